//! Real clients against a real server: matrix-nio (Python, PyPI) runs
//! `clients/nio/flow.py` (registration through UIA, login, a room, an invite
//! seen in the sync loop and joined, 25 messages taken in turns and seen in
//! `/sync`, `/messages` back to the create event, a leave seen by both), once
//! in an unencrypted room and once end-to-end encrypted, both at once against
//! one server. nio validates every response against its schemas, so a missing
//! field fails the flow.
//!
//! `clients/nio/setup.sh` builds the client's venv once, under
//! `${SEQLINE_CLIENT_CACHE:-~/.cache/seqline/clients}`, from the pinned
//! `requirements.txt`; later runs reuse it. Nothing is skipped: no Python, no
//! PyPI on the first run, or a failed flow, fails the test with the reason.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use tokio::process::Command;

backend_tests!(matrix_nio_flows);

/// The first run installs from PyPI; later ones only check a stamp.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// One flow takes seconds; this is the limit past which it hangs.
const FLOW_TIMEOUT: Duration = Duration::from_secs(180);

fn nio_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/nio")
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
