//! Federation identity and transport: two seqline servers, each named
//! `127.0.0.1:<its federation port>` with a TLS federation listener on a
//! self-signed certificate the test makes. The key endpoint serves a valid
//! self-signed key; the notary fetches, checks and countersigns another
//! server's key; X-Matrix requests are accepted only when signed by the
//! origin's key for this destination over this request.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, free_port, make_certificate, now_ms, verify, x_matrix};
use complement_tests::harness::{Backend, binary};
use ed25519_dalek::SigningKey;
use serde_json::{Value, json};

backend_tests!(
    key_endpoint_serves_a_self_signed_key,
    notary_fetches_and_countersigns_another_servers_key,
    signed_requests_are_checked,
    remote_profiles_are_asked_of_their_server,
    remote_aliases_are_asked_of_their_server,
);

async fn key_endpoint_serves_a_self_signed_key(backend: Backend) {
    let a = FedServer::start(&backend).await;
    let (status, keys) = a.send("GET", "/_matrix/key/v2/server", None, None).await;
    assert_eq!(status, 200, "{keys}");
    assert_eq!(keys["server_name"], a.name.as_str());
    assert_eq!(keys["old_verify_keys"], json!({}));
    let (key_id, key) = a.signing_key();
    let public = STANDARD_NO_PAD.encode(key.verifying_key().to_bytes());
    assert_eq!(keys["verify_keys"], json!({ key_id.clone(): { "key": public } }));
    verify(&keys, &a.name, &key_id, &public);
    let day = 24 * 60 * 60 * 1000;
    let valid_until = keys["valid_until_ts"].as_i64().unwrap();
    assert!(
        (valid_until - (now_ms() + day)).abs() < 60_000,
        "valid_until_ts {valid_until} is not now + 1 day"
    );

    let (status, version) = a.send("GET", "/_matrix/federation/v1/version", None, None).await;
    assert_eq!((status, version["server"]["name"].as_str()), (200, Some("seqline")), "{version}");
    assert!(version["server"]["version"].is_string());

    // The federation listener serves only /_matrix/federation and /_matrix/key.
    let (status, body) = a.send("GET", "/_matrix/client/versions", None, None).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_UNRECOGNIZED")));
    // And the client listener serves no federation.
    let (status, body) = a.server.get("/_matrix/key/v2/server", None).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_UNRECOGNIZED")));
    // Not TLS on the TLS listener: the handshake fails, nothing is served.
    let plain = reqwest::Client::new().get(format!("http://{}/_matrix/key/v2/server", a.name)).send().await;
    assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));

    // SIGTERM stops both listeners cleanly.
    let mut a = a;
    assert_eq!(a.server.stop().await, Some(0), "{}", a.server.log());
    assert!(tokio::net::TcpStream::connect(&a.name).await.is_err(), "the federation port is closed");
}

