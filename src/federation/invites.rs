//! Invites across servers, our side: one of our users invites another
//! server's user. The invite is built and checked at the head of the room
//! like any local event (`RoomWriter::template`, the lock released before
//! any network I/O), sent to the invitee's server (`/v2/invite`) with the
//! room's stripped state as full PDUs, and appended once that server has
//! signed it too: the invitee's server may refuse the invite, and then
//! nothing is stored.

use ruma::api::federation::membership::{RawStrippedState, create_invite};
use ruma::{RoomId, UserId};
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::room::pdu::{Draft, Pdu};
use crate::room::timeline::{self, Appended, RoomWriter};
use crate::room::version;
use crate::state::AppState;

/// Invites `draft`'s target, a user of another server, into `room_id`.
pub async fn invite_remote(state: &AppState, room_id: &RoomId, draft: &Draft) -> Result<Appended> {
    let target = draft
        .state_key
        .as_deref()
        .and_then(|k| UserId::parse(k).ok())
        .ok_or_else(|| Error::InvalidParam("The invite names no user".into()))?;
    let (pdu, version, rules) = {
        let mut writer = RoomWriter::open(state, room_id).await?;
        if !version::federates(&writer.version) {
            return Err(Error::UnsupportedRoomVersion(format!(
                "Rooms of version {} do not federate on this server: {target} cannot be invited",
                writer.version
            )));
        }
        let pdu = writer.template(state, draft).await?;
        (pdu, writer.version.clone(), writer.rules.clone())
    };
    let stripped = super::resident::stripped_state(state, room_id, Some(&draft.sender)).await?;
    let request = create_invite::v2::Request::new(
        room_id.to_owned(),
        pdu.event_id.clone(),
        version,
        raw(pdu.to_json_string())?,
        stripped,
    );
    let destination = target.server_name();
    let response = super::send(state, destination, request).await.map_err(|e| match e {
        super::FederationError::Status(403, body) => {
            Error::Forbidden(format!("{destination} refused the invite: {body}"))
        }
        other => Error::RemoteUnavailable(format!("Cannot invite {target}: {other}")),
    })?;
    let signed = super::incoming::check_pdu(state, &rules, &response.event).await?;
    if signed.event_id != pdu.event_id {
        return Err(Error::RemoteUnavailable(format!(
            "{destination} changed the invite it was asked to sign"
        )));
    }
    check_signed_by(state, &rules, &signed, destination).await?;
    timeline::append_remote(state, room_id, signed, true).await
}

/// The invitee's server must have signed the invite it returns (a
/// signature over the redacted event, like every event signature).
async fn check_signed_by(
    state: &AppState,
    rules: &ruma::room_version_rules::RoomVersionRules,
    pdu: &Pdu,
    server: &ruma::ServerName,
) -> Result<()> {
    let mut redacted = ruma::canonical_json::redact(pdu.canonical()?, &rules.redaction, None)
        .map_err(|e| Error::Internal(format!("redact: {e}")))?;
    redacted.remove("unsigned");
    // Only the invitee's server's signature is checked here (ours was, with
    // the event): verify_json wants keys for every signer it finds.
    let theirs = redacted
        .get("signatures")
        .and_then(|s| s.as_object())
        .and_then(|s| s.get(server.as_str()))
        .cloned()
        .ok_or_else(|| {
            Error::RemoteUnavailable(format!("{server} returned the invite without its signature"))
        })?;
    let key_id = theirs.as_object().and_then(|s| s.keys().next().cloned()).unwrap_or_default();
    redacted.insert(
        "signatures".into(),
        ruma::canonical_json::CanonicalJsonValue::Object(
            [(server.to_string(), theirs)].into_iter().collect(),
        ),
    );
    let keys = super::keys::public_keys(state, server, &key_id)
        .await
        .map_err(|e| Error::RemoteUnavailable(format!("Cannot get the keys of {server}: {e}")))?;
    let map = ruma::signatures::PublicKeyMap::from([(server.to_string(), keys)]);
    ruma::signatures::verify_json(&map, &redacted).map_err(|e| {
        Error::RemoteUnavailable(format!("{server}'s signature on the invite does not verify: {e}"))
    })
}

fn raw(json: String) -> Result<Box<RawJsonValue>> {
    RawJsonValue::from_string(json).map_err(|e| Error::Internal(format!("event json: {e}")))
}

/// Most stripped state events kept with an invite.
const MAX_STRIPPED: usize = 50;

