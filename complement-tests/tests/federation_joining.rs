//! seqline as the joining side: its users are invited into rooms on a real
//! Synapse (the invite countersigned, its stripped state in their /sync) and
//! turn the invite down (make_leave / send_leave through the inviting
//! server).

use complement_tests::api::{V3, create_room, enc, eventually, message_bodies, room_path, sync_once};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::json;

backend_tests!(
    synapse_invites_a_seqline_user_who_rejects,
    synapse_invites_a_seqline_user_who_rejects_v2,
    seqline_user_joins_a_synapse_room_v12,
    seqline_user_joins_a_synapse_room_v10,
    seqline_user_joins_a_synapse_room_v2,
    a_departed_remote_user_reads_nothing_after_leaving,
    queued_events_reach_a_server_that_was_down,
    a_long_outage_is_caught_up_across_a_hole,
    a_room_rejoined_after_a_time_away_has_its_hole_filled,
    every_acknowledged_event_survives_a_kill,
    a_synapse_moderator_kicks_and_bans_a_seqline_user,
);

async fn synapse_invites_a_seqline_user_who_rejects(backend: Backend) {
    invited_and_rejects(backend, None).await;
}

/// Version 2: Synapse's invite carries its own event id; seqline's leave
/// (make_leave / send_leave) one seqline made.
async fn synapse_invites_a_seqline_user_who_rejects_v2(backend: Backend) {
    invited_and_rejects(backend, Some("2")).await;
}

