//! `/sync`: initial and incremental syncs, invited and left rooms, limited
//! timelines and filters, lazy-loaded members, `state_after`, long-polling
//! (messages, typing, receipts, account data, tags) and many concurrent
//! writers, each checked by event id, body and order against `/messages`.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

backend_tests!(
    initial_sync_has_newest_timeline_state_before_it_and_summary,
    incremental_sync_sends_only_new_events_once,
    invited_room_has_stripped_invite_state,
    leave_shows_the_room_under_leave_up_to_the_leave,
    include_leave_brings_back_older_leaves_on_initial_sync,
    rejected_invite_appears_under_leave,
    a_rejected_invite_brings_only_the_own_membership_as_state,
    forgotten_room_disappears_even_with_include_leave,
    join_leave_join_in_one_window_is_a_join_without_the_gap,
    timeline_limit_from_inline_and_stored_filters,
    lazy_load_members_sends_only_the_timeline_senders,
    use_state_after_sends_state_after_the_timeline,
    long_poll_wakes_on_a_message,
    long_poll_wakes_on_typing,
    a_typing_wake_carries_the_counts_as_they_stand,
    typing_is_refused_once_the_typist_has_left,
    long_poll_wakes_on_a_receipt_and_private_receipts_stay_private,
    long_poll_wakes_on_account_data_and_tags,
    long_poll_of_a_non_member_is_not_woken,
    read_markers_set_fully_read_and_read_receipt,
    concurrent_senders_reach_the_reader_once_each_in_order,
    incremental_sync_over_many_rooms_brings_each_kind_of_news,
    a_woken_sync_reads_again_what_moved_while_it_waited,
);

/// A long-poll that some action must wake well before its end.
const LONG_POLL_MS: u64 = 10_000;

/// How long a woken long-poll may take to answer.
const WAKE_WITHIN: Duration = Duration::from_secs(5);

/// `/_matrix/client/v3/user/{user_id}{rest}`.
fn user_path(user: &User, rest: &str) -> String {
    format!("{V3}/user/{}{rest}", enc(&user.user_id))
}

async fn post_ok(server: &Server, user: &User, path: &str, body: Value) -> Value {
    let (status, response) = server.post(path, Some(&user.token), body.clone()).await;
    assert_eq!(status, 200, "POST {path} {body}: {response}");
    response
}

async fn put_ok(server: &Server, user: &User, path: &str, body: Value) -> Value {
    let (status, response) = server.put(path, Some(&user.token), body.clone()).await;
    assert_eq!(status, 200, "PUT {path} {body}: {response}");
    response
}

async fn get_ok(server: &Server, user: &User, path: &str) -> Value {
    let (status, response) = server.get(path, Some(&user.token)).await;
    assert_eq!(status, 200, "GET {path}: {response}");
    response
}

async fn create_room(server: &Server, user: &User, body: Value) -> String {
    let response = post_ok(server, user, &format!("{V3}/createRoom"), body).await;
    response["room_id"].as_str().unwrap_or_else(|| panic!("no room_id in {response}")).to_owned()
}

/// Sends an m.room.message; returns its event id.
async fn send_text(server: &Server, user: &User, room_id: &str, txn_id: &str, body: &str) -> String {
    let path = room_path(room_id, &format!("/send/m.room.message/{}", enc(txn_id)));
    event_id_of(&put_ok(server, user, &path, json!({ "msgtype": "m.text", "body": body })).await)
}

/// Sends a state event; returns its event id.
async fn set_state(
    server: &Server,
    user: &User,
    room_id: &str,
    kind: &str,
    state_key: &str,
    content: Value,
) -> String {
    let path = room_path(room_id, &format!("/state/{}/{}", enc(kind), enc(state_key)));
    event_id_of(&put_ok(server, user, &path, content).await)
}

async fn join(server: &Server, user: &User, room_id: &str) {
    post_ok(server, user, &room_path(room_id, "/join"), json!({})).await;
}

async fn leave(server: &Server, user: &User, room_id: &str) {
    post_ok(server, user, &room_path(room_id, "/leave"), json!({})).await;
}

async fn invite(server: &Server, inviter: &User, room_id: &str, invitee: &User) {
    post_ok(server, inviter, &room_path(room_id, "/invite"), json!({ "user_id": invitee.user_id })).await;
}

/// GET /sync?{query}, which must succeed.
async fn sync(server: &Server, user: &User, query: &str) -> Value {
    get_ok(server, user, &format!("{V3}/sync?{query}")).await
}

/// The query of an incremental sync that does not wait.
fn since(token: &str) -> String {
    format!("since={}&timeout=0", enc(token))
}

/// The `filter` query parameter carrying an inline filter definition.
fn filter_param(filter: &Value) -> String {
    format!("filter={}", enc(&filter.to_string()))
}

#[track_caller]
fn next_batch(body: &Value) -> String {
    body["next_batch"].as_str().unwrap_or_else(|| panic!("no next_batch in {body}")).to_owned()
}

/// `rooms.{section}.{room_id}`; panics if it is not there.
#[track_caller]
fn room_in<'a>(body: &'a Value, section: &str, room_id: &str) -> &'a Value {
    body["rooms"][section]
        .get(room_id)
        .unwrap_or_else(|| panic!("{room_id} is not in rooms.{section}: {body}"))
}

/// The room ids under `rooms.{section}` (an absent section is empty).
fn room_ids(body: &Value, section: &str) -> Vec<String> {
    body["rooms"][section].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

#[track_caller]
fn assert_no_rooms(body: &Value) {
    for section in ["join", "invite", "leave", "knock"] {
        assert!(room_ids(body, section).is_empty(), "rooms.{section} is not empty: {body}");
    }
}

/// `{container}.events` (absent: empty).
fn events(container: &Value) -> &[Value] {
    container["events"].as_array().map_or(&[], Vec::as_slice)
}

fn timeline(room: &Value) -> &[Value] {
    events(&room["timeline"])
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or_else(|| panic!("no event_id in {e}")).to_owned())
        .collect()
}

/// The bodies of the m.room.message events, in order.
fn bodies(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap_or_else(|| panic!("no body in {e}")).to_owned())
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// (type, state key) -> event id.
fn state_map(events: &[Value]) -> BTreeMap<(String, String), String> {
    let mut map = BTreeMap::new();
    for e in events {
        let field = |k: &str| e[k].as_str().unwrap_or_else(|| panic!("no {k} in {e}")).to_owned();
        let previous = map.insert((field("type"), field("state_key")), field("event_id"));
        assert!(previous.is_none(), "state holds ({}, {}) twice", e["type"], e["state_key"]);
    }
    map
}

fn key(kind: &str, state_key: &str) -> (String, String) {
    (kind.to_owned(), state_key.to_owned())
}

/// The state event of (type, key); panics if it is not there.
#[track_caller]
fn find<'a>(state: &'a [Value], kind: &str, state_key: &str) -> &'a Value {
    state
        .iter()
        .find(|e| e["type"] == kind && e["state_key"] == state_key)
        .unwrap_or_else(|| panic!("no {kind}/{state_key:?} in {}", Value::Array(state.to_vec())))
}

/// The ephemeral event of `kind` in a joined room, if any.
fn ephemeral<'a>(room: &'a Value, kind: &str) -> Option<&'a Value> {
    events(&room["ephemeral"]).iter().find(|e| e["type"] == kind)
}

/// The content of the account data event of `kind` in an `account_data` section.
fn account_data<'a>(section: &'a Value, kind: &str) -> Option<&'a Value> {
    events(section).iter().find(|e| e["type"] == kind).map(|e| &e["content"])
}

/// GET /rooms/{id}/state.
async fn current_state(server: &Server, user: &User, room_id: &str) -> Vec<Value> {
    let body = get_ok(server, user, &room_path(room_id, "/state")).await;
    body.as_array().unwrap_or_else(|| panic!("state is not an array: {body}")).clone()
}

