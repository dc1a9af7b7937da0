//! Rooms: createRoom (presets, room versions, overrides), sending messages and
//! state, transaction idempotency, power-level refusals, redaction, reading
//! state and membership, and the errors of each.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

backend_tests!(
    private_chat_v12_sends_initial_events_in_spec_order,
    trusted_private_chat_v12_makes_invitees_additional_creators,
    public_chat_has_public_join_rule_and_no_guest_access,
    preset_follows_visibility_when_absent,
    v12_create_pdu_has_no_room_id_and_names_the_room,
    v11_room_puts_creator_at_100_and_no_creator_key,
    v10_create_content_has_creator,
    overrides_initial_state_and_creation_content_take_effect,
    topic_param_sets_plain_text_topic_block,
    room_version_must_be_a_supported_string,
    sent_message_is_served_with_membership_and_own_transaction_id,
    same_txn_id_returns_same_event_also_after_restart,
    same_txn_id_from_another_device_is_a_new_event,
    same_txn_id_in_another_room_is_a_new_event,
    same_txn_id_for_another_event_type_is_a_new_event,
    state_put_and_get_with_empty_and_custom_state_keys,
    identical_state_returns_the_current_event,
    non_member_cannot_send_or_read,
    invited_user_cannot_send_before_joining,
    power_levels_refuse_events_above_sender_level,
    v12_creator_is_above_every_event_level,
    redaction_strips_content_and_records_redacted_because,
    redacting_unknown_event_is_not_found_and_foreign_one_invalid,
    malformed_room_id_is_invalid_param,
    unknown_room_is_forbidden_like_a_room_one_is_not_in,
    initial_state_replaces_the_presets_event,
    oversized_content_is_too_large_and_not_stored,
    joined_rooms_lists_created_rooms_only_when_joined,
    joined_members_and_members_filters,
    concurrent_sends_are_each_answered_for_themselves,
    same_txn_id_after_leaving_returns_the_event,
);

/// A retransmission answers with the event the first request made, even
/// once the sender could no longer send it.
async fn same_txn_id_after_leaving_returns_the_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    server.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    let first = send(&server, &bob, &room, "m.room.message", "once", text("before I go")).await;
    assert_eq!(first.0, 200, "{}", first.1);
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let again = send(&server, &bob, &room, "m.room.message", "once", text("before I go")).await;
    assert_eq!(again.0, 200, "the retransmission: {}", again.1);
    assert_eq!(event_id_of(&again.1), event_id_of(&first.1));
    let new = send(&server, &bob, &room, "m.room.message", "twice", text("still here?")).await;
    assert_error(&new, 403, "M_FORBIDDEN", "a new send after leaving");
}

/// Many sends at once into one room (the server writes them in shared
/// transactions): each member's send is stored once, at its own seq; a
/// non-member's sends among them are refused without harming the others; a
/// transaction id sent twice at once names one event.
async fn concurrent_sends_are_each_answered_for_themselves(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let (status, _) = server.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let (who, token) = match i % 3 {
            0 => ("alice", alice.token.clone()),
            1 => ("bob", bob.token.clone()),
            _ => ("eve", eve.token.clone()),
        };
        // bob's txn "b-dup" goes out twice at once.
        let txn = if i == 1 || i == 4 { "b-dup".to_owned() } else { format!("t{i}") };
        let url = server.url(&room_path(&room, &format!("/send/m.room.message/{txn}")));
        let http = server.http().clone();
        tasks.spawn(async move {
            let response = http
                .put(url)
                .bearer_auth(token)
                .json(&json!({ "msgtype": "m.text", "body": format!("{who} {txn}") }))
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (who, txn, status, body)
        });
    }
    let mut sent = std::collections::BTreeMap::new();
    let mut dup_ids = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (who, txn, status, body) = done.expect("task");
        if who == "eve" {
            assert_error(&(status, body), 403, "M_FORBIDDEN", "a non-member's send in the crowd");
            continue;
        }
        assert_eq!(status, 200, "{who} {txn}: {body}");
        let id = event_id_of(&body);
        if txn == "b-dup" {
            dup_ids.push(id);
        } else {
            assert!(sent.insert(id, format!("{who} {txn}")).is_none(), "an event id answered twice");
        }
    }
    assert_eq!(dup_ids.len(), 2);
    assert_eq!(dup_ids[0], dup_ids[1], "one transaction id, one event");
    sent.insert(dup_ids[0].clone(), "bob b-dup".to_owned());
    assert_eq!(sent.len(), 19, "10 from alice, 9 distinct from bob");

    // The timeline holds exactly those, each once, and nothing from eve.
    let (status, page) = server.get(&room_path(&room, "/messages?dir=b&limit=100"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    let messages: Vec<(String, String)> = page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| {
            (e["event_id"].as_str().unwrap().to_owned(), e["content"]["body"].as_str().unwrap().to_owned())
        })
        .collect();
    let stored: std::collections::BTreeMap<String, String> = messages.iter().cloned().collect();
    assert_eq!(messages.len(), stored.len(), "no event twice: {messages:?}");
    assert_eq!(stored, sent);
}

async fn create_room(server: &Server, user: &User, body: Value) -> String {
    let (status, response) = server.post(&format!("{V3}/createRoom"), Some(&user.token), body.clone()).await;
    assert_eq!(status, 200, "createRoom {body}: {response}");
    response["room_id"].as_str().unwrap_or_else(|| panic!("no room_id in {response}")).to_owned()
}

/// GET /rooms/{id}/state, which must succeed.
async fn room_state(server: &Server, user: &User, room_id: &str) -> Vec<Value> {
    let (status, body) = server.get(&room_path(room_id, "/state"), Some(&user.token)).await;
    assert_eq!(status, 200, "state of {room_id}: {body}");
    body.as_array().unwrap_or_else(|| panic!("state is not an array: {body}")).clone()
}

/// The (type, state key) of each event, in order.
fn keys(state: &[Value]) -> Vec<(String, String)> {
    state
        .iter()
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or_else(|| panic!("no {k} in {e}")).to_owned();
            (field("type"), field("state_key"))
        })
        .collect()
}

fn key(kind: &str, state_key: &str) -> (String, String) {
    (kind.to_owned(), state_key.to_owned())
}

