//! seqline as the resident server: a real Synapse's user joins a seqline
//! room (make_join / send_join v2), both talk (seqline's durable outgoing
//! queue one way, Synapse's /send transactions the other), history from
//! before the join stays hidden from the joiner under `joined` (Synapse gets
//! only redacted copies), and the leave reaches seqline. Room versions 12
//! (seqline's default), 10 and 2 (event ids carried in the PDU).

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use complement_tests::acting::Acting;
use complement_tests::api::{
    V3, assert_error, create_room, deactivate, enc, event_id_of, eventually, join as join_locally,
    message_bodies, reads_agree, room_path, text,
};
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, now_ms};
use complement_tests::harness::{Backend, User};
use complement_tests::pdu;
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    synapse_user_joins_talks_and_leaves_v12,
    synapse_user_joins_talks_and_leaves_v10,
    synapse_user_joins_talks_and_leaves_v2,
    remote_joins_and_events_are_checked,
    synapse_user_is_invited_joins_and_is_kicked,
    public_rooms_are_read_across_servers,
    remote_invites_and_joins_are_checked,
    a_partial_join_completes,
    server_acls_are_enforced,
    a_server_whose_users_all_left_may_not_send,
    v2_event_ids_must_be_signed_by_the_server_they_name,
    erased_users_events_go_to_other_servers_redacted,
    a_remote_depth_cannot_break_local_writes,
    a_remote_timestamp_cannot_age_out_a_rooms_history,
    a_transaction_over_two_rooms_is_taken_once_in_order,
    a_local_event_names_at_most_ten_prev_events,
    a_server_may_redact_its_own_users_events_only,
    what_a_server_adds_or_piles_up_is_not_taken,
    remote_events_are_authorised_where_they_stand,
    concurrent_state_resolves_by_the_rules,
    a_join_undone_by_resolution_ends_the_stay,
    a_branch_from_before_a_join_stays_hidden_under_joined,
    soft_failed_events_are_kept_and_never_shown,
);

async fn synapse_user_joins_talks_and_leaves_v12(backend: Backend) {
    joins_talks_and_leaves(backend, "12").await;
}

async fn synapse_user_joins_talks_and_leaves_v10(backend: Backend) {
    joins_talks_and_leaves(backend, "10").await;
}

/// Version 2: each server makes the ids of its own events
/// (`$<opaque>:<server>`), prev/auth events are `[id, hashes]` pairs.
async fn synapse_user_joins_talks_and_leaves_v2(backend: Backend) {
    joins_talks_and_leaves(backend, "2").await;
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
    if matches!(version, "1" | "2") {
        assert!(alice_event.ends_with(&format!(":{}", seq.name)), "{alice_event}");
        assert!(bob_event.ends_with(&format!(":{}", syn.name)), "{bob_event}");
    } else {
        assert!(!alice_event.contains(':') && !bob_event.contains(':'), "{alice_event} {bob_event}");
    }
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
    assert_eq!(message_bodies(&page), ["hello from synapse", "hello from seqline"], "{page}");
    assert!(!page.to_string().contains("before bob"), "{page}");
    let (status, hidden) =
        syn.get(&room_path(&room, &format!("/event/{}", enc(&before_id))), Some(&bob.token)).await;
    assert!(status == 404 || hidden["content"].get("body").is_none(), "{status} {hidden}");
    let page = seqline_messages(&seq, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["before bob", "hello from synapse", "hello from seqline"], "{page}");

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
    assert_eq!(message_bodies(&page).last().map(String::as_str), Some("after bob"));
}

/// The event id of the state event of `kind` in a send_join answer's state.
fn state_id(state: &Value, kind: &str, state_key: &str) -> String {
    state
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == kind && e["state_key"] == state_key)
        .map(pdu::event_id)
        .unwrap_or_else(|| panic!("no {kind} in {state}"))
}

async fn remote_joins_and_events_are_checked(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(
        &a.server,
        &alice,
        json!({
            "preset": "public_chat", "room_version": "11",
            "initial_state": [{
                "type": "m.room.history_visibility", "state_key": "",
                "content": { "history_visibility": "joined" }
            }],
        }),
    )
    .await;
    let (_, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/t0"), Some(&alice.token), text("secret before"))
        .await;
    let secret = event_id_of(&sent);
    let make_join = |user: &str, ver: &str| {
        format!("/_matrix/federation/v1/make_join/{}/{}?ver={ver}", enc(&room), enc(user))
    };

    // Only for its own users, only in versions it names, only in rooms we have.
    let carol = format!("@carol:127.0.0.1:{}", complement_tests::federation::free_port());
    assert_error(
        &acting.call("GET", &make_join(&carol, "11"), None).await,
        403,
        "M_FORBIDDEN",
        "another server's user",
    );
    let old = acting.call("GET", &make_join(&bob, "1"), None).await;
    assert_error(&old, 400, "M_INCOMPATIBLE_ROOM_VERSION", "version 1 only");
    assert_eq!(old.1["room_version"], "11");
    let unknown = format!("/_matrix/federation/v1/make_join/{}/{}?ver=11", enc("!nope:elsewhere"), enc(&bob));
    assert_error(&acting.call("GET", &unknown, None).await, 404, "M_NOT_FOUND", "unknown room");
    // Nothing of the room for a server with no user in it.
    let event_uri = format!("/_matrix/federation/v1/event/{}", enc(&secret));
    assert_error(&acting.call("GET", &event_uri, None).await, 403, "M_FORBIDDEN", "event before joining");
    let r = enc(&room);
    let s = enc(&secret);
    let gme = json!({ "earliest_events": [], "latest_events": [secret], "limit": 10 });
    for (method, uri, body) in [
        ("GET", format!("/_matrix/federation/v1/state/{r}?event_id={s}"), None),
        ("GET", format!("/_matrix/federation/v1/state_ids/{r}?event_id={s}"), None),
        ("GET", format!("/_matrix/federation/v1/event_auth/{r}/{s}"), None),
        ("GET", format!("/_matrix/federation/v1/backfill/{r}?v={s}&limit=10"), None),
        ("POST", format!("/_matrix/federation/v1/get_missing_events/{r}"), Some(&gme)),
    ] {
        let answer = acting.call(method, &uri, body).await;
        assert_error(&answer, 403, "M_FORBIDDEN", &format!("{uri} before joining"));
        assert!(!answer.1.to_string().contains("secret before"), "{uri}: {answer:?}");
    }
    // A leave for a user who is not in the room, or for another server's user.
    let make_leave = |user: &str| format!("/_matrix/federation/v1/make_leave/{r}/{}", enc(user));
    assert_error(
        &acting.call("GET", &make_leave(&bob), None).await,
        403,
        "M_FORBIDDEN",
        "leave of a non-member",
    );
    assert_error(
        &acting.call("GET", &make_leave(&carol), None).await,
        403,
        "M_FORBIDDEN",
        "leave of another server's user",
    );

    let (status, template) = acting.call("GET", &make_join(&bob, "11"), None).await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(template["room_version"], "11");
    let mut join = template["event"].clone();
    assert_eq!(
        (join["type"].as_str(), join["state_key"].as_str()),
        (Some("m.room.member"), Some(bob.as_str()))
    );
    assert_eq!(join["content"], json!({ "membership": "join" }));
    assert!(join.get("signatures").is_none() && join.get("hashes").is_none(), "{join}");
    let join_id = acting.sign(&mut join);
    let send_join = |id: &str| format!("/_matrix/federation/v2/send_join/{}/{}", enc(&room), enc(id));

    // The path must name the event; the signature must be the sender's server's.
    assert_error(
        &acting.call("PUT", &send_join(&secret), Some(&join)).await,
        400,
        "M_BAD_JSON",
        "another event id",
    );
    let mut forged = join.clone();
    forged["signatures"][&b.name][&acting.key.0] = json!(STANDARD_NO_PAD.encode([7u8; 64]));
    assert_error(
        &acting.call("PUT", &send_join(&join_id), Some(&forged)).await,
        400,
        "M_INVALID_SIGNATURE",
        "forged",
    );

    let (status, answer) = acting.call("PUT", &send_join(&join_id), Some(&join)).await;
    assert_eq!(status, 200, "{answer}\n{}", a.server.log());
    let state = &answer["state"];
    let create_id = state_id(state, "m.room.create", "");
    let power_id = state_id(state, "m.room.power_levels", "");
    assert!(
        answer["auth_chain"].as_array().unwrap().iter().any(|e| pdu::event_id(e) == create_id),
        "{answer}"
    );
    assert!(
        state.as_array().unwrap().iter().all(|e| e["state_key"] != bob.as_str()),
        "state before the join"
    );
    assert_eq!(pdu::event_id(&answer["event"]), join_id);
    let mut servers: Vec<&str> =
        answer["servers_in_room"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    servers.sort_unstable();
    let mut expected = vec![a.name.as_str(), b.name.as_str()];
    expected.sort_unstable();
    assert_eq!(servers, expected);

    // History from before the join goes out redacted (`joined`).
    let (status, before) = acting.call("GET", &event_uri, None).await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(before["pdus"][0]["content"], json!({}), "{before}");

    // Bob talks through a transaction; a retry of it changes nothing.
    let depth = join["depth"].as_i64().unwrap();
    let message = |body: &str, prev: &str| {
        json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": [prev], "auth_events": [create_id, power_id, join_id],
            "depth": depth + 1, "origin_server_ts": now_ms(),
        })
    };
    let mut hello = message("hello from b", &join_id);
    let hello_id = acting.sign(&mut hello);
    for _ in 0..2 {
        let (status, results) = acting.send_txn("t1", &[&hello]).await;
        assert_eq!(status, 200, "{results}");
        assert_eq!(results["pdus"], json!({ hello_id.clone(): {} }));
    }
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["secret before", "hello from b"], "{page}");

    // A PDU whose content was changed after signing is kept redacted.
    let mut tampered = message("original", &hello_id);
    let tampered_id = acting.sign(&mut tampered);
    tampered["content"]["body"] = json!("changed in transit");
    // Unknown prev events, or another server's user: refused one by one.
    let mut orphan = message("orphan", "$unknown-event-id-aaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    let orphan_id = acting.sign(&mut orphan);
    let mut impostor = message("impostor", &hello_id);
    impostor["sender"] = json!(carol);
    let impostor_id = acting.sign(&mut impostor);
    let (status, results) = acting.send_txn("t2", &[&tampered, &orphan, &impostor]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&tampered_id], json!({}), "{results}");
    assert!(results["pdus"][&orphan_id]["error"].is_string(), "{results}");
    assert!(results["pdus"][&impostor_id]["error"].is_string(), "{results}");
    let page = seqline_messages(&a, &alice, &room).await;
    let chunk = page["chunk"].as_array().unwrap();
    let kept =
        chunk.iter().find(|e| e["event_id"] == tampered_id.as_str()).unwrap_or_else(|| panic!("{page}"));
    assert_eq!(kept["content"], json!({}), "{kept}");
    assert!(!page.to_string().contains("orphan") && !page.to_string().contains("impostor"), "{page}");

    // Backfill and state: what B may read whole, the rest redacted.
    let backfill = format!("/_matrix/federation/v1/backfill/{}?v={}&limit=10", enc(&room), enc(&hello_id));
    let (status, page) = acting.call("GET", &backfill, None).await;
    assert_eq!(status, 200, "{page}");
    let pdus = page["pdus"].as_array().unwrap();
    let find = |id: &str| {
        pdus.iter().find(|e| pdu::event_id(e) == id).unwrap_or_else(|| panic!("{id} not in {page}"))
    };
    assert_eq!(find(&hello_id)["content"]["body"], "hello from b");
    assert_eq!(find(&secret)["content"], json!({}));
    let state_ids = format!("/_matrix/federation/v1/state_ids/{}?event_id={}", enc(&room), enc(&hello_id));
    let (status, ids) = acting.call("GET", &state_ids, None).await;
    assert_eq!(status, 200, "{ids}");
    let pdu_ids: Vec<&str> = ids["pdu_ids"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(pdu_ids.contains(&join_id.as_str()) && pdu_ids.contains(&create_id.as_str()), "{ids}");

    // Banned: B's next message is refused, and B may ask nothing more.
    let ban = json!({ "user_id": bob, "reason": "test" });
    let (status, body) = a.server.post(&room_path(&room, "/ban"), Some(&alice.token), ban).await;
    assert_eq!(status, 200, "{body}");
    // B has no one left in the room: it may send nothing more to it.
    let mut late = message("after the ban", &tampered_id);
    let late_id = acting.sign(&mut late);
    let (status, results) = acting.send_txn("t3", &[&late]).await;
    assert_eq!(status, 200, "{results}");
    assert!(results["pdus"][&late_id]["error"].is_string(), "{results}");
    let page = seqline_messages(&a, &alice, &room).await;
    assert!(!page.to_string().contains("after the ban"), "{page}");
    assert_error(&acting.call("GET", &event_uri, None).await, 403, "M_FORBIDDEN", "after the ban");
    // A transaction too large is refused whole.
    let many: Vec<&Value> = std::iter::repeat_n(&late, 51).collect();
    assert_error(&acting.send_txn("t4", &many).await, 400, "M_BAD_JSON", "51 PDUs");
}

