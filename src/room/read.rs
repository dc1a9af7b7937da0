//! The read side of rooms: loading stored events, a user's membership history
//! in a room (the changes on the seq line, from which `unsigned.membership` and
//! — in the membership-ranges work — every visibility decision follow), and the
//! client formatting of what was loaded.

use ruma::room_version_rules::RoomVersionRules;
use ruma::{RoomId, UserId};
use serde_json::Value;

use std::sync::Arc;

use ruma::events::room::power_levels::RoomPowerLevels;

use super::cache::{HeadState, MAX_HEAD_STATE_BYTES, MemberSummary, RoomInputs, UserInputs};
use super::format::{Viewer, client_event};
use super::pdu::Pdu;
use super::visibility::{self, Hv, HvLine, Inputs, SeqRanges};
use crate::account::Requester;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events::{self, StoredEvent};
use crate::storage::memberships;
use crate::storage::rooms::{self, RoomRow};

/// A room opened for reading.
#[derive(Debug, Clone)]
pub struct RoomView {
    /// Its row.
    pub room: RoomRow,
    /// Its version's rules.
    pub rules: RoomVersionRules,
}

/// The answer for a room the caller is not in, and for a room that does not
/// exist: the same, so that no answer tells which room ids exist.
pub fn not_a_member() -> Error {
    Error::Forbidden("You are not a member of this room".into())
}

/// Opens a room; an unknown room is the 403 of [`not_a_member`].
pub async fn open(state: &AppState, room_id: &RoomId) -> Result<RoomView> {
    view_of(rooms::get(&state.db, room_id.as_str()).await?.ok_or_else(not_a_member)?)
}

