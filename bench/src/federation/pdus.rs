//! The PDU modes of `seqline-fed-bench`: a fake federation server
//! (complement-tests' `FakeServer`) on one side, a fresh seqline or Synapse
//! (the receiver) on the other, in rounds that alternate the receivers'
//! order.
//!
//! - `inbound`: the receiver hosts a room of `--members` local members
//!   (created through the client API, `history_visibility: shared`); a user
//!   of the fake joins it over federation (make_join, send_join), then the
//!   fake sends `--pdus` message PDUs in transactions of `--txn-size`, one
//!   transaction in flight at a time, as a sender does per destination.
//!   Shapes: `linear` (each PDU's prev event is the previous PDU) and
//!   `forked` (`--branches` fake users, each on its own branch, one PDU of
//!   them every `--merge-every` naming every branch's tip; the last PDU is
//!   such a merge). Timed from the first transaction sent to the last one
//!   answered, and to the moment the room creator's `/sync` long-poll has
//!   the last PDU; then the fake's messages are counted in the creator's
//!   `/messages` (a PDU refused quickly is not a figure).
//! - `backfill`: the fake hosts a room of `--history` events (its creation
//!   and 4 state events, then messages of its creator); a user of the
//!   receiver joins it, and pages `/messages?dir=b&limit=--page-size` from
//!   its `/sync` token until `m.room.create`, each page timed. The fake
//!   answers `/backfill`, `/event`, `/state_ids`, `/state` and
//!   `/get_missing_events` from its room.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use complement_tests::fake::{FakeRoom, FakeServer, Received};
use complement_tests::federation::{https_client, now_ms, x_matrix};
use reqwest::Method;
use serde_json::{Value, json};

use super::{Binaries, FedConfig, Kind, SYNC_FILTER, Server, median, unix_secs};
use crate::{BenchError, Config, Progress, Report, Res, User, V3, enc, err, join_all, ms, register_all};

/// One receiver, one round, one shape of `inbound`.
#[derive(Debug, Clone, Default)]
pub struct InboundResult {
    /// `seqline` or `Synapse`.
    pub server: String,
    /// 1-based.
    pub round: usize,
    /// `linear` or `forked`.
    pub shape: String,
    /// PDUs sent.
    pub pdus: usize,
    /// Transactions sent.
    pub txns: usize,
    /// PDUs the receiver's answers refused (per-PDU errors).
    pub refused: usize,
    /// The fake's messages in the creator's `/messages` afterwards.
    pub accepted: usize,
    /// First transaction sent until the last one answered, ms.
    pub answered_ms: f64,
    /// First transaction sent until the last PDU is in the creator's /sync, ms.
    pub synced_ms: f64,
    /// Each transaction's round trip, ms.
    pub txn_ms: Vec<f64>,
    /// Why it stopped, if it did.
    pub error: Option<String>,
}

impl InboundResult {
    /// PDUs per second until the last transaction was answered.
    pub fn answered_rate(&self) -> f64 {
        self.pdus as f64 / (self.answered_ms / 1000.0)
    }

    /// PDUs per second until the last PDU was in /sync.
    pub fn synced_rate(&self) -> f64 {
        self.pdus as f64 / (self.synced_ms / 1000.0)
    }

    fn ok(&self) -> bool {
        self.error.is_none() && self.answered_ms > 0.0
    }

    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "server": self.server, "round": self.round, "shape": self.shape,
            "pdus": self.pdus, "txns": self.txns, "refused": self.refused, "accepted": self.accepted,
            "answered_ms": self.answered_ms, "synced_ms": self.synced_ms,
            "answered_pdus_per_s": self.answered_rate(), "synced_pdus_per_s": self.synced_rate(),
            "txn_ms": self.txn_ms, "error": self.error,
        })
    }
}

/// One receiver, one round of `backfill`.
#[derive(Debug, Clone, Default)]
pub struct BackfillResult {
    /// `seqline` or `Synapse`.
    pub server: String,
    /// 1-based.
    pub round: usize,
    /// Events of the fake's room.
    pub history: usize,
    /// The join's `POST /join` until its 200, ms.
    pub join_ms: f64,
    /// Events in the pages (the join included).
    pub events: usize,
    /// Whether the last page held `m.room.create`.
    pub reached_create: bool,
    /// Each page's time, ms.
    pub page_ms: Vec<f64>,
    /// The first page until the page with `m.room.create`, ms.
    pub total_ms: f64,
    /// `/backfill` requests the fake answered during the paging.
    pub backfills: usize,
    /// Other federation requests it answered during the paging (`/event`,
    /// `/state_ids`, `/state`, `/get_missing_events`).
    pub other_requests: usize,
    /// Why it stopped, if it did.
    pub error: Option<String>,
}

impl BackfillResult {
    fn ok(&self) -> bool {
        self.error.is_none() && self.reached_create
    }

    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "server": self.server, "round": self.round, "history": self.history,
            "join_ms": self.join_ms, "events": self.events, "reached_create": self.reached_create,
            "pages": self.page_ms.len(), "page_ms": self.page_ms, "total_ms": self.total_ms,
            "backfill_requests": self.backfills, "other_requests": self.other_requests, "error": self.error,
        })
    }
}