/// Another server invites one of our users (`/v2/invite`): the invite is
/// checked (the room versions we federate only; a PDU of that version
/// signed by the inviter's server; the inviter's own server is asking and
/// the room's server ACL, where we know it, lets it in; an invite of a user
/// of ours who exists), countersigned, kept with the room's stripped state
/// for the invitee's /sync, and returned. An invite into a room we are in
/// is only countersigned: it reaches the room through the inviter's server.
pub async fn receive_invite(
    state: &AppState,
    origin: &ruma::ServerName,
    room_id: &RoomId,
    event_id: &ruma::EventId,
    version: &ruma::RoomVersionId,
    event: &RawJsonValue,
    stripped: &[RawStrippedState],
) -> Result<Box<RawJsonValue>> {
    version::check_federates(version)?;
    let rules = version
        .rules()
        .ok_or_else(|| Error::IncompatibleRoomVersion { room_version: version.to_string() })?;
    let pdu = super::incoming::check_pdu(state, &rules, event).await?;
    if pdu.event_id != event_id || pdu.room_id.as_deref() != Some(room_id) {
        return Err(Error::BadJson("The invite is not the event the path names".into()));
    }
    let content = pdu.content_as::<serde_json::Value>().unwrap_or_default();
    let invitee = pdu.state_key.as_deref().and_then(|k| UserId::parse(k).ok());
    let Some(invitee) = invitee.filter(|_| {
        pdu.kind == ruma::events::TimelineEventType::RoomMember && content["membership"] == "invite"
    }) else {
        return Err(Error::BadJson("The event is not an invite".into()));
    };
    if pdu.sender.server_name() != origin {
        return Err(Error::Forbidden(format!("{origin} cannot invite on behalf of {}", pdu.sender)));
    }
    // A room we are in, or were: its server ACL closes /invite too.
    super::acl::check(state, room_id.as_str(), origin).await?;
    if invitee.server_name() != state.settings.server_name
        || !crate::storage::users::localpart_exists(&state.db, invitee.localpart()).await?
    {
        return Err(Error::NotFound(format!("{invitee} is not a user of this server")));
    }
    let signed = super::incoming::countersign(state, &rules, pdu)?;
    let json = signed.to_json_string();
    let ours = state.settings.server_name.as_str();
    if crate::storage::federation::server_in_room(&state.db, room_id.as_str(), ours).await? {
        return raw(json);
    }
    let member = serde_json::json!({
        "type": "m.room.member",
        "state_key": invitee,
        "sender": signed.sender,
        "content": content,
        "event_id": signed.event_id,
        "origin_server_ts": signed.origin_server_ts,
    });
    let invite = crate::storage::federation::RemoteInvite {
        user_id: invitee.to_string(),
        room_id: room_id.to_string(),
        event_id: signed.event_id.to_string(),
        room_version: version.to_string(),
        json: json.clone(),
        stripped_state: client_stripped_state(stripped, member),
        via: origin.to_string(),
        stream: 0,
        rejected: 0,
        membership: "invite".into(),
    };
    keep(state, invite).await?;
    raw(json)
}

/// The stripped state another server sent with an invite or a knock (at
/// most MAX_STRIPPED events), in the client's form, with the user's own
/// member event last: what their `/sync` shows.
pub(super) fn client_stripped_state(stripped: &[RawStrippedState], member: serde_json::Value) -> String {
    let mut events: Vec<serde_json::Value> =
        stripped.iter().take(MAX_STRIPPED).filter_map(stripped_event).collect();
    events.push(member);
    serde_json::Value::Array(events).to_string()
}

/// Keeps (or replaces) a pending invite or knock of one of our users at a
/// new stream position, and wakes their `/sync`.
pub(super) async fn keep(state: &AppState, mut row: crate::storage::federation::RemoteInvite) -> Result<()> {
    let reservation = state.streams.reserve();
    row.stream = reservation.pos;
    crate::storage::federation::put_remote_invite(&state.db, &row).await?;
    drop(reservation);
    state.notifier.wake([row.user_id.as_str()]);
    Ok(())
}

/// A member event sent to us for a room we are not in (the host's answer to
/// an invite or knock of one of our users that is pending here): a leave or
/// ban of that user, signed by the server that invited them or took their
/// knock (or sent by the user themselves), ends it: the room shows under
/// `rooms.leave`. Answers the event's id and what became of it; any other
/// event of a room we are not in is not known here.
pub async fn membership_outside(
    state: &AppState,
    room_id: &RoomId,
    raw: &RawJsonValue,
) -> (Option<ruma::OwnedEventId>, Result<()>) {
    let unknown = || Err(Error::NotFound(format!("Room {room_id} is not known here")));
    let Some((user, pending)) = pending_for(state, room_id, raw).await else { return (None, unknown()) };
    let Ok((_, rules)) =
        version::federated_rules(ruma::RoomVersionId::try_from(pending.room_version.as_str()).ok().as_ref())
    else {
        return (None, unknown());
    };
    let pdu = match super::incoming::check_pdu(state, &rules, raw).await {
        Ok(pdu) => pdu,
        Err(e) => return (None, Err(e)),
    };
    let membership =
        pdu.content_as::<serde_json::Value>().and_then(|c| c["membership"].as_str().map(str::to_owned));
    let by_host = pdu.sender.server_name().as_str() == pending.via || pdu.sender == user;
    let ends = pdu.kind == ruma::events::TimelineEventType::RoomMember
        && pdu.room_id.as_deref() == Some(room_id)
        && pdu.state_key.as_deref() == Some(user.as_str())
        && matches!(membership.as_deref(), Some("leave" | "ban"));
    if !ends || !by_host {
        return (Some(pdu.event_id), unknown());
    }
    let result = end_pending(state, &user, room_id).await;
    (Some(pdu.event_id), result)
}

