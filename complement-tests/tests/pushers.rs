//! Pushers and the outbound requests they cause: a pusher lives as long as the
//! access token that set it, its URL must be a gateway's notify endpoint, and
//! the server's requests never reach internal addresses (unless allowed),
//! never follow redirects and never read a gateway's reply past a limit.

use std::time::Duration;

use complement_tests::api::assert_error;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, User};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;

backend_tests!(
    a_pusher_goes_with_its_access_token,
    pusher_urls_must_name_the_notify_endpoint,
    internal_addresses_are_not_contacted_without_the_allow_setting,
    gateway_redirects_are_not_followed,
    a_huge_gateway_reply_is_abandoned,
    https_gateways_must_present_a_trusted_certificate,
    a_push_key_taken_by_another_user_leaves_the_first,
);

/// Without `append`, a push key set by Bob is no longer Alice's (the phone
/// changed hands); with `append: true` both keep it.
async fn a_push_key_taken_by_another_user_leaves_the_first(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let url = "https://push.example.org/_matrix/push/v1/notify";
    set_pusher(&server, &alice.token, "phone", url).await;
    set_pusher(&server, &alice.token, "tablet", url).await;
    set_pusher(&server, &bob.token, "phone", url).await;
    assert_eq!(pushkeys(&server, &alice.token).await, vec!["tablet"]);
    assert_eq!(pushkeys(&server, &bob.token).await, vec!["phone"]);

    let mut shared = pusher("phone", url);
    shared["append"] = json!(true);
    let (status, body) = server.post("/_matrix/client/v3/pushers/set", Some(&carol.token), shared).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pushkeys(&server, &bob.token).await, vec!["phone"]);
    assert_eq!(pushkeys(&server, &carol.token).await, vec!["phone"]);
}

const WAIT: Duration = Duration::from_secs(20);

/// What the fake gateway answers.
#[derive(Clone)]
enum Reply {
    /// `{"rejected":[]}`.
    Ok,
    /// 307 to this URL.
    Redirect(String),
    /// 200 with a JSON body of about this many bytes (no Content-Length,
    /// read until the connection closes), rejecting every pushkey it names.
    Huge(usize, String),
}

/// A fake push gateway on loopback: each POST body arrives on the channel.
async fn gateway(reply: Reply) -> (String, u16, UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/_matrix/push/v1/notify");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            let reply = reply.clone();
            tokio::spawn(async move {
                let Some(body) = read_request(&mut socket).await else { return };
                let _ = tx.send(body);
                match reply {
                    Reply::Ok => {
                        let r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"rejected\":[]}";
                        let _ = socket.write_all(r.as_bytes()).await;
                    }
                    Reply::Redirect(to) => {
                        let r = format!(
                            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        let _ = socket.write_all(r.as_bytes()).await;
                    }
                    Reply::Huge(size, pushkey) => {
                        let head =
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
                        let _ = socket.write_all(head.as_bytes()).await;
                        let start = format!("{{\"rejected\":[\"{pushkey}\"],\"pad\":\"");
                        let _ = socket.write_all(start.as_bytes()).await;
                        let chunk = vec![b'x'; 64 * 1024];
                        for _ in 0..size / chunk.len() {
                            if socket.write_all(&chunk).await.is_err() {
                                return;
                            }
                        }
                        let _ = socket.write_all(b"\"}").await;
                    }
                }
            });
        }
    });
    (url, port, rx)
}

async fn read_request<S: AsyncRead + Unpin>(socket: &mut S) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let len = text[..end]
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return Some(serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or_default());
        }
    }
}

/// A push gateway speaking TLS with a certificate for 127.0.0.1 from the
/// test CA (`fixtures/`): each handshake's outcome, then the POST body, arrives
/// on the channel.
async fn tls_gateway() -> (String, UnboundedReceiver<Result<Value, String>>) {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer> =
        CertificateDer::pem_slice_iter(include_bytes!("fixtures/gateway-127.0.0.1.pem"))
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("fixtures/gateway-127.0.0.1.key")).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/_matrix/push/v1/notify", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (tx, acceptor) = (tx.clone(), acceptor.clone());
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(socket).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let Some(body) = read_request(&mut tls).await else { return };
                let _ = tx.send(Ok(body));
                let r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"rejected\":[]}";
                let _ = tls.write_all(r.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (url, rx)
}