/// The state event of (type, key); panics if it is not there.
fn find<'a>(state: &'a [Value], kind: &str, state_key: &str) -> &'a Value {
    state
        .iter()
        .find(|e| e["type"] == kind && e["state_key"] == state_key)
        .unwrap_or_else(|| panic!("no {kind}/{state_key:?} in {}", Value::Array(state.to_vec())))
}

async fn send(
    server: &Server,
    user: &User,
    room_id: &str,
    kind: &str,
    txn_id: &str,
    content: Value,
) -> (u16, Value) {
    let path = room_path(room_id, &format!("/send/{}/{}", enc(kind), enc(txn_id)));
    server.put(&path, Some(&user.token), content).await
}

/// Sends an m.room.message, which must succeed; returns its event id.
async fn send_text(server: &Server, user: &User, room_id: &str, txn_id: &str, body: &str) -> String {
    let response = send(server, user, room_id, "m.room.message", txn_id, text(body)).await;
    assert_eq!(response.0, 200, "send {body:?}: {}", response.1);
    event_id_of(&response.1)
}

async fn get_event(server: &Server, user: &User, room_id: &str, event_id: &str) -> (u16, Value) {
    server.get(&room_path(room_id, &format!("/event/{}", enc(event_id))), Some(&user.token)).await
}

fn state_path(room_id: &str, kind: &str, state_key: &str) -> String {
    room_path(room_id, &format!("/state/{}/{}", enc(kind), enc(state_key)))
}

async fn put_state(
    server: &Server,
    user: &User,
    room_id: &str,
    kind: &str,
    state_key: &str,
    content: Value,
) -> (u16, Value) {
    server.put(&state_path(room_id, kind, state_key), Some(&user.token), content).await
}

async fn get_state(server: &Server, user: &User, room_id: &str, kind: &str, state_key: &str) -> (u16, Value) {
    server.get(&state_path(room_id, kind, state_key), Some(&user.token)).await
}

async fn joined_rooms(server: &Server, user: &User) -> Vec<String> {
    let (status, body) = server.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    let mut rooms: Vec<String> = body["joined_rooms"]
        .as_array()
        .unwrap_or_else(|| panic!("no joined_rooms in {body}"))
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    rooms.sort_unstable();
    rooms
}

/// GET /rooms/{id}/members{query} as (state key, membership) pairs, sorted,
/// checking each is a member event of the room.
async fn members(server: &Server, user: &User, room_id: &str, query: &str) -> Vec<(String, String)> {
    let path = room_path(room_id, &format!("/members{query}"));
    let (status, body) = server.get(&path, Some(&user.token)).await;
    assert_eq!(status, 200, "{query}: {body}");
    let chunk = body["chunk"].as_array().unwrap_or_else(|| panic!("{query}: no chunk in {body}"));
    let mut out: Vec<(String, String)> = chunk
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "m.room.member", "{e}");
            assert_eq!(e["room_id"], room_id, "{e}");
            let field = |v: &Value| v.as_str().unwrap_or_else(|| panic!("{e}")).to_owned();
            (field(&e["state_key"]), field(&e["content"]["membership"]))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Canonical JSON: keys sorted by code point, no whitespace.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), canonical(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// The event id a room's create event has as a PDU, rebuilt from the client
/// form the server serves: no prev or auth events, depth 1, and a `room_id` key
/// only if `with_room_id`. Content hash first, then the reference hash of the
/// redacted event, as the server-server spec defines event ids (v4 format).
fn create_event_reference_id(served: &Value, with_room_id: bool, version: &str) -> String {
    let mut pdu = json!({
        "auth_events": [],
        "content": served["content"],
        "depth": 1,
        "origin_server_ts": served["origin_server_ts"],
        "prev_events": [],
        "sender": served["sender"],
        "state_key": "",
        "type": "m.room.create",
    });
    if with_room_id {
        pdu["room_id"] = served["room_id"].clone();
    }
    let content_hash = Sha256::digest(canonical(&pdu).as_bytes());
    pdu["hashes"] = json!({ "sha256": STANDARD_NO_PAD.encode(content_hash) });
    if version == "10" {
        // Before v11 the redaction algorithm keeps only `creator` of a create event's content.
        pdu["content"] = json!({ "creator": served["content"]["creator"] });
    }
    format!("${}", URL_SAFE_NO_PAD.encode(Sha256::digest(canonical(&pdu).as_bytes())))
}

/// Checks what every event of a fresh room has in common.
#[track_caller]
fn assert_room_events(state: &[Value], room_id: &str, creator: &User) {
    for event in state {
        assert_eq!(event["room_id"], room_id, "{event}");
        assert_eq!(event["sender"], creator.user_id.as_str(), "{event}");
        assert!(event["event_id"].as_str().is_some_and(|id| id.starts_with('$')), "{event}");
        assert!(event["origin_server_ts"].as_u64().is_some(), "{event}");
    }
}

async fn private_chat_v12_sends_initial_events_in_spec_order(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({
            "preset": "private_chat",
            "name": "The Lounge",
            "topic": "Coffee and chat",
            "room_alias_name": "lounge",
            "initial_state": [
                { "type": "com.example.setting", "state_key": "colour", "content": { "value": "teal" } },
            ],
            "invite": [bob.user_id],
        }),
    )
    .await;

    let state = room_state(&server, &alice, &room).await;
    // The spec's order: create, creator's join, power levels, canonical alias,
    // the preset's events, initial_state, name, topic, invites.
    assert_eq!(
        keys(&state),
        vec![
            key("m.room.create", ""),
            key("m.room.member", &alice.user_id),
            key("m.room.power_levels", ""),
            key("m.room.canonical_alias", ""),
            key("m.room.join_rules", ""),
            key("m.room.history_visibility", ""),
            key("m.room.guest_access", ""),
            key("com.example.setting", "colour"),
            key("m.room.name", ""),
            key("m.room.topic", ""),
            key("m.room.member", &bob.user_id),
        ]
    );
    assert_room_events(&state, &room, &alice);

    // v12: the room id is the create event's id with `!` for `$`.
    let create = &state[0];
    let create_id = create["event_id"].as_str().unwrap();
    assert_eq!(room, format!("!{}", &create_id[1..]));
    assert_eq!(create["content"], json!({ "room_version": "12" }));

    assert_eq!(state[1]["content"]["membership"], "join");
    assert_eq!(state[1]["unsigned"]["membership"], "join");
    // v12 creators have infinite power and are not listed in `users`.
    let power = &state[2]["content"];
    assert!(power["users"].get(&alice.user_id).is_none(), "{power}");
    assert_eq!(power["events"]["m.room.tombstone"], 150, "{power}");
    assert_eq!(power["events"]["m.room.power_levels"], 100, "{power}");
    assert_eq!(state[3]["content"], json!({ "alias": "#lounge:test.local" }));
    assert_eq!(state[4]["content"], json!({ "join_rule": "invite" }));
    assert_eq!(state[5]["content"], json!({ "history_visibility": "shared" }));
    assert_eq!(state[6]["content"], json!({ "guest_access": "can_join" }));
    assert_eq!(state[7]["content"], json!({ "value": "teal" }));
    assert_eq!(state[8]["content"], json!({ "name": "The Lounge" }));
    assert_eq!(state[9]["content"]["topic"], "Coffee and chat");
    // An invite carries the invitee's profile (their display name starts as the localpart).
    assert_eq!(state[10]["content"], json!({ "membership": "invite", "displayname": "bob" }));
    for event in &state[1..] {
        assert_eq!(event["unsigned"]["membership"], "join", "{event}");
    }
}

