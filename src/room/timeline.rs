//! The write path of a room: each event is authorised against the room's
//! current state and appended at the room's next seq, in one transaction that
//! holds the room's lock (see `storage::Db::begin_room_write`). Several drafts
//! can go in one transaction (createRoom, bulk membership): consecutive seqs,
//! each authorised against the state the previous ones left.

use std::collections::HashMap;
use std::sync::Arc;

use ruma::events::{StateEventType, TimelineEventType};
use ruma::room_version_rules::RoomVersionRules;
use ruma::{MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedRoomId, RoomId, RoomVersionId, UInt};

use super::pdu::{self, Draft, Pdu, Placement};
use super::position;
use super::resolution;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events::{self, NewEvent, Txn};
use crate::storage::outliers::Standing;
use crate::storage::{self, RoomTx, memberships, remote_devices, rooms};
use crate::streams::{Change, Reservation};

mod fork;

/// The memberships that have ranges: stays (`join`), invites and knocks
/// (which let their holder read only the events that end them).
const RANGE_KINDS: [&str; 3] = ["join", "invite", "knock"];

/// The most prev events a local event points at (the spec allows 20).
const MAX_PREV_EVENTS: usize = 10;

/// The most queued appends one transaction takes.
const MAX_BATCH: usize = 64;

/// The state event type of the pre-join window: content `{"events": N}` lets
/// each later join also read the N events before it (never below a floor).
/// Positions are sparse, so the window's start (`window_seq`) is the position
/// of the Nth event before the join, counted by an index scan
/// ([`events::nth_before`]), fixed at join time.
pub const PREJOIN_WINDOW_TYPE: &str = "org.seqline.prejoin_window";

/// State that decides what members may read besides the history
/// visibility itself: each needs the level of `m.room.history_visibility`
/// too, whatever the room's power levels say of its own type (the default
/// `state_default` of 50 would let any moderator hide history for everyone).
pub const READ_CONTROL_TYPES: [&str; 2] = ["m.room.retention", PREJOIN_WINDOW_TYPE];

/// The largest pre-join window honoured.
pub const MAX_PREJOIN_WINDOW: i64 = 100_000;

/// The transaction a client send belongs to.
#[derive(Debug, Clone)]
pub struct ClientTxn {
    /// Sending device.
    pub device_id: String,
    /// What the transaction id is scoped to: the request path less the txn id
    /// (the spec: a retransmission has the same path), e.g.
    /// `send/!room/m.room.message`.
    pub scope: String,
    /// Client transaction id.
    pub txn_id: String,
}

/// What a write did.
#[derive(Debug, Clone)]
pub struct Appended {
    /// The event (new, or the one an earlier identical request created).
    pub pdu: Pdu,
    /// Its seq.
    pub seq: i64,
    /// False when nothing was stored: a repeated transaction or identical state.
    pub is_new: bool,
}

/// The room as a write transaction sees it.
pub struct RoomWriter {
    /// The room.
    pub room_id: OwnedRoomId,
    /// Its version.
    pub version: RoomVersionId,
    /// And that version's rules.
    pub rules: RoomVersionRules,
    last_seq: i64,
    extremities: Vec<OwnedEventId>,
    max_depth: i64,
    /// State loaded so far, by (type, state key); `None` = known absent.
    state: HashMap<(String, String), Option<Pdu>>,
    /// The same events by id, for the auth-event lookups.
    by_id: HashMap<OwnedEventId, Pdu>,
    /// Stream positions of the events appended, finished at commit (or
    /// drop), each with what its event was.
    reservations: Vec<(Reservation, AppendedEvent)>,
    /// A state event was appended: the room's read epoch moves at commit.
    state_changed: bool,
    /// The servers with users joined to the room, once loaded.
    servers: Option<Vec<String>>,
    /// Servers this transaction queued events for (woken after commit).
    destinations: std::collections::BTreeSet<String>,
    /// The events queued for them, by id, as stored (handed to the sender
    /// after commit: it need not read them back).
    outgoing: Vec<(String, String)>,
    /// Users whose membership a state resolution moved (woken after commit).
    resolved_targets: Vec<String>,
    /// Something was stored off the line (a soft-failed event): the write
    /// commits though no event was placed.
    kept_off_line: bool,
    /// Unread-count rows of the events appended, filed at commit.
    tally_rows: Vec<storage::tally::NewRow>,
    /// Each thread's unread-count totals as this write leaves them.
    tally_totals: HashMap<String, (i64, i64)>,
    tx: RoomTx,
}

impl RoomWriter {
    /// Opens a write on an existing room; an unknown room is the same 403 as
    /// a room the sender is not in (joins tell 404 before they get here).
    pub async fn open(state: &AppState, room_id: &RoomId) -> Result<Self> {
        let mut tx = state.db.begin_room_write(Some(room_id.as_str())).await?;
        let room = rooms::get_tx(tx.conn(), room_id.as_str()).await?.ok_or_else(super::read::not_a_member)?;
        let (version, rules) = super::rules_for(&room.room_version)?;
        let extremities = room
            .extremities
            .iter()
            .map(|id| OwnedEventId::try_from(id.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Internal(format!("stored extremity: {e}")))?;
        Ok(Self {
            room_id: room_id.to_owned(),
            version,
            rules,
            last_seq: room.last_seq,
            extremities,
            max_depth: room.max_depth,
            state: HashMap::new(),
            by_id: HashMap::new(),
            reservations: Vec::new(),
            state_changed: false,
            servers: None,
            destinations: Default::default(),
            outgoing: Vec::new(),
            resolved_targets: Vec::new(),
            kept_off_line: false,
            tally_rows: Vec::new(),
            tally_totals: HashMap::new(),
            tx,
        })
    }

    /// Continues a new room whose create event (at [`position::first`]) was just stored in
    /// `tx`: the room's row is the lock from now on.
    pub(super) fn after_create(
        room_id: OwnedRoomId,
        version: RoomVersionId,
        rules: RoomVersionRules,
        tx: RoomTx,
        create: Pdu,
        create_stream: Reservation,
    ) -> Self {
        let mut state = HashMap::new();
        let mut by_id = HashMap::new();
        state.insert((StateEventType::RoomCreate.to_string(), String::new()), Some(create.clone()));
        by_id.insert(create.event_id.clone(), create.clone());
        Self {
            room_id,
            version,
            rules,
            last_seq: position::first(),
            extremities: vec![create.event_id.clone()],
            max_depth: pdu::stored_depth(create.depth),
            state,
            by_id,
            reservations: vec![(
                create_stream,
                AppendedEvent { seq: position::first(), state: true, member: None, resolved: false },
            )],
            state_changed: true,
            servers: None,
            destinations: Default::default(),
            outgoing: Vec::new(),
            resolved_targets: Vec::new(),
            kept_off_line: false,
            tally_rows: Vec::new(),
            tally_totals: HashMap::new(),
            tx,
        }
    }

    /// Takes over the state an earlier writer of this room loaded, if the
    /// room's head has not moved since (else it is stale and dropped).
    fn adopt(&mut self, cache: StateCache) {
        if cache.last_seq == self.last_seq && self.state.is_empty() {
            self.state = cache.state;
            self.by_id = cache.by_id;
            self.tally_totals = cache.tally_totals;
            self.servers = cache.servers;
        }
    }

    /// The transaction's connection.
    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        self.tx.conn()
    }

