//! Events other servers send us: each PDU is checked before anything stores
//! it (size, format for its room's version, event id, the signatures of
//! every server that must have signed it, content hash: a mismatch keeps the
//! redacted copy, as the spec says; from room version 5 on, each key must
//! have been valid at the event's `origin_server_ts`), then goes through the room's write
//! queue like a local event (`RoomWriter::append_remote`: auth against its
//! auth events and the current state, placed at the head). Transactions
//! (`/send`) are answered per PDU and remembered, so a retry changes nothing
//! (those of typing notices and to-device messages alone need no record:
//! taken again they change nothing anyway).

use std::collections::BTreeMap;
use std::sync::Arc;

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::room_version_rules::RoomVersionRules;
use ruma::signatures::{PublicKeyMap, Verified};
use ruma::{EventId, OwnedEventId, OwnedRoomId, RoomId, ServerName};
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::room::pdu::{MAX_PDU_BYTES, Pdu};
use crate::room::version;
use crate::state::AppState;
use crate::storage::{self, federation as store, rooms};

/// Most PDUs in one received transaction (the spec's limit).
pub const MAX_PDUS: usize = 50;

/// Most EDUs in one received transaction (the spec's limit).
pub const MAX_EDUS: usize = 100;

/// Checks a PDU of a room of version `rules` another server sent: size,
/// format, event id, signatures (keys fetched as needed), content hash.
/// Answers the PDU as it will be stored (without `unsigned`; redacted when
/// its content does not match its hash).
pub async fn check_pdu(state: &AppState, rules: &RoomVersionRules, raw: &RawJsonValue) -> Result<Pdu> {
    check_object(state, rules, parse_pdu(raw)?).await
}

/// Most PDUs of one batch checked at once by [`check_pdus`].
const CHECKED_AT_ONCE: usize = 8;

/// Checks PDUs as [`check_pdu`] does, several at once (their signature
/// checks run on every core and their key look-ups overlap); the answers
/// come in the order of `raws`.
pub async fn check_pdus<'a>(
    state: &AppState,
    rules: &RoomVersionRules,
    raws: impl IntoIterator<Item = &'a RawJsonValue>,
) -> Vec<Result<Pdu>> {
    let raws: Vec<Box<RawJsonValue>> = raws.into_iter().map(ToOwned::to_owned).collect();
    let mut out: Vec<Option<Result<Pdu>>> = (0..raws.len()).map(|_| None).collect();
    let mut checks = tokio::task::JoinSet::new();
    let mut next = raws.into_iter().enumerate();
    loop {
        while checks.len() < CHECKED_AT_ONCE {
            let Some((i, raw)) = next.next() else { break };
            let (state, rules) = (state.clone(), rules.clone());
            checks.spawn(async move { (i, check_pdu(&state, &rules, &raw).await) });
        }
        match checks.join_next().await {
            Some(Ok((i, checked))) => out[i] = Some(checked),
            Some(Err(e)) => tracing::error!("a PDU check did not finish: {e}"),
            None => break,
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Internal("a PDU check did not finish".into()))))
        .collect()
}

/// A received PDU as an object, without `unsigned`, if it is not too large.
fn parse_pdu(raw: &RawJsonValue) -> Result<CanonicalJsonObject> {
    if raw.get().len() > MAX_PDU_BYTES {
        return Err(Error::TooLarge(format!("The event is larger than {MAX_PDU_BYTES} bytes")));
    }
    let mut object: CanonicalJsonObject = serde_json::from_str(raw.get())
        .map_err(|e| Error::BadJson(format!("The event is not canonical JSON: {e}")))?;
    object.remove("unsigned");
    Ok(object)
}

