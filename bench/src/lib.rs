//! The chapter's workload, driven against any Matrix homeserver over the
//! client-server API only: registration, one public room with
//! `history_visibility: joined` that members join, messages from many members
//! with concurrent senders (Ben leaves and rejoins, Cara joins late), then
//! `/messages` paging, initial `/sync` with and without lazy-loaded members,
//! wake-up latency of a long-polling `/sync`, and the server's RSS and
//! database size. [`run`] returns a [`Report`]; the binary prints it as a
//! table and writes it as JSON.
//!
//! This is a measurement, not a test: nothing here asserts on timings.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use reqwest::Method;
use serde_json::{Value, json};

pub mod federation;
mod search;
mod sliding;
mod sync;
mod unread;

/// The benchmark's settings (also its command line).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "seqline-bench",
    about = "The chapter's workload against any Matrix homeserver (client-server API only)"
)]
pub struct Config {
    /// The homeserver's client-server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8008")]
    pub base_url: String,
    /// The homeserver's server name (checked against the registered user ids).
    #[arg(long, default_value = "localhost")]
    pub server_name: String,
    /// Members of the room in all, the creator, Ben and Cara included.
    #[arg(long, default_value_t = 500)]
    pub members: usize,
    /// Messages sent into the room.
    #[arg(long, default_value_t = 4900)]
    pub messages: usize,
    /// Concurrent clients for registration, joins and sends.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Samples of the send -> waiting /sync wake-up latency.
    #[arg(long, default_value_t = 200)]
    pub wake_samples: usize,
    /// Initial /sync samples, each by a member that has not synced yet.
    #[arg(long, default_value_t = 5)]
    pub sync_samples: usize,
    /// Ben leaves after this message (default: 4816 of 4900, scaled to --messages).
    #[arg(long)]
    pub ben_leave_at: Option<usize>,
    /// Cara joins after this message (default: 4837 of 4900, scaled).
    #[arg(long)]
    pub cara_join_at: Option<usize>,
    /// Ben rejoins after this message (default: 4858 of 4900, scaled).
    #[arg(long)]
    pub ben_rejoin_at: Option<usize>,
    /// The room version to create (default: the server's default).
    #[arg(long)]
    pub room_version: Option<String>,
    /// Synapse's registration shared secret: register through
    /// `/_synapse/admin/v1/register` instead of open `/register`.
    #[arg(long)]
    pub registration_shared_secret: Option<String>,
    /// The server's process id, for its RSS after the run (/proc/PID/status).
    #[arg(long)]
    pub pid: Option<u32>,
    /// The database file (its -wal, -shm and -journal are added) or a directory (summed).
    #[arg(long)]
    pub db_path: Option<PathBuf>,
    /// A label for this run in the output (e.g. seqline, synapse).
    #[arg(long, default_value = "server")]
    pub label: String,
    /// Prefix of the registered localparts (default: derived from the clock, so
    /// reruns against one server do not collide).
    #[arg(long)]
    pub user_prefix: Option<String>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Growth series instead of the chapter: room sizes in events at which to
    /// measure /messages and initial /sync, e.g. 5000,50000,500000.
    #[arg(long, value_delimiter = ',')]
    pub growth: Vec<usize>,
    /// Growth series: stop before a size whose estimated fill time exceeds this many seconds.
    #[arg(long, default_value_t = 900)]
    pub growth_budget_secs: u64,
    /// Growth series: /messages pages (limit 50) read backwards from the newest event at each size.
    #[arg(long, default_value_t = 100)]
    pub growth_pages: usize,
    /// Search series instead of the chapter: fill one room with this many
    /// messages, then time `POST /search` (p50, p95) for terms matching all,
    /// a tenth, a hundredth, a thousandth and none of them.
    #[arg(long)]
    pub search: Option<usize>,
    /// Search series: requests per term and order.
    #[arg(long, default_value_t = 20)]
    pub search_samples: usize,
    /// The sync figures instead of the chapter: a room of `--members` whose
    /// timeline is their joins; initial lazy-member /sync (timeline limit
    /// 10) of members syncing for the first time, and wake-ups.
    #[arg(long)]
    pub sync: bool,
    /// `--sync`: initial-sync samples in the `--members` room.
    #[arg(long, default_value_t = 20)]
    pub sync_initial_samples: usize,
    /// `--sync`: wake-up samples in the `--members` room.
    #[arg(long, default_value_t = 50)]
    pub sync_wake_samples: usize,
    /// `--sync`: also measure initial sync as the room grows to these
    /// member counts, e.g. 50,500,1000,5000.
    #[arg(long, value_delimiter = ',')]
    pub sync_growth_members: Vec<usize>,
    /// `--sync`: also measure initial sync of users in this many rooms
    /// each, e.g. 1,10,100,300.
    #[arg(long, value_delimiter = ',')]
    pub sync_growth_rooms: Vec<usize>,
    /// The sliding sync figures instead of the chapter (`sliding`): a user
    /// in `--sliding-rooms` rooms; Element X's first room-list response,
    /// the full list, woken responses, RSS while connections wait.
    #[arg(long)]
    pub sliding: bool,
    /// `--sliding`: the rooms the user is in.
    #[arg(long, default_value_t = 1000)]
    pub sliding_rooms: usize,
    /// `--sliding`: how many of them have `--members` members.
    #[arg(long, default_value_t = 5)]
    pub sliding_big_rooms: usize,
    /// `--sliding`: messages the user has not read in each room.
    #[arg(long, default_value_t = 2)]
    pub sliding_unread: usize,
    /// `--sliding`: samples of the first response and of the woken one.
    #[arg(long, default_value_t = 20)]
    pub sliding_samples: usize,
    /// `--sliding`: connections (one per device) waiting at once for the RSS figure.
    #[arg(long, default_value_t = 100)]
    pub sliding_connections: usize,
    /// The unread figures instead of the chapter (`unread`): rooms whose
    /// members have not read what was sent; first syncs (counts checked) and
    /// wake-ups at each level of unread messages.
    #[arg(long)]
    pub unread: bool,
    /// `--unread`: the room sizes, in members.
    #[arg(long, value_delimiter = ',', default_value = "500,2000")]
    pub unread_members: Vec<usize>,
    /// `--unread`: the unread levels in the first room.
    #[arg(long, value_delimiter = ',', default_value = "0,50,1000,10000")]
    pub unread_levels: Vec<usize>,
    /// `--unread`: the unread levels in the other rooms.
    #[arg(long, value_delimiter = ',', default_value = "50")]
    pub unread_big_levels: Vec<usize>,
    /// `--unread`: first syncs per level.
    #[arg(long, default_value_t = 20)]
    pub unread_samples: usize,
    /// `--unread`: wake-ups per level.
    #[arg(long, default_value_t = 20)]
    pub unread_wake_samples: usize,
    /// Compare two JSON reports (A,B) instead of running; prints B/A and who is faster.
    #[arg(long, value_delimiter = ',', num_args = 1)]
    pub compare: Vec<PathBuf>,
    /// Replies in one thread for the relations figures (`/relations` paged
    /// through the thread, `/threads`, the root's bundle); 0 skips them.
    #[arg(long, default_value_t = 1000)]
    pub thread_replies: usize,
    /// Print progress lines on stderr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub progress: bool,
}

