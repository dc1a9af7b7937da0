//! `unread_notifications` and `unread_thread_notifications`, exact at any
//! number of unread events (docs/unread-counts.md).
//!
//! A reader whose rules say what the spec's default rules say in the room
//! (most readers, in most rooms) takes their counts from the running totals
//! the write path keeps per thread (`storage::tally`): the totals at the top
//! of their unread window less those at its bottom, less their own events,
//! with the few events that may say something else to them (those naming
//! them, those the legacy name rules read, redacted ones) evaluated one by
//! one. One statement per room, whatever the number of unread events, and
//! for a woken sync only the new stretch.
//! Other readers, events from before the tally, and windows the reader may
//! not read whole are evaluated event by event, a page at a time.

use std::collections::{BTreeMap, HashMap};
use std::ops::Not as _;
use std::sync::{Arc, Mutex};

use ruma::UserId;
use ruma::push::{AnyPushRuleRef, PushCondition, Ruleset};
use serde_json::Value;

use super::{Counts, Evaluator, Outcome, ReadMarks};
use crate::account::Requester;
use crate::error::Result;
use crate::room::history::{self, Dir};
use crate::room::read::{self, Access, Loaded, RoomView};
use crate::state::AppState;
use crate::storage::{events, tally};

/// What is kept between requests: each room's tally floor (fixed once
/// written), what each user's rules are found to be, and the counts of
/// readers counted event by event (extended by what is new).
#[derive(Debug, Default)]
pub struct CountCache {
    floors: Mutex<HashMap<String, i64>>,
    verdicts: Mutex<HashMap<String, Judged>>,
    evaluated: Mutex<HashMap<(String, String), Cached>>,
    tallied: Mutex<HashMap<(String, String), Tallied>>,
}

/// Entries a map of [`CountCache`] holds before it is emptied and refilled.
const MAX_ENTRIES: usize = 10_000;

fn remember<K: std::hash::Hash + Eq, V>(map: &Mutex<HashMap<K, V>>, key: K, value: V) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, value);
}

#[derive(Debug, Clone)]
struct Cached {
    rules: Arc<Ruleset>,
    marks: ReadMarks,
    after: i64,
    upto: i64,
    counts: Counts,
}

/// A user's rules and what they were found to be.
type Judged = (Arc<Ruleset>, Arc<Verdict>);

/// What a user's rules are, as far as counting goes.
#[derive(Debug, Default)]
struct Verdict {
    /// Less the rules bound to one room, they say of every event what the
    /// default rules say (actions other than notify and highlight aside).
    default_elsewhere: bool,
    /// The rooms some rule is bound to.
    bound: std::collections::HashSet<String>,
}

/// Who counts, where, and with what: what every step of a count takes.
struct Reader<'a> {
    state: &'a AppState,
    view: &'a RoomView,
    access: &'a Access,
    me: &'a Requester,
    rules: &'a Arc<Ruleset>,
    marks: &'a ReadMarks,
}

/// `unread_notifications` (and per thread, `unread_thread_notifications`)
/// for one room: notifying events from others in the user's current stay not
/// covered by their read marks, up to seq `upto`.
pub async fn counts(
    state: &AppState,
    view: &RoomView,
    access: &Access,
    me: &Requester,
    rules: &Arc<Ruleset>,
    marks: ReadMarks,
    upto: i64,
) -> Result<Counts> {
    let room_id = view.room.room_id.as_str();
    // Nothing from before the user's current stay is unread to them: what
    // was sent before they joined never notified them.
    let joined = access.stays.iter().filter(|r| r.kind == "join" && r.max_seq.is_none()).map(|r| r.min_seq);
    let after = joined.max().unwrap_or(0).max(marks.unthreaded);
    if after >= upto {
        return Ok(Counts::default());
    }
    let floor = floor(state, room_id).await?;
    let tallied_from = after.max(floor);
    let reader = Reader { state, view, access, me, rules, marks: &marks };
    if upto > tallied_from && follows_defaults(state, rules, &me.user_id, room_id) {
        let spans = history::readable_spans(access, Dir::Backward, upto, Some(tallied_from));
        if whole(&spans, tallied_from, upto) {
            let masks = name_masks(state, view, &me.user_id).await?;
            let mut acc = tallied(&reader, (tallied_from, upto), masks).await?;
            if after < floor {
                // Kept between requests: it changes only with the marks.
                acc.add_counts(&evaluated(&reader, (after, floor.min(upto))).await?);
            }
            tracing::debug!(room_id, after, upto, "unread counts from the totals");
            return Ok(acc.into_counts());
        }
    }
    tracing::debug!(room_id, after, upto, "unread counts event by event");
    evaluated(&reader, (after, upto)).await
}

