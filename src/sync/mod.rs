//! `/sync`: assembling what changed for one user between two stream positions,
//! and waiting for the next change.
//!
//! A token is `s<stream>_<typing serial>`. Everything stored with a stream
//! position at or below `<stream>` is covered (see `streams`); within a room,
//! seq and stream grow together, so a stream position maps to the highest seq
//! at or below it. Every room's events go through the user's readable ranges,
//! the same check as `/messages`.

pub mod presence;
pub mod quiet;
pub mod sliding;
pub mod typing;
pub mod writes;

use std::time::{Duration, Instant};

use ruma::{OwnedUserId, UserId};
use serde_json::{Map, Value, json};

use crate::account::Requester;
use crate::error::{Error, Result};
use crate::room::history::{self, Dir, EventFilter, PageRequest};
use crate::room::read::{self, Access, Loaded, RoomView};
use crate::state::AppState;
use crate::storage::{account_data, events, keys, memberships, receipts};
use crate::streams::RoomWatch;

/// A position in all the streams a sync reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Token {
    /// The global stream position.
    pub stream: i64,
    /// The typing serial.
    pub typing: u64,
    /// How far the device's to-device messages were sent, when a sync sent
    /// only some of those up to `stream` (see [`TO_DEVICE_PER_SYNC`]).
    pub to_device: Option<i64>,
}

/// The most to-device messages one `/sync` answer carries; the rest come in
/// the next.
pub const TO_DEVICE_PER_SYNC: i64 = 100;

impl Token {
    /// Parses `s<stream>_<typing>` or `s<stream>_<typing>_<to-device>`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || Error::InvalidParam(format!("Invalid since token {s:?}"));
        let rest = s.strip_prefix('s').ok_or_else(bad)?;
        let mut parts = rest.split('_');
        let stream = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let typing = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let to_device = match parts.next() {
            Some(p) => Some(p.parse::<i64>().ok().filter(|t| *t <= stream).ok_or_else(bad)?),
            None => None,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self { stream, typing, to_device })
    }

    /// The opaque form.
    pub fn to_token(self) -> String {
        match self.to_device {
            Some(t) => format!("s{}_{}_{t}", self.stream, self.typing),
            None => format!("s{}_{}", self.stream, self.typing),
        }
    }
}

/// The parts of a filter a sync uses.
#[derive(Debug, Clone, Default)]
pub struct SyncFilter {
    /// Timeline events per room.
    pub timeline_limit: usize,
    /// Timeline event selection.
    pub timeline: EventFilter,
    /// Only these rooms.
    pub rooms: Option<Vec<String>>,
    /// Not these rooms.
    pub not_rooms: Vec<String>,
    /// Include rooms left before `since` (initial and full-state syncs).
    pub include_leave: bool,
    /// Lazy-load member events.
    pub lazy_load_members: bool,
    /// Send member events again even if sent before (always the case here).
    pub include_redundant_members: bool,
    /// State event selection.
    pub state: EventFilter,
    /// Count thread replies apart (`unread_thread_notifications`).
    pub unread_thread_notifications: bool,
}

/// What the client asked for.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    /// Where the previous sync ended.
    pub since: Option<Token>,
    /// Send all state.
    pub full_state: bool,
    /// The filter.
    pub filter: SyncFilter,
    /// How long to wait for something new.
    pub timeout: Duration,
    /// Answer with `state_after` instead of `state`: the name of that field,
    /// `state_after` or, for a client that opted in with MSC4222's unstable
    /// query parameter, its unstable name (the only one such clients read).
    pub state_after: Option<&'static str>,
}

/// The default number of timeline events per room.
pub const DEFAULT_TIMELINE_LIMIT: usize = 10;

/// Runs a sync: builds the response, and if there is nothing new and the
/// client is willing to wait, waits until the user is woken or the timeout.
pub async fn sync(state: &AppState, me: &Requester, req: &SyncRequest) -> Result<Value> {
    let deadline = Instant::now() + req.timeout;
    let user = me.user_id.as_str();
    // Subscribe, and watch the rooms joined, before reading the position: a
    // write landing in between still wakes us.
    let mut wake = state.notifier.subscribe(user);
    // What the last pass read besides rooms, kept while the request waits.
    let mut last: Option<Pass> = None;
    let mut final_pass = false;
    // Times the room list was read again because a membership of the user's
    // landed while it was read (bounded: a stream of unknown writes must not
    // keep the request spinning).
    let mut relisted = 0;
    loop {
        wake.borrow_and_update();
        let clock = Instant::now();
        // One pass: its reads run back to back on one held connection.
        // The watch of the rooms joined stands while the request waits.
        let (_watch, pass) = state.db.pinned(pass(state, me, req, last.as_ref(), &mut relisted)).await??;
        tracing::debug!(woken = last.is_some(), pass_us = clock.elapsed().as_micros(), "sync pass");
        let Some((body, has_news, pass)) = pass else {
            // The room list may miss a room joined (or hold one left)
            // meanwhile: read it again before answering (nothing was
            // waited for).
            last = None;
            continue;
        };
        if has_news || req.since.is_none() || req.full_state || final_pass || Instant::now() >= deadline {
            return Ok(body);
        }
        let read_at = pass.now.stream;
        last = Some(pass);
        if !wait_for_news(state, &mut wake, read_at, deadline).await {
            // Timed out: one last pass for what landed meanwhile.
            final_pass = true;
        }
    }
}

