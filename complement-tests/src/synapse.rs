//! A real Synapse (from PyPI) as a federation peer: each test starts its own
//! in a fresh temporary directory and it is killed when the `Synapse` is
//! dropped.
//!
//! `clients/synapse/setup.sh` builds the venv once (pinned
//! `requirements.txt`, wheels only) under
//! `${SEQLINE_CLIENT_CACHE:-~/.cache/seqline/clients}/synapse-venv`; later runs
//! only check its stamp. Nothing is skipped: without Python 3.10+, or without
//! PyPI on the first run, every test that starts a Synapse fails with the
//! setup script's reason.
//!
//! The generated `homeserver.yaml` (written as JSON, which YAML reads) follows
//! FEDERATION.md §8: server name `127.0.0.1:<federation port>`, a TLS federation
//! listener on that port (self-signed certificate from
//! `federation::make_certificate`), a plain HTTP client listener on another free
//! port, SQLite, keys fetched directly from their servers
//! (`trusted_key_servers: []`), peers' certificates not checked, loopback
//! allowed as a destination, open registration, rate limits lifted. The
//! signing key is made here, so a test knows Synapse's key id and public key
//! before it starts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ed25519_dalek::SigningKey;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::federation::{federation_request, free_port, https_client, make_certificate};
use crate::harness::User;

/// The first run installs from PyPI; later ones only check a stamp.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// A start takes about 2.5 s on an idle 2-core machine; this is the limit past
/// which it hangs (generous: other builds may share the cores).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts at starting when a port picked by `free_port` was taken meanwhile.
const PORT_ATTEMPTS: usize = 3;

/// Synapse's default `ip_range_blacklist` without `127.0.0.0/8`: Synapse checks
/// an IP-literal server name against this list only.
const IP_RANGE_BLACKLIST: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "169.254.0.0/16",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "192.0.2.0/24",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "::1/128",
    "fe80::/10",
    "fc00::/7",
    "2001:db8::/32",
    "ff00::/8",
    "fec0::/10",
];

/// Synapse's rate limiters (`rc_*`, the nested ones by their leaves), all lifted.
const RATE_LIMITS: &[&str] = &[
    "rc_message",
    "rc_registration",
    "rc_registration_token_validity",
    "rc_login.address",
    "rc_login.account",
    "rc_login.failed_attempts",
    "rc_admin_redaction",
    "rc_joins.local",
    "rc_joins.remote",
    "rc_joins_per_room",
    "rc_key_requests",
    "rc_3pid_validation",
    "rc_invites.per_room",
    "rc_invites.per_user",
    "rc_invites.per_issuer",
    "rc_third_party_invite",
    "rc_media_create",
    "rc_presence.per_user",
    "rc_delayed_event_mgmt",
    "rc_room_creation",
    "rc_reports",
    "rc_user_directory",
    "rc_profile",
];

fn synapse_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/synapse")
}

/// Runs `clients/synapse/setup.sh` and returns the venv's python; panics with
/// the script's reason when Synapse cannot be installed.
pub async fn python() -> PathBuf {
    let mut cmd = Command::new("bash");
    cmd.arg(synapse_dir().join("setup.sh"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("clients/synapse/setup.sh: could not start: {e}"));
    let output = match tokio::time::timeout(SETUP_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("clients/synapse/setup.sh: {e}")),
        Err(_) => panic!("clients/synapse/setup.sh did not finish within {SETUP_TIMEOUT:?}"),
    };
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "clients/synapse/setup.sh failed ({}): Synapse could not be installed, so the federation \
         tests against it cannot run. A fresh machine needs python3 (3.10 or newer) and PyPI once.\n{text}",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let python = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(python.is_file(), "clients/synapse/setup.sh printed no python path:\n{text}");
    python
}

/// Options for starting a Synapse.
#[derive(Debug, Clone, Default)]
pub struct SynapseOptions {
    /// `default_room_version` (Synapse's own default is "12").
    pub default_room_version: Option<String>,
}

impl SynapseOptions {
    /// Rooms are created with this version unless the request names one.
    pub fn default_room_version(mut self, version: &str) -> Self {
        self.default_room_version = Some(version.to_owned());
        self
    }
}

/// A running Synapse and its temporary directory (removed on drop).
pub struct Synapse {
    child: Option<Child>,
    /// `127.0.0.1:<federation port>`: the server name and the TLS federation
    /// listener's address.
    pub name: String,
    /// `http://127.0.0.1:<client port>`.
    pub client_url: String,
    /// Config, database, keys, media and logs.
    pub dir: PathBuf,
    /// The signing key's id (`ed25519:a_…`).
    pub key_id: String,
    /// The signing key's public half, unpadded base64.
    pub public_key: String,
    /// How long the start took (process start to `/versions` answering).
    pub started_in: Duration,
    http: reqwest::Client,
    https: reqwest::Client,
}

