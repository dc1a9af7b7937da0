//! Rooms of every version seqline creates (1 to 12): each takes, serves and
//! redacts a message with its version's event id format (`$<opaque>:<server>`
//! in 1 and 2, the reference hash in standard base64 in 3, URL-safe from 4
//! on) and redaction algorithm (`allow` of join rules kept from 8, a
//! redaction's `redacts` from 11). Features a version lacks are refused with
//! 403 M_FORBIDDEN: knocking before 7, restricted joins before 8.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    capabilities_list_versions_1_to_12,
    every_version_sends_serves_and_redacts,
    knocking_is_refused_before_version_7,
    restricted_joins_are_refused_before_version_8,
);

async fn get_event(server: &Server, user: &User, room: &str, event_id: &str) -> Value {
    let (status, event) =
        server.get(&room_path(room, &format!("/event/{}", enc(event_id))), Some(&user.token)).await;
    assert_eq!(status, 200, "{event}");
    event
}

async fn redact(server: &Server, user: &User, room: &str, event_id: &str, txn: &str) -> String {
    let path = room_path(room, &format!("/redact/{}/{txn}", enc(event_id)));
    let (status, body) = server.put(&path, Some(&user.token), json!({ "reason": "test" })).await;
    assert_eq!(status, 200, "{body}");
    event_id_of(&body)
}

/// Asserts `id` has the form of an event id of room `version` made by `server_name`.
#[track_caller]
fn assert_id_format(id: &str, version: u32, server_name: &str) {
    let body = id.strip_prefix('$').unwrap_or_else(|| panic!("{id}"));
    match version {
        1 | 2 => {
            let (opaque, server) = body.split_once(':').unwrap_or_else(|| panic!("v{version}: {id}"));
            assert!(!opaque.is_empty(), "v{version}: {id}");
            assert_eq!(server, server_name, "v{version}: {id}");
        }
        _ => {
            // A SHA-256 in unpadded base64: 43 characters.
            assert_eq!(body.len(), 43, "v{version}: {id}");
            let url_safe = body.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            let standard = body.chars().all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/');
            if version == 3 {
                assert!(standard, "v3 ids are standard base64: {id}");
            } else {
                assert!(url_safe, "v{version} ids are URL-safe base64: {id}");
            }
        }
    }
}

async fn capabilities_list_versions_1_to_12(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) = server.get(&format!("{V3}/capabilities"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{body}");
    let versions = &body["capabilities"]["m.room_versions"];
    assert_eq!(versions["default"], "12", "{body}");
    let mut available: Vec<u32> = versions["available"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(v, stability)| {
            assert_eq!(stability, "stable", "{v}");
            v.parse().unwrap()
        })
        .collect();
    available.sort_unstable();
    assert_eq!(available, (1..=12).collect::<Vec<_>>());
    // Unknown versions are refused and create nothing.
    for version in ["0", "13", "org.example.custom"] {
        let response = server
            .post(&format!("{V3}/createRoom"), Some(&alice.token), json!({ "room_version": version }))
            .await;
        assert_error(&response, 400, "M_UNSUPPORTED_ROOM_VERSION", version);
    }
    let (_, joined) = server.get(&format!("{V3}/joined_rooms"), Some(&alice.token)).await;
    assert_eq!(joined["joined_rooms"], json!([]), "{joined}");
}

/// In each version: the create event says the version (and names its
/// creator before 11); a message is served by `/event` and `/messages`
/// under an id of the version's format; redacting it empties its content;
/// redacting the join rules keeps `allow` from 8 on; redacting the
/// redaction keeps its `content.redacts` from 11 on (the top-level
/// `redacts` is served in every version).
async fn every_version_sends_serves_and_redacts(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let server_name = alice.user_id.split_once(':').unwrap().1.to_owned();
    for version in 1..=12u32 {
        let room = create_room(
            &server,
            &alice,
            json!({
                "room_version": version.to_string(), "preset": "public_chat",
                "initial_state": [{
                    "type": "m.room.join_rules", "state_key": "",
                    "content": { "join_rule": "public", "allow": [], "x": 1 }
                }],
            }),
        )
        .await;
        if version <= 2 {
            // The room id names our server in every version but 12.
            assert!(room.ends_with(&format!(":{server_name}")), "{room}");
        }
        join(&server, &bob, &room).await;
        let (_, state) = server.get(&room_path(&room, "/state"), Some(&alice.token)).await;
        let create = state
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "m.room.create")
            .unwrap_or_else(|| panic!("v{version}: no create event in {state}"))
            .clone();
        assert_eq!(create["content"]["room_version"], version.to_string(), "{create}");
        assert_eq!(create["content"].get("creator").is_some(), version < 11, "v{version}: {create}");
        for event in state.as_array().unwrap() {
            assert_id_format(event["event_id"].as_str().unwrap(), version, &server_name);
        }

        let (status, sent) = server
            .put(&room_path(&room, "/send/m.room.message/m1"), Some(&bob.token), text(&format!("v{version}")))
            .await;
        assert_eq!(status, 200, "v{version}: {sent}");
        let message = event_id_of(&sent);
        assert_id_format(&message, version, &server_name);
        let event = get_event(&server, &alice, &room, &message).await;
        assert_eq!(
            (event["event_id"].as_str(), &event["content"]["body"]),
            (Some(message.as_str()), &json!(format!("v{version}")))
        );
        let (status, page) =
            server.get(&room_path(&room, "/messages?dir=b&limit=5"), Some(&alice.token)).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(message_bodies(&page), [format!("v{version}")], "v{version}: {page}");
        assert_eq!(page["chunk"][0]["event_id"], message.as_str(), "v{version}: {page}");

        // Alice (a moderator) redacts bob's message.
        let redaction = redact(&server, &alice, &room, &message, "r1").await;
        assert_id_format(&redaction, version, &server_name);
        let event = get_event(&server, &alice, &room, &message).await;
        assert_eq!(event["content"], json!({}), "v{version}: {event}");
        assert_eq!(event["unsigned"]["redacted_because"]["event_id"], redaction.as_str(), "v{version}");
        let served = get_event(&server, &alice, &room, &redaction).await;
        assert_eq!(served["redacts"], message.as_str(), "v{version}: {served}");
        let in_content = served["content"].get("redacts");
        assert_eq!(in_content.is_some(), version >= 11, "v{version}: {served}");

        // The join rules: `allow` survives redaction from version 8 on.
        let rules_id = state
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "m.room.join_rules")
            .and_then(|e| e["event_id"].as_str())
            .unwrap()
            .to_owned();
        redact(&server, &alice, &room, &rules_id, "r2").await;
        let rules = get_event(&server, &alice, &room, &rules_id).await;
        let expected = if version >= 8 {
            json!({ "join_rule": "public", "allow": [] })
        } else {
            json!({ "join_rule": "public" })
        };
        assert_eq!(rules["content"], expected, "v{version}: {rules}");

        // The redaction itself, redacted: `redacts` stays in its content from 11 on.
        redact(&server, &alice, &room, &redaction, "r3").await;
        let redacted = get_event(&server, &alice, &room, &redaction).await;
        let expected = if version >= 11 { json!({ "redacts": message }) } else { json!({}) };
        assert_eq!(redacted["content"], expected, "v{version}: {redacted}");
        assert_eq!(redacted["redacts"], message.as_str(), "v{version}: {redacted}");

        // The room goes on: the join rules are still in force for a newcomer.
        let (status, body) =
            server.put(&room_path(&room, "/send/m.room.message/m2"), Some(&bob.token), text("after")).await;
        assert_eq!(status, 200, "v{version}: {body}");
    }
}