/// Every event before `from` (`None`: the whole room), oldest first, paging
/// `/messages` backwards until it has no `end`.
async fn messages_before(server: &Server, user: &User, room_id: &str, from: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = from.map(str::to_owned);
    loop {
        let mut path = room_path(room_id, "/messages?dir=b&limit=50");
        if let Some(token) = &from {
            let _ = write!(path, "&from={}", enc(token));
        }
        let body = get_ok(server, user, &path).await;
        let chunk = body["chunk"].as_array().unwrap_or_else(|| panic!("no chunk in {body}"));
        out.extend(chunk.iter().cloned());
        match body["end"].as_str() {
            Some(end) if !chunk.is_empty() => from = Some(end.to_owned()),
            _ => break,
        }
    }
    out.reverse();
    out
}

/// The room's whole timeline, oldest first.
async fn all_events(server: &Server, user: &User, room_id: &str) -> Vec<Value> {
    messages_before(server, user, room_id, None).await
}

/// Starts a sync in a task of its own; the task yields how long it took and the body.
fn spawn_sync(server: &Server, user: &User, query: &str) -> JoinHandle<(Duration, Value)> {
    let request = server.http().get(server.url(&format!("{V3}/sync?{query}"))).bearer_auth(&user.token);
    let started = Instant::now();
    tokio::spawn(async move {
        let response = request.send().await.expect("sync request");
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("sync body");
        assert_eq!(status, 200, "{body}");
        (started.elapsed(), body)
    })
}

/// A long-poll from `token` that some action is about to wake.
fn spawn_long_poll(server: &Server, user: &User, token: &str) -> JoinHandle<(Duration, Value)> {
    spawn_sync(server, user, &format!("since={}&timeout={LONG_POLL_MS}", enc(token)))
}

/// Awaits a long-poll that must have been woken: it answers within a few
/// seconds, well before its timeout.
async fn woken(handle: JoinHandle<(Duration, Value)>, what: &str) -> Value {
    let (elapsed, body) = tokio::time::timeout(WAKE_WITHIN, handle)
        .await
        .unwrap_or_else(|_| panic!("{what}: the long-poll was not woken within {WAKE_WITHIN:?}"))
        .expect("sync task");
    assert!(elapsed < WAKE_WITHIN, "{what}: took {elapsed:?}");
    body
}

async fn initial_sync_has_newest_timeline_state_before_it_and_summary(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room =
        create_room(&server, &alice, json!({ "topic": "old topic", "invite": [bob.user_id, carol.user_id] }))
            .await;
    join(&server, &bob, &room).await;
    for i in 0..10 {
        send_text(&server, &alice, &room, &format!("t{i}"), &format!("m{i}")).await;
    }
    let new_topic =
        set_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "new topic" })).await;
    for i in 10..14 {
        send_text(&server, &alice, &room, &format!("t{i}"), &format!("m{i}")).await;
    }
    let all = all_events(&server, &bob, &room).await;
    assert!(all.len() > 20, "{}", all.len());

    let body = sync(&server, &bob, "").await;
    assert!(room_ids(&body, "invite").is_empty() && room_ids(&body, "leave").is_empty(), "{body}");
    let joined = room_in(&body, "join", &room);
    let tl = timeline(joined);
    // The 10 newest events, oldest first.
    let newest = &all[all.len() - 10..];
    assert_eq!(ids(tl), ids(newest), "{body}");
    assert_eq!(bodies(tl), strings(&["m5", "m6", "m7", "m8", "m9", "m10", "m11", "m12", "m13"]), "{body}");
    assert_eq!(tl[5]["event_id"], new_topic.as_str());
    assert_eq!(tl[5]["content"]["topic"], "new topic");
    for e in tl {
        assert_eq!(e["room_id"], room.as_str(), "{e}");
    }
    assert_eq!(joined["timeline"]["limited"], true, "{body}");

    // prev_batch pages back through exactly the events before the timeline.
    let prev_batch =
        joined["timeline"]["prev_batch"].as_str().unwrap_or_else(|| panic!("no prev_batch: {body}"));
    let before = messages_before(&server, &bob, &room, Some(prev_batch)).await;
    assert_eq!(ids(&before), ids(&all[..all.len() - 10]));

    // `state` is the state at the start of the timeline: the old topic, not
    // the timeline's own topic event.
    let old_topic = all.iter().find(|e| e["type"] == "m.room.topic").expect("a topic event");
    assert_eq!(old_topic["content"]["topic"], "old topic");
    let mut expected = state_map(&current_state(&server, &bob, &room).await);
    assert_eq!(expected[&key("m.room.topic", "")], new_topic);
    expected.insert(key("m.room.topic", ""), old_topic["event_id"].as_str().unwrap().to_owned());
    let state = events(&joined["state"]);
    assert_eq!(state_map(state), expected, "{body}");
    assert_eq!(find(state, "m.room.topic", "")["content"]["topic"], "old topic");
    assert_eq!(find(state, "m.room.member", &carol.user_id)["content"]["membership"], "invite");
    let timeline_ids: HashSet<String> = ids(tl).into_iter().collect();
    for e in state {
        assert!(!timeline_ids.contains(e["event_id"].as_str().unwrap()), "state holds a timeline event: {e}");
    }

    // No name: heroes are the other joined and invited members.
    let summary = &joined["summary"];
    assert_eq!(summary["m.joined_member_count"], 2, "{summary}");
    assert_eq!(summary["m.invited_member_count"], 1, "{summary}");
    assert_eq!(summary["m.heroes"], json!([alice.user_id, carol.user_id]), "{summary}");

    // A small named room: the whole room in the timeline, nothing before it.
    let den = create_room(&server, &bob, json!({ "name": "Bob's den" })).await;
    let den_all = all_events(&server, &bob, &den).await;
    assert!(den_all.len() < 10, "{}", den_all.len());
    let body = sync(&server, &bob, "").await;
    let joined = room_in(&body, "join", &den);
    assert_eq!(ids(timeline(joined)), ids(&den_all), "{body}");
    assert_eq!(joined["timeline"]["limited"], false, "{body}");
    assert!(events(&joined["state"]).is_empty(), "{body}");
    let prev_batch =
        joined["timeline"]["prev_batch"].as_str().unwrap_or_else(|| panic!("no prev_batch: {body}"));
    assert!(messages_before(&server, &bob, &den, Some(prev_batch)).await.is_empty());
    let summary = &joined["summary"];
    assert_eq!(summary["m.joined_member_count"], 1, "{summary}");
    assert_eq!(summary["m.invited_member_count"], 0, "{summary}");
    assert!(summary.get("m.heroes").is_none(), "a named room has no heroes: {summary}");
    // Both rooms are there.
    let mut joined_rooms = room_ids(&body, "join");
    joined_rooms.sort();
    let mut expected_rooms = vec![room.clone(), den.clone()];
    expected_rooms.sort();
    assert_eq!(joined_rooms, expected_rooms);
}

