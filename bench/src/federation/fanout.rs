//! The `fanout` mode of `seqline-fed-bench`: what a server sends to the
//! other servers of a large room while its users are active in it.
//!
//! The server under test (each of `--servers`, in rounds that alternate
//! their order, fresh servers with presence on) hosts a room created by one
//! of its `--users-per-server` users, all of whom join; then each of
//! `--fakes` fake federation servers (complement-tests' `FakeServer`) joins
//! `--users-per-server` users: the first by make_join and send_join, the
//! others by their join PDUs in one transaction. Once the server lists every
//! member and its sending has gone quiet, the local users are active for
//! `--window-secs` seconds (see [`Activity`]): a message a second (each read
//! by three other users: read receipts), five users starting to type every
//! four seconds and stopping two seconds later, three users changing
//! presence every ten seconds. Each fake counts the requests it receives,
//! from the window's start until [`DRAIN`] after its end: `/send`
//! transactions, their bytes, their PDUs and their EDUs by type (EDUs, the
//! updates inside them, bytes), per minute, per destination and in total.
//!
//! Bounded fan-out: one transaction carries the PDUs and EDUs queued for a
//! destination; an update reaches each destination once (not once per
//! member there), and bursts (five users typing at once) share transactions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use complement_tests::fake::{FakeServer, Received};
use complement_tests::federation::https_client;
use reqwest::Method;
use serde_json::{Value, json};

use super::pdus::{fake_join, kinds, round_order, send_txn, spread};
use super::{
    Binaries, FedConfig, Kind, Server, create_room, failure, median, start_run, unix_secs, with_server,
};
use crate::{BenchError, Config, Hs, Progress, Report, Res, User, V3, enc, err, join_all, register_all};

/// After the window, how long the fakes still count (what the last
/// activity queued).
const DRAIN: Duration = Duration::from_secs(2);

/// One bucket of the counts.
const MINUTE: Duration = Duration::from_secs(60);

/// The EDU types the tables show in columns (others are counted under their own names).
const EDU_TYPES: [&str; 3] = ["m.typing", "m.receipt", "m.presence"];

/// The local users' activity during the window: what they did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Activity {
    /// Messages sent (one a second, by each user in turn).
    pub messages: usize,
    /// Read receipts posted (three users read each message).
    pub receipts: usize,
    /// Typing notices (`typing: true` and `false`): five users every 4 s, each stopping 2 s later.
    pub typing: usize,
    /// Presence changes: three users every 10 s, `online` and `unavailable` in turn.
    pub presence: usize,
}

/// EDUs of one type: how many, the updates inside them, their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EduCount {
    /// EDUs.
    pub edus: usize,
    /// Updates inside them: a typing EDU 1, a receipt EDU its receipts, a presence EDU its `push` entries.
    pub updates: usize,
    /// Their bytes (as JSON).
    pub bytes: usize,
}

/// What some destinations received over some time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// `/send` transactions.
    pub txns: usize,
    /// Their bodies' bytes.
    pub bytes: usize,
    /// PDUs in them.
    pub pdus: usize,
    /// The PDUs' bytes (as JSON).
    pub pdu_bytes: usize,
    /// EDUs in them, by type.
    pub edus: BTreeMap<String, EduCount>,
    /// Requests other than `/send` (key queries, profile lookups, ...).
    pub other: usize,
}

impl Counts {
    /// Counts `requests` (as one fake received them).
    pub fn of(requests: &[Received]) -> Self {
        let mut c = Self::default();
        for r in requests {
            if !(r.method == "PUT" && r.path.starts_with("/_matrix/federation/v1/send/")) {
                c.other += 1;
                continue;
            }
            c.txns += 1;
            c.bytes += r.bytes;
            for pdu in r.body["pdus"].as_array().into_iter().flatten() {
                c.pdus += 1;
                c.pdu_bytes += pdu.to_string().len();
            }
            for edu in r.body["edus"].as_array().into_iter().flatten() {
                let kind = edu["edu_type"].as_str().unwrap_or("?").to_owned();
                let e = c.edus.entry(kind).or_default();
                e.edus += 1;
                e.updates += edu_updates(edu);
                e.bytes += edu.to_string().len();
            }
        }
        c
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Self) {
        self.txns += other.txns;
        self.bytes += other.bytes;
        self.pdus += other.pdus;
        self.pdu_bytes += other.pdu_bytes;
        self.other += other.other;
        for (kind, e) in &other.edus {
            let mine = self.edus.entry(kind.clone()).or_default();
            mine.edus += e.edus;
            mine.updates += e.updates;
            mine.bytes += e.bytes;
        }
    }