/// Waits until the user is woken (`wake`) or `deadline`; answers whether
/// woken. A write beyond `read_at` (the position a pass read up to) that
/// finished while an earlier one is still in flight may have spent its
/// wake-up on that pass: then the position reaching past it wakes too.
pub(crate) async fn wait_for_news(
    state: &AppState,
    wake: &mut tokio::sync::watch::Receiver<u64>,
    read_at: i64,
    deadline: Instant,
) -> bool {
    let mut advanced = state.streams.held_back(read_at).then(|| state.streams.watch_position());
    let remaining = deadline.saturating_duration_since(Instant::now());
    let _waiting = state.notifier.waiting();
    let woken = async {
        match &mut advanced {
            Some(position) => tokio::select! {
                changed = wake.changed() => changed.is_ok(),
                moved = position.wait_for(|at| *at > read_at) => moved.is_ok(),
            },
            None => wake.changed().await.is_ok(),
        }
    };
    matches!(tokio::time::timeout(remaining, woken).await, Ok(true))
}

/// One pass of [`sync`]: the room list (kept from the `last` pass while
/// none of the user's memberships moved since), then [`build`]. `None`
/// when a membership of the user's landed while the list was read, and the
/// list is to be read again (at most 3 times in a request, counted in
/// `relisted`: a stream of unknown writes must not keep it spinning).
async fn pass<'a>(
    state: &'a AppState,
    me: &Requester,
    req: &SyncRequest,
    last: Option<&Pass>,
    relisted: &mut u32,
) -> Result<(RoomWatch<'a>, Option<(Value, bool, Pass)>)> {
    let user = me.user_id.as_str();
    // The room list read at `listed_at` stands while none of the user's
    // memberships moved since (an unknown write may have moved one).
    let list_stands =
        |at: i64, upto: i64| state.streams.changes_between(user, at, upto).is_some_and(|m| !m.my_membership);
    let (listed_at, rooms) = match last {
        Some(pass) if list_stands(pass.listed.at, state.streams.position()) => {
            (pass.listed.at, pass.listed.rooms.clone())
        }
        _ => {
            let at = state.streams.position();
            (at, memberships::rooms_joined_of(&state.db, user).await?)
        }
    };
    let joined: Vec<String> = rooms.iter().filter(|(_, j)| *j).map(|(r, _)| r.clone()).collect();
    let watch = state.notifier.watch_rooms(user, joined);
    let now = Token { stream: state.streams.position(), typing: state.typing.serial(), to_device: None };
    if !list_stands(listed_at, now.stream) && *relisted < 3 {
        *relisted += 1;
        return Ok((watch, None));
    }
    // Reads of the earlier pass are kept for the streams that did not
    // move; a membership of the user's (a join makes older events
    // readable) means everything is read again.
    let reuse = last.and_then(|pass| {
        let moved = state.streams.changes_between(user, pass.now.stream, now.stream)?;
        (!moved.my_membership).then_some(Reuse { pass, moved })
    });
    Ok((watch, Some(build(state, me, req, now, Listed { at: listed_at, rooms }, reuse).await?)))
}

/// What a pass of [`build`] read besides the rooms' own events, kept while
/// the request waits: a woken pass reads again only the streams that moved
/// since (what [`crate::streams::Streams::changes_between`] says), since a
/// read over `(since, now]` equals the one over `(since, pass.now]` when no
/// write in between touched it.
#[derive(Debug)]
struct Pass {
    /// The position the pass read up to.
    now: Token,
    /// The user's rooms.
    listed: Listed,
    /// Account data changed, and the push rules and ignored list.
    account: AccountRead,
    /// To-device messages, key counts and remote invites.
    window: keys::DeviceWindow,
    /// Device lists changed and left, and newcomers.
    devices: (Vec<String>, Vec<String>, Vec<String>),
}

/// The user's rooms, each with whether joined now, and a position at or
/// below which every membership of theirs is in the list.
#[derive(Debug)]
struct Listed {
    at: i64,
    rooms: Vec<(String, bool)>,
}

/// Account data changed in a window ((room, type, content)) and the user's
/// push rules and ignored list ((type, content)), as one read returns them.
pub(crate) type AccountRead = (Vec<(String, String, String)>, Vec<(String, String)>);

/// The earlier pass of a woken request, and what moved since.
struct Reuse<'a> {
    pass: &'a Pass,
    moved: crate::streams::Moved,
}

/// The user and everyone joined to a room with them now.
pub async fn room_peers(state: &AppState, me: &UserId) -> Result<Vec<String>> {
    events::room_peers(&state.db, me.as_str()).await
}

