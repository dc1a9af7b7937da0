//! Aliases and the public room directory.

use ruma::{RoomAliasId, RoomId, UserId};
use serde_json::{Value, json};

use super::read;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::rooms::{RoomSummary, SummaryField, SummaryValue};
use crate::storage::{self, aliases, rooms};

/// The room an alias names and servers to join it through: a local alias
/// from the database (this server), another server's asked of that server
/// when federation is on (else, as for an unknown alias, 404).
pub async fn resolve(
    state: &AppState,
    alias: &RoomAliasId,
) -> Result<(ruma::OwnedRoomId, Vec<ruma::OwnedServerName>)> {
    if alias.server_name() != state.settings.server_name && state.settings.federation.is_some() {
        let request = ruma::api::federation::query::get_room_information::v1::Request::new(alias.to_owned());
        return match crate::federation::send(state, alias.server_name(), request).await {
            Ok(response) => Ok((response.room_id, response.servers)),
            Err(crate::federation::FederationError::Status(404, _)) => {
                Err(Error::NotFound(format!("Room alias {alias} not found")))
            }
            Err(e) => {
                tracing::info!(%alias, "remote alias query failed: {e}");
                Err(Error::RemoteUnavailable(format!("Cannot resolve {alias} at {}", alias.server_name())))
            }
        };
    }
    let (room_id, _) = aliases::get(&state.db, alias.as_str())
        .await?
        .ok_or_else(|| Error::NotFound(format!("Room alias {alias} not found")))?;
    let room_id = ruma::OwnedRoomId::try_from(room_id).map_err(|e| Error::Internal(e.to_string()))?;
    Ok((room_id, vec![state.settings.server_name.clone()]))
}

/// Creates a local alias for a room the creator is joined to.
pub async fn create_alias(
    state: &AppState,
    user: &UserId,
    alias: &RoomAliasId,
    room_id: &RoomId,
) -> Result<()> {
    if alias.server_name() != state.settings.server_name {
        return Err(Error::InvalidParam("Aliases can only be created on this server".into()));
    }
    read::open(state, room_id).await?;
    read::require_joined(state, room_id, user).await?;
    aliases::create(&state.db, alias.as_str(), room_id.as_str(), user.as_str(), storage::now_ms()).await
}

/// Deletes an alias: allowed for its creator, a server admin, or a member who
/// may change the room's canonical alias.
pub async fn delete_alias(
    state: &AppState,
    user: &UserId,
    is_admin: bool,
    alias: &RoomAliasId,
) -> Result<()> {
    let (room_id, creator) = aliases::get(&state.db, alias.as_str())
        .await?
        .ok_or_else(|| Error::NotFound("Unknown room alias".into()))?;
    let allowed = is_admin || creator == user.as_str() || {
        let room_id = RoomId::parse(&room_id).map_err(|e| Error::Internal(e.to_string()))?;
        let view = read::open(state, &room_id).await?;
        let power = super::power::current(state, &view).await?;
        read::MembershipHistory::load(state, &room_id, user).await?.current() == "join"
            && power.user_can_send_state(user, ruma::events::StateEventType::RoomCanonicalAlias)
    };
    if !allowed {
        return Err(Error::Forbidden("You may not delete this alias".into()));
    }
    aliases::delete(&state.db, alias.as_str()).await?;
    Ok(())
}

