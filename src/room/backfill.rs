//! History from before this server joined, placed below the bottom of the
//! room's line (`../shared/FEDERATION.md` §1.2 "Bottom"): a batch another
//! server sent through /backfill, checked by `federation::backfill`, takes
//! the positions just below the lowest one, children above parents, with no
//! stream position (it never reaches /sync). One transaction writes, for
//! those positions: the events (an outlier among them, such as an old state
//! event of the send_join answer, is placed now), the state after each
//! (`state_runs`: the whole state at the lowest, each change above it), the
//! membership rows (a stay that reached the old bottom now starts lower; a
//! stay, invite or knock inside the batch gets its own row), redactions
//! (applied when both ends are held, else remembered until the target comes),
//! and a new read epoch, so the history-visibility line and every user's
//! rows are read again. The current state never moves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ruma::OwnedEventId;
use ruma::room_version_rules::RoomVersionRules;

use super::pdu::Pdu;
use super::position;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events::{self, NewEvent};
use crate::storage::{self, backfill as store, outliers, state_runs};

/// A room's state: (type, state key) to event id.
pub type StateMap = BTreeMap<(String, String), OwnedEventId>;

/// An event of a batch with the state after it.
pub struct Filled {
    /// The checked event.
    pub pdu: Pdu,
    /// The state after it (the state before it with it applied).
    pub after: Arc<StateMap>,
}

/// A checked batch, ready to place.
pub struct Batch {
    /// The room's lowest position when the batch was fetched (for a hole,
    /// the position of the event above it): placing is given up (nothing
    /// written) if another backfill moved it meanwhile.
    pub bottom: i64,
    /// The events, parents before children (the lowest position first).
    pub events: Vec<Filled>,
    /// State and auth events fetched for the batch, to hold as outliers.
    pub outliers: Vec<Pdu>,
    /// Every event the states name, by id (for memberships and power levels).
    pub known: HashMap<OwnedEventId, Pdu>,
}

