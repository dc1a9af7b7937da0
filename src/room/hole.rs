//! History placed in a hole in the middle of a room's line
//! (`../shared/FEDERATION.md` §1.2): an event placed across a hole (its prev
//! events could not be had when it came, `timeline_gaps`) leaves the events
//! between our line and it unplaced. When a reader pages into the hole, a
//! batch another server sent through /backfill, checked by
//! `federation::backfill`, takes positions just below the event (children
//! above parents, no stream position: it never reaches /sync). One
//! transaction writes, for those positions: the events (outliers among them
//! placed now), the state after each (`state_runs`: the keys where the first
//! differs from the line below the hole, each change above it, and the
//! event above the hole keeps its state: its rows are written out for every
//! key the batch touched), the membership rows of every user whose
//! membership changes in the batch (a stay a kick in the hole ended now
//! ends at the kick), redactions, the hole moved down below the batch (or
//! forgotten when the batch reached the line), and a new read epoch.

use std::collections::{BTreeSet, HashMap};

use ruma::RoomId;
use ruma::room_version_rules::RoomVersionRules;

use super::backfill::{self, Batch};
use super::history::{Dir, Page};
use super::position;
use super::read::Access;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::memberships::Range;
use crate::storage::{self, Db, backfill as store, events, outliers, state_runs};

/// A state key: (type, state key).
type Key = (String, String);

/// Places `batch` in the hole recorded at `batch.bottom` (the position of
/// the event above the hole), which named `missing`; answers how many
/// events were placed (0 when the hole was filled or moved meanwhile).
pub async fn place(
    state: &AppState,
    room: &str,
    rules: &RoomVersionRules,
    batch: &Batch,
    missing: &[String],
) -> Result<usize> {
    let n = batch.events.len();
    if n == 0 {
        return Ok(0);
    }
    let upper = batch.bottom;
    let mut tx = state.db.begin_room_write(Some(room)).await?;
    if store::gap_tx(tx.conn(), room, upper).await?.as_deref() != Some(missing) {
        return Ok(0);
    }
    let Some(lower) = store::position_below(tx.conn(), room, upper).await? else { return Ok(0) };
    let positions = position::just_below(lower, upper, n)
        .ok_or_else(|| Error::Internal(format!("no room left in a hole of {room}'s line")))?;

    // The line at both ends of the hole, before anything moves.
    let below: HashMap<Key, String> =
        state_runs::ids_at(tx.conn(), room, lower).await?.into_iter().map(|(t, k, e)| ((t, k), e)).collect();
    let mut touched: BTreeSet<Key> = BTreeSet::new();
    for filled in &batch.events {
        let after = &filled.after;
        touched.extend(
            after.iter().filter(|(k, id)| below.get(*k) != Some(&id.to_string())).map(|(k, _)| k.clone()),
        );
        touched.extend(below.keys().filter(|k| !after.contains_key(*k)).cloned());
    }
    let mut above: HashMap<Key, Option<String>> = HashMap::new();
    for key in &touched {
        above.insert(key.clone(), state_runs::id_at(tx.conn(), room, &key.0, &key.1, upper).await?);
    }
    let mut rows_before: HashMap<String, (Option<Range>, Option<Range>)> = HashMap::new();
    for (_, user) in touched.iter().filter(|(t, _)| t == "m.room.member") {
        let through = store::row_through(tx.conn(), room, user, lower).await?;
        let starting = store::row_starting(tx.conn(), room, user, upper).await?;
        rows_before.insert(user.clone(), (through, starting));
    }
    let upper_member = store::member_at(tx.conn(), room, upper).await?;

    backfill::insert_events(&mut tx, room, batch, &positions).await?;
    write_states(&mut tx, room, batch, &positions, &below, &touched, &above, upper).await?;
    for (user, (through, starting)) in &rows_before {
        let key = ("m.room.member".to_owned(), user.clone());
        let fill: Vec<(i64, String)> = batch
            .events
            .iter()
            .zip(&positions)
            .map(|(f, &p)| {
                let kind = f
                    .after
                    .get(&key)
                    .map_or_else(|| "leave".to_owned(), |id| backfill::membership_of(&batch.known, id));
                (p, kind)
            })
            .collect();
        let end = if upper_member.as_deref() == Some(user.as_str()) { upper } else { upper - 1 };
        if let Some((gone, new)) = rebuild_rows(through.as_ref(), starting.as_ref(), &fill, upper, end) {
            for row in &gone {
                store::delete_row(tx.conn(), room, user, row).await?;
            }
            for row in &new {
                store::put_row(tx.conn(), room, user, row).await?;
            }
        }
    }
    backfill::apply_redactions(state, &mut tx, room, rules, batch).await?;

    // The hole now lies below the batch, as far as the batch does not reach
    // the line.
    store::remove_gap(tx.conn(), room, upper).await?;
    let in_batch: BTreeSet<&str> = batch.events.iter().map(|f| f.pdu.event_id.as_str()).collect();
    let prevs: BTreeSet<&str> = batch
        .events
        .iter()
        .flat_map(|f| f.pdu.prev_events.iter().map(|id| id.as_str()))
        .filter(|id| !in_batch.contains(id))
        .collect();
    let prevs: Vec<&str> = prevs.into_iter().collect();
    let placed: BTreeSet<String> = outliers::held_by_ids_tx(tx.conn(), &prevs)
        .await?
        .into_iter()
        .filter(|h| h.seq.is_some())
        .map(|h| h.event_id)
        .collect();
    let still: Vec<&str> = prevs.into_iter().filter(|id| !placed.contains(*id)).collect();
    if !still.is_empty() {
        let lowest = batch.events[0].pdu.event_id.as_str();
        store::add_gap(tx.conn(), room, positions[0], lowest, &still).await?;
    }
    store::bump_read_epoch(tx.conn(), room).await?;
    tx.commit().await?;
    Ok(n)
}

