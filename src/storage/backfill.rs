//! What backfill reads and writes besides events and state rows: the bottom
//! of a room's line and the events it still lacks below it, membership rows
//! extended downward, redactions waiting for their target, and the room's
//! read epoch.

use std::collections::{BTreeSet, HashSet};

use sqlx::AnyConnection;

use super::Db;
use super::dag::prev_events_of;
use super::memberships::Range;
use super::outliers::{IDS_PER_QUERY, in_list};
use crate::error::Result;

/// How many of the lowest placed events are looked at for missing prevs (a
/// backfilled batch may place side branches a little above the bottom).
const BOTTOM_EVENTS: i64 = 20;

/// The room's lowest placed position and the `prev_events` of its lowest
/// events that are not placed (outliers count as not placed) nor what a
/// hole in the middle lacks: where history continues below what this
/// server has on its line. `None` for a room with
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
    // What a hole in the middle lacks is not history below the bottom.
    let holes: Vec<String> = sqlx::query_scalar("SELECT missing_prevs FROM timeline_gaps WHERE room_id = $1")
        .bind(room_id)
        .fetch_all(&mut *conn)
        .await?;
    let in_holes: HashSet<String> =
        holes.iter().flat_map(|m| serde_json::from_str::<Vec<String>>(m).unwrap_or_default()).collect();
    let missing = prevs
        .into_iter()
        .filter(|id| !placed.contains(*id) && !in_holes.contains(*id))
        .map(str::to_owned)
        .collect();
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
    let row = Range { kind: kind.to_owned(), min_seq: min, max_seq: max, window_seq: min };
    put_row(conn, room_id, user_id, &row).await
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
/// Whether any redaction of `room_id` waits for its target.
pub async fn any_pending_redactions(conn: &mut AnyConnection, room_id: &str) -> Result<bool> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM pending_redactions WHERE room_id = $1 LIMIT 1")
            .bind(room_id)
            .fetch_optional(conn)
            .await?;
    Ok(found.is_some())
}

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

/// The holes recorded in `room_id` at positions in `lo..=hi`, as (position,
/// missing prev events), highest first.
pub async fn gaps_between(db: &Db, room_id: &str, lo: i64, hi: i64) -> Result<Vec<(i64, Vec<String>)>> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT seq, missing_prevs FROM timeline_gaps WHERE room_id = $1 AND seq >= $2 AND seq <= $3 \
         ORDER BY seq DESC LIMIT 100",
    )
    .bind(room_id)
    .bind(lo)
    .bind(hi)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(seq, missing)| (seq, serde_json::from_str(&missing).unwrap_or_default()))
        .collect())
}

/// The missing prev events of the hole recorded at `seq`, `None` when
/// there is none (filled meanwhile).
pub async fn gap_tx(conn: &mut AnyConnection, room_id: &str, seq: i64) -> Result<Option<Vec<String>>> {
    let missing: Option<String> =
        sqlx::query_scalar("SELECT missing_prevs FROM timeline_gaps WHERE room_id = $1 AND seq = $2")
            .bind(room_id)
            .bind(seq)
            .fetch_optional(conn)
            .await?;
    Ok(missing.map(|m| serde_json::from_str(&m).unwrap_or_default()))
}

/// Forgets the hole recorded at `seq` (filled, or moved down).
pub async fn remove_gap(conn: &mut AnyConnection, room_id: &str, seq: i64) -> Result<()> {
    sqlx::query("DELETE FROM timeline_gaps WHERE room_id = $1 AND seq = $2")
        .bind(room_id)
        .bind(seq)
        .execute(conn)
        .await?;
    Ok(())
}

/// The highest placed position of `room_id` below `seq`.
pub async fn position_below(conn: &mut AnyConnection, room_id: &str, seq: i64) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT MAX(seq) FROM events WHERE room_id = $1 AND seq < $2")
        .bind(room_id)
        .bind(seq)
        .fetch_one(conn)
        .await?)
}

/// `user_id`'s row that holds position `at` and goes on past it (`None`:
/// the user had no join, invite or knock there, or it ended at `at`).
pub async fn row_through(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    at: i64,
) -> Result<Option<Range>> {
    row_where(conn, room_id, user_id, at, "min_seq <= $3 AND (max_seq IS NULL OR max_seq > $3)").await
}

/// `user_id`'s row that starts at position `at`.
pub async fn row_starting(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    at: i64,
) -> Result<Option<Range>> {
    row_where(conn, room_id, user_id, at, "min_seq = $3").await
}

/// `user_id`'s latest row meeting `condition` (on `$3` = `at`).
async fn row_where(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    at: i64,
    condition: &'static str,
) -> Result<Option<Range>> {
    let sql = format!(
        "SELECT kind, min_seq, max_seq, window_seq FROM memberships \
         WHERE room_id = $1 AND user_id = $2 AND {condition} ORDER BY min_seq DESC LIMIT 1"
    );
    let row: Option<(String, i64, Option<i64>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(room_id)
        .bind(user_id)
        .bind(at)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(kind, min_seq, max_seq, window_seq)| Range { kind, min_seq, max_seq, window_seq }))
}

/// Removes `user_id`'s row `row` (matched by kind and start).
pub async fn delete_row(conn: &mut AnyConnection, room_id: &str, user_id: &str, row: &Range) -> Result<()> {
    sqlx::query("DELETE FROM memberships WHERE room_id = $1 AND user_id = $2 AND kind = $3 AND min_seq = $4")
        .bind(room_id)
        .bind(user_id)
        .bind(&row.kind)
        .bind(row.min_seq)
        .execute(conn)
        .await?;
    Ok(())
}

/// Adds `row` for `user_id`, its window kept.
pub async fn put_row(conn: &mut AnyConnection, room_id: &str, user_id: &str, row: &Range) -> Result<()> {
    let server_name = user_id.split_once(':').map_or("", |(_, server)| server);
    sqlx::query(
        "INSERT INTO memberships (room_id, user_id, kind, min_seq, max_seq, window_seq, server_name) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(room_id)
    .bind(user_id)
    .bind(&row.kind)
    .bind(row.min_seq)
    .bind(row.max_seq)
    .bind(row.window_seq)
    .bind(server_name)
    .execute(conn)
    .await?;
    Ok(())
}

/// The state key of the member event placed at `seq` (`None` when the
/// event there is no member event).
pub async fn member_at(conn: &mut AnyConnection, room_id: &str, seq: i64) -> Result<Option<String>> {
    let key: Option<Option<String>> = sqlx::query_scalar(
        "SELECT state_key FROM events WHERE room_id = $1 AND seq = $2 AND event_type = 'm.room.member'",
    )
    .bind(room_id)
    .bind(seq)
    .fetch_optional(conn)
    .await?;
    Ok(key.flatten())
}
