//! createRoom: the initial events in exactly the spec's order, in one
//! transaction, so a room either exists whole or not at all.

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::events::TimelineEventType;
use ruma::{
    MilliSecondsSinceUnixEpoch, OwnedRoomAliasId, OwnedRoomId, OwnedUserId, RoomId, RoomVersionId, UInt,
    UserId,
};
use serde_json::json;

use super::pdu::{self, Draft, Placement, canonical_content};
use super::timeline::RoomWriter;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events::{self, NewEvent};
use crate::storage::{self, aliases, rooms, users};

/// The presets of the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// invite-only, shared history, guests may join.
    PrivateChat,
    /// Like private, and every invitee gets the creator's power.
    TrustedPrivateChat,
    /// Public join rule, shared history.
    PublicChat,
}

/// A createRoom request, parsed.
#[derive(Debug, Clone)]
pub struct CreateRoom {
    /// Room version.
    pub version: RoomVersionId,
    /// Preset.
    pub preset: Preset,
    /// Extra keys for the create event's content.
    pub creation_content: CanonicalJsonObject,
    /// Merged over the default power levels.
    pub power_level_override: CanonicalJsonObject,
    /// `initial_state`: (type, state key, content).
    pub initial_state: Vec<(String, String, CanonicalJsonObject)>,
    /// `m.room.name`.
    pub name: Option<String>,
    /// `m.room.topic`.
    pub topic: Option<String>,
    /// Local alias to create and make canonical.
    pub alias: Option<OwnedRoomAliasId>,
    /// Users to invite.
    pub invite: Vec<OwnedUserId>,
    /// Mark the invites as direct chats.
    pub is_direct: bool,
    /// List in the public directory.
    pub publish: bool,
}

fn object(value: serde_json::Value) -> Result<CanonicalJsonObject> {
    canonical_content(value)
}

fn merge(base: &mut CanonicalJsonObject, over: &CanonicalJsonObject) {
    for (k, v) in over {
        base.insert(k.clone(), v.clone());
    }
}

