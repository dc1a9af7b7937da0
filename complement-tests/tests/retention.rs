//! `m.room.retention`: `max_lifetime` moves the room's floor as events age.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use serde_json::{Value, json};

backend_tests!(
    max_lifetime_hides_old_events_from_everyone,
    max_lifetime_below_the_server_minimum_hides_nothing_yet,
    read_control_state_needs_the_history_visibility_level,
);

fn bodies(page: &Value) -> Vec<String> {
    page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

/// With the server's minimum lifetime set to 0 by its admin.
async fn max_lifetime_hides_old_events_from_everyone(backend: Backend) {
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_RETENTION_MIN_LIFETIME_MS", "0")).await;
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

/// With the default bounds a room's `max_lifetime` of 1 ms counts as a day:
/// a message sent before it stays readable.
async fn max_lifetime_below_the_server_minimum_hides_nothing_yet(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, created) = server.post(&format!("{V3}/createRoom"), Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/1"), Some(&alice.token), text("kept")).await;
    assert_eq!(status, 200, "{body}");
    let old = event_id_of(&body);
    let (status, body) = server
        .put(&room_path(&room, "/state/m.room.retention/"), Some(&alice.token), json!({ "max_lifetime": 1 }))
        .await;
    assert_eq!(status, 200, "{body}");
    // The message is older than 1 ms by now (a whole request later).
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/2"), Some(&alice.token), text("new")).await;
    assert_eq!(status, 200, "{body}");
    let (status, event) =
        server.get(&room_path(&room, &format!("/event/{}", enc(&old))), Some(&alice.token)).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "kept");
    let (_, page) = server.get(&room_path(&room, "/messages?dir=b&limit=50"), Some(&alice.token)).await;
    assert_eq!(bodies(&page), vec!["new", "kept"]);
}

/// A moderator (50) may not set `m.room.retention` or the pre-join window:
/// createRoom puts both at 100 like `m.room.history_visibility`, and where
/// a room's power levels leave them out the history-visibility level still
/// applies.
async fn read_control_state_needs_the_history_visibility_level(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (_, created) = server
        .post(
            &format!("{V3}/createRoom"),
            Some(&alice.token),
            json!({ "preset": "public_chat", "room_version": "11" }),
        )
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, _) = server.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let (status, mut power) =
        server.get(&room_path(&room, "/state/m.room.power_levels/"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{power}");
    assert_eq!(power["events"]["m.room.retention"], 100, "{power}");
    assert_eq!(power["events"]["org.seqline.prejoin_window"], 100, "{power}");

    // Bob becomes a moderator, and the two types leave the power levels.
    power["users"][&bob.user_id] = json!(50);
    power["events"].as_object_mut().unwrap().remove("m.room.retention");
    power["events"].as_object_mut().unwrap().remove("org.seqline.prejoin_window");
    let (status, body) =
        server.put(&room_path(&room, "/state/m.room.power_levels/"), Some(&alice.token), power).await;
    assert_eq!(status, 200, "{body}");

    for (kind, content) in [
        ("m.room.retention", json!({ "max_lifetime": 1 })),
        ("org.seqline.prejoin_window", json!({ "events": 0 })),
    ] {
        let path = room_path(&room, &format!("/state/{kind}/"));
        let response = server.put(&path, Some(&bob.token), content.clone()).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("a moderator's {kind}"));
        let (status, _) = server.get(&path, Some(&bob.token)).await;
        assert_eq!(status, 404, "no {kind} stored");
        let (status, body) = server.put(&path, Some(&alice.token), content).await;
        assert_eq!(status, 200, "the admin's {kind}: {body}");
    }
}