    /// The current state event for (type, key), as this transaction sees it.
    pub async fn state_event(&mut self, kind: &str, state_key: &str) -> Result<Option<&Pdu>> {
        let key = (kind.to_owned(), state_key.to_owned());
        if !self.state.contains_key(&key) {
            let stored =
                events::current_state_event(self.tx.conn(), self.room_id.as_str(), kind, state_key).await?;
            let pdu = stored.map(|e| Pdu::from_stored(&e.event_id, &e.json)).transpose()?;
            if let Some(p) = &pdu {
                self.by_id.insert(p.event_id.clone(), p.clone());
            }
            self.state.insert(key.clone(), pdu);
        }
        Ok(self.state.get(&key).and_then(Option::as_ref))
    }

    /// Authorises `draft` and appends it at the next seq. Identical state (same
    /// type, key, sender and content as the current event) appends nothing and
    /// returns the current event; so does a repeated client transaction.
    pub async fn append(
        &mut self,
        state: &AppState,
        draft: &Draft,
        txn: Option<&ClientTxn>,
    ) -> Result<Appended> {
        // Before anything reads storage with the draft's type and state key.
        pdu::check_draft(draft)?;
        let prepared = super::joins::prepare(self, state, draft).await?;
        let draft = prepared.as_ref().unwrap_or(draft);
        let sender = draft.sender.as_str();
        let content_raw = serde_json::value::to_raw_value(&draft.content)
            .map_err(|e| Error::Internal(format!("content: {e}")))?;
        if let Some(state_key) = &draft.state_key
            && let Some(current) = self.state_event(&draft.kind, state_key).await?
            && current.sender == draft.sender
            && current.content.get() == content_raw.get()
        {
            let pdu = current.clone();
            let seq = events::by_id_tx(self.tx.conn(), pdu.event_id.as_str()).await?.map_or(0, |e| e.seq);
            return Ok(Appended { pdu, seq, is_new: false });
        }

        let now = storage::now_ms();
        let (pdu, redacts, allowed) = self.build(state, draft, now).await?;
        // A repeated transaction answers with the event the first one made,
        // even if the sender could not send it now (they left since, say).
        // Checked by claiming the transaction id: no extra query when new.
        if let Some(t) = txn {
            let key = Txn { user_id: sender, device_id: &t.device_id, scope: &t.scope, txn_id: &t.txn_id };
            let claimed = match allowed {
                Ok(()) => events::claim_txn(self.tx.conn(), key, pdu.event_id.as_str(), now).await?,
                Err(_) => false,
            };
            if !claimed && let Some(earlier) = self.txn_event(key).await? {
                return Ok(earlier);
            }
        }
        allowed?;
        self.place(state, draft, pdu, redacts.as_ref(), txn, now, true).await
    }

