//! Room endpoints of the federation API: joins, knocks and leaves through us
//! (make_join / send_join v2, make_knock / send_knock, make_leave / send_leave v2), transactions
//! (`/send`), and the events and state other servers ask for. Each handler
//! parses, calls `federation::{resident, incoming}`, formats.

use ruma::api::federation::authorization::get_event_authorization;
use ruma::api::federation::backfill::get_backfill;
use ruma::api::federation::directory::{get_public_rooms, get_public_rooms_filtered};
use ruma::api::federation::event::{get_event, get_missing_events, get_room_state, get_room_state_ids};
use ruma::api::federation::membership::{
    create_invite, create_join_event, create_knock_event, create_leave_event, prepare_join_event,
    prepare_knock_event, prepare_leave_event,
};
use ruma::api::federation::space::get_hierarchy;
use ruma::api::federation::transactions::send_transaction_message;
use ruma::{EventId, MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedServerName, UInt};

use super::Federation;
use crate::error::{Error, Result};
use crate::federation::{incoming, invites, resident};
use crate::state::AppState;

/// The origin of a signed request (the extractor sets it for every endpoint
/// these handlers serve).
fn origin<T>(req: &Federation<T>) -> Result<&OwnedServerName> {
    req.origin.as_ref().ok_or_else(|| Error::Unauthorized("The request is not signed".into()))
}

fn now() -> MilliSecondsSinceUnixEpoch {
    MilliSecondsSinceUnixEpoch(UInt::try_from(crate::storage::now_ms()).unwrap_or_default())
}

pub(super) async fn make_join(
    state: AppState,
    req: Federation<prepare_join_event::v1::Request>,
) -> Result<prepare_join_event::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let (version, event) =
        resident::make_membership(&state, origin, &body.room_id, &body.user_id, "join", Some(&body.ver))
            .await?;
    let mut response = prepare_join_event::v1::Response::new(event);
    response.room_version = Some(version);
    Ok(response)
}

pub(super) async fn send_join(
    state: AppState,
    req: Federation<create_join_event::v2::Request>,
) -> Result<create_join_event::v2::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let joined =
        resident::send_join(&state, origin, &body.room_id, &body.event_id, &body.pdu, body.omit_members)
            .await?;
    let mut room_state = create_join_event::v2::RoomState::new();
    room_state.state = joined.state;
    room_state.auth_chain = joined.auth_chain;
    room_state.event = Some(joined.event);
    room_state.servers_in_room = Some(joined.servers_in_room);
    room_state.members_omitted = joined.members_omitted;
    Ok(create_join_event::v2::Response::new(room_state))
}

pub(super) async fn make_knock(
    state: AppState,
    req: Federation<prepare_knock_event::v1::Request>,
) -> Result<prepare_knock_event::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let (version, event) =
        resident::make_membership(&state, origin, &body.room_id, &body.user_id, "knock", Some(&body.ver))
            .await?;
    Ok(prepare_knock_event::v1::Response::new(version, event))
}

pub(super) async fn send_knock(
    state: AppState,
    req: Federation<create_knock_event::v1::Request>,
) -> Result<create_knock_event::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let stripped = resident::send_knock(&state, origin, &body.room_id, &body.event_id, &body.pdu).await?;
    Ok(create_knock_event::v1::Response::new(stripped))
}

pub(super) async fn make_leave(
    state: AppState,
    req: Federation<prepare_leave_event::v1::Request>,
) -> Result<prepare_leave_event::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let (version, event) =
        resident::make_membership(&state, origin, &body.room_id, &body.user_id, "leave", None).await?;
    Ok(prepare_leave_event::v1::Response::new(Some(version), event))
}

pub(super) async fn send_leave(
    state: AppState,
    req: Federation<create_leave_event::v2::Request>,
) -> Result<create_leave_event::v2::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    resident::send_membership(&state, origin, &body.room_id, &body.event_id, &body.pdu, "leave").await?;
    Ok(create_leave_event::v2::Response::new())
}

pub(super) async fn send_transaction(
    state: AppState,
    req: Federation<send_transaction_message::v1::Request>,
) -> Result<send_transaction_message::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    if body.origin != *origin {
        return Err(Error::Forbidden("The transaction's origin is not the server that signed it".into()));
    }
    let edus: Vec<&serde_json::value::RawValue> = body.edus.iter().map(|edu| edu.json()).collect();
    let results =
        incoming::transaction(&state, origin, body.transaction_id.as_str(), &body.pdus, &edus).await?;
    Ok(send_transaction_message::v1::Response::new(results))
}

pub(super) async fn event(
    state: AppState,
    req: Federation<get_event::v1::Request>,
) -> Result<get_event::v1::Response> {
    let origin = origin(&req)?;
    let pdu = resident::event(&state, origin, &req.body.event_id).await?;
    Ok(get_event::v1::Response::new(state.settings.server_name.clone(), now(), pdu))
}

