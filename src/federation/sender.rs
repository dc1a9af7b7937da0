//! The outgoing side of federation: our events go to every server in their
//! room through a durable queue per destination (`fed_outbox`, written in
//! the transaction that stores the event, so nothing committed is lost to a
//! crash), our receipts, presence, device-list and to-device EDUs through
//! another (`fed_edu_outbox`, see `edus`). Typing notices are ephemeral:
//! one replayed after a crash or a long outage would be wrong, so they wait
//! in memory only ([`Sender::queue_ephemeral`]: one per key, a newer one
//! replacing the older, at most [`MAX_EPHEMERAL`] per destination, dropped
//! when older than [`EPHEMERAL_TTL`] as they are taken), and cost no
//! database write on their way out.
//!
//! One task per destination sends transactions of at most [`MAX_PDUS`]
//! events and [`MAX_EDUS`] EDUs: the durable ones first, then, in a new
//! transaction only, what the in-memory queue holds; with nothing durable
//! queued, the in-memory EDUs go alone under a txn id of their own (`t`...,
//! never one of the durable ids). A durable transaction is read without a
//! write (its id made from its rows, so the same rows always go under the
//! same id), its rows deleted once the destination has it; one that failed
//! has exactly its rows marked, and is retried with the same id and the
//! same events and EDUs, nothing added, after a
//! backoff that doubles per failure (from [`FIRST_BACKOFF_MS`] up to
//! [`MAX_BACKOFF_MS`]) and is forgotten as soon as the destination proves
//! reachable (it answers, or it calls us); the in-memory EDUs a failed
//! transaction carried go back to their queue unless a newer one about the
//! same thing came meanwhile. A destination that stays away keeps at most
//! `federation.max_queued_per_destination` events queued; past that only the
//! newest of each room (Synapse's catch-up: it fills the rest itself).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ruma::api::federation::transactions::send_transaction_message;
use ruma::{MilliSecondsSinceUnixEpoch, OwnedServerName, OwnedTransactionId, UInt};

use crate::state::AppState;
use crate::storage::{self, federation as store};

/// Most PDUs in one transaction (the spec's limit).
pub const MAX_PDUS: i64 = 50;

/// Most EDUs in one transaction (the spec's limit).
pub const MAX_EDUS: i64 = 100;

/// The first wait after a failure.
const FIRST_BACKOFF_MS: i64 = 2_000;

/// The longest wait between attempts.
const MAX_BACKOFF_MS: i64 = 3_600_000;

/// The wait after `failures` failures in a row.
fn backoff_ms(failures: i64) -> i64 {
    let doublings = u32::try_from((failures - 1).clamp(0, 30)).unwrap_or(30);
    FIRST_BACKOFF_MS.saturating_mul(1i64 << doublings).min(MAX_BACKOFF_MS)
}

/// Most ephemeral EDUs waiting for one destination: past it the oldest go
/// (a destination that stays away cannot grow memory).
pub const MAX_EPHEMERAL: usize = 1_000;

/// An ephemeral EDU older than this when a transaction would take it is
/// dropped: a typing notice that old says nothing true any more.
pub const EPHEMERAL_TTL: Duration = Duration::from_secs(30);

/// An EDU kept in memory only, waiting for one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ephemeral {
    /// What it is about (`typing {room} {user}`, as in the durable queue).
    key: String,
    /// The EDU's JSON.
    edu: String,
    /// When it was queued.
    queued: Instant,
}

/// The ephemeral EDUs waiting for one destination, oldest first, at most
/// one per key.
#[derive(Debug, Default)]
struct EphemeralQueue {
    waiting: VecDeque<Ephemeral>,
}

impl EphemeralQueue {
    /// Queues `edu`; an older one about the same thing goes (the newer
    /// takes the back of the line, so the line stays oldest first).
    fn push(&mut self, edu: Ephemeral) {
        if let Some(i) = self.waiting.iter().position(|e| e.key == edu.key) {
            self.waiting.remove(i);
        }
        self.waiting.push_back(edu);
        self.bound();
    }

    /// Drops the oldest past [`MAX_EPHEMERAL`].
    fn bound(&mut self) {
        while self.waiting.len() > MAX_EPHEMERAL {
            self.waiting.pop_front();
        }
    }

    /// Drops what was queued more than [`EPHEMERAL_TTL`] before `now`;
    /// answers how many.
    fn drop_stale(&mut self, now: Instant) -> usize {
        let before = self.waiting.len();
        while self.waiting.front().is_some_and(|e| now.saturating_duration_since(e.queued) > EPHEMERAL_TTL) {
            self.waiting.pop_front();
        }
        before - self.waiting.len()
    }

