//! Simplified sliding sync (MSC4186 in the form Element X, matrix-rust-sdk
//! and matrix-js-sdk speak; `../shared/SLIDING-SYNC.md` is the study):
//! `POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync`.
//!
//! A request names a connection (`conn_id`, per device) and the position
//! (`pos`) its client holds; [`conn`] keeps, per position, which rooms the
//! client has and how far. The answer holds each list's `count`, the rooms
//! in the lists' ranges and the subscriptions that have something the
//! client lacks ([`room`]), and the extensions ([`ext`]). When there is
//! nothing and the client gave a `pos` and a `timeout`, the request waits
//! for the user's next change (the notifier `/sync` uses) and builds again
//! from the same position. Every read goes through the user's readable
//! ranges, as `/sync` and `/messages` do.

pub mod conn;
pub mod ext;
pub mod list;
pub mod request;
pub mod room;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use self::conn::{RoomSent, Sent, Snapshot};
use self::ext::Ext;
use self::list::{Candidate, Facts};
use self::request::Body;
use crate::account::Requester;
use crate::error::Result;
use crate::state::AppState;
use crate::storage::{account_data, events, keys, sliding};
use crate::sync::Token;

/// The most timeline events one answer is built for (the sum of the
/// `timeline_limit`s of the rooms it looks into); rooms past it come in the
/// next answer.
pub const MAX_TIMELINE_EVENTS: u64 = 10_000;

/// The longest a request waits, whatever the client asks.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// A request: the query's `pos` and `timeout` (else the body's), the body.
#[derive(Debug, Clone)]
pub struct Request {
    pub pos: Option<String>,
    pub timeout: Duration,
    pub body: Body,
}

/// Answers a sliding sync request, waiting for news up to its timeout when
/// it builds on a position and there is none yet.
pub async fn sync(state: &AppState, me: &Requester, req: Request) -> Result<Value> {
    let user = me.user_id.as_str();
    let device = me.device_id.as_str();
    let body = &req.body;
    let held = state.sliding.load(user, device, &body.conn_id, req.pos.as_deref())?;
    // The first request of a connection answers at once.
    let deadline =
        Instant::now() + if held.is_some() { req.timeout.min(MAX_TIMEOUT) } else { Duration::ZERO };
    let to_device = Ext::of(&body.extensions, "to_device");
    if to_device.enabled
        && let Some(since) = to_device.since()
    {
        // What the device says it has is dropped; what follows is read above it.
        keys::ack_to_device(&state.db, user, device, since).await?;
    }
    let mut wake = state.notifier.subscribe(user);
    let mut final_pass = false;
    // The user's room list as last read (by this request or an earlier
    // one), and the position it was read at: shared, not copied.
    let mut last = state.sliding.room_list(user);
    // The position the last pass was built at (it found nothing new), and
    // what it read besides the rooms.
    let mut last_pass: Option<i64> = None;
    let mut kept: Option<Reads> = None;
    // The rooms watched for wake-ups, and their watch.
    let mut watch: Option<(u64, crate::streams::RoomWatch<'_>)> = None;
    loop {
        wake.borrow_and_update();
        let started = Instant::now();
        let listed_at = state.streams.position();
        let candidates = room_list(state, user, last.take(), listed_at).await?;
        state.sliding.keep_room_list(user, listed_at, candidates.clone());
        last = Some((listed_at, candidates.clone()));
        let candidates: &[Arc<sliding::ListedRoom>] = &candidates;
        // A connection without lists or subscriptions (Element X's
        // encryption one) watches no room: only what wakes the user alone
        // (to-device messages, device lists, account data) concerns it.
        // Nor does a first request, which answers at once.
        let watching = held.is_some() && (!body.lists.is_empty() || !body.room_subscriptions.is_empty());
        let joined = candidates.iter().filter(|r| watching && r.open.as_deref() == Some("join"));
        // The watch stands across passes while the rooms joined stay the same.
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            joined.clone().for_each(|r| r.room_id.hash(&mut h));
            h.finish()
        };
        if watch.as_ref().is_none_or(|(held, _)| *held != fingerprint) {
            let rooms = joined.map(|r| r.room_id.clone()).collect();
            watch = Some((fingerprint, state.notifier.watch_rooms(user, rooms)));
        }
        let now = Token { stream: state.streams.position(), typing: state.typing.serial(), to_device: None };
        // The pass's reads run back to back on one held connection.
        // Woken: what moved since the last pass, from the stream log (when
        // it still reaches back that far); the rest of its reads stand.
        let moved = last_pass.and_then(|at| state.streams.changes_between(user, at, now.stream));
        let reuse = moved.and_then(|moved| kept.take().map(|reads| (reads, moved)));
        let listed_us = started.elapsed().as_micros();
        let (mut answer, news, snapshot, reads) =
            state.db.pinned(build(state, me, body, held.as_deref(), candidates, now, reuse)).await??;
        kept = Some(reads);
        tracing::debug!(
            conn = body.conn_id,
            woken = last_pass.is_some(),
            listed_us,
            built_us = started.elapsed().as_micros(),
            rooms = answer["rooms"].as_object().map_or(0, Map::len),
            "sliding sync pass"
        );
        last_pass = Some(now.stream);
        if news || held.is_none() || final_pass || Instant::now() >= deadline {
            answer["pos"] = json!(state.sliding.store(user, device, &body.conn_id, snapshot));
            tracing::debug!(
                conn = body.conn_id,
                answered_us = started.elapsed().as_micros(),
                "sliding sync answer"
            );
            if let Some(txn_id) = &body.txn_id {
                answer["txn_id"] = json!(txn_id);
            }
            return Ok(answer);
        }
        if !crate::sync::wait_for_news(state, &mut wake, now.stream, deadline).await {
            // Timed out: one last pass for what landed meanwhile.
            final_pass = true;
        }
    }
}

