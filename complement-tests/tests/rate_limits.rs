//! Rate limits, black-box, with limits switched on (the harness switches them
//! off by default): the failed-password counter per account (logins and UIA
//! password stages alike, checked before any hashing), X-Forwarded-For only
//! from trusted proxies, and the per-user limits on sends, joins, invites and
//! presence.

use std::time::{Duration, Instant};

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use serde_json::{Value, json};

backend_tests!(
    failed_logins_lock_the_account_until_the_window_passes,
    a_flood_of_wrong_passwords_is_cut_off_before_hashing,
    uia_password_stages_share_the_failed_attempt_counter,
    forwarded_for_is_ignored_from_untrusted_peers,
    forwarded_for_is_honoured_from_trusted_proxies,
    sends_are_limited_per_user,
    joins_invites_and_presence_are_limited_per_user,
);

/// Limits on, address and registration limits out of the way, plus `extra`.
fn limits(extra: &str) -> Options {
    let config = format!(
        "[rate_limits]\nenabled = true\nregister_burst = 1000\nregister_per_second = 1000\n\
         login_burst = 1000\nlogin_per_second = 1000\n{extra}"
    );
    Options::default().config(&config).env("SEQLINE_RATE_LIMITS", "on")
}

fn password_login(user: &str, password: &str) -> Value {
    json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": user }, "password": password })
}

/// Asserts a 429 M_LIMIT_EXCEEDED and returns its `retry_after_ms`.
#[track_caller]
fn assert_limited(response: &(u16, Value), max_ms: u64, what: &str) -> u64 {
    assert_error(response, 429, "M_LIMIT_EXCEEDED", what);
    let retry = response.1["retry_after_ms"].as_u64().unwrap_or_else(|| panic!("{what}: {}", response.1));
    assert!(retry > 0 && retry <= max_ms, "{what}: retry_after_ms {retry}");
    retry
}

