//! Room upgrades (`POST /rooms/{roomId}/upgrade`): a new room of the asked
//! version replaces the old one. Only a member who may send
//! `m.room.tombstone` in the old room upgrades it. The new room is created
//! with the old one as its `predecessor` (its last event named before v12),
//! the old room's type, and a copy of the state people set (name, topic,
//! avatar, join rules, history visibility, guest access, encryption, server
//! ACL, power levels: in v12 without the creators, who have infinite power
//! there; an upgrader allowed the tombstone but not all that state is raised
//! while it is copied, then the old levels are restored in the new room);
//! then the old room gets its tombstone, its power levels are raised
//! so that ordinary members can no longer talk or invite there, and its
//! local aliases (the canonical one too) move to the new room.

use ruma::events::StateEventType;
use ruma::{OwnedRoomId, OwnedUserId, RoomId, RoomVersionId, UserId};
use serde_json::{Value, json};

use super::create::{CreateRoom, Preset};
use super::pdu::{Draft, canonical_content};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{aliases, events};

/// The state copied into the new room.
const COPIED: &[&str] = &[
    "m.room.server_acl",
    "m.room.encryption",
    "m.room.name",
    "m.room.topic",
    "m.room.avatar",
    "m.room.guest_access",
    "m.room.history_visibility",
    "m.room.join_rules",
];

async fn content_of(state: &AppState, room: &str, kind: &str) -> Result<Option<Value>> {
    Ok(match events::state_event(&state.db, room, kind, "").await? {
        Some(stored) => serde_json::from_str::<Value>(&stored.json).ok().map(|e| e["content"].clone()),
        None => None,
    })
}

fn state_draft(sender: &UserId, kind: &str, content: Value) -> Result<Draft> {
    Ok(Draft {
        kind: kind.into(),
        state_key: Some(String::new()),
        content: canonical_content(content)?,
        sender: sender.to_owned(),
        redacts: None,
    })
}

/// Upgrades `old` to `version` for `user`; answers the new room's id.
pub async fn upgrade(
    state: &AppState,
    user: &UserId,
    old: &RoomId,
    version: RoomVersionId,
    additional_creators: Vec<OwnedUserId>,
) -> Result<OwnedRoomId> {
    if !super::version::creatable(&version) {
        return Err(Error::UnsupportedRoomVersion(format!("Room version {version} is not supported here")));
    }
    let view = super::read::open(state, old).await?;
    super::read::require_joined(state, old, user).await?;
    let power = super::power::current(state, &view).await?;
    if !power.user_can_send_state(user, StateEventType::RoomTombstone) {
        return Err(Error::Forbidden("You may not upgrade this room".into()));
    }
    let room = old.as_str();
    let rules = version.rules().ok_or_else(|| Error::UnsupportedRoomVersion(version.to_string()))?;
    let v12 = rules.authorization.explicitly_privilege_room_creators;

    // The new room's create event: the predecessor, the old room's type.
    let mut creation = json!({ "predecessor": { "room_id": room } });
    if !v12 {
        let last =
            crate::storage::rooms::get(&state.db, room).await?.and_then(|r| r.extremities.into_iter().next());
        if let Some(last) = last {
            creation["predecessor"]["event_id"] = json!(last);
        }
    }
    if let Some(create) = content_of(state, room, "m.room.create").await? {
        for key in ["type", "m.federate"] {
            if let Some(value) = create.get(key) {
                creation[key] = value.clone();
            }
        }
    }
    if v12 && !additional_creators.is_empty() {
        creation["additional_creators"] = json!(additional_creators);
    }

    // The old power levels; in v12 without the creators.
    let old_power = content_of(state, room, "m.room.power_levels").await?.unwrap_or_else(|| json!({}));
    let mut power_levels = old_power.clone();
    if let Some(users) = power_levels.get_mut("users").and_then(Value::as_object_mut) {
        if v12 {
            users.remove(user.as_str());
            for creator in &additional_creators {
                users.remove(creator.as_str());
            }
        } else if !users.contains_key(user.as_str()) {
            users.insert(user.to_string(), json!(100));
        }
    } else if !v12 {
        power_levels["users"] = json!({ user.as_str(): 100 });
    }

    // Someone allowed the tombstone but not all the state the new room is
    // built with (a moderator under a higher `state_default`, say) is raised
    // to what that state needs while it is copied; the old levels, theirs
    // included, are restored as the new room's last state event.
    let needed = needed_level(&power_levels);
    let final_levels = (!v12 && level_of(&power_levels, user.as_str()) < needed).then(|| {
        let original = power_levels.clone();
        power_levels["users"][user.as_str()] = json!(needed);
        original
    });

    let mut initial_state = Vec::new();
    for kind in COPIED {
        if let Some(content) = content_of(state, room, kind).await?
            && content.as_object().is_some_and(|c| !c.is_empty())
        {
            initial_state.push((kind.to_string(), String::new(), canonical_content(content)?));
        }
    }
    let public =
        content_of(state, room, "m.room.join_rules").await?.is_some_and(|c| c["join_rule"] == "public");
    let new_room = super::create::create_room(
        state,
        user,
        CreateRoom {
            version,
            preset: if public { Preset::PublicChat } else { Preset::PrivateChat },
            creation_content: canonical_content(creation)?,
            power_level_override: canonical_content(power_levels)?,
            initial_state,
            name: None,
            topic: None,
            alias: None,
            invite: Vec::new(),
            is_direct: false,
            publish: false,
        },
    )
    .await?;

    if let Some(levels) = final_levels {
        super::timeline::append(state, &new_room, &state_draft(user, "m.room.power_levels", levels)?, None)
            .await?;
    }
    carry_over_user_settings(state, room, &new_room).await?;

    // The tombstone, then the old room quietened.
    let tombstone = json!({ "body": "This room has been replaced", "replacement_room": new_room });
    super::timeline::append(state, old, &state_draft(user, "m.room.tombstone", tombstone)?, None).await?;
    let users_default = old_power["users_default"].as_i64().unwrap_or(0);
    let quiet = (users_default + 1).max(50);
    let mut restricted = old_power;
    restricted["events_default"] = json!(quiet.max(restricted["events_default"].as_i64().unwrap_or(0)));
    restricted["invite"] = json!(quiet.max(restricted["invite"].as_i64().unwrap_or(0)));
    if let Err(e) =
        super::timeline::append(state, old, &state_draft(user, "m.room.power_levels", restricted)?, None)
            .await
    {
        tracing::info!(%old, "upgrade: the old room's power levels stay: {e}");
    }

    // Local aliases, and the canonical one, move to the new room.
    for alias in aliases::for_room(&state.db, room).await? {
        if let Some((_, creator)) = aliases::get(&state.db, &alias).await? {
            aliases::delete(&state.db, &alias).await?;
            aliases::create(&state.db, &alias, new_room.as_str(), &creator, crate::storage::now_ms()).await?;
        }
    }
    if let Some(canonical) = content_of(state, room, "m.room.canonical_alias").await?
        && canonical.as_object().is_some_and(|c| !c.is_empty())
    {
        let moved = state_draft(user, "m.room.canonical_alias", canonical)?;
        if super::timeline::append(state, &new_room, &moved, None).await.is_ok() {
            let cleared = state_draft(user, "m.room.canonical_alias", json!({}))?;
            if let Err(e) = super::timeline::append(state, old, &cleared, None).await {
                tracing::info!(%old, "upgrade: the old room keeps its canonical alias: {e}");
            }
        }
    }
    Ok(new_room)
}

