//! Server-side search (`POST /search`, category `room_events`): full-text
//! matches over the rooms a user is or was in, inside what they may read.
//!
//! The scope of a search is the caller's readable ranges ([`read::access`])
//! of every room they have a membership row in (not forgotten), narrowed by
//! the filter's rooms; the index query ([`search::page`]) matches and counts
//! only inside those ranges, so an event the caller may not read is never
//! returned, counted, highlighted or used as context (context is paged
//! through the same ranges, [`history::page`]). Each result is checked once
//! more against the ranges after loading.
//!
//! Paging: `next_batch` is an offset into the ordered matches with the stream
//! position the first page was cut at (later events stay out, so pages do not
//! shift), the order, and for a group's token the group it continues.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ruma::UserId;

use super::history::{self, Dir, EventFilter, PageRequest};
use super::read::{self, Access, Loaded, RoomView};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::memberships;
use crate::storage::search::{self, GroupColumn, Order, Query, SEARCHABLE};

/// The longest search term taken, in bytes.
pub const MAX_TERM_BYTES: usize = 1024;
/// The most words a search term may have (each one is a prefix lookup).
pub const MAX_WORDS: usize = 32;
/// Results per page when the filter sets no limit.
pub const DEFAULT_LIMIT: usize = 10;
/// The most results per page.
pub const MAX_LIMIT: usize = 100;
/// The most context events on either side of a result.
pub const MAX_CONTEXT: usize = 100;
/// The most highlight words returned.
const MAX_HIGHLIGHTS: usize = 50;

/// A group a token continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// Results of one room.
    Room(String),
    /// Results of one sender.
    Sender(String),
}

/// Where a page starts (the `next_batch` token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The order the token was made for.
    pub order: Order,
    /// Matches already returned.
    pub offset: i64,
    /// The stream position of the first page: nothing newer is matched.
    pub max_stream: i64,
    /// The group this token continues, if any.
    pub group: Option<Group>,
}

impl Batch {
    /// The opaque token: `<r|n><offset>_<max stream>[_<R|S><id>]`.
    pub fn token(&self) -> String {
        let order = match self.order {
            Order::Rank => 'r',
            Order::Recent => 'n',
        };
        let mut token = format!("{order}{}_{}", self.offset, self.max_stream);
        match &self.group {
            Some(Group::Room(id)) => token.push_str(&format!("_R{id}")),
            Some(Group::Sender(id)) => token.push_str(&format!("_S{id}")),
            None => {}
        }
        token
    }

    /// Parses a token; anything else is 400 M_INVALID_PARAM.
    pub fn parse(token: &str) -> Result<Self> {
        let bad = || Error::InvalidParam(format!("Invalid next_batch {token:?}"));
        let mut parts = token.splitn(3, '_');
        let head = parts.next().ok_or_else(bad)?;
        let order = match head.chars().next() {
            Some('r') => Order::Rank,
            Some('n') => Order::Recent,
            _ => return Err(bad()),
        };
        let number = |s: &str| s.parse::<i64>().ok().filter(|n| *n >= 0);
        let offset = number(&head[1..]).ok_or_else(bad)?;
        let max_stream = parts.next().and_then(number).ok_or_else(bad)?;
        let group = match parts.next() {
            None => None,
            Some(g) => match g.split_at_checked(1) {
                Some(("R", id)) if !id.is_empty() => Some(Group::Room(id.to_owned())),
                Some(("S", id)) if !id.is_empty() => Some(Group::Sender(id.to_owned())),
                _ => return Err(bad()),
            },
        };
        Ok(Self { order, offset, max_stream, group })
    }
}

/// What to search for.
#[derive(Debug, Clone)]
pub struct Request {
    /// The search term as sent.
    pub term: String,
    /// Event types searched (from the keys); the filter narrows them.
    pub types: Vec<&'static str>,
    /// The filter's senders, types and contains_url.
    pub filter: EventFilter,
    /// Only these rooms.
    pub rooms: Option<Vec<String>>,
    /// Never these rooms.
    pub not_rooms: Vec<String>,
    /// Result order.
    pub order: Order,
    /// Results per page.
    pub limit: usize,
    /// Where to start (`next_batch`).
    pub batch: Option<Batch>,
    /// Groupings asked for.
    pub groupings: Vec<GroupColumn>,
}

