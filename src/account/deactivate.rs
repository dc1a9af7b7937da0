//! Account deactivation (`POST /account/deactivate`): the account can never
//! be used or registered again. In order: the account is marked (no login,
//! no token resolves from then on), every device goes with its token, keys
//! and pushers, the user leaves every room they are joined to, invited to
//! or knocking on (remote invites are turned down at the inviting server),
//! and what the server keeps for them alone is deleted: profile, account
//! data and filters, room-key backups, cross-signing keys. The member events
//! and messages they sent stay in the rooms' history, as the spec says; with
//! `erase`, they are served redacted to everyone who was not joined when they
//! were sent (those who were keep what they saw).

use ruma::{RoomId, UserId};

use crate::error::Result;
use crate::room::membership::{self, Change};
use crate::state::AppState;
use crate::storage::{self, events, users};

/// Deactivates `user`, erasing them when asked.
pub async fn deactivate(state: &AppState, user: &UserId, erase: bool) -> Result<()> {
    users::set_deactivated(&state.db, user.as_str()).await?;
    if erase {
        users::set_erased(&state.db, user.as_str()).await?;
        state.erased.write().unwrap_or_else(|e| e.into_inner()).insert(user.to_string());
    }

    let devices = storage::devices::list(&state.db, user.as_str()).await?;
    let ids: Vec<&str> = devices.iter().map(|d| d.device_id.as_str()).collect();
    super::e2ee::remove_devices(state, user, &ids).await?;

    for kind in ["join", "invite", "knock"] {
        for room in events::rooms_with_membership(&state.db, user.as_str(), kind).await? {
            let Ok(room_id) = RoomId::parse(&room) else { continue };
            let change = Change { target: user.to_owned(), membership: "leave", reason: None };
            // A room that refuses the leave (none should) does not stop the
            // rest: the account is gone whatever happens in one room.
            if let Err(e) = membership::change(state, &room_id, user, change).await {
                tracing::warn!(%room_id, %user, "deactivation: cannot leave: {e}");
            }
        }
    }
    let invites = storage::federation::remote_invites_changed(&state.db, user.as_str(), 0, i64::MAX).await?;
    for invite in invites.into_iter().filter(|i| i.rejected == 0) {
        let Ok(room_id) = RoomId::parse(&invite.room_id) else { continue };
        if let Err(e) = crate::federation::invites::reject(state, user, &room_id).await {
            tracing::warn!(%room_id, %user, "deactivation: cannot reject the invite: {e}");
        }
    }

    users::erase_private_data(&state.db, user.as_str()).await?;
    Ok(())
}
