//! The federation join benchmark (`seqline-fed-bench`): for each pair of
//! servers (resident, joiner) it starts both fresh on loopback, each named
//! `127.0.0.1:<federation port>` with a TLS federation listener and a
//! self-signed certificate; builds on the resident a room of `--members`
//! members and `--events` events through the client API (`history_visibility:
//! shared`); then, `--repeats` times, a new user of the joiner joins it by
//! `POST /join/{roomId}?server_name=<resident>` and we time
//!
//! - (a) the join request until its 200,
//! - (b) the join request until the join event is in the room creator's
//!   `/sync` on the resident (a long-poll from a token taken before the join),
//! - (c) the join request until the joiner's `/joined_members` lists every
//!   member (a server that joined with partial state fills it in afterwards),
//!
//! after which the joiner leaves again, and the next sample starts once the
//! resident has the leave: so every sample is a join by a server that is not
//! in the room (the first one with cold key caches on both sides).
//!
//! Seqline runs from a release binary, Synapse from the pinned venv of
//! `complement-tests/clients/synapse/setup.sh`; both on SQLite (or PostgreSQL
//! with `--postgres`), rate limits off, registration open, presence off, logs
//! at warning level. This is a measurement, not a test.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

pub mod fanout;
pub mod latency;
pub mod pdus;

use crate::{
    BenchError, Config, Hs, PASSWORD, Progress, Report, Res, User, V3, enc, err, join_all, ms, register_all,
    send_range,
};

/// The federation benchmark's settings (its command line).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "seqline-fed-bench",
    about = "Times a remote join into a large room for the pairs (resident, joiner) of seqline and Synapse"
)]
pub struct FedConfig {
    /// The pairs to run, each `resident:joiner` (`seqline` or `synapse`), in this order.
    #[arg(long, value_delimiter = ',', default_value = "seqline:synapse,synapse:seqline,synapse:synapse")]
    pub pairs: Vec<String>,
    /// Members of the resident's room (the creator included), before the joins.
    #[arg(long, default_value_t = 500)]
    pub members: usize,
    /// Events in the resident's room before the joins: createRoom's events,
    /// the members' joins, then messages up to this count.
    #[arg(long, default_value_t = 5000)]
    pub events: usize,
    /// Joins timed per pair (each by a new user of the joiner, who leaves afterwards).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Concurrent clients for the population (registrations, joins, messages).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// The room version to create (default: the resident's default).
    #[arg(long)]
    pub room_version: Option<String>,
    /// The seqline binary (default: `seqline` next to this program).
    #[arg(long)]
    pub seqline_bin: Option<PathBuf>,
    /// The Python of the Synapse venv (default:
    /// `${SEQLINE_CLIENT_CACHE:-~/.cache/seqline/clients}/synapse-venv/bin/python`).
    #[arg(long)]
    pub synapse_python: Option<PathBuf>,
    /// PostgreSQL for both servers instead of SQLite: a server URL without a
    /// database (e.g. `postgres://postgres@127.0.0.1:5432`); a fresh database
    /// per server is made with `psql`. Synapse needs psycopg2 in its venv.
    #[arg(long)]
    pub postgres: Option<String>,
    /// Where the servers' directories and logs go (default:
    /// `~/.cache/seqline/bench-results/fed-<time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the servers' databases (by default only the logs are kept).
    #[arg(long)]
    pub keep_data: bool,
    /// The servers' log level: `warn` (seqline `warn`, Synapse `WARNING`) or
    /// `info`; anything else is seqline's filter as given (say
    /// `seqline=debug`, to read a sample's timings), Synapse's `WARNING`.
    #[arg(long, default_value = "warn")]
    pub server_log: String,
    /// Seconds a join, or the wait for it on either side, may take before the pair is failed.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Print progress lines on stderr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub progress: bool,
    /// What to measure: `join` (the pairs above), `inbound` (a fake
    /// server's PDUs into a room of `--members` on each of `--servers`),
    /// `backfill` (a user of each of `--servers` pages back through
    /// `--history` events of a room the fake hosts), `latency` (a message
    /// and a typing notice from one server into a `/sync` long-poll on the
    /// other, for `--latency-pairs`), `fanout` (what each of `--fakes` fake
    /// servers receives while the local users of each of `--servers` are
    /// active in a room they share); several with commas.
    #[arg(long, value_delimiter = ',', default_value = "join")]
    pub mode: Vec<String>,
    /// inbound, backfill, fanout: the servers under test (`seqline`,
    /// `synapse`), in the first round's order; each round reverses the
    /// order of the last.
    #[arg(long, value_delimiter = ',', default_value = "seqline,synapse")]
    pub servers: Vec<String>,
    /// inbound, backfill, fanout: rounds, each on fresh servers.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// latency: the pairs to run, each `sender:receiver` (`seqline` or `synapse`), in this order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "seqline:seqline,seqline:synapse,synapse:seqline,synapse:synapse"
    )]
    pub latency_pairs: Vec<String>,
    /// latency: samples per pair of each kind (message, typing notice),
    /// after one warm-up sample of each that is not counted.
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// fanout: fake federation servers in the room, beside the server under test.
    #[arg(long, default_value_t = 19)]
    pub fakes: usize,
    /// fanout: members of the room on each server (the server under test and each fake).
    #[arg(long, default_value_t = 25)]
    pub users_per_server: usize,
    /// fanout: seconds of activity by the local users during which the fakes count what they receive.
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
    /// Presence on the servers started (`fanout` turns it on; the other modes leave it off).
    #[arg(skip)]
    pub presence: bool,
    /// inbound: PDUs the fake sends per shape.
    #[arg(long, default_value_t = 5000)]
    pub pdus: usize,
    /// inbound: PDUs per transaction (one transaction in flight at a time).
    #[arg(long, default_value_t = 50)]
    pub txn_size: usize,
    /// inbound: `linear` (each PDU's prev event is the one before) and/or
    /// `forked` (`--branches` branches merged every `--merge-every` PDUs).
    #[arg(long, value_delimiter = ',', default_value = "linear,forked")]
    pub shapes: Vec<String>,
    /// inbound, forked: concurrent branches, one fake user each.
    #[arg(long, default_value_t = 3)]
    pub branches: usize,
    /// inbound, forked: every this many PDUs one names every branch's tip.
    #[arg(long, default_value_t = 30)]
    pub merge_every: usize,
    /// inbound: `sync` sends each transaction once the last PDU of the one
    /// before is in the room creator's `/sync` (the receiver has taken it);
    /// `answer` as soon as the one before is answered (Synapse answers before
    /// it processes, and past 100 PDUs queued for a room drops all but the
    /// newest, to be fetched again; the fake does not answer those fetches
    /// for this room, so fewer PDUs arrive).
    #[arg(long, default_value = "sync")]
    pub pace: String,
    /// backfill: events of the fake's room (its creation included) before the join.
    #[arg(long, default_value_t = 5000)]
    pub history: usize,
    /// backfill: the `limit` of each `/messages` page.
    #[arg(long, default_value_t = 100)]
    pub page_size: usize,
}

