//! Server-side room key backup (`/room_keys/...`): versions, each with
//! `algorithm` and `auth_data`, and the encrypted session keys clients store
//! in the current one. The server never decrypts anything; it only keeps the
//! best copy of each session key by the spec's order.

use axum::Router;
use ruma::api::client::backup::{
    add_backup_keys, add_backup_keys_for_room, add_backup_keys_for_session, create_backup_version,
    delete_backup_keys, delete_backup_keys_for_room, delete_backup_keys_for_session, delete_backup_version,
    get_backup_info, get_backup_keys, get_backup_keys_for_room, get_backup_keys_for_session,
    get_latest_backup_info, update_backup_version,
};
use ruma::serde::Raw;
use serde_json::{Map, Value, json};
use sqlx::AnyConnection;

use crate::api::extract::{Ruma, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::backup::{self, KeyRank};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route_json(router, create_version);
    let router = route_json(router, latest_version);
    let router = route_json(router, get_version);
    let router = route_json(router, update_version);
    let router = route_json(router, delete_version);
    let router = route_json(router, put_all);
    let router = route_json(router, put_room);
    let router = route_json(router, put_session);
    let router = route_json(router, get_all);
    let router = route_json(router, get_room);
    let router = route_json(router, get_session);
    let router = route_json(router, delete_all);
    let router = route_json(router, delete_room);
    route_json(router, delete_session)
}

fn unknown_version() -> Error {
    Error::NotFound("Unknown backup version".into())
}

/// A version as clients name it: a decimal number. Anything else names no
/// backup there is.
fn parse_version(text: &str) -> Result<i64> {
    text.parse::<i64>().ok().filter(|v| *v > 0).ok_or_else(unknown_version)
}

/// `algorithm` and `auth_data` (an object) of a version body.
fn algorithm_of<T>(raw: &Raw<T>) -> Result<(String, String, Value)> {
    let body: Value = serde_json::from_str(raw.json().get()).map_err(|e| Error::BadJson(e.to_string()))?;
    let algorithm = body["algorithm"]
        .as_str()
        .ok_or_else(|| Error::BadJson("algorithm must be a string".into()))?
        .to_owned();
    if !body["auth_data"].is_object() {
        return Err(Error::BadJson("auth_data must be an object".into()));
    }
    let auth_data = body["auth_data"].to_string();
    Ok((algorithm, auth_data, body))
}

async fn conn(state: &AppState) -> Result<sqlx::pool::PoolConnection<sqlx::Any>> {
    Ok(state.db.pool.acquire().await?)
}

async fn version_info(conn: &mut AnyConnection, user: &str, v: backup::Version) -> Result<Value> {
    let auth_data: Value = serde_json::from_str(&v.auth_data).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(json!({
        "algorithm": v.algorithm,
        "auth_data": auth_data,
        "count": backup::count(conn, user, v.version).await?,
        "etag": v.etag.to_string(),
        "version": v.version.to_string(),
    }))
}

async fn create_version(state: AppState, req: Ruma<create_backup_version::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let (algorithm, auth_data, _) = algorithm_of(&req.body.algorithm)?;
    let mut tx = state.db.begin_write().await?;
    let version = backup::create(tx.conn(), me.user_id.as_str(), &algorithm, &auth_data).await?;
    tx.commit().await?;
    Ok(json!({ "version": version.to_string() }))
}

async fn latest_version(state: AppState, req: Ruma<get_latest_backup_info::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let mut conn = conn(&state).await?;
    // Exactly 404 M_NOT_FOUND when there is none: clients read it as "no backup yet".
    let v = backup::current(&mut conn, user)
        .await?
        .ok_or_else(|| Error::NotFound("No current backup version".into()))?;
    version_info(&mut conn, user, v).await
}

async fn get_version(state: AppState, req: Ruma<get_backup_info::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let number = parse_version(&req.body.version)?;
    let mut conn = conn(&state).await?;
    let v = backup::version(&mut conn, user, number).await?.ok_or_else(unknown_version)?;
    version_info(&mut conn, user, v).await
}