/// [`from_totals`] over `(after, upto]`, extending the reader's counts of
/// an earlier request by what came since when nothing else moved: the same
/// marks (none past the earlier top), window bottom and names, and no
/// redaction since. A woken sync so reads only the new stretch.
async fn tallied(r: &Reader<'_>, (after, upto): (i64, i64), masks: (i64, i64)) -> Result<Acc> {
    let marks = r.marks;
    let key = (r.me.user_id.to_string(), r.view.room.room_id.clone());
    let earlier = r.state.counts.tallied.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    let mut acc = Acc::default();
    let extended = match earlier {
        Some(c)
            if c.marks == *marks
                && c.after == after
                && c.masks == masks
                && c.upto <= upto
                && marks.threads.values().all(|&m| m <= c.upto) =>
        {
            acc = c.acc;
            from_totals(r, (c.upto, upto), masks, &mut acc).await?.not()
        }
        _ => false,
    };
    if !extended {
        acc = Acc::default();
        from_totals(r, (after, upto), masks, &mut acc).await?;
    }
    let entry = Tallied { marks: marks.clone(), after, upto, masks, acc: acc.clone() };
    remember(&r.state.counts.tallied, key, entry);
    Ok(acc)
}

/// A reader's counts from the totals, as [`tallied`] keeps them.
#[derive(Debug, Clone)]
struct Tallied {
    marks: ReadMarks,
    after: i64,
    upto: i64,
    masks: (i64, i64),
    acc: Acc,
}

/// Whether `spans` (readable, newest first) are exactly `(after, upto]`.
fn whole(spans: &[(i64, i64)], after: i64, upto: i64) -> bool {
    let mut top = upto;
    for &(lo, hi) in spans {
        if hi != top {
            return false;
        }
        top = lo - 1;
    }
    top == after
}

async fn floor(state: &AppState, room_id: &str) -> Result<i64> {
    if let Some(seq) = state.counts.floors.lock().unwrap_or_else(|e| e.into_inner()).get(room_id) {
        return Ok(*seq);
    }
    let seq = tally::floor(&state.db, room_id).await?;
    remember(&state.counts.floors, room_id.to_owned(), seq);
    Ok(seq)
}

/// Counts in the making: `(notify, highlight)` per thread (`""`: the main
/// timeline), signed while corrections are applied.
#[derive(Debug, Default, Clone)]
struct Acc(BTreeMap<String, (i64, i64)>);

impl Acc {
    fn add(&mut self, thread: &str, notify: i64, highlight: i64) {
        let entry = self.0.entry(thread.to_owned()).or_default();
        entry.0 += notify;
        entry.1 += highlight;
    }

    fn into_counts(self) -> Counts {
        let mut counts = Counts::default();
        for (thread, (n, h)) in self.0 {
            let (n, h) = (u64::try_from(n).unwrap_or(0), u64::try_from(h).unwrap_or(0));
            counts.notify += n;
            counts.highlight += h;
            if !thread.is_empty() && n > 0 {
                counts.threads.insert(thread, (n, h));
            }
        }
        counts
    }
}

/// Where a thread's unread window starts: past `after` and past the user's
/// threaded receipt for it.
fn thread_after(marks: &ReadMarks, thread: &str, after: i64) -> i64 {
    let key = if thread.is_empty() { "main" } else { thread };
    marks.threads.get(key).copied().unwrap_or(0).max(after)
}

