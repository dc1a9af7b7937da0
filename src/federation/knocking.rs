//! Knocking on a room that lives on other servers: make_knock to each
//! candidate server in turn (`ver` = the versions we take part in), our
//! knock built from the template and signed (`joining::sign_template`),
//! send_knock; the room's stripped state the resident answers is kept with
//! the knock (`remote_invites`, membership `knock`) for the knocker's
//! `/sync` (`rooms.knock`). The host's answer comes as for any remote
//! invite: its invite replaces the row; its refusal (a leave or ban of the
//! knocker, sent to us) ends it (`invites::membership_outside`).

use ruma::api::federation::membership::{create_knock_event, prepare_knock_event};
use ruma::canonical_json::CanonicalJsonObject;
use ruma::{OwnedServerName, RoomId, UserId};
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::room::version;
use crate::state::AppState;
use crate::storage::federation::RemoteInvite;

/// Knocks `user` on `room_id` through the first of `servers` that takes the
/// knock; `content` are the keys the user adds to the knock (a reason).
pub async fn knock(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    servers: &[OwnedServerName],
    content: CanonicalJsonObject,
) -> Result<()> {
    super::joining::through_first(state, room_id, servers, "knock on", |server| {
        knock_via(state, user, room_id, server, content.clone())
    })
    .await
}

async fn knock_via(
    state: &AppState,
    user: &UserId,
    room_id: &RoomId,
    server: &OwnedServerName,
    content: CanonicalJsonObject,
) -> Result<()> {
    let mut request = prepare_knock_event::v1::Request::new(room_id.to_owned(), user.to_owned());
    request.ver = version::FEDERATED.to_vec();
    let template =
        super::send(state, server, request).await.map_err(|e| super::joining::remote_error(server, e))?;
    let (version, rules) = version::federated_rules(Some(&template.room_version))?;
    if !rules.authorization.knocking {
        return Err(Error::Forbidden(format!("Room version {version} does not support knocking")));
    }
    let (event_id, knock) =
        super::joining::sign_template(state, &rules, room_id, user, &template.event, "knock", content)
            .await?;
    let json = serde_json::to_string(&knock).map_err(|e| Error::Internal(format!("knock json: {e}")))?;
    let raw =
        RawJsonValue::from_string(json.clone()).map_err(|e| Error::Internal(format!("knock json: {e}")))?;
    let request = create_knock_event::v1::Request::new(room_id.to_owned(), event_id.clone(), raw);
    let answer =
        super::send(state, server, request).await.map_err(|e| super::joining::remote_error(server, e))?;
    let member = serde_json::json!({
        "type": "m.room.member",
        "state_key": user,
        "sender": user,
        "content": knock.get("content"),
        "event_id": event_id,
        "origin_server_ts": knock.get("origin_server_ts"),
    });
    let row = RemoteInvite {
        user_id: user.to_string(),
        room_id: room_id.to_string(),
        event_id: event_id.to_string(),
        room_version: version.to_string(),
        json,
        stripped_state: super::invites::client_stripped_state(&answer.knock_room_state, member),
        via: server.to_string(),
        stream: 0,
        rejected: 0,
        membership: "knock".into(),
    };
    super::invites::keep(state, row).await
}
