//! `event_relations`: which event relates to which (migration 0022), written
//! with each event by [`super::events::insert`], deleted when the child is
//! redacted. Every reader takes the caller's readable spans of the seq line
//! (inclusive `(lo, hi)` pairs) and matches the children's positions against
//! them in SQL, so a count, a latest reply or a listed thread never includes
//! an event the caller may not read.

use sqlx::AnyConnection;

use super::Db;
use super::events::{COLUMNS, Row, StoredEvent, from_row};
use super::outliers::IDS_PER_QUERY;
use super::params;
use crate::error::Result;

/// One relation, as the write path records it.
#[derive(Debug, Clone, Copy)]
pub struct NewRelation<'a> {
    /// The event it relates to.
    pub relates_to_id: &'a str,
    /// `rel_type`.
    pub rel_type: &'a str,
}

/// The most readable spans a query matches against. A user whose readable
/// part of a room is more pieces than this (each stay is one or two) is
/// matched against the newest of them: older pieces are left out of
/// relations, never anything unreadable let in.
pub const MAX_SPANS: usize = 32;

/// `(col BETWEEN $k AND $k+1 OR ...)` for `n` spans bound from `$from`;
/// false for none.
fn spans_clause(col: &str, from: usize, n: usize) -> String {
    if n == 0 {
        return "(1 = 0)".to_owned();
    }
    let parts: Vec<String> =
        (0..n).map(|i| format!("{col} BETWEEN ${} AND ${}", from + 2 * i, from + 2 * i + 1)).collect();
    format!("({})", parts.join(" OR "))
}

/// The newest [`MAX_SPANS`] spans.
fn newest(spans: &[(i64, i64)]) -> &[(i64, i64)] {
    &spans[spans.len().saturating_sub(MAX_SPANS)..]
}

/// Records that `event_id` (at `seq`) relates to another event.
pub async fn insert(
    conn: &mut AnyConnection,
    room_id: &str,
    event_id: &str,
    event_type: &str,
    sender: &str,
    seq: i64,
    relation: NewRelation<'_>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO event_relations (event_id, room_id, relates_to_id, rel_type, event_type, sender, seq) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(room_id)
    .bind(relation.relates_to_id)
    .bind(relation.rel_type)
    .bind(event_type)
    .bind(sender)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// Forgets the relation of a redacted event.
pub async fn delete(conn: &mut AnyConnection, event_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM event_relations WHERE event_id = $1").bind(event_id).execute(conn).await?;
    Ok(())
}

/// Which children [`children`] reads.
#[derive(Debug, Clone, Copy)]
pub struct ChildQuery<'a> {
    /// The room.
    pub room_id: &'a str,
    /// The parent.
    pub parent: &'a str,
    /// Only this `rel_type`.
    pub rel_type: Option<&'a str>,
    /// Only this event type (the outer one: `m.room.encrypted` for encrypted children).
    pub event_type: Option<&'a str>,
    /// 1: direct children only; more: their children too, this many levels.
    pub depth: i64,
}

