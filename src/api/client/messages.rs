//! History reads: `/messages` and `/context`, through the user's readable ranges.

use axum::Router;
use ruma::api::Direction;
use ruma::api::client::context::get_context;
use ruma::api::client::filter::{LazyLoadOptions, RoomEventFilter, UrlFilter};
use ruma::api::client::message::get_message_events;
use ruma::{OwnedUserId, UserId};
use serde_json::{Value, json};

use crate::account::Requester;
use crate::api::extract::{Ruma, route_json};
use crate::error::{Error, Result};
use crate::room::fields::EventFields;
use crate::room::history::{self, Dir, EventFilter, PageRequest};
use crate::room::read::{self, Access, Loaded, RoomView};
use crate::state::AppState;

/// The largest page served.
const MAX_LIMIT: usize = 1000;

/// Backfills one `/messages` request may wait for (each brings up to 100
/// events from another server).
const MAX_BACKFILLS: usize = 3;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route_json(router, messages);
    route_json(router, context)
}

/// The parts of a client's RoomEventFilter that select events (shared by
/// `/messages`, `/context` and `/sync`); a list longer than the bound is 400.
pub(super) fn event_filter(f: &RoomEventFilter) -> Result<EventFilter> {
    check_event_filter(f)?;
    Ok(EventFilter {
        types: f.types.clone(),
        not_types: f.not_types.clone(),
        senders: f.senders.as_ref().map(|s| s.iter().map(ToString::to_string).collect()),
        not_senders: f.not_senders.iter().map(ToString::to_string).collect(),
        contains_url: f.url_filter.as_ref().map(|u| matches!(u, UrlFilter::EventsWithUrl)),
    })
}

/// Refuses a RoomEventFilter with a list longer than the bound.
pub(super) fn check_event_filter(f: &RoomEventFilter) -> Result<()> {
    history::check_filter_list("types", f.types.as_ref().map_or(0, Vec::len))?;
    history::check_filter_list("not_types", f.not_types.len())?;
    history::check_filter_list("senders", f.senders.as_ref().map_or(0, Vec::len))?;
    history::check_filter_list("not_senders", f.not_senders.len())?;
    history::check_filter_list("rooms", f.rooms.as_ref().map_or(0, Vec::len))?;
    history::check_filter_list("not_rooms", f.not_rooms.len())
}

fn lazy_members(f: &RoomEventFilter) -> bool {
    matches!(f.lazy_load_options, LazyLoadOptions::Enabled { .. })
}

/// A position on the room's seq line from a `/messages` token (`t<seq>`) or a
/// `/sync` token (`s<stream>_<typing>`, which the spec allows here too).
pub(super) async fn position(state: &AppState, view: &RoomView, token: &str) -> Result<i64> {
    if token.starts_with('s') {
        let t = crate::sync::Token::parse(token)?;
        return crate::storage::events::seq_at_stream(&state.db, &view.room.room_id, t.stream).await;
    }
    history::parse_token(token)
}

/// 403 for a room the user may read nothing of and was never in, and for a
/// room they forgot (its history is gone for them).
pub(super) async fn require_some_access(
    state: &AppState,
    view: &RoomView,
    me: &Requester,
    access: &Access,
) -> Result<()> {
    if access.ranges.is_empty() && !access.ever_member() {
        return Err(Error::Forbidden("You are not a member of this room".into()));
    }
    let room = view.room.room_id.as_str();
    if !access.joined()
        && crate::storage::memberships::is_forgotten(&state.db, me.user_id.as_str(), room).await?
    {
        return Err(Error::Forbidden("You forgot this room".into()));
    }
    Ok(())
}

fn format_all(view: &RoomView, events: &[Loaded], me: &Requester, access: &Access) -> Vec<Value> {
    events.iter().map(|e| read::format(view, e, me, &access.history)).collect()
}

async fn lazy_state(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    events: &[&Loaded],
) -> Result<Vec<Value>> {
    let mut senders: Vec<OwnedUserId> = events.iter().map(|e| e.pdu.sender.clone()).collect();
    senders.sort();
    senders.dedup();
    let refs: Vec<&UserId> = senders.iter().map(|s| s.as_ref()).collect();
    let members = history::members_for(state, view, access, &refs).await?;
    Ok(format_all(view, &members, me, access))
}

