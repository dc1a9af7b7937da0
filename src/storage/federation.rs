//! Federation tables: which servers are in each room (`room_servers`), the
//! durable outgoing queue (`fed_outbox`, `fed_edu_outbox`,
//! `fed_destinations`) and the transactions received (`fed_inbound_txns`).
//! Typing notices never come here: the sender keeps them in memory.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// Adds `delta` to the number of `server_name`'s users joined to a room.
pub async fn add_joined(
    conn: &mut AnyConnection,
    room_id: &str,
    server_name: &str,
    delta: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO room_servers (room_id, server_name, joined) VALUES ($1, $2, $3) \
         ON CONFLICT (room_id, server_name) DO UPDATE SET joined = room_servers.joined + $3",
    )
    .bind(room_id)
    .bind(server_name)
    .bind(delta)
    .execute(conn)
    .await?;
    Ok(())
}

/// Forgets who is in a room (before the counts are made again from a state
/// received over federation).
pub async fn forget_servers(conn: &mut AnyConnection, room_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM room_servers WHERE room_id = $1").bind(room_id).execute(conn).await?;
    Ok(())
}

/// The servers with a user joined to the room, in name order.
pub async fn servers_in_room_tx(conn: &mut AnyConnection, room_id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT server_name FROM room_servers WHERE room_id = $1 AND joined > 0 ORDER BY server_name",
    )
    .bind(room_id)
    .fetch_all(conn)
    .await?)
}

/// [`servers_in_room_tx`] outside a transaction.
pub async fn servers_in_room(db: &Db, room_id: &str) -> Result<Vec<String>> {
    let mut conn = db.pool.acquire().await?;
    servers_in_room_tx(&mut conn, room_id).await
}

/// Whether `server_name` has a user joined to the room now.
pub async fn server_in_room(db: &Db, room_id: &str, server_name: &str) -> Result<bool> {
    let joined: Option<i64> = sqlx::query_scalar(SERVER_IN_ROOM)
        .bind(room_id)
        .bind(server_name)
        .fetch_optional(&mut db.reader())
        .await?;
    Ok(joined.is_some_and(|n| n > 0))
}

/// [`server_in_room`] inside a write transaction.
pub async fn server_in_room_tx(conn: &mut AnyConnection, room_id: &str, server_name: &str) -> Result<bool> {
    let joined: Option<i64> =
        sqlx::query_scalar(SERVER_IN_ROOM).bind(room_id).bind(server_name).fetch_optional(conn).await?;
    Ok(joined.is_some_and(|n| n > 0))
}

const SERVER_IN_ROOM: &str = "SELECT joined FROM room_servers WHERE room_id = $1 AND server_name = $2";

/// Queues `event_id` for each of `destinations`.
pub async fn enqueue(
    conn: &mut AnyConnection,
    destinations: &[String],
    room_id: &str,
    event_id: &str,
) -> Result<()> {
    for destination in destinations {
        sqlx::query("INSERT INTO fed_outbox (destination, room_id, event_id) VALUES ($1, $2, $3)")
            .bind(destination)
            .bind(room_id)
            .bind(event_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The destinations with something queued.
pub async fn destinations_with_work(db: &Db) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT destination FROM fed_outbox UNION SELECT destination FROM fed_edu_outbox")
        .fetch_all(&mut db.reader())
        .await?)
}

/// Queues `edu` (its JSON) for each of `destinations`; what was queued
/// under the same `ekey` and not yet taken into a transaction is replaced.
pub async fn enqueue_edu(db: &Db, destinations: &[String], ekey: &str, edu: &str) -> Result<()> {
    let mut tx = db.begin_write().await?;
    enqueue_edu_tx(tx.conn(), destinations, ekey, edu).await?;
    tx.commit().await
}

/// [`enqueue_edu`] inside a transaction (to-device messages are queued in
/// the one that takes the sender's request).
pub async fn enqueue_edu_tx(
    conn: &mut AnyConnection,
    destinations: &[String],
    ekey: &str,
    edu: &str,
) -> Result<()> {
    for destination in destinations {
        sqlx::query("DELETE FROM fed_edu_outbox WHERE destination = $1 AND ekey = $2 AND txn_id IS NULL")
            .bind(destination)
            .bind(ekey)
            .execute(&mut *conn)
            .await?;
        sqlx::query("INSERT INTO fed_edu_outbox (destination, ekey, edu) VALUES ($1, $2, $3)")
            .bind(destination)
            .bind(ekey)
            .bind(edu)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// How many EDUs wait (queued or in a transaction not yet answered) for
/// `destination` under a key starting with `prefix`, counted up to `cap`.
pub async fn queued_edus_with_prefix(
    conn: &mut AnyConnection,
    destination: &str,
    prefix: &str,
    cap: i64,
) -> Result<i64> {
    // substr, not LIKE: exact and byte-wise on both backends, whatever the
    // collation, and no escaping of `%` or `_` in user ids.
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT 1 AS x FROM fed_edu_outbox \
         WHERE destination = $1 AND substr(ekey, 1, $2) = $3 LIMIT $4 + 0) AS q",
    )
    .bind(destination)
    .bind(i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX))
    .bind(prefix)
    .bind(cap)
    .fetch_one(conn)
    .await?)
}

