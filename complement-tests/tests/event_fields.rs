//! A filter's `event_fields` restricts each event to the listed fields, in
//! `/sync`, `/messages` and `/context`; a malformed list is 400.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use serde_json::{Value, json};

backend_tests!(event_fields_restrict_sync_messages_and_context, malformed_event_fields_are_refused);

const FIELDS: &str = r#"{"event_fields":["type","content.body","event_id"]}"#;

fn assert_only_fields(events: &Value, what: &str) {
    let list = events.as_array().unwrap_or_else(|| panic!("{what}: no events in {events}"));
    assert!(!list.is_empty(), "{what}: no events");
    for event in list {
        let mut keys: Vec<&str> = event.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert!(keys.iter().all(|k| ["content", "event_id", "type"].contains(k)), "{what}: {event}");
        assert!(
            event["content"].as_object().is_none_or(|c| c.keys().all(|k| k == "body")),
            "{what}: {event}"
        );
    }
}

async fn event_fields_restrict_sync_messages_and_context(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, created) = server.post(&format!("{V3}/createRoom"), Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/1"), Some(&alice.token), text("hello")).await;
    assert_eq!(status, 200, "{body}");
    let message = event_id_of(&body);

    let (status, sync) =
        server.get(&format!("{V3}/sync?timeout=0&filter={}", enc(FIELDS)), Some(&alice.token)).await;
    assert_eq!(status, 200, "{sync}");
    let timeline = &sync["rooms"]["join"][&room]["timeline"]["events"];
    assert_only_fields(timeline, "sync timeline");
    let last = timeline.as_array().unwrap().last().unwrap();
    assert_eq!(
        last,
        &json!({ "type": "m.room.message", "event_id": message, "content": { "body": "hello" } })
    );

    let path = room_path(&room, &format!("/messages?dir=b&limit=5&filter={}", enc(FIELDS)));
    let (status, page) = server.get(&path, Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    assert_only_fields(&page["chunk"], "messages");
    assert_eq!(page["chunk"][0]["content"], json!({ "body": "hello" }));

    let path = room_path(&room, &format!("/context/{}?limit=2&filter={}", enc(&message), enc(FIELDS)));
    let (status, context) = server.get(&path, Some(&alice.token)).await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(
        context["event"],
        json!({ "type": "m.room.message", "event_id": message, "content": { "body": "hello" } })
    );
    assert_only_fields(&context["events_before"], "context before");

    // Without the list, events are whole.
    let (_, page) = server.get(&room_path(&room, "/messages?dir=b&limit=1"), Some(&alice.token)).await;
    assert_eq!(page["chunk"][0]["sender"], alice.user_id.as_str());
}

async fn malformed_event_fields_are_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, created) = server.post(&format!("{V3}/createRoom"), Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    for bad in [r#"{"event_fields":["content..body"]}"#, r#"{"event_fields":[""]}"#] {
        let response =
            server.get(&format!("{V3}/sync?timeout=0&filter={}", enc(bad)), Some(&alice.token)).await;
        assert_error(&response, 400, "M_BAD_JSON", &format!("sync with {bad}"));
        let path = room_path(&room, &format!("/messages?dir=b&filter={}", enc(bad)));
        let response = server.get(&path, Some(&alice.token)).await;
        assert_error(&response, 400, "M_BAD_JSON", &format!("messages with {bad}"));
        let path = format!("{V3}/user/{}/filter", enc(&alice.user_id));
        let response = server.post(&path, Some(&alice.token), serde_json::from_str(bad).unwrap()).await;
        assert_error(&response, 400, "M_BAD_JSON", &format!("a stored filter with {bad}"));
    }
}
