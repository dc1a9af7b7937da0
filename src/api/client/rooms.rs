//! Rooms: createRoom, sending messages and state, reading state and events,
//! membership lists, redaction.

use axum::Router;
use ruma::api::client::membership::{get_member_events, joined_members, joined_rooms};
use ruma::api::client::message::send_message_event;
use ruma::api::client::redact::redact_event;
use ruma::api::client::room::create_room::v3::RoomPreset;
use ruma::api::client::room::{Visibility, create_room, get_room_event};
use ruma::api::client::state::{get_state_event_for_key, get_state_events, send_state_event};
use ruma::canonical_json::CanonicalJsonObject;
use ruma::{OwnedUserId, RoomAliasId};
use serde_json::{Value, json};

use crate::account::Requester;
use crate::api::extract::{Ruma, RumaResponse, route, route_json, route_state};
use crate::error::{Error, Result};
use crate::room::create::{CreateRoom, Preset, create_room};
use crate::room::pdu::{Draft, canonical_content};
use crate::room::read;
use crate::room::timeline::{self, ClientTxn};
use crate::room::version;
use crate::state::AppState;
use crate::storage::events;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, create);
    let router = route(router, send_message);
    let router = route_state(router, send_state);
    let router = route_state(router, get_state_for_key);
    let router = route_json(router, get_state);
    let router = route_json(router, get_event);
    let router = route(router, joined_rooms_list);
    let router = route_json(router, joined_members_list);
    let router = route_json(router, members);
    let router = route_json(router, hierarchy);
    let router = route(router, upgrade);
    route(router, redact)
}

/// `POST /rooms/{roomId}/upgrade` (`room::upgrade`).
async fn upgrade(
    state: AppState,
    req: Ruma<ruma::api::client::room::upgrade_room::v3::Request>,
) -> Result<ruma::api::client::room::upgrade_room::v3::Response> {
    let me = req.requester()?;
    let b = &req.body;
    let new_room = crate::room::upgrade::upgrade(
        &state,
        &me.user_id,
        &b.room_id,
        b.new_version.clone(),
        b.additional_creators.clone(),
    )
    .await?;
    Ok(ruma::api::client::room::upgrade_room::v3::Response::new(new_room))
}

/// `GET /v1/rooms/{roomId}/hierarchy`: the rooms a space links to, as the
/// caller may see them (`room::spaces`).
async fn hierarchy(
    state: AppState,
    req: Ruma<ruma::api::client::space::get_hierarchy::v1::Request>,
) -> Result<Value> {
    let me = req.requester()?;
    let b = &req.body;
    let size = |n: Option<ruma::UInt>| n.map(|n| usize::try_from(u64::from(n)).unwrap_or(usize::MAX));
    if b.limit.is_some_and(|l| l == ruma::UInt::MIN) {
        return Err(Error::InvalidParam("limit must be positive".into()));
    }
    crate::room::spaces::hierarchy(
        &state,
        me.user_id.as_str(),
        crate::room::spaces::Query {
            root: &b.room_id,
            suggested_only: b.suggested_only,
            max_depth: size(b.max_depth),
            limit: size(b.limit),
            from: b.from.as_deref(),
        },
    )
    .await
}

fn object_of<T>(raw: &ruma::serde::Raw<T>, what: &str) -> Result<CanonicalJsonObject> {
    let value: Value =
        serde_json::from_str(raw.json().get()).map_err(|e| Error::BadJson(format!("{what}: {e}")))?;
    canonical_content(value).map_err(|e| Error::BadJson(format!("{what}: {e}")))
}