/// Alice's private room of `version` under join rule `rule`; bob knocks on
/// it or joins it (`path`: `knock` or `join`). Answers the response and
/// bob's member event as alice reads it.
async fn bob_tries(
    server: &Server,
    (alice, bob): (&User, &User),
    version: &str,
    rule: Value,
    path: &str,
) -> ((u16, Value), (u16, Value)) {
    let room = create_room(
        server,
        alice,
        json!({
            "room_version": version, "preset": "private_chat",
            "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": rule }],
        }),
    )
    .await;
    let response = server
        .post(&format!("{V3}/{path}/{}", enc(&room)), Some(&bob.token), json!({ "reason": "hi" }))
        .await;
    let member_path = room_path(&room, &format!("/state/m.room.member/{}", enc(&bob.user_id)));
    (response, server.get(&member_path, Some(&alice.token)).await)
}

/// A refusal for the room's version: 403 M_FORBIDDEN saying why, no member event.
#[track_caller]
fn assert_refused(response: &(u16, Value), member: &(u16, Value), why: &str) {
    assert_error(response, 403, "M_FORBIDDEN", why);
    let error = response.1["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "{error}");
    assert_eq!(member.0, 404, "no member event for bob: {}", member.1);
}

async fn knocking_is_refused_before_version_7(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let knock = json!({ "join_rule": "knock" });
    let (response, member) = bob_tries(&server, (&alice, &bob), "6", knock.clone(), "knock").await;
    assert_refused(&response, &member, "does not support knocking");
    let (response, member) = bob_tries(&server, (&alice, &bob), "7", knock, "knock").await;
    assert_eq!(response.0, 200, "{}", response.1);
    assert_eq!(member.1["membership"], "knock", "{}", member.1);
}

async fn restricted_joins_are_refused_before_version_8(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let space = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &space).await;
    let rule = json!({
        "join_rule": "restricted",
        "allow": [{ "type": "m.room_membership", "room_id": space }],
    });
    let (response, member) = bob_tries(&server, (&alice, &bob), "7", rule.clone(), "join").await;
    assert_refused(&response, &member, "does not support the restricted join rule");
    let (response, member) = bob_tries(&server, (&alice, &bob), "8", rule, "join").await;
    assert_eq!(response.0, 200, "{}", response.1);
    assert_eq!(member.1["membership"], "join", "{}", member.1);
    assert_eq!(member.1["join_authorised_via_users_server"], alice.user_id.as_str());
}