/// The rooms of one section (`invite`, `join`, `leave`) of a Synapse /sync.
async fn synapse_rooms(syn: &Synapse, token: &str, section: &str) -> Value {
    let (status, body) = syn.get(&format!("{V3}/sync?timeout=0"), Some(token)).await;
    assert_eq!(status, 200, "{body}");
    body["rooms"][section].clone()
}

async fn synapse_user_is_invited_joins_and_is_kicked(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let bob = syn.register("bob", "pw").await;
    let bob_id = syn.user_id("bob");

    // A direct chat made with bob invited: his server signs the invite, his
    // sync shows it with the room's stripped state.
    let room = create_room(
        &seq.server,
        &alice,
        json!({ "preset": "private_chat", "is_direct": true, "invite": [bob_id], "name": "Alice and Bob" }),
    )
    .await;
    let invite = eventually("the invite on Synapse", || async {
        let rooms = synapse_rooms(&syn, &bob.token, "invite").await;
        rooms.get(&room).cloned()
    })
    .await;
    let stripped = invite["invite_state"]["events"].as_array().unwrap();
    let name = stripped.iter().find(|e| e["type"] == "m.room.name").unwrap_or_else(|| panic!("{invite}"));
    assert_eq!(name["content"]["name"], "Alice and Bob");
    let own = stripped.iter().find(|e| e["type"] == "m.room.member" && e["state_key"] == bob_id.as_str());
    assert_eq!(own.map(|e| e["content"]["is_direct"].clone()), Some(json!(true)), "{invite}");
    let (status, members) = seq.server.get(&room_path(&room, "/members"), Some(&alice.token)).await;
    assert_eq!(status, 200);
    let invited = members["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["state_key"] == bob_id.as_str() && e["content"]["membership"] == "invite");
    assert!(invited, "{members}\n{}", seq.server.log());

    // Bob accepts: Synapse joins through seqline.
    let (status, joined) = syn.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{joined}\n{}", syn.log_tail());
    let mut expected = vec![alice_id.clone(), bob_id.clone()];
    expected.sort_unstable();
    assert_eq!(joined_members(&seq, &alice, &room).await, expected);

    // Alice kicks bob: the kick reaches his server, his sync shows the room left.
    let kick = json!({ "user_id": bob_id, "reason": "bye" });
    let (status, body) = seq.server.post(&room_path(&room, "/kick"), Some(&alice.token), kick).await;
    assert_eq!(status, 200, "{body}");
    eventually("the kick on Synapse", || async {
        let (status, members) = syn.get(&room_path(&room, "/members"), Some(&bob.token)).await;
        let kicked = status == 200
            && members["chunk"].as_array().unwrap().iter().any(|e| {
                e["state_key"] == bob_id.as_str()
                    && e["content"]["membership"] == "leave"
                    && e["sender"] == alice_id.as_str()
            });
        kicked.then_some(())
    })
    .await;
    assert_eq!(joined_members(&seq, &alice, &room).await, [alice_id]);

    // An invite to a user of a server that cannot be reached fails cleanly,
    // and nothing is stored.
    let nowhere = format!("@carol:127.0.0.1:{}", complement_tests::federation::free_port());
    let response = seq
        .server
        .post(&room_path(&room, "/invite"), Some(&alice.token), json!({ "user_id": nowhere }))
        .await;
    assert_eq!(response.0, 502, "{}", response.1);
    let (_, members) = seq.server.get(&room_path(&room, "/members"), Some(&alice.token)).await;
    assert!(!members.to_string().contains("carol"), "{members}");
}

/// The room ids of a /publicRooms answer.
fn listed(body: &Value) -> Vec<String> {
    body["chunk"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["room_id"].as_str().map(str::to_owned))
        .collect()
}

async fn public_rooms_are_read_across_servers(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let ours = create_room(
        &seq.server,
        &alice,
        json!({ "preset": "public_chat", "visibility": "public", "name": "Seqline lobby" }),
    )
    .await;
    let (status, created) = syn
        .post(
            &format!("{V3}/createRoom"),
            Some(&bob.token),
            json!({ "preset": "public_chat", "visibility": "public", "name": "Synapse lobby" }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let theirs = created["room_id"].as_str().unwrap().to_owned();

    // Synapse's user reads seqline's directory through Synapse.
    let (status, body) =
        syn.get(&format!("{V3}/publicRooms?server={}", enc(&seq.name)), Some(&bob.token)).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    assert_eq!(listed(&body), std::slice::from_ref(&ours), "{body}");
    assert_eq!(body["chunk"][0]["name"], "Seqline lobby");
    // seqline's user reads Synapse's through seqline, filtered too (Synapse
    // lists a new room once its statistics have caught up).
    eventually("Synapse's room in its own directory", || async {
        let (_, body) = syn.get(&format!("{V3}/publicRooms"), Some(&bob.token)).await;
        (listed(&body) == [theirs.clone()]).then_some(())
    })
    .await;
    let path = format!("{V3}/publicRooms?server={}", enc(&syn.name));
    eventually("Synapse's room in its directory, read through seqline", || async {
        let (status, body) = seq.server.get(&path, Some(&alice.token)).await;
        assert_eq!(status, 200, "{body}\n{}", seq.server.log());
        (listed(&body) == [theirs.clone()]).then_some(())
    })
    .await;
    let filter = json!({ "filter": { "generic_search_term": "synapse" } });
    let (status, body) = seq
        .server
        .post(&format!("{V3}/publicRooms?server={}", enc(&syn.name)), Some(&alice.token), filter)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(listed(&body), [theirs], "{body}");
    let filter = json!({ "filter": { "generic_search_term": "nothing like it" } });
    let (status, body) = seq
        .server
        .post(&format!("{V3}/publicRooms?server={}", enc(&syn.name)), Some(&alice.token), filter)
        .await;
    assert_eq!((status, listed(&body).len()), (200, 0), "{body}");
    // Our own name, or none: our directory.
    let (status, body) =
        seq.server.get(&format!("{V3}/publicRooms?server={}", enc(&seq.name)), Some(&alice.token)).await;
    assert_eq!((status, listed(&body)), (200, vec![ours]), "{body}");
    // A server that cannot be reached: 502.
    let nowhere = format!("127.0.0.1:{}", complement_tests::federation::free_port());
    let (status, body) =
        seq.server.get(&format!("{V3}/publicRooms?server={}", enc(&nowhere)), Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (502, Some("M_UNKNOWN")), "{body}");
}

/// Invites from another server (acting as B) are checked before anything is
/// kept: the room version, the event the path names, the invitee, who sent
/// it; a good one reaches the invitee's sync countersigned. Joins through a
/// server that cannot be reached, or that does not know the room, fail cleanly.
async fn remote_invites_and_joins_are_checked(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let alice_id = a.user_id("alice");
    let bob = b.user_id("bob");
    let room = format!("!remote:{}", b.name);
    let invite = |target: &str, sender: &str| {
        json!({
            "type": "m.room.member", "room_id": room, "sender": sender, "state_key": target,
            "content": { "membership": "invite" },
            "prev_events": ["$prev-event-id-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"],
            "auth_events": [], "depth": 5, "origin_server_ts": now_ms(),
        })
    };
    let acting = &acting;
    let put = |id: &str, version: &str, event: &Value| {
        let uri = format!("/_matrix/federation/v2/invite/{}/{}", enc(&room), enc(id));
        let body = json!({ "room_version": version, "event": event, "invite_room_state": [] });
        async move { acting.call("PUT", &uri, Some(&body)).await }
    };
    let since = complement_tests::api::sync_once(&a.server, &alice, None).await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut good = invite(&alice_id, &bob);
    let good_id = acting.sign(&mut good);
    assert_error(&put(&good_id, "1", &good).await, 400, "M_INCOMPATIBLE_ROOM_VERSION", "room version 1");
    assert_error(&put("$another-id", "11", &good).await, 400, "M_BAD_JSON", "another event id");
    let mut nobody = invite(&a.user_id("nobody"), &bob);
    let nobody_id = acting.sign(&mut nobody);
    assert_error(&put(&nobody_id, "11", &nobody).await, 404, "M_NOT_FOUND", "an unknown invitee");
    let carol = format!("@carol:127.0.0.1:{}", complement_tests::federation::free_port());
    let mut impostor = invite(&alice_id, &carol);
    let impostor_id = acting.sign(&mut impostor);
    let response = put(&impostor_id, "11", &impostor).await;
    assert!(matches!(response.0, 400 | 403), "{response:?}");
    let sync = complement_tests::api::sync_once(&a.server, &alice, Some(&since)).await;
    assert!(sync["rooms"]["invite"].get(&room).is_none(), "{sync}");

    let (status, signed) = put(&good_id, "11", &good).await;
    assert_eq!(status, 200, "{signed}\n{}", a.server.log());
    assert!(signed["event"]["signatures"][&a.name].is_object(), "{signed}");
    assert!(signed["event"]["signatures"][&b.name].is_object(), "{signed}");
    let sync = complement_tests::api::sync_once(&a.server, &alice, Some(&since)).await;
    let events =
        sync["rooms"]["invite"][&room]["invite_state"]["events"].as_array().cloned().unwrap_or_default();
    assert!(
        events.iter().any(|e| e["state_key"] == alice_id.as_str() && e["sender"] == bob.as_str()),
        "{sync}"
    );

    // Joins through a server that cannot be reached, or that lacks the room.
    let nowhere = format!("127.0.0.1:{}", complement_tests::federation::free_port());
    let path = format!("{V3}/join/{}?server_name={}", enc("!unknown:elsewhere"), enc(&nowhere));
    let (status, body) = a.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (502, Some("M_UNKNOWN")), "{body}");
    let path = format!("{V3}/join/{}?server_name={}", enc("!unknown:elsewhere"), enc(&b.name));
    let (status, body) = a.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
}

/// Synapse joins with `omit_members`: seqline answers the state without most
/// member events (members_omitted), and Synapse fetches the rest from
/// seqline (/state_ids, /state, /event) until it knows every member.
async fn a_partial_join_completes(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let room = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    let mut expected = vec![seq.user_id("alice")];
    for i in 0..9 {
        let user = seq.server.register(&format!("member{i}"), "pw").await;
        complement_tests::api::join(&seq.server, &user, &room).await;
        expected.push(user.user_id.clone());
    }
    let bob = syn.register("bob", "pw").await;
    expected.push(syn.user_id("bob"));
    expected.sort_unstable();
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&seq.name));
    let (status, body) = syn.post(&path, Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    eventually("every member known to Synapse", || async {
        let (status, members) = syn.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
        let mut known: Vec<String> =
            members["joined"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        known.sort_unstable();
        (status == 200 && known == expected).then_some(())
    })
    .await;
}

/// A room's server ACL shuts a server out of every federation entry point:
/// joins through us, its PDUs, the events it asks for.
async fn server_acls_are_enforced(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let deny_b = json!({ "allow": ["*"], "deny": ["127.0.0.1"] });
    let room = create_room(
        &a.server,
        &alice,
        json!({
            "preset": "public_chat", "room_version": "11",
            "initial_state": [{ "type": "m.room.server_acl", "state_key": "", "content": deny_b }],
        }),
    )
    .await;
    let make_join = format!("/_matrix/federation/v1/make_join/{}/{}?ver=11", enc(&room), enc(&bob));
    assert_error(
        &acting.call("GET", &make_join, None).await,
        403,
        "M_FORBIDDEN",
        "make_join denied by the ACL",
    );

    // Let it in, join, then shut it out again.
    let acl_path = room_path(&room, "/state/m.room.server_acl/");
    let (status, body) = a.server.put(&acl_path, Some(&alice.token), json!({ "allow": ["*"] })).await;
    assert_eq!(status, 200, "{body}");
    let (join_id, join, answer) = acting.join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let (status, body) = a.server.put(&acl_path, Some(&alice.token), deny_b).await;
    assert_eq!(status, 200, "{body}");

    let mut message = json!({
        "type": "m.room.message", "room_id": room, "sender": bob,
        "content": { "msgtype": "m.text", "body": "denied" },
        "prev_events": [join_id], "auth_events": [create_id, power_id, join_id],
        "depth": join["depth"].as_i64().unwrap() + 1, "origin_server_ts": now_ms(),
    });
    let message_id = acting.sign(&mut message);
    let (status, results) = acting.send_txn("acl1", &[&message]).await;
    assert_eq!(status, 200, "{results}");
    assert!(results["pdus"][&message_id]["error"].as_str().is_some_and(|e| e.contains("ACL")), "{results}");
    let event_uri = format!("/_matrix/federation/v1/event/{}", enc(&join_id));
    assert_error(&acting.call("GET", &event_uri, None).await, 403, "M_FORBIDDEN", "/event denied by the ACL");
    let page = seqline_messages(&a, &alice, &room).await;
    assert!(!page.to_string().contains("denied\""), "{page}");

    // Nor may it invite our users into the room (the spec names /invite
    // among the endpoints an ACL closes), whether or not we are in it.
    let carol = a.server.register("carol", "pw").await;
    let carol_id = a.user_id("carol");
    let mut invite = json!({
        "type": "m.room.member", "room_id": room, "sender": bob, "state_key": carol_id,
        "content": { "membership": "invite" },
        "prev_events": [join_id], "auth_events": [create_id, power_id, join_id],
        "depth": join["depth"].as_i64().unwrap() + 1, "origin_server_ts": now_ms(),
    });
    let invite_id = acting.sign(&mut invite);
    let uri = format!("/_matrix/federation/v2/invite/{}/{}", enc(&room), enc(&invite_id));
    let body = json!({ "room_version": "11", "event": invite, "invite_room_state": [] });
    let answer = acting.call("PUT", &uri, Some(&body)).await;
    assert_error(&answer, 403, "M_FORBIDDEN", "an invite from a server the ACL denies");
    let synced = complement_tests::api::sync_once(&a.server, &carol, None).await;
    assert!(synced["rooms"]["invite"].get(&room).is_none(), "{synced}");
}

/// Another server may send into a room only while one of its users is
/// joined (its own users' member events aside): a message sent after its
/// last user's leave is refused at the door, whatever the room as kept
/// since the message before it says.
async fn a_server_whose_users_all_left_may_not_send(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (join_id, join, answer) = acting.join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let depth = join["depth"].as_i64().unwrap();
    let event = |kind: &str, prev: &str, depth: i64, extra: Value| {
        let mut pdu = json!({
            "type": kind, "room_id": room, "sender": bob,
            "prev_events": [prev], "auth_events": [create_id, power_id, join_id],
            "depth": depth, "origin_server_ts": now_ms(),
        });
        for (k, v) in extra.as_object().unwrap() {
            pdu[k] = v.clone();
        }
        pdu
    };

    // While bob is joined, his server's messages are taken.
    let mut hello = event("m.room.message", &join_id, depth + 1, json!({ "content": text("hello") }));
    let hello_id = acting.sign(&mut hello);
    let (status, results) = acting.send_txn("left1", &[&hello]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&hello_id], json!({}), "{results}");

    let mut leave = event(
        "m.room.member",
        &hello_id,
        depth + 2,
        json!({ "state_key": bob, "content": { "membership": "leave" } }),
    );
    let leave_id = acting.sign(&mut leave);
    let (status, results) = acting.send_txn("left2", &[&leave]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&leave_id], json!({}), "{results}");

    // Now no user of B is joined: a message of bob's is refused as one from
    // a server not in the room, and nobody reads it.
    let mut after =
        event("m.room.message", &leave_id, depth + 3, json!({ "content": text("after leaving") }));
    let after_id = acting.sign(&mut after);
    let (status, results) = acting.send_txn("left3", &[&after]).await;
    assert_eq!(status, 200, "{results}");
    let error = results["pdus"][&after_id]["error"].as_str().unwrap_or_default();
    assert!(error.contains("not in room"), "{results}");
    let bodies = message_bodies(&seqline_messages(&a, &alice, &room).await);
    assert!(bodies.contains(&"hello".to_owned()), "{bodies:?}");
    assert!(!bodies.contains(&"after leaving".to_owned()), "{bodies:?}");
}