async fn create(state: AppState, req: Ruma<create_room::v3::Request>) -> Result<create_room::v3::Response> {
    let me = req.requester()?;
    let body = &req.body;
    if !body.invite_3pid.is_empty() {
        return Err(third_party_invites_unsupported());
    }
    let version = body.room_version.clone().unwrap_or(version::DEFAULT);
    if !version::creatable(&version) {
        return Err(Error::UnsupportedRoomVersion(format!(
            "This server does not create rooms of version {version}"
        )));
    }
    let preset = match &body.preset {
        Some(RoomPreset::PrivateChat) => Preset::PrivateChat,
        Some(RoomPreset::TrustedPrivateChat) => Preset::TrustedPrivateChat,
        Some(RoomPreset::PublicChat) => Preset::PublicChat,
        Some(other) => return Err(Error::BadJson(format!("Unknown preset {other:?}"))),
        None if body.visibility == Visibility::Public => Preset::PublicChat,
        None => Preset::PrivateChat,
    };
    let creation_content = match &body.creation_content {
        Some(raw) => object_of(raw, "creation_content")?,
        None => CanonicalJsonObject::new(),
    };
    let power_level_override = match &body.power_level_content_override {
        Some(raw) => object_of(raw, "power_level_content_override")?,
        None => CanonicalJsonObject::new(),
    };
    let mut initial_state = Vec::new();
    for raw in &body.initial_state {
        let event: Value = serde_json::from_str(raw.json().get())
            .map_err(|e| Error::BadJson(format!("initial_state: {e}")))?;
        let kind = event["type"]
            .as_str()
            .ok_or_else(|| Error::BadJson("initial_state events need a type".into()))?;
        let state_key = event["state_key"].as_str().unwrap_or("");
        let content = canonical_content(event["content"].clone())?;
        initial_state.push((kind.to_owned(), state_key.to_owned(), content));
    }
    let alias = match &body.room_alias_name {
        Some(name) => Some(
            RoomAliasId::parse(format!("#{name}:{}", state.settings.server_name))
                .map_err(|e| Error::InvalidParam(format!("Invalid room_alias_name: {e}")))?,
        ),
        None => None,
    };
    let invite: Vec<OwnedUserId> = body.invite.iter().filter(|u| **u != me.user_id).cloned().collect();
    let room_id = create_room(
        &state,
        &me.user_id,
        CreateRoom {
            version,
            preset,
            creation_content,
            power_level_override,
            initial_state,
            name: body.name.clone(),
            topic: body.topic.clone(),
            alias,
            invite,
            is_direct: body.is_direct,
            publish: body.visibility == Visibility::Public,
        },
    )
    .await?;
    Ok(create_room::v3::Response::new(room_id))
}

/// Third-party (identity server) invites are not offered.
fn third_party_invites_unsupported() -> Error {
    Error::Forbidden("Third-party invites are not supported on this server".into())
}

fn txn(me: &Requester, scope: String, txn_id: &str) -> ClientTxn {
    ClientTxn { device_id: me.device_id.to_string(), scope, txn_id: txn_id.to_owned() }
}

async fn send_message(
    state: AppState,
    req: Ruma<send_message_event::v3::Request>,
) -> Result<send_message_event::v3::Response> {
    let me = req.requester()?;
    let body = &req.body;
    let draft = Draft {
        kind: body.event_type.to_string(),
        state_key: None,
        content: object_of(&body.body, "content")?,
        sender: me.user_id.clone(),
        redacts: None,
    };
    let t = txn(me, format!("send/{}/{}", body.room_id, body.event_type), body.txn_id.as_str());
    let appended = timeline::append(&state, &body.room_id, &draft, Some(&t)).await?;
    Ok(send_message_event::v3::Response::new(appended.pdu.event_id))
}

