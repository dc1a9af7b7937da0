//! Simplified sliding sync (MSC4186, the unstable endpoint Element X and
//! matrix-rust-sdk speak): discovery, lists (order, `count`, ranges,
//! filters), positions (retries, unknown ones), the long-poll, per-room
//! fields (`initial`, `timeline`, `limited`/`prev_batch`, `num_live`,
//! `required_state` with `$ME`/`$LAZY`/`*`, `bump_stamp`, counts, heroes),
//! invites, leaves and kicks, and the extensions; each checked by event
//! ids and bodies. Hostile: rooms of others, a room left, forged
//! positions, oversized requests.

use std::time::{Duration, Instant};

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, Server, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

backend_tests!(
    versions_advertise_it_and_bad_requests_are_refused,
    lists_are_ordered_counted_and_sliced,
    a_position_can_be_retried_and_an_old_one_is_unknown,
    long_poll_waits_and_wakes_on_a_message,
    timeline_limit_prev_batch_and_required_state,
    invite_join_and_kick_are_told_as_element_x_reads_them,
    to_device_extension_wakes_and_acknowledges,
    a_waiting_request_wakes_with_account_data_and_device_lists,
    bump_stamp_moves_on_messages_only,
    filters_pick_invites_dms_encrypted_and_spaces,
    extensions_bring_receipts_typing_and_account_data,
    rooms_answered_together_keep_their_own_counts_receipts_and_account_data,
    rooms_answered_together_keep_their_own_timelines_and_state,
    others_rooms_and_rooms_left_stay_hidden,
    a_request_for_too_much_is_answered_in_parts,
    rooms_of_another_server_appear_whole,
    a_rejected_invite_shows_only_the_own_leave,
);

const PATH: &str = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync";

/// One sliding sync request.
async fn ss(server: &Server, user: &User, pos: Option<&str>, timeout: u64, body: Value) -> (u16, Value) {
    let path = match pos {
        Some(p) => format!("{PATH}?pos={}&timeout={timeout}", enc(p)),
        None => format!("{PATH}?timeout={timeout}"),
    };
    server.post(&path, Some(&user.token), body).await
}

async fn ss_ok(server: &Server, user: &User, pos: Option<&str>, timeout: u64, body: Value) -> Value {
    let (status, answer) = ss(server, user, pos, timeout, body.clone()).await;
    assert_eq!(status, 200, "{body} -> {answer}");
    assert!(answer["pos"].is_string(), "{answer}");
    answer
}

/// A request sent in the background (a long-poll something is about to
/// wake): its status and answer.
fn spawn_ss(server: &Server, user: &User, pos: &str, timeout: u64, body: Value) -> JoinHandle<(u16, Value)> {
    let url = server.url(&format!("{PATH}?pos={}&timeout={timeout}", enc(pos)));
    let request = server.http().post(url).bearer_auth(&user.token).json(&body);
    tokio::spawn(async move {
        let response = request.send().await.expect("sliding sync request");
        let status = response.status().as_u16();
        (status, response.json().await.expect("sliding sync body"))
    })
}

/// Awaits a long-poll that must have been woken well before its timeout.
async fn woken(handle: JoinHandle<(u16, Value)>, what: &str) -> Value {
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .unwrap_or_else(|_| panic!("{what}: the long-poll was not woken"))
        .expect("task");
    assert_eq!(status, 200, "{body}");
    body
}

fn pos(answer: &Value) -> String {
    answer["pos"].as_str().expect("pos").to_owned()
}

/// A list of everything, `ranges` as given.
fn all_rooms(ranges: Value, timeline_limit: u64) -> Value {
    json!({ "lists": { "all": {
        "ranges": ranges,
        "timeline_limit": timeline_limit,
        "required_state": [["m.room.name", ""], ["m.room.member", "$ME"], ["m.room.member", "$LAZY"]],
    } } })
}

/// `value` without its `unsigned.age` fields (which grow between answers).
fn without_ages(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter().filter(|(k, _)| *k != "age").map(|(k, v)| (k.clone(), without_ages(v))).collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_ages).collect()),
        other => other.clone(),
    }
}

fn room_ids(answer: &Value) -> Vec<String> {
    let mut ids: Vec<String> =
        answer["rooms"].as_object().map(|r| r.keys().cloned().collect()).unwrap_or_default();
    ids.sort();
    ids
}

