//! The outgoing side of federation: our events go to every server in their
//! room through a durable queue per destination (`fed_outbox`, written in
//! the transaction that stores the event, so nothing committed is lost to a
//! crash), our EDUs through another (`fed_edu_outbox`, see `edus`). One task
//! per destination sends transactions of at most [`MAX_PDUS`] events and
//! [`MAX_EDUS`] EDUs; a failed transaction is retried with the same id and
//! the same events after a backoff that doubles per failure (from
//! [`FIRST_BACKOFF_MS`] up to [`MAX_BACKOFF_MS`]) and is forgotten as soon as
//! the destination proves reachable (it answers, or it calls us). A
//! destination that stays away keeps at most
//! `federation.max_queued_per_destination` events queued; past that only the
//! newest of each room (Synapse's catch-up: it fills the rest itself).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ruma::api::federation::transactions::send_transaction_message;
use ruma::{MilliSecondsSinceUnixEpoch, OwnedServerName, OwnedTransactionId, UInt};

use crate::state::AppState;
use crate::storage::{self, federation as store};

/// Most PDUs in one transaction (the spec's limit).
pub const MAX_PDUS: i64 = 50;

/// Most EDUs in one transaction (the spec's limit).
pub const MAX_EDUS: i64 = 100;

/// The first wait after a failure.
const FIRST_BACKOFF_MS: i64 = 2_000;

/// The longest wait between attempts.
const MAX_BACKOFF_MS: i64 = 3_600_000;

/// The wait after `failures` failures in a row.
fn backoff_ms(failures: i64) -> i64 {
    let doublings = u32::try_from((failures - 1).clamp(0, 30)).unwrap_or(30);
    FIRST_BACKOFF_MS.saturating_mul(1i64 << doublings).min(MAX_BACKOFF_MS)
}

/// The destinations a sending task runs for, and those woken while it ran
/// (so a wake-up between its last look at the queue and its exit is not
/// lost).
#[derive(Debug, Default)]
pub struct Sender {
    running: Mutex<HashMap<OwnedServerName, bool>>,
}

impl Sender {
    /// Marks `destination` to be (re)examined; answers true when no task runs
    /// for it (the caller starts one).
    fn claim(&self, destination: &OwnedServerName) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get_mut(destination) {
            Some(woken) => {
                *woken = true;
                false
            }
            None => {
                running.insert(destination.clone(), false);
                true
            }
        }
    }

    /// The task for `destination` found nothing to send: it ends unless it
    /// was woken meanwhile (then it looks again).
    fn may_end(&self, destination: &OwnedServerName) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get_mut(destination) {
            Some(woken) if *woken => {
                *woken = false;
                false
            }
            _ => {
                running.remove(destination);
                true
            }
        }
    }
}

/// Makes sure a task sends what is queued for each of `destinations`.
pub fn wake<'a>(state: &AppState, destinations: impl IntoIterator<Item = &'a str>) {
    for destination in destinations {
        let Ok(destination) = OwnedServerName::try_from(destination) else { continue };
        if state.federation_sender.claim(&destination) {
            tokio::spawn(run(state.clone(), destination));
        }
    }
}

/// At start-up: a task for every destination with something queued.
pub async fn resume(state: &AppState) {
    match store::destinations_with_work(&state.db).await {
        Ok(destinations) => wake(state, destinations.iter().map(String::as_str)),
        Err(e) => tracing::error!("cannot read the federation queue: {e}"),
    }
}

/// `origin` called us: if we were backing off from it, try it now.
pub async fn contact_from(state: &AppState, origin: &ruma::ServerName) {
    match store::reset_backoff(&state.db, origin.as_str()).await {
        Ok(true) => wake(state, [origin.as_str()]),
        Ok(false) => {}
        Err(e) => tracing::warn!(%origin, "cannot reset the backoff: {e}"),
    }
}

/// Sends everything queued for `destination`, transaction by transaction.
async fn run(state: AppState, destination: OwnedServerName) {
    loop {
        match send_next(&state, &destination).await {
            Ok(true) => continue,
            Ok(false) => {
                if state.federation_sender.may_end(&destination) {
                    return;
                }
            }
            Err(retry_at) => {
                // Waking at least once a minute keeps the queue in its bound
                // however long the backoff (see `send_next`).
                let wait = (retry_at - storage::now_ms()).clamp(0, MAX_SLEEP_MS);
                tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
            }
        }
    }
}