/// How long [`kept_row`] uses a row it kept, at most.
const KEPT_ROW_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens a room for what moves only with state events (membership, the
/// server ACL, the room version): a typing notice of ours, another server's
/// EDUs, another server's event's version. See [`kept_row`].
pub async fn open_kept(state: &AppState, room_id: &RoomId) -> Result<RoomView> {
    view_of(kept_row(state, room_id).await?.ok_or_else(not_a_member)?)
}

/// A room's row (`None`: we do not have the room), kept from an earlier
/// call while the stream log shows no state event in the room since (and
/// for 5 seconds at most): the row's head (last seq, extremities) may be
/// older than the room's.
pub async fn kept_row(state: &AppState, room_id: &RoomId) -> Result<Option<RoomRow>> {
    let now = state.streams.position();
    if let Some((at, read, row)) = state.read_cache.row(room_id.as_str())
        && read.elapsed() < KEPT_ROW_FOR
        && state.streams.state_moved_between(room_id.as_str(), at, now) == Some(false)
    {
        return Ok(Some(row));
    }
    // The position before the row: the row is at least as new.
    let Some(row) = rooms::get(&state.db, room_id.as_str()).await? else { return Ok(None) };
    state.read_cache.put_row(now, row.clone());
    Ok(Some(row))
}

/// A room opened from its row (read with others, say).
pub fn view_of(room: RoomRow) -> Result<RoomView> {
    let (_, rules) = super::rules_for(&room.room_version)?;
    Ok(RoomView { room, rules })
}

/// One user's membership changes in one room, in seq order.
#[derive(Debug, Clone, Default)]
pub struct MembershipHistory {
    changes: Vec<(i64, String)>,
}

impl MembershipHistory {
    /// Loads the history.
    pub async fn load(state: &AppState, room_id: &RoomId, user_id: &UserId) -> Result<Self> {
        let changes = events::membership_changes(&state.db, room_id.as_str(), user_id.as_str()).await?;
        Ok(Self::from_changes(&changes))
    }

    fn from_changes(changes: &[events::MemberChange]) -> Self {
        Self { changes: changes.iter().map(|c| (c.seq, c.membership.clone())).collect() }
    }

    /// The membership in force after the event at `seq` ("leave" before any).
    pub fn at(&self, seq: i64) -> &str {
        let idx = self.changes.partition_point(|(s, _)| *s <= seq);
        if idx == 0 { "leave" } else { &self.changes[idx - 1].1 }
    }

    /// The current membership.
    pub fn current(&self) -> &str {
        self.changes.last().map_or("leave", |(_, m)| m.as_str())
    }
}

/// What one user may read in one room: the answer of
/// [`visibility::visible`] plus the membership history behind it.
#[derive(Debug, Clone)]
pub struct Access {
    /// Readable seqs.
    pub ranges: SeqRanges,
    /// Membership changes, for `unsigned.membership`.
    pub history: MembershipHistory,
    /// The membership ranges themselves.
    pub stays: Vec<memberships::Range>,
    /// The room's history visibility is `world_readable` now.
    pub world_readable_now: bool,
}

impl Access {
    /// Joined now.
    pub fn joined(&self) -> bool {
        self.history.current() == "join"
    }

    /// Was ever joined or invited (a knock alone makes no member).
    pub fn ever_member(&self) -> bool {
        self.stays.iter().any(|r| r.kind != "knock")
    }

    /// The seq at which the user's view of the room's state ends: now for
    /// members, the end of their last stay for those who left.
    pub fn state_horizon(&self, last_seq: i64) -> i64 {
        if self.joined() {
            return last_seq;
        }
        self.stays.iter().filter(|r| r.kind == "join").filter_map(|r| r.max_seq).max().unwrap_or(last_seq)
    }
}

/// The room's slowly changing read inputs, from the cache while the room's
/// read epoch stands still.
async fn room_inputs(state: &AppState, view: &RoomView) -> Result<Arc<RoomInputs>> {
    let room_id = view.room.room_id.as_str();
    if let Some(kept) = state.read_cache.room(room_id, view.room.read_epoch) {
        return Ok(kept);
    }
    let hv = hv_line(state, room_id).await?;
    let max_lifetime = match events::state_event(&state.db, room_id, "m.room.retention", "").await? {
        Some(stored) => Pdu::from_stored(&stored.event_id, &stored.json)?
            .content_as::<Value>()
            .and_then(|c| c["max_lifetime"].as_i64())
            .filter(|m| *m > 0)
            .map(|m| state.settings.history.clamp_lifetime(m)),
        None => None,
    };
    Ok(state.read_cache.put_room(room_id, view.room.read_epoch, hv, max_lifetime))
}

/// One user's read inputs in the room, from the cache while the room's read
/// epoch stands still.
async fn user_inputs(
    state: &AppState,
    view: &RoomView,
    room: &RoomInputs,
    user_id: &UserId,
) -> Result<Arc<UserInputs>> {
    if let Some(kept) = room.user(user_id.as_str()) {
        return Ok(kept);
    }
    let room_id = view.room.room_id.as_str();
    let (changes, stays, floor) = memberships::member_inputs(&state.db, room_id, user_id.as_str()).await?;
    let inputs = UserInputs {
        history: MembershipHistory::from_changes(&changes),
        display_name: changes.last().and_then(|c| c.display_name.clone()),
        stays,
        floor,
    };
    Ok(room.put_user(user_id.as_str(), inputs))
}

/// The display name in the user's current member event of the room.
pub async fn display_name(state: &AppState, view: &RoomView, user_id: &UserId) -> Result<Option<String>> {
    let room = room_inputs(state, view).await?;
    Ok(user_inputs(state, view, &room, user_id).await?.display_name.clone())
}

/// The room's current power levels (kept while its read epoch stands still).
pub async fn power_levels(state: &AppState, view: &RoomView) -> Result<RoomPowerLevels> {
    let room = room_inputs(state, view).await?;
    room.power.get_or_try_init(|| super::power::load(state, view)).await.cloned()
}

/// The room's member counts and first members (kept while its read epoch
/// stands still).
pub async fn member_summary(state: &AppState, view: &RoomView) -> Result<MemberSummary> {
    let room = room_inputs(state, view).await?;
    let load = || async {
        let room_id = view.room.room_id.as_str();
        let counts = events::member_counts(&state.db, room_id).await?;
        let count = |m: &str| counts.iter().find(|(k, _)| k == m).map_or(0, |(_, n)| *n);
        let named = events::state_event(&state.db, room_id, "m.room.name", "").await?.is_some()
            || events::state_event(&state.db, room_id, "m.room.canonical_alias", "").await?.is_some();
        Ok::<_, Error>(MemberSummary {
            joined: count("join"),
            invited: count("invite"),
            named,
            first_members: events::some_members(&state.db, room_id, 6).await?,
        })
    };
    room.members.get_or_try_init(load).await.cloned()
}

/// The room's state at seq `end` but its member events, in seq order: kept
/// with the room's read inputs when read at the head (see
/// [`super::cache::HeadState`]), so the rooms' first syncs and sliding
/// answers do not each read the same few events again.
pub async fn state_without_members(
    state: &AppState,
    view: &RoomView,
    end: i64,
) -> Result<Arc<[StoredEvent]>> {
    let room = room_inputs(state, view).await?;
    let head = view.room.last_seq;
    if let Some(Some(kept)) = room.state.get()
        && kept.at <= end
        && end <= head
    {
        return Ok(kept.events.clone());
    }
    let read: Arc<[StoredEvent]> =
        events::state_at_without_members(&state.db, view.room.room_id.as_str(), end).await?.into();
    if end == head {
        let bytes: usize = read.iter().map(|e| e.json.len()).sum();
        let kept = (bytes <= MAX_HEAD_STATE_BYTES).then(|| HeadState { at: end, events: read.clone() });
        // Another request may have kept the same state meanwhile.
        let _ = room.state.set(kept);
    }
    Ok(read)
}

/// [`state_without_members`] and the member events of `users` at `end`,
/// in seq order: the state a lazy-loading read sends.
pub async fn lazy_state(
    state: &AppState,
    view: &RoomView,
    users: &[&str],
    end: i64,
) -> Result<Vec<StoredEvent>> {
    let mut rows = state_without_members(state, view, end).await?.to_vec();
    rows.extend(members_at(state, view, users, end).await?);
    rows.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.event_id.cmp(&b.event_id)));
    Ok(rows)
}

