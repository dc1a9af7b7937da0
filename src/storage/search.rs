//! The `event_search` table: the searchable text of events (migration 0023)
//! and the full-text queries over it, FTS5 on SQLite and `tsvector` with a
//! GIN index on PostgreSQL. Rows are written by [`index_many`] from
//! [`super::events::insert`] (every placed event passes there) and removed by
//! [`unindex`] from [`super::events::set_redacted_by`], each in the
//! transaction of the event. Which rows a caller may see is decided by the
//! caller ([`Query::scope`]); this module only turns it into SQL.

use sqlx::AnyConnection;

use super::events::NewEvent;
use super::{Backend, Db};
use crate::error::Result;

/// The searchable events: (type, the content field indexed). The spec's keys
/// `content.body`, `content.name`, `content.topic` name these fields.
pub const SEARCHABLE: [(&str, &str); 3] =
    [("m.room.message", "body"), ("m.room.name", "name"), ("m.room.topic", "topic")];

/// The text of `e` to index, if any: a message's body, a room's name or
/// topic (state key ""), a string. NUL characters (which PostgreSQL text
/// cannot hold) become spaces.
fn searchable_text(e: &NewEvent<'_>) -> Option<(String, bool)> {
    let field = SEARCHABLE.iter().find(|(kind, _)| *kind == e.event_type).map(|(_, field)| *field)?;
    let state_ok = match e.event_type {
        "m.room.message" => e.state_key.is_none(),
        _ => e.state_key == Some(""),
    };
    if !state_ok {
        return None;
    }
    let pdu: serde_json::Value = serde_json::from_str(e.json).ok()?;
    let content = pdu.get("content")?;
    let text = content.get(field)?.as_str()?;
    let contains_url = e.event_type == "m.room.message" && content.get("url").is_some();
    Some((text.replace('\0', " "), contains_url))
}

/// Indexes newly placed events (inside their transaction), in one
/// statement per 64; events with nothing searchable are skipped.
pub async fn index_many(conn: &mut AnyConnection, events: &[NewEvent<'_>]) -> Result<()> {
    let texts: Vec<(&NewEvent<'_>, (String, bool))> =
        events.iter().filter_map(|e| Some((e, searchable_text(e)?))).collect();
    for chunk in texts.chunks(64) {
        let sql = super::values_sql(
            "INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)",
            8,
            chunk.len(),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (e, (body, contains_url)) in chunk {
            query = query
                .bind(e.event_id)
                .bind(e.room_id)
                .bind(e.seq)
                .bind(e.stream)
                .bind(e.event_type)
                .bind(e.sender)
                .bind(i64::from(*contains_url))
                .bind(body.as_str());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Removes a redacted event from the index (inside the redaction's
/// transaction).
pub async fn unindex(conn: &mut AnyConnection, event_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM event_search WHERE event_id = $1").bind(event_id).execute(conn).await?;
    Ok(())
}

/// Result order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Best match first (ties: older first).
    Rank,
    /// Newest first (by stream position).
    Recent,
}

/// Which column a grouping counts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupColumn {
    /// `room_id`.
    Room,
    /// `sender`.
    Sender,
}

impl GroupColumn {
    fn column(self) -> &'static str {
        match self {
            Self::Room => "s.room_id",
            Self::Sender => "s.sender",
        }
    }
}

/// A search: the words, what the caller may read, and the filter.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    /// The words to find (each a run of letters and digits, matched as a
    /// prefix; all must occur).
    pub words: &'a [String],
    /// Per room, the seq spans (inclusive) the caller may read; nothing
    /// outside them is matched or counted.
    pub scope: &'a [(String, Vec<(i64, i64)>)],
    /// Event types searched (from the keys and the filter's types).
    pub types: &'a [&'a str],
    /// Only these senders.
    pub senders: Option<&'a [String]>,
    /// Never these senders.
    pub not_senders: &'a [String],
    /// `Some(true)`: only events with `content.url`; `Some(false)`: only without.
    pub contains_url: Option<bool>,
    /// Only events at or below this stream position (fixed by the first page,
    /// so that later pages do not shift as new events arrive).
    pub max_stream: i64,
}

/// One match.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The event.
    pub event_id: String,
    /// Its room.
    pub room_id: String,
    /// Its position.
    pub seq: i64,
    /// How well it matches (higher is better).
    pub rank: f64,
    /// The indexed text.
    pub body: String,
}

/// The `FROM ... WHERE` of a query with its bind values, for either backend.
struct Sql {
    from_where: String,
    binds: Vec<Bind>,
    rank: &'static str,
}

enum Bind {
    Text(String),
    Int(i64),
}

impl Sql {
    fn push_text(&mut self, v: &str) -> String {
        self.binds.push(Bind::Text(v.to_owned()));
        format!("${}", self.binds.len())
    }

    fn push_int(&mut self, v: i64) -> String {
        self.binds.push(Bind::Int(v));
        format!("${}", self.binds.len())
    }
}

fn bind_all_as<'q, O>(
    mut query: sqlx::query::QueryAs<'q, sqlx::Any, O, sqlx::any::AnyArguments>,
    binds: &'q [Bind],
) -> sqlx::query::QueryAs<'q, sqlx::Any, O, sqlx::any::AnyArguments> {
    for b in binds {
        query = match b {
            Bind::Text(s) => query.bind(s.as_str()),
            Bind::Int(i) => query.bind(*i),
        };
    }
    query
}