async fn incremental_sync_sends_only_new_events_once(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let quiet = create_room(&server, &alice, json!({})).await;
    send_text(&server, &alice, &room, "first", "m0").await;

    let first = sync(&server, &alice, "").await;
    let first_token = next_batch(&first);
    room_in(&first, "join", &quiet);
    let mut seen = ids(timeline(room_in(&first, "join", &room)));
    let mut token = first_token.clone();
    let mut all_sent = Vec::new();
    for round in 0..3 {
        let mut sent = Vec::new();
        for i in 0..3 {
            sent.push(
                send_text(&server, &alice, &room, &format!("r{round}{i}"), &format!("r{round}-{i}")).await,
            );
        }
        let body = sync(&server, &alice, &since(&token)).await;
        assert_eq!(room_ids(&body, "join"), vec![room.clone()], "only the busy room: {body}");
        let joined = room_in(&body, "join", &room);
        assert_eq!(ids(timeline(joined)), sent, "{body}");
        assert_eq!(bodies(timeline(joined)), (0..3).map(|i| format!("r{round}-{i}")).collect::<Vec<_>>());
        assert_eq!(joined["timeline"]["limited"], false, "{body}");
        assert!(events(&joined["state"]).is_empty(), "no state changed: {body}");
        // prev_batch pages back into what was already synced.
        let prev_batch = joined["timeline"]["prev_batch"].as_str().unwrap_or_else(|| panic!("{body}"));
        let path = room_path(&room, &format!("/messages?dir=b&limit=3&from={}", enc(prev_batch)));
        let page = get_ok(&server, &alice, &path).await;
        let mut earlier = ids(page["chunk"].as_array().unwrap());
        earlier.reverse();
        assert_eq!(earlier, seen[seen.len() - 3..].to_vec(), "{page}");
        let next = next_batch(&body);
        assert_ne!(next, token);
        seen.extend(ids(timeline(joined)));
        all_sent.extend(sent);
        token = next;
    }
    // The syncs together hold the room's timeline, each event once.
    let all = all_events(&server, &alice, &room).await;
    assert_eq!(seen, ids(&all));
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), seen.len());

    // Nothing new: an immediate answer without rooms.
    let started = Instant::now();
    let body = sync(&server, &alice, &since(&token)).await;
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_no_rooms(&body);
    let token = next_batch(&body);
    let body = sync(&server, &alice, &since(&token)).await;
    assert_no_rooms(&body);

    // An older token still reads from where it was.
    let body = sync(&server, &alice, &since(&first_token)).await;
    assert_eq!(ids(timeline(room_in(&body, "join", &room))), all_sent, "{body}");
}

async fn invited_room_has_stripped_invite_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "name": "Invite Room", "topic": "Come in" })).await;

    let first = sync(&server, &bob, "").await;
    assert_no_rooms(&first);
    invite(&server, &alice, &room, &bob).await;

    let check = |body: &Value| {
        assert!(room_ids(body, "join").is_empty(), "{body}");
        let invited = room_in(body, "invite", &room);
        let state = events(&invited["invite_state"]);
        for e in state {
            for field in ["type", "state_key", "sender"] {
                assert!(e[field].is_string(), "stripped event without {field}: {e}");
            }
            assert!(e["content"].is_object(), "{e}");
        }
        let mine = find(state, "m.room.member", &bob.user_id);
        assert_eq!(mine["content"]["membership"], "invite", "{mine}");
        assert_eq!(mine["sender"], alice.user_id.as_str(), "{mine}");
        let inviter = find(state, "m.room.member", &alice.user_id);
        assert_eq!(inviter["content"]["membership"], "join", "{inviter}");
        assert_eq!(inviter["sender"], alice.user_id.as_str(), "{inviter}");
        assert_eq!(find(state, "m.room.name", "")["content"]["name"], "Invite Room");
        assert_eq!(find(state, "m.room.join_rules", "")["content"]["join_rule"], "invite");
        assert_eq!(find(state, "m.room.create", "")["sender"], alice.user_id.as_str());
    };
    let body = sync(&server, &bob, &since(&next_batch(&first))).await;
    check(&body);
    // An initial sync shows the invite too.
    let body = sync(&server, &bob, "").await;
    check(&body);

    // Joining moves the room to `join`, with the join at the end of the timeline.
    let token = next_batch(&body);
    join(&server, &bob, &room).await;
    let body = sync(&server, &bob, &since(&token)).await;
    assert!(room_ids(&body, "invite").is_empty(), "{body}");
    let joined = room_in(&body, "join", &room);
    let last = timeline(joined).last().unwrap_or_else(|| panic!("empty timeline: {body}"));
    assert_eq!((&last["type"], &last["state_key"]), (&json!("m.room.member"), &json!(bob.user_id)), "{last}");
    assert_eq!(last["content"]["membership"], "join");
}

async fn leave_shows_the_room_under_leave_up_to_the_leave(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let first = sync(&server, &bob, "").await;
    room_in(&first, "join", &room);

    let before = send_text(&server, &alice, &room, "b", "before the leave").await;
    leave(&server, &bob, &room).await;
    send_text(&server, &alice, &room, "a1", "after the leave").await;
    let all = all_events(&server, &alice, &room).await;
    let leave_event = &all[all.len() - 2];
    assert_eq!(leave_event["state_key"], bob.user_id.as_str(), "{leave_event}");
    assert_eq!(leave_event["content"]["membership"], "leave", "{leave_event}");
    let leave_id = leave_event["event_id"].as_str().unwrap().to_owned();

    let body = sync(&server, &bob, &since(&next_batch(&first))).await;
    assert!(room_ids(&body, "join").is_empty(), "{body}");
    let left = room_in(&body, "leave", &room);
    assert_eq!(ids(timeline(left)), vec![before, leave_id.clone()], "{body}");
    assert_eq!(bodies(timeline(left)), strings(&["before the leave"]));

    // Later syncs: the room is gone, and what was sent after the leave never comes.
    let token = next_batch(&body);
    send_text(&server, &alice, &room, "a2", "after the leave, again").await;
    let body = sync(&server, &bob, &since(&token)).await;
    assert_no_rooms(&body);
    let body = sync(&server, &bob, &since(&next_batch(&body))).await;
    assert_no_rooms(&body);
    let body = sync(&server, &bob, "").await;
    assert_no_rooms(&body);
    let include_leave = filter_param(&json!({ "room": { "include_leave": true } }));
    let body = sync(&server, &bob, &include_leave).await;
    let left = room_in(&body, "leave", &room);
    assert_eq!(ids(timeline(left)).last(), Some(&leave_id), "{body}");
    assert!(bodies(timeline(left)).iter().all(|b| !b.starts_with("after")), "{body}");
    assert!(!body.to_string().contains("after the leave"), "{body}");
}

async fn include_leave_brings_back_older_leaves_on_initial_sync(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "name": "Old haunt" })).await;
    join(&server, &bob, &room).await;
    let said = send_text(&server, &bob, &room, "b1", "bye").await;
    leave(&server, &bob, &room).await;
    send_text(&server, &alice, &room, "a1", "after bob left").await;
    let all = all_events(&server, &alice, &room).await;
    let leave_id = all[all.len() - 2]["event_id"].as_str().unwrap().to_owned();

    let body = sync(&server, &bob, "").await;
    assert_no_rooms(&body);

    let include_leave = filter_param(&json!({ "room": { "include_leave": true } }));
    let body = sync(&server, &bob, &include_leave).await;
    assert!(room_ids(&body, "join").is_empty(), "{body}");
    let left = room_in(&body, "leave", &room);
    let tl = ids(timeline(left));
    assert!(tl.len() >= 2, "{body}");
    assert_eq!(&tl[tl.len() - 2..], &[said, leave_id.clone()], "{body}");
    assert!(!body.to_string().contains("after bob left"), "{body}");

    // Incremental syncs do not bring it back.
    let later = sync(&server, &bob, &format!("{}&{include_leave}", since(&next_batch(&body)))).await;
    assert_no_rooms(&later);

    // The timeline is the room's last 10 events up to the leave: under
    // `shared`, bob may read everything sent before he joined (he "joined the
    // room at any point after the event was sent"), and keeps what he could
    // read when he leaves (client-server API, "Room History Visibility").
    let upto = all.iter().position(|e| e["event_id"] == leave_id.as_str()).unwrap();
    let expected: Vec<String> = ids(&all[..=upto]);
    assert_eq!(
        tl,
        expected[expected.len().saturating_sub(10)..].to_vec(),
        "left room's timeline is not the room's up to the leave: {body}"
    );
}