/// [`check_pdu`] of a parsed PDU.
async fn check_object(
    state: &AppState,
    rules: &RoomVersionRules,
    object: CanonicalJsonObject,
) -> Result<Pdu> {
    ruma::state_res::check_pdu_format(&object, &rules.event_format)
        .map_err(|e| Error::BadJson(format!("The event is not a valid PDU: {e}")))?;
    version::check_references(&object, rules)?;
    let event_id = version::event_id(&object, rules)?;
    let keys = signing_keys(state, &object, rules).await?;
    let object = match ruma::signatures::verify_event(&keys, &object, rules) {
        Ok(Verified::All) => object,
        // The signatures hold but the content was changed: keep the redacted copy.
        Ok(Verified::Signatures) => ruma::canonical_json::redact(object, &rules.redaction, None)
            .map_err(|e| Error::BadJson(format!("The event cannot be redacted: {e}")))?,
        Err(e) => return Err(Error::InvalidSignature(format!("The event's signatures do not verify: {e}"))),
    };
    Pdu::from_checked(event_id, &object)
}

/// Checks, like [`check_pdu`], an event another server sent for one of our
/// users to authorise (a restricted join through send_join): our signature,
/// which the rules require of it, is added first. The signed copy goes no
/// further than the caller, which places it only through the write path's
/// checks (`joins::check_remote`: the joiner meets the room's restricted rule).
pub async fn check_pdu_to_countersign(
    state: &AppState,
    rules: &RoomVersionRules,
    raw: &RawJsonValue,
) -> Result<Pdu> {
    let mut object = parse_pdu(raw)?;
    add_our_signature(state, rules, &mut object)?;
    check_object(state, rules, object).await
}

/// Adds our signature to another server's event (an invite of one of our
/// users). The event id does not change: signatures are not hashed.
pub fn countersign(state: &AppState, rules: &RoomVersionRules, pdu: Pdu) -> Result<Pdu> {
    let mut object = pdu.canonical()?;
    add_our_signature(state, rules, &mut object)?;
    Pdu::from_checked(pdu.event_id.clone(), &object)
}

/// Signs `object` as this server (over its redacted form), next to the
/// signatures it carries.
fn add_our_signature(
    state: &AppState,
    rules: &RoomVersionRules,
    object: &mut CanonicalJsonObject,
) -> Result<()> {
    let signature = {
        let mut redacted = ruma::canonical_json::redact(object.clone(), &rules.redaction, None)
            .map_err(|e| Error::BadJson(format!("The event cannot be redacted: {e}")))?;
        redacted.remove("signatures");
        redacted.remove("unsigned");
        ruma::signatures::sign_json(
            state.settings.server_name.as_str(),
            &state.signing_key.pair,
            &mut redacted,
        )
        .map_err(|e| Error::Internal(format!("sign: {e}")))?;
        redacted
            .get("signatures")
            .and_then(|s| s.as_object())
            .and_then(|s| s.get(state.settings.server_name.as_str()))
            .cloned()
            .ok_or_else(|| Error::Internal("no signature made".into()))?
    };
    let signatures = match object
        .entry("signatures".into())
        .or_insert_with(|| CanonicalJsonValue::Object(Default::default()))
    {
        CanonicalJsonValue::Object(o) => o,
        _ => return Err(Error::BadJson("signatures is not an object".into())),
    };
    signatures.insert(state.settings.server_name.to_string(), signature);
    Ok(())
}

/// The keys of every server whose signature the event needs: in room
/// versions 5 and later those valid at its `origin_server_ts`.
async fn signing_keys(
    state: &AppState,
    object: &CanonicalJsonObject,
    rules: &RoomVersionRules,
) -> Result<PublicKeyMap> {
    let servers = ruma::signatures::required_server_signatures_to_verify_event(object, &rules.signatures)
        .map_err(|e| Error::BadJson(format!("Cannot tell who must have signed the event: {e}")))?;
    // Room versions 5 on: the keys valid when the event says it was made.
    let at = match object.get("origin_server_ts") {
        _ if !rules.enforce_key_validity => None,
        Some(CanonicalJsonValue::Integer(ts)) => Some(i64::from(*ts)),
        _ => return Err(Error::BadJson("The event has no origin_server_ts".into())),
    };
    let signatures = object.get("signatures").and_then(|s| s.as_object());
    let mut map = PublicKeyMap::new();
    for server in servers {
        let wanted = signatures
            .and_then(|s| s.get(server.as_str()))
            .and_then(|s| s.as_object())
            .and_then(|s| s.keys().next().cloned())
            .ok_or_else(|| Error::InvalidSignature(format!("The event is not signed by {server}")))?;
        let keys = super::keys::keys_at(state, &server, &wanted, at)
            .await
            .map_err(|e| Error::InvalidSignature(format!("Cannot get the signing keys of {server}: {e}")))?;
        map.insert(server.to_string(), keys);
    }
    Ok(map)
}

