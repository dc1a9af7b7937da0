//! `/sync` and filters.

use std::time::Duration;

use axum::Router;
use ruma::api::client::filter::{FilterDefinition, LazyLoadOptions, create_filter, get_filter};
use ruma::api::client::sync::sync_events::v3::{self as sync_events, Filter};
use serde_json::Value;

use crate::api::extract::{Authed, RawJson, Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::room::fields::EventFields;
use crate::room::history;
use crate::state::AppState;
use crate::storage::account_data;
use crate::sync::{self, DEFAULT_TIMELINE_LIMIT, SyncFilter, SyncRequest, Token};

/// The longest a sync waits, whatever the client asks.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Simplified sliding sync's path (the unstable one every client speaks).
pub const SLIDING_SYNC_PATH: &str = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync";

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = router.route(SLIDING_SYNC_PATH, axum::routing::post(sliding_sync));
    let router = route_json(router, sync_handler);
    let router = route(router, create);
    route(router, get)
}

/// Refuses a filter with a list longer than the bound, wherever in the
/// definition (400 M_BAD_JSON): checked on upload and on every use, so a
/// filter stored before the bound is refused too.
fn check_definition(def: &FilterDefinition) -> Result<()> {
    let room = &def.room;
    history::check_filter_list("rooms", room.rooms.as_ref().map_or(0, Vec::len))?;
    history::check_filter_list("not_rooms", room.not_rooms.len())?;
    for f in [&room.timeline, &room.state, &room.ephemeral, &room.account_data] {
        super::messages::check_event_filter(f)?;
    }
    for f in [&def.presence, &def.account_data] {
        history::check_filter_list("types", f.types.as_ref().map_or(0, Vec::len))?;
        history::check_filter_list("not_types", f.not_types.len())?;
        history::check_filter_list("senders", f.senders.as_ref().map_or(0, Vec::len))?;
        history::check_filter_list("not_senders", f.not_senders.len())?;
    }
    Ok(())
}

fn sync_filter(def: &FilterDefinition) -> Result<SyncFilter> {
    check_definition(def)?;
    let room = &def.room;
    let lazy = match room.state.lazy_load_options {
        LazyLoadOptions::Enabled { include_redundant_members } => Some(include_redundant_members),
        LazyLoadOptions::Disabled => None,
    };
    Ok(SyncFilter {
        timeline_limit: room
            .timeline
            .limit
            .map_or(DEFAULT_TIMELINE_LIMIT, |l| {
                usize::try_from(u64::from(l)).unwrap_or(DEFAULT_TIMELINE_LIMIT)
            })
            .min(500),
        timeline: super::messages::event_filter(&room.timeline)?,
        rooms: room.rooms.as_ref().map(|r| r.iter().map(ToString::to_string).collect()),
        not_rooms: room.not_rooms.iter().map(ToString::to_string).collect(),
        include_leave: room.include_leave,
        lazy_load_members: lazy.is_some(),
        include_redundant_members: lazy.unwrap_or(false),
        state: super::messages::event_filter(&room.state)?,
        unread_thread_notifications: room.timeline.unread_thread_notifications,
    })
}

/// Parses a filter definition the client sent, with the spec's 400 M_BAD_JSON
/// for a wrong shape (`lazy_load_members: "yes"`, say).
fn parse_definition(text: &str) -> Result<FilterDefinition> {
    serde_json::from_str(text).map_err(|e| Error::BadJson(format!("Invalid filter: {e}")))
}

async fn resolve_filter(state: &AppState, user: &str, filter: &Option<Filter>) -> Result<FilterDefinition> {
    match filter {
        None => Ok(FilterDefinition::default()),
        Some(Filter::FilterDefinition(def)) => Ok(def.clone()),
        Some(Filter::FilterId(id)) if id.trim_start().starts_with('{') => parse_definition(id),
        Some(Filter::FilterId(id)) => {
            let text = account_data::get_filter(&state.db, user, id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("No filter {id:?}")))?;
            parse_definition(&text)
        }
        Some(_) => Ok(FilterDefinition::default()),
    }
}

async fn sync_handler(state: AppState, req: Ruma<sync_events::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let definition = resolve_filter(&state, me.user_id.as_str(), &b.filter).await?;
    let fields = EventFields::parse(definition.event_fields.as_deref())?;
    let request = SyncRequest {
        since: b.since.as_deref().map(Token::parse).transpose()?,
        full_state: b.full_state,
        filter: sync_filter(&definition)?,
        timeout: b.timeout.unwrap_or_default().min(MAX_TIMEOUT),
        // MSC4222's unstable names go together: a client that sends the
        // unstable parameter (matrix-js-sdk does) reads only the unstable field.
        state_after: if b.use_state_after {
            Some("state_after")
        } else if req.query_param("org.matrix.msc4222.use_state_after").is_some_and(|v| v == "true") {
            Some("org.matrix.msc4222.state_after")
        } else {
            None
        },
    };
    sync::presence::touch_from_sync(&state, &me.user_id, b.set_presence.as_str()).await?;
    let mut body = sync::sync(&state, me, &request).await?;
    if let Some(fields) = fields {
        fields.apply_to_sync(&mut body);
    }
    Ok(body)
}

async fn create(
    state: AppState,
    req: Ruma<create_filter::v3::Request>,
) -> Result<create_filter::v3::Response> {
    let me = req.requester()?;
    if req.body.user_id != me.user_id {
        return Err(Error::Forbidden("You can only create filters for yourself".into()));
    }
    EventFields::parse(req.body.filter.event_fields.as_deref())?;
    check_definition(&req.body.filter)?;
    let text = serde_json::to_string(&req.body.filter).map_err(|e| Error::Internal(e.to_string()))?;
    let id = account_data::put_filter(&state.db, me.user_id.as_str(), &text).await?;
    Ok(create_filter::v3::Response::new(id))
}

async fn get(state: AppState, req: Ruma<get_filter::v3::Request>) -> Result<get_filter::v3::Response> {
    let me = req.requester()?;
    if req.body.user_id != me.user_id {
        return Err(Error::Forbidden("You can only read your own filters".into()));
    }
    let text = account_data::get_filter(&state.db, me.user_id.as_str(), &req.body.filter_id)
        .await?
        .ok_or_else(|| Error::NotFound("Unknown filter".into()))?;
    Ok(get_filter::v3::Response::new(parse_definition(&text)?))
}

/// `POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync`:
/// `pos`, `timeout` and `set_presence` come in the query (a `pos` or
/// `timeout` in the body is read too, the query's winning).
async fn sliding_sync(
    axum::extract::State(state): axum::extract::State<AppState>,
    Authed(me): Authed,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    RawJson(bytes): RawJson,
) -> Result<axum::Json<Value>> {
    let query = query.unwrap_or_default();
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    };
    let body = sync::sliding::request::parse(&bytes)?;
    let timeout = match param("timeout") {
        Some(t) => Some(t.parse::<u64>().map_err(|_| Error::InvalidParam(format!("Invalid timeout {t:?}")))?),
        None => body.timeout,
    };
    let request = sync::sliding::Request {
        pos: param("pos").or_else(|| body.pos.clone()),
        timeout: Duration::from_millis(timeout.unwrap_or(0)),
        body,
    };
    let presence = param("set_presence").unwrap_or_else(|| "online".into());
    if !matches!(presence.as_str(), "online" | "offline" | "unavailable") {
        return Err(Error::InvalidParam(format!("Invalid set_presence {presence:?}")));
    }
    sync::presence::touch_from_sync(&state, &me.user_id, &presence).await?;
    Ok(axum::Json(sync::sliding::sync(&state, &me, request).await?))
}