/// Retries a login until it stops being rate limited, waiting what the server
/// says between tries; returns the first answer that is not a 429.
async fn login_when_allowed(server: &Server, user: &str, password: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = server.post(&format!("{V3}/login"), None, password_login(user, password)).await;
        if response.0 != 429 {
            return response;
        }
        assert!(Instant::now() < deadline, "still limited after 30 s: {}", response.1);
        let wait = response.1["retry_after_ms"].as_u64().unwrap_or(100).min(1000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

async fn failed_logins_lock_the_account_until_the_window_passes(backend: Backend) {
    let server =
        Server::start_with(&backend, limits("failed_login_burst = 3\nfailed_login_per_second = 0.5\n")).await;
    server.register("alice", "right").await;
    server.register("bob", "bobpw").await;
    for i in 0..3 {
        let response = server.post(&format!("{V3}/login"), None, password_login("alice", "wrong")).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("wrong password {i}"));
    }
    // The counter is per account, whoever the name is spelled: even the right password waits.
    let response =
        server.post(&format!("{V3}/login"), None, password_login("@Alice:test.local", "right")).await;
    assert_limited(&response, 2000, "right password after three wrong ones");
    let raw = server
        .http()
        .post(server.url(&format!("{V3}/login")))
        .json(&password_login("alice", "right"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 429);
    let header = raw.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap();
    assert!((1..=2).contains(&header), "Retry-After {header}");

    // Another account is not affected.
    let bob = server.login("bob", "bobpw").await;
    assert_eq!(bob.user_id, "@bob:test.local");

    // Once the window has passed, the right password works again.
    let (status, body) = login_when_allowed(&server, "alice", "right").await;
    assert_eq!((status, body["user_id"].as_str()), (200, Some("@alice:test.local")), "{body}");
}

async fn a_flood_of_wrong_passwords_is_cut_off_before_hashing(backend: Backend) {
    let server =
        Server::start_with(&backend, limits("failed_login_burst = 3\nfailed_login_per_second = 0.02\n"))
            .await;
    server.register("alice", "right").await;
    server.register("bob", "bobpw").await;
    let flood: Vec<_> = (0..24)
        .map(|_| {
            let http = server.http().clone();
            let url = server.url(&format!("{V3}/login"));
            tokio::spawn(async move {
                let response = http.post(url).json(&password_login("alice", "wrong")).send().await.unwrap();
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                (status, body)
            })
        })
        .collect();
    // Another account logs in while the flood is under way.
    let bob = server.login("bob", "bobpw").await;
    assert_eq!(bob.user_id, "@bob:test.local");
    let mut forbidden = 0;
    let mut limited = 0;
    for task in flood {
        let (status, body) = task.await.unwrap();
        match (status, body["errcode"].as_str()) {
            (403, Some("M_FORBIDDEN")) => forbidden += 1,
            (429, Some("M_LIMIT_EXCEEDED")) => limited += 1,
            other => panic!("unexpected answer to a wrong password: {other:?} {body}"),
        }
    }
    // Only as many passwords were checked as the counter allows; the rest were refused unhashed.
    assert_eq!((forbidden, limited), (3, 21));
    let response = server.post(&format!("{V3}/login"), None, password_login("alice", "right")).await;
    assert_limited(&response, 50_000, "right password after the flood");
    // Bob is still fine.
    server.login("bob", "bobpw").await;
}

async fn uia_password_stages_share_the_failed_attempt_counter(backend: Backend) {
    let server =
        Server::start_with(&backend, limits("failed_login_burst = 3\nfailed_login_per_second = 0.5\n")).await;
    let alice = server.register("alice", "right").await;
    let other = server.login("alice", "right").await;
    let change = |password: &str, new: &str| {
        json!({
            "new_password": new,
            "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": password },
        })
    };
    for i in 0..2 {
        let response = server
            .post(&format!("{V3}/account/password"), Some(&alice.token), change("wrong", "stolen"))
            .await;
        assert_error(&response, 401, "M_FORBIDDEN", &format!("UIA with a wrong password {i}"));
    }
    let response = server.post(&format!("{V3}/login"), None, password_login("alice", "wrong")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "third wrong password, by login");
    // Now every password check of the account waits: UIA stages and logins alike.
    let response =
        server.post(&format!("{V3}/account/password"), Some(&alice.token), change("right", "stolen")).await;
    assert_limited(&response, 2000, "password change with the right password");
    let auth = json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "right" });
    let response = server
        .post(
            &format!("{V3}/delete_devices"),
            Some(&alice.token),
            json!({ "devices": [other.device_id], "auth": auth }),
        )
        .await;
    assert_limited(&response, 2000, "delete_devices with the right password");
    // Nothing changed: the other device still works, the old password is still the password.
    let (status, body) = server.get(&format!("{V3}/account/whoami"), Some(&other.token)).await;
    assert_eq!((status, body["device_id"].as_str()), (200, Some(other.device_id.as_str())), "{body}");
    let (status, body) = login_when_allowed(&server, "alice", "right").await;
    assert_eq!(status, 200, "{body}");
    let response = server.post(&format!("{V3}/login"), None, password_login("alice", "stolen")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "the refused new password");
}

