//! Restricted joins (join rules `restricted` and `knock_restricted`): a user
//! may join when they are joined to one of the rooms the rule's `allow` list
//! names, and the join event then names, in
//! `join_authorised_via_users_server`, a member of this server who may invite.
//! That member is chosen here, by the server, in the write path every local
//! join passes; a client that supplies the field itself is refused, so nobody
//! can name an authoriser of their own choosing. Another server's user gets
//! the same choice in make_join's template; their signed join (send_join)
//! is checked again against the `allow` list in the write path
//! ([`check_remote`]) before we countersign it into the room. Where nobody
//! here may invite, a local user's join is let in by another server in the
//! room whose members may ([`authorising_servers`]), as any other server's
//! user's join would be.

use ruma::canonical_json::CanonicalJsonValue;
use ruma::events::TimelineEventType;
use ruma::{OwnedServerName, OwnedUserId, RoomId, UserId};
use serde_json::Value;

use super::pdu::{Draft, Pdu};
use super::timeline::{RoomWriter, member_value};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;
use crate::storage::federation as store;

/// The most entries of a join rule's `allow` list looked at.
const MAX_ALLOWED_ROOMS: usize = 50;

/// The member event field that names who authorised a restricted join.
pub const AUTHORISER_FIELD: &str = "join_authorised_via_users_server";

/// Checks a local member event before it is built: refuses a client-supplied
/// authoriser, and for a join that the room's restricted rule must allow,
/// returns the draft with the authoriser the server chose. `None` when the
/// draft goes as it is.
pub(super) async fn prepare(
    writer: &mut RoomWriter,
    state: &AppState,
    draft: &Draft,
) -> Result<Option<Draft>> {
    if draft.kind != "m.room.member" {
        return Ok(None);
    }
    let sender = draft.sender.as_str();
    if member_value(&draft.kind, &draft.content) == Some("knock") && !writer.rules.authorization.knocking {
        // The auth rules refuse it too; this says why (as Synapse does).
        return Err(Error::Forbidden(format!("Room version {} does not support knocking", writer.version)));
    }
    let own_join = member_value(&draft.kind, &draft.content) == Some("join")
        && draft.state_key.as_deref() == Some(sender);
    let was = match &draft.state_key {
        Some(target) => writer.membership(target).await?,
        None => None,
    };
    if draft.content.contains_key(AUTHORISER_FIELD) {
        if own_join && was.as_deref() == Some("join") {
            // A member changing their member event (a display name, say)
            // copies its content: the field counts only on the way in, so
            // it is dropped, not refused.
            let mut draft = draft.clone();
            draft.content.remove(AUTHORISER_FIELD);
            return Ok(Some(draft));
        }
        return Err(Error::Forbidden(format!(
            "{AUTHORISER_FIELD} is chosen by the server, not by the client"
        )));
    }
    if !own_join || matches!(was.as_deref(), Some("join" | "invite")) {
        // Members and invitees join whatever the rule says.
        return Ok(None);
    }
    if !check_allow_rules(writer, state, &draft.sender).await? {
        return Ok(None);
    }
    // The most powerful member who may invite authorises (ties: the first
    // user id).
    let power = writer.power_levels().await?;
    let room_id = writer.room_id.to_string();
    let authoriser = events::joined_members_tx(writer.conn(), &room_id)
        .await?
        .into_iter()
        .filter_map(|u| ruma::OwnedUserId::try_from(u).ok())
        .filter(|u| u.server_name() == state.settings.server_name && power.user_can_invite(u))
        .max_by(|a, b| power.for_user(a).cmp(&power.for_user(b)).then_with(|| b.cmp(a)));
    let Some(authoriser) = authoriser else {
        // Another server's user may try another server in the room; so does
        // ours (the client join goes through a server whose members may
        // invite: `authorising_servers`).
        return Err(Error::UnableToGrantJoin(
            "No member of this room on this server may authorise your join".into(),
        ));
    };
    let mut draft = draft.clone();
    draft.content.insert(AUTHORISER_FIELD.into(), CanonicalJsonValue::String(authoriser.to_string()));
    Ok(Some(draft))
}

