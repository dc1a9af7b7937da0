//! The running totals behind unread counts (`push_tally`, `push_threads`,
//! `push_mentions`, `push_floor`; docs/unread-counts.md): written with each
//! event placed at the head of a room's line, in its write transaction, and
//! read per (user, room) in two statements however many events are unread.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// What an event placed at the head counts for (its row of `push_tally`).
#[derive(Debug, Clone)]
pub struct NewRow<'a> {
    /// Room.
    pub room_id: &'a str,
    /// Seq.
    pub seq: i64,
    /// Thread root (`""`: the main timeline).
    pub thread: &'a str,
    /// Sender.
    pub sender: &'a str,
    /// The default rules make it notify a reader it does not name.
    pub notifies: bool,
    /// And highlight.
    pub highlights: bool,
    /// Each reader must evaluate it themselves (legacy name rules).
    pub recheck: bool,
    /// Our users it names.
    pub mentions: &'a [String],
}

/// Files `row`: its thread's totals move by its outcome (one upsert that
/// answers the new totals), its row records them, and its mentions follow.
pub async fn insert(conn: &mut AnyConnection, row: &NewRow<'_>) -> Result<()> {
    let (notify_n, highlight_n): (i64, i64) = sqlx::query_as(
        "INSERT INTO push_threads (room_id, thread, last_seq, notify_n, highlight_n) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (room_id, thread) DO UPDATE SET last_seq = excluded.last_seq, \
           notify_n = push_threads.notify_n + excluded.notify_n, \
           highlight_n = push_threads.highlight_n + excluded.highlight_n \
         RETURNING notify_n, highlight_n",
    )
    .bind(row.room_id)
    .bind(row.thread)
    .bind(row.seq)
    .bind(i64::from(row.notifies))
    .bind(i64::from(row.highlights))
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO push_tally (room_id, seq, thread, sender, notifies, highlights, recheck, notify_n, highlight_n) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(row.room_id)
    .bind(row.seq)
    .bind(row.thread)
    .bind(row.sender)
    .bind(i64::from(row.notifies))
    .bind(i64::from(row.highlights))
    .bind(i64::from(row.recheck))
    .bind(notify_n)
    .bind(highlight_n)
    .execute(&mut *conn)
    .await?;
    for chunk in row.mentions.chunks(100) {
        let sql = super::values_sql("INSERT INTO push_mentions (room_id, user_id, seq)", 3, chunk.len());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("{sql} ON CONFLICT DO NOTHING")));
        for user in chunk {
            query = query.bind(row.room_id).bind(user.as_str()).bind(row.seq);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// A redacted event's row (if it has one) is evaluated by each reader from
/// now on: its content, so what the rules say of it, has changed.
pub async fn recheck(conn: &mut AnyConnection, event_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE push_tally SET recheck = 1 \
         WHERE room_id = (SELECT room_id FROM events WHERE event_id = $1) \
           AND seq = (SELECT seq FROM events WHERE event_id = $1) AND recheck = 0",
    )
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The seq up to which a room's events predate the tally (0: none do).
pub async fn floor(db: &Db, room_id: &str) -> Result<i64> {
    let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM push_floor WHERE room_id = $1")
        .bind(room_id)
        .fetch_optional(&mut db.reader())
        .await?;
    Ok(seq.unwrap_or(0))
}

/// One thread's totals at the two ends of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadTotals {
    /// Thread root (`""`: the main timeline).
    pub thread: String,
    /// `(notify, highlight)` totals through the window's bottom.
    pub below: (i64, i64),
    /// Through its top.
    pub top: (i64, i64),
}

/// The totals of each thread with a row in `(after, upto]`, at `after` and
/// at `upto`: one statement, index seeks only.
pub async fn threads_between(db: &Db, room_id: &str, after: i64, upto: i64) -> Result<Vec<ThreadTotals>> {
    let at = |column: &str, bound: &str| {
        format!(
            "COALESCE((SELECT p.{column} FROM push_tally p WHERE p.room_id = t.room_id \
               AND p.thread = t.thread AND p.seq <= {bound} ORDER BY p.seq DESC LIMIT 1), 0)"
        )
    };
    let sql = format!(
        "SELECT t.thread, {}, {}, \
           CASE WHEN t.last_seq <= $3 THEN t.notify_n ELSE {} END, \
           CASE WHEN t.last_seq <= $3 THEN t.highlight_n ELSE {} END \
         FROM push_threads t WHERE t.room_id = $1 AND t.last_seq > $2",
        at("notify_n", "$2"),
        at("highlight_n", "$2"),
        at("notify_n", "$3"),
        at("highlight_n", "$3"),
    );
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(room_id)
        .bind(after)
        .bind(upto)
        .fetch_all(&mut db.reader())
        .await?;
    Ok(rows
        .into_iter()
        .map(|(thread, bn, bh, tn, th)| ThreadTotals { thread, below: (bn, bh), top: (tn, th) })
        .collect())
}

/// A row a reader treats on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    /// Seq.
    pub seq: i64,
    /// Thread it was filed in.
    pub thread: String,
    /// What the default rules said of it.
    pub notifies: bool,
    /// And of its highlighting.
    pub highlights: bool,
    /// The reader sent it: it never counts for them.
    pub own: bool,
}

/// The rows in `(after, upto]` that `user` cannot take from the totals: their
/// own (which never count), and others' that name them or that each reader
/// must evaluate (legacy name rules, redacted since), in seq order.
pub async fn specials_between(
    db: &Db,
    room_id: &str,
    user: &str,
    after: i64,
    upto: i64,
) -> Result<Vec<Special>> {
    const COLUMNS: &str = "p.seq, p.thread, p.notifies, p.highlights";
    let range = "p.room_id = $1 AND p.seq > $2 AND p.seq <= $3";
    let sql = format!(
        "SELECT {COLUMNS}, 1 FROM push_tally p WHERE {range} AND p.sender = $4 \
         UNION ALL \
         SELECT {COLUMNS}, 0 FROM push_tally p WHERE {range} AND p.recheck = 1 AND p.sender <> $4 \
         UNION ALL \
         SELECT {COLUMNS}, 0 FROM push_mentions m JOIN push_tally p ON p.room_id = m.room_id AND p.seq = m.seq \
           WHERE m.room_id = $1 AND m.user_id = $4 AND m.seq > $2 AND m.seq <= $3 \
             AND p.recheck = 0 AND p.sender <> $4 \
         ORDER BY 1"
    );
    let rows: Vec<(i64, String, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(room_id)
        .bind(after)
        .bind(upto)
        .bind(user)
        .fetch_all(&mut db.reader())
        .await?;
    Ok(rows
        .into_iter()
        .map(|(seq, thread, notifies, highlights, own)| Special {
            seq,
            thread,
            notifies: notifies != 0,
            highlights: highlights != 0,
            own: own != 0,
        })
        .collect())
}