/// `device_lists` of an incremental sync: `changed` holds the users whose
/// devices or keys changed and who share a room with `me`, and those who
/// newly share one (they joined a room of `me`'s, or `me` joined theirs);
/// `left` those who shared a room and share none any more. The third list
/// holds those who newly share a room (for presence).
pub async fn device_list_movement(
    state: &AppState,
    me: &UserId,
    after: i64,
    upto: i64,
) -> Result<(Vec<String>, Vec<String>, Vec<String>)> {
    let (mut changed, movers) = events::device_list_window(&state.db, me.as_str(), after, upto).await?;
    if movers.is_empty() {
        return Ok((changed, Vec::new(), Vec::new()));
    }
    let peers: std::collections::HashSet<String> = room_peers(state, me).await?.into_iter().collect();
    let (mut left, mut newcomers) = (Vec::new(), Vec::new());
    for (user, joined) in movers {
        let shares = peers.contains(&user);
        if joined && shares {
            if !newcomers.contains(&user) {
                newcomers.push(user.clone());
            }
            if !changed.contains(&user) {
                changed.push(user);
            }
        } else if !shares && !left.contains(&user) {
            left.push(user);
        }
    }
    changed.sort();
    left.sort();
    Ok((changed, left, newcomers))
}

/// The highest seq of `room_id` whose stream position is at or below `stream`.
async fn seq_at(state: &AppState, room_id: &str, stream: i64) -> Result<i64> {
    events::seq_at_stream(&state.db, room_id, stream).await
}

/// A timeline's events as served, with their bundled aggregations.
async fn format_events(
    state: &AppState,
    view: &RoomView,
    events: &[Loaded],
    me: &Requester,
    access: &Access,
) -> Result<Vec<Value>> {
    let refs: Vec<&Loaded> = events.iter().collect();
    read::format_events(state, view, access, me, &refs).await
}