    fn edu(&self, kind: &str) -> EduCount {
        self.edus.get(kind).copied().unwrap_or_default()
    }

    /// The counts as JSON.
    pub fn to_json(&self) -> Value {
        let edus: serde_json::Map<String, Value> = self
            .edus
            .iter()
            .map(|(k, e)| (k.clone(), json!({ "edus": e.edus, "updates": e.updates, "bytes": e.bytes })))
            .collect();
        json!({
            "txns": self.txns, "bytes": self.bytes, "pdus": self.pdus, "pdu_bytes": self.pdu_bytes,
            "edus": edus, "other_requests": self.other,
        })
    }
}

/// The updates one EDU carries: a receipt EDU's receipts (rooms × types ×
/// users), a presence EDU's `push` entries, 1 for any other.
fn edu_updates(edu: &Value) -> usize {
    let content = &edu["content"];
    match edu["edu_type"].as_str() {
        Some("m.receipt") => content
            .as_object()
            .into_iter()
            .flat_map(|rooms| rooms.values())
            .filter_map(Value::as_object)
            .flat_map(|types| types.values())
            .filter_map(Value::as_object)
            .map(serde_json::Map::len)
            .sum(),
        Some("m.presence") => content["push"].as_array().map_or(0, Vec::len),
        _ => 1,
    }
}

/// One server under test, one round.
#[derive(Debug, Clone, Default)]
pub struct FanoutResult {
    /// `seqline` or `Synapse`.
    pub server: String,
    /// 1-based.
    pub round: usize,
    /// Joined members when the window started.
    pub members: usize,
    /// The fakes' names.
    pub destinations: Vec<String>,
    /// The window's length, s (its activity), without the drain.
    pub window_s: f64,
    /// What the local users did.
    pub activity: Activity,
    /// Each fake's counts over the whole window, in `destinations`' order.
    pub per_destination: Vec<Counts>,
    /// Per minute of the window (the last one may be shorter, and holds
    /// the drain), each fake's counts.
    pub per_minute: Vec<Vec<Counts>>,
    /// The phases before the window, s.
    pub phases: Vec<(String, f64)>,
    /// Why the round stopped, if it did.
    pub error: Option<String>,
}

impl FanoutResult {
    /// Every destination's counts summed.
    pub fn total(&self) -> Counts {
        let mut t = Counts::default();
        self.per_destination.iter().for_each(|c| t.add(c));
        t
    }

    fn minutes(&self) -> f64 {
        self.window_s / 60.0
    }

    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        let a = &self.activity;
        json!({
            "server": self.server, "round": self.round, "members": self.members,
            "destinations": self.destinations, "window_s": self.window_s, "drain_s": DRAIN.as_secs_f64(),
            "activity": { "messages": a.messages, "receipts": a.receipts, "typing": a.typing, "presence": a.presence },
            "total": self.total().to_json(),
            "per_destination": self.per_destination.iter().map(Counts::to_json).collect::<Vec<_>>(),
            "per_minute": self.per_minute.iter().map(|m| {
                let mut t = Counts::default();
                m.iter().for_each(|c| t.add(c));
                json!({ "total": t.to_json(), "per_destination": m.iter().map(Counts::to_json).collect::<Vec<_>>() })
            }).collect::<Vec<_>>(),
            "phases_s": self.phases.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "error": self.error,
        })
    }
}

/// Every round's results as JSON.
pub fn to_json(config: &FedConfig, results: &[FanoutResult]) -> Value {
    json!({
        "mode": "fanout",
        "fakes": config.fakes,
        "users_per_server": config.users_per_server,
        "window_s": config.window_secs,
        "rounds": config.rounds,
        "backend": config.backend().to_lowercase(),
        "results": results.iter().map(FanoutResult::to_json).collect::<Vec<_>>(),
    })
}

