//! The `events` table (each room's seq line), `room_state` (current state),
//! the readers of the state as of a seq (over `state_runs`, see
//! [`super::state_runs`]) and `txn_ids` (idempotent sends).
//!
//! The state readers return outliers too (a room joined over federation
//! starts with a state of outliers): such a [`StoredEvent`] has the seq of
//! the position whose state names it. Lookups by id ([`by_id`]) return
//! placed events only; [`super::outliers::held_by_id`] returns either.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// An event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// The room.
    pub room_id: String,
    /// Its place on the room's seq line.
    pub seq: i64,
    /// Event id.
    pub event_id: String,
    /// The full PDU.
    pub json: String,
    /// The redaction that redacted it, if any.
    pub redacted_by: Option<String>,
    /// Sending device, for `unsigned.transaction_id`.
    pub txn_device_id: Option<String>,
    /// Its transaction id.
    pub txn_id: Option<String>,
    /// Whether other events relate to it (`event_relations` names it as a
    /// parent), when the query that read it looked (`None`: not asked).
    pub has_children: Option<bool>,
}

pub(super) type Row = (String, i64, String, String, Option<String>, Option<String>, Option<String>);

/// A [`Row`] and whether anything relates to the event (1) or not (0).
type RowWithChildren = (String, i64, String, String, Option<String>, Option<String>, Option<String>, i64);

pub(super) fn from_row(
    (room_id, seq, event_id, json, redacted_by, txn_device_id, txn_id): Row,
) -> StoredEvent {
    StoredEvent { room_id, seq, event_id, json, redacted_by, txn_device_id, txn_id, has_children: None }
}

pub(super) const COLUMNS: &str =
    "e.room_id, e.seq, e.event_id, e.json, e.redacted_by, e.txn_device_id, e.txn_id";

/// A state row `r` (of `state_runs` or `room_state`) with the event it names,
/// placed (`e`) or outlier (`o`): the columns of [`RunRow`]. A placed event
/// keeps its own seq; an outlier takes the row's.
const RUN_COLUMNS: &str = "r.room_id, COALESCE(e.seq, r.seq), r.event_id, COALESCE(e.json, o.json), \
     e.redacted_by, e.txn_device_id, e.txn_id";

/// The joins behind [`RUN_COLUMNS`].
pub(super) const RUN_JOINS: &str =
    "LEFT JOIN events e ON e.event_id = r.event_id LEFT JOIN outliers o ON o.event_id = r.event_id";

/// A row of [`RUN_COLUMNS`]: event id and JSON are NULL where the row says
/// the key is absent (or names an event not held).
type RunRow = (String, i64, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);

fn from_run_row(
    (room_id, seq, event_id, json, redacted_by, txn_device_id, txn_id): RunRow,
) -> Option<StoredEvent> {
    Some(StoredEvent {
        room_id,
        seq,
        event_id: event_id?,
        json: json?,
        redacted_by,
        txn_device_id,
        txn_id,
        has_children: None,
    })
}

/// A new row for the `events` table.
#[derive(Debug)]
pub struct NewEvent<'a> {
    /// Room.
    pub room_id: &'a str,
    /// Seq.
    pub seq: i64,
    /// Global stream position.
    pub stream: i64,
    /// Event id.
    pub event_id: &'a str,
    /// Type.
    pub event_type: &'a str,
    /// State key.
    pub state_key: Option<&'a str>,
    /// Sender.
    pub sender: &'a str,
    /// Timestamp.
    pub origin_server_ts: i64,
    /// PDU.
    pub json: &'a str,
    /// Sending device and transaction id.
    pub txn: Option<(&'a str, &'a str)>,
    /// For member events, `content.membership`.
    pub membership: Option<&'a str>,
    /// Its `content.m.relates_to`, when that names a parent and a type.
    pub relation: Option<super::relations::NewRelation<'a>>,
}

/// Appends an event at its seq with its searchable text
/// ([`super::search::index_many`]; its DAG edges are in its PDU) and, for state
/// events, records the change in `state_runs` (the state after an accepted state
/// event holds it for its own key) and makes it current state.
pub async fn insert(conn: &mut AnyConnection, e: &NewEvent<'_>) -> Result<()> {
    insert_row(conn, e).await?;
    if let Some(state_key) = e.state_key {
        super::state_runs::record(conn, e.room_id, e.event_type, state_key, e.seq, Some(e.event_id)).await?;
        set_current(conn, e.room_id, e.event_type, state_key, e.event_id, e.membership, e.seq).await?;
    }
    Ok(())
}

/// Places an event at its seq with its relation and searchable text and
/// nothing else: no `state_runs` row, no current state (backfill writes the state of the
/// positions it fills itself, and never moves the current state).
pub async fn insert_row(conn: &mut AnyConnection, e: &NewEvent<'_>) -> Result<()> {
    insert_rows(conn, std::slice::from_ref(e)).await
}

