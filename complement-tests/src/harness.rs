//! The black-box harness: starts the real `seqline` binary with a fresh data
//! directory on a free loopback port (the server binds port 0 and the harness
//! reads the address from its "listening on" log line), waits until it
//! answers, and stops it at the end. Tests talk HTTP only.
//!
//! Backends: every test runs on SQLite; with `SEQLINE_TEST_POSTGRES_URL` set it
//! also runs on PostgreSQL, each server in its own schema so tests run in
//! parallel.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// How long a server may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Which database a test server uses.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A SQLite file in the data dir.
    Sqlite,
    /// A fresh schema in the PostgreSQL database at this URL.
    Postgres(String),
}

impl Backend {
    /// The PostgreSQL backend, when `SEQLINE_TEST_POSTGRES_URL` is set.
    pub fn postgres() -> Option<Self> {
        std::env::var("SEQLINE_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()).map(Self::Postgres)
    }
}

/// Runs a test body once per backend: `sqlite` always, `postgres` when
/// configured. Each listed name is an `async fn(Backend)` in scope.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::harness::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    match $crate::harness::Backend::postgres() {
                        Some(backend) => super::$name(backend).await,
                        None => eprintln!("postgres skipped: SEQLINE_TEST_POSTGRES_URL is not set"),
                    }
                }
            }
        )*
    };
}

/// The `seqline` binary under test: `SEQLINE_BIN`, else the one cargo built
/// beside this test executable (`target/<profile>/seqline`).
pub fn binary() -> PathBuf {
    if let Ok(bin) = std::env::var("SEQLINE_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/seqline
    let profile_dir = exe.parent().and_then(Path::parent).expect("test executable in target/<profile>/deps");
    let bin = profile_dir.join(format!("seqline{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} does not exist: build it with `cargo build` (or run `cargo test --workspace`)",
        bin.display()
    );
    bin
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random();
    format!("{prefix}_{}_{n}_{r:08x}", std::process::id())
}

/// A running (or stopped) seqline process and its data.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The server name users are created under.
    pub server_name: String,
    /// The data directory (deleted when the `Server` is dropped).
    pub data_dir: PathBuf,
    env: Vec<(String, String)>,
    config_file: Option<PathBuf>,
    pg_schema: Option<(String, String)>,
    http: reqwest::Client,
}

/// Options for starting a server.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra environment variables (override the defaults below).
    pub env: Vec<(String, String)>,
    /// A configuration file's contents, written into the data dir.
    pub config: Option<String>,
}

impl Options {
    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets the configuration file's contents.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_owned());
        self
    }
}

impl Server {
    /// Starts a server with open registration and rate limits off.
    pub async fn start(backend: &Backend) -> Self {
        Self::start_with(backend, Options::default()).await
    }

    /// Starts a server with extra options.
    pub async fn start_with(backend: &Backend, options: Options) -> Self {
        let data_dir = std::env::temp_dir().join(unique_name("seqline-test"));
        std::fs::create_dir_all(&data_dir).expect("create data dir");
        let server_name = "test.local".to_owned();
        let mut env = vec![
            ("SEQLINE_SERVER_NAME".to_owned(), server_name.clone()),
            ("SEQLINE_LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
            ("SEQLINE_DATA_DIR".to_owned(), data_dir.display().to_string()),
            ("SEQLINE_REGISTRATION".to_owned(), "open".to_owned()),
            ("SEQLINE_RATE_LIMITS".to_owned(), "off".to_owned()),
            ("SEQLINE_LOG".to_owned(), "info,sqlx=warn".to_owned()),
        ];
        let mut pg_schema = None;
        if let Backend::Postgres(url) = backend {
            let schema = unique_name("seqline_t");
            create_schema(url, &schema).await;
            let sep = if url.contains('?') { '&' } else { '?' };
            env.push((
                "SEQLINE_DATABASE_URL".to_owned(),
                format!("{url}{sep}options=-c%20search_path%3D{schema}"),
            ));
            pg_schema = Some((url.clone(), schema));
        }
        for (k, v) in options.env {
            env.retain(|(key, _)| key != &k);
            env.push((k, v));
        }
        let config_file = options.config.map(|text| {
            let path = data_dir.join("seqline.toml");
            std::fs::write(&path, text).expect("write config");
            path
        });
        // Built with seqline in one workspace, reqwest needs a rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut server = Self {
            child: None,
            base_url: String::new(),
            server_name,
            data_dir,
            env,
            config_file,
            pg_schema,
            http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client"),
        };
        server.launch().await;
        server
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.join("server.log")
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A `seqline` command with this server's environment and config.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(binary());
        cmd.env_clear();
        if let Ok(path) = std::env::var("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(file) = &self.config_file {
            cmd.arg("--config").arg(file);
        }
        cmd
    }