/// The room a PDU names (`room_id`; a v12 create event names none).
fn room_of(raw: &RawJsonValue) -> Option<OwnedRoomId> {
    #[derive(serde::Deserialize)]
    struct RoomField {
        room_id: Option<OwnedRoomId>,
    }
    serde_json::from_str::<RoomField>(raw.get()).ok()?.room_id
}

/// Handles a received PDU: checked, then appended to its room. Answers the
/// event id it has (for the per-PDU answer) and what became of it.
async fn receive_pdu(
    state: &AppState,
    origin: &ServerName,
    raw: &RawJsonValue,
) -> (Option<OwnedEventId>, Result<()>) {
    let Some(room_id) = room_of(raw) else {
        return (None, Err(Error::BadJson("The event names no room".into())));
    };
    // For its version alone (which never changes): a kept row will do.
    let room = match crate::room::read::kept_row(state, &room_id).await {
        Ok(Some(room)) => room,
        // The host's answer to an invite or knock of one of our users, maybe.
        Ok(None) => return super::invites::membership_outside(state, &room_id, raw).await,
        Err(e) => return (None, Err(e)),
    };
    let rules = match crate::room::rules_for(&room.room_version) {
        Ok((id, rules)) => match version::check_federates(&id) {
            Ok(()) => rules,
            Err(e) => return (None, Err(e)),
        },
        Err(e) => return (None, Err(e)),
    };
    let pdu = match check_pdu(state, &rules, raw).await {
        Ok(pdu) => pdu,
        Err(e) => {
            // The id, where it can be told, so the sender learns which event failed.
            let id = serde_json::from_str::<CanonicalJsonObject>(raw.get()).ok().and_then(|mut o| {
                o.remove("unsigned");
                version::event_id(&o, &rules).ok()
            });
            return (id, Err(e));
        }
    };
    let event_id = pdu.event_id.clone();
    let result = accept(state, origin, &room_id, pdu).await;
    (Some(event_id), result)
}

/// Places our user's join into a room we are in that `via` let in (a
/// restricted join nobody here may authorise, countersigned there): as if
/// `via` had sent it, with what lies between it and our line fetched from
/// `via`. `via` sends it to the other servers, not to us.
pub async fn place_join_let_in(
    state: &AppState,
    via: &ServerName,
    room_id: &RoomId,
    join: Pdu,
) -> Result<()> {
    accept(state, via, room_id, join).await
}

/// Appends a checked PDU of a room we are in.
async fn accept(state: &AppState, origin: &ServerName, room_id: &RoomId, pdu: Pdu) -> Result<()> {
    // A server joins through send_join; after that it must be in the room
    // to send to it (its own users' member events aside).
    // Who is in the room and its ACL move only with state events: the room
    // as kept since the last one (`read::kept_row`) answers both without a
    // read. The write path checks the event against the state it lands on.
    let own_member_event =
        pdu.kind == ruma::events::TimelineEventType::RoomMember && pdu.sender.server_name() == origin;
    // Opened here, after the event's checks (which may fetch keys for a
    // while), not with the version above: a state event meanwhile counts.
    let view = crate::room::read::open_kept(state, room_id).await?;
    if !own_member_event {
        let servers = crate::room::read::servers_in_room(state, &view).await?;
        // (Ordered by the database's collation, not by bytes: no binary search.)
        if !servers.iter().any(|s| s == origin.as_str()) {
            return Err(Error::Forbidden(format!("{origin} is not in room {room_id}")));
        }
    }
    super::acl::check_in(state, &view, origin).await?;
    if origin != pdu.sender.server_name() {
        super::acl::check_in(state, &view, pdu.sender.server_name()).await?;
    }
    match crate::room::timeline::append_remote(state, room_id, pdu.clone(), false).await {
        Err(Error::MissingPrevEvents(_)) => catch_up(state, origin, room_id, pdu).await,
        other => other.map(|_| ()),
    }
}

