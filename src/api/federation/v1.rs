//! The v1 forms of `send_join`, `send_leave` and `invite`, for servers that
//! still call them. ruma 0.16 has no server side for the first two and
//! types v1 invites field by field (losing the hashes and signatures the
//! checks need), and its endpoint macros cannot be used outside ruma here,
//! so these take the signed raw request ([`Signed`]). Each answers as its
//! v2 form does, in the v1 shape `[200, body]`. A v1 invite names no room
//! version; the spec says to take it as version 1 or 2, whose events have
//! one form and one invite rule: it is checked as version 2 (a version 1
//! room, whose state resolution ruma lacks, is not joined here: the join
//! answers M_UNSUPPORTED_ROOM_VERSION once make_join names it).

use axum::Json;
use axum::extract::State;
use ruma::api::federation::membership::RawStrippedState;
use ruma::{EventId, RoomId, RoomVersionId};
use serde_json::value::RawValue as RawJsonValue;
use serde_json::{Value, json};

use super::Signed;
use crate::error::{Error, Result};
use crate::federation::{invites, resident};
use crate::state::AppState;

/// The JSON of a raw value (what we answer is built from checked events).
fn value_of(raw: &RawJsonValue) -> Result<Value> {
    serde_json::from_str(raw.get()).map_err(|e| Error::Internal(format!("unreadable event: {e}")))
}

fn values_of(raws: &[Box<RawJsonValue>]) -> Result<Vec<Value>> {
    raws.iter().map(|raw| value_of(raw)).collect()
}

/// The room and event ids of the path and the event of the body.
fn parts(req: &Signed) -> Result<(&RoomId, &EventId, Box<RawJsonValue>)> {
    let [room_id, event_id] = req.args.as_slice() else {
        return Err(Error::InvalidParam("The path names a room and an event".into()));
    };
    let room_id = <&RoomId>::try_from(room_id.as_str())
        .map_err(|e| Error::InvalidParam(format!("Invalid room id: {e}")))?;
    let event_id = <&EventId>::try_from(event_id.as_str())
        .map_err(|e| Error::InvalidParam(format!("Invalid event id: {e}")))?;
    let text = std::str::from_utf8(&req.body).map_err(|_| Error::BadJson("The body is not UTF-8".into()))?;
    let pdu = RawJsonValue::from_string(text.to_owned())
        .map_err(|e| Error::BadJson(format!("The body is not JSON: {e}")))?;
    if !pdu.get().trim_start().starts_with('{') {
        return Err(Error::BadJson("The body is not an event".into()));
    }
    Ok((room_id, event_id, pdu))
}

/// `PUT /_matrix/federation/v1/send_join/{roomId}/{eventId}`: `[200,
/// {origin, auth_chain, state, event}]`.
pub(super) async fn send_join(State(state): State<AppState>, req: Signed) -> Result<Json<Value>> {
    let (room_id, event_id, pdu) = parts(&req)?;
    let joined = resident::send_join(&state, &req.origin, room_id, event_id, &pdu, false).await?;
    let answer = json!({
        "origin": state.settings.server_name,
        "auth_chain": values_of(&joined.auth_chain)?,
        "state": values_of(&joined.state)?,
        "event": value_of(&joined.event)?,
    });
    Ok(Json(json!([200, answer])))
}

/// `PUT /_matrix/federation/v1/send_leave/{roomId}/{eventId}`: `[200, {}]`.
pub(super) async fn send_leave(State(state): State<AppState>, req: Signed) -> Result<Json<Value>> {
    let (room_id, event_id, pdu) = parts(&req)?;
    resident::send_membership(&state, &req.origin, room_id, event_id, &pdu, "leave").await?;
    Ok(Json(json!([200, {}])))
}

/// `PUT /_matrix/federation/v1/invite/{roomId}/{eventId}`: the body is the
/// invite itself, its stripped state under `unsigned.invite_room_state`;
/// `[200, {"event": ...}]`.
pub(super) async fn invite(State(state): State<AppState>, req: Signed) -> Result<Json<Value>> {
    let (room_id, event_id, pdu) = parts(&req)?;
    let event: Value = serde_json::from_str(pdu.get())
        .map_err(|e| Error::BadJson(format!("The invite is not a JSON object: {e}")))?;
    let stripped: Vec<RawStrippedState> = match event.pointer("/unsigned/invite_room_state") {
        Some(list) => serde_json::from_value(list.clone())
            .map_err(|e| Error::BadJson(format!("Invalid invite_room_state: {e}")))?,
        None => Vec::new(),
    };
    let signed =
        invites::receive_invite(&state, &req.origin, room_id, event_id, &RoomVersionId::V2, &pdu, &stripped)
            .await?;
    Ok(Json(json!([200, { "event": value_of(&signed)? }])))
}
