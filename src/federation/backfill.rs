//! Backfill, the joining side: when a user pages back past the bottom of a
//! room's line and history continues below it (the lowest events name
//! `prev_events` this server does not have on its line, as a join over
//! federation leaves it), ask a server in the room for /backfill from there,
//! check what comes back, and place it below (`room::backfill`).
//!
//! Every event of a batch passes the checks of any other server's event:
//! format, signatures, content hash (`incoming::check_pdu`), the auth rules
//! against its auth events and against the state before it. That state is
//! the state after its one parent when the parent is in the batch (history
//! is linear almost always), else the answer of /state_ids at the event
//! from the same server (as Synapse does for events whose parents it lacks),
//! its events loaded from what we hold or fetched (/event, or /state when
//! many are missing) and each checked against its own auth events. An
//! answer holding an event of another room is refused with what the server
//! gave for the batch (the next server is asked). An event
//! that fails is not placed and not asked for again for an hour; its
//! parents still are, so one bad event does not end the history.
//!
//! No network I/O happens under the room's lock: the batch is fetched and
//! checked first, then placed in one transaction, which gives up when
//! another backfill of the room moved the bottom meanwhile. One backfill
//! per room runs at a time in this process.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ruma::api::federation::backfill::get_backfill;
use ruma::api::federation::event::{get_event, get_room_state, get_room_state_ids};
use ruma::room_version_rules::RoomVersionRules;
use ruma::{OwnedEventId, OwnedServerName, RoomId, UInt};
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::room::backfill::{Batch, Filled, StateMap};
use crate::room::pdu::Pdu;
use crate::state::AppState;
use crate::storage::{self, events, outliers};

/// Events asked for per /backfill request (Synapse asks for 100 too).
const BATCH: u32 = 100;

/// Servers tried per backfill before giving up.
const MAX_SERVERS: usize = 3;

/// How long one server has to answer a whole batch (its /backfill and the
/// state and events the batch needs).
const SERVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Missing events fetched one by one (/event); past this many, the whole
/// state is asked for at once (/state).
const MAX_SINGLE_FETCHES: usize = 20;

/// The largest /backfill or /state answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How long an event that could not be had (no server gave it, or it failed
/// its checks) is not asked for again.
const DEAD_END: Duration = Duration::from_secs(3600);

/// Most dead ends remembered (then forgotten all at once).
const MAX_DEAD_ENDS: usize = 100_000;

/// This process's backfills: one per room at a time, and the events that
/// could not be had.
#[derive(Debug, Default)]
pub struct Backfills {
    rooms: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    dead: Mutex<HashMap<String, Instant>>,
}

