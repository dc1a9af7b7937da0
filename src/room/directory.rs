//! Aliases and the public room directory.

use ruma::{RoomAliasId, RoomId, UserId};
use serde_json::{Value, json};

use super::pdu::Pdu;
use super::read;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{self, aliases, events, rooms};

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

/// One public room's summary, as `/publicRooms` lists it.
async fn summary(state: &AppState, room_id: &str) -> Result<Value> {
    let mut chunk = json!({ "room_id": room_id, "num_joined_members": 0, "world_readable": false, "guest_can_join": false });
    let mut joined = 0u64;
    for stored in events::current_state(&state.db, room_id).await? {
        let pdu = Pdu::from_stored(&stored.event_id, &stored.json)?;
        let content: Value = pdu.content_as().unwrap_or_default();
        match pdu.kind.to_string().as_str() {
            "m.room.name" => chunk["name"] = content["name"].clone(),
            "m.room.topic" => chunk["topic"] = content["topic"].clone(),
            "m.room.avatar" => chunk["avatar_url"] = content["url"].clone(),
            "m.room.canonical_alias" => chunk["canonical_alias"] = content["alias"].clone(),
            "m.room.join_rules" => chunk["join_rule"] = content["join_rule"].clone(),
            "m.room.history_visibility" => {
                chunk["world_readable"] = json!(content["history_visibility"] == "world_readable")
            }
            "m.room.guest_access" => chunk["guest_can_join"] = json!(content["guest_access"] == "can_join"),
            "m.room.create" => {
                if let Some(t) = content.get("type") {
                    chunk["room_type"] = t.clone();
                }
            }
            "m.room.member" if content["membership"] == "join" => joined += 1,
            _ => {}
        }
    }
    chunk["num_joined_members"] = json!(joined);
    if let Some(obj) = chunk.as_object_mut() {
        obj.retain(|_, v| !v.is_null());
    }
    Ok(chunk)
}

/// The public room directory: rooms by joined members (most first), filtered
/// by a search term over name, topic and alias, paged by `since` (an offset
/// token `o<n>`).
pub async fn public_rooms(
    state: &AppState,
    limit: Option<u64>,
    since: Option<&str>,
    search: Option<&str>,
) -> Result<Value> {
    let offset: usize = match since {
        None => 0,
        Some(token) => token
            .strip_prefix('o')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Error::InvalidParam("Invalid since token".into()))?,
    };
    let term = search.map(str::to_lowercase).filter(|t| !t.is_empty());
    let mut all = Vec::new();
    for room_id in rooms::published(&state.db).await? {
        let chunk = summary(state, &room_id).await?;
        if let Some(term) = &term {
            let hay = ["name", "topic", "canonical_alias"]
                .iter()
                .filter_map(|k| chunk[*k].as_str())
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
                .join("\n");
            if !hay.contains(term.as_str()) {
                continue;
            }
        }
        all.push(chunk);
    }
    all.sort_by(|a, b| {
        b["num_joined_members"]
            .as_u64()
            .cmp(&a["num_joined_members"].as_u64())
            .then_with(|| a["room_id"].as_str().cmp(&b["room_id"].as_str()))
    });
    let total = all.len();
    let limit = limit.map_or(total, |l| usize::try_from(l).unwrap_or(usize::MAX)).max(1);
    let page: Vec<Value> = all.into_iter().skip(offset).take(limit).collect();
    let mut body = json!({ "chunk": page, "total_room_count_estimate": total });
    if offset + limit < total {
        body["next_batch"] = json!(format!("o{}", offset + limit));
    }
    if offset > 0 {
        body["prev_batch"] = json!(format!("o{}", offset.saturating_sub(limit)));
    }
    Ok(body)
}