/// The other servers with a member of `room_id` who may invite, in the
/// order of their most powerful such member (ties: the server name): those
/// that can authorise a restricted join when nobody here may (Synapse's
/// `servers_that_can_issue_invite`).
pub async fn authorising_servers(state: &AppState, room_id: &RoomId) -> Result<Vec<OwnedServerName>> {
    let view = super::read::open(state, room_id).await?;
    let power = super::power::current(state, &view).await?;
    let mut members: Vec<OwnedUserId> = events::joined_members(&state.db, room_id.as_str())
        .await?
        .into_iter()
        .filter_map(|u| OwnedUserId::try_from(u).ok())
        .filter(|u| !is_local(state, u) && power.user_can_invite(u))
        .collect();
    members.sort_by(|a, b| {
        power.for_user(b).cmp(&power.for_user(a)).then_with(|| a.server_name().cmp(b.server_name()))
    });
    let mut servers: Vec<OwnedServerName> = Vec::new();
    for member in members {
        if !servers.iter().any(|s| s == member.server_name()) {
            servers.push(member.server_name().to_owned());
        }
    }
    Ok(servers)
}

fn is_local(state: &AppState, user: &UserId) -> bool {
    user.server_name() == state.settings.server_name
}

/// The write path's check of another server's join that one of our users
/// authorises (send_join; we countersign it): the joiner must meet the
/// room's restricted rule here, as a local joiner must. The auth rules
/// check the authoriser (joined, with the power to invite); a join that
/// another server's user authorises is that server's to judge.
pub(super) async fn check_remote(writer: &mut RoomWriter, state: &AppState, pdu: &Pdu) -> Result<()> {
    if pdu.kind != TimelineEventType::RoomMember || pdu.state_key.as_deref() != Some(pdu.sender.as_str()) {
        return Ok(());
    }
    let content: Value = pdu.content_as().unwrap_or_default();
    if content["membership"] != "join" {
        return Ok(());
    }
    let ours = content[AUTHORISER_FIELD]
        .as_str()
        .and_then(|a| UserId::parse(a).ok())
        .is_some_and(|a| is_local(state, &a));
    if !ours {
        return Ok(());
    }
    let was = writer.membership(pdu.sender.as_str()).await?;
    if matches!(was.as_deref(), Some("join" | "invite")) {
        return Ok(());
    }
    check_allow_rules(writer, state, &pdu.sender).await.map(|_| ())
}

/// Whether `user`'s join must pass the room's restricted rule (`false`: the
/// rule is another), refusing it when they meet none of its `allow`
/// conditions: joined, as this server knows, to none of the rooms it names.
/// For another server's user, when this server is in none of those rooms
/// it cannot tell (M_UNABLE_TO_AUTHORISE_JOIN).
async fn check_allow_rules(writer: &mut RoomWriter, state: &AppState, user: &UserId) -> Result<bool> {
    let rules: Value =
        writer.state_event("m.room.join_rules", "").await?.and_then(|p| p.content_as()).unwrap_or_default();
    let auth = &writer.rules.authorization;
    let (rule, supported) = match rules["join_rule"].as_str() {
        Some(rule @ "restricted") => (rule, auth.restricted_join_rule),
        Some(rule @ "knock_restricted") => (rule, auth.knock_restricted_join_rule),
        _ => return Ok(false),
    };
    if !supported {
        // A join rule the version does not know lets nobody in (the auth
        // rules refuse the join too; this says why).
        return Err(Error::Forbidden(format!(
            "Room version {} does not support the {rule} join rule: nobody can join under it",
            writer.version
        )));
    }
    // Each allowed room costs a lookup inside the room's write lock: only
    // the first MAX_ALLOWED_ROOMS count.
    let allowed_rooms: Vec<String> = rules["allow"]
        .as_array()
        .into_iter()
        .flatten()
        .take(MAX_ALLOWED_ROOMS)
        .filter_map(|entry| {
            (entry["type"] == "m.room_membership").then(|| entry["room_id"].as_str()).flatten()
        })
        .map(str::to_owned)
        .collect();
    let our_name = state.settings.server_name.as_str();
    let mut known = false;
    for room in &allowed_rooms {
        if events::membership_tx(writer.conn(), room, user.as_str()).await?.as_deref() == Some("join") {
            return Ok(true);
        }
        known = known || store::server_in_room_tx(writer.conn(), room, our_name).await?;
    }
    if !known && !is_local(state, user) {
        return Err(Error::UnableToAuthoriseJoin(
            "This server is in none of the rooms the join rule names: it cannot tell whether you may join"
                .into(),
        ));
    }
    Err(Error::Forbidden(
        "This room can only be joined by members of the rooms its join rule names, and you are in none of them"
            .into(),
    ))
}