/// Rows one multi-row insert writes at most (11 values each, well under
/// SQLite's and PostgreSQL's limits on bound values).
const ROWS_PER_INSERT: usize = 64;

/// [`insert_row`] for many events at once (a backfill batch), a few
/// statements in all rather than some per event.
pub async fn insert_rows(conn: &mut AnyConnection, rows: &[NewEvent<'_>]) -> Result<()> {
    let filed = filed_timestamps(conn, rows).await?;
    let mut filed = filed.into_iter();
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let sql = super::values_sql(
            "INSERT INTO events (room_id, seq, stream, event_id, event_type, state_key, sender, origin_server_ts, json, txn_device_id, txn_id)",
            11,
            chunk.len(),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for e in chunk {
            query = query
                .bind(e.room_id)
                .bind(e.seq)
                .bind(e.stream)
                .bind(e.event_id)
                .bind(e.event_type)
                .bind(e.state_key)
                .bind(e.sender)
                .bind(filed.next().unwrap_or(e.origin_server_ts))
                .bind(e.json)
                .bind(e.txn.map(|t| t.0))
                .bind(e.txn.map(|t| t.1));
        }
        query.execute(&mut *conn).await?;
    }
    for e in rows {
        if let Some(relation) = e.relation {
            super::relations::insert(conn, e.room_id, e.event_id, e.event_type, e.sender, e.seq, relation)
                .await?;
        }
    }
    super::search::index_many(conn, rows).await
}

/// The times `rows` are filed under (`events.origin_server_ts`, by which
/// [`first_seq_since`] finds the oldest event a room's retention keeps): each
/// event's own `origin_server_ts`, the sender's word, kept between its
/// neighbours' on the seq line and never later than now. So the column never
/// falls along the line: a remote sender dating a new event just young
/// enough cannot make it look like the room's oldest young event (which
/// would lift the room's floor over all its history), nor a date ahead keep
/// what follows from ageing. The PDU keeps the time it was signed with.
async fn filed_timestamps(conn: &mut AnyConnection, rows: &[NewEvent<'_>]) -> Result<Vec<i64>> {
    let now = super::now_ms();
    let mut filed: Vec<i64> = rows.iter().map(|e| e.origin_server_ts.min(now)).collect();
    let mut by_room: std::collections::BTreeMap<&str, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, e) in rows.iter().enumerate() {
        by_room.entry(e.room_id).or_default().push(i);
    }
    for (room_id, mut indices) in by_room {
        indices.sort_by_key(|&i| rows[i].seq);
        let (Some(&first), Some(&last)) = (indices.first(), indices.last()) else { continue };
        // Both neighbours in one statement (one round trip of the writer's).
        let (below, above): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT origin_server_ts FROM events WHERE room_id = $1 AND seq < $2 \
                     ORDER BY seq DESC LIMIT 1), \
                    (SELECT origin_server_ts FROM events WHERE room_id = $1 AND seq > $3 \
                     ORDER BY seq ASC LIMIT 1)",
        )
        .bind(room_id)
        .bind(rows[first].seq)
        .bind(rows[last].seq)
        .fetch_one(&mut *conn)
        .await?;
        // Downwards no later than what lies above, then upwards no earlier
        // than what lies below.
        let mut cap = above.unwrap_or(now).min(now);
        for &i in indices.iter().rev() {
            filed[i] = filed[i].min(cap);
            cap = filed[i];
        }
        let mut least = below.unwrap_or(i64::MIN);
        for &i in &indices {
            filed[i] = filed[i].max(least);
            least = filed[i];
        }
    }
    Ok(filed)
}

/// The event id `room_state` holds for a key a state resolution left
/// absent: no event has it, so every reader joining the row to its event
/// finds none (the key is absent), and the key stays listed for the
/// readers of older positions.
pub const ABSENT: &str = "";

/// Makes `event_id` (placed or outlier) the current state for (type, state
/// key), as of position `seq`; `membership` is a member event's
/// `content.membership`. `room_state` also lists the keys the state readers
/// visit: every key with a `state_runs` row needs a row here.
pub async fn set_current(
    conn: &mut AnyConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    event_id: &str,
    membership: Option<&str>,
    seq: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO room_state (room_id, event_type, state_key, event_id, membership, seq) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (room_id, event_type, state_key) DO UPDATE SET \
           event_id = excluded.event_id, membership = excluded.membership, seq = excluded.seq",
    )
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .bind(event_id)
    .bind(membership)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// Lists (type, state key) among the keys the state readers visit, with no