    /// Builds the PDU of a local draft at the head of the line (auth events
    /// from the current state) and checks it: the outer error is a failure,
    /// the inner one a refusal.
    async fn build(
        &mut self,
        state: &AppState,
        draft: &Draft,
        now: i64,
    ) -> Result<(Pdu, Option<OwnedEventId>, Result<()>)> {
        let content_raw = serde_json::value::to_raw_value(&draft.content)
            .map_err(|e| Error::Internal(format!("content: {e}")))?;
        let kind = TimelineEventType::from(draft.kind.as_str());
        let auth_types = ruma::state_res::auth_types_for_event(
            &kind,
            &draft.sender,
            draft.state_key.as_deref(),
            &content_raw,
            &self.rules.authorization,
        )
        .map_err(|e| Error::BadJson(format!("Invalid event: {e}")))?;
        let rules = self.rules.clone();
        let pairs = super::version::references_are_pairs(&rules);
        let mut auth_events = Vec::new();
        let mut reference_hashes = HashMap::new();
        for (state_type, state_key) in &auth_types {
            if let Some(p) = self.state_event(&state_type.to_string(), state_key).await? {
                auth_events.push(p.event_id.clone());
                if pairs {
                    reference_hashes.insert(p.event_id.clone(), p.reference_hash(&rules)?);
                }
            }
        }
        // The dependent checks read the create event even where (v12) it is
        // not an auth event.
        self.state_event(StateEventType::RoomCreate.to_string().as_str(), "").await?;
        let prev_events: Vec<OwnedEventId> =
            self.extremities.iter().rev().take(MAX_PREV_EVENTS).cloned().collect();
        if pairs {
            for id in &prev_events {
                let hash = match self.by_id.get(id) {
                    Some(p) => p.reference_hash(&self.rules)?,
                    None => {
                        let stored = events::by_id_tx(self.tx.conn(), id.as_str())
                            .await?
                            .ok_or_else(|| Error::Internal(format!("extremity {id} is not stored")))?;
                        Pdu::from_stored(&stored.event_id, &stored.json)?.reference_hash(&self.rules)?
                    }
                };
                reference_hashes.insert(id.clone(), hash);
            }
        }
        let placement = Placement {
            room_id: if kind == TimelineEventType::RoomCreate
                && self.rules.authorization.room_create_event_id_as_room_id
            {
                None
            } else {
                Some(&self.room_id)
            },
            prev_events,
            auth_events,
            reference_hashes,
            depth: pdu::depth_after(self.max_depth),
            origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::try_from(now).unwrap_or_default()),
        };
        let pdu = pdu::build(&self.rules, &state.settings.server_name, &state.signing_key, draft, placement)?;
        let redacts = super::redaction::target(&self.rules, &pdu)?;
        let allowed = self.check(&pdu, draft, redacts.as_ref(), false).await?;
        Ok((pdu, redacts, allowed))
    }

    /// The rules every event passes, local or remote, with its auth events
    /// and the current state loaded: the spec's authorisation rules, who may
    /// redact what, who may change read-control state. The outer error is a
    /// failure, the inner one the refusal.
    async fn check(
        &mut self,
        pdu: &Pdu,
        draft: &Draft,
        redacts: Option<&OwnedEventId>,
        remote: bool,
    ) -> Result<Result<()>> {
        let allowed = authorize(
            &self.rules,
            pdu,
            |id| self.by_id.get(id),
            |t, k| self.state.get(&(t.to_string(), k.to_owned())).and_then(Option::as_ref),
        );
        if allowed.is_err() {
            return Ok(allowed);
        }
        if let Some(target) = redacts {
            let allowed = self.check_redaction(pdu, target, remote).await?;
            if allowed.is_err() {
                return Ok(allowed);
            }
        }
        if draft.state_key.is_some() && READ_CONTROL_TYPES.contains(&draft.kind.as_str()) {
            return self.check_read_control(&pdu.sender).await;
        }
        Ok(Ok(()))
    }

    /// The event another server's user would send to join (or leave) the
    /// room now (make_join, make_leave): built at the head like a local
    /// event, restricted-join authoriser chosen as for local joins, and
    /// refused if the rules refuse it. Nothing is stored.
    pub async fn template(&mut self, state: &AppState, draft: &Draft) -> Result<Pdu> {
        pdu::check_draft(draft)?;
        let prepared = super::joins::prepare(self, state, draft).await?;
        let draft = prepared.as_ref().unwrap_or(draft);
        let (pdu, _, allowed) = self.build(state, draft, storage::now_ms()).await?;
        allowed?;
        Ok(pdu)
    }

    /// Appends a PDU another server sent (checked already for format,
    /// signatures and hash: `federation::incoming`) at the head of the line,
    /// after the same authorisation as a local event: against its own auth
    /// events, then against the room's current state (and a join one of our
    /// users authorises, against the restricted rule: `joins::check_remote`). Its prev events must all
    /// be on the line. An event already stored appends nothing. With
    /// `forward`, the event is queued for the other servers in the room (an
    /// event that reached us alone: a join or leave through us).
    pub async fn append_remote(&mut self, state: &AppState, pdu: Pdu, forward: bool) -> Result<Appended> {
        self.append_remote_at(state, pdu, forward, None).await
    }

    /// [`Self::append_remote`]; with `across`, the event comes after a hole
    /// no fetch could fill: `across` is the state before it as its sender
    /// told it (checked already), its prev events we lack are recorded as a
    /// gap in the line instead of refusing it.
    async fn append_remote_at(
        &mut self,
        state: &AppState,
        pdu: Pdu,
        forward: bool,
        across: Option<resolution::StateIds>,
    ) -> Result<Appended> {
        // Where the event and its prev events stand, in one read.
        let standing = {
            let mut ids: Vec<&str> = vec![pdu.event_id.as_str()];
            ids.extend(pdu.prev_events.iter().map(|p| p.as_str()));
            crate::storage::outliers::standing(self.tx.conn(), &ids).await?
        };
        let own = standing.get(pdu.event_id.as_str());
        if let Some(Standing::Placed { seq, .. }) = own {
            return Ok(Appended { seq: *seq, pdu, is_new: false });
        }
        // The room has its create event: another one starts nothing here.
        if pdu.kind == TimelineEventType::RoomCreate {
            return Err(Error::Forbidden("The room has a create event already".into()));
        }
        if pdu.room_id.as_deref() != Some(&*self.room_id) {
            return Err(Error::BadJson("The event belongs to another room".into()));
        }
        if pdu.prev_events.is_empty() {
            return Err(Error::Forbidden("Only a create event may have no prev events".into()));
        }
        let draft = pdu.as_draft()?;
        pdu::check_draft(&draft)?;
        if let Some(Standing::OffLine(kept)) = own {
            // Held already, off the line: the same answer as the first time.
            if kept.rejected {
                return Err(Error::Forbidden("The event was rejected".into()));
            }
            return Ok(Appended { pdu, seq: 0, is_new: false });
        }
        let mut prev_seqs = Vec::with_capacity(pdu.prev_events.len());
        let mut missing: Vec<OwnedEventId> = Vec::new();
        for prev in &pdu.prev_events {
            let room = self.room_id.as_str();
            let seq = match standing.get(prev.as_str()) {
                Some(Standing::Placed { room_id, seq }) if room_id == room => Some(*seq),
                // A soft-failed or rejected prev event counts: its state is kept.
                Some(Standing::OffLine(kept)) if kept.room_id == room => Some(kept.base_seq),
                _ => None,
            };
            match seq {
                Some(seq) => prev_seqs.push(seq),
                None if across.is_some() => missing.push(prev.clone()),
                None => return Err(Error::MissingPrevEvents(format!("Previous event {prev} is not known"))),
            }
        }
        for id in &pdu.auth_events {
            if self.by_id.contains_key(id) {
                continue;
            }
            // Placed or not: a room joined over federation starts with its
            // auth events as outliers.
            let held = crate::storage::outliers::held_by_id_tx(self.tx.conn(), id.as_str())
                .await?
                .filter(|e| e.room_id == self.room_id.as_str())
                .ok_or_else(|| Error::Forbidden(format!("Auth event {id} is not known")))?;
            let mut auth = Pdu::from_stored(&held.event_id, &held.json)?;
            if held.seq.is_none() {
                // An outlier may have been rejected: the rules refuse what cites it.
                auth.rejected = crate::storage::outliers::off_line(self.tx.conn(), id.as_str())
                    .await?
                    .is_some_and(|kept| kept.rejected);
            }
            self.by_id.insert(auth.event_id.clone(), auth);
        }
        let mut auth_types = ruma::state_res::auth_types_for_event(
            &pdu.kind,
            &pdu.sender,
            pdu.state_key.as_deref(),
            &pdu.content,
            &self.rules.authorization,
        )
        .map_err(|e| Error::BadJson(format!("Invalid event: {e}")))?;
        // The dependent checks read the create event even where (v12) it is
        // not an auth event.
        auth_types.push((StateEventType::RoomCreate, String::new()));
        for (state_type, state_key) in &auth_types {
            self.state_event(&state_type.to_string(), state_key).await?;
        }
        // Off the room's head (a fork, or a join of forks): the state before
        // it, from its prev events' states, resolved where they differ.
        let fork = match across {
            Some(before) => Some(self.told_state(before, &auth_types).await?),
            None if self.extends_every_tip(&pdu) => None,
            None => Some(self.state_before(state.db.backend, &pdu, &prev_seqs, &auth_types).await?),
        };
        // The spec's checks 4 and 5: an event that fails them is rejected.
        // One of the room's is kept so that events built on it can be judged;
        // one that reached us alone (a join through us) is only refused.
        let allowed = self
            .check_own_auth_events(&pdu)
            .and_then(|()| fork.as_ref().map_or(Ok(()), |f| f.check(&self.rules, &pdu, &self.by_id)));
        if let Err(rejected) = allowed {
            if forward {
                return Err(rejected);
            }
            tracing::info!(room_id = %self.room_id, event_id = %pdu.event_id, "rejected: {rejected}");
            self.keep_off_line(pdu, fork, Some(&rejected.to_string())).await?;
            return Err(rejected);
        }
        let redacts = super::redaction::target(&self.rules, &pdu)?;
        if let Err(refused) = self.check(&pdu, &draft, redacts.as_ref(), true).await? {
            // The spec's check 6: allowed where it stands, not by the
            // room's state now. An event that reached us alone (a join
            // through us) is refused; one of the room's is soft-failed:
            // kept, never shown, never built on.
            if forward {
                return Err(refused);
            }
            tracing::info!(room_id = %self.room_id, event_id = %pdu.event_id, "soft-failed: {refused}");
            return self.keep_off_line(pdu, fork, None).await;
        }
        super::joins::check_remote(self, state, &pdu).await?;
        let ts = i64::try_from(u64::from(pdu.origin_server_ts.0)).unwrap_or(i64::MAX);
        let appended = self.place(state, &draft, pdu, redacts.as_ref(), None, ts, forward).await?;
        if !missing.is_empty() {
            let missing: Vec<&str> = missing.iter().map(|id| id.as_str()).collect();
            let (room, id) = (self.room_id.to_string(), appended.pdu.event_id.to_string());
            crate::storage::backfill::add_gap(self.tx.conn(), &room, appended.seq, &id, &missing).await?;
        }
        if let Some(fork) = fork {
            self.resolve_head(state.db.backend, &appended, fork).await?;
        }
        Ok(appended)
    }

    /// The spec's check 4: `pdu` passes the rules with its own auth events
    /// as the state (and the room's create event, which a v12 event does not
    /// list); otherwise it is rejected.
    fn check_own_auth_events(&self, pdu: &Pdu) -> Result<()> {
        let create_key = (StateEventType::RoomCreate.to_string(), String::new());
        let mut own: HashMap<(String, String), &Pdu> = HashMap::new();
        if let Some(Some(create)) = self.state.get(&create_key) {
            own.insert(create_key, create);
        }
        for auth in pdu.auth_events.iter().filter_map(|id| self.by_id.get(id)) {
            if let Some(key) = &auth.state_key {
                own.insert((auth.kind.to_string(), key.clone()), auth);
            }
        }
        authorize(
            &self.rules,
            pdu,
            |id| self.by_id.get(id),
            |t, k| own.get(&(t.to_string(), k.to_owned())).copied(),
        )
        .map_err(|e| Error::Forbidden(format!("Rejected by its own auth events: {e}")))
    }

    /// Puts an authorised event at the head of the line: next seq, stream
    /// position, state, ranges, the servers in the room, the outgoing queue
    /// (with `forward`: to every server in the room but ours and the sender's).
    #[allow(clippy::too_many_arguments)]
    async fn place(
        &mut self,
        state: &AppState,
        draft: &Draft,
        pdu: Pdu,
        redacts: Option<&OwnedEventId>,
        txn: Option<&ClientTxn>,
        origin_server_ts: i64,
        forward: bool,
    ) -> Result<Appended> {
        let sender = draft.sender.as_str();
        let seq = position::next_after(self.last_seq)
            .ok_or_else(|| Error::Internal(format!("the seq line of {} is full", self.room_id)))?;
        let membership_change = match (&draft.state_key, member_value(&draft.kind, &draft.content)) {
            (Some(target), Some(new)) => {
                let old = self.membership(target).await?;
                Some((target.clone(), old.unwrap_or_else(|| "leave".to_owned()), new.to_owned()))
            }
            _ => None,
        };
        let json = pdu.to_json_string();
        let reservation = state.streams.reserve();
        let new = NewEvent {
            stream: reservation.pos,
            room_id: self.room_id.as_str(),
            seq,
            event_id: pdu.event_id.as_str(),
            event_type: &draft.kind,
            state_key: draft.state_key.as_deref(),
            sender,
            origin_server_ts,
            json: &json,
            txn: txn.map(|t| (t.device_id.as_str(), t.txn_id.as_str())),
            membership: member_value(&draft.kind, &draft.content),
            relation: super::relations::relation_of(&draft.content),
        };
        events::insert(self.tx.conn(), &new).await?;
        self.tally(state, &pdu, draft, seq).await?;
        if let Some(key) = &draft.state_key {
            let members = membership_change.as_ref().map(|(_, old, new)| (old.as_str(), new.as_str()));
            super::directory::track_state(
                self.tx.conn(),
                self.room_id.as_str(),
                &draft.kind,
                key,
                &draft.content,
                members,
            )
            .await?;
        }
        let our_name = state.settings.server_name.as_str();
        let federating = state.settings.federation.is_some() && forward;
        let mut destinations = if federating { self.servers_in_room().await? } else { Vec::new() };
        if let Some((target, old, new)) = &membership_change {
            self.update_ranges(target, old, new, seq).await?;
            self.update_servers(target, old, new).await?;
            if federating {
                // Servers that join with this event, and the target's (an
                // invite, a kick, a ban) hear of it too.
                destinations.extend(self.servers_in_room().await?);
                destinations.extend(target.split_once(':').map(|(_, server)| server.to_owned()));
            }
        }
        destinations.retain(|server| server != our_name && server != pdu.sender.server_name().as_str());
        destinations.sort_unstable();
        destinations.dedup();
        if !destinations.is_empty() {
            crate::storage::federation::enqueue(
                self.tx.conn(),
                &destinations,
                self.room_id.as_str(),
                pdu.event_id.as_str(),
            )
            .await?;
            self.destinations.extend(destinations);
            self.outgoing.push((pdu.event_id.to_string(), json));
        }
        if let Some(target) = redacts {
            if events::by_id_tx(self.tx.conn(), target.as_str()).await?.is_some() {
                events::set_redacted_by(self.tx.conn(), target.as_str(), pdu.event_id.as_str()).await?;
                // A redacted event loses its content's `m.relates_to` (every
                // room version's redaction algorithm drops it), so its relation.
                crate::storage::relations::delete(self.tx.conn(), target.as_str()).await?;
            } else {
                // Another server's redaction of an event we lack: it applies
                // when the event arrives (here or through backfill).
                crate::storage::backfill::add_pending_redaction(
                    self.tx.conn(),
                    self.room_id.as_str(),
                    target.as_str(),
                    pdu.event_id.as_str(),
                )
                .await?;
            }
        }
        if draft.sender.server_name() != state.settings.server_name {
            self.apply_pending_redactions(&pdu).await?;
        }
        let member = membership_change.as_ref().map(|(target, _, _)| target.clone());
        self.reservations.push((
            reservation,
            AppendedEvent { seq, state: draft.state_key.is_some(), member, resolved: false },
        ));
        self.last_seq = seq;
        self.max_depth = self.max_depth.max(pdu::stored_depth(pdu.depth));
        // The new event replaces the extremities it points at (all of them
        // for a local event; a remote one may leave others standing).
        advance_tips(&mut self.extremities, &pdu.prev_events, pdu.event_id.clone());
        self.by_id.insert(pdu.event_id.clone(), pdu.clone());
        if let Some(state_key) = &draft.state_key {
            self.state.insert((draft.kind.clone(), state_key.clone()), Some(pdu.clone()));
            self.state_changed = true;
        }
        Ok(Appended { pdu, seq, is_new: true })
    }

    /// Files what the event at `seq` counts for in unread counts (see
    /// [`super::tally`]): a row when it counts for anyone.
    async fn tally(&mut self, state: &AppState, pdu: &Pdu, draft: &Draft, seq: i64) -> Result<()> {
        let content: serde_json::Value = pdu.content_as().unwrap_or_default();
        let room_id = self.room_id.clone();
        let class = super::tally::classify(
            &room_id,
            draft.sender.as_str(),
            &content,
            &draft.kind,
            draft.state_key.as_deref(),
            async || self.power_levels().await.ok(),
            state.settings.server_name.as_str(),
        )
        .await;
        let Some(class) = class.filter(super::tally::Class::counts) else { return Ok(()) };
        let thread = class.thread.unwrap_or_default();
        let totals = match self.tally_totals.get(&thread) {
            Some(t) => *t,
            None => storage::tally::thread_totals(self.tx.conn(), room_id.as_str(), &thread).await?,
        };
        let totals = (totals.0 + i64::from(class.unnamed.0), totals.1 + i64::from(class.unnamed.1));
        self.tally_totals.insert(thread.clone(), totals);
        self.tally_rows.push(storage::tally::NewRow {
            seq,
            thread,
            sender: draft.sender.to_string(),
            unnamed: class.unnamed,
            named: class.named,
            recheck: class.recheck,
            words: class.words,
            mentions: class.mentions,
            totals,
        });
        Ok(())
    }

    /// Redactions placed before `target` arrived that name it: each applies
    /// if its sender may redact it.
    async fn apply_pending_redactions(&mut self, target: &Pdu) -> Result<()> {
        let room = self.room_id.as_str().to_owned();
        let waiting = crate::storage::backfill::take_pending_redactions(
            self.tx.conn(),
            &room,
            target.event_id.as_str(),
        )
        .await?;
        for (redaction_id, _, json) in waiting {
            let redaction = Pdu::from_stored(&redaction_id, &json)?;
            let power = self.power_levels().await?;
            // Only another server's redaction waits for its target.
            if super::redaction::check(&redaction, &room, target, &room, &power, true).is_ok() {
                events::set_redacted_by(self.tx.conn(), target.event_id.as_str(), &redaction_id).await?;
                crate::storage::relations::delete(self.tx.conn(), target.event_id.as_str()).await?;
            }
        }
        Ok(())
    }

    /// Whether `redaction` may redact `target` (see [`super::redaction`]): the
    /// outer error is a storage failure, the inner one the refusal.
    async fn check_redaction(
        &mut self,
        redaction: &Pdu,
        target: &OwnedEventId,
        remote: bool,
    ) -> Result<Result<()>> {
        let Some(stored) = events::by_id_tx(self.tx.conn(), target.as_str()).await? else {
            // Another server may redact an event we have not received: the
            // redaction stands and applies if the event ever arrives.
            if remote {
                return Ok(Ok(()));
            }
            return Ok(Err(Error::NotFound("The event to redact is not known in this room".into())));
        };
        let target_pdu = Pdu::from_stored(&stored.event_id, &stored.json)?;
        let power = self.power_levels().await?;
        Ok(super::redaction::check(
            redaction,
            self.room_id.as_str(),
            &target_pdu,
            &stored.room_id,
            &power,
            remote,
        ))
    }

    /// Whether `sender` may change read-control state (see
    /// [`READ_CONTROL_TYPES`]): the outer error is a storage failure, the
    /// inner one the refusal.
    async fn check_read_control(&mut self, sender: &ruma::UserId) -> Result<Result<()>> {
        let power = self.power_levels().await?;
        Ok(if power.user_can_send_state(sender, StateEventType::RoomHistoryVisibility) {
            Ok(())
        } else {
            Err(Error::Forbidden(
                "Changing what members may read needs the power level of m.room.history_visibility".into(),
            ))
        })
    }

    /// `user`'s membership in the room now, as this transaction sees it
    /// (`None`: no member event).
    pub(super) async fn membership(&mut self, user: &str) -> Result<Option<String>> {
        Ok(self
            .state_event("m.room.member", user)
            .await?
            .and_then(|p| p.content_as::<serde_json::Value>())
            .and_then(|c| c["membership"].as_str().map(str::to_owned)))
    }

    /// The room's power levels as this transaction sees them.
    pub async fn power_levels(&mut self) -> Result<ruma::events::room::power_levels::RoomPowerLevels> {
        let power_levels = self.state_event("m.room.power_levels", "").await?.cloned();
        let create = self
            .state_event("m.room.create", "")
            .await?
            .cloned()
            .ok_or_else(|| Error::Internal("a room without a create event".into()))?;
        super::power::from_state(&self.rules, power_levels.as_ref(), Some(&create), create.sender.clone())
    }

    /// The event an earlier request with this transaction made, if any.
    async fn txn_event(&mut self, key: Txn<'_>) -> Result<Option<Appended>> {
        let Some(event_id) = events::txn_event(self.tx.conn(), key).await? else { return Ok(None) };
        let stored = events::by_id_tx(self.tx.conn(), &event_id)
            .await?
            .ok_or_else(|| Error::Internal("transaction points at a missing event".into()))?;
        let pdu = Pdu::from_stored(&stored.event_id, &stored.json)?;
        Ok(Some(Appended { pdu, seq: stored.seq, is_new: false }))
    }

    /// Keeps the membership ranges in step with a membership change at `seq`:
    /// a stay runs from the join through the event that ends it, an invite
    /// likewise; rows are closed, never deleted.
    async fn update_ranges(&mut self, user: &str, old: &str, new: &str, seq: i64) -> Result<()> {
        let room = self.room_id.to_string();
        for kind in RANGE_KINDS {
            if old == kind && new != kind {
                memberships::close(self.tx.conn(), &room, user, kind, seq).await?;
            }
        }
        if new != old && RANGE_KINDS.contains(&new) {
            let window = if new == "join" { self.prejoin_window().await? } else { 0 };
            let window_seq = if window > 0 {
                events::nth_before(self.tx.conn(), &room, seq, window).await?.unwrap_or(seq)
            } else {
                seq
            };
            memberships::open(self.tx.conn(), &room, user, new, seq, window_seq).await?;
            memberships::unforget(self.tx.conn(), user, &room).await?;
        }
        Ok(())
    }

    /// The servers with a user joined to the room now (ours among them), as
    /// this transaction sees it.
    async fn servers_in_room(&mut self) -> Result<Vec<String>> {
        if self.servers.is_none() {
            let all =
                crate::storage::federation::servers_in_room_tx(self.tx.conn(), self.room_id.as_str()).await?;
            self.servers = Some(all);
        }
        Ok(self.servers.clone().unwrap_or_default())
    }

    /// Keeps the count of each server's joined users in step with a
    /// membership change (and the servers this writer knows of).
    async fn update_servers(&mut self, user: &str, old: &str, new: &str) -> Result<()> {
        let delta = match (old == "join", new == "join") {
            (true, false) => -1,
            (false, true) => 1,
            _ => return Ok(()),
        };
        let server = user.split_once(':').map_or("", |(_, s)| s);
        crate::storage::federation::add_joined(self.tx.conn(), self.room_id.as_str(), server, delta).await?;
        self.servers = None;
        Ok(())
    }

    /// The room's pre-join window in events (`org.seqline.prejoin_window`).
    async fn prejoin_window(&mut self) -> Result<i64> {
        Ok(match self.state_event(PREJOIN_WINDOW_TYPE, "").await? {
            Some(p) => p
                .content_as::<serde_json::Value>()
                .and_then(|c| c["events"].as_i64())
                .map_or(0, |n| n.clamp(0, MAX_PREJOIN_WINDOW)),
            None => 0,
        })
    }

    /// Saves the new head of the seq line, commits everything appended, and
    /// then (the stream position having moved past it) wakes the syncs of
    /// every user whose ranges hold one of the new events.
    pub async fn commit(self, state: &AppState) -> Result<()> {
        self.commit_only(state.settings.server_name.as_str()).await?.0.announce(state).await;
        Ok(())
    }

    /// Saves the head and commits; what was appended is announced by
    /// [`Committed::announce`]. `ours`: our server name.
    async fn commit_only(self, ours: &str) -> Result<(Committed, StateCache)> {
        let RoomWriter {
            room_id,
            last_seq,
            extremities,
            max_depth,
            reservations,
            state_changed,
            mut tx,
            state,
            by_id,
            destinations,
            outgoing,
            resolved_targets,
            tally_rows,
            tally_totals,
            servers,
            ..
        } = self;
        storage::tally::insert(tx.conn(), room_id.as_str(), &tally_rows).await?;
        let extremities: Vec<String> = extremities.iter().map(ToString::to_string).collect();
        rooms::set_head(tx.conn(), room_id.as_str(), last_seq, &extremities, max_depth, state_changed)
            .await?;
        // The membership targets: whoever may now share a room with one of
        // ours has the device list held for them asked for again.
        let mut targets: Vec<String> = reservations.iter().filter_map(|(_, e)| e.member.clone()).collect();
        targets.extend(resolved_targets);
        remote_devices::members_moved(tx.conn(), room_id.as_str(), &targets, ours).await?;
        tx.commit().await?;
        // The seqs appended, then what each position was, for the syncs
        // that wake on them.
        let appended = reservations.first().zip(reservations.last()).map(|((_, a), (_, b))| (a.seq, b.seq));
        for (reservation, AppendedEvent { seq, state, member, resolved }) in reservations {
            reservation.finish(if resolved {
                Change::Unknown
            } else {
                Change::Room { room: room_id.to_string(), seq, state, member }
            });
        }
        let cache = StateCache::new(last_seq, state, by_id, tally_totals, servers);
        Ok((Committed { room_id, appended, destinations, outgoing, targets }, cache))
    }

    /// Ends the write without committing anything, keeping what it loaded.
    fn into_cache(self) -> StateCache {
        // The totals are left behind: they may count rows never filed.
        // So are the servers (read after a membership change of this write,
        // they would count it).
        StateCache::new(self.last_seq, self.state, self.by_id, HashMap::new(), None)
    }
}