/// The full-text query string of `words`: each word (letters and digits
/// only, so nothing in it is query syntax) as a prefix, all required.
fn match_expression(backend: Backend, words: &[String]) -> String {
    match backend {
        Backend::Sqlite => words.iter().map(|w| format!("\"{w}\"*")).collect::<Vec<_>>().join(" "),
        Backend::Postgres => words.iter().map(|w| format!("{w}:*")).collect::<Vec<_>>().join(" & "),
    }
}

fn build(backend: Backend, q: &Query<'_>) -> Sql {
    let mut sql = Sql { from_where: String::new(), binds: Vec::new(), rank: "" };
    let expr = sql.push_text(&match_expression(backend, q.words));
    let mut conds = Vec::new();
    match backend {
        Backend::Sqlite => {
            // CROSS JOIN keeps the full-text match the outer loop: SQLite
            // may otherwise walk event_search by room and run the match
            // once per row (quadratic: minutes on 100k messages).
            sql.from_where = format!(
                "FROM event_search_fts CROSS JOIN event_search s ON s.id = event_search_fts.rowid \
                 WHERE event_search_fts MATCH {expr}"
            );
            sql.rank = "-bm25(event_search_fts)";
        }
        Backend::Postgres => {
            sql.from_where =
                format!("FROM event_search s WHERE s.tsv @@ to_tsquery('english'::regconfig, {expr})");
            sql.rank = "ts_rank_cd(s.tsv, to_tsquery('english'::regconfig, $1))::float8";
        }
    }
    let types: Vec<String> = q.types.iter().map(|t| sql.push_text(t)).collect();
    conds.push(format!("s.event_type IN ({})", types.join(", ")));
    conds.push(format!("s.stream <= {}", sql.push_int(q.max_stream)));
    if let Some(senders) = q.senders {
        let list: Vec<String> = senders.iter().map(|s| sql.push_text(s)).collect();
        conds.push(if list.is_empty() {
            "1 = 0".to_owned()
        } else {
            format!("s.sender IN ({})", list.join(", "))
        });
    }
    if !q.not_senders.is_empty() {
        let list: Vec<String> = q.not_senders.iter().map(|s| sql.push_text(s)).collect();
        conds.push(format!("s.sender NOT IN ({})", list.join(", ")));
    }
    if let Some(url) = q.contains_url {
        conds.push(format!("s.contains_url = {}", i64::from(url)));
    }
    let mut rooms = Vec::new();
    for (room_id, spans) in q.scope {
        let room = sql.push_text(room_id);
        // The spans are positions this server computed (never client text).
        let spans: Vec<String> =
            spans.iter().map(|(lo, hi)| format!("s.seq BETWEEN {lo} AND {hi}")).collect();
        rooms.push(format!("(s.room_id = {room} AND ({}))", spans.join(" OR ")));
    }
    conds.push(format!("({})", rooms.join(" OR ")));
    for c in conds {
        sql.from_where.push_str(" AND ");
        sql.from_where.push_str(&c);
    }
    sql
}