impl FedConfig {
    /// Every flag at its default.
    pub fn defaults() -> Self {
        Self::parse_from(["seqline-fed-bench"])
    }

    /// The servers' database, as the tables name it.
    fn backend(&self) -> &'static str {
        if self.postgres.is_some() { "PostgreSQL" } else { "SQLite" }
    }
}

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// seqline (release binary).
    Seqline,
    /// Synapse (the pinned venv).
    Synapse,
}

impl Kind {
    fn parse(s: &str) -> Res<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "seqline" => Ok(Self::Seqline),
            "synapse" => Ok(Self::Synapse),
            other => err(format!("unknown server {other:?} (seqline or synapse)")),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Seqline => "seqline",
            Self::Synapse => "Synapse",
        }
    }
}

/// Parses `resident:joiner`.
pub fn parse_pair(s: &str) -> Res<(Kind, Kind)> {
    let Some((r, j)) = s.split_once(':') else {
        return err(format!("pair {s:?} is not resident:joiner"));
    };
    Ok((Kind::parse(r)?, Kind::parse(j)?))
}

/// What one pair measured.
#[derive(Debug, Clone, Default)]
pub struct PairResult {
    /// `seqline`, `Synapse` or `Synapse A`.
    pub resident: String,
    /// `seqline`, `Synapse` or `Synapse B`.
    pub joiner: String,
    /// The room's id.
    pub room_id: String,
    /// Joined members of the room as built (the resident's `/joined_members`).
    pub members: usize,
    /// Events of the room as built (the creator's `/messages`, all pages).
    pub events: usize,
    /// Of those, state events.
    pub state_events: usize,
    /// Phases and their wall time in seconds, in order.
    pub phases: Vec<(String, f64)>,
    /// (a) join request until 200, ms, one per sample.
    pub join_ms: Vec<f64>,
    /// (b) join request until the join is in the creator's /sync, ms.
    pub sync_ms: Vec<f64>,
    /// (c) join request until the joiner's /joined_members lists every member, ms.
    pub members_ms: Vec<f64>,
    /// Why the pair stopped, if it did.
    pub error: Option<String>,
}

impl PairResult {
    fn label(&self) -> String {
        format!("{} <- {}", self.resident, self.joiner)
    }

    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "resident": self.resident,
            "joiner": self.joiner,
            "room_id": self.room_id,
            "members": self.members,
            "events": self.events,
            "state_events": self.state_events,
            "phases_s": self.phases.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "join_200_ms": self.join_ms,
            "join_in_creator_sync_ms": self.sync_ms,
            "joiner_has_all_members_ms": self.members_ms,
            "error": self.error,
        })
    }
}

fn summary(samples: &[f64]) -> String {
    if samples.is_empty() {
        return "-".to_owned();
    }
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} [{:.0}–{:.0}]", median(samples), min, max)
}

/// The median (mean of the middle two for an even count); NaN when empty.
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { f64::midpoint(s[n / 2 - 1], s[n / 2]) }
}