/// The counts of `(after, upto]`, all readable and tallied, for a reader
/// whose rules follow the defaults there and whose names have the signature
/// masks `masks`; answers whether a redaction lies in the window (counts
/// taken before it may have moved).
async fn from_totals(
    r: &Reader<'_>,
    (after, upto): (i64, i64),
    masks: (i64, i64),
    acc: &mut Acc,
) -> Result<bool> {
    let (state, marks) = (r.state, r.marks);
    let room_id = r.view.room.room_id.as_str();
    let window = tally::window(&state.db, room_id, r.me.user_id.as_str(), (after, upto), masks).await?;
    for totals in window.threads {
        let from = thread_after(marks, &totals.thread, after);
        if from >= upto {
            continue;
        }
        let below = if from > after {
            tally::totals_at(&state.db, room_id, &totals.thread, from).await?
        } else {
            totals.below
        };
        acc.add(&totals.thread, totals.top.0 - below.0, totals.top.1 - below.1);
    }
    let in_window = |thread: &str, seq: i64| seq > thread_after(marks, thread, after);
    let mut redaction = false;
    let mut recheck = Vec::new();
    // Legacy rows come only where their signature may hold the reader's
    // names: one that cannot says to them what it says to anyone it does
    // not name, which the totals have right.
    for special in &window.specials {
        if special.kind == tally::SpecialKind::Redaction {
            redaction = true;
            continue;
        }
        if !in_window(&special.thread, special.seq) {
            // Neither counted in the totals taken nor to be counted...
            if special.kind == tally::SpecialKind::Redacted {
                // ... unless, redacted, it has left its thread for the main timeline.
                recheck.push(special.seq);
            }
            continue;
        }
        // What the totals counted of it comes out...
        let (n, h) = special.unnamed;
        acc.add(&special.thread, -i64::from(n), -i64::from(h));
        // ... and what it is to this reader goes in.
        match special.kind {
            tally::SpecialKind::Own | tally::SpecialKind::Redaction => {}
            tally::SpecialKind::Names((n, h)) => acc.add(&special.thread, i64::from(n), i64::from(h)),
            tally::SpecialKind::Legacy(_) | tally::SpecialKind::Redacted => recheck.push(special.seq),
        }
    }
    let mut evaluator = None;
    for stored in events::at_seqs(&state.db, room_id, &recheck).await? {
        let seq = stored.seq;
        let loaded = read::load(state, stored).await?;
        let outcome = evaluate(r, &mut evaluator, &loaded).await?;
        let thread = crate::room::relations::thread_of(&loaded).unwrap_or_default();
        if outcome.notify && in_window(&thread, seq) {
            acc.add(&thread, 1, i64::from(outcome.highlight));
        }
    }
    Ok(redaction)
}

/// The signature masks (`room::tally::mask`) of the reader's display name
/// in the room (their localpart when they have none) and of their localpart:
/// the names the legacy rules look for.
async fn name_masks(state: &AppState, view: &RoomView, user: &UserId) -> Result<(i64, i64)> {
    let localpart = user.localpart();
    let name = read::display_name(state, view, user).await?;
    let mask = crate::room::tally::mask;
    Ok((mask(name.as_deref().unwrap_or(localpart)), mask(localpart)))
}

/// What `rules` say of one loaded event, building the evaluator on first use.
async fn evaluate(r: &Reader<'_>, evaluator: &mut Option<Evaluator>, loaded: &Loaded) -> Result<Outcome> {
    let evaluator = match evaluator {
        Some(e) => e,
        None => {
            evaluator.insert(Evaluator::with_rules(r.state, r.view, &r.me.user_id, r.rules.clone()).await?)
        }
    };
    let event = read::format(r.view, loaded, r.me, &r.access.history);
    Ok(evaluator.evaluate(&event).await)
}

/// Counts a reader's unread window event by event: the cache of their last
/// answer is extended when only new events came since.
async fn evaluated(r: &Reader<'_>, (after, upto): (i64, i64)) -> Result<Counts> {
    let key = (r.me.user_id.to_string(), r.view.room.room_id.clone());
    let cached = r.state.counts.evaluated.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    let same = |c: &Cached| c.marks == *r.marks && c.after == after && same_rules(&c.rules, r.rules);
    let counts = match cached {
        Some(c) if same(&c) && c.upto == upto => c.counts,
        Some(c) if same(&c) && c.upto < upto => {
            let mut acc = Acc::default();
            acc.add_counts(&c.counts);
            by_events(r, (c.upto, upto), &mut acc).await?;
            acc.into_counts()
        }
        _ => {
            let mut acc = Acc::default();
            by_events(r, (after, upto), &mut acc).await?;
            acc.into_counts()
        }
    };
    let entry =
        Cached { rules: r.rules.clone(), marks: r.marks.clone(), after, upto, counts: counts.clone() };
    remember(&r.state.counts.evaluated, key, entry);
    Ok(counts)
}

fn same_rules(a: &Arc<Ruleset>, b: &Arc<Ruleset>) -> bool {
    Arc::ptr_eq(a, b) || serde_json::to_value(&**a).ok() == serde_json::to_value(&**b).ok()
}

