//! Who has which keys: `/keys/query` and `/keys/claim` of the client API,
//! and their federation forms (`/user/keys/query`, `/user/keys/claim`,
//! `/user/devices/{userId}`), one set of rules for both.
//!
//! Our users' keys are read here ([`query_local`], [`claim_local`]). Other
//! servers' users who share a room with the asker are answered from their
//! device lists held here (`storage::remote_devices`): a list not held, or
//! stale, is asked of its server first (`/user/devices/{userId}`), and kept
//! current by that server's updates (`remote_device_update`). Anyone else's
//! keys are asked of their servers, one request per server. All asking
//! happens at once, each bounded by the client's timeout
//! (`federation::user_keys`): a server that fails or does not answer in
//! time is listed in `failures` and delays no one else. Another server gets
//! only our users' keys, with the signatures their owners made (never
//! user-signing keys).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ruma::{OwnedUserId, UserId};
use serde_json::{Map, Value, json};

use super::keys as account_keys;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::remote_devices::{self, DeviceList};
use crate::storage::{devices, events, keys};
use crate::streams::Change;

/// The longest a client's `timeout` may make us wait for other servers.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Most device lists one query asks other servers for again; the other
/// users are asked about without keeping their lists.
const MAX_RESYNCS: usize = 100;

/// Most devices one claim takes keys from (each is a write); the rest of
/// the request is left unanswered.
pub const MAX_CLAIMED_DEVICES: usize = 1000;

/// The keys of some users, as `/keys/query` answers them.
#[derive(Debug, Default)]
pub struct Keys {
    /// user -> device -> device keys.
    pub device_keys: Map<String, Value>,
    /// user -> master key.
    pub master_keys: Map<String, Value>,
    /// user -> self-signing key.
    pub self_signing_keys: Map<String, Value>,
    /// user -> user-signing key (the asker's own only).
    pub user_signing_keys: Map<String, Value>,
    /// server -> why it gave nothing.
    pub failures: Map<String, Value>,
}

impl Keys {
    /// The client API's answer.
    pub fn to_json(&self) -> Value {
        json!({
            "device_keys": self.device_keys,
            "master_keys": self.master_keys,
            "self_signing_keys": self.self_signing_keys,
            "user_signing_keys": self.user_signing_keys,
            "failures": self.failures,
        })
    }
}

/// The client's `timeout` (ms; the spec's default 10 s), bounded.
pub fn timeout_of(ms: Option<u64>) -> Duration {
    ms.map_or(Duration::from_secs(10), Duration::from_millis).min(MAX_TIMEOUT)
}

/// `/keys/query` of `asker` (`None`: another server asks): our users' keys
/// from here, the others' from their servers within `timeout`.
pub async fn query(
    state: &AppState,
    asker: &UserId,
    wanted: &BTreeMap<OwnedUserId, Vec<String>>,
    timeout: Duration,
) -> Result<Keys> {
    let ours = &state.settings.server_name;
    let (local, remote): (BTreeMap<_, _>, BTreeMap<_, _>) =
        wanted.iter().map(|(u, d)| (u.clone(), d.clone())).partition(|(u, _)| u.server_name() == ours);
    let mut answer = query_local(state, &local, Some(asker)).await?;
    if remote.is_empty() || state.settings.federation.is_none() {
        return Ok(answer);
    }
    let rest = from_device_lists(state, asker, remote, timeout, &mut answer).await?;
    if !rest.is_empty() {
        crate::federation::user_keys::query(state, &rest, timeout, &mut answer).await;
    }
    Ok(answer)
}