async fn notary_fetches_and_countersigns_another_servers_key(backend: Backend) {
    let a = FedServer::start(&backend).await;
    let b = FedServer::start(&backend).await;
    let (a_key_id, a_key) = a.signing_key();
    let a_public = STANDARD_NO_PAD.encode(a_key.verifying_key().to_bytes());
    let (b_key_id, b_key) = b.signing_key();
    let b_public = STANDARD_NO_PAD.encode(b_key.verifying_key().to_bytes());

    // A has never seen B: it fetches B's key, checks it, and adds its own signature.
    let query = json!({ "server_keys": { b.name.clone(): { b_key_id.clone(): { "minimum_valid_until_ts": now_ms() } } } });
    let (status, body) = a.send("POST", "/_matrix/key/v2/query", None, Some(&query)).await;
    assert_eq!(status, 200, "{body}");
    let keys = body["server_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{body}");
    let b_keys = &keys[0];
    assert_eq!(b_keys["server_name"], b.name.as_str());
    assert_eq!(b_keys["verify_keys"][&b_key_id]["key"], b_public.as_str());
    verify(b_keys, &b.name, &b_key_id, &b_public);
    verify(b_keys, &a.name, &a_key_id, &a_public);
    assert!(a.server.log().contains("fetched server keys"), "{}", a.server.log());

    // Asked again, A answers from its cache: no second fetch.
    let (status, again) = a.send("POST", "/_matrix/key/v2/query", None, Some(&query)).await;
    assert_eq!(status, 200);
    assert_eq!(again["server_keys"][0]["verify_keys"], b_keys["verify_keys"]);
    assert_eq!(a.server.log().matches("fetched server keys").count(), 1, "{}", a.server.log());

    // A's own key through its notary; the one-server GET form too.
    let own = json!({ "server_keys": { a.name.clone(): {} } });
    let (status, body) = a.send("POST", "/_matrix/key/v2/query", None, Some(&own)).await;
    assert_eq!(status, 200);
    verify(&body["server_keys"][0], &a.name, &a_key_id, &a_public);
    let uri = format!("/_matrix/key/v2/query/{}?minimum_valid_until_ts={}", b.name, now_ms());
    let (status, body) = a.send("GET", &uri, None, None).await;
    assert_eq!(
        (status, body["server_keys"][0]["server_name"].as_str()),
        (200, Some(b.name.as_str())),
        "{body}"
    );

    // A server that does not answer is left out.
    let gone = format!("127.0.0.1:{}", free_port());
    let query = json!({ "server_keys": { gone: {} } });
    let (status, body) = a.send("POST", "/_matrix/key/v2/query", None, Some(&query)).await;
    assert_eq!((status, body["server_keys"].clone()), (200, json!([])), "{body}");
    // Several servers at once: each answered, the unreachable one left out.
    let gone = format!("127.0.0.1:{}", free_port());
    let query = json!({ "server_keys": { b.name.clone(): {}, gone: {}, a.name.clone(): {} } });
    let (status, body) = a.send("POST", "/_matrix/key/v2/query", None, Some(&query)).await;
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<&str> =
        body["server_keys"].as_array().unwrap().iter().map(|k| k["server_name"].as_str().unwrap()).collect();
    names.sort_unstable();
    let mut expected = vec![a.name.as_str(), b.name.as_str()];
    expected.sort_unstable();
    assert_eq!(names, expected, "{body}");
    // At most 100 servers a query.
    let many: serde_json::Map<String, Value> =
        (0..101).map(|i| (format!("s{i}.invalid"), json!({}))).collect();
    let (status, body) =
        a.send("POST", "/_matrix/key/v2/query", None, Some(&json!({ "server_keys": many }))).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")), "{body}");
    // Bad input changes nothing and says why.
    let (status, body) =
        a.send("POST", "/_matrix/key/v2/query", None, Some(&json!({ "server_keys": 5 }))).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
}