/// The room state a writer loaded, good for the next writer as long as the
/// room's head is still `last_seq` (another process may have moved it).
#[derive(Default)]
struct StateCache {
    last_seq: i64,
    state: HashMap<(String, String), Option<Pdu>>,
    /// The state events among them by id (auth events are state events).
    by_id: HashMap<OwnedEventId, Pdu>,
    /// Each thread's unread-count totals through the head.
    tally_totals: HashMap<String, (i64, i64)>,
    /// The servers with users joined (`room_servers` moves only in writes
    /// that move the head), once read.
    servers: Option<Vec<String>>,
}

impl StateCache {
    fn new(
        last_seq: i64,
        state: HashMap<(String, String), Option<Pdu>>,
        mut by_id: HashMap<OwnedEventId, Pdu>,
        tally_totals: HashMap<String, (i64, i64)>,
        servers: Option<Vec<String>>,
    ) -> Self {
        // Messages appended by the write are no auth events of later ones.
        by_id.retain(|_, p| p.state_key.is_some());
        Self { last_seq, state, by_id, tally_totals, servers }
    }
}

/// A state cache larger than this is not kept between writes.
const MAX_CACHED_STATE: usize = 10_000;

/// Events committed to a room and not yet announced.
/// What an appended event was, for the change log (see [`Change::Room`]).
#[derive(Debug)]
struct AppendedEvent {
    seq: i64,
    state: bool,
    member: Option<String>,
    /// A state resolution changed the room's state at it beyond its own
    /// key: the change log says "unknown" (a woken sync reads it all).
    resolved: bool,
}