async fn rejected_invite_appears_under_leave(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "name": "Not for me" })).await;
    invite(&server, &alice, &room, &carol).await;
    let first = sync(&server, &carol, "").await;
    room_in(&first, "invite", &room);

    leave(&server, &carol, &room).await;
    let body = sync(&server, &carol, &since(&next_batch(&first))).await;
    assert!(room_ids(&body, "invite").is_empty() && room_ids(&body, "join").is_empty(), "{body}");
    let left = room_in(&body, "leave", &room);
    let last = timeline(left).last().unwrap_or_else(|| panic!("no leave event in the timeline: {body}"));
    assert_eq!(last["type"], "m.room.member", "{last}");
    assert_eq!(last["state_key"], carol.user_id.as_str(), "{last}");
    assert_eq!(last["content"]["membership"], "leave", "{last}");

    let body = sync(&server, &carol, &since(&next_batch(&body))).await;
    assert_no_rooms(&body);
    let body = sync(&server, &carol, "").await;
    assert_no_rooms(&body);
}

/// One who never joined (an invite turned down) gets under `leave` no more
/// of the room's state than `/state` gives them (403: none): only their own
/// membership, whether state comes as `state` or `state_after`, in an
/// incremental sync or an initial one with `include_leave`.
async fn a_rejected_invite_brings_only_the_own_membership_as_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let dave = server.register("dave", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room =
        create_room(&server, &alice, json!({ "preset": "private_chat", "topic": "secret plans" })).await;
    invite(&server, &alice, &room, &dave).await;
    join(&server, &dave, &room).await;
    invite(&server, &alice, &room, &carol).await;
    let first = sync(&server, &carol, "").await;
    room_in(&first, "invite", &room);
    set_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "plans while carol waits" }))
        .await;
    leave(&server, &carol, &room).await;
    let (status, _) = server.get(&room_path(&room, "/state"), Some(&carol.token)).await;
    assert_eq!(status, 403, "/state refuses her");

    let include_leave = filter_param(&json!({ "room": { "include_leave": true } }));
    let queries = [
        since(&next_batch(&first)),
        format!("{}&use_state_after=true", since(&next_batch(&first))),
        include_leave.clone(),
        format!("{include_leave}&use_state_after=true"),
    ];
    for query in queries {
        let body = sync(&server, &carol, &query).await;
        let left = room_in(&body, "leave", &room);
        let field = if query.contains("use_state_after") { "state_after" } else { "state" };
        let keys: Vec<(String, String)> = state_map(events(&left[field])).into_keys().collect();
        let own = key("m.room.member", &carol.user_id);
        assert!(keys.iter().all(|k| *k == own), "{query}: {left}");
        let text = left.to_string();
        assert!(!text.contains("plans") && !text.contains(&dave.user_id), "{query}: {left}");
        let last =
            timeline(left).last().unwrap_or_else(|| panic!("{query}: no leave in the timeline: {body}"));
        assert_eq!(
            (last["state_key"].as_str(), last["content"]["membership"].as_str()),
            (Some(carol.user_id.as_str()), Some("leave"))
        );
    }
}

async fn forgotten_room_disappears_even_with_include_leave(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let forgotten = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let kept = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    for room in [&forgotten, &kept] {
        join(&server, &bob, room).await;
        leave(&server, &bob, room).await;
    }
    let include_leave = filter_param(&json!({ "room": { "include_leave": true } }));
    let body = sync(&server, &bob, &include_leave).await;
    let mut left = room_ids(&body, "leave");
    left.sort();
    let mut both = vec![forgotten.clone(), kept.clone()];
    both.sort();
    assert_eq!(left, both, "{body}");

    post_ok(&server, &bob, &room_path(&forgotten, "/forget"), json!({})).await;
    let body = sync(&server, &bob, &include_leave).await;
    assert_eq!(room_ids(&body, "leave"), vec![kept.clone()], "{body}");
    assert!(room_ids(&body, "join").is_empty(), "{body}");
    let body = sync(&server, &bob, &format!("{include_leave}&full_state=true")).await;
    assert_eq!(room_ids(&body, "leave"), vec![kept], "{body}");
}

async fn join_leave_join_in_one_window_is_a_join_without_the_gap(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({
            "preset": "public_chat",
            "initial_state": [
                { "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } },
            ],
        }),
    )
    .await;
    join(&server, &bob, &room).await;
    let first = sync(&server, &bob, "").await;
    room_in(&first, "join", &room);

    let a1 = send_text(&server, &alice, &room, "a1", "while bob is in").await;
    leave(&server, &bob, &room).await;
    send_text(&server, &alice, &room, "g1", "gap one").await;
    send_text(&server, &alice, &room, "g2", "gap two").await;
    join(&server, &bob, &room).await;
    let a2 = send_text(&server, &alice, &room, "a2", "bob is back").await;

    let all = all_events(&server, &alice, &room).await;
    let find_member = |membership: &str| {
        all.iter()
            .rev()
            .find(|e| e["state_key"] == bob.user_id.as_str() && e["content"]["membership"] == membership)
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let (left_id, rejoin_id) = (find_member("leave"), find_member("join"));

    let body = sync(&server, &bob, &since(&next_batch(&first))).await;
    assert!(room_ids(&body, "leave").is_empty(), "only under join: {body}");
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), vec![a1, left_id, rejoin_id, a2], "{body}");
    assert!(!body.to_string().contains("gap "), "{body}");
}

async fn timeline_limit_from_inline_and_stored_filters(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let mut sent = Vec::new();
    for i in 0..8 {
        sent.push(send_text(&server, &alice, &room, &format!("m{i}"), &format!("m{i}")).await);
    }
    let all = all_events(&server, &alice, &room).await;
    let definition = json!({ "room": { "timeline": { "limit": 3 } } });

    let body = sync(&server, &alice, &filter_param(&definition)).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), sent[5..].to_vec(), "{body}");
    assert_eq!(joined["timeline"]["limited"], true, "{body}");
    let prev_batch = joined["timeline"]["prev_batch"].as_str().unwrap();
    assert_eq!(
        ids(&messages_before(&server, &alice, &room, Some(prev_batch)).await),
        ids(&all[..all.len() - 3])
    );

    // A stored filter, which reads back as it was stored.
    let created = post_ok(&server, &alice, &user_path(&alice, "/filter"), definition.clone()).await;
    let filter_id =
        created["filter_id"].as_str().unwrap_or_else(|| panic!("no filter_id: {created}")).to_owned();
    let stored = get_ok(&server, &alice, &user_path(&alice, &format!("/filter/{}", enc(&filter_id)))).await;
    assert_eq!(stored, definition);
    let response = server.get(&user_path(&alice, "/filter/nosuchfilter"), Some(&alice.token)).await;
    assert_error(&response, 404, "M_NOT_FOUND", "unknown filter id");

    let by_id = format!("filter={}", enc(&filter_id));
    let body = sync(&server, &alice, &by_id).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), sent[5..].to_vec(), "{body}");
    assert_eq!(joined["timeline"]["limited"], true, "{body}");

    // Incremental with the limit: the newest 3, limited, prev_batch reaches
    // the two that were left out, and `state` has the topic set in the gap.
    let gap_topic =
        set_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "in the gap" })).await;
    let mut more = Vec::new();
    for i in 0..5 {
        more.push(send_text(&server, &alice, &room, &format!("n{i}"), &format!("n{i}")).await);
    }
    let body = sync(&server, &alice, &format!("{}&{by_id}", since(&next_batch(&body)))).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), more[2..].to_vec(), "{body}");
    assert_eq!(joined["timeline"]["limited"], true, "{body}");
    assert_eq!(
        ids(events(&joined["state"])),
        vec![gap_topic],
        "state changed between since and the timeline: {body}"
    );
    let prev_batch = joined["timeline"]["prev_batch"].as_str().unwrap();
    let path = room_path(&room, &format!("/messages?dir=b&limit=2&from={}", enc(prev_batch)));
    let page = get_ok(&server, &alice, &path).await;
    let chunk = page["chunk"].as_array().unwrap();
    assert_eq!(ids(chunk), vec![more[1].clone(), more[0].clone()], "{page}");
}