/// current event ([`ABSENT`]) when the room has no row for it yet: a key
/// that history placed below the head holds and the current state lacks.
pub async fn register_key(
    conn: &mut AnyConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    seq: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO room_state (room_id, event_type, state_key, event_id, membership, seq) \
         VALUES ($1, $2, $3, $4, NULL, $5) ON CONFLICT (room_id, event_type, state_key) DO NOTHING",
    )
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .bind(ABSENT)
    .bind(seq)
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether `room_id` has an event placed below position `seq` (one seek).
pub async fn placed_before(db: &Db, room_id: &str, seq: i64) -> Result<bool> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM events WHERE room_id = $1 AND seq < $2 LIMIT 1")
            .bind(room_id)
            .bind(seq)
            .fetch_optional(&mut db.reader())
            .await?;
    Ok(found.is_some())
}

/// The current state event for (type, state key), inside a transaction.
pub async fn current_state_event(
    conn: &mut AnyConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> Result<Option<StoredEvent>> {
    current_state_event_on(conn, room_id, event_type, state_key).await
}

/// [`current_state_event`] on any executor.
async fn current_state_event_on<'c, E: sqlx::Executor<'c, Database = sqlx::Any>>(
    conn: E,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> Result<Option<StoredEvent>> {
    let row: Option<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM room_state r {RUN_JOINS} \
         WHERE r.room_id = $1 AND r.event_type = $2 AND r.state_key = $3"
    )))
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .fetch_optional(conn)
    .await?;
    Ok(row.and_then(from_run_row))
}

/// Every current state event of a room, in seq order.
pub async fn current_state(db: &Db, room_id: &str) -> Result<Vec<StoredEvent>> {
    let rows: Vec<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM room_state r {RUN_JOINS} \
         WHERE r.room_id = $1 ORDER BY 2, r.event_type, r.state_key"
    )))
    .bind(room_id)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows.into_iter().filter_map(from_run_row).collect())
}

/// The current state events of one type (e.g. a space's `m.space.child`
/// events), by state key.
pub async fn current_state_of_type(db: &Db, room_id: &str, event_type: &str) -> Result<Vec<StoredEvent>> {
    let rows: Vec<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM room_state r {RUN_JOINS} \
         WHERE r.room_id = $1 AND r.event_type = $2 ORDER BY r.state_key"
    )))
    .bind(room_id)
    .bind(event_type)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows.into_iter().filter_map(from_run_row).collect())
}

/// The current state event for (type, state key).
pub async fn state_event(
    db: &Db,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> Result<Option<StoredEvent>> {
    current_state_event_on(&mut db.reader(), room_id, event_type, state_key).await
}

/// One event by id.
pub async fn by_id(db: &Db, event_id: &str) -> Result<Option<StoredEvent>> {
    by_id_on(&mut db.reader(), event_id).await
}

/// One event by id, inside a transaction.
pub async fn by_id_tx(conn: &mut AnyConnection, event_id: &str) -> Result<Option<StoredEvent>> {
    by_id_on(conn, event_id).await
}

/// [`by_id`] on any executor.
async fn by_id_on<'c, E: sqlx::Executor<'c, Database = sqlx::Any>>(
    conn: E,
    event_id: &str,
) -> Result<Option<StoredEvent>> {
    let row: Option<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM events e WHERE e.event_id = $1")))
            .bind(event_id)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(from_row))
}

/// Marks `target` as redacted by `redaction` and takes its text out of the
/// search index. A state event's redaction moves the room's read epoch:
/// what readers keep of the state (`room::cache`) is read again.
pub async fn set_redacted_by(conn: &mut AnyConnection, target: &str, redaction: &str) -> Result<()> {
    let marked =
        sqlx::query("UPDATE events SET redacted_by = $1 WHERE event_id = $2 AND redacted_by IS NULL")
            .bind(redaction)
            .bind(target)
            .execute(&mut *conn)
            .await?;
    if marked.rows_affected() > 0 {
        sqlx::query(
            "UPDATE rooms SET read_epoch = read_epoch + 1 \
             WHERE room_id = (SELECT room_id FROM events WHERE event_id = $1 AND state_key IS NOT NULL)",
        )
        .bind(target)
        .execute(&mut *conn)
        .await?;
    }
    super::tally::recheck(conn, target).await?;
    super::search::unindex(conn, target).await
}

/// A device's transaction.
#[derive(Debug, Clone, Copy)]
pub struct Txn<'a> {
    /// User.
    pub user_id: &'a str,
    /// Device.
    pub device_id: &'a str,
    /// Which endpoint family (`send`, `redact`).
    pub scope: &'a str,
    /// The client's transaction id.
    pub txn_id: &'a str,
}

/// The event a transaction produced, if it ran before.
pub async fn txn_event(conn: &mut AnyConnection, t: Txn<'_>) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT event_id FROM txn_ids WHERE user_id = $1 AND device_id = $2 AND scope = $3 AND txn_id = $4",
    )
    .bind(t.user_id)
    .bind(t.device_id)
    .bind(t.scope)
    .bind(t.txn_id)
    .fetch_optional(conn)
    .await?)
}

