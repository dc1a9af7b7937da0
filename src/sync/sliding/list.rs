//! The room lists of a sliding sync request (`../shared/SLIDING-SYNC.md`
//! §A.4): the user's rooms, filtered per list, sorted by their newest event
//! the user may see (newest first, then by room id), sliced by each list's
//! ranges. Every list reports `count`, the rooms its filters let through.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::request::{Body, Filters, RoomConfig};
use crate::storage::sliding::ListedRoom;

/// One room the user may see in a list: from this server's line, or a
/// pending invite or knock into a room on another server.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// The room as the list query read it.
    pub room: Cow<'a, ListedRoom>,
    /// For a room not on our line: the pending invite or knock's stripped
    /// state (the invite's own member event among it) and membership.
    pub remote: Option<(Value, String)>,
    /// Whether the lists show it (a room one left oneself shows only when
    /// the leave is news to the connection; a subscription still reaches
    /// it).
    pub listed: bool,
}

impl Candidate<'_> {
    /// `invite`, `knock`, `join`, or `None` (left, kicked, banned).
    pub fn membership(&self) -> Option<&str> {
        match &self.remote {
            Some((_, membership)) => Some(membership.as_str()),
            None => self.room.open.as_deref(),
        }
    }
}

/// What the user's account data says that the lists need.
#[derive(Debug, Default)]
pub struct Facts {
    /// Rooms named in `m.direct`.
    pub direct: HashSet<String>,
    /// Users in `m.ignored_user_list`.
    pub ignored: HashSet<String>,
    /// For a `spaces` filter: the rooms each space names as its children.
    pub children: HashMap<String, HashSet<String>>,
}

/// The rooms of `direct` (`m.direct` content: user id to room ids).
pub fn direct_rooms(content: Option<&str>) -> HashSet<String> {
    let value: Value = content.and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default();
    value
        .as_object()
        .map(|users| {
            users
                .values()
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a list's filters let `c` through.
fn passes(c: &Candidate<'_>, f: &Filters, facts: &Facts) -> bool {
    let room = &c.room;
    if f.is_dm.is_some_and(|want| want != facts.direct.contains(&room.room_id)) {
        return false;
    }
    if f.is_encrypted.is_some_and(|want| want != room.encrypted) {
        return false;
    }
    if f.is_invite.is_some_and(|want| want != (c.membership() == Some("invite"))) {
        return false;
    }
    if f.not_room_types.contains(&room.room_type) {
        return false;
    }
    if f.room_types.as_ref().is_some_and(|types| !types.contains(&room.room_type)) {
        return false;
    }
    if let Some(spaces) = &f.spaces {
        let child = spaces.iter().any(|s| facts.children.get(s).is_some_and(|c| c.contains(&room.room_id)));
        if !child {
            return false;
        }
    }
    true
}

/// What the lists and subscriptions select: each list's `count` and room
/// ids in order, and the config each selected room is sent with (several
/// lists and subscriptions merged), with the lists and subscription that
/// hold it (for the extensions' scoping).
#[derive(Debug, Default)]
pub struct Selection<'a> {
    /// Per list: how many rooms pass its filters, and the ids in its ranges.
    pub lists: BTreeMap<&'a str, (usize, Vec<&'a str>)>,
    /// The rooms to look at, with their merged configs.
    pub rooms: BTreeMap<&'a str, Arc<RoomConfig>>,
    /// Rooms by the lists that hold them: bit `i` for the `i`-th list of
    /// `lists` (at most [`super::request::MAX_LISTS`], under 128).
    pub in_lists: foldhash::HashMap<&'a str, u128>,
    /// Rooms subscribed to.
    pub subscribed: foldhash::HashSet<&'a str>,
}

/// Gives `room` `config`, merged with the one it has already.
fn add<'a>(rooms: &mut BTreeMap<&'a str, Arc<RoomConfig>>, room: &'a str, config: &Arc<RoomConfig>) {
    match rooms.get_mut(room) {
        None => {
            rooms.insert(room, config.clone());
        }
        Some(held) if **held == **config => {}
        Some(held) => {
            let mut merged = (**held).clone();
            merged.merge(config);
            *held = Arc::new(merged);
        }
    }
}

