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
//! are not walked. Rooms this server does not have are asked of the servers
//! their link names (`/_matrix/federation/v1/hierarchy`), whose answers are
//! held to the same rules for the user; [`for_server`] answers other
//! servers' questions by the server's own view (open rooms, and those its
//! users are in or, restricted, allowed through).

use std::collections::{HashMap, HashSet};

use ruma::api::federation::space::get_hierarchy;
use ruma::{RoomId, ServerName};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{events, federation, rooms};

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

/// One child link: the child's id, the servers to reach it through and the
/// stripped link event.
struct Link {
    child: String,
    via: Vec<String>,
    order: Option<String>,
    ts: i64,
    stripped: Value,
    suggested: bool,
}

/// A link from an `m.space.child` event (stored, or stripped in another
/// server's answer): none without a valid room id as its state key or
/// without servers to reach the child through.
fn link(event: &Value) -> Option<Link> {
    let content = &event["content"];
    let via: Vec<String> =
        content["via"].as_array()?.iter().filter_map(Value::as_str).map(str::to_owned).collect();
    if via.is_empty() || event["type"] != "m.space.child" {
        return None;
    }
    let child = event["state_key"].as_str().filter(|k| RoomId::parse(*k).is_ok())?;
    let order = content["order"]
        .as_str()
        .filter(|o| o.len() <= 50 && o.chars().all(|c| ('\x20'..='\x7e').contains(&c)))
        .map(str::to_owned);
    Some(Link {
        child: child.to_owned(),
        via,
        order,
        ts: event["origin_server_ts"].as_i64().unwrap_or(0),
        suggested: content["suggested"].as_bool() == Some(true),
        stripped: json!({
            "type": "m.space.child",
            "state_key": child,
            "content": content,
            "sender": event["sender"],
            "origin_server_ts": event["origin_server_ts"],
        }),
    })
}

/// Links in the spec's order: ordered links first (by order), then the
/// rest; then the link's age, then the id. With `suggested_only`, only those.
fn ordered(mut links: Vec<Link>, suggested_only: bool) -> Vec<Link> {
    links.retain(|l| !suggested_only || l.suggested);
    links.sort_by(|a, b| {
        (a.order.is_none(), &a.order, a.ts, &a.child).cmp(&(b.order.is_none(), &b.order, b.ts, &b.child))
    });
    links
}

/// The local room's valid child links, in the spec's order.
async fn links(state: &AppState, room_id: &str, suggested_only: bool) -> Result<Vec<Link>> {
    let stored = events::current_state_of_type(&state.db, room_id, "m.space.child").await?;
    let links = stored
        .iter()
        .filter_map(|s| serde_json::from_str::<Value>(&s.json).ok())
        .filter_map(|e| link(&e))
        .collect();
    Ok(ordered(links, suggested_only))
}

