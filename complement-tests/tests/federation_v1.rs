//! The v1 membership endpoints of the federation API, for servers that still
//! call them: `send_join` and `send_leave` answer as their v2 forms in the
//! v1 shape `[200, body]`, and a v1 invite (the event itself as the body,
//! its room version taken as 2) reaches the local user. A `FakeServer` plays the calling
//! server; requests that break the rules change nothing.

use complement_tests::api::{V3, create_room, enc, room_path, sync_once};
use complement_tests::backend_tests;
use complement_tests::fake::FakeServer;
use complement_tests::federation::{FedServer, now_ms};
use complement_tests::harness::{Backend, User};
use serde_json::{Value, json};

backend_tests!(
    a_server_joins_and_leaves_through_v1,
    a_v1_invite_reaches_the_local_user,
    v1_requests_that_break_the_rules_change_nothing,
);

async fn joined_members(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    complement_tests::api::joined_member_ids(&seq.server, user, room).await
}

/// alice's public room (version 10) on `seq` and mallory's signed join
/// from make_join: the room, mallory, the join's id and event.
async fn room_and_join(seq: &FedServer, fake: &FakeServer, alice: &User) -> (String, String, String, Value) {
    let body = json!({ "preset": "public_chat", "room_version": "10" });
    let room = create_room(&seq.server, alice, body).await;
    let mallory = fake.user_id("mallory");
    let (join_id, join) = signed_template(seq, fake, "join", &room, &mallory).await;
    (room, mallory, join_id, join)
}

/// The event `fake`'s `user` gets from make_`what` in `room`, signed: its id
/// and the event.
async fn signed_template(
    seq: &FedServer,
    fake: &FakeServer,
    what: &str,
    room: &str,
    user: &str,
) -> (String, Value) {
    let uri = format!("/_matrix/federation/v1/make_{what}/{}/{}?ver=10", enc(room), enc(user));
    let (status, template) = fake.call(seq, "GET", &uri, None).await;
    assert_eq!(status, 200, "{template}");
    let mut event = template["event"].clone();
    event["origin_server_ts"] = json!(now_ms());
    let id = fake.sign(&mut event);
    (id, event)
}