/// The member events of `users` at seq `end` (those that have one), in seq
/// order. Those read at the head are kept for later reads in the same read
/// epoch (see [`super::cache::KeptMember`]): the senders of a timeline, and
/// the reader, are read once, not by every sync that shows them.
pub async fn members_at(
    state: &AppState,
    view: &RoomView,
    users: &[&str],
    end: i64,
) -> Result<Vec<StoredEvent>> {
    let room_id = view.room.room_id.as_str();
    let (epoch, head) = (view.room.read_epoch, view.room.last_seq);
    let mut out = Vec::with_capacity(users.len());
    let mut missing = Vec::new();
    if end <= head {
        for (user, kept) in users.iter().zip(state.read_cache.members(room_id, epoch, end, users)) {
            match kept {
                Some(kept) => out.extend(kept.event),
                None => missing.push(*user),
            }
        }
    } else {
        missing.extend_from_slice(users);
    }
    if !missing.is_empty() {
        let read = events::members_at(&state.db, room_id, &missing, end).await?;
        if end == head {
            let by_user: std::collections::HashMap<String, &StoredEvent> =
                read.iter().filter_map(|e| member_key(e).map(|user| (user, e))).collect();
            let found = missing
                .iter()
                .map(|user| ((*user).to_owned(), by_user.get(*user).map(|e| (*e).clone())))
                .collect();
            state.read_cache.put_members(room_id, epoch, head, found);
        }
        out.extend(read);
    }
    out.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.event_id.cmp(&b.event_id)));
    // A user named twice is sent once.
    out.dedup_by(|a, b| a.event_id == b.event_id);
    Ok(out)
}

/// The user a member event as stored is about (`None`: not a member event).
pub fn member_key(stored: &StoredEvent) -> Option<String> {
    let pdu = Pdu::from_stored(&stored.event_id, &stored.json).ok()?;
    (pdu.kind.to_string() == "m.room.member").then_some(pdu.state_key).flatten()
}

/// The floor below which nothing is returned: the room's own, the user's own,
/// and `m.room.retention`'s `max_lifetime`.
async fn floor(state: &AppState, view: &RoomView, max_lifetime: Option<i64>, user_floor: i64) -> Result<i64> {
    let room_id = view.room.room_id.as_str();
    let mut floor = view.room.floor_seq.max(user_floor);
    if let Some(max_lifetime) = max_lifetime {
        let since = crate::storage::now_ms() - max_lifetime;
        // Nothing young enough: the floor goes just above the head (an
        // exclusive bound: positions are sparse, the next event lies higher).
        let first =
            events::first_seq_since(&state.db, room_id, since).await?.unwrap_or(view.room.last_seq + 1);
        if first > view.room.floor_seq {
            // Aged-out history is gone for good: the room's floor moves up
            // and stays there, whatever the setting later says.
            crate::storage::rooms::raise_floor(&state.db, room_id, first).await?;
        }
        floor = floor.max(first);
    }
    Ok(floor)
}

/// The room's history visibility along its seq line.
async fn hv_line(state: &AppState, room_id: &str) -> Result<HvLine> {
    let mut changes = Vec::new();
    for (seq, json) in events::state_changes(&state.db, room_id, "m.room.history_visibility", "").await? {
        let hv = match json {
            Some(json) => {
                let value: Value = serde_json::from_str(&json).unwrap_or_default();
                value["content"]["history_visibility"].as_str().map_or(Hv::Joined, Hv::parse)
            }
            // No history visibility: the spec's default.
            None => Hv::Shared,
        };
        changes.push((seq, hv));
    }
    Ok(HvLine { changes })
}