/// The results as a text table, each pair's phases, and how each seqline
/// pair compares with Synapse on both ends.
pub fn table(config: &FedConfig, results: &[PairResult]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let backend = if config.postgres.is_some() { "PostgreSQL" } else { "SQLite" };
    let _ = writeln!(
        out,
        "== federation join: room of {} members / {} events on the resident, {} joins per pair ({backend})",
        config.members, config.events, config.repeats
    );
    let _ = writeln!(out, "   times in ms from the join request: median [min–max]");
    let _ = writeln!(
        out,
        "{:<22} {:>14} {:>18} {:>22} {:>22}  samples (a / b)",
        "resident <- joiner", "room as built", "(a) join 200", "(b) in creator's sync", "(c) joiner has all"
    );
    for r in results {
        let room = if r.events > 0 { format!("{} m / {} ev", r.members, r.events) } else { "-".to_owned() };
        let samples: Vec<String> =
            r.join_ms.iter().zip(&r.sync_ms).map(|(a, b)| format!("{a:.0}/{b:.0}")).collect();
        let _ = writeln!(
            out,
            "{:<22} {:>14} {:>18} {:>22} {:>22}  {}",
            r.label(),
            room,
            summary(&r.join_ms),
            summary(&r.sync_ms),
            summary(&r.members_ms),
            samples.join(" ")
        );
    }
    for r in results {
        let phases: Vec<String> = r.phases.iter().map(|(k, v)| format!("{k} {v:.1} s")).collect();
        let _ = writeln!(out, "{}: {}", r.label(), phases.join(", "));
        if let Some(e) = &r.error {
            let _ = writeln!(out, "  FAILED: {e}");
        }
    }
    let base = results.iter().find(|r| r.resident.starts_with("Synapse") && r.joiner.starts_with("Synapse"));
    if let Some(base) = base.filter(|b| !b.join_ms.is_empty()) {
        for r in results.iter().filter(|r| !std::ptr::eq(*r, base) && !r.join_ms.is_empty()) {
            let (a, b) =
                (median(&r.join_ms) / median(&base.join_ms), median(&r.sync_ms) / median(&base.sync_ms));
            let verdict = if a <= 1.0 && b <= 1.0 { "not slower" } else { "SLOWER" };
            let _ = writeln!(
                out,
                "{} vs {}: (a) x{a:.2}, (b) x{b:.2} of Synapse on both ends: {verdict}",
                r.label(),
                base.label()
            );
        }
    }
    out
}

/// Runs every pair; a pair that fails keeps its figures so far and its error.
pub async fn run(config: &FedConfig) -> Res<Vec<PairResult>> {
    let pairs: Vec<(Kind, Kind)> = config.pairs.iter().map(|p| parse_pair(p)).collect::<Res<_>>()?;
    if config.members < 2 || config.repeats == 0 {
        return err("need --members >= 2 and --repeats >= 1");
    }
    let (progress, out) = start_run(config)?;
    let bins = Binaries::find(config, &pairs).await?;
    let mut results = Vec::new();
    for (i, &(resident, joiner)) in pairs.iter().enumerate() {
        let (rl, jl) = if resident == joiner {
            (format!("{} A", resident.as_str()), format!("{} B", joiner.as_str()))
        } else {
            (resident.as_str().to_owned(), joiner.as_str().to_owned())
        };
        let mut result = PairResult { resident: rl, joiner: jl, ..PairResult::default() };
        let dir = out.join(format!(
            "{}-{}-{}",
            i + 1,
            resident.as_str().to_lowercase(),
            joiner.as_str().to_lowercase()
        ));
        progress.say(&format!("pair {}: {}", i + 1, result.label()));
        let outcome = run_pair(config, &bins, &progress, &dir, resident, joiner, i, &mut result).await;
        result.error = failure(&progress, outcome);
        results.push(result);
    }
    Ok(results)
}

/// A step's error, said as progress: `None` when it went well.
fn failure(progress: &Progress, outcome: Res<()>) -> Option<String> {
    let e = outcome.err()?;
    progress.say(&format!("  failed: {e}"));
    Some(e.0)
}

/// Runs `body` on a fresh server of `kind` (in `dir`, database `db`) and
/// stops it afterwards; an error carries the tail of the server's log.
async fn with_server<T>(
    config: &FedConfig,
    bins: &Binaries,
    (kind, dir, db): (Kind, &Path, &str),
    body: impl AsyncFnOnce(&Server) -> Res<T>,
) -> Res<T> {
    let mut server = Server::start(config, bins, kind, dir, db).await?;
    let outcome = body(&server).await.map_err(|e| BenchError(format!("{e}{}", server.log_tail("server"))));
    server.stop(config).await;
    outcome
}

