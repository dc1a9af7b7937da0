//! Presence (`/presence/{userId}/status`) and the user directory.

use axum::Router;
use ruma::api::client::presence::{get_presence, set_presence};
use ruma::api::client::user_directory::search_users;
use serde_json::{Value, json};

use crate::api::extract::{Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{self, users};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, set);
    let router = route_json(router, get);
    route_json(router, search)
}

async fn set(state: AppState, req: Ruma<set_presence::v3::Request>) -> Result<set_presence::v3::Response> {
    let me = req.requester()?;
    if req.body.user_id != me.user_id {
        return Err(Error::Forbidden("You can only set your own presence".into()));
    }
    let value = req.body.presence.to_string();
    if !matches!(value.as_str(), "online" | "offline" | "unavailable") {
        return Err(Error::InvalidParam("presence must be online, offline or unavailable".into()));
    }
    crate::sync::presence::update(&state, &me.user_id, &value, req.body.status_msg.clone()).await?;
    Ok(set_presence::v3::Response::new())
}

async fn get(state: AppState, req: Ruma<get_presence::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let user = &req.body.user_id;
    if user.server_name() != state.settings.server_name
        || !users::localpart_exists(&state.db, user.localpart()).await?
    {
        return Err(Error::NotFound("Unknown user".into()));
    }
    // One's own, and that of those one shares a room with (as Synapse).
    if user != &me.user_id
        && !crate::sync::room_peers(&state, &me.user_id).await?.iter().any(|p| p == user.as_str())
    {
        return Err(Error::Forbidden("You do not share a room with this user".into()));
    }
    // With presence off nothing is ever stored: everyone reads as offline.
    Ok(match state.presence.get(user.as_str()) {
        Some(p) => {
            let mut body = json!({
                "presence": p.state,
                "last_active_ago": (storage::now_ms() - p.last_active_ts).max(0),
                "currently_active": p.state == "online",
            });
            if let Some(msg) = p.status_msg {
                body["status_msg"] = json!(msg);
            }
            body
        }
        None => json!({ "presence": "offline" }),
    })
}

/// Users who share a room with the searcher or are in a public room, whose id
/// or display name contains the term: one query, at most `limit` + 1 rows.
async fn search(state: AppState, req: Ruma<search_users::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let term = req.body.search_term.to_lowercase();
    let limit = usize::try_from(u64::from(req.body.limit)).unwrap_or(10).clamp(1, 100);
    let pattern = crate::room::directory::contains_pattern(&term);
    let fetch = i64::try_from(limit + 1).unwrap_or(101);
    let rows = users::directory_search(&state.db, me.user_id.as_str(), &pattern, fetch).await?;
    let decode = |v: Option<String>| {
        v.and_then(|v| serde_json::from_str::<Value>(&v).ok()).and_then(|v| v.as_str().map(str::to_owned))
    };
    let mut results = Vec::new();
    for (user, display_name, avatar_url) in rows {
        let display_name = decode(display_name);
        // The query matched the stored JSON text; the term must be in the name itself.
        let matches = user.to_lowercase().contains(&term)
            || display_name.as_ref().is_some_and(|d| d.to_lowercase().contains(&term));
        if !matches {
            continue;
        }
        let mut entry = json!({ "user_id": user });
        if let Some(d) = display_name {
            entry["display_name"] = json!(d);
        }
        if let Some(a) = decode(avatar_url) {
            entry["avatar_url"] = json!(a);
        }
        results.push(entry);
    }
    let limited = results.len() > limit;
    results.truncate(limit);
    Ok(json!({ "results": results, "limited": limited }))
}