impl Synapse {
    /// Starts a Synapse with the default options.
    pub async fn start() -> Self {
        Self::start_with(SynapseOptions::default()).await
    }

    /// Installs Synapse if needed (setup.sh), then starts one in a fresh
    /// directory and waits until its client API answers.
    pub async fn start_with(options: SynapseOptions) -> Self {
        let python = python().await;
        let r: u64 = rand::random();
        let dir = std::env::temp_dir().join(format!("seqline-synapse-{}-{r:016x}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the Synapse directory");
        make_certificate(&dir);
        let seed: [u8; 32] = rand::random();
        let key_name = format!("a_{:04x}", rand::random::<u16>());
        std::fs::write(
            dir.join("signing.key"),
            format!("ed25519 {key_name} {}\n", STANDARD_NO_PAD.encode(seed)),
        )
        .expect("write the signing key");
        let public_key = STANDARD_NO_PAD.encode(SigningKey::from_bytes(&seed).verifying_key().to_bytes());
        std::fs::write(dir.join("log.yaml"), log_config(&dir)).expect("write the log config");

        // Built with seqline in one workspace, reqwest needs a rustls provider
        // (a test that starts no seqline server first has none installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
        let mut synapse = Self {
            child: None,
            name: String::new(),
            client_url: String::new(),
            dir,
            key_id: format!("ed25519:{key_name}"),
            public_key,
            started_in: Duration::ZERO,
            http,
            https: https_client(),
        };
        for attempt in 1..=PORT_ATTEMPTS {
            let (federation_port, client_port) = (free_port(), free_port());
            synapse.name = format!("127.0.0.1:{federation_port}");
            synapse.client_url = format!("http://127.0.0.1:{client_port}");
            let config = synapse.config(federation_port, client_port, &options);
            std::fs::write(
                synapse.dir.join("homeserver.yaml"),
                serde_json::to_string_pretty(&config).unwrap(),
            )
            .expect("write homeserver.yaml");
            match synapse.launch(&python).await {
                Ok(()) => break,
                Err(log) if attempt < PORT_ATTEMPTS && log.contains("Address already in use") => {
                    let _ = std::fs::remove_file(synapse.dir.join("homeserver.db"));
                }
                Err(log) => panic!("Synapse exited before answering:\n{}", tail(&log)),
            }
        }
        eprintln!("synapse {} started in {:.1} s", synapse.name, synapse.started_in.as_secs_f64());

        // The federation listener comes up a moment after the client one:
        // wait until it accepts connections, then it must serve our key.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tokio::net::TcpStream::connect(synapse.name.as_str()).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "Synapse's federation listener at {} never accepted a connection\n{}",
                synapse.name,
                tail(&synapse.log())
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let (status, keys) = synapse.federation("GET", "/_matrix/key/v2/server", None).await;
        assert_eq!(
            (status, keys["verify_keys"][&synapse.key_id]["key"].as_str()),
            (200, Some(synapse.public_key.as_str())),
            "Synapse's federation listener at {}: {keys}\n{}",
            synapse.name,
            tail(&synapse.log())
        );
        synapse
    }

    fn config(&self, federation_port: u16, client_port: u16, options: &SynapseOptions) -> Value {
        let path = |file: &str| self.dir.join(file).display().to_string();
        let lifted = json!({ "per_second": 1_000_000, "burst_count": 1_000_000 });
        let mut config = json!({
            "server_name": self.name,
            "public_baseurl": format!("{}/", self.client_url),
            "report_stats": false,
            "listeners": [
                {
                    "port": federation_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": true,
                    "x_forwarded": false,
                    "resources": [{ "names": ["federation"], "compress": false }],
                },
                {
                    "port": client_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": false,
                    "x_forwarded": false,
                    "resources": [{ "names": ["client"], "compress": false }],
                },
            ],
            "tls_certificate_path": path("cert.pem"),
            "tls_private_key_path": path("key.pem"),
            "database": { "name": "sqlite3", "args": { "database": path("homeserver.db") } },
            "signing_key_path": path("signing.key"),
            "media_store_path": path("media"),
            "log_config": path("log.yaml"),
            "macaroon_secret_key": format!("{:032x}", rand::random::<u128>()),
            "form_secret": format!("{:032x}", rand::random::<u128>()),
            "trusted_key_servers": [],
            "suppress_key_server_warning": true,
            "federation_verify_certificates": false,
            "ip_range_blacklist": IP_RANGE_BLACKLIST,
            "ip_range_whitelist": ["127.0.0.0/8"],
            "enable_registration": true,
            "enable_registration_without_verification": true,
            "bcrypt_rounds": 4,
            "allow_public_rooms_over_federation": true,
            // Synapse lets only admins publish rooms by default.
            "room_list_publication_rules": [{ "action": "allow" }],
            "rc_federation": {
                "window_size": 1000,
                "sleep_limit": 1_000_000,
                "sleep_delay": 0,
                "reject_limit": 1_000_000,
                "concurrent": 1_000_000,
            },
        });
        for limit in RATE_LIMITS {
            match limit.split_once('.') {
                Some((outer, inner)) => config[outer][inner] = lifted.clone(),
                None => config[*limit] = lifted.clone(),
            }
        }
        if let Some(version) = &options.default_room_version {
            config["default_room_version"] = json!(version);
        }
        config
    }

    /// Starts the process and polls `/_matrix/client/versions` until it
    /// answers; `Err(log)` when the process exits first.
    async fn launch(&mut self, python: &Path) -> Result<(), String> {
        let out = std::fs::File::create(self.dir.join("stdout.log")).expect("create stdout.log");
        let mut child = Command::new(python)
            .args(["-m", "synapse.app.homeserver", "--config-path"])
            .arg(self.dir.join("homeserver.yaml"))
            .current_dir(&self.dir)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("stdout.log"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn Synapse");
        let started = Instant::now();
        let url = format!("{}/_matrix/client/versions", self.client_url);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("Synapse exited with {status}\n{}", self.log()));
            }
            let answered = self.http.get(&url).timeout(Duration::from_secs(5)).send().await;
            if answered.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.start_kill();
                panic!("Synapse did not answer {url} within {START_TIMEOUT:?}:\n{}", tail(&self.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.started_in = started.elapsed();
        self.child = Some(child);
        Ok(())
    }

    /// Synapse's output: its stdout/stderr, then its log file.
    pub fn log(&self) -> String {
        let read = |file: &str| std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        format!("{}{}", read("stdout.log"), read("homeserver.log"))
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log())
    }

    /// The user id of `localpart` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.name)
    }