/// Records the event a transaction produces; false (and nothing written)
/// when the transaction already has one.
pub async fn claim_txn(conn: &mut AnyConnection, t: Txn<'_>, event_id: &str, now: i64) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO txn_ids (user_id, device_id, scope, txn_id, event_id, created_ts) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (user_id, device_id, scope, txn_id) DO NOTHING",
    )
    .bind(t.user_id)
    .bind(t.device_id)
    .bind(t.scope)
    .bind(t.txn_id)
    .bind(event_id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Rooms in which `user_id`'s current membership is `membership`.
pub async fn rooms_with_membership(db: &Db, user_id: &str, membership: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT room_id FROM room_state WHERE event_type = 'm.room.member' AND state_key = $1 AND membership = $2 \
         ORDER BY room_id",
    )
    .bind(user_id)
    .bind(membership)
    .fetch_all(&mut db.reader())
    .await?)
}

/// A user's current membership in a room, if they have one.
pub async fn current_membership(db: &Db, room_id: &str, user_id: &str) -> Result<Option<String>> {
    let row: Option<Option<String>> = sqlx::query_scalar(
        "SELECT membership FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2",
    )
    .bind(room_id)
    .bind(user_id)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.flatten())
}

/// Every membership change of one user in one room: (seq, membership), in
/// order of the positions whose state it changed (a key gone absent reads as
/// "leave").
pub async fn membership_changes(db: &Db, room_id: &str, user_id: &str) -> Result<Vec<MemberChange>> {
    Ok(state_changes(db, room_id, "m.room.member", user_id)
        .await?
        .into_iter()
        .map(|(seq, json)| MemberChange::of(seq, json.as_deref()))
        .collect())
}

/// One of a user's member events, as far as reads need it.
#[derive(Debug, Clone)]
pub struct MemberChange {
    /// Its seq.
    pub seq: i64,
    /// `content.membership`.
    pub membership: String,
    /// `content.displayname`.
    pub display_name: Option<String>,
}

impl MemberChange {
    /// The change at `seq` to the member event `json` (`None`: the key
    /// became absent, which reads as "leave").
    pub(in crate::storage) fn of(seq: i64, json: Option<&str>) -> Self {
        let value = json.and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok()).unwrap_or_default();
        let content = &value["content"];
        MemberChange {
            seq,
            membership: content["membership"].as_str().unwrap_or("leave").to_owned(),
            display_name: content["displayname"].as_str().map(str::to_owned),
        }
    }
}

/// Every change of one state key in a room: (seq, PDU json), in seq order;
/// `None` where the key became absent.
pub async fn state_changes(
    db: &Db,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> Result<Vec<(i64, Option<String>)>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.seq, COALESCE(e.json, o.json) FROM state_runs r {RUN_JOINS} \
         WHERE r.room_id = $1 AND r.event_type = $2 AND r.state_key = $3 ORDER BY r.seq"
    )))
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .fetch_all(&mut db.reader())
    .await?)
}

/// The seq of the `n`th event below `seq` (`n` >= 1), or of the lowest one
/// when fewer lie below; `None` when none does. Positions are sparse, so "the
/// N events before" is counted here, on the (room_id, seq) primary key: one
/// descending index scan of at most `n` entries.
pub async fn nth_before(conn: &mut AnyConnection, room_id: &str, seq: i64, n: i64) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT MIN(w.seq) FROM (SELECT seq FROM events WHERE room_id = $1 AND seq < $2 \
         ORDER BY seq DESC LIMIT $3 + 0) w",
    )
    .bind(room_id)
    .bind(seq)
    .bind(n)
    .fetch_one(conn)
    .await?)
}

/// The first seq of an event sent at or after `ts` (for retention).
pub async fn first_seq_since(db: &Db, room_id: &str, ts: i64) -> Result<Option<i64>> {
    // The earliest event at or after `ts` by the (room, ts) index: one seek.
    Ok(sqlx::query_scalar(
        "SELECT seq FROM events WHERE room_id = $1 AND origin_server_ts >= $2 ORDER BY origin_server_ts LIMIT 1",
    )
    .bind(room_id)
    .bind(ts)
    .fetch_optional(&mut db.reader())
    .await?)
}

