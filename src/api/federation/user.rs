//! Another server asks for our users' devices and keys:
//! `/user/devices/{userId}`, `/user/keys/query`, `/user/keys/claim`. Only
//! our users are answered for (others are left out, a device list of
//! someone else's user is 404); what is answered is what
//! `account::key_query` gives any asker.

use std::collections::BTreeMap;

use ruma::api::federation::device::get_devices;
use ruma::api::federation::keys::{claim_keys, get_keys};
use ruma::serde::Raw;
use ruma::{OwnedDeviceId, OwnedUserId, UInt};
use serde_json::Value;
use serde_json::value::RawValue as RawJsonValue;

use super::Federation;
use crate::account::key_query;
use crate::error::{Error, Result};
use crate::state::AppState;

/// Most users one request may ask about.
const MAX_USERS: usize = 1000;

/// A JSON value as ruma's raw form of `T`.
fn raw<T>(value: &Value) -> Result<Raw<T>> {
    let text = serde_json::to_string(value).map_err(|e| Error::Internal(e.to_string()))?;
    let raw = RawJsonValue::from_string(text).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(Raw::from_json(raw))
}

pub(super) async fn devices(
    state: AppState,
    req: Federation<get_devices::v1::Request>,
) -> Result<get_devices::v1::Response> {
    let user = &req.body.user_id;
    if user.server_name() != state.settings.server_name
        || !crate::storage::users::localpart_exists(&state.db, user.localpart()).await?
    {
        return Err(Error::NotFound("No such user here".into()));
    }
    let answer = key_query::devices_of(&state, user).await?;
    let stream = UInt::try_from(answer["stream_id"].as_i64().unwrap_or(0).max(0)).unwrap_or_default();
    let mut response = get_devices::v1::Response::new(user.clone(), stream);
    for device in answer["devices"].as_array().into_iter().flatten() {
        let Some(id) = device["device_id"].as_str() else { continue };
        let mut entry = get_devices::v1::UserDevice::new(OwnedDeviceId::from(id), raw(&device["keys"])?);
        entry.device_display_name = device["device_display_name"].as_str().map(str::to_owned);
        response.devices.push(entry);
    }
    if answer["master_key"].is_object() {
        response.master_key = Some(raw(&answer["master_key"])?);
    }
    if answer["self_signing_key"].is_object() {
        response.self_signing_key = Some(raw(&answer["self_signing_key"])?);
    }
    Ok(response)
}

pub(super) async fn query(
    state: AppState,
    req: Federation<get_keys::v1::Request>,
) -> Result<get_keys::v1::Response> {
    let wanted: BTreeMap<OwnedUserId, Vec<String>> = req
        .body
        .device_keys
        .iter()
        .filter(|(user, _)| user.server_name() == state.settings.server_name)
        .take(MAX_USERS)
        .map(|(user, devices)| (user.clone(), devices.iter().map(|d| d.to_string()).collect()))
        .collect();
    let found = key_query::query_local(&state, &wanted, None).await?;
    let mut response = get_keys::v1::Response::new(BTreeMap::new());
    for (user, devices) in &found.device_keys {
        let Ok(user) = OwnedUserId::try_from(user.as_str()) else { continue };
        let mut per_device = BTreeMap::new();
        for (device, keys) in devices.as_object().into_iter().flatten() {
            per_device.insert(OwnedDeviceId::from(device.as_str()), raw(keys)?);
        }
        response.device_keys.insert(user, per_device);
    }
    for (from, to) in [
        (&found.master_keys, &mut response.master_keys),
        (&found.self_signing_keys, &mut response.self_signing_keys),
    ] {
        for (user, key) in from {
            if let Ok(user) = OwnedUserId::try_from(user.as_str()) {
                to.insert(user, raw(key)?);
            }
        }
    }
    Ok(response)
}

pub(super) async fn claim(
    state: AppState,
    req: Federation<claim_keys::v1::Request>,
) -> Result<claim_keys::v1::Response> {
    let wanted: BTreeMap<OwnedUserId, BTreeMap<String, String>> = req
        .body
        .one_time_keys
        .iter()
        .filter(|(user, _)| user.server_name() == state.settings.server_name)
        .take(MAX_USERS)
        .map(|(user, devices)| {
            (user.clone(), devices.iter().map(|(d, a)| (d.to_string(), a.to_string())).collect())
        })
        .collect();
    let claimed = key_query::claim_local(&state, &wanted).await?;
    let mut keys: claim_keys::v1::OneTimeKeys = BTreeMap::new();
    for (user, devices) in &claimed {
        let Ok(user) = OwnedUserId::try_from(user.as_str()) else { continue };
        let per_user = keys.entry(user).or_default();
        for (device, by_id) in devices.as_object().into_iter().flatten() {
            let per_device = per_user.entry(OwnedDeviceId::from(device.as_str())).or_default();
            for (key_id, key) in by_id.as_object().into_iter().flatten() {
                if let Ok(key_id) = key_id.as_str().try_into() {
                    per_device.insert(key_id, raw(key)?);
                }
            }
        }
    }
    Ok(claim_keys::v1::Response::new(keys))
}