/// The progress printer and the output directory (`--out`, made if missing) of a run.
fn start_run(config: &FedConfig) -> Res<(Progress, PathBuf)> {
    let progress = Progress { on: config.progress, start: Instant::now() };
    let out = match &config.out {
        Some(o) => o.clone(),
        None => home().join(".cache/seqline/bench-results").join(format!("fed-{}", unix_secs())),
    };
    std::fs::create_dir_all(&out).map_err(|e| BenchError(format!("{}: {e}", out.display())))?;
    progress.say(&format!("servers' directories and logs in {}", out.display()));
    Ok((progress, out))
}

/// Starts two fresh servers at once, each `(kind, its directory, its
/// database's name)`; if either fails the other is stopped again.
async fn start_two(
    config: &FedConfig,
    bins: &Binaries,
    a: (Kind, &Path, &str),
    b: (Kind, &Path, &str),
) -> Res<(Server, Server)> {
    let (x, y) =
        tokio::join!(Server::start(config, bins, a.0, a.1, a.2), Server::start(config, bins, b.0, b.1, b.2));
    match (x, y) {
        (Ok(x), Ok(y)) => Ok((x, y)),
        (Err(e), Ok(mut other)) | (Ok(mut other), Err(e)) => {
            other.stop(config).await;
            Err(e)
        }
        (Err(e), Err(_)) => Err(e),
    }
}

struct Binaries {
    seqline: PathBuf,
    python: PathBuf,
}

