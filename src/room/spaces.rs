//! Space hierarchies (`GET /v1/rooms/{roomId}/hierarchy`): the rooms a
//! space links to through its `m.space.child` state, depth first from the
//! space, children ordered as the spec says (`order`, then the link's
//! timestamp, then the room id), each room once.
//!
//! A room is listed only if the caller may see it: they are joined or
//! invited, or its join rule is public or knock, or a restricted rule
//! allows a room they are joined to, or its history is world-readable; the
//! space asked for must be visible itself (else 403). The children of a room
//! that is no space (`room_type` `m.space`), or that the caller may not see,
//! are not walked. Only rooms this server has are listed (asking other
//! servers for theirs is left for later).

use std::collections::HashSet;

use ruma::RoomId;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{events, rooms};

/// The default and the largest page.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// The deepest walk.
const MAX_DEPTH: usize = 100;

/// Rooms visited per request at most (a page past it ends early).
const MAX_VISITS: usize = 10_000;

/// What to list.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// The space.
    pub root: &'a RoomId,
    /// Only children marked `suggested`.
    pub suggested_only: bool,
    /// How deep to walk (the space is depth 0).
    pub max_depth: Option<usize>,
    /// Rooms per page.
    pub limit: Option<usize>,
    /// A `next_batch` of an earlier page.
    pub from: Option<&'a str>,
}

/// A page token: how many rooms came before, and the walk's parameters
/// (a token is refused with other ones).
fn token(offset: usize, q: &Query<'_>, max_depth: usize) -> String {
    format!("h{offset}_{max_depth}_{}", u8::from(q.suggested_only))
}

fn parse_token(token: &str, q: &Query<'_>, max_depth: usize) -> Result<usize> {
    let bad = || Error::InvalidParam(format!("Invalid pagination token {token:?}"));
    let rest = token.strip_prefix('h').ok_or_else(bad)?;
    let (offset, params) = rest.split_once('_').ok_or_else(bad)?;
    let offset: usize = offset.parse().map_err(|_| bad())?;
    if params != format!("{max_depth}_{}", u8::from(q.suggested_only)) {
        return Err(Error::InvalidParam("The token was made with other parameters".into()));
    }
    Ok(offset)
}

/// One child link: the child's id and the stripped link event.
struct Link {
    child: String,
    order: Option<String>,
    ts: i64,
    stripped: Value,
    suggested: bool,
}

/// The room's valid child links, in the spec's order.
async fn links(state: &AppState, room_id: &str) -> Result<Vec<Link>> {
    let mut out = Vec::new();
    for stored in events::current_state_of_type(&state.db, room_id, "m.space.child").await? {
        let pdu: Value = serde_json::from_str(&stored.json).unwrap_or_default();
        let content = &pdu["content"];
        // A link without servers to reach the child through is no link.
        if content["via"].as_array().is_none_or(|v| v.is_empty()) {
            continue;
        }
        let Some(child) = pdu["state_key"].as_str().filter(|k| RoomId::parse(*k).is_ok()) else { continue };
        let order = content["order"]
            .as_str()
            .filter(|o| o.len() <= 50 && o.chars().all(|c| ('\x20'..='\x7e').contains(&c)))
            .map(str::to_owned);
        out.push(Link {
            child: child.to_owned(),
            order,
            ts: pdu["origin_server_ts"].as_i64().unwrap_or(0),
            suggested: content["suggested"].as_bool() == Some(true),
            stripped: json!({
                "type": "m.space.child",
                "state_key": child,
                "content": content,
                "sender": pdu["sender"],
                "origin_server_ts": pdu["origin_server_ts"],
            }),
        });
    }
    // Ordered links first (by order), then the rest; then the link's age, then the id.
    out.sort_by(|a, b| {
        (a.order.is_none(), &a.order, a.ts, &a.child).cmp(&(b.order.is_none(), &b.order, b.ts, &b.child))
    });
    Ok(out)
}

/// The room's `allow` list of room ids (restricted join rules).
fn allowed_rooms(join_rules: &Value) -> Vec<String> {
    join_rules["content"]["allow"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "m.room_membership")
        .filter_map(|a| a["room_id"].as_str().map(str::to_owned))
        .collect()
}