/// Only `auth_data` may change; the algorithm (and a `version` in the body,
/// when given) must match.
async fn update_version(state: AppState, req: Ruma<update_backup_version::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let number = parse_version(&req.body.version)?;
    let (algorithm, auth_data, body) = algorithm_of(&req.body.algorithm)?;
    if let Some(named) = body.get("version")
        && named.as_str() != Some(req.body.version.as_str())
    {
        return Err(Error::InvalidParam("The version in the body does not match the one in the path".into()));
    }
    let mut tx = state.db.begin_write().await?;
    let v = backup::version(tx.conn(), user, number).await?.ok_or_else(unknown_version)?;
    if v.algorithm != algorithm {
        return Err(Error::InvalidParam("The algorithm of a backup version cannot change".into()));
    }
    backup::set_auth_data(tx.conn(), user, number, &auth_data).await?;
    tx.commit().await?;
    Ok(json!({}))
}

async fn delete_version(state: AppState, req: Ruma<delete_backup_version::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let number = parse_version(&req.body.version)?;
    let mut tx = state.db.begin_write().await?;
    if !backup::delete_version(tx.conn(), user, number).await? {
        return Err(unknown_version());
    }
    tx.commit().await?;
    Ok(json!({}))
}

/// One uploaded session key, checked.
struct Upload<'a> {
    room: &'a str,
    session: &'a str,
    rank: KeyRank,
    data: String,
}

fn upload<'a, T>(room: &'a str, session: &'a str, raw: &Raw<T>) -> Result<Upload<'a>> {
    let data: Value = serde_json::from_str(raw.json().get()).map_err(|e| Error::BadJson(e.to_string()))?;
    let count = |field: &str| {
        data[field]
            .as_u64()
            .and_then(|n| i64::try_from(n).ok())
            .ok_or_else(|| Error::BadJson(format!("{field} must be a non-negative integer")))
    };
    let first_message_index = count("first_message_index")?;
    let forwarded_count = count("forwarded_count")?;
    let is_verified = data["is_verified"]
        .as_bool()
        .ok_or_else(|| Error::BadJson("is_verified must be a boolean".into()))?;
    if !data["session_data"].is_object() {
        return Err(Error::BadJson("session_data must be an object".into()));
    }
    Ok(Upload {
        room,
        session,
        rank: KeyRank { is_verified, first_message_index, forwarded_count },
        data: data.to_string(),
    })
}

/// Stores keys in the user's current backup, which `version` must name:
/// each replaces the stored copy only if it ranks higher. Answers the
/// version's `count` and `etag` after the write.
async fn store(state: &AppState, user: &str, version: &str, uploads: Vec<Upload<'_>>) -> Result<Value> {
    let mut tx = state.db.begin_write().await?;
    let current = backup::current(tx.conn(), user).await?.ok_or_else(unknown_version)?;
    if version.parse::<i64>().ok() != Some(current.version) {
        return Err(Error::WrongRoomKeysVersion { current_version: current.version.to_string() });
    }
    let number = current.version;
    let mut changed = false;
    for u in &uploads {
        let better = match backup::key_rank(tx.conn(), user, number, u.room, u.session).await? {
            Some(old) => u.rank.replaces(&old),
            None => true,
        };
        if better {
            backup::put_key(tx.conn(), user, number, u.room, u.session, u.rank, &u.data).await?;
            changed = true;
        }
    }
    finish_key_write(tx, user, current, changed).await
}

/// Ends a write to a version's keys: moves the etag on if the keys changed,
/// commits, and answers the version's `count` and `etag`.
async fn finish_key_write(
    mut tx: crate::storage::RoomTx,
    user: &str,
    version: backup::Version,
    changed: bool,
) -> Result<Value> {
    let mut etag = version.etag;
    if changed {
        backup::bump_etag(tx.conn(), user, version.version).await?;
        etag += 1;
    }
    let count = backup::count(tx.conn(), user, version.version).await?;
    tx.commit().await?;
    Ok(json!({ "count": count, "etag": etag.to_string() }))
}

