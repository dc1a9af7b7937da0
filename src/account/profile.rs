//! Profiles: `displayname`, `avatar_url` and custom fields. Display name and
//! avatar are copied into the user's member events; a change is sent as a new
//! member event into every room the user is joined to.

use ruma::canonical_json::CanonicalJsonValue;
use ruma::{OwnedRoomId, UserId};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::room::pdu::{Draft, canonical_content};
use crate::room::timeline;
use crate::state::AppState;
use crate::storage::{events, users};

/// Fields copied into member events.
pub const MEMBER_FIELDS: &[&str] = &["displayname", "avatar_url"];

/// The largest profile field value, in bytes of JSON.
const MAX_FIELD_BYTES: usize = 4096;

/// A local user's whole profile; 404 for an unknown user.
pub async fn get(state: &AppState, user: &UserId) -> Result<Map<String, Value>> {
    if user.server_name() != state.settings.server_name
        || !users::localpart_exists(&state.db, user.localpart()).await?
    {
        return Err(Error::NotFound("Profile not found".into()));
    }
    let mut out = Map::new();
    for (field, value) in users::profile(&state.db, user.as_str()).await? {
        if let Ok(v) = serde_json::from_str(&value) {
            out.insert(field, v);
        }
    }
    Ok(out)
}

/// A user's whole profile: a local user's from the database, another
/// server's user's asked of that server (when federation is on; else 404).
pub async fn lookup(state: &AppState, user: &UserId) -> Result<Map<String, Value>> {
    if user.server_name() == state.settings.server_name || state.settings.federation.is_none() {
        return get(state, user).await;
    }
    let request = ruma::api::federation::query::get_profile_information::v1::Request::new(user.to_owned());
    match crate::federation::send(state, user.server_name(), request).await {
        Ok(response) => Ok(response.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        Err(crate::federation::FederationError::Status(404, _)) => {
            Err(Error::NotFound("Profile not found".into()))
        }
        Err(e) => {
            tracing::info!(%user, "remote profile query failed: {e}");
            Err(Error::RemoteUnavailable(format!("Cannot get the profile from {}", user.server_name())))
        }
    }
}

/// Whether `s` is a URI (RFC 3986: a scheme, a colon, the rest without
/// spaces or control characters).
fn is_uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else { return false };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !rest.is_empty()
        && !rest.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Sets or clears one field of one's own profile, and for the member fields
/// sends the change into every joined room.
pub async fn set(state: &AppState, user: &UserId, field: &str, value: Option<Value>) -> Result<()> {
    if field.is_empty() || field.len() > 255 {
        return Err(Error::InvalidParam("Invalid profile field name".into()));
    }
    match (field, &value) {
        ("displayname", Some(v)) if !v.is_string() => {
            return Err(Error::BadJson("displayname must be a string".into()));
        }
        ("avatar_url", Some(v)) if !v.as_str().is_some_and(|s| s.is_empty() || is_uri(s)) => {
            return Err(Error::BadJson("avatar_url must be a URI (clients use mxc://)".into()));
        }
        _ => {}
    }
    let text = value.as_ref().map(|v| serde_json::to_string(v).unwrap_or_default());
    if text.as_ref().is_some_and(|t| t.len() > MAX_FIELD_BYTES) {
        return Err(Error::TooLarge("The profile field is too large".into()));
    }
    users::set_profile_field(&state.db, user.as_str(), field, text.as_deref()).await?;
    if MEMBER_FIELDS.contains(&field) {
        propagate(state, user).await?;
    }
    Ok(())
}

/// The member-event fields of a user's profile.
pub async fn member_fields(state: &AppState, user: &UserId) -> Result<Vec<(String, CanonicalJsonValue)>> {
    let mut out = Vec::new();
    for (field, value) in users::profile(&state.db, user.as_str()).await? {
        if MEMBER_FIELDS.contains(&field.as_str())
            && let Some(s) =
                serde_json::from_str::<Value>(&value).ok().and_then(|v| v.as_str().map(str::to_owned))
        {
            out.push((field, CanonicalJsonValue::String(s)));
        }
    }
    Ok(out)
}

async fn propagate(state: &AppState, user: &UserId) -> Result<()> {
    let fields = member_fields(state, user).await?;
    for room in events::rooms_with_membership(&state.db, user.as_str(), "join").await? {
        let room_id = OwnedRoomId::try_from(room.as_str()).map_err(|e| Error::Internal(e.to_string()))?;
        let Some(current) = events::state_event(&state.db, &room, "m.room.member", user.as_str()).await?
        else {
            continue;
        };
        let pdu = crate::room::pdu::Pdu::from_stored(&current.event_id, &current.json)?;
        let mut content: Value = pdu.content_as().unwrap_or_default();
        if let Some(map) = content.as_object_mut() {
            for f in MEMBER_FIELDS {
                map.remove(*f);
            }
            for (f, v) in &fields {
                map.insert(f.clone(), serde_json::to_value(v).unwrap_or_default());
            }
        }
        let draft = Draft {
            kind: "m.room.member".into(),
            state_key: Some(user.to_string()),
            content: canonical_content(content)?,
            sender: user.to_owned(),
            redacts: None,
        };
        if let Err(e) = timeline::append(state, &room_id, &draft, None).await {
            tracing::warn!(%room_id, %user, "profile change not sent to the room: {e}");
        }
    }
    Ok(())
}
