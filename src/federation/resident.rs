//! The resident side of federation: another server's user joins, knocks on
//! or leaves a room of ours (make_join / send_join, make_knock / send_knock,
//! make_leave / send_leave), and other
//! servers in a room ask for its events and state (`/event`, `/state`,
//! `/state_ids`, `/event_auth`, `/backfill`, `/get_missing_events`). What a
//! server may be sent follows `read::server_access` (403 for a server with
//! no user in the room; events it may not see go out redacted).

use std::collections::{HashSet, VecDeque};

use ruma::api::federation::membership::RawStrippedState;
use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::events::TimelineEventType;
use ruma::{EventId, OwnedEventId, RoomId, RoomVersionId, ServerName, UserId};
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::room::pdu::{Draft, Pdu};
use crate::room::read::{self, RoomView};
use crate::room::timeline::{self, RoomWriter};
use crate::room::version;
use crate::room::visibility::SeqRanges;
use crate::state::AppState;
use crate::storage::events::{self, StoredEvent};
use crate::storage::federation as store;
use crate::storage::outliers::Held;

/// Most events one `/backfill` answers (Synapse's cap).
pub const MAX_BACKFILL: usize = 100;

/// Most events one `/get_missing_events` answers (Synapse's cap).
pub const MAX_MISSING: usize = 20;

/// Opens a room for another server's request; an unknown room, or one we
/// are no longer in, is 404 (Synapse's "Unknown room").
async fn open_room(state: &AppState, room_id: &RoomId) -> Result<RoomView> {
    let view = read::open(state, room_id).await.map_err(|_| unknown_room(room_id))?;
    if !store::server_in_room(&state.db, room_id.as_str(), state.settings.server_name.as_str()).await? {
        return Err(unknown_room(room_id));
    }
    Ok(view)
}

fn unknown_room(room_id: &RoomId) -> Error {
    Error::NotFound(format!("Room {room_id} is not known here"))
}

/// The member event `user_id` would send (make_join, make_leave): checked
/// against the room's rules now, returned unsigned, without hashes, with its
/// room's version. `ver` is what the asking server supports (make_join).
pub async fn make_membership(
    state: &AppState,
    origin: &ServerName,
    room_id: &RoomId,
    user_id: &UserId,
    membership: &str,
    ver: Option<&[RoomVersionId]>,
) -> Result<(RoomVersionId, Box<RawJsonValue>)> {
    if user_id.server_name() != origin {
        return Err(Error::Forbidden(format!("{origin} cannot act for {user_id}")));
    }
    let view = open_room(state, room_id).await?;
    super::acl::check(state, room_id.as_str(), origin).await?;
    let (version, _) = crate::room::rules_for(&view.room.room_version)?;
    version::check_federates(&version)?;
    if let Some(ver) = ver {
        // The spec's default when the asking server names none: version 1 only.
        let supported = if ver.is_empty() { &[RoomVersionId::V1][..] } else { ver };
        if !supported.contains(&version) {
            return Err(Error::IncompatibleRoomVersion { room_version: version.to_string() });
        }
    }
    if membership == "knock" && !view.rules.authorization.knocking {
        // The spec's answer to a knock on a room whose version has none.
        return Err(Error::IncompatibleRoomVersion { room_version: version.to_string() });
    }
    let mut content = CanonicalJsonObject::new();
    content.insert("membership".into(), CanonicalJsonValue::String(membership.into()));
    let draft = Draft {
        kind: "m.room.member".into(),
        state_key: Some(user_id.to_string()),
        content,
        sender: user_id.to_owned(),
        redacts: None,
    };
    let mut writer = RoomWriter::open(state, room_id).await?;
    let pdu = writer.template(state, &draft).await?;
    drop(writer);
    let mut object = pdu.canonical()?;
    for field in ["signatures", "hashes", "event_id", "unsigned"] {
        object.remove(field);
    }
    let raw = serde_json::value::to_raw_value(&object).map_err(|e| Error::Internal(e.to_string()))?;
    Ok((version, raw))
}