async fn signed_requests_are_checked(backend: Backend) {
    let a = FedServer::start(&backend).await;
    let b = FedServer::start(&backend).await;
    let alice = a.server.register("alice", "pw").await;
    let alice_id = format!("@alice:{}", a.name);
    let path = format!("/_matrix/client/v3/profile/{alice_id}/displayname");
    let (status, _) = a.server.put(&path, Some(&alice.token), json!({ "displayname": "Alice A" })).await;
    assert_eq!(status, 200);

    let uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        alice_id.replace('@', "%40").replace(':', "%3A")
    );
    let b_key = b.signing_key();
    let good = x_matrix(&b.name, &a.name, &b_key, "GET", &uri, None);
    // Signed by B for A: accepted (A fetches B's key to check it).
    let (status, body) = a.send("GET", &uri, Some(good.clone()), None).await;
    assert_eq!((status, body["displayname"].as_str()), (200, Some("Alice A")), "{body}");

    let unauthorized = |(status, body): (u16, Value)| {
        assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNAUTHORIZED")), "{body}");
        assert!(body["error"].is_string());
    };
    // No header.
    unauthorized(a.send("GET", &uri, None, None).await);
    // Signed for another destination.
    let elsewhere = x_matrix(&b.name, "127.0.0.1:1", &b_key, "GET", &uri, None);
    unauthorized(a.send("GET", &uri, Some(elsewhere), None).await);
    // A signature that is not B's (another key under B's key id).
    let forged_key = (b_key.0.clone(), SigningKey::from_bytes(&[9u8; 32]));
    let forged = x_matrix(&b.name, &a.name, &forged_key, "GET", &uri, None);
    unauthorized(a.send("GET", &uri, Some(forged), None).await);
    // B's signature over another request (the profile of someone else).
    let other =
        format!("/_matrix/federation/v1/query/profile?user_id=%40bob%3A{}", a.name.replace(':', "%3A"));
    unauthorized(a.send("GET", &other, Some(good.clone()), None).await);
    // Not X-Matrix at all.
    unauthorized(a.send("GET", &uri, Some("Bearer abc".into()), None).await);
    // An origin whose keys cannot be had.
    let nobody = format!("127.0.0.1:{}", free_port());
    let stranger = x_matrix(&nobody, &a.name, &b_key, "GET", &uri, None);
    unauthorized(a.send("GET", &uri, Some(stranger.clone()), None).await);
    // Asked again at once, A does not try that server again.
    unauthorized(a.send("GET", &uri, Some(stranger), None).await);
    let log = a.server.log();
    assert_eq!(log.matches(&format!("cannot fetch the keys of {nobody}")).count(), 1, "{log}");
    assert_eq!(log.matches(&format!("the keys of {nobody} could not be fetched lately")).count(), 1, "{log}");

    // Still accepted afterwards, from the cached key.
    let (status, body) = a.send("GET", &uri, Some(good), None).await;
    assert_eq!((status, body["displayname"].as_str()), (200, Some("Alice A")), "{body}");
    assert_eq!(a.server.log().matches("fetched server keys").count(), 1, "{}", a.server.log());

    // B starts over with a new key: A does not know its id, so it fetches B's keys again.
    let mut b = b;
    let line = format!("ed25519 a_rotated {}\n", STANDARD_NO_PAD.encode([5u8; 32]));
    std::fs::write(b.server.data_dir.join("signing.key"), line).unwrap();
    b.server.restart().await;
    let new_key = b.signing_key();
    assert_eq!(new_key.0, "ed25519:a_rotated");
    let (status, keys) = b.send("GET", "/_matrix/key/v2/server", None, None).await;
    assert!(status == 200 && keys["verify_keys"]["ed25519:a_rotated"].is_object(), "{keys}");
    let rotated = x_matrix(&b.name, &a.name, &new_key, "GET", &uri, None);
    let (status, body) = a.send("GET", &uri, Some(rotated), None).await;
    assert_eq!((status, body["displayname"].as_str()), (200, Some("Alice A")), "{body}");
    assert_eq!(a.server.log().matches("fetched server keys").count(), 2, "{}", a.server.log());
    // A made-up key id right after: refused, without another fetch.
    let made_up = ("ed25519:a_madeup".to_owned(), SigningKey::from_bytes(&[6u8; 32]));
    unauthorized(
        a.send("GET", &uri, Some(x_matrix(&b.name, &a.name, &made_up, "GET", &uri, None)), None).await,
    );
    assert_eq!(a.server.log().matches("fetched server keys").count(), 2, "{}", a.server.log());
}

