//! Reading a room's history: `/messages` pages and `/context`, both walking
//! only the user's readable ranges of the seq line. Visibility is applied
//! before a page is cut, so a page holds up to `limit` readable events and a
//! user who can see little of a long room reaches its start in few requests.
//!
//! Tokens are positions on the room's seq line: `p<P>` is the point just after
//! position P. Backwards from `p<P>` reads the events at P and below, forwards
//! the events above P. Positions are sparse (`super::position`), so P need
//! not be an event's position: `p<P-1>` is the point just before the event
//! at P. Tokens of the dense line (`t<S>`, before migration 0020) are still
//! taken: S is mapped as the migration mapped seqs (`position::from_dense`),
//! so an old token names the same point after the migration as before.

use ruma::UserId;

use super::read::{self, Access, Loaded, RoomView};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;

/// Which way to page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Older events first.
    Backward,
    /// Newer events first.
    Forward,
}

/// An event filter (the spec's RoomEventFilter, the parts that select events).
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only these types (`*` wildcards allowed).
    pub types: Option<Vec<String>>,
    /// Never these types.
    pub not_types: Vec<String>,
    /// Only these senders.
    pub senders: Option<Vec<String>>,
    /// Never these senders.
    pub not_senders: Vec<String>,
    /// `Some(true)`: only events with a `url` in content; `Some(false)`: only without.
    pub contains_url: Option<bool>,
}

fn type_matches(pattern: &str, kind: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => kind.starts_with(prefix),
        None => pattern == kind,
    }
}

impl EventFilter {
    /// Lets every event through.
    pub fn is_empty(&self) -> bool {
        self.types.is_none()
            && self.not_types.is_empty()
            && self.senders.is_none()
            && self.not_senders.is_empty()
            && self.contains_url.is_none()
    }

    /// Whether the filter's types and not_types let events of type `kind` through.
    pub fn allows_type(&self, kind: &str) -> bool {
        !self.not_types.iter().any(|p| type_matches(p, kind))
            && self.types.as_ref().is_none_or(|types| types.iter().any(|p| type_matches(p, kind)))
    }

    /// Whether the filter lets `loaded` through.
    pub fn allows(&self, loaded: &Loaded) -> bool {
        let kind = loaded.pdu.kind.to_string();
        let sender = loaded.pdu.sender.as_str();
        if !self.allows_type(&kind) {
            return false;
        }
        if self.not_senders.iter().any(|s| s == sender) {
            return false;
        }
        if let Some(senders) = &self.senders
            && !senders.iter().any(|s| s == sender)
        {
            return false;
        }
        if let Some(want) = self.contains_url {
            let has = loaded.redaction.is_none()
                && loaded.pdu.content_as::<serde_json::Value>().is_some_and(|c| c.get("url").is_some());
            if has != want {
                return false;
            }
        }
        true
    }
}

/// Parses a pagination token: `p<position>`, or a dense-line `t<seq>` from
/// before the migration to sparse positions.
pub fn parse_token(token: &str) -> Result<i64> {
    let number = |n: &str| n.parse::<i64>().ok().filter(|n| *n >= 0);
    let position = match token.split_at_checked(1) {
        Some(("p", n)) => number(n),
        Some(("t", n)) => number(n).and_then(super::position::from_dense),
        _ => None,
    };
    position.ok_or_else(|| Error::InvalidParam(format!("Invalid pagination token {token:?}")))
}

/// Formats a position as a token.
pub fn token(seq: i64) -> String {
    format!("p{seq}")
}

/// One page of history.
#[derive(Debug, Clone)]
pub struct Page {
    /// Events in the order of the direction.
    pub events: Vec<Loaded>,
    /// Where the next page starts; `None` when there is nothing more to read.
    pub next: Option<i64>,
}

/// How many rows to read per query while filling a page through a filter.
const BATCH: i64 = 100;

/// The most rows one page reads. A filter that matches little (or nothing)
/// would otherwise walk the whole room in one request; past this many rows
/// the page ends where the scan stopped, with a token to go on from. It
/// equals the largest page `/messages` serves, so an unfiltered page is never
/// cut short, and a thousand rows is a few milliseconds of reading.
pub const MAX_SCAN: i64 = 1000;