fn bodies(room: &Value) -> Vec<String> {
    room["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

/// The state keys of a room entry's member events in `required_state`, sorted.
fn required_members(room: &Value) -> Vec<&str> {
    let mut members: Vec<&str> = room["required_state"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.room.member")
        .filter_map(|e| e["state_key"].as_str())
        .collect();
    members.sort_unstable();
    members
}

async fn send(server: &Server, user: &User, room: &str, body: &str) -> String {
    let path = room_path(room, &format!("/send/m.room.message/{}", uuid_like(body)));
    let (status, answer) = server.put(&path, Some(&user.token), text(body)).await;
    assert_eq!(status, 200, "{answer}");
    event_id_of(&answer)
}

fn uuid_like(seed: &str) -> String {
    format!("t{}-{}", seed.len(), seed.bytes().map(|b| format!("{b:02x}")).collect::<String>())
}

async fn state(server: &Server, user: &User, room: &str, kind: &str, key: &str, content: Value) -> String {
    let (status, answer) = server
        .put(&room_path(room, &format!("/state/{kind}/{}", enc(key))), Some(&user.token), content)
        .await;
    assert_eq!(status, 200, "{answer}");
    event_id_of(&answer)
}

/// The state event (type, key) in a room's `required_state`.
fn state_of<'a>(room: &'a Value, kind: &str, key: &str) -> Option<&'a Value> {
    room["required_state"].as_array()?.iter().find(|e| e["type"] == kind && e["state_key"] == key)
}

async fn versions_advertise_it_and_bad_requests_are_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let (status, versions) = server.get("/_matrix/client/versions", None).await;
    assert_eq!(status, 200);
    assert_eq!(versions["unstable_features"]["org.matrix.simplified_msc3575"], true, "{versions}");
    let alice = server.register("alice", "pw-alice-1").await;
    // No token, a forged position, a position of another connection.
    let (status, _) = server.post(PATH, None, json!({})).await;
    assert_eq!(status, 401);
    assert_error(
        &ss(&server, &alice, Some("nonsense"), 0, json!({})).await,
        400,
        "M_UNKNOWN_POS",
        "forged pos",
    );
    let first = ss_ok(&server, &alice, None, 0, json!({ "conn_id": "room-list" })).await;
    let other_conn = ss(&server, &alice, Some(&pos(&first)), 0, json!({ "conn_id": "encryption" })).await;
    assert_error(&other_conn, 400, "M_UNKNOWN_POS", "another connection's pos");
    // Another user's position is unknown to this one.
    let bob = server.register("bob", "pw-bob-1").await;
    let theirs = ss(&server, &bob, Some(&pos(&first)), 0, json!({ "conn_id": "room-list" })).await;
    assert_error(&theirs, 400, "M_UNKNOWN_POS", "another user's pos");
    // Malformed and oversized bodies.
    let (status, body) =
        server.request_raw(reqwest::Method::POST, PATH, Some(&alice.token), b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    let bad_shape = ss(&server, &alice, None, 0, json!({ "lists": { "a": { "ranges": "all" } } })).await;
    assert_error(&bad_shape, 400, "M_BAD_JSON", "ranges not a list");
    let backwards = ss(&server, &alice, None, 0, all_rooms(json!([[5, 1]]), 1)).await;
    assert_error(&backwards, 400, "M_INVALID_PARAM", "a range that ends before it starts");
    let lists: serde_json::Map<String, Value> =
        (0..101).map(|i| (format!("l{i}"), json!({ "ranges": [[0, 0]], "timeline_limit": 1 }))).collect();
    assert_error(
        &ss(&server, &alice, None, 0, json!({ "lists": lists })).await,
        400,
        "M_INVALID_PARAM",
        "101 lists",
    );
    // A huge range over no rooms is fine and counts zero.
    let answer = ss_ok(&server, &alice, None, 0, all_rooms(json!([[0, 1_000_000_000_000u64]]), 1)).await;
    assert_eq!(answer["lists"]["all"]["count"], 0, "{answer}");
    assert_eq!(room_ids(&answer), Vec::<String>::new());
}

async fn lists_are_ordered_counted_and_sliced(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let mut rooms = Vec::new();
    for name in ["one", "two", "three"] {
        let room = create_room(&server, &alice, json!({ "name": name })).await;
        send(&server, &alice, &room, &format!("hello {name}")).await;
        rooms.push(room);
    }
    // "one" gets the newest message: one, three, two.
    let newest = send(&server, &alice, &rooms[0], "one again").await;
    let first = ss_ok(&server, &alice, None, 0, all_rooms(json!([[0, 0]]), 1)).await;
    assert_eq!(first["lists"]["all"]["count"], 3, "{first}");
    assert_eq!(room_ids(&first), vec![rooms[0].clone()]);
    let room = &first["rooms"][&rooms[0]];
    assert_eq!(room["initial"], true);
    assert_eq!(room["name"], "one");
    assert_eq!(bodies(room), vec!["one again"]);
    assert_eq!(room["timeline"][0]["event_id"], newest.as_str());
    assert_eq!(room["limited"], true, "older events exist: {room}");
    assert_eq!(room["joined_count"], 1);
    assert_eq!(room["num_live"], 0);
    let me = state_of(room, "m.room.member", &alice.user_id).expect("own member event ($ME)");
    assert_eq!(me["content"]["membership"], "join");
    assert!(state_of(room, "m.room.create", "").is_none(), "not asked for: {room}");
    // Widened: only the two rooms not sent yet, newest first in the list.
    let wider = ss_ok(&server, &alice, Some(&pos(&first)), 0, all_rooms(json!([[0, 2]]), 1)).await;
    let mut expected = vec![rooms[1].clone(), rooms[2].clone()];
    expected.sort();
    assert_eq!(room_ids(&wider), expected, "{wider}");
    assert_eq!(wider["rooms"][&rooms[2]]["name"], "three");
    assert_eq!(bodies(&wider["rooms"][&rooms[1]]), vec!["hello two"]);
    assert_eq!(wider["lists"]["all"]["count"], 3);
    // Nothing new: nothing sent, the count still there.
    let quiet = ss_ok(&server, &alice, Some(&pos(&wider)), 0, all_rooms(json!([[0, 2]]), 1)).await;
    assert_eq!(room_ids(&quiet), Vec::<String>::new(), "{quiet}");
    assert_eq!(quiet["lists"]["all"]["count"], 3);
    // A wider timeline: every room in range is sent again at once, whole,
    // not as initial.
    let later = send(&server, &alice, &rooms[1], "two again").await;
    let next = ss_ok(&server, &alice, Some(&pos(&quiet)), 0, all_rooms(json!([[0, 2]]), 5)).await;
    assert_eq!(room_ids(&next).len(), 3, "{next}");
    let room = &next["rooms"][&rooms[1]];
    assert_eq!(room["unstable_expanded_timeline"], true, "{room}");
    assert_eq!(room["timeline"].as_array().unwrap().last().unwrap()["event_id"], later.as_str());
    assert!(room.get("initial").is_none(), "{room}");
    assert_eq!(bodies(&next["rooms"][&rooms[2]]), vec!["hello three"]);
    // A new message in one room: it alone, one live event.
    let again = send(&server, &alice, &rooms[1], "two thrice").await;
    let next = ss_ok(&server, &alice, Some(&pos(&next)), 0, all_rooms(json!([[0, 2]]), 5)).await;
    let room = &next["rooms"][&rooms[1]];
    assert_eq!(bodies(room), vec!["two thrice"], "{room}");
    assert_eq!(room["timeline"][0]["event_id"], again.as_str());
    assert_eq!(room["num_live"], 1);
    assert!(room.get("limited").is_none() && room.get("initial").is_none(), "{room}");
    assert!(room.get("name").is_none(), "the name did not change: {room}");
}

async fn a_position_can_be_retried_and_an_old_one_is_unknown(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let room = create_room(&server, &alice, json!({})).await;
    let first = ss_ok(&server, &alice, None, 0, all_rooms(json!([[0, 9]]), 3)).await;
    let p1 = pos(&first);
    let id = send(&server, &alice, &room, "news").await;
    // The same position twice: the same answer (the client lost the first).
    let a = ss_ok(&server, &alice, Some(&p1), 0, all_rooms(json!([[0, 9]]), 3)).await;
    let b = ss_ok(&server, &alice, Some(&p1), 0, all_rooms(json!([[0, 9]]), 3)).await;
    assert_eq!(without_ages(&a["rooms"]), without_ages(&b["rooms"]));
    assert_eq!(a["rooms"][&room]["timeline"][0]["event_id"], id.as_str(), "{a}");
    assert_ne!(pos(&a), pos(&b));
    // Moving on from b's position: p1 is gone.
    ss_ok(&server, &alice, Some(&pos(&b)), 0, all_rooms(json!([[0, 9]]), 3)).await;
    let old = ss(&server, &alice, Some(&p1), 0, all_rooms(json!([[0, 9]]), 3)).await;
    assert_error(&old, 400, "M_UNKNOWN_POS", "a position moved past");
    // A restart forgets every position: unknown, never a wrong delta.
    let mut server = server;
    let last = ss_ok(&server, &alice, None, 0, all_rooms(json!([[0, 9]]), 3)).await;
    server.restart().await;
    let after = ss(&server, &alice, Some(&pos(&last)), 0, all_rooms(json!([[0, 9]]), 3)).await;
    assert_error(&after, 400, "M_UNKNOWN_POS", "a position from before a restart");
}

async fn long_poll_waits_and_wakes_on_a_message(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let first = ss_ok(&server, &bob, None, 0, all_rooms(json!([[0, 9]]), 5)).await;
    // Nothing new: the wait runs out, an empty answer with a new pos and the count.
    let started = Instant::now();
    let empty = ss_ok(&server, &bob, Some(&pos(&first)), 600, all_rooms(json!([[0, 9]]), 5)).await;
    assert!(started.elapsed() >= Duration::from_millis(550), "answered before its timeout");
    assert_eq!(room_ids(&empty), Vec::<String>::new());
    assert_eq!(empty["lists"]["all"]["count"], 1);
    // A message sent while bob waits wakes him with it.
    let waiting = spawn_ss(&server, &bob, &pos(&empty), 20_000, all_rooms(json!([[0, 9]]), 5));
    let id = send(&server, &alice, &room, "wake up").await;
    let woke = woken(waiting, "message").await;
    let r = &woke["rooms"][&room];
    assert_eq!(r["timeline"][0]["event_id"], id.as_str(), "{woke}");
    assert_eq!(r["num_live"], 1);
    assert!(r.get("initial").is_none());
    // $LAZY: alice's member event comes with her message.
    assert!(state_of(r, "m.room.member", &alice.user_id).is_some(), "{r}");
}

async fn timeline_limit_prev_batch_and_required_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let carol = server.register("carol", "pw-carol-1").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "topic": "T" })).await;
    join(&server, &bob, &room).await;
    join(&server, &carol, &room).await;
    for i in 0..25 {
        send(&server, if i % 2 == 0 { &alice } else { &bob }, &room, &format!("m{i}")).await;
    }
    let answer = ss_ok(&server, &carol, None, 0, all_rooms(json!([[0, 0]]), 5)).await;
    let r = &answer["rooms"][&room];
    assert_eq!(bodies(r), vec!["m20", "m21", "m22", "m23", "m24"]);
    assert_eq!(r["limited"], true);
    // prev_batch pages on from just before the first event.
    let from = r["prev_batch"].as_str().expect("prev_batch");
    let (status, page) = server
        .get(&room_path(&room, &format!("/messages?dir=b&limit=3&from={}", enc(from))), Some(&carol.token))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(message_bodies(&page), vec!["m17", "m18", "m19"]);
    // $LAZY gives the timeline's senders, $ME oneself, nobody else.
    let members = required_members(r);
    let mut want = vec![alice.user_id.as_str(), bob.user_id.as_str(), carol.user_id.as_str()];
    want.sort_unstable();
    assert_eq!(members, want);
    assert!(state_of(r, "m.room.topic", "").is_none());
    // ["*","*"]: every state event, on a new connection.
    let everything = json!({ "conn_id": "all", "room_subscriptions": { &room: {
        "timeline_limit": 0, "required_state": [["*", "*"]],
    } } });
    let all = ss_ok(&server, &carol, None, 0, everything).await;
    let r = &all["rooms"][&room];
    assert_eq!(state_of(r, "m.room.topic", "").unwrap()["content"]["topic"], "T");
    assert!(state_of(r, "m.room.create", "").is_some() && state_of(r, "m.room.power_levels", "").is_some());
    assert_eq!(
        r["required_state"].as_array().unwrap().iter().filter(|e| e["type"] == "m.room.member").count(),
        3
    );
    assert_eq!(r["timeline"], json!([]), "timeline_limit 0: {r}");
    // ["*", ""]: every type with an empty key, no members.
    let empty_keys = json!({ "conn_id": "keys", "room_subscriptions": { &room: {
        "timeline_limit": 1, "required_state": [["*", ""]],
    } } });
    let keys = ss_ok(&server, &carol, None, 0, empty_keys).await;
    let r = &keys["rooms"][&room];
    assert!(state_of(r, "m.room.topic", "").is_some());
    assert!(r["required_state"].as_array().unwrap().iter().all(|e| e["state_key"] == ""), "{r}");
}