/// The event types of the spec's search keys (`content.body`, ...); an
/// unknown key is 400 M_INVALID_PARAM.
pub fn types_of_key(key: &str) -> Result<&'static str> {
    SEARCHABLE
        .iter()
        .find(|(_, field)| key.strip_prefix("content.") == Some(field))
        .map(|(kind, _)| *kind)
        .ok_or_else(|| Error::InvalidParam(format!("Unknown search key {key:?}")))
}

/// The words of a search term: runs of letters and digits, lowercased. A
/// term longer than [`MAX_TERM_BYTES`] or with more than [`MAX_WORDS`] words
/// is 400 M_INVALID_PARAM.
pub fn words(term: &str) -> Result<Vec<String>> {
    if term.len() > MAX_TERM_BYTES {
        return Err(Error::InvalidParam(format!(
            "search_term is {} bytes long, at most {MAX_TERM_BYTES} are allowed",
            term.len()
        )));
    }
    let mut words: Vec<String> = Vec::new();
    for word in term.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let word = word.to_lowercase();
        if !words.contains(&word) {
            words.push(word);
        }
    }
    if words.len() > MAX_WORDS {
        return Err(Error::InvalidParam(format!(
            "search_term has {} words, at most {MAX_WORDS} are allowed",
            words.len()
        )));
    }
    Ok(words)
}

/// A room searched, opened for reading.
#[derive(Debug, Clone)]
pub struct Readable {
    /// The room.
    pub view: RoomView,
    /// What the caller may read in it.
    pub access: Access,
}

/// One result.
#[derive(Debug, Clone)]
pub struct Found {
    /// The event.
    pub loaded: Loaded,
    /// Its rank.
    pub rank: f64,
}

/// A group of the page's results.
#[derive(Debug, Clone)]
pub struct GroupOut {
    /// Room id or sender.
    pub key: String,
    /// The page's results in it.
    pub results: Vec<String>,
    /// Its place among the page's groups (1 first).
    pub order: usize,
    /// Its next page, when it has more.
    pub next: Option<Batch>,
}

/// A page of results.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The results in order.
    pub results: Vec<Found>,
    /// Matches in all (within what the caller may read).
    pub count: i64,
    /// The next page, when this one was full.
    pub next: Option<Batch>,
    /// The rooms searched.
    pub rooms: HashMap<String, Readable>,
    /// Words to highlight: the term's and the matched words of the results.
    pub highlights: Vec<String>,
    /// Per grouping asked for, the groups of this page.
    pub groups: Vec<(GroupColumn, Vec<GroupOut>)>,
}

/// The rooms to search and the caller's readable spans in each.
async fn scope(
    state: &AppState,
    user_id: &UserId,
    req: &Request,
) -> Result<(HashMap<String, Readable>, Vec<(String, Vec<(i64, i64)>)>)> {
    let mut rooms = HashMap::new();
    let mut spans = Vec::new();
    let group_room = match req.batch.as_ref().and_then(|b| b.group.as_ref()) {
        Some(Group::Room(id)) => Some(id.as_str()),
        _ => None,
    };
    // Forgotten rooms are left out by the query.
    for (room_id, _) in memberships::rooms_joined_of(&state.db, user_id.as_str()).await? {
        if req.rooms.as_ref().is_some_and(|only| !only.contains(&room_id))
            || req.not_rooms.contains(&room_id)
            || group_room.is_some_and(|g| g != room_id)
        {
            continue;
        }
        let Ok(parsed) = ruma::RoomId::parse(&room_id) else { continue };
        let view = read::open(state, &parsed).await?;
        let access = read::access(state, &view, user_id).await?;
        if access.ranges.is_empty() {
            continue;
        }
        spans.push((room_id.clone(), access.ranges.0.clone()));
        rooms.insert(room_id, Readable { view, access });
    }
    Ok((rooms, spans))
}