fn order_by(order: Order) -> &'static str {
    match order {
        Order::Rank => "score DESC, s.stream ASC, s.event_id",
        Order::Recent => "s.stream DESC, s.seq DESC, s.event_id",
    }
}

fn is_empty(q: &Query<'_>) -> bool {
    q.words.is_empty() || q.types.is_empty() || q.scope.iter().all(|(_, spans)| spans.is_empty())
}

/// Up to `limit` matches from `offset` in `order`.
///
/// Searches read on the pool, not a direct reader (`storage::direct`): a
/// common word's matches may take long to rank and count, and they wait on
/// a connection's own thread, not on the thread serving other requests.
pub async fn page(db: &Db, q: &Query<'_>, order: Order, offset: i64, limit: i64) -> Result<Vec<Hit>> {
    if is_empty(q) {
        return Ok(Vec::new());
    }
    let mut sql = build(db.backend, q);
    let (lim, off) = (sql.push_int(limit), sql.push_int(offset));
    let text = format!(
        "SELECT s.event_id, s.room_id, s.seq, {} AS score, s.body {} ORDER BY {} LIMIT {lim} OFFSET {off}",
        sql.rank,
        sql.from_where,
        order_by(order)
    );
    let rows: Vec<(String, String, i64, f64, String)> =
        bind_all_as(sqlx::query_as(sqlx::AssertSqlSafe(text)), &sql.binds).fetch_all(&db.pool).await?;
    Ok(rows
        .into_iter()
        .map(|(event_id, room_id, seq, rank, body)| Hit { event_id, room_id, seq, rank, body })
        .collect())
}

/// How many matches there are.
pub async fn count(db: &Db, q: &Query<'_>) -> Result<i64> {
    if is_empty(q) {
        return Ok(0);
    }
    let sql = build(db.backend, q);
    let text = format!("SELECT COUNT(*) {}", sql.from_where);
    let (n,): (i64,) =
        bind_all_as(sqlx::query_as(sqlx::AssertSqlSafe(text)), &sql.binds).fetch_one(&db.pool).await?;
    Ok(n)
}

/// Matches per group (room or sender): among the first `upto` in `order`,
/// or among all with `None`.
pub async fn group_counts(
    db: &Db,
    q: &Query<'_>,
    column: GroupColumn,
    order: Order,
    upto: Option<i64>,
) -> Result<Vec<(String, i64)>> {
    if is_empty(q) {
        return Ok(Vec::new());
    }
    let mut sql = build(db.backend, q);
    let col = column.column();
    let text = match upto {
        Some(n) => {
            let lim = sql.push_int(n);
            format!(
                "SELECT g, COUNT(*) FROM (SELECT {col} AS g, {} AS score {} \
                 ORDER BY {} LIMIT {lim}) firsts GROUP BY g",
                sql.rank,
                sql.from_where,
                order_by(order)
            )
        }
        None => format!("SELECT {col}, COUNT(*) {} GROUP BY {col}", sql.from_where),
    };
    let rows: Vec<(String, i64)> =
        bind_all_as(sqlx::query_as(sqlx::AssertSqlSafe(text)), &sql.binds).fetch_all(&db.pool).await?;
    Ok(rows)
}