async fn remote_profiles_are_asked_of_their_server(backend: Backend) {
    let a = FedServer::start(&backend).await;
    let b = FedServer::start(&backend).await;
    let alice = a.server.register("alice", "pw").await;
    let alice_id = format!("@alice:{}", a.name);
    let path = format!("/_matrix/client/v3/profile/{alice_id}/displayname");
    let (status, _) = a.server.put(&path, Some(&alice.token), json!({ "displayname": "Alice A" })).await;
    assert_eq!(status, 200);
    let bob = b.server.register("bob", "pw").await;

    // Bob's server asks Alice's, signing the request; A fetches B's key to check it.
    let (status, body) =
        b.server.get(&format!("/_matrix/client/v3/profile/{alice_id}"), Some(&bob.token)).await;
    assert_eq!((status, body["displayname"].as_str()), (200, Some("Alice A")), "{body}");
    let (status, body) = b.server.get(&path, Some(&bob.token)).await;
    assert_eq!((status, body), (200, json!({ "displayname": "Alice A" })));
    assert!(a.server.log().contains("fetched server keys"), "{}", a.server.log());

    // Unknown there: 404 as for a local user; a server that does not answer: 502.
    let nobody = format!("/_matrix/client/v3/profile/@nobody:{}", a.name);
    let (status, body) = b.server.get(&nobody, Some(&bob.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
    let gone = format!("/_matrix/client/v3/profile/@x:127.0.0.1:{}", free_port());
    let (status, body) = b.server.get(&gone, Some(&bob.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (502, Some("M_UNKNOWN")), "{body}");
}

async fn remote_aliases_are_asked_of_their_server(backend: Backend) {
    let a = FedServer::start(&backend).await;
    let b = FedServer::start(&backend).await;
    let alice = a.server.register("alice", "pw").await;
    let (status, room) = a
        .server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "room_alias_name": "lobby" }))
        .await;
    assert_eq!(status, 200, "{room}");
    let room_id = room["room_id"].as_str().unwrap();
    let bob = b.server.register("bob", "pw").await;

    let alias = format!("%23lobby:{}", a.name);
    let (status, body) =
        b.server.get(&format!("/_matrix/client/v3/directory/room/{alias}"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "room_id": room_id, "servers": [a.name.clone()] }));
    let (status, body) = b
        .server
        .get(&format!("/_matrix/client/v3/directory/room/%23nothing:{}", a.name), Some(&bob.token))
        .await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");

    // Over federation, A answers only for its own aliases, and only signed requests.
    let b_key = b.signing_key();
    let uri = format!(
        "/_matrix/federation/v1/query/directory?room_alias=%23lobby%3A{}",
        b.name.replace(':', "%3A")
    );
    let (status, body) =
        a.send("GET", &uri, Some(x_matrix(&b.name, &a.name, &b_key, "GET", &uri, None)), None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")), "{body}");
    let uri = format!(
        "/_matrix/federation/v1/query/directory?room_alias=%23lobby%3A{}",
        a.name.replace(':', "%3A")
    );
    let (status, body) = a.send("GET", &uri, None, None).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNAUTHORIZED")), "{body}");
}

#[tokio::test]
async fn a_bad_certificate_is_a_configuration_error() {
    let dir = std::env::temp_dir().join(format!("seqline-fed-badcert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = make_certificate(&dir);
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let junk = junk.display().to_string();
    for (i, (cert, key, needle)) in [
        (junk.as_str(), key.as_str(), "tls.cert_path"),
        (cert.as_str(), junk.as_str(), "tls.key_path"),
        ("/nonexistent/cert.pem", key.as_str(), "/nonexistent/cert.pem"),
        ("", "", "tls.cert_path, tls.key_path"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = tokio::process::Command::new(binary())
            .env_clear()
            .env("SEQLINE_DATA_DIR", dir.join(format!("d{i}")))
            .env("SEQLINE_LISTEN_FEDERATION", "127.0.0.1:0")
            .env("SEQLINE_TLS_CERT", cert)
            .env("SEQLINE_TLS_KEY", key)
            .arg("serve")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "case {i}: one line: {stderr}");
        assert!(stderr.contains(needle), "case {i}: {stderr} should name {needle}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
