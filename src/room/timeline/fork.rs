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

use ruma::OwnedEventId;
use ruma::events::StateEventType;
use ruma::room_version_rules::RoomVersionRules;

use super::{Appended, RoomWriter, authorize};
use crate::error::{Error, Result};
use crate::room::pdu::Pdu;
use crate::room::resolution::{self, Events, StateIds};
use crate::storage::{Backend, dag, events, outliers, state_runs};

/// The state before an event off the room's head, with the events read to
/// know it.
pub(super) struct Fork {
    /// The state before the event (the spec's S(E)).
    before: StateIds,
    /// The events `before` names for the keys the rules read, and whatever
    /// a resolution read.
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
            |t, k| self.before.get(&(t.clone(), k.to_owned())).and_then(|id| self.events.get(id)),
        )
        .map_err(|e| Error::Forbidden(format!("Rejected by the state before it: {e}")))
    }
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

    /// The state after the placed event `id` at position `seq`: the room's
    /// state there, and where the event stood on a side branch, the state it saw.
    async fn state_after(&mut self, id: &str, seq: i64) -> Result<StateIds> {
        let mut state = self.line_at(seq).await?;
        for (t, k, e) in state_runs::fork_state(self.tx.conn(), id).await? {
            match e.and_then(|e| OwnedEventId::try_from(e).ok()) {
                Some(e) => state.insert(key_of(&t, &k), e),
                None => state.remove(&key_of(&t, &k)),
            };
        }
        Ok(state)
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
    /// are not all of the room's tips: the state after them, resolved if
    /// they differ; with the events the rules read for `pdu` (`keys`).
    pub(super) async fn state_before(
        &mut self,
        backend: Backend,
        pdu: &Pdu,
        prev_seqs: &[i64],
        keys: &[(StateEventType, String)],
    ) -> Result<Fork> {
        let mut states: Vec<StateIds> = Vec::with_capacity(prev_seqs.len());
        for (prev, seq) in pdu.prev_events.iter().zip(prev_seqs) {
            let state = self.state_after(prev.as_str(), *seq).await?;
            if !states.contains(&state) {
                states.push(state);
            }
        }
        let mut events = Events::new();
        let before = match states.len() {
            0 | 1 => states.pop().unwrap_or_default(),
            _ => self.resolve(backend, &states, &mut events).await?,
        };
        self.load(&mut events, keys.iter().filter_map(|k| before.get(k))).await?;
        Ok(Fork { before, events })
    }

    /// The state before an event as its sender told it (after a hole), with
    /// the events the rules read for it (`keys`).
    pub(super) async fn told_state(
        &mut self,
        before: StateIds,
        keys: &[(StateEventType, String)],
    ) -> Result<Fork> {
        let mut events = Events::new();
        self.load(&mut events, keys.iter().filter_map(|k| before.get(k))).await?;
        Ok(Fork { before, events })
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
        for event in fetched.iter().filter(|e| e.room_id.as_deref() == Some(&*self.room_id)) {
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
        let Fork { before: mut own, mut events } = fork;
        let pdu = &appended.pdu;
        if let Some(state_key) = &pdu.state_key {
            own.insert(key_of(&pdu.kind.to_string(), state_key), pdu.event_id.clone());
        }
        events.insert(pdu.event_id.clone(), pdu.clone());
        let mut states = vec![own.clone()];
        for tip in self.extremities.clone().iter().filter(|t| **t != pdu.event_id) {
            let seq = events::by_id_tx(self.tx.conn(), tip.as_str())
                .await?
                .map(|e| e.seq)
                .ok_or_else(|| Error::Internal(format!("forward extremity {tip} is not placed")))?;
            let state = self.state_after(tip.as_str(), seq).await?;
            if !states.contains(&state) {
                states.push(state);
            }
        }
        let current =
            if states.len() == 1 { own.clone() } else { self.resolve(backend, &states, &mut events).await? };

        // The line at the event holds the room's state before it with the
        // event's own key applied (place did that); the resolution's
        // changes go on top.
        let line = self.line_at(appended.seq).await?;
        let mut changed: Vec<(&(StateEventType, String), &OwnedEventId)> =
            current.iter().filter(|(key, id)| line.get(*key) != Some(*id)).collect();
        changed.sort_unstable();
        // A key no tip's state lets stand (a join whose join rule lost, say).
        let mut dropped: Vec<&(StateEventType, String)> =
            line.keys().filter(|key| !current.contains_key(*key)).collect();
        dropped.sort_unstable();
        self.load(&mut events, changed.iter().map(|(_, id)| *id)).await?;
        // The event's own membership change opened its rows here; others'
        // rows that the resolution ends, end before it.
        let own_key = pdu.state_key.as_ref().map(|k| key_of(&pdu.kind.to_string(), k));
        for ((kind, state_key), id) in &changed {
            let event = events
                .get(*id)
                .cloned()
                .ok_or_else(|| Error::Internal(format!("resolved state event {id} is not held")))?;
            let own = own_key.as_ref() == Some(&(kind.clone(), state_key.clone()));
            self.set_state_at(appended.seq, &kind.to_string(), state_key, Some(&event), own).await?;
        }
        for (kind, state_key) in &dropped {
            let own = own_key.as_ref() == Some(&(kind.clone(), state_key.clone()));
            self.set_state_at(appended.seq, &kind.to_string(), state_key, None, own).await?;
        }
        if !changed.is_empty() || !dropped.is_empty() {
            self.state_changed = true;
            if let Some((_, last)) = self.reservations.last_mut() {
                last.resolved = true;
            }
        }

        let mut differs: Vec<(String, String, Option<String>)> = Vec::new();
        for (key, id) in &own {
            if current.get(key) != Some(id) {
                differs.push((key.0.to_string(), key.1.clone(), Some(id.to_string())));
            }
        }
        for key in current.keys().filter(|key| !own.contains_key(*key)) {
            differs.push((key.0.to_string(), key.1.clone(), None));
        }
        if !differs.is_empty() {
            let rows: Vec<(&str, &str, Option<&str>)> =
                differs.iter().map(|(t, k, e)| (t.as_str(), k.as_str(), e.as_deref())).collect();
            state_runs::put_fork_state(self.tx.conn(), pdu.event_id.as_str(), &rows).await?;
        }
        let resolved: Vec<&(StateEventType, String)> = changed.iter().map(|(key, _)| *key).collect();
        self.split_stays(appended.seq, &own, &current, &resolved, &mut events).await
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
        let mut own = fork.map(|f| f.before).unwrap_or_else(|| line.clone());
        if let Some(state_key) = pdu.state_key.as_ref().filter(|_| rejected.is_none()) {
            own.insert(key_of(&pdu.kind.to_string(), state_key), pdu.event_id.clone());
        }
        let mut differs: Vec<(String, String, Option<String>)> = Vec::new();
        for (key, id) in &own {
            if line.get(key) != Some(id) {
                differs.push((key.0.to_string(), key.1.clone(), Some(id.to_string())));
            }
        }
        for key in line.keys().filter(|key| !own.contains_key(*key)) {
            differs.push((key.0.to_string(), key.1.clone(), None));
        }
        crate::room::remote::hold(self.tx.conn(), self.room_id.as_str(), &pdu, crate::storage::now_ms())
            .await?;
        outliers::mark_off_line(self.tx.conn(), pdu.event_id.as_str(), self.room_id.as_str(), base, rejected)
            .await?;
        let rows: Vec<(&str, &str, Option<&str>)> =
            differs.iter().map(|(t, k, e)| (t.as_str(), k.as_str(), e.as_deref())).collect();
        state_runs::put_fork_state(self.tx.conn(), pdu.event_id.as_str(), &rows).await?;
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
        let members = match &new {
            Some(new) => {
                let old = match self.state_event(kind, state_key).await? {
                    Some(p) => p
                        .content_as::<serde_json::Value>()
                        .and_then(|c| c["membership"].as_str().map(str::to_owned)),
                    None => None,
                }
                .unwrap_or_else(|| "leave".to_owned());
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
            None => None,
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
