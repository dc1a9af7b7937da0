//! The benchmarks (`bench/`: `seqline-bench`, and `seqline-fed-bench` with a
//! real Synapse) on a tiny size against a debug seqline: they must finish and
//! report figures. Never asserts on timings.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};

backend_tests!(bench_runs_the_chapter_on_a_tiny_size, bench_runs_a_tiny_growth_series);

fn tiny(server: &Server) -> seqline_bench::Config {
    let mut config = seqline_bench::Config::for_url(&server.base_url);
    config.server_name.clone_from(&server.server_name);
    config.members = 5;
    config.messages = 30;
    config.wake_samples = 3;
    config.sync_samples = 1;
    config.thread_replies = 60;
    config.progress = false;
    config.db_path = Some(server.data_dir.join("seqline.db"));
    config
}

fn positive(report: &seqline_bench::Report, key: &str) {
    let value = report.get(key).unwrap_or_else(|| panic!("no {key} in\n{}", report.table()));
    assert!(value.is_finite() && value > 0.0, "{key} = {value} in\n{}", report.table());
}

async fn bench_runs_the_chapter_on_a_tiny_size(backend: Backend) {
    let server = Server::start(&backend).await;
    let report =
        seqline_bench::run(&tiny(&server)).await.unwrap_or_else(|e| panic!("bench: {e}\n{}", server.log()));
    assert_eq!(report.get("send.count"), Some(30.0), "{}", report.table());
    assert_eq!(report.get("wake.samples"), Some(3.0), "{}", report.table());
    // The whole thread, in two pages of 50.
    assert_eq!(report.get("relations.events"), Some(60.0), "{}", report.table());
    assert_eq!(report.get("relations.pages"), Some(2.0), "{}", report.table());
    for key in [
        "register.rate",
        "join.rate",
        "send.rate",
        "send.p99_ms",
        "messages.ben.events",
        "messages.cara.events",
        "messages.ben.p50_ms",
        "relations.page.p50_ms",
        "threads.p50_ms",
        "thread.root_event.p50_ms",
        "sync.initial.full.bytes",
        "sync.initial.lazy.bytes",
        "wake.p50_ms",
    ] {
        positive(&report, key);
    }
    if matches!(backend, Backend::Sqlite) {
        positive(&report, "server.db_mib");
    }
    assert!(report.errors.is_empty(), "failed requests: {:?}", report.errors);
    // The JSON round-trips and compares with itself.
    let again = seqline_bench::Report::from_json(&report.to_json()).expect("report JSON");
    assert!(seqline_bench::compare(&report, &again).contains("send.rate"));
}

async fn bench_runs_a_tiny_growth_series(backend: Backend) {
    let server = Server::start(&backend).await;
    let mut config = tiny(&server);
    config.growth = vec![40, 60];
    config.growth_pages = 2;
    let report = seqline_bench::run(&config).await.unwrap_or_else(|e| panic!("bench: {e}\n{}", server.log()));
    for key in [
        "growth.40.events",
        "growth.60.events",
        "growth.60.messages_old_member.p50_ms",
        "growth.60.sync.lazy.bytes",
        "growth.60.sync_gap.lazy.p50_ms",
    ] {
        positive(&report, key);
    }
    assert!(report.errors.is_empty(), "failed requests: {:?}", report.errors);
}

/// `seqline-fed-bench`'s settings for a smoke test of `modes` on seqline
/// only (the debug binary), its output in a temporary directory named
/// after `name` (the caller removes it).
fn tiny_fed(modes: &[&str], name: &str) -> (seqline_bench::federation::FedConfig, std::path::PathBuf) {
    let out = std::env::temp_dir().join(format!("seqline-fed-bench-{name}-smoke-{}", std::process::id()));
    let mut config = seqline_bench::federation::FedConfig::defaults();
    config.mode = modes.iter().map(|m| (*m).to_owned()).collect();
    config.servers = vec!["seqline".to_owned()];
    config.rounds = 1;
    config.progress = false;
    config.out = Some(out.clone());
    config.seqline_bin = Some(complement_tests::harness::binary());
    (config, out)
}

/// The federation join benchmark (`seqline-fed-bench`) on a tiny room, for
/// the pair it can run today: a debug seqline as the resident, a real
/// Synapse joining (SQLite only: the benchmark makes its own databases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fed_bench_times_a_synapse_user_joining_a_tiny_seqline_room() {
    let out = std::env::temp_dir().join(format!("seqline-fed-bench-smoke-{}", std::process::id()));
    let mut config = seqline_bench::federation::FedConfig::defaults();
    config.pairs = vec!["seqline:synapse".to_owned()];
    config.members = 4;
    config.events = 20;
    config.repeats = 2;
    config.progress = false;
    config.out = Some(out.clone());
    config.seqline_bin = Some(complement_tests::harness::binary());
    config.synapse_python = Some(complement_tests::synapse::python().await);
    let results = seqline_bench::federation::run(&config).await.expect("fed bench");
    let table = seqline_bench::federation::table(&config, &results);
    let _ = std::fs::remove_dir_all(&out);
    let [pair] = results.as_slice() else { panic!("one pair expected:\n{table}") };
    assert_eq!(pair.error, None, "{table}");
    assert_eq!((pair.resident.as_str(), pair.joiner.as_str()), ("seqline", "Synapse"), "{table}");
    // The room as built: the creator and 3 members; createRoom's events, 3 joins, messages up to 20.
    assert_eq!((pair.members, pair.events), (4, 20), "{table}");
    for samples in [&pair.join_ms, &pair.sync_ms, &pair.members_ms] {
        assert_eq!(samples.len(), 2, "{table}");
        assert!(samples.iter().all(|&ms| ms.is_finite() && ms > 0.0), "{table}");
    }
    assert!(table.contains("seqline <- Synapse"), "{table}");
}

