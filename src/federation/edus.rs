//! EDUs, both ways: typing notices, read receipts and presence (and, in,
//! to-device messages, which `account::to_device` queues and takes, and
//! device-list and signing-key updates, which tell our users to ask again).
//!
//! Out: what a local user does that other servers show ([`Outgoing`]) is
//! handed over through [`announce`], the one door the domain uses, for
//! every server with a user in the room (for presence and key changes:
//! every server sharing a room with the user). Receipts, presence and key
//! changes are queued durably per destination (`fed_edu_outbox`); typing
//! notices, which would be wrong replayed after a crash or a long outage,
//! wait in the sender's memory only (`sender::Sender::queue_ephemeral`) and
//! reach the destination without a database write. Either way a newer EDU
//! about the same thing replaces one not sent yet, so a server that is away
//! gets the last word, not every keystroke; the sender puts at most 100
//! into a transaction beside its PDUs.
//!
//! In ([`receive`]): a server speaks only for its own users, in rooms they
//! are joined to, and not where the room's server ACL denies it. Each EDU
//! then goes through the same domain write as a local one (the typing
//! notice, the receipt with its visibility check), so one rule holds for
//! both. An EDU that fails is dropped alone (logged): it never fails the
//! transaction or its PDUs.

use std::collections::BTreeSet;
use std::time::Duration;

use ruma::{OwnedRoomId, OwnedUserId, RoomId, ServerName, UserId};
use serde_json::value::RawValue as RawJsonValue;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::room::read;
use crate::state::AppState;
use crate::storage::{self, federation as store};

/// How long a typing notice from another server lasts without a renewal
/// (servers do not say; Synapse holds remote ones as long).
const REMOTE_TYPING: Duration = Duration::from_secs(60);

/// Most presence updates taken from one received transaction.
const MAX_PRESENCE_PUSHES: usize = 500;

/// Something a local user did that other servers show.
#[derive(Debug, Clone)]
pub enum Outgoing {
    /// Started or stopped typing in a room.
    Typing {
        /// The room.
        room_id: OwnedRoomId,
        /// Who.
        user_id: OwnedUserId,
        /// Started (true) or stopped.
        typing: bool,
    },
    /// A public read receipt (`m.read`; private ones never leave).
    Receipt {
        /// The room.
        room_id: OwnedRoomId,
        /// Who read.
        user_id: OwnedUserId,
        /// Up to which event.
        event_id: String,
        /// The thread (`None`: unthreaded).
        thread_id: Option<String>,
        /// When, ms since the epoch.
        ts: i64,
    },
    /// Something about a user's devices or keys (`m.device_list_update`,
    /// `m.signing_key_update`), for the servers sharing a room with them;
    /// `key` names it in the queue.
    AboutUser {
        /// Whose.
        user_id: OwnedUserId,
        /// What it is about (a newer one with the same key replaces it).
        key: String,
        /// The whole EDU.
        edu: Value,
    },
    /// A presence change (only when presence is on).
    Presence {
        /// Whose.
        user_id: OwnedUserId,
        /// `online`, `unavailable` or `offline`.
        presence: String,
        /// Free text.
        status_msg: Option<String>,
        /// Ms since they were last active.
        last_active_ago: i64,
    },
}

impl Outgoing {
    /// Whether it is kept in memory only on its way out (a typing notice:
    /// stale within seconds, wrong if replayed after a restart).
    fn is_ephemeral(&self) -> bool {
        matches!(self, Self::Typing { .. })
    }

    /// The EDU's JSON and what it is about (a newer one with the same key
    /// replaces it in the queue).
    fn to_edu(&self) -> (String, Value) {
        match self {
            Self::Typing { room_id, user_id, typing } => (
                format!("typing {room_id} {user_id}"),
                json!({ "edu_type": "m.typing", "content": {
                    "room_id": room_id, "user_id": user_id, "typing": typing,
                } }),
            ),
            Self::Receipt { room_id, user_id, event_id, thread_id, ts } => {
                let mut data = json!({ "ts": ts });
                if let Some(thread) = thread_id {
                    data["thread_id"] = json!(thread);
                }
                (
                    format!("receipt {room_id} {user_id} m.read {}", thread_id.as_deref().unwrap_or("")),
                    json!({ "edu_type": "m.receipt", "content": { room_id.as_str(): { "m.read": {
                        user_id.as_str(): { "event_ids": [event_id], "data": data },
                    } } } }),
                )
            }
            Self::AboutUser { key, edu, .. } => (key.clone(), edu.clone()),
            Self::Presence { user_id, presence, status_msg, last_active_ago } => {
                let mut push = json!({
                    "user_id": user_id,
                    "presence": presence,
                    "last_active_ago": last_active_ago,
                    "currently_active": presence == "online",
                });
                if let Some(msg) = status_msg {
                    push["status_msg"] = json!(msg);
                }
                (
                    format!("presence {user_id}"),
                    json!({ "edu_type": "m.presence", "content": { "push": [push] } }),
                )
            }
        }
    }
}