async fn trusted_private_chat_v12_makes_invitees_additional_creators(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "preset": "trusted_private_chat", "invite": [bob.user_id, carol.user_id], "is_direct": true }),
    )
    .await;

    let state = room_state(&server, &alice, &room).await;
    assert_eq!(
        keys(&state),
        vec![
            key("m.room.create", ""),
            key("m.room.member", &alice.user_id),
            key("m.room.power_levels", ""),
            key("m.room.join_rules", ""),
            key("m.room.history_visibility", ""),
            key("m.room.guest_access", ""),
            key("m.room.member", &bob.user_id),
            key("m.room.member", &carol.user_id),
        ]
    );
    assert_room_events(&state, &room, &alice);
    assert_eq!(
        state[0]["content"],
        json!({ "room_version": "12", "additional_creators": [bob.user_id, carol.user_id] })
    );
    assert_eq!(room, format!("!{}", &state[0]["event_id"].as_str().unwrap()[1..]));
    // Creators, additional ones too, are not in `users`.
    let users = &state[2]["content"]["users"];
    for user in [&alice, &bob, &carol] {
        assert!(users.get(&user.user_id).is_none(), "{users}");
    }
    assert_eq!(state[2]["content"]["events"]["m.room.tombstone"], 150);
    assert_eq!(state[3]["content"], json!({ "join_rule": "invite" }));
    assert_eq!(state[4]["content"], json!({ "history_visibility": "shared" }));
    assert_eq!(state[5]["content"], json!({ "guest_access": "can_join" }));
    assert_eq!(
        state[6]["content"],
        json!({ "membership": "invite", "is_direct": true, "displayname": "bob" })
    );
    assert_eq!(
        state[7]["content"],
        json!({ "membership": "invite", "is_direct": true, "displayname": "carol" })
    );
}

async fn public_chat_has_public_join_rule_and_no_guest_access(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "name": "Town square" })).await;

    let state = room_state(&server, &alice, &room).await;
    assert_eq!(
        keys(&state),
        vec![
            key("m.room.create", ""),
            key("m.room.member", &alice.user_id),
            key("m.room.power_levels", ""),
            key("m.room.join_rules", ""),
            key("m.room.history_visibility", ""),
            key("m.room.name", ""),
        ]
    );
    assert_room_events(&state, &room, &alice);
    assert_eq!(state[3]["content"], json!({ "join_rule": "public" }));
    assert_eq!(state[4]["content"], json!({ "history_visibility": "shared" }));
    assert_eq!(state[5]["content"], json!({ "name": "Town square" }));
    let response = get_state(&server, &alice, &room, "m.room.guest_access", "").await;
    assert_error(&response, 404, "M_NOT_FOUND", "guest_access of a public_chat room");
}

async fn preset_follows_visibility_when_absent(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;

    let public = create_room(&server, &alice, json!({ "visibility": "public" })).await;
    let state = room_state(&server, &alice, &public).await;
    assert_eq!(find(&state, "m.room.join_rules", "")["content"], json!({ "join_rule": "public" }));
    assert!(!keys(&state).contains(&key("m.room.guest_access", "")), "{state:?}");

    for body in [json!({ "visibility": "private" }), json!({})] {
        let private = create_room(&server, &alice, body.clone()).await;
        let state = room_state(&server, &alice, &private).await;
        assert_eq!(
            find(&state, "m.room.join_rules", "")["content"],
            json!({ "join_rule": "invite" }),
            "{body}"
        );
        assert_eq!(
            find(&state, "m.room.guest_access", "")["content"],
            json!({ "guest_access": "can_join" }),
            "{body}"
        );
        assert_eq!(
            find(&state, "m.room.history_visibility", "")["content"],
            json!({ "history_visibility": "shared" }),
            "{body}"
        );
    }
}

async fn v12_create_pdu_has_no_room_id_and_names_the_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "room_version": "12" })).await;

    let state = room_state(&server, &alice, &room).await;
    let create = find(&state, "m.room.create", "");
    // Served to clients with a room_id...
    assert_eq!(create["room_id"], room.as_str());
    assert_eq!(create["sender"], alice.user_id.as_str());
    assert_eq!(create["content"], json!({ "room_version": "12" }));
    // ... but the PDU it was hashed from has none: only without it does the
    // reference hash give the event id, and the room id is that hash.
    let event_id = create["event_id"].as_str().unwrap();
    assert_eq!(create_event_reference_id(create, false, "12"), event_id, "{create}");
    assert_eq!(room, format!("!{}", &event_id[1..]));
    assert!(!room.contains(':'), "{room}");

    // GET /event serves it the same way.
    let (status, served) = get_event(&server, &alice, &room, event_id).await;
    assert_eq!(status, 200, "{served}");
    assert_eq!(served["room_id"], room.as_str());
    assert_eq!(served["type"], "m.room.create");
    assert_eq!(served["state_key"], "");
    assert_eq!(served["content"], json!({ "room_version": "12" }));
    let (status, content) = get_state(&server, &alice, &room, "m.room.create", "").await;
    assert_eq!((status, content), (200, json!({ "room_version": "12" })));
}