/// A transaction to send: its id, its events (room id, event id) and its
/// EDUs (JSON), in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The transaction id.
    pub txn_id: String,
    /// The events.
    pub pdus: Vec<(String, String)>,
    /// The EDUs.
    pub edus: Vec<String>,
    /// Begun before (an attempt failed or went unanswered): it must be sent
    /// again exactly as it was, nothing added (the destination may answer a
    /// txn id it has seen from its cache, dropping anything new).
    pub retry: bool,
    /// A new transaction's rows, read and not marked (see
    /// [`next_transaction`]); `None` for a retry, whose rows are marked.
    pub rows: Option<Rows>,
}

/// The rows a new transaction carries: ids in `fed_outbox` and in
/// `fed_edu_outbox`, ascending.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rows {
    pub pdu_ids: Vec<i64>,
    pub edu_ids: Vec<i64>,
}

impl Rows {
    /// The transaction id of these rows: the same rows always give the
    /// same id, other rows another (row ids are never reused), so a
    /// destination that answers a repeated id from its cache only ever does
    /// so for content it has taken already. `r`, the first row's id, and a
    /// hash of all of them; never a former id (a row id, `e` and one).
    fn txn_id(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.pdu_ids.hash(&mut h);
        self.edu_ids.hash(&mut h);
        let first = self.pdu_ids.first().or(self.edu_ids.first()).copied().unwrap_or_default();
        format!("r{first}-{:016x}", h.finish())
    }
}

/// The transaction to send to `destination` next, read without a write:
/// the one begun before (a retry: same id, same events and EDUs), else up
/// to `limit` queued events and `edu_limit` queued EDUs not yet marked,
/// under the id of those rows ([`Rows`]), left unmarked: once the
/// destination has them they go ([`rows_sent`]); if the attempt fails
/// they are marked as begun ([`rows_begun`]). `None` when nothing is
/// queued. The write that marks rows before every send would sit between
/// a commit and its delivery.
pub async fn next_transaction(
    db: &Db,
    destination: &str,
    limit: i64,
    edu_limit: i64,
) -> Result<Option<Outgoing>> {
    // One statement (it sits between a commit and its delivery): every
    // begun row, then the first unmarked ones of each table.
    let rows: Vec<QueueRow> = sqlx::query_as(
        "SELECT CAST(0 AS BIGINT), id, txn_id, room_id, event_id, NULL FROM fed_outbox \
               WHERE destination = $1 AND txn_id IS NOT NULL \
             UNION ALL SELECT CAST(1 AS BIGINT), id, txn_id, NULL, NULL, edu FROM fed_edu_outbox \
               WHERE destination = $1 AND txn_id IS NOT NULL \
             UNION ALL SELECT * FROM (SELECT CAST(0 AS BIGINT), id, CAST(NULL AS TEXT), room_id, event_id, \
               CAST(NULL AS TEXT) FROM fed_outbox \
               WHERE destination = $1 AND txn_id IS NULL ORDER BY id LIMIT $2 + 0) AS p \
             UNION ALL SELECT * FROM (SELECT CAST(1 AS BIGINT), id, CAST(NULL AS TEXT), CAST(NULL AS TEXT), \
               CAST(NULL AS TEXT), edu FROM fed_edu_outbox \
               WHERE destination = $1 AND txn_id IS NULL ORDER BY id LIMIT $3 + 0) AS e",
    )
    .bind(destination)
    .bind(limit)
    .bind(edu_limit)
    .fetch_all(&mut db.reader())
    .await?;
    let (mut begun, fresh): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.2.is_some());
    // The transaction begun first (its lowest row), exactly as it was.
    if let Some(txn_id) = begun.iter().min_by_key(|r| r.1).and_then(|r| r.2.clone()) {
        begun.retain(|r| r.2.as_deref() == Some(txn_id.as_str()));
        begun.sort_by_key(|r| r.1);
        let (pdus, edus) = split(begun);
        let pdus = pdus.into_iter().map(|(_, room, event)| (room, event)).collect();
        let edus = edus.into_iter().map(|(_, edu)| edu).collect();
        return Ok(Some(Outgoing { txn_id, pdus, edus, retry: true, rows: None }));
    }
    let (pdu_rows, edu_rows) = split(fresh);
    if pdu_rows.is_empty() && edu_rows.is_empty() {
        return Ok(None);
    }
    let rows = Rows {
        pdu_ids: pdu_rows.iter().map(|r| r.0).collect(),
        edu_ids: edu_rows.iter().map(|r| r.0).collect(),
    };
    Ok(Some(Outgoing {
        txn_id: rows.txn_id(),
        pdus: pdu_rows.into_iter().map(|(_, room, event)| (room, event)).collect(),
        edus: edu_rows.into_iter().map(|(_, edu)| edu).collect(),
        retry: false,
        rows: Some(rows),
    }))
}