/// The rooms a local space names as its children (valid `m.space.child`
/// links, with servers to reach them), in the spec's order.
pub async fn children(state: &AppState, space_id: &str) -> Result<Vec<String>> {
    Ok(links(state, space_id, false).await?.into_iter().map(|l| l.child).collect())
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

/// A local room's join rules event and whether its history is world-readable.
async fn openness(state: &AppState, room_id: &str) -> Result<(Value, bool)> {
    let join_rules: Value = match events::state_event(&state.db, room_id, "m.room.join_rules", "").await? {
        Some(stored) => serde_json::from_str(&stored.json).unwrap_or_default(),
        None => Value::Null,
    };
    let world_readable = events::state_event(&state.db, room_id, "m.room.history_visibility", "")
        .await?
        .and_then(|s| serde_json::from_str::<Value>(&s.json).ok())
        .is_some_and(|e| e["content"]["history_visibility"] == "world_readable");
    Ok((join_rules, world_readable))
}

/// Whether a join rule lets anyone see the room in a hierarchy.
fn open_rule(rule: &str) -> bool {
    matches!(rule, "public" | "knock" | "knock_restricted")
}

/// Who asks for a hierarchy: a local user, or (over federation) a server.
#[derive(Clone, Copy)]
enum Asker<'a> {
    User(&'a str),
    Server(&'a ServerName),
}

impl Asker<'_> {
    /// Whether the asker belongs to the room: a user joined or invited, a
    /// server with a user joined.
    async fn member(&self, state: &AppState, room_id: &str) -> Result<bool> {
        match self {
            Self::User(user) => Ok(matches!(
                events::current_membership(&state.db, room_id, user).await?.as_deref(),
                Some("join" | "invite")
            )),
            Self::Server(server) => federation::server_in_room(&state.db, room_id, server.as_str()).await,
        }
    }

    /// Whether the asker is in a room a restricted rule allows: a user
    /// joined, a server with a user joined.
    async fn in_room(&self, state: &AppState, room_id: &str) -> Result<bool> {
        match self {
            Self::User(user) => {
                Ok(events::current_membership(&state.db, room_id, user).await?.as_deref() == Some("join"))
            }
            Self::Server(server) => federation::server_in_room(&state.db, room_id, server.as_str()).await,
        }
    }
}

/// The hierarchy's one rule of who sees a room: open join rules,
/// world-readable history, a member of it (`room_id`: a room this server
/// has), or a restricted rule naming a room the asker is in.
async fn may_see(
    state: &AppState,
    asker: Asker<'_>,
    room_id: Option<&str>,
    rule: &str,
    world_readable: bool,
    allowed: &[String],
) -> Result<bool> {
    if open_rule(rule) || world_readable {
        return Ok(true);
    }
    if let Some(room_id) = room_id
        && asker.member(state, room_id).await?
    {
        return Ok(true);
    }
    if rule == "restricted" {
        for room in allowed {
            if asker.in_room(state, room).await? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether `asker` may see the local room `room_id` in a hierarchy, and the
/// room's join rules event (for `allowed_room_ids`).
async fn visible(state: &AppState, asker: Asker<'_>, room_id: &str) -> Result<(bool, Value)> {
    let (join_rules, world_readable) = openness(state, room_id).await?;
    let rule = join_rules["content"]["join_rule"].as_str().unwrap_or("invite");
    let allowed = allowed_rooms(&join_rules);
    let visible = may_see(state, asker, Some(room_id), rule, world_readable, &allowed).await?;
    Ok((visible, join_rules))
}

/// Whether `user` may see a room another server described (`chunk`, as a
/// hierarchy lists it; this server has no members of it to ask about).
async fn visible_remote(state: &AppState, user: &str, chunk: &Value) -> Result<bool> {
    // The spec's default join rule of a listed room is `public`.
    let rule = chunk["join_rule"].as_str().unwrap_or("public");
    let allowed: Vec<String> = chunk["allowed_room_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    may_see(state, Asker::User(user), None, rule, chunk["world_readable"] == true, &allowed).await
}

/// A room this server has: its version and summary, read once for the
/// room's visit.
struct Local {
    version: String,
    summary: Option<rooms::RoomSummary>,
}

/// The room, if this server has it.
async fn local_room(state: &AppState, room_id: &str) -> Result<Option<Local>> {
    let Some(row) = rooms::get(&state.db, room_id).await? else { return Ok(None) };
    Ok(Some(Local { version: row.room_version, summary: rooms::summary(&state.db, room_id).await? }))
}

impl Local {
    fn is_space(&self) -> bool {
        self.summary.as_ref().is_some_and(|s| s.room_type.as_deref() == Some("m.space"))
    }
}

/// One room of this server as a hierarchy lists it.
async fn room_chunk(
    state: &AppState,
    room_id: &str,
    local: Local,
    join_rules: &Value,
    children: Vec<Value>,
) -> Result<Value> {
    let mut chunk = match local.summary {
        Some(s) => super::directory::chunk(s),
        None => {
            json!({ "room_id": room_id, "num_joined_members": 0, "world_readable": false, "guest_can_join": false })
        }
    };
    // Always said, from the rules event (a listed room without one would
    // read as public elsewhere, while this server treats it as invite-only).
    if chunk.get("join_rule").is_none() {
        chunk["join_rule"] = json!(join_rules["content"]["join_rule"].as_str().unwrap_or("invite"));
    }
    chunk["children_state"] = Value::Array(children);
    chunk["room_version"] = json!(local.version);
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

/// What another server said of one of its rooms: the room (with
/// `children_state`), or nothing when no server answered; and what it said
/// of the rooms that room links to.
#[derive(Debug, Clone, Default)]
struct Answer {
    room: Option<Value>,
    children: Vec<(String, Value)>,
    inaccessible: Vec<String>,
}

/// Other servers' answers, kept a while for every walk (pages of one walk
/// re-walk from the space, so they must not ask again).
#[derive(Debug, Default)]
pub struct RemoteCache {
    answers: std::sync::Mutex<HashMap<(String, bool), (std::time::Instant, Answer)>>,
}

/// How long an answer is used again.
const REMOTE_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(300);
/// Answers kept at most.
const REMOTE_CACHE_MAX: usize = 10_000;

impl RemoteCache {
    fn get(&self, room_id: &str, suggested_only: bool) -> Option<Answer> {
        let answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (at, answer) = answers.get(&(room_id.to_owned(), suggested_only))?;
        (at.elapsed() < REMOTE_CACHE_TTL).then(|| answer.clone())
    }

    fn put(&self, room_id: &str, suggested_only: bool, answer: Answer) {
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if answers.len() >= REMOTE_CACHE_MAX {
            answers.retain(|_, (at, _)| at.elapsed() < REMOTE_CACHE_TTL);
            if answers.len() >= REMOTE_CACHE_MAX {
                answers.clear();
            }
        }
        answers.insert((room_id.to_owned(), suggested_only), (std::time::Instant::now(), answer));
    }
}

/// What this walk learned from other servers about rooms this server does
/// not have.
#[derive(Default)]
struct Remote {
    /// Each room asked about: its chunk with `children_state`, or `None`
    /// when no server answered.
    asked: HashMap<String, Option<Value>>,
    /// Rooms an answer listed as children of the room it was about.
    children: HashMap<String, Value>,
    /// Rooms an answer said this server may not see.
    inaccessible: HashSet<String>,
    requests: usize,
}

/// Requests to other servers one hierarchy page makes at most (a page that
/// needs more ends early; the next one finds these answers cached).
const MAX_REMOTE_REQUESTS: usize = 20;
/// Servers of a link's `via` tried for one room at most.
const MAX_VIA_TRIED: usize = 3;

impl Remote {
    fn absorb(&mut self, room_id: &str, answer: Answer) -> Option<Value> {
        for (id, chunk) in answer.children {
            self.children.entry(id).or_insert(chunk);
        }
        self.inaccessible.extend(answer.inaccessible);
        self.asked.insert(room_id.to_owned(), answer.room.clone());
        answer.room
    }

    /// The room as another server lists it (with `children_state`): from
    /// this walk, the cache, or asked of the link's servers in turn.
    /// `Err(())` when this page has asked all it may.
    async fn ask(
        &mut self,
        state: &AppState,
        room_id: &str,
        via: &[String],
        suggested_only: bool,
    ) -> Result<Option<Value>, ()> {
        if let Some(answer) = self.asked.get(room_id) {
            return Ok(answer.clone());
        }
        if let Some(answer) = state.hierarchy_cache.get(room_id, suggested_only) {
            return Ok(self.absorb(room_id, answer));
        }
        let ours = state.settings.server_name.as_str();
        let servers: Vec<&String> = via.iter().filter(|s| s.as_str() != ours).take(MAX_VIA_TRIED).collect();
        if !servers.is_empty() && self.requests >= MAX_REMOTE_REQUESTS {
            return Err(());
        }
        let mut answer = Answer::default();
        for server in servers {
            let (Ok(server), Ok(room)) = (ServerName::parse(server), RoomId::parse(room_id)) else {
                continue;
            };
            self.requests += 1;
            let mut request = get_hierarchy::v1::Request::new(room);
            request.suggested_only = suggested_only;
            let response = match crate::federation::send(state, &server, request).await {
                Ok(response) if response.room.summary.room_id == room_id => response,
                Ok(_) => continue,
                Err(e) => {
                    tracing::info!(%server, room_id, error = %e, "another server's space hierarchy could not be read");
                    continue;
                }
            };
            let Ok(room) = serde_json::to_value(&response.room) else { continue };
            // What it says of other rooms counts only for the children it links to.
            let linked: HashSet<&str> = room["children_state"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["state_key"].as_str())
                .collect();
            for child in &response.children {
                if let Ok(chunk) = serde_json::to_value(child)
                    && let Some(id) = chunk["room_id"].as_str().filter(|id| linked.contains(id))
                {
                    answer.children.push((id.to_owned(), chunk.clone()));
                }
            }
            answer.inaccessible = response
                .inaccessible_children
                .iter()
                .map(ToString::to_string)
                .filter(|id| linked.contains(id.as_str()))
                .collect();
            answer.room = Some(room);
            break;
        }
        state.hierarchy_cache.put(room_id, suggested_only, answer.clone());
        Ok(self.absorb(room_id, answer))
    }
}

/// One room met on the walk: its chunk (made when listed) and its links.
struct Node {
    /// Another server's chunk; or this server's room and its join rules.
    source: Result<Value, (Local, Value)>,
    links: Vec<Link>,
}

/// What the walk does with a room.
enum Step {
    /// List it (and walk its links).
    Node(Box<Node>),
    /// Leave it out: the user may not see it, or no server could tell.
    Skip,
    /// End the page here: it asked other servers all it may.
    Stop,
}

/// The room `room_id` as `user` may see it, from this server or (a room it
/// does not have) from the servers of the link that led here.
async fn node(
    state: &AppState,
    remote: &mut Remote,
    user: &str,
    room_id: &str,
    via: &[String],
    q: &Query<'_>,
    walk_children: bool,
) -> Result<Step> {
    if let Some(local) = local_room(state, room_id).await? {
        let (may_see, join_rules) = visible(state, Asker::User(user), room_id).await?;
        if !may_see {
            return Ok(Step::Skip);
        }
        let links =
            if local.is_space() { links(state, room_id, q.suggested_only).await? } else { Vec::new() };
        return Ok(Step::Node(Box::new(Node { source: Err((local, join_rules)), links })));
    }
    if remote.inaccessible.contains(room_id) {
        return Ok(Step::Skip);
    }
    // A room listed by its parent's server needs no question of its own
    // unless it is a space whose children are walked.
    let listed = remote.children.get(room_id).cloned();
    let chunk = match listed {
        Some(chunk) if !walk_children || chunk["room_type"] != "m.space" => {
            let mut chunk = chunk;
            chunk["children_state"] = json!([]);
            chunk
        }
        _ => match remote.ask(state, room_id, via, q.suggested_only).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Ok(Step::Skip),
            Err(()) => return Ok(Step::Stop),
        },
    };
    if !visible_remote(state, user, &chunk).await? {
        return Ok(Step::Skip);
    }
    let links = if chunk["room_type"] == "m.space" {
        let events = chunk["children_state"].as_array().cloned().unwrap_or_default();
        ordered(events.iter().filter_map(link).collect(), q.suggested_only)
    } else {
        Vec::new()
    };
    Ok(Step::Node(Box::new(Node { source: Ok(chunk), links })))
}

/// A page of the space's hierarchy as `user` may see it. Rooms this server
/// does not have are asked of the servers their link names
/// (`/_matrix/federation/v1/hierarchy`), at most [`MAX_REMOTE_REQUESTS`] a
/// page; their answers are kept a while ([`RemoteCache`]) for the pages after.
pub async fn hierarchy(state: &AppState, user: &str, q: Query<'_>) -> Result<Value> {
    let max_depth = q.max_depth.unwrap_or(MAX_DEPTH).min(MAX_DEPTH);
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let offset = match q.from {
        Some(t) => parse_token(t, &q, max_depth)?,
        None => 0,
    };
    let root = q.root.as_str();
    if rooms::get(&state.db, root).await?.is_none() || !visible(state, Asker::User(user), root).await?.0 {
        return Err(Error::Forbidden("You may not view this space".into()));
    }

    // Depth first: a stack of (room, depth, servers to ask), children pushed in reverse.
    let mut stack: Vec<(String, usize, Vec<String>)> = vec![(root.to_owned(), 0, Vec::new())];
    let mut seen: HashSet<String> = HashSet::new();
    let mut remote = Remote::default();
    let mut listed = 0usize;
    let mut page = Vec::new();
    let mut visits = 0usize;
    while let Some((room_id, depth, via)) = stack.pop() {
        visits += 1;
        if visits > MAX_VISITS || page.len() >= limit {
            stack.push((room_id, depth, via));
            break;
        }
        if seen.contains(&room_id) {
            continue;
        }
        let node = match node(state, &mut remote, user, &room_id, &via, &q, depth < max_depth).await? {
            Step::Node(node) => node,
            Step::Skip => {
                seen.insert(room_id);
                continue;
            }
            Step::Stop => {
                stack.push((room_id, depth, via));
                break;
            }
        };
        seen.insert(room_id.clone());
        if depth < max_depth {
            for link in node.links.iter().rev() {
                if !seen.contains(&link.child) {
                    stack.push((link.child.clone(), depth + 1, link.via.clone()));
                }
            }
        }
        if listed >= offset {
            let children: Vec<Value> = node.links.into_iter().map(|l| l.stripped).collect();
            page.push(match node.source {
                Err((local, join_rules)) => room_chunk(state, &room_id, local, &join_rules, children).await?,
                Ok(mut chunk) => {
                    chunk["children_state"] = Value::Array(children);
                    chunk
                }
            });
        }
        listed += 1;
    }
    let mut body = json!({ "rooms": page });
    // More to list while the stack holds a room not listed yet.
    if stack.iter().any(|(r, _, _)| !seen.contains(r)) {
        body["next_batch"] =
            json!(token(offset + body["rooms"].as_array().map_or(0, Vec::len), &q, max_depth));
    }
    Ok(body)
}

/// A chunk as ruma's summary types take it. What a room's state may hold
/// that they refuse (it came from other servers' events unchecked) is
/// dropped first: an alias that is none, allowed room ids that are none, a
/// join rule of a room's own making (read as `invite`).
fn as_summary<T: serde::de::DeserializeOwned>(mut chunk: Value) -> Option<T> {
    const KNOWN: [&str; 6] = ["public", "knock", "invite", "private", "restricted", "knock_restricted"];
    if chunk["canonical_alias"].as_str().is_some_and(|a| ruma::RoomAliasId::parse(a).is_err()) {
        chunk.as_object_mut()?.remove("canonical_alias");
    }
    if let Some(ids) = chunk.get_mut("allowed_room_ids").and_then(Value::as_array_mut) {
        ids.retain(|id| id.as_str().is_some_and(|id| RoomId::parse(id).is_ok()));
    }
    if !chunk["join_rule"].as_str().is_some_and(|r| KNOWN.contains(&r)) {
        chunk["join_rule"] = json!("invite");
    }
    match serde_json::from_value(chunk) {
        Ok(summary) => Some(summary),
        Err(e) => {
            tracing::warn!(error = %e, "a room summary does not fit the federation answer");
            None
        }
    }
}

/// `/_matrix/federation/v1/hierarchy/{roomId}` for `server`: the room (404
/// when this server does not have it or `server` may not see it) with its
/// links, the linked rooms this server has that `server` may see, and those
/// it may not.
pub async fn for_server(
    state: &AppState,
    server: &ServerName,
    room_id: &RoomId,
    suggested_only: bool,
) -> Result<get_hierarchy::v1::Response> {
    let unknown = || Error::NotFound("Unknown room".into());
    let room = room_id.as_str();
    let local = local_room(state, room).await?.ok_or_else(unknown)?;
    crate::federation::acl::check(state, room, server).await?;
    let (may_see, join_rules) = visible(state, Asker::Server(server), room).await?;
    if !may_see {
        return Err(unknown());
    }
    let links = links(state, room, suggested_only).await?;
    let mut children = Vec::new();
    let mut inaccessible = Vec::new();
    for link in &links {
        let Some(child) = local_room(state, &link.child).await? else { continue };
        let (may_see, child_rules) = visible(state, Asker::Server(server), &link.child).await?;
        if may_see {
            let mut chunk = room_chunk(state, &link.child, child, &child_rules, Vec::new()).await?;
            if let Some(fields) = chunk.as_object_mut() {
                fields.remove("children_state");
            }
            children.push(chunk);
        } else {
            inaccessible.push(link.child.clone());
        }
    }
    let stripped: Vec<Value> = links.into_iter().map(|l| l.stripped).collect();
    let chunk = room_chunk(state, room, local, &join_rules, stripped).await?;
    let root =
        as_summary(chunk).ok_or_else(|| Error::Internal("the room's summary does not serialise".into()))?;
    let mut response = get_hierarchy::v1::Response::new(root);
    // A child whose summary still does not fit is left out, not the answer.
    response.children = children.into_iter().filter_map(as_summary).collect();
    response.inaccessible_children = inaccessible.iter().filter_map(|id| RoomId::parse(id).ok()).collect();
    Ok(response)
}
