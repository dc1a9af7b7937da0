//! Restricted joins and knocking. A `restricted` room lets in the members of
//! the rooms its join rule names; the server, not the client, names the
//! member who authorised the join (`join_authorised_via_users_server`), so a
//! made-up authoriser gets nobody in. A `knock` room takes knocks: members
//! see them, an invite accepts, a kick refuses, and the knocker sees the
//! knock in `/sync` under `rooms.knock`.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    restricted_join_needs_membership_of_an_allowed_room,
    forged_authoriser_is_refused,
    knock_restricted_room_takes_knocks_and_member_joins,
    knock_is_seen_by_members_and_accepted_by_invite,
    knock_refused_by_kick_shows_as_left,
    knock_needs_a_knock_join_rule,
);

/// A room whose join rule is `rule`, allowing members of `allowed`.
async fn room_with_rule(server: &Server, owner: &User, rule: &str, allowed: Option<&str>) -> String {
    let mut content = json!({ "join_rule": rule });
    if let Some(space) = allowed {
        content["allow"] = json!([{ "type": "m.room_membership", "room_id": space }]);
    }
    create_room(
        server,
        owner,
        json!({ "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": content }] }),
    )
    .await
}

async fn post(server: &Server, user: &User, path: &str) -> (u16, Value) {
    server.post(path, Some(&user.token), json!({})).await
}

fn join_path(room: &str) -> String {
    room_path(room, "/join")
}

fn knock_path(room: &str) -> String {
    format!("{V3}/knock/{}", enc(room))
}

/// `content` of the user's member event in the room, as the owner sees it.
async fn member_content(server: &Server, viewer: &User, room: &str, user: &User) -> (u16, Value) {
    let path = room_path(room, &format!("/state/m.room.member/{}", enc(&user.user_id)));
    server.get(&path, Some(&viewer.token)).await
}

/// Bob may join Alice's restricted room only once he is in the space it
/// names; the join then names Alice (the one member who may invite) as its
/// authoriser.
async fn restricted_join_needs_membership_of_an_allowed_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let space = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let room = room_with_rule(&server, &alice, "restricted", Some(&space)).await;

    let response = post(&server, &bob, &join_path(&room)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a join from outside the allowed room");
    let (status, _) = member_content(&server, &alice, &room, &bob).await;
    assert_eq!(status, 404, "no member event for bob");

    let (status, body) = post(&server, &bob, &join_path(&space)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(&server, &bob, &join_path(&room)).await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())), "{body}");
    let (status, content) = member_content(&server, &alice, &room, &bob).await;
    assert_eq!(status, 200, "{content}");
    assert_eq!(content["membership"], "join");
    assert_eq!(content["join_authorised_via_users_server"], alice.user_id.as_str(), "{content}");
}

/// Eve writes her own join with a made-up authoriser: refused, also when she
/// could have joined properly (the field is the server's to set).
async fn forged_authoriser_is_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let bob = server.register("bob", "pw").await;
    let space = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let room = room_with_rule(&server, &alice, "restricted", Some(&space)).await;
    let (status, _) = post(&server, &bob, &join_path(&space)).await;
    assert_eq!(status, 200);

    for who in [&eve, &bob] {
        let path = room_path(&room, &format!("/state/m.room.member/{}", enc(&who.user_id)));
        let forged = json!({ "membership": "join", "join_authorised_via_users_server": alice.user_id });
        let response = server.put(&path, Some(&who.token), forged).await;
        assert_error(&response, 403, "M_FORBIDDEN", "a client-supplied authoriser");
        let (status, _) = member_content(&server, &alice, &room, who).await;
        assert_eq!(status, 404, "{} is not in the room", who.user_id);
    }
    // The same field in a /join or /knock body (whose extra keys go into the
    // member event): refused too, and a `membership` key there changes nothing.
    for path in [join_path(&room), format!("{V3}/join/{}", enc(&room)), knock_path(&room)] {
        let forged = json!({ "join_authorised_via_users_server": alice.user_id, "membership": "ban" });
        let response = server.post(&path, Some(&eve.token), forged).await;
        assert_eq!(response.0, 403, "{path}: {}", response.1);
        let (status, _) = member_content(&server, &alice, &room, &eve).await;
        assert_eq!(status, 404, "{path}: eve is not in the room");
    }
    // Through /join the server names the authoriser itself.
    let (status, body) = post(&server, &bob, &join_path(&room)).await;
    assert_eq!(status, 200, "{body}");
}

/// `knock_restricted`: members of the allowed room join directly, others
/// may knock.
async fn knock_restricted_room_takes_knocks_and_member_joins(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let space = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let room = room_with_rule(&server, &alice, "knock_restricted", Some(&space)).await;
    let (status, _) = post(&server, &bob, &join_path(&space)).await;
    assert_eq!(status, 200);

    let (status, body) = post(&server, &bob, &join_path(&room)).await;
    assert_eq!(status, 200, "{body}");
    let response = post(&server, &carol, &join_path(&room)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a join from outside the allowed room");
    let (status, body) = post(&server, &carol, &knock_path(&room)).await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())), "{body}");
    let (_, content) = member_content(&server, &alice, &room, &carol).await;
    assert_eq!(content["membership"], "knock", "{content}");
}