/// Queues `edu` for the servers that should see it and wakes their
/// senders: a typing notice in memory, anything else durably. Failing to
/// queue is logged, never the caller's error: the local write it follows
/// has happened.
pub async fn announce(state: &AppState, edu: Outgoing) {
    if state.settings.federation.is_none() {
        return;
    }
    match destinations(state, &edu).await {
        Ok(destinations) => queue(state, edu, &destinations).await,
        Err(e) => tracing::warn!("cannot find where an EDU goes: {e}"),
    }
}

/// [`announce`] of an EDU of the open room `view` (a typing notice, a
/// receipt): its servers as the read cache keeps them.
pub async fn announce_in(state: &AppState, view: &read::RoomView, edu: Outgoing) {
    if state.settings.federation.is_none() {
        return;
    }
    match read::servers_in_room(state, view).await {
        Ok(servers) => queue(state, edu, &others(state, servers)).await,
        Err(e) => tracing::warn!("cannot find where an EDU goes: {e}"),
    }
}

/// Queues `edu` for `destinations` (in memory or durably, see [`announce`])
/// and wakes them.
async fn queue(state: &AppState, edu: Outgoing, destinations: &[String]) {
    if destinations.is_empty() {
        return;
    }
    let (key, value) = edu.to_edu();
    if edu.is_ephemeral() {
        state.federation_sender.queue_ephemeral(destinations, &key, &value.to_string());
        super::sender::wake_ephemeral(state, destinations.iter().map(String::as_str));
        return;
    }
    match store::enqueue_edu(&state.db, destinations, &key, &value.to_string()).await {
        Ok(()) => super::sender::wake(state, destinations.iter().map(String::as_str)),
        Err(e) => tracing::warn!("cannot queue an EDU: {e}"),
    }
}

/// `servers` less this one.
fn others(state: &AppState, servers: impl IntoIterator<Item = String>) -> Vec<String> {
    let ours = state.settings.server_name.as_str();
    servers.into_iter().filter(|s| s != ours).collect()
}

/// The other servers `edu` goes to.
async fn destinations(state: &AppState, edu: &Outgoing) -> Result<Vec<String>> {
    let servers: BTreeSet<String> = match edu {
        Outgoing::Typing { room_id, .. } | Outgoing::Receipt { room_id, .. } => {
            store::servers_in_room(&state.db, room_id.as_str()).await?.into_iter().collect()
        }
        Outgoing::Presence { user_id, .. } | Outgoing::AboutUser { user_id, .. } => {
            crate::sync::room_peers(state, user_id)
                .await?
                .iter()
                .filter_map(|peer| peer.split_once(':').map(|(_, server)| server.to_owned()))
                .collect()
        }
    };
    Ok(others(state, servers))
}

/// The `edu_type` of a received EDU, if it names one.
fn edu_type(raw: &RawJsonValue) -> Option<&str> {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(borrow)]
        edu_type: Option<&'a str>,
    }
    serde_json::from_str::<Kind<'_>>(raw.get()).ok().and_then(|k| k.edu_type)
}

/// Whether an EDU of `kind` is taken before the PDUs of its transaction:
/// to-device messages and key changes are, so that a room key sent just
/// before an encrypted message is there when a client reads the message;
/// the room's own EDUs (typing, receipts, presence) come after the PDUs,
/// which may be what makes their users members.
pub fn before_pdus(raw: &RawJsonValue) -> bool {
    edu_type(raw).is_some_and(|kind| {
        matches!(kind, "m.direct_to_device" | "m.device_list_update" | "m.signing_key_update")
    })
}

/// Whether taking the EDU again, right after it was taken (a transaction
/// sent again), changes nothing, so that a transaction of such EDUs alone
/// needs no record to be answered from: a typing notice (who types is set
/// to what it already is) and a to-device message (each is claimed by its
/// sender and `message_id` in the write that stores it, for good:
/// `account::to_device::receive_remote`). Receipts, presence and key
/// changes would be announced to our users again.
pub fn same_when_repeated(raw: &RawJsonValue) -> bool {
    edu_type(raw).is_some_and(|kind| matches!(kind, "m.typing" | "m.direct_to_device"))
}

/// Takes the EDUs of a transaction from `origin`, each on its own.
pub async fn receive(state: &AppState, origin: &ServerName, edus: &[&RawJsonValue]) {
    for raw in edus {
        let Ok(edu) = serde_json::from_str::<Value>(raw.get()) else {
            tracing::info!(%origin, "dropped an EDU that is not a JSON object");
            continue;
        };
        let kind = edu["edu_type"].as_str().unwrap_or_default();
        let content = &edu["content"];
        let taken = match kind {
            "m.typing" => typing(state, origin, content).await,
            "m.receipt" => receipts(state, origin, content).await,
            "m.presence" => presence(state, origin, content).await,
            "m.direct_to_device" => crate::account::to_device::receive_remote(state, origin, content).await,
            "m.device_list_update" | "m.signing_key_update" => {
                device_list(state, origin, kind, content).await
            }
            _ => Ok(()),
        };
        if let Err(e) = taken {
            tracing::info!(%origin, edu_type = kind, "dropped an EDU: {e}");
        }
    }
}

