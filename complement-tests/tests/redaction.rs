//! Redactions as an attacker would send them: through `/send` and `/state`
//! with `m.room.redaction`, at events of other rooms and of other users, in
//! room versions that put `redacts` at the top level (10) or in the content
//! (11+). A redaction applies only to an event of its own room, sent by its
//! sender or redacted by someone at the room's `redact` level; anything else
//! is refused and changes nothing.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    send_cannot_redact_an_event_of_another_room,
    state_put_cannot_carry_a_redaction,
    member_without_power_cannot_redact_others_events,
    moderator_and_sender_redactions_through_send_apply,
    redact_endpoint_answers_400_for_another_rooms_event,
    v10_redaction_needs_the_top_level_field,
    a_redacted_state_event_reaches_first_syncs_redacted,
);

async fn send(
    server: &Server,
    user: &User,
    room: &str,
    kind: &str,
    txn: &str,
    content: Value,
) -> (u16, Value) {
    let path = room_path(room, &format!("/send/{}/{}", enc(kind), enc(txn)));
    server.put(&path, Some(&user.token), content).await
}

async fn get_event(server: &Server, user: &User, room: &str, event_id: &str) -> Value {
    let (status, event) =
        server.get(&room_path(room, &format!("/event/{}", enc(event_id))), Some(&user.token)).await;
    assert_eq!(status, 200, "{event}");
    event
}

/// The event id of the room's current state event (type, "").
async fn state_event_id(server: &Server, user: &User, room: &str, kind: &str) -> String {
    let (status, state) = server.get(&room_path(room, "/state"), Some(&user.token)).await;
    assert_eq!(status, 200, "{state}");
    state
        .as_array()
        .and_then(|s| s.iter().find(|e| e["type"] == kind && e["state_key"] == ""))
        .and_then(|e| e["event_id"].as_str())
        .unwrap_or_else(|| panic!("no {kind} in {state}"))
        .to_owned()
}

#[track_caller]
fn assert_untouched(event: &Value, what: &str) {
    assert!(event["unsigned"].get("redacted_because").is_none(), "{what}: {event}");
}

/// Eve, admin of her own room, sends an `m.room.redaction` naming Alice's
/// message and Alice's power levels in another room: refused, and Alice's
/// events keep their content.
async fn send_cannot_redact_an_event_of_another_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(&server, &alice, json!({ "room_version": "11" })).await;
    let (status, body) = send(&server, &alice, &room, "m.room.message", "m1", text("mine")).await;
    assert_eq!(status, 200, "{body}");
    let message = event_id_of(&body);
    let power = state_event_id(&server, &alice, &room, "m.room.power_levels").await;
    let eves = create_room(&server, &eve, json!({ "room_version": "11" })).await;

    for (i, target) in [&message, &power].into_iter().enumerate() {
        let response =
            send(&server, &eve, &eves, "m.room.redaction", &format!("r{i}"), json!({ "redacts": target }))
                .await;
        // The same answer as for an id that names nothing: no oracle for
        // which events exist in rooms Eve cannot see.
        assert_error(&response, 404, "M_NOT_FOUND", "a redaction of another room's event");
    }
    let event = get_event(&server, &alice, &room, &message).await;
    assert_eq!(event["content"]["body"], "mine", "{event}");
    assert_untouched(&event, "the message");
    let event = get_event(&server, &alice, &room, &power).await;
    assert_eq!(event["content"]["users"][&alice.user_id], 100, "{event}");
    assert_untouched(&event, "the power levels");
}

/// `m.room.redaction` is not a state event: a PUT through `/state` is
/// refused, also in the room of its target.
async fn state_put_cannot_carry_a_redaction(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    join(&server, &eve, &room).await;
    let (status, body) = send(&server, &alice, &room, "m.room.message", "m1", text("mine")).await;
    assert_eq!(status, 200, "{body}");
    let message = event_id_of(&body);
    let eves = create_room(&server, &eve, json!({ "room_version": "11" })).await;

    for (target_room, who) in [(&eves, &eve), (&room, &eve), (&room, &alice)] {
        let path = room_path(target_room, "/state/m.room.redaction/x");
        let response = server.put(&path, Some(&who.token), json!({ "redacts": message })).await;
        assert_error(&response, 400, "M_BAD_JSON", "m.room.redaction through /state");
    }
    let event = get_event(&server, &alice, &room, &message).await;
    assert_eq!(event["content"]["body"], "mine", "{event}");
    assert_untouched(&event, "the message");
}

