//! A scriptable fake federation server, for tests where another server must
//! answer the way a hostile (or simply precise) one would.
//!
//! `FakeServer` is named `127.0.0.1:<port>` and listens with TLS there (a
//! self-signed certificate, as `FedServer`'s: seqline under test trusts it as
//! any peer, since it allows loopback and does not verify certificates). It
//! has its own ed25519 key and serves its key object at
//! `/_matrix/key/v2/server`, self-signed, with a `valid_until_ts` and
//! `old_verify_keys` the test may change (`set_key_validity`,
//! `set_old_verify_keys`).
//!
//! Requests are answered from the test's script: `answer(method, path
//! prefix, status, body)` or `answer_with(method, prefix, handler)`; the
//! most recent matching entry wins, paths are matched percent-decoded
//! (`/_matrix/federation/v1/make_join/!room:x/@u:y`). Unscripted, the key
//! object is served (also as `/_matrix/key/v2/query/<its name>`), a `/send`
//! transaction is taken (200, no per-PDU errors) and anything else is
//! 404 M_UNRECOGNIZED. Every request is recorded (`requests`, `requests_to`)
//! so a test can assert what seqline asked.
//!
//! It also acts as a server towards seqline: `call` (signed with X-Matrix),
//! `send_txn`, `join` (make_join + send_join of one of its users) and
//! `event`; `sign` signs a PDU as this server. `FakeRoom` is a room the fake
//! hosts (room versions 11 and 12): create event, creator's join, power
//! levels, public join rules, shared history; `add` appends signed events
//! with the spec's auth events, `join_template` / `send_join_answer` are
//! what make_join / send_join answer.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ed25519_dalek::{Signer, SigningKey};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

use crate::api::enc;
use crate::federation::{FedServer, TempDir, canonical, make_certificate, now_ms, x_matrix};
use crate::pdu;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The path, percent-decoded.
    pub path: String,
    /// The raw query string (empty when none).
    pub query: String,
    /// The X-Matrix origin, when the request was signed.
    pub origin: Option<String>,
    /// The JSON body (`Null` when none or not JSON).
    pub body: Value,
    /// The body's size in bytes, as received.
    pub bytes: usize,
}

/// A scripted answer computed from the request: `None` lets an older
/// matching entry (or the default) answer.
pub type Handler = Arc<dyn Fn(&Received) -> Option<(u16, Value)> + Send + Sync>;

struct Route {
    method: String,
    prefix: String,
    handler: Handler,
}

/// What the listener shares with the test.
struct Shared {
    name: String,
    key_id: String,
    key: SigningKey,
    valid_until_ts: Mutex<i64>,
    old_verify_keys: Mutex<Value>,
    routes: Mutex<Vec<Route>>,
    requests: Mutex<Vec<Received>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The self-signed key object of `/_matrix/key/v2/server`.
    fn key_object(&self) -> Value {
        let public = STANDARD_NO_PAD.encode(self.key.verifying_key().to_bytes());
        let mut object = json!({
            "server_name": self.name,
            "valid_until_ts": *lock(&self.valid_until_ts),
            "verify_keys": { &self.key_id: { "key": public } },
            "old_verify_keys": lock(&self.old_verify_keys).clone(),
        });
        let sig = STANDARD_NO_PAD.encode(self.key.sign(canonical(&object).as_bytes()).to_bytes());
        object["signatures"] = json!({ &self.name: { &self.key_id: sig } });
        object
    }

    fn answer(&self, request: &Received) -> (u16, Value) {
        let handlers: Vec<Handler> = lock(&self.routes)
            .iter()
            .rev()
            .filter(|r| r.method == request.method && request.path.starts_with(&r.prefix))
            .map(|r| r.handler.clone())
            .collect();
        if let Some(answer) = handlers.iter().find_map(|h| h(request)) {
            return answer;
        }
        if request.method == "GET" && request.path.starts_with("/_matrix/key/v2/server") {
            return (200, self.key_object());
        }
        // As its own notary: its key object, whatever validity was asked for.
        if request.method == "GET" && request.path == format!("/_matrix/key/v2/query/{}", self.name) {
            return (200, json!({ "server_keys": [self.key_object()] }));
        }
        if request.method == "PUT" && request.path.starts_with("/_matrix/federation/v1/send/") {
            return (200, json!({ "pdus": {} }));
        }
        (404, json!({ "errcode": "M_UNRECOGNIZED", "error": "not scripted" }))
    }
}

