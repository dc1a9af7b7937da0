//! seqline's own endpoints, under the unstable prefix
//! `/_matrix/client/unstable/org.seqline/`:
//!
//! - `POST rooms/{roomId}/clear_history`: the caller's own floor moves just
//!   past the newest event; on all their devices nothing older is returned.
//! - `POST rooms/{roomId}/purge` `{"before_event_id": "$..."}`: a room admin
//!   (power level at least `history.purge_power_level`) or a server admin
//!   moves the room's floor up to that event: nothing older is returned to
//!   anyone.
//! - `POST rooms/{roomId}/bulk_membership`
//!   `{"invite": [...], "kick": [...], "ban": [...], "reason": "..."}`: many
//!   membership changes in one transaction, at consecutive seqs.

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use ruma::events::room::power_levels::UserPowerLevel;
use ruma::{OwnedRoomId, OwnedUserId};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::extract::{Authed, JsonBody};
use crate::error::{Error, Result};
use crate::ratelimit::Action;
use crate::room::membership::{self, Change};
use crate::room::{power, read};
use crate::state::AppState;
use crate::storage::{memberships, rooms};

/// The unstable prefix of seqline's own endpoints.
pub const PREFIX: &str = "/_matrix/client/unstable/org.seqline";

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    router
        .route(&format!("{PREFIX}/rooms/{{room_id}}/clear_history"), post(clear_history))
        .route(&format!("{PREFIX}/rooms/{{room_id}}/purge"), post(purge))
        .route(&format!("{PREFIX}/rooms/{{room_id}}/bulk_membership"), post(bulk_membership))
}

fn room_id(raw: &str) -> Result<OwnedRoomId> {
    OwnedRoomId::try_from(raw).map_err(|e| Error::InvalidParam(format!("Invalid room id: {e}")))
}

async fn clear_history(
    State(state): State<AppState>,
    Authed(me): Authed,
    Path(raw): Path<String>,
) -> Result<axum::Json<Value>> {
    let room_id = room_id(&raw)?;
    let view = read::open(&state, &room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    if !access.ever_member() {
        return Err(Error::Forbidden("You are not a member of this room".into()));
    }
    // Just above the head: every event so far is below the floor, the next
    // one (placed further above, `position::next_after`) is not.
    memberships::raise_user_floor(&state.db, room_id.as_str(), me.user_id.as_str(), view.room.last_seq + 1)
        .await?;
    Ok(axum::Json(json!({})))
}

#[derive(Deserialize)]
struct PurgeBody {
    before_event_id: String,
}

async fn purge(
    State(state): State<AppState>,
    Authed(me): Authed,
    Path(raw): Path<String>,
    JsonBody(body): JsonBody<PurgeBody>,
) -> Result<axum::Json<Value>> {
    let room_id = room_id(&raw)?;
    let view = read::open(&state, &room_id).await?;
    if !me.is_admin {
        let levels = power::current(&state, &view).await?;
        let needed = ruma::Int::new_saturating(state.settings.history.purge_power_level);
        let allowed = read::MembershipHistory::load(&state, &room_id, &me.user_id).await?.current() == "join"
            && levels.for_user(&me.user_id) >= UserPowerLevel::Int(needed);
        if !allowed {
            return Err(Error::Forbidden("Purging history needs a room admin or a server admin".into()));
        }
    }
    let target = read::load_by_id(&state, &body.before_event_id).await?;
    if target.stored.room_id != room_id.as_str() {
        return Err(Error::NotFound("Event not found".into()));
    }
    rooms::raise_floor(&state.db, room_id.as_str(), target.stored.seq).await?;
    Ok(axum::Json(json!({})))
}

/// The most membership changes one bulk request makes.
const MAX_BULK_CHANGES: usize = 100;

#[derive(Deserialize)]
struct BulkBody {
    #[serde(default)]
    invite: Vec<OwnedUserId>,
    #[serde(default)]
    kick: Vec<OwnedUserId>,
    #[serde(default)]
    ban: Vec<OwnedUserId>,
    reason: Option<String>,
}

async fn bulk_membership(
    State(state): State<AppState>,
    Authed(me): Authed,
    Path(raw): Path<String>,
    JsonBody(body): JsonBody<BulkBody>,
) -> Result<axum::Json<Value>> {
    let room_id = room_id(&raw)?;
    let change = |target: &OwnedUserId, membership| Change {
        target: target.clone(),
        membership,
        reason: body.reason.clone(),
    };
    let changes: Vec<Change> = body
        .invite
        .iter()
        .map(|u| change(u, "invite"))
        .chain(body.kick.iter().map(|u| change(u, "leave")))
        .chain(body.ban.iter().map(|u| change(u, "ban")))
        .collect();
    if changes.is_empty() {
        return Err(Error::MissingParam("Give at least one of invite, kick, ban".into()));
    }
    if changes.len() > MAX_BULK_CHANGES {
        return Err(Error::InvalidParam(format!("At most {MAX_BULK_CHANGES} changes in one request")));
    }
    // The limits /invite, /kick and /ban are held to: each change is a send,
    // each invite one into the room and one for the invitee (nobody's bucket
    // is charged unless every invitee has room).
    let limiter = &state.rate_limiter;
    for invitee in &body.invite {
        limiter.peek(Action::InviteUser, invitee.as_str())?;
    }
    for _ in &changes {
        limiter.check(Action::Message, me.user_id.as_str())?;
    }
    for invitee in &body.invite {
        limiter.check(Action::InviteRoom, room_id.as_str())?;
        limiter.check(Action::InviteUser, invitee.as_str())?;
    }
    let appended = membership::bulk(&state, &room_id, &me.user_id, changes).await?;
    let ids: Vec<String> = appended.iter().map(|a| a.pdu.event_id.to_string()).collect();
    Ok(axum::Json(json!({ "event_ids": ids })))
}