/// Events with seq in `lo..=hi`, highest first (`descending`) or lowest
/// first, at most `limit`.
pub async fn range(
    db: &Db,
    room_id: &str,
    lo: i64,
    hi: i64,
    descending: bool,
    limit: i64,
) -> Result<Vec<StoredEvent>> {
    let order = if descending { "DESC" } else { "ASC" };
    // Whether anything relates to each event comes along (an index probe in
    // the same statement), so a page without relations needs no bundle query.
    let rows: Vec<RowWithChildren> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}, CASE WHEN EXISTS (SELECT 1 FROM event_relations x \
               WHERE x.room_id = e.room_id AND x.relates_to_id = e.event_id) THEN 1 ELSE 0 END \
             FROM events e WHERE e.room_id = $1 AND e.seq >= $2 AND e.seq <= $3 ORDER BY e.seq {order} LIMIT $4 + 0"
        )))
        .bind(room_id)
        .bind(lo)
        .bind(hi)
        .bind(limit)
        .fetch_all(&mut db.reader())
        .await?;
    Ok(rows
        .into_iter()
        .map(|(room_id, seq, event_id, json, redacted_by, txn_device_id, txn_id, children)| StoredEvent {
            room_id,
            seq,
            event_id,
            json,
            redacted_by,
            txn_device_id,
            txn_id,
            has_children: Some(children != 0),
        })
        .collect())
}

/// What [`unread_candidates`] leaves out.
#[derive(Debug, Clone, Copy)]
pub struct CandidateSkip<'a> {
    /// This sender's events.
    pub sender: &'a str,
    /// Member events whose state key is not `sender`.
    pub others_membership: bool,
}

/// The events with seq in `lo..=hi` but those `skip` names, highest first,
/// at most `limit`: the events unread counting may have to evaluate. When
/// others' member events are skipped, the rest is read as two index ranges
/// (`events_not_members`, `events_members_by_target`), so the joins of a
/// busy room are not walked one by one.
pub async fn unread_candidates(
    db: &Db,
    room_id: &str,
    lo: i64,
    hi: i64,
    skip: &CandidateSkip<'_>,
    limit: i64,
) -> Result<Vec<StoredEvent>> {
    let sql = sql::unread_candidates(skip.others_membership);
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(room_id)
        .bind(lo)
        .bind(hi)
        .bind(skip.sender)
        .bind(limit)
        .fetch_all(&mut db.reader())
        .await?;
    Ok(rows.into_iter().map(from_row).collect())
}

/// The placed events among `ids`, in no particular order.
pub async fn by_ids(db: &Db, ids: &[&str]) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = format!(
            "SELECT {COLUMNS} FROM events e WHERE e.event_id {}",
            super::outliers::in_list(chunk.len())
        );
        let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?.into_iter().map(from_row));
    }
    Ok(out)
}

/// The events of `room_id` at `seqs`, in no particular order.
pub async fn at_seqs(db: &Db, room_id: &str, seqs: &[i64]) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = format!(
            "SELECT {COLUMNS} FROM events e WHERE e.room_id = $1 AND e.seq IN ({})",
            super::params(2, chunk.len())
        );
        let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql)).bind(room_id);
        for seq in chunk {
            query = query.bind(*seq);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?.into_iter().map(from_row));
    }
    Ok(out)
}

/// The room's state as of seq `at` (each key's latest `state_runs` row at or
/// below it), in seq order. Driven by the room's state keys (every key ever
/// set is in `room_state`), one index seek each: the cost follows the size of
/// the state, not the length of the timeline. (`CROSS JOIN` keeps SQLite
/// from starting at `state_runs` and walking every row of the room.)
pub async fn state_at(db: &Db, room_id: &str, at: i64) -> Result<Vec<StoredEvent>> {
    state_at_sql(db, room_id, at, sql::state_at("")).await
}

/// The current state keys of room `$1` but its members, as the `s` of
/// [`sql::state_at_from`]: two ranges of the state index, each read on its
/// own. Written as one condition (`<>`, or `< ... OR > ...`) SQLite walked
/// every member of the room instead (0.36 ms in a room of 5,000).
const NON_MEMBER_KEYS: &str = "(SELECT room_id, event_type, state_key FROM room_state \
       WHERE room_id = $1 AND event_type < 'm.room.member' \
     UNION ALL \
     SELECT room_id, event_type, state_key FROM room_state \
       WHERE room_id = $1 AND event_type > 'm.room.member') s";

/// [`state_at`] without member events (lazy-loading fetches those one by one).
pub async fn state_at_without_members(db: &Db, room_id: &str, at: i64) -> Result<Vec<StoredEvent>> {
    state_at_sql(db, room_id, at, sql::state_at_without_members()).await
}

/// Runs a [`sql::state_at`] query.
async fn state_at_sql(db: &Db, room_id: &str, at: i64, sql: String) -> Result<Vec<StoredEvent>> {
    let rows: Vec<RunRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(room_id).bind(at).fetch_all(&mut db.reader()).await?;
    Ok(rows.into_iter().filter_map(from_run_row).collect())
}

