//! The body of a simplified sliding sync request (MSC4186 as clients speak
//! it today: `../shared/SLIDING-SYNC.md` §A.0, A.2), read into bounded
//! types. Both spellings a client may use are taken (`ranges` and `range`,
//! `is_invite` and `is_invited`, `pos`/`timeout` in the body as well as in
//! the query); unknown fields are ignored. Anything over a bound is a 400
//! `M_INVALID_PARAM` before any work is done.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Most lists in one request.
pub const MAX_LISTS: usize = 100;
/// Longest list name, in bytes.
pub const MAX_LIST_NAME: usize = 64;
/// Most ranges in one list.
pub const MAX_RANGES: usize = 20;
/// Most `required_state` entries in one list or subscription.
pub const MAX_REQUIRED_STATE: usize = 100;
/// Most room subscriptions in one request.
pub const MAX_SUBSCRIPTIONS: usize = 500;
/// Largest `timeline_limit` taken (a larger one is cut to it).
pub const MAX_TIMELINE_LIMIT: u64 = 1000;
/// Longest `conn_id`, in bytes.
pub const MAX_CONN_ID: usize = 64;
/// Most room types in a filter.
pub const MAX_ROOM_TYPES: usize = 50;

/// A request's body, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Body {
    /// The connection, per device (`""` when none is named).
    pub conn_id: String,
    /// Echoed back.
    pub txn_id: Option<String>,
    /// `pos` given in the body (the query's wins).
    pub pos: Option<String>,
    /// `timeout` given in the body, in ms (the query's wins).
    pub timeout: Option<u64>,
    /// Lists by name.
    pub lists: BTreeMap<String, List>,
    /// Rooms asked for by id, whatever the lists hold.
    pub room_subscriptions: BTreeMap<String, RoomConfig>,
    /// Extensions by name, as sent (each read by its own module).
    pub extensions: BTreeMap<String, Value>,
}

/// One list: which slice of the user's sorted, filtered rooms, and what to
/// send of each room in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct List {
    /// Inclusive index ranges, each `(start, end)` with `start <= end`.
    pub ranges: Vec<(u64, u64)>,
    /// What to send of each room.
    pub config: RoomConfig,
    /// Which rooms the list holds.
    pub filters: Filters,
}

/// What to send of a room: its newest events and some of its state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomConfig {
    /// Newest events per room (at most [`MAX_TIMELINE_LIMIT`]).
    pub timeline_limit: u64,
    /// `(type, state key)` pairs; `*`, `$ME` and `$LAZY` as the study says.
    pub required_state: Vec<(String, String)>,
}

impl RoomConfig {
    /// The config of a room several lists or subscriptions hold: the
    /// largest timeline, the union of the state.
    pub fn merge(&mut self, other: &RoomConfig) {
        self.timeline_limit = self.timeline_limit.max(other.timeline_limit);
        for pair in &other.required_state {
            if !self.required_state.contains(pair) {
                self.required_state.push(pair.clone());
            }
        }
    }
}

