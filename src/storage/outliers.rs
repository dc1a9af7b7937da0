//! `outliers`: events we hold that are not on any room's line (the auth
//! chain and state of a send_join answer, remote invites, out-of-band
//! leaves), and the lookups of "any event we hold", placed or outlier, for
//! federation. Client-facing lookups ([`super::events::by_id`]) never return
//! outliers.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// A new outlier.
#[derive(Debug)]
pub struct NewOutlier<'a> {
    /// Event id.
    pub event_id: &'a str,
    /// Its room.
    pub room_id: &'a str,
    /// Type.
    pub event_type: &'a str,
    /// State key.
    pub state_key: Option<&'a str>,
    /// Sender.
    pub sender: &'a str,
    /// `origin_server_ts`.
    pub origin_server_ts: i64,
    /// The PDU as received.
    pub json: &'a str,
    /// When we received it.
    pub received_ts: i64,
}

/// Stores an outlier (its edges are in its PDU); false (and nothing written) when
/// the event is held already, as an outlier or placed.
pub async fn insert(conn: &mut AnyConnection, o: &NewOutlier<'_>) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO outliers (event_id, room_id, event_type, state_key, sender, origin_server_ts, json, received_ts) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE NOT EXISTS (SELECT 1 FROM events WHERE event_id = $1) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(o.event_id)
    .bind(o.room_id)
    .bind(o.event_type)
    .bind(o.state_key)
    .bind(o.sender)
    .bind(o.origin_server_ts)
    .bind(o.json)
    .bind(o.received_ts)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Forgets an outlier that is being placed (its row in `events` takes
/// over, with the same PDU).
pub async fn remove(conn: &mut AnyConnection, event_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM outliers WHERE event_id = $1").bind(event_id).execute(conn).await?;
    Ok(())
}

/// [`remove`] of each of `ids`, a few statements for them all.
pub async fn remove_many(conn: &mut AnyConnection, ids: &[&str]) -> Result<()> {
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let sql = format!("DELETE FROM outliers WHERE event_id {}", in_list(chunk.len()));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// An event we hold, placed on a room's line or an outlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Event id.
    pub event_id: String,
    /// Its room.
    pub room_id: String,
    /// Its seq; `None` for an outlier.
    pub seq: Option<i64>,
    /// The full PDU.
    pub json: String,
}

type HeldRow = (String, String, Option<i64>, String);

/// Placed events first, so that an event found in both is taken as placed.
fn held_sql(condition: &str) -> String {
    format!(
        "SELECT event_id, room_id, seq, json FROM events WHERE event_id {condition} \
         UNION ALL SELECT event_id, room_id, NULL, json FROM outliers WHERE event_id {condition}"
    )
}

fn pick(rows: Vec<HeldRow>) -> Option<Held> {
    let mut rows: Vec<Held> = rows
        .into_iter()
        .map(|(event_id, room_id, seq, json)| Held { event_id, room_id, seq, json })
        .collect();
    rows.sort_by_key(|h| h.seq.is_none());
    rows.into_iter().next()
}

/// Any event we hold by id (for federation: clients use [`super::events::by_id`]).
pub async fn held_by_id(db: &Db, event_id: &str) -> Result<Option<Held>> {
    let mut conn = db.pool.acquire().await?;
    held_by_id_tx(&mut conn, event_id).await
}

/// [`held_by_id`] inside a transaction.
pub async fn held_by_id_tx(conn: &mut AnyConnection, event_id: &str) -> Result<Option<Held>> {
    let rows: Vec<HeldRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(held_sql("= $1"))).bind(event_id).fetch_all(conn).await?;
    Ok(pick(rows))
}

/// Ids per `IN (...)` list.
pub(super) const IDS_PER_QUERY: usize = 500;

/// `IN ($1, ..., $n)`.
pub(super) fn in_list(n: usize) -> String {
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!("IN ({})", params.join(", "))
}

/// The events we hold among `ids` (placed or outlier), in no particular
/// order, each once; ids not held are left out.
pub async fn held_by_ids(db: &Db, ids: &[&str]) -> Result<Vec<Held>> {
    held_by_ids_tx(db.read_conn().await?.conn(), ids).await
}

/// [`held_by_ids`] inside a transaction.
pub async fn held_by_ids_tx(conn: &mut AnyConnection, ids: &[&str]) -> Result<Vec<Held>> {
    let mut found = std::collections::HashMap::new();
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let sql = held_sql(&in_list(chunk.len()));
        let mut query = sqlx::query_as::<_, HeldRow>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        for (event_id, room_id, seq, json) in query.fetch_all(&mut *conn).await? {
            let held = Held { event_id: event_id.clone(), room_id, seq, json };
            match found.get(&event_id) {
                Some(Held { seq: Some(_), .. }) => {}
                _ => {
                    found.insert(event_id, held);
                }
            }
        }
    }
    Ok(found.into_values().collect())
}