async fn lazy_load_members_sends_only_the_timeline_senders(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let dave = server.register("dave", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    for user in [&bob, &carol, &dave] {
        join(&server, user, &room).await;
    }
    send_text(&server, &alice, &room, "a0", "alice speaks").await;
    let b0 = send_text(&server, &bob, &room, "b0", "bob speaks").await;
    let c0 = send_text(&server, &carol, &room, "c0", "carol speaks").await;
    let b1 = send_text(&server, &bob, &room, "b1", "bob again").await;
    let current = current_state(&server, &alice, &room).await;

    let lazy = json!({ "room": { "state": { "lazy_load_members": true }, "timeline": { "limit": 3 } } });
    let body = sync(&server, &dave, &filter_param(&lazy)).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), vec![b0, c0, b1], "{body}");
    let state = events(&joined["state"]);
    let mut members: Vec<String> = state
        .iter()
        .filter(|e| e["type"] == "m.room.member")
        .map(|e| e["state_key"].as_str().unwrap().to_owned())
        .collect();
    members.sort();
    assert_eq!(members, vec![bob.user_id.clone(), carol.user_id.clone(), dave.user_id.clone()], "{body}");
    for e in state.iter().filter(|e| e["type"] == "m.room.member") {
        let key = e["state_key"].as_str().unwrap();
        assert_eq!(e["event_id"], find(&current, "m.room.member", key)["event_id"], "{e}");
    }
    // Everything else is there as usual.
    let others = |events: &[Value]| {
        state_map(events)
            .into_iter()
            .filter(|((kind, _), _)| kind != "m.room.member")
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(others(state), others(&current));

    // The state and members read above are kept for the syncs that follow;
    // a new topic and Bob's new name reach the next first sync all the same.
    let (status, body) = server
        .put(&room_path(&room, "/state/m.room.topic/"), Some(&alice.token), json!({ "topic": "new" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .put(
            &room_path(&room, &format!("/state/m.room.member/{}", enc(&bob.user_id))),
            Some(&bob.token),
            json!({ "membership": "join", "displayname": "Bobby" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let b2 = send_text(&server, &bob, &room, "b2", "bob renamed").await;
    let c1 = send_text(&server, &carol, &room, "c1", "carol again").await;
    let b3 = send_text(&server, &bob, &room, "b3", "bob once more").await;
    let current = current_state(&server, &alice, &room).await;
    let body = sync(&server, &dave, &filter_param(&lazy)).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), vec![b2, c1, b3], "{body}");
    let state = events(&joined["state"]);
    let bobs = find(state, "m.room.member", &bob.user_id);
    assert_eq!(bobs["content"]["displayname"], "Bobby", "{body}");
    assert_eq!(bobs["event_id"], find(&current, "m.room.member", &bob.user_id)["event_id"], "{body}");
    assert_eq!(find(state, "m.room.topic", "")["content"]["topic"], "new", "{body}");
    assert_eq!(others(state), others(&current));

    // Without lazy loading: every member.
    let body = sync(&server, &dave, &filter_param(&json!({ "room": { "timeline": { "limit": 3 } } }))).await;
    let state = events(&room_in(&body, "join", &room)["state"]);
    assert_eq!(state.iter().filter(|e| e["type"] == "m.room.member").count(), 4, "{body}");

    // A wrongly typed option is refused.
    let bad = json!({ "room": { "state": { "lazy_load_members": "yes" } } });
    let response = server.get(&format!("{V3}/sync?{}", filter_param(&bad)), Some(&dave.token)).await;
    assert_error(&response, 400, "M_BAD_JSON", "lazy_load_members: \"yes\" in /sync");
    let response = server.post(&user_path(&dave, "/filter"), Some(&dave.token), bad).await;
    assert_error(&response, 400, "M_BAD_JSON", "lazy_load_members: \"yes\" in POST /filter");
}

async fn use_state_after_sends_state_after_the_timeline(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "topic": "t1" })).await;
    for i in 0..12 {
        send_text(&server, &alice, &room, &format!("m{i}"), &format!("m{i}")).await;
    }
    let t2 = set_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "t2" })).await;
    send_text(&server, &alice, &room, "m12", "m12").await;

    let body = sync(&server, &alice, "use_state_after=true").await;
    let joined = room_in(&body, "join", &room);
    assert!(joined.get("state").is_none(), "state instead of state_after: {joined}");
    assert!(ids(timeline(joined)).contains(&t2), "{body}");
    let state_after = events(&joined["state_after"]);
    assert_eq!(state_map(state_after), state_map(&current_state(&server, &alice, &room).await), "{body}");
    assert_eq!(find(state_after, "m.room.topic", "")["event_id"], t2.as_str());

    // Incremental: the state change in the timeline is in state_after too,
    // while plain `state` (before the timeline) has nothing.
    let token = next_batch(&body);
    let t3 = set_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "t3" })).await;
    let m13 = send_text(&server, &alice, &room, "m13", "m13").await;
    let body = sync(&server, &alice, &format!("{}&use_state_after=true", since(&token))).await;
    let joined = room_in(&body, "join", &room);
    assert!(joined.get("state").is_none(), "{joined}");
    assert_eq!(ids(timeline(joined)), vec![t3.clone(), m13.clone()], "{body}");
    assert_eq!(ids(events(&joined["state_after"])), vec![t3.clone()], "{body}");
    let body = sync(&server, &alice, &since(&token)).await;
    let joined = room_in(&body, "join", &room);
    assert!(joined.get("state_after").is_none(), "{joined}");
    assert_eq!(ids(timeline(joined)), vec![t3.clone(), m13.clone()], "{body}");
    assert!(events(&joined["state"]).is_empty(), "{body}");
    // The unstable parameter matrix-js-sdk sends (MSC4222) means the same,
    // answered under the unstable field name, the one such a client reads.
    let body =
        sync(&server, &alice, &format!("{}&org.matrix.msc4222.use_state_after=true", since(&token))).await;
    let joined = room_in(&body, "join", &room);
    assert!(joined.get("state").is_none(), "{joined}");
    assert!(joined.get("state_after").is_none(), "{joined}");
    assert_eq!(ids(events(&joined["org.matrix.msc4222.state_after"])), vec![t3.clone()], "{body}");
    // Both names: the stable one wins.
    let query = format!("{}&use_state_after=true&org.matrix.msc4222.use_state_after=true", since(&token));
    let joined = room_in(&sync(&server, &alice, &query).await, "join", &room).clone();
    assert!(joined.get("org.matrix.msc4222.state_after").is_none(), "{joined}");
    assert_eq!(ids(events(&joined["state_after"])), vec![t3], "{joined}");
}

async fn long_poll_wakes_on_a_message(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let token = next_batch(&sync(&server, &alice, "").await);

    let poll = spawn_long_poll(&server, &alice, &token);
    let sent = send_text(&server, &bob, &room, "hello", "wake up").await;
    let body = woken(poll, "message").await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(ids(timeline(joined)), vec![sent], "{body}");
    assert_eq!(bodies(timeline(joined)), strings(&["wake up"]));
    assert_eq!(timeline(joined)[0]["sender"], bob.user_id.as_str());

    // Again from the new token.
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let sent = send_text(&server, &bob, &room, "hello2", "and again").await;
    let body = woken(poll, "second message").await;
    assert_eq!(ids(timeline(room_in(&body, "join", &room))), vec![sent], "{body}");
}

/// The sync from `body`'s next_batch must not deliver `body`'s m.typing again:
/// the token covers what the response held.
async fn assert_typing_not_repeated(server: &Server, user: &User, body: &Value) {
    let token = next_batch(body);
    let again = sync(server, user, &since(&token)).await;
    assert!(
        !again.to_string().contains("m.typing"),
        "the sync from next_batch {token} repeats the typing notice already delivered\n\
         first: {body}\nagain: {again}"
    );
}