/// Runs `--rounds` rounds over `--servers`.
pub async fn run(config: &FedConfig) -> Res<Vec<FanoutResult>> {
    let kinds = kinds(config)?;
    if config.fakes == 0 || config.users_per_server < 2 || config.window_secs == 0 || config.rounds == 0 {
        return err("need --fakes >= 1, --users-per-server >= 2, --window-secs >= 1 and --rounds >= 1");
    }
    if let Some(v) = &config.room_version
        && !matches!(v.as_str(), "11" | "12")
    {
        return err("the fake servers make events for room versions 11 and 12 only");
    }
    let mut config = config.clone();
    config.presence = true;
    let config = &config;
    let (progress, out) = start_run(config)?;
    let pairs: Vec<(Kind, Kind)> = kinds.iter().map(|&k| (k, k)).collect();
    let bins = Binaries::find(config, &pairs).await?;
    let mut results = Vec::new();
    for round in 1..=config.rounds {
        for kind in round_order(&kinds, round) {
            progress.say(&format!("round {round}: fan-out from {}", kind.as_str()));
            let dir = out.join(format!("fanout-{round}-{}", kind.as_str().to_lowercase()));
            let mut result =
                FanoutResult { server: kind.as_str().to_owned(), round, ..FanoutResult::default() };
            let db = format!("fedfan_{round}_{}_{}", kind.as_str().to_lowercase(), std::process::id());
            let outcome = with_server(config, &bins, (kind, &dir, &db), async |server| {
                fanout_on(config, &progress, server, &mut result).await
            })
            .await;
            result.error = failure(&progress, outcome);
            results.push(result);
        }
    }
    Ok(results)
}

/// One round on a fresh server: the room, the fakes' users joining, the window.
async fn fanout_on(
    config: &FedConfig,
    progress: &Progress,
    server: &Server,
    result: &mut FanoutResult,
) -> Res<()> {
    let hs = &server.hs;
    let mut bc = Config::for_url(&server.client_url);
    bc.concurrency = config.concurrency;
    bc.progress = false;
    let run = format!("o{}", unix_secs() % 100_000_000);
    let n = config.users_per_server;
    let t = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("{run}_u{i}")).collect();
    let users = register_all(hs, &bc, names, &mut Report::default(), "register").await?;
    let Some(creator) = users.first() else { return err("no users") };
    let body = json!({ "preset": "public_chat", "name": "seqline-fed-bench fan-out" });
    let room = create_room(config, hs, creator, body).await?;
    join_all(hs, &bc, &room, &users[1..], &mut Report::default()).await?;
    result.phases.push((format!("{n} local users in the room"), t.elapsed().as_secs_f64()));
    progress.say(&format!("  room {room} with {n} local users; {} fakes join {n} users each", config.fakes));

    let t = Instant::now();
    let https = https_client();
    let mut fakes = Vec::with_capacity(config.fakes);
    for f in 0..config.fakes {
        let fake = FakeServer::start().await;
        let joiners: Vec<String> = (0..n).map(|i| fake.user_id(&format!("f{f}u{i}"))).collect();
        let mut fake_room = fake_join(&fake, &https, &server.name, &room, &joiners[0]).await?;
        let joins: Vec<Value> = joiners[1..]
            .iter()
            .map(|u| fake.add(&mut fake_room, "m.room.member", Some(u), u, json!({ "membership": "join" })).1)
            .collect();
        if !joins.is_empty()
            && send_txn(&fake, &https, &server.name, &format!("{run}-joins"), &joins).await? > 0
        {
            return err(format!("the server refused joins of {}", fake.name));
        }
        fakes.push(fake);
        // Each fake's users in before the next fake joins: a server that
        // queues a room's incoming PDUs (Synapse) is not given more than
        // one transaction's worth at a time.
        let wait = Duration::from_secs(config.timeout_secs);
        result.members = wait_members(hs, creator, &room, n * (f + 2), wait).await?;
    }
    let expected = n * (config.fakes + 1);
    result
        .phases
        .push((format!("{} fakes joined, {expected} members", config.fakes), t.elapsed().as_secs_f64()));
    result.destinations = fakes.iter().map(|f| f.name.clone()).collect();
    let t = Instant::now();
    let quiet = quiet(&fakes, Duration::from_secs(3), Duration::from_secs(90)).await;
    result.phases.push(("quiet".to_owned(), t.elapsed().as_secs_f64()));
    progress.say(&format!(
        "  {} members ({:.1} s); the fakes {}; {} s of activity",
        result.members,
        result.phases.iter().map(|(_, s)| s).sum::<f64>(),
        if quiet { "have heard nothing for 3 s" } else { "still hear from the server after 90 s" },
        config.window_secs
    ));

    let window = Duration::from_secs(config.window_secs);
    let start = Instant::now();
    let end = start + window;
    let mut marks: Vec<Vec<usize>> = vec![fakes.iter().map(|f| f.requests().len()).collect()];
    let users = Arc::new(users);
    let room = Arc::new(room);
    let sending = tokio::spawn(messages(hs.clone(), users.clone(), room.clone(), run.clone(), end));
    let typers = tokio::spawn(typing(hs.clone(), users.clone(), room.clone(), end));
    let present = tokio::spawn(presence(hs.clone(), users.clone(), end));
    let mut k = 1;
    loop {
        let at = (start + MINUTE * k).min(end);
        let last = at >= end;
        tokio::time::sleep_until((if last { end + DRAIN } else { at }).into()).await;
        marks.push(fakes.iter().map(|f| f.requests().len()).collect());
        if last {
            break;
        }
        k += 1;
    }
    result.window_s = start.elapsed().saturating_sub(DRAIN).as_secs_f64();
    let joined = |e: tokio::task::JoinError| BenchError(format!("activity task: {e}"));
    let (messages, receipts) = sending.await.map_err(joined)??;
    let typing = typers.await.map_err(joined)??;
    let presence = present.await.map_err(joined)??;
    let activity = Activity { messages, receipts, typing, presence };
    result.activity = activity;
    let requests: Vec<Vec<Received>> = fakes.iter().map(FakeServer::requests).collect();
    let (first, last) = (&marks[0], &marks[marks.len() - 1]);
    result.per_destination =
        requests.iter().enumerate().map(|(f, r)| Counts::of(&r[first[f]..last[f]])).collect();
    result.per_minute = marks
        .windows(2)
        .map(|m| requests.iter().enumerate().map(|(f, r)| Counts::of(&r[m[0][f]..m[1][f]])).collect())
        .collect();
    let t = result.total();
    progress.say(&format!(
        "  {} messages, {} receipts, {} typing notices, {} presence changes: {} transactions, {} PDUs, {} EDUs, {} bytes to {} fakes",
        activity.messages,
        activity.receipts,
        activity.typing,
        activity.presence,
        t.txns,
        t.pdus,
        t.edus.values().map(|e| e.edus).sum::<usize>(),
        t.bytes,
        fakes.len()
    ));
    Ok(())
}

