//! `POST /search`: the `room_events` category (the only one the spec has;
//! other keys of `search_categories` are ignored). The domain is
//! `room::search`; this parses the ruma request and formats the answer.

use axum::Router;
use ruma::api::client::search::search_events::v3::{Criteria, GroupingKey, OrderBy, Request};
use serde_json::{Map, Value, json};

use crate::account::Requester;
use crate::api::extract::{Ruma, route_json};
use crate::error::{Error, Result};
use crate::room::read::{self, Loaded};
use crate::room::search::{self, Batch, Found, Readable};
use crate::state::AppState;
use crate::storage::search::{GroupColumn, Order, SEARCHABLE};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    route_json(router, search_events)
}

async fn search_events(state: AppState, req: Ruma<Request>) -> Result<Value> {
    let me = req.requester()?;
    let Some(criteria) = &req.body.search_categories.room_events else {
        return Ok(json!({ "search_categories": {} }));
    };
    let batch = match req.body.next_batch.as_deref() {
        Some(token) => Some(Batch::parse(token)?),
        None => None,
    };
    let request = domain_request(criteria, batch)?;
    let outcome = search::run(&state, &me.user_id, &request).await?;
    let ctx = &criteria.event_context;
    // ruma fills in the spec's defaults (5 and 5) when the client sent no
    // `event_context`; then there is no context to give (nor to work out).
    let wants_context = serde_json::from_slice::<Value>(&req.raw_body)
        .is_ok_and(|b| b["search_categories"]["room_events"].get("event_context").is_some());
    let before =
        usize::try_from(u64::from(ctx.before_limit)).unwrap_or(search::MAX_CONTEXT).min(search::MAX_CONTEXT);
    let after =
        usize::try_from(u64::from(ctx.after_limit)).unwrap_or(search::MAX_CONTEXT).min(search::MAX_CONTEXT);
    let mut results = Vec::with_capacity(outcome.results.len());
    for found in &outcome.results {
        let Some(room) = outcome.rooms.get(found.loaded.stored.room_id.as_str()) else { continue };
        let mut result = json!({
            "rank": found.rank,
            "result": read::format(&room.view, &found.loaded, me, &room.access.history),
        });
        if wants_context {
            result["context"] =
                context_json(&state, me, room, found, (before, after), ctx.include_profile).await?;
        }
        results.push(result);
    }
    let mut body = json!({
        "count": outcome.count,
        "highlights": outcome.highlights,
        "results": results,
    });
    if let Some(next) = &outcome.next {
        body["next_batch"] = json!(next.token());
    }
    if criteria.include_state == Some(true) {
        let mut by_room = Map::new();
        for found in &outcome.results {
            let room_id = found.loaded.stored.room_id.as_str();
            if by_room.contains_key(room_id) {
                continue;
            }
            let Some(room) = outcome.rooms.get(room_id) else { continue };
            let events = read::visible_state(&state, &room.view, &room.access, None).await?;
            let formatted: Vec<Value> =
                events.iter().map(|e| read::format(&room.view, e, me, &room.access.history)).collect();
            by_room.insert(room_id.to_owned(), Value::Array(formatted));
        }
        body["state"] = Value::Object(by_room);
    }
    if !outcome.groups.is_empty() {
        let mut groups = Map::new();
        for (column, list) in &outcome.groups {
            let mut by_key = Map::new();
            for g in list {
                let mut group = json!({ "results": g.results, "order": g.order });
                if let Some(next) = &g.next {
                    group["next_batch"] = json!(next.token());
                }
                by_key.insert(g.key.clone(), group);
            }
            let name = match column {
                GroupColumn::Room => "room_id",
                GroupColumn::Sender => "sender",
            };
            groups.insert(name.to_owned(), Value::Object(by_key));
        }
        body["groups"] = Value::Object(groups);
    }
    Ok(json!({ "search_categories": { "room_events": body } }))
}

/// The domain request of the `room_events` criteria; unknown keys, orders
/// and grouping keys are 400 M_INVALID_PARAM, oversized filter lists 400
/// M_BAD_JSON.
fn domain_request(c: &Criteria, batch: Option<Batch>) -> Result<search::Request> {
    let mut types = Vec::new();
    match &c.keys {
        Some(keys) if !keys.is_empty() => {
            for key in keys {
                let kind = search::types_of_key(key.as_str())?;
                if !types.contains(&kind) {
                    types.push(kind);
                }
            }
        }
        _ => types.extend(SEARCHABLE.iter().map(|(kind, _)| *kind)),
    }
    let order = match &c.order_by {
        None | Some(OrderBy::Rank) => Order::Rank,
        Some(OrderBy::Recent) => Order::Recent,
        Some(other) => return Err(Error::InvalidParam(format!("Unknown order_by {:?}", other.as_str()))),
    };
    let mut groupings = Vec::new();
    for g in &c.groupings.group_by {
        let column = match &g.key {
            None => continue,
            Some(GroupingKey::RoomId) => GroupColumn::Room,
            Some(GroupingKey::Sender) => GroupColumn::Sender,
            Some(other) => {
                return Err(Error::InvalidParam(format!("Unknown group_by key {:?}", other.as_str())));
            }
        };
        if !groupings.contains(&column) {
            groupings.push(column);
        }
    }
    let filter = super::messages::event_filter(&c.filter)?;
    let limit = c.filter.limit.map_or(search::DEFAULT_LIMIT, |l| {
        usize::try_from(u64::from(l)).unwrap_or(search::MAX_LIMIT).clamp(1, search::MAX_LIMIT)
    });
    Ok(search::Request {
        term: c.search_term.clone(),
        types,
        filter,
        rooms: c.filter.rooms.as_ref().map(|r| r.iter().map(ToString::to_string).collect()),
        not_rooms: c.filter.not_rooms.iter().map(ToString::to_string).collect(),
        order,
        limit,
        batch,
        groupings,
    })
}

async fn context_json(
    state: &AppState,
    me: &Requester,
    room: &Readable,
    found: &Found,
    (before, after): (usize, usize),
    include_profile: bool,
) -> Result<Value> {
    let ctx = search::context(state, room, &found.loaded, before, after).await?;
    let format = |events: &[Loaded]| -> Vec<Value> {
        events.iter().map(|e| read::format(&room.view, e, me, &room.access.history)).collect()
    };
    let mut out = json!({
        "start": ctx.start,
        "end": ctx.end,
        "events_before": format(&ctx.before),
        "events_after": format(&ctx.after),
    });
    if include_profile {
        let all: Vec<&Loaded> =
            ctx.before.iter().chain(std::iter::once(&found.loaded)).chain(ctx.after.iter()).collect();
        let mut profiles = Map::new();
        for (user, (name, avatar)) in search::profiles(state, room, found.loaded.stored.seq, &all).await? {
            let mut p = Map::new();
            if let Some(name) = name {
                p.insert("displayname".into(), json!(name));
            }
            if let Some(avatar) = avatar {
                p.insert("avatar_url".into(), json!(avatar));
            }
            profiles.insert(user, Value::Object(p));
        }
        out["profile_info"] = Value::Object(profiles);
    }
    Ok(out)
}
