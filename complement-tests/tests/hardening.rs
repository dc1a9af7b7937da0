//! Smaller holes an attacker could use: looking at a room at a point one may
//! not read, others' presence, account data the server keeps itself, and a
//! user-interactive-auth session reused for another request than the one it
//! was started for.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, User};
use serde_json::json;

backend_tests!(
    members_at_a_point_one_cannot_read_is_forbidden,
    presence_is_for_those_who_share_a_room,
    server_controlled_account_data_is_refused,
    uia_session_deletes_only_the_devices_it_was_started_for,
    bulk_membership_is_capped_and_held_to_the_invite_limits,
    knocking_and_leaving_are_held_to_the_limits,
    restricted_joiner_can_still_change_their_member_event,
);

/// The position just after the room's newest event, as `alice` pages.
async fn newest_token(server: &Server, user: &User, room: &str) -> String {
    let (status, page) = server.get(&room_path(room, "/messages?dir=b&limit=1"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    page["start"].as_str().expect("start").to_owned()
}

/// In a `joined` room Bob may not read what came before his join, so he may
/// not ask for the members as of then either; as of his join he may.
async fn members_at_a_point_one_cannot_read_is_forbidden(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "preset": "public_chat", "initial_state": [
            { "type": "m.room.history_visibility", "content": { "history_visibility": "joined" } }
        ] }),
    )
    .await;
    let (status, _) =
        server.put(&room_path(&room, "/send/m.room.message/1"), Some(&alice.token), text("before")).await;
    assert_eq!(status, 200);
    let before = newest_token(&server, &alice, &room).await;
    join(&server, &bob, &room).await;
    let after = newest_token(&server, &bob, &room).await;

    let response =
        server.get(&room_path(&room, &format!("/members?at={}", enc(&before))), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "members as of a point before bob's join");
    let (status, body) =
        server.get(&room_path(&room, &format!("/members?at={}", enc(&after))), Some(&bob.token)).await;
    assert_eq!(status, 200, "{body}");
    let members: Vec<&str> =
        body["chunk"].as_array().unwrap().iter().filter_map(|e| e["state_key"].as_str()).collect();
    assert!(members.contains(&bob.user_id.as_str()) && members.contains(&alice.user_id.as_str()), "{body}");
    // Alice, in the room throughout, may look at either point.
    let (status, _) =
        server.get(&room_path(&room, &format!("/members?at={}", enc(&before))), Some(&alice.token)).await;
    assert_eq!(status, 200);
}

