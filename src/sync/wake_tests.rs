//! A woken long-poll reads again only what moved while it waited
//! ([`crate::streams::Streams::changes_between`]). These tests hold the
//! request until it is waiting (its first pass done), then change something
//! that does not wake it (a claim of its one-time keys), then wake it or let
//! it time out: the answer must count the claim either way. In-process, so
//! the moment the request waits can be seen.

use std::time::{Duration, Instant};

use axum::Router;
use serde_json::{Value, json};

use crate::state::AppState;
use crate::storage::keys;
use crate::storage::sparse_tests::{app_state, call};
use crate::storage::state_tests::backends;

/// Waits until `n` requests wait for a wake-up.
async fn until_waiting(state: &AppState, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.notifier.waiting_now() != n {
        assert!(Instant::now() < deadline, "no request started waiting");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn otk_count(body: &Value) -> &Value {
    &body["device_one_time_keys_count"]["signed_curve25519"]
}

/// A long-poll from `since` in a task of its own.
fn long_poll(
    app: &Router,
    token: &str,
    since: &str,
    timeout_ms: u64,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let (app, token) = (app.clone(), token.to_owned());
    let path = format!("/_matrix/client/v3/sync?since={since}&timeout={timeout_ms}");
    tokio::spawn(async move { call(&app, "GET", &path, &token, None).await })
}

#[tokio::test]
async fn a_claim_while_a_sync_waits_is_counted_when_it_wakes_or_times_out() {
    for fresh in backends().await {
        let data_dir =
            std::env::temp_dir().join(format!("seqline-wake-{}-{}", std::process::id(), fresh.label));
        std::fs::create_dir_all(&data_dir).unwrap();
        let state = app_state(&fresh.url, &data_dir, i64::MAX).await;
        let app = crate::api::router(state.clone());
        let mut sessions = Vec::new();
        for name in ["alice", "bob"] {
            let user = crate::account::create_user(&state, name, None, false).await.unwrap();
            sessions
                .push(crate::account::issue_session(&state, &user, None, None, None, false).await.unwrap());
        }
        let (alice, bob) = (&sessions[0], &sessions[1]);
        let (a, d) = (alice.user_id.as_str(), alice.device_id.as_str());
        for id in ["AAAA", "AAAB", "AAAC"] {
            keys::add_one_time_key(
                &state.db,
                a,
                d,
                &format!("signed_curve25519:{id}"),
                "signed_curve25519",
                "{}",
            )
            .await
            .unwrap();
        }
        let (status, body) = call(
            &app,
            "POST",
            "/_matrix/client/v3/createRoom",
            &alice.access_token,
            Some(json!({ "preset": "public_chat" })),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let room = body["room_id"].as_str().unwrap().to_owned();
        let join = format!("/_matrix/client/v3/join/{room}");
        assert_eq!(call(&app, "POST", &join, &bob.access_token, Some(json!({}))).await.0, 200);
        let (_, first) = call(&app, "GET", "/_matrix/client/v3/sync", &alice.access_token, None).await;
        assert_eq!(otk_count(&first), 3, "{first}");
        let claim = json!({ "one_time_keys": { a: { d: "signed_curve25519" } } });
        let claim_path = "/_matrix/client/v3/keys/claim";

        // Woken by a message after a claim that did not wake it.
        let poll = long_poll(&app, &alice.access_token, first["next_batch"].as_str().unwrap(), 20_000);
        until_waiting(&state, 1).await;
        let (status, claimed) = call(&app, "POST", claim_path, &bob.access_token, Some(claim.clone())).await;
        assert_eq!(status, 200, "{claimed}");
        assert_eq!(state.notifier.waiting_now(), 1, "a claim wakes no one");
        let send = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t1");
        let (status, sent) =
            call(&app, "PUT", &send, &bob.access_token, Some(json!({ "msgtype": "m.text", "body": "hi" })))
                .await;
        assert_eq!(status, 200, "{sent}");
        let (status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let timeline = &body["rooms"]["join"][&room]["timeline"]["events"];
        assert_eq!(timeline[0]["event_id"], sent["event_id"], "{body}");
        assert_eq!(otk_count(&body), 2, "the claim is counted: {body}");

        // Timed out after a claim: the last look counts it too.
        let poll = long_poll(&app, &alice.access_token, body["next_batch"].as_str().unwrap(), 300);
        until_waiting(&state, 1).await;
        let (status, claimed) = call(&app, "POST", claim_path, &bob.access_token, Some(claim)).await;
        assert_eq!(status, 200, "{claimed}");
        let (status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(otk_count(&body), 1, "the claim is counted: {body}");
        assert_eq!(state.notifier.waiting_now(), 0);

        // Woken by a state event: it is in `state_after` (the window's state
        // is read, not skipped as for a message).
        let since = body["next_batch"].as_str().unwrap().to_owned();
        let (app2, token) = (app.clone(), alice.access_token.clone());
        let path = format!("/_matrix/client/v3/sync?since={since}&timeout=20000&use_state_after=true");
        let poll = tokio::spawn(async move { call(&app2, "GET", &path, &token, None).await });
        until_waiting(&state, 1).await;
        let name = format!("/_matrix/client/v3/rooms/{room}/state/m.room.name/");
        let (status, named) =
            call(&app, "PUT", &name, &alice.access_token, Some(json!({ "name": "renamed" }))).await;
        assert_eq!(status, 200, "{named}");
        let (status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let after = &body["rooms"]["join"][&room]["state_after"]["events"];
        assert!(after.as_array().unwrap().iter().any(|e| e["event_id"] == named["event_id"]), "{body}");
        std::fs::remove_dir_all(&data_dir).ok();
    }
}

/// A fresh server on `url` with users of these names, each with a session.
async fn server_with(
    url: &str,
    label: &str,
    names: &[&str],
) -> (AppState, Router, Vec<crate::account::Session>, std::path::PathBuf) {
    let data_dir =
        std::env::temp_dir().join(format!("seqline-wake-{}-{label}-{}", std::process::id(), names[0]));
    std::fs::create_dir_all(&data_dir).unwrap();
    let state = app_state(url, &data_dir, i64::MAX).await;
    let app = crate::api::router(state.clone());
    let mut sessions = Vec::new();
    for name in names {
        let user = crate::account::create_user(&state, name, None, false).await.unwrap();
        sessions.push(crate::account::issue_session(&state, &user, None, None, None, false).await.unwrap());
    }
    (state, app, sessions, data_dir)
}

/// A room `token`'s user creates with `preset`.
async fn create_room(app: &Router, token: &str, preset: &str) -> String {
    let body = ok(app, "POST", "/_matrix/client/v3/createRoom", token, json!({ "preset": preset })).await;
    body["room_id"].as_str().unwrap().to_owned()
}

async fn ok(app: &Router, method: &str, path: &str, token: &str, body: Value) -> Value {
    let (status, answer) = call(app, method, path, token, Some(body)).await;
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer
}

/// Messages sent before a user joins, which they could not read when their
/// long-poll first looked, are theirs once they join (shared history): the
/// woken answer carries them, not just the join.
#[tokio::test]
async fn a_join_while_a_sync_waits_brings_the_history_it_opens() {
    for fresh in backends().await {
        let (state, app, s, dir) = server_with(&fresh.url, fresh.label, &["hjalice", "hjbob"]).await;
        let (alice, bob) = (&s[0].access_token, &s[1].access_token);
        let create = json!({ "preset": "public_chat", "initial_state": [
            { "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "shared" } }
        ] });
        let room = ok(&app, "POST", "/_matrix/client/v3/createRoom", bob, create).await["room_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (_, first) = call(&app, "GET", "/_matrix/client/v3/sync", alice, None).await;
        let mut sent = Vec::new();
        for i in 0..3 {
            let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/h{i}");
            sent.push(
                ok(&app, "PUT", &path, bob, json!({ "msgtype": "m.text", "body": format!("m{i}") })).await,
            );
        }
        let poll = long_poll(&app, alice, first["next_batch"].as_str().unwrap(), 20_000);
        until_waiting(&state, 1).await;
        ok(&app, "POST", &format!("/_matrix/client/v3/join/{room}"), alice, json!({})).await;
        let (status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let timeline = body["rooms"]["join"][&room]["timeline"]["events"].as_array().unwrap().clone();
        let ids: Vec<&Value> = timeline.iter().map(|e| &e["event_id"]).collect();
        for message in &sent {
            assert!(ids.contains(&&message["event_id"]), "{message} missing: {body}");
        }
        let last = timeline.last().unwrap();
        assert_eq!(
            (&last["type"], &last["state_key"]),
            (&json!("m.room.member"), &json!(s[0].user_id)),
            "{body}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// An invite from an ignored user is hidden; when the user stops ignoring
/// them while a long-poll waits, the woken answer shows the invite.
#[tokio::test]
async fn an_invite_shows_when_its_sender_is_no_longer_ignored() {
    for fresh in backends().await {
        let (state, app, s, dir) = server_with(&fresh.url, fresh.label, &["igalice", "igcarol"]).await;
        let (alice, carol) = (&s[0].access_token, &s[1].access_token);
        let (a, c) = (s[0].user_id.as_str(), s[1].user_id.as_str());
        let ignore = format!("/_matrix/client/v3/user/{a}/account_data/m.ignored_user_list");
        ok(&app, "PUT", &ignore, alice, json!({ "ignored_users": { c: {} } })).await;
        let (_, first) = call(&app, "GET", "/_matrix/client/v3/sync", alice, None).await;
        let room = create_room(&app, carol, "private_chat").await;
        ok(&app, "POST", &format!("/_matrix/client/v3/rooms/{room}/invite"), carol, json!({ "user_id": a }))
            .await;
        let poll = long_poll(&app, alice, first["next_batch"].as_str().unwrap(), 20_000);
        until_waiting(&state, 1).await;
        ok(&app, "PUT", &ignore, alice, json!({ "ignored_users": {} })).await;
        let (status, body) = poll.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body["rooms"]["invite"][&room].is_object(), "the invite shows: {body}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// A long-poll woken by typing alone (parked first, so the woken pass is the
/// one answering) carries the counts as they stand: those of the room's last
/// entry while nothing moved in the room, recounted once something did
/// (here a message seen only through an initial sync, which keeps no entry).
#[tokio::test]
async fn a_typing_wake_answers_the_counts_as_they_stand() {
    for fresh in backends().await {
        let (state, app, s, dir) = server_with(&fresh.url, fresh.label, &["qtalice", "qtbob"]).await;
        let (alice, bob) = (&s[0].access_token, &s[1].access_token);
        let room = create_room(&app, alice, "public_chat").await;
        ok(&app, "POST", &format!("/_matrix/client/v3/join/{room}"), bob, json!({})).await;
        let (_, first) = call(&app, "GET", "/_matrix/client/v3/sync", alice, None).await;
        let send = |txn: &str| format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
        let text = |body: &str| json!({ "msgtype": "m.text", "body": body });
        ok(&app, "PUT", &send("q1"), bob, text("one")).await;
        ok(&app, "PUT", &send("q2"), bob, text("two")).await;
        let since = first["next_batch"].as_str().unwrap();
        let (_, body) =
            call(&app, "GET", &format!("/_matrix/client/v3/sync?since={since}"), alice, None).await;
        let unread =
            |body: &Value| body["rooms"]["join"][&room]["unread_notifications"]["notification_count"].clone();
        assert_eq!(unread(&body), 2, "{body}");
        let typing_path = format!("/_matrix/client/v3/rooms/{room}/typing/{}", s[1].user_id);
        let typing_wake = async |since: &str, typing: bool| {
            let poll = long_poll(&app, alice, since, 20_000);
            until_waiting(&state, 1).await;
            ok(&app, "PUT", &typing_path, bob, json!({ "typing": typing, "timeout": 30000 })).await;
            let (status, body) = poll.await.unwrap();
            assert_eq!(status, 200, "{body}");
            let joined = &body["rooms"]["join"][&room];
            let users = if typing { json!([s[1].user_id]) } else { json!([]) };
            assert_eq!(joined["ephemeral"]["events"][0]["content"]["user_ids"], users, "{body}");
            assert_eq!(joined["timeline"]["events"], json!([]), "{body}");
            body
        };

        // Nothing moved: the counts of the last entry.
        let body = typing_wake(body["next_batch"].as_str().unwrap(), true).await;
        assert_eq!(unread(&body), 2, "{body}");
        let body = typing_wake(body["next_batch"].as_str().unwrap(), false).await;
        assert_eq!(unread(&body), 2, "{body}");

        // A message, then an initial sync past it: recounted.
        ok(&app, "PUT", &send("q3"), bob, text("three")).await;
        let (_, initial) = call(&app, "GET", "/_matrix/client/v3/sync", alice, None).await;
        assert_eq!(unread(&initial), 3, "{initial}");
        let body = typing_wake(initial["next_batch"].as_str().unwrap(), true).await;
        assert_eq!(unread(&body), 3, "{body}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