#[must_use = "announce wakes the syncs that wait for these events"]
struct Committed {
    room_id: OwnedRoomId,
    appended: Option<(i64, i64)>,
    /// Servers with new events queued for them.
    destinations: std::collections::BTreeSet<String>,
    /// Those events (id, stored JSON).
    outgoing: Vec<(String, String)>,
    /// The targets of the membership events among them.
    targets: Vec<String>,
}

impl Committed {
    /// Wakes the syncs waiting on the room (each waiting sync watches the
    /// rooms its user is joined to) and those of the membership events'
    /// targets, and hands the events to the pushers of every user whose
    /// ranges hold one. The events are committed: nothing here may turn the
    /// answer into an error (the client would retry a send that succeeded).
    async fn announce(self, state: &AppState) {
        let Committed { room_id, appended, destinations, outgoing, targets } = self;
        crate::federation::sender::committed(state, &destinations, outgoing);
        let Some((lo, hi)) = appended else { return };
        state.notifier.wake_room(room_id.as_str(), targets.iter().map(String::as_str));
        let anyone_pushes = !state.pusher_users.read().unwrap_or_else(|e| e.into_inner()).is_empty();
        if anyone_pushes {
            let state = state.clone();
            tokio::spawn(async move {
                match memberships::holders_between(&state.db, room_id.as_str(), lo, hi).await {
                    Ok(users) => {
                        crate::notify::push_new_events(state, room_id.to_string(), lo, hi, users).await
                    }
                    Err(e) => tracing::error!(%room_id, "cannot find whom to push to after a commit: {e}"),
                }
            });
        }
    }
}

