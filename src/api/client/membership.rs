//! Membership endpoints: join (by id or alias), leave, invite, kick, ban,
//! unban, forget, and seqline's bulk membership.

use axum::Router;
use ruma::api::client::knock::knock_room;
use ruma::api::client::membership::invite_user::v3::InvitationRecipient;
use ruma::api::client::membership::{
    ban_user, forget_room, invite_user, join_room_by_id, join_room_by_id_or_alias, kick_user, leave_room,
    unban_user,
};
use ruma::canonical_json::CanonicalJsonObject;
use ruma::{OwnedRoomId, OwnedServerName, RoomId};

use crate::api::extract::{Ruma, route};
use crate::error::{Error, Result};
use crate::room::membership::{self, Change};
use crate::room::read;
use crate::state::AppState;
use crate::storage::federation as fed;
use crate::storage::memberships;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, join_by_id);
    let router = route(router, join_by_id_or_alias);
    let router = route(router, knock);
    let router = route(router, leave);
    let router = route(router, invite);
    let router = route(router, kick);
    let router = route(router, ban);
    let router = route(router, unban);
    route(router, forget)
}

/// Joins or knocks: one's own membership change into a room that must exist
/// (joining and knocking are how one finds out whether a room exists: 404
/// when not, where every other room request answers 403).
async fn join_or_knock(
    state: &AppState,
    room_id: &RoomId,
    me: &crate::account::Requester,
    membership: &'static str,
    reason: Option<String>,
    extra: CanonicalJsonObject,
) -> Result<()> {
    if crate::storage::rooms::get(&state.db, room_id.as_str()).await?.is_none() {
        return Err(Error::NotFound("Unknown room".into()));
    }
    let change = Change { target: me.user_id.clone(), membership, reason };
    membership::own_change_with_content(state, room_id, change, extra).await?;
    Ok(())
}

/// The keys of a join or knock body beyond the ones the endpoint defines:
/// they go into the member event's content (custom keys clients and
/// bridges set); a body that is no object has none.
fn extra_content(raw: &[u8]) -> CanonicalJsonObject {
    let mut object: CanonicalJsonObject = serde_json::from_slice(raw).unwrap_or_default();
    for defined in ["reason", "third_party_signed", "membership", "via", "server_name"] {
        object.remove(defined);
    }
    object
}

/// Joins a room: here, when this server is in it (or it lives only here);
/// else over federation through the inviting server, the servers named
/// (`via`, an alias's servers) and the room id's own server, in that order.
/// A restricted join that nobody here may authorise goes through a server
/// in the room whose members may, and that server's join is placed here.
async fn join(
    state: &AppState,
    room_id: &RoomId,
    me: &crate::account::Requester,
    reason: Option<String>,
    via: &[OwnedServerName],
    extra: CanonicalJsonObject,
) -> Result<()> {
    if state.settings.federation.is_none() || is_here(state, room_id).await? {
        return match join_or_knock(state, room_id, me, "join", reason, extra).await {
            Err(Error::UnableToGrantJoin(why)) => join_let_in_elsewhere(state, room_id, me, why).await,
            other => other,
        };
    }
    let inviting = fed::remote_invite(&state.db, me.user_id.as_str(), room_id.as_str())
        .await?
        .and_then(|invite| OwnedServerName::try_from(invite.via.as_str()).ok());
    let servers = candidates(via.to_vec(), inviting, room_id);
    let joined = crate::federation::joining::join(state, &me.user_id, room_id, &servers).await?;
    crate::room::remote::store_joined_room(state, &me.user_id, &joined).await?;
    Ok(())
}

/// A restricted join into a room we are in where nobody here may invite:
/// make_join/send_join through the servers whose members may
/// (`joins::authorising_servers`), then the join they countersigned is
/// placed on our line. With none, the join is refused as it stands.
async fn join_let_in_elsewhere(
    state: &AppState,
    room_id: &RoomId,
    me: &crate::account::Requester,
    why: String,
) -> Result<()> {
    let servers = match state.settings.federation {
        Some(_) => crate::room::joins::authorising_servers(state, room_id).await?,
        None => Vec::new(),
    };
    if servers.is_empty() {
        return Err(Error::Forbidden(why));
    }
    let joined = crate::federation::joining::join(state, &me.user_id, room_id, &servers).await?;
    crate::federation::incoming::place_join_let_in(state, &joined.via, room_id, joined.join).await
}