async fn messages(state: AppState, req: Ruma<get_message_events::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let mut view = read::open(&state, &b.room_id).await?;
    let mut access = read::access(&state, &view, &me.user_id).await?;
    require_some_access(&state, &view, me, &access).await?;
    let dir = match b.dir {
        Direction::Backward => Dir::Backward,
        Direction::Forward => Dir::Forward,
    };
    let from = match &b.from {
        Some(t) => position(&state, &view, t).await?,
        None if dir == Dir::Backward => view.room.last_seq,
        None => 0,
    };
    let to = match &b.to {
        Some(t) => Some(position(&state, &view, t).await?),
        None => None,
    };
    let limit = usize::try_from(u64::from(b.limit)).unwrap_or(MAX_LIMIT).clamp(1, MAX_LIMIT);
    let fields = raw_event_fields(req.query_param("filter"))?;
    let filter = event_filter(&b.filter)?;
    let request = PageRequest { from, to, dir, limit, filter: &filter };
    let mut page = history::page(&state, &view, &access, request).await?;
    // Paging back past the bottom of the line: history this server does not
    // have yet may lie below it (a room joined over federation), fetched
    // from other servers, placed, and read with the user's ranges worked
    // out again (the placed history carries its own visibility).
    // A page that crosses a hole in the middle of the line (an event
    // placed across it after an outage) has it filled first, the same way.
    for _ in 0..MAX_BACKFILLS {
        let filled =
            match crate::room::hole::crossed(&state.db, &b.room_id, &access, &page, from, dir).await? {
                Some((upper, missing)) => {
                    crate::federation::backfill::fill_hole(&state, &b.room_id, upper, &missing).await?
                }
                None => false,
            };
        let short = page.next.is_none() && page.events.len() < limit && dir == Dir::Backward;
        let filled = filled
            || match access.ranges.first().filter(|_| short) {
                Some(first) => {
                    let readable_from = to.map_or(first, |t| first.max(t.saturating_add(1)));
                    crate::federation::backfill::fill_below(&state, &b.room_id, readable_from).await?
                }
                None => false,
            };
        if !filled {
            break;
        }
        view = read::open(&state, &b.room_id).await?;
        access = read::access(&state, &view, &me.user_id).await?;
        page = history::page(&state, &view, &access, request).await?;
    }
    let mut body = json!({
        "start": history::token(from),
        "chunk": read::format_events(&state, &view, &access, me, &page.events.iter().collect::<Vec<_>>()).await?,
    });
    // A filtered page that found something also ends with a token, as
    // other servers answer and clients expect (the next page, empty, has
    // none); unfiltered pages carry one only when more events follow.
    let filtered_end = (!filter.is_empty())
        .then(|| page.events.last())
        .flatten()
        .map(|last| if dir == Dir::Backward { last.stored.seq - 1 } else { last.stored.seq });
    if let Some(next) = page.next.or(filtered_end) {
        body["end"] = json!(history::token(next));
    }
    if lazy_members(&b.filter) {
        let refs: Vec<&Loaded> = page.events.iter().collect();
        body["state"] = json!(lazy_state(&state, &view, &access, me, &refs).await?);
    }
    if let Some(fields) = fields {
        fields.apply_all(&mut body["chunk"]);
    }
    Ok(body)
}

/// `event_fields` of the raw `filter` parameter of `/messages` and
/// `/context` (ruma's RoomEventFilter has no such field; seqline takes it
/// there too, as in a sync filter).
fn raw_event_fields(filter: Option<String>) -> Result<Option<EventFields>> {
    let Some(text) = filter else { return Ok(None) };
    let value: Value =
        serde_json::from_str(&text).map_err(|e| Error::BadJson(format!("Invalid filter: {e}")))?;
    let list: Option<Vec<String>> = match value.get("event_fields") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|_| Error::BadJson("event_fields must be a list of strings".into()))?,
        ),
    };
    EventFields::parse(list.as_deref())
}

async fn context(state: AppState, req: Ruma<get_context::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let view = read::open(&state, &b.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    require_some_access(&state, &view, me, &access).await?;
    let not_found = || Error::NotFound("Event not found".into());
    let event = read::load_by_id(&state, b.event_id.as_str()).await?;
    if event.stored.room_id != view.room.room_id || !access.ranges.contains(event.stored.seq) {
        return Err(not_found());
    }
    let seq = event.stored.seq;
    let limit = usize::try_from(u64::from(b.limit)).unwrap_or(MAX_LIMIT).min(MAX_LIMIT);
    let before_limit = limit / 2;
    let after_limit = limit - before_limit;
    let fields = raw_event_fields(req.query_param("filter"))?;
    let filter = event_filter(&b.filter)?;
    let before = if before_limit > 0 {
        let req =
            PageRequest { from: seq - 1, to: None, dir: Dir::Backward, limit: before_limit, filter: &filter };
        history::page(&state, &view, &access, req).await?.events
    } else {
        Vec::new()
    };
    let after = if after_limit > 0 {
        let req = PageRequest { from: seq, to: None, dir: Dir::Forward, limit: after_limit, filter: &filter };
        history::page(&state, &view, &access, req).await?.events
    } else {
        Vec::new()
    };
    let start = before.last().map_or(seq - 1, |e| e.stored.seq - 1);
    let end = after.last().map_or(seq, |e| e.stored.seq);
    let state_events = if lazy_members(&b.filter) {
        let all: Vec<&Loaded> = before.iter().chain(std::iter::once(&event)).chain(after.iter()).collect();
        lazy_state(&state, &view, &access, me, &all).await?
    } else {
        let mut out = Vec::new();
        for stored in crate::storage::events::state_at(&state.db, &view.room.room_id, seq).await? {
            out.push(read::format(&view, &read::load(&state, stored).await?, me, &access.history));
        }
        out
    };
    // One batch of bundled aggregations for the whole answer.
    let all: Vec<&Loaded> = before.iter().chain(std::iter::once(&event)).chain(after.iter()).collect();
    let mut formatted = read::format_events(&state, &view, &access, me, &all).await?;
    let events_after = formatted.split_off(before.len() + 1);
    let event_json = formatted.pop().unwrap_or_default();
    let events_before = formatted;
    let mut body = json!({
        "start": history::token(start),
        "end": history::token(end),
        "events_before": events_before,
        "event": event_json,
        "events_after": events_after,
        "state": state_events,
    });
    if let Some(fields) = fields {
        for part in ["events_before", "events_after", "state"] {
            fields.apply_all(&mut body[part]);
        }
        body["event"] = fields.apply(&body["event"]);
    }
    Ok(body)
}
