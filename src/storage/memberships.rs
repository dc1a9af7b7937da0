//! The `memberships` table (membership ranges), per-user floors and forgotten
//! rooms.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// One membership range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// `join` (a stay), `invite` or `knock`.
    pub kind: String,
    /// The event that started it.
    pub min_seq: i64,
    /// The event that ended it; `None` while it lasts.
    pub max_seq: Option<i64>,
    /// For stays: the first seq readable through the pre-join window.
    pub window_seq: i64,
}

/// Opens a range at `seq`.
pub async fn open(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    kind: &str,
    seq: i64,
    window_seq: i64,
) -> Result<()> {
    let server_name = user_id.split_once(':').map_or("", |(_, server)| server);
    sqlx::query(
        "INSERT INTO memberships (room_id, user_id, kind, min_seq, max_seq, window_seq, server_name) \
         VALUES ($1, $2, $3, $4, NULL, $5, $6)",
    )
    .bind(room_id)
    .bind(user_id)
    .bind(kind)
    .bind(seq)
    .bind(window_seq)
    .bind(server_name)
    .execute(conn)
    .await?;
    Ok(())
}

/// Closes the open range of `kind`, ending it at `seq` (inclusive).
pub async fn close(
    conn: &mut AnyConnection,
    room_id: &str,
    user_id: &str,
    kind: &str,
    seq: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE memberships SET max_seq = $1 WHERE room_id = $2 AND user_id = $3 AND kind = $4 AND max_seq IS NULL",
    )
    .bind(seq)
    .bind(room_id)
    .bind(user_id)
    .bind(kind)
    .execute(conn)
    .await?;
    Ok(())
}

/// Closes every range of the room still open, at `seq` (a room rejoined
/// over federation: what happened while we were out is not on our line).
pub async fn close_all_open(conn: &mut AnyConnection, room_id: &str, seq: i64) -> Result<()> {
    sqlx::query("UPDATE memberships SET max_seq = $1 WHERE room_id = $2 AND max_seq IS NULL")
        .bind(seq)
        .bind(room_id)
        .execute(conn)
        .await?;
    Ok(())
}

fn to_ranges(rows: Vec<(String, i64, Option<i64>, i64)>) -> Vec<Range> {
    rows.into_iter()
        .map(|(kind, min_seq, max_seq, window_seq)| Range { kind, min_seq, max_seq, window_seq })
        .collect()
}

/// What a read's first look at a user in a room needs, in one statement:
/// their member events' changes (as [`super::events::membership_changes`]),
/// their membership ranges by start, and their own floor in it (0: none).
pub async fn member_inputs(
    db: &Db,
    room_id: &str,
    user_id: &str,
) -> Result<(Vec<super::events::MemberChange>, Vec<Range>, i64)> {
    type Row = (i64, i64, Option<String>, Option<String>, Option<i64>, i64);
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT CAST(0 AS BIGINT), r.seq, COALESCE(e.json, o.json), NULL, NULL, CAST(0 AS BIGINT) \
           FROM state_runs r {} \
           WHERE r.room_id = $1 AND r.event_type = 'm.room.member' AND r.state_key = $2 \
         UNION ALL \
         SELECT 1, min_seq, NULL, kind, max_seq, window_seq FROM memberships WHERE room_id = $1 AND user_id = $2 \
         UNION ALL \
         SELECT 2, floor_seq, NULL, NULL, NULL, 0 FROM user_room_floors WHERE room_id = $1 AND user_id = $2 \
         ORDER BY 1, 2, 4",
        super::events::RUN_JOINS
    )))
    .bind(room_id)
    .bind(user_id)
    .fetch_all(&mut db.reader())
    .await?;
    let (mut changes, mut ranges, mut floor) = (Vec::new(), Vec::new(), 0);
    for (part, seq, json, kind, max_seq, window_seq) in rows {
        match part {
            0 => changes.push(super::events::MemberChange::of(seq, json.as_deref())),
            1 => ranges.push(Range { kind: kind.unwrap_or_default(), min_seq: seq, max_seq, window_seq }),
            _ => floor = seq,
        }
    }
    Ok((changes, ranges, floor))
}

