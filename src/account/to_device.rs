//! To-device messages, from our users and from other servers' users.
//!
//! A local sender's request (`/sendToDevice`) is taken once per
//! transaction id: messages for our users' devices are stored for their
//! next /sync, those for other servers' users are queued, in the same
//! database transaction, as one `m.direct_to_device` EDU per server (with a
//! `message_id` of its own, so a resent federation transaction is taken
//! once there). A received EDU is taken once per (origin, sender,
//! `message_id`) and delivers to our users only. Both ways, a sender may
//! have at most [`MAX_PENDING`] undelivered messages per device, and at
//! most [`MAX_PENDING`] EDUs waiting for one other server (one that does
//! not answer keeps them until it does); past either, nothing of the
//! request is stored (429).

use std::collections::BTreeMap;

use ruma::{OwnedUserId, ServerName, UserId};
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{self, devices, events, keys};
use crate::streams::Change;

/// Most undelivered to-device messages one sender may have queued for one
/// device, and most `m.direct_to_device` EDUs for one other server.
pub const MAX_PENDING: i64 = 1000;

/// Which of a user's devices a message is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One device.
    Device(String),
    /// All of them (`*`).
    All,
}

/// One message: for whom, and its content (JSON text).
#[derive(Debug, Clone)]
pub struct Message {
    /// The recipient.
    pub user: OwnedUserId,
    /// Which of their devices.
    pub target: Target,
    /// The content, as JSON text.
    pub content: String,
}

/// A local user's `/sendToDevice` (`txn_id` from its path): stored for our
/// users, queued for other servers' users; a transaction id seen before
/// does nothing.
pub async fn send_local(
    state: &AppState,
    sender: &UserId,
    sender_device: &str,
    event_type: &str,
    txn_id: &str,
    messages: Vec<Message>,
) -> Result<()> {
    let scope = format!("sendToDevice/{event_type}");
    let txn = events::Txn { user_id: sender.as_str(), device_id: sender_device, scope: &scope, txn_id };
    {
        let mut conn = state.db.pool.acquire().await?;
        if events::txn_event(&mut conn, txn).await?.is_some() {
            return Ok(());
        }
    }
    let ours = &state.settings.server_name;
    let (local, remote): (Vec<Message>, Vec<Message>) =
        messages.into_iter().partition(|m| m.user.server_name() == ours);
    let mut edus: BTreeMap<String, Value> = BTreeMap::new();
    if state.settings.federation.is_some() {
        for message in remote {
            let server = message.user.server_name().to_string();
            let edu = edus.entry(server).or_insert_with(|| {
                json!({ "edu_type": "m.direct_to_device", "content": {
                    "sender": sender, "type": event_type, "message_id": message_id(), "messages": {},
                } })
            });
            let device = match &message.target {
                Target::Device(d) => d.as_str(),
                Target::All => "*",
            };
            let content: Value = serde_json::from_str(&message.content).unwrap_or_default();
            edu["content"]["messages"][message.user.as_str()][device] = content;
        }
    }
    deliver(state, txn, sender, event_type, local, edus).await
}

/// An `m.direct_to_device` EDU from `origin` (its `content`): delivered to
/// our users' devices once per `message_id`.
pub async fn receive_remote(state: &AppState, origin: &ServerName, content: &Value) -> Result<()> {
    let sender = content["sender"]
        .as_str()
        .and_then(|s| UserId::parse(s).ok())
        .ok_or_else(|| Error::BadJson("The to-device EDU names no sender".into()))?;
    if sender.server_name() != origin {
        return Err(Error::Forbidden(format!("{origin} cannot speak for {sender}")));
    }
    let event_type = content["type"].as_str().filter(|t| !t.is_empty() && t.len() <= 255);
    let event_type = event_type.ok_or_else(|| Error::BadJson("The to-device EDU names no type".into()))?;
    let message_id = content["message_id"].as_str().filter(|m| !m.is_empty() && m.len() <= 255);
    let message_id =
        message_id.ok_or_else(|| Error::BadJson("The to-device EDU has no message_id".into()))?;
    let ours = &state.settings.server_name;
    let mut messages = content["messages"].as_object().map(messages_of).unwrap_or_default();
    messages.retain(|m| m.user.server_name() == ours);
    let txn = events::Txn {
        user_id: sender.as_str(),
        device_id: origin.as_str(),
        scope: "m.direct_to_device",
        txn_id: message_id,
    };
    deliver(state, txn, &sender, event_type, messages, BTreeMap::new()).await
}