/// Percent-decodes a URI path.
fn decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `origin` of an X-Matrix Authorization header.
fn x_matrix_origin(header: &str) -> Option<String> {
    let params = header.strip_prefix("X-Matrix ")?;
    params.split(',').find_map(|p| {
        let value = p.trim().strip_prefix("origin=")?;
        Some(value.trim_matches('"').to_owned())
    })
}

async fn serve(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = decode(request.uri().path());
    let query = request.uri().query().unwrap_or_default().to_owned();
    let origin =
        request.headers().get("authorization").and_then(|h| h.to_str().ok()).and_then(x_matrix_origin);
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let bytes = body.len();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let received = Received { method, path, query, origin, body, bytes };
    let (status, answer) = shared.answer(&received);
    lock(&shared.requests).push(received);
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    response
        .headers_mut()
        .insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    Ok(response)
}

/// A fake federation server (see the module documentation).
pub struct FakeServer {
    /// `127.0.0.1:<port>`, also the server name.
    pub name: String,
    /// Its signing key: (key id, key).
    pub key: (String, SigningKey),
    shared: Arc<Shared>,
    listener: tokio::task::JoinHandle<()>,
    _cert_dir: TempDir,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl FakeServer {
    /// Starts listening (TLS) on a free loopback port, with a fresh key
    /// valid for a day.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let name = format!("127.0.0.1:{port}");
        let dir =
            TempDir(std::env::temp_dir().join(format!("seqline-fake-cert-{}-{port}", std::process::id())));
        let (cert, key_path) = make_certificate(&dir.0);
        let acceptor = tls_acceptor(&cert, &key_path);
        let key = (format!("ed25519:fake{port}"), SigningKey::from_bytes(&rand::random::<[u8; 32]>()));
        let shared = Arc::new(Shared {
            name: name.clone(),
            key_id: key.0.clone(),
            key: key.1.clone(),
            valid_until_ts: Mutex::new(now_ms() + 24 * 3600 * 1000),
            old_verify_keys: Mutex::new(json!({})),
            routes: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
        });
        let served = shared.clone();
        let listener = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, shared) = (acceptor.clone(), served.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(socket).await else { return };
                    let service = hyper::service::service_fn(move |r| serve(shared.clone(), r));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { name, key, shared, listener, _cert_dir: dir }
    }