/// `user` (a string from the EDU) as a user of `origin`.
fn user_of(origin: &ServerName, user: &Value) -> Result<OwnedUserId> {
    let user = user
        .as_str()
        .and_then(|u| UserId::parse(u).ok())
        .ok_or_else(|| Error::BadJson("The EDU names no valid user".into()))?;
    if user.server_name() != origin {
        return Err(Error::Forbidden(format!("{origin} cannot speak for {user}")));
    }
    Ok(user)
}

/// `room` (a string from the EDU) as a room `origin` may speak in, opened:
/// we have it and its server ACL lets `origin` in. What an EDU's room is
/// checked for moves only with state events: a kept row will do
/// ([`read::open_kept`]).
async fn room_of(state: &AppState, origin: &ServerName, room: &str) -> Result<(OwnedRoomId, read::RoomView)> {
    let room_id = RoomId::parse(room).map_err(|_| Error::BadJson("The EDU names no valid room".into()))?;
    let view = read::open_kept(state, &room_id).await?;
    super::acl::check_in(state, &view, origin).await?;
    Ok((room_id, view))
}

async fn typing(state: &AppState, origin: &ServerName, content: &Value) -> Result<()> {
    let user = user_of(origin, &content["user_id"])?;
    let (_, view) = room_of(state, origin, content["room_id"].as_str().unwrap_or_default()).await?;
    let typing = content["typing"].as_bool().unwrap_or(false);
    crate::sync::writes::set_typing_in(state, &view, &user, typing.then_some(REMOTE_TYPING)).await
}

async fn receipts(state: &AppState, origin: &ServerName, content: &Value) -> Result<()> {
    let Some(rooms) = content.as_object() else {
        return Err(Error::BadJson("Receipts come as an object of rooms".into()));
    };
    for (room, types) in rooms {
        let room_id = match room_of(state, origin, room).await {
            Ok((room_id, _)) => room_id,
            Err(e) => {
                tracing::info!(%origin, %room, "dropped receipts: {e}");
                continue;
            }
        };
        // Only public read receipts cross servers.
        let Some(users) = types["m.read"].as_object() else { continue };
        for (user, receipt) in users {
            let taken = async {
                let user = user_of(origin, &json!(user))?;
                let event_id = receipt["event_ids"]
                    .as_array()
                    .and_then(|ids| ids.last())
                    .and_then(Value::as_str)
                    .ok_or_else(|| Error::BadJson("A receipt names no event".into()))?;
                let thread = receipt["data"]["thread_id"].as_str();
                crate::sync::writes::set_receipt(state, &user, &room_id, "m.read", thread, event_id).await
            };
            if let Err(e) = taken.await {
                tracing::info!(%origin, %room, %user, "dropped a receipt: {e}");
            }
        }
    }
    Ok(())
}

async fn presence(state: &AppState, origin: &ServerName, content: &Value) -> Result<()> {
    if !state.settings.presence_enabled {
        return Ok(());
    }
    let pushes = content["push"].as_array().map_or(&[][..], Vec::as_slice);
    for push in pushes.iter().take(MAX_PRESENCE_PUSHES) {
        let taken = async {
            let user = user_of(origin, &push["user_id"])?;
            let presence = match push["presence"].as_str() {
                Some(p @ ("online" | "unavailable" | "offline")) => p,
                _ => return Err(Error::BadJson("Unknown presence".into())),
            };
            let ago = push["last_active_ago"].as_i64().unwrap_or(0).clamp(0, storage::now_ms());
            let status = push["status_msg"].as_str().map(|s| s.chars().take(1024).collect());
            crate::sync::presence::update_remote(state, &user, presence, status, ago).await
        };
        if let Err(e) = taken.await {
            tracing::info!(%origin, "dropped a presence update: {e}");
        }
    }
    Ok(())
}

/// A device or cross-signing key of another server's user changed: the
/// device list held here for them follows (or goes stale: see
/// `account::key_query::remote_device_update`), and our users who share a
/// room with them are told (`device_lists.changed` in their /sync,
/// `/keys/changes`) and ask for the keys again. Only for a user who shares
/// a room with one of ours.
async fn device_list(state: &AppState, origin: &ServerName, kind: &str, content: &Value) -> Result<()> {
    let user = user_of(origin, &content["user_id"])?;
    let ours = state.settings.server_name.as_str();
    let peers = crate::sync::room_peers(state, &user).await?;
    if !peers.iter().any(|p| p.split_once(':').is_some_and(|(_, server)| server == ours)) {
        return Err(Error::Forbidden(format!("{user} shares no room with a user here")));
    }
    let held = if kind == "m.signing_key_update" {
        crate::account::key_query::remote_signing_update(state, &user, content).await
    } else {
        crate::account::key_query::remote_device_update(state, &user, content).await
    };
    // Told either way: a client asking again gets the list asked for anew.
    crate::account::e2ee::device_list_changed(state, &user, crate::account::e2ee::DeviceChange::Remote)
        .await?;
    held
}
