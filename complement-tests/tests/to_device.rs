//! To-device messages as a flood would send them: only devices that exist
//! get them, one `/sync` carries at most 100 (the rest follow, in order, in
//! the next), and one sender may queue at most 1000 for one device.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    messages_for_unknown_devices_are_not_kept,
    a_sync_carries_at_most_100_and_the_rest_follow,
    one_sender_queues_at_most_1000_for_a_device,
);

async fn send(server: &Server, from: &User, to: &User, device: &str, txn: &str, n: usize) -> (u16, Value) {
    let body = json!({ "messages": { to.user_id.clone(): { device: { "n": n } } } });
    server.put(&format!("{V3}/sendToDevice/m.test/{txn}"), Some(&from.token), body).await
}

fn numbers(sync: &Value) -> Vec<u64> {
    sync["to_device"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["content"]["n"].as_u64())
        .collect()
}

/// A message for a device id nobody has is dropped: a device that later
/// logs in with that id does not get it.
async fn messages_for_unknown_devices_are_not_kept(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (status, body) = send(&server, &alice, &bob, "LATER", "t1", 1).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&server, &alice, &bob, &bob.device_id, "t2", 2).await;
    assert_eq!(status, 200, "{body}");

    let (status, login) = server
        .post(
            &format!("{V3}/login"),
            None,
            json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "bob" },
                    "password": "pw", "device_id": "LATER" }),
        )
        .await;
    assert_eq!(status, 200, "{login}");
    let later = User {
        user_id: bob.user_id.clone(),
        token: login["access_token"].as_str().unwrap().to_owned(),
        device_id: "LATER".into(),
    };
    assert_eq!(numbers(&sync_once(&server, &later, None).await), Vec::<u64>::new());
    assert_eq!(numbers(&sync_once(&server, &bob, None).await), vec![2]);
}

/// 150 messages: the first sync carries 100, the next the other 50, in the
/// order sent, and none twice.
async fn a_sync_carries_at_most_100_and_the_rest_follow(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let first = sync_once(&server, &bob, None).await;
    let mut since = first["next_batch"].as_str().unwrap().to_owned();
    for n in 0..150 {
        let (status, body) = send(&server, &alice, &bob, &bob.device_id, &format!("t{n}"), n).await;
        assert_eq!(status, 200, "{body}");
    }
    let mut got = Vec::new();
    for expected in [100, 50, 0] {
        let page = sync_once(&server, &bob, Some(&since)).await;
        let n = numbers(&page);
        assert_eq!(n.len(), expected, "{page}");
        got.extend(n);
        since = page["next_batch"].as_str().unwrap().to_owned();
    }
    assert_eq!(got, (0..150).collect::<Vec<u64>>());
}

/// A sender with 1000 messages waiting for one device gets 429 for the
/// next, which is not stored; another sender still gets through.
async fn one_sender_queues_at_most_1000_for_a_device(backend: Backend) {
    let server = Server::start(&backend).await;
    let eve = server.register("eve", "pw").await;
    let carol = server.register("carol", "pw").await;
    let bob = server.register("bob", "pw").await;
    for n in 0..1000 {
        let (status, body) = send(&server, &eve, &bob, &bob.device_id, &format!("t{n}"), n).await;
        assert_eq!(status, 200, "{body}");
    }
    let response = send(&server, &eve, &bob, &bob.device_id, "over", 1000).await;
    assert_error(&response, 429, "M_LIMIT_EXCEEDED", "the 1001st message from one sender");
    let (status, body) = send(&server, &carol, &bob, &bob.device_id, "c1", 5000).await;
    assert_eq!(status, 200, "{body}");

    let mut since: Option<String> = None;
    let mut got = Vec::new();
    loop {
        let page = sync_once(&server, &bob, since.as_deref()).await;
        let n = numbers(&page);
        if n.is_empty() {
            break;
        }
        got.extend(n);
        since = page["next_batch"].as_str().map(str::to_owned);
    }
    assert_eq!(got.len(), 1001);
    assert!(!got.contains(&1000) && got.contains(&5000));
}