/// Room version 2 as another server (B) acting by hand: the make_join
/// template lists `[id, hashes]` pairs; B makes the ids of its own events
/// (`$<opaque>:<B>`). The spec (server-server API, validating signatures:
/// versions 1 and 2) wants an event signed by the server its event id names
/// as well as by its sender's: an id naming A, or a third server, on an event
/// only B signed is refused (send_join and /send alike), and so are ids and
/// references of another version's form. Version 1 rooms are not joined.
async fn v2_event_ids_must_be_signed_by_the_server_they_name(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "2" })).await;
    let make_join = |room: &str, ver: &str| {
        format!("/_matrix/federation/v1/make_join/{}/{}?ver={ver}", enc(room), enc(&bob))
    };
    let (status, template) = acting.call("GET", &make_join(&room, "2"), None).await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(template["room_version"], "2");
    let mut join = template["event"].clone();
    assert!(join.get("event_id").is_none(), "the joiner makes the id: {join}");
    for field in ["prev_events", "auth_events"] {
        for entry in join[field].as_array().unwrap() {
            let id = entry[0].as_str().unwrap_or_else(|| panic!("{field}: {join}"));
            assert!(id.ends_with(&format!(":{}", a.name)), "{id}");
            assert!(entry[1]["sha256"].is_string(), "{join}");
        }
    }
    let send_join = |id: &str| format!("/_matrix/federation/v2/send_join/{}/{}", enc(&room), enc(id));
    // B signs a join whose id names A: A never signed it.
    let mut forged = join.clone();
    forged["event_id"] = json!(format!("$forged:{}", a.name));
    acting.sign(&mut forged);
    assert_error(
        &acting.call("PUT", &send_join(&format!("$forged:{}", a.name)), Some(&forged)).await,
        400,
        "M_INVALID_SIGNATURE",
        "an event id naming the resident",
    );
    let join_id = format!("$join1:{}", b.name);
    join["event_id"] = json!(join_id);
    acting.sign(&mut join);
    let (status, answer) = acting.call("PUT", &send_join(&join_id), Some(&join)).await;
    assert_eq!(status, 200, "{answer}\n{}", a.server.log());
    assert_eq!(answer["event"]["event_id"], join_id.as_str());
    let state_event = |kind: &str| {
        answer["state"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == kind)
            .and_then(|e| e["event_id"].as_str())
            .unwrap_or_else(|| panic!("no {kind} in {answer}"))
            .to_owned()
    };
    let (create_id, power_id) = (state_event("m.room.create"), state_event("m.room.power_levels"));
    assert!(create_id.ends_with(&format!(":{}", a.name)), "{create_id}");

    let depth = join["depth"].as_i64().unwrap();
    let pair = |id: &str| json!([id, {}]);
    let message = |event_id: &str, body: &str| {
        json!({
            "event_id": event_id, "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": [pair(&join_id)],
            "auth_events": [pair(&create_id), pair(&power_id), pair(&join_id)],
            "depth": depth + 1, "origin_server_ts": now_ms(),
        })
    };
    let third = format!("127.0.0.1:{}", complement_tests::federation::free_port());
    let mut cases = Vec::new();
    for (id, body) in [
        (format!("$m1:{}", a.name), "names the resident"),
        (format!("$m2:{third}"), "names a third server"),
        ("$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned(), "a v3+ id"),
    ] {
        let mut pdu = message(&id, body);
        acting.sign(&mut pdu);
        cases.push((id, pdu));
    }
    let mut plain_refs = message(&format!("$m3:{}", b.name), "plain references");
    plain_refs["prev_events"] = json!([join_id]);
    acting.sign(&mut plain_refs);
    cases.push((format!("$m3:{}", b.name), plain_refs));
    let good_id = format!("$m4:{}", b.name);
    let mut good = message(&good_id, "hello in v2");
    acting.sign(&mut good);
    let pdus: Vec<&Value> = cases.iter().map(|(_, p)| p).chain([&good]).collect();
    let (status, results) = acting.send_txn("v2", &pdus).await;
    assert_eq!(status, 200, "{results}");
    for (id, _) in &cases {
        if id.contains(':') {
            assert!(results["pdus"][id]["error"].is_string(), "{id}: {results}");
        }
    }
    assert_eq!(results["pdus"][&good_id], json!({}), "{results}");
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["hello in v2"], "{page}");
    for (id, _) in &cases {
        let (status, _) =
            a.server.get(&room_path(&room, &format!("/event/{}", enc(id))), Some(&alice.token)).await;
        assert_eq!(status, 404, "{id} was not stored");
    }
    let (status, served) =
        a.server.get(&room_path(&room, &format!("/event/{}", enc(&good_id))), Some(&alice.token)).await;
    assert_eq!((status, &served["content"]["body"]), (200, &json!("hello in v2")), "{served}");

    // Version 1: refused whatever the joiner names.
    let old = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "1" })).await;
    let response = acting.call("GET", &make_join(&old, "1"), None).await;
    assert_error(&response, 400, "M_INCOMPATIBLE_ROOM_VERSION", "a version 1 room");
    assert_eq!(response.1["room_version"], "1");
    // Nor does one of our users invite another server's user into one.
    let invite = json!({ "user_id": bob });
    let response = a.server.post(&room_path(&old, "/invite"), Some(&alice.token), invite).await;
    assert_error(&response, 400, "M_UNSUPPORTED_ROOM_VERSION", "a remote invite into a version 1 room");
    let member = room_path(&old, &format!("/state/m.room.member/{}", enc(&bob)));
    assert_eq!(a.server.get(&member, Some(&alice.token)).await.0, 404);
}