/// Up to `limit` children (at every level up to `q.depth`) placed in
/// `lo..=hi`, in seq order (`descending`: newest first).
pub async fn children(
    db: &Db,
    q: ChildQuery<'_>,
    lo: i64,
    hi: i64,
    descending: bool,
    limit: i64,
) -> Result<Vec<StoredEvent>> {
    let order = if descending { "DESC" } else { "ASC" };
    let mut filters = String::new();
    let mut next = 6;
    if q.rel_type.is_some() {
        filters.push_str(&format!(" AND x.rel_type = ${next}"));
        next += 1;
    }
    if q.event_type.is_some() {
        filters.push_str(&format!(" AND x.event_type = ${next}"));
    }
    // Direct children are one range of the parent index, read in order.
    // Deeper, each event relates to one parent, so the walk is a tree: every
    // child is reached once, and the depth bound stops it whatever the data.
    let (with, from, parent) = if q.depth <= 1 {
        ("", "event_relations x", "x.room_id = $1 AND x.relates_to_id = $2 AND $3 >= 1")
    } else {
        (
            "WITH RECURSIVE tree (event_id, depth) AS ( \
               SELECT event_id, 1 FROM event_relations WHERE room_id = $1 AND relates_to_id = $2 \
               UNION ALL \
               SELECT c.event_id, t.depth + 1 FROM event_relations c JOIN tree t ON c.relates_to_id = t.event_id \
               WHERE c.room_id = $1 AND t.depth < $3 \
             ) ",
            "tree JOIN event_relations x ON x.event_id = tree.event_id",
            "1 = 1",
        )
    };
    let sql = format!(
        "{with}SELECT {COLUMNS} FROM {from} JOIN events e ON e.event_id = x.event_id \
         WHERE {parent} AND x.seq >= $4 AND x.seq <= $5{filters} ORDER BY x.seq {order} LIMIT {limit}"
    );
    let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql))
        .bind(q.room_id)
        .bind(q.parent)
        .bind(q.depth)
        .bind(lo)
        .bind(hi);
    if let Some(rel_type) = q.rel_type {
        query = query.bind(rel_type);
    }
    if let Some(event_type) = q.event_type {
        query = query.bind(event_type);
    }
    Ok(query.fetch_all(&mut db.reader()).await?.into_iter().map(from_row).collect())
}

/// A thread as one reader sees it.
#[derive(Debug, Clone)]
pub struct ThreadSummary {
    /// The root.
    pub root: String,
    /// Readable replies.
    pub count: i64,
    /// Position of the newest readable reply.
    pub latest_seq: i64,
    /// Whether `me` sent a readable reply.
    pub replied: bool,
}

/// The threads rooted at `roots`, counting only replies in `spans`.
pub async fn thread_summaries(
    db: &Db,
    room_id: &str,
    roots: &[&str],
    spans: &[(i64, i64)],
    me: &str,
) -> Result<Vec<ThreadSummary>> {
    let spans = newest(spans);
    let mut out = Vec::new();
    for chunk in roots.chunks(IDS_PER_QUERY) {
        let sql = format!(
            "SELECT x.relates_to_id, COUNT(*), MAX(x.seq), MAX(CASE WHEN x.sender = $2 THEN 1 ELSE 0 END) \
             FROM event_relations x WHERE x.room_id = $1 AND x.rel_type = 'm.thread' \
             AND x.relates_to_id IN ({}) AND {} GROUP BY x.relates_to_id",
            params(3, chunk.len()),
            spans_clause("x.seq", 3 + chunk.len(), spans.len()),
        );
        let mut query =
            sqlx::query_as::<_, (String, i64, i64, i64)>(sqlx::AssertSqlSafe(sql)).bind(room_id).bind(me);
        for id in chunk {
            query = query.bind(*id);
        }
        for (lo, hi) in spans {
            query = query.bind(*lo).bind(*hi);
        }
        for (root, count, latest_seq, replied) in query.fetch_all(&mut db.reader()).await? {
            out.push(ThreadSummary { root, count, latest_seq, replied: replied > 0 });
        }
    }
    Ok(out)
}

/// The most references bundled per page.
const MAX_REFERENCES: i64 = 1000;

/// `(parent, child)` for each `m.reference` to one of `parents` in `spans`,
/// in seq order.
pub async fn references(
    db: &Db,
    room_id: &str,
    parents: &[&str],
    spans: &[(i64, i64)],
) -> Result<Vec<(String, String)>> {
    let spans = newest(spans);
    let mut out = Vec::new();
    for chunk in parents.chunks(IDS_PER_QUERY) {
        let sql = format!(
            "SELECT x.relates_to_id, x.event_id FROM event_relations x \
             WHERE x.room_id = $1 AND x.rel_type = 'm.reference' AND x.relates_to_id IN ({}) AND {} \
             ORDER BY x.seq LIMIT {MAX_REFERENCES}",
            params(2, chunk.len()),
            spans_clause("x.seq", 2 + chunk.len(), spans.len()),
        );
        let mut query = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql)).bind(room_id);
        for id in chunk {
            query = query.bind(*id);
        }
        for (lo, hi) in spans {
            query = query.bind(*lo).bind(*hi);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?);
    }
    Ok(out)
}

