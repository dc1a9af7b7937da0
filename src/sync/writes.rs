//! Writes that only /sync shows: account data, receipts, typing. Each takes a
//! stream position (typing: a serial), then wakes exactly the users concerned
//! (a room's ephemeral events: the waiting syncs watching the room, which
//! are those of its joined members). Receipts and typing notices of other
//! servers' users come through here too (`federation::edus`), under the
//! same checks; those of our users are announced to the room's servers.

use std::time::Duration;

use ruma::{RoomId, UserId};

use crate::error::{Error, Result};
use crate::federation::edus::Outgoing;
use crate::room::read;
use crate::state::AppState;
use crate::storage::{self, account_data, receipts};
use crate::streams::Change;

/// Sets account data (`room_id` `None` for global) and wakes the user.
pub async fn set_account_data(
    state: &AppState,
    user: &UserId,
    room_id: Option<&RoomId>,
    data_type: &str,
    content: &serde_json::Value,
) -> Result<()> {
    if !content.is_object() {
        return Err(Error::BadJson("Account data must be a JSON object".into()));
    }
    let text = serde_json::to_string(content).map_err(|e| Error::Internal(e.to_string()))?;
    let reservation = state.streams.reserve();
    account_data::put(
        &state.db,
        user.as_str(),
        room_id.map_or("", |r| r.as_str()),
        data_type,
        &text,
        reservation.pos,
    )
    .await?;
    reservation.finish(Change::AccountData { user: user.to_string() });
    state.notifier.wake([user.as_str()]);
    Ok(())
}

/// Sets a receipt on a visible event and wakes the room's members.
pub async fn set_receipt(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    receipt_type: &str,
    thread_id: Option<&str>,
    event_id: &str,
) -> Result<()> {
    let view = read::open(state, room_id).await?;
    let access = read::access(state, &view, user).await?;
    let target = read::load_by_id(state, event_id).await?;
    if target.stored.room_id != room_id.as_str() || !access.ranges.contains(target.stored.seq) {
        return Err(Error::NotFound("Event not found".into()));
    }
    if !access.joined() {
        return Err(Error::Forbidden("You are not joined to this room".into()));
    }
    let receipt = receipts::Receipt {
        room_id: room_id.to_string(),
        user_id: user.to_string(),
        receipt_type: receipt_type.to_owned(),
        thread_id: thread_id.unwrap_or("").to_owned(),
        event_id: event_id.to_owned(),
        ts: storage::now_ms(),
    };
    let reservation = state.streams.reserve();
    receipts::put(&state.db, &receipt, reservation.pos).await?;
    reservation.finish(Change::Receipt { room: room_id.to_string() });
    if receipt_type == "m.read.private" {
        state.notifier.wake([user.as_str()]);
        return Ok(());
    }
    state.notifier.wake_room(room_id.as_str(), []);
    if is_local(state, user) {
        let edu = Outgoing::Receipt {
            room_id: room_id.to_owned(),
            user_id: user.to_owned(),
            event_id: receipt.event_id,
            thread_id: thread_id.map(str::to_owned),
            ts: receipt.ts,
        };
        crate::federation::edus::announce_in(state, &view, edu).await;
    }
    Ok(())
}

/// Whether `user` is one of ours (what they do is announced to other
/// servers; what another server's user does came from there).
fn is_local(state: &AppState, user: &UserId) -> bool {
    user.server_name() == state.settings.server_name
}

/// Starts or stops typing and wakes the room's members if that changed.
pub async fn set_typing(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    timeout: Option<Duration>,
) -> Result<()> {
    let view = read::open_kept(state, room_id).await?;
    set_typing_in(state, &view, user, timeout).await
}

/// [`set_typing`] in an open room. Nothing on this path writes to the
/// database or reads more than the room's row (kept between notices, see
/// [`read::open_kept`]): whether the user is joined and which servers
/// are in the room come from the read cache.
pub async fn set_typing_in(
    state: &AppState,
    view: &read::RoomView,
    user: &UserId,
    timeout: Option<Duration>,
) -> Result<()> {
    let room_id = view.room.room_id.as_str();
    read::require_joined_in(state, view, user).await?;
    let changed = state.typing.set(room_id, user.as_str(), timeout);
    if changed {
        state.notifier.wake_room(room_id, []);
    }
    // A renewal is announced too: other servers time a notice out alone.
    if is_local(state, user) && (changed || timeout.is_some()) {
        let room_id = ruma::OwnedRoomId::try_from(room_id)
            .map_err(|e| Error::Internal(format!("stored room id {room_id}: {e}")))?;
        let edu = Outgoing::Typing { room_id, user_id: user.to_owned(), typing: timeout.is_some() };
        crate::federation::edus::announce_in(state, view, edu).await;
    }
    Ok(())
}

/// Expires typing notices; run every second by the server.
pub async fn expire_typing(state: &AppState) -> Result<()> {
    for room_id in state.typing.expire() {
        state.notifier.wake_room(&room_id, []);
    }
    Ok(())
}