impl Binaries {
    async fn find(config: &FedConfig, pairs: &[(Kind, Kind)]) -> Res<Self> {
        let seqline = match &config.seqline_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| BenchError(format!("current_exe: {e}")))?
                .with_file_name("seqline"),
        };
        let python = match &config.synapse_python {
            Some(p) => p.clone(),
            None => std::env::var_os("SEQLINE_CLIENT_CACHE")
                .map_or_else(|| home().join(".cache/seqline/clients"), PathBuf::from)
                .join("synapse-venv/bin/python"),
        };
        let uses = |k| pairs.iter().any(|&(r, j)| r == k || j == k);
        if uses(Kind::Seqline) && !seqline.is_file() {
            return err(format!(
                "no seqline binary at {} (build it: cargo build --release)",
                seqline.display()
            ));
        }
        if uses(Kind::Synapse) {
            if !python.is_file() {
                return err(format!(
                    "no Synapse venv at {} (run complement-tests/clients/synapse/setup.sh)",
                    python.display()
                ));
            }
            if config.postgres.is_some() {
                let ok = Command::new(&python)
                    .args(["-c", "import psycopg2"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .await
                    .is_ok_and(|s| s.success());
                if !ok {
                    return err(format!(
                        "--postgres: the Synapse venv ({}) has no psycopg2",
                        python.display()
                    ));
                }
            }
        }
        Ok(Self { seqline, python })
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[allow(clippy::too_many_arguments)]
async fn run_pair(
    config: &FedConfig,
    bins: &Binaries,
    progress: &Progress,
    dir: &Path,
    resident: Kind,
    joiner: Kind,
    index: usize,
    result: &mut PairResult,
) -> Res<()> {
    let t = Instant::now();
    let db = |role: &str| format!("fedbench_{}_{role}_{}", index + 1, std::process::id());
    let (res_dir, join_dir) = (dir.join("resident"), dir.join("joiner"));
    let (res_db, join_db) = (db("resident"), db("joiner"));
    let (mut res, mut join) =
        start_two(config, bins, (resident, &res_dir, &res_db), (joiner, &join_dir, &join_db)).await?;
    result.phases.push(("start both".to_owned(), t.elapsed().as_secs_f64()));
    progress.say(&format!(
        "  resident {} ({}), joiner {} ({})",
        res.name, res.client_url, join.name, join.client_url
    ));
    let outcome = async {
        let room = populate(config, progress, &res, result).await?;
        measure(config, progress, &res, &join, &room, result).await
    }
    .await;
    res.stop(config).await;
    join.stop(config).await;
    outcome
}

/// The resident's room as built.
struct Room {
    id: String,
    creator: User,
}

async fn populate(
    config: &FedConfig,
    progress: &Progress,
    res: &Server,
    result: &mut PairResult,
) -> Res<Room> {
    let hs = &res.hs;
    let mut bc = Config::for_url(&res.client_url);
    bc.concurrency = config.concurrency;
    bc.progress = false;
    let run = format!("f{}", unix_secs() % 100_000_000);
    let names: Vec<String> = std::iter::once(format!("{run}_creator"))
        .chain((1..config.members).map(|i| format!("{run}_m{i}")))
        .collect();
    progress.say(&format!("  registering {} users on the resident", names.len()));
    let t = Instant::now();
    let mut users = register_all(hs, &bc, names, &mut Report::default(), "register").await?;
    result.phases.push((format!("register {}", users.len()), t.elapsed().as_secs_f64()));
    let members = users.split_off(1);
    let Some(creator) = users.pop() else { return err("no creator") };

    let body = json!({
        "preset": "public_chat",
        "name": "seqline-fed-bench",
        "initial_state": [{
            "type": "m.room.history_visibility",
            "state_key": "",
            "content": { "history_visibility": "shared" },
        }],
    });
    let id = create_room(config, hs, &creator, body).await?;
    let (initial, _) = count_events(hs, &creator, &id).await?;
    progress.say(&format!("  room {id} ({initial} events); {} members join", members.len()));
    let t = Instant::now();
    join_all(hs, &bc, &id, &members, &mut Report::default()).await?;
    result.phases.push((format!("join {}", members.len()), t.elapsed().as_secs_f64()));

    let messages = config.events.saturating_sub(initial + members.len());
    progress.say(&format!("  sending {messages} messages, {} at a time", config.concurrency));
    let mut senders = vec![creator.clone()];
    senders.extend(members.iter().cloned());
    let senders = Arc::new(senders);
    let t = Instant::now();
    send_range(hs, &bc, &id, &senders, &run, 1, messages).await?;
    let secs = t.elapsed().as_secs_f64();
    result.phases.push((format!("send {messages} ({:.0}/s)", messages as f64 / secs), secs));

    let t = Instant::now();
    let (events, state) = count_events(hs, &creator, &id).await?;
    let path = format!("{V3}/rooms/{}/joined_members", enc(&id));
    let (v, _) = hs.ok("joined_members", Method::GET, &path, Some(&creator.token), None).await?;
    result.members = v["joined"].as_object().map_or(0, serde_json::Map::len);
    (result.events, result.state_events) = (events, state);
    result.room_id.clone_from(&id);
    result.phases.push(("count".to_owned(), t.elapsed().as_secs_f64()));
    progress.say(&format!("  built: {} members, {events} events ({state} state)", result.members));
    Ok(Room { id, creator })
}

/// `creator` creates a room with `body` (and `--room-version`, if given); answers its id.
async fn create_room(config: &FedConfig, hs: &Hs, creator: &User, body: Value) -> Res<String> {
    hs.create_room_with(creator, body, config.room_version.as_deref()).await
}

/// Every event of the room the creator can page back to: (all, state).
async fn count_events(hs: &Hs, user: &User, room: &str) -> Res<(usize, usize)> {
    let (mut events, mut state) = (0, 0);
    let mut from: Option<String> = None;
    loop {
        let mut path = format!("{V3}/rooms/{}/messages?dir=b&limit=1000", enc(room));
        if let Some(f) = &from {
            path.push_str(&format!("&from={}", enc(f)));
        }
        let (v, _) = hs.ok("messages", Method::GET, &path, Some(&user.token), None).await?;
        let chunk = v["chunk"].as_array().map_or(&[][..], Vec::as_slice);
        events += chunk.len();
        state += chunk.iter().filter(|e| e.get("state_key").is_some()).count();
        match v["end"].as_str() {
            Some(e) if from.as_deref() != Some(e) => from = Some(e.to_owned()),
            _ => break,
        }
    }
    Ok((events, state))
}

/// Only the room's timeline, a few events of it, no presence or account data.
const SYNC_FILTER: &str = r#"{"room":{"timeline":{"limit":20},"state":{"lazy_load_members":true},"ephemeral":{"types":[]},"account_data":{"types":[]}},"presence":{"types":[]},"account_data":{"types":[]}}"#;

async fn measure(
    config: &FedConfig,
    progress: &Progress,
    res: &Server,
    join: &Server,
    room: &Room,
    result: &mut PairResult,
) -> Res<()> {
    let timeout = Duration::from_secs(config.timeout_secs);
    let (v, _) = res.hs.sync(&room.creator, Some(SYNC_FILTER), None, None).await?;
    let Some(mut since) = v["next_batch"].as_str().map(str::to_owned) else {
        return err("the creator's /sync has no next_batch");
    };
    let run = format!("j{}", unix_secs() % 100_000_000);
    let expected = result.members + 1;
    let t_all = Instant::now();
    for i in 0..config.repeats {
        let joiner = join.hs.register(&format!("{run}_{i}"), PASSWORD, None).await?;
        let t0 = Instant::now();
        let watch = {
            let (hs, creator, room, user, since) = (
                res.hs.clone(),
                room.creator.clone(),
                room.id.clone(),
                joiner.user_id.clone(),
                since.clone(),
            );
            tokio::spawn(async move {
                wait_membership(&hs, &creator, &room, &user, "join", since, t0, timeout).await
            })
        };
        let path = format!("{V3}/join/{}?server_name={}", enc(&room.id), enc(&res.name));
        let answer = tokio::time::timeout(
            timeout,
            join.hs.raw(Method::POST, &path, Some(&joiner.token), Some(&json!({}))),
        )
        .await;
        let join_ms = ms(t0.elapsed());
        match answer {
            Ok(Ok((200, v, _))) if v["room_id"].as_str() == Some(room.id.as_str()) => {}
            Ok(Ok((status, v, _))) => {
                watch.abort();
                return err(format!(
                    "join {} by {}: {status} {v} after {join_ms:.0} ms{}",
                    i + 1,
                    joiner.user_id,
                    join.log_tail("joiner")
                ));
            }
            Ok(Err(e)) => {
                watch.abort();
                return err(format!("join {}: {e}{}", i + 1, join.log_tail("joiner")));
            }
            Err(_) => {
                watch.abort();
                return err(format!(
                    "join {}: no answer within {timeout:?}{}",
                    i + 1,
                    join.log_tail("joiner")
                ));
            }
        }
        let (sync_ms, next) = watch
            .await
            .map_err(|e| BenchError(format!("sync task: {e}")))?
            .map_err(|e| BenchError(format!("{e}{}", res.log_tail("resident"))))?;
        since = next;
        let members_ms = wait_members(&join.hs, &joiner, &room.id, expected, t0, timeout).await?;
        progress.say(&format!(
            "  join {}: 200 in {join_ms:.0} ms, in the creator's sync in {sync_ms:.0} ms, the joiner lists {expected} members after {members_ms:.0} ms",
            i + 1
        ));
        result.join_ms.push(join_ms);
        result.sync_ms.push(sync_ms);
        result.members_ms.push(members_ms);
        if i + 1 < config.repeats {
            // Leave, so that the next join is again by a server not in the room.
            let path = format!("{V3}/rooms/{}/leave", enc(&room.id));
            join.hs.ok("leave", Method::POST, &path, Some(&joiner.token), Some(&json!({}))).await?;
            let t = Instant::now();
            let (_, next) = wait_membership(
                &res.hs,
                &room.creator,
                &room.id,
                &joiner.user_id,
                "leave",
                since,
                t,
                timeout,
            )
            .await
            .map_err(|e| BenchError(format!("after join {}: {e}", i + 1)))?;
            since = next;
        }
    }
    result.phases.push((format!("{} joins (with leaves)", config.repeats), t_all.elapsed().as_secs_f64()));
    Ok(())
}

/// Long-polls `user`'s /sync from `since` until the room's timeline (or
/// state) carries `target`'s membership `want`; returns the ms since `t0`
/// and the next `since`.
#[allow(clippy::too_many_arguments)]
async fn wait_membership(
    hs: &Hs,
    user: &User,
    room: &str,
    target: &str,
    want: &str,
    mut since: String,
    t0: Instant,
    timeout: Duration,
) -> Res<(f64, String)> {
    loop {
        let (v, _) = hs.sync(user, Some(SYNC_FILTER), Some(&since), Some(10_000)).await?;
        let at = ms(t0.elapsed());
        let r = &v["rooms"]["join"][room];
        let found = ["timeline", "state"].iter().any(|section| {
            r[section]["events"].as_array().is_some_and(|evs| {
                evs.iter().any(|e| {
                    e["type"] == "m.room.member"
                        && e["state_key"].as_str() == Some(target)
                        && e["content"]["membership"].as_str() == Some(want)
                })
            })
        });
        if let Some(next) = v["next_batch"].as_str() {
            next.clone_into(&mut since);
        }
        if found {
            return Ok((at, since));
        }
        if t0.elapsed() > timeout {
            return err(format!(
                "{target}'s {want} did not reach {}'s /sync within {timeout:?}",
                user.user_id
            ));
        }
    }
}

/// Polls the joiner's /joined_members every 100 ms until it lists `expected`
/// members; returns the ms since `t0`.
async fn wait_members(
    hs: &Hs,
    user: &User,
    room: &str,
    expected: usize,
    t0: Instant,
    timeout: Duration,
) -> Res<f64> {
    let path = format!("{V3}/rooms/{}/joined_members", enc(room));
    let mut last = Value::Null;
    while t0.elapsed() < timeout {
        let (status, v, _) = hs.raw(Method::GET, &path, Some(&user.token), None).await?;
        if status == 200 && v["joined"].as_object().is_some_and(|m| m.len() >= expected) {
            return Ok(ms(t0.elapsed()));
        }
        last = if status == 200 { json!(v["joined"].as_object().map_or(0, serde_json::Map::len)) } else { v };
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    err(format!(
        "the joiner's /joined_members did not list {expected} members within {timeout:?} (last: {last})"
    ))
}

/// One running server.
struct Server {
    kind: Kind,
    /// `127.0.0.1:<federation port>`.
    name: String,
    client_url: String,
    dir: PathBuf,
    child: Child,
    hs: Hs,
    /// The PostgreSQL database, if any.
    db: Option<String>,
}

/// A free loopback port (bound and released).
fn free_port() -> Res<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError(format!("free port: {e}")))
}

/// A self-signed P-256 certificate for 127.0.0.1 and localhost in `dir`.
async fn make_certificate(dir: &Path) -> Res<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| BenchError(format!("openssl: {e}")))?;
    if !status.success() {
        return err(format!("openssl req failed: {status}"));
    }
    Ok((cert, key))
}

