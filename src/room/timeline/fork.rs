//! Events another server placed off the room's head: on a side branch of
//! the graph (their prev events are not all of our forward extremities), or
//! joining branches again. The state before such an event is the state
//! after its prev events, resolved where they differ (the spec's check 5
//! runs against it); once it is placed, the room's current state is the
//! resolution of the states after every tip of the graph, and what that
//! changes is written at the event's position: `state_runs`, `room_state`,
//! the membership ranges of everyone whose membership moved, the room's
//! servers. `state_runs` so stays the room's state as it was after each
//! position; an event whose own state differs from it (a side branch that
//! lost, or has not yet won) keeps the difference in `fork_states`, read
//! back when it is a prev event again.

use std::collections::HashMap;

use ruma::OwnedEventId;
use ruma::events::StateEventType;
use ruma::room_version_rules::RoomVersionRules;

use super::{Appended, RoomWriter, authorize};
use crate::error::{Error, Result};
use crate::room::pdu::Pdu;
use crate::room::resolution::{self, Events, StateIds};
use crate::storage::{Backend, dag, events, outliers, state_runs};

/// A state as the line holds it after position `seq`, with an event's own
/// differences over it (`over`: `None` = absent): the state after a placed
/// event (or a soft-failed or rejected one) without reading it whole.
#[derive(Debug, Clone, PartialEq)]
struct Tip {
    seq: i64,
    over: HashMap<(StateEventType, String), Option<OwnedEventId>>,
}

/// The state before an event: a tip's (its prev events agree), or a whole
/// state (resolved from theirs, or told by its sender after a hole).
#[derive(Debug, Clone)]
enum Before {
    Tip(Tip),
    Whole(StateIds),
}

/// The state before an event off the room's head, with the events read to
/// know it.
pub(super) struct Fork {
    /// The state before the event (the spec's S(E)).
    before: Before,
    /// Its values for the keys the rules read for the event.
    view: StateIds,
    /// The events `view` names, and whatever a resolution read.
    events: Events,
}

impl Fork {
    /// The spec's check 5: the rules with the state before the event
    /// (`auth`: its auth events, loaded already); otherwise it is rejected.
    pub(super) fn check(&self, rules: &RoomVersionRules, pdu: &Pdu, auth: &Events) -> Result<()> {
        authorize(
            rules,
            pdu,
            |id| self.events.get(id).or_else(|| auth.get(id)),
            |t, k| self.view.get(&(t.clone(), k.to_owned())).and_then(|id| self.events.get(id)),
        )
        .map_err(|e| Error::Forbidden(format!("Rejected by the state before it: {e}")))
    }
}

/// A key of a state and the event holding it (`None`: absent).
type Entry = ((StateEventType, String), Option<OwnedEventId>);

/// Where `a` differs from `b`: each such key with `a`'s value (`None`: `a`
/// lacks it), in key order.
fn state_diff(a: &StateIds, b: &StateIds) -> Vec<Entry> {
    let mut diff: Vec<Entry> = a
        .iter()
        .filter(|(key, id)| b.get(*key) != Some(*id))
        .map(|(key, id)| (key.clone(), Some(id.clone())))
        .chain(b.keys().filter(|key| !a.contains_key(*key)).map(|key| (key.clone(), None)))
        .collect();
    diff.sort_unstable();
    diff
}

/// A state key as `state_runs` and `room_state` write it.
fn key_of(kind: &str, state_key: &str) -> (StateEventType, String) {
    (StateEventType::from(kind), state_key.to_owned())
}

impl RoomWriter {
    /// Whether `pdu` stands on every tip of the room's graph and on nothing
    /// else: then the state before it is the room's current state.
    pub(super) fn extends_every_tip(&self, pdu: &Pdu) -> bool {
        let mut prevs: Vec<&OwnedEventId> = pdu.prev_events.iter().collect();
        let mut tips: Vec<&OwnedEventId> = self.extremities.iter().collect();
        prevs.sort_unstable();
        prevs.dedup();
        tips.sort_unstable();
        tips.dedup();
        prevs == tips
    }

    /// The room's state after position `seq`, as `state_runs` holds it.
    async fn line_at(&mut self, seq: i64) -> Result<StateIds> {
        let room = self.room_id.to_string();
        Ok(state_runs::ids_at(self.tx.conn(), &room, seq)
            .await?
            .into_iter()
            .filter_map(|(t, k, e)| Some((key_of(&t, &k), OwnedEventId::try_from(e).ok()?)))
            .collect())
    }