impl Config {
    /// Settings for a given base URL with every other flag at its default.
    pub fn for_url(base_url: &str) -> Self {
        let mut c = Self::parse_from(["seqline-bench"]);
        base_url.clone_into(&mut c.base_url);
        c
    }

    fn milestone(&self, given: Option<usize>, of_4900: usize) -> usize {
        given.unwrap_or_else(|| (self.messages * of_4900).div_ceil(4900)).clamp(1, self.messages.max(1))
    }
}

/// A failure that stops the run.
#[derive(Debug)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

type Res<T> = Result<T, BenchError>;

fn err<T>(msg: impl Into<String>) -> Res<T> {
    Err(BenchError(msg.into()))
}

/// Whether a smaller or a larger figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Latencies, sizes.
    Lower,
    /// Rates.
    Higher,
    /// Counts that describe the run.
    Info,
}

impl Better {
    fn as_str(self) -> &'static str {
        match self {
            Self::Lower => "lower",
            Self::Higher => "higher",
            Self::Info => "info",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "lower" => Self::Lower,
            "higher" => Self::Higher,
            _ => Self::Info,
        }
    }
}

/// One figure of the report.
#[derive(Debug, Clone)]
pub struct Metric {
    /// Stable key, e.g. `send.p50_ms`.
    pub key: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Which direction is better.
    pub better: Better,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The run's label.
    pub label: String,
    /// The server's base URL.
    pub base_url: String,
    /// The figures, in the order measured.
    pub metrics: Vec<Metric>,
    /// Failed requests (after retries or not retried), by endpoint.
    pub errors: BTreeMap<String, u64>,
    /// Remarks (skipped parts, server version).
    pub notes: Vec<String>,
    /// The settings as JSON.
    pub config: Value,
}

impl Report {
    fn push(&mut self, key: &str, value: f64, unit: &str, better: Better) {
        self.metrics.push(Metric { key: key.to_owned(), value, unit: unit.to_owned(), better });
    }

    fn lat(&mut self, key: &str, samples: &[f64], pcts: &[u8]) {
        for &p in pcts {
            self.push(&format!("{key}.p{p}_ms"), percentile(samples, f64::from(p)), "ms", Better::Lower);
        }
    }

    /// The value of a metric, if measured.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.key == key).map(|m| m.value)
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        let mut metrics = serde_json::Map::new();
        for m in &self.metrics {
            metrics.insert(
                m.key.clone(),
                json!({ "value": m.value, "unit": m.unit, "better": m.better.as_str() }),
            );
        }
        json!({
            "label": self.label,
            "base_url": self.base_url,
            "config": self.config,
            "metrics": metrics,
            "errors": self.errors,
            "notes": self.notes,
        })
    }

    /// Reads a report written by [`Report::to_json`].
    pub fn from_json(v: &Value) -> Res<Self> {
        let Some(map) = v["metrics"].as_object() else { return err("report has no metrics") };
        let metrics = map
            .iter()
            .map(|(k, m)| Metric {
                key: k.clone(),
                value: m["value"].as_f64().unwrap_or(f64::NAN),
                unit: m["unit"].as_str().unwrap_or("").to_owned(),
                better: Better::parse(m["better"].as_str().unwrap_or("")),
            })
            .collect();
        Ok(Self {
            label: v["label"].as_str().unwrap_or("?").to_owned(),
            base_url: v["base_url"].as_str().unwrap_or("").to_owned(),
            metrics,
            errors: serde_json::from_value(v["errors"].clone()).unwrap_or_default(),
            notes: v["notes"]
                .as_array()
                .map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            config: v["config"].clone(),
        })
    }

    /// The report as a text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "== {} ({})", self.label, self.base_url);
        let width = self.metrics.iter().map(|m| m.key.len()).max().unwrap_or(10);
        for m in &self.metrics {
            let _ = writeln!(out, "{:<width$}  {:>14}  {}", m.key, fmt_num(m.value), m.unit);
        }
        if !self.errors.is_empty() {
            let _ = writeln!(out, "errors: {:?}", self.errors);
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".to_owned()
    } else if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A side-by-side table of two reports: A, B, B/A, and how many times
/// better A is than B on that figure (`>1`: A is better).
pub fn compare(a: &Report, b: &Report) -> String {
    let mut out = String::new();
    let width = a.metrics.iter().map(|m| m.key.len()).max().unwrap_or(10).max(6);
    let _ = writeln!(
        out,
        "{:<width$}  {:>12}  {:>12}  {:>8}  {:>10}  unit",
        "metric",
        a.label,
        b.label,
        format!("{}/{}", short(&b.label), short(&a.label)),
        format!("{} x", short(&a.label)),
    );
    for m in &a.metrics {
        let Some(bv) = b.get(&m.key) else { continue };
        let ratio = bv / m.value;
        let better = match m.better {
            Better::Lower => fmt_num(bv / m.value) + "x",
            Better::Higher => fmt_num(m.value / bv) + "x",
            Better::Info => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>12}  {:>8}  {:>10}  {}",
            m.key,
            fmt_num(m.value),
            fmt_num(bv),
            if m.better == Better::Info { String::new() } else { format!("{ratio:.2}") },
            better,
            m.unit
        );
    }
    let _ = writeln!(
        out,
        "(`{} x`: how many times better {} is on that figure: >1 means {} is faster/smaller)",
        short(&a.label),
        a.label,
        a.label
    );
    for r in [a, b] {
        if !r.errors.is_empty() {
            let _ = writeln!(out, "{} errors: {:?}", r.label, r.errors);
        }
        for n in &r.notes {
            let _ = writeln!(out, "{} note: {n}", r.label);
        }
    }
    out
}