/// A list's filters; `None` is "either way".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    pub is_dm: Option<bool>,
    pub is_encrypted: Option<bool>,
    pub is_invite: Option<bool>,
    /// `m.room.create`'s `content.type` among these (`None`: no type).
    pub room_types: Option<Vec<Option<String>>>,
    /// Not among these (wins over `room_types`).
    pub not_room_types: Vec<Option<String>>,
    /// A direct child of one of these spaces.
    pub spaces: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawBody {
    conn_id: Option<String>,
    txn_id: Option<String>,
    pos: Option<String>,
    timeout: Option<u64>,
    #[serde(default)]
    lists: BTreeMap<String, RawList>,
    #[serde(default)]
    room_subscriptions: BTreeMap<String, RawConfig>,
    #[serde(default)]
    extensions: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
struct RawList {
    ranges: Option<Vec<(u64, u64)>>,
    range: Option<(u64, u64)>,
    #[serde(flatten)]
    config: RawConfig,
    #[serde(default)]
    filters: RawFilters,
}

#[derive(Deserialize, Default)]
struct RawConfig {
    timeline_limit: Option<u64>,
    #[serde(default)]
    required_state: Vec<(String, String)>,
}

#[derive(Deserialize, Default)]
struct RawFilters {
    is_dm: Option<bool>,
    is_encrypted: Option<bool>,
    is_invite: Option<bool>,
    is_invited: Option<bool>,
    room_types: Option<Vec<Option<String>>>,
    #[serde(default)]
    not_room_types: Vec<Option<String>>,
    spaces: Option<Vec<String>>,
}

fn invalid(why: String) -> Error {
    Error::InvalidParam(why)
}

fn config(raw: RawConfig, whose: &str) -> Result<RoomConfig> {
    if raw.required_state.len() > MAX_REQUIRED_STATE {
        return Err(invalid(format!("{whose}: more than {MAX_REQUIRED_STATE} required_state entries")));
    }
    Ok(RoomConfig {
        timeline_limit: raw.timeline_limit.unwrap_or(0).min(MAX_TIMELINE_LIMIT),
        required_state: raw.required_state,
    })
}

/// Reads and checks a request body (an empty body is an empty request).
pub fn parse(bytes: &[u8]) -> Result<Body> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Body::default());
    }
    let raw: RawBody = serde_json::from_slice(bytes).map_err(|e| Error::BadJson(e.to_string()))?;
    let conn_id = raw.conn_id.unwrap_or_default();
    if conn_id.len() > MAX_CONN_ID {
        return Err(invalid(format!("conn_id is longer than {MAX_CONN_ID} bytes")));
    }
    if raw.lists.len() > MAX_LISTS {
        return Err(invalid(format!("more than {MAX_LISTS} lists")));
    }
    if raw.room_subscriptions.len() > MAX_SUBSCRIPTIONS {
        return Err(invalid(format!("more than {MAX_SUBSCRIPTIONS} room subscriptions")));
    }
    let mut lists = BTreeMap::new();
    for (name, list) in raw.lists {
        if name.len() > MAX_LIST_NAME {
            return Err(invalid(format!("a list name is longer than {MAX_LIST_NAME} bytes")));
        }
        let ranges = list.ranges.or(list.range.map(|r| vec![r])).unwrap_or_default();
        if ranges.len() > MAX_RANGES {
            return Err(invalid(format!("list {name:?}: more than {MAX_RANGES} ranges")));
        }
        if let Some((start, end)) = ranges.iter().find(|(start, end)| start > end) {
            return Err(invalid(format!("list {name:?}: range [{start}, {end}] ends before it starts")));
        }
        let f = list.filters;
        let types = f.room_types.as_ref().map_or(0, Vec::len) + f.not_room_types.len();
        if types > MAX_ROOM_TYPES || f.spaces.as_ref().is_some_and(|s| s.len() > MAX_ROOM_TYPES) {
            return Err(invalid(format!("list {name:?}: too many room types or spaces in its filters")));
        }
        let filters = Filters {
            is_dm: f.is_dm,
            is_encrypted: f.is_encrypted,
            is_invite: f.is_invite.or(f.is_invited),
            room_types: f.room_types,
            not_room_types: f.not_room_types,
            spaces: f.spaces,
        };
        let config = config(list.config, &format!("list {name:?}"))?;
        lists.insert(name, List { ranges, config, filters });
    }
    let mut room_subscriptions = BTreeMap::new();
    for (room, raw) in raw.room_subscriptions {
        let config = config(raw, &format!("subscription {room:?}"))?;
        room_subscriptions.insert(room, config);
    }
    Ok(Body {
        conn_id,
        txn_id: raw.txn_id,
        pos: raw.pos,
        timeout: raw.timeout,
        lists,
        room_subscriptions,
        extensions: raw.extensions,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(v: Value) -> Result<Body> {
        parse(v.to_string().as_bytes())
    }

    #[test]
    fn element_x_room_list_request_is_read() {
        let got = body(json!({
            "conn_id": "room-list",
            "lists": { "all_rooms": {
                "ranges": [[0, 19]], "timeline_limit": 1,
                "required_state": [["m.room.name", ""], ["m.room.member", "$LAZY"], ["m.room.member", "$ME"]],
                "filters": {},
            } },
            "room_subscriptions": { "!a:x": { "timeline_limit": 20, "required_state": [["*", "*"]] } },
            "extensions": { "receipts": { "enabled": true, "rooms": ["*"] } },
        }))
        .unwrap();
        assert_eq!(got.conn_id, "room-list");
        let list = &got.lists["all_rooms"];
        assert_eq!(list.ranges, [(0, 19)]);
        assert_eq!(list.config.timeline_limit, 1);
        assert_eq!(list.config.required_state[2], ("m.room.member".to_owned(), "$ME".to_owned()));
        assert_eq!(list.filters, Filters::default());
        assert_eq!(got.room_subscriptions["!a:x"].timeline_limit, 20);
        assert_eq!(got.extensions["receipts"]["enabled"], true);
    }

    #[test]
    fn both_spellings_are_taken() {
        let got = body(json!({
            "pos": "p", "timeout": 5,
            "lists": { "l": { "range": [2, 5], "filters": { "is_invited": true } } },
        }))
        .unwrap();
        assert_eq!((got.pos.as_deref(), got.timeout), (Some("p"), Some(5)));
        assert_eq!(got.lists["l"].ranges, [(2, 5)]);
        assert_eq!(got.lists["l"].filters.is_invite, Some(true));
        assert_eq!(parse(b"").unwrap(), Body::default());
    }

    #[test]
    fn bounds_are_kept() {
        let lists: serde_json::Map<String, Value> =
            (0..=MAX_LISTS).map(|i| (format!("l{i}"), json!({ "ranges": [] }))).collect();
        assert!(matches!(body(json!({ "lists": lists })), Err(Error::InvalidParam(_))));
        let long = "x".repeat(MAX_LIST_NAME + 1);
        assert!(matches!(body(json!({ "lists": { long: {} } })), Err(Error::InvalidParam(_))));
        let backwards = json!({ "lists": { "l": { "ranges": [[5, 2]] } } });
        assert!(matches!(body(backwards), Err(Error::InvalidParam(_))));
        let state: Vec<Value> = (0..=MAX_REQUIRED_STATE).map(|i| json!(["t", i.to_string()])).collect();
        let too_much = json!({ "room_subscriptions": { "!a:x": { "required_state": state } } });
        assert!(matches!(body(too_much), Err(Error::InvalidParam(_))));
        let huge =
            body(json!({ "lists": { "l": { "ranges": [[0, 0]], "timeline_limit": 1_000_000 } } })).unwrap();
        assert_eq!(huge.lists["l"].config.timeline_limit, MAX_TIMELINE_LIMIT);
        assert!(matches!(parse(b"{\"lists\": 3}"), Err(Error::BadJson(_))));
        assert!(matches!(body(json!({ "conn_id": "c".repeat(65) })), Err(Error::InvalidParam(_))));
    }

    #[test]
    fn configs_merge_by_the_largest_timeline_and_the_union_of_state() {
        let mut a = RoomConfig { timeline_limit: 1, required_state: vec![("a".into(), "".into())] };
        let b = RoomConfig {
            timeline_limit: 20,
            required_state: vec![("a".into(), "".into()), ("b".into(), "*".into())],
        };
        a.merge(&b);
        assert_eq!(a.timeline_limit, 20);
        assert_eq!(a.required_state, [("a".into(), "".into()), ("b".into(), "*".into())]);
    }
}