/// What the PDU modes measured.
#[derive(Debug, Clone, Default)]
pub struct PduResults {
    /// `inbound`, per receiver, round and shape.
    pub inbound: Vec<InboundResult>,
    /// `backfill`, per receiver and round.
    pub backfill: Vec<BackfillResult>,
}

impl PduResults {
    /// Whether any run failed.
    pub fn failed(&self) -> bool {
        self.inbound.iter().any(|r| r.error.is_some()) || self.backfill.iter().any(|r| r.error.is_some())
    }

    /// The results as JSON.
    pub fn to_json(&self, config: &FedConfig) -> Value {
        json!({
            "members": config.members, "pdus": config.pdus, "txn_size": config.txn_size,
            "branches": config.branches, "merge_every": config.merge_every,
            "history": config.history, "page_size": config.page_size, "rounds": config.rounds,
            "backend": if config.postgres.is_some() { "postgres" } else { "sqlite" },
            "inbound": self.inbound.iter().map(InboundResult::to_json).collect::<Vec<_>>(),
            "backfill": self.backfill.iter().map(BackfillResult::to_json).collect::<Vec<_>>(),
        })
    }
}

pub(super) fn kinds(config: &FedConfig) -> Res<Vec<Kind>> {
    let kinds: Vec<Kind> = config.servers.iter().map(|s| Kind::parse(s)).collect::<Res<_>>()?;
    if kinds.is_empty() {
        return err("--servers names no server");
    }
    Ok(kinds)
}

/// Runs the PDU modes `config.mode` names (`inbound`, `backfill`).
pub async fn run(config: &FedConfig) -> Res<PduResults> {
    let kinds = kinds(config)?;
    let inbound = config.mode.iter().any(|m| m == "inbound");
    let backfill = config.mode.iter().any(|m| m == "backfill");
    for shape in &config.shapes {
        if !matches!(shape.as_str(), "linear" | "forked") {
            return err(format!("unknown shape {shape:?} (linear or forked)"));
        }
    }
    if !matches!(config.pace.as_str(), "sync" | "answer") {
        return err(format!("unknown --pace {:?} (sync or answer)", config.pace));
    }
    if config.rounds == 0 || config.txn_size == 0 || config.txn_size > 50 || config.pdus == 0 {
        return err("need --rounds >= 1, --txn-size in 1..=50 and --pdus >= 1");
    }
    if config.branches < 2 || config.merge_every < 2 || config.history < 6 || config.page_size == 0 {
        return err("need --branches >= 2, --merge-every >= 2, --history >= 6 and --page-size >= 1");
    }
    if let Some(v) = &config.room_version
        && !matches!(v.as_str(), "11" | "12")
    {
        return err("the fake server makes events for room versions 11 and 12 only");
    }
    let (progress, out) = super::start_run(config)?;
    let pairs: Vec<(Kind, Kind)> = kinds.iter().map(|&k| (k, k)).collect();
    let bins = Binaries::find(config, &pairs).await?;
    let mut results = PduResults::default();
    for round in 1..=config.rounds {
        for kind in round_order(&kinds, round) {
            let label = kind.as_str().to_lowercase();
            if inbound {
                progress.say(&format!("round {round}: inbound into {}", kind.as_str()));
                let dir = out.join(format!("inbound-{round}-{label}"));
                results.inbound.extend(inbound_round(config, &bins, &progress, &dir, kind, round).await);
            }
            if backfill {
                progress.say(&format!("round {round}: backfill by {}", kind.as_str()));
                let dir = out.join(format!("backfill-{round}-{label}"));
                let mut result =
                    BackfillResult { server: kind.as_str().to_owned(), round, ..BackfillResult::default() };
                let db = format!("fedpdus_bf_{round}_{label}_{}", std::process::id());
                let outcome = super::with_server(config, &bins, (kind, &dir, &db), async |server| {
                    backfill_on(config, &progress, server, &mut result).await
                })
                .await;
                result.error = super::failure(&progress, outcome);
                results.backfill.push(result);
            }
        }
    }
    Ok(results)
}