fn random_bytes<const N: usize>() -> Res<[u8; N]> {
    let mut buf = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| BenchError(format!("/dev/urandom: {e}")))?;
    Ok(buf)
}

/// Unpadded standard base64.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Synapse's default `ip_range_blacklist` without 127.0.0.0/8 (an IP-literal
/// server name is checked against this list only).
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

/// Synapse's rate limiters (nested ones by their leaves), all lifted.
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

async fn psql(sql: &str) -> Res<()> {
    let status = Command::new("psql")
        .args(["-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", sql])
        .stdout(Stdio::null())
        .status()
        .await
        .map_err(|e| BenchError(format!("psql: {e}")))?;
    if status.success() { Ok(()) } else { err(format!("psql {sql:?}: {status}")) }
}

impl Server {
    async fn start(config: &FedConfig, bins: &Binaries, kind: Kind, dir: &Path, db_name: &str) -> Res<Self> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| BenchError(format!("{}: {e}", dir.display())))?;
        let (cert, key) = make_certificate(dir).await?;
        let (fed_port, client_port) = (free_port()?, free_port()?);
        let name = format!("127.0.0.1:{fed_port}");
        let client_url = format!("http://127.0.0.1:{client_port}");
        let db = match &config.postgres {
            Some(_) => {
                psql(&format!("DROP DATABASE IF EXISTS {db_name}")).await?;
                psql(&format!(
                    "CREATE DATABASE {db_name} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
                ))
                .await?;
                Some(db_name.to_owned())
            }
            None => None,
        };
        let log = std::fs::File::create(dir.join("stdout.log"))
            .map_err(|e| BenchError(format!("{}: {e}", dir.display())))?;
        let log2 = log.try_clone().map_err(|e| BenchError(format!("stdout.log: {e}")))?;
        let info = config.server_log == "info";
        let mut cmd = match kind {
            Kind::Seqline => {
                let mut cmd = Command::new(&bins.seqline);
                cmd.arg("serve").env_clear();
                if let Some(path) = std::env::var_os("PATH") {
                    cmd.env("PATH", path);
                }
                let data = dir.join("data");
                cmd.env("SEQLINE_SERVER_NAME", &name)
                    .env("SEQLINE_LISTEN", format!("127.0.0.1:{client_port}"))
                    .env("SEQLINE_LISTEN_FEDERATION", &name)
                    .env("SEQLINE_TLS_CERT", &cert)
                    .env("SEQLINE_TLS_KEY", &key)
                    .env("SEQLINE_FEDERATION_VERIFY_TLS", "false")
                    .env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8")
                    .env("SEQLINE_DATA_DIR", &data)
                    .env("SEQLINE_REGISTRATION", "open")
                    .env("SEQLINE_RATE_LIMITS", "off")
                    .env("SEQLINE_PRESENCE", if config.presence { "on" } else { "off" })
                    .env(
                        "SEQLINE_LOG",
                        match config.server_log.as_str() {
                            "info" => "info,sqlx=warn",
                            "warn" => "warn",
                            filter => filter,
                        },
                    );
                if let (Some(url), Some(db)) = (&config.postgres, &db) {
                    cmd.env("SEQLINE_DATABASE_URL", format!("{}/{db}", url.trim_end_matches('/')));
                }
                cmd
            }
            Kind::Synapse => {
                write_synapse_config(
                    config,
                    dir,
                    fed_port,
                    client_port,
                    &name,
                    &client_url,
                    db.as_deref(),
                    info,
                )?;
                let mut cmd = Command::new(&bins.python);
                cmd.args(["-m", "synapse.app.homeserver", "--config-path"])
                    .arg(dir.join("homeserver.yaml"))
                    .env("PYTHONUNBUFFERED", "1");
                cmd
            }
        };
        let mut child = cmd
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BenchError(format!("start {}: {e}", kind.as_str())))?;
        let hs = Hs::new(&client_url)?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return err(format!("{} exited with {status}:\n{}", kind.as_str(), tail_of(dir)));
            }
            let client = matches!(
                tokio::time::timeout(
                    Duration::from_secs(5),
                    hs.raw(Method::GET, "/_matrix/client/versions", None, None)
                )
                .await,
                Ok(Ok((200, _, _)))
            );
            if client && tokio::net::TcpStream::connect(("127.0.0.1", fed_port)).await.is_ok() {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.start_kill();
                return err(format!("{} did not answer within 120 s:\n{}", kind.as_str(), tail_of(dir)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { kind, name, client_url, dir: dir.to_owned(), child, hs, db })
    }

    /// "; <role>'s log:" and the tail of its log, or nothing when it is empty.
    fn log_tail(&self, role: &str) -> String {
        let tail = tail_of(&self.dir);
        if tail.trim().is_empty() { String::new() } else { format!("; {role}'s log:\n{tail}") }
    }

    /// Stops the process; removes the databases unless `--keep-data` (the logs stay).
    async fn stop(&mut self, config: &FedConfig) {
        if let Some(pid) = self.child.id() {
            // SIGTERM first (seqline shuts down cleanly), then kill.
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
                let _ = self.child.kill().await;
            }
        }
        if config.keep_data {
            return;
        }
        match self.kind {
            Kind::Seqline => {
                let _ = std::fs::remove_dir_all(self.dir.join("data"));
            }
            Kind::Synapse => {
                for f in ["homeserver.db", "homeserver.db-wal", "homeserver.db-shm", "homeserver.db-journal"]
                {
                    let _ = std::fs::remove_file(self.dir.join(f));
                }
                let _ = std::fs::remove_dir_all(self.dir.join("media"));
            }
        }
        if let Some(db) = &self.db {
            let _ = psql(&format!("DROP DATABASE IF EXISTS {db}")).await;
        }
    }
}