/// Bob, a plain member, may redact his own events but not Alice's, through
/// either path; the refused attempts leave no `redacted_because`.
async fn member_without_power_cannot_redact_others_events(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    join(&server, &bob, &room).await;
    let (_, body) = send(&server, &alice, &room, "m.room.message", "m1", text("alice's")).await;
    let message = event_id_of(&body);
    let encryption = {
        let path = room_path(&room, "/state/m.room.encryption/");
        let (status, body) =
            server.put(&path, Some(&alice.token), json!({ "algorithm": "m.megolm.v1.aes-sha2" })).await;
        assert_eq!(status, 200, "{body}");
        event_id_of(&body)
    };

    for (i, target) in [&message, &encryption].into_iter().enumerate() {
        let response =
            send(&server, &bob, &room, "m.room.redaction", &format!("s{i}"), json!({ "redacts": target }))
                .await;
        assert_error(&response, 403, "M_FORBIDDEN", "a member's redaction of another's event through /send");
        let path = room_path(&room, &format!("/redact/{}/r{i}", enc(target)));
        let response = server.put(&path, Some(&bob.token), json!({})).await;
        assert_error(&response, 403, "M_FORBIDDEN", "a member's redaction of another's event");
    }
    let event = get_event(&server, &bob, &room, &message).await;
    assert_eq!(event["content"]["body"], "alice's");
    assert_untouched(&event, "alice's message");
    let event = get_event(&server, &bob, &room, &encryption).await;
    assert_eq!(event["content"]["algorithm"], "m.megolm.v1.aes-sha2");
    assert_untouched(&event, "the encryption event");

    // The messages after the refused attempts are only Alice's events.
    let (status, page) = server.get(&room_path(&room, "/messages?dir=b&limit=3"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{page}");
    let kinds: Vec<&str> =
        page["chunk"].as_array().unwrap().iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["m.room.encryption", "m.room.message", "m.room.member"], "{page}");
}

/// A sender redacting their own event, and a moderator redacting someone
/// else's, through `/send` with `redacts` in the content (v11): applied.
async fn moderator_and_sender_redactions_through_send_apply(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    join(&server, &bob, &room).await;
    let (_, body) = send(&server, &bob, &room, "m.room.message", "m1", text("bob's first")).await;
    let first = event_id_of(&body);
    let (_, body) = send(&server, &bob, &room, "m.room.message", "m2", text("bob's second")).await;
    let second = event_id_of(&body);

    let (status, body) =
        send(&server, &bob, &room, "m.room.redaction", "r1", json!({ "redacts": first })).await;
    assert_eq!(status, 200, "{body}");
    let own = event_id_of(&body);
    let (status, body) = send(
        &server,
        &alice,
        &room,
        "m.room.redaction",
        "r2",
        json!({ "redacts": second, "reason": "spam" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let moderator = event_id_of(&body);

    for (target, by) in [(&first, &own), (&second, &moderator)] {
        let event = get_event(&server, &bob, &room, target).await;
        assert_eq!(event["content"], json!({}), "{event}");
        assert_eq!(event["unsigned"]["redacted_because"]["event_id"], by.as_str(), "{event}");
    }
}

/// `/redact` of an event that exists in another room is 400 (the room in
/// the path does not hold it), an unknown one 404.
async fn redact_endpoint_answers_400_for_another_rooms_event(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let other = create_room(&server, &alice, json!({})).await;
    let (_, body) = send(&server, &alice, &other, "m.room.message", "m1", text("elsewhere")).await;
    let elsewhere = event_id_of(&body);

    let path = room_path(&room, &format!("/redact/{}/r1", enc(&elsewhere)));
    let response = server.put(&path, Some(&alice.token), json!({})).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "redact another room's event");
    // Bob, who cannot see that room, gets the 404 of an unknown event.
    let bob = server.register("bob", "pw").await;
    let bobs = create_room(&server, &bob, json!({})).await;
    let path = room_path(&bobs, &format!("/redact/{}/r1", enc(&elsewhere)));
    let response = server.put(&path, Some(&bob.token), json!({})).await;
    assert_error(&response, 404, "M_NOT_FOUND", "redact an event of a room one cannot see");
    let event = get_event(&server, &alice, &other, &elsewhere).await;
    assert_eq!(event["content"]["body"], "elsewhere");
    assert_untouched(&event, "the other room's event");
}

/// Before room version 11 the target is the top-level `redacts`, which a
/// client cannot set through `/send`: `redacts` in the content of a v10
/// redaction names nothing, so the send is refused and nothing is redacted.
async fn v10_redaction_needs_the_top_level_field(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({ "room_version": "10" })).await;
    let (_, body) = send(&server, &alice, &room, "m.room.message", "m1", text("kept")).await;
    let message = event_id_of(&body);

    let response =
        send(&server, &alice, &room, "m.room.redaction", "r1", json!({ "redacts": message })).await;
    assert_error(&response, 400, "M_BAD_JSON", "a v10 redaction with redacts only in the content");
    let event = get_event(&server, &alice, &room, &message).await;
    assert_eq!(event["content"]["body"], "kept");
    assert_untouched(&event, "the message");

    // /redact puts it where v10 reads it.
    let path = room_path(&room, &format!("/redact/{}/r2", enc(&message)));
    let (status, body) = server.put(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let event = get_event(&server, &alice, &room, &message).await;
    assert_eq!(event["content"], json!({}), "{event}");
    assert_eq!(event["unsigned"]["redacted_because"]["event_id"], event_id_of(&body).as_str());
}

/// The state of a room `/sync` or sliding sync read once is kept for the
/// first syncs that follow (`read::state_without_members`). Alice's topic
/// is read that way by Bob, then redacted: a first `/sync` and a new
/// sliding connection both serve it redacted, never the kept content.
async fn a_redacted_state_event_reaches_first_syncs_redacted(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "room_version": "11" })).await;
    let (status, body) = server
        .put(&room_path(&room, "/state/m.room.topic/"), Some(&alice.token), json!({ "topic": "the plan" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let topic = event_id_of(&body);
    join(&server, &bob, &room).await;

    let filter =
        enc(&json!({ "room": { "state": { "lazy_load_members": true }, "timeline": { "limit": 1 } } })
            .to_string());
    let first_sync = || async {
        let (status, body) =
            server.get(&format!("{V3}/sync?timeout=0&filter={filter}"), Some(&bob.token)).await;
        assert_eq!(status, 200, "{body}");
        body["rooms"]["join"][&room]["state"]["events"]
            .as_array()
            .and_then(|s| s.iter().find(|e| e["event_id"] == topic.as_str()).cloned())
            .unwrap_or_else(|| panic!("no topic in the state: {body}"))
    };
    let sliding = || async {
        let (status, body) = server
            .post(
                "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync",
                Some(&bob.token),
                json!({ "lists": { "all": {
                    "ranges": [[0, 9]],
                    "timeline_limit": 1,
                    "required_state": [["m.room.topic", ""], ["m.room.member", "$LAZY"]]
                } } }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["rooms"][&room]["required_state"]
            .as_array()
            .and_then(|s| s.iter().find(|e| e["event_id"] == topic.as_str()).cloned())
            .unwrap_or_else(|| panic!("no topic in required_state: {body}"))
    };
    assert_eq!(first_sync().await["content"]["topic"], "the plan");
    assert_eq!(sliding().await["content"]["topic"], "the plan");

    let (status, body) =
        send(&server, &alice, &room, "m.room.redaction", "r1", json!({ "redacts": topic })).await;
    assert_eq!(status, 200, "{body}");
    let redaction = event_id_of(&body);
    for (what, event) in [("/sync", first_sync().await), ("sliding sync", sliding().await)] {
        assert_eq!(event["content"], json!({}), "{what}: {event}");
        assert_eq!(event["unsigned"]["redacted_because"]["event_id"], redaction.as_str(), "{what}: {event}");
    }
}
