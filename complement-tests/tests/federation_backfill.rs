//! Backfill, seqline as the joining side: a user who joined a room that
//! lives on another server pages `/messages` back past their join, and the
//! history from before it comes from that server, placed below the join,
//! read with exactly the visibility it was sent under, never in /sync.

use complement_tests::api::{V3, create_room, enc, message_bodies, room_path, sync_once};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    shared_history_of_a_synapse_room_is_backfilled,
    history_sent_under_joined_stays_hidden_after_backfill,
    invited_history_starts_at_the_invite,
    a_v12_room_is_backfilled_to_its_creation,
);

/// Every event of `room` a user reads (`get` asks their server), paging
/// back from the end with `limit` per page until no `end` is given; newest
/// first.
async fn page_all<F, Fut>(get: F, room: &str, limit: u32) -> Vec<Value>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = (u16, Value)>,
{
    let mut out = Vec::new();
    let mut from: Option<String> = None;
    for _ in 0..100 {
        let mut path = room_path(room, &format!("/messages?dir=b&limit={limit}"));
        if let Some(from) = &from {
            path.push_str(&format!("&from={}", enc(from)));
        }
        let (status, page) = get(path).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["chunk"].as_array().unwrap().iter().cloned());
        match page["end"].as_str() {
            Some(end) => from = Some(end.to_owned()),
            None => return out,
        }
    }
    panic!("more than 100 pages");
}

async fn seqline_all(server: &FedServer, user: &User, room: &str, limit: u32) -> Vec<Value> {
    page_all(|path| async move { server.server.get(&path, Some(&user.token)).await }, room, limit).await
}