pub(super) fn membership_of(known: &HashMap<OwnedEventId, Pdu>, id: &OwnedEventId) -> String {
    known
        .get(id)
        .and_then(|p| p.content_as::<serde_json::Value>())
        .and_then(|c| c["membership"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "leave".into())
}

fn ts(pdu: &Pdu) -> i64 {
    i64::try_from(u64::from(pdu.origin_server_ts.0)).unwrap_or(i64::MAX)
}

/// Places `batch` below the room's bottom; answers how many events were
/// placed (0 when the bottom moved meanwhile).
pub async fn place(state: &AppState, room: &str, rules: &RoomVersionRules, batch: &Batch) -> Result<usize> {
    let n = batch.events.len();
    if n == 0 {
        return Ok(0);
    }
    let mut tx = state.db.begin_room_write(Some(room)).await?;
    match store::bottom_tx(tx.conn(), room).await? {
        Some((lowest, _)) if lowest == batch.bottom => {}
        _ => return Ok(0),
    }
    let mut positions = vec![0i64; n];
    let mut p = batch.bottom;
    for slot in positions.iter_mut().rev() {
        p = position::below(p).ok_or_else(|| Error::Internal(format!("no room left below {room}'s line")))?;
        *slot = p;
    }
    insert_events(&mut tx, room, batch, &positions).await?;
    write_states(&mut tx, room, batch, &positions).await?;
    write_rows(&mut tx, room, batch, &positions).await?;
    apply_redactions(state, &mut tx, room, rules, batch).await?;
    store::bump_read_epoch(tx.conn(), room).await?;
    tx.commit().await?;
    Ok(n)
}

/// Holds the batch's fetched events as outliers and places its events at
/// `positions` (rows and edges; no state rows, no current state): what a
/// batch below the bottom and one in a hole both write first.
pub(super) async fn insert_events(
    tx: &mut storage::RoomTx,
    room: &str,
    batch: &Batch,
    positions: &[i64],
) -> Result<()> {
    let now = storage::now_ms();
    for pdu in &batch.outliers {
        super::remote::hold(tx.conn(), room, pdu, now).await?;
    }
    // Old state events held since the join (outliers) are placed now.
    let ids: Vec<&str> = batch.events.iter().map(|f| f.pdu.event_id.as_str()).collect();
    outliers::remove_many(tx.conn(), &ids).await?;
    let mut owned = Vec::with_capacity(batch.events.len());
    for filled in &batch.events {
        let pdu = &filled.pdu;
        let membership = pdu.state_key.is_some().then(|| membership_of(&batch.known, &pdu.event_id));
        owned.push((pdu.to_json_string(), pdu.kind.to_string(), membership, pdu.as_draft()?.content));
    }
    let rows: Vec<NewEvent<'_>> = batch
        .events
        .iter()
        .zip(positions)
        .zip(&owned)
        .map(|((filled, &seq), (json, kind, membership, content))| {
            let pdu = &filled.pdu;
            NewEvent {
                room_id: room,
                seq,
                stream: 0,
                event_id: pdu.event_id.as_str(),
                event_type: kind,
                state_key: pdu.state_key.as_deref(),
                sender: pdu.sender.as_str(),
                origin_server_ts: ts(pdu),
                json,
                txn: None,
                membership: membership.as_deref().filter(|_| kind == "m.room.member"),
                relation: super::relations::relation_of(content),
            }
        })
        .collect();
    events::insert_rows(tx.conn(), &rows).await?;
    Ok(())
}

/// The state after each new position: the whole state at the lowest (there
/// is nothing below it), the keys that differ from the position below at
/// each other one. The old bottom keeps its rows: it carries a whole state
/// too (a join's snapshot, or an earlier batch's lowest position).
async fn write_states(tx: &mut storage::RoomTx, room: &str, batch: &Batch, positions: &[i64]) -> Result<()> {
    let first = &batch.events[0].after;
    let entries: Vec<(&str, &str, &str)> =
        first.iter().map(|((t, k), id)| (t.as_str(), k.as_str(), id.as_str())).collect();
    state_runs::write_snapshot(tx.conn(), room, positions[0], &entries).await?;
    for (pair, &seq) in batch.events.windows(2).zip(&positions[1..]) {
        let (below, after) = (&pair[0].after, &pair[1].after);
        let keys: BTreeSet<&(String, String)> = below.keys().chain(after.keys()).collect();
        for key in keys {
            let now = after.get(key);
            if now != below.get(key) {
                state_runs::record(tx.conn(), room, &key.0, &key.1, seq, now.map(|id| id.as_str())).await?;
            }
        }
    }
    Ok(())
}

/// Membership rows for the new positions: a user's row is a run of
/// positions where their membership is the same join, invite or knock, from
/// the event that started it to the one that ended it. A run that reaches
/// the old bottom with the membership the user had there extends the row
/// starting there; one that ends at the old bottom (their membership changed
/// there) gets a row ending there.
async fn write_rows(tx: &mut storage::RoomTx, room: &str, batch: &Batch, positions: &[i64]) -> Result<()> {
    let mut users: BTreeSet<&str> = BTreeSet::new();
    for filled in &batch.events {
        users.extend(filled.after.keys().filter(|(t, _)| t == "m.room.member").map(|(_, k)| k.as_str()));
    }
    for user in users {
        let key = ("m.room.member".to_owned(), user.to_owned());
        let mut run: Option<(String, i64)> = None;
        for (filled, &seq) in batch.events.iter().zip(positions) {
            let kind = filled
                .after
                .get(&key)
                .map_or_else(|| "leave".to_owned(), |id| membership_of(&batch.known, id));
            let row_kind = matches!(kind.as_str(), "join" | "invite" | "knock");
            match &run {
                Some((k, _)) if *k == kind => continue,
                Some((k, start)) => {
                    store::insert_row(tx.conn(), room, user, k, *start, Some(seq)).await?;
                    run = None;
                }
                None => {}
            }
            if row_kind {
                run = Some((kind, seq));
            }
        }
        if let Some((kind, start)) = run
            && !store::extend_row_down(tx.conn(), room, user, &kind, batch.bottom, start).await?
        {
            store::insert_row(tx.conn(), room, user, &kind, start, Some(batch.bottom)).await?;
        }
    }
    Ok(())
}

/// Redactions among the new events whose target is held are applied (when
/// their sender may redact it); the others wait for their target. New events
/// that redactions placed earlier were waiting for are redacted now.
pub(super) async fn apply_redactions(
    state: &AppState,
    tx: &mut storage::RoomTx,
    room: &str,
    rules: &RoomVersionRules,
    batch: &Batch,
) -> Result<()> {
    let in_batch: HashMap<&OwnedEventId, &Filled> =
        batch.events.iter().map(|f| (&f.pdu.event_id, f)).collect();
    for filled in &batch.events {
        let redaction = &filled.pdu;
        let Ok(Some(target_id)) = super::redaction::target(rules, redaction) else { continue };
        let target = match in_batch.get(&target_id) {
            Some(f) => Some(f.pdu.clone()),
            None => match events::by_id_tx(tx.conn(), target_id.as_str()).await? {
                Some(stored) if stored.room_id == room => {
                    Some(Pdu::from_stored(&stored.event_id, &stored.json)?)
                }
                Some(_) => None,
                None => {
                    store::add_pending_redaction(
                        tx.conn(),
                        room,
                        target_id.as_str(),
                        redaction.event_id.as_str(),
                    )
                    .await?;
                    None
                }
            },
        };
        if let Some(target) = target
            && may_redact(rules, redaction, &target, room, &filled.after, &batch.known)
        {
            redact(tx, target.event_id.as_str(), redaction.event_id.as_str()).await?;
        }
    }
    // Almost always none waits: one look instead of one per event.
    let waiting = store::any_pending_redactions(tx.conn(), room).await?;
    for filled in batch.events.iter().filter(|_| waiting) {
        let target = &filled.pdu;
        for (redaction_id, seq, json) in
            store::take_pending_redactions(tx.conn(), room, target.event_id.as_str()).await?
        {
            let redaction = Pdu::from_stored(&redaction_id, &json)?;
            let power = events::state_event_at(&state.db, room, "m.room.power_levels", "", seq).await?;
            let create = events::state_event_at(&state.db, room, "m.room.create", "", seq).await?;
            let parse = |s: Option<events::StoredEvent>| {
                s.map(|s| Pdu::from_stored(&s.event_id, &s.json)).transpose()
            };
            let (power, create) = (parse(power)?, parse(create)?);
            if check_redaction(rules, &redaction, target, room, power.as_ref(), create.as_ref()) {
                redact(tx, target.event_id.as_str(), &redaction_id).await?;
            }
        }
    }
    Ok(())
}

/// Marks `target` redacted by `redaction`; its relation goes with its
/// `m.relates_to`.
async fn redact(tx: &mut storage::RoomTx, target: &str, redaction: &str) -> Result<()> {
    events::set_redacted_by(tx.conn(), target, redaction).await?;
    storage::relations::delete(tx.conn(), target).await
}

/// Whether `redaction`, with the state `at` it, may redact `target`.
fn may_redact(
    rules: &RoomVersionRules,
    redaction: &Pdu,
    target: &Pdu,
    room: &str,
    at: &StateMap,
    known: &HashMap<OwnedEventId, Pdu>,
) -> bool {
    let get = |t: &str| at.get(&(t.to_owned(), String::new())).and_then(|id| known.get(id));
    check_redaction(rules, redaction, target, room, get("m.room.power_levels"), get("m.room.create"))
}

fn check_redaction(
    rules: &RoomVersionRules,
    redaction: &Pdu,
    target: &Pdu,
    room: &str,
    power: Option<&Pdu>,
    create: Option<&Pdu>,
) -> bool {
    let Some(create) = create else { return false };
    let Ok(power) = super::power::from_state(rules, power, Some(create), create.sender.clone()) else {
        return false;
    };
    let target_room = target.room_id.as_ref().map_or(room, |r| r.as_str());
    // Backfilled events are other servers'.
    super::redaction::check(redaction, room, target, target_room, &power, true).is_ok()
}