/// The PDU modes of `seqline-fed-bench` on a tiny size, a debug seqline
/// receiving: a fake server's PDUs into a room of 4 members (both shapes),
/// and a backfill of 120 events. They must finish, count every PDU in the
/// receiver's `/messages`, page back to the room's creation and report
/// positive figures (SQLite only: the benchmark makes its own databases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fed_bench_pdu_modes_run_on_a_tiny_size() {
    use seqline_bench::federation::pdus;
    let (mut config, out) = tiny_fed(&["inbound", "backfill"], "pdus");
    config.members = 4;
    config.pdus = 60;
    config.txn_size = 20;
    config.branches = 2;
    config.merge_every = 5;
    config.history = 120;
    config.page_size = 30;
    let results = pdus::run(&config).await.expect("fed bench, PDU modes");
    let table = pdus::table(&config, &results);
    let _ = std::fs::remove_dir_all(&out);
    assert!(!results.failed(), "{table}");
    assert_eq!(results.inbound.len(), 2, "{table}");
    for r in &results.inbound {
        assert_eq!((r.pdus, r.accepted, r.refused, r.txns), (60, 60, 0, 3), "{table}");
        assert!(r.answered_rate() > 0.0 && r.synced_rate().is_finite() && r.synced_rate() > 0.0, "{table}");
    }
    let [backfill] = results.backfill.as_slice() else { panic!("one backfill expected:\n{table}") };
    assert!(backfill.reached_create, "{table}");
    // The fake's 120 events and the reader's join.
    assert_eq!((backfill.history, backfill.events), (120, 121), "{table}");
    assert!(backfill.total_ms > 0.0 && backfill.backfills > 0, "{table}");
    assert!(table.contains("seqline    linear"), "{table}");
}

/// The latency mode of `seqline-fed-bench` on a tiny size: two debug
/// seqlines, a few messages and typing notices from one into the other's
/// waiting `/sync`. It must finish with every sample, positive and finite,
/// in its results and its JSON (SQLite only: the benchmark makes its own
/// databases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fed_bench_latency_runs_on_a_tiny_size() {
    use seqline_bench::federation::latency;
    let (mut config, out) = tiny_fed(&["latency"], "latency");
    config.latency_pairs = vec!["seqline:seqline".to_owned()];
    config.samples = 3;
    let results = latency::run(&config).await.expect("fed bench, latency");
    let table = latency::table(&config, &results);
    let json = latency::to_json(&config, &results);
    let _ = std::fs::remove_dir_all(&out);
    let [pair] = results.as_slice() else { panic!("one pair expected:\n{table}") };
    assert_eq!(pair.error, None, "{table}");
    for samples in [&pair.message_ms, &pair.typing_ms] {
        assert_eq!(samples.len(), 3, "{table}");
        assert!(samples.iter().all(|&ms| ms.is_finite() && ms > 0.0), "{table}");
    }
    for kind in ["message", "typing"] {
        let figures = &json["pairs"][0][kind];
        assert_eq!(figures["samples"], 3, "{json}");
        for key in ["p50_ms", "p95_ms", "max_ms"] {
            assert!(figures[key].as_f64().is_some_and(|ms| ms > 0.0), "{kind} {key} in {json}");
        }
    }
    assert!(table.contains("seqline -> seqline     message"), "{table}");
}

/// The fan-out mode of `seqline-fed-bench` on a tiny size: a debug seqline
/// hosting a room of 3 local users and 3 users of each of 2 fake servers,
/// 3 s of activity. Each fake must have received transactions with the
/// messages and typing notices, each at most once (no per-member copies),
/// and the JSON must carry the counts (SQLite only: the benchmark makes its
/// own databases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fed_bench_fanout_runs_on_a_tiny_size() {
    use seqline_bench::federation::fanout;
    let (mut config, out) = tiny_fed(&["fanout"], "fanout");
    config.fakes = 2;
    config.users_per_server = 3;
    config.window_secs = 3;
    let results = fanout::run(&config).await.expect("fed bench, fanout");
    let table = fanout::table(&config, &results);
    let json = fanout::to_json(&config, &results);
    let _ = std::fs::remove_dir_all(&out);
    let [round] = results.as_slice() else { panic!("one round expected:\n{table}") };
    assert_eq!(round.error, None, "{table}");
    assert_eq!((round.members, round.destinations.len(), round.per_destination.len()), (9, 2, 2), "{table}");
    let a = round.activity;
    assert!(a.messages > 0 && a.typing > 0 && a.receipts > 0 && a.presence > 0, "{a:?}\n{table}");
    for c in &round.per_destination {
        assert!(c.txns > 0 && c.bytes > 0, "{table}");
        assert!((1..=a.messages).contains(&c.pdus), "{table}");
        let typing = c.edus.get("m.typing").map_or(0, |e| e.edus);
        assert!((1..=a.typing).contains(&typing), "{table}");
    }
    let total = &json["results"][0]["total"];
    assert!(total["txns"].as_u64().is_some_and(|n| n > 0), "{json}");
    assert!(total["edus"]["m.typing"]["edus"].as_u64().is_some_and(|n| n > 0), "{json}");
    assert!(table.contains("seqline      1     2"), "{table}");
}