    /// Takes up to `limit` of the oldest that are not stale at `now`.
    fn take(&mut self, limit: usize, now: Instant) -> Vec<Ephemeral> {
        self.drop_stale(now);
        let n = limit.min(self.waiting.len());
        self.waiting.drain(..n).collect()
    }

    /// Puts back what a failed transaction carried, ahead of what came
    /// since (it is older), except where a newer one about the same thing
    /// is queued.
    fn put_back(&mut self, taken: Vec<Ephemeral>) {
        for edu in taken.into_iter().rev() {
            if !self.waiting.iter().any(|e| e.key == edu.key) {
                self.waiting.push_front(edu);
            }
        }
        self.bound();
    }
}

/// Destinations this process last found with nothing queued in the
/// database and no failure recorded, with nothing durable queued for them
/// since: their ephemeral EDUs go without reading the database first.
#[derive(Debug, Default)]
struct Clear {
    /// Durable wake-ups so far (of any destination): a destination is
    /// marked clear only if none came while it was read.
    wakes: u64,
    destinations: HashSet<OwnedServerName>,
}

/// Most destinations kept in [`Clear`] (past it, all are read again).
const MAX_CLEAR: usize = 10_000;

/// Our events as committed, by id, kept a little while so that the
/// transactions carrying them need not read them back: an event's stored
/// JSON never changes, so the copy here is the one the database holds.
#[derive(Debug, Default)]
struct Fresh {
    /// Ids oldest first, each with when it came.
    order: VecDeque<(String, Instant)>,
    json: HashMap<String, std::sync::Arc<str>>,
    /// The JSON kept, in bytes.
    bytes: usize,
}

/// Most bytes of events [`Fresh`] keeps.
const FRESH_BYTES: usize = 4 << 20;

/// How long [`Fresh`] keeps an event (a destination that answers takes it
/// well within this; one that does not reads it back when it returns).
const FRESH_FOR: Duration = Duration::from_secs(10);

impl Fresh {
    fn put(&mut self, event_id: String, json: String, now: Instant) {
        if self.json.contains_key(&event_id) {
            return;
        }
        self.bytes += json.len();
        self.json.insert(event_id.clone(), json.into());
        self.order.push_back((event_id, now));
        self.trim(now);
    }

    /// Forgets what is too old, and the oldest past [`FRESH_BYTES`].
    fn trim(&mut self, now: Instant) {
        while let Some((id, at)) = self.order.front() {
            if self.bytes <= FRESH_BYTES && now.saturating_duration_since(*at) <= FRESH_FOR {
                break;
            }
            if let Some(json) = self.json.remove(id) {
                self.bytes -= json.len();
            }
            self.order.pop_front();
        }
    }

    fn get(&self, event_id: &str) -> Option<std::sync::Arc<str>> {
        self.json.get(event_id).cloned()
    }
}

/// Adds `destination` to `known`, a set kept within [`MAX_CLEAR`] (past it,
/// all are forgotten and found out again).
fn keep(known: &mut HashSet<OwnedServerName>, destination: &OwnedServerName) {
    if known.len() >= MAX_CLEAR {
        known.clear();
    }
    known.insert(destination.clone());
}

/// The destinations a sending task runs for, and those woken while it ran
/// (so a wake-up between its last look at the queue and its exit is not
/// lost); the ephemeral EDUs waiting for each destination; those known to
/// need no look at the database.
#[derive(Debug)]
pub struct Sender {
    running: Mutex<HashMap<OwnedServerName, bool>>,
    ephemeral: Mutex<HashMap<OwnedServerName, EphemeralQueue>>,
    clear: Mutex<Clear>,
    /// Destinations with no failure recorded, as far as this process knows
    /// (it records theirs itself): a durable wake-up reads their queue
    /// without first reading their state.
    healthy: Mutex<HashSet<OwnedServerName>>,
    /// Failures recorded by this process so far (of any destination): a
    /// read that saw none marks a destination healthy only if none came
    /// while it ran.
    failures: AtomicU64,
    /// Our events just committed.
    fresh: Mutex<Fresh>,
    /// The start of the ids of transactions of ephemeral EDUs alone: `t`,
    /// the process's start (ms) and id, so that no restart reuses one and
    /// none is a durable id (a row id, or `e` and one).
    txn_prefix: String,
    /// The number of such transactions so far.
    txn_count: AtomicU64,
}

