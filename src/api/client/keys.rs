//! End-to-end encryption plumbing (server side only; clients do the crypto):
//! key upload, query and claim, key changes, cross-signing keys and
//! signatures, and to-device messages.

use std::collections::BTreeMap;

use axum::Router;
use ruma::OwnedUserId;
use ruma::api::client::keys::{
    claim_keys, get_key_changes, get_keys, upload_keys, upload_signatures, upload_signing_keys,
};
use ruma::api::client::to_device::send_event_to_device;
use ruma::to_device::DeviceIdOrAllDevices;
use serde_json::{Map, Value, json};

use crate::account::{e2ee, uia};
use crate::api::extract::{Ruma, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{devices, events, keys};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route_json(router, upload);
    let router = route_json(router, query);
    let router = route_json(router, claim);
    let router = route_json(router, changes);
    let router = route_json(router, upload_signing);
    let router = route_json(router, upload_sigs);
    route_json(router, send_to_device)
}

fn raw_value<T>(raw: &ruma::serde::Raw<T>) -> Result<Value> {
    serde_json::from_str(raw.json().get()).map_err(|e| Error::BadJson(e.to_string()))
}

async fn upload(state: AppState, req: Ruma<upload_keys::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let (user, device) = (me.user_id.as_str(), me.device_id.as_str());
    if let Some(raw) = &b.device_keys {
        let value = raw_value(raw)?;
        if value["user_id"] != user || value["device_id"] != device {
            return Err(Error::InvalidParam("device_keys must be for this user and device".into()));
        }
        let text = serde_json::to_string(&value).map_err(|e| Error::Internal(e.to_string()))?;
        let changed =
            keys::device_keys(&state.db, user).await?.iter().all(|(d, k)| d != device || *k != text);
        keys::put_device_keys(&state.db, user, device, &text).await?;
        if changed {
            e2ee::device_list_changed(&state, &me.user_id).await?;
        }
    }
    for (key_id, raw) in &b.one_time_keys {
        let text = raw.json().get();
        keys::add_one_time_key(&state.db, user, device, key_id.as_str(), key_id.algorithm().as_str(), text)
            .await?;
    }
    for (key_id, raw) in &b.fallback_keys {
        keys::put_fallback_key(
            &state.db,
            user,
            device,
            key_id.algorithm().as_str(),
            key_id.as_str(),
            raw.json().get(),
        )
        .await?;
    }
    Ok(json!({ "one_time_key_counts": e2ee::otk_counts(&state, user, device).await? }))
}

async fn query(state: AppState, req: Ruma<get_keys::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let mut device_keys = Map::new();
    let mut master = Map::new();
    let mut self_signing = Map::new();
    let mut user_signing = Map::new();
    for (user, wanted) in &req.body.device_keys {
        if user.server_name() != state.settings.server_name {
            continue;
        }
        let mut per_device = Map::new();
        for (device, text) in keys::device_keys(&state.db, user.as_str()).await? {
            if !wanted.is_empty() && !wanted.iter().any(|d| d.as_str() == device) {
                continue;
            }
            let mut value: Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(row) = devices::get(&state.db, user.as_str(), &device).await?
                && let Some(name) = row.display_name
            {
                value["unsigned"] = json!({ "device_display_name": name });
            }
            per_device.insert(device, value);
        }
        device_keys.insert(user.to_string(), Value::Object(per_device));
        for (kind, map) in [("master", &mut master), ("self_signing", &mut self_signing)] {
            if let Some(text) = keys::cross_signing_key(&state.db, user.as_str(), kind).await? {
                map.insert(user.to_string(), serde_json::from_str(&text).unwrap_or_default());
            }
        }
        if *user == me.user_id
            && let Some(text) = keys::cross_signing_key(&state.db, user.as_str(), "user_signing").await?
        {
            user_signing.insert(user.to_string(), serde_json::from_str(&text).unwrap_or_default());
        }
    }
    Ok(json!({
        "device_keys": device_keys,
        "master_keys": master,
        "self_signing_keys": self_signing,
        "user_signing_keys": user_signing,
        "failures": {},
    }))
}