/// Answers what it can of `remote` (other servers' users -> devices wanted)
/// from the device lists held here: for the users who share a room with
/// `asker` (the only ones whose servers keep us told), a list held and
/// current is used as it is, one stale or not held is asked of its server
/// and kept (the first [`MAX_RESYNCS`]). Answers the users left to ask
/// about without keeping their lists.
async fn from_device_lists(
    state: &AppState,
    asker: &UserId,
    remote: BTreeMap<OwnedUserId, Vec<String>>,
    timeout: Duration,
    answer: &mut Keys,
) -> Result<BTreeMap<OwnedUserId, Vec<String>>> {
    let peers: HashSet<String> = events::room_peers(&state.db, asker.as_str()).await?.into_iter().collect();
    let mut rest = BTreeMap::new();
    let mut resyncs = tokio::task::JoinSet::new();
    for (user, wanted) in remote {
        if !peers.contains(user.as_str()) {
            rest.insert(user, wanted);
            continue;
        }
        match remote_devices::get(&state.db, user.as_str()).await? {
            Some(list) if list.stale == 0 => add_held(answer, &user, &wanted, &list),
            _ if resyncs.len() < MAX_RESYNCS => {
                let state = state.clone();
                resyncs.spawn(async move {
                    let resynced = resync(&state, &user, timeout).await;
                    (user, wanted, resynced)
                });
            }
            _ => {
                rest.insert(user, wanted);
            }
        }
    }
    while let Some(Ok((user, wanted, resynced))) = resyncs.join_next().await {
        match resynced {
            Ok(list) => add_held(answer, &user, &wanted, &list),
            Err(why) => {
                let failure = json!({ "errcode": "M_UNAVAILABLE", "error": why });
                answer.failures.insert(user.server_name().to_string(), failure);
            }
        }
    }
    Ok(rest)
}

/// Asks `user`'s server for their device list and keeps it (unless an
/// update came meanwhile: then it stays stale and is asked for again next
/// time); answers the list or why there is none.
async fn resync(
    state: &AppState,
    user: &UserId,
    timeout: Duration,
) -> std::result::Result<DeviceList, String> {
    let mark = remote_devices::begin_resync(&state.db, user.as_str()).await.map_err(|e| e.to_string())?;
    let list = crate::federation::user_keys::device_list(state, user, timeout).await?;
    remote_devices::finish_resync(&state.db, user.as_str(), mark, &list).await.map_err(|e| e.to_string())?;
    Ok(list)
}

/// Adds to `answer` the keys of `user` in a device list held here: of the
/// devices `wanted` (none: all) that have keys, each with its name.
fn add_held(answer: &mut Keys, user: &UserId, wanted: &[String], list: &DeviceList) {
    let mut per_device = Map::new();
    for (device, entry) in &list.devices {
        if !wanted.is_empty() && !wanted.contains(device) {
            continue;
        }
        let Some(mut keys) = entry.get("keys").filter(|k| k.is_object()).cloned() else { continue };
        if let Some(name) = entry.get("device_display_name") {
            keys["unsigned"] = json!({ "device_display_name": name });
        }
        per_device.insert(device.clone(), keys);
    }
    answer.device_keys.insert(user.to_string(), Value::Object(per_device));
    if let Some(master) = &list.master_key {
        answer.master_keys.insert(user.to_string(), master.clone());
    }
    if let Some(self_signing) = &list.self_signing_key {
        answer.self_signing_keys.insert(user.to_string(), self_signing.clone());
    }
}