/// Works out what `user_id` may read in the room.
pub async fn access(state: &AppState, view: &RoomView, user_id: &UserId) -> Result<Access> {
    let room = room_inputs(state, view).await?;
    let user = user_inputs(state, view, &room, user_id).await?;
    let floor = floor(state, view, room.max_lifetime, user.floor).await?;
    let ranges = visibility::visible(&Inputs {
        ranges: &user.stays,
        hv: &room.hv,
        last_seq: view.room.last_seq,
        floor,
    });
    let world_readable_now = room.hv.changes.last().is_some_and(|(_, v)| *v == Hv::WorldReadable);
    Ok(Access { ranges, history: user.history.clone(), stays: user.stays.clone(), world_readable_now })
}

/// What another server may be sent of the room ([`visibility::server_visible`]
/// over the union of its users' ranges, above the room's floors). A server
/// none of whose users is joined now, or that the room's server ACL denies,
/// is refused (403), as Synapse does.
pub async fn server_access(
    state: &AppState,
    view: &RoomView,
    server: &ruma::ServerName,
) -> Result<SeqRanges> {
    let room_id = view.room.room_id.as_str();
    if !crate::storage::federation::server_in_room(&state.db, room_id, server.as_str()).await? {
        return Err(Error::Forbidden(format!("{server} is not in this room")));
    }
    crate::federation::acl::check(state, room_id, server).await?;
    let room = room_inputs(state, view).await?;
    let floor = floor(state, view, room.max_lifetime, 0).await?;
    let rows = memberships::server_ranges(&state.db, room_id, server.as_str()).await?;
    Ok(visibility::server_visible(&rows, &room.hv, view.room.last_seq, floor))
}

/// The servers with a user joined to the room now, in name order (kept
/// while its read epoch stands still).
pub async fn servers_in_room(state: &AppState, view: &RoomView) -> Result<Vec<String>> {
    let room = room_inputs(state, view).await?;
    let load = || crate::storage::federation::servers_in_room(&state.db, view.room.room_id.as_str());
    room.servers.get_or_try_init(load).await.cloned()
}

/// The content of the room's current `m.room.server_acl`, if it has one
/// (kept while its read epoch stands still).
pub async fn server_acl(state: &AppState, view: &RoomView) -> Result<Option<Value>> {
    let room = room_inputs(state, view).await?;
    let load = || async {
        let room_id = view.room.room_id.as_str();
        let Some(stored) = events::state_event(&state.db, room_id, "m.room.server_acl", "").await? else {
            return Ok::<_, Error>(None);
        };
        let mut event: Value = serde_json::from_str(&stored.json).unwrap_or_default();
        Ok(Some(event["content"].take()))
    };
    room.acl.get_or_try_init(load).await.cloned()
}

/// [`require_joined`] in an open room, from the membership history kept
/// while its read epoch stands still.
pub async fn require_joined_in(state: &AppState, view: &RoomView, user_id: &UserId) -> Result<()> {
    let room = room_inputs(state, view).await?;
    refuse_unless_joined(&user_inputs(state, view, &room, user_id).await?.history)
}

/// The one refusal of [`require_joined`] and [`require_joined_in`].
fn refuse_unless_joined(history: &MembershipHistory) -> Result<()> {
    if history.current() != "join" {
        return Err(Error::Forbidden("You are not joined to this room".into()));
    }
    Ok(())
}

/// Refuses users who are not joined to the room now.
pub async fn require_joined(
    state: &AppState,
    room_id: &RoomId,
    user_id: &UserId,
) -> Result<MembershipHistory> {
    let history = MembershipHistory::load(state, room_id, user_id).await?;
    refuse_unless_joined(&history)?;
    Ok(history)
}

/// A stored event with what serving it needs.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The row.
    pub stored: StoredEvent,
    /// The parsed PDU.
    pub pdu: Pdu,
    /// The redaction that redacted it.
    pub redaction: Option<Pdu>,
    /// Its sender was erased: served redacted to whoever was not joined
    /// when it was sent.
    pub sender_erased: bool,
}

