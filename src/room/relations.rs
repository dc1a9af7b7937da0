//! Relations between events (client-server API, "Forming relationships
//! between events", "Threading", "Event replacements", "Reference
//! relations"): what the write path records of `m.relates_to`, the children
//! of an event (`/relations`), a room's threads (`/threads`), and the bundled
//! aggregations (`unsigned.m.relations`) every event served to a client
//! carries.
//!
//! Every read here is cut to the caller's readable ranges ([`Access`]): a
//! child outside them is never returned, counted, bundled or used to order
//! threads.

use std::collections::HashMap;

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use serde_json::{Map, Value, json};

use super::history::{self, Dir};
use super::read::{self, Access, Loaded, RoomView};
use crate::account::Requester;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;
use crate::storage::relations::{self as store, ChildQuery, NewRelation, ThreadQuery};

/// How deep `recurse=true` follows relations (Synapse's depth too): the
/// children, theirs, and theirs.
pub const RECURSION_DEPTH: u32 = 3;

/// The relation an event's content declares: `m.relates_to` with a string
/// `rel_type` (1 to 255 bytes) and an event id. Anything else (a reply's
/// `m.in_reply_to` alone, a malformed or NUL-carrying value) is none.
pub fn relation_of(content: &CanonicalJsonObject) -> Option<NewRelation<'_>> {
    let CanonicalJsonValue::Object(relates_to) = content.get("m.relates_to")? else { return None };
    let rel_type = relates_to.get("rel_type")?.as_str()?;
    let relates_to_id = relates_to.get("event_id")?.as_str()?;
    let well_formed = !rel_type.is_empty()
        && rel_type.len() <= 255
        && !rel_type.contains('\0')
        && names_an_event(relates_to_id);
    well_formed.then_some(NewRelation { relates_to_id, rel_type })
}

/// Whether a relation's `event_id` can name an event: an event id of at
/// most 255 bytes (the spec's bound; ruma's parser allows longer ones, and a
/// longer key fails PostgreSQL's index entries), without NUL.
pub fn names_an_event(id: &str) -> bool {
    id.len() <= 255 && !id.contains('\0') && <&ruma::EventId>::try_from(id).is_ok()
}

/// The `rel_type` of a served event's own relation.
fn own_rel_type(loaded: &Loaded) -> Option<String> {
    let content: Value = loaded.pdu.content_as()?;
    content.get("m.relates_to")?.get("rel_type")?.as_str().map(str::to_owned)
}

/// The thread an event is in: the root its `m.thread` relation names
/// (`None`: the main timeline, thread roots included). A redacted event has
/// lost its relation.
pub fn thread_of(loaded: &Loaded) -> Option<String> {
    if loaded.redaction.is_some() {
        return None;
    }
    let content: Value = loaded.pdu.content_as()?;
    super::tally::thread_in(&content).map(str::to_owned)
}

/// A readable event of the room by id, or the 404 of `/event` (unknown,
/// in another room, or not readable: the same answer).
pub async fn readable_event(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    event_id: &str,
) -> Result<Loaded> {
    let not_found = || Error::NotFound("Event not found".into());
    let stored = events::by_id(&state.db, event_id).await?.ok_or_else(not_found)?;
    if stored.room_id != view.room.room_id || !access.ranges.contains(stored.seq) {
        return Err(not_found());
    }
    read::load(state, stored).await
}

/// What `/relations` asks for.
#[derive(Debug, Clone, Copy)]
pub struct ChildrenRequest<'a> {
    /// The parent (readable, checked by [`children`]).
    pub parent: &'a str,
    /// Only this `rel_type`.
    pub rel_type: Option<&'a str>,
    /// Only this event type.
    pub event_type: Option<&'a str>,
    /// Start position (`None`: the head going backwards, the start going forwards).
    pub from: Option<i64>,
    /// Stop position.
    pub to: Option<i64>,
    /// Direction.
    pub dir: Dir,
    /// At most this many.
    pub limit: usize,
    /// Follow relations of relations up to [`RECURSION_DEPTH`].
    pub recurse: bool,
}