async fn send_state(
    state: AppState,
    req: Ruma<send_state_event::v3::Request>,
) -> Result<RumaResponse<send_state_event::v3::Response>> {
    let me = req.requester()?;
    let body = &req.body;
    let kind = body.event_type.to_string();
    let content = object_of(&body.body, "content")?;
    match kind.as_str() {
        "m.room.canonical_alias" => {
            let value = serde_json::to_value(&content).map_err(|e| Error::Internal(e.to_string()))?;
            crate::room::directory::validate_canonical_alias(&state, &body.room_id, &value).await?;
        }
        "m.room.third_party_invite" => return Err(third_party_invites_unsupported()),
        "m.room.create" => {
            return Err(Error::BadJson("A room's create event is made by createRoom, never sent".into()));
        }
        "m.room.power_levels" => {
            let view = read::open(&state, &body.room_id).await?;
            if view.rules.authorization.explicitly_privilege_room_creators {
                let power = crate::room::power::current(&state, &view).await?;
                let creators: Vec<OwnedUserId> =
                    power.rules.privileged_creators.into_iter().flatten().collect();
                crate::room::create::refuse_creators_in_users(&content, &creators)?;
            }
        }
        // The same checks as /invite, /kick, /ban: one membership path.
        "m.room.member" if body.state_key != me.user_id.as_str() => {
            let target = ruma::UserId::parse(&body.state_key).map_err(|_| {
                Error::InvalidParam("The state key of m.room.member must be a user id".into())
            })?;
            let membership = content.get("membership").and_then(|m| m.as_str()).unwrap_or_default();
            crate::room::membership::check_target(&state, &target, membership).await?;
        }
        _ => {}
    }
    let draft = Draft {
        kind,
        state_key: Some(body.state_key.clone()),
        content,
        sender: me.user_id.clone(),
        redacts: None,
    };
    let appended = timeline::append(&state, &body.room_id, &draft, None).await?;
    Ok(RumaResponse(send_state_event::v3::Response::new(appended.pdu.event_id)))
}