/// Sends one transaction; `Ok(false)` when nothing was queued, `Err(when)`
/// when it failed (or the destination is backing off) and should be tried
/// again at `when`.
async fn send_next(state: &AppState, destination: &OwnedServerName) -> Result<bool, i64> {
    let now = storage::now_ms();
    let failed = |e: &dyn std::fmt::Display| {
        tracing::warn!(%destination, "federation send failed: {e}");
    };
    match store::retry_at(&state.db, destination.as_str()).await {
        Ok(at) if at > now => {
            compact(state, destination).await;
            return Err(at);
        }
        Ok(_) => {}
        Err(e) => {
            failed(&e);
            return Err(now + FIRST_BACKOFF_MS);
        }
    }
    let next = store::next_transaction(&state.db, destination.as_str(), MAX_PDUS, MAX_EDUS).await;
    let store::Outgoing { txn_id, pdus: queued, edus } = match next {
        Ok(Some(next)) => next,
        Ok(None) => return Ok(false),
        Err(e) => {
            failed(&e);
            return Err(now + FIRST_BACKOFF_MS);
        }
    };
    // The transaction's events in one query, sent in queue order.
    let ids: Vec<&str> = queued.iter().map(|(_, id)| id.as_str()).collect();
    let mut held: HashMap<String, String> = match crate::storage::outliers::held_by_ids(&state.db, &ids).await
    {
        Ok(found) => found.into_iter().map(|h| (h.event_id, h.json)).collect(),
        Err(e) => {
            failed(&e);
            return Err(now + FIRST_BACKOFF_MS);
        }
    };
    let mut pdus = Vec::with_capacity(queued.len());
    for event_id in ids {
        // An id queued twice is sent once (the first take empties its entry).
        let Some(json) = held.remove(event_id) else { continue };
        match serde_json::value::RawValue::from_string(json) {
            Ok(raw) => pdus.push(raw),
            Err(e) => tracing::error!(%event_id, "stored event is not JSON: {e}"),
        }
    }
    let mut request = send_transaction_message::v1::Request::new(
        OwnedTransactionId::from(txn_id.as_str()),
        state.settings.server_name.clone(),
        MilliSecondsSinceUnixEpoch(UInt::try_from(now).unwrap_or_default()),
    );
    request.pdus = pdus;
    request.edus = edus
        .into_iter()
        .filter_map(|json| match serde_json::value::RawValue::from_string(json) {
            Ok(raw) => Some(ruma::serde::Raw::from_json(raw)),
            Err(e) => {
                tracing::error!("queued EDU is not JSON: {e}");
                None
            }
        })
        .collect();
    match super::send(state, destination, request).await {
        Ok(response) => {
            for (event_id, result) in &response.pdus {
                if let Err(e) = result {
                    tracing::info!(%destination, %event_id, "the destination refused our event: {e}");
                }
            }
            if let Err(e) = store::transaction_sent(&state.db, destination.as_str(), &txn_id).await {
                failed(&e);
                return Err(now + FIRST_BACKOFF_MS);
            }
            Ok(true)
        }
        Err(e) => {
            failed(&e);
            let retry_at = store::transaction_failed(&state.db, destination.as_str(), now, backoff_ms)
                .await
                .unwrap_or(now + FIRST_BACKOFF_MS);
            compact(state, destination).await;
            Err(retry_at)
        }
    }
}

/// The longest a backing-off task sleeps before it looks at its queue again.
const MAX_SLEEP_MS: i64 = 60_000;

/// Keeps what is queued for a destination that does not answer within
/// `federation.max_queued_per_destination`.
async fn compact(state: &AppState, destination: &OwnedServerName) {
    match store::compact_queue(&state.db, destination.as_str(), state.settings.federation_max_queued).await {
        Ok(0) => {}
        Ok(dropped) => tracing::info!(
            %destination,
            dropped,
            "the destination does not answer: kept only the newest queued event of each room"
        ),
        Err(e) => tracing::warn!(%destination, "cannot bound the federation queue: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        assert_eq!(backoff_ms(1), 2_000);
        assert_eq!(backoff_ms(2), 4_000);
        assert_eq!(backoff_ms(5), 32_000);
        assert_eq!(backoff_ms(12), MAX_BACKOFF_MS);
        assert_eq!(backoff_ms(1_000), MAX_BACKOFF_MS);
    }

    #[test]
    fn a_wake_during_a_run_keeps_the_task_going() {
        let sender = Sender::default();
        let dest: OwnedServerName = "other.example".try_into().unwrap();
        assert!(sender.claim(&dest));
        assert!(!sender.claim(&dest));
        assert!(!sender.may_end(&dest));
        assert!(sender.may_end(&dest));
        assert!(sender.claim(&dest));
    }
}
