//! Asking other servers for their users' keys (`/user/keys/query`,
//! `/user/keys/claim`): one request per server, all at once, each bounded
//! by the asker's timeout. A server that fails or does not answer in time
//! goes into `failures` (by server name) and delays no one else; what a
//! server answers counts only for its own users.

use std::collections::BTreeMap;
use std::time::Duration;

use ruma::api::federation::device::get_devices;
use ruma::api::federation::keys::{claim_keys, get_keys};
use ruma::{OwnedDeviceId, OwnedServerName, OwnedUserId, UserId};
use serde_json::{Map, Value, json};

use crate::account::key_query::Keys;
use crate::state::AppState;
use crate::storage::remote_devices::{DeviceList, MAX_DEVICES};

/// Most servers one request asks at once; the others are listed in
/// `failures` (a client cannot make us open thousands of connections).
const MAX_SERVERS: usize = 100;

/// `wanted` grouped by the users' servers (the first [`MAX_SERVERS`]).
type ByServer<T> = BTreeMap<OwnedServerName, BTreeMap<OwnedUserId, T>>;

/// Groups `wanted` by the users' servers; answers also the servers left out.
fn by_server<T: Clone>(wanted: &BTreeMap<OwnedUserId, T>) -> (ByServer<T>, Vec<OwnedServerName>) {
    let mut out: ByServer<T> = BTreeMap::new();
    let mut left_out = Vec::new();
    for (user, value) in wanted {
        let server = user.server_name().to_owned();
        if out.len() >= MAX_SERVERS && !out.contains_key(&server) {
            if !left_out.contains(&server) {
                left_out.push(server);
            }
            continue;
        }
        out.entry(server).or_default().insert(user.clone(), value.clone());
    }
    (out, left_out)
}

/// Why a server gave nothing, as `failures` lists it.
fn failure(why: impl std::fmt::Display) -> Value {
    json!({ "errcode": "M_UNAVAILABLE", "error": why.to_string() })
}

/// The device list of another server's `user`, asked of that server
/// (`/user/devices/{userId}`) within `timeout`. Keys that name another user
/// or another device than the one they are listed under are left out, and
/// so are cross-signing keys of another user. Fails (with why) when the
/// server does not answer, answers about someone else, or lists more than
/// [`MAX_DEVICES`] devices.
pub async fn device_list(state: &AppState, user: &UserId, timeout: Duration) -> Result<DeviceList, String> {
    if state.settings.federation.is_none() {
        return Err("federation is off".to_owned());
    }
    let asked = super::send(state, user.server_name(), get_devices::v1::Request::new(user.to_owned()));
    let response = match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("timed out".to_owned()),
    };
    if response.user_id != user {
        return Err(format!("asked for {user}, answered for {}", response.user_id));
    }
    if response.devices.len() > MAX_DEVICES {
        return Err(format!("{} devices, more than {MAX_DEVICES}", response.devices.len()));
    }
    let stream_id = i64::try_from(u64::from(response.stream_id)).map_err(|e| e.to_string())?;
    let mut devices = Map::new();
    for device in response.devices {
        let keys = value(device.keys.json());
        if keys["user_id"] != user.as_str() || keys["device_id"] != device.device_id.as_str() {
            continue;
        }
        let mut entry = json!({ "keys": keys });
        if let Some(name) = device.device_display_name {
            entry["device_display_name"] = json!(name);
        }
        devices.insert(device.device_id.to_string(), entry);
    }
    let own = |raw: Option<ruma::serde::Raw<_>>| {
        raw.map(|r: ruma::serde::Raw<_>| value(r.json())).filter(|k| k["user_id"] == user.as_str())
    };
    Ok(DeviceList {
        stream_id,
        stale: 0,
        devices,
        master_key: own(response.master_key),
        self_signing_key: own(response.self_signing_key),
    })
}

/// Parses a raw JSON answer part.
fn value(raw: &serde_json::value::RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or_default()
}