fn short(label: &str) -> &str {
    label.get(..label.len().min(6)).unwrap_or(label)
}

/// Nearest-rank percentile of `samples` (ms); NaN when empty.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Percent-encodes a path segment or query value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A client of one homeserver, with error counts.
#[derive(Clone)]
pub struct Hs {
    http: reqwest::Client,
    base: String,
    errors: Arc<Mutex<BTreeMap<String, u64>>>,
}

/// A registered, logged-in user.
#[derive(Debug, Clone)]
pub struct User {
    /// Full user id.
    pub user_id: String,
    /// Access token.
    pub token: String,
}

const V3: &str = "/_matrix/client/v3";
const ATTEMPTS: u32 = 5;

impl Hs {
    /// A client for `base_url`.
    pub fn new(base_url: &str) -> Res<Self> {
        // Built with seqline in one workspace, reqwest needs a rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| BenchError(format!("http client: {e}")))?;
        Ok(Self { http, base: base_url.trim_end_matches('/').to_owned(), errors: Arc::default() })
    }

    fn count_error(&self, label: &str) {
        *self.errors.lock().expect("errors lock").entry(label.to_owned()).or_default() += 1;
    }

    /// One request: status, JSON body (`Null` if not JSON) and body size.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Res<(u16, Value, usize)> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| BenchError(format!("{path}: {}", with_causes(&e))))?;
        let status = resp.status().as_u16();
        let bytes =
            resp.bytes().await.map_err(|e| BenchError(format!("{path}: body: {}", with_causes(&e))))?;
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null), bytes.len()))
    }

    /// A request that must succeed: retried on 429, 5xx and transport errors
    /// (each failure counted under `label`), an error otherwise.
    pub async fn ok(
        &self,
        label: &str,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Res<(Value, usize)> {
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let t = Instant::now();
            match self.raw(method.clone(), path, token, body).await {
                Ok((s, v, n)) if (200..300).contains(&s) => return Ok((v, n)),
                Ok((s, v, _)) if s == 429 || s >= 500 => {
                    self.count_error(label);
                    let _ = write!(
                        last,
                        "[attempt {attempt} after {:.1} s: {s} {v}] ",
                        t.elapsed().as_secs_f64()
                    );
                    let wait = v["retry_after_ms"].as_u64().unwrap_or(200).min(5000);
                    tokio::time::sleep(Duration::from_millis(wait * u64::from(attempt))).await;
                }
                Ok((s, v, _)) => {
                    self.count_error(label);
                    return err(format!("{label}: {method} {path}: {s} {v}"));
                }
                Err(e) => {
                    self.count_error(label);
                    let _ = write!(
                        last,
                        "[attempt {attempt} after {:.1} s: {}] ",
                        t.elapsed().as_secs_f64(),
                        e.0
                    );
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
            }
        }
        err(format!("{label}: {method} {path}: failed {ATTEMPTS} times: {last}"))
    }

    /// Registers `localpart` (open registration with the dummy flow, or
    /// Synapse's shared-secret admin API); logs in if it exists already.
    pub async fn register(&self, localpart: &str, password: &str, shared_secret: Option<&str>) -> Res<User> {
        if let Some(secret) = shared_secret {
            return self.register_shared_secret(localpart, password, secret).await;
        }
        let path = format!("{V3}/register");
        let mut body = json!({
            "username": localpart,
            "password": password,
            "auth": { "type": "m.login.dummy" },
            "initial_device_display_name": "seqline-bench",
        });
        for attempt in 1..=ATTEMPTS {
            let (s, v, _) = self.raw(Method::POST, &path, None, Some(&body)).await?;
            match s {
                200 => return user_from(&v),
                401 if v["session"].is_string() => body["auth"]["session"] = v["session"].clone(),
                400 if v["errcode"] == "M_USER_IN_USE" => return self.login(localpart, password).await,
                429 | 500.. => {
                    self.count_error("register");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                _ => {
                    self.count_error("register");
                    return err(format!("register {localpart}: {s} {v}"));
                }
            }
        }
        err(format!("register {localpart}: no success after {ATTEMPTS} attempts"))
    }

    async fn register_shared_secret(&self, localpart: &str, password: &str, secret: &str) -> Res<User> {
        use hmac::{KeyInit as _, Mac as _};
        let path = "/_synapse/admin/v1/register";
        let (nonce, _) = self.ok("register.nonce", Method::GET, path, None, None).await?;
        let Some(nonce) = nonce["nonce"].as_str() else { return err("no nonce from shared-secret register") };
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes())
            .map_err(|e| BenchError(format!("hmac key: {e}")))?;
        for (i, part) in [nonce, localpart, password, "notadmin"].iter().enumerate() {
            if i > 0 {
                mac.update(b"\0");
            }
            mac.update(part.as_bytes());
        }
        let digest = mac.finalize().into_bytes();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let body = json!({ "nonce": nonce, "username": localpart, "password": password, "admin": false, "mac": hex });
        let (v, _) = self.ok("register", Method::POST, path, None, Some(&body)).await?;
        user_from(&v)
    }

    /// Password login.
    pub async fn login(&self, localpart: &str, password: &str) -> Res<User> {
        let body = json!({
            "type": "m.login.password",
            "identifier": { "type": "m.id.user", "user": localpart },
            "password": password,
        });
        let (v, _) = self.ok("login", Method::POST, &format!("{V3}/login"), None, Some(&body)).await?;
        user_from(&v)
    }

    /// Creates the chapter's room: public, `history_visibility: joined`.
    pub async fn create_room(&self, creator: &User, room_version: Option<&str>) -> Res<String> {
        let body = json!({
            "preset": "public_chat",
            "visibility": "public",
            "name": "seqline-bench",
            "initial_state": [{
                "type": "m.room.history_visibility",
                "state_key": "",
                "content": { "history_visibility": "joined" },
            }],
        });
        self.create_room_with(creator, body, room_version).await
    }

    /// Creates a room from the `createRoom` body `body`, of `room_version`
    /// when given; returns its id.
    pub async fn create_room_with(
        &self,
        creator: &User,
        mut body: Value,
        room_version: Option<&str>,
    ) -> Res<String> {
        if let Some(v) = room_version {
            body["room_version"] = json!(v);
        }
        let (v, _) = self
            .ok("createRoom", Method::POST, &format!("{V3}/createRoom"), Some(&creator.token), Some(&body))
            .await?;
        match v["room_id"].as_str() {
            Some(id) => Ok(id.to_owned()),
            None => err(format!("createRoom: no room_id in {v}")),
        }
    }

    /// Joins the room.
    pub async fn join(&self, user: &User, room: &str) -> Res<()> {
        let path = format!("{V3}/rooms/{}/join", enc(room));
        self.ok("join", Method::POST, &path, Some(&user.token), Some(&json!({}))).await.map(drop)
    }

    /// Leaves the room.
    pub async fn leave(&self, user: &User, room: &str) -> Res<()> {
        let path = format!("{V3}/rooms/{}/leave", enc(room));
        self.ok("leave", Method::POST, &path, Some(&user.token), Some(&json!({}))).await.map(drop)
    }

    /// Sends an `m.text` message; returns its event id.
    pub async fn send(&self, user: &User, room: &str, txn: &str, text: &str) -> Res<String> {
        self.send_content(user, room, txn, &json!({ "msgtype": "m.text", "body": text })).await
    }

    /// Sends an `m.room.message` of this content; returns its event id.
    pub async fn send_content(&self, user: &User, room: &str, txn: &str, content: &Value) -> Res<String> {
        let path = format!("{V3}/rooms/{}/send/m.room.message/{}", enc(room), enc(txn));
        let (v, _) = self.ok("send", Method::PUT, &path, Some(&user.token), Some(content)).await?;
        Ok(v["event_id"].as_str().unwrap_or_default().to_owned())
    }

    /// `/sync` with an optional inline filter, since token and timeout;
    /// returns the body and its size in bytes.
    pub async fn sync(
        &self,
        user: &User,
        filter: Option<&str>,
        since: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> Res<(Value, usize)> {
        let mut q = Vec::new();
        if let Some(f) = filter {
            q.push(format!("filter={}", enc(f)));
        }
        if let Some(s) = since {
            q.push(format!("since={}", enc(s)));
        }
        if let Some(t) = timeout_ms {
            q.push(format!("timeout={t}"));
        }
        let path = format!("{V3}/sync?{}", q.join("&"));
        self.ok("sync", Method::GET, &path, Some(&user.token), None).await
    }

    /// One `/messages` page backwards (limit 50); returns the events in it
    /// and the `end` token, if any.
    pub async fn messages_page(
        &self,
        user: &User,
        room: &str,
        from: Option<&str>,
    ) -> Res<(usize, Option<String>)> {
        let mut path = format!("{V3}/rooms/{}/messages?dir=b&limit=50", enc(room));
        if let Some(f) = from {
            let _ = write!(path, "&from={}", enc(f));
        }
        let (v, _) = self.ok("messages", Method::GET, &path, Some(&user.token), None).await?;
        let n = v["chunk"].as_array().map_or(0, Vec::len);
        Ok((n, v["end"].as_str().map(str::to_owned)))
    }

    /// Sends an `m.text` reply in the thread of `root`; returns its event id.
    pub async fn send_thread_reply(
        &self,
        user: &User,
        room: &str,
        root: &str,
        txn: &str,
        text: &str,
    ) -> Res<String> {
        let path = format!("{V3}/rooms/{}/send/m.room.message/{}", enc(room), enc(txn));
        let body = json!({
            "msgtype": "m.text",
            "body": text,
            "m.relates_to": { "rel_type": "m.thread", "event_id": root },
        });
        let (v, _) = self.ok("send", Method::PUT, &path, Some(&user.token), Some(&body)).await?;
        Ok(v["event_id"].as_str().unwrap_or_default().to_owned())
    }

    /// One `/relations/{root}/m.thread` page backwards (limit 50); returns
    /// the events in it and `next_batch`, if any.
    pub async fn relations_page(
        &self,
        user: &User,
        room: &str,
        root: &str,
        from: Option<&str>,
    ) -> Res<(usize, Option<String>)> {
        let mut path =
            format!("/_matrix/client/v1/rooms/{}/relations/{}/m.thread?dir=b&limit=50", enc(room), enc(root));
        if let Some(f) = from {
            let _ = write!(path, "&from={}", enc(f));
        }
        let (v, _) = self.ok("relations", Method::GET, &path, Some(&user.token), None).await?;
        let n = v["chunk"].as_array().map_or(0, Vec::len);
        Ok((n, v["next_batch"].as_str().map(str::to_owned)))
    }

    /// The server's name and version from Synapse's or seqline's
    /// `/_matrix/federation/v1/version`, when it answers.
    pub async fn version(&self) -> Option<String> {
        let (s, v, _) = self.raw(Method::GET, "/_matrix/federation/v1/version", None, None).await.ok()?;
        if s != 200 {
            return None;
        }
        Some(format!("{} {}", v["server"]["name"].as_str()?, v["server"]["version"].as_str()?))
    }
}

/// An error and its causes, `: `-separated (reqwest's own text names only the URL).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let _ = write!(text, ": {c}");
        cause = c.source();
    }
    text
}

