//! Process life: restart keeps users, tokens and the signing key; a bad
//! configuration stops start-up with one line; SIGTERM shuts down cleanly; the
//! sub-commands.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, binary};
use tokio::process::Command;

backend_tests!(restart_keeps_users_tokens_and_signing_key, sigterm_shuts_down_cleanly);

async fn restart_keeps_users_tokens_and_signing_key(backend: Backend) {
    let mut server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let key_file = server.data_dir.join("signing.key");
    let key_before = std::fs::read_to_string(&key_file).expect("signing key written on first start");
    assert!(key_before.starts_with("ed25519 a_"), "{key_before}");

    server.restart().await;

    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key_before, "the key is reused, not regenerated");
    let (status, me) = server.get("/_matrix/client/v3/account/whoami", Some(&alice.token)).await;
    assert_eq!((status, me["user_id"].as_str()), (200, Some("@alice:test.local")));
    server.login("alice", "pw").await;
    let (status, body) = server.get("/_matrix/client/v3/register/available?username=alice", None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_USER_IN_USE")));
    // Both starts logged the same key id.
    let key_id = format!("ed25519:{}", key_before.split_whitespace().nth(1).unwrap());
    assert_eq!(server.log().matches(&key_id).count(), 2, "{}", server.log());
}

async fn sigterm_shuts_down_cleanly(backend: Backend) {
    let mut server = Server::start(&backend).await;
    server.register("bob", "pw").await;
    assert_eq!(server.stop().await, Some(0));
    assert!(server.log().contains("shutting down"), "{}", server.log());
}

fn seqline() -> Command {
    let mut cmd = Command::new(binary());
    cmd.env_clear();
    cmd
}

#[tokio::test]
async fn bad_configuration_stops_start_up_with_one_line() {
    let dir = std::env::temp_dir().join(format!("seqline-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (environment variable, config file, what the error line must name)
    let cases = [
        (Some(("SEQLINE_LISTEN", "not-an-address")), None, "listen.client"),
        (Some(("SEQLINE_SERVER_NAME", "bad name")), None, "server_name"),
        (Some(("SEQLINE_REGISTRATION", "sometimes")), None, "SEQLINE_REGISTRATION"),
        (Some(("SEQLINE_RATE_LIMITS", "maybe")), None, "SEQLINE_RATE_LIMITS"),
        (Some(("SEQLINE_DATABASE_URL", "mysql://x")), None, "database_url"),
        (None, Some("server_nam = \"x\"\n"), "server_nam"),
        (None, Some("[registration]\nmode = \"token\"\n"), "registration.tokens"),
        (None, Some("[limits]\nmax_request_body_bytes = \"big\"\n"), "line 2"),
    ];
    for (i, (env, file, needle)) in cases.into_iter().enumerate() {
        let mut cmd = seqline();
        cmd.env("SEQLINE_DATA_DIR", dir.join(format!("d{i}")));
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        if let Some(text) = file {
            let path = dir.join(format!("c{i}.toml"));
            std::fs::write(&path, text).unwrap();
            cmd.arg("--config").arg(path);
        }
        let out = cmd.arg("serve").output().await.unwrap();
        assert_eq!(out.status.code(), Some(2), "case {i}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "case {i}: one line: {stderr}");
        assert!(stderr.contains(needle), "case {i}: {stderr} should name {needle}");
        assert!(!dir.join(format!("d{i}")).exists(), "case {i}: nothing is created");
    }
    let out = seqline().args(["serve", "--config", "/nonexistent/seqline.toml"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/seqline.toml"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn subcommands_help_version_and_generate_config() {
    let out = seqline().arg("--help").output().await.unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in ["serve", "generate-config", "register-user", "version"] {
        assert!(help.contains(sub), "{help}");
    }
    let out = seqline().arg("version").output().await.unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("seqline 0."));

    // The generated config is a working config: a server starts on it.
    let out = seqline().arg("generate-config").output().await.unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("server_name = \"localhost:8008\""));
    let options = Options::default().config(&text);
    let mut server = Server::start_with(&Backend::Sqlite, options).await;
    let (status, _) = server.get("/_matrix/client/versions", None).await;
    assert_eq!(status, 200);
    assert_eq!(server.stop().await, Some(0));
}