/// The hole a page crosses, nearest to where it starts: one recorded at a
/// position the page reaches or passes (paging back, the page's lowest
/// event or below when it ends there; forwards, up to its highest), whose
/// events the reader may read (the position just below the event above it
/// is in their ranges). Answers its position and the events it lacks.
pub async fn crossed(
    db: &Db,
    room_id: &RoomId,
    access: &Access,
    page: &Page,
    from: i64,
    dir: Dir,
) -> Result<Option<(i64, Vec<String>)>> {
    let edge = if page.next.is_some() { page.events.last().map(|e| e.stored.seq) } else { None };
    let (lo, hi) = match dir {
        Dir::Backward => (edge.unwrap_or(position::NONE), from),
        Dir::Forward => (from.saturating_add(1), edge.unwrap_or(i64::MAX)),
    };
    let mut holes = store::gaps_between(db, room_id.as_str(), lo, hi).await?;
    if dir == Dir::Forward {
        holes.reverse();
    }
    Ok(holes.into_iter().find(|(upper, _)| access.ranges.contains(upper - 1)))
}

/// The state rows of the batch: at the lowest new position the keys where
/// its state differs from the line below the hole, at each other one the
/// keys that differ from the position below, and at `upper` every touched
/// key whose value there (`above`, read before) is not the batch's last.
#[allow(clippy::too_many_arguments)]
async fn write_states(
    tx: &mut storage::RoomTx,
    room: &str,
    batch: &Batch,
    positions: &[i64],
    below: &HashMap<Key, String>,
    touched: &BTreeSet<Key>,
    above: &HashMap<Key, Option<String>>,
    upper: i64,
) -> Result<()> {
    let mut previous: HashMap<&Key, Option<String>> =
        touched.iter().map(|k| (k, below.get(k).cloned())).collect();
    for (filled, &seq) in batch.events.iter().zip(positions) {
        for key in touched {
            let now = filled.after.get(key).map(|id| id.to_string());
            if previous.get(key) != Some(&now) {
                state_runs::record(tx.conn(), room, &key.0, &key.1, seq, now.as_deref()).await?;
                previous.insert(key, now);
            }
        }
    }
    for key in touched {
        let want = above.get(key).cloned().flatten();
        if previous.get(key) != Some(&want) {
            state_runs::record(tx.conn(), room, &key.0, &key.1, upper, want.as_deref()).await?;
        }
        events::register_key(tx.conn(), room, &key.0, &key.1, upper).await?;
    }
    Ok(())
}

/// Memberships that have rows.
fn has_row(kind: &str) -> bool {
    matches!(kind, "join" | "invite" | "knock")
}