async fn invite_join_and_kick_are_told_as_element_x_reads_them(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let room = create_room(&server, &alice, json!({ "name": "Club" })).await;
    send(&server, &alice, &room, "before the invite").await;
    let first = ss_ok(&server, &bob, None, 0, all_rooms(json!([[0, 9]]), 5)).await;
    assert_eq!(first["lists"]["all"]["count"], 0);
    let (status, _) = server
        .post(&room_path(&room, "/invite"), Some(&alice.token), json!({ "user_id": bob.user_id }))
        .await;
    assert_eq!(status, 200);
    let invited = ss_ok(&server, &bob, Some(&pos(&first)), 5_000, all_rooms(json!([[0, 9]]), 5)).await;
    let r = &invited["rooms"][&room];
    assert_eq!(r["initial"], true, "{invited}");
    let stripped = r["invite_state"].as_array().expect("invite_state");
    let own =
        stripped.iter().find(|e| e["type"] == "m.room.member" && e["state_key"] == bob.user_id.as_str());
    assert_eq!(own.expect("own member event in invite_state")["content"]["membership"], "invite");
    assert!(stripped.iter().any(|e| e["type"] == "m.room.name" && e["content"]["name"] == "Club"));
    // No events, no state: only the stripped state (the fields are there, empty).
    assert_eq!((&r["timeline"], &r["required_state"]), (&json!([]), &json!([])), "{r}");
    assert_eq!(invited["lists"]["all"]["count"], 1);
    // Asked again with nothing new: not sent again.
    let quiet = ss_ok(&server, &bob, Some(&pos(&invited)), 0, all_rooms(json!([[0, 9]]), 5)).await;
    assert_eq!(room_ids(&quiet), Vec::<String>::new(), "{quiet}");
    // Joined: no invite_state, the own join in required_state.
    join(&server, &bob, &room).await;
    let joined = ss_ok(&server, &bob, Some(&pos(&quiet)), 5_000, all_rooms(json!([[0, 9]]), 5)).await;
    let r = &joined["rooms"][&room];
    assert!(r.get("invite_state").is_none(), "{r}");
    // The client held only the stripped state: the room comes whole, its
    // history before the invite included (shared visibility).
    assert_eq!(r["initial"], true, "{r}");
    assert!(bodies(r).contains(&"before the invite".to_owned()), "{r}");
    assert_eq!(state_of(r, "m.room.member", &bob.user_id).expect("$ME")["content"]["membership"], "join");
    // Kicked: the own leave in required_state, nothing after it later.
    let (status, _) = server
        .post(
            &room_path(&room, "/kick"),
            Some(&alice.token),
            json!({ "user_id": bob.user_id, "reason": "bye" }),
        )
        .await;
    assert_eq!(status, 200);
    let kicked = ss_ok(&server, &bob, Some(&pos(&joined)), 5_000, all_rooms(json!([[0, 9]]), 5)).await;
    let r = &kicked["rooms"][&room];
    let own = state_of(r, "m.room.member", &bob.user_id).expect("own leave");
    assert_eq!(own["content"]["membership"], "leave", "{r}");
    assert_eq!(own["sender"], alice.user_id.as_str());
    send(&server, &alice, &room, "after the kick").await;
    let after = ss_ok(&server, &bob, Some(&pos(&kicked)), 0, all_rooms(json!([[0, 9]]), 5)).await;
    assert_eq!(room_ids(&after), Vec::<String>::new(), "nothing after the kick reaches bob: {after}");
    // A new connection still lists the room (kicked), up to the kick only.
    let fresh = ss_ok(
        &server,
        &bob,
        None,
        0,
        json!({ "conn_id": "new", "lists": { "all": {
        "ranges": [[0, 9]], "timeline_limit": 10, "required_state": [["m.room.member", "$ME"]] } } }),
    )
    .await;
    let r = &fresh["rooms"][&room];
    assert!(!bodies(r).contains(&"after the kick".to_owned()), "{r}");
    assert_eq!(state_of(r, "m.room.member", &bob.user_id).unwrap()["content"]["membership"], "leave");
}