    /// The state after the event `id` whose state the line holds at `seq`
    /// (placed there, or kept off the line over it): the line there, and
    /// where the event stood on a side branch, the state it saw.
    async fn tip_after(&mut self, id: &str, seq: i64) -> Result<Tip> {
        let over = state_runs::fork_state(self.tx.conn(), id)
            .await?
            .into_iter()
            .map(|(t, k, e)| (key_of(&t, &k), e.and_then(|e| OwnedEventId::try_from(e).ok())))
            .collect();
        Ok(Tip { seq, over })
    }

    /// A tip's state, read whole.
    async fn whole(&mut self, tip: &Tip) -> Result<StateIds> {
        let mut state = self.line_at(tip.seq).await?;
        for (key, value) in &tip.over {
            match value {
                Some(id) => state.insert(key.clone(), id.clone()),
                None => state.remove(key),
            };
        }
        Ok(state)
    }

    /// A tip's value for one key.
    async fn value(&mut self, tip: &Tip, key: &(StateEventType, String)) -> Result<Option<OwnedEventId>> {
        if let Some(value) = tip.over.get(key) {
            return Ok(value.clone());
        }
        let room = self.room_id.to_string();
        Ok(state_runs::id_at(self.tx.conn(), &room, &key.0.to_string(), &key.1, tip.seq)
            .await?
            .and_then(|id| OwnedEventId::try_from(id).ok()))
    }

    /// The keys where two tips' states differ, with `a`'s value for each:
    /// only the keys with rows between their positions and their own
    /// differences are looked at, so the cost follows the state changes
    /// between them, not the size of the state.
    async fn differing(&mut self, a: &Tip, b: &Tip) -> Result<Vec<Entry>> {
        let room = self.room_id.to_string();
        let (lo, hi) = (a.seq.min(b.seq), a.seq.max(b.seq));
        let mut keys: Vec<(StateEventType, String)> =
            state_runs::keys_changed_between(self.tx.conn(), &room, lo, hi)
                .await?
                .into_iter()
                .map(|(t, k)| key_of(&t, &k))
                .chain(a.over.keys().cloned())
                .chain(b.over.keys().cloned())
                .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut out = Vec::new();
        for key in keys {
            let (va, vb) = (self.value(a, &key).await?, self.value(b, &key).await?);
            if va != vb {
                out.push((key, va));
            }
        }
        Ok(out)
    }

    /// The tips of the room's graph but `except`, as tips.
    async fn other_tips(&mut self, except: &OwnedEventId) -> Result<Vec<Tip>> {
        let mut tips = Vec::new();
        for tip in self.extremities.clone().iter().filter(|t| *t != except) {
            let seq = events::by_id_tx(self.tx.conn(), tip.as_str())
                .await?
                .map(|e| e.seq)
                .ok_or_else(|| Error::Internal(format!("forward extremity {tip} is not placed")))?;
            tips.push(self.tip_after(tip.as_str(), seq).await?);
        }
        Ok(tips)
    }