/// mallory joins a seqline room through v1 send_join (the answer is `[200,
/// {...}]` with the room's state, the auth chain and the join), is a
/// member, then leaves through v1 send_leave (`[200, {}]`) and is not.
async fn a_server_joins_and_leaves_through_v1(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let (room, mallory, join_id, join) = room_and_join(&seq, &fake, &alice).await;
    let uri = format!("/_matrix/federation/v1/send_join/{}/{}", enc(&room), enc(&join_id));
    let (status, answer) = fake.call(&seq, "PUT", &uri, Some(&join)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer[0], 200, "{answer}");
    let body = &answer[1];
    let types: Vec<&str> =
        body["state"].as_array().unwrap().iter().filter_map(|e| e["type"].as_str()).collect();
    for kind in ["m.room.create", "m.room.power_levels", "m.room.join_rules", "m.room.member"] {
        assert!(types.contains(&kind), "{kind}: {types:?}");
    }
    assert!(!body["auth_chain"].as_array().unwrap().is_empty(), "{body}");
    assert_eq!(body["event"]["state_key"], mallory.as_str(), "{body}");
    assert_eq!(body["origin"], seq.name.as_str());
    let mut both = vec![alice.user_id.clone(), mallory.clone()];
    both.sort_unstable();
    assert_eq!(joined_members(&seq, &alice, &room).await, both);

    let (leave_id, leave) = signed_template(&seq, &fake, "leave", &room, &mallory).await;
    let uri = format!("/_matrix/federation/v1/send_leave/{}/{}", enc(&room), enc(&leave_id));
    let (status, answer) = fake.call(&seq, "PUT", &uri, Some(&leave)).await;
    assert_eq!((status, answer), (200, json!([200, {}])));
    assert_eq!(joined_members(&seq, &alice, &room).await, std::slice::from_ref(&alice.user_id));
    let (status, page) =
        seq.server.get(&room_path(&room, "/messages?dir=b&limit=1"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["chunk"][0]["event_id"], leave_id.as_str(), "{page}");
}

/// A v1 invite (room version 1 or 2 form), as a server speaking only v1 sends it: the
/// event (with its own `event_id`, v1 prev and auth pairs) and its
/// stripped state under `unsigned`.
fn v1_invite(fake: &FakeServer, room: &str, invitee: &str, name: &str) -> (String, Value) {
    let mallory = fake.user_id("mallory");
    let event_id = format!("$invite-{}:{}", now_ms(), fake.name);
    let pair = |id: &str| json!([format!("${id}:{}", fake.name), { "sha256": "aGFzaA" }]);
    let mut invite = json!({
        "event_id": event_id,
        "room_id": room,
        "type": "m.room.member",
        "state_key": invitee,
        "sender": mallory,
        "content": { "membership": "invite" },
        "origin_server_ts": now_ms(),
        "depth": 4,
        "prev_events": [pair("join")],
        "auth_events": [pair("create"), pair("power"), pair("join")],
    });
    fake.sign(&mut invite);
    invite["unsigned"] = json!({ "invite_room_state": [
        { "type": "m.room.name", "state_key": "", "sender": mallory, "content": { "name": name } },
        { "type": "m.room.join_rules", "state_key": "", "sender": mallory, "content": { "join_rule": "invite" } },
    ] });
    (event_id, invite)
}

/// mallory invites alice through v1 (its room version taken as 2): the answer
/// is `[200, {"event": ...}]` with seqline's signature added, and alice's
/// /sync shows the invite with its stripped state.
async fn a_v1_invite_reaches_the_local_user(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let room = format!("!old:{}", fake.name);
    let (event_id, invite) = v1_invite(&fake, &room, &alice.user_id, "An old room");
    let uri = format!("/_matrix/federation/v1/invite/{}/{}", enc(&room), enc(&event_id));
    let (status, answer) = fake.call(&seq, "PUT", &uri, Some(&invite)).await;
    assert_eq!(status, 200, "{answer}\n{}", seq.server.log());
    assert_eq!(answer[0], 200, "{answer}");
    let signed = &answer[1]["event"];
    assert_eq!(signed["event_id"], event_id.as_str());
    assert!(signed["signatures"][&seq.name].is_object(), "{signed}");
    assert!(signed["signatures"][&fake.name].is_object(), "{signed}");

    let sync = sync_once(&seq.server, &alice, None).await;
    let events = &sync["rooms"]["invite"][&room]["invite_state"]["events"];
    let name = events.as_array().unwrap().iter().find(|e| e["type"] == "m.room.name");
    assert_eq!(name.map(|e| &e["content"]["name"]), Some(&json!("An old room")), "{sync}");
    let member = events.as_array().unwrap().iter().find(|e| e["type"] == "m.room.member");
    assert_eq!(member.map(|e| &e["state_key"]), Some(&json!(alice.user_id)), "{sync}");
}

/// Broken v1 requests: unsigned, a path naming another event than the body,
/// an invite for another server's user or sent on behalf of another
/// server's user, a body that is no event, and a join of a room we do not
/// have. Each is refused with its Matrix error, and nothing changes.
async fn v1_requests_that_break_the_rules_change_nothing(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let (room, _, join_id, join) = room_and_join(&seq, &fake, &alice).await;
    let send_join = format!("/_matrix/federation/v1/send_join/{}/{}", enc(&room), enc(&join_id));

    let (status, body) = seq.send("PUT", &send_join, None, Some(&join)).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNAUTHORIZED")), "{body}");
    let other = format!("/_matrix/federation/v1/send_join/{}/{}", enc(&room), enc("$another"));
    let (status, body) = fake.call(&seq, "PUT", &other, Some(&join)).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
    let (status, body) = fake.call(&seq, "PUT", &send_join, Some(&json!([1, 2]))).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
    let unknown = format!("/_matrix/federation/v1/send_join/{}/{}", enc("!nowhere:x"), enc(&join_id));
    let (status, body) = fake.call(&seq, "PUT", &unknown, Some(&join)).await;
    assert!(status == 400 || status == 404, "{status} {body}");
    assert_eq!(joined_members(&seq, &alice, &room).await, std::slice::from_ref(&alice.user_id));

    let far_room = format!("!old:{}", fake.name);
    let (event_id, invite) = v1_invite(&fake, &far_room, "@bob:elsewhere.example", "Not for us");
    let uri = format!("/_matrix/federation/v1/invite/{}/{}", enc(&far_room), enc(&event_id));
    let (status, body) = fake.call(&seq, "PUT", &uri, Some(&invite)).await;
    assert!((400..500).contains(&status) && body["errcode"].is_string(), "{status} {body}");
    // Signed by the fake, sent on behalf of a user of the server under test.
    let (event_id, mut invite) = v1_invite(&fake, &far_room, &alice.user_id, "Forged");
    invite["sender"] = json!(format!("@eve:{}", seq.name));
    fake.sign(&mut invite);
    let uri = format!("/_matrix/federation/v1/invite/{}/{}", enc(&far_room), enc(&event_id));
    let (status, body) = fake.call(&seq, "PUT", &uri, Some(&invite)).await;
    assert!((400..500).contains(&status) && body["errcode"].is_string(), "{status} {body}");
    let (status, body) = seq.server.get(&format!("{V3}/sync"), Some(&alice.token)).await;
    assert_eq!(status, 200);
    assert_eq!(body["rooms"]["invite"], json!({}), "{body}");
}