/// Checks an `m.room.canonical_alias` content: every local alias it names
/// must exist and point at this room (400 M_BAD_ALIAS otherwise).
pub async fn validate_canonical_alias(state: &AppState, room_id: &RoomId, content: &Value) -> Result<()> {
    let mut names = Vec::new();
    match content.get("alias") {
        None | Some(Value::Null) => {}
        Some(Value::String(a)) => names.push(a.clone()),
        Some(_) => return Err(Error::InvalidParam("alias must be a string".into())),
    }
    match content.get("alt_aliases") {
        None => {}
        Some(Value::Array(list)) => {
            for a in list {
                names.push(
                    a.as_str()
                        .ok_or_else(|| Error::InvalidParam("alt_aliases must hold strings".into()))?
                        .to_owned(),
                );
            }
        }
        Some(_) => return Err(Error::InvalidParam("alt_aliases must be a list".into())),
    }
    for name in names {
        let alias = RoomAliasId::parse(&name)
            .map_err(|_| Error::InvalidParam(format!("{name:?} is not a room alias")))?;
        if alias.server_name() != state.settings.server_name {
            continue;
        }
        match aliases::get(&state.db, alias.as_str()).await? {
            Some((target, _)) if target == room_id.as_str() => {}
            _ => return Err(Error::BadAlias(format!("{alias} does not point to this room"))),
        }
    }
    Ok(())
}

/// Whether `user` may list or unlist the room in the directory.
pub async fn set_visibility(
    state: &AppState,
    user: &UserId,
    is_admin: bool,
    room_id: &RoomId,
    public: bool,
) -> Result<()> {
    let view = read::open(state, room_id).await?;
    let power = super::power::current(state, &view).await?;
    let joined = read::MembershipHistory::load(state, room_id, user).await?.current() == "join";
    let may = joined && power.user_can_send_state(user, ruma::events::StateEventType::RoomCanonicalAlias);
    if !(is_admin || may) {
        return Err(Error::Forbidden("You may not change this room's directory listing".into()));
    }
    rooms::set_published(&state.db, room_id.as_str(), public).await
}

/// Keeps the room's directory summary current: called by the write path, in
/// its transaction, for every state event it appends (`membership`: the
/// target's membership before and after, for member events).
pub async fn track_state(
    conn: &mut sqlx::AnyConnection,
    room_id: &str,
    kind: &str,
    state_key: &str,
    content: &ruma::CanonicalJsonObject,
    membership: Option<(&str, &str)>,
) -> Result<()> {
    if let Some((old, new)) = membership {
        let delta = i64::from(new == "join") - i64::from(old == "join");
        if delta != 0 {
            rooms::add_joined_members(conn, room_id, delta).await?;
        }
        return Ok(());
    }
    if !state_key.is_empty() {
        return Ok(());
    }
    let text = |key: &str| match content.get(key) {
        Some(ruma::CanonicalJsonValue::String(s)) => SummaryValue::Text(Some(s.clone())),
        _ => SummaryValue::Text(None),
    };
    let is = |key: &str, want: &str| {
        SummaryValue::Flag(matches!(content.get(key), Some(ruma::CanonicalJsonValue::String(s)) if s == want))
    };
    let (field, value) = match kind {
        "m.room.name" => (SummaryField::Name, text("name")),
        "m.room.topic" => (SummaryField::Topic, text("topic")),
        "m.room.avatar" => (SummaryField::AvatarUrl, text("url")),
        "m.room.canonical_alias" => (SummaryField::CanonicalAlias, text("alias")),
        "m.room.join_rules" => (SummaryField::JoinRule, text("join_rule")),
        "m.room.create" => (SummaryField::RoomType, text("type")),
        "m.room.history_visibility" => {
            (SummaryField::WorldReadable, is("history_visibility", "world_readable"))
        }
        "m.room.guest_access" => (SummaryField::GuestCanJoin, is("guest_access", "can_join")),
        _ => return Ok(()),
    };
    rooms::set_summary_field(conn, room_id, field, value).await
}

/// The largest `/publicRooms` page (also the page without a `limit`).
const MAX_PUBLIC_ROOMS_PAGE: u64 = 500;