/// Sorts `candidates` as the lists show them: newest first (then by id).
pub fn sort(candidates: &mut [Candidate<'_>]) {
    candidates
        .sort_by(|a, b| b.room.stream.cmp(&a.room.stream).then_with(|| a.room.room_id.cmp(&b.room.room_id)));
}

/// Applies the request's lists and subscriptions to `candidates` (in
/// [`sort`]'s order); the answer borrows the ids from them.
pub fn select<'a>(body: &'a Body, candidates: &'a [Candidate<'_>], facts: &Facts) -> Selection<'a> {
    let mut out = Selection::default();
    for (name, list) in &body.lists {
        let passing: Vec<&'a Candidate<'_>> =
            candidates.iter().filter(|c| c.listed && passes(c, &list.filters, facts)).collect();
        let mut ids: Vec<&'a str> = Vec::new();
        // Ranges may overlap: a room is taken once (one range needs no look).
        let mut seen: foldhash::HashSet<&str> = foldhash::HashSet::default();
        for &(start, end) in &list.ranges {
            let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else { continue };
            if start >= passing.len() {
                continue;
            }
            for c in &passing[start..=end.min(passing.len() - 1)] {
                let id: &'a str = c.room.room_id.as_str();
                if list.ranges.len() == 1 || seen.insert(id) {
                    ids.push(id);
                }
            }
        }
        // Rooms of one list share its config; one in several gets them merged.
        let config = Arc::new(list.config.clone());
        if out.rooms.is_empty() {
            // The first list: its rooms all at once, sorted then built.
            out.rooms = ids.iter().map(|id| (*id, config.clone())).collect();
        } else {
            for id in &ids {
                add(&mut out.rooms, id, &config);
            }
        }
        let bit = 1_u128 << out.lists.len().min(127);
        for id in &ids {
            *out.in_lists.entry(*id).or_default() |= bit;
        }
        out.lists.insert(name.as_str(), (passing.len(), ids));
    }
    if body.room_subscriptions.is_empty() {
        return out;
    }
    let known: foldhash::HashSet<&str> = candidates.iter().map(|c| c.room.room_id.as_str()).collect();
    for (room, config) in &body.room_subscriptions {
        // Rooms the user has no membership of (or that do not exist) are
        // left out without a word.
        if known.contains(room.as_str()) {
            add(&mut out.rooms, room.as_str(), &Arc::new(config.clone()));
            out.subscribed.insert(room.as_str());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::sliding::request::{self, List};

    fn room(id: &str, stream: i64, open: Option<&str>) -> Candidate<'static> {
        Candidate {
            room: Cow::Owned(ListedRoom {
                room_id: id.into(),
                open: open.map(str::to_owned),
                horizon: stream,
                stream,
                sender: String::new(),
                room_type: None,
                encrypted: false,
                name: None,
                avatar: None,
            }),
            remote: None,
            listed: true,
        }
    }

    fn list(ranges: Vec<(u64, u64)>, filters: Filters) -> List {
        List { ranges, config: RoomConfig { timeline_limit: 1, required_state: Vec::new() }, filters }
    }

    #[test]
    fn lists_sort_filter_count_and_slice() {
        let mut rooms = vec![
            room("!a", 5, Some("join")),
            room("!b", 9, Some("invite")),
            room("!c", 7, Some("join")),
            room("!d", 7, Some("join")),
        ];
        rooms[2].room.to_mut().encrypted = true;
        let body = request::Body {
            lists: BTreeMap::from([
                ("all".to_owned(), list(vec![(0, 1)], Filters::default())),
                (
                    "invites".to_owned(),
                    list(vec![(0, 9)], Filters { is_invite: Some(true), ..Filters::default() }),
                ),
                (
                    "plain".to_owned(),
                    list(vec![(1, 5)], Filters { is_encrypted: Some(false), ..Filters::default() }),
                ),
                // Overlapping ranges: each room once, in the ranges' order.
                ("twice".to_owned(), list(vec![(1, 2), (0, 1)], Filters::default())),
            ]),
            ..request::Body::default()
        };
        sort(&mut rooms);
        let got = select(&body, &rooms, &Facts::default());
        // Newest first; a tie goes by room id.
        assert_eq!(got.lists["all"], (4, vec!["!b", "!c"]));
        assert_eq!(got.lists["invites"], (1, vec!["!b"]));
        assert_eq!(got.lists["plain"], (3, vec!["!d", "!a"]));
        assert_eq!(got.lists["twice"], (4, vec!["!c", "!d", "!b"]));
        assert_eq!(got.rooms.len(), 4);
        assert_eq!(got.in_lists["!b"], 0b1011, "in the lists \"all\", \"invites\" and \"twice\"");
    }

    #[test]
    fn subscriptions_name_only_rooms_of_the_user() {
        let rooms = vec![room("!a", 5, Some("join"))];
        let config = RoomConfig { timeline_limit: 20, required_state: Vec::new() };
        let body = request::Body {
            room_subscriptions: BTreeMap::from([
                ("!a".to_owned(), config.clone()),
                ("!x".to_owned(), config),
            ]),
            ..request::Body::default()
        };
        let got = select(&body, &rooms, &Facts::default());
        assert_eq!(got.rooms.keys().copied().collect::<Vec<_>>(), vec!["!a"]);
        assert_eq!(got.rooms["!a"].timeline_limit, 20);
    }

    #[test]
    fn direct_rooms_are_read_from_m_direct() {
        let got = direct_rooms(Some(r#"{"@a:x":["!1","!2"],"@b:x":["!3"],"@c:x":"junk"}"#));
        assert_eq!(got.len(), 3);
        assert!(got.contains("!3"));
        assert!(direct_rooms(Some("not json")).is_empty());
    }
}