impl Default for Sender {
    fn default() -> Self {
        Self {
            running: Mutex::default(),
            ephemeral: Mutex::default(),
            clear: Mutex::default(),
            healthy: Mutex::default(),
            failures: AtomicU64::new(0),
            fresh: Mutex::default(),
            txn_prefix: format!("t{}p{}n", storage::now_ms(), std::process::id()),
            txn_count: AtomicU64::new(0),
        }
    }
}

impl Sender {
    /// Marks `destination` to be (re)examined; answers true when no task runs
    /// for it (the caller starts one).
    fn claim(&self, destination: &OwnedServerName) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get_mut(destination) {
            Some(woken) => {
                *woken = true;
                false
            }
            None => {
                running.insert(destination.clone(), false);
                true
            }
        }
    }

    /// The task for `destination` found nothing to send: it ends unless it
    /// was woken meanwhile (then it looks again).
    fn may_end(&self, destination: &OwnedServerName) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get_mut(destination) {
            Some(woken) if *woken => {
                *woken = false;
                false
            }
            _ => {
                running.remove(destination);
                true
            }
        }
    }

    /// Queues the ephemeral `edu` (JSON) about `key` for each of
    /// `destinations`, in memory only; the caller wakes them.
    pub fn queue_ephemeral(&self, destinations: &[String], key: &str, edu: &str) {
        self.queue_ephemeral_at(destinations, key, edu, Instant::now());
    }

    fn queue_ephemeral_at(&self, destinations: &[String], key: &str, edu: &str, now: Instant) {
        let mut queues = self.ephemeral.lock().unwrap_or_else(|e| e.into_inner());
        for destination in destinations {
            let Ok(destination) = OwnedServerName::try_from(destination.as_str()) else { continue };
            let queue = queues.entry(destination).or_default();
            queue.drop_stale(now);
            queue.push(Ephemeral { key: key.to_owned(), edu: edu.to_owned(), queued: now });
        }
    }

    /// Takes up to `limit` ephemeral EDUs for `destination` (the stale ones
    /// dropped).
    fn take_ephemeral(&self, destination: &OwnedServerName, limit: usize, now: Instant) -> Vec<Ephemeral> {
        let mut queues = self.ephemeral.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues.get_mut(destination) else { return Vec::new() };
        let taken = queue.take(limit, now);
        if queue.waiting.is_empty() {
            queues.remove(destination);
        }
        taken
    }

    /// A transaction carrying `taken` failed: they wait again (see
    /// [`EphemeralQueue::put_back`]).
    fn put_back_ephemeral(&self, destination: &OwnedServerName, taken: Vec<Ephemeral>) {
        if taken.is_empty() {
            return;
        }
        let mut queues = self.ephemeral.lock().unwrap_or_else(|e| e.into_inner());
        queues.entry(destination.clone()).or_default().put_back(taken);
    }

    /// While `destination` backs off: what went stale waiting goes.
    fn drop_stale_ephemeral(&self, destination: &OwnedServerName, now: Instant) {
        let mut queues = self.ephemeral.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues.get_mut(destination) else { return };
        let dropped = queue.drop_stale(now);
        if queue.waiting.is_empty() {
            queues.remove(destination);
        }
        if dropped > 0 {
            tracing::debug!(%destination, dropped, "ephemeral EDUs went stale while the destination was away");
        }
    }

    /// A fresh id for a transaction of ephemeral EDUs alone.
    fn ephemeral_txn_id(&self) -> String {
        format!("{}{}", self.txn_prefix, self.txn_count.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `destination` is known to have nothing queued in the
    /// database and no failure recorded; else the count of durable
    /// wake-ups to pass to [`Sender::mark_clear`] after reading.
    fn is_clear(&self, destination: &OwnedServerName) -> Result<(), u64> {
        let clear = self.clear.lock().unwrap_or_else(|e| e.into_inner());
        if clear.destinations.contains(destination) { Ok(()) } else { Err(clear.wakes) }
    }

    /// A read begun after `wakes` durable wake-ups found `destination`
    /// with nothing queued and no failure: it is clear unless something
    /// durable was queued since (for it or any other).
    fn mark_clear(&self, destination: &OwnedServerName, wakes: u64) {
        let mut clear = self.clear.lock().unwrap_or_else(|e| e.into_inner());
        if clear.wakes == wakes {
            keep(&mut clear.destinations, destination);
        }
    }

    /// Whether `destination` has no failure recorded, as far as known.
    fn is_healthy(&self, destination: &OwnedServerName) -> bool {
        self.healthy.lock().unwrap_or_else(|e| e.into_inner()).contains(destination)
    }

    /// Records whether `destination` has a failure recorded (`false`) or
    /// none (`true`).
    fn set_healthy(&self, destination: &OwnedServerName, healthy: bool) {
        let mut known = self.healthy.lock().unwrap_or_else(|e| e.into_inner());
        if !healthy {
            self.failures.fetch_add(1, Ordering::Relaxed);
            known.remove(destination);
            return;
        }
        keep(&mut known, destination);
    }

    /// A read begun after `failures` failures found none recorded for
    /// `destination`: it is healthy unless one was recorded since (the
    /// count moves under the same lock).
    fn mark_healthy_since(&self, destination: &OwnedServerName, failures: u64) {
        let mut known = self.healthy.lock().unwrap_or_else(|e| e.into_inner());
        if self.failures.load(Ordering::Relaxed) == failures {
            keep(&mut known, destination);
        }
    }

    /// Something durable was queued for `destination`, or a failure was
    /// recorded: the database must be read again.
    fn not_clear(&self, destination: &OwnedServerName) {
        let mut clear = self.clear.lock().unwrap_or_else(|e| e.into_inner());
        clear.wakes += 1;
        clear.destinations.remove(destination);
    }
}

/// The write path committed `events` (id, stored JSON), queued for
/// `destinations`: they are kept for the transactions that carry them, and
/// the destinations woken.
pub fn committed(
    state: &AppState,
    destinations: &std::collections::BTreeSet<String>,
    events: Vec<(String, String)>,
) {
    if destinations.is_empty() {
        return;
    }
    {
        let now = Instant::now();
        let mut fresh = state.federation_sender.fresh.lock().unwrap_or_else(|e| e.into_inner());
        for (event_id, json) in events {
            fresh.put(event_id, json, now);
        }
    }
    wake(state, destinations.iter().map(String::as_str));
}

/// Makes sure a task sends what is queued for each of `destinations`
/// (after something durable was queued for them, or they came back).
pub fn wake<'a>(state: &AppState, destinations: impl IntoIterator<Item = &'a str>) {
    start(state, destinations, true);
}