async fn to_device_extension_wakes_and_acknowledges(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let encryption = |since: Option<&str>| {
        let mut to_device = json!({ "enabled": true });
        if let Some(s) = since {
            to_device["since"] = json!(s);
        }
        json!({ "conn_id": "encryption", "extensions": { "to_device": to_device, "e2ee": { "enabled": true } } })
    };
    let first = ss_ok(&server, &bob, None, 0, encryption(None)).await;
    let e2ee = &first["extensions"]["e2ee"];
    assert!(e2ee["device_one_time_keys_count"].is_object(), "{first}");
    assert_eq!(e2ee["device_unused_fallback_key_types"], json!([]));
    assert!(e2ee.get("device_lists").is_none(), "no device_lists without a pos: {e2ee}");
    let since = first["extensions"]["to_device"]["next_batch"].as_str().expect("next_batch").to_owned();
    assert_eq!(first["extensions"]["to_device"]["events"], json!([]));
    let waiting = spawn_ss(&server, &bob, &pos(&first), 20_000, encryption(Some(&since)));
    let message = json!({ "messages": { &bob.user_id: { &bob.device_id: { "secret": "s1" } } } });
    let (status, _) =
        server.put(&format!("{V3}/sendToDevice/m.test/txn-1"), Some(&alice.token), message).await;
    assert_eq!(status, 200);
    let woke = woken(waiting, "to-device message").await;
    let events = woke["extensions"]["to_device"]["events"].as_array().unwrap().clone();
    assert_eq!(events.len(), 1, "{woke}");
    assert_eq!(events[0]["content"]["secret"], "s1");
    assert_eq!(events[0]["sender"], alice.user_id.as_str());
    let next = woke["extensions"]["to_device"]["next_batch"].as_str().unwrap().to_owned();
    // Not acknowledged yet: the same since again gives it again.
    let again = ss_ok(&server, &bob, Some(&pos(&woke)), 0, encryption(Some(&since))).await;
    assert_eq!(again["extensions"]["to_device"]["events"].as_array().unwrap().len(), 1);
    // Acknowledged with next_batch, also on a new connection: gone.
    let acked = ss_ok(&server, &bob, None, 0, encryption(Some(&next))).await;
    assert_eq!(acked["extensions"]["to_device"]["events"], json!([]), "{acked}");
    let old_since = ss_ok(&server, &bob, None, 0, encryption(Some(&since))).await;
    assert_eq!(old_since["extensions"]["to_device"]["events"], json!([]), "deleted once acknowledged");
}

