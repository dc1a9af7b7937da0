//! Joining a room that lives on other servers: make_join to each candidate
//! server in turn (`ver` = the versions we take part in,
//! `version::FEDERATED`), our join built from the template and signed (in
//! versions 1 and 2 under an event id of ours), send_join (v2), and every
//! event of the answer checked before anything is stored: format,
//! signatures of every server that must have signed, content hash, every
//! event one of the room being joined (else the whole answer is refused:
//! `version::belongs_to`), the auth chain authorised in depth order against its own auth events, the state
//! likewise, the join against that state. Then the room is stored with the answer's events as outliers
//! and the join as the first position on our line, carrying the whole state
//! (`room::remote::store_joined_room`).

use std::collections::HashMap;
use std::time::Duration;

use ruma::api::federation::membership::{create_join_event, prepare_join_event};
use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::events::{StateEventType, TimelineEventType};
use ruma::room_version_rules::RoomVersionRules;
use ruma::{OwnedEventId, OwnedServerName, RoomId, RoomVersionId, UserId};
use serde_json::value::RawValue as RawJsonValue;

use super::FederationError;
use crate::error::{Error, Result};
use crate::room::pdu::{MAX_PDU_BYTES, Pdu};
use crate::room::version;
use crate::state::AppState;
use crate::storage;

/// The largest send_join answer read (a big room's state and auth chain).
const MAX_SEND_JOIN_BYTES: usize = 256 * 1024 * 1024;

/// A send_join answer, checked.
pub struct JoinedRoom {
    /// The room's version.
    pub version: RoomVersionId,
    /// Its rules.
    pub rules: RoomVersionRules,
    /// The server that let us in.
    pub via: OwnedServerName,
    /// The state before our join, by (type, state key).
    pub state: HashMap<(String, String), Pdu>,
    /// Every event of the auth chain and the state that passed the checks.
    pub events: HashMap<OwnedEventId, Pdu>,
    /// Our join as the resident server returned it.
    pub join: Pdu,
}

/// Joins `user` to `room_id` through the first of `servers` that lets them
/// in; answers the checked room.
pub async fn join(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    servers: &[OwnedServerName],
) -> Result<JoinedRoom> {
    let mut waits = INVITE_RACE_WAITS_MS.iter();
    loop {
        let joined =
            through_first(state, room_id, servers, "join", |server| join_via(state, user, room_id, server))
                .await;
        match joined {
            Err(Error::Forbidden(_)) if invited_lately(state, user, room_id).await => match waits.next() {
                Some(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
                None => return joined,
            },
            other => return other,
        }
    }
}

/// The waits before asking again when a join on a fresh invite is refused:
/// the inviting server commits its invite only after ours signed it, so a
/// client that joins the moment the invite reaches it can ask before the
/// invite stands there.
const INVITE_RACE_WAITS_MS: [u64; 4] = [100, 200, 400, 800];

/// Whether `user` holds a pending invite into `room_id` sent within the
/// last minute (the refusal of a join may then be the race above).
async fn invited_lately(state: &AppState, user: &UserId, room_id: &RoomId) -> bool {
    let Ok(Some(invite)) =
        storage::federation::remote_invite(&state.db, user.as_str(), room_id.as_str()).await
    else {
        return false;
    };
    let sent = serde_json::from_str::<serde_json::Value>(&invite.json)
        .ok()
        .and_then(|e| e["origin_server_ts"].as_i64())
        .unwrap_or(0);
    invite.rejected == 0 && storage::now_ms() - sent < 60_000
}

/// Asks each of `servers` in turn (ours left out) to let us `what` (join,
/// knock) `room_id`, until one does; answers its answer. A server that
/// answered (no such room, not allowed) says more than one that could not
/// be reached: its refusal is the one given.
pub async fn through_first<'a, T, F, Fut>(
    state: &AppState,
    room_id: &RoomId,
    servers: &'a [OwnedServerName],
    what: &str,
    mut ask: F,
) -> Result<T>
where
    F: FnMut(&'a OwnedServerName) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut answer: Option<Error> = None;
    let mut unreachable: Option<Error> = None;
    for server in servers.iter().filter(|s| **s != state.settings.server_name) {
        match ask(server).await {
            Ok(done) => return Ok(done),
            Err(e) => {
                tracing::info!(%room_id, %server, "cannot {what} through this server: {e}");
                let slot =
                    if matches!(e, Error::RemoteUnavailable(_)) { &mut unreachable } else { &mut answer };
                slot.get_or_insert(e);
            }
        }
    }
    Err(answer
        .or(unreachable)
        .unwrap_or_else(|| Error::NotFound(format!("No server to {what} {room_id} through"))))
}