async fn v11_room_puts_creator_at_100_and_no_creator_key(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "room_version": "11", "preset": "trusted_private_chat", "invite": [bob.user_id] }),
    )
    .await;
    assert!(room.starts_with('!') && room.ends_with(":test.local"), "{room}");

    let state = room_state(&server, &alice, &room).await;
    assert_eq!(
        keys(&state),
        vec![
            key("m.room.create", ""),
            key("m.room.member", &alice.user_id),
            key("m.room.power_levels", ""),
            key("m.room.join_rules", ""),
            key("m.room.history_visibility", ""),
            key("m.room.guest_access", ""),
            key("m.room.member", &bob.user_id),
        ]
    );
    assert_room_events(&state, &room, &alice);
    let create = &state[0];
    // No `creator` (the sender is the creator since v11), no additional_creators.
    assert_eq!(create["content"], json!({ "room_version": "11" }));
    // The PDU carries the room id, and the event id is its reference hash.
    assert_eq!(create_event_reference_id(create, true, "11"), create["event_id"].as_str().unwrap());
    assert_ne!(room, format!("!{}", &create["event_id"].as_str().unwrap()[1..]));

    // Creator and (trusted) invitee at 100; tombstone at 100 before v12.
    let power = &state[2]["content"];
    assert_eq!(power["users"], json!({ alice.user_id.clone(): 100, bob.user_id.clone(): 100 }), "{power}");
    assert_eq!(power["events"]["m.room.tombstone"], 100, "{power}");
    assert_eq!(state[6]["content"], json!({ "membership": "invite", "displayname": "bob" }));
}

async fn v10_create_content_has_creator(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "room_version": "10", "preset": "private_chat" })).await;
    assert!(room.ends_with(":test.local"), "{room}");

    let state = room_state(&server, &alice, &room).await;
    assert_eq!(
        keys(&state),
        vec![
            key("m.room.create", ""),
            key("m.room.member", &alice.user_id),
            key("m.room.power_levels", ""),
            key("m.room.join_rules", ""),
            key("m.room.history_visibility", ""),
            key("m.room.guest_access", ""),
        ]
    );
    assert_room_events(&state, &room, &alice);
    let create = &state[0];
    assert_eq!(create["content"], json!({ "creator": alice.user_id, "room_version": "10" }));
    assert_eq!(create_event_reference_id(create, true, "10"), create["event_id"].as_str().unwrap());
    assert_eq!(state[2]["content"]["users"], json!({ alice.user_id.clone(): 100 }));
}

async fn overrides_initial_state_and_creation_content_take_effect(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({
            "preset": "private_chat",
            "name": "From the name key",
            "creation_content": { "m.federate": false, "type": "m.space" },
            "power_level_content_override": {
                "events_default": 20,
                "ban": 70,
                "users": { bob.user_id.clone(): 40 },
            },
            "initial_state": [
                { "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "public" } },
                { "type": "m.room.history_visibility", "content": { "history_visibility": "joined" } },
                { "type": "m.room.name", "state_key": "", "content": { "name": "From initial_state" } },
            ],
        }),
    )
    .await;

    let state = room_state(&server, &alice, &room).await;
    let state_keys = keys(&state);
    for unique in ["m.room.create", "m.room.power_levels", "m.room.join_rules", "m.room.name"] {
        assert_eq!(state_keys.iter().filter(|k| k.0 == unique).count(), 1, "{unique} in {state_keys:?}");
    }
    assert_eq!(
        find(&state, "m.room.create", "")["content"],
        json!({ "room_version": "12", "m.federate": false, "type": "m.space" })
    );
    let power = &find(&state, "m.room.power_levels", "")["content"];
    assert_eq!(power["events_default"], 20, "{power}");
    assert_eq!(power["ban"], 70, "{power}");
    assert_eq!(power["users"], json!({ bob.user_id.clone(): 40 }), "{power}");
    // initial_state wins over the preset...
    assert_eq!(find(&state, "m.room.join_rules", "")["content"], json!({ "join_rule": "public" }));
    assert_eq!(
        find(&state, "m.room.history_visibility", "")["content"],
        json!({ "history_visibility": "joined" })
    );
    // ... and `name` over initial_state.
    assert_eq!(find(&state, "m.room.name", "")["content"], json!({ "name": "From the name key" }));
    // The preset's guest access is untouched, and comes before initial_state's events.
    let position = |k: (String, String)| state_keys.iter().position(|x| *x == k).unwrap();
    assert!(
        position(key("m.room.guest_access", "")) < position(key("m.room.join_rules", "")),
        "{state_keys:?}"
    );
    assert!(position(key("m.room.join_rules", "")) < position(key("m.room.name", "")), "{state_keys:?}");
}

async fn topic_param_sets_plain_text_topic_block(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "topic": "All about pizza" })).await;

    let (status, content) = get_state(&server, &alice, &room, "m.room.topic", "").await;
    assert_eq!(status, 200, "{content}");
    assert_eq!(content["topic"], "All about pizza");
    // Since v1.15 the topic also comes as an `m.topic` content block, an
    // object whose `m.text` holds the representations; createRoom's `topic`
    // is its text/plain one (the mimetype's default).
    let texts = content["m.topic"]["m.text"]
        .as_array()
        .unwrap_or_else(|| panic!("m.topic is not {{\"m.text\": [...]}}: {content}"));
    assert!(
        texts.iter().any(|t| t["body"] == "All about pizza"
            && (t["mimetype"] == "text/plain" || t.get("mimetype").is_none())),
        "{content}"
    );
}

async fn room_version_must_be_a_supported_string(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let kept = create_room(&server, &alice, json!({})).await;
    assert_eq!(joined_rooms(&server, &alice).await, vec![kept.clone()]);

    let path = format!("{V3}/createRoom");
    let response = server.post(&path, Some(&alice.token), json!({ "room_version": 5, "name": "x" })).await;
    assert_error(&response, 400, "M_BAD_JSON", "numeric room_version");
    let response =
        server.post(&path, Some(&alice.token), json!({ "room_version": "999", "name": "x" })).await;
    assert_error(&response, 400, "M_UNSUPPORTED_ROOM_VERSION", "room_version 999");

    // Neither created anything.
    assert_eq!(joined_rooms(&server, &alice).await, vec![kept]);
}