/// A user's membership rows once a hole below `upper` is filled with
/// `fill` (each new position with the user's membership after it):
/// `through` is their row that went on past the position below the hole,
/// `starting` the one that started at `upper`, `end` where a row that the
/// event at `upper` ends stops (`upper` when that is the user's own member
/// event, else the position before it). Answers the rows to remove and
/// those to add, `None` when the batch changes nothing for them.
fn rebuild_rows(
    through: Option<&Range>,
    starting: Option<&Range>,
    fill: &[(i64, String)],
    upper: i64,
    end: i64,
) -> Option<(Vec<Range>, Vec<Range>)> {
    let mut current: Option<Range> = through.cloned();
    let mut new: Vec<Range> = Vec::new();
    let mut changed = false;
    for (p, kind) in fill {
        let same = match &current {
            Some(c) => c.kind == *kind,
            None => !has_row(kind),
        };
        if same {
            continue;
        }
        changed = true;
        if let Some(mut c) = current.take() {
            c.max_seq = Some(*p);
            new.push(c);
        }
        if has_row(kind) {
            current = Some(Range { kind: kind.clone(), min_seq: *p, max_seq: None, window_seq: *p });
        }
    }
    if !changed {
        return None;
    }
    let mut gone: Vec<Range> = through.cloned().into_iter().collect();
    // The row that went on past the event above the hole (it did not
    // change there).
    let went_on = through.filter(|r| r.max_seq.is_none_or(|m| m > upper));
    let mut resume = went_on;
    if let Some(mut c) = current {
        if let Some(next) = starting.filter(|r| r.kind == c.kind) {
            c.max_seq = next.max_seq;
            gone.push(next.clone());
        } else if let Some(on) = went_on.filter(|r| r.kind == c.kind) {
            c.max_seq = on.max_seq;
            resume = None;
        } else {
            c.max_seq = Some(end);
        }
        new.push(c);
    }
    if let Some(on) = resume {
        new.push(Range { kind: on.kind.clone(), min_seq: upper, max_seq: on.max_seq, window_seq: upper });
    }
    Some((gone, new))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: &str, min: i64, max: Option<i64>) -> Range {
        Range { kind: kind.into(), min_seq: min, max_seq: max, window_seq: min }
    }

    fn fill(kinds: &[(i64, &str)]) -> Vec<(i64, String)> {
        kinds.iter().map(|(p, k)| (*p, (*k).to_owned())).collect()
    }

    #[test]
    fn a_kick_in_the_hole_ends_the_stay_there() {
        // Joined from 10; the event above the hole (at 100) was placed with
        // the resolved state saying "left": the stay ended at 99.
        let stay = Range { window_seq: 5, ..row("join", 10, Some(99)) };
        let (gone, new) =
            rebuild_rows(Some(&stay), None, &fill(&[(50, "join"), (60, "leave"), (70, "leave")]), 100, 99)
                .unwrap();
        assert_eq!(gone, std::slice::from_ref(&stay));
        assert_eq!(new, [Range { max_seq: Some(60), ..stay }]);
    }

    #[test]
    fn a_stay_that_goes_on_past_the_hole_is_cut_where_the_batch_says_and_resumes_above_it() {
        let stay = row("join", 10, None);
        let (gone, new) = rebuild_rows(Some(&stay), None, &fill(&[(50, "leave")]), 100, 99).unwrap();
        assert_eq!(gone, [stay]);
        assert_eq!(new, [row("join", 10, Some(50)), row("join", 100, None)]);
    }

    #[test]
    fn a_join_in_the_hole_reaches_the_stay_that_started_above_it() {
        let above = row("join", 100, Some(300));
        let (gone, new) =
            rebuild_rows(None, Some(&above), &fill(&[(40, "invite"), (50, "join")]), 100, 99).unwrap();
        assert_eq!(gone, [above]);
        assert_eq!(new, [row("invite", 40, Some(50)), row("join", 50, Some(300))]);
    }

    #[test]
    fn a_stay_begun_and_ended_in_the_hole_gets_its_own_row() {
        let (gone, new) =
            rebuild_rows(None, None, &fill(&[(40, "join"), (50, "join"), (60, "leave")]), 100, 99).unwrap();
        assert!(gone.is_empty());
        assert_eq!(new, [row("join", 40, Some(60))]);
        // Still joined when the hole ends, and the event above it is their leave.
        let (_, new) = rebuild_rows(None, None, &fill(&[(40, "join")]), 100, 100).unwrap();
        assert_eq!(new, [row("join", 40, Some(100))]);
    }

    #[test]
    fn nothing_changes_when_the_batch_keeps_the_membership() {
        let stay = row("join", 10, None);
        assert_eq!(rebuild_rows(Some(&stay), None, &fill(&[(50, "join")]), 100, 99), None);
        assert_eq!(rebuild_rows(None, None, &fill(&[(50, "leave"), (60, "ban")]), 100, 99), None);
    }
}
