//! What clients call beside rooms: profiles, push rules, E2EE key plumbing,
//! to-device messages, and the start-up probes they read as "none yet".

use complement_tests::backend_tests;
use complement_tests::e2ee::{Key, device_keys, signed_one_time_key};
use complement_tests::harness::{Backend, Options, Server};
use reqwest::Method;
use serde_json::{Value, json};

backend_tests!(
    profile_changes_reach_member_events,
    push_rules_start_from_the_defaults_and_can_be_edited,
    keys_upload_query_claim_and_to_device,
    startup_probes_answer_as_clients_expect,
    unread_counts_follow_push_rules_and_drop_on_receipt,
    unread_counts_start_at_the_join,
    user_directory_lists_each_user_once_by_their_global_name,
    pushes_reach_the_gateway_only_for_holders,
    presence_and_user_directory,
    presence_can_be_switched_off,
    turn_credentials_are_time_limited,
);

async fn presence_can_be_switched_off(backend: Backend) {
    let server = Server::start_with(&backend, Options::default().env("SEQLINE_PRESENCE", "off")).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (_, created) = server.post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    server
        .post(
            &format!("/_matrix/client/v3/rooms/{room}/invite"),
            Some(&alice.token),
            json!({ "user_id": bob.user_id }),
        )
        .await;
    server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    let (_, first) = server.get("/_matrix/client/v3/sync", Some(&alice.token)).await;
    assert_eq!(first["presence"]["events"], json!([]), "{first}");
    let since = first["next_batch"].as_str().unwrap().to_owned();
    let (status, _) = server
        .put(
            &format!("/_matrix/client/v3/presence/{}/status", bob.user_id),
            Some(&bob.token),
            json!({ "presence": "online", "status_msg": "hiking" }),
        )
        .await;
    assert_eq!(status, 200, "setting presence is accepted and ignored");
    let (_, got) =
        server.get(&format!("/_matrix/client/v3/presence/{}/status", bob.user_id), Some(&alice.token)).await;
    assert_eq!(got, json!({ "presence": "offline" }));
    // Nothing wakes alice: her long-poll runs to its timeout, with no presence.
    let (_, sync) =
        server.get(&format!("/_matrix/client/v3/sync?since={since}&timeout=300"), Some(&alice.token)).await;
    assert_eq!(sync["presence"]["events"], json!([]), "{sync}");
    assert_eq!(sync["rooms"]["join"], json!({}), "{sync}");
}

async fn turn_credentials_are_time_limited(backend: Backend) {
    let config = r#"
[voip]
turn_uris = ["turn:turn.test.local:3478?transport=udp", "turns:turn.test.local:5349"]
turn_shared_secret = "north-wind"
turn_user_lifetime_secs = 600
"#;
    let server = Server::start_with(&backend, Options::default().config(config)).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) = server.get("/_matrix/client/v3/voip/turnServer", Some(&alice.token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["uris"],
        json!(["turn:turn.test.local:3478?transport=udp", "turns:turn.test.local:5349"])
    );
    assert_eq!(body["ttl"], 600);
    let username = body["username"].as_str().unwrap();
    let (expiry, user) = username.split_once(':').unwrap();
    assert_eq!(user, alice.user_id);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let expiry: u64 = expiry.parse().unwrap();
    assert!((now + 590..=now + 610).contains(&expiry), "expiry {expiry}, now {now}");
    // base64 of a 20-byte HMAC-SHA1.
    assert_eq!(body["password"].as_str().unwrap().len(), 28, "{body}");
    let (status, _) = server.get("/_matrix/client/v3/voip/turnServer", None).await;
    assert_eq!(status, 401);
}