async fn sent_message_is_served_with_membership_and_own_transaction_id(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let laptop = server.login("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;

    let event_id = send_text(&server, &alice, &room, "txn-hello", "Hello, world").await;

    let (status, event) = get_event(&server, &alice, &room, &event_id).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["event_id"], event_id.as_str());
    assert_eq!(event["room_id"], room.as_str());
    assert_eq!(event["type"], "m.room.message");
    assert_eq!(event["sender"], alice.user_id.as_str());
    assert_eq!(event["content"], json!({ "msgtype": "m.text", "body": "Hello, world" }));
    assert!(event.get("state_key").is_none(), "{event}");
    assert!(event["origin_server_ts"].as_u64().is_some(), "{event}");
    assert_eq!(event["unsigned"]["membership"], "join", "{event}");
    assert_eq!(event["unsigned"]["transaction_id"], "txn-hello", "{event}");

    // The same user on another device sees the event, without the transaction id.
    let (status, other) = get_event(&server, &laptop, &room, &event_id).await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["content"], event["content"]);
    assert_eq!(other["unsigned"]["membership"], "join", "{other}");
    assert!(other["unsigned"].get("transaction_id").is_none(), "{other}");

    // An unknown event in the room is 404.
    let response = get_event(&server, &alice, &room, "$nosuchevent0000000000000000000000000000000").await;
    assert_error(&response, 404, "M_NOT_FOUND", "unknown event");
}

async fn same_txn_id_returns_same_event_also_after_restart(backend: Backend) {
    let mut server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;

    let first = send_text(&server, &alice, &room, "t1", "once").await;
    // A retransmission returns the first event, whatever its body.
    let again = send_text(&server, &alice, &room, "t1", "once, retried").await;
    assert_eq!(again, first);

    server.restart().await;
    let after_restart = send_text(&server, &alice, &room, "t1", "once").await;
    assert_eq!(after_restart, first);
    let (status, event) = get_event(&server, &alice, &room, &first).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "once");
    assert_eq!(event["unsigned"]["transaction_id"], "t1");

    // A new transaction id is a new event.
    let second = send_text(&server, &alice, &room, "t2", "twice").await;
    assert_ne!(second, first);
    let (_, event) = get_event(&server, &alice, &room, &second).await;
    assert_eq!(event["content"]["body"], "twice");
    assert_eq!(event["unsigned"]["transaction_id"], "t2");
}

async fn same_txn_id_from_another_device_is_a_new_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let phone = server.register("alice", "pw").await;
    let laptop = server.login("alice", "pw").await;
    let room = create_room(&server, &phone, json!({})).await;

    let from_phone = send_text(&server, &phone, &room, "shared-txn", "from phone").await;
    let from_laptop = send_text(&server, &laptop, &room, "shared-txn", "from laptop").await;
    assert_ne!(from_laptop, from_phone);

    // Each device sees its own transaction id only.
    for (event_id, body, owner, other) in
        [(&from_phone, "from phone", &phone, &laptop), (&from_laptop, "from laptop", &laptop, &phone)]
    {
        let (status, event) = get_event(&server, owner, &room, event_id).await;
        assert_eq!(status, 200, "{event}");
        assert_eq!(event["content"]["body"], body);
        assert_eq!(event["unsigned"]["transaction_id"], "shared-txn", "{event}");
        let (_, event) = get_event(&server, other, &room, event_id).await;
        assert_eq!(event["content"]["body"], body);
        assert!(event["unsigned"].get("transaction_id").is_none(), "{event}");
    }
}

async fn same_txn_id_in_another_room_is_a_new_event(backend: Backend) {
    // A retransmission is the same transaction id on the same path; in another
    // room the path differs, so it is a new request.
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room_a = create_room(&server, &alice, json!({ "name": "A" })).await;
    let room_b = create_room(&server, &alice, json!({ "name": "B" })).await;

    let in_a = send_text(&server, &alice, &room_a, "t1", "in A").await;
    let in_b = send_text(&server, &alice, &room_b, "t1", "in B").await;
    assert_ne!(in_b, in_a, "the same txn id in room B returned room A's event");
    let (status, event) = get_event(&server, &alice, &room_b, &in_b).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["room_id"], room_b.as_str());
    assert_eq!(event["content"]["body"], "in B");
}

async fn same_txn_id_for_another_event_type_is_a_new_event(backend: Backend) {
    // The event type is part of the path too.
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;

    let message = send_text(&server, &alice, &room, "t1", "a message").await;
    let response = send(&server, &alice, &room, "com.example.ping", "t1", json!({ "n": 1 })).await;
    assert_eq!(response.0, 200, "{}", response.1);
    let ping = event_id_of(&response.1);
    assert_ne!(ping, message, "the same txn id for com.example.ping returned the m.room.message");
    let (status, event) = get_event(&server, &alice, &room, &ping).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["type"], "com.example.ping");
    assert_eq!(event["content"], json!({ "n": 1 }));
}