fn user_from(v: &Value) -> Res<User> {
    match (v["user_id"].as_str(), v["access_token"].as_str()) {
        (Some(u), Some(t)) => Ok(User { user_id: u.to_owned(), token: t.to_owned() }),
        _ => err(format!("no user_id/access_token in {v}")),
    }
}

/// Runs `f(i)` for every `i` in `0..n` on `concurrency` workers; returns each
/// result with its latency in ms, in index order.
async fn pool<R, F, Fut>(n: usize, concurrency: usize, f: F) -> Res<Vec<(f64, R)>>
where
    R: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Res<R>> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (f, next) = (f.clone(), next.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = Instant::now();
                let r = f(i).await?;
                out.push((i, ms(t.elapsed()), r));
            }
            Ok::<_, BenchError>(out)
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(done) = set.join_next().await {
        let part = done.map_err(|e| BenchError(format!("worker: {e}")))?;
        match part {
            Ok(p) => all.extend(p),
            Err(e) => {
                set.abort_all();
                return Err(e);
            }
        }
    }
    all.sort_by_key(|(i, _, _)| *i);
    Ok(all.into_iter().map(|(_, l, r)| (l, r)).collect())
}

struct Progress {
    on: bool,
    start: Instant,
}

impl Progress {
    fn say(&self, msg: &str) {
        if self.on {
            eprintln!("[{:>7.1}s] {msg}", self.start.elapsed().as_secs_f64());
        }
    }
}