/// [`wake`] after ephemeral EDUs alone were queued (in memory: what is
/// known of the destination's database rows still holds).
pub fn wake_ephemeral<'a>(state: &AppState, destinations: impl IntoIterator<Item = &'a str>) {
    start(state, destinations, false);
}

fn start<'a>(state: &AppState, destinations: impl IntoIterator<Item = &'a str>, durable: bool) {
    for destination in destinations {
        let Ok(destination) = OwnedServerName::try_from(destination) else { continue };
        if durable {
            state.federation_sender.not_clear(&destination);
        }
        if state.federation_sender.claim(&destination) {
            tokio::spawn(run(state.clone(), destination));
        }
    }
}

/// At start-up: a task for every destination with something queued.
pub async fn resume(state: &AppState) {
    match store::destinations_with_work(&state.db).await {
        Ok(destinations) => wake(state, destinations.iter().map(String::as_str)),
        Err(e) => tracing::error!("cannot read the federation queue: {e}"),
    }
}

/// Whether `destination` is known to have no failure recorded (so a call
/// from it changes nothing here).
pub fn known_healthy(state: &AppState, destination: &ruma::ServerName) -> bool {
    let destination = destination.to_owned();
    let sender = &state.federation_sender;
    sender.is_clear(&destination).is_ok() || sender.is_healthy(&destination)
}

/// `origin` called us: if we were backing off from it, try it now. A read
/// first: a write per request would put the writer slot (and, were a row
/// there, a sync to disk) on every call another server makes; one that
/// finds no failure recorded spares the next calls the read.
pub async fn contact_from(state: &AppState, origin: &ruma::ServerName) {
    let sender = &state.federation_sender;
    let failures = sender.failures.load(Ordering::Relaxed);
    match store::backing_off(&state.db, origin.as_str()).await {
        Ok(true) => {}
        Ok(false) => {
            sender.mark_healthy_since(&origin.to_owned(), failures);
            return;
        }
        Err(e) => {
            tracing::warn!(%origin, "cannot read the backoff: {e}");
            return;
        }
    }
    match store::reset_backoff(&state.db, origin.as_str()).await {
        Ok(true) => wake(state, [origin.as_str()]),
        Ok(false) => {}
        Err(e) => tracing::warn!(%origin, "cannot reset the backoff: {e}"),
    }
}