/// Alice's public room, which Bob joined, and Alice's first sync's token.
async fn alice_and_bob_synced(backend: &Backend) -> (Server, User, User, String, String) {
    let server = Server::start(backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let token = next_batch(&sync(&server, &alice, "").await);
    (server, alice, bob, room, token)
}

async fn long_poll_wakes_on_typing(backend: Backend) {
    let (server, alice, bob, room, token) = alice_and_bob_synced(&backend).await;
    let typing_path = room_path(&room, &format!("/typing/{}", enc(&bob.user_id)));

    let poll = spawn_long_poll(&server, &alice, &token);
    put_ok(&server, &bob, &typing_path, json!({ "typing": true, "timeout": 30000 })).await;
    let body = woken(poll, "typing").await;
    let joined = room_in(&body, "join", &room);
    let typing = ephemeral(joined, "m.typing").unwrap_or_else(|| panic!("no m.typing: {body}"));
    assert_eq!(typing["content"], json!({ "user_ids": [bob.user_id] }), "{body}");
    assert!(timeline(joined).is_empty(), "{body}");
    assert_typing_not_repeated(&server, &alice, &body).await;

    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    put_ok(&server, &bob, &typing_path, json!({ "typing": false })).await;
    let body = woken(poll, "typing stopped").await;
    let typing =
        ephemeral(room_in(&body, "join", &room), "m.typing").unwrap_or_else(|| panic!("no m.typing: {body}"));
    assert_eq!(typing["content"], json!({ "user_ids": [] }), "{body}");
    assert_typing_not_repeated(&server, &alice, &body).await;

    // A notice that times out ends by itself, and that wakes the long-poll too.
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    put_ok(&server, &bob, &typing_path, json!({ "typing": true, "timeout": 1000 })).await;
    let body = woken(poll, "short typing").await;
    let typing =
        ephemeral(room_in(&body, "join", &room), "m.typing").unwrap_or_else(|| panic!("no m.typing: {body}"));
    assert_eq!(typing["content"], json!({ "user_ids": [bob.user_id] }), "{body}");
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let body = woken(poll, "typing expired").await;
    let typing =
        ephemeral(room_in(&body, "join", &room), "m.typing").unwrap_or_else(|| panic!("no m.typing: {body}"));
    assert_eq!(typing["content"], json!({ "user_ids": [] }), "{body}");
}

/// A long-poll woken by typing alone answers the room's counts as they
/// stand now (kept from the room's last entry, which a message, a receipt
/// or an initial sync in between must not leave standing), an empty
/// timeline whose `prev_batch` pages back from the newest event, and the
/// notice.
async fn a_typing_wake_carries_the_counts_as_they_stand(backend: Backend) {
    let (server, alice, bob, room, token) = alice_and_bob_synced(&backend).await;
    let typing_path = room_path(&room, &format!("/typing/{}", enc(&bob.user_id)));
    let counts = |n: u64| json!({ "notification_count": n, "highlight_count": 0 });
    let typing_wake = async |token: &str, typing: bool| {
        let poll = spawn_long_poll(&server, &alice, token);
        put_ok(&server, &bob, &typing_path, json!({ "typing": typing, "timeout": 30000 })).await;
        let body = woken(poll, "typing").await;
        let joined = room_in(&body, "join", &room).clone();
        let notice = ephemeral(&joined, "m.typing").unwrap_or_else(|| panic!("no m.typing: {body}")).clone();
        let users = if typing { json!([bob.user_id]) } else { json!([]) };
        assert_eq!(notice["content"], json!({ "user_ids": users }), "{body}");
        assert!(timeline(&joined).is_empty(), "{body}");
        assert_eq!(joined["timeline"]["limited"], false, "{body}");
        assert!(events(&joined["state"]).is_empty(), "{body}");
        (next_batch(&body), joined)
    };

    send_text(&server, &bob, &room, "m1", "one").await;
    let second = send_text(&server, &bob, &room, "m2", "two").await;
    let body = sync(&server, &alice, &since(&token)).await;
    assert_eq!(room_in(&body, "join", &room)["unread_notifications"], counts(2), "{body}");

    let (token, joined) = typing_wake(&next_batch(&body), true).await;
    assert_eq!(joined["unread_notifications"], counts(2), "{joined}");
    let prev = joined["timeline"]["prev_batch"].as_str().unwrap_or_else(|| panic!("no prev_batch: {joined}"));
    let before = messages_before(&server, &alice, &room, Some(prev)).await;
    assert_eq!(before.last().and_then(|e| e["event_id"].as_str()), Some(second.as_str()), "{before:?}");

    // Her receipt moves the counts: the next typing wake says so.
    let poll = spawn_long_poll(&server, &alice, &token);
    post_ok(&server, &alice, &room_path(&room, &format!("/receipt/m.read/{}", enc(&second))), json!({}))
        .await;
    let body = woken(poll, "receipt").await;
    assert_eq!(room_in(&body, "join", &room)["unread_notifications"], counts(0), "{body}");
    let (_, joined) = typing_wake(&next_batch(&body), false).await;
    assert_eq!(joined["unread_notifications"], counts(0), "{joined}");

    // A message she syncs past only in an initial sync (no entry kept from
    // it): a typing wake from there counts it, not the 0 kept before.
    let third = send_text(&server, &bob, &room, "m3", "three").await;
    let body = sync(&server, &alice, "").await;
    assert_eq!(ids(timeline(room_in(&body, "join", &room))).last(), Some(&third), "{body}");
    let (_, joined) = typing_wake(&next_batch(&body), true).await;
    assert_eq!(joined["unread_notifications"], counts(1), "{joined}");
}

/// A typing notice right after one that was let in (the room opened for it
/// is kept a while) is refused once its user has left: 403, and no one
/// sees them typing; nor anyone typing for another user, in a room they
/// are not in or that does not exist, or with a malformed body.
async fn typing_is_refused_once_the_typist_has_left(backend: Backend) {
    let (server, alice, bob, room, _) = alice_and_bob_synced(&backend).await;
    let typing_path = room_path(&room, &format!("/typing/{}", enc(&bob.user_id)));
    put_ok(&server, &bob, &typing_path, json!({ "typing": true, "timeout": 30000 })).await;
    put_ok(&server, &bob, &typing_path, json!({ "typing": false })).await;
    leave(&server, &bob, &room).await;
    let start = json!({ "typing": true, "timeout": 30000 });
    let refused = async |path: &str, user: &User, body: Value, status: u16, errcode: &str| {
        let answer = server.put(path, Some(&user.token), body).await;
        assert_error(&answer, status, errcode, path);
    };
    refused(&typing_path, &bob, start.clone(), 403, "M_FORBIDDEN").await;
    // Hostile: for another user, in a room never joined or not there, a
    // body that is no typing notice; none shows anyone typing.
    let as_alice = room_path(&room, &format!("/typing/{}", enc(&alice.user_id)));
    refused(&as_alice, &bob, start.clone(), 403, "M_FORBIDDEN").await;
    let carol = server.register("carol", "pw").await;
    let carols = room_path(&room, &format!("/typing/{}", enc(&carol.user_id)));
    refused(&carols, &carol, start.clone(), 403, "M_FORBIDDEN").await;
    let nowhere = room_path("!nowhere:localhost", &format!("/typing/{}", enc(&carol.user_id)));
    refused(&nowhere, &carol, start.clone(), 403, "M_FORBIDDEN").await;
    refused(&as_alice, &alice, json!({ "typing": "yes" }), 400, "M_BAD_JSON").await;
    let body = sync(&server, &alice, "").await;
    let typing =
        ephemeral(room_in(&body, "join", &room), "m.typing").map(|e| e["content"]["user_ids"].clone());
    assert!(typing.is_none_or(|users| users == json!([])), "{body}");
}

async fn long_poll_wakes_on_a_receipt_and_private_receipts_stay_private(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let first = send_text(&server, &bob, &room, "m1", "read me").await;
    let second = send_text(&server, &bob, &room, "m2", "read me privately").await;
    let token = next_batch(&sync(&server, &bob, "").await);

    let poll = spawn_long_poll(&server, &bob, &token);
    post_ok(&server, &alice, &room_path(&room, &format!("/receipt/m.read/{}", enc(&first))), json!({})).await;
    let body = woken(poll, "receipt").await;
    let receipt = ephemeral(room_in(&body, "join", &room), "m.receipt")
        .unwrap_or_else(|| panic!("no m.receipt: {body}"));
    let content = &receipt["content"];
    assert_eq!(content.as_object().map(|m| m.len()), Some(1), "{content}");
    let read = &content[&first]["m.read"];
    assert_eq!(
        read.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()),
        Some(vec![alice.user_id.clone()])
    );
    assert!(read[&alice.user_id]["ts"].as_u64().is_some_and(|ts| ts > 0), "{content}");

    // A private receipt: its owner sees it, bob does not.
    let bob_token = next_batch(&body);
    let alice_token = next_batch(&sync(&server, &alice, "").await);
    let path = room_path(&room, &format!("/receipt/m.read.private/{}", enc(&second)));
    post_ok(&server, &alice, &path, json!({})).await;
    let body = sync(&server, &alice, &since(&alice_token)).await;
    let receipt = ephemeral(room_in(&body, "join", &room), "m.receipt")
        .unwrap_or_else(|| panic!("alice does not see her private receipt: {body}"));
    assert!(
        receipt["content"][&second]["m.read.private"][&alice.user_id]["ts"].as_u64().is_some(),
        "{receipt}"
    );
    let body = sync(&server, &bob, &since(&bob_token)).await;
    assert!(!body.to_string().contains("m.read.private"), "bob sees alice's private receipt: {body}");
    let body = sync(&server, &bob, "").await;
    assert!(!body.to_string().contains("m.read.private"), "bob sees alice's private receipt: {body}");
}