/// Another server's answer to a membership request (make_/send_ join,
/// knock, leave) that is not a success, as our error.
pub fn remote_error(server: &ruma::ServerName, e: FederationError) -> Error {
    match e {
        FederationError::Status(403, body) => Error::Forbidden(format!("{server} refused: {body}")),
        FederationError::Status(404, body) => {
            Error::NotFound(format!("{server} does not know the room: {body}"))
        }
        FederationError::Status(400, body) if body.contains("M_INCOMPATIBLE_ROOM_VERSION") => {
            Error::UnsupportedRoomVersion(format!(
                "The room's version is not one this server supports: {body}"
            ))
        }
        other => Error::RemoteUnavailable(format!("Cannot join through {server}: {other}")),
    }
}

async fn join_via(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    server: &OwnedServerName,
) -> Result<JoinedRoom> {
    let mut request = prepare_join_event::v1::Request::new(room_id.to_owned(), user.to_owned());
    request.ver = version::FEDERATED.to_vec();
    let template = super::send(state, server, request).await.map_err(|e| remote_error(server, e))?;
    let (version, rules) = version::federated_rules(template.room_version.as_ref())?;
    let (event_id, join) =
        sign_template(state, &rules, room_id, user, &template.event, "join", CanonicalJsonObject::new())
            .await?;
    let raw = RawJsonValue::from_string(
        serde_json::to_string(&join).map_err(|e| Error::Internal(format!("join json: {e}")))?,
    )
    .map_err(|e| Error::Internal(format!("join json: {e}")))?;
    let request = create_join_event::v2::Request::new(room_id.to_owned(), event_id.clone(), raw);
    let answer = super::send_capped(state, server, request, MAX_SEND_JOIN_BYTES)
        .await
        .map_err(|e| remote_error(server, e))?
        .room_state;
    let join = match &answer.event {
        // The resident's copy (countersigned for a restricted join).
        Some(event) => super::incoming::check_pdu(state, &rules, event).await?,
        None => Pdu::from_checked(event_id.clone(), &join)?,
    };
    if join.event_id != event_id {
        return Err(Error::RemoteUnavailable(format!("{server} returned another join than ours")));
    }
    check_answer(state, version, rules, server.clone(), room_id, &answer, join).await
}

/// Our member event from a make_join, make_knock or make_leave template:
/// checked to be `user`'s own `membership` event in `room_id`, with our
/// timestamp and signature (and for a join or knock, the user's profile and
/// `extra`, the content keys the user adds: a reason; the template's win).
pub async fn sign_template(
    state: &AppState,
    rules: &RoomVersionRules,
    room_id: &RoomId,
    user: &UserId,
    template: &RawJsonValue,
    membership: &str,
    extra: CanonicalJsonObject,
) -> Result<(OwnedEventId, CanonicalJsonObject)> {
    let mut event: CanonicalJsonObject = serde_json::from_str(template.get())
        .map_err(|e| Error::RemoteUnavailable(format!("The template is not canonical JSON: {e}")))?;
    let field = |name: &str| event.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    let content = event.get("content").and_then(|c| c.as_object()).cloned().unwrap_or_default();
    if field("type").as_deref() != Some("m.room.member")
        || field("state_key").as_deref() != Some(user.as_str())
        || field("sender").as_deref() != Some(user.as_str())
        || field("room_id").as_deref() != Some(room_id.as_str())
        || content.get("membership").and_then(|m| m.as_str()) != Some(membership)
    {
        return Err(Error::RemoteUnavailable(format!(
            "The template is not a {membership} of this user in this room"
        )));
    }
    let mut content = content;
    if matches!(membership, "join" | "knock") {
        for (name, value) in crate::account::profile::member_fields(state, user).await? {
            content.insert(name, value);
        }
        for (name, value) in extra {
            content.entry(name).or_insert(value);
        }
    }
    event.insert("content".into(), CanonicalJsonValue::Object(content));
    let now = ruma::Int::try_from(crate::storage::now_ms()).unwrap_or_default();
    event.insert("origin_server_ts".into(), CanonicalJsonValue::Integer(now));
    if event.contains_key("origin") {
        event.insert("origin".into(), CanonicalJsonValue::String(state.settings.server_name.to_string()));
    }
    for name in ["signatures", "hashes", "unsigned"] {
        event.remove(name);
    }
    // Versions 1 and 2: the id is ours to make (the template's, if any, is not).
    version::assign_event_id(rules, &state.settings.server_name, &mut event);
    ruma::signatures::hash_and_sign_event(
        state.settings.server_name.as_str(),
        &state.signing_key.pair,
        &mut event,
        &rules.redaction,
    )
    .map_err(|e| Error::Internal(format!("signing the {membership}: {e}")))?;
    if serde_json::to_string(&event).map_or(0, |t| t.len()) > MAX_PDU_BYTES {
        return Err(Error::TooLarge(format!("The {membership} is larger than {MAX_PDU_BYTES} bytes")));
    }
    let event_id = version::event_id(&event, rules)?;
    Ok((event_id, event))
}

