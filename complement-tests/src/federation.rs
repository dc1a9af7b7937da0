//! Federation test support shared by every federation test file: a seqline
//! server with a TLS federation listener (`FedServer`), named
//! `127.0.0.1:<its federation port>` with a self-signed certificate the test
//! makes; free loopback ports; and the signing helpers a test needs to check
//! or forge federation signatures (canonical JSON, ed25519 over it, X-Matrix).

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde_json::{Value, json};

use crate::harness::{Backend, Options, Server};

/// A seqline server with a federation listener.
pub struct FedServer {
    /// The seqline process (client listener at `server.base_url`).
    pub server: Server,
    /// `127.0.0.1:<federation port>`, also the server name.
    pub name: String,
    https: reqwest::Client,
    /// The certificate and key (kept for restarts).
    _cert_dir: TempDir,
}

/// A directory removed when dropped (also when a start is abandoned midway).
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port on loopback (bound and released: the server name must carry
/// the federation port before the server starts). Taken below the kernel's
/// ephemeral range (32768 up), where the outgoing connections of every
/// process get their ports: a port handed out by binding port 0 could be
/// taken by one of those before the server binds it ("Address already in
/// use"). Each test process starts at its own offset and counts up.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(LOW + (start + n) % SPAN).unwrap_or(20_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A self-signed certificate for 127.0.0.1 and localhost (P-256), made with
/// the openssl command in `dir` (created); returns the certificate and key paths.
pub fn make_certificate(dir: &Path) -> (String, String) {
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

/// An HTTPS client that accepts the tests' self-signed certificates.
pub fn https_client() -> reqwest::Client {
    // Built with seqline in one workspace, reqwest needs a rustls provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

impl FedServer {
    /// Starts seqline with a federation listener on a free port, talking to
    /// peers on loopback without checking their certificates.
    pub async fn start(backend: &Backend) -> Self {
        Self::start_with(backend, &[]).await
    }

    /// [`FedServer::start`] with more environment settings.
    pub async fn start_with(backend: &Backend, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let name = format!("127.0.0.1:{port}");
        let dir =
            TempDir(std::env::temp_dir().join(format!("seqline-fed-cert-{}-{port}", std::process::id())));
        let (cert, key) = make_certificate(&dir.0);
        let options = Options::default()
            .env("SEQLINE_SERVER_NAME", &name)
            .env("SEQLINE_LISTEN_FEDERATION", &name)
            .env("SEQLINE_TLS_CERT", &cert)
            .env("SEQLINE_TLS_KEY", &key)
            .env("SEQLINE_FEDERATION_VERIFY_TLS", "false")
            .env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8");
        let options = env.iter().fold(options, |options, (key, value)| options.env(key, value));
        let server = Server::start_with(backend, options).await;
        assert!(
            server.log().contains(&format!("federation listening on https://{name}")),
            "{}",
            server.log()
        );
        Self { server, name, https: https_client(), _cert_dir: dir }
    }

    /// The user id of `localpart` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.name)
    }

    /// The server's signing key from its key file: (key id, key).
    pub fn signing_key(&self) -> (String, SigningKey) {
        let line = std::fs::read_to_string(self.server.data_dir.join("signing.key")).unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        let seed: [u8; 32] = STANDARD_NO_PAD.decode(parts[2]).unwrap().try_into().unwrap();
        (format!("ed25519:{}", parts[1]), SigningKey::from_bytes(&seed))
    }

    /// The server's key id and unpadded base64 public key.
    pub fn public_key(&self) -> (String, String) {
        let (key_id, key) = self.signing_key();
        (key_id, STANDARD_NO_PAD.encode(key.verifying_key().to_bytes()))
    }

    /// A request to the federation listener, with an optional Authorization header.
    pub async fn send(
        &self,
        method: &str,
        uri: &str,
        auth: Option<String>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        federation_request(&self.https, &self.name, method, uri, auth, body).await
    }
}

/// A request over HTTPS to the federation listener at `name` (`host:port`).
pub async fn federation_request(
    https: &reqwest::Client,
    name: &str,
    method: &str,
    uri: &str,
    auth: Option<String>,
    body: Option<&Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = https.request(method, format!("https://{name}{uri}"));
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

/// The canonical JSON of `object` without `signatures` and `unsigned`
/// (serde_json's maps are sorted and `to_string` is compact).
pub fn canonical(object: &Value) -> String {
    let mut object = object.clone();
    let map = object.as_object_mut().unwrap();
    map.remove("signatures");
    map.remove("unsigned");
    serde_json::to_string(&object).unwrap()
}

/// Asserts that `object` carries a signature by `signer` with `key_id` that
/// the unpadded base64 ed25519 key `public` verifies.
pub fn verify(object: &Value, signer: &str, key_id: &str, public: &str) {
    let sig = object["signatures"][signer][key_id]
        .as_str()
        .unwrap_or_else(|| panic!("no {signer} {key_id}: {object}"));
    let sig = ed25519_dalek::Signature::from_slice(&STANDARD_NO_PAD.decode(sig).unwrap()).unwrap();
    let public: [u8; 32] = STANDARD_NO_PAD.decode(public).unwrap().try_into().unwrap();
    VerifyingKey::from_bytes(&public)
        .unwrap()
        .verify(canonical(object).as_bytes(), &sig)
        .unwrap_or_else(|e| panic!("{signer}'s {key_id} signature does not verify ({e}): {object}"));
}

/// An X-Matrix Authorization header for a request from `origin` to
/// `destination`, signed with `key`.
pub fn x_matrix(
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

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}