/// The user's rooms at `at`: read whole, or, when a woken pass has the
/// list an earlier one read and none of the user's memberships moved since,
/// that list with only the rooms that moved read again (what a long-poll
/// in a thousand rooms does on each wake-up).
async fn room_list(
    state: &AppState,
    user: &str,
    last: Option<(i64, conn::RoomList)>,
    at: i64,
) -> Result<conn::RoomList> {
    let whole = || async {
        Ok(Arc::new(sliding::rooms_of(&state.db, user, &[]).await?.into_iter().map(Arc::new).collect()))
    };
    let Some((listed_at, mut rooms)) = last else { return whole().await };
    let moved = match state.streams.changes_between(user, listed_at, at) {
        Some(moved) if !moved.my_membership => moved,
        _ => return whole().await,
    };
    let ids: Vec<&str> =
        moved.rooms.keys().map(String::as_str).filter(|id| rooms.iter().any(|r| r.room_id == *id)).collect();
    if ids.is_empty() {
        return Ok(rooms);
    }
    let fresh = sliding::rooms_of(&state.db, user, &ids).await?;
    let list = Arc::make_mut(&mut rooms);
    for fresh in fresh {
        if let Some(slot) = list.iter_mut().find(|r| r.room_id == fresh.room_id) {
            *slot = Arc::new(fresh);
        }
    }
    Ok(rooms)
}

/// The spaces a `spaces` filter names that the user is joined to, with the
/// rooms each names as children (`room::spaces::children`).
async fn space_children(
    state: &AppState,
    body: &Body,
    candidates: &[Arc<sliding::ListedRoom>],
) -> Result<HashMap<String, HashSet<String>>> {
    let mut out = HashMap::new();
    let spaces: HashSet<&String> =
        body.lists.values().filter_map(|l| l.filters.spaces.as_ref()).flatten().collect();
    for space in spaces {
        let joined = candidates.iter().any(|c| &c.room_id == space && c.open.as_deref() == Some("join"));
        if !joined {
            continue;
        }
        let children: HashSet<String> =
            crate::room::spaces::children(state, space).await?.into_iter().collect();
        out.insert(space.clone(), children);
    }
    Ok(out)
}

/// What a pass read besides the rooms, kept for the next pass of the same
/// request: a read over `(since, now]` equals the one over `(since, last
/// pass]` while no write in between touched it (the stream log says which).
#[derive(Debug, Clone)]
struct Reads {
    /// Account data changed, and the push rules, ignored users and `m.direct`.
    account: crate::sync::AccountRead,
    /// To-device messages, key counts and remote invites.
    window: keys::DeviceWindow,
    /// Device lists changed and left (read only for `e2ee` on a position).
    devices: Option<(Vec<String>, Vec<String>)>,
}