/// A user deactivated with `erase: true`: other servers that ask for their
/// events (`/event`, `/backfill`, `/get_missing_events`) get them redacted,
/// like the local users who were not there; everyone else's stay whole.
async fn erased_users_events_go_to_other_servers_redacted(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let dave = a.server.register("dave", "pw-dave").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    join_locally(&a.server, &dave, &room).await;
    let mut sent = Vec::new();
    for (user, txn, body) in [(&dave, "d1", "dave's words"), (&alice, "a1", "alice's words")] {
        let path = room_path(&room, &format!("/send/m.room.message/{txn}"));
        let (status, answer) = a.server.put(&path, Some(&user.token), text(body)).await;
        assert_eq!(status, 200, "{answer}");
        sent.push(event_id_of(&answer));
    }
    let (daves, alices) = (sent[0].clone(), sent[1].clone());
    deactivate(&a.server, &dave, "dave", "pw-dave", true).await;

    let (join_id, _, _) = acting.join(&room, &bob).await;

    let event = |id: &str| format!("/_matrix/federation/v1/event/{}", enc(id));
    let (status, page) = acting.call("GET", &event(&daves), None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["pdus"][0]["content"], json!({}), "{page}");
    assert_eq!(pdu::event_id(&page["pdus"][0]), daves, "the same event, redacted");
    let (status, page) = acting.call("GET", &event(&alices), None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["pdus"][0]["content"]["body"], "alice's words");

    let backfill = format!("/_matrix/federation/v1/backfill/{}?v={}&limit=20", enc(&room), enc(&join_id));
    let gme = json!({ "earliest_events": [], "latest_events": [join_id], "limit": 20 });
    let missing = format!("/_matrix/federation/v1/get_missing_events/{}", enc(&room));
    for (method, uri, body) in [("GET", &backfill, None), ("POST", &missing, Some(&gme))] {
        let (status, page) = acting.call(method, uri, body).await;
        assert_eq!(status, 200, "{uri}: {page}");
        let key = if method == "GET" { "pdus" } else { "events" };
        let content = |id: &str| {
            page[key]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| pdu::event_id(e) == id)
                .map(|e| e["content"].clone())
        };
        assert_eq!(content(&daves), Some(json!({})), "{uri}: {page}");
        assert_eq!(content(&alices).unwrap()["body"], "alice's words", "{uri}");
        assert!(!page.to_string().contains("dave's words"), "{uri}: {page}");
    }
}