/// Runs a search for `user_id`.
pub async fn run(state: &AppState, user_id: &UserId, req: &Request) -> Result<Outcome> {
    let words = words(&req.term)?;
    if let Some(b) = &req.batch
        && b.order != req.order
    {
        return Err(Error::InvalidParam("next_batch was made for another order_by".into()));
    }
    let types: Vec<&str> = req.types.iter().copied().filter(|t| req.filter.allows_type(t)).collect();
    let senders: Option<Vec<String>> = match req.batch.as_ref().and_then(|b| b.group.as_ref()) {
        Some(Group::Sender(s)) => Some(match &req.filter.senders {
            Some(list) if !list.contains(s) => Vec::new(),
            _ => vec![s.clone()],
        }),
        _ => req.filter.senders.clone(),
    };
    let (rooms, spans) = scope(state, user_id, req).await?;
    let max_stream = req.batch.as_ref().map_or_else(|| state.streams.position(), |b| b.max_stream);
    let offset = req.batch.as_ref().map_or(0, |b| b.offset);
    let limit = i64::try_from(req.limit).unwrap_or(10);
    let query = Query {
        words: &words,
        scope: &spans,
        types: &types,
        senders: senders.as_deref(),
        not_senders: &req.filter.not_senders,
        contains_url: req.filter.contains_url,
        max_stream,
    };
    let hits = search::page(&state.db, &query, req.order, offset, limit).await?;
    let count = search::count(&state.db, &query).await?;
    let full = hits.len() >= req.limit;
    let mut highlights: BTreeSet<String> = words.iter().cloned().collect();
    let mut results = Vec::with_capacity(hits.len());
    for hit in hits {
        let Some(room) = rooms.get(&hit.room_id) else { continue };
        let loaded = read::load_by_id(state, &hit.event_id).await?;
        // Once more against what the caller may read, after loading.
        if loaded.stored.room_id != hit.room_id
            || !room.access.ranges.contains(loaded.stored.seq)
            || loaded.stored.redacted_by.is_some()
        {
            continue;
        }
        for word in hit.body.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            let lower = word.to_lowercase();
            if highlights.len() < MAX_HIGHLIGHTS && words.iter().any(|w| lower.starts_with(w.as_str())) {
                highlights.insert(lower);
            }
        }
        results.push(Found { loaded, rank: hit.rank });
    }
    let next = full.then(|| Batch {
        order: req.order,
        offset: offset + limit,
        max_stream,
        group: req.batch.as_ref().and_then(|b| b.group.clone()),
    });
    let mut groups = Vec::new();
    for column in &req.groupings {
        let totals: HashMap<String, i64> =
            search::group_counts(&state.db, &query, *column, req.order, None).await?.into_iter().collect();
        let seen: HashMap<String, i64> =
            search::group_counts(&state.db, &query, *column, req.order, Some(offset + limit))
                .await?
                .into_iter()
                .collect();
        let mut out: Vec<GroupOut> = Vec::new();
        for found in &results {
            let key = match column {
                GroupColumn::Room => found.loaded.stored.room_id.clone(),
                GroupColumn::Sender => found.loaded.pdu.sender.to_string(),
            };
            let id = found.loaded.stored.event_id.clone();
            if let Some(g) = out.iter_mut().find(|g| g.key == key) {
                g.results.push(id);
                continue;
            }
            let (total, seen) =
                (totals.get(&key).copied().unwrap_or(0), seen.get(&key).copied().unwrap_or(0));
            let next = (total > seen).then(|| Batch {
                order: req.order,
                offset: seen,
                max_stream,
                group: Some(match column {
                    GroupColumn::Room => Group::Room(key.clone()),
                    GroupColumn::Sender => Group::Sender(key.clone()),
                }),
            });
            out.push(GroupOut { key, results: vec![id], order: out.len() + 1, next });
        }
        groups.push((*column, out));
    }
    Ok(Outcome { results, count, next, rooms, highlights: highlights.into_iter().collect(), groups })
}

/// The events around a result, inside the caller's readable ranges.
#[derive(Debug, Clone)]
pub struct Context {
    /// Older events, newest first.
    pub before: Vec<Loaded>,
    /// Newer events, oldest first.
    pub after: Vec<Loaded>,
    /// The token before the oldest.
    pub start: String,
    /// The token after the newest.
    pub end: String,
}