/// A long-poll's passes keep what they read besides the rooms while the
/// stream log says nothing of it moved: account data and device lists that
/// move while it waits still come in the answer they wake.
async fn a_waiting_request_wakes_with_account_data_and_device_lists(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let mut body = all_rooms(json!([[0, 9]]), 1);
    body["extensions"] = json!({ "account_data": { "enabled": true }, "e2ee": { "enabled": true } });
    let first = ss_ok(&server, &bob, None, 0, body.clone()).await;
    // Something else wakes it first (a message), then bob's account data.
    let waiting = spawn_ss(&server, &bob, &pos(&first), 20_000, body.clone());
    let id = send(&server, &alice, &room, "first wake").await;
    let woke = woken(waiting, "message").await;
    assert_eq!(woke["rooms"][&room]["timeline"][0]["event_id"], id.as_str(), "{woke}");
    let waiting = spawn_ss(&server, &bob, &pos(&woke), 20_000, body.clone());
    let path = format!("{V3}/user/{}/account_data/u.custom", enc(&bob.user_id));
    assert_eq!(server.put(&path, Some(&bob.token), json!({ "n": 1 })).await.0, 200);
    let woke = woken(waiting, "account data").await;
    let global = woke["extensions"]["account_data"]["global"].as_array().expect("global").clone();
    assert!(global.iter().any(|d| d["type"] == "u.custom" && d["content"]["n"] == 1), "{woke}");
    // Alice logs in on a new device: bob, who shares a room with her, hears
    // of it (before its keys, as Synapse tells of a new device).
    let waiting = spawn_ss(&server, &bob, &pos(&woke), 20_000, body.clone());
    server.login("alice", "pw-alice-1").await;
    let woke = woken(waiting, "device list").await;
    let changed = woke["extensions"]["e2ee"]["device_lists"]["changed"].as_array().expect("changed").clone();
    assert!(changed.iter().any(|u| u == alice.user_id.as_str()), "{woke}");
}

async fn bump_stamp_moves_on_messages_only(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let room = create_room(&server, &alice, json!({})).await;
    send(&server, &alice, &room, "first").await;
    let body = all_rooms(json!([[0, 0]]), 1);
    let a = ss_ok(&server, &alice, None, 0, body.clone()).await;
    let stamp = a["rooms"][&room]["bump_stamp"].as_u64().expect("bump_stamp");
    assert!(stamp > 0 && stamp < (1 << 53));
    state(&server, &alice, &room, "m.room.name", "", json!({ "name": "renamed" })).await;
    let b = ss_ok(&server, &alice, Some(&pos(&a)), 0, body.clone()).await;
    let r = &b["rooms"][&room];
    assert_eq!(r["name"], "renamed", "{b}");
    assert_eq!(r["bump_stamp"].as_u64(), Some(stamp), "a name change does not bump: {r}");
    send(&server, &alice, &room, "second").await;
    let c = ss_ok(&server, &alice, Some(&pos(&b)), 0, body).await;
    assert!(c["rooms"][&room]["bump_stamp"].as_u64().unwrap() > stamp, "{c}");
}

async fn filters_pick_invites_dms_encrypted_and_spaces(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let plain = create_room(&server, &bob, json!({})).await;
    let encrypted = create_room(
        &server,
        &bob,
        json!({ "initial_state": [{ "type": "m.room.encryption", "state_key": "", "content": { "algorithm": "m.megolm.v1.aes-sha2" } }] }),
    )
    .await;
    let space = create_room(&server, &bob, json!({ "creation_content": { "type": "m.space" } })).await;
    state(&server, &bob, &space, "m.space.child", &plain, json!({ "via": ["localhost"] })).await;
    let dm = create_room(&server, &alice, json!({ "is_direct": true, "invite": [bob.user_id] })).await;
    let (status, _) = server
        .put(
            &format!("{V3}/user/{}/account_data/m.direct", enc(&bob.user_id)),
            Some(&bob.token),
            json!({ &alice.user_id: [&dm] }),
        )
        .await;
    assert_eq!(status, 200);
    let list = |filters: Value| json!({ "ranges": [[0, 20]], "timeline_limit": 0, "filters": filters });
    let answer = ss_ok(
        &server,
        &bob,
        None,
        0,
        json!({ "lists": {
            "invites": list(json!({ "is_invite": true })),
            "joined": list(json!({ "is_invite": false })),
            "dms": list(json!({ "is_dm": true })),
            "encrypted": list(json!({ "is_encrypted": true })),
            "not_spaces": list(json!({ "not_room_types": ["m.space"] })),
            "spaces_only": list(json!({ "room_types": ["m.space"] })),
            "in_space": list(json!({ "spaces": [&space] })),
        } }),
    )
    .await;
    let count = |name: &str| answer["lists"][name]["count"].as_u64().unwrap();
    assert_eq!(count("invites"), 1, "{answer}");
    assert_eq!(count("joined"), 3);
    assert_eq!(count("dms"), 1);
    assert_eq!(count("encrypted"), 1);
    assert_eq!(count("not_spaces"), 3);
    assert_eq!(count("spaces_only"), 1);
    assert_eq!(count("in_space"), 1);
    assert_eq!(answer["rooms"][&dm]["is_dm"], true);
    assert!(answer["rooms"][&dm]["invite_state"].is_array());
    // Each list alone holds just its rooms.
    let only = |name: &str, filters: Value| json!({ "conn_id": name, "lists": { name: list(filters) } });
    let enc_only = ss_ok(&server, &bob, None, 0, only("e", json!({ "is_encrypted": true }))).await;
    assert_eq!(room_ids(&enc_only), vec![encrypted]);
    let in_space = ss_ok(&server, &bob, None, 0, only("s", json!({ "spaces": [&space] }))).await;
    assert_eq!(room_ids(&in_space), vec![plain]);
}