/// Loads an event with its redaction, if any.
pub async fn load(state: &AppState, stored: StoredEvent) -> Result<Loaded> {
    let pdu = Pdu::from_stored(&stored.event_id, &stored.json)?;
    let redaction = match &stored.redacted_by {
        Some(id) => match events::by_id(&state.db, id).await? {
            Some(r) => Some(Pdu::from_stored(&r.event_id, &r.json)?),
            None => None,
        },
        None => None,
    };
    let sender_erased = {
        let erased = state.erased.read().unwrap_or_else(|e| e.into_inner());
        !erased.is_empty() && erased.contains(pdu.sender.as_str())
    };
    Ok(Loaded { stored, pdu, redaction, sender_erased })
}

/// Loads an event by id; 404 when unknown.
pub async fn load_by_id(state: &AppState, event_id: &str) -> Result<Loaded> {
    let stored =
        events::by_id(&state.db, event_id).await?.ok_or_else(|| Error::NotFound("Event not found".into()))?;
    load(state, stored).await
}

/// Formats loaded events for `requester`, with `unsigned.membership` from
/// `history`.
pub fn format(view: &RoomView, loaded: &Loaded, requester: &Requester, history: &MembershipHistory) -> Value {
    let membership = history.at(loaded.stored.seq);
    let mut event = client_event(
        &loaded.stored,
        &loaded.pdu,
        &view.rules,
        loaded.redaction.as_ref(),
        Some(Viewer { requester, membership }),
    );
    // An erased sender's event, to someone who was not joined when it was
    // sent: its content as a redaction leaves it.
    if loaded.sender_erased && loaded.redaction.is_none() && membership != "join" {
        event["content"] = super::format::redacted_content(&loaded.pdu, &view.rules);
    }
    event
}

/// Formats a page of events for `requester` as [`format`] does, each with
/// its bundled aggregations (`unsigned.m.relations`, see
/// [`super::relations::bundles`]): the one formatting path of every event
/// served to clients in a timeline.
pub async fn format_events(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    requester: &Requester,
    events: &[&Loaded],
) -> Result<Vec<Value>> {
    let mut bundles = super::relations::bundles(state, view, access, requester, events).await?;
    Ok(events
        .iter()
        .map(|loaded| {
            let mut event = format(view, loaded, requester, &access.history);
            if let Some(bundle) = bundles.remove(loaded.pdu.event_id.as_str()) {
                event["unsigned"]["m.relations"] = bundle;
            }
            event
        })
        .collect())
}

/// [`format_events`] of one event.
pub async fn format_event(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    requester: &Requester,
    loaded: &Loaded,
) -> Result<Value> {
    let mut out = format_events(state, view, access, requester, &[loaded]).await?;
    Ok(out.pop().unwrap_or_default())
}

/// The seq as of which a user may see the room's state (see
/// [`visible_state`]); 403 for one who may see none of it.
pub fn state_horizon(view: &RoomView, access: &Access) -> Result<i64> {
    let last = view.room.last_seq;
    if access.joined() {
        Ok(last)
    } else if access.stays.iter().any(|r| r.kind == "join") {
        Ok(access.state_horizon(last))
    } else if access.world_readable_now {
        // Anyone may look into a world-readable room (an invitee too).
        Ok(last)
    } else {
        Err(not_a_member())
    }
}

/// One state event (type, state key) a user may see, by the rules of
/// [`visible_state`]: one index lookup, whatever the size of the state.
pub async fn visible_state_event(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    kind: &str,
    state_key: &str,
) -> Result<Option<Loaded>> {
    let horizon = state_horizon(view, access)?;
    let room_id = view.room.room_id.as_str();
    let stored = if horizon == view.room.last_seq {
        events::state_event(&state.db, room_id, kind, state_key).await?
    } else {
        events::state_event_at(&state.db, room_id, kind, state_key, horizon).await?
    };
    match stored {
        Some(s) => Ok(Some(load(state, s).await?)),
        None => Ok(None),
    }
}

/// The room state a user may see: current state while joined (or for anyone
/// when the room is world-readable), the state as of their leave after they
/// left, 403 for a room they were never in. `at` narrows it to an earlier point.
pub async fn visible_state(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    at: Option<i64>,
) -> Result<Vec<Loaded>> {
    let last = view.room.last_seq;
    let horizon = state_horizon(view, access)?;
    let at = at.map_or(horizon, |a| a.min(horizon));
    let stored = if at == last {
        events::current_state(&state.db, &view.room.room_id).await?
    } else {
        events::state_at(&state.db, &view.room.room_id, at).await?
    };
    let mut out = Vec::with_capacity(stored.len());
    for s in stored {
        out.push(load(state, s).await?);
    }
    Ok(out)
}
