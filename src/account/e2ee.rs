//! End-to-end encryption bookkeeping shared by the key endpoints, device
//! removal and /sync: one-time key counts and device-list changes.

use ruma::UserId;
use serde_json::{Map, Value, json};

use crate::error::Result;
use crate::federation::edus::Outgoing;
use crate::state::AppState;
use crate::storage::{devices, events, keys};
use crate::streams::Change;

/// What changed about a user's devices or keys (what other servers are told).
#[derive(Debug, Clone, Copy)]
pub enum DeviceChange<'a> {
    /// These devices of ours: their keys, signatures or display names.
    Devices(&'a [&'a str]),
    /// Our user's cross-signing keys.
    CrossSigning,
    /// Another server's user (its server told us; nothing to tell anyone else).
    Remote,
}

/// Records a device-list change of `user` and wakes everyone who shares a room
/// with them (and the user's own other devices); for our users, tells the
/// other servers that share a room with them (`m.device_list_update` per
/// device, `m.signing_key_update`).
pub async fn device_list_changed(state: &AppState, user: &UserId, change: DeviceChange<'_>) -> Result<()> {
    let reservation = state.streams.reserve();
    let (pos, previous) = (reservation.pos, keys::last_device_list_change(&state.db, user.as_str()).await?);
    keys::device_list_changed(&state.db, user.as_str(), pos).await?;
    reservation.finish(Change::DeviceList { user: user.to_string() });
    wake_peers(state, user).await?;
    match change {
        DeviceChange::Devices(ids) => announce_devices(state, user, ids, false, pos, previous).await,
        DeviceChange::CrossSigning => announce_cross_signing(state, user).await,
        DeviceChange::Remote => Ok(()),
    }
}

/// Tells the other servers sharing a room with `user` that `devices` changed
/// (`deleted`: are gone) at device-list position `pos`, after `previous`.
async fn announce_devices(
    state: &AppState,
    user: &UserId,
    devices: &[&str],
    deleted: bool,
    pos: i64,
    previous: Option<i64>,
) -> Result<()> {
    if state.settings.federation.is_none() {
        return Ok(());
    }
    let all_keys = if deleted { Vec::new() } else { keys::device_keys(&state.db, user.as_str()).await? };
    let signatures =
        if deleted { Vec::new() } else { keys::key_signatures(&state.db, user.as_str()).await? };
    for device in devices {
        let mut content = json!({
            "user_id": user, "device_id": device, "stream_id": pos,
            "prev_id": previous.into_iter().collect::<Vec<_>>(), "deleted": deleted,
        });
        if !deleted {
            if let Some((_, text)) = all_keys.iter().find(|(d, _)| d == device) {
                let mut value: Value = serde_json::from_str(text).unwrap_or_default();
                super::keys::add_signatures(&mut value, user.as_str(), device, &signatures, user.as_str());
                content["keys"] = value;
            }
            if let Some(name) =
                devices::get(&state.db, user.as_str(), device).await?.and_then(|d| d.display_name)
            {
                content["device_display_name"] = json!(name);
            }
        }
        let edu = json!({ "edu_type": "m.device_list_update", "content": content });
        let key = format!("device {user} {device} {pos}");
        crate::federation::edus::announce(state, Outgoing::AboutUser { user_id: user.to_owned(), key, edu })
            .await;
    }
    Ok(())
}

/// Tells the other servers sharing a room with `user` their cross-signing
/// keys now.
async fn announce_cross_signing(state: &AppState, user: &UserId) -> Result<()> {
    if state.settings.federation.is_none() {
        return Ok(());
    }
    let mut content = json!({ "user_id": user });
    for (kind, field) in [("master", "master_key"), ("self_signing", "self_signing_key")] {
        if let Some(text) = keys::cross_signing_key(&state.db, user.as_str(), kind).await? {
            content[field] = serde_json::from_str(&text).unwrap_or_default();
        }
    }
    let edu = json!({ "edu_type": "m.signing_key_update", "content": content });
    let key = format!("signing keys {user}");
    crate::federation::edus::announce(state, Outgoing::AboutUser { user_id: user.to_owned(), key, edu })
        .await;
    Ok(())
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
    let (pos, previous) = (reservation.pos, keys::last_device_list_change(&state.db, user.as_str()).await?);
    devices::delete_many(&state.db, user.as_str(), device_ids, pos).await?;
    reservation.finish(Change::DeviceList { user: user.to_string() });
    for device in device_ids {
        state.tokens.forget_device(user.as_str(), device);
        state.sliding.forget_device(user.as_str(), device);
    }
    wake_peers(state, user).await?;
    announce_devices(state, user, device_ids, true, pos, previous).await
}
