//! Hostile servers answering seqline's own requests, played by a
//! `FakeServer`: a room host whose send_join answer holds real, signed
//! events of another room (a local user's join there) must not make that
//! user look joined; the answer is refused whole and nothing is stored. An
//! honest fake answer, as a control, lets the user join and hear the host.

use complement_tests::api::{
    V3, assert_error, create_room, enc, event_id_of, join, room_path, sync_once, text,
};
use complement_tests::backend_tests;
use complement_tests::fake::{FakeRoom, FakeServer};
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, User};
use complement_tests::pdu;
use serde_json::{Value, json};

backend_tests!(
    an_honest_host_lets_a_user_join_and_talk,
    a_host_cannot_make_local_users_look_joined_v11,
    a_host_cannot_make_local_users_look_joined_v12,
);

const MAKE_JOIN: &str = "/_matrix/federation/v1/make_join/";
const SEND_JOIN: &str = "/_matrix/federation/v2/send_join/";

/// Scripts `fake` to answer make_join for `user` and send_join in `room`
/// with `answer`.
fn host_join(fake: &FakeServer, room: &FakeRoom, user: &str, answer: Value) {
    fake.answer("GET", &format!("{MAKE_JOIN}{}/{user}", room.room_id), 200, room.join_template(user));
    fake.answer("PUT", &format!("{SEND_JOIN}{}/", room.room_id), 200, answer);
}

/// `POST /join/{room}?server_name=<via>` as `user`.
async fn join_via(seq: &FedServer, user: &User, room: &str, via: &str) -> (u16, Value) {
    let path = format!("{V3}/join/{}?server_name={}", enc(room), enc(via));
    seq.server.post(&path, Some(&user.token), json!({})).await
}

async fn joined_rooms(seq: &FedServer, user: &User) -> Vec<String> {
    let (status, body) = seq.server.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body["joined_rooms"].clone()).unwrap()
}

