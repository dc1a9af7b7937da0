//! Push rules at work: each user's rule set (stored as `m.push_rules` account
//! data, starting from the spec's defaults) evaluated on the events after their
//! read receipt, giving `/sync`'s `unread_notifications` and `/notifications`.
//! Counting happens when asked, from the same readable ranges as every other
//! read, so nothing is written per recipient on the send path.

use ruma::events::room::power_levels::RoomPowerLevels;
use ruma::push::{Action, AnyPushRuleRef, PushCondition, PushConditionRoomCtx, Ruleset, ScalarJsonValue};
use ruma::serde::Raw;
use std::sync::Arc;

use ruma::{OwnedRoomId, UInt, UserId};
use serde_json::Value;

use crate::account::Requester;
use crate::error::{Error, Result};
use crate::outbound::{self, OutboundError};
use crate::room::history::{self, Dir};
use crate::room::read::{self, Access, Loaded, RoomView};
use crate::state::AppState;
use crate::storage::{account_data, events};

mod counting;
pub use counting::{CountCache, counts};

/// A user's rule set, to change: what they stored, or the server defaults.
pub async fn ruleset(state: &AppState, user: &UserId) -> Result<Ruleset> {
    Ok(Ruleset::clone(&*rules_of(state, user).await?))
}

/// The user's rule set, shared: the server defaults are built once per user.
pub async fn rules_of(state: &AppState, user: &UserId) -> Result<Arc<Ruleset>> {
    let stored = account_data::get(&state.db, user.as_str(), "", "m.push_rules").await?;
    rules_from(state, user, stored.as_deref())
}

/// The rule set of a user whose stored `m.push_rules` content (if any) is
/// at hand.
pub fn rules_from(state: &AppState, user: &UserId, stored: Option<&str>) -> Result<Arc<Ruleset>> {
    Ok(match stored {
        Some(text) => Arc::new(parse_stored(text)?),
        None => state.push_defaults.get(user),
    })
}

fn parse_stored(text: &str) -> Result<Ruleset> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::Internal(e.to_string()))?;
    serde_json::from_value(value["global"].clone())
        .map_err(|e| Error::Internal(format!("stored push rules: {e}")))
}

/// Each user's default rule set, built once (it depends on nothing but the
/// user id).
#[derive(Debug, Default)]
pub struct DefaultRules {
    users: std::sync::Mutex<std::collections::HashMap<ruma::OwnedUserId, Arc<Ruleset>>>,
}

/// Default rule sets kept before the map is dropped and refilled on demand.
const MAX_DEFAULT_RULESETS: usize = 10_000;

impl DefaultRules {
    /// The user's default rule set.
    pub fn get(&self, user: &UserId) -> Arc<Ruleset> {
        if let Some(rules) = self.users.lock().unwrap_or_else(|e| e.into_inner()).get(user) {
            return rules.clone();
        }
        let rules = Arc::new(crate::room::tally::default_ruleset(user));
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        if users.len() >= MAX_DEFAULT_RULESETS {
            users.clear();
        }
        users.insert(user.to_owned(), rules.clone());
        rules
    }
}

/// What the rules say about one event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The event notifies.
    pub notify: bool,
    /// The event highlights.
    pub highlight: bool,
}

/// Evaluates rules for events of one room for one user.
pub struct Evaluator {
    rules: Arc<Ruleset>,
    ctx: PushConditionRoomCtx,
}

impl Evaluator {
    /// Builds the room context (member count, display name, power levels)
    /// for the user's rule set.
    pub async fn with_rules(
        state: &AppState,
        view: &RoomView,
        user: &UserId,
        rules: Arc<Ruleset>,
    ) -> Result<Self> {
        let room_id =
            OwnedRoomId::try_from(view.room.room_id.as_str()).map_err(|e| Error::Internal(e.to_string()))?;
        let members = read::member_summary(state, view).await?.joined;
        let display_name =
            read::display_name(state, view, user).await?.unwrap_or_else(|| user.localpart().to_owned());
        let mut ctx = PushConditionRoomCtx::new(
            room_id,
            UInt::try_from(members).unwrap_or_default(),
            user.to_owned(),
            display_name,
        );
        let levels: RoomPowerLevels = read::power_levels(state, view).await?;
        ctx.power_levels = Some(levels.into());
        Ok(Self { rules, ctx })
    }