    /// A client API request with an optional JSON body and access token;
    /// returns the status and the JSON body (`Value::Null` if not JSON).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.client_url));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response =
            req.send().await.unwrap_or_else(|e| panic!("Synapse request {path}: {e}\n{}", self.log_tail()));
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("response body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// GET on the client API.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.request(Method::GET, path, token, None).await
    }

    /// POST on the client API.
    pub async fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.request(Method::POST, path, token, Some(body)).await
    }

    /// PUT on the client API.
    pub async fn put(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.request(Method::PUT, path, token, Some(body)).await
    }

    /// An unsigned request to the federation listener (key endpoints, version).
    pub async fn federation(&self, method: &str, uri: &str, body: Option<&Value>) -> (u16, Value) {
        federation_request(&self.https, &self.name, method, uri, None, body).await
    }

    /// A federation request signed (X-Matrix) as the server `origin` with
    /// its `key`: a test acting as that server toward Synapse.
    pub async fn federation_as(
        &self,
        origin: &str,
        key: &(String, SigningKey),
        method: &str,
        uri: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let auth = crate::federation::x_matrix(origin, &self.name, key, method, uri, body);
        federation_request(&self.https, &self.name, method, uri, Some(auth), body).await
    }

    /// Registers `localpart` with a password through the dummy auth stage.
    pub async fn register(&self, localpart: &str, password: &str) -> User {
        let body = json!({
            "username": localpart,
            "password": password,
            "auth": { "type": "m.login.dummy" },
        });
        let (status, body) = self.post("/_matrix/client/v3/register", None, body).await;
        assert_eq!(status, 200, "register {localpart} on Synapse: {body}\n{}", self.log_tail());
        let field = |k: &str| body[k].as_str().unwrap_or_else(|| panic!("no {k} in {body}")).to_owned();
        User { user_id: field("user_id"), token: field("access_token"), device_id: field("device_id") }
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Python logging to `homeserver.log` in `dir`, at INFO.
fn log_config(dir: &Path) -> String {
    let config = json!({
        "version": 1,
        "formatters": { "plain": { "format": "%(asctime)s %(name)s %(levelname)s %(message)s" } },
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": dir.join("homeserver.log").display().to_string(),
                "formatter": "plain",
            },
        },
        "root": { "level": "INFO", "handlers": ["file"] },
        "disable_existing_loggers": false,
    });
    serde_json::to_string_pretty(&config).unwrap()
}

/// The last 60 lines of `log`.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