async fn state_put_and_get_with_empty_and_custom_state_keys(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let t = Some(alice.token.as_str());

    // Without the state key segment, and with a trailing slash: the empty key.
    let (status, body) =
        server.put(&room_path(&room, "/state/m.room.topic"), t, json!({ "topic": "No key segment" })).await;
    assert_eq!(status, 200, "{body}");
    let topic_id = event_id_of(&body);
    let (status, body) =
        server.put(&room_path(&room, "/state/m.room.name/"), t, json!({ "name": "Trailing slash" })).await;
    assert_eq!(status, 200, "{body}");
    let name_id = event_id_of(&body);
    let (status, body) =
        put_state(&server, &alice, &room, "com.example.x", "somekey", json!({ "k": [1, 2] })).await;
    assert_eq!(status, 200, "{body}");
    let custom_id = event_id_of(&body);

    // GET in each form returns the content.
    let (status, body) = server.get(&room_path(&room, "/state/m.room.topic"), t).await;
    assert_eq!((status, body), (200, json!({ "topic": "No key segment" })));
    let (status, body) = server.get(&room_path(&room, "/state/m.room.topic/"), t).await;
    assert_eq!((status, body), (200, json!({ "topic": "No key segment" })));
    let (status, body) = get_state(&server, &alice, &room, "m.room.name", "").await;
    assert_eq!((status, body), (200, json!({ "name": "Trailing slash" })));
    let (status, body) = get_state(&server, &alice, &room, "com.example.x", "somekey").await;
    assert_eq!((status, body), (200, json!({ "k": [1, 2] })));

    // ?format=event returns the whole event.
    let (status, event) =
        server.get(&format!("{}?format=event", state_path(&room, "com.example.x", "somekey")), t).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["event_id"], custom_id.as_str());
    assert_eq!(event["type"], "com.example.x");
    assert_eq!(event["state_key"], "somekey");
    assert_eq!(event["sender"], alice.user_id.as_str());
    assert_eq!(event["room_id"], room.as_str());
    assert_eq!(event["content"], json!({ "k": [1, 2] }));
    let (status, event) =
        server.get(&format!("{}?format=event", room_path(&room, "/state/m.room.topic")), t).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(
        (event["event_id"].as_str(), event["state_key"].as_str()),
        (Some(topic_id.as_str()), Some(""))
    );

    // The events are in /state with those ids, and GET /event serves them.
    let state = room_state(&server, &alice, &room).await;
    assert_eq!(find(&state, "m.room.topic", "")["event_id"], topic_id.as_str());
    assert_eq!(find(&state, "m.room.name", "")["event_id"], name_id.as_str());
    assert_eq!(find(&state, "com.example.x", "somekey")["event_id"], custom_id.as_str());
    let (status, event) = get_event(&server, &alice, &room, &name_id).await;
    assert_eq!((status, &event["content"]), (200, &json!({ "name": "Trailing slash" })), "{event}");

    // Another key of the same type is another piece of state; an unset key is 404.
    let response = get_state(&server, &alice, &room, "com.example.x", "otherkey").await;
    assert_error(&response, 404, "M_NOT_FOUND", "unset state key");
    let response = get_state(&server, &alice, &room, "com.example.x", "").await;
    assert_error(&response, 404, "M_NOT_FOUND", "unset empty state key");
}

async fn identical_state_returns_the_current_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let topic = |text: &str| json!({ "topic": text });

    let (status, body) = put_state(&server, &alice, &room, "m.room.topic", "", topic("same")).await;
    assert_eq!(status, 200, "{body}");
    let first = event_id_of(&body);
    let (status, body) = put_state(&server, &alice, &room, "m.room.topic", "", topic("same")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(event_id_of(&body), first);
    let state = room_state(&server, &alice, &room).await;
    let topics: Vec<&Value> = state.iter().filter(|e| e["type"] == "m.room.topic").collect();
    assert_eq!(topics.len(), 1, "{state:?}");
    assert_eq!(topics[0]["event_id"], first.as_str());

    // A change is a new event, and so is changing it back.
    let (_, body) = put_state(&server, &alice, &room, "m.room.topic", "", topic("changed")).await;
    let changed = event_id_of(&body);
    assert_ne!(changed, first);
    let (_, body) = put_state(&server, &alice, &room, "m.room.topic", "", topic("same")).await;
    let back = event_id_of(&body);
    assert_ne!(back, first);
    assert_ne!(back, changed);
    let state = room_state(&server, &alice, &room).await;
    assert_eq!(find(&state, "m.room.topic", "")["event_id"], back.as_str());
}

async fn non_member_cannot_send_or_read(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let message = send_text(&server, &alice, &room, "t1", "members only").await;

    let response = send(&server, &eve, &room, "m.room.message", "t1", text("let me in")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "send by a non-member");
    let response = put_state(&server, &eve, &room, "m.room.topic", "", json!({ "topic": "mine" })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "state by a non-member");
    let response = server.get(&room_path(&room, "/state"), Some(&eve.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "/state by a non-member");
    let response = get_state(&server, &eve, &room, "m.room.join_rules", "").await;
    assert_error(&response, 403, "M_FORBIDDEN", "state event by a non-member");
    let response = get_event(&server, &eve, &room, &message).await;
    assert_error(&response, 404, "M_NOT_FOUND", "event read by a non-member");
    let path = room_path(&room, &format!("/redact/{}/r1", enc(&message)));
    let response = server.put(&path, Some(&eve.token), json!({ "reason": "vandal" })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "redaction by a non-member");

    // Nothing was added on eve's behalf.
    let (_, event) = get_event(&server, &alice, &room, &message).await;
    assert_eq!(event["content"]["body"], "members only", "{event}");
    assert!(event["unsigned"].get("redacted_because").is_none(), "{event}");
    let state = room_state(&server, &alice, &room).await;
    assert!(state.iter().all(|e| e["sender"] == alice.user_id.as_str()), "{state:?}");
    assert!(!keys(&state).contains(&key("m.room.topic", "")), "{state:?}");
}

async fn invited_user_cannot_send_before_joining(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "invite": [bob.user_id] })).await;
    let state = room_state(&server, &alice, &room).await;
    assert_eq!(find(&state, "m.room.member", &bob.user_id)["content"]["membership"], "invite");

    let response = send(&server, &bob, &room, "m.room.message", "t1", text("hi")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "send by an invitee");
    let response = put_state(&server, &bob, &room, "com.example.x", "", json!({ "a": 1 })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "state by an invitee");
    let response = server.get(&room_path(&room, "/state"), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "/state by an invitee");
    assert!(joined_rooms(&server, &bob).await.is_empty());

    let after = room_state(&server, &alice, &room).await;
    assert_eq!(keys(&after), keys(&state));
}

