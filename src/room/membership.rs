//! Membership changes: join, leave, invite, kick, ban, unban, and bulk changes.
//! All go through the one write path (`timeline`), so each is an ordinary
//! `m.room.member` event at its own seq and the membership ranges move in the
//! same transaction.

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::{OwnedUserId, RoomId, UserId};

use super::pdu::Draft;
use super::timeline::{Appended, RoomWriter};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::users;

/// A membership change one user makes for another (or themselves).
#[derive(Debug, Clone)]
pub struct Change {
    /// Whose membership changes.
    pub target: OwnedUserId,
    /// `join`, `invite`, `leave`, `ban`, `knock`.
    pub membership: &'static str,
    /// Optional reason.
    pub reason: Option<String>,
}

/// Whether `target` may be the target of a `membership` change: a local
/// user who exists, or (with federation on) another server's user to
/// invite (their server signs the invite first), kick, ban or unban (the
/// event reaches their server through the room's outgoing queue).
pub async fn check_target(state: &AppState, target: &UserId, membership: &str) -> Result<()> {
    if target.server_name() != state.settings.server_name {
        if matches!(membership, "invite" | "leave" | "ban") && state.settings.federation.is_some() {
            return Ok(());
        }
        return Err(Error::Forbidden(format!(
            "{target} is on another server, and this server does not federate"
        )));
    }
    if !users::localpart_exists(&state.db, target.localpart()).await? {
        return Err(Error::NotFound(format!("Unknown user {target}")));
    }
    Ok(())
}

/// The member event content: membership, reason, and for joins and invites
/// the target's display name and avatar.
async fn content(state: &AppState, change: &Change) -> Result<CanonicalJsonObject> {
    let mut content = CanonicalJsonObject::new();
    content.insert("membership".into(), CanonicalJsonValue::String(change.membership.to_owned()));
    if let Some(reason) = &change.reason {
        content.insert("reason".into(), CanonicalJsonValue::String(reason.clone()));
    }
    if matches!(change.membership, "join" | "invite" | "knock") {
        for (field, value) in crate::account::profile::member_fields(state, &change.target).await? {
            content.insert(field, value);
        }
    }
    Ok(content)
}

async fn draft(state: &AppState, sender: &UserId, change: &Change) -> Result<Draft> {
    Ok(Draft {
        kind: "m.room.member".into(),
        state_key: Some(change.target.to_string()),
        content: content(state, change).await?,
        sender: sender.to_owned(),
        redacts: None,
    })
}

/// One's own join or knock with extra content keys the client sent (the
/// server's own keys, membership, reason and profile, win over them).
pub async fn own_change_with_content(
    state: &AppState,
    room_id: &RoomId,
    change: Change,
    extra: CanonicalJsonObject,
) -> Result<Appended> {
    let sender = change.target.clone();
    let mut draft = draft(state, &sender, &change).await?;
    for (key, value) in extra {
        draft.content.entry(key).or_insert(value);
    }
    super::timeline::append(state, room_id, &draft, None).await
}

/// Applies one change.
pub async fn change(state: &AppState, room_id: &RoomId, sender: &UserId, change: Change) -> Result<Appended> {
    bulk(state, room_id, sender, vec![change])
        .await?
        .pop()
        .ok_or_else(|| Error::Internal("no change made".into()))
}

/// Applies several changes in one transaction: consecutive seqs, each
/// authorised against the state the previous ones left; all or nothing.
pub async fn bulk(
    state: &AppState,
    room_id: &RoomId,
    sender: &UserId,
    changes: Vec<Change>,
) -> Result<Vec<Appended>> {
    for c in &changes {
        if c.target != sender {
            check_target(state, &c.target, c.membership).await?;
        }
    }
    let mut drafts = Vec::with_capacity(changes.len());
    for c in &changes {
        drafts.push(draft(state, sender, c).await?);
    }
    let remote_invite =
        |c: &Change| c.membership == "invite" && c.target.server_name() != state.settings.server_name;
    if let ([change], [one]) = (changes.as_slice(), drafts.as_slice())
        && remote_invite(change)
    {
        return Ok(vec![crate::federation::invites::invite_remote(state, room_id, one).await?]);
    }
    if changes.iter().any(remote_invite) {
        return Err(Error::InvalidParam("Users of other servers are invited one at a time".into()));
    }
    if let [one] = drafts.as_slice() {
        // A single change may share a commit with other writes to the room.
        return Ok(vec![super::timeline::append(state, room_id, one, None).await?]);
    }
    let mut writer = RoomWriter::open(state, room_id).await?;
    let mut out = Vec::with_capacity(changes.len());
    for d in &drafts {
        out.push(writer.append(state, d, None).await?);
    }
    if out.iter().any(|a| a.is_new) {
        writer.commit(state).await?;
    }
    Ok(out)
}
