//! Federation identity and transport: two seqline servers, each named
//! `127.0.0.1:<its federation port>` with a TLS federation listener on a
//! self-signed certificate the test makes. The key endpoint serves a valid
//! self-signed key; the notary fetches, checks and countersigns another
//! server's key; X-Matrix requests are accepted only when signed by the
//! origin's key for this destination over this request.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, binary};
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde_json::{Value, json};

backend_tests!(
    key_endpoint_serves_a_self_signed_key,
    notary_fetches_and_countersigns_another_servers_key,
    signed_requests_are_checked,
    remote_profiles_are_asked_of_their_server,
    remote_aliases_are_asked_of_their_server,
);

/// A seqline server with a federation listener.
struct FedServer {
    server: Server,
    /// `127.0.0.1:<federation port>`, also the server name.
    name: String,
    https: reqwest::Client,
    /// The certificate and key (kept for restarts, removed on drop).
    cert_dir: std::path::PathBuf,
}

impl Drop for FedServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.cert_dir);
    }
}

/// A free port on loopback (bound and released: the server name must carry
/// the federation port before the server starts).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A self-signed certificate for 127.0.0.1 and localhost (P-256), made with
/// the openssl command; returns the certificate and key paths.
fn make_certificate(dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args([
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert.display().to_string(), key.display().to_string())
}

impl FedServer {
    async fn start(backend: &Backend) -> Self {
        let port = free_port();
        let name = format!("127.0.0.1:{port}");
        let dir = std::env::temp_dir().join(format!("seqline-fed-cert-{}-{port}", std::process::id()));
        let (cert, key) = make_certificate(&dir);
        let options = Options::default()
            .env("SEQLINE_SERVER_NAME", &name)
            .env("SEQLINE_LISTEN_FEDERATION", &name)
            .env("SEQLINE_TLS_CERT", &cert)
            .env("SEQLINE_TLS_KEY", &key)
            .env("SEQLINE_FEDERATION_VERIFY_TLS", "false")
            .env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8");
        let server = Server::start_with(backend, options).await;
        assert!(
            server.log().contains(&format!("federation listening on https://{name}")),
            "{}",
            server.log()
        );
        let https = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .unwrap();
        Self { server, name, https, cert_dir: dir }
    }

    /// The server's signing key from its key file: (key id, key).
    fn signing_key(&self) -> (String, SigningKey) {
        let line = std::fs::read_to_string(self.server.data_dir.join("signing.key")).unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        let seed: [u8; 32] = STANDARD_NO_PAD.decode(parts[2]).unwrap().try_into().unwrap();
        (format!("ed25519:{}", parts[1]), SigningKey::from_bytes(&seed))
    }

    /// A request to the federation listener, with an optional Authorization header.
    async fn send(
        &self,
        method: &str,
        uri: &str,
        auth: Option<String>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.https.request(method, format!("https://{}{uri}", self.name));
        if let Some(auth) = auth {
            req = req.header("Authorization", auth);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let response = req.send().await.expect("federation request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// The canonical JSON of `object` without `signatures` and `unsigned`
/// (serde_json's maps are sorted and `to_string` is compact).
fn canonical(object: &Value) -> String {
    let mut object = object.clone();
    let map = object.as_object_mut().unwrap();
    map.remove("signatures");
    map.remove("unsigned");
    serde_json::to_string(&object).unwrap()
}

fn verify(object: &Value, signer: &str, key_id: &str, public: &str) {
    let sig = object["signatures"][signer][key_id]
        .as_str()
        .unwrap_or_else(|| panic!("no {signer} {key_id}: {object}"));
    let sig = ed25519_dalek::Signature::from_slice(&STANDARD_NO_PAD.decode(sig).unwrap()).unwrap();
    let public: [u8; 32] = STANDARD_NO_PAD.decode(public).unwrap().try_into().unwrap();
    VerifyingKey::from_bytes(&public)
        .unwrap()
        .verify(canonical(object).as_bytes(), &sig)
        .expect("signature verifies");
}

/// An X-Matrix Authorization header for a request from `origin` to
/// `destination`, signed with `key`.
fn x_matrix(
    origin: &str,
    destination: &str,
    (key_id, key): &(String, SigningKey),
    method: &str,
    uri: &str,
    content: Option<&Value>,
) -> String {
    let mut request = json!({ "method": method, "uri": uri, "origin": origin, "destination": destination });
    if let Some(content) = content {
        request["content"] = content.clone();
    }
    let sig = STANDARD_NO_PAD.encode(key.sign(canonical(&request).as_bytes()).to_bytes());
    format!("X-Matrix origin=\"{origin}\",destination=\"{destination}\",key=\"{key_id}\",sig=\"{sig}\"")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

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
