//! End-to-end encryption bookkeeping shared by the key endpoints, device
//! removal and /sync: one-time key counts and device-list changes.

use ruma::UserId;
use serde_json::{Map, Value, json};

use crate::error::Result;
use crate::state::AppState;
use crate::storage::{devices, events, keys};
use crate::streams::Change;

/// Records a device-list change of `user` and wakes everyone who shares a room
/// with them (and the user's own other devices).
pub async fn device_list_changed(state: &AppState, user: &UserId) -> Result<()> {
    let reservation = state.streams.reserve();
    keys::device_list_changed(&state.db, user.as_str(), reservation.pos).await?;
    reservation.finish(Change::DeviceList { user: user.to_string() });
    wake_peers(state, user).await
}

/// Wakes everyone who shares a room with `user` (and the user's own
/// devices): their device lists changed.
async fn wake_peers(state: &AppState, user: &UserId) -> Result<()> {
    let wake = events::room_peers(&state.db, user.as_str()).await?;
    state.notifier.wake(wake.iter().map(String::as_str));
    Ok(())
}

/// The one-time key counts of a device, as uploads and /sync report them.
pub async fn otk_counts(state: &AppState, user: &str, device: &str) -> Result<Value> {
    Ok(otk_counts_json(&keys::one_time_key_counts(&state.db, user, device).await?))
}

/// `one_time_key_counts` from the stored counts (`signed_curve25519` always there).
pub fn otk_counts_json(stored: &[(String, i64)]) -> Value {
    let mut counts = Map::new();
    counts.insert("signed_curve25519".into(), json!(0));
    for (algorithm, n) in stored {
        counts.insert(algorithm.clone(), json!(n));
    }
    Value::Object(counts)
}

/// Deletes devices with their keys and queued messages, and tells those who
/// share a room with the user.
pub async fn remove_devices(state: &AppState, user: &UserId, device_ids: &[&str]) -> Result<()> {
    if device_ids.is_empty() {
        return Ok(());
    }
    // The devices, their keys, signatures and queued messages and the
    // device-list change go in one transaction: no one sees the devices gone
    // without the change that tells them.
    let reservation = state.streams.reserve();
    devices::delete_many(&state.db, user.as_str(), device_ids, reservation.pos).await?;
    reservation.finish(Change::DeviceList { user: user.to_string() });
    for device in device_ids {
        state.tokens.forget_device(user.as_str(), device);
    }
    wake_peers(state, user).await
}