/// The member events of `users` as of seq `at` (those that have one), in
/// seq order: one query for a page's or a timeline's senders.
pub async fn members_at(db: &Db, room_id: &str, users: &[&str], at: i64) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::with_capacity(users.len());
    for chunk in users.chunks(super::outliers::IDS_PER_QUERY) {
        let extra = format!(
            "AND s.event_type = 'm.room.member' AND s.state_key IN ({})",
            super::params(3, chunk.len())
        );
        let mut query =
            sqlx::query_as::<_, RunRow>(sqlx::AssertSqlSafe(sql::state_at(&extra))).bind(room_id).bind(at);
        for user in chunk {
            query = query.bind(*user);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?.into_iter().filter_map(from_run_row));
    }
    out.sort_by_key(|e| e.seq);
    Ok(out)
}

/// One state event as of seq `at`.
pub async fn state_event_at(
    db: &Db,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    at: i64,
) -> Result<Option<StoredEvent>> {
    let row: Option<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql::state_event_at()))
        .bind(room_id)
        .bind(event_type)
        .bind(state_key)
        .bind(at)
        .fetch_optional(&mut db.reader())
        .await?;
    Ok(row.and_then(from_run_row))
}

/// The state as of `at` restricted to keys that changed in `(after, at]`:
/// what an incremental sync must send: each changed key's last row in that
/// stretch (a key that became absent has nothing to send). A range scan over
/// the stretch's `state_runs` rows, never its messages, with one seek per
/// row to see whether it is the key's last.
pub async fn state_changed_between(db: &Db, room_id: &str, after: i64, at: i64) -> Result<Vec<StoredEvent>> {
    let rows: Vec<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql::state_changed_between()))
        .bind(room_id)
        .bind(after)
        .bind(at)
        .fetch_all(&mut db.reader())
        .await?;
    Ok(rows.into_iter().filter_map(from_run_row).collect())
}

/// The positions in `after+1..=at` where the room's state moved by more
/// than the event placed there: an event placed across a hole (with the
/// state its sender gave) or a merge whose state resolution changed other
/// keys. No event of the timeline says what changed there.
pub async fn moved_apart(db: &Db, room_id: &str, after: i64, at: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT r.seq FROM state_runs r LEFT JOIN events e ON e.room_id = r.room_id AND e.seq = r.seq \
         WHERE r.room_id = $1 AND r.seq > $2 AND r.seq <= $3 \
           AND (r.event_id IS NULL OR e.event_id IS NULL OR r.event_id <> e.event_id) \
         ORDER BY r.seq",
    )
    .bind(room_id)
    .bind(after)
    .bind(at)
    .fetch_all(&mut db.reader())
    .await?)
}

/// The SQL of the readers whose plans tests look at (the state readers, the
/// unread candidates), apart from their callers.
pub(super) mod sql {
    use super::{COLUMNS, NON_MEMBER_KEYS, RUN_COLUMNS, RUN_JOINS};

    /// [`super::state_at_without_members`]: $1 room, $2 seq.
    pub(in crate::storage) fn state_at_without_members() -> String {
        state_at_from(NON_MEMBER_KEYS, "")
    }

    /// [`super::unread_candidates`]: $1 room, $2 lo, $3 hi, $4 the user, $5 limit.
    pub(in crate::storage) fn unread_candidates(others_membership: bool) -> String {
        let range = "e.room_id = $1 AND e.seq >= $2 AND e.seq <= $3 AND e.sender <> $4";
        if others_membership {
            // A compound SELECT ordered as a whole: both index ranges already
            // come in seq order, so the two are merged as they are read, with
            // no sort and no more rows read than the LIMIT takes.
            format!(
                "SELECT {COLUMNS} FROM events e WHERE {range} AND e.event_type <> 'm.room.member' \
                 UNION ALL \
                 SELECT {COLUMNS} FROM events e WHERE {range} \
                   AND e.event_type = 'm.room.member' AND e.state_key = $4 \
                 ORDER BY seq DESC LIMIT $5 + 0"
            )
        } else {
            format!("SELECT {COLUMNS} FROM events e WHERE {range} ORDER BY e.seq DESC LIMIT $5 + 0")
        }
    }

    /// [`super::state_at`]: $1 room, $2 seq; `extra` narrows the keys (`s`).
    pub(in crate::storage) fn state_at(extra: &str) -> String {
        state_at_from("room_state s", extra)
    }

    /// [`state_at`] of the keys in `from` (a table or subquery named `s`
    /// with `room_id`, `event_type` and `state_key`).
    pub(in crate::storage) fn state_at_from(from: &str, extra: &str) -> String {
        format!(
            "SELECT {RUN_COLUMNS} FROM {from} CROSS JOIN state_runs r {RUN_JOINS} \
             WHERE s.room_id = $1 {extra} \
               AND r.room_id = s.room_id AND r.event_type = s.event_type AND r.state_key = s.state_key \
               AND r.seq = (SELECT MAX(x.seq) FROM state_runs x WHERE x.room_id = s.room_id \
                              AND x.event_type = s.event_type AND x.state_key = s.state_key AND x.seq <= $2) \
               AND r.event_id IS NOT NULL \
             ORDER BY 2, r.event_type, r.state_key"
        )
    }