pub(super) async fn room_state(
    state: AppState,
    req: Federation<get_room_state::v1::Request>,
) -> Result<get_room_state::v1::Response> {
    let origin = origin(&req)?;
    let (pdus, chain) =
        resident::state_at_event(&state, origin, &req.body.room_id, &req.body.event_id).await?;
    Ok(get_room_state::v1::Response::new(resident::raw_held(chain)?, resident::raw_events(pdus)?))
}

pub(super) async fn room_state_ids(
    state: AppState,
    req: Federation<get_room_state_ids::v1::Request>,
) -> Result<get_room_state_ids::v1::Response> {
    let origin = origin(&req)?;
    let (pdus, chain) =
        resident::state_at_event(&state, origin, &req.body.room_id, &req.body.event_id).await?;
    let ids = |ids: Vec<String>| -> Vec<OwnedEventId> {
        ids.iter().filter_map(|id| EventId::parse(id).ok()).collect()
    };
    Ok(get_room_state_ids::v1::Response::new(
        ids(chain.into_iter().map(|e| e.event_id).collect()),
        ids(pdus.into_iter().map(|e| e.event_id).collect()),
    ))
}

pub(super) async fn event_auth(
    state: AppState,
    req: Federation<get_event_authorization::v1::Request>,
) -> Result<get_event_authorization::v1::Response> {
    let origin = origin(&req)?;
    let chain = resident::event_auth(&state, origin, &req.body.room_id, &req.body.event_id).await?;
    Ok(get_event_authorization::v1::Response::new(chain))
}

pub(super) async fn backfill(
    state: AppState,
    req: Federation<get_backfill::v1::Request>,
) -> Result<get_backfill::v1::Response> {
    let origin = origin(&req)?;
    let limit = usize::try_from(u64::from(req.body.limit)).unwrap_or(resident::MAX_BACKFILL);
    let pdus = resident::backfill(&state, origin, &req.body.room_id, &req.body.v, limit).await?;
    Ok(get_backfill::v1::Response::new(state.settings.server_name.clone(), now(), pdus))
}

pub(super) async fn missing_events(
    state: AppState,
    req: Federation<get_missing_events::v1::Request>,
) -> Result<get_missing_events::v1::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let limit = usize::try_from(u64::from(body.limit)).unwrap_or(resident::MAX_MISSING);
    let events = resident::missing_events(
        &state,
        origin,
        &body.room_id,
        &body.earliest_events,
        &body.latest_events,
        limit,
    )
    .await?;
    Ok(get_missing_events::v1::Response::new(events))
}

pub(super) async fn invite(
    state: AppState,
    req: Federation<create_invite::v2::Request>,
) -> Result<create_invite::v2::Response> {
    let origin = origin(&req)?;
    let body = &req.body;
    let event = invites::receive_invite(
        &state,
        origin,
        &body.room_id,
        &body.event_id,
        &body.room_version,
        &body.event,
        &body.invite_room_state,
    )
    .await?;
    Ok(create_invite::v2::Response::new(event))
}

/// Our public rooms as the client API lists them, in ruma's federation form.
async fn directory_page(
    state: &AppState,
    limit: Option<UInt>,
    since: Option<&str>,
    search: Option<&str>,
) -> Result<(Vec<ruma::directory::PublicRoomsChunk>, Option<String>, Option<String>, Option<UInt>)> {
    let page = crate::room::directory::public_rooms(state, limit.map(u64::from), since, search).await?;
    let chunk = serde_json::from_value(page["chunk"].clone())
        .map_err(|e| Error::Internal(format!("directory page: {e}")))?;
    let text = |key: &str| page[key].as_str().map(str::to_owned);
    let total = page["total_room_count_estimate"].as_u64().and_then(|n| UInt::try_from(n).ok());
    Ok((chunk, text("next_batch"), text("prev_batch"), total))
}

pub(super) async fn public_rooms(
    state: AppState,
    req: Federation<get_public_rooms::v1::Request>,
) -> Result<get_public_rooms::v1::Response> {
    origin(&req)?;
    let (chunk, next, prev, total) =
        directory_page(&state, req.body.limit, req.body.since.as_deref(), None).await?;
    let mut response = get_public_rooms::v1::Response::new();
    response.chunk = chunk;
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = total;
    Ok(response)
}

pub(super) async fn public_rooms_filtered(
    state: AppState,
    req: Federation<get_public_rooms_filtered::v1::Request>,
) -> Result<get_public_rooms_filtered::v1::Response> {
    origin(&req)?;
    let b = &req.body;
    let (chunk, next, prev, total) =
        directory_page(&state, b.limit, b.since.as_deref(), b.filter.generic_search_term.as_deref()).await?;
    let mut response = get_public_rooms_filtered::v1::Response::new();
    response.chunk = chunk;
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = total;
    Ok(response)
}

pub(super) async fn hierarchy(
    state: AppState,
    req: Federation<get_hierarchy::v1::Request>,
) -> Result<get_hierarchy::v1::Response> {
    let origin = origin(&req)?;
    crate::room::spaces::for_server(&state, origin, &req.body.room_id, req.body.suggested_only).await
}
