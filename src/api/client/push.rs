//! Push rules (the spec's default rule set, per user, editable) and pushers;
//! plus the small endpoints clients call at start-up and read as "none yet":
//! key backup, TURN servers, third-party protocols.
//!
//! A user's rules are stored as the global account data `m.push_rules` (the
//! spec delivers them that way in /sync), starting from the server defaults.

use axum::Router;
use ruma::UserId;
use ruma::api::client::push::set_pusher::v3::PusherAction;
use ruma::api::client::push::{
    delete_pushrule, get_notifications, get_pushers, get_pushrule, get_pushrule_actions,
    get_pushrule_enabled, get_pushrules_all, get_pushrules_global_scope, set_pusher, set_pushrule,
    set_pushrule_actions, set_pushrule_enabled,
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
    let router = route_json(router, notifications);
    let router = route_json(router, pushers);
    let router = route(router, set_pushers);
    let router = route_json(router, turn_server);
    route_json(router, protocols)
        // Clients also ask without the trailing slash.
        .route("/_matrix/client/v3/pushrules", axum::routing::get(all_rules_plain))
        .route("/_matrix/client/r0/pushrules", axum::routing::get(all_rules_plain))
}

use crate::notify::ruleset;

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

/// `/notifications`: the notifying events of the user's joined rooms, newest
/// first (the most recent [`NOTIFICATION_WINDOW`] readable events of each room
/// are looked at), `read` when at or before their read receipt. `from` is the
/// `next_token` of a previous page; `only=highlight` keeps highlights.
async fn notifications(state: AppState, req: Ruma<get_notifications::v3::Request>) -> Result<Value> {
    const NOTIFICATION_WINDOW: usize = 200;
    let me = req.requester()?;
    let limit = req.body.limit.map_or(50, |l| usize::try_from(u64::from(l)).unwrap_or(50)).clamp(1, 200);
    let before_ts: Option<i64> = match &req.body.from {
        Some(token) => Some(token.parse().map_err(|_| Error::InvalidParam("Invalid from token".into()))?),
        None => None,
    };
    let only_highlight = req.body.only.as_deref() == Some("highlight");
    let mut found: Vec<(i64, Value)> = Vec::new();
    let rules = crate::notify::rules_of(&state, &me.user_id).await?;
    for room in crate::storage::events::rooms_with_membership(&state.db, me.user_id.as_str(), "join").await? {
        let room_id =
            ruma::OwnedRoomId::try_from(room.as_str()).map_err(|e| Error::Internal(e.to_string()))?;
        let view = crate::room::read::open(&state, &room_id).await?;
        let access = crate::room::read::access(&state, &view, &me.user_id).await?;
        let marks = crate::notify::read_marks(&state, &room, &me.user_id).await?;
        let events = crate::notify::evaluate_range(
            &state,
            &view,
            &access,
            me,
            &rules,
            0,
            view.room.last_seq,
            NOTIFICATION_WINDOW,
        )
        .await?;
        for (loaded, outcome) in events {
            if !outcome.notify || (only_highlight && !outcome.highlight) {
                continue;
            }
            let ts = i64::try_from(u64::from(loaded.pdu.origin_server_ts.0)).unwrap_or(0);
            if before_ts.is_some_and(|b| ts >= b) {
                continue;
            }
            let event = crate::room::read::format(&view, &loaded, me, &access.history);
            let mut actions = vec![json!("notify")];
            if outcome.highlight {
                actions.push(json!({ "set_tweak": "highlight" }));
            }
            found.push((
                ts,
                json!({ "room_id": room, "event": event, "read": marks.is_read(loaded.stored.seq, crate::room::relations::thread_of(&loaded).as_deref()), "ts": ts, "actions": actions }),
            ));
        }
    }
    found.sort_by_key(|n| std::cmp::Reverse(n.0));
    let more = found.len() > limit;
    found.truncate(limit);
    let mut body = json!({ "notifications": found.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>() });
    if more && let Some((ts, _)) = found.last() {
        body["next_token"] = json!(ts.to_string());
    }
    Ok(body)
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
        PusherAction::Post(data) => crate::notify::add_pusher(&state, me, &data.pusher, data.append).await?,
        PusherAction::Delete(ids) => {
            account_data::delete_pusher(&state.db, me.user_id.as_str(), &ids.app_id, &ids.pushkey).await?;
        }
        _ => return Err(Error::BadJson("Unknown pusher action".into())),
    }
    Ok(set_pusher::v3::Response::new())
}

/// The configured TURN servers with credentials for this user: time-limited
/// ones from the shared secret, else the fixed ones; `{}` when none are set.
async fn turn_server(state: AppState, req: Ruma<get_turn_server_info::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let voip = &state.settings.voip;
    if voip.turn_uris.is_empty() {
        return Ok(json!({}));
    }
    let now_secs = u64::try_from(crate::storage::now_ms() / 1000).unwrap_or(0);
    let (username, password) = if voip.turn_shared_secret.is_empty() {
        (voip.turn_username.clone(), voip.turn_password.clone())
    } else {
        crate::account::voip::turn_credentials(
            &voip.turn_shared_secret,
            &me.user_id,
            now_secs + voip.turn_user_lifetime_secs,
        )
    };
    Ok(json!({
        "username": username,
        "password": password,
        "uris": voip.turn_uris,
        "ttl": voip.turn_user_lifetime_secs,
    }))
}

/// No third-party protocols (bridges).
async fn protocols(_state: AppState, _req: Ruma<get_protocols::v3::Request>) -> Result<Value> {
    Ok(json!({}))
}