impl Backfills {
    fn room_lock(&self, room: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget the locks nobody holds or waits for.
        if rooms.len() > 1000 {
            rooms.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        rooms.entry(room.to_owned()).or_default().clone()
    }

    pub(super) fn is_dead(&self, event_id: &str) -> bool {
        let dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        dead.get(event_id).is_some_and(|since| since.elapsed() < DEAD_END)
    }

    pub(super) fn mark_dead(&self, event_id: &str) {
        let mut dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        if dead.len() >= MAX_DEAD_ENDS {
            dead.clear();
        }
        dead.insert(event_id.to_owned(), Instant::now());
    }
}

/// Fills history below the bottom of `room_id`'s line from another server
/// in the room, when there is some and a reader may see below the bottom
/// (`readable_from`: the lowest position the reader may read). Answers
/// whether anything was placed.
pub async fn fill_below(state: &AppState, room_id: &RoomId, readable_from: i64) -> Result<bool> {
    if state.settings.federation.is_none() {
        return Ok(false);
    }
    let room = room_id.as_str();
    let lock = state.backfills.room_lock(room);
    let _guard = lock.lock().await;
    let Some((bottom, missing)) = storage::backfill::bottom(&state.db, room).await? else {
        return Ok(false);
    };
    if readable_from >= bottom {
        return Ok(false);
    }
    let started = std::time::Instant::now();
    let Some((server, rules, batch)) = fetch_from_any(state, room_id, bottom, &missing).await? else {
        return Ok(false);
    };
    let fetched_ms = started.elapsed().as_millis();
    let placed = crate::room::backfill::place(state, room, &rules, &batch).await?;
    let placed_ms = started.elapsed().as_millis() - fetched_ms;
    tracing::info!(%room_id, %server, placed, fetched_ms, placed_ms, "backfilled");
    Ok(placed > 0)
}

/// Fills the hole in `room_id`'s line recorded at `upper` (the event there
/// names `missing`, which we lack) from another server in the room, when a
/// reader pages into it: the batch is placed just below `upper`
/// (`room::hole`), and what it still lacks stays recorded below it. Answers
/// whether anything was placed. Events no server could give are dead ends
/// for an hour, as below the bottom.
pub async fn fill_hole(state: &AppState, room_id: &RoomId, upper: i64, missing: &[String]) -> Result<bool> {
    if state.settings.federation.is_none() {
        return Ok(false);
    }
    let room = room_id.as_str();
    let lock = state.backfills.room_lock(room);
    let _guard = lock.lock().await;
    let Some((server, rules, batch)) = fetch_from_any(state, room_id, upper, missing).await? else {
        return Ok(false);
    };
    let placed = crate::room::hole::place(state, room, &rules, &batch, missing).await?;
    tracing::info!(%room_id, %server, placed, "filled a hole in the line");
    Ok(placed > 0)
}

/// The first usable batch of the history before `missing` (the events
/// named at position `upper` that we lack) from up to [`MAX_SERVERS`]
/// servers of the room, with the server and the room's rules. `None` when
/// every event wanted is a dead end or no server gave anything usable (the
/// events wanted become dead ends then).
async fn fetch_from_any(
    state: &AppState,
    room_id: &RoomId,
    upper: i64,
    missing: &[String],
) -> Result<Option<(OwnedServerName, RoomVersionRules, Batch)>> {
    let wanted: Vec<OwnedEventId> = missing
        .iter()
        .filter(|id| !state.backfills.is_dead(id))
        .filter_map(|id| OwnedEventId::try_from(id.as_str()).ok())
        .collect();
    if wanted.is_empty() {
        return Ok(None);
    }
    let view = crate::room::read::open(state, room_id).await?;
    let rules = view.rules.clone();
    for server in other_servers(state, room_id.as_str()).await?.into_iter().take(MAX_SERVERS) {
        let fetched =
            tokio::time::timeout(SERVER_TIMEOUT, fetch(state, &server, room_id, &rules, upper, &wanted))
                .await;
        match fetched {
            Ok(Ok(Some(batch))) => return Ok(Some((server, rules, batch))),
            Ok(Ok(None)) => tracing::info!(%room_id, %server, "backfill: nothing usable"),
            Ok(Err(e)) => tracing::info!(%room_id, %server, "backfill failed: {e}"),
            Err(_) => tracing::info!(%room_id, %server, "backfill timed out"),
        }
    }
    for id in &wanted {
        state.backfills.mark_dead(id.as_str());
    }
    Ok(None)
}

/// The servers in `room` other than this one.
async fn other_servers(state: &AppState, room: &str) -> Result<Vec<OwnedServerName>> {
    Ok(storage::federation::servers_in_room(&state.db, room)
        .await?
        .into_iter()
        .filter(|s| *s != state.settings.server_name.as_str())
        .filter_map(|s| OwnedServerName::try_from(s).ok())
        .collect())
}

/// What one server gives of the history below `missing`, checked; `None`
/// when nothing of it can be placed.
async fn fetch(
    state: &AppState,
    server: &OwnedServerName,
    room_id: &RoomId,
    rules: &RoomVersionRules,
    bottom: i64,
    missing: &[OwnedEventId],
) -> Result<Option<Batch>> {
    let started = std::time::Instant::now();
    let request = get_backfill::v1::Request::new(room_id.to_owned(), missing.to_vec(), UInt::from(BATCH));
    let answer = super::send_capped(state, server, request, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| Error::RemoteUnavailable(format!("/backfill from {server}: {e}")))?;
    let answered_ms = started.elapsed().as_millis();
    let mut got: HashMap<OwnedEventId, Pdu> = HashMap::new();
    let raws = answer.pdus.iter().take(BATCH as usize * 2).map(|raw| &**raw);
    for checked in super::incoming::check_pdus(state, rules, raws).await {
        match checked {
            Ok(pdu) => {
                refuse_other_rooms(rules, &pdu, room_id, server, "/backfill")?;
                got.insert(pdu.event_id.clone(), pdu);
            }
            Err(e) => tracing::info!(%server, "backfill: dropped an event: {e}"),
        }
    }
    // Events placed already (one that came through /send, say) stay where
    // they are, and the walk down from `missing` stops at them: what lies
    // below one of them (a hole's answer reaching past the hole into our
    // line, our line's own older history) belongs below it, not here.
    let ids: Vec<&str> = got.keys().map(|id| id.as_str()).collect();
    let placed: HashSet<String> = outliers::held_by_ids(&state.db, &ids)
        .await?
        .into_iter()
        .filter(|h| h.seq.is_some())
        .map(|h| h.event_id)
        .collect();
    got.retain(|id, _| !placed.contains(id.as_str()));
    let order = below_order(&got, missing);
    if order.is_empty() {
        return Ok(None);
    }

    let mut known = Known::default();
    if let Some(create) = events::state_event(&state.db, room_id.as_str(), "m.room.create", "").await? {
        let pdu = Pdu::from_stored(&create.event_id, &create.json)?;
        known.pdus.insert(pdu.event_id.clone(), pdu);
    }
    // The auth events of the whole batch that are not in it, at once.
    let batch_ids: HashSet<&OwnedEventId> = order.iter().collect();
    let auth_ids: Vec<OwnedEventId> = order
        .iter()
        .filter_map(|id| got.get(id))
        .flat_map(|p| p.auth_events.iter().cloned())
        .filter(|id| !batch_ids.contains(id))
        .collect();
    let checked_ms = started.elapsed().as_millis();
    known.load(state, server, room_id, rules, &auth_ids, None).await?;

    let mut after_of: HashMap<OwnedEventId, Arc<StateMap>> = HashMap::new();
    let mut events: Vec<Filled> = Vec::new();
    for id in order.iter().rev() {
        let Some(pdu) = got.remove(id) else { continue };
        let before = match pdu.prev_events.as_slice() {
            [prev] if after_of.contains_key(prev) => after_of[prev].clone(),
            _ => Arc::new(known.state_before(state, server, room_id, rules, &pdu.event_id).await?),
        };
        let allowed = crate::room::timeline::authorize(
            rules,
            &pdu,
            |id| known.pdus.get(id),
            |t, k| before.get(&(t.to_string(), k.to_owned())).and_then(|id| known.pdus.get(id)),
        );
        if let Err(e) = allowed {
            // Rejected: the state after it is the state before it.
            tracing::info!(event_id = %pdu.event_id, "backfill: an event fails its auth rules: {e}");
            state.backfills.mark_dead(pdu.event_id.as_str());
            after_of.insert(pdu.event_id.clone(), before);
            continue;
        }
        let after = match &pdu.state_key {
            Some(key) => {
                let mut after = (*before).clone();
                after.insert((pdu.kind.to_string(), key.clone()), pdu.event_id.clone());
                Arc::new(after)
            }
            None => before,
        };
        known.pdus.insert(pdu.event_id.clone(), pdu.clone());
        after_of.insert(pdu.event_id.clone(), after.clone());
        events.push(Filled { pdu, after });
    }
    tracing::info!(%server, answered_ms, checked_ms, authorised_ms = started.elapsed().as_millis(), "backfill: a batch");
    if events.is_empty() {
        return Ok(None);
    }
    Ok(Some(Batch { bottom, events, outliers: known.fetched, known: known.pdus }))
}

/// Refuses a server's answer (the whole batch it serves) holding `pdu`
/// when that is an event of another room than `room_id`.
fn refuse_other_rooms(
    rules: &RoomVersionRules,
    pdu: &Pdu,
    room_id: &RoomId,
    server: &OwnedServerName,
    what: &str,
) -> Result<()> {
    if crate::room::version::belongs_to(rules, pdu, room_id) {
        return Ok(());
    }
    Err(Error::RemoteUnavailable(format!(
        "{server}'s {what} answer holds an event of another room ({})",
        pdu.event_id
    )))
}

/// The events of `got` reached from `missing` through `prev_events`, in the
/// order they take below the bottom: children before parents (Kahn over the
/// batch's prev edges; among events free at once, the greater depth first,
/// then the greater id). Depth only breaks ties: it never lifts an event
/// above one of its children.
fn below_order(got: &HashMap<OwnedEventId, Pdu>, missing: &[OwnedEventId]) -> Vec<OwnedEventId> {
    let mut reached: HashSet<&OwnedEventId> = HashSet::new();
    let mut stack: Vec<&OwnedEventId> = missing.iter().collect();
    while let Some(id) = stack.pop() {
        if let Some(pdu) = got.get(id)
            && reached.insert(id)
        {
            stack.extend(pdu.prev_events.iter());
        }
    }
    // How many reached children each reached event has.
    let mut children: HashMap<&OwnedEventId, usize> = reached.iter().map(|id| (*id, 0)).collect();
    for id in &reached {
        for prev in &got[*id].prev_events {
            if let Some(n) = children.get_mut(prev) {
                *n += 1;
            }
        }
    }
    let key = |id: &OwnedEventId| (got[id].depth, id.clone());
    let mut free: BinaryHeap<(u64, OwnedEventId)> =
        children.iter().filter(|(_, n)| **n == 0).map(|(id, _)| key(id)).collect();
    let mut order = Vec::new();
    while let Some((_, id)) = free.pop() {
        for prev in &got[&id].prev_events {
            if let Some(n) = children.get_mut(prev) {
                *n -= 1;
                if *n == 0 {
                    free.push(key(prev));
                }
            }
        }
        order.push(id);
    }
    order
}

/// The events a batch's checks read: what we hold, and what was fetched
/// (to be held as outliers once the batch is placed).
#[derive(Default)]
pub(super) struct Known {
    pdus: HashMap<OwnedEventId, Pdu>,
    /// What was fetched and passed its checks, not held yet.
    pub(super) fetched: Vec<Pdu>,
}

impl Known {
    /// The state before `event_id`, as `server` says (/state_ids), every
    /// event of it held or fetched and checked.
    pub(super) async fn state_before(
        &mut self,
        state: &AppState,
        server: &OwnedServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        event_id: &OwnedEventId,
    ) -> Result<StateMap> {
        let request = get_room_state_ids::v1::Request::new(event_id.clone(), room_id.to_owned());
        let answer = super::send_capped(state, server, request, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| Error::RemoteUnavailable(format!("/state_ids from {server}: {e}")))?;
        let mut ids = answer.pdu_ids.clone();
        ids.extend(answer.auth_chain_ids);
        self.load(state, server, room_id, rules, &ids, Some(event_id)).await?;
        let mut map = StateMap::new();
        for id in &answer.pdu_ids {
            if let Some(pdu) = self.pdus.get(id)
                && let Some(key) = &pdu.state_key
            {
                map.insert((pdu.kind.to_string(), key.clone()), id.clone());
            }
        }
        Ok(map)
    }