async fn long_poll_wakes_on_account_data_and_tags(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let token = next_batch(&sync(&server, &alice, "").await);

    let poll = spawn_long_poll(&server, &alice, &token);
    put_ok(&server, &alice, &user_path(&alice, "/account_data/com.example.x"), json!({ "colour": "teal" }))
        .await;
    let body = woken(poll, "global account data").await;
    assert_eq!(
        account_data(&body["account_data"], "com.example.x"),
        Some(&json!({ "colour": "teal" })),
        "{body}"
    );
    assert_no_rooms(&body);

    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let path = user_path(&alice, &format!("/rooms/{}/account_data/com.example.room", enc(&room)));
    put_ok(&server, &alice, &path, json!({ "pinned": true })).await;
    let body = woken(poll, "room account data").await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(
        account_data(&joined["account_data"], "com.example.room"),
        Some(&json!({ "pinned": true })),
        "{body}"
    );
    assert!(account_data(&body["account_data"], "com.example.room").is_none(), "{body}");

    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let path = user_path(&alice, &format!("/rooms/{}/tags/u.work", enc(&room)));
    put_ok(&server, &alice, &path, json!({ "order": 0.5 })).await;
    let body = woken(poll, "tag").await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(
        account_data(&joined["account_data"], "m.tag"),
        Some(&json!({ "tags": { "u.work": { "order": 0.5 } } })),
        "{body}"
    );
    let tags = get_ok(&server, &alice, &user_path(&alice, &format!("/rooms/{}/tags", enc(&room)))).await;
    assert_eq!(tags, json!({ "tags": { "u.work": { "order": 0.5 } } }));

    // An initial sync carries all of it.
    let body = sync(&server, &alice, "").await;
    assert_eq!(
        account_data(&body["account_data"], "com.example.x"),
        Some(&json!({ "colour": "teal" })),
        "{body}"
    );
    let joined = room_in(&body, "join", &room);
    assert_eq!(account_data(&joined["account_data"], "com.example.room"), Some(&json!({ "pinned": true })));
    assert_eq!(
        account_data(&joined["account_data"], "m.tag"),
        Some(&json!({ "tags": { "u.work": { "order": 0.5 } } }))
    );
}

async fn long_poll_of_a_non_member_is_not_woken(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let token = next_batch(&sync(&server, &carol, "").await);

    let poll = spawn_sync(&server, &carol, &format!("since={}&timeout=1500", enc(&token)));
    send_text(&server, &alice, &room, "m1", "not for carol").await;
    let (elapsed, body) = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("sync did not end")
        .expect("sync task");
    assert!(
        elapsed >= Duration::from_millis(1400),
        "a non-member's long-poll returned after {elapsed:?}: {body}"
    );
    assert_no_rooms(&body);
}

async fn read_markers_set_fully_read_and_read_receipt(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let m1 = send_text(&server, &bob, &room, "m1", "one").await;
    let m2 = send_text(&server, &bob, &room, "m2", "two").await;
    let alice_token = next_batch(&sync(&server, &alice, "").await);
    let bob_token = next_batch(&sync(&server, &bob, "").await);

    post_ok(&server, &alice, &room_path(&room, "/read_markers"), json!({ "m.fully_read": m2, "m.read": m1 }))
        .await;
    let body = sync(&server, &alice, &since(&alice_token)).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(
        account_data(&joined["account_data"], "m.fully_read"),
        Some(&json!({ "event_id": m2 })),
        "{body}"
    );
    let receipt = ephemeral(joined, "m.receipt").unwrap_or_else(|| panic!("no m.receipt: {body}"));
    assert!(receipt["content"][&m1]["m.read"][&alice.user_id]["ts"].as_u64().is_some(), "{receipt}");
    let path = user_path(&alice, &format!("/rooms/{}/account_data/m.fully_read", enc(&room)));
    assert_eq!(get_ok(&server, &alice, &path).await, json!({ "event_id": m2 }));

    // The public receipt reaches bob; alice's fully-read marker does not.
    let body = sync(&server, &bob, &since(&bob_token)).await;
    let joined = room_in(&body, "join", &room);
    let receipt = ephemeral(joined, "m.receipt").unwrap_or_else(|| panic!("no m.receipt for bob: {body}"));
    assert!(receipt["content"][&m1]["m.read"][&alice.user_id]["ts"].as_u64().is_some(), "{receipt}");
    assert!(account_data(&joined["account_data"], "m.fully_read").is_none(), "{body}");

    // Moving the marker on shows the new one.
    post_ok(&server, &alice, &room_path(&room, "/read_markers"), json!({ "m.fully_read": m1 })).await;
    let body = sync(&server, &alice, &since(&alice_token)).await;
    let joined = room_in(&body, "join", &room);
    assert_eq!(
        account_data(&joined["account_data"], "m.fully_read"),
        Some(&json!({ "event_id": m1 })),
        "{body}"
    );
}