fn allowing_loopback() -> Options {
    Options::default().env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8,::1/128")
}

fn pusher(pushkey: &str, url: &str) -> Value {
    json!({
        "pushkey": pushkey, "kind": "http", "app_id": "org.example.app", "app_display_name": "App",
        "device_display_name": "Phone", "lang": "en", "data": { "url": url, "format": "event_id_only" },
    })
}

async fn set_pusher(server: &Server, token: &str, pushkey: &str, url: &str) {
    let (status, body) =
        server.post("/_matrix/client/v3/pushers/set", Some(token), pusher(pushkey, url)).await;
    assert_eq!(status, 200, "set pusher {pushkey}: {body}");
}

async fn pushkeys(server: &Server, token: &str) -> Vec<String> {
    let (status, body) = server.get("/_matrix/client/v3/pushers", Some(token)).await;
    assert_eq!(status, 200, "{body}");
    let mut keys: Vec<String> = body["pushers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pushkey"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

/// Alice's public room with the others joined.
async fn room_with(server: &Server, alice: &User, others: &[&User]) -> String {
    let (_, created) = server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": "public_chat" }))
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    for user in others {
        let (status, body) =
            server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&user.token), json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    room
}

async fn say(server: &Server, alice: &User, room: &str, txn: &str) -> String {
    let path = format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}");
    let (status, body) =
        server.put(&path, Some(&alice.token), json!({ "msgtype": "m.text", "body": txn })).await;
    assert_eq!(status, 200, "{body}");
    body["event_id"].as_str().unwrap().to_owned()
}

/// The next `n` pushes as (event id, pushkey), sorted.
async fn next_pushes(rx: &mut UnboundedReceiver<Value>, n: usize) -> Vec<(String, String)> {
    let mut got = Vec::new();
    for _ in 0..n {
        let push = tokio::time::timeout(WAIT, rx.recv()).await.expect("a push in time").unwrap();
        let n = &push["notification"];
        got.push((
            n["event_id"].as_str().unwrap().to_owned(),
            n["devices"][0]["pushkey"].as_str().unwrap().to_owned(),
        ));
    }
    got.sort();
    got
}

/// Waits until the server's log has `count` lines holding every one of `parts`.
async fn wait_for_log(server: &Server, parts: &[&str], count: usize) {
    let started = std::time::Instant::now();
    loop {
        let log = server.log();
        let found = log.lines().filter(|l| parts.iter().all(|p| l.contains(p))).count();
        if found >= count {
            return;
        }
        assert!(started.elapsed() < WAIT, "no log line with {parts:?}:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request behind user-interactive auth with bob's password.
async fn with_password(
    server: &Server,
    method: Method,
    path: &str,
    token: &str,
    body: Value,
) -> (u16, Value) {
    let (status, first) = server.request(method.clone(), path, Some(token), Some(body.clone())).await;
    assert_eq!(status, 401, "{first}");
    let mut body = body;
    body["auth"] = json!({
        "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "bob" },
        "password": "pw", "session": first["session"],
    });
    server.request(method, path, Some(token), Some(body)).await
}

async fn login_as(server: &Server, device_id: &str) -> User {
    let (status, body) = server
        .post(
            "/_matrix/client/v3/login",
            None,
            json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "bob" },
                    "password": "pw", "device_id": device_id }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    User {
        user_id: body["user_id"].as_str().unwrap().to_owned(),
        token: body["access_token"].as_str().unwrap().to_owned(),
        device_id: body["device_id"].as_str().unwrap().to_owned(),
    }
}

async fn a_pusher_goes_with_its_access_token(backend: Backend) {
    let server = Server::start_with(&backend, allowing_loopback()).await;
    let alice = server.register("alice", "pw").await;
    let carol = server.register("carol", "pw").await;
    server.register("bob", "pw").await;
    let (url, _, mut pushed) = gateway(Reply::Ok).await;
    let [a, b, c, k, p] = [
        login_as(&server, "A").await,
        login_as(&server, "B").await,
        login_as(&server, "C").await,
        login_as(&server, "K").await,
        login_as(&server, "P").await,
    ];
    for (user, key) in [(&a, "key-a"), (&b, "key-b"), (&c, "key-c"), (&k, "key-k"), (&p, "key-p")] {
        set_pusher(&server, &user.token, key, &url).await;
    }
    set_pusher(&server, &carol.token, "key-carol", &url).await;
    let room = room_with(&server, &alice, &[&p, &carol]).await;
    let first = say(&server, &alice, &room, "first").await;
    let all: Vec<(String, String)> = ["key-a", "key-b", "key-c", "key-carol", "key-k", "key-p"]
        .iter()
        .map(|k| (first.clone(), k.to_string()))
        .collect();
    assert_eq!(next_pushes(&mut pushed, 6).await, all, "every pusher works at first");

    // Logout: the device's pusher goes.
    let (status, _) = server.post("/_matrix/client/v3/logout", Some(&a.token), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(pushkeys(&server, &p.token).await, ["key-b", "key-c", "key-k", "key-p"]);
    // Deleting a device.
    let (status, body) =
        with_password(&server, Method::DELETE, "/_matrix/client/v3/devices/B", &p.token, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pushkeys(&server, &p.token).await, ["key-c", "key-k", "key-p"]);
    // A login naming device C replaces its token, and the old token's pusher.
    let c2 = login_as(&server, "C").await;
    assert_eq!(pushkeys(&server, &c2.token).await, ["key-k", "key-p"]);
    // A password change that logs the other devices out.
    let (status, body) = with_password(
        &server,
        Method::POST,
        "/_matrix/client/v3/account/password",
        &p.token,
        json!({ "new_password": "pw", "logout_devices": true }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pushkeys(&server, &p.token).await, ["key-p"]);
    let second = say(&server, &alice, &room, "second").await;
    let expected = vec![(second.clone(), "key-carol".to_owned()), (second.clone(), "key-p".to_owned())];
    assert_eq!(next_pushes(&mut pushed, 2).await, expected, "only the living pushers are told");

    // logout/all takes the last one.
    let (status, _) = server.post("/_matrix/client/v3/logout/all", Some(&p.token), json!({})).await;
    assert_eq!(status, 200);
    let fresh = login_as(&server, "FRESH").await;
    assert_eq!(pushkeys(&server, &fresh.token).await, Vec::<String>::new());
    let third = say(&server, &alice, &room, "third").await;
    assert_eq!(next_pushes(&mut pushed, 1).await, vec![(third, "key-carol".to_owned())]);
    let late = tokio::time::timeout(Duration::from_millis(0), pushed.recv()).await;
    assert!(late.is_err(), "nothing for bob after his tokens are gone: {late:?}");
}

async fn pusher_urls_must_name_the_notify_endpoint(backend: Backend) {
    let server = Server::start(&backend).await;
    let bob = server.register("bob", "pw").await;
    let t = Some(bob.token.as_str());
    for url in [
        "https://push.example.org/",
        "https://push.example.org/_matrix/push/v1/notify/extra",
        "https://push.example.org/_matrix/push/v1/notif",
        "ftp://push.example.org/_matrix/push/v1/notify",
        "file:///_matrix/push/v1/notify",
        "not a url",
        "",
    ] {
        let response = server.post("/_matrix/client/v3/pushers/set", t, pusher("key", url)).await;
        assert_error(&response, 400, "M_INVALID_PARAM", url);
    }
    assert_eq!(pushkeys(&server, &bob.token).await, Vec::<String>::new(), "nothing stored");

    // At most 20 pushers per user; replacing one is not adding one.
    let url = "https://push.example.org/_matrix/push/v1/notify";
    for i in 0..20 {
        set_pusher(&server, &bob.token, &format!("key-{i:02}"), url).await;
    }
    let response = server.post("/_matrix/client/v3/pushers/set", t, pusher("key-20", url)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "the 21st pusher");
    set_pusher(&server, &bob.token, "key-07", "http://push.example.net/_matrix/push/v1/notify").await;
    let keys = pushkeys(&server, &bob.token).await;
    assert_eq!(keys.len(), 20);
    assert!(!keys.contains(&"key-20".to_owned()));
    let (_, list) = server.get("/_matrix/client/v3/pushers", t).await;
    let replaced = list["pushers"].as_array().unwrap().iter().find(|p| p["pushkey"] == "key-07").unwrap();
    assert_eq!(replaced["data"]["url"], "http://push.example.net/_matrix/push/v1/notify");
    let delete = json!({ "pushkey": "key-03", "app_id": "org.example.app", "kind": null });
    let (status, body) = server.post("/_matrix/client/v3/pushers/set", t, delete).await;
    assert_eq!(status, 200, "{body}");
    set_pusher(&server, &bob.token, "key-20", url).await;
}

async fn internal_addresses_are_not_contacted_without_the_allow_setting(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (url, port, mut pushed) = gateway(Reply::Ok).await;
    set_pusher(&server, &bob.token, "by-address", &url).await;
    let by_name = format!("http://localhost:{port}/_matrix/push/v1/notify");
    set_pusher(&server, &bob.token, "by-name", &by_name).await;
    let room = room_with(&server, &alice, &[&bob]).await;
    say(&server, &alice, &room, "hello").await;
    wait_for_log(&server, &["push gateway not contacted", "address not allowed", &url], 1).await;
    wait_for_log(&server, &["push gateway not contacted", "address not allowed", &by_name], 1).await;
    let got = tokio::time::timeout(Duration::from_millis(0), pushed.recv()).await;
    assert!(got.is_err(), "the loopback gateway got a request: {got:?}");
}

async fn gateway_redirects_are_not_followed(backend: Backend) {
    let server = Server::start_with(&backend, allowing_loopback()).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (target, _, mut followed) = gateway(Reply::Ok).await;
    let (url, _, mut pushed) = gateway(Reply::Redirect(target)).await;
    set_pusher(&server, &bob.token, "bob-key", &url).await;
    let room = room_with(&server, &alice, &[&bob]).await;
    let event = say(&server, &alice, &room, "hello").await;
    assert_eq!(next_pushes(&mut pushed, 1).await, vec![(event, "bob-key".to_owned())]);
    wait_for_log(&server, &["redirect, not followed", &url], 1).await;
    let got = tokio::time::timeout(Duration::from_millis(0), followed.recv()).await;
    assert!(got.is_err(), "the redirect was followed: {got:?}");
    let again = tokio::time::timeout(Duration::from_millis(0), pushed.recv()).await;
    assert!(again.is_err(), "a redirect is final, not retried: {again:?}");
}

async fn a_huge_gateway_reply_is_abandoned(backend: Backend) {
    let server = Server::start_with(&backend, allowing_loopback()).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    // 64 MiB that would reject the pushkey if it were read whole.
    let (url, _, mut pushed) = gateway(Reply::Huge(64 << 20, "bob-key".into())).await;
    set_pusher(&server, &bob.token, "bob-key", &url).await;
    let room = room_with(&server, &alice, &[&bob]).await;
    let event = say(&server, &alice, &room, "hello").await;
    assert_eq!(next_pushes(&mut pushed, 1).await, vec![(event, "bob-key".to_owned())]);
    wait_for_log(&server, &["push gateway reply not read", &url], 1).await;
    assert_eq!(pushkeys(&server, &bob.token).await, ["bob-key"], "the reply was not acted on");
    let (status, _) = server.get("/_matrix/client/versions", None).await;
    assert_eq!(status, 200);
}

async fn https_gateways_must_present_a_trusted_certificate(backend: Backend) {
    // The gateway's CA is in no trust store: the handshake fails, nothing is posted.
    let server = Server::start_with(&backend, allowing_loopback()).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (url, mut seen) = tls_gateway().await;
    set_pusher(&server, &bob.token, "bob-key", &url).await;
    let room = room_with(&server, &alice, &[&bob]).await;
    say(&server, &alice, &room, "hello").await;
    let first = tokio::time::timeout(WAIT, seen.recv()).await.expect("a TLS handshake in time").unwrap();
    assert!(first.is_err(), "an untrusted certificate must fail the handshake: {first:?}");

    // The same kind of gateway, its CA trusted (the platform verifier reads
    // SSL_CERT_FILE): the push arrives over TLS.
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/test-ca.pem");
    let trusting = Server::start_with(&backend, allowing_loopback().env("SSL_CERT_FILE", ca)).await;
    let alice = trusting.register("alice", "pw").await;
    let bob = trusting.register("bob", "pw").await;
    let (url, mut seen) = tls_gateway().await;
    set_pusher(&trusting, &bob.token, "bob-key", &url).await;
    let room = room_with(&trusting, &alice, &[&bob]).await;
    let event = say(&trusting, &alice, &room, "hello").await;
    let got = tokio::time::timeout(WAIT, seen.recv()).await.expect("a push in time").unwrap();
    let body = got.expect("a trusted certificate completes the handshake");
    assert_eq!(body["notification"]["event_id"], event.as_str(), "{body}");
}