    /// The outcome for one client-format event.
    pub async fn evaluate(&self, event: &Value) -> Outcome {
        let Ok(raw) = serde_json::value::to_raw_value(event) else { return Outcome::default() };
        let raw: Raw<ruma::events::AnySyncTimelineEvent> = Raw::from_json(raw);
        let actions = self.rules.get_actions(&raw, &self.ctx).await;
        Outcome {
            notify: actions.iter().any(|a| matches!(a, Action::Notify)),
            highlight: actions.iter().any(Action::is_highlight),
        }
    }
}

/// Where a user has read a room up to (their read receipts, public or
/// private): an unthreaded receipt reads everything up to its event, a
/// threaded one (`thread_id`) only the main timeline (`main`) or one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadMarks {
    /// The unthreaded receipt's position (0: none).
    pub unthreaded: i64,
    /// Each threaded receipt's position, by `thread_id` (`main` or a root's id).
    pub threads: std::collections::BTreeMap<String, i64>,
}

impl ReadMarks {
    /// Whether the event at `seq` in `thread` (`None`: the main timeline)
    /// has been read.
    pub fn is_read(&self, seq: i64, thread: Option<&str>) -> bool {
        let threaded = self.threads.get(thread.unwrap_or("main")).copied().unwrap_or(0);
        seq <= self.unthreaded.max(threaded)
    }
}

/// The user's read marks in the room.
pub async fn read_marks(state: &AppState, room_id: &str, user: &UserId) -> Result<ReadMarks> {
    Ok(ReadMarks::from_rows(crate::storage::receipts::read_up_to(&state.db, room_id, user.as_str()).await?))
}

impl ReadMarks {
    /// From the highest seq each receipt reaches, per thread id ('' for
    /// unthreaded).
    pub fn from_rows(rows: Vec<(String, Option<i64>)>) -> Self {
        let mut marks = Self::default();
        for (thread, seq) in rows {
            let seq = seq.unwrap_or(0);
            if thread.is_empty() {
                marks.unthreaded = seq;
            } else {
                marks.threads.insert(thread, seq);
            }
        }
        marks
    }
}

/// What the rules could say of an event knowing only its type, state key
/// and sender: `false` when no rule that notifies can be the first to match
/// it, whatever its content, so it need not be loaded to be evaluated.
///
/// Rules are walked in priority order. A condition on `type`, `state_key`,
/// `sender` or `room_id` with a literal pattern is decided here (ruma's glob
/// matching is case-insensitive, so the comparison is too); every other
/// condition (the content, member counts, power, display names) is unknown.
/// A rule that surely matches ends the walk with its own answer; one that
/// may match and notifies means the event must be evaluated; one that may
/// match and does not notify is passed (if it matched, nothing notifies).
pub fn may_notify(rules: &Ruleset, room_id: &str, shape: &Shape<'_>) -> bool {
    for rule in rules.iter() {
        if !rule.enabled() {
            continue;
        }
        let matches = match rule {
            AnyPushRuleRef::Override(r) | AnyPushRuleRef::Underride(r) => {
                all_known(&r.conditions, room_id, shape)
            }
            AnyPushRuleRef::Room(r) => Some(r.rule_id.as_str() == room_id),
            AnyPushRuleRef::Sender(r) => shape.sender.map(|s| r.rule_id.as_str() == s),
            // Content rules (and any kind added later) look at the content.
            _ => None,
        };
        match matches {
            Some(false) => {}
            Some(true) => return rule.triggers_notification(),
            None if rule.triggers_notification() => return true,
            None => {}
        }
    }
    false
}

/// The parts of an event the rules can be asked about without loading it.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// `type`.
    pub kind: &'a str,
    /// `state_key`.
    pub state_key: StateKey<'a>,
    /// `sender` (`None`: any sender).
    pub sender: Option<&'a str>,
}

