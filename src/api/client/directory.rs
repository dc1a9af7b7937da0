//! Room aliases and the public room directory.

use axum::Router;
use ruma::OwnedRoomAliasId;
use ruma::api::client::alias::{create_alias, delete_alias, get_alias};
use ruma::api::client::directory::{
    get_public_rooms, get_public_rooms_filtered, get_room_visibility, set_room_visibility,
};
use ruma::api::client::room::{Visibility, aliases};
use serde_json::Value;

use crate::api::extract::{Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::room::{directory, read};
use crate::state::AppState;
use crate::storage::{self, rooms};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, put_alias);
    let router = route(router, resolve_alias);
    let router = route(router, remove_alias);
    let router = route(router, room_aliases);
    let router = route(router, visibility);
    let router = route(router, change_visibility);
    let router = route_json(router, public_rooms);
    route_json(router, public_rooms_filtered)
}

async fn put_alias(
    state: AppState,
    req: Ruma<create_alias::v3::Request>,
) -> Result<create_alias::v3::Response> {
    let me = req.requester()?;
    directory::create_alias(&state, &me.user_id, &req.body.room_alias, &req.body.room_id).await?;
    Ok(create_alias::v3::Response::new())
}

async fn resolve_alias(
    state: AppState,
    req: Ruma<get_alias::v3::Request>,
) -> Result<get_alias::v3::Response> {
    let (room_id, servers) = directory::resolve(&state, &req.body.room_alias).await?;
    Ok(get_alias::v3::Response::new(room_id, servers))
}

async fn remove_alias(
    state: AppState,
    req: Ruma<delete_alias::v3::Request>,
) -> Result<delete_alias::v3::Response> {
    let me = req.requester()?;
    directory::delete_alias(&state, &me.user_id, me.is_admin, &req.body.room_alias).await?;
    Ok(delete_alias::v3::Response::new())
}

async fn room_aliases(state: AppState, req: Ruma<aliases::v3::Request>) -> Result<aliases::v3::Response> {
    let me = req.requester()?;
    read::open(&state, &req.body.room_id).await?;
    read::require_joined(&state, &req.body.room_id, &me.user_id).await?;
    let list = storage::aliases::for_room(&state.db, req.body.room_id.as_str())
        .await?
        .into_iter()
        .filter_map(|a| OwnedRoomAliasId::try_from(a).ok())
        .collect();
    Ok(aliases::v3::Response::new(list))
}

async fn visibility(
    state: AppState,
    req: Ruma<get_room_visibility::v3::Request>,
) -> Result<get_room_visibility::v3::Response> {
    let room = rooms::get(&state.db, req.body.room_id.as_str())
        .await?
        .ok_or_else(|| Error::NotFound("Unknown room".into()))?;
    Ok(get_room_visibility::v3::Response::new(if room.published {
        Visibility::Public
    } else {
        Visibility::Private
    }))
}

async fn change_visibility(
    state: AppState,
    req: Ruma<set_room_visibility::v3::Request>,
) -> Result<set_room_visibility::v3::Response> {
    let me = req.requester()?;
    let public = match req.body.visibility {
        Visibility::Public => true,
        Visibility::Private => false,
        _ => return Err(Error::InvalidParam("visibility must be public or private".into())),
    };
    directory::set_visibility(&state, &me.user_id, me.is_admin, &req.body.room_id, public).await?;
    Ok(set_room_visibility::v3::Response::new())
}

/// The server whose directory is asked: another one only when named and
/// federation is on (a name of ours, or none, is this server).
fn other_server<'a>(state: &AppState, server: Option<&'a ruma::ServerName>) -> Option<&'a ruma::ServerName> {
    server.filter(|s| *s != state.settings.server_name && state.settings.federation.is_some())
}

async fn public_rooms(state: AppState, req: Ruma<get_public_rooms::v3::Request>) -> Result<Value> {
    let b = &req.body;
    if let Some(server) = other_server(&state, b.server.as_deref()) {
        return directory::remote_public_rooms(
            &state,
            server,
            b.limit.map(u64::from),
            b.since.as_deref(),
            None,
        )
        .await;
    }
    directory::public_rooms(&state, b.limit.map(u64::from), b.since.as_deref(), None).await
}

async fn public_rooms_filtered(
    state: AppState,
    req: Ruma<get_public_rooms_filtered::v3::Request>,
) -> Result<Value> {
    let b = &req.body;
    if let Some(server) = other_server(&state, b.server.as_deref()) {
        return directory::remote_public_rooms(
            &state,
            server,
            b.limit.map(u64::from),
            b.since.as_deref(),
            b.filter.generic_search_term.as_deref(),
        )
        .await;
    }
    directory::public_rooms(
        &state,
        b.limit.map(u64::from),
        b.since.as_deref(),
        b.filter.generic_search_term.as_deref(),
    )
    .await
}