/// A fresh `message_id`.
fn message_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..24).map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8)).collect()
}

/// Stores `local` for our users' devices that exist and queues `edus` (per
/// server) in one transaction, claimed as `txn` (taken before: nothing).
async fn deliver(
    state: &AppState,
    txn: events::Txn<'_>,
    sender: &UserId,
    event_type: &str,
    local: Vec<Message>,
    edus: BTreeMap<String, Value>,
) -> Result<()> {
    // Only devices that exist get messages (`*`: all of the user's).
    let mut recipients: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut known: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in local {
        let user = message.user.as_str();
        if !known.contains_key(user) {
            let devices = devices::list(&state.db, user).await?.into_iter().map(|d| d.device_id).collect();
            known.insert(user.to_owned(), devices);
        }
        let wanted = |d: &&String| match &message.target {
            Target::All => true,
            Target::Device(id) => id == *d,
        };
        for device in known[user].iter().filter(wanted) {
            recipients.entry(user.to_owned()).or_default().push((device.clone(), message.content.clone()));
        }
    }
    let reservation = state.streams.reserve();
    let mut tx = state.db.begin_write().await?;
    // One sender's requests count their queued messages one after the other.
    storage::users::lock_for_count(&state.db, tx.conn(), sender.as_str()).await?;
    if !events::claim_txn(tx.conn(), txn, "", storage::now_ms()).await? {
        // The same transaction, sent again meanwhile, is being or was stored.
        return Ok(());
    }
    for (user, list) in &recipients {
        // One grouped count per recipient (not one per device) while the
        // write slot is held.
        let pending = keys::pending_to_device(tx.conn(), user, sender.as_str()).await?;
        for (device, content) in list {
            if pending.get(device).is_some_and(|n| *n >= MAX_PENDING) {
                // Nothing of the request is stored: the transaction is dropped.
                return Err(Error::LimitExceeded { retry_after_ms: 10_000 });
            }
            keys::put_to_device(
                tx.conn(),
                user,
                device,
                reservation.pos,
                sender.as_str(),
                event_type,
                content,
            )
            .await?;
        }
    }
    for (server, edu) in &edus {
        // Keyed by sender, so that what one sender has waiting for a server
        // that does not answer is counted and bounded like a device's.
        let prefix = format!("to-device {sender} ");
        let waiting =
            storage::federation::queued_edus_with_prefix(tx.conn(), server, &prefix, MAX_PENDING).await?;
        if waiting >= MAX_PENDING {
            return Err(Error::LimitExceeded { retry_after_ms: 10_000 });
        }
        let key = format!("{prefix}{}", edu["content"]["message_id"].as_str().unwrap_or_default());
        storage::federation::enqueue_edu_tx(tx.conn(), std::slice::from_ref(server), &key, &edu.to_string())
            .await?;
    }
    tx.commit().await?;
    reservation.finish(Change::ToDevice { users: recipients.keys().cloned().collect() });
    state.notifier.wake(recipients.keys().map(String::as_str));
    crate::federation::sender::wake(state, edus.keys().map(String::as_str));
    Ok(())
}

/// The messages of a `/sendToDevice` body (`messages`: user -> device or
/// `*` -> content).
pub fn messages_of(body: &Map<String, Value>) -> Vec<Message> {
    let mut out = Vec::new();
    for (user, per_device) in body {
        let Ok(user) = UserId::parse(user.as_str()) else { continue };
        for (device, content) in per_device.as_object().into_iter().flatten() {
            let target = if device == "*" { Target::All } else { Target::Device(device.clone()) };
            out.push(Message { user: user.clone(), target, content: content.to_string() });
        }
    }
    out
}
