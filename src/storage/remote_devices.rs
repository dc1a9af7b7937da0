//! Other servers' users' device lists (`remote_device_lists`): what their
//! server gave at a device-list position, kept current by its updates, and
//! marked stale when an update does not follow on from what is held or the
//! user may have begun to share a room with us again.

use serde_json::{Map, Value};
use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// Most devices kept for one user (a server giving more is not cached: its
/// answers are passed on, never stored).
pub const MAX_DEVICES: usize = 1000;

/// One user's device list as held here.
#[derive(Debug, Clone, Default)]
pub struct DeviceList {
    /// The owner's server's device-list position it is at.
    pub stream_id: i64,
    /// Not to be answered from: ask the owner's server again (0: current;
    /// each mark adds one, so a resync can tell it was overtaken).
    pub stale: i64,
    /// Device id -> `{ "keys": .., "device_display_name": .. }`.
    pub devices: Map<String, Value>,
    pub master_key: Option<Value>,
    pub self_signing_key: Option<Value>,
}

type Row = (i64, i64, String, Option<String>, Option<String>);

fn parse(text: Option<String>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

/// The device list held for `user`, if any.
pub async fn get(db: &Db, user: &str) -> Result<Option<DeviceList>> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT stream_id, stale, devices, master_key, self_signing_key FROM remote_device_lists \
         WHERE user_id = $1",
    )
    .bind(user)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(|(stream_id, stale, devices, master, self_signing)| DeviceList {
        stream_id,
        stale,
        devices: serde_json::from_str(&devices).unwrap_or_default(),
        master_key: parse(master),
        self_signing_key: parse(self_signing),
    }))
}

fn text(value: Option<&Value>) -> Option<String> {
    value.map(Value::to_string)
}

/// Before asking `user`'s server for their list: holds a stale list for
/// them if none is held, and answers its stale mark, which
/// [`finish_resync`] must find unchanged.
pub async fn begin_resync(db: &Db, user: &str) -> Result<i64> {
    sqlx::query(
        "INSERT INTO remote_device_lists (user_id, stream_id, stale, devices) VALUES ($1, -1, 1, '{}') \
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(user)
    .execute(&db.pool)
    .await?;
    let mark: Option<i64> = sqlx::query_scalar("SELECT stale FROM remote_device_lists WHERE user_id = $1")
        .bind(user)
        .fetch_optional(&db.pool)
        .await?;
    Ok(mark.unwrap_or(1))
}

/// Keeps `list` as `user`'s device list (no longer stale) unless the list
/// was marked stale again since [`begin_resync`] answered `mark` (an update
/// came meanwhile that the answer may predate): then false, and it stays
/// stale.
pub async fn finish_resync(db: &Db, user: &str, mark: i64, list: &DeviceList) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE remote_device_lists SET stream_id = $3, stale = 0, devices = $4, master_key = $5, \
         self_signing_key = $6 WHERE user_id = $1 AND stale = $2",
    )
    .bind(user)
    .bind(mark)
    .bind(list.stream_id)
    .bind(Value::Object(list.devices.clone()).to_string())
    .bind(text(list.master_key.as_ref()))
    .bind(text(list.self_signing_key.as_ref()))
    .execute(&db.pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Replaces the devices of `user`'s list at position `from` with `devices`
/// at `to`: false when the list moved meanwhile (or went stale, or is not
/// held), and nothing is written.
pub async fn advance(db: &Db, user: &str, from: i64, to: i64, devices: &Map<String, Value>) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE remote_device_lists SET stream_id = $3, devices = $4 \
         WHERE user_id = $1 AND stream_id = $2 AND stale = 0",
    )
    .bind(user)
    .bind(from)
    .bind(to)
    .bind(Value::Object(devices.clone()).to_string())
    .execute(&db.pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets the cross-signing keys held for `user` (those given).
pub async fn set_cross_signing(
    db: &Db,
    user: &str,
    master: Option<&Value>,
    self_signing: Option<&Value>,
) -> Result<()> {
    sqlx::query(
        "UPDATE remote_device_lists SET master_key = COALESCE($2, master_key), \
         self_signing_key = COALESCE($3, self_signing_key) WHERE user_id = $1",
    )
    .bind(user)
    .bind(text(master))
    .bind(text(self_signing))
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// `user`'s list is to be asked for again before it is answered from (a
/// resync under way when this happens does not count).
pub async fn mark_stale(db: &Db, user: &str) -> Result<()> {
    sqlx::query("UPDATE remote_device_lists SET stale = stale + 1 WHERE user_id = $1")
        .bind(user)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Forgets `user`'s list (it grew too large to keep).
pub async fn forget(db: &Db, user: &str) -> Result<()> {
    sqlx::query("DELETE FROM remote_device_lists WHERE user_id = $1").bind(user).execute(&db.pool).await?;
    Ok(())
}

/// Inside a room write that moved the memberships of `targets` (after the
/// room's state holds the moves): whoever may have begun to share a room
/// with one of our users gets a stale list, since no update reached us
/// while no room was shared. A remote target is that user; one of ours
/// (`ours`: our server name) makes it everyone joined to the room.
pub async fn members_moved(
    conn: &mut AnyConnection,
    room_id: &str,
    targets: &[String],
    ours: &str,
) -> Result<()> {
    let mut room_done = false;
    for target in targets {
        if target.split_once(':').is_some_and(|(_, server)| server == ours) {
            if room_done {
                continue;
            }
            room_done = true;
            sqlx::query(
                "UPDATE remote_device_lists SET stale = stale + 1 WHERE user_id IN \
                 (SELECT state_key FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' \
                  AND membership = 'join')",
            )
            .bind(room_id)
            .execute(&mut *conn)
            .await?;
        } else {
            sqlx::query("UPDATE remote_device_lists SET stale = stale + 1 WHERE user_id = $1")
                .bind(target)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}