/// A row of [`next_transaction`]'s statement: its table (0 events, 1
/// EDUs), id, txn id when begun, and the event's room and id or the EDU.
type QueueRow = (i64, i64, Option<String>, Option<String>, Option<String>, Option<String>);

/// Queue rows of [`next_transaction`]'s statement, apart: events
/// `(id, room, event)` and EDUs `(id, edu)`, each in id order.
#[allow(clippy::type_complexity)]
fn split(rows: Vec<QueueRow>) -> (Vec<(i64, String, String)>, Vec<(i64, String)>) {
    let mut pdus = Vec::new();
    let mut edus = Vec::new();
    for (table, id, _, room, event, edu) in rows {
        if table == 0 {
            pdus.push((id, room.unwrap_or_default(), event.unwrap_or_default()));
        } else {
            edus.push((id, edu.unwrap_or_default()));
        }
    }
    pdus.sort_by_key(|r| r.0);
    edus.sort_by_key(|r| r.0);
    (pdus, edus)
}

/// The destination took a new transaction of `rows`: they go (an EDU
/// replaced meanwhile is gone already), and its failures are forgotten.
pub async fn rows_sent(db: &Db, destination: &str, rows: &Rows) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for (table, ids) in [("fed_outbox", &rows.pdu_ids), ("fed_edu_outbox", &rows.edu_ids)] {
        for chunk in ids.chunks(100) {
            let marks: Vec<String> = (2..chunk.len() + 2).map(|i| format!("${i}")).collect();
            let sql = format!("DELETE FROM {table} WHERE destination = $1 AND id IN ({})", marks.join(", "));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(destination);
            for id in chunk {
                query = query.bind(id);
            }
            query.execute(tx.conn()).await?;
        }
    }
    sqlx::query("DELETE FROM fed_destinations WHERE server_name = $1")
        .bind(destination)
        .execute(tx.conn())
        .await?;
    tx.commit().await
}

/// An attempt at a new transaction of `rows` failed or went unanswered:
/// exactly those rows (those still there) are marked as begun under
/// `txn_id`, so that every retry carries them and nothing else.
pub async fn rows_begun(db: &Db, destination: &str, txn_id: &str, rows: &Rows) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for (table, ids) in [("fed_outbox", &rows.pdu_ids), ("fed_edu_outbox", &rows.edu_ids)] {
        for chunk in ids.chunks(100) {
            let marks: Vec<String> = (3..chunk.len() + 3).map(|i| format!("${i}")).collect();
            let sql = format!(
                "UPDATE {table} SET txn_id = $1 WHERE destination = $2 AND txn_id IS NULL AND id IN ({})",
                marks.join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(txn_id).bind(destination);
            for id in chunk {
                query = query.bind(id);
            }
            query.execute(tx.conn()).await?;
        }
    }
    tx.commit().await
}

/// The destination accepted transaction `txn_id`: its rows go, and the
/// destination's failures are forgotten.
pub async fn transaction_sent(db: &Db, destination: &str, txn_id: &str) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for table in ["fed_outbox", "fed_edu_outbox"] {
        let sql = format!("DELETE FROM {table} WHERE destination = $1 AND txn_id = $2");
        sqlx::query(sqlx::AssertSqlSafe(sql)).bind(destination).bind(txn_id).execute(tx.conn()).await?;
    }
    sqlx::query("DELETE FROM fed_destinations WHERE server_name = $1")
        .bind(destination)
        .execute(tx.conn())
        .await?;
    tx.commit().await
}

