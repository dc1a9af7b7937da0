//! Push rules (the spec's default rule set, per user, editable) and pushers;
//! plus the small endpoints clients call at start-up and read as "none yet":
//! key backup, TURN servers, third-party protocols.
//!
//! A user's rules are stored as the global account data `m.push_rules` (the
//! spec delivers them that way in /sync), starting from the server defaults.

use axum::Router;
use ruma::UserId;
use ruma::api::client::backup::get_latest_backup_info;
use ruma::api::client::push::set_pusher::v3::PusherAction;
use ruma::api::client::push::{
    delete_pushrule, get_pushers, get_pushrule, get_pushrule_actions, get_pushrule_enabled,
    get_pushrules_all, get_pushrules_global_scope, set_pusher, set_pushrule, set_pushrule_actions,
    set_pushrule_enabled,
};
use ruma::api::client::thirdparty::get_protocols;
use ruma::api::client::voip::get_turn_server_info;
use ruma::push::{InsertPushRuleError, RemovePushRuleError, Ruleset};
use serde_json::{Value, json};

use crate::api::extract::{Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::account_data;
use crate::sync::writes;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route_json(router, all_rules);
    let router = route_json(router, global_rules);
    let router = route_json(router, one_rule);
    let router = route(router, put_rule);
    let router = route(router, delete_rule);
    let router = route_json(router, rule_enabled);
    let router = route(router, set_enabled);
    let router = route_json(router, rule_actions);
    let router = route(router, set_actions);
    let router = route_json(router, pushers);
    let router = route(router, set_pushers);
    let router = route_json(router, key_backup);
    let router = route_json(router, turn_server);
    route_json(router, protocols)
        // Clients also ask without the trailing slash.
        .route("/_matrix/client/v3/pushrules", axum::routing::get(all_rules_plain))
        .route("/_matrix/client/r0/pushrules", axum::routing::get(all_rules_plain))
}

/// A user's rule set: what they stored, or the server defaults.
pub async fn ruleset(state: &AppState, user: &UserId) -> Result<Ruleset> {
    match account_data::get(&state.db, user.as_str(), "", "m.push_rules").await? {
        Some(text) => {
            let value: Value = serde_json::from_str(&text).map_err(|e| Error::Internal(e.to_string()))?;
            serde_json::from_value(value["global"].clone())
                .map_err(|e| Error::Internal(format!("stored push rules: {e}")))
        }
        None => Ok(Ruleset::server_default(user)),
    }
}

async fn save(state: &AppState, user: &UserId, rules: &Ruleset) -> Result<()> {
    let content = json!({ "global": rules });
    writes::set_account_data(state, user, None, "m.push_rules", &content).await
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::Internal(e.to_string()))
}

/// A rule set as clients read it: every kind present, empty ones as `[]`.
fn ruleset_value(rules: &Ruleset) -> Result<Value> {
    let mut value = to_value(rules)?;
    if let Some(map) = value.as_object_mut() {
        for kind in ["override", "content", "room", "sender", "underride"] {
            map.entry(kind).or_insert_with(|| json!([]));
        }
    }
    Ok(value)
}

async fn all_rules(state: AppState, req: Ruma<get_pushrules_all::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    Ok(json!({ "global": ruleset_value(&ruleset(&state, &me.user_id).await?)? }))
}

async fn all_rules_plain(
    axum::extract::State(state): axum::extract::State<AppState>,
    crate::api::extract::Authed(me): crate::api::extract::Authed,
) -> Result<axum::Json<Value>> {
    Ok(axum::Json(json!({ "global": ruleset_value(&ruleset(&state, &me.user_id).await?)? })))
}

async fn global_rules(state: AppState, req: Ruma<get_pushrules_global_scope::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    ruleset_value(&ruleset(&state, &me.user_id).await?)
}

fn not_found() -> Error {
    Error::NotFound("No such push rule".into())
}

async fn one_rule(state: AppState, req: Ruma<get_pushrule::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let rules = ruleset(&state, &me.user_id).await?;
    let rule = rules.get(req.body.kind.clone(), &req.body.rule_id).ok_or_else(not_found)?;
    to_value(&ruma::api::client::push::PushRule::from(rule.to_owned()))
}

