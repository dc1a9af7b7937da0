//! Power levels as the client-server rules beyond the auth rules need them
//! (who may redact others' events, change the directory, delete aliases).

use ruma::OwnedUserId;
use ruma::events::room::power_levels::{RoomPowerLevels, RoomPowerLevelsEventContent, RoomPowerLevelsSource};
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
    let content = match events::state_event(&state.db, room_id, "m.room.power_levels", "").await? {
        Some(stored) => Pdu::from_stored(&stored.event_id, &stored.json)?
            .content_as::<RoomPowerLevelsEventContent>()
            .ok_or_else(|| Error::Internal("stored power levels do not parse".into()))?,
        None => RoomPowerLevelsEventContent::new(&view.rules.authorization),
    };
    let mut creators =
        vec![OwnedUserId::try_from(view.room.creator.as_str()).map_err(|e| Error::Internal(e.to_string()))?];
    if let Some(create) = events::state_event(&state.db, room_id, "m.room.create", "").await? {
        let content: Value =
            Pdu::from_stored(&create.event_id, &create.json)?.content_as().unwrap_or_default();
        if let Some(list) = content["additional_creators"].as_array() {
            creators
                .extend(list.iter().filter_map(Value::as_str).filter_map(|s| OwnedUserId::try_from(s).ok()));
        }
    }
    Ok(RoomPowerLevels::new(RoomPowerLevelsSource::Original(content), &view.rules.authorization, creators))
}