/// The most entries a filter's list (types, not_types, senders, not_senders,
/// rooms, not_rooms) may hold: every event read is matched against each.
pub const MAX_FILTER_ENTRIES: usize = 100;

/// Refuses a filter list longer than [`MAX_FILTER_ENTRIES`] (400 M_BAD_JSON,
/// like any other filter this server will not take).
pub fn check_filter_list(name: &str, len: usize) -> Result<()> {
    if len > MAX_FILTER_ENTRIES {
        return Err(Error::BadJson(format!(
            "Invalid filter: {name} has {len} entries, at most {MAX_FILTER_ENTRIES} are allowed"
        )));
    }
    Ok(())
}

/// What page to read.
#[derive(Debug, Clone, Copy)]
pub struct PageRequest<'a> {
    /// Start position.
    pub from: i64,
    /// Stop position, if any.
    pub to: Option<i64>,
    /// Direction.
    pub dir: Dir,
    /// At most this many events.
    pub limit: usize,
    /// Which events count.
    pub filter: &'a EventFilter,
}

/// Up to `limit` readable events from `from` in `dir`, stopping at `to`,
/// reading at most [`MAX_SCAN`] rows: a page cut short by that bound has fewer
/// events (maybe none) and a `next` to continue from.
/// `from` and `to` come from client tokens and may be anything `i64` holds.
pub async fn page(state: &AppState, view: &RoomView, access: &Access, req: PageRequest<'_>) -> Result<Page> {
    let PageRequest { from, to, dir, limit, filter } = req;
    let room_id = view.room.room_id.as_str();
    let mut events = Vec::new();
    let mut last_read: Option<i64> = None;
    let mut scanned: i64 = 0;
    // Whether a row was read past the full page (so more lie beyond it).
    let mut read_past = false;
    let spans: Vec<(i64, i64)> = match dir {
        Dir::Backward => access.ranges.descending_from(from).filter(|r| to.is_none_or(|t| r.1 > t)).collect(),
        Dir::Forward => access
            .ranges
            .ascending_from(from.saturating_add(1))
            .filter(|r| to.is_none_or(|t| r.0 <= t))
            .collect(),
    };
    'spans: for (lo, hi) in spans {
        let (lo, hi) = match (dir, to) {
            (Dir::Backward, Some(t)) => (lo.max(t.saturating_add(1)), hi),
            (Dir::Forward, Some(t)) => (lo, hi.min(t)),
            _ => (lo, hi),
        };
        let (mut lo, mut hi) = (lo, hi);
        while lo <= hi {
            // Every seq in a readable span is readable, so without a filter
            // each row read fills the page: read no more than it still needs,
            // and one more, which tells whether the page ends the history
            // without another query.
            let needed = i64::try_from(limit - events.len()).unwrap_or(BATCH);
            let want = if filter.is_empty() { needed + 1 } else { BATCH.max(needed) }.min(MAX_SCAN - scanned);
            if want <= 0 {
                break 'spans;
            }
            let rows = events::range(&state.db, room_id, lo, hi, dir == Dir::Backward, want).await?;
            // Fewer rows than asked for: the span holds no more.
            let exhausted = i64::try_from(rows.len()).unwrap_or(i64::MAX) < want;
            if rows.is_empty() {
                break;
            }
            for stored in rows {
                if events.len() >= limit {
                    read_past = true;
                    break 'spans;
                }
                let seq = stored.seq;
                scanned += 1;
                last_read = Some(seq);
                match dir {
                    Dir::Backward => hi = seq - 1,
                    Dir::Forward => lo = seq + 1,
                }
                let loaded = read::load(state, stored).await?;
                if filter.allows(&loaded) {
                    events.push(loaded);
                }
            }
            if events.len() >= limit {
                // Full at the batch's last row: whether more lie beyond is
                // asked below.
                break 'spans;
            }
            if exhausted {
                break;
            }
        }
    }
    // More to read if a readable event lies beyond the last one looked at,
    // and the page ends there: full, or the scan reached its bound. A row
    // read past the full page is one (every seq in a span is readable);
    // else, positions being sparse, a readable span need not hold an event:
    // ask the table.
    let cut = events.len() >= limit || scanned >= MAX_SCAN;
    let next = match last_read {
        Some(seq) if cut && read_past => Some(match dir {
            Dir::Backward => seq - 1,
            Dir::Forward => seq,
        }),
        Some(seq) if cut => {
            let (beyond, next) = match dir {
                Dir::Backward => (seq - 1, seq - 1),
                Dir::Forward => (seq + 1, seq),
            };
            readable_event_beyond(state, room_id, access, dir, beyond, to).await?.then_some(next)
        }
        _ => None,
    };
    Ok(Page { events, next })
}