    async fn launch(&mut self) {
        // Append, so a restart keeps the earlier run's lines; the address is
        // read from the first "listening" line after this offset.
        let offset = std::fs::metadata(self.log_path()).map(|m| m.len() as usize).unwrap_or(0);
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("log file");
        let mut cmd = self.command();
        cmd.arg("serve")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn seqline");
        let started = Instant::now();
        let base_url = loop {
            let text = self.log();
            if let Some(url) = text.get(offset..).and_then(listening_url) {
                break url;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("seqline exited with {status} before listening:\n{text}");
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "seqline did not start within {START_TIMEOUT:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.base_url = base_url;
        self.child = Some(child);
        // The listener is bound before the line is logged; check it answers.
        let (status, _) = self.get("/_matrix/client/versions", None).await;
        assert_eq!(status, 200, "server at {} does not answer /versions", self.base_url);
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit code.
    pub async fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("seqline did not stop within 30 s of SIGTERM")
            .expect("wait for seqline");
        status.code()
    }

    /// Kills the server with SIGKILL (no shutdown of any kind: what it had
    /// not committed is gone, as after a crash) and waits for it to be gone.
    pub async fn kill(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        child.kill().await.expect("kill seqline");
    }

    /// Starts a stopped server again on the same data and database.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        self.launch().await;
    }

    /// Stops the server and starts it again on the same data and database.
    pub async fn restart(&mut self) {
        let code = self.stop().await;
        assert_eq!(code, Some(0), "seqline did not exit cleanly:\n{}", self.log());
        self.launch().await;
    }

    /// A full URL for `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// Sends a request with an optional JSON body and access token; returns
    /// the status and the JSON body (`Value::Null` if the body is not JSON).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("response body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Sends raw bytes as the body.
    pub async fn request_raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path)).body(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let response = req.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("response body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The underlying HTTP client, for header-level checks.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// GET.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.request(Method::GET, path, token, None).await
    }

    /// POST with a JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.request(Method::POST, path, token, Some(body)).await
    }

    /// PUT with a JSON body.
    pub async fn put(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.request(Method::PUT, path, token, Some(body)).await
    }

    /// Registers `localpart` through the dummy UIA flow and returns the session.
    pub async fn register(&self, localpart: &str, password: &str) -> User {
        let (status, body) = self
            .post(
                "/_matrix/client/v3/register",
                None,
                json!({ "username": localpart, "password": password, "auth": { "type": "m.login.dummy" } }),
            )
            .await;
        assert_eq!(status, 200, "register {localpart}: {body}");
        User::from_login(&body)
    }

    /// Logs in with a password.
    pub async fn login(&self, localpart: &str, password: &str) -> User {
        let (status, body) = self
            .post(
                "/_matrix/client/v3/login",
                None,
                json!({
                    "type": "m.login.password",
                    "identifier": { "type": "m.id.user", "user": localpart },
                    "password": password,
                }),
            )
            .await;
        assert_eq!(status, 200, "login {localpart}: {body}");
        User::from_login(&body)
    }

    /// The user id of `localpart` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.server_name)
    }
}

/// A logged-in session.
#[derive(Debug, Clone)]
pub struct User {
    /// Full user id.
    pub user_id: String,
    /// Access token.
    pub token: String,
    /// Device id.
    pub device_id: String,
}

impl User {
    fn from_login(body: &Value) -> Self {
        let field = |k: &str| body[k].as_str().unwrap_or_else(|| panic!("no {k} in {body}")).to_owned();
        Self { user_id: field("user_id"), token: field("access_token"), device_id: field("device_id") }
    }
}

fn listening_url(log: &str) -> Option<String> {
    let at = log.find("listening on http://")?;
    let rest = &log[at + "listening on ".len()..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

async fn create_schema(url: &str, schema: &str) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.expect("connect to SEQLINE_TEST_POSTGRES_URL");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&pool)
        .await
        .expect("create schema");
    pool.close().await;
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
        if let Some((url, schema)) = self.pg_schema.take() {
            // Drop runs inside the test's runtime: clean up on a thread of its own.
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                rt.block_on(async {
                    if let Ok(pool) = sqlx::AnyPool::connect(&url).await {
                        let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}