async fn put_rule(
    state: AppState,
    req: Ruma<set_pushrule::v3::Request>,
) -> Result<set_pushrule::v3::Response> {
    let me = req.requester()?;
    let b = &req.body;
    let mut rules = ruleset(&state, &me.user_id).await?;
    rules.insert(b.rule.clone(), b.after.as_deref(), b.before.as_deref()).map_err(|e| match e {
        InsertPushRuleError::UnknownRuleId => Error::NotFound("The before/after rule does not exist".into()),
        other => Error::InvalidParam(format!("Invalid push rule: {other}")),
    })?;
    save(&state, &me.user_id, &rules).await?;
    Ok(set_pushrule::v3::Response::new())
}

async fn delete_rule(
    state: AppState,
    req: Ruma<delete_pushrule::v3::Request>,
) -> Result<delete_pushrule::v3::Response> {
    let me = req.requester()?;
    let mut rules = ruleset(&state, &me.user_id).await?;
    rules.remove(req.body.kind.clone(), &req.body.rule_id).map_err(|e| match e {
        RemovePushRuleError::NotFound => not_found(),
        other => Error::InvalidParam(format!("Cannot delete this rule: {other}")),
    })?;
    save(&state, &me.user_id, &rules).await?;
    Ok(delete_pushrule::v3::Response::new())
}

async fn rule_enabled(state: AppState, req: Ruma<get_pushrule_enabled::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let rules = ruleset(&state, &me.user_id).await?;
    let rule = rules.get(req.body.kind.clone(), &req.body.rule_id).ok_or_else(not_found)?;
    Ok(json!({ "enabled": rule.enabled() }))
}

async fn set_enabled(
    state: AppState,
    req: Ruma<set_pushrule_enabled::v3::Request>,
) -> Result<set_pushrule_enabled::v3::Response> {
    let me = req.requester()?;
    let mut rules = ruleset(&state, &me.user_id).await?;
    rules.set_enabled(req.body.kind.clone(), &req.body.rule_id, req.body.enabled).map_err(|_| not_found())?;
    save(&state, &me.user_id, &rules).await?;
    Ok(set_pushrule_enabled::v3::Response::new())
}

async fn rule_actions(state: AppState, req: Ruma<get_pushrule_actions::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let rules = ruleset(&state, &me.user_id).await?;
    let rule = rules.get(req.body.kind.clone(), &req.body.rule_id).ok_or_else(not_found)?;
    Ok(json!({ "actions": to_value(&rule.actions())? }))
}

async fn set_actions(
    state: AppState,
    req: Ruma<set_pushrule_actions::v3::Request>,
) -> Result<set_pushrule_actions::v3::Response> {
    let me = req.requester()?;
    let mut rules = ruleset(&state, &me.user_id).await?;
    rules
        .set_actions(req.body.kind.clone(), &req.body.rule_id, req.body.actions.clone())
        .map_err(|_| not_found())?;
    save(&state, &me.user_id, &rules).await?;
    Ok(set_pushrule_actions::v3::Response::new())
}

async fn pushers(state: AppState, req: Ruma<get_pushers::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let list: Vec<Value> = account_data::pushers(&state.db, me.user_id.as_str())
        .await?
        .iter()
        .filter_map(|p| serde_json::from_str(p).ok())
        .collect();
    Ok(json!({ "pushers": list }))
}

async fn set_pushers(
    state: AppState,
    req: Ruma<set_pusher::v3::Request>,
) -> Result<set_pusher::v3::Response> {
    let me = req.requester()?;
    match &req.body.action {
        PusherAction::Post(data) => {
            let ids = &data.pusher.ids;
            let text = serde_json::to_string(&data.pusher).map_err(|e| Error::Internal(e.to_string()))?;
            account_data::set_pusher(&state.db, me.user_id.as_str(), &ids.app_id, &ids.pushkey, Some(&text))
                .await?;
        }
        PusherAction::Delete(ids) => {
            account_data::set_pusher(&state.db, me.user_id.as_str(), &ids.app_id, &ids.pushkey, None).await?;
        }
        _ => return Err(Error::BadJson("Unknown pusher action".into())),
    }
    Ok(set_pusher::v3::Response::new())
}

/// No server-side key backup yet: exactly the 404 M_NOT_FOUND clients read as
/// "no backup exists".
async fn key_backup(_state: AppState, _req: Ruma<get_latest_backup_info::v3::Request>) -> Result<Value> {
    Err(Error::NotFound("No current backup version".into()))
}

/// No TURN server configured: an empty object.
async fn turn_server(_state: AppState, _req: Ruma<get_turn_server_info::v3::Request>) -> Result<Value> {
    Ok(json!({}))
}

/// No third-party protocols (bridges).
async fn protocols(_state: AppState, _req: Ruma<get_protocols::v3::Request>) -> Result<Value> {
    Ok(json!({}))
}