impl Acc {
    fn add_counts(&mut self, counts: &Counts) {
        let (n, h) = counts.main();
        self.add("", i64::try_from(n).unwrap_or(0), i64::try_from(h).unwrap_or(0));
        for (thread, (n, h)) in &counts.threads {
            self.add(thread, i64::try_from(*n).unwrap_or(0), i64::try_from(*h).unwrap_or(0));
        }
    }
}

/// Adds the unread notifying events of `(after, upto]` the reader may read,
/// each evaluated ([`super::each_evaluated`], no limit).
async fn by_events(r: &Reader<'_>, (after, upto): (i64, i64), acc: &mut Acc) -> Result<()> {
    let window = (after, upto, usize::MAX);
    super::each_evaluated(r.state, r.view, r.access, r.me, r.rules, window, &mut |loaded, outcome| {
        let thread = crate::room::relations::thread_of(&loaded);
        if outcome.notify && !r.marks.is_read(loaded.stored.seq, thread.as_deref()) {
            acc.add(thread.as_deref().unwrap_or(""), 1, i64::from(outcome.highlight));
        }
    })
    .await
}

/// Whether the running totals answer for `user` in `room_id`: their rules,
/// less those bound to other rooms, are the defaults (as far as notifying
/// and highlighting go), and none is bound to this room.
fn follows_defaults(state: &AppState, rules: &Arc<Ruleset>, user: &UserId, room_id: &str) -> bool {
    if Arc::ptr_eq(rules, &state.push_defaults.get(user)) {
        return true;
    }
    let known = state.counts.verdicts.lock().unwrap_or_else(|e| e.into_inner()).get(user.as_str()).cloned();
    let verdict = match known {
        Some((seen, verdict)) if Arc::ptr_eq(&seen, rules) => verdict,
        _ => {
            let verdict = Arc::new(judge(rules, &state.push_defaults.get(user)));
            remember(&state.counts.verdicts, user.to_string(), (rules.clone(), verdict.clone()));
            verdict
        }
    };
    // A room_id condition matches without regard to case, as ruma does.
    verdict.default_elsewhere && !verdict.bound.contains(&room_id.to_lowercase())
}

/// Compares `rules` with `defaults`, rule by rule in order, by what decides
/// counts (kind, id, enabled, conditions or pattern, notify, highlight),
/// leaving aside the rules bound to one room.
fn judge(rules: &Ruleset, defaults: &Ruleset) -> Verdict {
    let mut bound = std::collections::HashSet::new();
    let shape = |ruleset: &Ruleset, bound: &mut std::collections::HashSet<String>| -> Vec<Value> {
        ruleset
            .iter()
            .filter(|rule| match room_bound(rule) {
                Some(room) => {
                    bound.insert(room);
                    false
                }
                None => true,
            })
            .map(|rule| {
                let actions = rule.actions();
                let notify = actions.iter().any(|a| matches!(a, ruma::push::Action::Notify));
                let highlight = actions.iter().any(ruma::push::Action::is_highlight);
                let (kind, conditions, pattern) = match rule {
                    AnyPushRuleRef::Override(r) => {
                        ("override", serde_json::to_value(&r.conditions).ok(), None)
                    }
                    AnyPushRuleRef::Underride(r) => {
                        ("underride", serde_json::to_value(&r.conditions).ok(), None)
                    }
                    AnyPushRuleRef::Content(r) => ("content", None, Some(r.pattern.clone())),
                    AnyPushRuleRef::Room(_) => ("room", None, None),
                    AnyPushRuleRef::Sender(_) => ("sender", None, None),
                    _ => ("other", None, None),
                };
                serde_json::json!([
                    kind,
                    rule.rule_id(),
                    rule.enabled(),
                    conditions,
                    pattern,
                    notify,
                    highlight
                ])
            })
            .collect()
    };
    let mine = shape(rules, &mut bound);
    let theirs = shape(defaults, &mut std::collections::HashSet::new());
    Verdict { default_elsewhere: mine == theirs, bound }
}

/// The room a rule is bound to: a room rule's, or an override or underride
/// with a literal `room_id` condition.
fn room_bound(rule: &AnyPushRuleRef<'_>) -> Option<String> {
    match rule {
        AnyPushRuleRef::Room(r) => Some(r.rule_id.as_str().to_lowercase()),
        AnyPushRuleRef::Override(r) | AnyPushRuleRef::Underride(r) => {
            r.conditions.iter().find_map(|c| match c {
                PushCondition::EventMatch(d) if d.key == "room_id" && !d.pattern.contains(['*', '?']) => {
                    Some(d.pattern.to_lowercase())
                }
                _ => None,
            })
        }
        _ => None,
    }
}