async fn joined_members(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    let (status, body) = seq.server.get(&room_path(room, "/joined_members"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    let mut members: Vec<String> = body["joined"].as_object().unwrap().keys().cloned().collect();
    members.sort_unstable();
    members
}

async fn message_bodies(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    let (status, page) =
        seq.server.get(&room_path(room, "/messages?dir=b&limit=50"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    complement_tests::api::message_bodies(&page)
}

/// The control: the fake hosts a room and answers honestly; alice joins
/// through it and reads what its user says afterwards.
async fn an_honest_host_lets_a_user_join_and_talk(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let mut room = fake.create_room("12", &mallory);
    host_join(&fake, &room, &alice.user_id, room.send_join_answer(&[&fake.name]));

    let (status, joined) = join_via(&seq, &alice, &room.room_id, &fake.name).await;
    assert_eq!(status, 200, "{joined}\n{}", seq.server.log());
    assert_eq!(joined["room_id"], room.room_id.as_str());
    // seqline offered the versions it takes part in, and sent its signed join.
    let asked = fake.requests_to(MAKE_JOIN);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].query.contains("ver=12") && asked[0].origin.as_deref() == Some(seq.name.as_str()));
    let sent = fake.requests_to(SEND_JOIN);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let alice_join = sent[0].body.clone();
    assert_eq!(
        (alice_join["sender"].as_str(), alice_join["state_key"].as_str()),
        (Some(&*alice.user_id), Some(&*alice.user_id))
    );
    let join_id = room.push(alice_join);
    assert!(sent[0].path.ends_with(&join_id), "{}", sent[0].path);

    let mut members = vec![alice.user_id.clone(), mallory.clone()];
    members.sort_unstable();
    assert_eq!(joined_members(&seq, &alice, &room.room_id).await, members);
    assert_eq!(joined_rooms(&seq, &alice).await, [room.room_id.clone()]);

    // The host talks; alice reads it.
    let (message_id, message) =
        fake.add(&mut room, "m.room.message", None, &mallory, text("hello from the fake"));
    assert_eq!(message["prev_events"], json!([join_id]));
    let (status, results) = fake.send_txn(&seq, "t1", &[&message]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&message_id], json!({}), "{results}");
    assert_eq!(message_bodies(&seq, &alice, &room.room_id).await, ["hello from the fake"]);
    let sync = sync_once(&seq.server, &alice, None).await;
    let timeline = &sync["rooms"]["join"][&room.room_id]["timeline"]["events"];
    assert!(timeline.as_array().unwrap().iter().any(|e| e["event_id"] == message_id.as_str()), "{sync}");
}

async fn a_host_cannot_make_local_users_look_joined_v11(backend: Backend) {
    a_host_cannot_make_local_users_look_joined(backend, "11").await;
}

async fn a_host_cannot_make_local_users_look_joined_v12(backend: Backend) {
    a_host_cannot_make_local_users_look_joined(backend, "12").await;
}

/// Alice's and bob's real joins of a seqline room R2, put by the host of R1
/// into R1's send_join answer, do not make them members of R1: alice's join
/// fails and neither looks joined; R2 goes on as before.
async fn a_host_cannot_make_local_users_look_joined(backend: Backend, version: &str) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let bob = seq.server.register("bob", "pw").await;
    let mallory = fake.user_id("mallory");

    // R2 on seqline, with alice, bob and (through make_join/send_join) mallory.
    let r2 =
        create_room(&seq.server, &alice, json!({ "preset": "public_chat", "room_version": version })).await;
    join(&seq.server, &bob, &r2).await;
    let (_, _, r2_answer) = fake.join(&seq, &r2, &mallory).await;
    let member_id = |user: &str| {
        r2_answer["state"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "m.room.member" && e["state_key"] == user)
            .map(pdu::event_id)
            .unwrap_or_else(|| panic!("no join of {user} in {r2_answer}"))
    };
    // The real, signed joins, fetched as any server in R2 may.
    let alice_r2_join = fake.event(&seq, &member_id(&alice.user_id)).await;
    let bob_r2_join = fake.event(&seq, &member_id(&bob.user_id)).await;
    for (event, user) in [(&alice_r2_join, &alice.user_id), (&bob_r2_join, &bob.user_id)] {
        assert_eq!(
            (event["sender"].as_str(), event["content"]["membership"].as_str()),
            (Some(&**user), Some("join"))
        );
        assert_eq!(event["room_id"], r2.as_str());
    }

    // R1, hosted by the fake: its answer's state adds both R2 joins, and its
    // auth chain everything of R2 they need.
    let r1 = fake.create_room(version, &mallory);
    let mut answer = r1.send_join_answer(&[&fake.name]);
    let state = answer["state"].as_array_mut().unwrap();
    state.retain(|e| e["type"] != "m.room.member" || e["state_key"] == mallory.as_str());
    state.extend([alice_r2_join.clone(), bob_r2_join.clone()]);
    let chain = answer["auth_chain"].as_array_mut().unwrap();
    chain.extend(r2_answer["state"].as_array().unwrap().iter().cloned());
    chain.extend(r2_answer["auth_chain"].as_array().unwrap().iter().cloned());
    host_join(&fake, &r1, &alice.user_id, answer);

    let refused = join_via(&seq, &alice, &r1.room_id, &fake.name).await;
    assert_error(&refused, 502, "M_UNKNOWN", "a send_join answer with another room's events");
    assert!(refused.1["error"].as_str().unwrap().contains("another room"), "{}", refused.1);
    assert_eq!(fake.requests_to(SEND_JOIN).len(), 1, "the answer was asked for and refused");

    // Nothing of R1 was stored: nobody looks joined.
    for user in [&alice, &bob] {
        assert_eq!(joined_rooms(&seq, user).await, std::slice::from_ref(&r2), "{}", user.user_id);
        let sync = sync_once(&seq.server, user, None).await;
        assert!(sync["rooms"]["join"].get(&r1.room_id).is_none(), "{sync}");
        assert!(sync["rooms"]["join"].get(&r2).is_some(), "{sync}");
    }
    let (status, members) =
        seq.server.get(&room_path(&r1.room_id, "/joined_members"), Some(&alice.token)).await;
    assert_eq!(status, 403, "{members}");

    // R2 goes on: alice talks, bob reads, the members are the three.
    let (status, sent) = seq
        .server
        .put(&room_path(&r2, "/send/m.room.message/a1"), Some(&alice.token), text("still here"))
        .await;
    assert_eq!(status, 200, "{sent}");
    event_id_of(&sent);
    assert_eq!(message_bodies(&seq, &bob, &r2).await, ["still here"]);
    let mut members = vec![alice.user_id.clone(), bob.user_id.clone(), mallory];
    members.sort_unstable();
    assert_eq!(joined_members(&seq, &bob, &r2).await, members);
}