/// Most events asked for when a received event's prev events are missing
/// (Synapse asks for 10).
const MISSING_LIMIT: u32 = 10;

/// `pdu` names prev events we lack: the events in between are asked of its
/// sender (`/get_missing_events`) and placed parents first. Where they still
/// do not reach our line (a hole longer than one ask, after an outage), the
/// oldest that does not is placed across the hole with the state its sender
/// says it had (`/state_ids`, every event of it checked), the hole recorded,
/// and the rest placed after it.
async fn catch_up(state: &AppState, origin: &ServerName, room_id: &RoomId, pdu: Pdu) -> Result<()> {
    let mut batch = fetch_missing(state, origin, room_id, &pdu).await?;
    batch.push(pdu);
    let last = batch.len() - 1;
    let mut crossed = false;
    for (i, event) in batch.into_iter().enumerate() {
        let id = event.event_id.clone();
        let result = match crate::room::timeline::append_remote(state, room_id, event.clone(), false).await {
            Err(Error::MissingPrevEvents(_)) if !crossed => {
                crossed = true;
                across_gap(state, origin, room_id, event).await
            }
            other => other.map(|_| ()),
        };
        match result {
            _ if i == last => return result,
            Err(e) if e.taints_transaction() => return Err(e),
            Err(e) => tracing::info!(event_id = %id, "a missing event was not placed: {e}"),
            Ok(()) => {}
        }
    }
    Ok(())
}

/// Places `pdu` across a hole: the state before it from `origin`. An event
/// whose state could not be had is not asked about again for an hour (the
/// backfill's dead ends): a server naming made-up prev events again and
/// again gets one /state_ids each, not a storm.
async fn across_gap(state: &AppState, origin: &ServerName, room_id: &RoomId, pdu: Pdu) -> Result<()> {
    if state.backfills.is_dead(pdu.event_id.as_str()) {
        return Err(Error::MissingPrevEvents(format!(
            "The state before {} could not be had lately: not asked again yet",
            pdu.event_id
        )));
    }
    let id = pdu.event_id.clone();
    let placed = place_across_gap(state, origin, room_id, pdu).await;
    if matches!(&placed, Err(e) if !e.taints_transaction()) {
        state.backfills.mark_dead(id.as_str());
    }
    placed
}

async fn place_across_gap(state: &AppState, origin: &ServerName, room_id: &RoomId, pdu: Pdu) -> Result<()> {
    let Some(room) = rooms::get(&state.db, room_id.as_str()).await? else {
        return Err(Error::NotFound(format!("Room {room_id} is not known here")));
    };
    let (_, rules) = crate::room::rules_for(&room.room_version)?;
    let mut known = super::backfill::Known::default();
    let before = known.state_before(state, &origin.to_owned(), room_id, &rules, &pdu.event_id).await?;
    let before = before
        .into_iter()
        .map(|((kind, key), id)| ((ruma::events::StateEventType::from(kind), key), id))
        .collect();
    tracing::info!(%room_id, event_id = %pdu.event_id, %origin, "placing an event across a hole in the line");
    crate::room::timeline::append_across_gap(state, room_id, pdu, before, known.fetched).await.map(|_| ())
}