    /// The user id of `localpart` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.name)
    }

    /// Sets the `valid_until_ts` of the key object it serves.
    pub fn set_key_validity(&self, valid_until_ts: i64) {
        *lock(&self.shared.valid_until_ts) = valid_until_ts;
    }

    /// Sets the `old_verify_keys` of the key object it serves
    /// (`{"ed25519:old": {"key": ..., "expired_ts": ...}}`).
    pub fn set_old_verify_keys(&self, old_verify_keys: Value) {
        *lock(&self.shared.old_verify_keys) = old_verify_keys;
    }

    /// The key object it serves now.
    pub fn key_object(&self) -> Value {
        self.shared.key_object()
    }

    /// Answers `method` requests whose decoded path starts with `prefix`
    /// with `status` and `body` (over older scripts for the same requests).
    pub fn answer(&self, method: &str, prefix: &str, status: u16, body: Value) {
        self.answer_with(method, prefix, move |_| Some((status, body.clone())));
    }

    /// Answers `method` requests whose decoded path starts with `prefix`
    /// with what `handler` makes of them (`None`: an older script answers).
    pub fn answer_with(
        &self,
        method: &str,
        prefix: &str,
        handler: impl Fn(&Received) -> Option<(u16, Value)> + Send + Sync + 'static,
    ) {
        lock(&self.shared.routes).push(Route {
            method: method.to_owned(),
            prefix: prefix.to_owned(),
            handler: Arc::new(handler),
        });
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Received> {
        lock(&self.shared.requests).clone()
    }

    /// The requests received so far whose decoded path starts with `prefix`.
    pub fn requests_to(&self, prefix: &str) -> Vec<Received> {
        self.requests().into_iter().filter(|r| r.path.starts_with(prefix)).collect()
    }

    /// Signs `pdu` as this server (content hash, signature); answers its event id.
    pub fn sign(&self, pdu: &mut Value) -> String {
        pdu::sign(pdu, &self.name, &self.key.0, &self.key.1)
    }

    /// A request to `target`'s federation listener signed with X-Matrix.
    pub async fn call(
        &self,
        target: &FedServer,
        method: &str,
        uri: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let auth = x_matrix(&self.name, &target.name, &self.key, method, uri, body);
        target.send(method, uri, Some(auth), body).await
    }

    /// A transaction of `pdus` to `target`; answers its status and per-PDU results.
    pub async fn send_txn(&self, target: &FedServer, txn: &str, pdus: &[&Value]) -> (u16, Value) {
        let body = json!({ "origin": self.name, "origin_server_ts": now_ms(), "pdus": pdus });
        self.call(target, "PUT", &format!("/_matrix/federation/v1/send/{txn}"), Some(&body)).await
    }

    /// `GET /event/{id}` of `target`: the PDU.
    pub async fn event(&self, target: &FedServer, event_id: &str) -> Value {
        let uri = format!("/_matrix/federation/v1/event/{}", enc(event_id));
        let (status, answer) = self.call(target, "GET", &uri, None).await;
        assert_eq!(status, 200, "{uri}: {answer}");
        answer["pdus"][0].clone()
    }

    /// `user` (of this server) joins `room` on `target` by make_join
    /// (versions 11 and 12) and send_join v2; answers the join's event id,
    /// the signed join and the send_join answer.
    pub async fn join(&self, target: &FedServer, room: &str, user: &str) -> (String, Value, Value) {
        let make_join = format!("/_matrix/federation/v1/make_join/{}/{}?ver=11&ver=12", enc(room), enc(user));
        let (status, template) = self.call(target, "GET", &make_join, None).await;
        assert_eq!(status, 200, "{template}");
        let mut join = template["event"].clone();
        join["origin_server_ts"] = json!(now_ms());
        let join_id = self.sign(&mut join);
        let send_join = format!("/_matrix/federation/v2/send_join/{}/{}", enc(room), enc(&join_id));
        let (status, answer) = self.call(target, "PUT", &send_join, Some(&join)).await;
        assert_eq!(status, 200, "{answer}");
        (join_id, join, answer)
    }

    /// Creates a room this server hosts (`version` 11 or 12), `creator` one
    /// of its users: create, the creator's join, power levels (the creator
    /// at 100 before v12, where creators outrank everyone), public join
    /// rules, shared history.
    pub fn create_room(&self, version: &str, creator: &str) -> FakeRoom {
        assert!(matches!(version, "11" | "12"), "FakeRoom makes rooms of versions 11 and 12");
        let mut room = FakeRoom {
            version: version.to_owned(),
            room_id: String::new(),
            events: Vec::new(),
            state: BTreeMap::new(),
            by_id: HashMap::new(),
            index: HashMap::new(),
            depth: 0,
            last: None,
        };
        let mut create = json!({
            "type": "m.room.create", "state_key": "", "sender": creator,
            "content": { "room_version": version }, "origin_server_ts": now_ms(),
            "depth": 1, "prev_events": [], "auth_events": [],
        });
        if version == "12" {
            let id = self.sign(&mut create);
            room.room_id = format!("!{}", &id[1..]);
        } else {
            room.room_id = format!("!fake{}:{}", rand::random::<u32>(), self.name);
            create["room_id"] = json!(room.room_id);
            self.sign(&mut create);
        }
        room.push(create);
        self.add(&mut room, "m.room.member", Some(creator), creator, json!({ "membership": "join" }));
        let users = if version == "12" { json!({}) } else { json!({ creator: 100 }) };
        let power = json!({
            "users": users, "users_default": 0, "events": {}, "events_default": 0,
            "state_default": 50, "ban": 50, "kick": 50, "redact": 50, "invite": 0,
        });
        self.add(&mut room, "m.room.power_levels", Some(""), creator, power);
        self.add(&mut room, "m.room.join_rules", Some(""), creator, json!({ "join_rule": "public" }));
        let history = json!({ "history_visibility": "shared" });
        self.add(&mut room, "m.room.history_visibility", Some(""), creator, history);
        room
    }

    /// Appends an event of this server's `sender` to `room`, signed;
    /// answers its id and the PDU.
    pub fn add(
        &self,
        room: &mut FakeRoom,
        kind: &str,
        state_key: Option<&str>,
        sender: &str,
        content: Value,
    ) -> (String, Value) {
        let mut event = room.draft(kind, state_key, sender, content);
        let id = self.sign(&mut event);
        room.push(event.clone());
        (id, event)
    }
}