/// The largest depth the spec allows (2^53 - 1, the canonical JSON integer bound).
const MAX_DEPTH: i64 = (1 << 53) - 1;

/// Depth is the sender's hint: a remote message claiming the largest depth
/// there is must not make every later local event too deep to build. Local
/// sends, state changes, kicks and bans go on (depth capped at 2^53 - 1),
/// also after a restart, and the huge depth moves nothing in the order.
async fn a_remote_depth_cannot_break_local_writes(backend: Backend) {
    let (mut a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let acting = Acting::new(&a, &b);
    let (join_id, _, answer) = acting.join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let mut deep = json!({
        "type": "m.room.message", "room_id": room, "sender": bob,
        "content": { "msgtype": "m.text", "body": "from the deep" },
        "prev_events": [join_id], "auth_events": [create_id, power_id, join_id],
        "depth": MAX_DEPTH, "origin_server_ts": now_ms(),
    });
    let deep_id = acting.sign(&mut deep);
    let (status, results) = acting.send_txn("deep1", &[&deep]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"], json!({ deep_id.clone(): {} }), "{results}");
    drop(acting);

    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/d1"), Some(&alice.token), text("after")).await;
    assert_eq!(status, 200, "{sent}\n{}", a.server.log());
    let after = event_id_of(&sent);
    assert_eq!(depth_of(&a, &b, &after).await, MAX_DEPTH);
    let topic = room_path(&room, "/state/m.room.topic/");
    let (status, body) = a.server.put(&topic, Some(&alice.token), json!({ "topic": "still here" })).await;
    assert_eq!(status, 200, "{body}");

    a.server.restart().await;
    let (status, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/d2"), Some(&alice.token), text("restarted"))
        .await;
    assert_eq!(status, 200, "{sent}\n{}", a.server.log());
    let kick = json!({ "user_id": bob, "reason": "deep" });
    let (status, body) = a.server.post(&room_path(&room, "/ban"), Some(&alice.token), kick).await;
    assert_eq!(status, 200, "{body}");
    // The order is seqline's: the deep message sits where it arrived.
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["from the deep", "after", "restarted"], "{page}");
}

/// `origin_server_ts` is the sender's word too: a remote member dating a new
/// message just young enough for the room's `max_lifetime` must not make it
/// look like the room's oldest young event (which would lift the room's
/// floor over all its history, for good). (A date far in the future fails
/// the check of the signing key at the event's time.)
async fn a_remote_timestamp_cannot_age_out_a_rooms_history(backend: Backend) {
    const DAY: i64 = 86_400_000;
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let retention = room_path(&room, "/state/m.room.retention/");
    let (status, body) =
        a.server.put(&retention, Some(&alice.token), json!({ "max_lifetime": 30 * DAY })).await;
    assert_eq!(status, 200, "{body}");
    for (txn, body) in [("r1", "first words"), ("r2", "second words")] {
        let (status, sent) = a
            .server
            .put(&room_path(&room, &format!("/send/m.room.message/{txn}")), Some(&alice.token), text(body))
            .await;
        assert_eq!(status, 200, "{sent}");
    }
    let acting = Acting::new(&a, &b);
    let (join_id, _, answer) = acting.join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let mut prev = join_id.clone();
    for (i, (ts, body)) in
        [(now_ms() - 30 * DAY + 3_600_000, "dated a month back"), (now_ms() + 3_600_000, "dated an hour on")]
            .into_iter()
            .enumerate()
    {
        let mut pdu = json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": [prev], "auth_events": [create_id, power_id, join_id],
            "depth": 100 + i, "origin_server_ts": ts,
        });
        let id = acting.sign(&mut pdu);
        let (status, results) = acting.send_txn(&format!("ts{i}"), &[&pdu]).await;
        assert_eq!(status, 200, "{results}");
        assert_eq!(results["pdus"], json!({ id.clone(): {} }), "{results}");
        prev = id;
    }
    drop(acting);
    let (status, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/r3"), Some(&alice.token), text("third words"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let want = ["first words", "second words", "dated a month back", "dated an hour on", "third words"];
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), want, "{page}");
    // The floor, once moved, stays: read again after a restart.
    let mut a = a;
    a.server.restart().await;
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), want, "{page}");
}

/// One transaction carrying PDUs of two rooms: each room's are placed in
/// their order (the rooms are taken side by side), each PDU answered. The
/// same transaction sent twice at once (a sender retrying a slow one) is
/// taken once: both answers alike, every event stored once.
async fn a_transaction_over_two_rooms_is_taken_once_in_order(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let acting = Acting::new(&a, &b);
    let mut rooms = Vec::new();
    for _ in 0..2 {
        let room =
            create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
        let (join_id, _, answer) = acting.join(&room, &bob).await;
        let auth = [
            state_id(&answer["state"], "m.room.create", ""),
            state_id(&answer["state"], "m.room.power_levels", ""),
            join_id.clone(),
        ];
        rooms.push((room, join_id, auth));
    }
    let mut pdus = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for n in 0..3 {
        for (r, (room, join_id, auth)) in rooms.iter().enumerate() {
            let prev = if n == 0 { join_id.clone() } else { ids[ids.len() - 2].clone() };
            let mut pdu = json!({
                "type": "m.room.message", "room_id": room, "sender": bob,
                "content": { "msgtype": "m.text", "body": format!("room {r} message {n}") },
                "prev_events": [prev], "auth_events": auth, "depth": 10 + n, "origin_server_ts": now_ms(),
            });
            ids.push(acting.sign(&mut pdu));
            pdus.push(pdu);
        }
    }
    let refs: Vec<&Value> = pdus.iter().collect();
    let (first, second) =
        tokio::join!(acting.send_txn("two-rooms", &refs), acting.send_txn("two-rooms", &refs));
    let all_taken: Value =
        ids.iter().map(|id| (id.clone(), json!({}))).collect::<serde_json::Map<_, _>>().into();
    for (status, results) in [first, second] {
        assert_eq!(status, 200, "{results}");
        assert_eq!(results["pdus"], all_taken, "{results}");
    }
    for (r, (room, _, _)) in rooms.iter().enumerate() {
        let page = seqline_messages(&a, &alice, room).await;
        let want: Vec<String> = (0..3).map(|n| format!("room {r} message {n}")).collect();
        assert_eq!(message_bodies(&page), want, "{page}");
    }
}

/// Alice's public v11 room on A with B's bob joined (make_join/send_join):
/// alice, bob, the room, and the ids of bob's join, the create event and
/// the power levels.
async fn room_with_remote_bob(a: &FedServer, b: &FedServer) -> (User, String, String, [String; 3]) {
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (join_id, _, answer) = Acting::new(a, b).join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    (alice, bob, room, [join_id, create_id, power_id])
}

