//! seqline as the resident server: a real Synapse's user joins a seqline
//! room (make_join / send_join v2), both talk (seqline's durable outgoing
//! queue one way, Synapse's /send transactions the other), history from
//! before the join stays hidden from the joiner under `joined` (Synapse gets
//! only redacted copies), and the leave reaches seqline. Room versions 12
//! (seqline's default) and 10.

use std::time::{Duration, Instant};

use complement_tests::api::{V3, create_room, enc, event_id_of, room_path, text};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(synapse_user_joins_talks_and_leaves_v12, synapse_user_joins_talks_and_leaves_v10);

async fn synapse_user_joins_talks_and_leaves_v12(backend: Backend) {
    joins_talks_and_leaves(backend, "12").await;
}

async fn synapse_user_joins_talks_and_leaves_v10(backend: Backend) {
    joins_talks_and_leaves(backend, "10").await;
}

/// Waits (up to 30 s) until `check` answers `Some`, asking again every 100 ms.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bodies of the room's messages a user sees, oldest first (one page
/// back from the end).
fn bodies(page: &Value) -> Vec<String> {
    let mut out: Vec<String> = page["chunk"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect();
    out.reverse();
    out
}

async fn seqline_messages(seq: &FedServer, user: &User, room: &str) -> Value {
    let (status, page) =
        seq.server.get(&room_path(room, "/messages?dir=b&limit=50"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    page
}

async fn synapse_messages(syn: &Synapse, token: &str, room: &str) -> Value {
    let (status, page) = syn.get(&room_path(room, "/messages?dir=b&limit=50"), Some(token)).await;
    assert_eq!(status, 200, "{page}");
    page
}

async fn joined_members(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    let (status, body) = seq.server.get(&room_path(room, "/joined_members"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    let mut members: Vec<String> =
        body["joined"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    members.sort_unstable();
    members
}

async fn joins_talks_and_leaves(backend: Backend, version: &str) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let bob = syn.register("bob", "pw").await;
    let bob_id = syn.user_id("bob");

    let room = create_room(
        &seq.server,
        &alice,
        json!({
            "preset": "public_chat",
            "room_version": version,
            "initial_state": [{
                "type": "m.room.history_visibility", "state_key": "",
                "content": { "history_visibility": "joined" }
            }],
        }),
    )
    .await;
    let (status, before) = seq
        .server
        .put(&room_path(&room, "/send/m.room.message/t0"), Some(&alice.token), text("before bob"))
        .await;
    assert_eq!(status, 200, "{before}");
    let before_id = event_id_of(&before);

    // Bob joins through seqline (a v12 room id names no server: Synapse must be told).
    let join_path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&seq.name));
    let (status, joined) = syn.post(&join_path, Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{joined}\n{}\n{}", syn.log_tail(), seq.server.log());
    assert_eq!(joined["room_id"], room.as_str());
    let mut expected = vec![alice_id.clone(), bob_id.clone()];
    expected.sort_unstable();
    assert_eq!(joined_members(&seq, &alice, &room).await, expected);

    // Synapse's view of the membership agrees.
    let (status, members) = syn.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{members}");
    let mut synapse_members: Vec<String> = members["joined"].as_object().unwrap().keys().cloned().collect();
    synapse_members.sort_unstable();
    assert_eq!(synapse_members, expected);

    // Bob talks: Synapse sends the event to seqline, alice reads it.
    let (status, sent) = syn
        .put(&room_path(&room, "/send/m.room.message/b1"), Some(&bob.token), text("hello from synapse"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let bob_event = event_id_of(&sent);
    eventually("bob's message on seqline", || async {
        let page = seqline_messages(&seq, &alice, &room).await;
        page["chunk"].as_array().unwrap().iter().any(|e| e["event_id"] == bob_event.as_str()).then_some(())
    })
    .await;

    // Alice answers: seqline's queue sends it to Synapse, bob reads it.
    let (status, sent) = seq
        .server
        .put(&room_path(&room, "/send/m.room.message/a1"), Some(&alice.token), text("hello from seqline"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let alice_event = event_id_of(&sent);
    let page = eventually("alice's answer on Synapse", || async {
        let page = synapse_messages(&syn, &bob.token, &room).await;
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event_id"] == alice_event.as_str())
            .then_some(page)
    })
    .await;

    // One conversation, one order, on both servers; bob never reads what was
    // said before he joined (Synapse had it only as a redacted copy).
    assert_eq!(bodies(&page), ["hello from synapse", "hello from seqline"], "{page}");
    assert!(!page.to_string().contains("before bob"), "{page}");
    let (status, hidden) =
        syn.get(&room_path(&room, &format!("/event/{}", enc(&before_id))), Some(&bob.token)).await;
    assert!(status == 404 || hidden["content"].get("body").is_none(), "{status} {hidden}");
    let page = seqline_messages(&seq, &alice, &room).await;
    assert_eq!(bodies(&page), ["before bob", "hello from synapse", "hello from seqline"], "{page}");

    // Bob leaves; seqline hears of it.
    let (status, left) = syn.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{left}");
    eventually("bob's leave on seqline", || async {
        (joined_members(&seq, &alice, &room).await == [alice_id.clone()]).then_some(())
    })
    .await;
    // What alice says after the leave stays on seqline: Synapse is no longer in the room.
    let (status, after) = seq
        .server
        .put(&room_path(&room, "/send/m.room.message/a2"), Some(&alice.token), text("after bob"))
        .await;
    assert_eq!(status, 200, "{after}");
    let (status, page) =
        seq.server.get(&room_path(&room, "/messages?dir=b&limit=50"), Some(&alice.token)).await;
    assert_eq!(status, 200);
    assert_eq!(bodies(&page).last().map(String::as_str), Some("after bob"));
}