/// The most edit candidates read per page.
const MAX_EDITS: i64 = 1000;

/// `(original, edit)` for each `m.replace` of one of `originals` in `spans`
/// that may replace it by the rows alone: same room, same sender, same type,
/// neither a state event. Newest first by `origin_server_ts`, then event id
/// (the spec's order for picking the one to bundle).
pub async fn edit_candidates(
    db: &Db,
    room_id: &str,
    originals: &[&str],
    spans: &[(i64, i64)],
) -> Result<Vec<(String, StoredEvent)>> {
    let spans = newest(spans);
    let mut out = Vec::new();
    for chunk in originals.chunks(IDS_PER_QUERY) {
        let sql = format!(
            "SELECT x.relates_to_id, {COLUMNS} FROM event_relations x \
             JOIN events e ON e.event_id = x.event_id \
             JOIN events o ON o.event_id = x.relates_to_id \
             WHERE x.room_id = $1 AND x.rel_type = 'm.replace' AND x.relates_to_id IN ({}) AND {} \
             AND o.room_id = x.room_id AND o.sender = e.sender AND o.event_type = e.event_type \
             AND o.state_key IS NULL AND e.state_key IS NULL \
             ORDER BY e.origin_server_ts DESC, e.event_id DESC LIMIT {MAX_EDITS}",
            params(2, chunk.len()),
            spans_clause("x.seq", 2 + chunk.len(), spans.len()),
        );
        type EditRow = (String, String, i64, String, String, Option<String>, Option<String>, Option<String>);
        let mut query = sqlx::query_as::<_, EditRow>(sqlx::AssertSqlSafe(sql)).bind(room_id);
        for id in chunk {
            query = query.bind(*id);
        }
        for (lo, hi) in spans {
            query = query.bind(*lo).bind(*hi);
        }
        for (original, r, s, id, json, redacted_by, device, txn) in query.fetch_all(&mut db.reader()).await? {
            out.push((original, from_row((r, s, id, json, redacted_by, device, txn))));
        }
    }
    Ok(out)
}

/// Which threads [`threads`] lists.
#[derive(Debug, Clone, Copy)]
pub struct ThreadQuery<'a> {
    /// The room.
    pub room_id: &'a str,
    /// The reader's readable spans: roots and replies outside them do not count.
    pub spans: &'a [(i64, i64)],
    /// Only threads this user started or replied to.
    pub participant: Option<&'a str>,
    /// Only threads whose newest readable reply is at or below this position.
    pub at_or_below: i64,
    /// At most this many.
    pub limit: i64,
}