/// A send to `destination` failed: counts the failure and sets when to try
/// again; answers that time (ms since the epoch).
pub async fn transaction_failed(
    db: &Db,
    destination: &str,
    now: i64,
    backoff: impl Fn(i64) -> i64,
) -> Result<i64> {
    let mut tx = db.begin_write().await?;
    let failures: i64 = sqlx::query_scalar("SELECT failures FROM fed_destinations WHERE server_name = $1")
        .bind(destination)
        .fetch_optional(tx.conn())
        .await?
        .unwrap_or(0)
        + 1;
    let retry_at = now + backoff(failures);
    sqlx::query(
        "INSERT INTO fed_destinations (server_name, failures, retry_at) VALUES ($1, $2, $3) \
         ON CONFLICT (server_name) DO UPDATE SET failures = $2, retry_at = $3",
    )
    .bind(destination)
    .bind(failures)
    .bind(retry_at)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(retry_at)
}

/// Keeps at most `cap` events queued for `destination` and not yet taken
/// into a transaction: past it, only the newest event of each room stays
/// (the destination fills the rest itself when it is back). The transaction
/// under way, if any, is kept whole (a retry sends the same). Answers how
/// many were dropped.
pub async fn compact_queue(db: &Db, destination: &str, cap: i64) -> Result<u64> {
    let queued: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM fed_outbox WHERE destination = $1 AND txn_id IS NULL")
            .bind(destination)
            .fetch_one(&mut db.reader())
            .await?;
    if queued <= cap {
        return Ok(0);
    }
    let mut tx = db.begin_write().await?;
    let done = sqlx::query(
        "DELETE FROM fed_outbox WHERE destination = $1 AND txn_id IS NULL AND id NOT IN            (SELECT MAX(id) FROM fed_outbox WHERE destination = $1 AND txn_id IS NULL GROUP BY room_id)",
    )
    .bind(destination)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// What the sender must know of `destination` before it sends: when it may
/// be tried again (`None`: no failure is recorded) and whether anything is
/// queued for it in the database (taken into a transaction or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestinationState {
    /// When to try again, ms since the epoch; `None`: no failure recorded.
    pub retry_at: Option<i64>,
    /// Rows wait in `fed_outbox` or `fed_edu_outbox`.
    pub queued: bool,
}

/// [`DestinationState`] of `destination`, in one read (no write slot:
/// a transaction of in-memory EDUs alone needs nothing more).
pub async fn destination_state(db: &Db, destination: &str) -> Result<DestinationState> {
    let (retry_at, queued): (Option<i64>, i64) = sqlx::query_as(
        "SELECT (SELECT retry_at FROM fed_destinations WHERE server_name = $1), \
           (SELECT COUNT(*) FROM (SELECT 1 AS x FROM fed_outbox WHERE destination = $1 LIMIT 1) AS p) \
           + (SELECT COUNT(*) FROM (SELECT 1 AS x FROM fed_edu_outbox WHERE destination = $1 LIMIT 1) AS e)",
    )
    .bind(destination)
    .fetch_one(&mut db.reader())
    .await?;
    Ok(DestinationState { retry_at, queued: queued > 0 })
}

/// Whether a failure of `destination` is recorded (it is backing off, or
/// was until its next attempt succeeds).
pub async fn backing_off(db: &Db, destination: &str) -> Result<bool> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT retry_at FROM fed_destinations WHERE server_name = $1")
            .bind(destination)
            .fetch_optional(&mut db.reader())
            .await?;
    Ok(found.is_some())
}

/// `destination` proved reachable (it called us, or answered a
/// transaction): it may be tried now. Answers whether it was backing off.
pub async fn reset_backoff(db: &Db, destination: &str) -> Result<bool> {
    let mut tx = db.begin_write().await?;
    let done = sqlx::query("DELETE FROM fed_destinations WHERE server_name = $1")
        .bind(destination)
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    Ok(done.rows_affected() > 0)
}

/// The answer given to transaction `txn_id` of `origin`, if it was received.
pub async fn inbound_txn(db: &Db, origin: &str, txn_id: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT response FROM fed_inbound_txns WHERE origin = $1 AND txn_id = $2")
        .bind(origin)
        .bind(txn_id)
        .fetch_optional(&mut db.reader())
        .await?)
}

