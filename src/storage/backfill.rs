//! What backfill reads and writes besides events and state rows: the bottom
//! of a room's line and the events it still lacks below it, membership rows
//! extended downward, redactions waiting for their target, and the room's
//! read epoch.

use std::collections::{BTreeSet, HashSet};

use sqlx::AnyConnection;

use super::Db;
use super::dag::prev_events_of;
use super::outliers::{IDS_PER_QUERY, in_list};
use crate::error::Result;

/// How many of the lowest placed events are looked at for missing prevs (a
/// backfilled batch may place side branches a little above the bottom).
const BOTTOM_EVENTS: i64 = 20;

/// The room's lowest placed position and the `prev_events` of its lowest
/// events that are not placed (outliers count as not placed): where history
/// continues below what this server has on its line. `None` for a room with
/// no events.
pub async fn bottom(db: &Db, room_id: &str) -> Result<Option<(i64, Vec<String>)>> {
    let mut conn = db.pool.acquire().await?;
    bottom_tx(&mut conn, room_id).await
}

/// [`bottom`] inside a transaction. The `prev_events` are read from the
/// lowest events' PDUs.
pub async fn bottom_tx(conn: &mut AnyConnection, room_id: &str) -> Result<Option<(i64, Vec<String>)>> {
    let low: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, json FROM events WHERE room_id = $1 ORDER BY seq LIMIT $2 + 0")
            .bind(room_id)
            .bind(BOTTOM_EVENTS)
            .fetch_all(&mut *conn)
            .await?;
    let Some(lowest) = low.first().map(|(seq, _)| *seq) else { return Ok(None) };
    let mut prevs = BTreeSet::new();
    for (_, json) in &low {
        prevs.extend(prev_events_of(json)?);
    }
    let prevs: Vec<&str> = prevs.iter().map(String::as_str).collect();
    let mut placed = HashSet::new();
    for chunk in prevs.chunks(IDS_PER_QUERY) {
        let sql = format!("SELECT event_id FROM events WHERE event_id {}", in_list(chunk.len()));
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        placed.extend(query.fetch_all(&mut *conn).await?);
    }
    let missing = prevs.into_iter().filter(|id| !placed.contains(*id)).map(str::to_owned).collect();
    Ok(Some((lowest, missing)))
}

/// Moves the start of `user`'s `kind` row that starts at `from` down to `to`
/// (its pre-join window with it: history placed below a stay is no join).
/// False when there is no such row.
pub async fn extend_row_down(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    kind: &str,
    from: i64,
    to: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE memberships SET min_seq = $1, window_seq = $1 \
         WHERE room_id = $2 AND user_id = $3 AND kind = $4 AND min_seq = $5",
    )
    .bind(to)
    .bind(room_id)
    .bind(user_id)
    .bind(kind)
    .bind(from)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Adds a row `min..=max` (`max` `None`: still open).
pub async fn insert_row(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    kind: &str,
    min: i64,
    max: Option<i64>,
) -> Result<()> {
    let server_name = user_id.split_once(':').map_or("", |(_, server)| server);
    sqlx::query(
        "INSERT INTO memberships (room_id, user_id, kind, min_seq, max_seq, window_seq, server_name) \
         VALUES ($1, $2, $3, $4, $5, $4, $6)",
    )
    .bind(room_id)
    .bind(user_id)
    .bind(kind)
    .bind(min)
    .bind(max)
    .bind(server_name)
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes every reader work out the room's read inputs again (its
/// history-visibility line and membership rows changed below the head).
pub async fn bump_read_epoch(conn: &mut AnyConnection, room_id: &str) -> Result<()> {
    sqlx::query("UPDATE rooms SET read_epoch = read_epoch + 1 WHERE room_id = $1")
        .bind(room_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Remembers that `redaction_id` names `target_id`, which is not held yet.
pub async fn add_pending_redaction(
    conn: &mut AnyConnection,
    room_id: &str,
    target_id: &str,
    redaction_id: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO pending_redactions (target_id, redaction_id, room_id) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(target_id)
    .bind(redaction_id)
    .bind(room_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The redactions (placed, of `room_id`) waiting for `target_id`, taken off
/// the waiting list: the caller decides whether each applies.
pub async fn take_pending_redactions(
    conn: &mut AnyConnection,
    room_id: &str,
    target_id: &str,
) -> Result<Vec<(String, i64, String)>> {
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT e.event_id, e.seq, e.json FROM pending_redactions w JOIN events e ON e.event_id = w.redaction_id \
         WHERE w.target_id = $1 AND w.room_id = $2 AND e.room_id = $2",
    )
    .bind(target_id)
    .bind(room_id)
    .fetch_all(&mut *conn)
    .await?;
    // Almost every event has none waiting: no write then.
    if rows.is_empty() {
        return Ok(rows);
    }
    sqlx::query("DELETE FROM pending_redactions WHERE target_id = $1 AND room_id = $2")
        .bind(target_id)
        .bind(room_id)
        .execute(conn)
        .await?;
    Ok(rows)
}

/// Records a hole in the middle of a room's line: the event placed at `seq`
/// names `missing_prevs`, which we could not get (see migration 0031).
pub async fn add_gap(
    conn: &mut AnyConnection,
    room_id: &str,
    seq: i64,
    event_id: &str,
    missing_prevs: &[&str],
) -> Result<()> {
    let missing = serde_json::to_string(missing_prevs).unwrap_or_else(|_| "[]".into());
    sqlx::query("INSERT INTO timeline_gaps (room_id, seq, event_id, missing_prevs) VALUES ($1, $2, $3, $4)")
        .bind(room_id)
        .bind(seq)
        .bind(event_id)
        .bind(missing)
        .execute(conn)
        .await?;
    Ok(())
}