/// Marks the outlier `event_id` of `room_id` as kept off the line:
/// soft-failed (`rejected`: `None`) or rejected for that reason; its state
/// after is read at `base_seq` (see migration 0031).
pub async fn mark_off_line(
    conn: &mut AnyConnection,
    event_id: &str,
    room_id: &str,
    base_seq: i64,
    rejected: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO off_line_events (event_id, room_id, base_seq, rejected_reason) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(room_id)
    .bind(base_seq)
    .bind(rejected)
    .execute(conn)
    .await?;
    Ok(())
}

/// An event kept off the line (soft-failed or rejected): its room, base
/// position and whether it was rejected.
#[derive(Debug, Clone)]
pub struct OffLine {
    /// Its room.
    pub room_id: String,
    /// The position its state after is read over.
    pub base_seq: i64,
    /// It was rejected (else soft-failed).
    pub rejected: bool,
}

/// Where an event we hold stands: placed on a room's line, or kept off it.
#[derive(Debug, Clone)]
pub enum Standing {
    /// Placed in `room_id` at `seq`.
    Placed { room_id: String, seq: i64 },
    /// Kept off the line.
    OffLine(OffLine),
}

/// Where each of `ids` stands, in one read (an id neither placed nor kept
/// off the line is absent; one that is both counts as placed).
pub async fn standing(
    conn: &mut AnyConnection,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, Standing>> {
    let mut found = std::collections::HashMap::new();
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let list = in_list(chunk.len());
        let sql = format!(
            "SELECT event_id, room_id, seq, CAST(NULL AS TEXT), CAST(0 AS BIGINT) FROM events WHERE event_id {list} \
             UNION ALL SELECT event_id, room_id, base_seq, rejected_reason, CAST(1 AS BIGINT) \
             FROM off_line_events WHERE event_id {list}"
        );
        let mut query =
            sqlx::query_as::<_, (String, String, i64, Option<String>, i64)>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        for (event_id, room_id, seq, reason, off) in query.fetch_all(&mut *conn).await? {
            let standing = if off == 0 {
                Standing::Placed { room_id, seq }
            } else {
                Standing::OffLine(OffLine { room_id, base_seq: seq, rejected: reason.is_some() })
            };
            match found.get(&event_id) {
                Some(Standing::Placed { .. }) => {}
                _ => {
                    found.insert(event_id, standing);
                }
            }
        }
    }
    Ok(found)
}

/// The record of an event kept off the line, if it is one.
pub async fn off_line(conn: &mut AnyConnection, event_id: &str) -> Result<Option<OffLine>> {
    let row: Option<(String, i64, Option<String>)> =
        sqlx::query_as("SELECT room_id, base_seq, rejected_reason FROM off_line_events WHERE event_id = $1")
            .bind(event_id)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(|(room_id, base_seq, reason)| OffLine { room_id, base_seq, rejected: reason.is_some() }))
}