async fn invited_and_rejects(backend: Backend, version: Option<&str>) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let (status, bob) = syn
        .post(
            &format!("{V3}/register"),
            None,
            json!({
                "username": "bob", "password": "pw", "auth": { "type": "m.login.dummy" }
            }),
        )
        .await;
    assert_eq!(status, 200, "{bob}");
    let bob_token = bob["access_token"].as_str().unwrap().to_owned();
    let bob_id = syn.user_id("bob");
    let (status, created) = syn
        .post(
            &format!("{V3}/createRoom"),
            Some(&bob_token),
            json!({
                "preset": "private_chat", "name": "Bob's room", "room_version": version.unwrap_or("12")
            }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let room = created["room_id"].as_str().unwrap().to_owned();

    let first = sync_once(&seq.server, &alice, None).await;
    let since = first["next_batch"].as_str().unwrap().to_owned();
    let (status, body) =
        syn.post(&room_path(&room, "/invite"), Some(&bob_token), json!({ "user_id": alice_id })).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", syn.log_tail(), seq.server.log());

    // The invite reaches alice's sync with the room's stripped state.
    let invite = eventually("the invite in alice's sync", || async {
        let body = sync_once(&seq.server, &alice, Some(&since)).await;
        body["rooms"]["invite"].get(&room).cloned()
    })
    .await;
    let events = invite["invite_state"]["events"].as_array().unwrap();
    let name = events.iter().find(|e| e["type"] == "m.room.name").unwrap_or_else(|| panic!("{invite}"));
    assert_eq!(name["content"]["name"], "Bob's room");
    let own = events.iter().find(|e| e["type"] == "m.room.member" && e["state_key"] == alice_id.as_str());
    let own = own.unwrap_or_else(|| panic!("{invite}"));
    assert_eq!(
        (own["sender"].as_str(), own["content"]["membership"].as_str()),
        (Some(bob_id.as_str()), Some("invite"))
    );
    // Synapse holds the invite as seqline countersigned it.
    let (status, members) = syn.get(&room_path(&room, "/members"), Some(&bob_token)).await;
    assert_eq!(status, 200, "{members}");
    assert!(members.to_string().contains(&alice_id), "{members}");

    // Alice turns it down: Synapse sees her leave, her sync shows the room left.
    let (status, body) = seq.server.post(&room_path(&room, "/leave"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", seq.server.log());
    let leave = eventually("the rejection on Synapse", || async {
        let (_, members) = syn.get(&room_path(&room, "/members"), Some(&bob_token)).await;
        members["chunk"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["state_key"] == alice_id.as_str() && e["content"]["membership"] == "leave")
            .cloned()
    })
    .await;
    let leave_id = leave["event_id"].as_str().unwrap_or_default();
    if version == Some("2") {
        assert!(leave_id.ends_with(&format!(":{}", seq.name)), "{leave}");
    } else {
        assert!(!leave_id.contains(':'), "{leave}");
    }
    let after = sync_once(&seq.server, &alice, Some(&since)).await;
    assert!(after["rooms"]["leave"].get(&room).is_some(), "{after}");
    assert!(after["rooms"]["invite"].get(&room).is_none(), "{after}");
    // Turning it down twice is refused.
    let (status, _) = seq.server.post(&room_path(&room, "/leave"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 403);
}

async fn seqline_user_joins_a_synapse_room_v12(backend: Backend) {
    joins_a_synapse_room(backend, "12").await;
}

async fn seqline_user_joins_a_synapse_room_v10(backend: Backend) {
    joins_a_synapse_room(backend, "10").await;
}

/// Version 2: event ids are `$<opaque>:<server>`, made by each event's
/// server (Synapse's for bob's, seqline's for alice's join and message), and
/// prev/auth events are `[id, hashes]` pairs. Version 1 rooms stay refused.
async fn seqline_user_joins_a_synapse_room_v2(backend: Backend) {
    joins_a_synapse_room(backend, "2").await;
}

async fn joins_a_synapse_room(backend: Backend, version: &str) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let bob = syn.register("bob", "pw").await;
    let bob_id = syn.user_id("bob");
    let (status, created) = syn
        .post(
            &format!("{V3}/createRoom"),
            Some(&bob.token),
            json!({ "preset": "public_chat", "room_version": version, "name": "On Synapse" }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, _) = syn
        .put(
            &room_path(&room, "/send/m.room.message/b0"),
            Some(&bob.token),
            json!({ "msgtype": "m.text", "body": "before alice" }),
        )
        .await;
    assert_eq!(status, 200);

    // Alice joins through Synapse (the room id alone may not name it).
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, body) = seq.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    assert_eq!(body["room_id"], room.as_str());
    let ids_name_servers = matches!(version, "1" | "2");

    // Both servers agree on who is in.
    let (status, members) = seq.server.get(&room_path(&room, "/joined_members"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{members}");
    let mut here: Vec<String> = members["joined"].as_object().unwrap().keys().cloned().collect();
    here.sort_unstable();
    let mut expected = vec![alice_id.clone(), bob_id.clone()];
    expected.sort_unstable();
    assert_eq!(here, expected);
    // The room's state is readable from the join on: its name, its creator's power.
    let (status, name) = seq.server.get(&room_path(&room, "/state/m.room.name/"), Some(&alice.token)).await;
    assert_eq!((status, name["name"].as_str()), (200, Some("On Synapse")), "{name}");
    let initial = sync_once(&seq.server, &alice, None).await;
    let joined = &initial["rooms"]["join"][&room];
    assert!(joined.is_object(), "{initial}");
    let since = initial["next_batch"].as_str().unwrap().to_owned();

    // Bob talks; alice's sync gets it.
    let (status, sent) = syn
        .put(
            &room_path(&room, "/send/m.room.message/b1"),
            Some(&bob.token),
            json!({ "msgtype": "m.text", "body": "welcome alice" }),
        )
        .await;
    assert_eq!(status, 200, "{sent}");
    let bob_event = sent["event_id"].as_str().unwrap().to_owned();
    eventually("bob's message in alice's sync", || async {
        let body = sync_once(&seq.server, &alice, Some(&since)).await;
        let timeline = &body["rooms"]["join"][&room]["timeline"]["events"];
        timeline.as_array().into_iter().flatten().any(|e| e["event_id"] == bob_event.as_str()).then_some(())
    })
    .await;
    // Alice answers; bob reads it on Synapse, after his own.
    let (status, sent) = seq
        .server
        .put(
            &room_path(&room, "/send/m.room.message/a1"),
            Some(&alice.token),
            json!({ "msgtype": "m.text", "body": "thanks bob" }),
        )
        .await;
    assert_eq!(status, 200, "{sent}");
    let alice_event = sent["event_id"].as_str().unwrap().to_owned();
    if ids_name_servers {
        assert!(alice_event.ends_with(&format!(":{}", seq.name)), "{alice_event}");
        assert!(bob_event.ends_with(&format!(":{}", syn.name)), "{bob_event}");
    } else {
        assert!(!alice_event.contains(':') && !bob_event.contains(':'), "{alice_event} {bob_event}");
    }
    let page = eventually("alice's answer on Synapse", || async {
        let (status, page) = syn.get(&room_path(&room, "/messages?dir=b&limit=50"), Some(&bob.token)).await;
        (status == 200
            && page["chunk"].as_array().unwrap().iter().any(|e| e["event_id"] == alice_event.as_str()))
        .then_some(page)
    })
    .await;
    assert_eq!(message_bodies(&page), ["before alice", "welcome alice", "thanks bob"], "{page}");
    let (status, page) =
        seq.server.get(&room_path(&room, "/messages?dir=b&limit=50"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    // The room is `shared` (public_chat): what was said before alice joined
    // comes from Synapse when her client pages back past her join.
    assert_eq!(message_bodies(&page), ["before alice", "welcome alice", "thanks bob"], "{page}");

    // Alice leaves; Synapse hears of it.
    let (status, body) = seq.server.post(&room_path(&room, "/leave"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    eventually("alice's leave on Synapse", || async {
        let (_, members) = syn.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
        (members["joined"].as_object().is_some_and(|m| !m.contains_key(&alice_id))).then_some(())
    })
    .await;

    if ids_name_servers {
        // Version 1 is not taken part in over federation (no state
        // resolution v1): Synapse's room is refused, nothing is stored.
        let (status, created) = syn
            .post(
                &format!("{V3}/createRoom"),
                Some(&bob.token),
                json!({ "preset": "public_chat", "room_version": "1" }),
            )
            .await;
        assert_eq!(status, 200, "{created}");
        let old = created["room_id"].as_str().unwrap().to_owned();
        let path = format!("{V3}/join/{}?server_name={}", enc(&old), enc(&syn.name));
        let response = seq.server.post(&path, Some(&alice.token), json!({})).await;
        complement_tests::api::assert_error(&response, 400, "M_UNSUPPORTED_ROOM_VERSION", "a v1 room");
        let (status, _) = seq.server.get(&room_path(&old, "/joined_members"), Some(&alice.token)).await;
        assert_eq!(status, 403);
    }
}

/// The bodies a user of `server` reads in `room` (one page back).
async fn seqline_bodies(server: &FedServer, user: &User, room: &str) -> Vec<String> {
    let (status, page) =
        server.server.get(&room_path(room, "/messages?dir=b&limit=50"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    message_bodies(&page)
}

async fn say(server: &FedServer, user: &User, room: &str, txn: &str, body: &str) -> String {
    let path = room_path(room, &format!("/send/m.room.message/{txn}"));
    let (status, sent) =
        server.server.put(&path, Some(&user.token), json!({ "msgtype": "m.text", "body": body })).await;
    assert_eq!(status, 200, "{sent}");
    sent["event_id"].as_str().unwrap().to_owned()
}

async fn join_remote(server: &FedServer, user: &User, room: &str, via: &FedServer) {
    let path = format!("{V3}/join/{}?server_name={}", enc(room), enc(&via.name));
    let (status, body) = server.server.post(&path, Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", server.server.log());
}

/// `user` of `server` leaves `room`, and `host` (read by `reader`) has it.
async fn leave_remote(server: &FedServer, user: &User, room: &str, host: &FedServer, reader: &User) {
    let (status, body) = server.server.post(&room_path(room, "/leave"), Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    eventually("the leave on the host", || async {
        let (_, members) = host.server.get(&room_path(room, "/joined_members"), Some(&reader.token)).await;
        (!members["joined"].as_object().unwrap().contains_key(&user.user_id)).then_some(())
    })
    .await;
}

/// Two seqline servers: bob and carol of B join a room of A; after bob
/// leaves, what A's alice says reaches carol and never bob (sync, messages,
/// event).
async fn a_departed_remote_user_reads_nothing_after_leaving(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let (bob, carol) = (b.server.register("bob", "pw").await, b.server.register("carol", "pw").await);
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "12" })).await;
    say(&a, &alice, &room, "a1", "one").await;
    join_remote(&b, &bob, &room, &a).await;
    join_remote(&b, &carol, &room, &a).await;
    say(&a, &alice, &room, "a2", "two").await;
    eventually("'two' on B", || async {
        seqline_bodies(&b, &carol, &room).await.contains(&"two".to_owned()).then_some(())
    })
    .await;
    // The room is `shared`: "one", from before their joins, is backfilled from A.
    assert_eq!(seqline_bodies(&b, &bob, &room).await, ["one", "two"]);

    let before_leave = sync_once(&b.server, &bob, None).await["next_batch"].as_str().unwrap().to_owned();
    leave_remote(&b, &bob, &room, &a, &alice).await;
    let three = say(&a, &alice, &room, "a3", "three").await;
    eventually("'three' reaches carol", || async {
        (seqline_bodies(&b, &carol, &room).await == ["one", "two", "three"]).then_some(())
    })
    .await;
    // Bob: not in /messages, not in /sync after his leave, not by id.
    assert_eq!(seqline_bodies(&b, &bob, &room).await, ["one", "two"]);
    let sync = sync_once(&b.server, &bob, Some(&before_leave)).await;
    assert!(!sync.to_string().contains("three"), "{sync}");
    let (status, _) =
        b.server.get(&room_path(&room, &format!("/event/{}", enc(&three))), Some(&bob.token)).await;
    assert_eq!(status, 404);
    let (status, event) =
        b.server.get(&room_path(&room, &format!("/event/{}", enc(&three))), Some(&carol.token)).await;
    assert_eq!((status, event["content"]["body"].as_str()), (200, Some("three")), "{event}");
}

/// What A sends while B is down reaches B once it is back, after A itself
/// restarted in between (the queue is in A's database), in order.
async fn queued_events_reach_a_server_that_was_down(backend: Backend) {
    let (mut a, mut b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    join_remote(&b, &bob, &room, &a).await;
    b.server.stop().await;
    for (i, body) in ["while", "you were", "out"].iter().enumerate() {
        say(&a, &alice, &room, &format!("q{i}"), body).await;
    }
    a.server.restart().await;
    b.server.start_again().await;
    eventually("the queued events on B", || async {
        (seqline_bodies(&b, &bob, &room).await == ["while", "you were", "out"]).then_some(())
    })
    .await;
}

/// B is away while A's alice says more than A keeps queued for it (the
/// bound here is 5): A keeps only the newest event of the room (and the
/// transaction it had begun). When B is back it gets that, asks A for what
/// lies between (/get_missing_events, 10 at most), places the oldest it got
/// across the hole with the state A says it had (/state_ids), and the room
/// goes on: bob reads the newest, what came after, in A's order.
async fn a_long_outage_is_caught_up_across_a_hole(backend: Backend) {
    let (mut a, mut b) = tokio::join!(
        FedServer::start_with(&backend, &[("SEQLINE_FEDERATION_MAX_QUEUED", "5")]),
        FedServer::start(&backend)
    );
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    join_remote(&b, &bob, &room, &a).await;
    b.server.stop().await;
    // A first send fails and its transaction is begun with m0 alone.
    say(&a, &alice, &room, "m0", "m0").await;
    eventually("A's first failed send", || async {
        a.server.log().contains("federation send failed").then_some(())
    })
    .await;
    let said: Vec<String> = (1..=20).map(|i| format!("m{i}")).collect();
    for body in &said {
        say(&a, &alice, &room, body, body).await;
    }
    eventually("A's queue for B cut to the newest event", || async {
        a.server.log().contains("kept only the newest queued event of each room").then_some(())
    })
    .await;
    // Back; A tries at once after a restart.
    b.server.start_again().await;
    a.server.restart().await;
    let bodies = eventually("m20 on B", || async {
        let bodies = seqline_bodies(&b, &bob, &room).await;
        bodies.contains(&"m20".to_owned()).then_some(bodies)
    })
    .await;
    assert!(b.server.log().contains("placing an event across a hole"), "{}", b.server.log());
    // What B has is in A's order, the newest ten among it.
    let positions: Vec<usize> = bodies.iter().filter_map(|b| said.iter().position(|s| s == b)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{bodies:?}");
    for body in &said[10..] {
        assert!(bodies.contains(body), "{body} missing from {bodies:?}");
    }
    // And the room goes on both ways.
    say(&a, &alice, &room, "after", "after").await;
    eventually("'after' on B", || async {
        (seqline_bodies(&b, &bob, &room).await.last().map(String::as_str) == Some("after")).then_some(())
    })
    .await;
    say(&b, &bob, &room, "bob back", "bob back").await;
    eventually("bob's answer on A", || async {
        (seqline_bodies(&a, &alice, &room).await.last().map(String::as_str) == Some("bob back")).then_some(())
    })
    .await;
}

/// B's only member of A's room leaves, A's alice says more while B is
/// away, bob joins again: what was said meanwhile is a hole in B's line
/// below the rejoin (B never heard of it). The room is `shared`, so bob may
/// read it: paging back fills the hole from A, in A's order, and B's
/// history goes on below it as before.
async fn a_room_rejoined_after_a_time_away_has_its_hole_filled(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "12" })).await;
    say(&a, &alice, &room, "a1", "before").await;
    join_remote(&b, &bob, &room, &a).await;
    say(&b, &bob, &room, "b1", "bob was here").await;
    eventually("bob's message on A", || async {
        seqline_bodies(&a, &alice, &room).await.contains(&"bob was here".to_owned()).then_some(())
    })
    .await;
    leave_remote(&b, &bob, &room, &a, &alice).await;
    let away: Vec<String> = (1..=6).map(|i| format!("while away {i}")).collect();
    for (i, body) in away.iter().enumerate() {
        say(&a, &alice, &room, &format!("w{i}"), body).await;
    }
    join_remote(&b, &bob, &room, &a).await;
    say(&a, &alice, &room, "a2", "welcome back").await;
    let mut want = vec!["before".to_owned(), "bob was here".to_owned()];
    want.extend(away.iter().cloned());
    want.push("welcome back".to_owned());
    let bodies = eventually("the rejoined room read whole on B", || async {
        let bodies = seqline_bodies(&b, &bob, &room).await;
        (bodies.last().map(String::as_str) == Some("welcome back")).then_some(bodies)
    })
    .await;
    assert_eq!(bodies, want, "{}", b.server.log());
    assert_eq!(seqline_bodies(&a, &alice, &room).await, want);
}

/// Kill -9, of the sender and then of the receiver, while messages are
/// being sent: after each comes back, every message whose send was
/// answered 200 reaches the other server, once.
async fn every_acknowledged_event_survives_a_kill(backend: Backend) {
    let (mut a, mut b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    join_remote(&b, &bob, &room, &a).await;
    let mut acked: Vec<String> = Vec::new();

    // The sender dies with events queued (or in flight) for B.
    for i in 0..10 {
        let body = format!("before a dies {i}");
        say(&a, &alice, &room, &body, &body).await;
        acked.push(body);
    }
    a.server.kill().await;
    a.server.start_again().await;
    // The receiver dies while A sends to it.
    let sending = async {
        let mut sent = Vec::new();
        for i in 0..10 {
            let body = format!("while b dies {i}");
            say(&a, &alice, &room, &body, &body).await;
            sent.push(body);
        }
        sent
    };
    let (sent, ()) = tokio::join!(sending, async {
        b.server.kill().await;
    });
    acked.extend(sent);
    b.server.start_again().await;
    // A tries again at once after its restart (else its backoff decides when).
    a.server.restart().await;
    let bodies = eventually("every acknowledged message on B", || async {
        let bodies = seqline_bodies(&b, &bob, &room).await;
        acked.iter().all(|m| bodies.contains(m)).then_some(bodies)
    })
    .await;
    let mut unique = bodies.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), bodies.len(), "a message twice: {bodies:?}");
    assert_eq!(bodies, acked, "in the order A sent them");
}

/// Moderation from the other side: the Synapse room's creator kicks alice
/// of seqline (her /sync shows the room left, what is said afterwards never
/// reaches her), she rejoins, and a ban keeps her out.
async fn a_synapse_moderator_kicks_and_bans_a_seqline_user(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let bob = syn.register("bob", "pw").await;
    let (status, created) = syn
        .post(
            &format!("{V3}/createRoom"),
            Some(&bob.token),
            json!({ "preset": "public_chat", "room_version": "12" }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let room = created["room_id"].as_str().unwrap().to_owned();
    let join_path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, body) = seq.server.post(&join_path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let since = sync_once(&seq.server, &alice, None).await["next_batch"].as_str().unwrap().to_owned();

    let (status, body) = syn
        .post(&room_path(&room, "/kick"), Some(&bob.token), json!({ "user_id": alice_id, "reason": "out" }))
        .await;
    assert_eq!(status, 200, "{body}");
    eventually("the kick in alice's sync", || async {
        let sync = sync_once(&seq.server, &alice, Some(&since)).await;
        sync["rooms"]["leave"][&room].is_object().then_some(())
    })
    .await;
    let (status, _) = syn
        .put(
            &room_path(&room, "/send/m.room.message/k1"),
            Some(&bob.token),
            json!({ "msgtype": "m.text", "body": "after the kick" }),
        )
        .await;
    assert_eq!(status, 200);
    // Sending is refused for her now, and she never reads what came after.
    let (status, _) = seq
        .server
        .put(
            &room_path(&room, "/send/m.room.message/a1"),
            Some(&alice.token),
            json!({ "msgtype": "m.text", "body": "still here?" }),
        )
        .await;
    assert_eq!(status, 403);
    let (_, page) = seq.server.get(&room_path(&room, "/messages?dir=b&limit=50"), Some(&alice.token)).await;
    assert!(!message_bodies(&page).contains(&"after the kick".to_owned()), "{page}");

    // A ban: her join is refused.
    let (status, body) =
        syn.post(&room_path(&room, "/ban"), Some(&bob.token), json!({ "user_id": alice_id })).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = seq.server.post(&join_path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 403, "{body}");
}
