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
use crate::state::AppState;
use crate::storage::events;

/// The state an invitee's server is shown of the room.
const STRIPPED_TYPES: [&str; 7] = [
    "m.room.create",
    "m.room.join_rules",
    "m.room.name",
    "m.room.avatar",
    "m.room.canonical_alias",
    "m.room.encryption",
    "m.room.topic",
];

/// Invites `draft`'s target, a user of another server, into `room_id`.
pub async fn invite_remote(state: &AppState, room_id: &RoomId, draft: &Draft) -> Result<Appended> {
    let target = draft
        .state_key
        .as_deref()
        .and_then(|k| UserId::parse(k).ok())
        .ok_or_else(|| Error::InvalidParam("The invite names no user".into()))?;
    let (pdu, version, rules) = {
        let mut writer = RoomWriter::open(state, room_id).await?;
        let pdu = writer.template(state, draft).await?;
        (pdu, writer.version.clone(), writer.rules.clone())
    };
    let mut stripped = Vec::new();
    for kind in STRIPPED_TYPES {
        if let Some(stored) = events::state_event(&state.db, room_id.as_str(), kind, "").await? {
            stripped.push(RawStrippedState::Pdu(raw(stored.json)?));
        }
    }
    if let Some(stored) =
        events::state_event(&state.db, room_id.as_str(), "m.room.member", draft.sender.as_str()).await?
    {
        stripped.push(RawStrippedState::Pdu(raw(stored.json)?));
    }
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