/// Whether `user` may see `room_id` in a hierarchy, and the room's join
/// rules event (for `allowed_room_ids`).
async fn visible(state: &AppState, user: &str, room_id: &str) -> Result<(bool, Value)> {
    let join_rules: Value = match events::state_event(&state.db, room_id, "m.room.join_rules", "").await? {
        Some(stored) => serde_json::from_str(&stored.json).unwrap_or_default(),
        None => Value::Null,
    };
    if matches!(
        events::current_membership(&state.db, room_id, user).await?.as_deref(),
        Some("join" | "invite")
    ) {
        return Ok((true, join_rules));
    }
    let rule = join_rules["content"]["join_rule"].as_str().unwrap_or("invite");
    if matches!(rule, "public" | "knock") {
        return Ok((true, join_rules));
    }
    if matches!(rule, "restricted" | "knock_restricted") {
        for allowed in allowed_rooms(&join_rules) {
            if events::current_membership(&state.db, &allowed, user).await?.as_deref() == Some("join") {
                return Ok((true, join_rules));
            }
        }
        if rule == "knock_restricted" {
            return Ok((true, join_rules));
        }
    }
    let world_readable = events::state_event(&state.db, room_id, "m.room.history_visibility", "")
        .await?
        .and_then(|s| serde_json::from_str::<Value>(&s.json).ok())
        .is_some_and(|e| e["content"]["history_visibility"] == "world_readable");
    Ok((world_readable, join_rules))
}

/// One room as a hierarchy lists it.
async fn room_chunk(
    state: &AppState,
    room_id: &str,
    join_rules: &Value,
    children: Vec<Value>,
) -> Result<Value> {
    let summary = rooms::summary(&state.db, room_id).await?;
    let mut chunk = match summary {
        Some(s) => super::directory::chunk(s),
        None => {
            json!({ "room_id": room_id, "num_joined_members": 0, "world_readable": false, "guest_can_join": false })
        }
    };
    chunk["children_state"] = Value::Array(children);
    if let Some(room) = rooms::get(&state.db, room_id).await? {
        chunk["room_version"] = json!(room.room_version);
    }
    if matches!(chunk["join_rule"].as_str(), Some("restricted" | "knock_restricted")) {
        chunk["allowed_room_ids"] = json!(allowed_rooms(join_rules));
    }
    if let Some(stored) = events::state_event(&state.db, room_id, "m.room.encryption", "").await?
        && let Ok(event) = serde_json::from_str::<Value>(&stored.json)
        && let Some(algorithm) = event["content"]["algorithm"].as_str()
    {
        chunk["encryption"] = json!(algorithm);
    }
    Ok(chunk)
}

/// A page of the space's hierarchy as `user` may see it.
pub async fn hierarchy(state: &AppState, user: &str, q: Query<'_>) -> Result<Value> {
    let max_depth = q.max_depth.unwrap_or(MAX_DEPTH).min(MAX_DEPTH);
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let offset = match q.from {
        Some(t) => parse_token(t, &q, max_depth)?,
        None => 0,
    };
    let root = q.root.as_str();
    if rooms::get(&state.db, root).await?.is_none() || !visible(state, user, root).await?.0 {
        return Err(Error::Forbidden("You may not view this space".into()));
    }

    // Depth first: a stack of (room, depth), children pushed in reverse.
    let mut stack: Vec<(String, usize)> = vec![(root.to_owned(), 0)];
    let mut seen: HashSet<String> = HashSet::new();
    let mut listed = 0usize;
    let mut page = Vec::new();
    let mut visits = 0usize;
    while let Some((room_id, depth)) = stack.pop() {
        visits += 1;
        if visits > MAX_VISITS || page.len() >= limit {
            stack.push((room_id, depth));
            break;
        }
        if !seen.insert(room_id.clone()) || rooms::get(&state.db, &room_id).await?.is_none() {
            continue;
        }
        let (may_see, join_rules) = visible(state, user, &room_id).await?;
        if !may_see {
            continue;
        }
        let is_space = rooms::summary(&state.db, &room_id)
            .await?
            .is_some_and(|s| s.room_type.as_deref() == Some("m.space"));
        let links = if is_space { links(state, &room_id).await? } else { Vec::new() };
        let links: Vec<Link> = links.into_iter().filter(|l| !q.suggested_only || l.suggested).collect();
        if depth < max_depth {
            for link in links.iter().rev() {
                if !seen.contains(&link.child) {
                    stack.push((link.child.clone(), depth + 1));
                }
            }
        }
        if listed >= offset {
            let children = links.into_iter().map(|l| l.stripped).collect();
            page.push(room_chunk(state, &room_id, &join_rules, children).await?);
        }
        listed += 1;
    }
    let mut body = json!({ "rooms": page });
    // More to list while the stack holds a room not listed yet.
    if stack.iter().any(|(r, _)| !seen.contains(r)) {
        body["next_batch"] =
            json!(token(offset + body["rooms"].as_array().map_or(0, Vec::len), &q, max_depth));
    }
    Ok(body)
}
