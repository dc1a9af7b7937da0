//! A room joined over federation, stored: the send_join answer's events
//! (auth chain and state, checked by `federation::joining`) become outliers,
//! and our join becomes the next position of the room's line (the first one
//! for a room new here) carrying the whole state in `state_runs`, so "state
//! as of a seq" is exact from the join on. Every member in that state gets
//! a range row from the join's position (local and remote users alike:
//! remote users' rows decide what their servers may be sent), and the
//! servers in the room are counted. One transaction.

use ruma::UserId;

use super::pdu::Pdu;
use crate::error::{Error, Result};
use crate::federation::joining::JoinedRoom;
use crate::state::AppState;
use crate::storage::events::{self, NewEvent};
use crate::storage::{self, federation as fed, memberships, outliers, remote_devices, rooms, state_runs};

/// Stores the room `joined` describes with `user`'s join at its head.
pub async fn store_joined_room(state: &AppState, user: &UserId, joined: &JoinedRoom) -> Result<i64> {
    let room_id =
        joined.join.room_id.clone().ok_or_else(|| Error::Internal("a join without a room id".into()))?;
    let room = room_id.as_str();
    let create = joined
        .state
        .get(&("m.room.create".to_owned(), String::new()))
        .ok_or_else(|| Error::Internal("a joined room without a create event".into()))?;
    let now = storage::now_ms();
    let mut tx = state.db.begin_room_write(Some(room)).await?;
    let existing = rooms::get_tx(tx.conn(), room).await?;
    if existing.is_none() {
        rooms::insert(tx.conn(), room, joined.version.as_str(), create.sender.as_str(), now).await?;
    }
    let last = existing.as_ref().map_or(super::position::NONE, |r| r.last_seq);
    let seq = super::position::next_after(last)
        .ok_or_else(|| Error::Internal(format!("the seq line of {room} is full")))?;
    if existing.is_some() {
        // Back in a room we had left: what we knew of it stops where we left
        // (its last position); who is in it and which servers are, start
        // again from this state.
        fed::forget_servers(tx.conn(), room).await?;
        memberships::close_all_open(tx.conn(), room, last).await?;
    }

    for pdu in joined.events.values() {
        hold(tx.conn(), room, pdu, now).await?;
    }

    let join = &joined.join;
    let json = join.to_json_string();
    let reservation = state.streams.reserve();
    events::insert(
        tx.conn(),
        &NewEvent {
            room_id: room,
            seq,
            stream: reservation.pos,
            event_id: join.event_id.as_str(),
            event_type: "m.room.member",
            state_key: Some(user.as_str()),
            sender: user.as_str(),
            origin_server_ts: i64::try_from(u64::from(join.origin_server_ts.0)).unwrap_or(i64::MAX),
            json: &json,
            txn: None,
            membership: Some("join"),
            relation: None,
        },
    )
    .await?;

    // The state after the join: the answer's state with the join in it.
    let mut entries: Vec<(String, String, String)> = joined
        .state
        .iter()
        .filter(|((kind, key), _)| !(kind == "m.room.member" && key == user.as_str()))
        .map(|((kind, key), pdu)| (kind.clone(), key.clone(), pdu.event_id.to_string()))
        .collect();
    entries.push(("m.room.member".into(), user.to_string(), join.event_id.to_string()));
    let refs: Vec<(&str, &str, &str)> =
        entries.iter().map(|(t, k, e)| (t.as_str(), k.as_str(), e.as_str())).collect();
    state_runs::write_snapshot(tx.conn(), room, seq, &refs).await?;

    let mut joined_per_server: std::collections::BTreeMap<String, i64> = Default::default();
    for ((kind, key), pdu) in &joined.state {
        let content: serde_json::Value = pdu.content_as().unwrap_or_default();
        let membership = (kind == "m.room.member").then(|| content["membership"].as_str()).flatten();
        if kind == "m.room.member" && key == user.as_str() {
            continue;
        }
        events::set_current(tx.conn(), room, kind, key, pdu.event_id.as_str(), membership, seq).await?;
        let canonical = pdu.as_draft()?.content;
        crate::room::directory::track_state(
            tx.conn(),
            room,
            kind,
            key,
            &canonical,
            membership.map(|m| ("leave", m)),
        )
        .await?;
        if let Some(m @ ("join" | "invite" | "knock")) = membership {
            memberships::open(tx.conn(), room, key, m, seq, seq).await?;
            if m == "join" {
                let server = key.split_once(':').map_or("", |(_, s)| s);
                *joined_per_server.entry(server.to_owned()).or_default() += 1;
            }
        }
    }
    let content = join.as_draft()?.content;
    crate::room::directory::track_state(
        tx.conn(),
        room,
        "m.room.member",
        user.as_str(),
        &content,
        Some(("leave", "join")),
    )
    .await?;
    memberships::open(tx.conn(), room, user.as_str(), "join", seq, seq).await?;
    memberships::unforget(tx.conn(), user.as_str(), room).await?;
    *joined_per_server.entry(state.settings.server_name.to_string()).or_default() += 1;
    for (server, n) in &joined_per_server {
        fed::add_joined(tx.conn(), room, server, *n).await?;
    }
    fed::delete_remote_invite(tx.conn(), user.as_str(), room).await?;
    // Everyone in the room may now share one with us for the first time.
    let ours = state.settings.server_name.as_str();
    remote_devices::members_moved(tx.conn(), room, &[user.to_string()], ours).await?;
    if existing.is_some() {
        // What was said while we were away lies between our line and the
        // join: a hole below it, filled by backfill when someone pages into
        // it (`room::hole`), as one an outage leaves.
        let mut missing = Vec::new();
        for prev in &join.prev_events {
            if events::by_id_tx(tx.conn(), prev.as_str()).await?.is_none() {
                missing.push(prev.as_str());
            }
        }
        if !missing.is_empty() {
            storage::backfill::add_gap(tx.conn(), room, seq, join.event_id.as_str(), &missing).await?;
        }
    }
    let depth = crate::room::pdu::stored_depth(join.depth);
    rooms::set_head(tx.conn(), room, seq, &[join.event_id.to_string()], depth, true).await?;
    tx.commit().await?;
    drop(reservation);
    state.notifier.wake([user.as_str()]);
    Ok(seq)
}

/// Holds another server's checked event as an outlier of `room` (nothing
/// written when it is held already).
pub(super) async fn hold(conn: &mut sqlx::AnyConnection, room: &str, pdu: &Pdu, now: i64) -> Result<()> {
    let json = pdu.to_json_string();
    let kind = pdu.kind.to_string();
    outliers::insert(
        conn,
        &outliers::NewOutlier {
            event_id: pdu.event_id.as_str(),
            room_id: room,
            event_type: &kind,
            state_key: pdu.state_key.as_deref(),
            sender: pdu.sender.as_str(),
            origin_server_ts: i64::try_from(u64::from(pdu.origin_server_ts.0)).unwrap_or(i64::MAX),
            json: &json,
            received_ts: now,
        },
    )
    .await?;
    Ok(())
}
