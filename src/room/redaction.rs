//! Which event a redaction redacts, and whether it may: the one check every
//! path that can carry an `m.room.redaction` passes (`/redact`, `/send`,
//! `/state`, and federation later), called by the write path.
//!
//! The auth rules (room version 3+) let anyone who may send
//! `m.room.redaction` send one; whether it takes effect is decided here: the
//! target must be an event of the same room, and the redaction's sender must
//! have sent it or have the room's `redact` level; a redaction another server
//! sends may also redact what a user of that same server sent (the spec's
//! rule: the server speaks for its own users; Synapse applies it too), never
//! a local one's request for another local user's event.

use ruma::OwnedEventId;
use ruma::events::room::power_levels::RoomPowerLevels;
use ruma::room_version_rules::RoomVersionRules;

use super::pdu::Pdu;
use crate::error::{Error, Result};

/// The target a redaction names, from where its room version reads it; a
/// redaction that names none, or is sent as a state event, is malformed.
/// `None` for events that are no redactions.
pub fn target(rules: &RoomVersionRules, pdu: &Pdu) -> Result<Option<OwnedEventId>> {
    if pdu.kind != ruma::events::TimelineEventType::RoomRedaction {
        return Ok(None);
    }
    if pdu.state_key.is_some() {
        return Err(Error::BadJson("m.room.redaction is not a state event".into()));
    }
    let where_ = if rules.redaction.content_field_redacts { "in its content" } else { "at its top level" };
    pdu.redaction_target(&rules.redaction)
        .cloned()
        .map(Some)
        .ok_or_else(|| Error::BadJson(format!("A redaction in this room version names its event {where_}")))
}

/// Whether `redaction` (whose target is `target`, an event found in room
/// `target_room`) may redact it: an event of another room is the same 404 as
/// an unknown one (the answer must not tell which event ids exist in rooms
/// the sender may not see; `/redact`, which can ask what the caller reads,
/// says 400 for another room's event they can see), 403 when the sender
/// neither sent it nor has the `redact` level. `remote`: the redaction came
/// from another server, which may redact its own users' events.
pub fn check(
    redaction: &Pdu,
    room_id: &str,
    target: &Pdu,
    target_room: &str,
    power: &RoomPowerLevels,
    remote: bool,
) -> Result<()> {
    if target_room != room_id {
        return Err(Error::NotFound("The event to redact is not known in this room".into()));
    }
    let allowed = if target.sender == redaction.sender {
        power.user_can_redact_own_event(&redaction.sender)
    } else {
        power.user_can_redact_event_of_other(&redaction.sender)
            || (remote && redaction.sender.server_name() == target.sender.server_name())
    };
    if allowed { Ok(()) } else { Err(Error::Forbidden("You may not redact this event".into())) }
}