/// Builds the answer from `since` to `now`; `rooms` are the user's rooms (any
/// membership range), each with whether they are joined now.
async fn build(
    state: &AppState,
    me: &Requester,
    req: &SyncRequest,
    now: Token,
    listed: Listed,
    reuse: Option<Reuse<'_>>,
) -> Result<(Value, bool, Pass)> {
    let since = req.since.unwrap_or_default();
    let initial = req.since.is_none();
    let mut join = Map::new();
    let mut invite = Map::new();
    let mut leave = Map::new();
    let mut knock = Map::new();
    let mut has_news = false;

    let mut room_data: Vec<(String, String, String)> = Vec::new();
    let mut global_data = Vec::new();
    // What changed, and the push rules (for the counts) and the ignored
    // users whatever their age, in one read.
    let account = match &reuse {
        Some(r) if !r.moved.account_data => r.pass.account.clone(),
        _ => {
            account_data::changed_and_wanted(
                &state.db,
                me.user_id.as_str(),
                since.stream,
                now.stream,
                &["m.push_rules", "m.ignored_user_list"],
            )
            .await?
        }
    };
    let (changed, personal) = &account;
    for (room_id, kind, content) in changed {
        let content: Value = serde_json::from_str(content).unwrap_or_else(|_| json!({}));
        if room_id.is_empty() {
            global_data.push(json!({ "type": kind, "content": content }));
        } else {
            room_data.push((
                room_id.clone(),
                kind.clone(),
                serde_json::to_string(&content).unwrap_or_default(),
            ));
        }
    }
    let stored = |kind: &str| personal.iter().find(|(k, _)| k == kind).map(|(_, c)| c.as_str());
    let rules = crate::notify::rules_from(state, &me.user_id, stored("m.push_rules"))?;
    let ignored = ignored_users(stored("m.ignored_user_list"));
    // An initial sync carries the push rules even when the user never
    // changed them (clients read them from there).
    if initial && !global_data.iter().any(|d| d["type"] == "m.push_rules") {
        global_data.push(json!({ "type": "m.push_rules", "content": { "global": *rules } }));
    }
    has_news |= !global_data.is_empty();

    // The rooms the filter lets through; an incremental sync over several
    // looks only into those with something new (one probe for all): the
    // others have nothing to say.
    let mut ids: Vec<&str> = listed
        .rooms
        .iter()
        .map(|(r, _)| r.as_str())
        .filter(|r| {
            req.filter.rooms.as_ref().is_none_or(|only| only.iter().any(|o| o == r))
                && !req.filter.not_rooms.iter().any(|n| n == r)
        })
        .collect();
    let probed = match &reuse {
        // Woken: the earlier pass found nothing new in any room, so only
        // those with events or receipts since can have something. Not when
        // account data moved: an ignored user no longer ignored shows their
        // invite, which the earlier pass hid.
        Some(r) if !r.moved.account_data => Some(r.moved.rooms.keys().cloned().collect()),
        _ if !initial && !req.full_state && ids.len() > 1 => {
            Some(events::rooms_changed(&state.db, &ids, since.stream, now.stream).await?)
        }
        _ => None,
    };
    if let Some(changed) = probed {
        ids.retain(|room| {
            changed.iter().any(|c: &String| c == room)
                || room_data.iter().any(|(r, _, _)| r == room)
                || state.typing.changed_since(room, Some(since.typing), now.typing).is_some()
        });
    }
    // Woken by typing alone in a room whose last entry still holds: answered
    // from that entry, nothing read (see `quiet`).
    if let Some(r) = reuse.as_ref().filter(|r| !r.moved.account_data) {
        let state_key = req.state_after.unwrap_or("state");
        let by_thread = req.filter.unread_thread_notifications;
        ids.retain(|&room| {
            if r.moved.rooms.contains_key(room) || room_data.iter().any(|(data_room, _, _)| data_room == room)
            {
                return true;
            }
            let Some(users) = state.typing.changed_since(room, Some(since.typing), now.typing) else {
                return true;
            };
            let user = me.user_id.as_str();
            let Some(quiet) = state.quiet_rooms.still(&state.streams, user, room, now.stream, by_thread)
            else {
                return true;
            };
            let typing = json!({ "type": "m.typing", "content": { "user_ids": users } });
            join.insert(room.to_owned(), quiet::entry(quiet, vec![typing], state_key));
            has_news = true;
            false
        });
    }
    // Every room's row in one read (after `now`: the rows are at least as
    // new as the position).
    let mut rows: std::collections::HashMap<String, crate::storage::rooms::RoomRow> =
        crate::storage::rooms::get_many(&state.db, &ids)
            .await?
            .into_iter()
            .map(|r| (r.room_id.clone(), r))
            .collect();
    // In the user's order of rooms; those the filter or the probe left out
    // have no row.
    for (room_id, _) in &listed.rooms {
        let room_id = room_id.clone();
        let Some(row) = rows.remove(&room_id) else { continue };
        let view = read::view_of(row)?;
        let access = read::access(state, &view, &me.user_id).await?;
        // Woken, with events here since the earlier pass found nothing: the
        // window's own seqs bound what is new (seq and stream grow together in
        // a room, and nothing between `since` and the earlier pass showed).
        // Not after a state event, which may change what is readable.
        let moved = reuse.as_ref().and_then(|r| r.moved.rooms.get(&room_id));
        let (since_seq, now_seq) = match moved.filter(|m| !m.state).and_then(|m| m.seqs) {
            _ if initial => (0, seq_at(state, &room_id, now.stream).await?),
            Some((lo, hi)) => (lo - 1, hi),
            None => events::seqs_at_streams(&state.db, &room_id, since.stream, now.stream).await?,
        };
        // No state event in that window: no state changed since `since`.
        let state_moved = moved.is_none_or(|m| m.state);
        let membership = access.history.at(now_seq).to_owned();
        let data: Vec<Value> = room_data
            .iter()
            .filter(|(r, _, _)| *r == room_id)
            .map(|(_, t, c)| json!({ "type": t, "content": serde_json::from_str::<Value>(c).unwrap_or_default() }))
            .collect();
        match membership.as_str() {
            "join" => {
                let seqs = Seqs { since: since_seq, now: now_seq, state_moved };
                if let Some(room) =
                    joined_room(state, me, req, &view, &access, since, now, seqs, data, &rules).await?
                {
                    has_news = true;
                    join.insert(room_id, room);
                }
            }
            kind @ ("invite" | "knock") => {
                // Pending: the room's stripped state, once, from the invite
                // or knock on.
                let started =
                    access.stays.iter().filter(|r| r.kind == kind).map(|r| r.min_seq).max().unwrap_or(0);
                if (initial || started > since_seq)
                    && !(kind == "invite" && invited_by_ignored(state, &room_id, me, &ignored).await?)
                {
                    has_news = true;
                    let events = invite_state(state, &view, &me.user_id).await?;
                    if kind == "invite" {
                        invite.insert(room_id, json!({ "invite_state": { "events": events } }));
                    } else {
                        knock.insert(room_id, json!({ "knock_state": { "events": events } }));
                    }
                }
            }
            _ => {
                // Left, kicked, banned, an invite rejected/withdrawn, or a
                // knock refused/withdrawn.
                let end = access.stays.iter().filter_map(|r| r.max_seq).max().unwrap_or(0);
                let recent = !initial && end > since_seq;
                let old_but_asked = (initial || req.full_state) && req.filter.include_leave;
                if end > 0 && end <= now_seq && (recent || old_but_asked) {
                    has_news = true;
                    let room = left_room(state, me, req, &view, &access, since_seq, end, data).await?;
                    leave.insert(room_id, room);
                }
            }
        }
    }

    // What the client's token says it has is acknowledged: deleted off the
    // answer's path (what follows reads above it anyway). At most
    // TO_DEVICE_PER_SYNC go out, and the token then says how far. The
    // to-device messages, key counts and remote invites come in one read.
    let acked = since.to_device.unwrap_or(since.stream);
    if acked > 0 && reuse.is_none() {
        let (state, user, device) = (state.clone(), me.user_id.to_string(), me.device_id.to_string());
        tokio::spawn(async move {
            if let Err(e) = keys::ack_to_device(&state.db, &user, &device, acked).await {
                tracing::warn!(%user, %device, "to-device messages not dropped after their ack: {e}");
            }
        });
    }
    let window = match &reuse {
        Some(r) if !r.moved.device => r.pass.window.clone(),
        _ => {
            keys::device_window(
                &state.db,
                me.user_id.as_str(),
                me.device_id.as_str(),
                acked,
                if initial { 0 } else { since.stream },
                now.stream,
                TO_DEVICE_PER_SYNC + 1,
            )
            .await?
        }
    };

    // Invites into rooms on other servers (not on any line of ours yet), and
    // knocks on them.
    for pending in &window.remote_invites {
        let room_id = pending.room_id.clone();
        if req.filter.rooms.as_ref().is_some_and(|r| !r.contains(&room_id))
            || req.filter.not_rooms.contains(&room_id)
        {
            continue;
        }
        if pending.rejected != 0 {
            if !initial {
                has_news = true;
                leave.insert(room_id, json!({ "timeline": { "events": [] }, "state": { "events": [] } }));
            }
            continue;
        }
        let inviter = serde_json::from_str::<Value>(&pending.json)
            .ok()
            .and_then(|e| e["sender"].as_str().map(str::to_owned));
        if inviter.is_some_and(|i| ignored.contains(&i)) {
            continue;
        }
        has_news = true;
        let events: Value = serde_json::from_str(&pending.stripped_state).unwrap_or_else(|_| json!([]));
        if pending.membership == "knock" {
            knock.insert(room_id, json!({ "knock_state": { "events": events } }));
        } else {
            invite.insert(room_id, json!({ "invite_state": { "events": events } }));
        }
    }

    let mut next = now;
    let mut rows = window.to_device.as_slice();
    if rows.len() > TO_DEVICE_PER_SYNC as usize {
        rows = &rows[..TO_DEVICE_PER_SYNC as usize];
        next.to_device = rows.last().map(|r| r.0);
        has_news = true;
    }
    let to_device: Vec<Value> = rows
        .iter()
        .map(|(_, sender, kind, content)| {
            json!({ "sender": sender, "type": kind, "content": serde_json::from_str::<Value>(content).unwrap_or_default() })
        })
        .collect();
    let devices = match &reuse {
        Some(r) if r.moved.keeps_device_list_movement() => r.pass.devices.clone(),
        _ if initial => (Vec::new(), Vec::new(), Vec::new()),
        _ => device_list_movement(state, &me.user_id, since.stream, now.stream).await?,
    };
    let (changed, left, newcomers) = &devices;
    has_news |= !to_device.is_empty() || !changed.is_empty() || !left.is_empty();
    let otk = crate::account::e2ee::otk_counts_json(&window.one_time_keys);
    let fallback = &window.fallback;

    // Nobody has set a presence: no need to look up who shares a room.
    let presence = if state.presence.is_empty() {
        Vec::new()
    } else {
        let peers = room_peers(state, &me.user_id).await?;
        let now_ms = crate::storage::now_ms();
        let mut seen = state.presence.events(&peers, req.since.map(|s| s.stream), now.stream, now_ms);
        // Those who newly share a room: their presence as it stands, even
        // if it did not change in the window.
        for event in state.presence.events(newcomers, None, now.stream, now_ms) {
            if !seen.iter().any(|e| e["sender"] == event["sender"]) {
                seen.push(event);
            }
        }
        seen
    };
    has_news |= !presence.is_empty();

    let body = json!({
        "next_batch": next.to_token(),
        "rooms": { "join": join, "invite": invite, "leave": leave, "knock": knock },
        "account_data": { "events": global_data },
        "presence": { "events": presence },
        "to_device": { "events": to_device },
        "device_lists": { "changed": changed, "left": left },
        "device_one_time_keys_count": otk,
        "device_unused_fallback_key_types": fallback,
    });
    Ok((body, has_news, Pass { now, listed, account, window, devices }))
}