/// The TLS acceptor for the certificate and key (PEM files).
fn tls_acceptor(cert: &str, key: &str) -> tokio_rustls::TlsAcceptor {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer> =
        CertificateDer::pem_file_iter(cert).expect("certificate").collect::<Result<_, _>>().expect("pem");
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("certificate and key");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A room a `FakeServer` hosts: its events in order and its current state.
pub struct FakeRoom {
    /// "11" or "12".
    pub version: String,
    /// Its id (v12: `!` + the create event's reference hash).
    pub room_id: String,
    /// Every event, oldest first.
    pub events: Vec<Value>,
    state: BTreeMap<(String, String), String>,
    by_id: HashMap<String, Value>,
    /// The index in `events` of each of them, by id.
    index: HashMap<String, usize>,
    depth: i64,
    last: Option<String>,
}

impl FakeRoom {
    /// A room another server hosts, as one of this server's users joined
    /// it: `state` is the room's state send_join answered (its `state`),
    /// `join` the signed join, which becomes the room's newest event (and
    /// its only one in `events`). `draft` and `FakeServer::add` build on it.
    pub fn joined(version: &str, room_id: &str, state: &[Value], join: Value) -> Self {
        assert!(matches!(version, "11" | "12"), "FakeRoom makes events for versions 11 and 12");
        let mut room = FakeRoom {
            version: version.to_owned(),
            room_id: room_id.to_owned(),
            events: Vec::new(),
            state: BTreeMap::new(),
            by_id: HashMap::new(),
            index: HashMap::new(),
            depth: 0,
            last: None,
        };
        for event in state {
            let id = pdu::event_id(event);
            if let (Some(kind), Some(key)) = (event["type"].as_str(), event["state_key"].as_str()) {
                room.state.insert((kind.to_owned(), key.to_owned()), id.clone());
            }
            room.by_id.insert(id, event.clone());
        }
        room.push(join);
        room
    }

    /// The event of this id the room holds (its own events and the state it joined with).
    pub fn get(&self, event_id: &str) -> Option<&Value> {
        self.by_id.get(event_id)
    }

    /// Adds a signed event (of any server) as the room's newest.
    pub fn push(&mut self, event: Value) -> String {
        let id = pdu::event_id(&event);
        if let Some(key) = event["state_key"].as_str() {
            let kind = event["type"].as_str().unwrap_or_default().to_owned();
            self.state.insert((kind, key.to_owned()), id.clone());
        }
        self.depth = self.depth.max(event["depth"].as_i64().unwrap_or_default());
        self.last = Some(id.clone());
        self.by_id.insert(id.clone(), event.clone());
        self.index.insert(id.clone(), self.events.len());
        self.events.push(event);
        id
    }

    /// Where the event of this id is in `events` (`None`: not one of them).
    pub fn index_of(&self, event_id: &str) -> Option<usize> {
        self.index.get(event_id).copied()
    }

    /// The id of the current state event of `kind` and `state_key`.
    pub fn state_id(&self, kind: &str, state_key: &str) -> Option<String> {
        self.state.get(&(kind.to_owned(), state_key.to_owned())).cloned()
    }

    /// The current state's events.
    pub fn state_events(&self) -> Vec<Value> {
        self.state.values().map(|id| self.by_id[id].clone()).collect()
    }

    /// An unsigned event on top of the room, with the auth events the spec
    /// selects (create before v12, power levels, the sender's member event;
    /// for a member event the target's and, joining, the join rules).
    pub fn draft(&self, kind: &str, state_key: Option<&str>, sender: &str, content: Value) -> Value {
        let mut wanted = vec![("m.room.power_levels", ""), ("m.room.member", sender)];
        if self.version != "12" {
            wanted.push(("m.room.create", ""));
        }
        if kind == "m.room.member" {
            wanted.push(("m.room.member", state_key.unwrap_or_default()));
            if matches!(content["membership"].as_str(), Some("join" | "invite")) {
                wanted.push(("m.room.join_rules", ""));
            }
        }
        let mut auth: Vec<String> = wanted.iter().filter_map(|(k, s)| self.state_id(k, s)).collect();
        auth.sort();
        auth.dedup();
        let mut event = json!({
            "room_id": self.room_id, "type": kind, "sender": sender, "content": content,
            "origin_server_ts": now_ms(), "depth": self.depth + 1,
            "prev_events": self.last.iter().collect::<Vec<_>>(), "auth_events": auth,
        });
        if let Some(key) = state_key {
            event["state_key"] = json!(key);
        }
        event
    }

    /// make_join's answer for `user`: the room's version and the join template.
    pub fn join_template(&self, user: &str) -> Value {
        let event = self.draft("m.room.member", Some(user), user, json!({ "membership": "join" }));
        json!({ "room_version": self.version, "event": event })
    }

    /// send_join's answer: the current state, every event as the auth
    /// chain, and `servers` as the servers in the room.
    pub fn send_join_answer(&self, servers: &[&str]) -> Value {
        json!({
            "state": self.state_events(), "auth_chain": self.events,
            "members_omitted": false, "servers_in_room": servers,
        })
    }
}
