//! The running totals behind unread counts (`push_tally`, `push_threads`,
//! `push_mentions`, `push_floor`; docs/unread-counts.md): written with each
//! event placed at the head of a room's line, in its write transaction, and
//! read per (user, room) in one statement however many events are unread.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// What an event placed at the head counts for (its row of `push_tally`).
#[derive(Debug, Clone)]
pub struct NewRow {
    /// Seq.
    pub seq: i64,
    /// Thread root (`""`: the main timeline).
    pub thread: String,
    /// Sender.
    pub sender: String,
    /// `(notify, highlight)`: what the default rules say to a reader it
    /// does not name.
    pub unnamed: (bool, bool),
    /// To a reader it names.
    pub named: (bool, bool),
    /// Who evaluates it themselves (`room::tally::LEGACY`, ...; 0 no one).
    pub recheck: i64,
    /// Its body's signature (`room::tally::words`).
    pub words: i64,
    /// Our users it names.
    pub mentions: Vec<String>,
    /// Its thread's `(notify, highlight)` totals through it.
    pub totals: (i64, i64),
}

/// A thread's `(notify, highlight)` totals through its newest row (0, 0
/// for a thread with none), read on the writer's connection.
pub async fn thread_totals(conn: &mut AnyConnection, room_id: &str, thread: &str) -> Result<(i64, i64)> {
    totals_through(conn, room_id, thread, i64::MAX).await
}

/// A thread's `(notify, highlight)` totals through seq `at` (its newest row
/// at or below it; 0, 0 for none).
async fn totals_through<'c, E: sqlx::Executor<'c, Database = sqlx::Any>>(
    executor: E,
    room_id: &str,
    thread: &str,
    at: i64,
) -> Result<(i64, i64)> {
    let row: Option<(i64, i64)> = sqlx::query_as(
        "SELECT notify_n, highlight_n FROM push_tally WHERE room_id = $1 AND thread = $2 AND seq <= $3 \
         ORDER BY seq DESC LIMIT 1",
    )
    .bind(room_id)
    .bind(thread)
    .bind(at)
    .fetch_optional(executor)
    .await?;
    Ok(row.unwrap_or((0, 0)))
}

/// Rows one multi-row insert writes at most (12 values each).
const ROWS_PER_INSERT: usize = 64;

/// Files the rows of one write transaction (in seq order, their totals
/// worked out by the writer from [`thread_totals`]): a few statements for
/// the whole batch, whatever its size, then each thread's new top (threads
/// other than the main timeline: `push_threads`).
pub async fn insert(conn: &mut AnyConnection, room_id: &str, rows: &[NewRow]) -> Result<()> {
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let sql = super::values_sql(
            "INSERT INTO push_tally (room_id, seq, thread, sender, notifies, highlights, recheck, words, \
               named_notifies, named_highlights, notify_n, highlight_n)",
            12,
            chunk.len(),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for row in chunk {
            query = query
                .bind(room_id)
                .bind(row.seq)
                .bind(row.thread.as_str())
                .bind(row.sender.as_str())
                .bind(i64::from(row.unnamed.0))
                .bind(i64::from(row.unnamed.1))
                .bind(row.recheck)
                .bind(row.words)
                .bind(i64::from(row.named.0))
                .bind(i64::from(row.named.1))
                .bind(row.totals.0)
                .bind(row.totals.1);
        }
        query.execute(&mut *conn).await?;
    }
    // Each thread's top: its last row in the batch. The main timeline's is
    // its newest row of `push_tally`, read there (no second write for the
    // most common event).
    let mut tops: Vec<&NewRow> = Vec::new();
    for row in rows.iter().rev() {
        if !row.thread.is_empty() && !tops.iter().any(|t| t.thread == row.thread) {
            tops.push(row);
        }
    }
    for top in tops {
        sqlx::query(
            "INSERT INTO push_threads (room_id, thread, last_seq, notify_n, highlight_n) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (room_id, thread) DO UPDATE SET last_seq = excluded.last_seq, \
               notify_n = excluded.notify_n, highlight_n = excluded.highlight_n",
        )
        .bind(room_id)
        .bind(top.thread.as_str())
        .bind(top.seq)
        .bind(top.totals.0)
        .bind(top.totals.1)
        .execute(&mut *conn)
        .await?;
    }
    let mentions: Vec<(&str, i64)> =
        rows.iter().flat_map(|r| r.mentions.iter().map(move |u| (u.as_str(), r.seq))).collect();
    for chunk in mentions.chunks(100) {
        let sql = super::values_sql("INSERT INTO push_mentions (room_id, user_id, seq)", 3, chunk.len());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("{sql} ON CONFLICT DO NOTHING")));
        for (user, seq) in chunk {
            query = query.bind(room_id).bind(*user).bind(*seq);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// A redacted event's row (if it has one) is evaluated by each reader from
/// now on: its content, so what the rules say of it, has changed.
pub async fn recheck(conn: &mut AnyConnection, event_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE push_tally SET recheck = 2 \
         WHERE room_id = (SELECT room_id FROM events WHERE event_id = $1) \
           AND seq = (SELECT seq FROM events WHERE event_id = $1)",
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

/// A row a reader treats on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    /// Seq.
    pub seq: i64,
    /// Thread it was filed in.
    pub thread: String,
    /// What the totals counted of it: `(notify, highlight)`.
    pub unnamed: (bool, bool),
    /// What it is to this reader.
    pub kind: SpecialKind,
}

/// Why a row is special to a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    /// The reader sent it: it never counts for them.
    Own,
    /// The legacy name rules read its body (with this signature): a reader
    /// whose name it may hold evaluates it.
    Legacy(i64),
    /// Redacted since, or an invite naming others: every reader evaluates it.
    Redacted,
    /// A redaction: counts taken before it may have moved.
    Redaction,
    /// It names the reader; what the default rules say to them.
    Names((bool, bool)),
}