/// Up to `before`/`after` readable events around `found`.
pub async fn context(
    state: &AppState,
    room: &Readable,
    found: &Loaded,
    before: usize,
    after: usize,
) -> Result<Context> {
    let seq = found.stored.seq;
    let everything = EventFilter::default();
    let page = |from, dir, limit| PageRequest { from, to: None, dir, limit, filter: &everything };
    let before = if before > 0 {
        history::page(state, &room.view, &room.access, page(seq - 1, Dir::Backward, before)).await?.events
    } else {
        Vec::new()
    };
    let after = if after > 0 {
        history::page(state, &room.view, &room.access, page(seq, Dir::Forward, after)).await?.events
    } else {
        Vec::new()
    };
    let start = history::token(before.last().map_or(seq - 1, |e| e.stored.seq - 1));
    let end = history::token(after.last().map_or(seq, |e| e.stored.seq));
    Ok(Context { before, after, start, end })
}

/// The display name and avatar of each sender of `events` as of `seq` (their
/// member event in the state there), for `include_profile`.
pub async fn profiles(
    state: &AppState,
    room: &Readable,
    seq: i64,
    events: &[&Loaded],
) -> Result<BTreeMap<String, (Option<String>, Option<String>)>> {
    let mut out = BTreeMap::new();
    for e in events {
        let sender = e.pdu.sender.to_string();
        if out.contains_key(&sender) {
            continue;
        }
        let member = crate::storage::events::state_event_at(
            &state.db,
            room.view.room.room_id.as_str(),
            "m.room.member",
            &sender,
            seq,
        )
        .await?;
        let (name, avatar) = match member {
            Some(stored) if stored.redacted_by.is_none() => {
                let pdu = super::pdu::Pdu::from_stored(&stored.event_id, &stored.json)?;
                let content = pdu.content_as::<serde_json::Value>().unwrap_or_default();
                let text = |k: &str| content.get(k).and_then(|v| v.as_str()).map(str::to_owned);
                (text("displayname"), text("avatar_url"))
            }
            _ => (None, None),
        };
        out.insert(sender, (name, avatar));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_garbage() {
        let cases = [
            Batch { order: Order::Rank, offset: 10, max_stream: 99, group: None },
            Batch {
                order: Order::Recent,
                offset: 0,
                max_stream: 1,
                group: Some(Group::Room("!a_b:x".into())),
            },
            Batch {
                order: Order::Recent,
                offset: 7,
                max_stream: 5,
                group: Some(Group::Sender("@u_1:x".into())),
            },
        ];
        for b in cases {
            assert_eq!(Batch::parse(&b.token()).unwrap(), b);
        }
        for bad in ["", "r", "r1", "x1_2", "r-1_2", "r1_-2", "r1_2_", "r1_2_Q!a", "r1_2_R", "rx_2", "n1_y"] {
            assert!(Batch::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn words_split_and_bound() {
        assert_eq!(words("Hello, World!").unwrap(), vec!["hello", "world"]);
        assert_eq!(words("\"x\"* OR NEAR(a b)").unwrap(), vec!["x", "or", "near", "a", "b"]);
        assert!(words("!!!").unwrap().is_empty());
        assert_eq!(words("a b a").unwrap(), vec!["a", "b"]);
        let many: Vec<String> = (0..=MAX_WORDS).map(|i| format!("w{i}")).collect();
        assert!(words(&many.join(" ")).is_err());
        assert!(words(&many[..MAX_WORDS].join(" ")).is_ok());
        assert!(words(&"a".repeat(MAX_TERM_BYTES + 1)).is_err());
    }

    #[test]
    fn keys_name_types() {
        assert_eq!(types_of_key("content.body").unwrap(), "m.room.message");
        assert_eq!(types_of_key("content.name").unwrap(), "m.room.name");
        assert_eq!(types_of_key("content.topic").unwrap(), "m.room.topic");
        assert!(types_of_key("content.url").is_err());
        assert!(types_of_key("body").is_err());
    }
}
