//! Keys across servers: a user of one seqline server queries and claims
//! the keys of a user of another (`/keys/query`, `/keys/claim`, answered
//! there through `/user/keys/query`, `/user/keys/claim`; the device list
//! through `/user/devices/{userId}`): device keys with their owner's
//! signatures, cross-signing keys (never the user-signing key), one-time
//! keys each claimed once, then the fallback key. A server that does not
//! answer is listed in `failures` within the asker's timeout; another
//! server is answered only about our users.

use complement_tests::api::{V3, enc};
use complement_tests::backend_tests;
use complement_tests::e2ee::{Key, cross_signing_key, device_keys, signed_one_time_key};
use complement_tests::fake::FakeServer;
use complement_tests::federation::FedServer;
use complement_tests::harness::Backend;
use serde_json::{Value, json};

backend_tests!(
    keys_are_queried_and_claimed_across_servers,
    other_servers_get_only_our_users_keys,
    an_encrypted_room_joined_over_federation_says_so,
    key_requests_naming_too_much_are_bounded,
    remote_device_lists_are_kept_and_followed,
);

/// alice on A uploads device keys, two one-time keys, a fallback key and
/// cross-signing keys; bob on B sees them all (a third server that does not
/// answer shows in `failures`) and claims the one-time keys once each, then
/// the fallback key.
async fn keys_are_queried_and_claimed_across_servers(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let alice_id = a.user_id("alice");
    let device = alice.device_id.clone();
    let key = Key::new("alice-device");
    let keys = device_keys(&alice_id, &device, &key);
    let otk = |n: &str| signed_one_time_key(&alice_id, &device, &key, n);
    let upload = json!({
        "device_keys": keys,
        "one_time_keys": { "signed_curve25519:AAAA": otk("one"), "signed_curve25519:AAAB": otk("two") },
        "fallback_keys": { "signed_curve25519:FFFF": otk("fallback") },
    });
    let (status, body) = a.server.post(&format!("{V3}/keys/upload"), Some(&alice.token), upload).await;
    assert_eq!(status, 200, "{body}");
    let master = Key::new("alice-master");
    let auth = json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "pw" });
    let signing = json!({
        "master_key": cross_signing_key(&alice_id, "master", &master, None),
        "self_signing_key": cross_signing_key(&alice_id, "self_signing", &Key::new("alice-self"), Some(&master)),
        "user_signing_key": cross_signing_key(&alice_id, "user_signing", &Key::new("alice-user"), Some(&master)),
        "auth": auth,
    });
    let (status, body) =
        a.server.post(&format!("{V3}/keys/device_signing/upload"), Some(&alice.token), signing).await;
    assert_eq!(status, 200, "{body}");

    // A closed port: that server cannot answer.
    let nowhere = "@carol:127.0.0.1:9";
    let started = std::time::Instant::now();
    let query = json!({ "device_keys": { alice_id.as_str(): [], nowhere: [] }, "timeout": 3000 });
    let (status, answer) = b.server.post(&format!("{V3}/keys/query"), Some(&bob.token), query).await;
    assert_eq!(status, 200, "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    let got = &answer["device_keys"][&alice_id][&device];
    assert_eq!(got["keys"], keys["keys"], "{answer}");
    assert_eq!(got["signatures"][&alice_id], keys["signatures"][&alice_id], "{answer}");
    assert_eq!(answer["master_keys"][&alice_id]["keys"][master.id()], master.public.as_str(), "{answer}");
    assert!(answer["self_signing_keys"][&alice_id].is_object(), "{answer}");
    assert!(answer["user_signing_keys"][&alice_id].is_null(), "{answer}");
    assert!(answer["failures"]["127.0.0.1:9"].is_object(), "{answer}");
    assert!(answer["failures"][&a.name].is_null(), "{answer}");

    let claim = json!({ "one_time_keys": { alice_id.as_str(): { device.as_str(): "signed_curve25519" } } });
    let mut claimed = Vec::new();
    for _ in 0..4 {
        let (status, answer) =
            b.server.post(&format!("{V3}/keys/claim"), Some(&bob.token), claim.clone()).await;
        assert_eq!(status, 200, "{answer}");
        let keys = answer["one_time_keys"][&alice_id][&device].as_object().cloned().unwrap_or_default();
        claimed.push(
            keys.iter()
                .map(|(id, k)| format!("{id}={}", k["key"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>(),
        );
    }
    claimed[..2].sort();
    assert_eq!(
        claimed,
        [
            vec!["signed_curve25519:AAAA=one".to_owned()],
            vec!["signed_curve25519:AAAB=two".to_owned()],
            vec!["signed_curve25519:FFFF=fallback".to_owned()],
            vec!["signed_curve25519:FFFF=fallback".to_owned()],
        ]
    );
}

/// A server asking about users who are not ours (a third server's, one that
/// does not exist) gets nothing for them, and a device list only for ours.
async fn other_servers_get_only_our_users_keys(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let key = Key::new("alice-device");
    let upload = json!({ "device_keys": device_keys(&alice_id, &alice.device_id, &key) });
    let (status, body) = seq.server.post(&format!("{V3}/keys/upload"), Some(&alice.token), upload).await;
    assert_eq!(status, 200, "{body}");

    let body = json!({ "device_keys": { alice_id.as_str(): [], "@carol:third.example": [], format!("@ghost:{}", seq.name): [] } });
    let (status, answer) =
        fake.call(&seq, "POST", "/_matrix/federation/v1/user/keys/query", Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    let users: Vec<&String> = answer["device_keys"].as_object().unwrap().keys().collect();
    assert!(users.contains(&&alice_id) && !users.iter().any(|u| u.contains("carol")), "{answer}");
    assert_eq!(
        answer["device_keys"][&alice_id][&alice.device_id]["keys"],
        device_keys(&alice_id, &alice.device_id, &key)["keys"]
    );

    let path = format!("/_matrix/federation/v1/user/devices/{}", enc(&alice_id));
    let (status, answer) = fake.call(&seq, "GET", &path, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["user_id"], alice_id.as_str());
    assert_eq!(answer["devices"][0]["device_id"], alice.device_id.as_str(), "{answer}");
    assert!(answer["stream_id"].as_i64().is_some(), "{answer}");
    for user in ["@carol:third.example".to_owned(), format!("@ghost:{}", seq.name)] {
        let path = format!("/_matrix/federation/v1/user/devices/{}", enc(&user));
        let (status, answer) = fake.call(&seq, "GET", &path, None).await;
        assert_eq!((status, answer["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{user}: {answer}");
    }
    let body = json!({ "one_time_keys": { "@carol:third.example": { "DEV": "signed_curve25519" } } });
    let (status, answer) =
        fake.call(&seq, "POST", "/_matrix/federation/v1/user/keys/claim", Some(&body)).await;
    assert_eq!((status, &answer["one_time_keys"]), (200, &json!({})), "{answer}");
}

/// bob on B joins alice's encrypted room on A (invited): his /sync has the
/// room's `m.room.encryption` (the joiner's client encrypts by it), and so
/// does his first sync after the join.
async fn an_encrypted_room_joined_over_federation_says_so(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let bob_id = b.user_id("bob");
    let encryption = json!({ "type": "m.room.encryption", "state_key": "", "content": { "algorithm": "m.megolm.v1.aes-sha2" } });
    let body = json!({ "preset": "private_chat", "initial_state": [encryption], "invite": [bob_id] });
    let room = complement_tests::api::create_room(&a.server, &alice, body).await;
    let (status, first) = b.server.get(&format!("{V3}/sync"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{first}");
    let since = first["next_batch"].as_str().unwrap().to_owned();
    let path = format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name));
    let (status, joined) = b.server.post(&path, Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{joined}");
    let has_encryption = |sync: &serde_json::Value| {
        let joined = &sync["rooms"]["join"][&room];
        ["state", "timeline"].iter().any(|section| {
            joined[section]["events"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["type"] == "m.room.encryption")
        })
    };
    let (status, incremental) =
        b.server.get(&format!("{V3}/sync?since={}", enc(&since)), Some(&bob.token)).await;
    assert_eq!(status, 200, "{incremental}");
    assert!(has_encryption(&incremental), "{incremental}");
    let (status, initial) = b.server.get(&format!("{V3}/sync"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{initial}");
    assert!(has_encryption(&initial), "{initial}");
}

/// A client asking about users of 150 servers (none of which answers)
/// gets an answer at once, every server in `failures` (the first 100 were
/// asked, the others left out); another server claiming keys of 3,000
/// devices of alice's gets an answer: her one real device's key (its id
/// sorts before the made-up ones, so it is among the first thousand taken).
async fn key_requests_naming_too_much_are_bounded(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let key = Key::new("alice-device");
    let upload = json!({
        "device_keys": device_keys(&alice_id, &alice.device_id, &key),
        "one_time_keys": { "signed_curve25519:AAAA": signed_one_time_key(&alice_id, &alice.device_id, &key, "one") },
    });
    let (status, body) = seq.server.post(&format!("{V3}/keys/upload"), Some(&alice.token), upload).await;
    assert_eq!(status, 200, "{body}");

    let users: serde_json::Map<String, serde_json::Value> =
        (1..=150).map(|port| (format!("@u:127.0.0.1:{port}"), json!([]))).collect();
    let started = std::time::Instant::now();
    let query = json!({ "device_keys": users, "timeout": 5000 });
    let (status, answer) = seq.server.post(&format!("{V3}/keys/query"), Some(&alice.token), query).await;
    assert_eq!(status, 200, "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "{:?}", started.elapsed());
    assert_eq!(answer["failures"].as_object().map(|f| f.len()), Some(150), "{answer}");

    let mut devices: serde_json::Map<String, serde_json::Value> =
        (0..3000).map(|i| (format!("~nope{i:04}"), json!("signed_curve25519"))).collect();
    devices.insert(alice.device_id.clone(), json!("signed_curve25519"));
    let body = json!({ "one_time_keys": { alice_id.as_str(): devices } });
    let (status, answer) =
        fake.call(&seq, "POST", "/_matrix/federation/v1/user/keys/claim", Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    let claimed = &answer["one_time_keys"][&alice_id];
    assert_eq!(claimed.as_object().map(|m| m.len()), Some(1), "{answer}");
    assert_eq!(claimed[&alice.device_id]["signed_curve25519:AAAA"]["key"], "one", "{answer}");
}

/// What alice (on the server under test) gets for mallory (on the fake, in
/// her room): mallory's device ids with keys, and his master key.
async fn mallory_as_seen(
    seq: &FedServer,
    alice: &complement_tests::harness::User,
    mallory: &str,
) -> (Vec<String>, Value) {
    let query = json!({ "device_keys": { mallory: [] }, "timeout": 5000 });
    let (status, answer) = seq.server.post(&format!("{V3}/keys/query"), Some(&alice.token), query).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["failures"], json!({}), "{answer}");
    let devices =
        answer["device_keys"][mallory].as_object().map(|d| d.keys().cloned().collect()).unwrap_or_default();
    (devices, answer["master_keys"][mallory]["keys"].clone())
}

/// mallory's device list is asked of the fake once and kept: later
/// queries are answered from it, the fake's updates that follow on from it
/// move it (a device added, one deleted, a new master key), an update that
/// does not follow on (a `prev_id` never seen) makes the next query ask the
/// fake again, and so does a user of ours joining the room. A user who shares no room with
/// alice is asked about without keeping anything; devices whose keys name
/// someone else are left out.
async fn remote_device_lists_are_kept_and_followed(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let room =
        complement_tests::api::create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    let mallory = fake.user_id("mallory");
    fake.join(&seq, &room, &mallory).await;
    let keys = |device: &str| device_keys(&mallory, device, &Key::new(device));
    let master = |name: &str| cross_signing_key(&mallory, "master", &Key::new(name), None);
    let (m1, m2, m3) = (keys("M1"), keys("M2"), keys("M3"));
    let devices_path = "/_matrix/federation/v1/user/devices/";
    fake.answer("GET", devices_path, 200, json!({
        "user_id": mallory, "stream_id": 5, "master_key": master("first-master"),
        "devices": [
            { "device_id": "M1", "keys": m1, "device_display_name": "phone" },
            { "device_id": "FORGED", "keys": device_keys(&format!("@eve:{}", seq.name), "FORGED", &Key::new("x")) },
        ],
    }));
    let asked = || fake.requests_to(devices_path).len();

    let (devices, first_master) = mallory_as_seen(&seq, &alice, &mallory).await;
    assert_eq!((devices, asked()), (vec!["M1".to_owned()], 1));
    assert_eq!(first_master, master("first-master")["keys"]);
    let query = json!({ "device_keys": { mallory.as_str(): ["M1"] } });
    let (status, answer) = seq.server.post(&format!("{V3}/keys/query"), Some(&alice.token), query).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["device_keys"][&mallory]["M1"]["keys"], m1["keys"], "{answer}");
    assert_eq!(answer["device_keys"][&mallory]["M1"]["unsigned"]["device_display_name"], "phone", "{answer}");
    assert_eq!(asked(), 1, "answered from the list held");

    let send = |txn: &'static str, edus: Vec<Value>| {
        let body = json!({ "origin": fake.name, "origin_server_ts": complement_tests::federation::now_ms(), "pdus": [], "edus": edus });
        let fake = &fake;
        let seq = &seq;
        async move {
            let (status, answer) =
                fake.call(seq, "PUT", &format!("/_matrix/federation/v1/send/{txn}"), Some(&body)).await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    let update = |device: &str, stream: i64, prev: i64, keys: Option<&Value>| {
        let mut content = json!({ "user_id": mallory, "device_id": device, "stream_id": stream, "prev_id": [prev], "deleted": keys.is_none() });
        if let Some(keys) = keys {
            content["keys"] = keys.clone();
        }
        json!({ "edu_type": "m.device_list_update", "content": content })
    };
    send("t1", vec![update("M2", 6, 5, Some(&m2))]).await;
    assert_eq!(mallory_as_seen(&seq, &alice, &mallory).await.0, ["M1", "M2"]);
    send("t2", vec![update("M1", 7, 6, None)]).await;
    let signing = json!({ "edu_type": "m.signing_key_update", "content": { "user_id": mallory, "master_key": master("second-master") } });
    send("t3", vec![signing]).await;
    let (devices, second_master) = mallory_as_seen(&seq, &alice, &mallory).await;
    assert_eq!(
        (devices, second_master, asked()),
        (vec!["M2".to_owned()], master("second-master")["keys"].clone(), 1)
    );

    // An update after position 8, which never came: the fake is asked again.
    fake.answer(
        "GET",
        devices_path,
        200,
        json!({
            "user_id": mallory, "stream_id": 9, "devices": [{ "device_id": "M3", "keys": m3 }],
        }),
    );
    send("t4", vec![update("M3", 9, 8, Some(&m3))]).await;
    assert_eq!(mallory_as_seen(&seq, &alice, &mallory).await.0, ["M3"]);
    assert_eq!(asked(), 2);
    assert_eq!(mallory_as_seen(&seq, &alice, &mallory).await.0, ["M3"]);
    assert_eq!(asked(), 2);

    // bob, of ours, joins the room (as if it were our first user there: no
    // update reached us while no room was shared): asked for again.
    let bob = seq.server.register("bob", "pw").await;
    let (status, body) =
        seq.server.post(&format!("{V3}/join/{}", enc(&room)), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mallory_as_seen(&seq, &alice, &mallory).await.0, ["M3"]);
    assert_eq!(asked(), 3);

    // Someone who shares no room with alice: asked of the fake each time.
    let stranger = fake.user_id("stranger");
    let stranger_keys = device_keys(&stranger, "S1", &Key::new("S1"));
    fake.answer(
        "POST",
        "/_matrix/federation/v1/user/keys/query",
        200,
        json!({ "device_keys": { stranger.as_str(): { "S1": stranger_keys } } }),
    );
    for round in 1..=2 {
        let query = json!({ "device_keys": { stranger.as_str(): [] } });
        let (status, answer) = seq.server.post(&format!("{V3}/keys/query"), Some(&alice.token), query).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["device_keys"][&stranger]["S1"]["keys"], stranger_keys["keys"], "{answer}");
        assert_eq!(fake.requests_to("/_matrix/federation/v1/user/keys/query").len(), round);
    }
    assert_eq!(asked(), 3);
}