/// The servers of round `round` (1-based): `kinds`, reversed in even rounds.
pub(super) fn round_order(kinds: &[Kind], round: usize) -> Vec<Kind> {
    let mut order = kinds.to_vec();
    if round.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// A signed federation request from `fake` to the listener of `target`.
pub(super) async fn fed(
    fake: &FakeServer,
    https: &reqwest::Client,
    target: &str,
    method: Method,
    uri: &str,
    body: Option<&Value>,
) -> Res<(u16, Value)> {
    let auth = x_matrix(&fake.name, target, &fake.key, method.as_str(), uri, body);
    let mut req = https.request(method, format!("https://{target}{uri}")).header("Authorization", auth);
    if let Some(body) = body {
        req = req.json(body);
    }
    let response = req.send().await.map_err(|e| BenchError(format!("{uri}: {e}")))?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.map_err(|e| BenchError(format!("{uri}: body: {e}")))?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// `user` of the fake joins `room_id` on `target` (make_join, send_join v2);
/// answers the room as the fake now sees it (the join its newest event).
pub(super) async fn fake_join(
    fake: &FakeServer,
    https: &reqwest::Client,
    target: &str,
    room_id: &str,
    user: &str,
) -> Res<FakeRoom> {
    let uri = format!("/_matrix/federation/v1/make_join/{}/{}?ver=11&ver=12", enc(room_id), enc(user));
    let (status, template) = fed(fake, https, target, Method::GET, &uri, None).await?;
    if status != 200 {
        return err(format!("make_join: {status} {template}"));
    }
    let version = template["room_version"].as_str().unwrap_or("1").to_owned();
    if !matches!(version.as_str(), "11" | "12") {
        return err(format!("the room is of version {version}; the fake makes events for 11 and 12 only"));
    }
    let mut join = template["event"].clone();
    join["origin_server_ts"] = json!(now_ms());
    let join_id = fake.sign(&mut join);
    let uri = format!("/_matrix/federation/v2/send_join/{}/{}", enc(room_id), enc(&join_id));
    let (status, answer) = fed(fake, https, target, Method::PUT, &uri, Some(&join)).await?;
    if status != 200 {
        return err(format!("send_join: {status} {answer}"));
    }
    let state = answer["state"].as_array().map_or(&[][..], Vec::as_slice);
    Ok(FakeRoom::joined(&version, room_id, state, join))
}

/// Sends `pdus` in one transaction; answers how many the receiver refused.
pub(super) async fn send_txn(
    fake: &FakeServer,
    https: &reqwest::Client,
    target: &str,
    txn: &str,
    pdus: &[Value],
) -> Res<usize> {
    let body = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": pdus });
    let uri = format!("/_matrix/federation/v1/send/{txn}");
    let (status, answer) = fed(fake, https, target, Method::PUT, &uri, Some(&body)).await?;
    if status != 200 {
        return err(format!("transaction {txn}: {status} {answer}"));
    }
    let refused =
        answer["pdus"].as_object().map_or(0, |m| m.values().filter(|r| r.get("error").is_some()).count());
    Ok(refused)
}

/// The PDUs of one shape on top of `room` (whose newest event is `tip`):
/// messages of `senders[0]` (linear) or of every sender on its own branch,
/// merged every `merge_every` PDUs and at the end (forked).
fn build_pdus(
    config: &FedConfig,
    fake: &FakeServer,
    room: &mut FakeRoom,
    senders: &[String],
    shape: &str,
    tip: (String, i64),
) -> Vec<Value> {
    let branches = if shape == "linear" { 1 } else { senders.len() };
    let mut tips = vec![tip; branches];
    let mut out = Vec::with_capacity(config.pdus);
    for i in 0..config.pdus {
        let merge = branches > 1 && ((i + 1) % config.merge_every == 0 || i + 1 == config.pdus);
        let branch = i % branches;
        let prevs: Vec<(String, i64)> = if merge {
            let mut seen = HashSet::new();
            tips.iter().filter(|(id, _)| seen.insert(id.clone())).cloned().collect()
        } else {
            vec![tips[branch].clone()]
        };
        let sender = &senders[branch];
        let content = json!({ "msgtype": "m.text", "body": format!("{shape} pdu {i}") });
        let mut event = room.draft("m.room.message", None, sender, content);
        let depth = prevs.iter().map(|(_, d)| *d).max().unwrap_or(0) + 1;
        event["prev_events"] = json!(prevs.iter().map(|(id, _)| id).collect::<Vec<_>>());
        event["depth"] = json!(depth);
        let id = fake.sign(&mut event);
        if merge {
            tips.iter_mut().for_each(|t| *t = (id.clone(), depth));
        } else {
            tips[branch] = (id, depth);
        }
        room.push(event.clone());
        out.push(event);
    }
    out
}

/// Long-polls `user`'s /sync from `since` until the room's timeline holds
/// `event_id`; answers when it did and the next `since`.
async fn wait_event(
    hs: crate::Hs,
    user: User,
    room: String,
    event_id: String,
    mut since: String,
) -> Res<(Instant, String)> {
    loop {
        let (v, _) = hs.sync(&user, Some(SYNC_FILTER), Some(&since), Some(10_000)).await?;
        let at = Instant::now();
        let found = v["rooms"]["join"][&room]["timeline"]["events"]
            .as_array()
            .is_some_and(|evs| evs.iter().any(|e| e["event_id"].as_str() == Some(event_id.as_str())));
        if let Some(next) = v["next_batch"].as_str() {
            next.clone_into(&mut since);
        }
        if found {
            return Ok((at, since));
        }
    }
}

/// Counts the events of `room` in `user`'s `/messages` (back from `from`)
/// that `keep` keeps.
async fn count_messages(
    hs: &crate::Hs,
    user: &User,
    room: &str,
    from: &str,
    keep: impl Fn(&Value) -> bool,
) -> Res<usize> {
    let mut count = 0;
    let mut from = from.to_owned();
    loop {
        let path = format!("{V3}/rooms/{}/messages?dir=b&limit=1000&from={}", enc(room), enc(&from));
        let (v, _) = hs.ok("messages", Method::GET, &path, Some(&user.token), None).await?;
        let chunk = v["chunk"].as_array().map_or(&[][..], Vec::as_slice);
        count += chunk.iter().filter(|e| keep(e)).count();
        match v["end"].as_str() {
            Some(e) if !chunk.is_empty() && e != from => e.clone_into(&mut from),
            _ => return Ok(count),
        }
    }
}

/// One receiver's inbound figures for every shape (fresh server, one room per shape).
async fn inbound_round(
    config: &FedConfig,
    bins: &Binaries,
    progress: &Progress,
    dir: &Path,
    kind: Kind,
    round: usize,
) -> Vec<InboundResult> {
    let blank = |shape: &str| InboundResult {
        server: kind.as_str().to_owned(),
        round,
        shape: shape.to_owned(),
        ..InboundResult::default()
    };
    let db = format!("fedpdus_in_{round}_{}_{}", kind.as_str().to_lowercase(), std::process::id());
    let mut server = match Server::start(config, bins, kind, dir, &db).await {
        Ok(s) => s,
        Err(e) => {
            return config
                .shapes
                .iter()
                .map(|s| InboundResult { error: Some(e.0.clone()), ..blank(s) })
                .collect();
        }
    };
    let mut results: Vec<InboundResult> = config.shapes.iter().map(|s| blank(s)).collect();
    let outcome = async {
        let mut bc = Config::for_url(&server.client_url);
        bc.concurrency = config.concurrency;
        bc.progress = false;
        let run = format!("i{}", unix_secs() % 100_000_000);
        let names: Vec<String> = std::iter::once(format!("{run}_creator"))
            .chain((1..config.members).map(|i| format!("{run}_m{i}")))
            .collect();
        progress.say(&format!("  registering {} users on {}", names.len(), server.name));
        let mut users = register_all(&server.hs, &bc, names, &mut Report::default(), "register").await?;
        let members = users.split_off(1);
        let Some(creator) = users.pop() else { return err("no creator") };
        let fake = FakeServer::start().await;
        let https = https_client();
        for (shape, result) in config.shapes.iter().zip(results.iter_mut()) {
            if let Err(e) =
                inbound_shape(config, progress, &server, &fake, &https, &creator, &members, shape, result)
                    .await
            {
                progress.say(&format!("  {shape} failed: {e}{}", server.log_tail("receiver")));
                result.error = Some(e.0);
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        progress.say(&format!("  failed: {e}"));
        for r in results.iter_mut().filter(|r| r.error.is_none() && r.answered_ms == 0.0) {
            r.error = Some(e.0.clone());
        }
    }
    server.stop(config).await;
    results
}

#[allow(clippy::too_many_arguments)]
async fn inbound_shape(
    config: &FedConfig,
    progress: &Progress,
    server: &Server,
    fake: &FakeServer,
    https: &reqwest::Client,
    creator: &User,
    members: &[User],
    shape: &str,
    result: &mut InboundResult,
) -> Res<()> {
    let hs = &server.hs;
    let body = json!({
        "preset": "public_chat",
        "name": format!("inbound {shape}"),
        "initial_state": [{
            "type": "m.room.history_visibility", "state_key": "",
            "content": { "history_visibility": "shared" },
        }],
    });
    let room_id = super::create_room(config, hs, creator, body).await?;
    let mut bc = Config::for_url(&server.client_url);
    bc.concurrency = config.concurrency;
    bc.progress = false;
    let t = Instant::now();
    join_all(hs, &bc, &room_id, members, &mut Report::default()).await?;
    progress.say(&format!(
        "  {shape}: room {room_id}, {} members joined in {:.1} s",
        members.len(),
        t.elapsed().as_secs_f64()
    ));

    // The fake's users join: the first by send_join, the others in one transaction.
    let senders: Vec<String> = (0..if shape == "linear" { 1 } else { config.branches })
        .map(|i| fake.user_id(&format!("{shape}{i}")))
        .collect();
    let mut room = fake_join(fake, https, &server.name, &room_id, &senders[0]).await?;
    let mut joins = Vec::new();
    for user in &senders[1..] {
        let (_, join) =
            fake.add(&mut room, "m.room.member", Some(user), user, json!({ "membership": "join" }));
        joins.push(join);
    }
    if !joins.is_empty() && send_txn(fake, https, &server.name, &format!("{shape}-joins"), &joins).await? > 0
    {
        return err("the receiver refused the joins of the fake's users");
    }
    let Some(last) = room.events.last() else { return err("the fake's room has no events") };
    let tip = (complement_tests::pdu::event_id(last), last["depth"].as_i64().unwrap_or(0));

    let pdus = build_pdus(config, fake, &mut room, &senders, shape, tip);
    let Some(last_id) = pdus.last().map(complement_tests::pdu::event_id) else { return err("no PDUs") };
    let (v, _) = hs.sync(creator, Some(SYNC_FILTER), None, None).await?;
    let Some(since) = v["next_batch"].as_str().map(str::to_owned) else {
        return err("the creator's /sync has no next_batch");
    };
    let timeout = Duration::from_secs(config.timeout_secs);
    let paced = config.pace == "sync";
    let watch = (!paced).then(|| {
        tokio::spawn(wait_event(hs.clone(), creator.clone(), room_id.clone(), last_id.clone(), since.clone()))
    });
    progress.say(&format!(
        "  {shape}: sending {} PDUs of {} senders in transactions of {} (pace: {})",
        pdus.len(),
        senders.len(),
        config.txn_size,
        config.pace
    ));
    let t0 = Instant::now();
    let mut since = since;
    let mut synced = None;
    let sent = async {
        for (i, chunk) in pdus.chunks(config.txn_size).enumerate() {
            let t = Instant::now();
            result.refused += send_txn(fake, https, &server.name, &format!("{shape}-{i}"), chunk).await?;
            result.txn_ms.push(ms(t.elapsed()));
            result.txns += 1;
            if paced {
                // The next transaction once this one's last PDU is in the creator's /sync.
                let Some(last) = chunk.last().map(complement_tests::pdu::event_id) else { continue };
                let wait = wait_event(hs.clone(), creator.clone(), room_id.clone(), last, since.clone());
                let Ok(found) = tokio::time::timeout(timeout, wait).await else {
                    return err(format!(
                        "transaction {i}'s last PDU did not reach the creator's /sync within {timeout:?}"
                    ));
                };
                let (at, next) = found?;
                since = next;
                synced = Some(at);
            }
        }
        Ok::<_, BenchError>(())
    }
    .await;
    result.answered_ms = if paced { result.txn_ms.iter().sum() } else { ms(t0.elapsed()) };
    result.pdus = pdus.len();
    if let Err(e) = sent {
        if let Some(w) = &watch {
            w.abort();
        }
        return Err(e);
    }
    let (at, next) = match (watch, synced) {
        (None, Some(at)) => (at, since),
        (None, None) => return err("nothing sent"),
        (Some(watch), _) => match tokio::time::timeout(timeout, watch).await {
            Ok(Ok(Ok(found))) => found,
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(e)) => return err(format!("sync task: {e}")),
            Err(_) => {
                return err(format!("the last PDU did not reach the creator's /sync within {timeout:?}"));
            }
        },
    };
    result.synced_ms = ms(at.duration_since(t0));
    let suffix = format!(":{}", fake.name);
    result.accepted = count_messages(hs, creator, &room_id, &next, |e| {
        e["type"] == "m.room.message" && e["sender"].as_str().is_some_and(|s| s.ends_with(&suffix))
    })
    .await?;
    progress.say(&format!(
        "  {shape}: {} PDUs answered in {:.0} ms ({:.0}/s), in /sync after {:.0} ms ({:.0}/s); {} refused, {} in /messages",
        result.pdus,
        result.answered_ms,
        result.answered_rate(),
        result.synced_ms,
        result.synced_rate(),
        result.refused,
        result.accepted
    ));
    if result.accepted != result.pdus && paced {
        return err(format!("{} PDUs sent, {} in the creator's /messages", result.pdus, result.accepted));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The values of `key` in a raw query string, percent-decoded.
fn query_values(query: &str, key: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| percent_decode(v))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The events reached from `from` (included) back through prev events,
/// breadth first, stopping at `stop` and after `limit`.
fn walk_back(room: &FakeRoom, from: &[String], stop: &HashSet<String>, limit: usize) -> Vec<Value> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut queue: VecDeque<String> = from.iter().cloned().collect();
    let mut out = Vec::new();
    while let Some(id) = queue.pop_front() {
        if out.len() >= limit {
            break;
        }
        if stop.contains(&id) || !seen.insert(id.clone()) {
            continue;
        }
        let Some(event) = room.get(&id) else { continue };
        for prev in event["prev_events"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            queue.push_back(prev.to_owned());
        }
        out.push(event.clone());
    }
    out
}

/// The auth chain of `ids` (their auth events, recursively; not `ids` themselves).
fn auth_chain(room: &FakeRoom, ids: &[String]) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut queue: Vec<String> = ids.to_vec();
    let mut out = Vec::new();
    while let Some(id) = queue.pop() {
        let Some(event) = room.get(&id) else { continue };
        for auth in event["auth_events"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if seen.insert(auth.to_owned()) {
                out.push(auth.to_owned());
                queue.push(auth.to_owned());
            }
        }
    }
    out
}

/// The state before `event_id` (the room's history being linear).
fn state_before(room: &FakeRoom, event_id: &str) -> Option<Vec<String>> {
    let index = room.index_of(event_id)?;
    let mut state: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, event) in room.events[..index].iter().enumerate() {
        if let (Some(kind), Some(key)) = (event["type"].as_str(), event["state_key"].as_str()) {
            state.insert((kind.to_owned(), key.to_owned()), i);
        }
    }
    Some(state.into_values().map(|i| complement_tests::pdu::event_id(&room.events[i])).collect())
}

/// Scripts `fake` to host `room`: make_join, send_join (v2; the joiner's
/// event becomes the room's newest), /backfill, /event, /state_ids, /state
/// and /get_missing_events.
fn host(fake: &FakeServer, room: Arc<Mutex<FakeRoom>>) {
    let name = fake.name.clone();
    let pdus =
        move |events: Vec<Value>| json!({ "origin": name, "origin_server_ts": now_ms(), "pdus": events });
    let r = room.clone();
    fake.answer_with("GET", "/_matrix/federation/v1/make_join/", move |req: &Received| {
        let user = req.path.rsplit('/').next()?;
        Some((200, lock(&r).join_template(user)))
    });
    let r = room.clone();
    let servers = vec![fake.name.clone()];
    fake.answer_with("PUT", "/_matrix/federation/v2/send_join/", move |req: &Received| {
        let mut room = lock(&r);
        // The state before the join, then the join as the room's newest event.
        let state: Vec<Value> = room.state_events();
        let ids: Vec<String> = state.iter().map(complement_tests::pdu::event_id).collect();
        let chain: Vec<Value> =
            auth_chain(&room, &ids).iter().filter_map(|id| room.get(id).cloned()).collect();
        let id = complement_tests::pdu::event_id(&req.body);
        if room.get(&id).is_none() {
            room.push(req.body.clone());
        }
        Some((
            200,
            json!({
                "state": state, "auth_chain": chain, "event": req.body,
                "members_omitted": false, "servers_in_room": servers,
            }),
        ))
    });
    let (r, answer) = (room.clone(), pdus.clone());
    fake.answer_with("GET", "/_matrix/federation/v1/backfill/", move |req: &Received| {
        let from = query_values(&req.query, "v");
        let limit = query_values(&req.query, "limit").first().and_then(|l| l.parse().ok()).unwrap_or(10);
        let events = walk_back(&lock(&r), &from, &HashSet::new(), limit);
        Some((200, answer(events)))
    });
    let (r, answer) = (room.clone(), pdus.clone());
    fake.answer_with("GET", "/_matrix/federation/v1/event/", move |req: &Received| {
        let id = req.path.rsplit('/').next()?;
        let event = lock(&r).get(id).cloned()?;
        Some((200, answer(vec![event])))
    });
    let r = room.clone();
    fake.answer_with("GET", "/_matrix/federation/v1/state_ids/", move |req: &Received| {
        let id = query_values(&req.query, "event_id").pop()?;
        let room = lock(&r);
        let state = state_before(&room, &id)?;
        let chain = auth_chain(&room, &state);
        Some((200, json!({ "pdu_ids": state, "auth_chain_ids": chain })))
    });
    let r = room.clone();
    fake.answer_with("GET", "/_matrix/federation/v1/state/", move |req: &Received| {
        let id = query_values(&req.query, "event_id").pop()?;
        let room = lock(&r);
        let state = state_before(&room, &id)?;
        let chain = auth_chain(&room, &state);
        let get = |ids: &[String]| ids.iter().filter_map(|id| room.get(id).cloned()).collect::<Vec<_>>();
        Some((200, json!({ "pdus": get(&state), "auth_chain": get(&chain) })))
    });
    let r = room;
    fake.answer_with("POST", "/_matrix/federation/v1/get_missing_events/", move |req: &Received| {
        let ids = |key: &str| -> Vec<String> {
            req.body[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        };
        let limit = req.body["limit"].as_u64().map_or(10, |l| l as usize);
        let stop: HashSet<String> = ids("earliest_events").into_iter().collect();
        let latest = ids("latest_events");
        let room = lock(&r);
        // The latest events themselves are not answered: start from their parents.
        let parents: Vec<String> = latest
            .iter()
            .filter_map(|id| room.get(id))
            .flat_map(|e| e["prev_events"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let mut events = walk_back(&room, &parents, &stop, limit);
        events.sort_by_key(|e| e["depth"].as_i64().unwrap_or(0));
        Some((200, json!({ "events": events })))
    });
}

/// One receiver's backfill figures (on a fresh server): a fresh fake with
/// a room of `--history` events, a user of the receiver joins and pages back.
async fn backfill_on(
    config: &FedConfig,
    progress: &Progress,
    server: &Server,
    result: &mut BackfillResult,
) -> Res<()> {
    let hs = &server.hs;
    let fake = FakeServer::start().await;
    let version = config.room_version.clone().unwrap_or_else(|| "12".to_owned());
    let creator = fake.user_id("host");
    let mut room = fake.create_room(&version, &creator);
    let t = Instant::now();
    let mut i = 0;
    while room.events.len() < config.history {
        i += 1;
        let content = json!({ "msgtype": "m.text", "body": format!("history {i}") });
        fake.add(&mut room, "m.room.message", None, &creator, content);
    }
    result.history = room.events.len();
    let room_id = room.room_id.clone();
    progress.say(&format!(
        "  the fake's room {room_id}: {} events (made in {:.1} s)",
        result.history,
        t.elapsed().as_secs_f64()
    ));
    let shared = Arc::new(Mutex::new(room));
    host(&fake, shared);

    let reader = hs.register(&format!("r{}", unix_secs() % 100_000_000), crate::PASSWORD, None).await?;
    let path = format!("{V3}/join/{}?server_name={}", enc(&room_id), enc(&fake.name));
    let t = Instant::now();
    let (status, v, _) = hs.raw(Method::POST, &path, Some(&reader.token), Some(&json!({}))).await?;
    result.join_ms = ms(t.elapsed());
    if status != 200 {
        return err(format!("join: {status} {v}"));
    }
    let (v, _) = hs.sync(&reader, Some(SYNC_FILTER), None, None).await?;
    let Some(mut from) = v["next_batch"].as_str().map(str::to_owned) else {
        return err("the reader's /sync has no next_batch");
    };
    let asked_before = fake.requests().len();
    progress.say(&format!(
        "  joined in {:.0} ms ({asked_before} requests to the fake so far); paging back {} at a time",
        result.join_ms, config.page_size
    ));
    let timeout = Duration::from_secs(config.timeout_secs);
    let max_pages = config.history / config.page_size * 4 + 20;
    let t0 = Instant::now();
    while !result.reached_create {
        let path = format!(
            "{V3}/rooms/{}/messages?dir=b&limit={}&from={}",
            enc(&room_id),
            config.page_size,
            enc(&from)
        );
        let t = Instant::now();
        let (status, v, _) = hs.raw(Method::GET, &path, Some(&reader.token), None).await?;
        result.page_ms.push(ms(t.elapsed()));
        if status != 200 {
            return err(format!("/messages page {}: {status} {v}", result.page_ms.len()));
        }
        let chunk = v["chunk"].as_array().map_or(&[][..], Vec::as_slice);
        result.events += chunk.len();
        result.reached_create = chunk.iter().any(|e| e["type"] == "m.room.create");
        result.total_ms = ms(t0.elapsed());
        if result.reached_create {
            break;
        }
        match v["end"].as_str() {
            Some(end) if end != from => end.clone_into(&mut from),
            _ => {
                return err(format!(
                    "/messages ended after {} pages and {} events without m.room.create",
                    result.page_ms.len(),
                    result.events
                ));
            }
        }
        if result.page_ms.len() > max_pages || t0.elapsed() > timeout {
            return err(format!(
                "no m.room.create after {} pages, {} events, {:.1} s",
                result.page_ms.len(),
                result.events,
                t0.elapsed().as_secs_f64()
            ));
        }
    }
    let asked: Vec<Received> = fake.requests().into_iter().skip(asked_before).collect();
    result.backfills =
        asked.iter().filter(|r| r.path.starts_with("/_matrix/federation/v1/backfill/")).count();
    result.other_requests = asked
        .iter()
        .filter(|r| {
            ["event/", "state_ids/", "state/", "get_missing_events/"]
                .iter()
                .any(|p| r.path.starts_with(&format!("/_matrix/federation/v1/{p}")))
        })
        .count();
    progress.say(&format!(
        "  {} events in {} pages, {:.0} ms (pages: median {:.0} ms, max {:.0} ms); the fake answered {} /backfill and {} other requests",
        result.events,
        result.page_ms.len(),
        result.total_ms,
        median(&result.page_ms),
        result.page_ms.iter().copied().fold(0.0, f64::max),
        result.backfills,
        result.other_requests
    ));
    Ok(())
}

pub(super) fn spread(samples: &[f64], digits: usize) -> String {
    if samples.is_empty() {
        return "-".to_owned();
    }
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.digits$} [{min:.digits$}–{max:.digits$}]", median(samples))
}

/// The PDU modes' results as text tables, with seqline's ratios to Synapse.
pub fn table(config: &FedConfig, results: &PduResults) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let backend = if config.postgres.is_some() { "PostgreSQL" } else { "SQLite" };
    if !results.inbound.is_empty() {
        let _ = writeln!(
            out,
            "== inbound /send: {} PDUs in transactions of {} into a room of {} members ({backend}); forked: {} branches, merged every {}",
            config.pdus, config.txn_size, config.members, config.branches, config.merge_every
        );
        let _ = writeln!(
            out,
            "   PDUs/s: median [min–max] over rounds; pace {}: {}",
            config.pace,
            if config.pace == "sync" {
                "each transaction once the last one's PDUs are in /sync; 'answered' = PDUs / sum of the transactions' round trips"
            } else {
                "each transaction once the last one is answered"
            }
        );
        let _ = writeln!(
            out,
            "{:<10} {:<8} {:>7} {:>26} {:>26} {:>16} {:>10}",
            "receiver",
            "shape",
            "rounds",
            "to last txn answered",
            "to last PDU in /sync",
            "accepted/sent",
            "refused"
        );
        let mut medians: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
        for shape in &config.shapes {
            for server in ["seqline", "Synapse"] {
                let runs: Vec<&InboundResult> =
                    results.inbound.iter().filter(|r| r.server == server && &r.shape == shape).collect();
                if runs.is_empty() {
                    continue;
                }
                let ok: Vec<&&InboundResult> = runs.iter().filter(|r| r.ok()).collect();
                let answered: Vec<f64> = ok.iter().map(|r| r.answered_rate()).collect();
                let synced: Vec<f64> =
                    ok.iter().filter(|r| r.synced_ms > 0.0).map(|r| r.synced_rate()).collect();
                let accepted: usize = runs.iter().map(|r| r.accepted).sum();
                let sent: usize = runs.iter().map(|r| r.pdus).sum();
                let refused: usize = runs.iter().map(|r| r.refused).sum();
                let _ = writeln!(
                    out,
                    "{server:<10} {shape:<8} {:>7} {:>26} {:>26} {:>16} {refused:>10}",
                    format!("{}/{}", ok.len(), runs.len()),
                    spread(&answered, 0),
                    spread(&synced, 0),
                    format!("{accepted}/{sent}")
                );
                medians.insert((server.to_owned(), shape.clone()), (median(&answered), median(&synced)));
            }
        }
        for shape in &config.shapes {
            let (Some(s), Some(y)) = (
                medians.get(&("seqline".to_owned(), shape.clone())),
                medians.get(&("Synapse".to_owned(), shape.clone())),
            ) else {
                continue;
            };
            // Synapse answers a transaction once it has queued its PDUs, not
            // processed them: only the /sync figure compares the two.
            let (a, b) = (s.0 / y.0, s.1 / y.1);
            let verdict = if b >= 10.0 { "meets x10" } else { "BELOW x10" };
            let _ = writeln!(
                out,
                "{shape}: seqline x{b:.1} of Synapse to the last PDU in /sync: {verdict} (answered: x{a:.1}; Synapse answers before it processes)"
            );
        }
        for r in results.inbound.iter().filter(|r| r.error.is_some()) {
            let _ = writeln!(
                out,
                "  {} {} round {} FAILED: {}",
                r.server,
                r.shape,
                r.round,
                r.error.as_deref().unwrap_or_default()
            );
        }
    }
    if !results.backfill.is_empty() {
        let _ = writeln!(
            out,
            "== backfill: a user joins the fake's room of {} events and pages /messages?dir=b&limit={} to m.room.create ({backend})",
            config.history, config.page_size
        );
        let _ = writeln!(out, "   ms: median [min–max] over rounds");
        let _ = writeln!(
            out,
            "{:<10} {:>7} {:>24} {:>8} {:>10} {:>22} {:>22} {:>10} {:>8}",
            "receiver",
            "rounds",
            "all pages",
            "pages",
            "events",
            "page (median of runs)",
            "slowest page",
            "/backfill",
            "other"
        );
        for server in ["seqline", "Synapse"] {
            let runs: Vec<&BackfillResult> = results.backfill.iter().filter(|r| r.server == server).collect();
            if runs.is_empty() {
                continue;
            }
            let ok: Vec<&&BackfillResult> = runs.iter().filter(|r| r.ok()).collect();
            let total: Vec<f64> = ok.iter().map(|r| r.total_ms).collect();
            let page: Vec<f64> = ok.iter().map(|r| median(&r.page_ms)).collect();
            let slowest: Vec<f64> =
                ok.iter().map(|r| r.page_ms.iter().copied().fold(0.0, f64::max)).collect();
            let pages: Vec<f64> = ok.iter().map(|r| r.page_ms.len() as f64).collect();
            let events: Vec<f64> = ok.iter().map(|r| r.events as f64).collect();
            let backfills: Vec<f64> = ok.iter().map(|r| r.backfills as f64).collect();
            let other: Vec<f64> = ok.iter().map(|r| r.other_requests as f64).collect();
            let _ = writeln!(
                out,
                "{server:<10} {:>7} {:>24} {:>8.0} {:>10.0} {:>22} {:>22} {:>10.0} {:>8.0}",
                format!("{}/{}", ok.len(), runs.len()),
                spread(&total, 0),
                median(&pages),
                median(&events),
                spread(&page, 1),
                spread(&slowest, 0),
                median(&backfills),
                median(&other)
            );
        }
        if let Some(s) = results
            .backfill
            .iter()
            .filter(|r| r.server == "seqline" && r.ok())
            .map(|r| r.total_ms)
            .reduce(f64::max)
        {
            let verdict = if s < 2000.0 { "under 2 s" } else { "OVER 2 s" };
            let _ = writeln!(
                out,
                "seqline's slowest backfill of {} events: {s:.0} ms: {verdict}",
                config.history
            );
        }
        for r in results.backfill.iter().filter(|r| r.error.is_some()) {
            let _ = writeln!(
                out,
                "  {} round {} FAILED: {}",
                r.server,
                r.round,
                r.error.as_deref().unwrap_or_default()
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_split_and_decoded() {
        let q = "v=%24abc&v=%24def%2B&limit=100";
        assert_eq!(query_values(q, "v"), ["$abc", "$def+"]);
        assert_eq!(query_values(q, "limit"), ["100"]);
        assert!(query_values(q, "x").is_empty());
    }
}