/// One page of children.
#[derive(Debug, Clone)]
pub struct ChildrenPage {
    /// In the order of the direction.
    pub events: Vec<Loaded>,
    /// Where the next page starts (a position, as in `/messages` tokens).
    pub next: Option<i64>,
}

/// The readable children of a readable parent, paged along the seq line
/// through the caller's readable spans; 404 when the parent is not readable.
pub async fn children(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    req: ChildrenRequest<'_>,
) -> Result<ChildrenPage> {
    readable_event(state, view, access, req.parent).await?;
    let query = ChildQuery {
        room_id: view.room.room_id.as_str(),
        parent: req.parent,
        rel_type: req.rel_type,
        event_type: req.event_type,
        depth: if req.recurse { i64::from(RECURSION_DEPTH) } else { 1 },
    };
    let (from, to, dir, limit) = (req.from, req.to, req.dir, req.limit.max(1));
    // Tokens name the point after a position: forwards starts above it.
    let spans = match dir {
        Dir::Backward => history::readable_spans(access, dir, from.unwrap_or(view.room.last_seq), to),
        Dir::Forward => history::readable_spans(access, dir, from.unwrap_or(0).saturating_add(1), to),
    };
    let mut found = Vec::new();
    let mut more = false;
    let span_count = spans.len();
    for (i, (lo, hi)) in spans.into_iter().enumerate() {
        let wanted = limit - found.len();
        let want = i64::try_from(wanted).unwrap_or(i64::MAX).saturating_add(1);
        let mut rows = store::children(&state.db, query, lo, hi, dir == Dir::Backward, want).await?;
        if rows.len() > wanted {
            rows.truncate(wanted);
            more = true;
        }
        found.extend(rows);
        if found.len() >= limit {
            // Full at the end of a span: later spans may hold more.
            more = more || i + 1 < span_count;
            break;
        }
    }
    let next = match found.last() {
        Some(last) if more => Some(match dir {
            Dir::Backward => last.seq - 1,
            Dir::Forward => last.seq,
        }),
        _ => None,
    };
    let mut events = Vec::with_capacity(found.len());
    for stored in found {
        events.push(read::load(state, stored).await?);
    }
    Ok(ChildrenPage { events, next })
}

/// One page of `/threads`.
#[derive(Debug, Clone)]
pub struct ThreadsPage {
    /// Thread roots, newest readable reply first.
    pub roots: Vec<Loaded>,
    /// Where the next page starts: threads whose newest reply is at or below it.
    pub next: Option<i64>,
}

/// The room's threads with a readable root, ordered by their newest
/// readable reply; with `participant`, only those that user started or
/// replied to.
pub async fn threads(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    participant: Option<&str>,
    from: Option<i64>,
    limit: usize,
) -> Result<ThreadsPage> {
    let limit = limit.max(1);
    let mut rows = store::threads(
        &state.db,
        ThreadQuery {
            room_id: view.room.room_id.as_str(),
            spans: &access.ranges.0,
            participant,
            at_or_below: from.unwrap_or(i64::MAX),
            limit: i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1),
        },
    )
    .await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = if more { rows.last().map(|(_, latest)| latest - 1) } else { None };
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    let mut by_id: HashMap<String, Loaded> = HashMap::new();
    for stored in events::by_ids(&state.db, &ids).await? {
        by_id.insert(stored.event_id.clone(), read::load(state, stored).await?);
    }
    let roots = rows.iter().filter_map(|(id, _)| by_id.remove(id)).collect();
    Ok(ThreadsPage { roots, next })
}