/// Another server says (`m.device_list_update`, `content`) that a device of
/// its `user` changed at its device-list position `stream_id`, after
/// `prev_id`. A list held here follows when the update follows on from it
/// (every `prev_id` at or below the position held, and the position not
/// behind it); an update from before it is old news; anything else marks
/// the list stale (asked for again on the next query: a missed update is
/// healed by the server's whole list).
pub async fn remote_device_update(state: &AppState, user: &UserId, content: &Value) -> Result<()> {
    let db = &state.db;
    let Some(list) = remote_devices::get(db, user.as_str()).await? else { return Ok(()) };
    let stale = || remote_devices::mark_stale(db, user.as_str());
    let (Some(stream), Some(device)) = (content["stream_id"].as_i64(), content["device_id"].as_str()) else {
        stale().await?;
        return Err(Error::BadJson("A device-list update needs stream_id and device_id".into()));
    };
    let prevs: Option<Vec<i64>> = match &content["prev_id"] {
        Value::Null => Some(Vec::new()),
        Value::Array(ids) => ids.iter().map(Value::as_i64).collect(),
        _ => None,
    };
    if list.stale != 0 {
        return stale().await;
    }
    if stream < list.stream_id {
        return Ok(());
    }
    let follows = prevs.is_some_and(|p| p.iter().all(|&id| id <= list.stream_id && id < stream));
    if !follows {
        return stale().await;
    }
    let mut devices = list.devices.clone();
    if content["deleted"] == true {
        devices.remove(device);
    } else {
        let mut entry = json!({});
        if let Some(keys) = content.get("keys").filter(|k| k.is_object()) {
            if keys["user_id"] != user.as_str() || keys["device_id"] != device {
                return stale().await;
            }
            entry["keys"] = keys.clone();
        }
        if let Some(name) = content["device_display_name"].as_str() {
            entry["device_display_name"] = json!(name);
        }
        devices.insert(device.to_owned(), entry);
    }
    if devices.len() > remote_devices::MAX_DEVICES {
        return remote_devices::forget(db, user.as_str()).await;
    }
    if !remote_devices::advance(db, user.as_str(), list.stream_id, stream, &devices).await? {
        stale().await?;
    }
    Ok(())
}

/// Another server says (`m.signing_key_update`, `content`) its `user`'s
/// cross-signing keys changed: the list held here takes those given that
/// are `user`'s.
pub async fn remote_signing_update(state: &AppState, user: &UserId, content: &Value) -> Result<()> {
    let own = |field: &str| content.get(field).filter(|k| k["user_id"] == user.as_str());
    remote_devices::set_cross_signing(&state.db, user.as_str(), own("master_key"), own("self_signing_key"))
        .await
}

/// Our users' keys among `wanted` (user -> devices, none: all), as
/// `asker` sees them (their own user-signing key, the signatures they may
/// see); `None` for another server (the owners' signatures only).
pub async fn query_local(
    state: &AppState,
    wanted: &BTreeMap<OwnedUserId, Vec<String>>,
    asker: Option<&UserId>,
) -> Result<Keys> {
    let mut out = Keys::default();
    for (user, devices_wanted) in wanted {
        if user.server_name() != state.settings.server_name {
            continue;
        }
        let owner = user.as_str();
        let viewer = asker.map_or(owner, |a| a.as_str());
        let signatures = keys::key_signatures(&state.db, owner).await?;
        let mut per_device = Map::new();
        for (device, text) in keys::device_keys(&state.db, owner).await? {
            if !devices_wanted.is_empty() && !devices_wanted.contains(&device) {
                continue;
            }
            let mut value: Value = serde_json::from_str(&text).unwrap_or_default();
            account_keys::add_signatures(&mut value, owner, &device, &signatures, viewer);
            if let Some(name) = devices::get(&state.db, owner, &device).await?.and_then(|d| d.display_name) {
                value["unsigned"] = json!({ "device_display_name": name });
            }
            per_device.insert(device, value);
        }
        out.device_keys.insert(owner.to_owned(), Value::Object(per_device));
        for (kind, map) in [("master", &mut out.master_keys), ("self_signing", &mut out.self_signing_keys)] {
            if let Some(text) = keys::cross_signing_key(&state.db, owner, kind).await? {
                let mut value: Value = serde_json::from_str(&text).unwrap_or_default();
                if let Some(public) = account_keys::cross_signing_public_key(&value) {
                    account_keys::add_signatures(&mut value, owner, &public, &signatures, viewer);
                }
                map.insert(owner.to_owned(), value);
            }
        }
        if asker == Some(&**user)
            && let Some(text) = keys::cross_signing_key(&state.db, owner, "user_signing").await?
        {
            out.user_signing_keys.insert(owner.to_owned(), serde_json::from_str(&text).unwrap_or_default());
        }
    }
    Ok(out)
}