/// Threads with a readable root, newest readable reply first:
/// `(root, position of that reply)`.
pub async fn threads(db: &Db, q: ThreadQuery<'_>) -> Result<Vec<(String, i64)>> {
    let spans = newest(q.spans);
    let n = spans.len();
    let participant = match q.participant {
        Some(_) => format!(
            " AND (root.sender = ${p} OR EXISTS (SELECT 1 FROM event_relations p \
               WHERE p.room_id = $1 AND p.relates_to_id = t.relates_to_id AND p.rel_type = 'm.thread' \
               AND p.sender = ${p}))",
            p = 3 + 4 * n
        ),
        None => String::new(),
    };
    // Replies grouped by thread first (from the relations index alone),
    // then each thread's root looked up once, not once per reply.
    let sql = format!(
        "SELECT t.relates_to_id, t.latest FROM ( \
           SELECT x.relates_to_id, MAX(x.seq) AS latest FROM event_relations x \
           WHERE x.room_id = $1 AND x.rel_type = 'm.thread' AND {} \
           GROUP BY x.relates_to_id HAVING MAX(x.seq) <= $2 \
         ) t JOIN events root ON root.event_id = t.relates_to_id \
         WHERE root.room_id = $1 AND {}{participant} ORDER BY t.latest DESC LIMIT {}",
        spans_clause("x.seq", 3, n),
        spans_clause("root.seq", 3 + 2 * n, n),
        q.limit.max(0),
    );
    let mut query =
        sqlx::query_as::<_, (String, i64)>(sqlx::AssertSqlSafe(sql)).bind(q.room_id).bind(q.at_or_below);
    for _ in 0..2 {
        for (lo, hi) in spans {
            query = query.bind(*lo).bind(*hi);
        }
    }
    if let Some(user) = q.participant {
        query = query.bind(user);
    }
    Ok(query.fetch_all(&mut db.reader()).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SqliteSynchronous;

    /// Migration 0022 fills the table from the events already stored, on
    /// both backends: a well-formed relation only, never a redacted one.
    #[tokio::test]
    async fn migration_fills_relations_from_existing_events() {
        for fresh in super::super::state_tests::backends().await {
            let db = Db::connect_migrated_to(&fresh.url, SqliteSynchronous::Full, 20).await.unwrap();
            sqlx::query(
                "INSERT INTO rooms (room_id, room_version, creator, created_ts) VALUES ('!r:x', '11', '@a:x', 0)",
            )
            .execute(&db.pool)
            .await
            .unwrap();
            let events = [
                ("$thread", r#"{"m.relates_to":{"rel_type":"m.thread","event_id":"$root"}}"#, None),
                (
                    "$edit",
                    r#"{"m.relates_to":{"rel_type":"m.replace","event_id":"$root"},"m.new_content":{}}"#,
                    None,
                ),
                ("$redacted", r#"{"m.relates_to":{"rel_type":"m.thread","event_id":"$root"}}"#, Some("$r")),
                ("$reply", r#"{"m.relates_to":{"m.in_reply_to":{"event_id":"$root"}}}"#, None),
                ("$number", r#"{"m.relates_to":{"rel_type":5,"event_id":"$root"}}"#, None),
                ("$noid", r#"{"m.relates_to":{"rel_type":"m.thread","event_id":"root"}}"#, None),
                ("$nul", r#"{"m.relates_to":{"rel_type":"m.th\u0000read","event_id":"$root"}}"#, None),
                ("$plain", r#"{"body":"hi"}"#, None),
            ];
            for (i, (id, content, redacted_by)) in events.iter().enumerate() {
                let json = format!(r#"{{"type":"m.room.message","content":{content}}}"#);
                sqlx::query(
                    "INSERT INTO events (room_id, seq, event_id, event_type, sender, origin_server_ts, json, redacted_by) \
                     VALUES ('!r:x', $1, $2, 'm.room.message', '@a:x', 0, $3, $4)",
                )
                .bind(i64::try_from(i).unwrap() + 10)
                .bind(*id)
                .bind(json)
                .bind(*redacted_by)
                .execute(&db.pool)
                .await
                .unwrap();
            }
            db.pool.close().await;
            let db = Db::connect(&fresh.url, SqliteSynchronous::Full).await.unwrap();
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
                "SELECT event_id, relates_to_id, rel_type, seq FROM event_relations ORDER BY seq",
            )
            .fetch_all(&mut db.reader())
            .await
            .unwrap();
            let want = [
                ("$thread".to_owned(), "$root".to_owned(), "m.thread".to_owned(), 10),
                ("$edit".to_owned(), "$root".to_owned(), "m.replace".to_owned(), 11),
            ];
            assert_eq!(rows, want, "{}", fresh.label);
            db.pool.close().await;
            fresh.finish().await;
        }
    }

    #[test]
    fn clauses() {
        assert_eq!(params(3, 2), "$3, $4");
        assert_eq!(spans_clause("x.seq", 2, 0), "(1 = 0)");
        assert_eq!(spans_clause("x.seq", 4, 2), "(x.seq BETWEEN $4 AND $5 OR x.seq BETWEEN $6 AND $7)");
        let many: Vec<(i64, i64)> = (0..40).map(|i| (i * 10, i * 10 + 5)).collect();
        assert_eq!(newest(&many).len(), MAX_SPANS);
        assert_eq!(newest(&many)[MAX_SPANS - 1], (390, 395));
    }
}