    /// Makes `ids` known: from what we hold, else fetched (one by one, or,
    /// when many are missing and `at` is given, the whole state at `at`),
    /// each fetched event checked against its own auth events.
    async fn load(
        &mut self,
        state: &AppState,
        server: &OwnedServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        ids: &[OwnedEventId],
        at: Option<&OwnedEventId>,
    ) -> Result<()> {
        let wanted: Vec<&str> =
            ids.iter().filter(|id| !self.pdus.contains_key(*id)).map(|id| id.as_str()).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        for held in outliers::held_by_ids(&state.db, &wanted).await? {
            if held.room_id == room_id.as_str() {
                let pdu = Pdu::from_stored(&held.event_id, &held.json)?;
                self.pdus.insert(pdu.event_id.clone(), pdu);
            }
        }
        let missing: Vec<OwnedEventId> = ids
            .iter()
            .filter(|id| !self.pdus.contains_key(*id) && !state.backfills.is_dead(id.as_str()))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let raws: Vec<Box<RawJsonValue>> = match at {
            Some(at) if missing.len() > MAX_SINGLE_FETCHES => {
                let request = get_room_state::v1::Request::new(at.clone(), room_id.to_owned());
                let answer = super::send_capped(state, server, request, MAX_ANSWER_BYTES)
                    .await
                    .map_err(|e| Error::RemoteUnavailable(format!("/state from {server}: {e}")))?;
                answer.pdus.into_iter().chain(answer.auth_chain).collect()
            }
            _ => {
                let mut raws = Vec::new();
                for id in missing.iter().take(MAX_SINGLE_FETCHES * 5) {
                    match super::send(state, server, get_event::v1::Request::new(id.clone())).await {
                        Ok(answer) => raws.push(answer.pdu),
                        Err(e) => tracing::info!(event_id = %id, %server, "backfill: cannot fetch: {e}"),
                    }
                }
                raws
            }
        };
        let mut candidates: HashMap<OwnedEventId, Pdu> = HashMap::new();
        for checked in super::incoming::check_pdus(state, rules, raws.iter().map(|raw| &**raw)).await {
            match checked {
                Ok(pdu) => {
                    refuse_other_rooms(rules, &pdu, room_id, server, "/state or /event")?;
                    candidates.insert(pdu.event_id.clone(), pdu);
                }
                Err(e) => tracing::info!(%server, "backfill: dropped a fetched event: {e}"),
            }
        }
        let accepted = super::joining::authorise_chain(rules, &self.pdus, candidates);
        for id in &missing {
            if !accepted.contains_key(id) {
                state.backfills.mark_dead(id.as_str());
            }
        }
        for (id, pdu) in accepted {
            self.fetched.push(pdu.clone());
            self.pdus.insert(id, pdu);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdu(id: &str, depth: u32, prevs: &[&str]) -> Pdu {
        let json = serde_json::json!({
            "room_id": "!r:x", "sender": "@a:x", "type": "m.room.message", "content": {"body": id},
            "origin_server_ts": 1, "depth": depth, "prev_events": prevs, "auth_events": [],
            "hashes": {"sha256": "x"}, "signatures": {},
        });
        Pdu::from_stored(id, &json.to_string()).unwrap()
    }

    fn ids(order: &[OwnedEventId]) -> Vec<&str> {
        order.iter().map(|id| id.as_str()).collect()
    }

    #[test]
    fn children_go_above_parents_whatever_their_depth() {
        // $d <- $c <- $b <- $a (missing: $a); $c claims a huge depth.
        let got: HashMap<OwnedEventId, Pdu> = [
            pdu("$a", 4, &["$b"]),
            pdu("$b", 3, &["$c"]),
            pdu("$c", 1_000_000, &["$d"]),
            pdu("$d", 1, &["$z"]),
        ]
        .into_iter()
        .map(|p| (p.event_id.clone(), p))
        .collect();
        let missing = [OwnedEventId::try_from("$a").unwrap()];
        assert_eq!(ids(&below_order(&got, &missing)), ["$a", "$b", "$c", "$d"]);
    }

    #[test]
    fn only_what_the_bottom_reaches_is_taken() {
        // $x is no ancestor of the missing event: it is left out.
        let got: HashMap<OwnedEventId, Pdu> =
            [pdu("$a", 3, &["$b"]), pdu("$b", 2, &[]), pdu("$x", 9, &["$b"])]
                .into_iter()
                .map(|p| (p.event_id.clone(), p))
                .collect();
        let missing = [OwnedEventId::try_from("$a").unwrap()];
        assert_eq!(ids(&below_order(&got, &missing)), ["$a", "$b"]);
    }

    #[test]
    fn a_fork_is_placed_with_both_branches_above_their_common_parent() {
        // $m merges $l and $r, both children of $p.
        let got: HashMap<OwnedEventId, Pdu> =
            [pdu("$m", 4, &["$l", "$r"]), pdu("$l", 3, &["$p"]), pdu("$r", 3, &["$p"]), pdu("$p", 2, &[])]
                .into_iter()
                .map(|p| (p.event_id.clone(), p))
                .collect();
        let missing = [OwnedEventId::try_from("$m").unwrap()];
        assert_eq!(ids(&below_order(&got, &missing)), ["$m", "$r", "$l", "$p"]);
    }
}