    /// [`super::device_list_window`]: $1 user, $2 after, $3 upto.
    pub(in crate::storage) fn device_list_window() -> String {
        format!(
            "SELECT d.user_id, NULL, 0 FROM device_list_updates d WHERE d.stream > $2 AND d.stream <= $3 \
               AND (d.user_id = $1 OR EXISTS (SELECT 1 FROM room_state a CROSS JOIN room_state b \
                    WHERE a.event_type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join' \
                      AND b.room_id = a.room_id AND b.event_type = 'm.room.member' AND b.state_key = d.user_id \
                      AND b.membership = 'join')) \
             UNION ALL \
             SELECT x.state_key, x.membership, 1 FROM ({}) x",
            MEMBER_MOVERS
        )
    }

    /// The movers of [`super::device_list_window`]: $1 user, $2 after, $3 upto. Both halves
    /// start from the user's own member rows (`CROSS JOIN`, `EXISTS`): left
    /// to itself SQLite starts the second from every member row of every room.
    pub(in crate::storage) const MEMBER_MOVERS: &str = "SELECT DISTINCT e.state_key, cur.membership FROM room_state mine \
           JOIN events e ON e.room_id = mine.room_id AND e.stream > $2 AND e.stream <= $3 \
           LEFT JOIN room_state cur ON cur.room_id = e.room_id AND cur.event_type = 'm.room.member' \
             AND cur.state_key = e.state_key \
          WHERE mine.event_type = 'm.room.member' AND mine.state_key = $1 AND mine.membership = 'join' \
            AND e.event_type = 'm.room.member' AND e.state_key <> $1 \
         UNION \
         SELECT DISTINCT b.state_key, b.membership FROM room_state mine CROSS JOIN room_state b \
          WHERE mine.event_type = 'm.room.member' AND mine.state_key = $1 AND mine.membership = 'join' \
            AND EXISTS (SELECT 1 FROM events e WHERE e.room_id = mine.room_id AND e.stream > $2 \
                          AND e.stream <= $3 AND e.event_type = 'm.room.member' AND e.state_key = $1) \
            AND b.room_id = mine.room_id AND b.event_type = 'm.room.member' \
            AND b.membership = 'join' AND b.state_key <> $1";

    /// [`super::room_peers`] before [`crate::storage::Db::joined_column`]:
    /// $1 user. `CROSS JOIN`: from the user's rooms to their members; left
    /// to itself SQLite walks every member row of every room instead.
    pub(in crate::storage) const ROOM_PEERS: &str = "SELECT DISTINCT b.state_key AS v FROM room_state a CROSS JOIN room_state b \
         WHERE a.event_type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join' \
           AND b.room_id = a.room_id AND b.event_type = 'm.room.member' AND b.membership = 'join'";

    /// [`super::state_event_at`]: $1 room, $2 type, $3 state key, $4 seq.
    pub(in crate::storage) fn state_event_at() -> String {
        format!(
            "SELECT {RUN_COLUMNS} FROM state_runs r {RUN_JOINS} \
             WHERE r.room_id = $1 AND r.event_type = $2 AND r.state_key = $3 AND r.seq <= $4 \
             ORDER BY r.seq DESC LIMIT 1"
        )
    }

    /// [`super::state_changed_between`]: $1 room, $2 after, $3 at.
    pub(in crate::storage) fn state_changed_between() -> String {
        format!(
            "SELECT {RUN_COLUMNS} FROM state_runs r {RUN_JOINS} \
             WHERE r.room_id = $1 AND r.seq > $2 AND r.seq <= $3 AND r.event_id IS NOT NULL AND NOT EXISTS \
               (SELECT 1 FROM state_runs y WHERE y.room_id = r.room_id AND y.event_type = r.event_type \
                  AND y.state_key = r.state_key AND y.seq > r.seq AND y.seq <= $3) \
             ORDER BY 2, r.event_type, r.state_key"
        )
    }
}

/// Member counts of a room by membership.
pub async fn member_counts(db: &Db, room_id: &str) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT membership, COUNT(*) FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' \
         AND membership IS NOT NULL GROUP BY membership",
    )
    .bind(room_id)
    .fetch_all(&mut db.reader())
    .await?)
}

/// Joined and invited members, by user id, at most `limit` (for heroes).
pub async fn some_members(db: &Db, room_id: &str, limit: i64) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT state_key FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' \
         AND membership IN ('join', 'invite') ORDER BY state_key LIMIT $2 + 0",
    )
    .bind(room_id)
    .bind(limit)
    .fetch_all(&mut db.reader())
    .await?)
}

