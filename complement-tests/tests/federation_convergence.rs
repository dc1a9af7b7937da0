//! Three servers writing to one room at once: two seqline servers and a real
//! Synapse. Their users send messages and change the topic concurrently, so
//! the room's graph forks on every server; once each has heard everything,
//! every server holds the same events, each once, and the same current
//! state (the state resolution both implementations run gives one answer).
//!
//! On loopback the events mostly arrive in the order they were made, so
//! this also passes where the last topic to arrive simply wins; the edge
//! where it does not (an older event arriving last) is pinned by
//! `federation_resident::concurrent_state_resolves_by_the_rules`.

use std::collections::{BTreeMap, BTreeSet};

use complement_tests::api::{V3, create_room, enc, eventually, room_path};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::Backend;
use complement_tests::side::Side;
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::json;

backend_tests!(three_servers_writing_at_once_converge);

/// What the test reads of a side.
trait Reads {
    async fn timeline(&self, room: &str) -> Vec<(String, String)>;
    async fn state(&self, room: &str) -> BTreeMap<(String, String), String>;
    async fn has_all(&self, room: &str, bodies: &[String]) -> bool;
}

impl Reads for Side<'_> {
    /// The room's events as this user pages back from the end (event id,
    /// body or type), newest last.
    async fn timeline(&self, room: &str) -> Vec<(String, String)> {
        let (status, page) = self.get(&room_path(room, "/messages?dir=b&limit=300")).await;
        assert_eq!(status, 200, "{page}");
        let mut events: Vec<(String, String)> = page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let what = e["content"]["body"].as_str().or(e["type"].as_str()).unwrap_or_default();
                (e["event_id"].as_str().unwrap_or_default().to_owned(), what.to_owned())
            })
            .collect();
        events.reverse();
        events
    }

    /// The room's current state: (type, state key) -> event id.
    async fn state(&self, room: &str) -> BTreeMap<(String, String), String> {
        let (status, state) = self.get(&room_path(room, "/state")).await;
        assert_eq!(status, 200, "{state}");
        state
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let key =
                    (e["type"].as_str().unwrap().to_owned(), e["state_key"].as_str().unwrap().to_owned());
                (key, e["event_id"].as_str().unwrap().to_owned())
            })
            .collect()
    }

    /// Whether this user's timeline holds every one of `bodies`.
    async fn has_all(&self, room: &str, bodies: &[String]) -> bool {
        let seen: BTreeSet<String> = self.timeline(room).await.into_iter().map(|(_, b)| b).collect();
        bodies.iter().all(|b| seen.contains(b))
    }
}

/// One round of the burst for one side: a message, and in some rounds a
/// topic change right after it; answers the message's body.
async fn step(side: &Side<'_>, room: &str, name: &str, i: usize) -> String {
    let body = format!("{name} {i}");
    side.say(room, &format!("{name}-m{i}"), &body).await;
    if i % 3 == 1 {
        let path = room_path(room, "/state/m.room.topic/");
        let (status, sent) = side.put(&path, json!({ "topic": format!("{name}'s topic {i}") })).await;
        assert_eq!(status, 200, "{sent}");
    }
    body
}

async fn three_servers_writing_at_once_converge(backend: Backend) {
    let (a, b, syn) = tokio::join!(
        FedServer::start(&backend),
        FedServer::start(&backend),
        Synapse::start_with(SynapseOptions::default())
    );
    let alice = a.server.register("alice", "pw").await;
    let carol = b.server.register("carol", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let (carol_id, bob_id) = (b.user_id("carol"), syn.user_id("bob"));
    let room = create_room(
        &a.server,
        &alice,
        json!({
            "preset": "public_chat", "room_version": "12",
            "power_level_content_override": { "users": { carol_id.clone(): 50, bob_id.clone(): 50 } },
        }),
    )
    .await;
    let sides =
        [Side::Seqline(&a, &alice), Side::Seqline(&b, &carol), Side::Synapse(&syn, bob.token.as_str())];
    for side in &sides[1..] {
        let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name));
        let (status, body) = side.post(&path, json!({})).await;
        assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    }
    let names = ["alice", "carol", "bob"];
    let joined: Vec<String> = names.iter().map(|n| format!("{n} is here")).collect();
    for (side, body) in sides.iter().zip(&joined) {
        side.say(&room, "here", body).await;
    }
    for side in &sides {
        eventually("everyone's hello everywhere", || async {
            side.has_all(&room, &joined).await.then_some(())
        })
        .await;
    }

    // All at once, round by round: the graph forks on every server, and
    // each hears the others' topics in another order.
    let mut said = Vec::new();
    for i in 0..6 {
        let (x, y, z) = tokio::join!(
            step(&sides[0], &room, names[0], i),
            step(&sides[1], &room, names[1], i),
            step(&sides[2], &room, names[2], i)
        );
        said.extend([x, y, z]);
    }
    for side in &sides {
        eventually("every burst everywhere", || async { side.has_all(&room, &said).await.then_some(()) })
            .await;
    }
    // Each answers once it has heard everything: the branches meet.
    let merged: Vec<String> = names.iter().map(|n| format!("{n} heard all")).collect();
    for (side, body) in sides.iter().zip(&merged) {
        side.say(&room, "merge", body).await;
    }
    for side in &sides {
        eventually("every answer everywhere", || async { side.has_all(&room, &merged).await.then_some(()) })
            .await;
    }

    // The same events, each once, and the same state on every server.
    let ours: BTreeSet<&String> = joined.iter().chain(&said).chain(&merged).collect();
    let mut timelines = Vec::new();
    for side in &sides {
        let timeline = side.timeline(&room).await;
        let ids: Vec<&String> = timeline.iter().map(|(id, _)| id).collect();
        let unique: BTreeSet<&String> = ids.iter().copied().collect();
        assert_eq!(ids.len(), unique.len(), "an event twice: {timeline:?}");
        let set: BTreeSet<String> = timeline
            .into_iter()
            .filter(|(_, what)| ours.contains(what) || what == "m.room.topic")
            .map(|(id, _)| id)
            .collect();
        timelines.push(set);
    }
    assert_eq!(timelines[0].len(), ours.len() + 6, "{:?}", timelines[0]);
    assert_eq!(timelines[0], timelines[1], "seqline A and seqline B hold other events");
    assert_eq!(timelines[0], timelines[2], "seqline and Synapse hold other events");
    let states: Vec<BTreeMap<(String, String), String>> = {
        let mut states = Vec::new();
        for side in &sides {
            states.push(side.state(&room).await);
        }
        states
    };
    assert_eq!(states[0], states[1], "seqline A and seqline B disagree on the room's state");
    assert_eq!(states[0], states[2], "seqline and Synapse disagree on the room's state\n{}", syn.log_tail());
}
