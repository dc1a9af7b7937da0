//! Rooms: the domain. Every event is a signed PDU of the room's version
//! (`pdu`), authorised by the spec's rules through ruma-state-res and given the
//! room's next position on its seq line (`position`) in the transaction that stores it (`timeline`). Knows
//! nothing of HTTP.

#[cfg(test)]
mod auth_tests;
pub mod backfill;
pub mod cache;
pub mod create;
pub mod directory;
pub mod fields;
pub mod format;
pub mod history;
pub mod hole;
pub mod joins;
pub mod membership;
pub mod pdu;
pub mod position;
pub mod power;
pub mod read;
pub mod redaction;
pub mod relations;
pub mod remote;
pub mod resolution;
pub mod search;
pub mod spaces;
pub mod tally;
pub mod timeline;
pub mod upgrade;
pub mod version;
pub mod visibility;

use ruma::RoomVersionId;
use ruma::room_version_rules::RoomVersionRules;

use crate::error::{Error, Result};

/// The state an invitee or knocker is shown of a room (stripped state),
/// besides the member events of the invitee and the inviter.
pub const STRIPPED_STATE_TYPES: [&str; 7] = [
    "m.room.create",
    "m.room.join_rules",
    "m.room.name",
    "m.room.avatar",
    "m.room.canonical_alias",
    "m.room.encryption",
    "m.room.topic",
];

/// The rules of a stored room's version.
pub fn rules_for(version: &str) -> Result<(RoomVersionId, RoomVersionRules)> {
    let id = RoomVersionId::try_from(version)
        .map_err(|_| Error::Internal(format!("stored room version {version:?} is invalid")))?;
    let rules = id.rules().ok_or_else(|| Error::Internal(format!("room version {version} has no rules")))?;
    Ok((id, rules))
}
