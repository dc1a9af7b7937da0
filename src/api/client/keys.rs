//! End-to-end encryption plumbing (server side only; clients do the crypto):
//! key upload, query and claim, key changes, cross-signing keys and
//! signatures, and to-device messages. What an upload must carry (its
//! signatures) is checked in `account::keys`.

use std::collections::BTreeMap;

use axum::Router;
use ruma::OwnedUserId;
use ruma::api::client::keys::{
    claim_keys, get_key_changes, get_keys, upload_keys, upload_signatures, upload_signing_keys,
};
use ruma::api::client::to_device::send_event_to_device;
use ruma::to_device::DeviceIdOrAllDevices;
use serde_json::{Map, Value, json};

use crate::account::{e2ee, key_query, keys as account_keys, to_device};
use crate::api::extract::{Ruma, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;

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
    let parse = |raw: &str| serde_json::from_str::<Value>(raw).map_err(|e| Error::BadJson(e.to_string()));
    let mut upload = account_keys::DeviceKeysUpload {
        device_keys: b.device_keys.as_ref().map(raw_value).transpose()?,
        ..Default::default()
    };
    for (key_id, raw) in &b.one_time_keys {
        let algorithm = key_id.algorithm().as_str().to_owned();
        upload.one_time_keys.push((key_id.to_string(), algorithm, parse(raw.json().get())?));
    }
    for (key_id, raw) in &b.fallback_keys {
        let algorithm = key_id.algorithm().as_str().to_owned();
        upload.fallback_keys.push((key_id.to_string(), algorithm, parse(raw.json().get())?));
    }
    account_keys::upload_device_keys(&state, me, upload).await?;
    let (user, device) = (me.user_id.as_str(), me.device_id.as_str());
    Ok(json!({ "one_time_key_counts": e2ee::otk_counts(&state, user, device).await? }))
}

async fn query(state: AppState, req: Ruma<get_keys::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let wanted: BTreeMap<OwnedUserId, Vec<String>> = req
        .body
        .device_keys
        .iter()
        .map(|(user, devices)| (user.clone(), devices.iter().map(|d| d.to_string()).collect()))
        .collect();
    let timeout =
        key_query::timeout_of(req.body.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
    Ok(key_query::query(&state, &me.user_id, &wanted, timeout).await?.to_json())
}

async fn claim(state: AppState, req: Ruma<claim_keys::v3::Request>) -> Result<Value> {
    req.requester()?;
    let wanted: BTreeMap<OwnedUserId, BTreeMap<String, String>> = req
        .body
        .one_time_keys
        .iter()
        .map(|(user, devices)| {
            (user.clone(), devices.iter().map(|(d, a)| (d.to_string(), a.to_string())).collect())
        })
        .collect();
    let timeout =
        key_query::timeout_of(req.body.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
    let (keys, failures) = key_query::claim(&state, &wanted, timeout).await?;
    Ok(json!({ "one_time_keys": keys, "failures": failures }))
}

async fn changes(state: AppState, req: Ruma<get_key_changes::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let parse = |t: &str| crate::sync::Token::parse(t).map(|t| t.stream);
    let (from, to) = (parse(&req.body.from)?, parse(&req.body.to)?);
    let (changed, left, _) = crate::sync::device_list_movement(&state, &me.user_id, from, to).await?;
    Ok(json!({ "changed": changed, "left": left }))
}

async fn upload_signing(state: AppState, req: Ruma<upload_signing_keys::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let upload = account_keys::CrossSigningUpload {
        master: b.master_key.as_ref().map(raw_value).transpose()?,
        self_signing: b.self_signing_key.as_ref().map(raw_value).transpose()?,
        user_signing: b.user_signing_key.as_ref().map(raw_value).transpose()?,
    };
    account_keys::upload_cross_signing_keys(&state, me, upload, b.auth.as_ref()).await?;
    Ok(json!({}))
}

async fn upload_sigs(state: AppState, req: Ruma<upload_signatures::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let mut signed = Vec::new();
    for (user, keys) in &req.body.signed_keys {
        let mut objects = Vec::new();
        for (key_id, raw) in keys.iter() {
            let object: Value = serde_json::from_str(raw.get()).map_err(|e| Error::BadJson(e.to_string()))?;
            if !object.is_object() {
                return Err(Error::BadJson(format!(
                    "The signed key {key_id} of {user} is not a JSON object"
                )));
            }
            objects.push((key_id.to_owned(), object));
        }
        signed.push((user.clone(), objects));
    }
    let mut failures = Map::new();
    for (user, key_id, error) in account_keys::upload_signatures(&state, me, signed).await? {
        let (_, errcode) = error.status_and_code();
        let per_user = failures.entry(user.to_string()).or_insert_with(|| json!({}));
        per_user[key_id] = json!({ "errcode": errcode, "error": error.to_string() });
    }
    Ok(json!({ "failures": failures }))
}

async fn send_to_device(state: AppState, req: Ruma<send_event_to_device::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let mut messages = Vec::new();
    for (user, per_device) in &b.messages {
        for (target, raw) in per_device {
            let target = match target {
                DeviceIdOrAllDevices::DeviceId(d) => to_device::Target::Device(d.to_string()),
                DeviceIdOrAllDevices::AllDevices => to_device::Target::All,
            };
            let content = raw.json().get().to_owned();
            messages.push(to_device::Message { user: user.clone(), target, content });
        }
    }
    let event_type = b.event_type.to_string();
    to_device::send_local(
        &state,
        &me.user_id,
        me.device_id.as_str(),
        &event_type,
        b.txn_id.as_str(),
        messages,
    )
    .await?;
    Ok(json!({}))
}