/// The timeline of a room between two seqs: up to `limit` readable events
/// ending at `hi`, and whether readable events before them were left out.
pub(crate) async fn timeline(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    lo: i64,
    hi: i64,
    filter: &SyncFilter,
) -> Result<(Vec<Loaded>, bool)> {
    // A limit of 0 asks for no events: one is read to tell whether any
    // were left out.
    let wanted = filter.timeline_limit;
    let page = history::page(
        state,
        view,
        access,
        PageRequest {
            from: hi,
            to: Some(lo),
            dir: Dir::Backward,
            limit: wanted.max(1),
            filter: &filter.timeline,
        },
    )
    .await?;
    let limited = page.next.is_some() || (wanted == 0 && !page.events.is_empty());
    let mut events = if wanted == 0 { Vec::new() } else { page.events };
    events.reverse();
    Ok((events, limited))
}

/// A joined room's window of seqs in an incremental sync.
#[derive(Debug, Clone, Copy)]
struct Seqs {
    /// Events after this one are new.
    since: i64,
    /// Up to this one.
    now: i64,
    /// Whether a state event may have landed in the window (`false` only
    /// when the change log says none did).
    state_moved: bool,
}

/// An incremental state section: what changed after `after`, read only when
/// `read` (else the change log showed no state event in the window).
#[derive(Debug, Clone, Copy)]
struct Changed {
    after: i64,
    read: bool,
}

