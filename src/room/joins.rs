//! Restricted joins (join rules `restricted` and `knock_restricted`): a user
//! may join when they are joined to one of the rooms the rule's `allow` list
//! names, and the join event then names, in
//! `join_authorised_via_users_server`, a member of this server who may invite.
//! That member is chosen here, by the server, in the write path every local
//! join passes; a client that supplies the field itself is refused, so nobody
//! can name an authoriser of their own choosing.

use ruma::canonical_json::CanonicalJsonValue;
use serde_json::Value;

use super::pdu::Draft;
use super::timeline::{RoomWriter, member_value};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;

/// The most entries of a join rule's `allow` list looked at.
const MAX_ALLOWED_ROOMS: usize = 50;

/// The member event field that names who authorised a restricted join.
pub const AUTHORISER_FIELD: &str = "join_authorised_via_users_server";

/// Checks a local member event before it is built: refuses a client-supplied
/// authoriser, and for a join that the room's restricted rule must allow,
/// returns the draft with the authoriser the server chose. `None` when the
/// draft goes as it is.
pub(super) async fn prepare(
    writer: &mut RoomWriter,
    state: &AppState,
    draft: &Draft,
) -> Result<Option<Draft>> {
    if draft.kind != "m.room.member" {
        return Ok(None);
    }
    let sender = draft.sender.as_str();
    if member_value(&draft.kind, &draft.content) == Some("knock") && !writer.rules.authorization.knocking {
        // The auth rules refuse it too; this says why (as Synapse does).
        return Err(Error::Forbidden(format!("Room version {} does not support knocking", writer.version)));
    }
    let own_join = member_value(&draft.kind, &draft.content) == Some("join")
        && draft.state_key.as_deref() == Some(sender);
    let current = match &draft.state_key {
        Some(target) => {
            writer.state_event("m.room.member", target).await?.and_then(|p| p.content_as::<Value>())
        }
        None => None,
    };
    let was = current.as_ref().and_then(|c| c["membership"].as_str().map(str::to_owned));
    if draft.content.contains_key(AUTHORISER_FIELD) {
        if own_join && was.as_deref() == Some("join") {
            // A member changing their member event (a display name, say)
            // copies its content: the field counts only on the way in, so
            // it is dropped, not refused.
            let mut draft = draft.clone();
            draft.content.remove(AUTHORISER_FIELD);
            return Ok(Some(draft));
        }
        return Err(Error::Forbidden(format!(
            "{AUTHORISER_FIELD} is chosen by the server, not by the client"
        )));
    }
    if !own_join || matches!(was.as_deref(), Some("join" | "invite")) {
        // Members and invitees join whatever the rule says.
        return Ok(None);
    }
    let rules: Value =
        writer.state_event("m.room.join_rules", "").await?.and_then(|p| p.content_as()).unwrap_or_default();
    let auth = &writer.rules.authorization;
    let (rule, supported) = match rules["join_rule"].as_str() {
        Some(rule @ "restricted") => (rule, auth.restricted_join_rule),
        Some(rule @ "knock_restricted") => (rule, auth.knock_restricted_join_rule),
        _ => return Ok(None),
    };
    if !supported {
        // A join rule the version does not know lets nobody in (the auth
        // rules refuse the join too; this says why).
        return Err(Error::Forbidden(format!(
            "Room version {} does not support the {rule} join rule: nobody can join under it",
            writer.version
        )));
    }
    // Each allowed room costs a lookup inside the room's write lock: only
    // the first MAX_ALLOWED_ROOMS count.
    let allowed_rooms =
        rules["allow"].as_array().into_iter().flatten().take(MAX_ALLOWED_ROOMS).filter_map(|entry| {
            (entry["type"] == "m.room_membership").then(|| entry["room_id"].as_str()).flatten()
        });
    let mut in_allowed_room = false;
    for room in allowed_rooms.collect::<Vec<_>>() {
        if events::membership_tx(writer.conn(), room, sender).await?.as_deref() == Some("join") {
            in_allowed_room = true;
            break;
        }
    }
    if !in_allowed_room {
        return Err(Error::Forbidden(
            "This room can only be joined by members of the rooms its join rule names, and you are in none of them"
                .into(),
        ));
    }
    // The most powerful member who may invite authorises (ties: the first
    // user id).
    let power = writer.power_levels().await?;
    let room_id = writer.room_id.to_string();
    let authoriser = events::joined_members_tx(writer.conn(), &room_id)
        .await?
        .into_iter()
        .filter_map(|u| ruma::OwnedUserId::try_from(u).ok())
        .filter(|u| u.server_name() == state.settings.server_name && power.user_can_invite(u))
        .max_by(|a, b| power.for_user(a).cmp(&power.for_user(b)).then_with(|| b.cmp(a)))
        .ok_or_else(|| {
            Error::Forbidden("No member of this room on this server may authorise your join".into())
        })?;
    let mut draft = draft.clone();
    draft.content.insert(AUTHORISER_FIELD.into(), CanonicalJsonValue::String(authoriser.to_string()));
    Ok(Some(draft))
}