/// Appends waiting to be written, per room. Whoever holds a room's slot
/// writes everything queued for that room (up to [`MAX_BATCH`]) in one
/// transaction: concurrent writers to one room share one commit and one
/// wake-up instead of queueing for one each. Each append is still authorised
/// on its own against the state the ones before it left, and answered on its
/// own: a refused one does not affect the others.
#[derive(Default)]
pub struct WriteQueue {
    rooms: std::sync::Mutex<HashMap<OwnedRoomId, Arc<RoomSlot>>>,
    /// The state the last writer of a room loaded, kept while the room has
    /// no slot (between bursts of writes), so the next writer need not load
    /// it again if the head has not moved.
    idle: std::sync::Mutex<IdleCaches>,
}

#[derive(Default)]
struct IdleCaches {
    rooms: HashMap<OwnedRoomId, StateCache>,
    /// State entries held over all rooms.
    entries: usize,
}

/// Idle state caches hold at most this many state entries in all.
const MAX_IDLE_STATE: usize = 20_000;

impl std::fmt::Debug for WriteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rooms = self.rooms.lock().map_or(0, |r| r.len());
        f.debug_struct("WriteQueue").field("rooms", &rooms).finish()
    }
}

#[derive(Default)]
struct RoomSlot {
    /// Held by the task writing this room's queue, with the state the last
    /// writer loaded.
    writing: tokio::sync::Mutex<StateCache>,
    pending: std::sync::Mutex<Vec<Job>>,
}