    /// Reads the events among `ids` that `events` lacks (placed or outliers).
    async fn load<'a>(
        &mut self,
        events: &mut Events,
        ids: impl IntoIterator<Item = &'a OwnedEventId>,
    ) -> Result<()> {
        let wanted: Vec<&str> =
            ids.into_iter().filter(|id| !events.contains_key(*id)).map(|id| id.as_str()).collect();
        for held in outliers::held_by_ids_tx(self.tx.conn(), &wanted).await? {
            let pdu = Pdu::from_stored(&held.event_id, &held.json)?;
            events.insert(pdu.event_id.clone(), pdu);
        }
        Ok(())
    }

    /// Resolves `states`, reading into `events` every event they name and
    /// their auth chains.
    async fn resolve(
        &mut self,
        backend: Backend,
        states: &[StateIds],
        events: &mut Events,
    ) -> Result<StateIds> {
        let mut roots: Vec<&OwnedEventId> = states.iter().flat_map(|s| s.values()).collect();
        roots.sort_unstable();
        roots.dedup();
        self.load(events, roots.iter().copied()).await?;
        let seeds: Vec<&str> = roots.iter().map(|id| id.as_str()).collect();
        let chain = dag::auth_chain_ids_tx(self.tx.conn(), backend, &seeds, dag::MAX_AUTH_CHAIN).await?;
        let chain: Vec<OwnedEventId> =
            chain.into_iter().filter_map(|id| OwnedEventId::try_from(id).ok()).collect();
        self.load(events, chain.iter()).await?;
        resolution::resolve(&self.rules, states, events)
    }

    /// The state before `pdu`, whose prev events (placed at `prev_seqs`)
    /// are not all of the room's tips: the state after them (read whole and
    /// resolved only if they differ); with the events the rules read for
    /// `pdu` (`keys`).
    pub(super) async fn state_before(
        &mut self,
        backend: Backend,
        pdu: &Pdu,
        prev_seqs: &[i64],
        keys: &[(StateEventType, String)],
    ) -> Result<Fork> {
        let mut tips: Vec<Tip> = Vec::with_capacity(prev_seqs.len());
        for (prev, seq) in pdu.prev_events.iter().zip(prev_seqs) {
            let tip = self.tip_after(prev.as_str(), *seq).await?;
            if !tips.contains(&tip) {
                tips.push(tip);
            }
        }
        let mut agree = true;
        for other in tips.iter().skip(1) {
            agree &= self.differing(&tips[0], other).await?.is_empty();
        }
        let mut events = Events::new();
        let before = match tips.first() {
            Some(first) if agree => Before::Tip(first.clone()),
            _ => {
                let mut states = Vec::with_capacity(tips.len());
                for tip in &tips {
                    states.push(self.whole(tip).await?);
                }
                Before::Whole(self.resolve(backend, &states, &mut events).await?)
            }
        };
        self.fork(before, keys, events).await
    }

    /// The state before an event as its sender told it (after a hole), with
    /// the events the rules read for it (`keys`).
    pub(super) async fn told_state(
        &mut self,
        before: StateIds,
        keys: &[(StateEventType, String)],
    ) -> Result<Fork> {
        self.fork(Before::Whole(before), keys, Events::new()).await
    }

    /// A [`Fork`] of `before`, with its values for `keys` and their events.
    async fn fork(
        &mut self,
        before: Before,
        keys: &[(StateEventType, String)],
        mut events: Events,
    ) -> Result<Fork> {
        let mut view = StateIds::new();
        for key in keys {
            let value = match &before {
                Before::Tip(tip) => self.value(tip, key).await?,
                Before::Whole(state) => state.get(key).cloned(),
            };
            if let Some(id) = value {
                view.insert(key.clone(), id);
            }
        }
        self.load(&mut events, view.values()).await?;
        Ok(Fork { before, view, events })
    }

    /// [`super::append_across_gap`] in this write: the fetched events held
    /// as outliers, then the event appended with the state it was told.
    pub(super) async fn append_across_gap(
        &mut self,
        state: &crate::state::AppState,
        pdu: Pdu,
        before: StateIds,
        fetched: Vec<Pdu>,
    ) -> Result<Appended> {
        let now = crate::storage::now_ms();
        for event in
            fetched.iter().filter(|e| crate::room::version::belongs_to(&self.rules, e, &self.room_id))
        {
            crate::room::remote::hold(self.tx.conn(), self.room_id.as_str(), event, now).await?;
        }
        self.append_remote_at(state, pdu, false, Some(before)).await
    }

    /// After placing `appended` off the head: the room's state becomes the
    /// resolution of the states after every tip (the event among them), and
    /// what that changes is written at the event's position. Where the
    /// event's own state differs from the room's, the difference is kept.
    pub(super) async fn resolve_head(
        &mut self,
        backend: Backend,
        appended: &Appended,
        fork: Fork,
    ) -> Result<()> {
        let Fork { before, mut events, .. } = fork;
        let pdu = &appended.pdu;
        let own_key = pdu.state_key.as_ref().map(|k| key_of(&pdu.kind.to_string(), k));
        events.insert(pdu.event_id.clone(), pdu.clone());
        let others = self.other_tips(&pdu.event_id).await?;
        // Where every tip's state is the event's own (a message on a
        // branch where nothing else changed, the common fork), nothing is
        // read whole: the room's state is the event's, and only the keys
        // where it differs from the line there are written.
        if let Before::Tip(before) = &before {
            let mut own = before.clone();
            if let Some(key) = &own_key {
                own.over.insert(key.clone(), Some(pdu.event_id.clone()));
            }
            let mut agree = true;
            for other in &others {
                agree &= self.differing(&own, other).await?.is_empty();
            }
            if agree {
                let line = Tip { seq: appended.seq, over: HashMap::new() };
                let changed = self.differing(&own, &line).await?;
                self.load(&mut events, changed.iter().filter_map(|(_, id)| id.as_ref())).await?;
                return self.apply_resolved(appended.seq, own_key.as_ref(), &changed, &events).await;
            }
        }
        let mut own = match &before {
            Before::Tip(tip) => self.whole(tip).await?,
            Before::Whole(state) => state.clone(),
        };
        if let Some(key) = &own_key {
            own.insert(key.clone(), pdu.event_id.clone());
        }
        let mut states = vec![own.clone()];
        for other in &others {
            let state = self.whole(other).await?;
            if !states.contains(&state) {
                states.push(state);
            }
        }
        let current =
            if states.len() == 1 { own.clone() } else { self.resolve(backend, &states, &mut events).await? };

        // The line at the event holds the room's state before it with the
        // event's own key applied (place did that); the resolution's
        // changes go on top. A key no tip's state lets stand (a join whose
        // join rule lost, say) becomes absent.
        let line = self.line_at(appended.seq).await?;
        let changed = state_diff(&current, &line);
        self.load(&mut events, changed.iter().filter_map(|(_, id)| id.as_ref())).await?;
        self.apply_resolved(appended.seq, own_key.as_ref(), &changed, &events).await?;
        self.keep_own_state(&pdu.event_id, &state_diff(&own, &current)).await?;
        let resolved: Vec<&(StateEventType, String)> = changed.iter().map(|(key, _)| key).collect();
        self.split_stays(appended.seq, &own, &current, &resolved, &mut events).await
    }

    /// Keeps where the state after `event` differs from the line at its
    /// position (`diff`, from [`state_diff`]): its `fork_states` rows.
    async fn keep_own_state(&mut self, event: &OwnedEventId, diff: &[Entry]) -> Result<()> {
        if diff.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, &str, Option<&str>)> = diff
            .iter()
            .map(|((t, k), e)| (t.to_string(), k.as_str(), e.as_ref().map(|e| e.as_str())))
            .collect();
        let rows: Vec<(&str, &str, Option<&str>)> =
            rows.iter().map(|(t, k, e)| (t.as_str(), *k, *e)).collect();
        state_runs::put_fork_state(self.tx.conn(), event.as_str(), &rows).await
    }

    /// Writes the keys a resolution changed at `seq` (`None`: now absent);
    /// `own_key`: the event's own, whose rows it opened there.
    async fn apply_resolved(
        &mut self,
        seq: i64,
        own_key: Option<&(StateEventType, String)>,
        changed: &[Entry],
        events: &Events,
    ) -> Result<()> {
        for (key, id) in changed {
            let event = match id {
                Some(id) => Some(
                    events
                        .get(id)
                        .cloned()
                        .ok_or_else(|| Error::Internal(format!("resolved state event {id} is not held")))?,
                ),
                None => None,
            };
            let own = own_key == Some(key);
            self.set_state_at(seq, &key.0.to_string(), &key.1, event.as_ref(), own).await?;
        }
        if !changed.is_empty() {
            self.state_changed = true;
            if let Some((_, last)) = self.reservations.last_mut() {
                last.resolved = true;
            }
        }
        Ok(())
    }

    /// Keeps `pdu` off the line as an outlier: soft-failed (`rejected`:
    /// `None`; it failed the rules against the room's state now, check 6,
    /// but passed those where it stands) or rejected for that reason
    /// (checks 4 or 5). Never placed, so never in /sync, /messages, the
    /// ranges or the forward extremities; served to other servers; its state
    /// after (the state before it (`fork`: off the head; `None`: the room's
    /// state), with it applied unless rejected) kept as `fork_states` over
    /// the head's position, read when an event names it as a prev event.
    pub(super) async fn keep_off_line(
        &mut self,
        pdu: Pdu,
        fork: Option<Fork>,
        rejected: Option<&str>,
    ) -> Result<Appended> {
        let base = self.last_seq;
        let line = self.line_at(base).await?;
        let mut own = match fork.map(|f| f.before) {
            Some(Before::Tip(tip)) => self.whole(&tip).await?,
            Some(Before::Whole(state)) => state,
            None => line.clone(),
        };
        if let Some(state_key) = pdu.state_key.as_ref().filter(|_| rejected.is_none()) {
            own.insert(key_of(&pdu.kind.to_string(), state_key), pdu.event_id.clone());
        }
        crate::room::remote::hold(self.tx.conn(), self.room_id.as_str(), &pdu, crate::storage::now_ms())
            .await?;
        outliers::mark_off_line(self.tx.conn(), pdu.event_id.as_str(), self.room_id.as_str(), base, rejected)
            .await?;
        self.keep_own_state(&pdu.event_id, &state_diff(&own, &line)).await?;
        self.kept_off_line = true;
        Ok(Appended { pdu, seq: 0, is_new: false })
    }

    /// Members joined in the room's state (`current`) but not in the state
    /// an event at `seq` saw (`own`: it stands on a branch from before
    /// their join): the event is not theirs to read under `joined`, so
    /// their stay is split around it (`shared` still opens it, by the stay
    /// that goes on after it). Keys the resolution moved at `seq`
    /// (`resolved`) had their rows written there already.
    async fn split_stays(
        &mut self,
        seq: i64,
        own: &StateIds,
        current: &StateIds,
        resolved: &[&(StateEventType, String)],
        events: &mut Events,
    ) -> Result<()> {
        let keys: Vec<&(StateEventType, String)> = current
            .iter()
            .filter(|(key, id)| {
                key.0 == StateEventType::RoomMember && own.get(*key) != Some(*id) && !resolved.contains(key)
            })
            .map(|(key, _)| key)
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        self.load(
            events,
            keys.iter().filter_map(|k| own.get(*k)).chain(keys.iter().filter_map(|k| current.get(*k))),
        )
        .await?;
        let joined = |id: Option<&OwnedEventId>| {
            id.and_then(|id| events.get(id))
                .and_then(|p| p.content_as::<serde_json::Value>())
                .is_some_and(|c| c["membership"] == "join")
        };
        let room = self.room_id.to_string();
        for key in keys {
            if joined(current.get(key)) && !joined(own.get(key)) {
                let user = key.1.as_str();
                crate::storage::memberships::close(self.tx.conn(), &room, user, "join", seq - 1).await?;
                crate::storage::memberships::open(self.tx.conn(), &room, user, "join", seq + 1, seq + 1)
                    .await?;
                // What readers cached of the ranges is stale now.
                self.state_changed = true;
            }
        }
        Ok(())
    }

    /// Makes `event` the room's state for (`kind`, `state_key`) from
    /// position `seq` on (`None`: the key is absent), where resolution put
    /// it: the line, the current state (an absent key keeps its row in
    /// `room_state` with no event, [`events::ABSENT`], so the readers of
    /// older positions still visit it), the room's summary, and for a
    /// member key the ranges and the servers in the room. A range the
    /// resolution ends closes before `seq` (what made the user leave is not
    /// theirs to read), unless the event at `seq` opened it (`own`).
    async fn set_state_at(
        &mut self,
        seq: i64,
        kind: &str,
        state_key: &str,
        event: Option<&Pdu>,
        own: bool,
    ) -> Result<()> {
        let room = self.room_id.to_string();
        let content = match event {
            Some(event) => event.as_draft()?.content,
            None => Default::default(),
        };
        let id = event.map(|e| e.event_id.as_str());
        let is_member = kind == "m.room.member";
        let new = match super::member_value(kind, &content) {
            Some(m) => Some(m.to_owned()),
            None if is_member => Some("leave".to_owned()),
            None => None,
        };
        // The membership before, read before the current state moves (a key
        // this write has not read yet comes from `room_state`).
        let old = match is_member {
            true => Some(self.membership(state_key).await?.unwrap_or_else(|| "leave".to_owned())),
            false => None,
        };
        state_runs::record(self.tx.conn(), &room, kind, state_key, seq, id).await?;
        let stored_membership = if event.is_some() { new.as_deref() } else { None };
        events::set_current(
            self.tx.conn(),
            &room,
            kind,
            state_key,
            id.unwrap_or(events::ABSENT),
            stored_membership,
            seq,
        )
        .await?;
        let members = match (&new, old) {
            (Some(new), Some(old)) => {
                if old != *new {
                    let ends_at = if own { seq } else { seq - 1 };
                    for kind in super::RANGE_KINDS {
                        if old == kind {
                            crate::storage::memberships::close(
                                self.tx.conn(),
                                &room,
                                state_key,
                                kind,
                                ends_at,
                            )
                            .await?;
                        }
                    }
                    // Nothing to close any more: only the opening is left.
                    self.update_ranges(state_key, "", new, seq).await?;
                    self.update_servers(state_key, &old, new).await?;
                    self.resolved_targets.push(state_key.to_owned());
                }
                Some((old, new.clone()))
            }
            _ => None,
        };
        crate::room::directory::track_state(
            self.tx.conn(),
            &room,
            kind,
            state_key,
            &content,
            members.as_ref().map(|(old, new)| (old.as_str(), new.as_str())),
        )
        .await?;
        if let Some(event) = event {
            self.by_id.insert(event.event_id.clone(), event.clone());
        }
        self.state.insert((kind.to_owned(), state_key.to_owned()), event.cloned());
        Ok(())
    }
}