async fn extensions_bring_receipts_typing_and_account_data(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let id = send(&server, &alice, &room, "read me").await;
    let (status, _) = server
        .post(&room_path(&room, &format!("/receipt/m.read/{}", enc(&id))), Some(&alice.token), json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = server
        .put(
            &format!("{V3}/user/{}/rooms/{}/tags/u.work", enc(&bob.user_id), enc(&room)),
            Some(&bob.token),
            json!({}),
        )
        .await;
    assert_eq!(status, 200);
    let mut body = all_rooms(json!([[0, 9]]), 3);
    body["extensions"] = json!({
        "receipts": { "enabled": true }, "typing": { "enabled": true }, "account_data": { "enabled": true },
    });
    let first = ss_ok(&server, &bob, None, 0, body.clone()).await;
    let ext = &first["extensions"];
    assert!(
        ext["receipts"]["rooms"][&room]["content"][&id]["m.read"][&alice.user_id]["ts"].is_u64(),
        "{ext}"
    );
    let global = ext["account_data"]["global"].as_array().unwrap();
    assert!(global.iter().any(|d| d["type"] == "m.push_rules"), "push rules on the first answer: {ext}");
    let tags = ext["account_data"]["rooms"][&room].as_array().expect("room account data");
    assert!(tags.iter().any(|d| d["type"] == "m.tag" && d["content"]["tags"]["u.work"].is_object()));
    // Alice types: bob's waiting request wakes with it.
    let waiting = spawn_ss(&server, &bob, &pos(&first), 20_000, body.clone());
    let (status, _) = server
        .put(
            &room_path(&room, &format!("/typing/{}", enc(&alice.user_id))),
            Some(&alice.token),
            json!({ "typing": true, "timeout": 10_000 }),
        )
        .await;
    assert_eq!(status, 200);
    let woke = woken(waiting, "typing").await;
    assert_eq!(
        woke["extensions"]["typing"]["rooms"][&room]["content"]["user_ids"],
        json!([alice.user_id]),
        "{woke}"
    );
    assert!(
        woke["extensions"]["receipts"]["rooms"].as_object().unwrap().is_empty(),
        "no receipt news: {woke}"
    );
}

/// The rooms of one answer have their read marks, receipts and account
/// data read together: each room still gets its own, and only its own.
async fn rooms_answered_together_keep_their_own_counts_receipts_and_account_data(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let mut rooms = Vec::new();
    for _ in 0..3 {
        let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
        join(&server, &bob, &room).await;
        let mut sent = Vec::new();
        for i in 0..3 {
            sent.push(send(&server, &alice, &room, &format!("message {i}")).await);
        }
        rooms.push((room, sent));
    }
    let receipt = |user: &User, room: &str, id: &str| {
        let path = room_path(room, &format!("/receipt/m.read/{}", enc(id)));
        let token = user.token.clone();
        let server = &server;
        async move { server.post(&path, Some(&token), json!({})).await.0 }
    };
    // Bob read the first message of room 0 and two of room 1, none of room 2.
    assert_eq!(receipt(&bob, &rooms[0].0, &rooms[0].1[0]).await, 200);
    assert_eq!(receipt(&bob, &rooms[1].0, &rooms[1].1[1]).await, 200);
    // Alice's own receipt in room 1 only, at its newest message.
    assert_eq!(receipt(&alice, &rooms[1].0, &rooms[1].1[2]).await, 200);
    for (i, tag) in [(0, "u.first"), (2, "u.third")] {
        let path = format!("{V3}/user/{}/rooms/{}/tags/{tag}", enc(&bob.user_id), enc(&rooms[i].0));
        assert_eq!(server.put(&path, Some(&bob.token), json!({})).await.0, 200);
    }
    let mut body = all_rooms(json!([[0, 9]]), 1);
    body["extensions"] = json!({ "receipts": { "enabled": true }, "account_data": { "enabled": true } });
    let answer = ss_ok(&server, &bob, None, 0, body).await;
    let counts: Vec<&Value> = rooms.iter().map(|(r, _)| &answer["rooms"][r]["notification_count"]).collect();
    assert_eq!(counts, vec![&json!(2), &json!(1), &json!(3)], "{answer}");
    let ext = &answer["extensions"];
    let tags = |i: usize| -> Vec<String> {
        ext["account_data"]["rooms"][&rooms[i].0]
            .as_array()
            .map(|data| {
                data.iter()
                    .filter(|d| d["type"] == "m.tag")
                    .flat_map(|d| d["content"]["tags"].as_object().unwrap().keys().cloned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!((tags(0), tags(1), tags(2)), (vec!["u.first".to_owned()], vec![], vec!["u.third".to_owned()]));
    let read_by = |i: usize| -> Vec<(String, String)> {
        let mut found = Vec::new();
        if let Some(content) = ext["receipts"]["rooms"][&rooms[i].0]["content"].as_object() {
            for (event, kinds) in content {
                for user in kinds["m.read"].as_object().into_iter().flat_map(|u| u.keys()) {
                    found.push((event.clone(), user.clone()));
                }
            }
        }
        found.sort();
        found
    };
    // Room 0: bob's own receipt (whatever event it is at); room 1: bob's
    // own and alice's at the timeline's event; room 2: none.
    assert_eq!(read_by(0), vec![(rooms[0].1[0].clone(), bob.user_id.clone())], "{ext}");
    let mut both =
        vec![(rooms[1].1[1].clone(), bob.user_id.clone()), (rooms[1].1[2].clone(), alice.user_id.clone())];
    both.sort();
    assert_eq!(read_by(1), both, "{ext}");
    assert_eq!(read_by(2), vec![], "{ext}");
}

/// The timelines and `required_state` of a first answer's rooms are read
/// for all of them at once: each room still gets its own events, its own
/// name and the member events of its own timeline's senders, within what
/// the user may read (a room joined under `joined` history starts at the
/// join; a room left is read up to the leave).
async fn rooms_answered_together_keep_their_own_timelines_and_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let carol = server.register("carol", "pw-carol-1").await;
    let mut rooms = Vec::new();
    for i in 0..3 {
        let room =
            create_room(&server, &alice, json!({ "preset": "public_chat", "name": format!("room {i}") }))
                .await;
        join(&server, &bob, &room).await;
        join(&server, &carol, &room).await;
        rooms.push(room);
    }
    // Room 0: alice then carol; room 1: carol then alice; room 2: alice twice.
    let sent = [
        vec![send(&server, &alice, &rooms[0], "r0 a").await, send(&server, &carol, &rooms[0], "r0 c").await],
        vec![send(&server, &carol, &rooms[1], "r1 c").await, send(&server, &alice, &rooms[1], "r1 a").await],
        vec![
            send(&server, &alice, &rooms[2], "r2 a1").await,
            send(&server, &alice, &rooms[2], "r2 a2").await,
        ],
    ];
    // A room under `joined` history that bob joins after its first message,
    // and one he leaves before its last.
    let late = create_room(
        &server,
        &alice,
        json!({ "preset": "public_chat", "name": "late", "initial_state": [{
            "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } }] }),
    )
    .await;
    send(&server, &alice, &late, "before bob").await;
    join(&server, &bob, &late).await;
    let after = send(&server, &alice, &late, "after bob").await;
    let left = create_room(&server, &alice, json!({ "preset": "public_chat", "name": "left" })).await;
    join(&server, &bob, &left).await;
    send(&server, &alice, &left, "while bob was in").await;
    assert_eq!(server.post(&room_path(&left, "/leave"), Some(&bob.token), json!({})).await.0, 200);
    send(&server, &alice, &left, "after bob left").await;

    let answer = ss_ok(&server, &bob, None, 0, all_rooms(json!([[0, 9]]), 2)).await;
    for (i, room) in rooms.iter().enumerate() {
        let entry = &answer["rooms"][room];
        let ids: Vec<&str> =
            entry["timeline"].as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap()).collect();
        assert_eq!(ids, sent[i].iter().map(String::as_str).collect::<Vec<_>>(), "room {i}: {entry}");
        assert_eq!(entry["name"], format!("room {i}"), "{entry}");
        let members = required_members(entry);
        let mut expected = vec![bob.user_id.as_str(), alice.user_id.as_str()];
        if i < 2 {
            expected.push(carol.user_id.as_str());
        }
        expected.sort_unstable();
        assert_eq!(members, expected, "room {i}: {entry}");
        for event in entry["required_state"].as_array().unwrap() {
            assert_eq!(event["room_id"].as_str().unwrap_or(room), room, "room {i}: {event}");
        }
    }
    // Only what bob may read: the join and after in `late`, up to the leave in `left`.
    let late_bodies = bodies(&answer["rooms"][&late]);
    assert_eq!(late_bodies, vec!["after bob".to_owned()], "{}", answer["rooms"][&late]);
    assert_eq!(answer["rooms"][&late]["timeline"].as_array().unwrap().last().unwrap()["event_id"], after);
    let left_entry = &answer["rooms"][&left];
    assert!(!left_entry.to_string().contains("after bob left"), "{left_entry}");
}

async fn others_rooms_and_rooms_left_stay_hidden(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let eve = server.register("eve", "pw-eve-1").await;
    let secret = create_room(&server, &alice, json!({ "preset": "private_chat" })).await;
    send(&server, &alice, &secret, "for alice only").await;
    // A subscription to a room eve was never in: nothing, not even an error.
    let sub = json!({ "room_subscriptions": { &secret: { "timeline_limit": 10, "required_state": [["*", "*"]] } } });
    let answer = ss_ok(&server, &eve, None, 0, sub).await;
    assert_eq!(room_ids(&answer), Vec::<String>::new(), "{answer}");
    // A room eve left: up to her leave, never after.
    let public = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &eve, &public).await;
    send(&server, &alice, &public, "while eve is in").await;
    let (status, _) = server.post(&room_path(&public, "/leave"), Some(&eve.token), json!({})).await;
    assert_eq!(status, 200);
    send(&server, &alice, &public, "after eve left").await;
    let sub = json!({ "room_subscriptions": { &public: { "timeline_limit": 10, "required_state": [["m.room.member", "$ME"]] } } });
    let answer = ss_ok(&server, &eve, None, 0, sub).await;
    let r = &answer["rooms"][&public];
    assert_eq!(bodies(r), vec!["while eve is in"], "{r}");
    assert_eq!(state_of(r, "m.room.member", &eve.user_id).unwrap()["content"]["membership"], "leave");
    // Her own leave does not list the room on a new connection.
    let listed = ss_ok(&server, &eve, None, 0, all_rooms(json!([[0, 9]]), 1)).await;
    assert_eq!(listed["lists"]["all"]["count"], 0, "{listed}");
    // Forgotten: not even a subscription reaches it any more.
    let (status, _) = server.post(&room_path(&public, "/forget"), Some(&eve.token), json!({})).await;
    assert_eq!(status, 200);
    let sub =
        json!({ "conn_id": "after-forget", "room_subscriptions": { &public: { "timeline_limit": 10 } } });
    let answer = ss_ok(&server, &eve, None, 0, sub).await;
    assert_eq!(room_ids(&answer), Vec::<String>::new(), "a forgotten room: {answer}");
}

async fn a_request_for_too_much_is_answered_in_parts(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let mut rooms = Vec::new();
    for i in 0..12 {
        let room = create_room(&server, &alice, json!({})).await;
        send(&server, &alice, &room, &format!("in room {i}")).await;
        rooms.push(room);
    }
    rooms.sort();
    // 12 rooms of up to 1,000 events each: more than one answer is built for.
    let body = all_rooms(json!([[0, 99]]), 1000);
    let first = ss_ok(&server, &alice, None, 0, body.clone()).await;
    assert_eq!(first["lists"]["all"]["count"], 12);
    let got = room_ids(&first);
    assert_eq!(got.len(), 10, "{first}");
    // The rest come at once in the next answer (no waiting for news), each once.
    let started = Instant::now();
    let second = ss_ok(&server, &alice, Some(&pos(&first)), 10_000, body.clone()).await;
    assert!(started.elapsed() < Duration::from_secs(5), "the rest waited for news");
    let mut all: Vec<String> = got.into_iter().chain(room_ids(&second)).collect();
    all.sort();
    assert_eq!(all, rooms, "every room once across the two answers");
    let third = ss_ok(&server, &alice, Some(&pos(&second)), 0, body).await;
    assert_eq!(room_ids(&third), Vec::<String>::new(), "{third}");
}

/// A room on Synapse (version 12, shared history) joined over federation,
/// and a Synapse user's invite into another (a room not on our line yet):
/// both in the list, the joined one with its newest events, the user's join
/// and a `prev_batch` from which `/messages` backfills the rest.
async fn rooms_of_another_server_appear_whole(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw-alice-1").await;
    let bob = syn.register("bob", "pw-bob-1").await;
    let create = |name: &str| {
        json!({ "preset": "public_chat", "room_version": "12", "name": name,
                "initial_state": [{ "type": "m.room.history_visibility", "content": { "history_visibility": "shared" } }] })
    };
    let (status, created) =
        syn.post(&format!("{V3}/createRoom"), Some(&bob.token), create("Over there")).await;
    assert_eq!(status, 200, "{created}");
    let room = created["room_id"].as_str().unwrap().to_owned();
    for i in 0..8 {
        let path = room_path(&room, &format!("/send/m.room.message/f{i}"));
        let (status, sent) = syn.put(&path, Some(&bob.token), text(&format!("far {i}"))).await;
        assert_eq!(status, 200, "{sent}");
    }
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&syn.name));
    let (status, joined) = seq.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{joined}");
    let (status, other) = syn.post(&format!("{V3}/createRoom"), Some(&bob.token), create("Invited")).await;
    assert_eq!(status, 200, "{other}");
    let invited = other["room_id"].as_str().unwrap().to_owned();
    let (status, body) = syn
        .post(&room_path(&invited, "/invite"), Some(&bob.token), json!({ "user_id": alice.user_id }))
        .await;
    assert_eq!(status, 200, "{body}");

    let answer = eventually("the remote invite in alice's list", || async {
        let a = ss_ok(&seq.server, &alice, None, 0, all_rooms(json!([[0, 9]]), 3)).await;
        (a["lists"]["all"]["count"] == 2).then_some(a)
    })
    .await;
    let r = &answer["rooms"][&room];
    assert_eq!(r["initial"], true, "{answer}");
    assert_eq!(r["name"], "Over there");
    let me = state_of(r, "m.room.member", &alice.user_id).expect("own join");
    assert_eq!(me["content"]["membership"], "join");
    let stamp = r["bump_stamp"].as_u64().expect("bump_stamp");
    assert!(stamp < (1 << 53), "{stamp}");
    // Her join starts the line here (as in /sync); what came before is
    // fetched when she pages back.
    let timeline = r["timeline"].as_array().unwrap();
    assert_eq!(timeline.last().unwrap()["type"], "m.room.member", "{r}");
    assert_eq!(timeline.last().unwrap()["state_key"], alice.user_id.as_str());
    assert_eq!(r["limited"], true);
    let from = r["prev_batch"].as_str().unwrap();
    let (status, page) = seq
        .server
        .get(&room_path(&room, &format!("/messages?dir=b&limit=3&from={}", enc(from))), Some(&alice.token))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(message_bodies(&page), vec!["far 5", "far 6", "far 7"], "backfilled from Synapse");
    let i = &answer["rooms"][&invited];
    let stripped = i["invite_state"].as_array().expect("invite_state of the remote invite");
    assert!(
        stripped.iter().any(|e| e["type"] == "m.room.member"
            && e["state_key"] == alice.user_id.as_str()
            && e["content"]["membership"] == "invite"),
        "{i}"
    );
    assert_eq!(i["initial"], true);
}

/// Someone invited who never joined and turned the invite down may see
/// their own leave, never the room's state (as `/state` refuses them).
async fn a_rejected_invite_shows_only_the_own_leave(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-1").await;
    let bob = server.register("bob", "pw-bob-1").await;
    let room =
        create_room(&server, &alice, json!({ "preset": "private_chat", "topic": "secret plans" })).await;
    let (status, _) = server
        .post(&room_path(&room, "/invite"), Some(&alice.token), json!({ "user_id": bob.user_id }))
        .await;
    assert_eq!(status, 200);
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "newer plans" })).await;
    let (status, _) = server.get(&room_path(&room, "/state"), Some(&bob.token)).await;
    assert_eq!(status, 403, "/state refuses him");
    let sub =
        json!({ "room_subscriptions": { &room: { "timeline_limit": 10, "required_state": [["*", "*"]] } } });
    let answer = ss_ok(&server, &bob, None, 0, sub).await;
    let r = &answer["rooms"][&room];
    let kinds: Vec<(&str, &str)> = r["required_state"]
        .as_array()
        .expect("required_state")
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["state_key"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, vec![("m.room.member", bob.user_id.as_str())], "{r}");
    assert_eq!(state_of(r, "m.room.member", &bob.user_id).unwrap()["content"]["membership"], "leave");
    assert!(r.get("name").is_none() && !r.to_string().contains("plans"), "{r}");
}