struct Job {
    work: Work,
    reply: tokio::sync::oneshot::Sender<Result<Appended>>,
}

/// What a queued append is.
enum Work {
    /// A local event to build, with the client transaction it belongs to.
    Local(Draft, Option<ClientTxn>),
    /// Another server's event, checked already, and whether to forward it
    /// (see [`RoomWriter::append_remote`]).
    Remote(Pdu, bool),
    /// Another server's event after a hole, with the state before it and
    /// the checked events that state needed (see [`append_across_gap`]).
    AcrossGap(Pdu, resolution::StateIds, Vec<Pdu>),
}

impl WriteQueue {
    fn slot(&self, room_id: &RoomId) -> Arc<RoomSlot> {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        rooms
            .entry(room_id.to_owned())
            .or_insert_with(|| {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                let cache = idle.rooms.remove(room_id).unwrap_or_default();
                idle.entries -= cache.state.len();
                Arc::new(RoomSlot { writing: tokio::sync::Mutex::new(cache), pending: Default::default() })
            })
            .clone()
    }

    /// Forgets a room's slot once nobody else holds it (so rooms that are
    /// written to rarely, or do not exist, hold no slot), keeping the state
    /// its writer loaded among the idle caches.
    fn release(&self, room_id: &RoomId, slot: Arc<RoomSlot>) {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and ours: no request holds it, and none can
        // take it without this lock.
        if Arc::strong_count(&slot) == 2 {
            rooms.remove(room_id);
            let Ok(mut cache) = slot.writing.try_lock() else { return };
            let cache = std::mem::take(&mut *cache);
            if cache.state.is_empty() {
                return;
            }
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.entries + cache.state.len() > MAX_IDLE_STATE {
                idle.rooms.clear();
                idle.entries = 0;
            }
            idle.entries += cache.state.len();
            if let Some(old) = idle.rooms.insert(room_id.to_owned(), cache) {
                idle.entries -= old.state.len();
            }
        }
    }
}

impl RoomSlot {
    fn take(&self) -> Vec<Job> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let n = pending.len().min(MAX_BATCH);
        pending.drain(..n).collect()
    }
}

/// Writes what is queued for a room (run as its own task, so a client that
/// goes away cannot leave a queued write behind).
async fn write_queued(state: AppState, room_id: OwnedRoomId, slot: Arc<RoomSlot>) {
    let committed = {
        let mut cache = slot.writing.lock().await;
        let jobs = slot.take();
        if jobs.is_empty() {
            None
        } else {
            let (committed, next) = write_batch(&state, &room_id, jobs, std::mem::take(&mut *cache)).await;
            if next.state.len() <= MAX_CACHED_STATE {
                *cache = next;
            }
            committed
        }
    };
    // The next batch need not wait for the wake-ups of this one.
    if let Some(committed) = committed {
        committed.announce(&state).await;
    }
    state.write_queue.release(&room_id, slot);
}