/// Sends everything queued for `destination`, transaction by transaction.
async fn run(state: AppState, destination: OwnedServerName) {
    loop {
        match send_next(&state, &destination).await {
            Ok(true) => continue,
            Ok(false) => {
                if state.federation_sender.may_end(&destination) {
                    return;
                }
            }
            Err(retry_at) => {
                // Waking at least once a minute keeps the queue in its bound
                // however long the backoff (see `send_next`).
                let wait = (retry_at - storage::now_ms()).clamp(0, MAX_SLEEP_MS);
                tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
            }
        }
    }
}

/// Most EDUs in one transaction, as a count of them.
const MAX_EDUS_COUNT: usize = MAX_EDUS as usize;

/// Sends one transaction; `Ok(false)` when nothing was queued, `Err(when)`
/// when it failed (or the destination is backing off) and should be tried
/// again at `when`.
async fn send_next(state: &AppState, destination: &OwnedServerName) -> Result<bool, i64> {
    let now = storage::now_ms();
    let clock = Instant::now();
    let sender = &state.federation_sender;
    let failed = |e: &dyn std::fmt::Display| {
        tracing::warn!(%destination, "federation send failed: {e}");
    };
    // The durable wake-ups counted before a queue read that skipped the
    // destination's state: a read that finds nothing marks it clear.
    let mut read_after = None;
    let known = match sender.is_clear(destination) {
        Ok(()) => store::DestinationState { retry_at: None, queued: false },
        // Woken for something durable, with no failure known: the queue's
        // read below says what there is.
        Err(wakes) if sender.is_healthy(destination) => {
            read_after = Some(wakes);
            store::DestinationState { retry_at: None, queued: true }
        }
        Err(wakes) => match store::destination_state(&state.db, destination.as_str()).await {
            Ok(known) => {
                if known == (store::DestinationState { retry_at: None, queued: false }) {
                    sender.mark_clear(destination, wakes);
                }
                sender.set_healthy(destination, known.retry_at.is_none());
                known
            }
            Err(e) => {
                failed(&e);
                return Err(now + FIRST_BACKOFF_MS);
            }
        },
    };
    if let Some(at) = known.retry_at.filter(|at| *at > now) {
        sender.drop_stale_ephemeral(destination, Instant::now());
        compact(state, destination).await;
        return Err(at);
    }
    // The database is read only when it has rows for the destination:
    // in-memory EDUs alone go without it.
    let durable = if known.queued {
        match store::next_transaction(&state.db, destination.as_str(), MAX_PDUS, MAX_EDUS).await {
            Ok(next) => {
                // Nothing queued and no failure known: the typing notices
                // that follow go without reading the queue again.
                if let (None, Some(wakes)) = (&next, read_after) {
                    sender.mark_clear(destination, wakes);
                }
                next
            }
            Err(e) => {
                failed(&e);
                return Err(now + FIRST_BACKOFF_MS);
            }
        }
    } else {
        None
    };
    let (durable_id, rows, queued, edus, ephemeral) = match durable {
        Some(store::Outgoing { txn_id, pdus, edus, retry, rows }) => {
            // A retry carries what it carried before, nothing more.
            let room = if retry { 0 } else { MAX_EDUS_COUNT.saturating_sub(edus.len()) };
            let ephemeral = sender.take_ephemeral(destination, room, Instant::now());
            (Some(txn_id), rows, pdus, edus, ephemeral)
        }
        None => {
            let ephemeral = sender.take_ephemeral(destination, MAX_EDUS_COUNT, Instant::now());
            if ephemeral.is_empty() {
                return Ok(false);
            }
            (None, None, Vec::new(), Vec::new(), ephemeral)
        }
    };
    let pdus = match load_pdus(state, &queued).await {
        Ok(pdus) => pdus,
        Err(e) => {
            failed(&e);
            sender.put_back_ephemeral(destination, ephemeral);
            return Err(now + FIRST_BACKOFF_MS);
        }
    };
    let txn_id = durable_id.clone().unwrap_or_else(|| sender.ephemeral_txn_id());
    let mut request = send_transaction_message::v1::Request::new(
        OwnedTransactionId::from(txn_id.as_str()),
        state.settings.server_name.clone(),
        MilliSecondsSinceUnixEpoch(UInt::try_from(now).unwrap_or_default()),
    );
    request.pdus = pdus;
    request.edus = edus
        .into_iter()
        .chain(ephemeral.iter().map(|e| e.edu.clone()))
        .filter_map(|json| match serde_json::value::RawValue::from_string(json) {
            Ok(raw) => Some(ruma::serde::Raw::from_json(raw)),
            Err(e) => {
                tracing::error!("queued EDU is not JSON: {e}");
                None
            }
        })
        .collect();
    let read_us = clock.elapsed().as_micros();
    let sent = super::send(state, destination, request).await;
    tracing::debug!(%destination, txn_id, read_us, sent_us = clock.elapsed().as_micros(), ok = sent.is_ok(), "transaction sent");
    match sent {
        Ok(response) => {
            for (event_id, result) in &response.pdus {
                if let Err(e) = result {
                    tracing::info!(%destination, %event_id, "the destination refused our event: {e}");
                }
            }
            let done = match (&durable_id, &rows) {
                (_, Some(rows)) => store::rows_sent(&state.db, destination.as_str(), rows).await,
                (Some(txn_id), None) => {
                    store::transaction_sent(&state.db, destination.as_str(), txn_id).await
                }
                // Nothing in the database to forget but a recorded failure.
                (None, None) if known.retry_at.is_some() => {
                    store::reset_backoff(&state.db, destination.as_str()).await.map(|_| ())
                }
                (None, None) => Ok(()),
            };
            if let Err(e) = done {
                failed(&e);
                return Err(now + FIRST_BACKOFF_MS);
            }
            sender.set_healthy(destination, true);
            Ok(true)
        }
        Err(e) => {
            failed(&e);
            sender.put_back_ephemeral(destination, ephemeral);
            sender.not_clear(destination);
            sender.set_healthy(destination, false);
            // The destination may have taken it all the same: what it
            // carried of the queue goes again under its id, nothing added.
            if let (Some(txn_id), Some(rows)) = (&durable_id, &rows)
                && let Err(e) = store::rows_begun(&state.db, destination.as_str(), txn_id, rows).await
            {
                tracing::warn!(%destination, "cannot mark the transaction as begun: {e}");
            }
            let retry_at = store::transaction_failed(&state.db, destination.as_str(), now, backoff_ms)
                .await
                .unwrap_or(now + FIRST_BACKOFF_MS);
            compact(state, destination).await;
            Err(retry_at)
        }
    }
}

