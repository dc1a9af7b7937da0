//! End-to-end encryption bookkeeping shared by the key endpoints, device
//! removal and /sync: one-time key counts and device-list changes.

use ruma::UserId;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{devices, events, keys, memberships};

/// Records a device-list change of `user` and wakes everyone who shares a room
/// with them (and the user's own other devices).
pub async fn device_list_changed(state: &AppState, user: &UserId) -> Result<()> {
    let reservation = state.streams.reserve();
    keys::device_list_changed(&state.db, user.as_str(), reservation.pos).await?;
    drop(reservation);
    let mut wake = vec![user.to_string()];
    for room in events::rooms_with_membership(&state.db, user.as_str(), "join").await? {
        let view = crate::room::read::open(
            state,
            &ruma::RoomId::parse(&room).map_err(|e| Error::Internal(e.to_string()))?,
        )
        .await?;
        wake.extend(
            memberships::holders_between(&state.db, &room, view.room.last_seq, view.room.last_seq).await?,
        );
    }
    state.notifier.wake(wake.iter().map(String::as_str));
    Ok(())
}

/// The one-time key counts of a device, as uploads and /sync report them.
pub async fn otk_counts(state: &AppState, user: &str, device: &str) -> Result<Value> {
    let mut counts = Map::new();
    counts.insert("signed_curve25519".into(), json!(0));
    for (algorithm, n) in keys::one_time_key_counts(&state.db, user, device).await? {
        counts.insert(algorithm, json!(n));
    }
    Ok(Value::Object(counts))
}

/// Deletes devices with their keys and queued messages, and tells those who
/// share a room with the user.
pub async fn remove_devices(state: &AppState, user: &UserId, device_ids: &[&str]) -> Result<()> {
    devices::delete_many(&state.db, user.as_str(), device_ids).await?;
    for device in device_ids {
        keys::delete_device(&state.db, user.as_str(), device).await?;
    }
    if !device_ids.is_empty() {
        device_list_changed(state, user).await?;
    }
    Ok(())
}