/// Eve shares no room with Alice: 403. Bob, who does, and Alice herself see
/// her presence.
async fn presence_is_for_those_who_share_a_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let eve = server.register("eve", "pw").await;
    let path = format!("{V3}/presence/{}/status", enc(&alice.user_id));
    let (status, body) =
        server.put(&path, Some(&alice.token), json!({ "presence": "online", "status_msg": "here" })).await;
    assert_eq!(status, 200, "{body}");
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;

    let response = server.get(&path, Some(&eve.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a stranger's look at alice's presence");
    for who in [&alice, &bob] {
        let (status, body) = server.get(&path, Some(&who.token)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["presence"], "online", "{body}");
    }
}

/// `m.push_rules` and `m.fully_read` are kept by the server: writing them as
/// account data is 405 M_BAD_JSON and changes nothing.
async fn server_controlled_account_data_is_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let user = enc(&alice.user_id);
    for kind in ["m.push_rules", "m.fully_read"] {
        let global = format!("{V3}/user/{user}/account_data/{kind}");
        let response = server.put(&global, Some(&alice.token), json!({ "global": {} })).await;
        assert_error(&response, 405, "M_BAD_JSON", &format!("global {kind}"));
        let in_room = format!("{V3}/user/{user}/rooms/{}/account_data/{kind}", enc(&room));
        let response = server.put(&in_room, Some(&alice.token), json!({ "event_id": "$nothing" })).await;
        assert_error(&response, 405, "M_BAD_JSON", &format!("room {kind}"));
    }
    let (status, rules) = server.get(&format!("{V3}/pushrules/"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{rules}");
    assert!(rules["global"]["override"].as_array().is_some_and(|r| !r.is_empty()), "{rules}");
}

/// A session started to delete device B cannot delete device C once its
/// password stage is done; it still deletes B.
async fn uia_session_deletes_only_the_devices_it_was_started_for(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let b = server.login("alice", "pw").await;
    let c = server.login("alice", "pw").await;
    let path = format!("{V3}/delete_devices");
    let (status, body) = server.post(&path, Some(&alice.token), json!({ "devices": [b.device_id] })).await;
    assert_eq!(status, 401, "{body}");
    let session = body["session"].as_str().expect("session").to_owned();
    let auth = json!({
        "type": "m.login.password", "session": session, "password": "pw",
        "identifier": { "type": "m.id.user", "user": alice.user_id },
    });

    let response =
        server.post(&path, Some(&alice.token), json!({ "devices": [c.device_id], "auth": auth })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "the session used for other devices");
    let (status, _) = server.get(&format!("{V3}/account/whoami"), Some(&c.token)).await;
    assert_eq!(status, 200, "device C still works");

    let (status, body) =
        server.post(&path, Some(&alice.token), json!({ "devices": [b.device_id], "auth": auth })).await;
    assert_eq!(status, 200, "{body}");
    let response = server.get(&format!("{V3}/account/whoami"), Some(&b.token)).await;
    assert_error(&response, 401, "M_UNKNOWN_TOKEN", "device B is deleted");
}

/// seqline's bulk membership takes at most 100 changes, and its invites are
/// charged like /invite's: a user invited over and over is soon 429.
async fn bulk_membership_is_capped_and_held_to_the_invite_limits(backend: Backend) {
    let server = Server::start_with(&backend, Options::default().env("SEQLINE_RATE_LIMITS", "on")).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let bulk = format!("/_matrix/client/unstable/org.seqline/rooms/{}/bulk_membership", enc(&room));
    let many: Vec<String> = (0..101).map(|i| format!("@u{i}:test.local")).collect();
    let response = server.post(&bulk, Some(&alice.token), json!({ "kick": many })).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "101 changes in one request");

    let mut limited = None;
    for round in 0..12 {
        let (status, body) = server.post(&bulk, Some(&alice.token), json!({ "invite": [bob.user_id] })).await;
        if status == 429 {
            assert_eq!(body["errcode"], "M_LIMIT_EXCEEDED", "{body}");
            limited = Some(round);
            break;
        }
        assert_eq!(status, 200, "{body}");
        let (status, body) = server.post(&bulk, Some(&alice.token), json!({ "kick": [bob.user_id] })).await;
        if status == 429 {
            limited = Some(round);
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    assert!(limited.is_some(), "bulk invites were never limited");
}

/// Knocking and leaving over and over fills every member's timeline: both
/// are limited (knock as a join, leave as a send).
async fn knocking_and_leaving_are_held_to_the_limits(backend: Backend) {
    let server = Server::start_with(&backend, Options::default().env("SEQLINE_RATE_LIMITS", "on")).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "initial_state": [{ "type": "m.room.join_rules", "content": { "join_rule": "knock" } }] }),
    )
    .await;
    let mut limited = false;
    for _ in 0..30 {
        let (status, body) =
            server.post(&format!("{V3}/knock/{}", enc(&room)), Some(&eve.token), json!({})).await;
        if status == 429 {
            limited = true;
            break;
        }
        assert_eq!(status, 200, "{body}");
        let (status, body) = server.post(&room_path(&room, "/leave"), Some(&eve.token), json!({})).await;
        if status == 429 {
            limited = true;
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    assert!(limited, "30 knock and leave rounds were never limited");
}

/// After a restricted join (whose member event names an authoriser), the
/// member may still change their display name there: the copied field is
/// dropped, not refused.
async fn restricted_joiner_can_still_change_their_member_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let space = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let room = create_room(
        &server,
        &alice,
        json!({ "initial_state": [{ "type": "m.room.join_rules", "content": {
            "join_rule": "restricted", "allow": [{ "type": "m.room_membership", "room_id": space }] } }] }),
    )
    .await;
    join(&server, &bob, &space).await;
    join(&server, &bob, &room).await;
    let member = room_path(&room, &format!("/state/m.room.member/{}", enc(&bob.user_id)));
    let (_, content) = server.get(&member, Some(&bob.token)).await;
    assert_eq!(content["join_authorised_via_users_server"], alice.user_id.as_str(), "{content}");

    let name = format!("{V3}/profile/{}/displayname", enc(&bob.user_id));
    let (status, body) = server.put(&name, Some(&bob.token), json!({ "displayname": "Bobby" })).await;
    assert_eq!(status, 200, "{body}");
    let (_, content) = server.get(&member, Some(&bob.token)).await;
    assert_eq!(content["displayname"], "Bobby", "{content}");
    assert_eq!(content["membership"], "join");
    // A per-room name, the way clients set it: the current content with a new name.
    let mut per_room = content.clone();
    per_room["displayname"] = json!("Bob here");
    per_room["join_authorised_via_users_server"] = json!(alice.user_id);
    let (status, body) = server.put(&member, Some(&bob.token), per_room).await;
    assert_eq!(status, 200, "{body}");
    let (_, content) = server.get(&member, Some(&bob.token)).await;
    assert_eq!(content["displayname"], "Bob here", "{content}");
}
