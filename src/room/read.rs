//! The read side of rooms: loading stored events, a user's membership history
//! in a room (the changes on the seq line, from which `unsigned.membership` and
//! — in the membership-ranges work — every visibility decision follow), and the
//! client formatting of what was loaded.

use ruma::room_version_rules::RoomVersionRules;
use ruma::{RoomId, UserId};
use serde_json::Value;

use super::format::{Viewer, client_event};
use super::pdu::Pdu;
use crate::account::Requester;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events::{self, StoredEvent};
use crate::storage::rooms::{self, RoomRow};

/// A room opened for reading.
#[derive(Debug, Clone)]
pub struct RoomView {
    /// Its row.
    pub room: RoomRow,
    /// Its version's rules.
    pub rules: RoomVersionRules,
}

/// Opens a room; an unknown room is 404.
pub async fn open(state: &AppState, room_id: &RoomId) -> Result<RoomView> {
    let room = rooms::get(&state.db, room_id.as_str())
        .await?
        .ok_or_else(|| Error::NotFound("Unknown room".into()))?;
    let (_, rules) = super::rules_for(&room.room_version)?;
    Ok(RoomView { room, rules })
}

/// One user's membership changes in one room, in seq order.
#[derive(Debug, Clone, Default)]
pub struct MembershipHistory {
    changes: Vec<(i64, String)>,
}

impl MembershipHistory {
    /// Loads the history.
    pub async fn load(state: &AppState, room_id: &RoomId, user_id: &UserId) -> Result<Self> {
        Ok(Self { changes: events::membership_changes(&state.db, room_id.as_str(), user_id.as_str()).await? })
    }

    /// The membership in force after the event at `seq` ("leave" before any).
    pub fn at(&self, seq: i64) -> &str {
        let idx = self.changes.partition_point(|(s, _)| *s <= seq);
        if idx == 0 { "leave" } else { &self.changes[idx - 1].1 }
    }

    /// The current membership.
    pub fn current(&self) -> &str {
        self.changes.last().map_or("leave", |(_, m)| m.as_str())
    }
}

/// Refuses users who are not joined to the room now.
pub async fn require_joined(
    state: &AppState,
    room_id: &RoomId,
    user_id: &UserId,
) -> Result<MembershipHistory> {
    let history = MembershipHistory::load(state, room_id, user_id).await?;
    if history.current() != "join" {
        return Err(Error::Forbidden("You are not joined to this room".into()));
    }
    Ok(history)
}

/// A stored event with what serving it needs.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The row.
    pub stored: StoredEvent,
    /// The parsed PDU.
    pub pdu: Pdu,
    /// The redaction that redacted it.
    pub redaction: Option<Pdu>,
}

/// Loads an event with its redaction, if any.
pub async fn load(state: &AppState, stored: StoredEvent) -> Result<Loaded> {
    let pdu = Pdu::from_stored(&stored.event_id, &stored.json)?;
    let redaction = match &stored.redacted_by {
        Some(id) => match events::by_id(&state.db, id).await? {
            Some(r) => Some(Pdu::from_stored(&r.event_id, &r.json)?),
            None => None,
        },
        None => None,
    };
    Ok(Loaded { stored, pdu, redaction })
}

/// Loads an event by id; 404 when unknown.
pub async fn load_by_id(state: &AppState, event_id: &str) -> Result<Loaded> {
    let stored =
        events::by_id(&state.db, event_id).await?.ok_or_else(|| Error::NotFound("Event not found".into()))?;
    load(state, stored).await
}

/// Formats loaded events for `requester`, with `unsigned.membership` from
/// `history`.
pub fn format(view: &RoomView, loaded: &Loaded, requester: &Requester, history: &MembershipHistory) -> Value {
    let membership = history.at(loaded.stored.seq);
    client_event(
        &loaded.stored,
        &loaded.pdu,
        &view.rules,
        loaded.redaction.as_ref(),
        Some(Viewer { requester, membership }),
    )
}