/// Bob knocks with a reason: he sees the knock in `rooms.knock` (stripped
/// state with his own member event and the join rule) and cannot read the
/// room; Alice sees the knock in her timeline; her invite moves Bob's room
/// from `knock` to `invite`, and he joins.
async fn knock_is_seen_by_members_and_accepted_by_invite(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = room_with_rule(&server, &alice, "knock", None).await;
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/m1"), Some(&alice.token), text("secret")).await;
    assert_eq!(status, 200, "{body}");

    let (status, body) =
        server.post(&knock_path(&room), Some(&bob.token), json!({ "reason": "let me in" })).await;
    assert_eq!(status, 200, "{body}");
    let first = sync_once(&server, &bob, None).await;
    let knock = &first["rooms"]["knock"][&room];
    let events =
        knock["knock_state"]["events"].as_array().unwrap_or_else(|| panic!("no knock for the room: {first}"));
    let own = events
        .iter()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == bob.user_id.as_str())
        .unwrap_or_else(|| panic!("no own member event: {knock}"));
    assert_eq!(own["content"]["membership"], "knock");
    assert_eq!(own["content"]["reason"], "let me in");
    assert!(
        events.iter().any(|e| e["type"] == "m.room.join_rules" && e["content"]["join_rule"] == "knock"),
        "{knock}"
    );
    assert!(first["rooms"]["join"].get(&room).is_none() && first["rooms"]["invite"].get(&room).is_none());
    let response = server.get(&room_path(&room, "/messages?dir=b"), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a knocker reading the room");

    let (status, page) = server.get(&room_path(&room, "/messages?dir=b&limit=1"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    let knock_event = &page["chunk"][0];
    assert_eq!(
        (knock_event["type"].as_str(), knock_event["state_key"].as_str()),
        (Some("m.room.member"), Some(bob.user_id.as_str()))
    );
    assert_eq!(knock_event["content"]["membership"], "knock");

    let next = first["next_batch"].as_str().unwrap().to_owned();
    let (status, body) = server
        .post(&room_path(&room, "/invite"), Some(&alice.token), json!({ "user_id": bob.user_id }))
        .await;
    assert_eq!(status, 200, "{body}");
    let later = sync_once(&server, &bob, Some(&next)).await;
    assert!(later["rooms"]["invite"].get(&room).is_some(), "{later}");
    assert!(later["rooms"]["knock"].get(&room).is_none(), "{later}");
    let (status, body) = post(&server, &bob, &join_path(&room)).await;
    assert_eq!(status, 200, "{body}");
}

/// Alice kicks Dave's knock: Dave's next sync has the room under `leave`
/// with the kick as its only event, and the room is gone from `knock`.
async fn knock_refused_by_kick_shows_as_left(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let dave = server.register("dave", "pw").await;
    let room = room_with_rule(&server, &alice, "knock", None).await;
    let (status, _) = post(&server, &dave, &knock_path(&room)).await;
    assert_eq!(status, 200);
    let first = sync_once(&server, &dave, None).await;
    assert!(first["rooms"]["knock"].get(&room).is_some(), "{first}");
    let next = first["next_batch"].as_str().unwrap().to_owned();

    let (status, body) = server
        .post(
            &room_path(&room, "/kick"),
            Some(&alice.token),
            json!({ "user_id": dave.user_id, "reason": "no" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let later = sync_once(&server, &dave, Some(&next)).await;
    assert!(later["rooms"]["knock"].get(&room).is_none(), "{later}");
    let timeline =
        later["rooms"]["leave"][&room]["timeline"]["events"].as_array().unwrap_or_else(|| panic!("{later}"));
    assert_eq!(timeline.len(), 1, "{later}");
    assert_eq!(timeline[0]["sender"], alice.user_id.as_str());
    assert_eq!(timeline[0]["content"]["membership"], "leave");
    assert_eq!(timeline[0]["content"]["reason"], "no");
    // Dave may knock again.
    let (status, body) = post(&server, &dave, &knock_path(&room)).await;
    assert_eq!(status, 200, "{body}");
}

/// Knocking on a room whose rule does not take knocks, on a room one is in,
/// and on an unknown room.
async fn knock_needs_a_knock_join_rule(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let private = create_room(&server, &alice, json!({ "preset": "private_chat" })).await;
    let public = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let knock_room = room_with_rule(&server, &alice, "knock", None).await;
    for room in [&private, &public] {
        let response = post(&server, &bob, &knock_path(room)).await;
        assert_error(&response, 403, "M_FORBIDDEN", "a knock on a room that takes none");
    }
    let response = post(&server, &alice, &knock_path(&knock_room)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a knock by a member");
    let response = post(&server, &bob, &knock_path("!unknown:test.local")).await;
    assert_error(&response, 404, "M_NOT_FOUND", "a knock on an unknown room");
    let response = post(&server, &bob, &knock_path("#nowhere:test.local")).await;
    assert_error(&response, 404, "M_NOT_FOUND", "a knock on an unknown alias");
}