/// Raises a user's floor (it never moves down); the room's read epoch moves
/// with it, in the same transaction.
pub async fn raise_user_floor(db: &Db, room_id: &str, user_id: &str, floor_seq: i64) -> Result<()> {
    let mut tx = db.begin_write().await?;
    sqlx::query(
        "INSERT INTO user_room_floors (room_id, user_id, floor_seq) VALUES ($1, $2, $3) \
         ON CONFLICT (room_id, user_id) DO UPDATE SET floor_seq = \
           CASE WHEN excluded.floor_seq > user_room_floors.floor_seq THEN excluded.floor_seq ELSE user_room_floors.floor_seq END",
    )
    .bind(room_id)
    .bind(user_id)
    .bind(floor_seq)
    .execute(tx.conn())
    .await?;
    sqlx::query("UPDATE rooms SET read_epoch = read_epoch + 1 WHERE room_id = $1")
        .bind(room_id)
        .execute(tx.conn())
        .await?;
    tx.commit().await
}

/// Marks a room forgotten by a user.
pub async fn forget(db: &Db, user_id: &str, room_id: &str) -> Result<()> {
    sqlx::query("INSERT INTO forgotten_rooms (user_id, room_id) VALUES ($1, $2) ON CONFLICT (user_id, room_id) DO NOTHING")
        .bind(user_id)
        .bind(room_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Clears the forgotten mark (on a new join or invite).
pub async fn unforget(conn: &mut AnyConnection, user_id: &str, room_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM forgotten_rooms WHERE user_id = $1 AND room_id = $2")
        .bind(user_id)
        .bind(room_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether a user forgot a room.
pub async fn is_forgotten(db: &Db, user_id: &str, room_id: &str) -> Result<bool> {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM forgotten_rooms WHERE user_id = $1 AND room_id = $2")
            .bind(user_id)
            .bind(room_id)
            .fetch_one(&mut db.reader())
            .await?;
    Ok(n > 0)
}

/// Users with a stay or an invite holding any seq in `lo..=hi`: whom new
/// events there concern.
pub async fn holders_between(db: &Db, room_id: &str, lo: i64, hi: i64) -> Result<Vec<String>> {
    let sql = db.joined_column(
        "SELECT DISTINCT user_id AS v FROM memberships WHERE room_id = $1 AND window_seq <= $3 \
         AND (max_seq IS NULL OR max_seq >= $2)",
    );
    let joined: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(room_id)
        .bind(lo)
        .bind(hi)
        .fetch_one(&mut db.reader())
        .await?;
    Ok(super::split_column(joined))
}

/// Rooms where a user has any membership range and that they have not
/// forgotten, with whether they are joined there now (an open join range),
/// by room id.
pub async fn rooms_joined_of(db: &Db, user_id: &str) -> Result<Vec<(String, bool)>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT m.room_id, MAX(CASE WHEN m.kind = 'join' AND m.max_seq IS NULL THEN 1 ELSE 0 END) \
         FROM memberships m WHERE m.user_id = $1 AND NOT EXISTS \
           (SELECT 1 FROM forgotten_rooms f WHERE f.user_id = m.user_id AND f.room_id = m.room_id) \
         GROUP BY m.room_id ORDER BY m.room_id",
    )
    .bind(user_id)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows.into_iter().map(|(room, joined)| (room, joined != 0)).collect())
}

/// Every range of every user of `server_name` in a room (what decides what
/// that server may be sent), by start.
pub async fn server_ranges(db: &Db, room_id: &str, server_name: &str) -> Result<Vec<Range>> {
    let rows: Vec<(String, i64, Option<i64>, i64)> = sqlx::query_as(
        "SELECT kind, min_seq, max_seq, window_seq FROM memberships WHERE room_id = $1 AND server_name = $2 \
         ORDER BY min_seq",
    )
    .bind(room_id)
    .bind(server_name)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(to_ranges(rows))
}