async fn put_all(state: AppState, req: Ruma<add_backup_keys::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let mut uploads = Vec::new();
    for (room, backup) in &req.body.rooms {
        for (session, raw) in &backup.sessions {
            uploads.push(upload(room.as_str(), session, raw)?);
        }
    }
    store(&state, user, &req.body.version, uploads).await
}

async fn put_room(state: AppState, req: Ruma<add_backup_keys_for_room::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let room = req.body.room_id.as_str();
    let uploads = req
        .body
        .sessions
        .iter()
        .map(|(session, raw)| upload(room, session, raw))
        .collect::<Result<Vec<_>>>()?;
    store(&state, user, &req.body.version, uploads).await
}

async fn put_session(state: AppState, req: Ruma<add_backup_keys_for_session::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let b = &req.body;
    let one = upload(b.room_id.as_str(), &b.session_id, &b.session_data)?;
    store(&state, user, &b.version, vec![one]).await
}

/// Stored keys of an existing version, as `{room: {session: data}}`.
async fn read(
    state: &AppState,
    user: &str,
    version: &str,
    room: Option<&str>,
    session: Option<&str>,
) -> Result<Map<String, Value>> {
    let number = parse_version(version)?;
    let mut conn = conn(state).await?;
    backup::version(&mut conn, user, number).await?.ok_or_else(unknown_version)?;
    let mut rooms = Map::new();
    for (room, session, data) in backup::keys(&mut conn, user, number, room, session).await? {
        let data: Value = serde_json::from_str(&data).map_err(|e| Error::Internal(e.to_string()))?;
        let sessions = rooms.entry(room).or_insert_with(|| json!({}));
        sessions[session] = data;
    }
    Ok(rooms)
}

async fn get_all(state: AppState, req: Ruma<get_backup_keys::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let rooms = read(&state, user, &req.body.version, None, None).await?;
    let rooms: Map<String, Value> =
        rooms.into_iter().map(|(room, sessions)| (room, json!({ "sessions": sessions }))).collect();
    Ok(json!({ "rooms": rooms }))
}

async fn get_room(state: AppState, req: Ruma<get_backup_keys_for_room::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let room = req.body.room_id.as_str();
    let mut rooms = read(&state, user, &req.body.version, Some(room), None).await?;
    Ok(json!({ "sessions": rooms.remove(room).unwrap_or_else(|| json!({})) }))
}

async fn get_session(state: AppState, req: Ruma<get_backup_keys_for_session::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let b = &req.body;
    let room = b.room_id.as_str();
    let mut rooms = read(&state, user, &b.version, Some(room), Some(&b.session_id)).await?;
    rooms
        .remove(room)
        .and_then(|mut sessions| sessions.get_mut(&b.session_id).map(Value::take))
        .ok_or_else(|| Error::NotFound("No backed-up key for this session".into()))
}

/// Deletes keys of an existing version; answers its `count` and `etag` after.
async fn remove(
    state: &AppState,
    user: &str,
    version: &str,
    room: Option<&str>,
    session: Option<&str>,
) -> Result<Value> {
    let number = parse_version(version)?;
    let mut tx = state.db.begin_write().await?;
    let v = backup::version(tx.conn(), user, number).await?.ok_or_else(unknown_version)?;
    let changed = backup::delete_keys(tx.conn(), user, number, room, session).await? > 0;
    finish_key_write(tx, user, v, changed).await
}

async fn delete_all(state: AppState, req: Ruma<delete_backup_keys::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    remove(&state, user, &req.body.version, None, None).await
}

async fn delete_room(state: AppState, req: Ruma<delete_backup_keys_for_room::v3::Request>) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    remove(&state, user, &req.body.version, Some(req.body.room_id.as_str()), None).await
}

async fn delete_session(
    state: AppState,
    req: Ruma<delete_backup_keys_for_session::v3::Request>,
) -> Result<Value> {
    let user = req.requester()?.user_id.as_str();
    let b = &req.body;
    remove(&state, user, &b.version, Some(b.room_id.as_str()), Some(&b.session_id)).await
}
