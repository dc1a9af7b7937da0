//! The `rooms` table: one row per room, holding the head of its seq line.

use sqlx::AnyConnection;

use super::Db;
use crate::error::{Error, Result};

/// A room's row.
#[derive(Debug, Clone)]
pub struct RoomRow {
    /// Room id.
    pub room_id: String,
    /// Room version id.
    pub room_version: String,
    /// The creator (sender of the create event).
    pub creator: String,
    /// Seq of the newest event.
    pub last_seq: i64,
    /// Event ids new events point at.
    pub extremities: Vec<String>,
    /// Greatest depth so far.
    pub max_depth: i64,
    /// Listed in the public directory.
    pub published: bool,
    /// The room's floor: nothing below it is returned to anyone.
    pub floor_seq: i64,
    /// Moves whenever what members may read changes other than by the head
    /// moving on (a state event, a purge, a user's own floor).
    pub read_epoch: i64,
}

type Row = (String, String, String, i64, String, i64, i64, i64, i64);

fn from_row(
    (room_id, room_version, creator, last_seq, extremities, max_depth, published, floor_seq, read_epoch): Row,
) -> RoomRow {
    RoomRow {
        floor_seq,
        read_epoch,
        room_id,
        room_version,
        creator,
        last_seq,
        extremities: serde_json::from_str(&extremities).unwrap_or_default(),
        max_depth,
        published: published != 0,
    }
}

const COLUMNS: &str =
    "room_id, room_version, creator, last_seq, extremities, max_depth, published, floor_seq, read_epoch";

/// Loads a room inside a write transaction.
pub async fn get_tx(conn: &mut AnyConnection, room_id: &str) -> Result<Option<RoomRow>> {
    let row: Option<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM rooms WHERE room_id = $1")))
            .bind(room_id)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(from_row))
}

/// Loads a room.
pub async fn get(db: &Db, room_id: &str) -> Result<Option<RoomRow>> {
    let row: Option<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM rooms WHERE room_id = $1")))
            .bind(room_id)
            .fetch_optional(&db.pool)
            .await?;
    Ok(row.map(from_row))
}

/// Inserts a new room with an empty seq line.
pub async fn insert(
    conn: &mut AnyConnection,
    room_id: &str,
    room_version: &str,
    creator: &str,
    now: i64,
) -> Result<()> {
    sqlx::query("INSERT INTO rooms (room_id, room_version, creator, created_ts) VALUES ($1, $2, $3, $4)")
        .bind(room_id)
        .bind(room_version)
        .bind(creator)
        .bind(now)
        .execute(conn)
        .await
        .map_err(|e| {
            if super::is_unique_violation(&e) {
                Error::Internal(format!("room {room_id} exists already"))
            } else {
                e.into()
            }
        })?;
    Ok(())
}

/// Moves the head of the seq line.
pub async fn set_head(
    conn: &mut AnyConnection,
    room_id: &str,
    last_seq: i64,
    extremities: &[String],
    max_depth: i64,
    state_changed: bool,
) -> Result<()> {
    let extremities = serde_json::to_string(extremities).map_err(|e| Error::Internal(e.to_string()))?;
    sqlx::query(
        "UPDATE rooms SET last_seq = $1, extremities = $2, max_depth = $3, read_epoch = read_epoch + $4 \
         WHERE room_id = $5",
    )
    .bind(last_seq)
    .bind(extremities)
    .bind(max_depth)
    .bind(i64::from(state_changed))
    .bind(room_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Lists or unlists a room in the public directory.
pub async fn set_published(db: &Db, room_id: &str, published: bool) -> Result<()> {
    sqlx::query("UPDATE rooms SET published = $1 WHERE room_id = $2")
        .bind(i64::from(published))
        .bind(room_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Rooms in the public directory, by room id.
pub async fn published(db: &Db) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT room_id FROM rooms WHERE published = 1 ORDER BY room_id")
        .fetch_all(&db.pool)
        .await?)
}

/// Raises the room's floor (it never moves down).
pub async fn raise_floor(db: &Db, room_id: &str, floor_seq: i64) -> Result<()> {
    sqlx::query(
        "UPDATE rooms SET floor_seq = $1, read_epoch = read_epoch + 1 WHERE room_id = $2 AND floor_seq < $1",
    )
    .bind(floor_seq)
    .bind(room_id)
    .execute(&db.pool)
    .await?;
    Ok(())
}