/// The rooms among `rooms` with an event or a receipt at a stream position
/// in `(after, upto]`: the only ones an incremental `/sync` can have news of
/// (besides typing and room account data, which it knows apart). One index
/// seek per room and table, in one statement.
pub async fn rooms_changed(db: &Db, rooms: &[&str], after: i64, upto: i64) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for chunk in rooms.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = format!(
            "SELECT x.room_id FROM rooms x WHERE x.room_id IN ({}) \
             AND (EXISTS (SELECT 1 FROM events e WHERE e.room_id = x.room_id AND e.stream > $1 AND e.stream <= $2) \
               OR EXISTS (SELECT 1 FROM receipts r WHERE r.room_id = x.room_id AND r.stream > $1 AND r.stream <= $2))",
            super::params(3, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql)).bind(after).bind(upto);
        for room in chunk {
            query = query.bind(*room);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?);
    }
    Ok(out)
}

/// [`seq_at_stream`] at two positions in one statement.
pub async fn seqs_at_streams(db: &Db, room_id: &str, a: i64, b: i64) -> Result<(i64, i64)> {
    let (x, y): (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT seq FROM events WHERE room_id = $1 AND stream <= $2 AND stream > 0 \
                 ORDER BY stream DESC LIMIT 1), \
                (SELECT seq FROM events WHERE room_id = $1 AND stream <= $3 AND stream > 0 \
                 ORDER BY stream DESC LIMIT 1)",
    )
    .bind(room_id)
    .bind(a)
    .bind(b)
    .fetch_one(&mut db.reader())
    .await?;
    Ok((x.unwrap_or(0), y.unwrap_or(0)))
}

/// The highest seq of a room whose stream position is at or below `stream`
/// (within a room, seq and stream grow together). Backfilled events have no
/// stream position (0) and are never the answer.
pub async fn seq_at_stream(db: &Db, room_id: &str, stream: i64) -> Result<i64> {
    // One index seek: the newest row at or below the position (MAX(seq) would
    // read every earlier row of the room).
    let seq: Option<i64> = sqlx::query_scalar(
        "SELECT seq FROM events WHERE room_id = $1 AND stream <= $2 AND stream > 0 ORDER BY stream DESC LIMIT 1",
    )
    .bind(room_id)
    .bind(stream)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(seq.unwrap_or(0))
}

/// A user's membership in a room now (`None`: never a member), inside a
/// write transaction.
pub async fn membership_tx(conn: &mut AnyConnection, room_id: &str, user_id: &str) -> Result<Option<String>> {
    let row: Option<Option<String>> = sqlx::query_scalar(
        "SELECT membership FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2",
    )
    .bind(room_id)
    .bind(user_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.flatten())
}

/// The users joined to the room now, inside a write transaction.
pub async fn joined_members_tx(conn: &mut AnyConnection, room_id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT state_key FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' \
         AND membership = 'join' ORDER BY state_key",
    )
    .bind(room_id)
    .fetch_all(conn)
    .await?)
}

/// The users joined to the room now.
pub async fn joined_members(db: &Db, room_id: &str) -> Result<Vec<String>> {
    let sql = db.joined_column(
        "SELECT state_key AS v FROM room_state WHERE room_id = $1 AND event_type = 'm.room.member' \
         AND membership = 'join'",
    );
    let joined: Option<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(room_id).fetch_one(&mut db.reader()).await?;
    Ok(super::split_column(joined))
}

/// `user` and everyone joined to a room with them now, in one query.
pub async fn room_peers(db: &Db, user: &str) -> Result<Vec<String>> {
    room_peers_inner(db, user).await
}

/// For `/sync`'s device lists, in one statement: the users whose devices or
/// keys changed in `(after, upto]` and who share a room with `user` now (or
/// are `user`), sorted; and the users (not `user`) whose membership changed
/// in that window in a room `user` is joined to now, each with whether they
/// are joined to it now, and when `user`'s own join falls in the window,
/// every member joined to that room now.
pub async fn device_list_window(
    db: &Db,
    user: &str,
    after: i64,
    upto: i64,
) -> Result<(Vec<String>, Vec<(String, bool)>)> {
    let sql = sql::device_list_window();
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(user)
        .bind(after)
        .bind(upto)
        .fetch_all(&mut db.reader())
        .await?;
    let (mut changed, mut movers) = (Vec::new(), Vec::new());
    for (who, membership, kind) in rows {
        if kind == 0 {
            changed.push(who);
        } else {
            movers.push((who, membership.as_deref() == Some("join")));
        }
    }
    changed.sort();
    changed.dedup();
    Ok((changed, movers))
}

async fn room_peers_inner(db: &Db, user: &str) -> Result<Vec<String>> {
    let sql = db.joined_column(sql::ROOM_PEERS);
    let joined: Option<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(user).fetch_one(&mut db.reader()).await?;
    let mut peers = super::split_column(joined);
    if !peers.iter().any(|p| p == user) {
        peers.push(user.to_owned());
    }
    peers.sort();
    Ok(peers)
}