async fn power_levels_refuse_events_above_sender_level(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;

    // The creator (100 in a v11 room) cannot set a topic that needs 200.
    let room = create_room(
        &server,
        &alice,
        json!({ "room_version": "11", "power_level_content_override": { "events": { "m.room.topic": 200 } } }),
    )
    .await;
    let response = put_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "nope" })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "topic below its level");
    let response = get_state(&server, &alice, &room, "m.room.topic", "").await;
    assert_error(&response, 404, "M_NOT_FOUND", "refused topic");
    // Messages need only events_default.
    send_text(&server, &alice, &room, "t1", "still allowed").await;

    // A creator who lowers themselves to 50 keeps the old topic and cannot
    // raise themselves again.
    let room = create_room(&server, &alice, json!({ "room_version": "11", "topic": "old" })).await;
    let (status, mut power) = get_state(&server, &alice, &room, "m.room.power_levels", "").await;
    assert_eq!(status, 200, "{power}");
    power["users"][&alice.user_id] = json!(50);
    power["events"]["m.room.topic"] = json!(100);
    let (status, body) = put_state(&server, &alice, &room, "m.room.power_levels", "", power.clone()).await;
    assert_eq!(status, 200, "{body}");
    let demoted = event_id_of(&body);

    let response = put_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "new" })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "topic at 100 by a user at 50");
    let (status, topic) = get_state(&server, &alice, &room, "m.room.topic", "").await;
    assert_eq!((status, &topic["topic"]), (200, &json!("old")), "{topic}");

    let mut restore = power.clone();
    restore["users"][&alice.user_id] = json!(100);
    let response = put_state(&server, &alice, &room, "m.room.power_levels", "", restore).await;
    assert_error(&response, 403, "M_FORBIDDEN", "power levels by a user at 50");
    let state = room_state(&server, &alice, &room).await;
    let current = find(&state, "m.room.power_levels", "");
    assert_eq!(current["event_id"], demoted.as_str());
    assert_eq!(current["content"]["users"][&alice.user_id], 50);
}

async fn v12_creator_is_above_every_event_level(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "power_level_content_override": { "events": { "m.room.topic": 200 } } }),
    )
    .await;
    let (status, body) =
        put_state(&server, &alice, &room, "m.room.topic", "", json!({ "topic": "creator" })).await;
    assert_eq!(status, 200, "{body}");
    let (status, topic) = get_state(&server, &alice, &room, "m.room.topic", "").await;
    assert_eq!((status, topic), (200, json!({ "topic": "creator" })));
}

async fn redaction_strips_content_and_records_redacted_because(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "topic": "Secret topic" })).await;
    let message = send_text(&server, &alice, &room, "t1", "regrettable").await;
    let t = Some(alice.token.as_str());

    let redact_path =
        |target: &str, txn: &str| room_path(&room, &format!("/redact/{}/{}", enc(target), enc(txn)));
    // The message's txn id again, on the redact endpoint: a separate request.
    let (status, body) = server.put(&redact_path(&message, "t1"), t, json!({ "reason": "oops" })).await;
    assert_eq!(status, 200, "{body}");
    let redaction = event_id_of(&body);
    assert_ne!(redaction, message);
    // Idempotent like send.
    let (status, body) = server.put(&redact_path(&message, "t1"), t, json!({ "reason": "oops" })).await;
    assert_eq!((status, event_id_of(&body)), (200, redaction.clone()));

    let (status, event) = get_event(&server, &alice, &room, &message).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["event_id"], message.as_str());
    assert_eq!(event["type"], "m.room.message");
    assert_eq!(event["sender"], alice.user_id.as_str());
    assert_eq!(event["content"], json!({}));
    let because = &event["unsigned"]["redacted_because"];
    assert_eq!(because["event_id"], redaction.as_str(), "{event}");
    assert_eq!(because["type"], "m.room.redaction", "{event}");
    assert_eq!(because["sender"], alice.user_id.as_str(), "{event}");
    assert_eq!(because["content"]["reason"], "oops", "{event}");

    // The redaction itself: `redacts` in content (v11+) and, for older
    // clients, at the top level too.
    let (status, event) = get_event(&server, &alice, &room, &redaction).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["type"], "m.room.redaction");
    assert_eq!(event["content"], json!({ "reason": "oops", "redacts": message }));
    assert_eq!(event["redacts"], message.as_str());
    assert_eq!(event["unsigned"]["transaction_id"], "t1");

    // A redacted state event stays in the state, stripped.
    let state = room_state(&server, &alice, &room).await;
    let topic_id = find(&state, "m.room.topic", "")["event_id"].as_str().unwrap().to_owned();
    let (status, body) = server.put(&redact_path(&topic_id, "r2"), t, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let topic_redaction = event_id_of(&body);
    let (status, content) = get_state(&server, &alice, &room, "m.room.topic", "").await;
    assert_eq!((status, content), (200, json!({})));
    let state = room_state(&server, &alice, &room).await;
    let topic = find(&state, "m.room.topic", "");
    assert_eq!(topic["event_id"], topic_id.as_str());
    assert_eq!(topic["content"], json!({}));
    assert_eq!(topic["unsigned"]["redacted_because"]["event_id"], topic_redaction.as_str(), "{topic}");
    assert!(topic["unsigned"]["redacted_because"]["content"].get("reason").is_none(), "{topic}");
}

async fn redacting_unknown_event_is_not_found_and_foreign_one_invalid(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let other_room = create_room(&server, &alice, json!({})).await;
    let elsewhere = send_text(&server, &alice, &other_room, "t1", "in the other room").await;
    let t = Some(alice.token.as_str());

    let unknown = "$unknownevent000000000000000000000000000000";
    let path = room_path(&room, &format!("/redact/{}/r1", enc(unknown)));
    let response = server.put(&path, t, json!({ "reason": "x" })).await;
    assert_error(&response, 404, "M_NOT_FOUND", "redact an unknown event");
    let path = room_path(&room, &format!("/redact/{}/r2", enc(&elsewhere)));
    let response = server.put(&path, t, json!({ "reason": "x" })).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "redact an event of another room");

    // The other room's event is untouched.
    let (status, event) = get_event(&server, &alice, &other_room, &elsewhere).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "in the other room");
    assert!(event["unsigned"].get("redacted_because").is_none(), "{event}");
}

async fn malformed_room_id_is_invalid_param(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let t = Some(alice.token.as_str());

    for bad in ["not-a-room-id", "#alias:test.local", "@user:test.local"] {
        let response = send(&server, &alice, bad, "m.room.message", "t1", text("x")).await;
        assert_error(&response, 400, "M_INVALID_PARAM", &format!("send to {bad}"));
        let response = put_state(&server, &alice, bad, "m.room.topic", "", json!({ "topic": "x" })).await;
        assert_error(&response, 400, "M_INVALID_PARAM", &format!("state in {bad}"));
        let response = server.get(&room_path(bad, "/state"), t).await;
        assert_error(&response, 400, "M_INVALID_PARAM", &format!("/state of {bad}"));
    }
    assert!(joined_rooms(&server, &alice).await.is_empty());
}