/// The last 40 lines of a server's output and log file.
fn tail_of(dir: &Path) -> String {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let all = format!("{}{}", read("stdout.log"), read("homeserver.log"));
    let lines: Vec<&str> = all.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Writes `homeserver.yaml` (as JSON, which YAML reads), its log config and a
/// fresh signing key: FEDERATION.md §8's settings for loopback federation.
#[allow(clippy::too_many_arguments)]
fn write_synapse_config(
    config: &FedConfig,
    dir: &Path,
    fed_port: u16,
    client_port: u16,
    name: &str,
    client_url: &str,
    db: Option<&str>,
    info: bool,
) -> Res<()> {
    let path = |f: &str| dir.join(f).display().to_string();
    let write = |f: &str, text: String| {
        std::fs::write(dir.join(f), text).map_err(|e| BenchError(format!("{}: {e}", dir.join(f).display())))
    };
    let seed = random_bytes::<32>()?;
    let key_id = hex(&random_bytes::<2>()?);
    write("signing.key", format!("ed25519 a_{key_id} {}\n", base64(&seed)))?;
    let log = json!({
        "version": 1,
        "formatters": { "plain": { "format": "%(asctime)s %(name)s %(levelname)s %(message)s" } },
        "handlers": { "file": { "class": "logging.FileHandler", "filename": path("homeserver.log"), "formatter": "plain" } },
        "root": { "level": if info { "INFO" } else { "WARNING" }, "handlers": ["file"] },
        "disable_existing_loggers": false,
    });
    write("log.yaml", log.to_string())?;
    let database = match (db, &config.postgres) {
        (Some(db), Some(url)) => {
            // postgres://user@host:port
            let rest = url
                .trim_end_matches('/')
                .trim_start_matches("postgres://")
                .trim_start_matches("postgresql://");
            let (user, hostport) = rest.split_once('@').unwrap_or(("postgres", rest));
            let (host, port) = hostport.split_once(':').unwrap_or((hostport, "5432"));
            json!({ "name": "psycopg2", "args": {
                "user": user, "host": host, "port": port.parse::<u16>().unwrap_or(5432),
                "database": db, "cp_min": 5, "cp_max": 10 } })
        }
        _ => json!({ "name": "sqlite3", "args": { "database": path("homeserver.db") } }),
    };
    let lifted = json!({ "per_second": 1_000_000, "burst_count": 1_000_000 });
    let mut c = json!({
        "server_name": name,
        "public_baseurl": format!("{client_url}/"),
        "report_stats": false,
        "listeners": [
            { "port": fed_port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": true,
              "x_forwarded": false, "resources": [{ "names": ["federation"], "compress": false }] },
            { "port": client_port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": false,
              "x_forwarded": false, "resources": [{ "names": ["client"], "compress": false }] },
        ],
        "tls_certificate_path": path("cert.pem"),
        "tls_private_key_path": path("key.pem"),
        "database": database,
        "signing_key_path": path("signing.key"),
        "media_store_path": path("media"),
        "pid_file": path("homeserver.pid"),
        "log_config": path("log.yaml"),
        "macaroon_secret_key": hex(&random_bytes::<16>()?),
        "form_secret": hex(&random_bytes::<16>()?),
        "trusted_key_servers": [],
        "suppress_key_server_warning": true,
        "federation_verify_certificates": false,
        "ip_range_blacklist": IP_RANGE_BLACKLIST,
        "ip_range_whitelist": ["127.0.0.0/8"],
        "enable_registration": true,
        "enable_registration_without_verification": true,
        "bcrypt_rounds": 4,
        "presence": { "enabled": config.presence },
        "allow_public_rooms_over_federation": true,
        "rc_federation": {
            "window_size": 1000, "sleep_limit": 1_000_000, "sleep_delay": 0,
            "reject_limit": 1_000_000, "concurrent": 1_000_000,
        },
    });
    for limit in RATE_LIMITS {
        match limit.split_once('.') {
            Some((outer, inner)) => c[outer][inner] = lifted.clone(),
            None => c[*limit] = lifted.clone(),
        }
    }
    write("homeserver.yaml", serde_json::to_string_pretty(&c).map_err(|e| BenchError(e.to_string()))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_unpadded() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg");
        assert_eq!(base64(b"fo"), "Zm8");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff; 32]).len(), 43);
    }

    #[test]
    fn medians_and_pairs() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(parse_pair("seqline:synapse").unwrap(), (Kind::Seqline, Kind::Synapse));
        assert!(parse_pair("seqline").is_err());
        assert!(parse_pair("dendrite:synapse").is_err());
    }
}