/// The most readable spans [`readable_event_beyond`] looks into; past them it
/// answers yes (the next page finds out), so a user whose readable ranges
/// are many small pieces costs a bounded number of seeks per page.
const MAX_SPANS_PROBED: usize = 16;

/// The user's readable spans from `from` (inclusive) on in `dir`, in that
/// order, cut at `to` (exclusive going backwards, inclusive going forwards,
/// as tokens mean).
pub fn readable_spans(access: &Access, dir: Dir, from: i64, to: Option<i64>) -> Vec<(i64, i64)> {
    match dir {
        Dir::Backward => access
            .ranges
            .descending_from(from)
            .map(|(lo, hi)| (to.map_or(lo, |t| lo.max(t.saturating_add(1))), hi))
            .filter(|(lo, hi)| lo <= hi)
            .collect(),
        Dir::Forward => access
            .ranges
            .ascending_from(from)
            .map(|(lo, hi)| (lo, to.map_or(hi, |t| hi.min(t))))
            .filter(|(lo, hi)| lo <= hi)
            .collect(),
    }
}

/// Whether an event the user may read lies at `from` or beyond it in `dir`
/// (not past `to`): one index seek per readable span.
async fn readable_event_beyond(
    state: &AppState,
    room_id: &str,
    access: &Access,
    dir: Dir,
    from: i64,
    to: Option<i64>,
) -> Result<bool> {
    for (i, (lo, hi)) in readable_spans(access, dir, from, to).into_iter().enumerate() {
        if i >= MAX_SPANS_PROBED {
            return Ok(true);
        }
        if !events::range(&state.db, room_id, lo, hi, dir == Dir::Backward, 1).await?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The member events (as of the user's state horizon) of the given senders,
/// for lazy-loading members alongside a page.
pub async fn members_for(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    senders: &[&UserId],
) -> Result<Vec<Loaded>> {
    let horizon = access.state_horizon(view.room.last_seq);
    let mut users: Vec<&str> = senders.iter().map(|s| s.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    let mut out = Vec::with_capacity(users.len());
    for stored in read::members_at(state, view, &users, horizon).await? {
        out.push(read::load(state, stored).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_garbage() {
        use crate::room::position::{ORIGIN, STEP};
        assert_eq!(parse_token(&token(42)).unwrap(), 42);
        assert_eq!(token(ORIGIN + STEP), "p4611686018428436480");
        assert_eq!(parse_token(&token(ORIGIN + STEP)).unwrap(), ORIGIN + STEP);
        // Dense-line tokens from before the migration name the same points.
        assert_eq!(parse_token("t0").unwrap(), 0);
        assert_eq!(parse_token("t1").unwrap(), ORIGIN);
        assert_eq!(parse_token("t5").unwrap(), ORIGIN + 4 * STEP);
        for bad in ["", "t", "p", "42", "t-1", "p-1", "tx", "s5", "t9223372036854775807", "q5", "é5"] {
            assert!(parse_token(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn type_patterns() {
        assert!(type_matches("m.room.*", "m.room.message"));
        assert!(type_matches("m.room.message", "m.room.message"));
        assert!(!type_matches("m.room.message", "m.room.member"));
        assert!(type_matches("*", "anything"));
    }
}