async fn get_state_for_key(
    state: AppState,
    req: Ruma<get_state_event_for_key::v3::Request>,
) -> Result<axum::Json<Value>> {
    let me = req.requester()?;
    let body = &req.body;
    let view = read::open(&state, &body.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    let kind = body.event_type.to_string();
    let loaded = read::visible_state_event(&state, &view, &access, &kind, &body.state_key)
        .await?
        .ok_or_else(|| Error::NotFound("No such state event".into()))?;
    let event = read::format(&view, &loaded, me, &access.history);
    let wants_event = matches!(body.format, get_state_event_for_key::v3::StateEventFormat::Event);
    Ok(axum::Json(if wants_event { event } else { event["content"].clone() }))
}

async fn get_state(state: AppState, req: Ruma<get_state_events::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let view = read::open(&state, &req.body.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    let loaded = read::visible_state(&state, &view, &access, None).await?;
    Ok(Value::Array(loaded.iter().map(|l| read::format(&view, l, me, &access.history)).collect()))
}

async fn get_event(state: AppState, req: Ruma<get_room_event::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let view = read::open(&state, &req.body.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    // An event the user may not see is the same 404 as an unknown one.
    let not_found = || Error::NotFound("Event not found".into());
    let loaded = match read::load_by_id(&state, req.body.event_id.as_str()).await {
        Ok(l) => l,
        Err(Error::NotFound(_)) => return Err(not_found()),
        Err(e) => return Err(e),
    };
    if loaded.stored.room_id != req.body.room_id.as_str() || !access.ranges.contains(loaded.stored.seq) {
        return Err(not_found());
    }
    read::format_event(&state, &view, &access, me, &loaded).await
}

async fn joined_rooms_list(
    state: AppState,
    req: Ruma<joined_rooms::v3::Request>,
) -> Result<joined_rooms::v3::Response> {
    let me = req.requester()?;
    let rooms = events::rooms_with_membership(&state.db, me.user_id.as_str(), "join").await?;
    let rooms = rooms
        .into_iter()
        .map(|r| ruma::OwnedRoomId::try_from(r).map_err(|e| Error::Internal(format!("stored room id: {e}"))))
        .collect::<Result<_>>()?;
    Ok(joined_rooms::v3::Response::new(rooms))
}

async fn joined_members_list(state: AppState, req: Ruma<joined_members::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let view = read::open(&state, &req.body.room_id).await?;
    // Members joined now, or anyone when the room is world-readable (a
    // departed user gets 403).
    let access = read::access(&state, &view, &me.user_id).await?;
    if !access.joined() && !access.world_readable_now {
        return Err(Error::Forbidden("You are not joined to this room".into()));
    }
    let mut joined = serde_json::Map::new();
    for stored in events::current_state(&state.db, req.body.room_id.as_str()).await? {
        let pdu = crate::room::pdu::Pdu::from_stored(&stored.event_id, &stored.json)?;
        if pdu.kind.to_string() != "m.room.member" {
            continue;
        }
        let content: Value = pdu.content_as().unwrap_or_default();
        if content["membership"] != "join" {
            continue;
        }
        if let Some(user) = &pdu.state_key {
            joined.insert(
                user.clone(),
                json!({ "display_name": content.get("displayname"), "avatar_url": content.get("avatar_url") }),
            );
        }
    }
    Ok(json!({ "joined": joined }))
}

async fn members(state: AppState, req: Ruma<get_member_events::v3::Request>) -> Result<Value> {
    let me = req.requester()?;
    let body = &req.body;
    let view = read::open(&state, &body.room_id).await?;
    let access = read::access(&state, &view, &me.user_id).await?;
    // A `/messages` token or a `/sync` one (`next_batch`, as the spec allows).
    let at = match body.at.as_deref() {
        Some(token) => Some(super::messages::position(&state, &view, token).await?),
        None => None,
    };
    // The event at that point must be one the caller may read (as Synapse):
    // the membership there would tell what they may not see.
    if let Some(at) = at
        && !access.ranges.contains(at)
    {
        return Err(Error::Forbidden("You may not see the room at that point".into()));
    }
    let mut chunk = Vec::new();
    for loaded in read::visible_state(&state, &view, &access, at).await? {
        if loaded.pdu.kind.to_string() != "m.room.member" {
            continue;
        }
        let event = read::format(&view, &loaded, me, &access.history);
        let membership = event["content"]["membership"].as_str().unwrap_or("leave");
        if body.membership.as_ref().is_some_and(|m| m.as_str() != membership) {
            continue;
        }
        if body.not_membership.as_ref().is_some_and(|m| m.as_str() == membership) {
            continue;
        }
        chunk.push(event);
    }
    Ok(json!({ "chunk": chunk }))
}

async fn redact(state: AppState, req: Ruma<redact_event::v3::Request>) -> Result<redact_event::v3::Response> {
    let me = req.requester()?;
    let body = &req.body;
    let view = read::open(&state, &body.room_id).await?;
    let target = read::load_by_id(&state, body.event_id.as_str()).await?;
    // Only what the redactor may read: an event outside their ranges is the
    // same 404 as an unknown one. Whether they may redact it (same room,
    // their own or at the redact level) is the write path's check.
    let access = read::access(&state, &view, &me.user_id).await?;
    if !access.joined() {
        return Err(Error::Forbidden("You are not joined to this room".into()));
    }
    if target.stored.room_id != body.room_id.as_str() {
        // 400 only to someone who can see the event where it is; to anyone
        // else it is as unknown as an id that names nothing.
        let elsewhere =
            ruma::RoomId::parse(&target.stored.room_id).map_err(|e| Error::Internal(e.to_string()))?;
        let there = read::open(&state, &elsewhere).await?;
        let readable = read::access(&state, &there, &me.user_id).await?.ranges.contains(target.stored.seq);
        return Err(if readable {
            Error::InvalidParam("The event to redact is not in this room".into())
        } else {
            Error::NotFound("Event not found".into())
        });
    }
    if !access.ranges.contains(target.stored.seq) {
        return Err(Error::NotFound("Event not found".into()));
    }
    let mut content = CanonicalJsonObject::new();
    if let Some(reason) = &body.reason {
        content.insert("reason".into(), ruma::canonical_json::CanonicalJsonValue::String(reason.clone()));
    }
    let draft = Draft {
        kind: "m.room.redaction".into(),
        state_key: None,
        content,
        sender: me.user_id.clone(),
        redacts: Some(body.event_id.clone()),
    };
    let t = txn(me, format!("redact/{}/{}", body.room_id, body.event_id), body.txn_id.as_str());
    let appended = timeline::append(&state, &body.room_id, &draft, Some(&t)).await?;
    Ok(redact_event::v3::Response::new(appended.pdu.event_id))
}