/// Builds an answer at `now` for a client holding `held`: the body (without
/// `pos`), whether it carries news, what the client holds once it has it,
/// and what was read besides the rooms. `reuse`: a woken pass's earlier
/// reads and what moved since them.
async fn build(
    state: &AppState,
    me: &Requester,
    body: &Body,
    held: Option<&Snapshot>,
    listed: &[Arc<sliding::ListedRoom>],
    now: Token,
    reuse: Option<(Reads, crate::streams::Moved)>,
) -> Result<(Value, bool, Snapshot, Reads)> {
    let user = me.user_id.as_str();
    let clock = Instant::now();
    let since = held.map_or(0, |h| h.stream);
    let (kept, log) = match reuse {
        Some((reads, moved)) => (Some(reads), Some(moved)),
        None => (None, None),
    };
    let moved_since: Option<foldhash::HashSet<String>> =
        log.as_ref().map(|m| m.rooms.keys().cloned().collect());
    // The earlier pass's reads, where the log says what they read stands.
    let standing = |stands: fn(&crate::streams::Moved) -> bool| {
        kept.as_ref().filter(|_| log.as_ref().is_some_and(stands))
    };
    let account_read = match standing(|m| !m.account_data) {
        Some(k) => k.account.clone(),
        None => {
            account_data::changed_and_wanted(
                &state.db,
                user,
                since,
                now.stream,
                &["m.push_rules", "m.ignored_user_list", "m.direct"],
            )
            .await?
        }
    };
    let (changed_data, personal) = &account_read;
    let stored = |kind: &str| personal.iter().find(|(k, _)| k == kind).map(|(_, c)| c.as_str());
    let rules = crate::notify::rules_from(state, &me.user_id, stored("m.push_rules"))?;
    let mut facts = Facts {
        direct: list::direct_rooms(stored("m.direct")),
        ignored: crate::sync::ignored_users(stored("m.ignored_user_list")),
        children: space_children(state, body, listed).await?,
    };

    // The device's to-device messages (from what it acknowledged), key
    // counts, and every pending invite into a room on another server.
    let to_device = Ext::of(&body.extensions, "to_device");
    let acked = if to_device.enabled { to_device.since().unwrap_or(0) } else { now.stream };
    let window = match standing(|m| !m.device) {
        Some(k) => k.window.clone(),
        None => {
            keys::device_window(
                &state.db,
                user,
                me.device_id.as_str(),
                acked,
                0,
                now.stream,
                to_device.limit() + 1,
            )
            .await?
        }
    };

    let read_us = clock.elapsed().as_micros();
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    for room in listed {
        let shown = match room.open.as_deref() {
            // An invite from someone ignored is never shown.
            Some("invite") if facts.ignored.contains(&room.sender) => continue,
            Some(_) => true,
            // One's own leave is listed only when it is news to this client.
            None => room.sender != user || (held.is_some() && room.stream > since),
        };
        candidates.push(Candidate { room: Cow::Borrowed(&**room), remote: None, listed: shown });
    }
    for invite in &window.remote_invites {
        let on_line = candidates.iter().any(|c| c.room.room_id == invite.room_id);
        let inviter = serde_json::from_str::<Value>(&invite.json)
            .ok()
            .and_then(|e| e["sender"].as_str().map(str::to_owned))
            .unwrap_or_default();
        if invite.rejected != 0 || on_line || facts.ignored.contains(&inviter) {
            continue;
        }
        let stripped: Value = serde_json::from_str(&invite.stripped_state).unwrap_or_else(|_| json!([]));
        candidates.push(Candidate {
            room: Cow::Owned(sliding::ListedRoom {
                room_id: invite.room_id.clone(),
                open: None,
                horizon: 0,
                stream: invite.stream,
                sender: inviter,
                room_type: None,
                encrypted: false,
                name: None,
                avatar: None,
            }),
            remote: Some((stripped, invite.membership.clone())),
            listed: true,
        });
    }
    list::sort(&mut candidates);
    let selection = list::select(body, &candidates, &facts);
    let selected_us = clock.elapsed().as_micros();
    facts.children.clear();

    // Rooms held live with the same config need a look only when something
    // landed in them since (one probe for all).
    // Configs are compared once per pair of shared configs (a list's rooms
    // share one), not once per room.
    let mut compared: Vec<(usize, usize, bool)> = Vec::new();
    let marked: Vec<(&str, bool)> = selection
        .rooms
        .iter()
        .map(|(id, config)| {
            let Some(sent) = held.and_then(|h| h.rooms.get(*id)).filter(|s| s.sent == Sent::Live) else {
                return (*id, false);
            };
            let pair = (Arc::as_ptr(&sent.config) as usize, Arc::as_ptr(config) as usize);
            let same = match compared.iter().find(|(a, b, _)| (*a, *b) == pair) {
                Some(&(_, _, same)) => same,
                None => {
                    let same = sent.config == *config;
                    compared.push((pair.0, pair.1, same));
                    same
                }
            };
            (*id, same)
        })
        .collect();
    let live = marked.iter().filter(|(_, live)| *live).count();
    let moved: foldhash::HashSet<String> = match moved_since {
        // A woken pass: the earlier one found nothing new, so only the
        // rooms the stream log says moved since can have something.
        Some(rooms) => rooms,
        None if live == 0 => foldhash::HashSet::default(),
        None => {
            let live: Vec<&str> = marked.iter().filter(|(_, live)| *live).map(|(id, _)| *id).collect();
            events::rooms_changed(&state.db, &live, since, now.stream).await?.into_iter().collect()
        }
    };
    let mut ids: Vec<&str> =
        marked.iter().filter(|(id, live)| !live || moved.contains(*id)).map(|(id, _)| *id).collect();
    // Bounded work per answer: past a budget of timeline events the other
    // rooms wait for the next answer (which the client asks for at once:
    // this one says there is news).
    let mut budget = 0;
    let deferred: foldhash::HashSet<&str> = ids
        .iter()
        .filter(|id| {
            let limit = selection.rooms.get(**id).map_or(0, |c| c.timeline_limit.max(1));
            budget += limit;
            budget > MAX_TIMELINE_EVENTS && budget != limit
        })
        .copied()
        .collect();
    if !deferred.is_empty() {
        ids.retain(|id| !deferred.contains(id));
    }
    let mut views: HashMap<String, crate::storage::rooms::RoomRow> =
        crate::storage::rooms::get_many(&state.db, &ids)
            .await?
            .into_iter()
            .map(|r| (r.room_id.clone(), r))
            .collect();

    let on_line: Vec<&str> = ids.iter().copied().filter(|id| views.contains_key(*id)).collect();
    let positions = sliding::positions(&state.db, &on_line, since, now.stream).await?;
    // The read marks of the rooms never sent (what their unread counts
    // start from), in one read.
    let never_sent: Vec<&str> =
        on_line.iter().copied().filter(|id| held.is_none_or(|h| !h.rooms.contains_key(*id))).collect();
    let marks = if never_sent.is_empty() {
        HashMap::new()
    } else {
        crate::storage::receipts::read_up_to_in(&state.db, &never_sent, user).await?
    };
    let ctx = room::Ctx { state, me, now, rules: &rules, marks: &marks };
    // The candidates looked into.
    let by_id: foldhash::HashMap<&str, &Candidate> = {
        let wanted: foldhash::HashSet<&str> = ids.iter().copied().collect();
        candidates
            .iter()
            .filter(|c| wanted.contains(c.room.room_id.as_str()))
            .map(|c| (c.room.room_id.as_str(), c))
            .collect()
    };
    let mut rooms = Map::new();
    let mut whole: HashMap<String, Vec<String>> = HashMap::new();
    let mut receipts_of: HashMap<String, Vec<crate::storage::receipts::Receipt>> = HashMap::new();
    for id in &ids {
        let (Some(candidate), Some(config)) = (by_id.get(id), selection.rooms.get(*id)) else { continue };
        let sent = held.and_then(|h| h.rooms.get(*id));
        if let Some((stripped, _)) = &candidate.remote {
            if sent.is_none_or(|_| candidate.room.stream > since) {
                // Empty `timeline` and `required_state` are sent all the
                // same: matrix-js-sdk reads both from every room.
                let mut entry = json!({
                    "invite_state": stripped,
                    "bump_stamp": candidate.room.stream,
                    "timeline": [],
                    "required_state": [],
                });
                if sent.is_none() {
                    entry["initial"] = json!(true);
                }
                rooms.insert((*id).to_owned(), entry);
            }
            continue;
        }
        let Some(row) = views.remove(*id) else { continue };
        let view = crate::room::read::view_of(row)?;
        let held_room = room::Held { sent, stream: since };
        let at = positions.get(*id).copied().unwrap_or_default();
        let built =
            room::build(&ctx, &view, candidate, config, held_room, at, facts.direct.contains(*id)).await?;
        if built.whole {
            whole.insert((*id).to_owned(), built.timeline);
        }
        receipts_of.insert((*id).to_owned(), built.receipts);
        if let Some(entry) = built.body {
            rooms.insert((*id).to_owned(), entry);
        }
    }

    // What the client holds once it has this answer: the rooms selected now
    // live, the others as far as they were.
    let rooms_us = clock.elapsed().as_micros();
    // Every room held is selected again, live with the same config: the
    // client's rooms are those of `held`, shared rather than copied.
    let unchanged =
        held.filter(|h| deferred.is_empty() && live == selection.rooms.len() && h.rooms.len() == live);
    let rooms_sent = match unchanged {
        Some(h) => h.rooms.clone(),
        None => {
            let mut sent = foldhash::HashMap::default();
            if let Some(h) = held {
                for (id, was) in h.rooms.iter() {
                    let until = match was.sent {
                        Sent::Live => h.stream,
                        Sent::Until(t) => t,
                    };
                    sent.insert(
                        id.clone(),
                        RoomSent { sent: Sent::Until(until), config: was.config.clone() },
                    );
                }
            }
            for (id, config) in selection.rooms.iter().filter(|(id, _)| !deferred.contains(*id)) {
                sent.insert((*id).to_owned(), RoomSent { sent: Sent::Live, config: config.clone() });
            }
            Arc::new(sent)
        }
    };
    let snapshot = Snapshot { stream: now.stream, typing: now.typing, rooms: rooms_sent };

    let snapshot_us = clock.elapsed().as_micros();
    let mut news = !rooms.is_empty() || !deferred.is_empty();
    let mut extensions = Map::new();
    let mut devices = None;
    if to_device.enabled {
        let limit = usize::try_from(to_device.limit()).unwrap_or(100);
        let more = window.to_device.len() > limit;
        let messages = &window.to_device[..window.to_device.len().min(limit)];
        let next = if more { messages.last().map_or(acked, |m| m.0) } else { acked.max(now.stream) };
        let events: Vec<Value> = messages
            .iter()
            .map(|(_, sender, kind, content)| {
                json!({ "sender": sender, "type": kind, "content": serde_json::from_str::<Value>(content).unwrap_or_default() })
            })
            .collect();
        news |= !events.is_empty();
        extensions.insert("to_device".into(), json!({ "next_batch": next.to_string(), "events": events }));
    }
    if Ext::of(&body.extensions, "e2ee").enabled {
        let mut e2ee = json!({
            "device_one_time_keys_count": crate::account::e2ee::otk_counts_json(&window.one_time_keys),
            "device_unused_fallback_key_types": window.fallback,
        });
        if held.is_some() {
            let (changed, left) = match standing(crate::streams::Moved::keeps_device_list_movement)
                .and_then(|k| k.devices.clone())
            {
                Some(devices) => devices,
                None => {
                    let (changed, left, _) =
                        crate::sync::device_list_movement(state, &me.user_id, since, now.stream).await?;
                    (changed, left)
                }
            };
            news |= !changed.is_empty() || !left.is_empty();
            e2ee["device_lists"] = json!({ "changed": changed, "left": left });
            devices = Some((changed, left));
        }
        extensions.insert("e2ee".into(), e2ee);
    }
    let account = Ext::of(&body.extensions, "account_data");
    if account.enabled {
        let mut global: Vec<Value> = changed_data
            .iter()
            .filter(|(room, _, _)| room.is_empty())
            .map(|(_, kind, content)| json!({ "type": kind, "content": parse(content) }))
            .collect();
        if held.is_none() && !global.iter().any(|d| d["type"] == "m.push_rules") {
            global.push(json!({ "type": "m.push_rules", "content": { "global": *rules } }));
        }
        let mut per_room = Map::new();
        // Only rooms sent whole or with data changed can have any.
        let mut maybe: Vec<&str> = whole.keys().map(String::as_str).collect();
        maybe.extend(changed_data.iter().map(|(room, _, _)| room.as_str()).filter(|r| !r.is_empty()));
        maybe.sort_unstable();
        maybe.dedup();
        maybe.retain(|id| account.covers(&selection, id));
        // What the rooms sent whole hold, all in one read.
        let sent_whole: Vec<&str> = maybe.iter().copied().filter(|id| whole.contains_key(*id)).collect();
        let mut of_whole: HashMap<String, Vec<Value>> = HashMap::new();
        if !sent_whole.is_empty() {
            for (room, kind, content) in account_data::of_rooms(&state.db, user, &sent_whole).await? {
                of_whole.entry(room).or_default().push(json!({ "type": kind, "content": parse(&content) }));
            }
        }
        for id in maybe {
            let data: Vec<Value> = if whole.contains_key(id) {
                of_whole.remove(id).unwrap_or_default()
            } else {
                changed_data
                    .iter()
                    .filter(|(room, _, _)| room == id)
                    .map(|(_, kind, content)| json!({ "type": kind, "content": parse(content) }))
                    .collect()
            };
            if !data.is_empty() {
                per_room.insert(id.to_owned(), json!(data));
            }
        }
        news |= !global.is_empty() || !per_room.is_empty();
        extensions.insert("account_data".into(), json!({ "global": global, "rooms": per_room }));
    }
    let receipts = Ext::of(&body.extensions, "receipts");
    if receipts.enabled {
        let mut per_room = Map::new();
        // Only rooms sent whole or with receipts changed can have any.
        let mut maybe: Vec<String> = whole.keys().cloned().collect();
        maybe.extend(receipts_of.iter().filter(|(_, r)| !r.is_empty()).map(|(id, _)| id.clone()));
        maybe.sort_unstable();
        maybe.dedup();
        maybe.retain(|id| receipts.covers(&selection, id));
        // Those at the timelines of the rooms sent whole, all in one read.
        let sent_whole: Vec<(&str, &[String])> = maybe
            .iter()
            .filter_map(|id| whole.get(id).map(|timeline| (id.as_str(), timeline.as_slice())))
            .collect();
        let mut of_whole: HashMap<String, Vec<crate::storage::receipts::Receipt>> = HashMap::new();
        if !sent_whole.is_empty() {
            for receipt in crate::storage::receipts::at_events_and_own(&state.db, &sent_whole, user).await? {
                of_whole.entry(receipt.room_id.clone()).or_default().push(receipt);
            }
        }
        for id in maybe.iter().map(String::as_str) {
            let found = if whole.contains_key(id) {
                of_whole.remove(id).unwrap_or_default()
            } else {
                receipts_of.remove(id).unwrap_or_default()
            };
            if let Some(event) = ext::receipt_event(&found, user) {
                per_room.insert(id.to_owned(), event);
            }
        }
        news |= !per_room.is_empty();
        extensions.insert("receipts".into(), json!({ "rooms": per_room }));
    }
    let typing = Ext::of(&body.extensions, "typing");
    if typing.enabled {
        let mut per_room = Map::new();
        // No typing notice moved since the client's position: only rooms
        // sent whole (all who type now) are looked at.
        // Else the rooms where it moved, when fewer than those selected.
        let quiet = held.is_some_and(|h| h.typing == now.typing);
        let mut maybe: Vec<&str> = whole.keys().map(String::as_str).collect();
        let moved = match held {
            Some(h) if !quiet => state.typing.rooms_changed(h.typing, now.typing, selection.rooms.len()),
            _ => Some(Vec::new()),
        };
        match &moved {
            Some(rooms) => {
                maybe.extend(rooms.iter().map(String::as_str).filter(|id| selection.rooms.contains_key(id)))
            }
            None => maybe = selection.rooms.keys().copied().collect(),
        }
        maybe.sort_unstable();
        maybe.dedup();
        maybe.retain(|id| typing.covers(&selection, id));
        let joined: foldhash::HashSet<&str> = if maybe.is_empty() {
            foldhash::HashSet::default()
        } else {
            let wanted: foldhash::HashSet<&str> = maybe.iter().copied().collect();
            candidates
                .iter()
                .filter(|c| c.membership() == Some("join") && wanted.contains(c.room.room_id.as_str()))
                .map(|c| c.room.room_id.as_str())
                .collect()
        };
        for id in maybe.into_iter().filter(|id| joined.contains(id)) {
            let from = if whole.contains_key(id) { None } else { held.map(|h| h.typing) };
            if let Some(users) = state.typing.changed_since(id, from, now.typing) {
                per_room
                    .insert(id.to_owned(), json!({ "type": "m.typing", "content": { "user_ids": users } }));
            }
        }
        news |= !per_room.is_empty();
        extensions.insert("typing".into(), json!({ "rooms": per_room }));
    }

    tracing::debug!(
        read_us,
        selected_us,
        rooms_us,
        snapshot_us,
        extensions_us = clock.elapsed().as_micros(),
        "sliding sync build"
    );
    let lists: Map<String, Value> = selection
        .lists
        .iter()
        .map(|(name, (count, _))| ((*name).to_owned(), json!({ "count": count })))
        .collect();
    let answer = json!({ "lists": lists, "rooms": rooms, "extensions": extensions });
    Ok((answer, news, snapshot, Reads { account: account_read, window, devices }))
}

fn parse(content: &str) -> Value {
    serde_json::from_str(content).unwrap_or_else(|_| json!({}))
}