/// A login for an unknown user (no hashing, distinct failed-attempt counters),
/// sent with an X-Forwarded-For header.
async fn forwarded_login(server: &Server, n: u32, forwarded: &str) -> (u16, Value) {
    let response = server
        .http()
        .post(server.url(&format!("{V3}/login")))
        .header("X-Forwarded-For", forwarded)
        .json(&password_login(&format!("nobody{n}"), "pw"))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

const ADDRESS_LIMIT: &str = "[rate_limits]\nenabled = true\nlogin_burst = 2\nlogin_per_second = 0.01\n";

async fn forwarded_for_is_ignored_from_untrusted_peers(backend: Backend) {
    let options = Options::default().config(ADDRESS_LIMIT).env("SEQLINE_RATE_LIMITS", "on");
    let server = Server::start_with(&backend, options).await;
    assert_error(&forwarded_login(&server, 1, "10.0.0.1").await, 403, "M_FORBIDDEN", "first");
    assert_error(&forwarded_login(&server, 2, "10.0.0.2").await, 403, "M_FORBIDDEN", "second");
    // A fresh forwarded address from an untrusted peer is still the peer's bucket.
    assert_limited(&forwarded_login(&server, 3, "10.0.0.3").await, 200_000, "third, forwarded 10.0.0.3");
}

async fn forwarded_for_is_honoured_from_trusted_proxies(backend: Backend) {
    let options = Options::default()
        .config(ADDRESS_LIMIT)
        .env("SEQLINE_RATE_LIMITS", "on")
        .env("SEQLINE_TRUSTED_PROXIES", "192.0.2.7, 127.0.0.0/8,::1");
    let server = Server::start_with(&backend, options).await;
    assert_error(&forwarded_login(&server, 1, "10.0.0.1").await, 403, "M_FORBIDDEN", "10.0.0.1 first");
    // The right-most address that is not a trusted proxy is the client.
    assert_error(
        &forwarded_login(&server, 2, "10.0.0.1, 127.0.0.1").await,
        403,
        "M_FORBIDDEN",
        "10.0.0.1 second",
    );
    assert_limited(&forwarded_login(&server, 3, "10.0.0.1").await, 200_000, "10.0.0.1 third");
    // A client cannot pick its bucket by prepending an address.
    assert_limited(&forwarded_login(&server, 4, "10.9.9.9, 10.0.0.1").await, 200_000, "spoofed left-most");
    // Another forwarded client has its own bucket.
    assert_error(&forwarded_login(&server, 5, "10.0.0.2").await, 403, "M_FORBIDDEN", "10.0.0.2 first");
    assert_error(&forwarded_login(&server, 6, "10.0.0.2").await, 403, "M_FORBIDDEN", "10.0.0.2 second");
    // Garbage in the header is not a client address: the proxy's own bucket applies.
    assert_error(&forwarded_login(&server, 7, "not-an-ip").await, 403, "M_FORBIDDEN", "garbage first");
}

async fn sends_are_limited_per_user(backend: Backend) {
    let server = Server::start_with(&backend, limits("message_burst = 3\nmessage_per_second = 0.01\n")).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    // Bob creates the room (a createRoom counts as one of his sends).
    let (status, body) =
        server.post(&format!("{V3}/createRoom"), Some(&bob.token), json!({ "preset": "public_chat" })).await;
    assert_eq!(status, 200, "{body}");
    let room = body["room_id"].as_str().unwrap().to_owned();
    let (status, body) = server.post(&room_path(&room, "/join"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let mut sent = Vec::new();
    for i in 0..3 {
        let response = server
            .put(
                &room_path(&room, &format!("/send/m.room.message/a{i}")),
                Some(&alice.token),
                text(&format!("a{i}")),
            )
            .await;
        assert_eq!(response.0, 200, "{}", response.1);
        sent.push(event_id_of(&response.1));
    }
    let response =
        server.put(&room_path(&room, "/send/m.room.message/a3"), Some(&alice.token), text("a3")).await;
    assert_limited(&response, 200_000, "alice's fourth message");
    // State events come out of the same allowance.
    let response = server
        .put(&room_path(&room, "/state/m.room.topic/"), Some(&alice.token), json!({ "topic": "flood" }))
        .await;
    assert_limited(&response, 200_000, "alice's topic");
    let response =
        server.put(&room_path(&room, "/send/m.room.message/b0"), Some(&bob.token), text("b0")).await;
    assert_eq!(response.0, 200, "bob is not limited: {}", response.1);
    sent.push(event_id_of(&response.1));

    let (status, page) = server.get(&room_path(&room, "/messages?dir=b&limit=10"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{page}");
    let messages: Vec<(String, String)> = page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.room.message" || e["type"] == "m.room.topic")
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_owned(),
                e["content"]["body"].as_str().unwrap_or("").to_owned(),
            )
        })
        .rev()
        .collect();
    let expected: Vec<(String, String)> =
        sent.into_iter().zip(["a0", "a1", "a2", "b0"]).map(|(id, b)| (id, b.to_owned())).collect();
    assert_eq!(messages, expected, "the limited sends stored nothing");
}

async fn joins_invites_and_presence_are_limited_per_user(backend: Backend) {
    let extra = "join_burst = 2\njoin_per_second = 0.01\ninvite_room_burst = 2\ninvite_room_per_second = 0.01\n\
                 invite_user_burst = 5\ninvite_user_per_second = 0.01\npresence_burst = 1\npresence_per_second = 0.01\n";
    let server = Server::start_with(&backend, limits(extra)).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let mut rooms = Vec::new();
    for _ in 0..3 {
        let (status, body) = server
            .post(&format!("{V3}/createRoom"), Some(&alice.token), json!({ "preset": "public_chat" }))
            .await;
        assert_eq!(status, 200, "{body}");
        rooms.push(body["room_id"].as_str().unwrap().to_owned());
    }
    // Joins: two, then limited; the third room does not list bob.
    for room in &rooms[..2] {
        let (status, body) = server.post(&room_path(room, "/join"), Some(&bob.token), json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    let response = server.post(&format!("{V3}/join/{}", enc(&rooms[2])), Some(&bob.token), json!({})).await;
    assert_limited(&response, 200_000, "bob's third join");
    let (status, body) = server.get(&room_path(&rooms[2], "/joined_members"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["joined"].get(server.user_id("bob")).is_none(), "{body}");

    // Invites: two into one room, then that room is limited; another room is not.
    for name in ["c1", "c2", "c3"] {
        server.register(name, "pw").await;
    }
    for name in ["c1", "c2"] {
        let response = server
            .post(
                &room_path(&rooms[2], "/invite"),
                Some(&alice.token),
                json!({ "user_id": server.user_id(name) }),
            )
            .await;
        assert_eq!(response.0, 200, "{}", response.1);
    }
    let response = server
        .post(
            &room_path(&rooms[2], "/invite"),
            Some(&alice.token),
            json!({ "user_id": server.user_id("c3") }),
        )
        .await;
    assert_limited(&response, 200_000, "third invite into one room");
    let response = server
        .post(
            &room_path(&rooms[1], "/invite"),
            Some(&alice.token),
            json!({ "user_id": server.user_id("c3") }),
        )
        .await;
    assert_eq!(response.0, 200, "another room: {}", response.1);

    // Invites received: dave may be invited five times (through createRoom too), then he is left alone.
    server.register("dave", "pw").await;
    let dave = server.user_id("dave");
    for i in 0..5 {
        let (status, body) = server
            .post(
                &format!("{V3}/createRoom"),
                Some(&alice.token),
                json!({ "name": format!("r{i}"), "invite": [dave] }),
            )
            .await;
        assert_eq!(status, 200, "invite {i}: {body}");
    }
    let (_, before) = server.get(&format!("{V3}/joined_rooms"), Some(&alice.token)).await;
    let response = server
        .post(&format!("{V3}/createRoom"), Some(&alice.token), json!({ "name": "r5", "invite": [dave] }))
        .await;
    assert_limited(&response, 200_000, "dave's sixth invite, by createRoom");
    let response =
        server.post(&room_path(&rooms[0], "/invite"), Some(&alice.token), json!({ "user_id": dave })).await;
    assert_limited(&response, 200_000, "dave's sixth invite, by /invite");
    let (_, after) = server.get(&format!("{V3}/joined_rooms"), Some(&alice.token)).await;
    assert_eq!(before, after, "the limited createRoom created nothing");

    // Presence: one update, then limited; another user is not.
    let path = |user: &str| format!("{V3}/presence/{}/status", enc(&server.user_id(user)));
    let response = server.put(&path("alice"), Some(&alice.token), json!({ "presence": "online" })).await;
    assert_eq!(response.0, 200, "{}", response.1);
    let response = server.put(&path("alice"), Some(&alice.token), json!({ "presence": "unavailable" })).await;
    assert_limited(&response, 200_000, "alice's second presence update");
    let (status, body) = server.get(&path("alice"), Some(&bob.token)).await;
    assert_eq!((status, body["presence"].as_str()), (200, Some("online")), "{body}");
    let response = server.put(&path("bob"), Some(&bob.token), json!({ "presence": "online" })).await;
    assert_eq!(response.0, 200, "{}", response.1);
}