/// The bundled aggregations of `events` for the caller, by event id: the
/// `m.thread` summary (readable replies only), the `m.reference` children,
/// the newest valid `m.replace`. A few queries for the whole page.
pub async fn bundles(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    page: &[&Loaded],
) -> Result<HashMap<String, Value>> {
    let mut out: HashMap<String, Map<String, Value>> = HashMap::new();
    if page.is_empty() {
        return Ok(HashMap::new());
    }
    let room_id = view.room.room_id.as_str();
    let spans = &access.ranges.0;
    let ids: Vec<&str> = page.iter().map(|e| e.pdu.event_id.as_str()).collect();
    let me_str = me.user_id.as_str();

    // The page's reader said nothing relates to any of its events: no
    // bundle to look for.
    if page.iter().all(|e| e.stored.has_children == Some(false)) {
        return Ok(HashMap::new());
    }
    let summaries = store::thread_summaries(&state.db, room_id, &ids, spans, me_str).await?;
    let latest_seqs: Vec<i64> = summaries.iter().map(|s| s.latest_seq).collect();
    let mut latest: HashMap<i64, Loaded> = HashMap::new();
    for stored in events::at_seqs(&state.db, room_id, &latest_seqs).await? {
        latest.insert(stored.seq, read::load(state, stored).await?);
    }

    // Edits of the page's events and of the latest replies, in one query.
    let mut edited: Vec<&Loaded> = page.to_vec();
    edited.extend(latest.values());
    let edits = newest_edits(state, view, access, me, &edited).await?;

    for summary in summaries {
        let Some(root) = page.iter().find(|e| e.pdu.event_id.as_str() == summary.root) else { continue };
        let Some(reply) = latest.get(&summary.latest_seq) else { continue };
        let mut reply_json = read::format(view, reply, me, &access.history);
        if let Some(edit) = edits.get(reply.pdu.event_id.as_str()) {
            reply_json["unsigned"]["m.relations"] = json!({ "m.replace": edit });
        }
        let participated = summary.replied || root.pdu.sender == me.user_id;
        out.entry(summary.root.clone()).or_default().insert(
            "m.thread".into(),
            json!({
                "latest_event": reply_json,
                "count": summary.count,
                "current_user_participated": participated,
            }),
        );
    }
    let mut references: HashMap<String, Vec<Value>> = HashMap::new();
    for (parent, child) in store::references(&state.db, room_id, &ids, spans).await? {
        references.entry(parent).or_default().push(json!({ "event_id": child }));
    }
    for (parent, chunk) in references {
        out.entry(parent).or_default().insert("m.reference".into(), json!({ "chunk": chunk }));
    }
    for event in page {
        if let Some(edit) = edits.get(event.pdu.event_id.as_str()) {
            out.entry(event.pdu.event_id.to_string()).or_default().insert("m.replace".into(), edit.clone());
        }
    }
    Ok(out.into_iter().map(|(id, m)| (id, Value::Object(m))).collect())
}

/// The newest valid replacement of each of `originals` the caller may read,
/// formatted: same sender and type (checked in SQL), carrying
/// `m.new_content` (unless encrypted), of an original that is neither
/// redacted (its edits would show what the redaction removed) nor itself a
/// replacement.
async fn newest_edits(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    originals: &[&Loaded],
) -> Result<HashMap<String, Value>> {
    let editable: Vec<&str> = originals
        .iter()
        .filter(|e| e.redaction.is_none() && own_rel_type(e).as_deref() != Some("m.replace"))
        .map(|e| e.pdu.event_id.as_str())
        .collect();
    let mut out: HashMap<String, Value> = HashMap::new();
    if editable.is_empty() {
        return Ok(out);
    }
    let room_id = view.room.room_id.as_str();
    for (original, stored) in store::edit_candidates(&state.db, room_id, &editable, &access.ranges.0).await? {
        if out.contains_key(&original) {
            continue;
        }
        let loaded = read::load(state, stored).await?;
        let content: Value = loaded.pdu.content_as().unwrap_or_default();
        let encrypted = loaded.pdu.kind.to_string() == "m.room.encrypted";
        if !encrypted && !content.get("m.new_content").is_some_and(Value::is_object) {
            continue;
        }
        out.insert(original, read::format(view, &loaded, me, &access.history));
    }
    Ok(out)
}