/// Writes one batch; returns what was committed (to announce) and the state
/// the writer loaded.
async fn write_batch(
    state: &AppState,
    room_id: &RoomId,
    jobs: Vec<Job>,
    cache: StateCache,
) -> (Option<Committed>, StateCache) {
    let fail_all = |replies: Vec<tokio::sync::oneshot::Sender<Result<Appended>>>, e: &Error| {
        for reply in replies {
            let _ = reply.send(Err(e.replicate()));
        }
    };
    let mut writer = match RoomWriter::open(state, room_id).await {
        Ok(w) => w,
        Err(e) => {
            fail_all(jobs.into_iter().map(|j| j.reply).collect(), &e);
            return (None, StateCache::default());
        }
    };
    writer.adopt(cache);
    let mut answers = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter();
    while let Some(job) = jobs.next() {
        let result = match job.work {
            Work::Local(draft, txn) => writer.append(state, &draft, txn.as_ref()).await,
            Work::Remote(pdu, forward) => writer.append_remote(state, pdu, forward).await,
            Work::AcrossGap(pdu, before, fetched) => {
                writer.append_across_gap(state, pdu, before, fetched).await
            }
        };
        match result {
            Err(e) if e.taints_transaction() => {
                // Part of this append may be in the transaction: nothing of
                // the batch commits, and every request in it hears why.
                let replies = answers.into_iter().map(|(r, _)| r).chain(jobs.map(|j| j.reply));
                fail_all(replies.collect(), &e);
                let _ = job.reply.send(Err(e));
                return (None, StateCache::default());
            }
            result => answers.push((job.reply, result)),
        }
    }
    let (committed, cache) = if writer.kept_off_line
        || answers.iter().any(|(_, r)| matches!(r, Ok(a) if a.is_new))
    {
        let clock = std::time::Instant::now();
        let done = writer.commit_only(state.settings.server_name.as_str()).await;
        tracing::debug!(%room_id, events = answers.len(), commit_us = clock.elapsed().as_micros(), "room write committed");
        match done {
            Ok((committed, cache)) => (Some(committed), cache),
            Err(e) => {
                fail_all(answers.into_iter().map(|(r, _)| r).collect(), &e);
                return (None, StateCache::default());
            }
        }
    } else {
        (None, writer.into_cache())
    };
    for (reply, result) in answers {
        let _ = reply.send(result);
    }
    (committed, cache)
}

/// The spec's authorisation rules for `pdu` (ruma-state-res): the checks that
/// need only its auth events, then those against the room's current state.
/// A refusal is 403 M_FORBIDDEN with the rule's reason.
pub fn authorize<'a>(
    rules: &RoomVersionRules,
    pdu: &Pdu,
    auth_event: impl Fn(&ruma::EventId) -> Option<&'a Pdu>,
    current_state: impl Fn(&StateEventType, &str) -> Option<&'a Pdu>,
) -> Result<()> {
    ruma::state_res::check_state_independent_auth_rules(&rules.authorization, pdu, auth_event)
        .map_err(|e| Error::Forbidden(format!("Event not allowed: {e}")))?;
    ruma::state_res::check_state_dependent_auth_rules(&rules.authorization, pdu, current_state)
        .map_err(|e| Error::Forbidden(format!("Event not allowed: {e}")))
}

/// Appends one event to an existing room, through the room's write queue
/// (see [`WriteQueue`]): it may share a transaction with other appends to
/// the room that arrive meanwhile, and is answered once that commits.
pub async fn append(
    state: &AppState,
    room_id: &RoomId,
    draft: &Draft,
    txn: Option<&ClientTxn>,
) -> Result<Appended> {
    enqueue(state, room_id, Work::Local(draft.clone(), txn.cloned())).await
}

/// Appends another server's event (checked already for format, signatures
/// and hash) through the room's write queue, like [`append`]; `forward`: see
/// [`RoomWriter::append_remote`].
pub async fn append_remote(state: &AppState, room_id: &RoomId, pdu: Pdu, forward: bool) -> Result<Appended> {
    enqueue(state, room_id, Work::Remote(pdu, forward)).await
}

/// Appends another server's event whose prev events no fetch could reach
/// (a hole in the line, after an outage): `before` is the state before it
/// as its sender says (`/state_ids`), `fetched` the events of that state and
/// its auth chain we lacked, each checked already. They are held as
/// outliers; the event is placed at the head, checked against `before`, and
/// the hole recorded.
pub async fn append_across_gap(
    state: &AppState,
    room_id: &RoomId,
    pdu: Pdu,
    before: resolution::StateIds,
    fetched: Vec<Pdu>,
) -> Result<Appended> {
    enqueue(state, room_id, Work::AcrossGap(pdu, before, fetched)).await
}

async fn enqueue(state: &AppState, room_id: &RoomId, work: Work) -> Result<Appended> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let slot = state.write_queue.slot(room_id);
    slot.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Job { work, reply });
    tokio::spawn(write_queued(state.clone(), room_id.to_owned(), slot));
    let clock = std::time::Instant::now();
    let answer = answer.await.unwrap_or_else(|_| Err(Error::Internal("the room write was dropped".into())));
    tracing::debug!(%room_id, written_us = clock.elapsed().as_micros(), "room write answered");
    answer
}

/// Most forward extremities a room keeps. Every remote event off the head
/// resolves the states of all of them, so a server that keeps forking the
/// room must not make that grow: past this, the oldest tips are let go
/// (their branches stay in the room's history; their state no longer takes
/// part in the current state), as Synapse prunes old extremities.
const MAX_TIPS: usize = 20;

/// The room's tips after `event` (naming `prevs`) is placed: it replaces
/// the tips it points at, and the oldest go past [`MAX_TIPS`].
fn advance_tips(tips: &mut Vec<OwnedEventId>, prevs: &[OwnedEventId], event: OwnedEventId) {
    tips.retain(|e| !prevs.contains(e));
    tips.push(event);
    if tips.len() > MAX_TIPS {
        tips.drain(..tips.len() - MAX_TIPS);
    }
}

/// `content.membership` of a member event.
pub fn member_value<'a>(
    kind: &str,
    content: &'a ruma::canonical_json::CanonicalJsonObject,
) -> Option<&'a str> {
    (kind == "m.room.member").then(|| content.get("membership").and_then(|m| m.as_str())).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: usize) -> OwnedEventId {
        OwnedEventId::try_from(format!("$e{n}")).unwrap()
    }

    #[test]
    fn tips_are_replaced_by_what_points_at_them_and_never_pile_up() {
        let mut tips = vec![id(1), id(2)];
        advance_tips(&mut tips, &[id(1)], id(3));
        assert_eq!(tips, [id(2), id(3)]);
        advance_tips(&mut tips, &[id(2), id(3)], id(4));
        assert_eq!(tips, [id(4)]);
        // A server forking the room from one old event over and over.
        for n in 5..100 {
            advance_tips(&mut tips, &[id(0)], id(n));
        }
        assert_eq!(tips.len(), MAX_TIPS);
        assert_eq!(tips.first(), Some(&id(100 - MAX_TIPS)));
        assert_eq!(tips.last(), Some(&id(99)));
    }
}