/// Asks `origin` for the events between our forward extremities and `pdu`
/// (`/get_missing_events`), checks them (an answer holding an event of
/// another room is refused whole) and answers them parents first (their prev edges; depth only breaks ties). A
/// failure to ask is not an error of ours: nothing is answered.
async fn fetch_missing(
    state: &AppState,
    origin: &ServerName,
    room_id: &RoomId,
    pdu: &Pdu,
) -> Result<Vec<Pdu>> {
    use ruma::api::federation::event::get_missing_events;
    let Some(room) = rooms::get(&state.db, room_id.as_str()).await? else { return Ok(Vec::new()) };
    let (_, rules) = crate::room::rules_for(&room.room_version)?;
    let earliest: Vec<OwnedEventId> =
        room.extremities.iter().filter_map(|id| EventId::parse(id).ok()).collect();
    let mut request =
        get_missing_events::v1::Request::new(room_id.to_owned(), earliest, vec![pdu.event_id.clone()]);
    request.limit = MISSING_LIMIT.into();
    let events = match super::send(state, origin, request).await {
        Ok(response) => response.events,
        Err(e) => {
            tracing::info!(%origin, %room_id, "cannot get missing events: {e}");
            return Ok(Vec::new());
        }
    };
    let mut checked = Vec::new();
    let raws = events.iter().take(MISSING_LIMIT as usize).map(|raw| &**raw);
    for checked_pdu in check_pdus(state, &rules, raws).await {
        match checked_pdu {
            Ok(missing) if !version::belongs_to(&rules, &missing, room_id) => {
                // An answer holding another room's events is not used at all.
                tracing::info!(%origin, %room_id, event_id = %missing.event_id,
                    "get_missing_events answered with another room's event: answer refused");
                return Ok(Vec::new());
            }
            Ok(missing) => checked.push(missing),
            Err(e) => tracing::info!(%origin, "a missing event fails its checks: {e}"),
        }
    }
    Ok(parents_first(checked))
}

/// `batch` ordered so that each event comes after those of its prev events
/// the batch holds (Kahn; among events free at once the lower depth, then
/// the lower id: depth only breaks ties).
fn parents_first(batch: Vec<Pdu>) -> Vec<Pdu> {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashMap};
    let index: HashMap<OwnedEventId, usize> =
        batch.iter().enumerate().map(|(i, p)| (p.event_id.clone(), i)).collect();
    let mut waiting: Vec<usize> =
        batch.iter().map(|p| p.prev_events.iter().filter(|prev| index.contains_key(*prev)).count()).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); batch.len()];
    for (i, pdu) in batch.iter().enumerate() {
        for prev in &pdu.prev_events {
            if let Some(&p) = index.get(prev) {
                children[p].push(i);
            }
        }
    }
    let key = |i: usize| Reverse((batch[i].depth, batch[i].event_id.clone(), i));
    let mut free: BinaryHeap<_> = (0..batch.len()).filter(|i| waiting[*i] == 0).map(key).collect();
    let mut order = Vec::with_capacity(batch.len());
    while let Some(Reverse((_, _, i))) = free.pop() {
        order.push(i);
        for &child in &children[i] {
            waiting[child] -= 1;
            if waiting[child] == 0 {
                free.push(key(child));
            }
        }
    }
    let mut slots: Vec<Option<Pdu>> = batch.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// Whose turn it is to have a transaction taken, per sending server: one at
/// a time each (Synapse too takes one at a time per origin), so a retry
/// that arrives while the first try still runs waits and gets its answer
/// instead of running beside it, and one server never has more than one
/// transaction's fetches going.
#[derive(Debug, Default)]
pub struct InboundTurns {
    turns: std::sync::Mutex<std::collections::HashMap<ruma::OwnedServerName, Arc<tokio::sync::Mutex<()>>>>,
}

/// A server's turn, held while its transaction is taken.
pub struct Turn<'a> {
    turns: &'a InboundTurns,
    origin: ruma::OwnedServerName,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl InboundTurns {
    /// Waits for `origin`'s turn.
    pub async fn take(&self, origin: &ServerName) -> Turn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            turns.entry(origin.to_owned()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        Turn { turns: self, origin: origin.to_owned(), guard: Some(guard) }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Forgotten once no one holds or waits for it.
        let mut turns = self.turns.turns.lock().unwrap_or_else(|e| e.into_inner());
        if turns.get(&self.origin).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            turns.remove(&self.origin);
        }
    }
}

/// The answer to one transaction: per PDU, `{}` or `{"error": ...}`.
pub type PduResults = BTreeMap<OwnedEventId, std::result::Result<(), String>>;