/// `/keys/claim`: a one-time key (else the fallback key) of each device
/// wanted (user -> device -> algorithm); ours from here, the others' from
/// their servers within `timeout`. Answers the keys and the failures.
pub async fn claim(
    state: &AppState,
    wanted: &BTreeMap<OwnedUserId, BTreeMap<String, String>>,
    timeout: Duration,
) -> Result<(Map<String, Value>, Map<String, Value>)> {
    let ours = &state.settings.server_name;
    let (local, remote): (BTreeMap<_, _>, BTreeMap<_, _>) =
        wanted.iter().map(|(u, d)| (u.clone(), d.clone())).partition(|(u, _)| u.server_name() == ours);
    let mut keys = claim_local(state, &local).await?;
    let mut failures = Map::new();
    if !remote.is_empty() {
        crate::federation::user_keys::claim(state, &remote, timeout, &mut keys, &mut failures).await;
    }
    Ok((keys, failures))
}

/// Claims a one-time key (else the fallback key) of each of our users'
/// devices among `wanted` (the first [`MAX_CLAIMED_DEVICES`]): user ->
/// device -> key id -> key.
pub async fn claim_local(
    state: &AppState,
    wanted: &BTreeMap<OwnedUserId, BTreeMap<String, String>>,
) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    let mut budget = MAX_CLAIMED_DEVICES;
    for (user, devices_wanted) in wanted {
        if user.server_name() != state.settings.server_name {
            continue;
        }
        let mut per_device = Map::new();
        for (device, algorithm) in devices_wanted {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let (u, d, a) = (user.as_str(), device.as_str(), algorithm.as_str());
            // The owner's key counts move: a position says so to their syncs.
            let reservation = state.streams.reserve();
            let key = match keys::claim_one_time_key(&state.db, u, d, a).await? {
                Some(k) => Some(k),
                None => keys::use_fallback_key(&state.db, u, d, a).await?,
            };
            reservation.finish(Change::Keys { user: u.to_owned() });
            if let Some((key_id, text)) = key {
                per_device.insert(
                    d.to_owned(),
                    json!({ key_id: serde_json::from_str::<Value>(&text).unwrap_or_default() }),
                );
            }
        }
        if !per_device.is_empty() {
            out.insert(user.to_string(), Value::Object(per_device));
        }
    }
    Ok(out)
}

/// `/user/devices/{userId}` for our `user`: the device-list position, each
/// device with keys, with them (the owner's signatures) and its name, and
/// the master and self-signing keys.
pub async fn devices_of(state: &AppState, user: &UserId) -> Result<Value> {
    let owner = user.as_str();
    let stream = keys::last_device_list_change(&state.db, owner).await?.unwrap_or(0);
    let all = BTreeMap::from([(user.to_owned(), Vec::new())]);
    let found = query_local(state, &all, None).await?;
    let keyed = found.device_keys.get(owner).and_then(Value::as_object).cloned().unwrap_or_default();
    let mut list = Vec::new();
    for row in devices::list(&state.db, owner).await? {
        // A device that uploaded no keys has none to give.
        let Some(keys) = keyed.get(&row.device_id) else { continue };
        let mut keys = keys.clone();
        if let Some(map) = keys.as_object_mut() {
            map.remove("unsigned");
        }
        let mut device = json!({ "device_id": row.device_id, "keys": keys });
        if let Some(name) = row.display_name {
            device["device_display_name"] = json!(name);
        }
        list.push(device);
    }
    let mut answer = json!({ "user_id": user, "stream_id": stream, "devices": list });
    if let Some(master) = found.master_keys.get(owner) {
        answer["master_key"] = master.clone();
    }
    if let Some(self_signing) = found.self_signing_keys.get(owner) {
        answer["self_signing_key"] = self_signing.clone();
    }
    Ok(answer)
}