/// What a reader's unread window `(after, upto]` holds: each thread with a
/// row in it, with its totals at both ends, and the rows the reader cannot
/// take from the totals (their own, the ones that name them, the ones
/// every reader evaluates), in seq order. One statement, index seeks and
/// the special rows only.
///
/// `masks` are the signature masks of the reader's names (display name,
/// localpart): a legacy row whose signature lacks both cannot name them and
/// is left out in SQL.
pub async fn window(
    db: &Db,
    room_id: &str,
    user: &str,
    (after, upto): (i64, i64),
    masks: (i64, i64),
) -> Result<Window> {
    let rows: Vec<(i64, i64, String, i64, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(window_sql()))
        .bind(room_id)
        .bind(after)
        .bind(upto)
        .bind(user)
        .bind(masks.0)
        .bind(masks.1)
        .fetch_all(&mut db.reader())
        .await?;
    let mut out = Window::default();
    for (kind, seq, thread, a, b, c, d) in rows {
        if kind == 0 {
            out.threads.push(ThreadTotals { thread, below: (a, b), top: (c, d) });
            continue;
        }
        let kind = match (kind, c) {
            (1, _) => SpecialKind::Own,
            (2, 1) => SpecialKind::Legacy(d),
            (2, 3) => SpecialKind::Redaction,
            (2, _) => SpecialKind::Redacted,
            _ => SpecialKind::Names((c != 0, d != 0)),
        };
        out.specials.push(Special { seq, thread, unnamed: (a != 0, b != 0), kind });
    }
    // Sorted here: asked to order the parts in SQL, SQLite walks the window
    // by seq for the reader's own rows instead of seeking them by sender.
    out.specials.sort_by_key(|s| s.seq);
    Ok(out)
}

/// [`window`]'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    /// Each thread with a row in the window.
    pub threads: Vec<ThreadTotals>,
    /// The reader's special rows, in seq order.
    pub specials: Vec<Special>,
}

/// [`window`]: $1 room, $2 after, $3 upto, $4 user, $5 and $6 the masks of
/// the reader's names. Rows of
/// `(kind, seq, thread, a, b, c, d)`: kind 0 a thread's totals (a, b below;
/// c, d at the top), 1 own, 2 recheck (c its kind, d the signature), 3
/// names the reader (a, b what the totals counted; c, d what the defaults
/// say to the reader). The rows
/// naming the reader are found from `push_mentions` (`CROSS JOIN` keeps
/// SQLite from walking every row of the window in `push_tally` instead).
pub(in crate::storage) fn window_sql() -> String {
    // A thread's running total `column` through seq `bound`.
    let at = |room: &str, thread: &str, column: &str, bound: &str| {
        format!(
            "COALESCE((SELECT q.{column} FROM push_tally q WHERE q.room_id = {room} \
               AND q.thread = {thread} AND q.seq <= {bound} ORDER BY q.seq DESC LIMIT 1), 0)"
        )
    };
    let range = "p.room_id = $1 AND p.seq > $2 AND p.seq <= $3";
    // The main timeline: its newest row up to the top, when in the window.
    format!(
        "SELECT 0, p.seq, '', {}, {}, p.notify_n, p.highlight_n FROM push_tally p \
         WHERE p.room_id = $1 AND p.thread = '' AND p.seq > $2 AND p.seq = (SELECT MAX(q.seq) FROM push_tally q \
           WHERE q.room_id = $1 AND q.thread = '' AND q.seq <= $3) \
         UNION ALL \
         SELECT 0, t.last_seq, t.thread, {}, {}, \
           CASE WHEN t.last_seq <= $3 THEN t.notify_n ELSE {} END, \
           CASE WHEN t.last_seq <= $3 THEN t.highlight_n ELSE {} END \
         FROM push_threads t WHERE t.room_id = $1 AND t.last_seq > $2 \
         UNION ALL \
         SELECT 1, p.seq, p.thread, p.notifies, p.highlights, 0, 0 FROM push_tally p \
           WHERE {range} AND p.sender = $4 AND p.recheck <> 3 \
         UNION ALL \
         SELECT 2, p.seq, p.thread, p.notifies, p.highlights, p.recheck, p.words FROM push_tally p \
           WHERE {range} AND p.recheck > 0 AND (p.sender <> $4 OR p.recheck = 3) \
             AND (p.recheck <> 1 OR (p.words & $5) = $5 OR (p.words & $6) = $6) \
         UNION ALL \
         SELECT 3, p.seq, p.thread, p.notifies, p.highlights, p.named_notifies, p.named_highlights \
           FROM push_mentions m CROSS JOIN push_tally p \
           WHERE p.room_id = m.room_id AND p.seq = m.seq \
             AND m.room_id = $1 AND m.user_id = $4 AND m.seq > $2 AND m.seq <= $3 \
             AND p.recheck = 0 AND p.sender <> $4",
        at("$1", "''", "notify_n", "$2"),
        at("$1", "''", "highlight_n", "$2"),
        at("t.room_id", "t.thread", "notify_n", "$2"),
        at("t.room_id", "t.thread", "highlight_n", "$2"),
        at("t.room_id", "t.thread", "notify_n", "$3"),
        at("t.room_id", "t.thread", "highlight_n", "$3"),
    )
}

/// One thread's `(notify, highlight)` totals through seq `at`.
pub async fn totals_at(db: &Db, room_id: &str, thread: &str, at: i64) -> Result<(i64, i64)> {
    totals_through(&mut db.reader(), room_id, thread, at).await
}
