//! `/relations` (the children of an event, by relation type and event type)
//! and `/threads` (a room's threads), through the caller's readable ranges
//! (`room::relations`).

use axum::Router;
use ruma::api::Direction;
use ruma::api::client::relations::{
    get_relating_events, get_relating_events_with_rel_type, get_relating_events_with_rel_type_and_event_type,
};
use ruma::api::client::threads::get_threads::v1::{self as get_threads, IncludeThreads};
use ruma::serde::Raw;
use ruma::{EventId, RoomId, UInt};
use serde_json::Value;

use super::messages::{position, require_some_access};
use crate::account::Requester;
use crate::api::extract::{Ruma, route};
use crate::error::{Error, Result};
use crate::room::history::{self, Dir};
use crate::room::read;
use crate::room::relations::{self, ChildrenRequest, RECURSION_DEPTH};
use crate::state::AppState;

/// A `/relations` page without a `limit` (Synapse's default).
const DEFAULT_LIMIT: usize = 5;

/// The largest `/relations` and `/threads` page served (Synapse's cap).
const MAX_LIMIT: usize = 1000;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, relating_events);
    let router = route(router, relating_events_with_rel_type);
    let router = route(router, relating_events_with_rel_type_and_event_type);
    route(router, threads)
}

/// The parts of the three `/relations` requests.
struct Query<'a> {
    room_id: &'a RoomId,
    event_id: &'a EventId,
    rel_type: Option<String>,
    event_type: Option<String>,
    from: Option<&'a str>,
    to: Option<&'a str>,
    dir: Direction,
    limit: Option<UInt>,
    recurse: bool,
}

/// What `/relations` answers, in the one form the three requests share.
struct Answer {
    chunk: Vec<Raw<ruma::events::AnyMessageLikeEvent>>,
    next_batch: Option<String>,
    prev_batch: Option<String>,
    recursion_depth: Option<UInt>,
}

fn page_limit(limit: Option<UInt>, default: usize) -> usize {
    limit.map_or(default, |l| usize::try_from(u64::from(l)).unwrap_or(MAX_LIMIT)).clamp(1, MAX_LIMIT)
}

fn raw<T>(value: &Value) -> Result<Raw<T>> {
    serde_json::value::to_raw_value(value)
        .map(Raw::from_json)
        .map_err(|e| Error::Internal(format!("cannot serialise an event: {e}")))
}

async fn answer(state: &AppState, me: &Requester, q: Query<'_>) -> Result<Answer> {
    let view = read::open(state, q.room_id).await?;
    let access = read::access(state, &view, &me.user_id).await?;
    let dir = match q.dir {
        Direction::Backward => Dir::Backward,
        Direction::Forward => Dir::Forward,
    };
    let from = match q.from {
        Some(t) => Some(position(state, &view, t).await?),
        None => None,
    };
    let to = match q.to {
        Some(t) => Some(position(state, &view, t).await?),
        None => None,
    };
    let req = ChildrenRequest {
        parent: q.event_id.as_str(),
        rel_type: q.rel_type.as_deref(),
        event_type: q.event_type.as_deref(),
        from,
        to,
        dir,
        limit: page_limit(q.limit, DEFAULT_LIMIT),
        recurse: q.recurse,
    };
    let page = relations::children(state, &view, &access, req).await?;
    let refs: Vec<&read::Loaded> = page.events.iter().collect();
    let chunk = read::format_events(state, &view, &access, me, &refs).await?;
    Ok(Answer {
        chunk: chunk.iter().map(raw).collect::<Result<_>>()?,
        next_batch: page.next.map(history::token),
        prev_batch: q.from.map(str::to_owned),
        recursion_depth: q.recurse.then(|| UInt::from(RECURSION_DEPTH)),
    })
}

/// A `/relations` handler for one of the three request types: the same
/// answer, `rel_type` and `event_type` taken from the path where it has them.
macro_rules! relations_handler {
    ($name:ident, $endpoint:ident, |$b:ident| $rel_type:expr, $event_type:expr) => {
        async fn $name(
            state: AppState,
            req: Ruma<$endpoint::v1::Request>,
        ) -> Result<$endpoint::v1::Response> {
            let me = req.requester()?;
            let $b = &req.body;
            let query = Query {
                room_id: &$b.room_id,
                event_id: &$b.event_id,
                rel_type: $rel_type,
                event_type: $event_type,
                from: $b.from.as_deref(),
                to: $b.to.as_deref(),
                dir: $b.dir,
                limit: $b.limit,
                recurse: $b.recurse,
            };
            let a = answer(&state, me, query).await?;
            let mut out = $endpoint::v1::Response::new(a.chunk);
            (out.next_batch, out.prev_batch, out.recursion_depth) =
                (a.next_batch, a.prev_batch, a.recursion_depth);
            Ok(out)
        }
    };
}

relations_handler!(relating_events, get_relating_events, |b| None, None);
relations_handler!(
    relating_events_with_rel_type,
    get_relating_events_with_rel_type,
    |b| Some(b.rel_type.to_string()),
    None
);
relations_handler!(
    relating_events_with_rel_type_and_event_type,
    get_relating_events_with_rel_type_and_event_type,
    |b| Some(b.rel_type.to_string()),
    Some(b.event_type.to_string())
);

async fn threads(state: AppState, req: Ruma<get_threads::Request>) -> Result<get_threads::Response> {
    let me = req.requester()?;
    let b = &req.body;
    let participated = match &b.include {
        IncludeThreads::All => false,
        IncludeThreads::Participated => true,
        other => {
            return Err(Error::InvalidParam(format!(
                "include must be \"all\" or \"participated\", not {:?}",
                other.as_str()
            )));
        }
    };
    let view = read::open(&state, &b.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    require_some_access(&state, &view, me, &access).await?;
    let from = match &b.from {
        Some(t) => Some(history::parse_token(t)?),
        None => None,
    };
    let participant = participated.then_some(me.user_id.as_str());
    let limit = page_limit(b.limit, DEFAULT_LIMIT);
    let page = relations::threads(&state, &view, &access, participant, from, limit).await?;
    let refs: Vec<&read::Loaded> = page.roots.iter().collect();
    let chunk = read::format_events(&state, &view, &access, me, &refs).await?;
    let mut out = get_threads::Response::new(chunk.iter().map(raw).collect::<Result<_>>()?);
    out.next_batch = page.next.map(history::token);
    Ok(out)
}
