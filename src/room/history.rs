//! Reading a room's history: `/messages` pages and `/context`, both walking
//! only the user's readable ranges of the seq line. Visibility is applied
//! before a page is cut, so a page holds up to `limit` readable events and a
//! user who can see little of a long room reaches its start in few requests.
//!
//! Tokens are positions on the room's seq line: `t<S>` is the point just after
//! seq S. Backwards from `t<S>` reads S, S-1, ...; forwards reads S+1, S+2, ...

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

    /// Whether the filter lets `loaded` through.
    pub fn allows(&self, loaded: &Loaded) -> bool {
        let kind = loaded.pdu.kind.to_string();
        let sender = loaded.pdu.sender.as_str();
        if self.not_types.iter().any(|p| type_matches(p, &kind)) {
            return false;
        }
        if let Some(types) = &self.types
            && !types.iter().any(|p| type_matches(p, &kind))
        {
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

/// Parses a `t<S>` token.
pub fn parse_token(token: &str) -> Result<i64> {
    token
        .strip_prefix('t')
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n >= 0)
        .ok_or_else(|| Error::InvalidParam(format!("Invalid pagination token {token:?}")))
}

/// Formats a position as a token.
pub fn token(seq: i64) -> String {
    format!("t{seq}")
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
            // each row read fills the page: read no more than it still needs.
            let needed = i64::try_from(limit - events.len()).unwrap_or(BATCH);
            let want = if filter.is_empty() { needed } else { BATCH.max(needed) }.min(MAX_SCAN - scanned);
            if want <= 0 {
                break 'spans;
            }
            let rows = events::range(&state.db, room_id, lo, hi, dir == Dir::Backward, want).await?;
            if rows.is_empty() {
                break;
            }
            for stored in rows {
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
                    if events.len() >= limit {
                        break 'spans;
                    }
                }
            }
        }
    }
    // More to read if any readable seq lies beyond the last one looked at,
    // and the page ends there: full, or the scan reached its bound.
    let cut = events.len() >= limit || scanned >= MAX_SCAN;
    let next = last_read.and_then(|seq| match dir {
        Dir::Backward => {
            let more =
                access.ranges.descending_from(seq - 1).next().is_some() && to.is_none_or(|t| seq - 1 > t);
            (more && cut).then_some(seq - 1)
        }
        Dir::Forward => {
            let more = access.ranges.ascending_from(seq + 1).next().is_some() && to.is_none_or(|t| seq < t);
            (more && cut).then_some(seq)
        }
    });
    Ok(Page { events, next })
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
    let mut out = Vec::new();
    for sender in senders {
        if let Some(stored) =
            events::state_event_at(&state.db, &view.room.room_id, "m.room.member", sender.as_str(), horizon)
                .await?
        {
            out.push(read::load(state, stored).await?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_garbage() {
        assert_eq!(parse_token(&token(42)).unwrap(), 42);
        for bad in ["", "t", "42", "t-1", "tx", "s5"] {
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