async fn profile_changes_reach_member_events(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, body) = server.get("/_matrix/client/v3/profile/@alice:test.local", None).await;
    assert_eq!(body, json!({ "displayname": "alice" }), "the display name starts as the localpart");
    let (_, created) = server.post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();

    let (status, _) = server
        .put(
            "/_matrix/client/v3/profile/@alice:test.local/displayname",
            Some(&alice.token),
            json!({ "displayname": "Alice A." }),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = server
        .put(
            "/_matrix/client/v3/profile/@alice:test.local/avatar_url",
            Some(&alice.token),
            json!({ "avatar_url": "mxc://test.local/abc" }),
        )
        .await;
    assert_eq!(status, 200);
    let (_, body) = server.get("/_matrix/client/v3/profile/@alice:test.local/displayname", None).await;
    assert_eq!(body, json!({ "displayname": "Alice A." }));
    let member = format!("/_matrix/client/v3/rooms/{room}/state/m.room.member/@alice:test.local");
    let (_, content) = server.get(&member, Some(&alice.token)).await;
    assert_eq!(
        content,
        json!({ "membership": "join", "displayname": "Alice A.", "avatar_url": "mxc://test.local/abc" })
    );

    let (status, body) = server
        .put(
            "/_matrix/client/v3/profile/@alice:test.local/avatar_url",
            Some(&alice.token),
            json!({ "avatar_url": "not a uri" }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
    let bob = server.register("bob", "pw").await;
    let (status, body) = server
        .put(
            "/_matrix/client/v3/profile/@alice:test.local/displayname",
            Some(&bob.token),
            json!({ "displayname": "Mallory" }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")));
    let (status, body) = server.get("/_matrix/client/v3/profile/@nobody:test.local", None).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")));
}

async fn push_rules_start_from_the_defaults_and_can_be_edited(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let t = Some(alice.token.as_str());
    for path in
        ["/_matrix/client/v3/pushrules/", "/_matrix/client/v3/pushrules", "/_matrix/client/r0/pushrules/"]
    {
        let (status, body) = server.get(path, t).await;
        assert_eq!(status, 200, "{path}: {body}");
        let global = &body["global"];
        for kind in ["override", "content", "room", "sender", "underride"] {
            assert!(global[kind].is_array(), "{path}: {kind} missing in {global}");
        }
        let ids: Vec<&str> =
            global["override"].as_array().unwrap().iter().map(|r| r["rule_id"].as_str().unwrap()).collect();
        let at =
            |id: &str| ids.iter().position(|i| *i == id).unwrap_or_else(|| panic!("{id} missing: {ids:?}"));
        assert_eq!(at(".m.rule.master"), 0);
        assert_eq!(at(".m.rule.contains_display_name"), at(".m.rule.is_user_mention") + 1, "{ids:?}");
        assert_eq!(at(".m.rule.roomnotif"), at(".m.rule.is_room_mention") + 1, "{ids:?}");
        assert_eq!(
            global["content"],
            json!([{
                "rule_id": ".m.rule.contains_user_name", "default": true, "enabled": true, "pattern": "alice",
                "actions": ["notify", { "set_tweak": "sound", "value": "default" }, { "set_tweak": "highlight" }],
            }]),
            "{path}"
        );
        let under: Vec<&str> =
            global["underride"].as_array().unwrap().iter().map(|r| r["rule_id"].as_str().unwrap()).collect();
        assert!(
            under.contains(&".m.rule.room_one_to_one") && under.contains(&".m.rule.encrypted"),
            "{under:?}"
        );
    }
    let master = "/_matrix/client/v3/pushrules/global/override/.m.rule.master";
    let (_, rule) = server.get(master, t).await;
    assert_eq!(rule["enabled"], false);
    let (status, _) = server.put(&format!("{master}/enabled"), t, json!({ "enabled": true })).await;
    assert_eq!(status, 200);
    let (_, enabled) = server.get(&format!("{master}/enabled"), t).await;
    assert_eq!(enabled, json!({ "enabled": true }));

    let rule = "/_matrix/client/v3/pushrules/global/content/cake";
    let (status, _) = server.put(rule, t, json!({ "pattern": "cake", "actions": ["notify"] })).await;
    assert_eq!(status, 200);
    let (_, got) = server.get(rule, t).await;
    assert_eq!((got["pattern"].as_str(), got["actions"].clone()), (Some("cake"), json!(["notify"])));
    let (status, _) = server.put(&format!("{rule}/actions"), t, json!({ "actions": [] })).await;
    assert_eq!(status, 200);
    let (_, actions) = server.get(&format!("{rule}/actions"), t).await;
    assert_eq!(actions, json!({ "actions": [] }));
    let (status, _) = server.request(Method::DELETE, rule, t, None).await;
    assert_eq!(status, 200);
    let (status, body) = server.get(rule, t).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")));
    let (status, _) = server.request(Method::DELETE, master, t, None).await;
    assert_eq!(status, 400, "server-default rules cannot be deleted");
    // The rules reach the client as account data too.
    let (_, sync) = server.get("/_matrix/client/v3/sync", t).await;
    let types: Vec<&str> = sync["account_data"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"m.push_rules"), "{types:?}");
}

async fn keys_upload_query_claim_and_to_device(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (a, d) = (alice.user_id.as_str(), alice.device_id.as_str());
    let key = Key::new("alice-device");
    let mut fallback = json!({ "key": "fb", "fallback": true });
    key.sign(&mut fallback, a, &format!("ed25519:{d}"));
    let (status, body) = server
        .post(
            "/_matrix/client/v3/keys/upload",
            Some(&alice.token),
            json!({
                "device_keys": device_keys(a, d, &key),
                "one_time_keys": {
                    "signed_curve25519:AAAA": signed_one_time_key(a, d, &key, "otk1"),
                    "signed_curve25519:AAAB": signed_one_time_key(a, d, &key, "otk2"),
                },
                "fallback_keys": { "signed_curve25519:FFFF": fallback },
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["one_time_key_counts"]["signed_curve25519"], 2);
    // Keys for another device are refused.
    let (status, _) = server
        .post(
            "/_matrix/client/v3/keys/upload",
            Some(&alice.token),
            json!({ "device_keys": device_keys(a, "OTHER", &key) }),
        )
        .await;
    assert_eq!(status, 400);

    let (_, q) = server
        .post(
            "/_matrix/client/v3/keys/query",
            Some(&bob.token),
            json!({ "device_keys": { alice.user_id.clone(): [] } }),
        )
        .await;
    let keys = &q["device_keys"][&alice.user_id][&alice.device_id];
    assert_eq!(keys["keys"][format!("ed25519:{d}")], json!(key.public), "{q}");

    let claim = json!({ "one_time_keys": { alice.user_id.clone(): { alice.device_id.clone(): "signed_curve25519" } } });
    let mut claimed = Vec::new();
    for _ in 0..3 {
        let (_, c) = server.post("/_matrix/client/v3/keys/claim", Some(&bob.token), claim.clone()).await;
        let got = c["one_time_keys"][&alice.user_id][&alice.device_id].as_object().unwrap().clone();
        claimed.push(got.keys().next().unwrap().clone());
    }
    // Two one-time keys, each once, then the fallback key.
    assert_eq!(claimed, vec!["signed_curve25519:AAAA", "signed_curve25519:AAAB", "signed_curve25519:FFFF"]);

    // To-device: idempotent per txn id, delivered once through /sync.
    let (_, first) = server.get("/_matrix/client/v3/sync", Some(&alice.token)).await;
    let since = first["next_batch"].as_str().unwrap().to_owned();
    assert_eq!(first["device_one_time_keys_count"]["signed_curve25519"], 0);
    assert_eq!(first["device_unused_fallback_key_types"], json!([]), "the fallback key was used");
    let msg =
        json!({ "messages": { alice.user_id.clone(): { alice.device_id.clone(): { "hello": "there" } } } });
    for _ in 0..2 {
        let (status, _) =
            server.put("/_matrix/client/v3/sendToDevice/m.test/txn1", Some(&bob.token), msg.clone()).await;
        assert_eq!(status, 200);
    }
    let (_, s) =
        server.get(&format!("/_matrix/client/v3/sync?since={since}&timeout=5000"), Some(&alice.token)).await;
    assert_eq!(
        s["to_device"]["events"],
        json!([{ "sender": bob.user_id, "type": "m.test", "content": { "hello": "there" } }])
    );
    let next = s["next_batch"].as_str().unwrap();
    let (_, s) = server.get(&format!("/_matrix/client/v3/sync?since={next}"), Some(&alice.token)).await;
    assert_eq!(s["to_device"]["events"], json!([]), "delivered once");
}

async fn startup_probes_answer_as_clients_expect(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let t = Some(alice.token.as_str());
    let (status, body) = server.get("/_matrix/client/v3/room_keys/version", t).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
    let (status, body) = server.get("/_matrix/client/v3/voip/turnServer", t).await;
    assert_eq!((status, body), (200, json!({})));
    let (status, body) = server.get("/_matrix/client/v3/thirdparty/protocols", t).await;
    assert_eq!((status, body), (200, json!({})));
    let (status, body) = server.get("/_matrix/client/v3/pushers", t).await;
    assert_eq!((status, body), (200, json!({ "pushers": [] })));
    let (status, body) = server.get("/_matrix/client/unstable/org.matrix.msc4143/rtc/transports", t).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_UNRECOGNIZED")));
}

async fn unread_counts_follow_push_rules_and_drop_on_receipt(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (_, created) = server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": "public_chat" }))
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, _) =
        server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let server = &server;
    let send = |txn: &str, content: Value| {
        let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
        let token = alice.token.clone();
        async move { server.put(&path, Some(&token), content).await.1["event_id"].as_str().unwrap().to_owned() }
    };
    send("1", json!({ "msgtype": "m.text", "body": "one" })).await;
    send("2", json!({ "msgtype": "m.text", "body": "hey bob", "m.mentions": { "user_ids": [bob.user_id] } }))
        .await;
    // The legacy rules (deprecated in v1.7, still in the defaults) match only
    // events without m.mentions: bob's display name, and @room from a sender
    // whose power level allows it.
    send("4", json!({ "msgtype": "m.text", "body": "lunch, Bob?" })).await;
    send("5", json!({ "msgtype": "m.text", "body": "@room meeting" })).await;
    send("6", json!({ "msgtype": "m.text", "body": "bob again", "m.mentions": {} })).await;
    let last = send("3", json!({ "msgtype": "m.text", "body": "three" })).await;
    // Bob's own message does not count for him.
    let (status, _) = server
        .put(
            &format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/b1"),
            Some(&bob.token),
            json!({ "msgtype": "m.text", "body": "mine" }),
        )
        .await;
    assert_eq!(status, 200);

    let (_, sync) = server.get("/_matrix/client/v3/sync", Some(&bob.token)).await;
    let counts = &sync["rooms"]["join"][&room]["unread_notifications"];
    assert_eq!(counts, &json!({ "notification_count": 6, "highlight_count": 3 }), "{sync}");

    let (_, list) = server.get("/_matrix/client/v3/notifications", Some(&bob.token)).await;
    let bodies: Vec<&str> = list["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event"]["content"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        vec!["three", "bob again", "@room meeting", "lunch, Bob?", "hey bob", "one"],
        "{list}"
    );
    let (_, only) = server.get("/_matrix/client/v3/notifications?only=highlight", Some(&bob.token)).await;
    let highlighted: Vec<&str> = only["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event"]["content"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(highlighted, vec!["@room meeting", "lunch, Bob?", "hey bob"], "{only}");

    let since = sync["next_batch"].as_str().unwrap().to_owned();
    let (status, _) = server
        .post(&format!("/_matrix/client/v3/rooms/{room}/receipt/m.read/{last}"), Some(&bob.token), json!({}))
        .await;
    assert_eq!(status, 200);
    let (_, sync) =
        server.get(&format!("/_matrix/client/v3/sync?since={since}&timeout=5000"), Some(&bob.token)).await;
    let counts = &sync["rooms"]["join"][&room]["unread_notifications"];
    assert_eq!(counts, &json!({ "notification_count": 0, "highlight_count": 0 }), "{sync}");
    let (_, list) = server.get("/_matrix/client/v3/notifications", Some(&bob.token)).await;
    assert!(list["notifications"].as_array().unwrap().iter().all(|n| n["read"] == true), "{list}");
}

/// What was sent before a user joined never notified them: with no read
/// receipt, their counts start at their join, though history visibility
/// lets them read further back. Others' joins count for nothing.
async fn unread_counts_start_at_the_join(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let carol = server.register("carol", "pw").await;
    let dave = server.register("dave", "pw").await;
    let (_, created) = server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": "public_chat" }))
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let send = |txn: &'static str, body: &'static str| {
        let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
        let (server, token) = (&server, alice.token.clone());
        async move {
            let (status, sent) =
                server.put(&path, Some(&token), json!({ "msgtype": "m.text", "body": body })).await;
            assert_eq!(status, 200, "{sent}");
        }
    };
    send("1", "before carol").await;
    send("2", "carol, are you there?").await;
    let join = |user: &complement_tests::harness::User| {
        let (server, path, token) = (&server, format!("/_matrix/client/v3/join/{room}"), user.token.clone());
        async move { assert_eq!(server.post(&path, Some(&token), json!({})).await.0, 200) }
    };
    join(&carol).await;
    join(&dave).await;
    let counts = |sync: &Value| sync["rooms"]["join"][&room]["unread_notifications"].clone();
    let (_, sync) = server.get("/_matrix/client/v3/sync", Some(&carol.token)).await;
    // She can read what came before her (shared history), but it is not unread.
    let bodies: Vec<&str> = sync["rooms"]["join"][&room]["timeline"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["content"]["body"].as_str())
        .collect();
    assert_eq!(bodies, vec!["before carol", "carol, are you there?"], "{sync}");
    assert_eq!(counts(&sync), json!({ "notification_count": 0, "highlight_count": 0 }), "{sync}");
    send("3", "welcome carol").await;
    let (_, sync) = server.get("/_matrix/client/v3/sync", Some(&dave.token)).await;
    assert_eq!(counts(&sync), json!({ "notification_count": 1, "highlight_count": 0 }), "{sync}");
    let (_, sync) = server.get("/_matrix/client/v3/sync", Some(&carol.token)).await;
    assert_eq!(counts(&sync), json!({ "notification_count": 1, "highlight_count": 1 }), "{sync}");
}

/// A user who shares several rooms with the searcher, one of them public,
/// and who took another name in one room, is found once, by the name of
/// their profile (TestRoomSpecificUsernameAtJoin/Change).
async fn user_directory_lists_each_user_once_by_their_global_name(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let path = format!("/_matrix/client/v3/profile/{}/displayname", bob.user_id);
    assert_eq!(server.put(&path, Some(&bob.token), json!({ "displayname": "Bobby" })).await.0, 200);
    let mut rooms = Vec::new();
    for preset in ["public_chat", "private_chat", "public_chat"] {
        let (_, created) = server
            .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": preset }))
            .await;
        let room = created["room_id"].as_str().unwrap().to_owned();
        let (status, _) = server
            .post(
                &format!("/_matrix/client/v3/rooms/{room}/invite"),
                Some(&alice.token),
                json!({ "user_id": bob.user_id }),
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(
            server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await.0,
            200
        );
        rooms.push(room);
    }
    let member = format!("/_matrix/client/v3/rooms/{}/state/m.room.member/{}", rooms[1], bob.user_id);
    let (status, body) = server
        .put(
            &member,
            Some(&bob.token),
            json!({ "membership": "join", "displayname": "Bob of the back room" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for term in ["bob", "Bobby"] {
        let (status, found) = server
            .post(
                "/_matrix/client/v3/user_directory/search",
                Some(&alice.token),
                json!({ "search_term": term }),
            )
            .await;
        assert_eq!(status, 200, "{found}");
        assert_eq!(
            found["results"],
            json!([{ "user_id": bob.user_id, "display_name": "Bobby" }]),
            "{term}: {found}"
        );
        assert_eq!(found["limited"], false, "{found}");
    }
}

/// A fake push gateway on loopback: every POST body arrives on the channel.
async fn fake_gateway() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/_matrix/push/v1/notify", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            let body: Value =
                                serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or_default();
                            let _ = tx.send(body);
                            let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"rejected\":[]}";
                            let _ = socket.write_all(reply.as_bytes()).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, rx)
}

async fn pushes_reach_the_gateway_only_for_holders(backend: Backend) {
    // The fake gateway is on loopback, which outbound requests refuse by default.
    let options = Options::default().env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8");
    let server = Server::start_with(&backend, options).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (url, mut pushed) = fake_gateway().await;
    let pusher = json!({
        "pushkey": "bob-key", "kind": "http", "app_id": "org.example.app", "app_display_name": "App",
        "device_display_name": "Phone", "lang": "en", "data": { "url": url, "format": "event_id_only" },
    });
    let (status, body) = server.post("/_matrix/client/v3/pushers/set", Some(&bob.token), pusher).await;
    assert_eq!(status, 200, "{body}");
    let (_, list) = server.get("/_matrix/client/v3/pushers", Some(&bob.token)).await;
    assert_eq!(list["pushers"][0]["pushkey"], "bob-key");

    let (_, created) = server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": "public_chat" }))
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    let say = |txn: &'static str, text: &'static str| {
        let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
        let token = alice.token.clone();
        let server = &server;
        async move {
            server.put(&path, Some(&token), json!({ "msgtype": "m.text", "body": text })).await.1["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let first = say("1", "hello bob").await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), pushed.recv())
        .await
        .expect("a push")
        .unwrap();
    assert_eq!(got["notification"]["event_id"], first.as_str(), "{got}");
    assert_eq!(got["notification"]["room_id"], room.as_str());
    assert_eq!(got["notification"]["counts"]["unread"], 1);
    assert_eq!(got["notification"]["devices"][0]["pushkey"], "bob-key");
    assert!(got["notification"].get("content").is_none(), "event_id_only: {got}");

    // Bob leaves: what is sent while he is out is not his to be told about.
    server.post(&format!("/_matrix/client/v3/rooms/{room}/leave"), Some(&bob.token), json!({})).await;
    let hidden = say("2", "while bob is away").await;
    server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    let back = say("3", "welcome back").await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), pushed.recv())
        .await
        .expect("a push")
        .unwrap();
    assert_eq!(
        got["notification"]["event_id"],
        back.as_str(),
        "the next push is the message after his return"
    );
    assert_ne!(got["notification"]["event_id"], hidden.as_str());
}

async fn presence_and_user_directory(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let (_, created) = server.post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({})).await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    server
        .post(
            &format!("/_matrix/client/v3/rooms/{room}/invite"),
            Some(&alice.token),
            json!({ "user_id": bob.user_id }),
        )
        .await;
    server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;

    let (_, first) = server.get("/_matrix/client/v3/sync", Some(&alice.token)).await;
    let since = first["next_batch"].as_str().unwrap().to_owned();
    let (status, _) = server
        .put(
            &format!("/_matrix/client/v3/presence/{}/status", bob.user_id),
            Some(&bob.token),
            json!({ "presence": "online", "status_msg": "hiking" }),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) =
        server.get(&format!("/_matrix/client/v3/presence/{}/status", bob.user_id), Some(&alice.token)).await;
    assert_eq!(
        (got["presence"].as_str(), got["status_msg"].as_str()),
        (Some("online"), Some("hiking")),
        "{got}"
    );
    let (_, sync) =
        server.get(&format!("/_matrix/client/v3/sync?since={since}&timeout=5000"), Some(&alice.token)).await;
    let events = sync["presence"]["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{sync}");
    assert_eq!(
        (events[0]["sender"].as_str(), events[0]["content"]["presence"].as_str()),
        (Some(bob.user_id.as_str()), Some("online"))
    );
    // Carol shares no room with bob: his presence is not hers to see in sync;
    // her own (online from syncing) is.
    let (_, carol_sync) = server.get("/_matrix/client/v3/sync", Some(&carol.token)).await;
    let senders: Vec<&str> = carol_sync["presence"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["sender"].as_str())
        .collect();
    assert_eq!(senders, vec![carol.user_id.as_str()], "{carol_sync}");
    // Syncing with set_presence=offline leaves an unknown user offline.
    let dave = server.register("dave", "pw").await;
    server.get("/_matrix/client/v3/sync?set_presence=offline", Some(&dave.token)).await;
    // (Dave shares no room with anyone: he reads his own.)
    let (_, got) =
        server.get(&format!("/_matrix/client/v3/presence/{}/status", dave.user_id), Some(&dave.token)).await;
    assert_eq!(got["presence"], "offline", "{got}");
    server.get("/_matrix/client/v3/sync", Some(&dave.token)).await;
    let (_, got) =
        server.get(&format!("/_matrix/client/v3/presence/{}/status", dave.user_id), Some(&dave.token)).await;
    assert_eq!(got["presence"], "online", "a plain sync brings a user online: {got}");
    let (status, _) = server
        .put(
            &format!("/_matrix/client/v3/presence/{}/status", bob.user_id),
            Some(&alice.token),
            json!({ "presence": "offline" }),
        )
        .await;
    assert_eq!(status, 403);

    // The directory: users sharing a room, or in public rooms.
    let (_, found) = server
        .post("/_matrix/client/v3/user_directory/search", Some(&alice.token), json!({ "search_term": "bo" }))
        .await;
    assert_eq!(found["results"], json!([{ "user_id": bob.user_id, "display_name": "bob" }]), "{found}");
    let (_, found) = server
        .post(
            "/_matrix/client/v3/user_directory/search",
            Some(&alice.token),
            json!({ "search_term": "carol" }),
        )
        .await;
    assert_eq!(found["results"], json!([]), "carol shares no room and is in no public room");
    let (_, public) = server
        .post("/_matrix/client/v3/createRoom", Some(&carol.token), json!({ "preset": "public_chat" }))
        .await;
    assert!(public["room_id"].is_string());
    let (_, found) = server
        .post(
            "/_matrix/client/v3/user_directory/search",
            Some(&alice.token),
            json!({ "search_term": "carol" }),
        )
        .await;
    assert_eq!(found["results"][0]["user_id"], carol.user_id.as_str(), "{found}");
    assert_eq!(found["limited"], false);
}