/// An unknown room answers like a room the caller is not in (403), so no
/// answer tells which room ids exist; only a join says 404.
async fn unknown_room_is_forbidden_like_a_room_one_is_not_in(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let t = Some(alice.token.as_str());
    let bobs = create_room(&server, &bob, json!({})).await;

    for room in ["!doesnotexist:test.local", "!AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", bobs.as_str()] {
        let response = send(&server, &alice, room, "m.room.message", "t1", text("x")).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("send to {room}"));
        let response = put_state(&server, &alice, room, "m.room.topic", "", json!({ "topic": "x" })).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("put state in {room}"));
        let response = get_state(&server, &alice, room, "m.room.topic", "").await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("get state in {room}"));
        let response = server.get(&room_path(room, "/state"), t).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("/state of {room}"));
        let response = server.get(&room_path(room, "/messages?dir=b"), t).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("/messages of {room}"));
        let response = server.get(&room_path(room, "/members"), t).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("/members of {room}"));
    }
    for room in ["!doesnotexist:test.local", "!AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"] {
        let response = server.post(&room_path(room, "/join"), t, json!({})).await;
        assert_error(&response, 404, "M_NOT_FOUND", &format!("join {room}"));
    }
    assert!(joined_rooms(&server, &alice).await.is_empty());
}

async fn oversized_content_is_too_large_and_not_stored(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let before = room_state(&server, &alice, &room).await;

    let huge = "x".repeat(70_000);
    let response = send(&server, &alice, &room, "m.room.message", "big", text(&huge)).await;
    assert_error(&response, 413, "M_TOO_LARGE", "huge message");
    // The transaction was not recorded: the same id now sends a new event.
    let small = send_text(&server, &alice, &room, "big", "small").await;
    let (_, event) = get_event(&server, &alice, &room, &small).await;
    assert_eq!(event["content"]["body"], "small");

    let response = put_state(&server, &alice, &room, "com.example.big", "k", json!({ "blob": huge })).await;
    assert_error(&response, 413, "M_TOO_LARGE", "huge state");
    let response = get_state(&server, &alice, &room, "com.example.big", "k").await;
    assert_error(&response, 404, "M_NOT_FOUND", "refused huge state");
    assert_eq!(keys(&room_state(&server, &alice, &room).await), keys(&before));

    // A large event within the limit goes through whole.
    let large = "y".repeat(60_000);
    let event_id = send_text(&server, &alice, &room, "large", &large).await;
    let (status, event) = get_event(&server, &alice, &room, &event_id).await;
    assert_eq!(status, 200);
    assert_eq!(event["content"]["body"].as_str().map(str::len), Some(60_000));
}

async fn joined_rooms_lists_created_rooms_only_when_joined(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    assert!(joined_rooms(&server, &alice).await.is_empty());

    let mut created = vec![
        create_room(&server, &alice, json!({})).await,
        create_room(&server, &alice, json!({ "room_version": "11", "invite": [bob.user_id] })).await,
        create_room(&server, &alice, json!({ "room_version": "10", "preset": "public_chat" })).await,
    ];
    created.sort_unstable();
    assert_eq!(joined_rooms(&server, &alice).await, created);
    // An invite is not a join; another user's rooms are not listed.
    assert!(joined_rooms(&server, &bob).await.is_empty());
    let bobs = create_room(&server, &bob, json!({})).await;
    assert_eq!(joined_rooms(&server, &bob).await, vec![bobs]);
    assert_eq!(joined_rooms(&server, &alice).await, created);
}

async fn joined_members_and_members_filters(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "invite": [bob.user_id, carol.user_id] })).await;
    let t = Some(alice.token.as_str());

    let (status, body) = server.get(&room_path(&room, "/joined_members"), t).await;
    assert_eq!(status, 200, "{body}");
    let joined = body["joined"].as_object().unwrap_or_else(|| panic!("no joined in {body}"));
    assert_eq!(joined.keys().collect::<Vec<_>>(), vec![&alice.user_id], "{body}");
    assert_eq!(joined[&alice.user_id]["display_name"], "alice", "{body}");
    let response = server.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "joined_members for an invitee");

    // Users sort as alice < bob < carol, as the helper sorts.
    let entry = |user: &User, membership: &str| (user.user_id.clone(), membership.to_owned());
    let (alice_join, bob_invite, carol_invite) =
        (entry(&alice, "join"), entry(&bob, "invite"), entry(&carol, "invite"));
    let list = |query: &'static str| members(&server, &alice, &room, query);
    assert_eq!(list("").await, vec![alice_join.clone(), bob_invite.clone(), carol_invite.clone()]);
    assert_eq!(list("?membership=join").await, vec![alice_join.clone()]);
    assert_eq!(list("?membership=invite").await, vec![bob_invite.clone(), carol_invite.clone()]);
    assert_eq!(list("?not_membership=invite").await, vec![alice_join.clone()]);
    assert_eq!(list("?not_membership=join").await, vec![bob_invite, carol_invite]);
    assert_eq!(list("?membership=leave").await, vec![]);
    assert_eq!(list("?membership=join&not_membership=join").await, vec![]);

    let response = server.get(&room_path(&room, "/members"), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "members for an invitee");
}

/// An `initial_state` entry replaces the preset's event of the same type and
/// state key: one `m.room.history_visibility` and one join rule, the caller's.
async fn initial_state_replaces_the_presets_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "preset": "public_chat", "initial_state": [
            { "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } },
            { "type": "m.room.join_rules", "content": { "join_rule": "invite" } },
        ] }),
    )
    .await;
    let (status, page) = server.get(&room_path(&room, "/messages?dir=f&limit=50"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    let of = |kind: &str| -> Vec<Value> {
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["content"].clone())
            .collect()
    };
    assert_eq!(of("m.room.history_visibility"), vec![json!({ "history_visibility": "joined" })], "{page}");
    assert_eq!(of("m.room.join_rules"), vec![json!({ "join_rule": "invite" })], "{page}");
}