/// Adds to `answer` what the servers of `wanted` (user -> devices, none:
/// all) say of their users' keys.
pub async fn query(
    state: &AppState,
    wanted: &BTreeMap<OwnedUserId, Vec<String>>,
    timeout: Duration,
    answer: &mut Keys,
) {
    if state.settings.federation.is_none() {
        return;
    }
    let (servers, left_out) = by_server(wanted);
    for server in left_out {
        answer.failures.insert(server.to_string(), failure("too many servers in one request"));
    }
    let mut asks = tokio::task::JoinSet::new();
    for (server, users) in servers {
        let request: BTreeMap<OwnedUserId, Vec<OwnedDeviceId>> =
            users.into_iter().map(|(u, d)| (u, d.into_iter().map(OwnedDeviceId::from).collect())).collect();
        let state = state.clone();
        asks.spawn(async move {
            let asked = super::send(&state, &server, get_keys::v1::Request::new(request));
            let result = tokio::time::timeout(timeout, asked).await;
            (server, result)
        });
    }
    while let Some(Ok((server, result))) = asks.join_next().await {
        let response = match result {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                answer.failures.insert(server.to_string(), failure(e));
                continue;
            }
            Err(_) => {
                answer.failures.insert(server.to_string(), failure("timed out"));
                continue;
            }
        };
        let own = |user: &OwnedUserId| user.server_name() == server;
        for (user, devices) in response.device_keys.iter().filter(|(u, _)| own(u)) {
            let per_device: Map<String, Value> =
                devices.iter().map(|(d, raw)| (d.to_string(), value(raw.json()))).collect();
            answer.device_keys.insert(user.to_string(), Value::Object(per_device));
        }
        for (user, raw) in response.master_keys.iter().filter(|(u, _)| own(u)) {
            answer.master_keys.insert(user.to_string(), value(raw.json()));
        }
        for (user, raw) in response.self_signing_keys.iter().filter(|(u, _)| own(u)) {
            answer.self_signing_keys.insert(user.to_string(), value(raw.json()));
        }
    }
}

/// Adds to `keys` what the servers of `wanted` (user -> device ->
/// algorithm) give of their users' one-time keys; those that fail go to
/// `failures`.
pub async fn claim(
    state: &AppState,
    wanted: &BTreeMap<OwnedUserId, BTreeMap<String, String>>,
    timeout: Duration,
    keys: &mut Map<String, Value>,
    failures: &mut Map<String, Value>,
) {
    if state.settings.federation.is_none() {
        return;
    }
    let (servers, left_out) = by_server(wanted);
    for server in left_out {
        failures.insert(server.to_string(), failure("too many servers in one request"));
    }
    let mut asks = tokio::task::JoinSet::new();
    for (server, users) in servers {
        let request: claim_keys::v1::OneTimeKeyClaims = users
            .into_iter()
            .map(|(u, d)| {
                (u, d.into_iter().map(|(d, a)| (OwnedDeviceId::from(d), a.as_str().into())).collect())
            })
            .collect();
        let state = state.clone();
        asks.spawn(async move {
            let asked = super::send(&state, &server, claim_keys::v1::Request::new(request));
            let result = tokio::time::timeout(timeout, asked).await;
            (server, result)
        });
    }
    while let Some(Ok((server, result))) = asks.join_next().await {
        match result {
            Ok(Ok(response)) => {
                for (user, devices) in
                    response.one_time_keys.iter().filter(|(u, _)| u.server_name() == server)
                {
                    let per_device: Map<String, Value> = devices
                        .iter()
                        .map(|(d, by_id)| {
                            let ids: Map<String, Value> =
                                by_id.iter().map(|(id, raw)| (id.to_string(), value(raw.json()))).collect();
                            (d.to_string(), Value::Object(ids))
                        })
                        .collect();
                    keys.insert(user.to_string(), Value::Object(per_device));
                }
            }
            Ok(Err(e)) => {
                failures.insert(server.to_string(), failure(e));
            }
            Err(_) => {
                failures.insert(server.to_string(), failure("timed out"));
            }
        }
    }
}