async fn concurrent_senders_reach_the_reader_once_each_in_order(backend: Backend) {
    const SENDERS: usize = 8;
    const EACH: usize = 25;
    let server = Arc::new(Server::start(&backend).await);
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        let user = server.register(&format!("sender{i}"), "pw").await;
        join(&server, &user, &room).await;
        senders.push(user);
    }
    let filter = filter_param(&json!({ "room": { "timeline": { "limit": 500 } } }));
    let first = sync(&server, &alice, &filter).await;
    let initial_last =
        ids(timeline(room_in(&first, "join", &room))).last().cloned().expect("initial timeline");

    let mut tasks = tokio::task::JoinSet::new();
    for (i, user) in senders.into_iter().enumerate() {
        let server = server.clone();
        let room = room.clone();
        tasks.spawn(async move {
            for n in 0..EACH {
                send_text(&server, &user, &room, &format!("h{n}"), &format!("s{i}-{n}")).await;
            }
        });
    }

    let mut token = next_batch(&first);
    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut syncs = 0;
    while seen.len() < SENDERS * EACH {
        assert!(Instant::now() < deadline, "after {syncs} syncs only {} events were seen", seen.len());
        let body = sync(&server, &alice, &format!("since={}&timeout=1000&{filter}", enc(&token))).await;
        syncs += 1;
        if let Some(joined) = body["rooms"]["join"].get(&room) {
            assert_eq!(joined["timeline"]["limited"], false, "{body}");
            seen.extend(timeline(joined).iter().cloned());
        }
        token = next_batch(&body);
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("sender task");
    }
    // Nothing more comes afterwards.
    let body = sync(&server, &alice, &since(&token)).await;
    assert_no_rooms(&body);

    let seen_ids = ids(&seen);
    let unique: HashSet<&String> = seen_ids.iter().collect();
    assert_eq!(unique.len(), seen_ids.len(), "an event was synced twice");
    let all = all_events(&server, &alice, &room).await;
    let start =
        all.iter().position(|e| e["event_id"] == initial_last.as_str()).expect("initial last event") + 1;
    assert_eq!(seen_ids, ids(&all[start..]), "synced timelines differ from /messages");
    assert_eq!(seen_ids.len(), SENDERS * EACH);
    // Each sender's messages arrive in the order sent.
    for i in 0..SENDERS {
        let prefix = format!("s{i}-");
        let mine: Vec<String> = bodies(&seen).into_iter().filter(|b| b.starts_with(&prefix)).collect();
        let expected: Vec<String> = (0..EACH).map(|n| format!("{prefix}{n}")).collect();
        assert_eq!(mine, expected);
    }
    eprintln!("{} events over {syncs} syncs", seen.len());
}

/// An incremental sync over several rooms looks only into the rooms with
/// news: each kind of news (a message, typing, room account data, a
/// receipt) still brings its room, an untouched room stays out, and a
/// message in any joined room wakes a long-poll.
async fn incremental_sync_over_many_rooms_brings_each_kind_of_news(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let mut rooms = Vec::new();
    for _ in 0..5 {
        let room = create_room(&server, &bob, json!({ "preset": "public_chat" })).await;
        join(&server, &alice, &room).await;
        rooms.push(room);
    }
    let read = send_text(&server, &bob, &rooms[3], "r3", "to be read").await;
    let token = next_batch(&sync(&server, &alice, "").await);

    let sent = send_text(&server, &bob, &rooms[0], "m0", "news in the first").await;
    let typing_path = room_path(&rooms[1], &format!("/typing/{}", enc(&bob.user_id)));
    put_ok(&server, &bob, &typing_path, json!({ "typing": true, "timeout": 30000 })).await;
    let note_path = user_path(&alice, &format!("/rooms/{}/account_data/com.example.note", enc(&rooms[2])));
    put_ok(&server, &alice, &note_path, json!({ "n": 1 })).await;
    post_ok(&server, &bob, &room_path(&rooms[3], &format!("/receipt/m.read/{}", enc(&read))), json!({}))
        .await;

    let body = sync(&server, &alice, &since(&token)).await;
    let mut got = room_ids(&body, "join");
    got.sort();
    let mut want = rooms[..4].to_vec();
    want.sort();
    assert_eq!(got, want, "the fifth room had nothing new: {body}");
    assert_eq!(ids(timeline(room_in(&body, "join", &rooms[0]))), vec![sent], "{body}");
    let typing = ephemeral(room_in(&body, "join", &rooms[1]), "m.typing").unwrap_or_else(|| panic!("{body}"));
    assert_eq!(typing["content"], json!({ "user_ids": [bob.user_id] }), "{body}");
    let note = account_data(&room_in(&body, "join", &rooms[2])["account_data"], "com.example.note");
    assert_eq!(note, Some(&json!({ "n": 1 })), "{body}");
    let receipt =
        ephemeral(room_in(&body, "join", &rooms[3]), "m.receipt").unwrap_or_else(|| panic!("{body}"));
    assert!(receipt["content"][&read]["m.read"].get(&bob.user_id).is_some(), "{body}");

    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let last = send_text(&server, &bob, &rooms[4], "m4", "news in the fifth").await;
    let body = woken(poll, "a message in the fifth room").await;
    assert_eq!(room_ids(&body, "join"), vec![rooms[4].clone()], "{body}");
    assert_eq!(ids(timeline(room_in(&body, "join", &rooms[4]))), vec![last], "{body}");
}

/// A woken long-poll reads again only the streams that moved while it
/// waited; what moved without waking it (a claim of its one-time keys) or
/// woke it along with other news (to-device messages, account data, a new
/// room) must all be in the answer. Whichever way the race between the
/// long-poll's first look and the writes goes, the answer is the same.
async fn a_woken_sync_reads_again_what_moved_while_it_waited(backend: Backend) {
    use complement_tests::e2ee::{Key, device_keys, signed_one_time_key};
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (a, d) = (alice.user_id.as_str(), alice.device_id.as_str());
    let key = Key::new("alice-device");
    let upload = json!({
        "device_keys": device_keys(a, d, &key),
        "one_time_keys": {
            "signed_curve25519:AAAA": signed_one_time_key(a, d, &key, "otk1"),
            "signed_curve25519:AAAB": signed_one_time_key(a, d, &key, "otk2"),
        },
    });
    post_ok(&server, &alice, "/_matrix/client/v3/keys/upload", upload).await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let first = sync(&server, &alice, "").await;
    assert_eq!(first["device_one_time_keys_count"]["signed_curve25519"], 2, "{first}");

    // A claim does not wake alice; bob's message does.
    let poll = spawn_long_poll(&server, &alice, &next_batch(&first));
    let claim = json!({ "one_time_keys": { a: { d: "signed_curve25519" } } });
    let claimed = post_ok(&server, &bob, "/_matrix/client/v3/keys/claim", claim).await;
    assert!(claimed["one_time_keys"][a][d]["signed_curve25519:AAAA"].is_object(), "{claimed}");
    let sent = send_text(&server, &bob, &room, "after-claim", "keys went").await;
    let body = woken(poll, "message after a claim").await;
    assert_eq!(ids(timeline(room_in(&body, "join", &room))), vec![sent], "{body}");
    assert_eq!(body["device_one_time_keys_count"]["signed_curve25519"], 1, "the claim is counted: {body}");

    // A to-device message wakes alice: it is in the answer, once.
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let message = json!({ "messages": { a: { d: { "n": 7 } } } });
    put_ok(&server, &bob, "/_matrix/client/v3/sendToDevice/m.test/t1", message).await;
    let body = woken(poll, "to-device").await;
    assert_eq!(body["to_device"]["events"][0]["content"]["n"], 7, "{body}");
    assert_eq!(body["to_device"]["events"].as_array().map(Vec::len), Some(1), "{body}");

    // Account data, then a room alice is invited to: each wakes her with it.
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    put_ok(&server, &alice, &user_path(&alice, "/account_data/m.test"), json!({ "x": 1 })).await;
    let body = woken(poll, "account data").await;
    let data = body["account_data"]["events"].as_array().unwrap();
    assert!(data.iter().any(|e| e["type"] == "m.test" && e["content"]["x"] == 1), "{body}");
    let other = create_room(&server, &bob, json!({ "preset": "private_chat" })).await;
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    invite(&server, &bob, &other, &alice).await;
    let body = woken(poll, "invite").await;
    assert!(body["rooms"]["invite"][&other].is_object(), "{body}");
    // And a message after it in the first room still comes (the room list
    // was read again, the first room still watched).
    let poll = spawn_long_poll(&server, &alice, &next_batch(&body));
    let sent = send_text(&server, &bob, &room, "after-invite", "still here").await;
    let body = woken(poll, "message after an invite").await;
    assert_eq!(ids(timeline(room_in(&body, "join", &room))), vec![sent], "{body}");
    assert!(body["rooms"]["invite"].get(&other).is_none(), "the invite is not repeated: {body}");
}
