//! The event DAG: `event_edges` (the `prev_events` of every placed event)
//! and `event_auth_edges` (the `auth_events` of every placed event and
//! outlier), auth chains over them, and which ids of a list we do not hold.

use std::collections::HashSet;

use sqlx::AnyConnection;

use super::outliers::{Held, IDS_PER_QUERY, held_by_ids, in_list};
use super::{Backend, Db};
use crate::error::{Error, Result};

/// The most event ids an auth chain may have: past it, [`auth_chain`]
/// refuses rather than load it (a room's auth chain is its history of
/// power, join rule and member events: large rooms have tens of thousands).
pub const MAX_AUTH_CHAIN: usize = 100_000;

/// Records an event's edges (ids named twice once); either list may be empty.
pub async fn insert_edges(
    conn: &mut AnyConnection,
    event_id: &str,
    prev_events: &[&str],
    auth_events: &[&str],
) -> Result<()> {
    insert_pairs(conn, "event_edges", "prev_id", event_id, prev_events).await?;
    insert_pairs(conn, "event_auth_edges", "auth_id", event_id, auth_events).await
}

async fn insert_pairs(
    conn: &mut AnyConnection,
    table: &str,
    column: &str,
    event_id: &str,
    ids: &[&str],
) -> Result<()> {
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("($1, ${})", i + 2)).collect();
        let sql = format!(
            "INSERT INTO {table} (event_id, {column}) VALUES {} ON CONFLICT DO NOTHING",
            values.join(", ")
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(event_id);
        for id in chunk {
            query = query.bind(*id);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// The auth chain of `event_ids`: every event reachable from them through
/// `auth_events`, transitively (the events themselves only where another's
/// chain reaches them), with the PDUs we hold, placed or outlier, in no
/// particular order. Ids the edges name that we do not hold are left out
/// (see [`missing`]). One recursive query; past [`MAX_AUTH_CHAIN`] ids it
/// stops and answers [`Error::TooLarge`].
pub async fn auth_chain(db: &Db, event_ids: &[&str]) -> Result<Vec<Held>> {
    let ids = auth_chain_ids(db, event_ids).await?;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    held_by_ids(db, &refs).await
}

/// The ids of [`auth_chain`], in no particular order.
pub async fn auth_chain_ids(db: &Db, event_ids: &[&str]) -> Result<Vec<String>> {
    auth_chain_ids_capped(db, event_ids, MAX_AUTH_CHAIN).await
}

/// [`auth_chain_ids`] refusing chains of more than `cap` ids.
pub(super) async fn auth_chain_ids_capped(db: &Db, event_ids: &[&str], cap: usize) -> Result<Vec<String>> {
    auth_chain_ids_tx(db.read_conn().await?.conn(), db.backend, event_ids, cap).await
}

/// [`auth_chain_ids`] inside a transaction on a database of `backend`,
/// refusing chains of more than `cap` ids.
pub async fn auth_chain_ids_tx(
    conn: &mut AnyConnection,
    backend: Backend,
    event_ids: &[&str],
    cap: usize,
) -> Result<Vec<String>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    // The seeds come as one JSON array parameter, however many there are.
    // Each step looks up the edges of the ids found by the step before, one
    // index seek each: PostgreSQL is kept from hashing the whole edge table
    // for it by the LATERAL subquery (OFFSET 0 keeps it from being flattened
    // into a join); SQLite has no LATERAL and always seeks.
    let (seeds, step) = match backend {
        Backend::Sqlite => (
            "SELECT value FROM json_each($1)",
            "SELECT a.auth_id FROM chain c JOIN event_auth_edges a ON a.event_id = c.id",
        ),
        Backend::Postgres => (
            "SELECT json_array_elements_text($1::json)",
            "SELECT a.auth_id FROM chain c CROSS JOIN LATERAL \
               (SELECT x.auth_id FROM event_auth_edges x WHERE x.event_id = c.id OFFSET 0) a",
        ),
    };
    // UNION (not UNION ALL) drops ids already found, so the recursion ends
    // at the chain's roots and on cycles. The LIMIT ends it early on both
    // backends: SQLite stops the recursion once the limit's rows are out,
    // PostgreSQL evaluates a WITH query only as far as its reader fetches.
    let sql = format!(
        "WITH RECURSIVE chain(id) AS ( \
             SELECT a.auth_id FROM event_auth_edges a WHERE a.event_id IN ({seeds}) \
             UNION {step} \
         ) SELECT id FROM chain LIMIT $2 + 0"
    );
    let seeds =
        serde_json::to_string(event_ids).map_err(|e| Error::Internal(format!("auth chain seeds: {e}")))?;
    let limit = i64::try_from(cap).unwrap_or(i64::MAX - 1) + 1;
    let ids: Vec<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(seeds).bind(limit).fetch_all(&mut *conn).await?;
    if ids.len() > cap {
        return Err(Error::TooLarge(format!("The auth chain has more than {cap} events")));
    }
    Ok(ids)
}

/// The ids among `event_ids` that we hold neither placed nor as outliers,
/// in their order, each once.
pub async fn missing(db: &Db, event_ids: &[&str]) -> Result<Vec<String>> {
    let mut held = HashSet::new();
    for chunk in event_ids.chunks(IDS_PER_QUERY) {
        let list = in_list(chunk.len());
        let sql = format!(
            "SELECT event_id FROM events WHERE event_id {list} UNION SELECT event_id FROM outliers WHERE event_id {list}"
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        held.extend(query.fetch_all(&mut db.reader()).await?);
    }
    let mut seen = HashSet::new();
    Ok(event_ids
        .iter()
        .filter(|id| !held.contains(**id) && seen.insert(**id))
        .map(|id| (*id).to_owned())
        .collect())
}
