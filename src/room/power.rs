//! Power levels as the client-server rules beyond the auth rules need them
//! (who may redact others' events, change the directory, delete aliases).

use ruma::OwnedUserId;
use ruma::events::room::power_levels::{RoomPowerLevels, RoomPowerLevelsEventContent, RoomPowerLevelsSource};
use ruma::room_version_rules::RoomVersionRules;
use serde_json::Value;

use super::pdu::Pdu;
use super::read::RoomView;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;

/// The room's current power levels, with v12 creators' infinite power.
pub async fn current(state: &AppState, view: &RoomView) -> Result<RoomPowerLevels> {
    super::read::power_levels(state, view).await
}

/// Reads the room's current power levels from its state.
pub(super) async fn load(state: &AppState, view: &RoomView) -> Result<RoomPowerLevels> {
    let room_id = &view.room.room_id;
    let power = match events::state_event(&state.db, room_id, "m.room.power_levels", "").await? {
        Some(stored) => Some(Pdu::from_stored(&stored.event_id, &stored.json)?),
        None => None,
    };
    let create = match events::state_event(&state.db, room_id, "m.room.create", "").await? {
        Some(stored) => Some(Pdu::from_stored(&stored.event_id, &stored.json)?),
        None => None,
    };
    let creator =
        OwnedUserId::try_from(view.room.creator.as_str()).map_err(|e| Error::Internal(e.to_string()))?;
    from_state(&view.rules, power.as_ref(), create.as_ref(), creator)
}

/// Power levels from the room's `m.room.power_levels` and `m.room.create`
/// events (`creator` stands in for the create event's sender when it is not
/// at hand): the v12 creators (the sender and `additional_creators`) have
/// infinite power.
pub fn from_state(
    rules: &RoomVersionRules,
    power_levels: Option<&Pdu>,
    create: Option<&Pdu>,
    creator: OwnedUserId,
) -> Result<RoomPowerLevels> {
    let content = match power_levels {
        Some(pdu) => pdu
            .content_as::<RoomPowerLevelsEventContent>()
            .ok_or_else(|| Error::Internal("stored power levels do not parse".into()))?,
        None => RoomPowerLevelsEventContent::new(&rules.authorization),
    };
    let mut creators = vec![create.map_or(creator, |c| c.sender.clone())];
    if let Some(create) = create {
        let content: Value = create.content_as().unwrap_or_default();
        if let Some(list) = content["additional_creators"].as_array() {
            creators
                .extend(list.iter().filter_map(Value::as_str).filter_map(|s| OwnedUserId::try_from(s).ok()));
        }
    }
    Ok(RoomPowerLevels::new(RoomPowerLevelsSource::Original(content), &rules.authorization, creators))
}
