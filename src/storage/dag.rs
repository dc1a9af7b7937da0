//! The event DAG, read from the stored PDUs: an event's `prev_events` and
//! `auth_events` are in its `json` (in `events` or `outliers`), so placing
//! or holding an event writes no edge rows (docs/federation-storage.md, "DAG
//! edges"). Auth chains over them, the `prev_events` of a PDU, and which ids
//! of a list we do not hold.

use std::collections::HashSet;

use serde::Deserialize;
use sqlx::{AnyConnection, Connection};

use super::outliers::{Held, IDS_PER_QUERY, held_by_ids, in_list};
use super::{Backend, Db};
use crate::error::{Error, Result};

/// The most event ids an auth chain may have: past it, [`auth_chain`]
/// refuses rather than load it (a room's auth chain is its history of
/// power, join rule and member events: large rooms have tens of thousands).
pub const MAX_AUTH_CHAIN: usize = 100_000;

/// The `prev_events` of a stored PDU, in its order (bare ids, or the ids
/// of room versions 1 and 2's `[id, hashes]` pairs).
pub fn prev_events_of(json: &str) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Prevs {
        #[serde(default)]
        prev_events: Vec<Reference>,
    }
    let prevs: Prevs =
        serde_json::from_str(json).map_err(|e| Error::Internal(format!("stored pdu prev_events: {e}")))?;
    Ok(prevs.prev_events.into_iter().map(Reference::into_id).collect())
}

/// An entry of `prev_events` or `auth_events` as stored.
#[derive(Deserialize)]
#[serde(untagged)]
enum Reference {
    Id(String),
    Pair(String, serde::de::IgnoredAny),
}

impl Reference {
    fn into_id(self) -> String {
        match self {
            Self::Id(id) | Self::Pair(id, _) => id,
        }
    }
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
    let mut conn = db.read_conn().await?;
    match db.backend {
        Backend::Sqlite => auth_chain_ids_tx(conn.conn(), db.backend, event_ids, cap).await,
        // A transaction of its own, for the setting `auth_chain_ids_tx` makes.
        Backend::Postgres => {
            let mut tx = conn.conn().begin().await?;
            let ids = auth_chain_ids_tx(&mut tx, db.backend, event_ids, cap).await?;
            tx.commit().await?;
            Ok(ids)
        }
    }
}

/// [`auth_chain_ids`] inside a transaction on a database of `backend`,
/// refusing chains of more than `cap` ids. On PostgreSQL it turns JIT
/// compilation off for the rest of the transaction: the planner sees a
/// recursion of unknown depth, estimates it in the millions of rows and
/// compiles the query, which cost 150-250 ms more than running it (5,000
/// ids) on the machine of docs/federation-storage.md.
pub async fn auth_chain_ids_tx(
    conn: &mut AnyConnection,
    backend: Backend,
    event_ids: &[&str],
    cap: usize,
) -> Result<Vec<String>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = match backend {
        Backend::Sqlite => sqlite_auth_chain_sql(),
        Backend::Postgres => {
            sqlx::query("SET LOCAL jit = off").execute(&mut *conn).await?;
            postgres_auth_chain_sql()
        }
    };
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

/// The auth chain query on SQLite. The seeds come as one JSON array
/// parameter, however many there are. Each step seeks each id found by the
/// step before in `events` and in `outliers` (a recursive term per table)
/// and reads the ids its PDU lists under `auth_events`: a bare id, or the
/// first element of a v1/v2 `[id, hashes]` pair; anything else gives
/// nothing. UNION (not UNION ALL) drops ids already found, so the recursion
/// ends at the chain's roots and on cycles; the LIMIT ends it early (SQLite
/// stops the recursion once the limit's rows are out).
fn sqlite_auth_chain_sql() -> String {
    let refs = |tables: &str, filter: &str| {
        format!(
            "SELECT CASE j.type WHEN 'text' THEN j.value ELSE json_extract(j.value, '$[0]') END \
             FROM {tables}, json_each(h.json, '$.auth_events') j \
             WHERE {filter}(j.type = 'text' OR (j.type = 'array' AND json_type(j.value, '$[0]') = 'text'))"
        )
    };
    let seeded = "h.event_id IN (SELECT value FROM json_each($1)) AND ";
    format!(
        "WITH RECURSIVE chain(id) AS ( \
             {} UNION {} UNION {} UNION {} \
         ) SELECT id FROM chain LIMIT $2 + 0",
        refs("events h", seeded),
        refs("outliers h", seeded),
        refs("chain c JOIN events h ON h.event_id = c.id", ""),
        refs("chain c JOIN outliers h ON h.event_id = c.id", ""),
    )
}

/// The auth chain query on PostgreSQL: as on SQLite, with each id's PDU
/// looked up in a LATERAL subquery (an index seek per table). PostgreSQL
/// refuses to parse a `\u0000` escape (which a display name may carry): it
/// is neutralised first; ids never contain one. An element that is an
/// `[id, hashes]` pair comes out as its JSON text and gives its first
/// element. (`auth_events` is an array in every PDU we store: PDUs from
/// elsewhere are parsed as one before they are kept.) PostgreSQL evaluates
/// a WITH query only as far as its reader fetches, so the LIMIT ends the
/// recursion early here too.
fn postgres_auth_chain_sql() -> String {
    let refs = |id: &str| {
        format!(
            "SELECT CASE WHEN left(p, 1) = '[' THEN p::json ->> 0 ELSE p END AS id \
             FROM (SELECT e.json FROM events e WHERE e.event_id = {id} \
                   UNION ALL SELECT o.json FROM outliers o WHERE o.event_id = {id}) h \
             CROSS JOIN LATERAL json_array_elements_text( \
                 replace(h.json, '\\u0000', '\\ufffd')::json -> 'auth_events') p"
        )
    };
    format!(
        "WITH RECURSIVE chain(id) AS ( \
             SELECT r.id FROM json_array_elements_text($1::json) s(id) CROSS JOIN LATERAL ({}) r \
             WHERE r.id IS NOT NULL \
             UNION SELECT r.id FROM chain c CROSS JOIN LATERAL ({}) r WHERE r.id IS NOT NULL \
         ) SELECT id FROM chain LIMIT $2 + 0",
        refs("s.id"),
        refs("c.id"),
    )
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