/// Checks every event of a send_join answer and our join against the state.
async fn check_answer(
    state: &AppState,
    version: RoomVersionId,
    rules: RoomVersionRules,
    via: OwnedServerName,
    room_id: &RoomId,
    answer: &create_join_event::v2::RoomState,
    join: Pdu,
) -> Result<JoinedRoom> {
    let mut candidates: HashMap<OwnedEventId, Pdu> = HashMap::new();
    let raws = answer.auth_chain.iter().chain(&answer.state).map(|raw| &**raw);
    for checked in super::incoming::check_pdus(state, &rules, raws).await {
        match checked {
            Ok(pdu) if !version::belongs_to(&rules, &pdu, room_id) => {
                return Err(Error::RemoteUnavailable(format!(
                    "{via} answered the join with an event of another room ({}); nothing was stored",
                    pdu.event_id
                )));
            }
            Ok(pdu) => {
                candidates.insert(pdu.event_id.clone(), pdu);
            }
            Err(e) => tracing::info!(%room_id, %via, "dropped an event of the send_join answer: {e}"),
        }
    }
    let events = authorise_chain(&rules, &HashMap::new(), candidates);
    let mut room_state: HashMap<(String, String), Pdu> = HashMap::new();
    for raw in &answer.state {
        let Ok(object) = serde_json::from_str::<CanonicalJsonObject>(raw.get()) else { continue };
        let Ok(id) = version::event_id(&object, &rules) else { continue };
        if let Some(pdu) = events.get(&id)
            && let Some(key) = &pdu.state_key
        {
            room_state.insert((pdu.kind.to_string(), key.clone()), pdu.clone());
        }
    }
    let create = room_state
        .get(&(StateEventType::RoomCreate.to_string(), String::new()))
        .ok_or_else(|| Error::RemoteUnavailable("The room's state has no valid create event".into()))?;
    if !version::belongs_to(&rules, create, room_id) {
        return Err(Error::RemoteUnavailable("The room's create event is another room's".into()));
    }
    crate::room::timeline::authorize(
        &rules,
        &join,
        |id| events.get(id),
        |t, k| room_state.get(&(t.to_string(), k.to_owned())),
    )
    .map_err(|e| Error::Forbidden(format!("The room's state does not allow the join: {e}")))?;
    Ok(JoinedRoom { version, rules, via, state: room_state, events, join })
}

/// The events of an auth chain (and state) that pass the authorisation
/// rules against their own auth events, each checked after those (depth
/// order, then id); an event whose auth events did not pass does not pass.
/// `held` are events accepted before (they may be the candidates' auth
/// events); the answer holds the candidates that passed.
pub(super) fn authorise_chain(
    rules: &RoomVersionRules,
    held: &HashMap<OwnedEventId, Pdu>,
    candidates: HashMap<OwnedEventId, Pdu>,
) -> HashMap<OwnedEventId, Pdu> {
    let mut order: Vec<&Pdu> = candidates.values().filter(|p| !held.contains_key(&p.event_id)).collect();
    order.sort_by(|a, b| a.depth.cmp(&b.depth).then_with(|| a.event_id.cmp(&b.event_id)));
    let mut accepted: HashMap<OwnedEventId, Pdu> = HashMap::new();
    let held_create = held.values().find(|a| a.kind == TimelineEventType::RoomCreate);
    for pdu in order {
        let get = |id: &ruma::EventId| accepted.get(id).or_else(|| held.get(id));
        let auth: Vec<&Pdu> = pdu.auth_events.iter().filter_map(|id| get(id)).collect();
        if auth.len() != pdu.auth_events.len() {
            continue;
        }
        let by_key = |t: &StateEventType, k: &str| {
            auth.iter()
                .copied()
                .find(|a| a.kind.to_string() == t.to_string() && a.state_key.as_deref() == Some(k))
        };
        // v12: the create event is no auth event, yet the rules read it.
        let create =
            held_create.or_else(|| accepted.values().find(|a| a.kind == TimelineEventType::RoomCreate));
        let state_lookup = |t: &StateEventType, k: &str| {
            by_key(t, k)
                .or_else(|| (*t == StateEventType::RoomCreate && k.is_empty()).then_some(create).flatten())
        };
        let ok = ruma::state_res::check_state_independent_auth_rules(&rules.authorization, pdu, get)
            .and_then(|()| {
                ruma::state_res::check_state_dependent_auth_rules(&rules.authorization, pdu, state_lookup)
            });
        match ok {
            Ok(()) => {
                accepted.insert(pdu.event_id.clone(), pdu.clone());
            }
            Err(e) => {
                tracing::info!(event_id = %pdu.event_id, "an event of the room's auth chain fails its auth rules: {e}")
            }
        }
    }
    accepted
}
