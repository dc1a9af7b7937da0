//! Presence, kept in memory: each change takes a stream position (nothing is
//! written), so `/sync` reports it like any other change and wakes those who
//! share a room with the user.

use std::collections::HashMap;
use std::sync::Mutex;

use ruma::UserId;
use serde_json::{Value, json};

use crate::error::Result;
use crate::state::AppState;

/// Sets `user`'s presence (unless presence is switched off) at a new stream
/// position and wakes the syncs of those who share a room with them.
pub async fn update(
    state: &AppState,
    user: &UserId,
    presence: &str,
    status_msg: Option<String>,
) -> Result<()> {
    if !state.settings.presence_enabled {
        return Ok(());
    }
    let reservation = state.streams.reserve();
    state.presence.set(
        user.as_str(),
        presence,
        status_msg.clone(),
        crate::storage::now_ms(),
        reservation.pos,
    );
    reservation.finish(crate::streams::Change::Presence);
    let peers = super::room_peers(state, user).await?;
    state.notifier.wake(peers.iter().map(String::as_str));
    let edu = crate::federation::edus::Outgoing::Presence {
        user_id: user.to_owned(),
        presence: presence.to_owned(),
        status_msg,
        last_active_ago: 0,
    };
    crate::federation::edus::announce(state, edu).await;
    Ok(())
}

/// Another server's user's presence, as their server says (`last_active_ago`
/// ms ago): kept only when they share a room with one of ours (who are then
/// woken), never announced again.
pub async fn update_remote(
    state: &AppState,
    user: &UserId,
    presence: &str,
    status_msg: Option<String>,
    last_active_ago: i64,
) -> Result<()> {
    if !state.settings.presence_enabled {
        return Ok(());
    }
    let ours = state.settings.server_name.as_str();
    let peers = super::room_peers(state, user).await?;
    let local: Vec<&str> = peers
        .iter()
        .map(String::as_str)
        .filter(|p| p.split_once(':').is_some_and(|(_, s)| s == ours))
        .collect();
    if local.is_empty() {
        return Err(crate::error::Error::Forbidden(format!("{user} shares no room with a user here")));
    }
    let reservation = state.streams.reserve();
    let active = crate::storage::now_ms() - last_active_ago;
    state.presence.set(user.as_str(), presence, status_msg, active, reservation.pos);
    reservation.finish(crate::streams::Change::Presence);
    state.notifier.wake(local);
    Ok(())
}

/// A /sync with `set_presence` (default `online`): a user with no presence
/// or offline comes online (or unavailable); a presence they set themselves
/// is kept, and only its last-active time moves.
pub async fn touch_from_sync(state: &AppState, user: &UserId, set_presence: &str) -> Result<()> {
    if !state.settings.presence_enabled || set_presence == "offline" {
        return Ok(());
    }
    let changes = state.presence.touch(user.as_str(), crate::storage::now_ms());
    if changes {
        update(state, user, set_presence, None).await?;
    }
    Ok(())
}

/// One user's presence.
#[derive(Debug, Clone)]
pub struct Presence {
    /// `online`, `unavailable` or `offline`.
    pub state: String,
    /// Free text.
    pub status_msg: Option<String>,
    /// When they were last active, ms since the epoch.
    pub last_active_ts: i64,
    /// Stream position of the change.
    pub stream: i64,
}

/// Everyone's presence.
#[derive(Debug, Default)]
pub struct PresenceMap {
    users: Mutex<HashMap<String, Presence>>,
}

impl PresenceMap {
    /// Sets a user's presence at stream position `stream`.
    pub fn set(&self, user: &str, state: &str, status_msg: Option<String>, now: i64, stream: i64) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.insert(
            user.to_owned(),
            Presence { state: state.to_owned(), status_msg, last_active_ts: now, stream },
        );
    }

    /// Marks `user` active now; true when they have no presence or are
    /// offline (the caller then sets one, at a new stream position).
    pub fn touch(&self, user: &str, now: i64) -> bool {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        match users.get_mut(user) {
            Some(p) if p.state != "offline" => {
                p.last_active_ts = now;
                false
            }
            _ => true,
        }
    }

    /// Whether nobody has set a presence yet.
    pub fn is_empty(&self) -> bool {
        self.users.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// A user's presence.
    pub fn get(&self, user: &str) -> Option<Presence> {
        self.users.lock().unwrap_or_else(|e| e.into_inner()).get(user).cloned()
    }

    /// `m.presence` events of `users` changed in `(after, upto]` (all known
    /// ones when `after` is `None`).
    pub fn events(&self, users: &[String], after: Option<i64>, upto: i64, now: i64) -> Vec<Value> {
        let map = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for user in users {
            if let Some(p) = map.get(user)
                && p.stream <= upto
                && after.is_none_or(|a| p.stream > a)
            {
                let mut content = json!({
                    "presence": p.state,
                    "last_active_ago": (now - p.last_active_ts).max(0),
                    "currently_active": p.state == "online",
                });
                if let Some(msg) = &p.status_msg {
                    content["status_msg"] = json!(msg);
                }
                out.push(json!({ "type": "m.presence", "sender": user, "content": content }));
            }
        }
        out
    }
}