/// The pending invite or knock (not yet ended) of the local user an event
/// of `room_id` names as its state key.
async fn pending_for(
    state: &AppState,
    room_id: &RoomId,
    raw: &RawJsonValue,
) -> Option<(ruma::OwnedUserId, crate::storage::federation::RemoteInvite)> {
    #[derive(serde::Deserialize)]
    struct Target {
        state_key: Option<ruma::OwnedUserId>,
    }
    let user = serde_json::from_str::<Target>(raw.get()).ok()?.state_key?;
    if user.server_name() != state.settings.server_name {
        return None;
    }
    let pending = crate::storage::federation::remote_invite(&state.db, user.as_str(), room_id.as_str())
        .await
        .ok()
        .flatten()
        .filter(|p| p.rejected == 0)?;
    Some((user, pending))
}

/// Marks a pending invite or knock ended (shown once under `leave`) and
/// wakes the user's `/sync`.
async fn end_pending(state: &AppState, user: &UserId, room_id: &RoomId) -> Result<()> {
    let reservation = state.streams.reserve();
    crate::storage::federation::reject_remote_invite(
        &state.db,
        user.as_str(),
        room_id.as_str(),
        reservation.pos,
    )
    .await?;
    drop(reservation);
    state.notifier.wake([user.as_str()]);
    Ok(())
}

/// One stripped state event in the client's form (type, state key, content,
/// sender), from a full PDU or a stripped event; `None` when it is neither.
fn stripped_event(entry: &RawStrippedState) -> Option<serde_json::Value> {
    let json = match entry {
        RawStrippedState::Pdu(raw) => raw.get(),
        #[allow(deprecated)]
        RawStrippedState::Stripped(raw) => raw.json().get(),
        _ => return None,
    };
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    let field = |name: &str| value.get(name).filter(|v| v.is_string()).cloned();
    let content = value.get("content").filter(|c| c.is_object()).cloned()?;
    Some(serde_json::json!({
        "type": field("type")?,
        "state_key": field("state_key")?,
        "sender": field("sender")?,
        "content": content,
    }))
}

/// The invitee turns down an invite into a room on another server: a leave
/// through the inviting server (make_leave / send_leave), and whatever that
/// server answers, the invite is over here (the spec's out-of-band
/// rejection when the server cannot be reached).
pub async fn reject(state: &AppState, user: &UserId, room_id: &RoomId) -> Result<()> {
    let invite = crate::storage::federation::remote_invite(&state.db, user.as_str(), room_id.as_str())
        .await?
        .filter(|i| i.rejected == 0)
        .ok_or_else(crate::room::read::not_a_member)?;
    if let Err(e) = leave_via(state, user, room_id, &invite.via).await {
        tracing::info!(%room_id, via = %invite.via, "invite rejected here only: {e}");
    }
    end_pending(state, user, room_id).await
}

async fn leave_via(state: &AppState, user: &UserId, room_id: &RoomId, via: &str) -> Result<()> {
    use ruma::api::federation::membership::{create_leave_event, prepare_leave_event};
    let server = <&ruma::ServerName>::try_from(via)
        .map_err(|e| Error::Internal(format!("stored server name: {e}")))?;
    let template = super::send(
        state,
        server,
        prepare_leave_event::v1::Request::new(room_id.to_owned(), user.to_owned()),
    )
    .await
    .map_err(|e| super::joining::remote_error(server, e))?;
    let (_, rules) = version::federated_rules(template.room_version.as_ref())?;
    let (event_id, leave) = super::joining::sign_template(
        state,
        &rules,
        room_id,
        user,
        &template.event,
        "leave",
        Default::default(),
    )
    .await?;
    let raw = raw(serde_json::to_string(&leave).map_err(|e| Error::Internal(e.to_string()))?)?;
    super::send(state, server, create_leave_event::v2::Request::new(room_id.to_owned(), event_id, raw))
        .await
        .map_err(|e| super::joining::remote_error(server, e))?;
    Ok(())
}