async fn claim(state: AppState, req: Ruma<claim_keys::v3::Request>) -> Result<Value> {
    req.requester()?;
    let mut out = Map::new();
    for (user, devices) in &req.body.one_time_keys {
        let mut per_device = Map::new();
        for (device, algorithm) in devices {
            let (u, d, a) = (user.as_str(), device.as_str(), algorithm.as_str());
            let key = match keys::claim_one_time_key(&state.db, u, d, a).await? {
                Some(k) => Some(k),
                None => keys::use_fallback_key(&state.db, u, d, a).await?,
            };
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
    Ok(json!({ "one_time_keys": out, "failures": {} }))
}

async fn changes(state: AppState, req: Ruma<get_key_changes::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let parse = |t: &str| crate::sync::Token::parse(t).map(|t| t.stream);
    let (from, to) = (parse(&req.body.from)?, parse(&req.body.to)?);
    let changed = crate::sync::device_list_changes(&state, &me.user_id, from, to).await?;
    Ok(json!({ "changed": changed, "left": [] }))
}

async fn upload_signing(state: AppState, req: Ruma<upload_signing_keys::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    // The first upload needs no UIA (there is nothing to take over yet);
    // replacing existing keys does.
    let existing = keys::cross_signing_key(&state.db, me.user_id.as_str(), "master").await?;
    let grant = if existing.is_some() {
        Some(
            uia::authorize(
                &state,
                uia::Purpose::DeleteDevices,
                Some(me),
                &[&[uia::PASSWORD]],
                b.auth.as_ref(),
            )
            .await?,
        )
    } else {
        None
    };
    for (kind, raw) in [
        ("master", &b.master_key),
        ("self_signing", &b.self_signing_key),
        ("user_signing", &b.user_signing_key),
    ] {
        if let Some(raw) = raw {
            let value = raw_value(raw)?;
            if value["user_id"] != me.user_id.as_str() {
                return Err(Error::InvalidParam("Cross-signing keys must be for this user".into()));
            }
            keys::put_cross_signing_key(&state.db, me.user_id.as_str(), kind, &value.to_string()).await?;
        }
    }
    if let Some(grant) = grant {
        grant.finish(&state).await?;
    }
    e2ee::device_list_changed(&state, &me.user_id).await?;
    Ok(json!({}))
}

/// Merges `signatures` of `incoming` into `stored` JSON.
fn merge_signatures(stored: &mut Value, incoming: &Value) {
    if let Some(sigs) = incoming["signatures"].as_object() {
        for (signer, keys) in sigs {
            if let Some(keys) = keys.as_object() {
                for (key_id, sig) in keys {
                    stored["signatures"][signer][key_id] = sig.clone();
                }
            }
        }
    }
}

async fn upload_sigs(state: AppState, req: Ruma<upload_signatures::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let mut touched: Vec<OwnedUserId> = Vec::new();
    for (user, signed) in &req.body.signed_keys {
        for (key_id, raw) in signed.iter() {
            let incoming: Value =
                serde_json::from_str(raw.get()).map_err(|e| Error::BadJson(e.to_string()))?;
            // A device of the user, or one of their cross-signing keys by public key.
            if let Some((_, text)) =
                keys::device_keys(&state.db, user.as_str()).await?.into_iter().find(|(d, _)| d == key_id)
            {
                let mut stored: Value = serde_json::from_str(&text).unwrap_or_default();
                merge_signatures(&mut stored, &incoming);
                keys::put_device_keys(&state.db, user.as_str(), key_id, &stored.to_string()).await?;
            } else {
                for kind in ["master", "self_signing", "user_signing"] {
                    if let Some(text) = keys::cross_signing_key(&state.db, user.as_str(), kind).await? {
                        let mut stored: Value = serde_json::from_str(&text).unwrap_or_default();
                        let matches =
                            stored["keys"].as_object().is_some_and(|k| k.values().any(|v| v == key_id));
                        if matches {
                            merge_signatures(&mut stored, &incoming);
                            keys::put_cross_signing_key(&state.db, user.as_str(), kind, &stored.to_string())
                                .await?;
                        }
                    }
                }
            }
        }
        touched.push(user.clone());
    }
    let _ = me;
    for user in touched {
        e2ee::device_list_changed(&state, &user).await?;
    }
    Ok(json!({ "failures": {} }))
}

async fn send_to_device(state: AppState, req: Ruma<send_event_to_device::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let scope = format!("sendToDevice/{}", b.event_type);
    let txn = events::Txn {
        user_id: me.user_id.as_str(),
        device_id: me.device_id.as_str(),
        scope: &scope,
        txn_id: b.txn_id.as_str(),
    };
    {
        let mut conn = state.db.pool.acquire().await?;
        if events::txn_event(&mut conn, txn).await?.is_some() {
            return Ok(json!({}));
        }
    }
    let mut recipients: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (user, per_device) in &b.messages {
        if user.server_name() != state.settings.server_name {
            continue;
        }
        for (target, raw) in per_device {
            let devices: Vec<String> = match target {
                DeviceIdOrAllDevices::DeviceId(d) => vec![d.to_string()],
                DeviceIdOrAllDevices::AllDevices => {
                    devices::list(&state.db, user.as_str()).await?.into_iter().map(|d| d.device_id).collect()
                }
            };
            for device in devices {
                recipients.entry(user.to_string()).or_default().push((device, raw.json().get().to_owned()));
            }
        }
    }
    let reservation = state.streams.reserve();
    for (user, list) in &recipients {
        for (device, content) in list {
            keys::put_to_device(
                &state.db,
                user,
                device,
                reservation.pos,
                me.user_id.as_str(),
                &b.event_type.to_string(),
                content,
            )
            .await?;
        }
    }
    let mut conn = state.db.pool.acquire().await?;
    events::claim_txn(&mut conn, txn, "", crate::storage::now_ms()).await?;
    drop(conn);
    drop(reservation);
    state.notifier.wake(recipients.keys().map(String::as_str));
    Ok(json!({}))
}