/// Each local member's room push rule and tags of the old room, copied to
/// the new one (as they set them, under the new room's id).
async fn carry_over_user_settings(state: &AppState, old: &str, new_room: &RoomId) -> Result<()> {
    for member in events::joined_members(&state.db, old).await? {
        let Ok(user) = UserId::parse(&member) else { continue };
        if user.server_name() != state.settings.server_name {
            continue;
        }
        let mut rules = crate::notify::ruleset(state, &user).await?;
        let copied: Vec<_> = rules
            .room
            .iter()
            .filter(|r| r.rule_id.as_str() == old)
            .map(|r| {
                let mut rule = r.clone();
                rule.rule_id = new_room.to_owned();
                rule
            })
            .collect();
        if !copied.is_empty() {
            for rule in copied {
                rules.room.replace(rule);
            }
            let content = json!({ "global": rules });
            crate::sync::writes::set_account_data(state, &user, None, "m.push_rules", &content).await?;
        }
        if let Some(tags) = crate::storage::account_data::get(&state.db, user.as_str(), old, "m.tag").await? {
            let tags: Value = serde_json::from_str(&tags).unwrap_or_else(|_| json!({}));
            if tags["tags"].as_object().is_some_and(|t| !t.is_empty()) {
                crate::sync::writes::set_account_data(state, &user, Some(new_room), "m.tag", &tags).await?;
            }
        }
    }
    Ok(())
}

/// A user's level in power-levels content (`users_default` when unlisted).
fn level_of(levels: &Value, user: &str) -> i64 {
    levels["users"][user].as_i64().unwrap_or_else(|| levels["users_default"].as_i64().unwrap_or(0))
}

/// The level that sends every state event the new room is built with and
/// sets its power levels: `state_default`, and each event type's own level
/// (the spec's defaults where unset).
fn needed_level(levels: &Value) -> i64 {
    let own =
        levels["events"].as_object().map_or(0, |e| e.values().filter_map(Value::as_i64).max().unwrap_or(0));
    levels["state_default"].as_i64().unwrap_or(50).max(own)
}