/// A shape's state key.
#[derive(Debug, Clone, Copy)]
pub enum StateKey<'a> {
    /// Not a state event.
    None,
    /// This key.
    Is(&'a str),
    /// Any key but this one (others' member events, say).
    AnyBut(&'a str),
}

/// Whether all of `conditions` hold: `None` when some cannot be told from
/// the shape and none is surely false.
fn all_known(conditions: &[PushCondition], room_id: &str, shape: &Shape<'_>) -> Option<bool> {
    let mut all = Some(true);
    for condition in conditions {
        match condition_known(condition, room_id, shape) {
            Some(false) => return Some(false),
            Some(true) => {}
            None => all = None,
        }
    }
    all
}

/// One condition decided from the shape, when it can be.
fn condition_known(condition: &PushCondition, room_id: &str, shape: &Shape<'_>) -> Option<bool> {
    // Whether the field `key` equals `want` (`eq` compares), when known.
    let equals = |key: &str, want: &str, eq: fn(&str, &str) -> bool| -> Option<bool> {
        match key {
            "type" => Some(eq(shape.kind, want)),
            "room_id" => Some(eq(room_id, want)),
            "sender" => shape.sender.map(|s| eq(s, want)),
            "state_key" => match shape.state_key {
                // An absent field matches nothing.
                StateKey::None => Some(false),
                StateKey::Is(k) => Some(eq(k, want)),
                StateKey::AnyBut(k) => eq(k, want).then_some(false),
            },
            _ => None,
        }
    };
    match condition {
        // ruma's glob matching is case-insensitive; a glob is not decided here.
        PushCondition::EventMatch(d) if !d.pattern.contains(['*', '?']) => {
            equals(&d.key, &d.pattern, |a, b| a.to_lowercase() == b.to_lowercase())
        }
        PushCondition::EventPropertyIs(d) => match &d.value {
            ScalarJsonValue::String(want) => equals(&d.key, want, |a, b| a == b),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the rules leave every member event about someone other than
/// `me` silent, whoever sends it: then counting need not even look at them.
pub fn others_membership_silent(rules: &Ruleset, room_id: &str, me: &str) -> bool {
    let shape = Shape { kind: "m.room.member", state_key: StateKey::AnyBut(me), sender: None };
    !may_notify(rules, room_id, &shape)
}

/// The readable events from others in `(after, upto]` that may notify
/// ([`may_notify`]), newest first, with what the rules say of each; at most
/// `limit` events of the range are looked at (see [`each_evaluated`]).
#[allow(clippy::too_many_arguments)]
pub async fn evaluate_range(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    rules: &Arc<Ruleset>,
    after: i64,
    upto: i64,
    limit: usize,
) -> Result<Vec<(Loaded, Outcome)>> {
    let mut out = Vec::new();
    let window = (after, upto, limit);
    each_evaluated(state, view, access, me, rules, window, &mut |loaded, outcome| {
        out.push((loaded, outcome))
    })
    .await?;
    Ok(out)
}

/// Unread candidates are read this many at a time.
const PAGE: i64 = 500;

/// Hands `visit` each readable event from others in `(after, upto]` (the
/// `window`, with at most `limit` events of it looked at) that may notify,
/// newest first, with what the rules say of it. Events are read a page at a
/// time, leaving out (in SQL) the user's own and, when the rules leave them
/// silent, others' member events; of the rest only those that may notify
/// are evaluated. In a room of joins and leaves nothing is read at all.
pub async fn each_evaluated(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    rules: &Arc<Ruleset>,
    (after, upto, limit): (i64, i64, usize),
    visit: &mut (dyn FnMut(Loaded, Outcome) + Send),
) -> Result<()> {
    if after >= upto {
        return Ok(());
    }
    let room_id = view.room.room_id.as_str();
    let mut left = i64::try_from(limit).unwrap_or(i64::MAX);
    let me_str = me.user_id.as_str();
    let skip = events::CandidateSkip {
        sender: me_str,
        others_membership: others_membership_silent(rules, room_id, me_str),
    };
    let mut evaluator = None;
    for (lo, mut hi) in history::readable_spans(access, Dir::Backward, upto, Some(after)) {
        while hi >= lo && left > 0 {
            let page = left.min(PAGE);
            let rows = events::unread_candidates(&state.db, room_id, lo, hi, &skip, page).await?;
            let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
            left -= n;
            hi = rows.last().map_or(lo, |r| r.seq) - 1;
            for stored in rows {
                let loaded = read::load(state, stored).await?;
                let kind = loaded.pdu.kind.to_string();
                let state_key = loaded.pdu.state_key.as_deref().map_or(StateKey::None, StateKey::Is);
                let shape = Shape { kind: &kind, state_key, sender: Some(loaded.pdu.sender.as_str()) };
                if !may_notify(rules, room_id, &shape) {
                    continue;
                }
                let evaluator = match &mut evaluator {
                    Some(e) => e,
                    None => evaluator
                        .insert(Evaluator::with_rules(state, view, &me.user_id, rules.clone()).await?),
                };
                let event = read::format(view, &loaded, me, &access.history);
                let outcome = evaluator.evaluate(&event).await;
                visit(loaded, outcome);
            }
            if n < page {
                break;
            }
        }
    }
    Ok(())
}

/// Unread notifying events of one room: in all, and per thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Notifying events, every timeline.
    pub notify: u64,
    /// Highlighting ones among them.
    pub highlight: u64,
    /// `(notify, highlight)` per thread root, threads with any only.
    pub threads: std::collections::BTreeMap<String, (u64, u64)>,
}

impl Counts {
    /// The main timeline's share (events in no thread; a root is one).
    pub fn main(&self) -> (u64, u64) {
        let (n, h) = self.threads.values().fold((0, 0), |(n, h), (tn, th)| (n + tn, h + th));
        (self.notify - n, self.highlight - h)
    }
}

/// Sends the notifying events among seqs `lo..=hi` of a room to the HTTP
/// pushers of `holders` (the users whose ranges hold them), per the Push
/// Gateway API, with retries. Runs after the commit, off the send path.
pub async fn push_new_events(state: AppState, room_id: String, lo: i64, hi: i64, holders: Vec<String>) {
    let users: Vec<String> = {
        let with_pushers = state.pusher_users.read().unwrap_or_else(|e| e.into_inner());
        holders.into_iter().filter(|u| with_pushers.contains(u)).collect()
    };
    for user in users {
        if let Err(e) = push_for_user(&state, &room_id, lo, hi, &user).await {
            tracing::warn!(%user, %room_id, "push failed: {e}");
        }
    }
}

async fn push_for_user(state: &AppState, room_id: &str, lo: i64, hi: i64, user: &str) -> Result<()> {
    let user_id = ruma::OwnedUserId::try_from(user).map_err(|e| Error::Internal(e.to_string()))?;
    let pushers: Vec<Value> = account_data::pushers(&state.db, user)
        .await?
        .iter()
        .filter_map(|p| serde_json::from_str::<Value>(p).ok())
        .filter(|p| p["kind"] == "http" && p["data"]["url"].is_string())
        .collect();
    if pushers.is_empty() {
        return Ok(());
    }
    let rid = OwnedRoomId::try_from(room_id).map_err(|e| Error::Internal(e.to_string()))?;
    let view = read::open(state, &rid).await?;
    let access = read::access(state, &view, &user_id).await?;
    let me = Requester { user_id: user_id.clone(), device_id: "PUSHER".into(), is_admin: false };
    let rules = rules_of(state, &user_id).await?;
    let events = evaluate_range(state, &view, &access, &me, &rules, lo - 1, hi, 100).await?;
    let marks = read_marks(state, room_id, &user_id).await?;
    let unread = counts(state, &view, &access, &me, &rules, marks, hi).await?.notify;
    for (loaded, outcome) in events.into_iter().rev() {
        if !outcome.notify {
            continue;
        }
        let event = read::format(&view, &loaded, &me, &access.history);
        for pusher in &pushers {
            let body = notification_body(&event, pusher, unread, outcome);
            let url = pusher["data"]["url"].as_str().unwrap_or_default().to_owned();
            let pushkey = pusher["pushkey"].as_str().unwrap_or_default().to_owned();
            let app_id = pusher["app_id"].as_str().unwrap_or_default().to_owned();
            // Gateways that never answer hold a slot each, not the server:
            // with every slot taken the push is dropped (pushes are best
            // effort), not queued without bound.
            let Ok(slot) = state.push_slots.clone().try_acquire_owned() else {
                tracing::warn!(%user, "every push slot is busy: push dropped");
                continue;
            };
            let state = state.clone();
            let user = user.to_owned();
            tokio::spawn(async move {
                let _slot = slot;
                deliver(&state, &user, &app_id, &pushkey, &url, &body).await
            });
        }
    }
    Ok(())
}

/// The Push Gateway API body for one event and one pusher.
fn notification_body(event: &Value, pusher: &Value, unread: u64, outcome: Outcome) -> Value {
    let mut data = pusher["data"].clone();
    if let Some(map) = data.as_object_mut() {
        map.remove("url");
    }
    let mut tweaks = serde_json::Map::new();
    if outcome.highlight {
        tweaks.insert("highlight".into(), Value::Bool(true));
    }
    let device = serde_json::json!({
        "app_id": pusher["app_id"],
        "pushkey": pusher["pushkey"],
        "data": data,
        "tweaks": tweaks,
    });
    let mut notification = serde_json::json!({
        "event_id": event["event_id"],
        "room_id": event["room_id"],
        "counts": { "unread": unread },
        "prio": if outcome.highlight { "high" } else { "low" },
        "devices": [device],
    });
    if pusher["data"]["format"] != "event_id_only" {
        notification["type"] = event["type"].clone();
        notification["sender"] = event["sender"].clone();
        notification["content"] = event["content"].clone();
    }
    serde_json::json!({ "notification": notification })
}

/// The most pushers one user may have (Synapse has no limit; each one is a
/// request per notifying event).
pub const MAX_PUSHERS_PER_USER: i64 = 20;

/// The longest push gateway reply read; a longer one is abandoned.
const MAX_GATEWAY_REPLY_BYTES: usize = 64 * 1024;

/// The one path of the Push Gateway API's notify endpoint.
const NOTIFY_PATH: &str = "/_matrix/push/v1/notify";

/// Adds (or replaces) a pusher for the device whose token sets it: it lives
/// as long as that token. An HTTP pusher's `url` must be an http(s) URL of a
/// gateway's notify endpoint; a user has at most [`MAX_PUSHERS_PER_USER`].
pub async fn add_pusher(
    state: &AppState,
    me: &Requester,
    pusher: &ruma::api::client::push::Pusher,
    append: bool,
) -> Result<()> {
    if let ruma::api::client::push::PusherKind::Http(http) = &pusher.kind {
        check_gateway_url(&http.url)?;
    }
    let text = serde_json::to_string(pusher).map_err(|e| Error::Internal(e.to_string()))?;
    let ids = &pusher.ids;
    let user = me.user_id.as_str();
    let new = account_data::NewPusher {
        user_id: user,
        device_id: me.device_id.as_str(),
        app_id: &ids.app_id,
        pushkey: &ids.pushkey,
        pusher: &text,
        append,
    };
    if !account_data::add_pusher(&state.db, new, MAX_PUSHERS_PER_USER).await? {
        return Err(Error::Forbidden(format!(
            "Too many pushers: a user may have at most {MAX_PUSHERS_PER_USER}"
        )));
    }
    state.pusher_users.write().unwrap_or_else(|e| e.into_inner()).insert(user.to_owned());
    Ok(())
}

/// An HTTP pusher's `data.url`: http or https, a host, the notify path.
fn check_gateway_url(url: &str) -> Result<()> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| Error::InvalidParam(format!("'url' in data is not a valid URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
        return Err(Error::InvalidParam("'url' in data must be an http or https URL with a host".into()));
    }
    if parsed.path() != NOTIFY_PATH {
        return Err(Error::InvalidParam(format!("'url' in data must have the path {NOTIFY_PATH}")));
    }
    Ok(())
}

/// Whether a failed request was refused by the outbound address policy
/// (for a name, the refusal comes back from inside reqwest).
fn refused_by_policy(error: &OutboundError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if matches!(
            e.downcast_ref::<OutboundError>(),
            Some(OutboundError::Refused(_) | OutboundError::BadUrl(_))
        ) {
            return true;
        }
        source = e.source();
    }
    false
}

/// Push deliveries in flight at once; more are dropped.
pub const MAX_PUSHES_IN_FLIGHT: usize = 64;

/// POSTs to a push gateway: up to five tries with doubling waits; a gateway
/// that rejects the pushkey gets the pusher removed, as the spec asks. A
/// destination the outbound policy refuses, a redirect (never followed), a
/// 4xx other than 429 or a reply over [`MAX_GATEWAY_REPLY_BYTES`] ends it.
async fn deliver(state: &AppState, user: &str, app_id: &str, pushkey: &str, url: &str, body: &Value) {
    let mut wait = std::time::Duration::from_millis(500);
    for attempt in 1..=5 {
        let sent = match state.outbound.post(url) {
            Ok(request) => request.json(body).send().await.map_err(OutboundError::from),
            Err(e) => Err(e),
        };
        match sent {
            Ok(response) if response.status().is_success() => {
                let reply = match outbound::read_capped(response, MAX_GATEWAY_REPLY_BYTES).await {
                    Ok(bytes) => serde_json::from_slice::<Value>(&bytes).unwrap_or_default(),
                    Err(e) => {
                        tracing::warn!(%url, "push gateway reply not read: {e}");
                        return;
                    }
                };
                let rejected = reply["rejected"].as_array().is_some_and(|r| r.iter().any(|k| k == pushkey));
                if rejected
                    && let Err(e) = account_data::delete_pusher(&state.db, user, app_id, pushkey).await
                {
                    tracing::warn!("removing a rejected pusher failed: {e}");
                }
                return;
            }
            Ok(response) if response.status().is_redirection() => {
                tracing::warn!(%url, status = %response.status(), "push gateway answered with a redirect, not followed");
                return;
            }
            Ok(response) if response.status().is_client_error() && response.status().as_u16() != 429 => {
                tracing::warn!(%url, status = %response.status(), "push gateway refused the notification");
                return;
            }
            Ok(response) => {
                tracing::debug!(%url, attempt, status = %response.status(), "push gateway error, retrying")
            }
            Err(e) if refused_by_policy(&e) => {
                tracing::warn!(%url, "push gateway not contacted: {e}");
                return;
            }
            Err(e) => tracing::debug!(%url, attempt, "push gateway unreachable, retrying: {e}"),
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
    tracing::warn!(%url, "push gateway unreachable, notification dropped after 5 tries");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::tally::default_ruleset;

    const ROOM: &str = "!r:example.org";

    fn shape<'a>(kind: &'a str, state_key: Option<&'a str>, sender: &'a str) -> Shape<'a> {
        Shape { kind, state_key: state_key.map_or(StateKey::None, StateKey::Is), sender: Some(sender) }
    }

    /// The defaults with `rule` as the user's first override.
    fn ahead_of_defaults(user: &UserId, rule: Value) -> Ruleset {
        rules_with(user, |v| v["override"].as_array_mut().unwrap().insert(0, rule))
    }

    fn rules_with(user: &UserId, edit: impl FnOnce(&mut Value)) -> Ruleset {
        let mut value = serde_json::to_value(default_ruleset(user)).unwrap();
        edit(&mut value);
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_defaults_leave_others_membership_unloaded() {
        let me = ruma::user_id!("@me:example.org");
        let rules = default_ruleset(me);
        let other = "@other:example.org";
        // Another member's join, leave or profile change: `.m.rule.member_event`.
        assert!(!may_notify(&rules, ROOM, &shape("m.room.member", Some(other), other)));
        assert!(!may_notify(&rules, ROOM, &shape("M.Room.Member", Some(other), other)));
        // A reaction may carry `m.mentions`: the mention rules come before `.m.rule.reaction`.
        assert!(may_notify(&rules, ROOM, &shape("m.reaction", None, other)));
        // An invite for me may notify; so may any message (mentions, content rules).
        assert!(may_notify(&rules, ROOM, &shape("m.room.member", Some(me.as_str()), other)));
        assert!(may_notify(&rules, ROOM, &shape("m.room.message", None, other)));
        assert!(may_notify(&rules, ROOM, &shape("m.room.encrypted", None, other)));
        // A type no rule names still goes through the content rules.
        assert!(may_notify(&rules, ROOM, &shape("org.example.custom", None, other)));
    }

    #[test]
    fn user_rules_are_honoured_in_order() {
        let me = ruma::user_id!("@me:example.org");
        let other = "@other:example.org";
        let member = shape("m.room.member", Some(other), other);
        // An override of the user's own ahead of the defaults: joins notify.
        let joins = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "joins", "default": false, "enabled": true,
                "conditions": [{ "kind": "event_match", "key": "type", "pattern": "m.room.member" }],
                "actions": ["notify"],
            }),
        );
        assert!(may_notify(&joins, ROOM, &member));
        // The same rule with a content condition: it may match.
        let content = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "bans", "default": false, "enabled": true,
                "conditions": [
                    { "kind": "event_match", "key": "type", "pattern": "m.room.member" },
                    { "kind": "event_match", "key": "content.membership", "pattern": "ban" },
                ],
                "actions": ["notify"],
            }),
        );
        assert!(may_notify(&content, ROOM, &member));
        // A glob on the type is not decided here.
        let glob = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "glob", "default": false, "enabled": true,
                "conditions": [{ "kind": "event_match", "key": "type", "pattern": "m.room.mem*" }],
                "actions": ["notify"],
            }),
        );
        assert!(may_notify(&glob, ROOM, &member));
        // The master rule on: nothing notifies, nothing is loaded.
        let master = rules_with(me, |v| {
            for rule in v["override"].as_array_mut().unwrap() {
                if rule["rule_id"] == ".m.rule.master" {
                    rule["enabled"] = true.into();
                }
            }
        });
        assert!(!may_notify(&master, ROOM, &shape("m.room.message", None, other)));
        // A room rule and a sender rule decide by room and sender.
        let muted = rules_with(me, |v| {
            v["room"] =
                serde_json::json!([{ "rule_id": ROOM, "default": false, "enabled": true, "actions": [] }]);
            v["sender"] = serde_json::json!([{
                "rule_id": "@loud:example.org", "default": false, "enabled": true, "actions": ["notify"],
            }]);
        });
        // A message can still hit a mention override before the room rule.
        assert!(may_notify(&muted, ROOM, &shape("m.room.message", None, other)));
        // An unknown type in the muted room: no override notifies, the content
        // rule may, so it is evaluated; in another room the sender rule decides.
        let loud = shape("org.example.custom", None, "@loud:example.org");
        assert!(may_notify(&muted, "!other:example.org", &loud));
        // A member event surely matches `.m.rule.member_event` first.
        assert!(!may_notify(&muted, ROOM, &shape("m.room.member", Some(other), "@loud:example.org")));
    }

    #[test]
    fn others_membership_is_silent_unless_a_rule_may_say_otherwise() {
        let me = ruma::user_id!("@me:example.org");
        assert!(others_membership_silent(&default_ruleset(me), ROOM, me.as_str()));
        // Sender rules come after the overrides, where `.m.rule.member_event`
        // has already decided.
        let loud = rules_with(me, |v| {
            v["sender"] = serde_json::json!([{
                "rule_id": "@loud:example.org", "default": false, "enabled": true, "actions": ["notify"],
            }]);
        });
        assert!(others_membership_silent(&loud, ROOM, me.as_str()));
        // A rule about one particular member's events, ahead of the defaults.
        let watched = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "watch", "default": false, "enabled": true,
                "conditions": [
                    { "kind": "event_match", "key": "type", "pattern": "m.room.member" },
                    { "kind": "event_match", "key": "state_key", "pattern": "@boss:example.org" },
                ],
                "actions": ["notify"],
            }),
        );
        assert!(!others_membership_silent(&watched, ROOM, me.as_str()));
        // The same rule about me only: others' member events stay silent.
        let mine = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "mine", "default": false, "enabled": true,
                "conditions": [
                    { "kind": "event_match", "key": "type", "pattern": "m.room.member" },
                    { "kind": "event_match", "key": "state_key", "pattern": "@ME:example.org" },
                ],
                "actions": ["notify"],
            }),
        );
        assert!(others_membership_silent(&mine, ROOM, me.as_str()));
        // A sender condition with no sender known: the rule may match.
        let by_sender = ahead_of_defaults(
            me,
            serde_json::json!({
                "rule_id": "by", "default": false, "enabled": true,
                "conditions": [{ "kind": "event_match", "key": "sender", "pattern": "@boss:example.org" }],
                "actions": ["notify"],
            }),
        );
        assert!(!others_membership_silent(&by_sender, ROOM, me.as_str()));
    }
}