/// Whether a join of `room_id` is made here: the room is ours and this
/// server is in it, or no other server is.
async fn is_here(state: &AppState, room_id: &RoomId) -> Result<bool> {
    if crate::storage::rooms::get(&state.db, room_id.as_str()).await?.is_none() {
        return Ok(false);
    }
    let servers = fed::servers_in_room(&state.db, room_id.as_str()).await?;
    let ours = state.settings.server_name.as_str();
    Ok(servers.iter().any(|s| s == ours) || servers.iter().all(|s| s == ours))
}

/// A room id, or the room an alias points to (`room::directory::resolve`:
/// 404 when it points nowhere) with the servers the alias names.
async fn resolve(
    state: &AppState,
    target: &ruma::RoomOrAliasId,
) -> Result<(OwnedRoomId, Vec<OwnedServerName>)> {
    match <&RoomId>::try_from(target) {
        Ok(id) => Ok((id.to_owned(), Vec::new())),
        Err(alias) => crate::room::directory::resolve(state, alias).await,
    }
}

/// Knocking (join rules `knock` and `knock_restricted`): asks the room's
/// members to let one in; an invite accepts, a kick refuses, a leave
/// withdraws.
/// A room not on this server is knocked on over federation, through the
/// servers named (`via`, an alias's servers) and the room id's own server.
async fn knock(state: AppState, req: Ruma<knock_room::v3::Request>) -> Result<knock_room::v3::Response> {
    let me = req.requester()?;
    let (room_id, mut via) = resolve(&state, &req.body.room_id_or_alias).await?;
    let reason = req.body.reason.clone();
    let extra = extra_content(&req.raw_body);
    if state.settings.federation.is_none() || is_here(&state, &room_id).await? {
        join_or_knock(&state, &room_id, me, "knock", reason, extra).await?;
        return Ok(knock_room::v3::Response::new(room_id));
    }
    via.splice(0..0, req.body.via.iter().cloned());
    let servers = candidates(via, None, &room_id);
    let mut content = extra;
    if let Some(reason) = reason {
        content.insert("reason".into(), ruma::canonical_json::CanonicalJsonValue::String(reason));
    }
    crate::federation::knocking::knock(&state, &me.user_id, &room_id, &servers, content).await?;
    Ok(knock_room::v3::Response::new(room_id))
}

/// The servers to ask for a room this server is not in, in order: `first`
/// (the inviting server), `via`, the room id's own server; each once.
fn candidates(
    via: Vec<OwnedServerName>,
    first: Option<OwnedServerName>,
    room_id: &RoomId,
) -> Vec<OwnedServerName> {
    let mut servers: Vec<OwnedServerName> = first.into_iter().chain(via).collect();
    servers.extend(room_id.server_name().map(ToOwned::to_owned));
    let mut seen = std::collections::HashSet::new();
    servers.retain(|s| seen.insert(s.clone()));
    servers
}

async fn join_by_id(
    state: AppState,
    req: Ruma<join_room_by_id::v3::Request>,
) -> Result<join_room_by_id::v3::Response> {
    let me = req.requester()?;
    join(&state, &req.body.room_id, me, req.body.reason.clone(), &[], extra_content(&req.raw_body)).await?;
    Ok(join_room_by_id::v3::Response::new(req.body.room_id.clone()))
}

async fn join_by_id_or_alias(
    state: AppState,
    req: Ruma<join_room_by_id_or_alias::v3::Request>,
) -> Result<join_room_by_id_or_alias::v3::Response> {
    let me = req.requester()?;
    let (room_id, mut via) = resolve(&state, &req.body.room_id_or_alias).await?;
    via.splice(0..0, req.body.via.iter().cloned());
    join(&state, &room_id, me, req.body.reason.clone(), &via, extra_content(&req.raw_body)).await?;
    Ok(join_room_by_id_or_alias::v3::Response::new(room_id))
}