/// Creates a room; returns its id.
pub async fn create_room(state: &AppState, creator: &UserId, req: CreateRoom) -> Result<OwnedRoomId> {
    let rules =
        req.version.rules().ok_or_else(|| Error::UnsupportedRoomVersion("Unknown room version".into()))?;
    let v12 = rules.authorization.explicitly_privilege_room_creators;
    let server_name = &state.settings.server_name;

    // Check what can fail before anything is written.
    for user in &req.invite {
        if user.server_name() != server_name {
            if state.settings.federation.is_none() {
                return Err(Error::Forbidden(format!("Cannot invite {user}: this server does not federate")));
            }
            continue;
        }
        if !users::localpart_exists(&state.db, user.localpart()).await? {
            return Err(Error::NotFound(format!("Unknown user {user}")));
        }
    }
    if let Some(alias) = &req.alias
        && aliases::get(&state.db, alias.as_str()).await?.is_some()
    {
        return Err(Error::RoomInUse("Room alias already taken".into()));
    }

    // 1. m.room.create
    let mut create_content = req.creation_content.clone();
    create_content.insert("room_version".into(), CanonicalJsonValue::String(req.version.to_string()));
    if !rules.authorization.use_room_create_sender {
        create_content.insert("creator".into(), CanonicalJsonValue::String(creator.to_string()));
    }
    let mut additional_creators: Vec<OwnedUserId> = Vec::new();
    if v12 {
        match create_content.get("additional_creators") {
            None | Some(CanonicalJsonValue::Array(_)) => {}
            Some(_) => {
                return Err(Error::BadJson(
                    "creation_content.additional_creators must be a list of user ids".into(),
                ));
            }
        }
        if let Some(CanonicalJsonValue::Array(list)) = create_content.get("additional_creators") {
            for v in list {
                let id = v.as_str().and_then(|s| UserId::parse(s).ok()).ok_or_else(|| {
                    Error::BadJson("creation_content.additional_creators must hold user ids".into())
                })?;
                additional_creators.push(id);
            }
        }
        if req.preset == Preset::TrustedPrivateChat {
            for user in &req.invite {
                if !additional_creators.contains(user) && user != creator {
                    additional_creators.push(user.clone());
                }
            }
        }
        if !additional_creators.is_empty() {
            create_content.insert(
                "additional_creators".into(),
                CanonicalJsonValue::Array(
                    additional_creators.iter().map(|u| CanonicalJsonValue::String(u.to_string())).collect(),
                ),
            );
        }
    }

    let random_room_id = || -> Result<OwnedRoomId> {
        use rand::Rng;
        let mut rng = rand::rng();
        let local: String = (0..18).map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8)).collect();
        RoomId::parse(format!("!{local}:{server_name}")).map_err(|e| Error::Internal(format!("room id: {e}")))
    };
    let preset_room_id =
        if rules.authorization.room_create_event_id_as_room_id { None } else { Some(random_room_id()?) };

    let creator_profile = crate::account::profile::member_fields(state, creator).await?;
    let mut invite_profiles = Vec::with_capacity(req.invite.len());
    for user in &req.invite {
        invite_profiles.push(crate::account::profile::member_fields(state, user).await?);
    }
    let mut tx = state.db.begin_room_write(None).await?;
    let create_draft = Draft {
        kind: TimelineEventType::RoomCreate.to_string(),
        state_key: Some(String::new()),
        content: create_content,
        sender: creator.to_owned(),
        redacts: None,
    };
    pdu::check_draft(&create_draft)?;
    let now = storage::now_ms();
    let create_pdu = pdu::build(
        &rules,
        server_name,
        &state.signing_key,
        &create_draft,
        Placement {
            room_id: preset_room_id.as_deref(),
            prev_events: vec![],
            auth_events: vec![],
            reference_hashes: Default::default(),
            depth: 1,
            origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::try_from(now).unwrap_or_default()),
        },
    )?;
    ruma::state_res::check_state_independent_auth_rules(&rules.authorization, &create_pdu, |_| {
        None::<&pdu::Pdu>
    })
    .map_err(|e| Error::BadJson(format!("Invalid creation_content: {e}")))?;
    let room_id = match preset_room_id {
        Some(id) => id,
        None => RoomId::parse(format!("!{}", &create_pdu.event_id.as_str()[1..]))
            .map_err(|e| Error::Internal(format!("room id: {e}")))?,
    };
    rooms::insert(tx.conn(), room_id.as_str(), req.version.as_str(), creator.as_str(), now).await?;
    let json = create_pdu.to_json_string();
    let create_stream = state.streams.reserve();
    events::insert(
        tx.conn(),
        &NewEvent {
            room_id: room_id.as_str(),
            seq: super::position::first(),
            stream: create_stream.pos,
            event_id: create_pdu.event_id.as_str(),
            event_type: "m.room.create",
            state_key: Some(""),
            sender: creator.as_str(),
            origin_server_ts: now,
            json: &json,
            txn: None,
            membership: None,
            relation: None,
        },
    )
    .await?;
    super::directory::track_state(
        tx.conn(),
        room_id.as_str(),
        "m.room.create",
        "",
        &create_draft.content,
        None,
    )
    .await?;
    if let Some(alias) = &req.alias {
        aliases::create_tx(tx.conn(), alias.as_str(), room_id.as_str(), creator.as_str(), now).await?;
    }
    let mut writer = RoomWriter::after_create(
        room_id.clone(),
        req.version.clone(),
        rules.clone(),
        tx,
        create_pdu,
        create_stream,
    );

    let state_draft = |kind: &str, state_key: &str, content: CanonicalJsonObject| Draft {
        kind: kind.to_owned(),
        state_key: Some(state_key.to_owned()),
        content,
        sender: creator.to_owned(),
        redacts: None,
    };

    // 2. The creator joins.
    let mut join = object(json!({ "membership": "join" }))?;
    join.extend(creator_profile);
    writer.append(state, &state_draft("m.room.member", creator.as_str(), join), None).await?;

    // 3. Power levels: defaults, then the preset, then the override.
    let mut users_map = serde_json::Map::new();
    if !v12 {
        users_map.insert(creator.to_string(), json!(100));
        if req.preset == Preset::TrustedPrivateChat {
            for user in &req.invite {
                users_map.insert(user.to_string(), json!(100));
            }
        }
    }
    let mut power = object(json!({
        "users": users_map,
        "users_default": 0,
        "events": {
            "m.room.name": 50,
            "m.room.power_levels": 100,
            "m.room.history_visibility": 100,
            "m.room.retention": 100,
            "org.seqline.prejoin_window": 100,
            "m.room.canonical_alias": 50,
            "m.room.avatar": 50,
            "m.room.tombstone": if v12 { 150 } else { 100 },
            "m.room.server_acl": 100,
            "m.room.encryption": 100,
        },
        "events_default": 0,
        "state_default": 50,
        "ban": 50,
        "kick": 50,
        "redact": 50,
        "invite": if req.preset == Preset::PublicChat { 50 } else { 0 },
        "historical": 100,
    }))?;
    if v12 {
        let mut creators = additional_creators.clone();
        creators.push(creator.to_owned());
        refuse_creators_in_users(&req.power_level_override, &creators)?;
    }
    merge(&mut power, &req.power_level_override);
    writer.append(state, &state_draft("m.room.power_levels", "", power), None).await?;

    // 4. The canonical alias.
    if let Some(alias) = &req.alias {
        writer
            .append(
                state,
                &state_draft("m.room.canonical_alias", "", object(json!({ "alias": alias }))?),
                None,
            )
            .await?;
    }

    // 5. The preset's events, less those `initial_state` replaces (same type
    // and state key): the room gets one of each, the caller's.
    let (join_rule, guest_access) = match req.preset {
        Preset::PrivateChat | Preset::TrustedPrivateChat => ("invite", Some("can_join")),
        Preset::PublicChat => ("public", None),
    };
    let mut preset = vec![
        ("m.room.join_rules", json!({ "join_rule": join_rule })),
        ("m.room.history_visibility", json!({ "history_visibility": "shared" })),
    ];
    if let Some(guest_access) = guest_access {
        preset.push(("m.room.guest_access", json!({ "guest_access": guest_access })));
    }
    for (kind, content) in preset {
        if !req.initial_state.iter().any(|(k, key, _)| k == kind && key.is_empty()) {
            writer.append(state, &state_draft(kind, "", object(content)?), None).await?;
        }
    }

    // 6. initial_state, in the order given.
    for (kind, state_key, content) in &req.initial_state {
        writer.append(state, &state_draft(kind, state_key, content.clone()), None).await?;
    }

    // 7. Name and topic.
    if let Some(name) = &req.name {
        writer.append(state, &state_draft("m.room.name", "", object(json!({ "name": name }))?), None).await?;
    }
    if let Some(topic) = &req.topic {
        let content =
            json!({ "topic": topic, "m.topic": { "m.text": [{ "mimetype": "text/plain", "body": topic }] } });
        writer.append(state, &state_draft("m.room.topic", "", object(content)?), None).await?;
    }

    // 8. Invites: ours in the room's first transaction, other servers'
    // users once it is committed (their servers sign their invites).
    let mut remote_invites = Vec::new();
    for (user, profile) in req.invite.iter().zip(invite_profiles) {
        let mut content = json!({ "membership": "invite" });
        if req.is_direct {
            content["is_direct"] = json!(true);
        }
        let mut content = object(content)?;
        content.extend(profile);
        let draft = state_draft("m.room.member", user.as_str(), content);
        if user.server_name() == server_name {
            writer.append(state, &draft, None).await?;
        } else {
            remote_invites.push(draft);
        }
    }
    writer.commit(state).await?;
    for draft in remote_invites {
        // The room exists whatever another server answers: a failed invite
        // is logged and the room returned, as the invite can be sent again.
        if let Err(e) = crate::federation::invites::invite_remote(state, &room_id, &draft).await {
            tracing::warn!(%room_id, invitee = ?draft.state_key, "cannot invite: {e}");
        }
    }
    if req.publish {
        rooms::set_published(&state.db, room_id.as_str(), true).await?;
    }
    tracing::info!(%room_id, %creator, version = %req.version, "created room");
    Ok(room_id)
}

/// In rooms whose creators have infinite power (v12), power levels that
/// name a creator in `users` are a bad request (400), whoever sends them:
/// the creators' power is not the power levels' to give.
pub fn refuse_creators_in_users(power_levels: &CanonicalJsonObject, creators: &[OwnedUserId]) -> Result<()> {
    if let Some(CanonicalJsonValue::Object(users)) = power_levels.get("users")
        && let Some(creator) = creators.iter().find(|c| users.contains_key(c.as_str()))
    {
        return Err(Error::BadJson(format!(
            "{creator} is a creator of this room: creators may not be listed in the power levels' users"
        )));
    }
    Ok(())
}
