//! `m.room.retention`: `max_lifetime` moves the room's floor as events age.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use serde_json::{Value, json};

backend_tests!(max_lifetime_hides_old_events_from_everyone);

fn bodies(page: &Value) -> Vec<String> {
    page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

async fn max_lifetime_hides_old_events_from_everyone(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, created) = server.post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let send = |txn: &'static str, body: &'static str| {
        let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
        let (server, token) = (&server, alice.token.clone());
        async move {
            server.put(&path, Some(&token), json!({ "msgtype": "m.text", "body": body })).await.1["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let old = send("1", "old news").await;
    let retention = format!("/_matrix/client/v3/rooms/{room}/state/m.room.retention");
    let (status, _) = server.put(&retention, Some(&alice.token), json!({ "max_lifetime": 3_600_000 })).await;
    assert_eq!(status, 200);
    let messages = format!("/_matrix/client/v3/rooms/{room}/messages?dir=b&limit=50");
    let (_, page) = server.get(&messages, Some(&alice.token)).await;
    assert_eq!(bodies(&page), vec!["old news"], "an hour keeps everything");

    // A lifetime of 1 ms: everything sent before now ages out. Wait for the
    // condition (the old message older than 1 ms), not for a fixed time.
    let (status, _) = server.put(&retention, Some(&alice.token), json!({ "max_lifetime": 1 })).await;
    assert_eq!(status, 200);
    let mut hidden = false;
    for _ in 0..200 {
        let (status, body) =
            server.get(&format!("/_matrix/client/v3/rooms/{room}/event/{old}"), Some(&alice.token)).await;
        if status == 404 {
            assert_eq!(body["errcode"], "M_NOT_FOUND");
            hidden = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(hidden, "the old message never aged out");
    let (_, page) = server.get(&messages, Some(&alice.token)).await;
    assert!(bodies(&page).is_empty(), "{page}");
    // Aged-out history stays gone when the lifetime is raised again; new events
    // are readable.
    let (status, _) = server.put(&retention, Some(&alice.token), json!({ "max_lifetime": 3_600_000 })).await;
    assert_eq!(status, 200);
    send("2", "fresh").await;
    let (_, page) = server.get(&messages, Some(&alice.token)).await;
    assert_eq!(bodies(&page), vec!["fresh"], "the floor only moves up");
}