/// The user a member event names in `join_authorised_via_users_server`, if
/// any (the event is checked after).
fn authoriser_of(raw: &RawJsonValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Content {
        #[serde(rename = "join_authorised_via_users_server")]
        authoriser: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Event {
        content: Content,
    }
    serde_json::from_str::<Event>(raw.get()).ok()?.content.authoriser
}

/// What send_join answers.
pub struct Joined {
    /// The room's state before the join.
    pub state: Vec<Box<RawJsonValue>>,
    /// The auth chain of that state and of the join.
    pub auth_chain: Vec<Box<RawJsonValue>>,
    /// The join as stored (with our signature when we authorised it).
    pub event: Box<RawJsonValue>,
    /// The servers in the room.
    pub servers_in_room: Vec<String>,
    /// The state leaves out member events (the joiner asked: omit_members).
    pub members_omitted: bool,
}

/// Takes another server's signed member event (send_join, send_leave):
/// checked like every remote PDU, it must be `user`'s own `membership`
/// event for this room under the id the path names, sent by `origin`.
/// A join that names one of our users as its authoriser (restricted rooms)
/// is signed by us too, and placed only if the joiner meets the room's
/// restricted rule (the write path checks it); one naming another server's
/// user is refused. Appended, then forwarded to the room's other servers.
pub async fn send_membership(
    state: &AppState,
    origin: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
    raw: &RawJsonValue,
    membership: &str,
) -> Result<(RoomView, Pdu, i64)> {
    let view = open_room(state, room_id).await?;
    super::acl::check(state, room_id.as_str(), origin).await?;
    version::check_federates(&crate::room::rules_for(&view.room.room_version)?.0)?;
    let pdu = match authoriser_of(raw).filter(|_| membership == "join") {
        Some(authoriser) => {
            // send_join is for the joins we authorise: ours to countersign.
            let authoriser = UserId::parse(&authoriser)
                .map_err(|e| Error::BadJson(format!("Invalid authorising user: {e}")))?;
            if authoriser.server_name() != state.settings.server_name {
                return Err(Error::Forbidden(format!(
                    "{authoriser} is not a user of this server: this server authorises only its own users' joins"
                )));
            }
            super::incoming::check_pdu_to_countersign(state, &view.rules, raw).await?
        }
        None => super::incoming::check_pdu(state, &view.rules, raw).await?,
    };
    if pdu.event_id != event_id {
        return Err(Error::BadJson(format!("The event's id is {}, not {event_id}", pdu.event_id)));
    }
    if pdu.room_id.as_deref() != Some(room_id) {
        return Err(Error::BadJson("The event belongs to another room".into()));
    }
    let content = pdu.content_as::<serde_json::Value>().unwrap_or_default();
    if pdu.kind != TimelineEventType::RoomMember
        || pdu.state_key.as_deref() != Some(pdu.sender.as_str())
        || content["membership"] != membership
    {
        return Err(Error::BadJson(format!("The event is not its sender's own {membership} event")));
    }
    if pdu.sender.server_name() != origin {
        return Err(Error::Forbidden(format!("{origin} cannot act for {}", pdu.sender)));
    }
    let appended = timeline::append_remote(state, room_id, pdu, true).await?;
    Ok((view, appended.pdu, appended.seq))
}

/// The answer to send_join: the state before the join (with
/// `omit_members`, without most member events), its auth chain with the
/// join's, the join as stored, the servers in the room.
pub async fn send_join(
    state: &AppState,
    origin: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
    raw: &RawJsonValue,
    omit_members: bool,
) -> Result<Joined> {
    let (_, pdu, seq) = send_membership(state, origin, room_id, event_id, raw, "join").await?;
    let mut before = events::state_at(&state.db, room_id.as_str(), seq - 1).await?;
    let whole = before.len();
    if omit_members {
        // A partial join (the joiner fetches the rest later): the state
        // without member events, but for those the join's auth needs and the
        // few members a client names the room after.
        let heroes: HashSet<String> =
            events::some_members(&state.db, room_id.as_str(), MAX_HEROES).await?.into_iter().collect();
        let needed: HashSet<&str> = pdu.auth_events.iter().map(|id| id.as_str()).collect();
        let mut kept = Vec::with_capacity(before.len());
        for stored in before {
            let event = Pdu::from_stored(&stored.event_id, &stored.json)?;
            let member = event.kind == TimelineEventType::RoomMember;
            let hero = event.state_key.as_ref().is_some_and(|k| heroes.contains(k));
            if !member || hero || needed.contains(stored.event_id.as_str()) {
                kept.push(stored);
            }
        }
        before = kept;
    }
    let mut roots: Vec<OwnedEventId> =
        before.iter().filter_map(|e| EventId::parse(&e.event_id).ok()).collect();
    roots.push(pdu.event_id.clone());
    let chain = auth_chain(state, &roots).await?;
    let before_len = before.len();
    Ok(Joined {
        state: before.into_iter().map(|e| raw_json(e.json)).collect::<Result<_>>()?,
        auth_chain: raw_held(chain)?,
        event: raw_json(pdu.to_json_string())?,
        servers_in_room: store::servers_in_room(&state.db, room_id.as_str()).await?,
        // Said only when something was left out: a small room's join is whole.
        members_omitted: before_len < whole,
    })
}

/// send_knock: the knock checked and placed like a join through us
/// ([`send_membership`]: local members see it and may invite or refuse);
/// answers the room's stripped state for the knocker's client.
pub async fn send_knock(
    state: &AppState,
    origin: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
    raw: &RawJsonValue,
) -> Result<Vec<RawStrippedState>> {
    send_membership(state, origin, room_id, event_id, raw, "knock").await?;
    stripped_state(state, room_id, None).await
}

/// The room's stripped state another server's user is sent with an invite
/// or a knock: the room's identity events (`room::STRIPPED_STATE_TYPES`)
/// and `member`'s member event, as PDUs.
pub async fn stripped_state(
    state: &AppState,
    room_id: &RoomId,
    member: Option<&UserId>,
) -> Result<Vec<RawStrippedState>> {
    let mut stripped = Vec::new();
    for kind in crate::room::STRIPPED_STATE_TYPES {
        if let Some(stored) = events::state_event(&state.db, room_id.as_str(), kind, "").await? {
            stripped.push(RawStrippedState::Pdu(raw_json(stored.json)?));
        }
    }
    if let Some(member) = member
        && let Some(stored) =
            events::state_event(&state.db, room_id.as_str(), "m.room.member", member.as_str()).await?
    {
        stripped.push(RawStrippedState::Pdu(raw_json(stored.json)?));
    }
    Ok(stripped)
}

/// Members kept in a partial join's state for the room's name (the spec's
/// heroes are at most 5).
const MAX_HEROES: i64 = 5;

fn raw_json(json: String) -> Result<Box<RawJsonValue>> {
    RawJsonValue::from_string(json).map_err(|e| Error::Internal(format!("stored event: {e}")))
}

/// The auth chain of `roots` (their auth events, theirs, and so on), placed
/// events and outliers alike (a room joined over federation starts with
/// its auth events as outliers).
async fn auth_chain(state: &AppState, roots: &[OwnedEventId]) -> Result<Vec<Held>> {
    let ids: Vec<&str> = roots.iter().map(|id| id.as_str()).collect();
    crate::storage::dag::auth_chain(&state.db, &ids).await
}

/// Held events as JSON for an answer.
pub fn raw_held(events: Vec<Held>) -> Result<Vec<Box<RawJsonValue>>> {
    events.into_iter().map(|e| raw_json(e.json)).collect()
}

/// An event as `server` may be sent it: whole where it may read it, the
/// event is not redacted and its sender was not erased (deactivated with
/// `erase: true`; Synapse sends those redacted to every server too), else
/// the redacted copy.
fn as_served(
    state: &AppState,
    view: &RoomView,
    readable: &SeqRanges,
    stored: &StoredEvent,
) -> Result<Box<RawJsonValue>> {
    if readable.contains(stored.seq) && stored.redacted_by.is_none() && !sender_erased(state, &stored.json) {
        return raw_json(stored.json.clone());
    }
    let object: CanonicalJsonObject =
        serde_json::from_str(&stored.json).map_err(|e| Error::Internal(format!("stored event: {e}")))?;
    let redacted = ruma::canonical_json::redact(object, &view.rules.redaction, None)
        .map_err(|e| Error::Internal(format!("redact: {e}")))?;
    raw_json(serde_json::to_string(&redacted).map_err(|e| Error::Internal(e.to_string()))?)
}

/// Whether the sender of the event `json` was erased.
fn sender_erased(state: &AppState, json: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Sender {
        sender: String,
    }
    let erased = state.erased.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    !erased.is_empty() && serde_json::from_str::<Sender>(json).is_ok_and(|e| erased.contains(&e.sender))
}

/// A stored event of the room by id; 404 for unknown ones and for another
/// room's.
async fn event_in_room(state: &AppState, room_id: &str, event_id: &str) -> Result<StoredEvent> {
    events::by_id(&state.db, event_id)
        .await?
        .filter(|e| e.room_id == room_id)
        .ok_or_else(|| Error::NotFound("Event not found".into()))
}

/// `/event/{eventId}`: one event, as `server` may be sent it.
/// An event held off the line (soft-failed, or from the auth chain or state
/// of a join) goes to a server in the room as Synapse serves outliers: as
/// `shared` history, whole unless its sender was erased.
pub async fn event(state: &AppState, server: &ServerName, event_id: &EventId) -> Result<Box<RawJsonValue>> {
    let not_found = || Error::NotFound("Event not found".into());
    let stored = match events::by_id(&state.db, event_id.as_str()).await? {
        Some(stored) => stored,
        None => {
            let held = crate::storage::outliers::held_by_id(&state.db, event_id.as_str())
                .await?
                .ok_or_else(not_found)?;
            let room_id = RoomId::parse(&held.room_id).map_err(|e| Error::Internal(e.to_string()))?;
            let view = open_room(state, &room_id).await?;
            let readable = read::server_access(state, &view, server).await?;
            // An event kept off the line: a rejected one is not served (as
            // Synapse does not); a soft-failed one is, read as of where it
            // came (whole where the server may read there, else redacted).
            // Other held events (auth chains, state) go whole.
            let off_line = {
                let mut conn = state.db.read_conn().await?;
                crate::storage::outliers::off_line(conn.conn(), event_id.as_str()).await?
            };
            let (seq, readable) = match off_line {
                Some(kept) if kept.rejected => return Err(not_found()),
                Some(kept) => (kept.base_seq, readable),
                None => (0, SeqRanges(vec![(0, 0)])),
            };
            let stored = StoredEvent {
                room_id: held.room_id,
                seq,
                event_id: held.event_id,
                json: held.json,
                redacted_by: None,
                txn_device_id: None,
                txn_id: None,
                has_children: None,
            };
            return as_served(state, &view, &readable, &stored);
        }
    };
    let room_id = RoomId::parse(&stored.room_id).map_err(|e| Error::Internal(e.to_string()))?;
    let view = open_room(state, &room_id).await?;
    let readable = read::server_access(state, &view, server).await?;
    as_served(state, &view, &readable, &stored)
}

/// `/state` and `/state_ids`: the room's state before `event_id` and the
/// auth chain of that state.
pub async fn state_at_event(
    state: &AppState,
    server: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
) -> Result<(Vec<StoredEvent>, Vec<Held>)> {
    let view = open_room(state, room_id).await?;
    read::server_access(state, &view, server).await?;
    let at = event_in_room(state, room_id.as_str(), event_id.as_str()).await?;
    let before = events::state_at(&state.db, room_id.as_str(), at.seq - 1).await?;
    let roots: Vec<OwnedEventId> = before.iter().filter_map(|e| EventId::parse(&e.event_id).ok()).collect();
    let chain = auth_chain(state, &roots).await?;
    Ok((before, chain))
}

/// Events as JSON for an answer.
pub fn raw_events(events: Vec<StoredEvent>) -> Result<Vec<Box<RawJsonValue>>> {
    events.into_iter().map(|e| raw_json(e.json)).collect()
}

/// `/event_auth/{roomId}/{eventId}`: the event's auth chain.
pub async fn event_auth(
    state: &AppState,
    server: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
) -> Result<Vec<Box<RawJsonValue>>> {
    let view = open_room(state, room_id).await?;
    read::server_access(state, &view, server).await?;
    event_in_room(state, room_id.as_str(), event_id.as_str()).await?;
    raw_held(auth_chain(state, &[event_id.to_owned()]).await?)
}

/// `/backfill/{roomId}`: up to `limit` events at and before the newest of
/// `from`, newest first, each as `server` may be sent it.
pub async fn backfill(
    state: &AppState,
    server: &ServerName,
    room_id: &RoomId,
    from: &[OwnedEventId],
    limit: usize,
) -> Result<Vec<Box<RawJsonValue>>> {
    let view = open_room(state, room_id).await?;
    let readable = read::server_access(state, &view, server).await?;
    let mut top = None;
    for id in from {
        if let Some(e) =
            events::by_id(&state.db, id.as_str()).await?.filter(|e| e.room_id == room_id.as_str())
        {
            top = top.max(Some(e.seq));
        }
    }
    let Some(top) = top else { return Ok(Vec::new()) };
    let limit = i64::try_from(limit.clamp(1, MAX_BACKFILL)).unwrap_or(1);
    let floor = view.room.floor_seq.max(1);
    let page = events::range(&state.db, room_id.as_str(), floor, top, true, limit).await?;
    page.iter().map(|e| as_served(state, &view, &readable, e)).collect()
}

/// `/get_missing_events/{roomId}`: events reached from `latest` by prev
/// edges and not from `earliest`, up to `limit`, oldest first, each as
/// `server` may be sent it.
pub async fn missing_events(
    state: &AppState,
    server: &ServerName,
    room_id: &RoomId,
    earliest: &[OwnedEventId],
    latest: &[OwnedEventId],
    limit: usize,
) -> Result<Vec<Box<RawJsonValue>>> {
    let view = open_room(state, room_id).await?;
    let readable = read::server_access(state, &view, server).await?;
    let limit = limit.clamp(1, MAX_MISSING);
    let stop: HashSet<&OwnedEventId> = earliest.iter().collect();
    let mut seen: HashSet<OwnedEventId> = latest.iter().cloned().collect();
    let mut queue: VecDeque<OwnedEventId> = VecDeque::new();
    for id in latest {
        if let Some(e) =
            events::by_id(&state.db, id.as_str()).await?.filter(|e| e.room_id == room_id.as_str())
        {
            queue.extend(Pdu::from_stored(&e.event_id, &e.json)?.prev_events);
        }
    }
    let mut out = Vec::new();
    while let Some(id) = queue.pop_front() {
        if out.len() >= limit {
            break;
        }
        if stop.contains(&id) || !seen.insert(id.clone()) {
            continue;
        }
        let Some(e) = events::by_id(&state.db, id.as_str()).await?.filter(|e| e.room_id == room_id.as_str())
        else {
            continue;
        };
        queue.extend(Pdu::from_stored(&e.event_id, &e.json)?.prev_events);
        out.push(e);
    }
    out.sort_by_key(|e| e.seq);
    out.iter().map(|e| as_served(state, &view, &readable, e)).collect()
}