/// A room forked fifteen ways (a remote member sending each message after
/// the same old event): the next local event points at ten of the forward
/// extremities, the newest (the spec allows twenty; Synapse takes ten), and
/// the one after it at that event and the five forks left over.
async fn a_local_event_names_at_most_ten_prev_events(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let (alice, bob, room, [join_id, create_id, power_id]) = room_with_remote_bob(&a, &b).await;
    let acting = Acting::new(&a, &b);
    let auth = [create_id, power_id, join_id.clone()];
    let mut forks = Vec::new();
    for n in 0..15 {
        let mut pdu = json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": format!("fork {n}") },
            "prev_events": [join_id], "auth_events": auth, "depth": 10, "origin_server_ts": now_ms(),
        });
        let id = acting.sign(&mut pdu);
        let (status, results) = acting.send_txn(&format!("fork{n}"), &[&pdu]).await;
        assert_eq!(status, 200, "{results}");
        assert_eq!(results["pdus"], json!({ id.clone(): {} }), "{results}");
        forks.push(id);
    }
    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/m1"), Some(&alice.token), text("merge")).await;
    assert_eq!(status, 200, "{sent}");
    let merge = event_id_of(&sent);
    let served = served_event(&a, &b, &merge).await;
    let mut prevs: Vec<String> =
        served["prev_events"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect();
    prevs.sort();
    let mut newest: Vec<String> = forks[5..].to_vec();
    newest.sort();
    assert_eq!(prevs, newest, "{served}");
    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/m2"), Some(&alice.token), text("after")).await;
    assert_eq!(status, 200, "{sent}");
    let after = served_event(&a, &b, &event_id_of(&sent)).await;
    let mut prevs: Vec<String> =
        after["prev_events"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect();
    prevs.sort();
    let mut rest: Vec<String> = forks[..5].iter().cloned().chain([merge]).collect();
    rest.sort();
    assert_eq!(prevs, rest, "{after}");
}

/// Redactions another server sends: one by a user of that server without
/// the `redact` level takes effect on what another user of the same server
/// sent (the server speaks for its own users, as the spec says and Synapse
/// does), never on a local user's event; and a local user without the
/// level may not redact another local user's event.
async fn a_server_may_redact_its_own_users_events_only(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let dave = a.server.register("dave", "pw").await;
    let (bob, carol) = (b.user_id("bob"), b.user_id("carol"));
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    join_locally(&a.server, &dave, &room).await;
    let (status, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/x1"), Some(&alice.token), text("alice's words"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let alices = event_id_of(&sent);
    let acting = Acting::new(&a, &b);
    let (bob_join, _, answer) = acting.join(&room, &bob).await;
    let (carol_join, _, _) = acting.join(&room, &carol).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let mut bobs = json!({
        "type": "m.room.message", "room_id": room, "sender": bob,
        "content": { "msgtype": "m.text", "body": "bob's words" },
        "prev_events": [carol_join], "auth_events": [create_id, power_id, bob_join], "depth": 20,
        "origin_server_ts": now_ms(),
    });
    let bobs_id = acting.sign(&mut bobs);
    let redaction = |target: &str, prev: &str, depth: i64| {
        json!({
            "type": "m.room.redaction", "room_id": room, "sender": carol,
            "content": { "redacts": target },
            "prev_events": [prev], "auth_events": [create_id, power_id, carol_join], "depth": depth,
            "origin_server_ts": now_ms(),
        })
    };
    let mut of_bob = redaction(&bobs_id, &bobs_id, 21);
    let of_bob_id = acting.sign(&mut of_bob);
    let mut of_alice = redaction(&alices, &of_bob_id, 22);
    let of_alice_id = acting.sign(&mut of_alice);
    let (status, results) = acting.send_txn("redactions", &[&bobs, &of_bob, &of_alice]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&bobs_id], json!({}), "{results}");
    assert_eq!(results["pdus"][&of_bob_id], json!({}), "{results}");
    // Kept without effect (soft-failed): answered as taken.
    assert_eq!(results["pdus"][&of_alice_id], json!({}), "{results}");

    let event = |id: String| {
        let server = &a.server;
        let token = alice.token.clone();
        let room = room.clone();
        async move {
            let (status, body) =
                server.get(&room_path(&room, &format!("/event/{}", enc(&id))), Some(&token)).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let bobs_now = event(bobs_id.clone()).await;
    assert_eq!(bobs_now["content"], json!({}), "carol's server speaks for bob: {bobs_now}");
    assert_eq!(bobs_now["unsigned"]["redacted_because"]["event_id"], of_bob_id.as_str(), "{bobs_now}");
    let alices_now = event(alices.clone()).await;
    assert_eq!(alices_now["content"]["body"], "alice's words", "{alices_now}");
    // Locally the rule stays the room's: dave (power 0) may not redact alice's.
    let path = room_path(&room, &format!("/redact/{}/r1", enc(&alices)));
    let (status, body) = a.server.put(&path, Some(&dave.token), json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")), "{body}");
    assert_eq!(event(alices).await["content"]["body"], "alice's words");
}

/// What a server may add to a PDU outside what it signs, or pile into one:
/// `unsigned` (a forged transaction id, a forged relation summary, a forged
/// `redacted_because`) is dropped on the way in; 21 prev events or 11 auth
/// events refuse the PDU; a transaction of 101 EDUs is refused whole
/// (400 `M_BAD_JSON`) and changes nothing.
async fn what_a_server_adds_or_piles_up_is_not_taken(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let (alice, bob, room, [join_id, create_id, power_id]) = room_with_remote_bob(&a, &b).await;
    let acting = Acting::new(&a, &b);
    let message = |body: &str, prev: Value, auth: Value| {
        json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": prev, "auth_events": auth, "depth": 30, "origin_server_ts": now_ms(),
        })
    };
    let mut dressed = message("dressed up", json!([join_id]), json!([create_id, power_id, join_id]));
    let dressed_id = acting.sign(&mut dressed);
    dressed["unsigned"] = json!({
        "transaction_id": "forged",
        "redacted_because": { "event_id": "$forged", "type": "m.room.redaction" },
        "m.relations": { "m.thread": { "count": 99, "latest_event": { "event_id": "$forged" } } },
    });
    let prevs: Vec<String> = (0..21).map(|_| join_id.clone()).collect();
    let mut many_prevs = message("many prevs", json!(prevs), json!([create_id, power_id, join_id]));
    let many_prevs_id = acting.sign(&mut many_prevs);
    let auths: Vec<String> = (0..11).map(|_| join_id.clone()).collect();
    let mut many_auths = message("many auths", json!([join_id]), json!(auths));
    let many_auths_id = acting.sign(&mut many_auths);
    let (status, results) = acting.send_txn("shapes", &[&dressed, &many_prevs, &many_auths]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&dressed_id], json!({}), "{results}");
    for id in [&many_prevs_id, &many_auths_id] {
        assert!(results["pdus"][id]["error"].is_string(), "{id}: {results}");
    }
    let (status, event) =
        a.server.get(&room_path(&room, &format!("/event/{}", enc(&dressed_id))), Some(&alice.token)).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "dressed up", "{event}");
    assert!(!event.to_string().contains("forged"), "{event}");
    assert_eq!(message_bodies(&seqline_messages(&a, &alice, &room).await), ["dressed up"]);

    let typing =
        json!({ "edu_type": "m.typing", "content": { "room_id": room, "user_id": bob, "typing": true } });
    let edus: Vec<Value> = (0..101).map(|_| typing.clone()).collect();
    let mut late =
        message("in a refused transaction", json!([dressed_id]), json!([create_id, power_id, join_id]));
    acting.sign(&mut late);
    let body = json!({ "origin": b.name, "origin_server_ts": now_ms(), "pdus": [late], "edus": edus });
    let (status, refused) = acting.call("PUT", "/_matrix/federation/v1/send/edus101", Some(&body)).await;
    assert_eq!((status, refused["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{refused}");
    assert_eq!(message_bodies(&seqline_messages(&a, &alice, &room).await), ["dressed up"]);
}

/// The spec's checks 4 and 5 on a received PDU, not only the current state:
/// an event with no prev events (only a create event may have none), a
/// second create event, an event whose own auth events do not let its
/// sender post (here: its sender's join left out), and an event placed
/// after an event from before its sender joined are all rejected, though
/// the current state would let each through; the room goes on.
async fn remote_events_are_authorised_where_they_stand(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (_, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/w0"), Some(&alice.token), text("before bob"))
        .await;
    let before_bob = event_id_of(&sent);
    let (join_id, join, answer) = acting.join(&room, &bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let depth = join["depth"].as_i64().unwrap() + 1;
    let message = |body: &str, prev: Value, auth: Value| {
        json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": prev, "auth_events": auth, "depth": depth, "origin_server_ts": now_ms(),
        })
    };
    let full_auth = json!([create_id, power_id, join_id]);
    let mut no_prevs = message("no prevs", json!([]), full_auth.clone());
    let no_prevs_id = acting.sign(&mut no_prevs);
    let mut unjoined = message("auth without my join", json!([join_id]), json!([create_id, power_id]));
    let unjoined_id = acting.sign(&mut unjoined);
    let mut early = message("from before my join", json!([before_bob]), full_auth.clone());
    let early_id = acting.sign(&mut early);
    let mut create = json!({
        "type": "m.room.create", "room_id": room, "sender": bob, "state_key": "",
        "content": { "room_version": "11", "forged": true },
        "prev_events": [], "auth_events": [], "depth": 1, "origin_server_ts": now_ms(),
    });
    let create2_id = acting.sign(&mut create);
    let (status, results) = acting.send_txn("where1", &[&no_prevs, &unjoined, &early, &create]).await;
    assert_eq!(status, 200, "{results}");
    for id in [&no_prevs_id, &unjoined_id, &early_id, &create2_id] {
        assert!(results["pdus"][id]["error"].is_string(), "{id} in {results}\n{}", a.server.log());
    }
    // Sent again: rejected again, not taken the second time.
    let (_, results) = acting.send_txn("where1b", &[&unjoined]).await;
    assert!(results["pdus"][&unjoined_id]["error"].is_string(), "{results}");
    // The honest message after them is taken and is the last word; so is
    // one built on a rejected event (kept, with the state before it, so
    // that what comes after it can be judged).
    let mut honest = message("honest", json!([join_id]), full_auth.clone());
    let honest_id = acting.sign(&mut honest);
    let mut built = message("built on a rejected one", json!([unjoined_id]), full_auth);
    let built_id = acting.sign(&mut built);
    let (status, results) = acting.send_txn("where2", &[&honest, &built]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(
        results["pdus"],
        json!({ honest_id: {}, built_id.clone(): {} }),
        "{results}\n{}",
        a.server.log()
    );
    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["before bob", "honest", "built on a rejected one"], "{page}");
    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/w1"), Some(&alice.token), text("alice")).await;
    assert_eq!(status, 200, "{sent}");
    let (status, create_now) =
        a.server.get(&room_path(&room, "/state/m.room.create/"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{create_now}");
    assert!(create_now.get("forged").is_none(), "{create_now}");
    // A rejected event is kept (what is built on it needs it) but never
    // served to another server; the event built on it is.
    let (status, body) = ask_event(&a, &b, &unjoined_id).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
    assert_eq!(served_event(&a, &b, &built_id).await["content"]["body"], "built on a rejected one");
}

/// The depth of event `id` on `server` as `asking` reads it over federation.
async fn depth_of(server: &FedServer, asking: &FedServer, id: &str) -> i64 {
    served_event(server, asking, id).await["depth"].as_i64().unwrap()
}

/// Event `id` as `server` serves it to `asking` over federation.
async fn served_event(server: &FedServer, asking: &FedServer, id: &str) -> Value {
    let (status, body) = ask_event(server, asking, id).await;
    assert_eq!(status, 200, "{body}");
    body["pdus"][0].clone()
}

/// `server`'s answer to `asking`'s `/event/{id}`.
async fn ask_event(server: &FedServer, asking: &FedServer, id: &str) -> (u16, Value) {
    let uri = format!("/_matrix/federation/v1/event/{}", enc(id));
    let auth = complement_tests::federation::x_matrix(
        &asking.name,
        &server.name,
        &asking.signing_key(),
        "GET",
        &uri,
        None,
    );
    server.send("GET", &uri, Some(auth), None).await
}

/// A room on A (v11, `shared`) with B's bob joined through make_join and
/// send_join and given power 50 by alice: answers the room, the ids of its
/// create event, bob's join and the power levels now (the room's tip).
async fn room_with_bob_at_50(
    a: &FedServer,
    acting: &Acting<'_>,
    alice: &User,
    bob: &str,
) -> (String, String, String, String) {
    let room = create_room(&a.server, alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (join_id, _, answer) = acting.join(&room, bob).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let (status, power) =
        a.server.get(&room_path(&room, "/state/m.room.power_levels/"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{power}");
    let mut power = power;
    power["users"][bob] = json!(50);
    let (status, sent) =
        a.server.put(&room_path(&room, "/state/m.room.power_levels/"), Some(&alice.token), power).await;
    assert_eq!(status, 200, "{sent}");
    (room, create_id, join_id, event_id_of(&sent))
}

/// A state event of bob's (power 50) on B, after `prev`.
fn bob_state(
    room: &str,
    bob: &str,
    kind: &str,
    content: Value,
    prev: &[&str],
    auth: &[&str],
    ts: i64,
) -> Value {
    json!({
        "type": kind, "room_id": room, "sender": bob, "state_key": "", "content": content,
        "prev_events": prev, "auth_events": auth, "depth": 20, "origin_server_ts": ts,
    })
}

async fn topic_now(a: &FedServer, user: &User, room: &str) -> Value {
    let (status, topic) = a.server.get(&room_path(room, "/state/m.room.topic/"), Some(&user.token)).await;
    assert_eq!(status, 200, "{topic}");
    topic["topic"].clone()
}

/// Two topics set at once on two servers: the room's topic is the one state
/// resolution picks (of two events authorised by the same power levels,
/// the later `origin_server_ts`), not the one that arrived last; a third
/// after the losing branch wins when it is later still. Resolution reads the
/// losing branch's own state back (bob's third topic stands on his second).
async fn concurrent_state_resolves_by_the_rules(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let bob = b.user_id("bob");
    let (room, create_id, join_id, power_id) = room_with_bob_at_50(&a, &acting, &alice, &bob).await;
    let auth = [create_id.as_str(), power_id.as_str(), join_id.as_str()];

    let (status, sent) = a
        .server
        .put(&room_path(&room, "/state/m.room.topic/"), Some(&alice.token), json!({ "topic": "one" }))
        .await;
    assert_eq!(status, 200, "{sent}");
    // Bob's, made before he saw alice's: an earlier timestamp.
    let mut two = bob_state(
        &room,
        &bob,
        "m.room.topic",
        json!({ "topic": "two" }),
        &[&power_id],
        &auth,
        now_ms() - 60_000,
    );
    let two_id = acting.sign(&mut two);
    let (status, results) = acting.send_txn("topic2", &[&two]).await;
    assert_eq!(results["pdus"], json!({ two_id.clone(): {} }), "{status} {results}\n{}", a.server.log());
    assert_eq!(topic_now(&a, &alice, &room).await, "one");
    // Both topic events are in the room's history.
    let page = seqline_messages(&a, &alice, &room).await;
    let ids: Vec<&str> =
        page["chunk"].as_array().unwrap().iter().filter_map(|e| e["event_id"].as_str()).collect();
    assert!(ids.contains(&event_id_of(&sent).as_str()) && ids.contains(&two_id.as_str()), "{page}");

    let mut three = bob_state(
        &room,
        &bob,
        "m.room.topic",
        json!({ "topic": "three" }),
        &[&two_id],
        &auth,
        now_ms() + 60_000,
    );
    let three_id = acting.sign(&mut three);
    let (status, results) = acting.send_txn("topic3", &[&three]).await;
    assert_eq!(results["pdus"], json!({ three_id: {} }), "{status} {results}");
    assert_eq!(topic_now(&a, &alice, &room).await, "three");
    // Alice's next event joins the branches; the topic stays.
    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/r1"), Some(&alice.token), text("merged")).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(topic_now(&a, &alice, &room).await, "three");
    reads_agree(&a.server, &alice, &room).await;
}

/// Carol (ours) joins a public room while bob (B, power 50) makes it
/// invite-only on a branch that never saw her join: state resolution keeps
/// the join rule and drops her join. Her stay ends before the change (she
/// keeps what she read), the room moves to `leave` in her /sync, she can no
/// longer post, and alice no longer counts her among the members.
async fn a_join_undone_by_resolution_ends_the_stay(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let carol = a.server.register("carol", "pw").await;
    let bob = b.user_id("bob");
    let (room, create_id, join_id, power_id) = room_with_bob_at_50(&a, &acting, &alice, &bob).await;
    let (_, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/j0"), Some(&alice.token), text("before carol"))
        .await;
    let before_carol = event_id_of(&sent);
    join_locally(&a.server, &carol, &room).await;
    let (status, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/j1"), Some(&carol.token), text("carol here"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let since = complement_tests::api::sync_once(&a.server, &carol, None).await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();

    let auth = [create_id.as_str(), power_id.as_str(), join_id.as_str()];
    let mut invite_only = bob_state(
        &room,
        &bob,
        "m.room.join_rules",
        json!({ "join_rule": "invite" }),
        &[&before_carol],
        &auth,
        now_ms(),
    );
    let invite_only_id = acting.sign(&mut invite_only);
    let (status, results) = acting.send_txn("rules1", &[&invite_only]).await;
    assert_eq!(
        results["pdus"],
        json!({ invite_only_id.clone(): {} }),
        "{status} {results}\n{}",
        a.server.log()
    );

    let mut expected = vec![a.user_id("alice"), bob.clone()];
    expected.sort_unstable();
    assert_eq!(joined_members(&a, &alice, &room).await, expected);
    let (status, rules) =
        a.server.get(&room_path(&room, "/state/m.room.join_rules/"), Some(&alice.token)).await;
    assert_eq!((status, rules["join_rule"].as_str()), (200, Some("invite")), "{rules}");
    let synced = complement_tests::api::sync_once(&a.server, &carol, Some(&since)).await;
    assert!(synced["rooms"]["leave"].get(&room).is_some(), "{synced}");
    assert!(synced["rooms"]["join"].get(&room).is_none(), "{synced}");
    let (status, body) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/j2"), Some(&carol.token), text("still here?"))
        .await;
    assert_eq!(status, 403, "{body}");
    // What she read while she was in stays hers; bob's change is not.
    let page = seqline_messages(&a, &carol, &room).await;
    assert_eq!(message_bodies(&page), ["before carol", "carol here"], "{page}");
    assert!(!page.to_string().contains(&invite_only_id), "{page}");
    for user in [&alice, &carol] {
        reads_agree(&a.server, user, &room).await;
    }
}

/// Bob (B) answers on a branch that forked before carol joined: under
/// `joined` his message is not carol's to read (the state it was sent in
/// does not have her), though it lands after her join on our line; alice,
/// joined all along, reads it; under `shared` carol reads it too. What comes
/// after the branches meet is carol's again.
async fn a_branch_from_before_a_join_stays_hidden_under_joined(backend: Backend) {
    for visibility in ["joined", "shared"] {
        let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
        let acting = Acting::new(&a, &b);
        let alice = a.server.register("alice", "pw").await;
        let carol = a.server.register("carol", "pw").await;
        let bob = b.user_id("bob");
        let room = create_room(
            &a.server,
            &alice,
            json!({
                "preset": "public_chat", "room_version": "11",
                "initial_state": [{
                    "type": "m.room.history_visibility", "state_key": "",
                    "content": { "history_visibility": visibility }
                }],
            }),
        )
        .await;
        let (join_id, join, answer) = acting.join(&room, &bob).await;
        let create_id = state_id(&answer["state"], "m.room.create", "");
        let power_id = state_id(&answer["state"], "m.room.power_levels", "");
        let (_, sent) = a
            .server
            .put(&room_path(&room, "/send/m.room.message/f0"), Some(&alice.token), text("alice first"))
            .await;
        let first = event_id_of(&sent);
        join_locally(&a.server, &carol, &room).await;
        let mut branch = json!({
            "type": "m.room.message", "room_id": room, "sender": bob,
            "content": { "msgtype": "m.text", "body": "from the branch" },
            "prev_events": [first], "auth_events": [create_id, power_id, join_id],
            "depth": join["depth"].as_i64().unwrap() + 2, "origin_server_ts": now_ms(),
        });
        let branch_id = acting.sign(&mut branch);
        let (status, results) = acting.send_txn("branch1", &[&branch]).await;
        assert_eq!(
            results["pdus"],
            json!({ branch_id.clone(): {} }),
            "{status} {results}\n{}",
            a.server.log()
        );
        let (status, sent) = a
            .server
            .put(&room_path(&room, "/send/m.room.message/f1"), Some(&alice.token), text("merged"))
            .await;
        assert_eq!(status, 200, "{sent}");

        let page = seqline_messages(&a, &alice, &room).await;
        assert_eq!(message_bodies(&page), ["alice first", "from the branch", "merged"], "{page}");
        let page = seqline_messages(&a, &carol, &room).await;
        let expected: &[&str] = if visibility == "joined" {
            &["from the branch", "merged"][1..]
        } else {
            &["alice first", "from the branch", "merged"]
        };
        assert_eq!(message_bodies(&page), expected, "{visibility}: {page}");
        let (status, event) =
            a.server.get(&room_path(&room, &format!("/event/{}", enc(&branch_id))), Some(&carol.token)).await;
        assert_eq!(status == 200, visibility == "shared", "{visibility}: {status} {event}");
        let synced = complement_tests::api::sync_once(&a.server, &carol, None).await;
        let timeline = synced["rooms"]["join"][&room]["timeline"].to_string();
        assert_eq!(timeline.contains("from the branch"), visibility == "shared", "{visibility}: {synced}");
        assert!(timeline.contains("merged"), "{synced}");
        for user in [&alice, &carol] {
            reads_agree(&a.server, user, &room).await;
        }
    }
}

/// Bob and dave of B share a room of A's. Alice bans bob; bob's message
/// made before he heard of it (its prev event is from before the ban)
/// passes the rules where it stands and fails them against the room's
/// state now: soft-failed. The transaction takes it, no one on A reads it
/// (/messages, /sync, /event), our next event does not build on it, and
/// B, still in the room, can fetch it. Dave's answer to it passes and is
/// shown.
async fn soft_failed_events_are_kept_and_never_shown(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let (bob, dave) = (b.user_id("bob"), b.user_id("dave"));
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (bob_join, _, answer) = acting.join(&room, &bob).await;
    let (dave_join, _, _) = acting.join(&room, &dave).await;
    let create_id = state_id(&answer["state"], "m.room.create", "");
    let power_id = state_id(&answer["state"], "m.room.power_levels", "");
    let (_, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/s0"), Some(&alice.token), text("before the ban"))
        .await;
    let before_ban = event_id_of(&sent);
    let (status, body) =
        a.server.post(&room_path(&room, "/ban"), Some(&alice.token), json!({ "user_id": bob })).await;
    assert_eq!(status, 200, "{body}");
    let since = complement_tests::api::sync_once(&a.server, &alice, None).await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();

    let message = |sender: &str, body: &str, prev: &str, join: &str| {
        json!({
            "type": "m.room.message", "room_id": room, "sender": sender,
            "content": { "msgtype": "m.text", "body": body },
            "prev_events": [prev], "auth_events": [create_id, power_id, join],
            "depth": 30, "origin_server_ts": now_ms(),
        })
    };
    let mut unheard = message(&bob, "did not hear of the ban", &before_ban, &bob_join);
    let unheard_id = acting.sign(&mut unheard);
    let (status, results) = acting.send_txn("soft1", &[&unheard]).await;
    assert_eq!(results["pdus"], json!({ unheard_id.clone(): {} }), "{status} {results}\n{}", a.server.log());
    // Sent again, by /send or as a prev event fetched later: still kept once, still hidden.
    let (_, results) = acting.send_txn("soft2", &[&unheard]).await;
    assert_eq!(results["pdus"], json!({ unheard_id.clone(): {} }), "{results}");

    let mut reply = message(&dave, "dave answers", &unheard_id, &dave_join);
    let reply_id = acting.sign(&mut reply);
    let (status, results) = acting.send_txn("soft3", &[&reply]).await;
    assert_eq!(results["pdus"], json!({ reply_id.clone(): {} }), "{status} {results}\n{}", a.server.log());

    let page = seqline_messages(&a, &alice, &room).await;
    assert_eq!(message_bodies(&page), ["before the ban", "dave answers"], "{page}");
    let synced = complement_tests::api::sync_once(&a.server, &alice, Some(&since)).await;
    let timeline = synced["rooms"]["join"][&room]["timeline"].to_string();
    assert!(timeline.contains("dave answers") && !timeline.contains("did not hear"), "{synced}");
    let (status, _) =
        a.server.get(&room_path(&room, &format!("/event/{}", enc(&unheard_id))), Some(&alice.token)).await;
    assert_eq!(status, 404);

    // Our next event joins dave's branch and the ban, never building on
    // the soft-failed event; bob stays banned.
    let (status, sent) = a
        .server
        .put(&room_path(&room, "/send/m.room.message/s1"), Some(&alice.token), text("alice after"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let uri = format!("/_matrix/federation/v1/event/{}", enc(&event_id_of(&sent)));
    let (status, ours) = acting.call("GET", &uri, None).await;
    assert_eq!(status, 200, "{ours}");
    let prevs = ours["pdus"][0]["prev_events"].as_array().unwrap();
    assert!(prevs.contains(&json!(reply_id)) && !prevs.contains(&json!(unheard_id)), "{ours}");
    let (status, member) = a
        .server
        .get(&room_path(&room, &format!("/state/m.room.member/{}", enc(&bob))), Some(&alice.token))
        .await;
    assert_eq!((status, member["membership"].as_str()), (200, Some("ban")), "{member}");
    // B (dave is still in) can fetch the soft-failed event whole.
    let uri = format!("/_matrix/federation/v1/event/{}", enc(&unheard_id));
    let (status, kept) = acting.call("GET", &uri, None).await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["pdus"][0]["content"]["body"], "did not hear of the ban", "{kept}");
    let read = reads_agree(&a.server, &alice, &room).await;
    assert!(!read.contains(&unheard_id), "{read:?}");
}