/// Polls `/joined_members` every 200 ms until it lists `expected`; answers the count.
async fn wait_members(hs: &Hs, user: &User, room: &str, expected: usize, wait: Duration) -> Res<usize> {
    let path = format!("{V3}/rooms/{}/joined_members", enc(room));
    let t = Instant::now();
    let mut last = 0;
    while t.elapsed() < wait {
        let (v, _) = hs.ok("joined_members", Method::GET, &path, Some(&user.token), None).await?;
        last = v["joined"].as_object().map_or(0, serde_json::Map::len);
        if last >= expected {
            return Ok(last);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    err(format!("the room has {last} of {expected} members after {wait:?}"))
}

/// Waits until no fake has received anything for `quiet` (answers true), or `limit` passed (false).
async fn quiet(fakes: &[FakeServer], quiet: Duration, limit: Duration) -> bool {
    let t = Instant::now();
    let count = || fakes.iter().map(|f| f.requests().len()).sum::<usize>();
    let (mut seen, mut since) = (count(), Instant::now());
    while t.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = count();
        if now != seen {
            (seen, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            return true;
        }
    }
    false
}

/// A message a second until `end`, by each user in turn; each read by the
/// next three users. Answers (messages, receipts).
async fn messages(
    hs: Hs,
    users: Arc<Vec<User>>,
    room: Arc<String>,
    run: String,
    end: Instant,
) -> Res<(usize, usize)> {
    let (mut sent, mut receipts) = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= end {
            return Ok((sent, receipts));
        }
        let sender = &users[sent % users.len()];
        let id =
            hs.send(sender, &room, &format!("{run}-m{sent}"), &format!("fan-out message {sent}")).await?;
        sent += 1;
        for r in 1..=3.min(users.len() - 1) {
            let reader = &users[(sent + r) % users.len()];
            let path = format!("{V3}/rooms/{}/receipt/m.read/{}", enc(&room), enc(&id));
            hs.ok("receipt", Method::POST, &path, Some(&reader.token), Some(&json!({}))).await?;
            receipts += 1;
        }
    }
}

/// Every 4 s five users (the next five in turn) start typing, and stop 2 s
/// later; answers the typing notices sent (starts and stops).
async fn typing(hs: Hs, users: Arc<Vec<User>>, room: Arc<String>, end: Instant) -> Res<usize> {
    let mut notices = 0;
    let mut next = 0;
    let typers = 5.min(users.len());
    let mut tick = tokio::time::interval(Duration::from_secs(4));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= end {
            return Ok(notices);
        }
        let group: Vec<&User> = (0..typers).map(|i| &users[(next + i) % users.len()]).collect();
        next += typers;
        for on in [true, false] {
            for user in &group {
                let path = format!("{V3}/rooms/{}/typing/{}", enc(&room), enc(&user.user_id));
                let body = if on {
                    json!({ "typing": true, "timeout": 10_000 })
                } else {
                    json!({ "typing": false })
                };
                hs.ok("typing", Method::PUT, &path, Some(&user.token), Some(&body)).await?;
                notices += 1;
            }
            if on {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Every 10 s three users (the next three in turn) set their presence,
/// `online` and `unavailable` in turn; answers the changes made.
async fn presence(hs: Hs, users: Arc<Vec<User>>, end: Instant) -> Res<usize> {
    let mut changes = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for turn in 0.. {
        tick.tick().await;
        if Instant::now() >= end {
            break;
        }
        for i in 0..3.min(users.len()) {
            let k = turn * 3 + i;
            let user = &users[k % users.len()];
            // Each user's own sequence: online, unavailable, online, ...
            let state = if (k / users.len()).is_multiple_of(2) { "online" } else { "unavailable" };
            let path = format!("{V3}/presence/{}/status", enc(&user.user_id));
            let body = json!({ "presence": state, "status_msg": format!("fan-out {turn}") });
            hs.ok("presence", Method::PUT, &path, Some(&user.token), Some(&body)).await?;
            changes += 1;
        }
    }
    Ok(changes)
}

/// The rounds as tables: per destination over the window (median [min–max]
/// over the fakes, per minute), and per minute over all of them.
pub fn table(config: &FedConfig, results: &[FanoutResult]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== fan-out: a room of {} members on {} servers: the server under test with {}, {} fakes with {} each; {} s of activity ({backend})",
        config.users_per_server * (config.fakes + 1),
        config.fakes + 1,
        config.users_per_server,
        config.fakes,
        config.users_per_server,
        config.window_secs,
        backend = config.backend()
    );
    let _ = writeln!(
        out,
        "   activity: 1 message/s (3 read receipts each), 5 users typing every 4 s (start, stop 2 s later), 3 presence changes every 10 s;"
    );
    let _ = writeln!(
        out,
        "   counted at each fake until {} s after the window; per destination per minute: median [min–max] over the fakes; EDUs (updates inside)",
        DRAIN.as_secs()
    );
    let _ = writeln!(
        out,
        "{:<8} {:>5} {:>5} {:>20} {:>18} {:>10} {:>14} {:>14} {:>14} {:>6} {:>10} {:>10}",
        "server",
        "round",
        "dests",
        "txns/dest/min",
        "KiB/dest/min",
        "PDUs/dest",
        "m.typing/dest",
        "m.receipt/dest",
        "m.presence/dest",
        "other",
        "txns all",
        "KiB all"
    );
    for r in results.iter().filter(|r| !r.per_destination.is_empty()) {
        let per_min = |f: &dyn Fn(&Counts) -> f64| -> Vec<f64> {
            r.per_destination.iter().map(|c| f(c) / r.minutes()).collect()
        };
        let med = |f: &dyn Fn(&Counts) -> f64| median(&r.per_destination.iter().map(f).collect::<Vec<_>>());
        let edu = |kind: &'static str| {
            let e = med(&|c| c.edu(kind).edus as f64);
            let u = med(&|c| c.edu(kind).updates as f64);
            format!("{e:.0} ({u:.0})")
        };
        let t = r.total();
        let _ = writeln!(
            out,
            "{:<8} {:>5} {:>5} {:>20} {:>18} {:>10.0} {:>14} {:>14} {:>14} {:>6.0} {:>10} {:>10.0}",
            r.server,
            r.round,
            r.per_destination.len(),
            spread(&per_min(&|c| c.txns as f64), 1),
            spread(&per_min(&|c| c.bytes as f64 / 1024.0), 1),
            med(&|c| c.pdus as f64),
            edu(EDU_TYPES[0]),
            edu(EDU_TYPES[1]),
            edu(EDU_TYPES[2]),
            med(&|c| c.other as f64),
            t.txns,
            t.bytes as f64 / 1024.0
        );
    }
    let _ = writeln!(
        out,
        "per destination, per action of the local users (1.00 = each reached each destination once):"
    );
    for r in results.iter().filter(|r| !r.per_destination.is_empty()) {
        let a = &r.activity;
        let t = r.total();
        let dests = r.per_destination.len() as f64;
        let ratio = |got: usize, did: usize| {
            if did == 0 { "-".to_owned() } else { format!("{:.2}", got as f64 / dests / did as f64) }
        };
        let _ = writeln!(
            out,
            "  {} round {}: {} messages -> PDUs x{}; {} typing notices -> m.typing EDUs x{}; {} receipts -> receipt updates x{} in m.receipt EDUs x{}; {} presence changes -> presence updates x{} in m.presence EDUs x{}; transactions per action x{}",
            r.server,
            r.round,
            a.messages,
            ratio(t.pdus, a.messages),
            a.typing,
            ratio(t.edu("m.typing").edus, a.typing),
            a.receipts,
            ratio(t.edu("m.receipt").updates, a.receipts),
            ratio(t.edu("m.receipt").edus, a.receipts),
            a.presence,
            ratio(t.edu("m.presence").updates, a.presence),
            ratio(t.edu("m.presence").edus, a.presence),
            ratio(t.txns, a.messages + a.typing + a.receipts + a.presence)
        );
    }
    let _ = writeln!(
        out,
        "per minute, all destinations together: transactions (per destination max), PDUs, EDUs (updates), KiB"
    );
    let _ = writeln!(
        out,
        "{:<8} {:>5} {:>6} {:>14} {:>8} {:>14} {:>14} {:>14} {:>10}",
        "server", "round", "minute", "txns (max)", "PDUs", "m.typing", "m.receipt", "m.presence", "KiB"
    );
    for r in results {
        for (m, dests) in r.per_minute.iter().enumerate() {
            let mut t = Counts::default();
            dests.iter().for_each(|c| t.add(c));
            let max = dests.iter().map(|c| c.txns).max().unwrap_or(0);
            let edu = |kind: &str| format!("{} ({})", t.edu(kind).edus, t.edu(kind).updates);
            let _ = writeln!(
                out,
                "{:<8} {:>5} {:>6} {:>14} {:>8} {:>14} {:>14} {:>14} {:>10.1}",
                r.server,
                r.round,
                m + 1,
                format!("{} ({max})", t.txns),
                t.pdus,
                edu(EDU_TYPES[0]),
                edu(EDU_TYPES[1]),
                edu(EDU_TYPES[2]),
                t.bytes as f64 / 1024.0
            );
        }
    }
    for r in results {
        let phases: Vec<String> = r.phases.iter().map(|(k, v)| format!("{k} {v:.1} s")).collect();
        let _ = writeln!(out, "{} round {}: {}", r.server, r.round, phases.join(", "));
        if let Some(e) = &r.error {
            let _ = writeln!(out, "  FAILED: {e}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(body: Value) -> Received {
        let bytes = body.to_string().len();
        Received {
            method: "PUT".to_owned(),
            path: "/_matrix/federation/v1/send/1".to_owned(),
            query: String::new(),
            origin: None,
            body,
            bytes,
        }
    }

    #[test]
    fn transactions_are_counted_by_pdus_and_edu_types() {
        let receipt = json!({ "edu_type": "m.receipt", "content": { "!r": { "m.read": {
            "@a:x": { "event_ids": ["$1"], "data": {} }, "@b:x": { "event_ids": ["$1"], "data": {} } } } } });
        let presence = json!({ "edu_type": "m.presence", "content": { "push": [{ "user_id": "@a:x" }] } });
        let typing = json!({ "edu_type": "m.typing", "content": { "room_id": "!r", "user_id": "@a:x", "typing": true } });
        let requests = vec![
            txn(json!({ "pdus": [{ "type": "m.room.message" }], "edus": [receipt, typing.clone()] })),
            txn(json!({ "pdus": [], "edus": [presence, typing] })),
            Received {
                method: "GET".to_owned(),
                path: "/_matrix/key/v2/server".to_owned(),
                ..txn(Value::Null)
            },
        ];
        let c = Counts::of(&requests);
        assert_eq!((c.txns, c.pdus, c.other), (2, 1, 1));
        assert_eq!((c.edu("m.typing").edus, c.edu("m.typing").updates), (2, 2));
        assert_eq!((c.edu("m.receipt").edus, c.edu("m.receipt").updates), (1, 2));
        assert_eq!((c.edu("m.presence").edus, c.edu("m.presence").updates), (1, 1));
        assert_eq!(c.bytes, requests[0].bytes + requests[1].bytes);
        let mut twice = c.clone();
        twice.add(&c);
        assert_eq!((twice.txns, twice.edu("m.typing").edus), (4, 4));
    }
}