/// Remembers the answer to a transaction (and, once an hour, forgets those
/// older than a day).
pub async fn save_inbound_txn(db: &Db, origin: &str, txn_id: &str, response: &str, now: i64) -> Result<()> {
    let mut tx = db.begin_write().await?;
    let hour = now / (3600 * 1000);
    if db.inbound_pruned_hour.swap(hour, std::sync::atomic::Ordering::Relaxed) != hour {
        sqlx::query("DELETE FROM fed_inbound_txns WHERE ts < $1")
            .bind(now - 24 * 3600 * 1000)
            .execute(tx.conn())
            .await?;
    }
    sqlx::query(
        "INSERT INTO fed_inbound_txns (origin, txn_id, response, ts) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (origin, txn_id) DO NOTHING",
    )
    .bind(origin)
    .bind(txn_id)
    .bind(response)
    .bind(now)
    .execute(tx.conn())
    .await?;
    tx.commit().await
}

/// An invite of one of our users into a room on another server, or their
/// knock on one (`membership`).
#[derive(Debug, Clone)]
pub struct RemoteInvite {
    /// The invitee.
    pub user_id: String,
    /// The room.
    pub room_id: String,
    /// The invite event's id.
    pub event_id: String,
    /// The room's version.
    pub room_version: String,
    /// The invite PDU, signed by both servers.
    pub json: String,
    /// JSON array of stripped state events (client format).
    pub stripped_state: String,
    /// The inviting server.
    pub via: String,
    /// Stream position of the last change.
    pub stream: i64,
    /// 1 once the invitee rejected it (or the knock was refused or withdrawn).
    pub rejected: i64,
    /// `invite`, or `knock` (then `json` is our knock, `via` the server
    /// that took it).
    pub membership: String,
}

type InviteRow = (String, String, String, String, String, String, String, i64, i64, String);

const INVITE_COLUMNS: &str =
    "user_id, room_id, event_id, room_version, json, stripped_state, via, stream, rejected, membership";

fn invite_from(
    (user_id, room_id, event_id, room_version, json, stripped_state, via, stream, rejected, membership): InviteRow,
) -> RemoteInvite {
    RemoteInvite {
        user_id,
        room_id,
        event_id,
        room_version,
        json,
        stripped_state,
        via,
        stream,
        rejected,
        membership,
    }
}

/// Records (or replaces) an invite of `invite.user_id` into a remote room,
/// or their knock on one (an invite replaces the knock it answers).
pub async fn put_remote_invite(db: &Db, invite: &RemoteInvite) -> Result<()> {
    sqlx::query(
        "INSERT INTO remote_invites (user_id, room_id, event_id, room_version, json, stripped_state, via, stream, rejected, membership) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9) \
         ON CONFLICT (user_id, room_id) DO UPDATE SET event_id = $3, room_version = $4, json = $5, \
           stripped_state = $6, via = $7, stream = $8, rejected = 0, membership = $9",
    )
    .bind(&invite.user_id)
    .bind(&invite.room_id)
    .bind(&invite.event_id)
    .bind(&invite.room_version)
    .bind(&invite.json)
    .bind(&invite.stripped_state)
    .bind(&invite.via)
    .bind(invite.stream)
    .bind(&invite.membership)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// The invite of `user_id` into `room_id`, if there is one.
pub async fn remote_invite(db: &Db, user_id: &str, room_id: &str) -> Result<Option<RemoteInvite>> {
    let row: Option<InviteRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {INVITE_COLUMNS} FROM remote_invites WHERE user_id = $1 AND room_id = $2"
    )))
    .bind(user_id)
    .bind(room_id)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(invite_from))
}

/// A user's remote invites changed in `(after, upto]` (all of them when
/// `after` is 0), pending and rejected.
pub async fn remote_invites_changed(
    db: &Db,
    user_id: &str,
    after: i64,
    upto: i64,
) -> Result<Vec<RemoteInvite>> {
    let rows: Vec<InviteRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {INVITE_COLUMNS} FROM remote_invites WHERE user_id = $1 AND stream > $2 AND stream <= $3 ORDER BY stream"
    )))
    .bind(user_id)
    .bind(after)
    .bind(upto)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows.into_iter().map(invite_from).collect())
}

/// The invitee turned the invite down (at stream position `stream`).
pub async fn reject_remote_invite(db: &Db, user_id: &str, room_id: &str, stream: i64) -> Result<()> {
    sqlx::query("UPDATE remote_invites SET rejected = 1, stream = $3 WHERE user_id = $1 AND room_id = $2")
        .bind(user_id)
        .bind(room_id)
        .bind(stream)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// The invite is over: the invitee joined the room.
pub async fn delete_remote_invite(conn: &mut AnyConnection, user_id: &str, room_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM remote_invites WHERE user_id = $1 AND room_id = $2")
        .bind(user_id)
        .bind(room_id)
        .execute(conn)
        .await?;
    Ok(())
}