/// State for the `state` (or `state_after`) section: the state at `at`,
/// keeping only what changed after `changed_after` unless everything is due,
/// lazy-loaded to the members the timeline needs.
#[allow(clippy::too_many_arguments)]
async fn state_section(
    state: &AppState,
    me: &Requester,
    req: &SyncRequest,
    view: &RoomView,
    access: &Access,
    at: i64,
    changed_after: Option<Changed>,
    timeline: &[Loaded],
) -> Result<Vec<Value>> {
    if at <= 0 {
        return Ok(Vec::new());
    }
    let in_timeline: Vec<&str> = timeline.iter().map(|e| e.stored.event_id.as_str()).collect();
    let senders: Vec<String> = timeline.iter().map(|e| e.pdu.sender.to_string()).collect();
    let room_id = view.room.room_id.as_str();
    // Nothing is placed before the timeline's first event when it is the
    // first position of a room joined over federation (the join, with the
    // room's whole state): the state there, less the timeline's own events,
    // is the state before it.
    let first = timeline.first().map(|e| e.stored.seq);
    let at = match first {
        Some(first)
            if changed_after.is_none()
                && at < first
                && !events::placed_before(&state.db, room_id, first).await? =>
        {
            first
        }
        _ => at,
    };
    let rows = match changed_after {
        // Incremental: only what changed since, read from that stretch alone.
        Some(Changed { after, read }) => {
            // An empty stretch (a room woken by typing or a receipt alone)
            // has nothing to read.
            let mut rows = if read && after < at {
                events::state_changed_between(&state.db, room_id, after, at).await?
            } else {
                Vec::new()
            };
            if req.filter.lazy_load_members {
                // The timeline's senders, whatever changed.
                let mut wanted: Vec<&str> = senders.iter().map(String::as_str).collect();
                wanted.sort_unstable();
                wanted.dedup();
                let changed: std::collections::HashSet<String> =
                    rows.iter().filter_map(read::member_key).collect();
                wanted.retain(|user| !changed.contains(*user));
                if !wanted.is_empty() {
                    rows.extend(read::members_at(state, view, &wanted, at).await?);
                    rows.sort_by_key(|e| e.seq);
                }
            }
            rows
        }
        // Everything, lazily: the non-member state, then just the members needed.
        None if req.filter.lazy_load_members => {
            let mut wanted: Vec<&str> = senders.iter().map(String::as_str).collect();
            wanted.push(me.user_id.as_str());
            wanted.sort_unstable();
            wanted.dedup();
            read::lazy_state(state, view, &wanted, at).await?
        }
        None => events::state_at(&state.db, room_id, at).await?,
    };
    let mut out = Vec::new();
    for stored in rows {
        if req.state_after.is_none() && in_timeline.contains(&stored.event_id.as_str()) {
            continue;
        }
        let loaded = read::load(state, stored).await?;
        if !req.filter.state.allows(&loaded) {
            continue;
        }
        let is_member = loaded.pdu.kind.to_string() == "m.room.member";
        if is_member && req.filter.lazy_load_members {
            let key = loaded.pdu.state_key.as_deref().unwrap_or("");
            let needed = key == me.user_id.as_str()
                || senders.iter().any(|s| s == key)
                || changed_after.is_some_and(|c| loaded.stored.seq > c.after);
            if !needed {
                continue;
            }
        }
        out.push(read::format(view, &loaded, me, &access.history));
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn joined_room(
    state: &AppState,
    me: &Requester,
    req: &SyncRequest,
    view: &RoomView,
    access: &Access,
    since: Token,
    now: Token,
    seqs: Seqs,
    account_data: Vec<Value>,
    rules: &std::sync::Arc<ruma::push::Ruleset>,
) -> Result<Option<Value>> {
    let Seqs { since: since_seq, now: now_seq, state_moved } = seqs;
    let initial = req.since.is_none();
    let room_id = view.room.room_id.as_str();
    let (mut timeline_events, mut limited) =
        timeline(state, view, access, since_seq, now_seq, &req.filter).await?;
    // A join since `since` gets the room whole, as on an initial sync.
    let joined_at =
        access.stays.iter().filter(|r| r.kind == "join" && r.max_seq.is_none()).map(|r| r.min_seq).max();
    let newly_joined = !initial && joined_at.is_some_and(|j| j > since_seq);
    let everything = initial || req.full_state || newly_joined;
    // `state` is the state before the timeline, and the timeline's events
    // then say what changed. Where the state moved by more than an event
    // within the timeline's stretch (an event placed across a hole, a merge
    // that resolution changed), no event would say so: the timeline starts
    // there instead (limited), with the state as of that position.
    let mut cut = None;
    if let (None, Some(first), Some(last)) =
        (req.state_after, timeline_events.first(), timeline_events.last())
        && (everything || state_moved)
    {
        let (first, last) = (first.stored.seq, last.stored.seq);
        if let Some(&at) = events::moved_apart(&state.db, room_id, first - 1, last).await?.last() {
            let before = timeline_events.len();
            timeline_events.retain(|e| e.stored.seq >= at);
            limited |= timeline_events.len() < before;
            cut = Some(at);
        }
    }
    let start = timeline_events.first().map_or(now_seq + 1, |e| e.stored.seq);
    let changed_after = if everything { None } else { Some(Changed { after: since_seq, read: state_moved }) };
    let (state_key, state_events) = if let Some(field) = req.state_after {
        (field, state_section(state, me, req, view, access, now_seq, changed_after, &timeline_events).await?)
    } else {
        let at = cut.map_or(start - 1, |at| at.max(start - 1));
        ("state", state_section(state, me, req, view, access, at, changed_after, &timeline_events).await?)
    };

    let mut ephemeral = Vec::new();
    if let Some(users) = state.typing.changed_since(room_id, req.since.map(|s| s.typing), now.typing) {
        ephemeral.push(json!({ "type": "m.typing", "content": { "user_ids": users } }));
    }
    let (changed, marks) =
        receipts::changed_and_read_up_to(&state.db, room_id, since.stream, now.stream, me.user_id.as_str())
            .await?;
    let contents = receipt_contents(&changed, me.user_id.as_str());
    for content in contents {
        ephemeral.push(json!({ "type": "m.receipt", "content": content }));
    }

    let news = !timeline_events.is_empty()
        || limited
        || !state_events.is_empty()
        || !ephemeral.is_empty()
        || !account_data.is_empty();
    if !initial && !req.full_state && !news {
        return Ok(None);
    }
    let marks = crate::notify::ReadMarks::from_rows(marks);
    let counts = crate::notify::counts(state, view, access, me, rules, marks, now_seq).await?;
    let (notify, highlight) = if req.filter.unread_thread_notifications {
        counts.main()
    } else {
        (counts.notify, counts.highlight)
    };
    let prev_batch = history::token(start - 1);
    let mut room = json!({
        "timeline": {
            "events": format_events(state, view, &timeline_events, me, access).await?,
            "limited": limited,
            "prev_batch": prev_batch,
        },
        "ephemeral": { "events": ephemeral },
        "account_data": { "events": account_data },
        "unread_notifications": { "notification_count": notify, "highlight_count": highlight },
        "summary": summary(state, view, &me.user_id).await?,
    });
    if req.filter.unread_thread_notifications && !counts.threads.is_empty() {
        let threads: Map<String, Value> = counts
            .threads
            .iter()
            .map(|(root, (n, h))| (root.clone(), json!({ "notification_count": n, "highlight_count": h })))
            .collect();
        room["unread_thread_notifications"] = Value::Object(threads);
    }
    room[state_key] = json!({ "events": state_events });
    if !initial {
        let quiet = quiet::Quiet {
            seq: now_seq,
            unread: room["unread_notifications"].clone(),
            threads: room.get("unread_thread_notifications").cloned(),
            summary: room["summary"].clone(),
        };
        let by_thread = req.filter.unread_thread_notifications;
        state.quiet_rooms.remember(me.user_id.as_str(), room_id, now.stream, by_thread, quiet);
    }
    Ok(Some(room))
}

#[allow(clippy::too_many_arguments)]
async fn left_room(
    state: &AppState,
    me: &Requester,
    req: &SyncRequest,
    view: &RoomView,
    access: &Access,
    since_seq: i64,
    end: i64,
    account_data: Vec<Value>,
) -> Result<Value> {
    let (timeline_events, limited) = timeline(state, view, access, since_seq, end, &req.filter).await?;
    let start = timeline_events.first().map_or(end + 1, |e| e.stored.seq);
    let initial_like = req.since.is_none() || req.full_state;
    let changed_after = if initial_like { None } else { Some(Changed { after: since_seq, read: true }) };
    // The state goes no further than every read lets it (`read::state_horizon`,
    // the rule of `/state`): the end of the last stay after a leave; one who
    // never joined (an invite turned down, a knock refused) gets only their
    // own membership.
    let horizon = read::state_horizon(view, access).ok();
    let (state_key, at) = match req.state_after {
        Some(field) => (field, end),
        None => ("state", start - 1),
    };
    let at = horizon.map_or(at, |h| at.min(h));
    let mut state_events =
        state_section(state, me, req, view, access, at, changed_after, &timeline_events).await?;
    if horizon.is_none() {
        state_events.retain(|e| e["type"] == "m.room.member" && e["state_key"] == me.user_id.as_str());
    }
    let mut room = json!({
        "timeline": {
            "events": format_events(state, view, &timeline_events, me, access).await?,
            "limited": limited,
            "prev_batch": history::token(start - 1),
        },
        "account_data": { "events": account_data },
    });
    room[state_key] = json!({ "events": state_events });
    Ok(room)
}

/// Receipts as the contents of `m.receipt` events, others' private ones
/// left out (only `me` sees their own). One user may hold receipts of one
/// type at one event in several threads (unthreaded and threaded, say): an
/// event's content holds one per (event, type, user), so the others go in
/// further contents (matrix-spec#1727).
pub(crate) fn receipt_contents(receipts: &[receipts::Receipt], me: &str) -> Vec<Map<String, Value>> {
    let mut contents: Vec<Map<String, Value>> = Vec::new();
    for r in receipts {
        if r.receipt_type == "m.read.private" && r.user_id != me {
            continue;
        }
        let mut receipt = json!({ "ts": r.ts });
        if !r.thread_id.is_empty() {
            receipt["thread_id"] = json!(r.thread_id);
        }
        let free = |c: &Map<String, Value>| {
            c.get(&r.event_id).is_none_or(|e| e[&r.receipt_type].get(&r.user_id).is_none())
        };
        let i = match contents.iter().position(free) {
            Some(i) => i,
            None => {
                contents.push(Map::new());
                contents.len() - 1
            }
        };
        let entry = contents[i].entry(r.event_id.clone()).or_insert_with(|| json!({}));
        entry[&r.receipt_type][&r.user_id] = receipt;
    }
    contents
}

/// The users ignored per the stored `m.ignored_user_list` content.
pub(crate) fn ignored_users(stored: Option<&str>) -> std::collections::HashSet<String> {
    let value: Value = stored.and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default();
    value["ignored_users"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

/// Whether `me`'s pending invite into `room_id` comes from a user they
/// ignore: such an invite is never shown.
async fn invited_by_ignored(
    state: &AppState,
    room_id: &str,
    me: &Requester,
    ignored: &std::collections::HashSet<String>,
) -> Result<bool> {
    if ignored.is_empty() {
        return Ok(false);
    }
    let Some(invite) = events::state_event(&state.db, room_id, "m.room.member", me.user_id.as_str()).await?
    else {
        return Ok(false);
    };
    let sender = serde_json::from_str::<Value>(&invite.json)
        .ok()
        .and_then(|e| e["sender"].as_str().map(str::to_owned));
    Ok(sender.is_some_and(|s| ignored.contains(&s)))
}

/// Stripped state for an invite or a knock: the room's identity, the
/// user's own member event and its sender's.
pub(crate) async fn invite_state(state: &AppState, view: &RoomView, me: &UserId) -> Result<Vec<Value>> {
    const TYPES: &[&str] = &crate::room::STRIPPED_STATE_TYPES;
    let mut out = Vec::new();
    let current = events::current_state(&state.db, &view.room.room_id).await?;
    let mut inviter: Option<OwnedUserId> = None;
    for stored in &current {
        let pdu = crate::room::pdu::Pdu::from_stored(&stored.event_id, &stored.json)?;
        if pdu.kind.to_string() == "m.room.member" && pdu.state_key.as_deref() == Some(me.as_str()) {
            inviter = Some(pdu.sender.clone());
        }
    }
    for stored in current {
        let pdu = crate::room::pdu::Pdu::from_stored(&stored.event_id, &stored.json)?;
        let kind = pdu.kind.to_string();
        let key = pdu.state_key.clone().unwrap_or_default();
        let keep = TYPES.contains(&kind.as_str())
            || (kind == "m.room.member"
                && (key == me.as_str() || inviter.as_ref().is_some_and(|i| i.as_str() == key)));
        if keep {
            let content: Value = pdu.content_as().unwrap_or_default();
            let mut event =
                json!({ "type": kind, "state_key": key, "content": content, "sender": pdu.sender });
            // One's own member event, and the whole create event (MSC4311:
            // clients check the room's identity from it).
            if (kind == "m.room.member" && key == me.as_str()) || kind == "m.room.create" {
                event["event_id"] = json!(pdu.event_id);
                event["origin_server_ts"] = json!(pdu.origin_server_ts);
            }
            if kind == "m.room.create" {
                event["room_id"] = json!(view.room.room_id);
            }
            out.push(event);
        }
    }
    Ok(out)
}

/// `summary`: heroes and member counts, from the current-state index.
async fn summary(state: &AppState, view: &RoomView, me: &UserId) -> Result<Value> {
    let members = read::member_summary(state, view).await?;
    let mut summary =
        json!({ "m.joined_member_count": members.joined, "m.invited_member_count": members.invited });
    if !members.named {
        let heroes: Vec<&String> =
            members.first_members.iter().filter(|u| *u != me.as_str()).take(5).collect();
        summary["m.heroes"] = json!(heroes);
    }
    Ok(summary)
}

#[cfg(test)]
mod wake_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        let t = Token { stream: 42, typing: 7, to_device: None };
        assert_eq!(Token::parse(&t.to_token()).unwrap(), t);
        let partial = Token { stream: 42, typing: 7, to_device: Some(40) };
        assert_eq!(partial.to_token(), "s42_7_40");
        assert_eq!(Token::parse("s42_7_40").unwrap(), partial);
        // A to-device position past the stream, or a fourth part, is no token.
        for bad in ["", "s", "s1", "x1_2", "s1_x", "s-_1", "s42_7_43", "s1_2_1_1", "s1_2_x"] {
            assert!(Token::parse(bad).is_err(), "{bad}");
        }
    }
}