/// One public room as `/publicRooms` lists it (a space hierarchy's rooms
/// start from it too).
pub fn chunk(s: RoomSummary) -> Value {
    let mut chunk = json!({
        "room_id": s.room_id,
        "num_joined_members": s.joined_members.max(0),
        "world_readable": s.world_readable,
        "guest_can_join": s.guest_can_join,
    });
    for (key, value) in [
        ("name", s.name),
        ("topic", s.topic),
        ("avatar_url", s.avatar_url),
        ("canonical_alias", s.canonical_alias),
        ("join_rule", s.join_rule),
        ("room_type", s.room_type),
    ] {
        if let Some(v) = value {
            chunk[key] = json!(v);
        }
    }
    chunk
}

/// A LIKE pattern matching text that contains `term` literally.
pub fn contains_pattern(term: &str) -> String {
    let mut out = String::with_capacity(term.len() + 2);
    out.push('%');
    for c in term.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The public room directory: rooms by joined members (most first), filtered
/// by a search term over name, topic and alias, paged by `since` (an offset
/// token `o<n>`). Reads the summaries the write path keeps, one page at a time.
pub async fn public_rooms(
    state: &AppState,
    limit: Option<u64>,
    since: Option<&str>,
    search: Option<&str>,
) -> Result<Value> {
    let offset: u64 = match since {
        None => 0,
        Some(token) => token
            .strip_prefix('o')
            .and_then(|n| n.parse().ok())
            .filter(|n| i64::try_from(*n).is_ok())
            .ok_or_else(|| Error::InvalidParam("Invalid since token".into()))?,
    };
    let limit = limit.unwrap_or(MAX_PUBLIC_ROOMS_PAGE).clamp(1, MAX_PUBLIC_ROOMS_PAGE);
    let pattern = search.map(str::to_lowercase).filter(|t| !t.is_empty()).map(|t| contains_pattern(&t));
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let (rows, total) =
        rooms::published_summaries(&state.db, pattern.as_deref(), as_i64(offset), as_i64(limit)).await?;
    let page: Vec<Value> = rows.into_iter().map(chunk).collect();
    let total = u64::try_from(total).unwrap_or(0);
    let mut body = json!({ "chunk": page, "total_room_count_estimate": total });
    if offset.saturating_add(limit) < total {
        body["next_batch"] = json!(format!("o{}", offset + limit));
    }
    if offset > 0 {
        body["prev_batch"] = json!(format!("o{}", offset.saturating_sub(limit)));
    }
    Ok(body)
}

/// Another server's public room directory (`/publicRooms?server=`), asked
/// over federation; answered in the client's form. An unreachable server is
/// 502, its refusal passed on.
pub async fn remote_public_rooms(
    state: &AppState,
    server: &ruma::ServerName,
    limit: Option<u64>,
    since: Option<&str>,
    search: Option<&str>,
) -> Result<Value> {
    use ruma::api::federation::directory::get_public_rooms_filtered;
    let mut request = get_public_rooms_filtered::v1::Request::new();
    request.limit = limit.map(|l| ruma::UInt::try_from(l.min(MAX_PUBLIC_ROOMS_PAGE)).unwrap_or_default());
    request.since = since.map(str::to_owned);
    request.filter.generic_search_term = search.map(str::to_owned);
    let response = crate::federation::send(state, server, request).await.map_err(|e| match e {
        crate::federation::FederationError::Status(status @ 400..500, body) => {
            Error::Forbidden(format!("{server} answered {status}: {body}"))
        }
        other => Error::RemoteUnavailable(format!("Cannot read the room directory of {server}: {other}")),
    })?;
    let mut body = json!({ "chunk": response.chunk });
    if let Some(total) = response.total_room_count_estimate {
        body["total_room_count_estimate"] = json!(total);
    }
    if let Some(next) = response.next_batch {
        body["next_batch"] = json!(next);
    }
    if let Some(prev) = response.prev_batch {
        body["prev_batch"] = json!(prev);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_term_is_matched_literally() {
        assert_eq!(contains_pattern("a_b%c\\d"), "%a\\_b\\%c\\\\d%");
    }
}