/// The events `queued` (room id, event id) as stored, in queue order; an
/// id queued twice is sent once. Those just committed come from memory.
async fn load_pdus(
    state: &AppState,
    queued: &[(String, String)],
) -> crate::error::Result<Vec<Box<serde_json::value::RawValue>>> {
    if queued.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = queued.iter().map(|(_, id)| id.as_str()).collect();
    let mut held: HashMap<String, String> = {
        let fresh = state.federation_sender.fresh.lock().unwrap_or_else(|e| e.into_inner());
        ids.iter().filter_map(|id| fresh.get(id).map(|json| ((*id).to_owned(), json.to_string()))).collect()
    };
    let missing: Vec<&str> = ids.iter().copied().filter(|id| !held.contains_key(*id)).collect();
    if !missing.is_empty() {
        held.extend(
            crate::storage::outliers::held_by_ids(&state.db, &missing)
                .await?
                .into_iter()
                .map(|h| (h.event_id, h.json)),
        );
    }
    let mut pdus = Vec::with_capacity(queued.len());
    for event_id in ids {
        // The first take empties its entry.
        let Some(json) = held.remove(event_id) else { continue };
        match serde_json::value::RawValue::from_string(json) {
            Ok(raw) => pdus.push(raw),
            Err(e) => tracing::error!(%event_id, "stored event is not JSON: {e}"),
        }
    }
    Ok(pdus)
}

/// The longest a backing-off task sleeps before it looks at its queue again.
const MAX_SLEEP_MS: i64 = 60_000;