/// A public room of `version` on Synapse, history `shared`.
async fn shared_synapse_room(syn: &Synapse, user: &User, version: &str) -> String {
    let (status, created) = syn
        .post(
            &format!("{V3}/createRoom"),
            Some(&user.token),
            json!({ "preset": "public_chat", "room_version": version,
                    "initial_state": [{ "type": "m.room.history_visibility",
                                        "content": { "history_visibility": "shared" } }] }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    created["room_id"].as_str().unwrap().to_owned()
}

fn bodies(events: &[Value]) -> Vec<String> {
    message_bodies(&json!({ "chunk": events }))
}

async fn synapse_says(syn: &Synapse, user: &User, room: &str, txn: &str, body: &str) -> String {
    let path = room_path(room, &format!("/send/m.room.message/{txn}"));
    let (status, sent) =
        syn.put(&path, Some(&user.token), json!({ "msgtype": "m.text", "body": body })).await;
    assert_eq!(status, 200, "{sent}");
    sent["event_id"].as_str().unwrap().to_owned()
}

/// A Synapse room under `shared` with 130 messages (more than one /backfill
/// batch), a topic change and two redactions before alice of seqline joins: her
/// /messages reaches the room's creation in Synapse's order, the redacted
/// message without its body; none of it comes in her incremental /sync.
async fn shared_history_of_a_synapse_room_is_backfilled(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let room = shared_synapse_room(&syn, &bob, "10").await;
    // Message 5 comes in a later /backfill batch than its redaction,
    // message 120 in the same one.
    let mut redacted = Vec::new();
    for i in 0..130 {
        let id = synapse_says(&syn, &bob, &room, &format!("m{i}"), &format!("message {i}")).await;
        if i == 5 || i == 120 {
            redacted.push(id);
        }
        if i == 100 {
            let (status, body) = syn
                .put(&room_path(&room, "/state/m.room.topic/"), Some(&bob.token), json!({ "topic": "later" }))
                .await;
            assert_eq!(status, 200, "{body}");
        }
    }
    for (i, id) in redacted.iter().enumerate() {
        let path = room_path(&room, &format!("/redact/{}/r{i}", enc(id)));
        let (status, body) = syn.put(&path, Some(&bob.token), json!({})).await;
        assert_eq!(status, 200, "{body}");
    }

    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, body) = seq.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let since = sync_once(&seq.server, &alice, None).await["next_batch"].as_str().unwrap().to_owned();

    let ours = seqline_all(&seq, &alice, &room, 40).await;
    let (syn_ref, bob_ref) = (&syn, &bob);
    let theirs =
        page_all(|path| async move { syn_ref.get(&path, Some(&bob_ref.token)).await }, &room, 40).await;
    let ids = |events: &[Value]| -> Vec<String> {
        events.iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect()
    };
    // The same events in the same order (alice's join is the newest of both).
    assert_eq!(ids(&ours), ids(&theirs), "{ours:?}");
    assert_eq!(ours.last().unwrap()["type"], "m.room.create");
    let expected: Vec<String> =
        (0..130).filter(|i| *i != 5 && *i != 120).map(|i| format!("message {i}")).collect();
    assert_eq!(bodies(&ours), expected);
    for id in &redacted {
        let gone = ours.iter().find(|e| e["event_id"] == id.as_str()).unwrap();
        assert_eq!(gone["content"], json!({}), "{gone}");
    }
    // The topic in force back then: the state of an event before the change.
    let early = ours.iter().find(|e| e["content"]["body"] == "message 50").unwrap();
    let event_id = early["event_id"].as_str().unwrap();
    let (status, context) = seq
        .server
        .get(&room_path(&room, &format!("/context/{}?limit=0", enc(event_id))), Some(&alice.token))
        .await;
    assert_eq!(status, 200, "{context}");
    let topics: Vec<&Value> =
        context["state"].as_array().unwrap().iter().filter(|e| e["type"] == "m.room.topic").collect();
    assert!(topics.is_empty(), "no topic yet at message 50: {topics:?}");

    // None of the backfilled history arrives as new in /sync.
    let sync = sync_once(&seq.server, &alice, Some(&since)).await;
    assert!(!sync.to_string().contains("message "), "{sync}");
}

/// A Synapse room that was `shared`, then `joined`: alice of seqline, who
/// joins later, reads what was sent under `shared` and nothing sent under
/// `joined` before her join, though her server now holds it.
async fn history_sent_under_joined_stays_hidden_after_backfill(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let room = shared_synapse_room(&syn, &bob, "12").await;
    synapse_says(&syn, &bob, &room, "s1", "shared one").await;
    let (status, body) = syn
        .put(
            &room_path(&room, "/state/m.room.history_visibility/"),
            Some(&bob.token),
            json!({ "history_visibility": "joined" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let secret = synapse_says(&syn, &bob, &room, "j1", "joined only").await;
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, body) = seq.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    synapse_says(&syn, &bob, &room, "j2", "after alice").await;
    let after = complement_tests::api::eventually("bob's message on seqline", || async {
        let events = seqline_all(&seq, &alice, &room, 10).await;
        bodies(&events).contains(&"after alice".to_owned()).then_some(events)
    })
    .await;
    assert_eq!(bodies(&after), ["shared one", "after alice"]);
    assert!(!serde_json::to_string(&after).unwrap().contains("joined only"));
    let (status, _) =
        seq.server.get(&room_path(&room, &format!("/event/{}", enc(&secret))), Some(&alice.token)).await;
    assert_eq!(status, 404);
}

/// Two seqline servers, a room under `invited` on A: bob of B, invited and
/// then joined, reads from his invite on (backfilled from A, which serves the
/// earlier message to B only redacted).
async fn invited_history_starts_at_the_invite(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = create_room(
        &a.server,
        &alice,
        json!({ "preset": "private_chat", "initial_state": [
            { "type": "m.room.history_visibility", "content": { "history_visibility": "invited" } }] }),
    )
    .await;
    let say = |txn: &'static str, body: &'static str| {
        let (a, alice, room) = (&a, &alice, &room);
        async move {
            let path = room_path(room, &format!("/send/m.room.message/{txn}"));
            let (status, sent) =
                a.server.put(&path, Some(&alice.token), json!({ "msgtype": "m.text", "body": body })).await;
            assert_eq!(status, 200, "{sent}");
        }
    };
    say("a1", "before the invite").await;
    let (status, body) = a
        .server
        .post(&room_path(&room, "/invite"), Some(&alice.token), json!({ "user_id": b.user_id("bob") }))
        .await;
    assert_eq!(status, 200, "{body}");
    say("a2", "after the invite").await;
    complement_tests::api::eventually("the invite on B", || async {
        let sync = sync_once(&b.server, &bob, None).await;
        sync["rooms"]["invite"][&room].is_object().then_some(())
    })
    .await;
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name));
    let (status, body) = b.server.post(&path, Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", b.server.log());
    let events = seqline_all(&b, &bob, &room, 10).await;
    assert_eq!(bodies(&events), ["after the invite"], "{events:?}");
    // His own invite is there, below his join.
    let bob_id = b.user_id("bob");
    let own: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "m.room.member" && e["state_key"] == bob_id.as_str())
        .map(|e| e["content"]["membership"].as_str().unwrap())
        .collect();
    assert_eq!(own, ["join", "invite"]);
}

/// Room version 12: the create event names no room (the room id is made
/// from it) and is no event's auth event. Paging back through a Synapse
/// room joined over federation still ends with it, in Synapse's order.
async fn a_v12_room_is_backfilled_to_its_creation(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let room = shared_synapse_room(&syn, &bob, "12").await;
    for i in 0..3 {
        synapse_says(&syn, &bob, &room, &format!("v{i}"), &format!("message {i}")).await;
    }
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, body) = seq.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let ours = seqline_all(&seq, &alice, &room, 5).await;
    let (syn_ref, bob_ref) = (&syn, &bob);
    let theirs =
        page_all(|path| async move { syn_ref.get(&path, Some(&bob_ref.token)).await }, &room, 5).await;
    let ids = |events: &[Value]| -> Vec<String> {
        events.iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&ours), ids(&theirs), "ours {ours:?}\ntheirs {theirs:?}");
    assert_eq!(ours.last().unwrap()["type"], "m.room.create", "{ours:?}");
    assert_eq!(bodies(&ours), ["message 0", "message 1", "message 2"]);
}