/// Handles `PUT /send/{txnId}` from `origin`, one of its transactions at a
/// time: a transaction seen before gets the answer it got then; otherwise
/// its to-device and key EDUs are taken, the PDUs of each room in order
/// (rooms side by side), then the room's EDUs (`edus::receive`, each on its
/// own, see `edus::before_pdus`), and the answer is remembered. A
/// transaction of no PDUs whose EDUs all change nothing when taken again
/// (`edus::same_when_repeated`: typing notices, to-device messages) is not
/// remembered: taken again it changes nothing either, and a typing notice
/// costs no write.
pub async fn transaction(
    state: &AppState,
    origin: &ServerName,
    txn_id: &str,
    pdus: &[Box<RawJsonValue>],
    edus: &[&RawJsonValue],
) -> Result<PduResults> {
    if pdus.len() > MAX_PDUS || edus.len() > MAX_EDUS {
        return Err(Error::BadJson(format!(
            "A transaction holds at most {MAX_PDUS} PDUs and {MAX_EDUS} EDUs"
        )));
    }
    // One transaction of a server at a time (a retry sent while the first
    // try still runs waits for it, then gets its answer).
    let _turn = state.inbound_turns.take(origin).await;
    let clock = std::time::Instant::now();
    let remembered = !pdus.is_empty() || !edus.iter().all(|raw| super::edus::same_when_repeated(raw));
    let saved = if remembered { store::inbound_txn(&state.db, origin.as_str(), txn_id).await? } else { None };
    if let Some(saved) = saved {
        let saved: BTreeMap<OwnedEventId, Option<String>> =
            serde_json::from_str(&saved).map_err(|e| Error::Internal(format!("saved transaction: {e}")))?;
        return Ok(saved.into_iter().map(|(id, e)| (id, e.map_or(Ok(()), Err))).collect());
    }
    let (early, late): (Vec<&RawJsonValue>, Vec<&RawJsonValue>) =
        edus.iter().copied().partition(|raw| super::edus::before_pdus(raw));
    super::edus::receive(state, origin, &early).await;
    // Each room's PDUs in their order, the rooms side by side: a room whose
    // events need fetching does not hold up the others.
    let mut by_room: Vec<(Option<OwnedRoomId>, Vec<Box<RawJsonValue>>)> = Vec::new();
    for raw in pdus {
        let room = room_of(raw);
        match by_room.iter_mut().find(|(r, _)| *r == room && room.is_some()) {
            Some((_, group)) => group.push(raw.clone()),
            None => by_room.push((room, vec![raw.clone()])),
        }
    }
    let mut rooms = tokio::task::JoinSet::new();
    for (_, group) in by_room {
        let (state, origin) = (state.clone(), origin.to_owned());
        rooms.spawn(async move {
            let mut answers = Vec::with_capacity(group.len());
            for raw in &group {
                answers.push(receive_pdu(&state, &origin, raw).await);
            }
            answers
        });
    }
    let mut results = PduResults::new();
    let mut tainted = None;
    while let Some(answers) = rooms.join_next().await {
        let answers = answers.map_err(|e| Error::Internal(format!("a room's PDUs were not taken: {e}")))?;
        for (id, result) in answers {
            if let Err(e) = &result {
                tracing::info!(%origin, event_id = ?id, "refused a PDU: {e}");
                if e.taints_transaction() {
                    tainted = Some(e.to_string());
                }
            }
            if let Some(id) = id {
                results.insert(id, result.map_err(|e| e.to_string()));
            }
        }
    }
    if let Some(e) = tainted {
        // Our failure, not the event's: the sender retries the transaction
        // (what was placed is placed once; the retry finds it).
        return Err(Error::Internal(format!("cannot take the transaction: {e}")));
    }
    let pdus_us = clock.elapsed().as_micros();
    super::edus::receive(state, origin, &late).await;
    tracing::debug!(%origin, txn_id, pdus = pdus.len(), edus = edus.len(), pdus_us, taken_us = clock.elapsed().as_micros(), "transaction taken");
    if !remembered {
        return Ok(results);
    }
    let saved: BTreeMap<&OwnedEventId, Option<&String>> =
        results.iter().map(|(id, r)| (id, r.as_ref().err())).collect();
    let saved = serde_json::to_string(&saved).map_err(|e| Error::Internal(e.to_string()))?;
    store::save_inbound_txn(&state.db, origin.as_str(), txn_id, &saved, storage::now_ms()).await?;
    tracing::debug!(%origin, txn_id, remembered_us = clock.elapsed().as_micros(), "transaction remembered");
    Ok(results)
}
