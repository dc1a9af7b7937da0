//! Typing, receipts, read markers, account data and tags: what a client shows
//! beside the timeline, delivered through /sync.

use std::time::Duration;

use axum::Router;
use ruma::api::client::config::{
    get_global_account_data, get_room_account_data, set_global_account_data, set_room_account_data,
};
use ruma::api::client::read_marker::set_read_marker;
use ruma::api::client::receipt::create_receipt::{self, v3::ReceiptType};
use ruma::api::client::tag::{create_tag, delete_tag, get_tags};
use ruma::api::client::typing::create_typing_event::{self, v3::Typing};
use ruma::{RoomId, UserId};
use serde_json::{Value, json};

use crate::account::Requester;
use crate::api::extract::{Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::account_data;
use crate::sync::writes;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, typing);
    let router = route(router, receipt);
    let router = route(router, read_markers);
    let router = route(router, put_global);
    let router = route_json(router, get_global);
    let router = route(router, put_room);
    let router = route_json(router, get_room);
    let router = route_json(router, tags);
    let router = route(router, put_tag);
    route(router, remove_tag)
}

fn own(me: &Requester, user: &UserId) -> Result<()> {
    if me.user_id != user {
        return Err(Error::Forbidden("You can only do this for yourself".into()));
    }
    Ok(())
}

fn raw_object<T>(raw: &ruma::serde::Raw<T>) -> Result<Value> {
    let value: Value = serde_json::from_str(raw.json().get()).map_err(|e| Error::BadJson(e.to_string()))?;
    if !value.is_object() {
        return Err(Error::BadJson("The content must be a JSON object".into()));
    }
    Ok(value)
}

async fn typing(
    state: AppState,
    req: Ruma<create_typing_event::v3::Request>,
) -> Result<create_typing_event::v3::Response> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    let timeout = match &req.body.state {
        Typing::Yes(info) => Some(info.timeout.min(Duration::from_secs(120))),
        _ => None,
    };
    writes::set_typing(&state, &me.user_id, &req.body.room_id, timeout).await?;
    Ok(create_typing_event::v3::Response::new())
}

async fn receipt(
    state: AppState,
    req: Ruma<create_receipt::v3::Request>,
) -> Result<create_receipt::v3::Response> {
    let me = req.requester()?;
    let b = &req.body;
    let thread = b.thread.as_str().map(str::to_owned);
    match &b.receipt_type {
        ReceiptType::FullyRead => fully_read(&state, &me.user_id, &b.room_id, b.event_id.as_str()).await?,
        kind => {
            let kind = kind.to_string();
            writes::set_receipt(
                &state,
                &me.user_id,
                &b.room_id,
                &kind,
                thread.as_deref(),
                b.event_id.as_str(),
            )
            .await?;
        }
    }
    Ok(create_receipt::v3::Response::new())
}

async fn fully_read(state: &AppState, user: &UserId, room_id: &RoomId, event_id: &str) -> Result<()> {
    writes::set_account_data(state, user, Some(room_id), "m.fully_read", &json!({ "event_id": event_id }))
        .await
}

async fn read_markers(
    state: AppState,
    req: Ruma<set_read_marker::v3::Request>,
) -> Result<set_read_marker::v3::Response> {
    let me = req.requester()?;
    let b = &req.body;
    if let Some(id) = &b.fully_read {
        fully_read(&state, &me.user_id, &b.room_id, id.as_str()).await?;
    }
    if let Some(id) = &b.read_receipt {
        writes::set_receipt(&state, &me.user_id, &b.room_id, "m.read", None, id.as_str()).await?;
    }
    if let Some(id) = &b.private_read_receipt {
        writes::set_receipt(&state, &me.user_id, &b.room_id, "m.read.private", None, id.as_str()).await?;
    }
    Ok(set_read_marker::v3::Response::new())
}

/// Account data the server keeps itself: written through its own APIs
/// (push rules, read markers), never through the account-data API.
fn client_writable(kind: &str) -> Result<()> {
    if matches!(kind, "m.push_rules" | "m.fully_read") {
        return Err(Error::ServerControlled(format!(
            "{kind} is controlled by the server; use its own API to change it"
        )));
    }
    Ok(())
}

async fn put_global(
    state: AppState,
    req: Ruma<set_global_account_data::v3::Request>,
) -> Result<set_global_account_data::v3::Response> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    client_writable(&req.body.event_type.to_string())?;
    let content = raw_object(&req.body.data)?;
    writes::set_account_data(&state, &me.user_id, None, &req.body.event_type.to_string(), &content).await?;
    Ok(set_global_account_data::v3::Response::new())
}

async fn stored(state: &AppState, user: &UserId, room: &str, kind: &str) -> Result<Value> {
    let text = account_data::get(&state.db, user.as_str(), room, kind)
        .await?
        .ok_or_else(|| Error::NotFound("No account data of that type".into()))?;
    serde_json::from_str(&text).map_err(|e| Error::Internal(e.to_string()))
}

async fn get_global(state: AppState, req: Ruma<get_global_account_data::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    stored(&state, &me.user_id, "", &req.body.event_type.to_string()).await
}

async fn put_room(
    state: AppState,
    req: Ruma<set_room_account_data::v3::Request>,
) -> Result<set_room_account_data::v3::Response> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    client_writable(&req.body.event_type.to_string())?;
    let content = raw_object(&req.body.data)?;
    writes::set_account_data(
        &state,
        &me.user_id,
        Some(&req.body.room_id),
        &req.body.event_type.to_string(),
        &content,
    )
    .await?;
    Ok(set_room_account_data::v3::Response::new())
}

async fn get_room(state: AppState, req: Ruma<get_room_account_data::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    stored(&state, &me.user_id, req.body.room_id.as_str(), &req.body.event_type.to_string()).await
}

async fn current_tags(state: &AppState, user: &UserId, room_id: &RoomId) -> Result<Value> {
    Ok(match account_data::get(&state.db, user.as_str(), room_id.as_str(), "m.tag").await? {
        Some(text) => serde_json::from_str::<Value>(&text).unwrap_or_default()["tags"].clone(),
        None => json!({}),
    })
}

async fn tags(state: AppState, req: Ruma<get_tags::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    let tags = current_tags(&state, &me.user_id, &req.body.room_id).await?;
    Ok(json!({ "tags": if tags.is_object() { tags } else { json!({}) } }))
}

async fn put_tag(state: AppState, req: Ruma<create_tag::v3::Request>) -> Result<create_tag::v3::Response> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    let mut tags = current_tags(&state, &me.user_id, &req.body.room_id).await?;
    if !tags.is_object() {
        tags = json!({});
    }
    tags[&req.body.tag] =
        serde_json::to_value(&req.body.tag_info).map_err(|e| Error::Internal(e.to_string()))?;
    writes::set_account_data(&state, &me.user_id, Some(&req.body.room_id), "m.tag", &json!({ "tags": tags }))
        .await?;
    Ok(create_tag::v3::Response::new())
}

async fn remove_tag(state: AppState, req: Ruma<delete_tag::v3::Request>) -> Result<delete_tag::v3::Response> {
    let me = req.requester()?;
    own(me, &req.body.user_id)?;
    let mut tags = current_tags(&state, &me.user_id, &req.body.room_id).await?;
    if let Some(map) = tags.as_object_mut() {
        map.remove(&req.body.tag);
    } else {
        tags = json!({});
    }
    writes::set_account_data(&state, &me.user_id, Some(&req.body.room_id), "m.tag", &json!({ "tags": tags }))
        .await?;
    Ok(delete_tag::v3::Response::new())
}