async fn leave(state: AppState, req: Ruma<leave_room::v3::Request>) -> Result<leave_room::v3::Response> {
    let me = req.requester()?;
    let here = crate::storage::federation::server_in_room(
        &state.db,
        req.body.room_id.as_str(),
        state.settings.server_name.as_str(),
    )
    .await?;
    if !here
        && crate::storage::federation::remote_invite(
            &state.db,
            me.user_id.as_str(),
            req.body.room_id.as_str(),
        )
        .await?
        .is_some_and(|i| i.rejected == 0)
    {
        // An invite into a room on another server, turned down.
        crate::federation::invites::reject(&state, &me.user_id, &req.body.room_id).await?;
        return Ok(leave_room::v3::Response::new());
    }
    let change = Change { target: me.user_id.clone(), membership: "leave", reason: req.body.reason.clone() };
    membership::change(&state, &req.body.room_id, &me.user_id, change).await?;
    Ok(leave_room::v3::Response::new())
}

async fn invite(state: AppState, req: Ruma<invite_user::v3::Request>) -> Result<invite_user::v3::Response> {
    let me = req.requester()?;
    let InvitationRecipient::UserId(recipient) = &req.body.recipient else {
        return Err(Error::Forbidden("Third-party invites are not supported on this server".into()));
    };
    let change =
        Change { target: recipient.user_id.clone(), membership: "invite", reason: recipient.reason.clone() };
    membership::change(&state, &req.body.room_id, &me.user_id, change).await?;
    Ok(invite_user::v3::Response::new())
}

async fn kick(state: AppState, req: Ruma<kick_user::v3::Request>) -> Result<kick_user::v3::Response> {
    let me = req.requester()?;
    read::open(&state, &req.body.room_id).await?;
    let target = read::MembershipHistory::load(&state, &req.body.room_id, &req.body.user_id).await?;
    if !matches!(target.current(), "join" | "invite" | "knock") {
        return Err(Error::Forbidden("The target user is not in the room".into()));
    }
    let change =
        Change { target: req.body.user_id.clone(), membership: "leave", reason: req.body.reason.clone() };
    membership::change(&state, &req.body.room_id, &me.user_id, change).await?;
    Ok(kick_user::v3::Response::new())
}

async fn ban(state: AppState, req: Ruma<ban_user::v3::Request>) -> Result<ban_user::v3::Response> {
    let me = req.requester()?;
    let change =
        Change { target: req.body.user_id.clone(), membership: "ban", reason: req.body.reason.clone() };
    membership::change(&state, &req.body.room_id, &me.user_id, change).await?;
    Ok(ban_user::v3::Response::new())
}

async fn unban(state: AppState, req: Ruma<unban_user::v3::Request>) -> Result<unban_user::v3::Response> {
    let me = req.requester()?;
    read::open(&state, &req.body.room_id).await?;
    let target = read::MembershipHistory::load(&state, &req.body.room_id, &req.body.user_id).await?;
    if target.current() != "ban" {
        return Err(Error::Forbidden("That user is not banned".into()));
    }
    let change =
        Change { target: req.body.user_id.clone(), membership: "leave", reason: req.body.reason.clone() };
    membership::change(&state, &req.body.room_id, &me.user_id, change).await?;
    Ok(unban_user::v3::Response::new())
}

async fn forget(state: AppState, req: Ruma<forget_room::v3::Request>) -> Result<forget_room::v3::Response> {
    let me = req.requester()?;
    read::open(&state, &req.body.room_id).await?;
    let history = read::MembershipHistory::load(&state, &req.body.room_id, &me.user_id).await?;
    if matches!(history.current(), "join" | "invite" | "knock") {
        return Err(Error::Unknown("Leave the room before forgetting it".into()));
    }
    memberships::forget(&state.db, me.user_id.as_str(), req.body.room_id.as_str()).await?;
    // Forgetting moves no stream: the room list sliding sync keeps is dropped.
    state.sliding.drop_room_list(me.user_id.as_str());
    Ok(forget_room::v3::Response::new())
}