/// Keeps what is queued for a destination that does not answer within
/// `federation.max_queued_per_destination`.
async fn compact(state: &AppState, destination: &OwnedServerName) {
    match store::compact_queue(&state.db, destination.as_str(), state.settings.federation_max_queued).await {
        Ok(0) => {}
        Ok(dropped) => tracing::info!(
            %destination,
            dropped,
            "the destination does not answer: kept only the newest queued event of each room"
        ),
        Err(e) => tracing::warn!(%destination, "cannot bound the federation queue: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        assert_eq!(backoff_ms(1), 2_000);
        assert_eq!(backoff_ms(2), 4_000);
        assert_eq!(backoff_ms(5), 32_000);
        assert_eq!(backoff_ms(12), MAX_BACKOFF_MS);
        assert_eq!(backoff_ms(1_000), MAX_BACKOFF_MS);
    }

    fn edu(key: &str, body: &str, queued: Instant) -> Ephemeral {
        Ephemeral { key: key.to_owned(), edu: body.to_owned(), queued }
    }

    fn bodies(queue: &EphemeralQueue) -> Vec<&str> {
        queue.waiting.iter().map(|e| e.edu.as_str()).collect()
    }

    fn texts(edus: &[Ephemeral]) -> Vec<&str> {
        edus.iter().map(|e| e.edu.as_str()).collect()
    }

    #[test]
    fn a_newer_ephemeral_edu_replaces_the_older_of_its_key() {
        let t0 = Instant::now();
        let mut queue = EphemeralQueue::default();
        queue.push(edu("typing !r @a", "a starts", t0));
        queue.push(edu("typing !r @b", "b starts", t0));
        queue.push(edu("typing !r @a", "a stops", t0 + Duration::from_secs(1)));
        assert_eq!(bodies(&queue), ["b starts", "a stops"]);
        let taken = queue.take(10, t0 + Duration::from_secs(2));
        assert_eq!(texts(&taken), ["b starts", "a stops"]);
        assert!(queue.waiting.is_empty());
    }

    #[test]
    fn the_ephemeral_queue_keeps_the_newest_within_its_bound() {
        let t0 = Instant::now();
        let mut queue = EphemeralQueue::default();
        for i in 0..MAX_EPHEMERAL + 5 {
            queue.push(edu(&format!("typing !r @u{i}"), &i.to_string(), t0));
        }
        assert_eq!(queue.waiting.len(), MAX_EPHEMERAL);
        assert_eq!(queue.waiting.front().map(|e| e.edu.as_str()), Some("5"));
        assert_eq!(queue.waiting.back().map(|e| e.edu.as_str()), Some(&*(MAX_EPHEMERAL + 4).to_string()));
        // A put-back past the bound loses the oldest too.
        let mut full = EphemeralQueue::default();
        for i in 0..MAX_EPHEMERAL {
            full.push(edu(&format!("typing !r @n{i}"), "new", t0));
        }
        full.put_back(vec![edu("typing !r @old", "old", t0)]);
        assert_eq!(full.waiting.len(), MAX_EPHEMERAL);
        assert!(full.waiting.iter().all(|e| e.edu == "new"));
    }

    #[test]
    fn a_stale_ephemeral_edu_is_not_taken() {
        let t0 = Instant::now();
        let mut queue = EphemeralQueue::default();
        queue.push(edu("typing !r @a", "old", t0));
        queue.push(edu("typing !r @b", "fresh", t0 + Duration::from_secs(20)));
        let taken = queue.take(10, t0 + EPHEMERAL_TTL + Duration::from_secs(1));
        assert_eq!(texts(&taken), ["fresh"]);
        // Taken at most `limit`, oldest first.
        for i in 0..5 {
            queue.push(edu(&format!("typing !r @u{i}"), &i.to_string(), t0));
        }
        assert_eq!(texts(&queue.take(3, t0)), ["0", "1", "2"]);
        assert_eq!(bodies(&queue), ["3", "4"]);
        assert_eq!(queue.drop_stale(t0 + EPHEMERAL_TTL + Duration::from_millis(1)), 2);
    }

    #[test]
    fn a_failed_ephemeral_edu_goes_back_unless_a_newer_one_came() {
        let t0 = Instant::now();
        let mut queue = EphemeralQueue::default();
        queue.push(edu("typing !r @a", "a starts", t0));
        queue.push(edu("typing !r @b", "b starts", t0));
        let taken = queue.take(10, t0);
        queue.push(edu("typing !r @a", "a stops", t0 + Duration::from_secs(1)));
        queue.push(edu("typing !r @c", "c starts", t0 + Duration::from_secs(1)));
        queue.put_back(taken);
        assert_eq!(bodies(&queue), ["b starts", "a stops", "c starts"]);
    }

    #[test]
    fn ephemeral_edus_wait_per_destination_and_go_with_their_own_txn_ids() {
        let sender = Sender::default();
        let (one, two): (OwnedServerName, OwnedServerName) =
            ("one.example".try_into().unwrap(), "two.example".try_into().unwrap());
        let both = [one.to_string(), two.to_string(), "not a server name!".to_owned()];
        let t0 = Instant::now();
        sender.queue_ephemeral_at(&both, "typing !r @a", "a starts", t0);
        sender.queue_ephemeral_at(&both[..1], "typing !r @b", "b starts", t0);
        assert_eq!(sender.take_ephemeral(&one, 1, t0).len(), 1);
        assert_eq!(sender.take_ephemeral(&one, 10, t0).len(), 1);
        assert!(sender.take_ephemeral(&one, 10, t0).is_empty());
        let taken = sender.take_ephemeral(&two, 10, t0);
        assert_eq!(texts(&taken), ["a starts"]);
        // Nothing is kept for a destination with nothing waiting.
        assert!(sender.ephemeral.lock().unwrap().is_empty());
        sender.put_back_ephemeral(&two, taken);
        sender.drop_stale_ephemeral(&two, t0 + EPHEMERAL_TTL + Duration::from_secs(1));
        assert!(sender.ephemeral.lock().unwrap().is_empty());

        let (a, b) = (sender.ephemeral_txn_id(), sender.ephemeral_txn_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert!(id.starts_with('t') && id.parse::<i64>().is_err(), "{id}");
        }
    }

    #[test]
    fn a_destination_is_clear_only_if_nothing_durable_came_during_its_read() {
        let sender = Sender::default();
        let (dest, other): (OwnedServerName, OwnedServerName) =
            ("one.example".try_into().unwrap(), "two.example".try_into().unwrap());
        let Err(before) = sender.is_clear(&dest) else { panic!("clear before any read") };
        // Something durable is queued (anywhere) while the read runs.
        sender.not_clear(&other);
        sender.mark_clear(&dest, before);
        assert!(sender.is_clear(&dest).is_err());
        let Err(before) = sender.is_clear(&dest) else { unreachable!() };
        sender.mark_clear(&dest, before);
        assert_eq!(sender.is_clear(&dest), Ok(()));
        // Another destination's wake-up leaves it clear; its own does not.
        sender.not_clear(&other);
        assert_eq!(sender.is_clear(&dest), Ok(()));
        sender.not_clear(&dest);
        assert!(sender.is_clear(&dest).is_err());
    }

    #[test]
    fn fresh_events_are_kept_a_while_and_within_their_bytes() {
        let t0 = Instant::now();
        let mut fresh = Fresh::default();
        fresh.put("$a".into(), "{\"a\":1}".into(), t0);
        fresh.put("$a".into(), "{\"changed\":1}".into(), t0);
        assert_eq!(fresh.get("$a").as_deref(), Some("{\"a\":1}"));
        assert_eq!(fresh.get("$b"), None);
        // Past its time an event goes when the next one comes.
        fresh.put("$b".into(), "{}".into(), t0 + FRESH_FOR + Duration::from_millis(1));
        assert_eq!(fresh.get("$a"), None);
        assert_eq!(fresh.get("$b").as_deref(), Some("{}"));
        assert_eq!(fresh.bytes, 2);
        // Past the bytes, the oldest go.
        let big = "x".repeat(FRESH_BYTES / 2 + 1);
        fresh.put("$c".into(), big.clone(), t0 + FRESH_FOR + Duration::from_millis(2));
        fresh.put("$d".into(), big, t0 + FRESH_FOR + Duration::from_millis(2));
        assert_eq!(fresh.get("$b"), None);
        assert_eq!(fresh.get("$c"), None);
        assert!(fresh.get("$d").is_some());
        assert_eq!(fresh.bytes, FRESH_BYTES / 2 + 1);
    }

    #[test]
    fn a_destination_found_without_failure_is_healthy_unless_one_came_meanwhile() {
        let sender = Sender::default();
        let (dest, other): (OwnedServerName, OwnedServerName) =
            ("one.example".try_into().unwrap(), "two.example".try_into().unwrap());
        let before = sender.failures.load(Ordering::Relaxed);
        // A failure (anywhere) while the read ran: not marked.
        sender.set_healthy(&other, false);
        sender.mark_healthy_since(&dest, before);
        assert!(!sender.is_healthy(&dest));
        let before = sender.failures.load(Ordering::Relaxed);
        sender.mark_healthy_since(&dest, before);
        assert!(sender.is_healthy(&dest));
        sender.set_healthy(&dest, false);
        assert!(!sender.is_healthy(&dest));
    }

    #[test]
    fn a_wake_during_a_run_keeps_the_task_going() {
        let sender = Sender::default();
        let dest: OwnedServerName = "other.example".try_into().unwrap();
        assert!(sender.claim(&dest));
        assert!(!sender.claim(&dest));
        assert!(!sender.may_end(&dest));
        assert!(sender.may_end(&dest));
        assert!(sender.claim(&dest));
    }
}