/// Sum of the sizes of the database: a file plus its -wal/-shm/-journal, or
/// every file under a directory.
pub fn db_size(path: &Path) -> u64 {
    fn dir_size(p: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else { return 0 };
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => dir_size(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    if path.is_dir() {
        return dir_size(path);
    }
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .filter_map(|sfx| {
            let mut p = path.as_os_str().to_owned();
            p.push(sfx);
            std::fs::metadata(PathBuf::from(p)).ok().map(|m| m.len())
        })
        .sum()
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn prefix(config: &Config) -> String {
    config.user_prefix.clone().unwrap_or_else(|| {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        format!("b{}", t % 100_000_000)
    })
}

const PASSWORD: &str = "seqline-bench password 1";

struct Cast {
    creator: User,
    ben: User,
    cara: User,
    /// Everyone else, in registration order.
    members: Vec<User>,
}

async fn register_all(
    hs: &Hs,
    config: &Config,
    names: Vec<String>,
    report: &mut Report,
    key: &str,
) -> Res<Vec<User>> {
    let n = names.len();
    let names = Arc::new(names);
    let secret = config.registration_shared_secret.clone();
    let t = Instant::now();
    let hs2 = hs.clone();
    let done = pool(n, config.concurrency, move |i| {
        let (hs, names, secret) = (hs2.clone(), names.clone(), secret.clone());
        async move { hs.register(&names[i], PASSWORD, secret.as_deref()).await }
    })
    .await?;
    let wall = t.elapsed().as_secs_f64();
    let lat: Vec<f64> = done.iter().map(|(l, _)| *l).collect();
    report.push(&format!("{key}.users"), n as f64, "users", Better::Info);
    report.push(&format!("{key}.rate"), n as f64 / wall, "users/s", Better::Higher);
    report.lat(key, &lat, &[50, 95]);
    Ok(done.into_iter().map(|(_, u)| u).collect())
}

async fn register_cast(hs: &Hs, config: &Config, report: &mut Report) -> Res<Cast> {
    let p = prefix(config);
    let regular = config.members.saturating_sub(3).max(2);
    let mut names = vec![format!("{p}_creator"), format!("{p}_ben"), format!("{p}_cara")];
    names.extend((0..regular).map(|i| format!("{p}_m{i}")));
    let mut users = register_all(hs, config, names, report, "register").await?;
    if let Some(u) = users.first()
        && !u.user_id.ends_with(&format!(":{}", config.server_name))
    {
        report
            .notes
            .push(format!("user ids are on {} (not --server-name {})", u.user_id, config.server_name));
    }
    let members = users.split_off(3);
    let cara = users.pop().expect("cara");
    let ben = users.pop().expect("ben");
    let creator = users.pop().expect("creator");
    Ok(Cast { creator, ben, cara, members })
}

/// Joins `users` into `room` concurrently; reports latency, rate and the
/// median of the first and last tenth (the room grows as they join).
async fn join_all(hs: &Hs, config: &Config, room: &str, users: &[User], report: &mut Report) -> Res<()> {
    let n = users.len();
    let users = Arc::new(users.to_vec());
    let room = Arc::new(room.to_owned());
    let t = Instant::now();
    let hs2 = hs.clone();
    let done = pool(n, config.concurrency, move |i| {
        let (hs, users, room) = (hs2.clone(), users.clone(), room.clone());
        async move { hs.join(&users[i], &room).await }
    })
    .await?;
    let wall = t.elapsed().as_secs_f64();
    let lat: Vec<f64> = done.iter().map(|(l, _)| *l).collect();
    report.push("join.count", n as f64, "joins", Better::Info);
    report.push("join.rate", n as f64 / wall, "joins/s", Better::Higher);
    report.lat("join", &lat, &[50, 95]);
    let tenth = (n / 10).max(1);
    report.push("join.first_tenth_p50_ms", percentile(&lat[..tenth.min(n)], 50.0), "ms", Better::Lower);
    report.push(
        "join.last_tenth_p50_ms",
        percentile(&lat[n.saturating_sub(tenth)..], 50.0),
        "ms",
        Better::Lower,
    );
    Ok(())
}

/// Sends messages `from..=to` (1-based numbers), sender chosen by number
/// from `senders`; returns latencies.
async fn send_range(
    hs: &Hs,
    config: &Config,
    room: &str,
    senders: &Arc<Vec<User>>,
    run: &str,
    from: usize,
    to: usize,
) -> Res<Vec<f64>> {
    if to < from {
        return Ok(Vec::new());
    }
    let (hs2, senders, room, run) =
        (hs.clone(), senders.clone(), Arc::new(room.to_owned()), Arc::new(run.to_owned()));
    let done = pool(to - from + 1, config.concurrency, move |i| {
        let (hs, senders, room, run) = (hs2.clone(), senders.clone(), room.clone(), run.clone());
        async move {
            let k = from + i;
            let sender = &senders[k % senders.len()];
            hs.send(sender, &room, &format!("{run}-{k}"), &format!("message {k} of the chapter")).await
        }
    })
    .await?;
    Ok(done.into_iter().map(|(l, _)| l).collect())
}

/// Samples of the single requests in [`thread_figures`].
const THREAD_SAMPLES: usize = 20;

/// A thread of `config.thread_replies` replies to one root: the time to
/// page all of it through `/relations` (limit 50), one `/threads` page and
/// `/event` of the root (whose bundle counts the replies and carries the
/// latest).
async fn thread_figures(
    hs: &Hs,
    config: &Config,
    reader: &User,
    senders: &Arc<Vec<User>>,
    room: &str,
    run: &str,
    report: &mut Report,
) -> Res<()> {
    let root = hs.send(reader, room, &format!("{run}-root"), "the thread's root").await?;
    let (hs2, senders2, room2, run2, root2) = (
        hs.clone(),
        senders.clone(),
        Arc::new(room.to_owned()),
        Arc::new(run.to_owned()),
        Arc::new(root.clone()),
    );
    let sent = pool(config.thread_replies, config.concurrency, move |i| {
        let (hs, senders, room, run, root) =
            (hs2.clone(), senders2.clone(), room2.clone(), run2.clone(), root2.clone());
        async move {
            let sender = &senders[i % senders.len()];
            hs.send_thread_reply(sender, &room, &root, &format!("{run}-reply-{i}"), &format!("reply {i}"))
                .await
        }
    })
    .await?;
    report.push("thread.replies", sent.len() as f64, "events", Better::Info);
    let t = Instant::now();
    let (mut pages, mut events, mut from) = (Vec::new(), 0, None::<String>);
    loop {
        let p = Instant::now();
        let (n, next) = hs.relations_page(reader, room, &root, from.as_deref()).await?;
        pages.push(ms(p.elapsed()));
        events += n;
        match next {
            Some(next) if pages.len() <= config.thread_replies / 10 + 10 => from = Some(next),
            _ => break,
        }
    }
    report.push("relations.thread_ms", ms(t.elapsed()), "ms", Better::Lower);
    report.push("relations.pages", pages.len() as f64, "pages", Better::Info);
    report.push("relations.events", events as f64, "events", Better::Info);
    report.lat("relations.page", &pages, &[50, 95]);
    let threads_path = format!("/_matrix/client/v1/rooms/{}/threads?limit=10", enc(room));
    let event_path = format!("{V3}/rooms/{}/event/{}", enc(room), enc(&root));
    for (key, path) in [("threads", threads_path), ("thread.root_event", event_path)] {
        let mut lat = Vec::with_capacity(THREAD_SAMPLES);
        for _ in 0..THREAD_SAMPLES {
            let t = Instant::now();
            hs.ok(key, Method::GET, &path, Some(&reader.token), None).await?;
            lat.push(ms(t.elapsed()));
        }
        report.lat(key, &lat, &[50, 95]);
    }
    Ok(())
}

/// Pages a user's whole visible history backwards, limit 50; returns the
/// page latencies and the events seen.
async fn page_history(hs: &Hs, user: &User, room: &str, max_pages: usize) -> Res<(Vec<f64>, usize)> {
    let mut lat = Vec::new();
    let mut events = 0;
    let mut from: Option<String> = None;
    for _ in 0..max_pages {
        let t = Instant::now();
        let (n, end) = hs.messages_page(user, room, from.as_deref()).await?;
        lat.push(ms(t.elapsed()));
        events += n;
        // An empty chunk with an `end` means "nothing visible here, page on"
        // (Synapse filters each page after reading it); no `end` is the start.
        match end {
            Some(e) if Some(&e) != from.as_ref() => from = Some(e),
            _ => break,
        }
    }
    Ok((lat, events))
}

const LAZY: &str = r#"{"room":{"state":{"lazy_load_members":true}}}"#;

/// Initial /sync figures of `users` (each syncs once without and once with
/// lazy-loaded members, alternating which goes first).
async fn initial_syncs(hs: &Hs, users: &[User], room: &str, key: &str, report: &mut Report) -> Res<()> {
    let (mut full, mut lazy) = (Vec::new(), Vec::new());
    let (mut full_bytes, mut lazy_bytes, mut full_state, mut lazy_state) = (0, 0, 0, 0);
    for (i, u) in users.iter().enumerate() {
        for pass in 0..2 {
            let is_lazy = (pass == 0) == (i % 2 == 1);
            let t = Instant::now();
            let (v, bytes) = hs.sync(u, is_lazy.then_some(LAZY), None, None).await?;
            let l = ms(t.elapsed());
            let r = &v["rooms"]["join"][room];
            let state = r["state"]["events"].as_array().map_or(0, Vec::len)
                + r["state_after"]["events"].as_array().map_or(0, Vec::len);
            if is_lazy {
                lazy.push(l);
                (lazy_bytes, lazy_state) = (bytes, state);
            } else {
                full.push(l);
                (full_bytes, full_state) = (bytes, state);
            }
        }
    }
    report.lat(&format!("{key}.full"), &full, &[50]);
    report.push(&format!("{key}.full.bytes"), full_bytes as f64, "bytes", Better::Lower);
    report.push(&format!("{key}.full.state_events"), full_state as f64, "events", Better::Info);
    report.lat(&format!("{key}.lazy"), &lazy, &[50]);
    report.push(&format!("{key}.lazy.bytes"), lazy_bytes as f64, "bytes", Better::Lower);
    report.push(&format!("{key}.lazy.state_events"), lazy_state as f64, "events", Better::Info);
    Ok(())
}

/// Incremental /sync (lazy members) of `user` from `since`, long before the
/// room's head: a limited timeline whose state covers the whole gap.
async fn gap_syncs(
    hs: &Hs,
    user: &User,
    room: &str,
    since: &str,
    samples: usize,
    key: &str,
    report: &mut Report,
) -> Res<()> {
    let mut lat = Vec::new();
    for _ in 0..samples.max(1) {
        let t = Instant::now();
        let (v, _) = hs.sync(user, Some(LAZY), Some(since), Some(0)).await?;
        lat.push(ms(t.elapsed()));
        if v["rooms"]["join"][room]["timeline"]["limited"] != Value::Bool(true) {
            return err(format!("{key}: the timeline after a long gap is not limited"));
        }
    }
    report.lat(&format!("{key}.lazy"), &lat, &[50]);
    Ok(())
}

fn timeline_has(v: &Value, room: &str, marker: &str) -> bool {
    v["rooms"]["join"][room]["timeline"]["events"]
        .as_array()
        .is_some_and(|evs| evs.iter().any(|e| e["content"]["body"].as_str() == Some(marker)))
}

/// Wake-up figures of [`wake_ups`], in ms, one entry per sample.
#[derive(Debug, Default)]
struct Wakes {
    /// From just before the send to the sync response carrying the message.
    wake: Vec<f64>,
    /// From the send's response to that sync response (negative when the
    /// sync answered first).
    after_send: Vec<f64>,
    /// The sends' own latency.
    send: Vec<f64>,
}

/// Wake-up latency: `waiter` long-polls /sync, `sender` sends; measured from
/// just before the send, and from the send's answer, to the sync response
/// that carries the message.
async fn wake_ups(
    hs: &Hs,
    samples: usize,
    waiter: &User,
    sender: &User,
    room: &str,
    run: &str,
) -> Res<Wakes> {
    let filter = r#"{"room":{"timeline":{"limit":5}}}"#;
    let (v, _) = hs.sync(waiter, Some(filter), None, None).await?;
    let mut since = v["next_batch"].as_str().unwrap_or_default().to_owned();
    let mut out = Wakes::default();
    let poll = |since: String| {
        let (hs, waiter) = (hs.clone(), waiter.clone());
        tokio::spawn(async move {
            let r = hs.sync(&waiter, Some(filter), Some(&since), Some(30_000)).await;
            r.map(|(v, _)| (v, Instant::now()))
        })
    };
    for i in 0..samples {
        let marker = format!("{run} wake {i}");
        let first = poll(since.clone());
        // Let the long-poll reach the server and start waiting.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        let send = {
            let (hs, sender, room, marker) = (hs.clone(), sender.clone(), room.to_owned(), marker.clone());
            tokio::spawn(async move {
                hs.send(&sender, &room, &format!("{marker}-txn"), &marker).await.map(|_| Instant::now())
            })
        };
        let (mut resp, mut at) = first.await.map_err(|e| BenchError(format!("sync task: {e}")))??;
        let mut found = timeline_has(&resp, room, &marker);
        // Woken by something else (or early): poll on until the message arrives.
        for _ in 0..10 {
            if found {
                break;
            }
            since = resp["next_batch"].as_str().unwrap_or(&since).to_owned();
            (resp, at) = poll(since.clone()).await.map_err(|e| BenchError(format!("sync task: {e}")))??;
            found = timeline_has(&resp, room, &marker);
        }
        let sent = send.await.map_err(|e| BenchError(format!("send task: {e}")))??;
        if found {
            out.wake.push(ms(at - t0));
            out.send.push(ms(sent - t0));
            out.after_send.push(ms_signed(at, sent));
        } else {
            hs.count_error("wake.missed");
        }
        since = resp["next_batch"].as_str().unwrap_or(&since).to_owned();
    }
    Ok(out)
}

/// `a - b` in ms, negative when `a` came first.
fn ms_signed(a: Instant, b: Instant) -> f64 {
    if a >= b { ms(a - b) } else { -ms(b - a) }
}

/// Reports [`Wakes`] under `key`.
fn report_wakes(report: &mut Report, key: &str, w: &Wakes) {
    report.push(&format!("{key}.samples"), w.wake.len() as f64, "samples", Better::Info);
    report.lat(key, &w.wake, &[50, 95]);
    report.lat(&format!("{key}.after_send"), &w.after_send, &[50, 95]);
    // The same sends' own latency (one at a time, nothing else running).
    report.lat(&format!("{key}.send_alone"), &w.send, &[50]);
}

fn server_figures(config: &Config, report: &mut Report) {
    if let Some(pid) = config.pid {
        match rss_kib(pid) {
            Some((rss, hwm)) => {
                report.push("server.rss_mib", rss as f64 / 1024.0, "MiB", Better::Lower);
                report.push("server.peak_rss_mib", hwm as f64 / 1024.0, "MiB", Better::Lower);
            }
            None => report.notes.push(format!("could not read /proc/{pid}/status")),
        }
    }
    if let Some(path) = &config.db_path {
        report.push("server.db_mib", db_size(path) as f64 / (1024.0 * 1024.0), "MiB", Better::Lower);
    }
}

fn new_report(config: &Config) -> Report {
    Report {
        label: config.label.clone(),
        base_url: config.base_url.clone(),
        config: json!({
            "members": config.members,
            "messages": config.messages,
            "concurrency": config.concurrency,
            "wake_samples": config.wake_samples,
            "sync_samples": config.sync_samples,
            "room_version": config.room_version,
            "growth": config.growth,
        }),
        ..Report::default()
    }
}

/// Runs the chapter's workload (or the growth series, when `config.growth`
/// is set) and returns the figures.
pub async fn run(config: &Config) -> Res<Report> {
    if config.messages == 0 || config.members < 4 {
        return err("need --messages >= 1 and --members >= 4");
    }
    let hs = Hs::new(&config.base_url)?;
    let progress = Progress { on: config.progress, start: Instant::now() };
    let mut report = new_report(config);
    if let Some(v) = hs.version().await {
        report.notes.push(format!("server: {v}"));
    }
    if config.unread {
        unread::series(&hs, config, &progress, &mut report).await?;
    } else if config.sliding {
        sliding::series(&hs, config, &progress, &mut report).await?;
    } else if config.sync {
        sync::series(&hs, config, &progress, &mut report).await?;
    } else if config.search.is_some() {
        search::series(&hs, config, &progress, &mut report).await?;
    } else if !config.growth.is_empty() {
        growth(&hs, config, &progress, &mut report).await?;
    } else {
        chapter(&hs, config, &progress, &mut report).await?;
    }
    server_figures(config, &mut report);
    report.errors = hs.errors.lock().expect("errors lock").clone();
    Ok(report)
}

async fn chapter(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let run = prefix(config);
    progress.say(&format!("registering {} users", config.members.max(5)));
    let cast = register_cast(hs, config, report).await?;
    let room = hs.create_room(&cast.creator, config.room_version.as_deref()).await?;
    progress.say(&format!("room {room}; Ben and {} members join", cast.members.len()));
    hs.join(&cast.ben, &room).await?;
    join_all(hs, config, &room, &cast.members, report).await?;

    let leave = config.milestone(config.ben_leave_at, 4816);
    let cara = config.milestone(config.cara_join_at, 4837).max(leave);
    let rejoin = config.milestone(config.ben_rejoin_at, 4858).max(cara);
    report.notes.push(format!(
        "Ben leaves after message {leave}, Cara joins after {cara}, Ben rejoins after {rejoin} of {}",
        config.messages
    ));
    let mut senders = vec![cast.creator.clone()];
    senders.extend(cast.members.iter().cloned());
    let senders = Arc::new(senders);
    progress.say(&format!("sending {} messages, {} at a time", config.messages, config.concurrency));
    let mut lat = Vec::with_capacity(config.messages);
    let mut send_secs = 0.0;
    let mut at = 0;
    for (upto, step) in [(leave, 0), (cara, 1), (rejoin, 2), (config.messages, 3)] {
        let t = Instant::now();
        lat.extend(send_range(hs, config, &room, &senders, &run, at + 1, upto).await?);
        send_secs += t.elapsed().as_secs_f64();
        at = at.max(upto);
        match step {
            0 => hs.leave(&cast.ben, &room).await?,
            1 => hs.join(&cast.cara, &room).await?,
            2 => hs.join(&cast.ben, &room).await?,
            _ => {}
        }
        progress.say(&format!("  {at} sent"));
    }
    report.push("send.count", lat.len() as f64, "messages", Better::Info);
    report.push("send.rate", lat.len() as f64 / send_secs, "msgs/s", Better::Higher);
    report.lat("send", &lat, &[50, 95, 99]);

    progress.say("paging /messages for Ben and Cara");
    let max_pages = (config.messages + config.members) / 10 + 100;
    for (who, user) in [("ben", &cast.ben), ("cara", &cast.cara)] {
        let (lat, events) = page_history(hs, user, &room, max_pages).await?;
        report.push(&format!("messages.{who}.pages"), lat.len() as f64, "pages", Better::Info);
        report.push(&format!("messages.{who}.events"), events as f64, "events", Better::Info);
        report.lat(&format!("messages.{who}"), &lat, &[50, 95]);
    }

    progress.say("initial /sync with and without lazy loading");
    let k = config.sync_samples.clamp(1, cast.members.len().saturating_sub(1).max(1));
    initial_syncs(hs, &cast.members[1..=k.min(cast.members.len() - 1)], &room, "sync.initial", report)
        .await?;

    progress.say(&format!("{} wake-up samples", config.wake_samples));
    let wakes = wake_ups(hs, config.wake_samples, &cast.members[0], &cast.creator, &room, &run).await?;
    report_wakes(report, "wake", &wakes);
    if config.thread_replies > 0 {
        progress.say(&format!(
            "a thread of {} replies: /relations, /threads, the root's bundle",
            config.thread_replies
        ));
        thread_figures(hs, config, &cast.creator, &senders, &room, &run, report).await?;
    }
    progress.say("done");
    Ok(())
}

/// The growth series: one room filled up to each size in turn; at each, a
/// long-time member pages back `growth_pages` pages, a member who joins just
/// then pages their whole (short) history, and fresh members sync initially.
async fn growth(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let run = prefix(config);
    let sizes: Vec<usize> = {
        let mut s = config.growth.clone();
        s.sort_unstable();
        s.dedup();
        s
    };
    progress.say(&format!("growth series {sizes:?}: registering {} users", config.members));
    let cast = register_cast(hs, config, report).await?;
    // Late joiners (one per size) and fresh syncers (sync_samples per size).
    let per = config.sync_samples.max(1);
    let names: Vec<String> = (0..sizes.len())
        .flat_map(|s| {
            let run = run.clone();
            (0..=per).map(move |j| format!("{run}_g{s}_{j}"))
        })
        .collect();
    let extra = register_all(hs, config, names, &mut Report::default(), "register.extra").await?;
    let room = hs.create_room(&cast.creator, config.room_version.as_deref()).await?;
    hs.join(&cast.ben, &room).await?;
    let syncers: Vec<User> = extra.chunks(per + 1).flat_map(|c| c[1..].iter().cloned()).collect();
    join_all(hs, config, &room, &cast.members, report).await?;
    join_all(hs, config, &room, &syncers, &mut Report::default()).await?;
    // Ben's position before the fill: each size's gappy incremental sync
    // starts from it, so its gap is the whole fill so far.
    let (v, _) = hs.sync(&cast.ben, Some(LAZY), None, None).await?;
    let Some(ben_since) = v["next_batch"].as_str().map(str::to_owned) else {
        return err("initial /sync without next_batch");
    };
    // createRoom's events, Ben, the members and the syncers.
    let mut events = 6 + 1 + cast.members.len() + syncers.len();
    let mut senders = vec![cast.creator.clone()];
    senders.extend(cast.members.iter().cloned());
    let senders = Arc::new(senders);
    let mut sent = 0;
    let mut rate = f64::NAN;
    for (si, &size) in sizes.iter().enumerate() {
        let need = size.saturating_sub(events);
        if rate.is_finite() && need as f64 / rate > config.growth_budget_secs as f64 {
            report.notes.push(format!(
                "growth {size}: skipped, filling {need} more events at {rate:.0} msgs/s would take {:.0} s (> {} s)",
                need as f64 / rate,
                config.growth_budget_secs
            ));
            break;
        }
        progress.say(&format!("growth {size}: sending {need} messages"));
        let t = Instant::now();
        let lat = send_range(hs, config, &room, &senders, &run, sent + 1, sent + need).await?;
        let secs = t.elapsed().as_secs_f64();
        if need > 0 {
            rate = need as f64 / secs;
            report.push(&format!("growth.{size}.fill_rate"), rate, "msgs/s", Better::Higher);
            report.lat(&format!("growth.{size}.send"), &lat, &[50]);
        }
        sent += need;
        events += need;
        report.push(&format!("growth.{size}.events"), events as f64, "events", Better::Info);

        progress.say(&format!("growth {size}: measuring"));
        let late = &extra[si * (per + 1)];
        let t = Instant::now();
        hs.join(late, &room).await?;
        report.push(&format!("growth.{size}.late_join_ms"), ms(t.elapsed()), "ms", Better::Lower);
        events += 1;
        let (lat, _) = page_history(hs, &cast.ben, &room, config.growth_pages).await?;
        report.lat(&format!("growth.{size}.messages_old_member"), &lat, &[50, 95]);
        let (lat, n) = page_history(hs, late, &room, 1000).await?;
        report.lat(&format!("growth.{size}.messages_late_joiner"), &lat, &[50]);
        report.push(&format!("growth.{size}.late_joiner_events"), n as f64, "events", Better::Info);
        let fresh = &extra[si * (per + 1) + 1..(si + 1) * (per + 1)];
        initial_syncs(hs, fresh, &room, &format!("growth.{size}.sync"), report).await?;
        gap_syncs(hs, &cast.ben, &room, &ben_since, per, &format!("growth.{size}.sync_gap"), report).await?;
    }
    Ok(())
}
