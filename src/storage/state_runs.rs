//! `state_runs`: the state after every placed event, run-length encoded.
//!
//! A row `(room, type, state_key, seq, event_id)` exists iff the state after
//! the event at `seq` differs in that key from the state at the previous
//! placed position; `event_id` NULL says the key is absent from there on.
//! The state as of a seq is, per key, the latest row at or below it (the
//! readers are in [`super::events`]: `state_at`, `state_event_at`,
//! `state_changed_between`, ...). The keys those readers visit are the
//! room's keys in `room_state`: every key that has a row here must have a
//! `room_state` row too (see [`super::events::set_current`]).
//!
//! On a linear room there is exactly one row per state event, written by
//! [`super::events::insert`]; [`write_snapshot`] writes a whole state at one
//! position (the first position of a room joined over federation).

use std::collections::{BTreeMap, HashMap};

use sqlx::AnyConnection;

use crate::error::Result;

/// Rows per INSERT statement (5 parameters each).
const ROWS_PER_INSERT: usize = 100;

/// One row: the state after `seq` holds `event_id` for (type, key), or
/// nothing (`None`); replaces a row the position had for the key (so that
/// placing an event and writing its position's snapshot may come in either
/// order).
pub async fn record(
    conn: &mut AnyConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    seq: i64,
    event_id: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO state_runs (room_id, event_type, state_key, seq, event_id) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (room_id, event_type, state_key, seq) DO UPDATE SET event_id = excluded.event_id",
    )
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .bind(seq)
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes the state after position `seq` exactly `entries` (type, state key,
/// event id; a key listed twice takes its last entry): whatever rows `seq`
/// had are replaced by one row per key whose event differs from the state
/// at the previous position, and a NULL row per key that state had and
/// `entries` lacks. For a room with no state yet, that is a row per entry.
/// Returns the number of rows written.
///
/// The events named must be held (placed or outliers) for the readers to
/// return them, and every key must be in `room_state` for them to visit it
/// ([`super::events::set_current`] for a snapshot at the head). Positions
/// after `seq` are not touched: at the head there are none; elsewhere the
/// caller rewrites the next position's rows against this state.
pub async fn write_snapshot(
    conn: &mut AnyConnection,
    room_id: &str,
    seq: i64,
    entries: &[(&str, &str, &str)],
) -> Result<usize> {
    sqlx::query("DELETE FROM state_runs WHERE room_id = $1 AND seq = $2")
        .bind(room_id)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    let before = state_before(conn, room_id, seq).await?;
    let wanted: BTreeMap<(&str, &str), &str> = entries.iter().map(|(t, k, e)| ((*t, *k), *e)).collect();

    let mut rows: Vec<(&str, &str, Option<&str>)> = Vec::new();
    for (&(t, k), &e) in &wanted {
        let unchanged =
            before.get(&(t.to_owned(), k.to_owned())).is_some_and(|held| held.as_deref() == Some(e));
        if !unchanged {
            rows.push((t, k, Some(e)));
        }
    }
    for ((t, k), held) in &before {
        if held.is_some() && !wanted.contains_key(&(t.as_str(), k.as_str())) {
            rows.push((t, k, None));
        }
    }
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut sql =
            String::from("INSERT INTO state_runs (room_id, event_type, state_key, seq, event_id) VALUES ");
        for i in 0..chunk.len() {
            let p = i * 5;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("(${}, ${}, ${}, ${}, ${})", p + 1, p + 2, p + 3, p + 4, p + 5));
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (t, k, e) in chunk {
            query = query.bind(room_id).bind(*t).bind(*k).bind(seq).bind(*e);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(rows.len())
}

/// The state at the last position before `seq`, per key (`None`: absent),
/// over every key the room has rows for. Reads all the room's rows below
/// `seq`: for snapshots, which are rare, not for serving.
async fn state_before(
    conn: &mut AnyConnection,
    room_id: &str,
    seq: i64,
) -> Result<HashMap<(String, String), Option<String>>> {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT r.event_type, r.state_key, r.event_id FROM state_runs r \
         WHERE r.room_id = $1 AND r.seq < $2 AND NOT EXISTS \
           (SELECT 1 FROM state_runs y WHERE y.room_id = r.room_id AND y.event_type = r.event_type \
              AND y.state_key = r.state_key AND y.seq > r.seq AND y.seq < $2)",
    )
    .bind(room_id)
    .bind(seq)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(t, k, e)| ((t, k), e)).collect())
}

/// The keys where the state after `event_id` differs from the state at its
/// position (see migration 0033): (type, state key, event id or `None` for
/// absent). Empty for an event on the room's main line.
pub async fn fork_state(
    conn: &mut AnyConnection,
    event_id: &str,
) -> Result<Vec<(String, String, Option<String>)>> {
    Ok(sqlx::query_as("SELECT event_type, state_key, state_event_id FROM fork_states WHERE event_id = $1")
        .bind(event_id)
        .fetch_all(conn)
        .await?)
}

/// Records where the state after `event_id` differs from the state at its
/// position (`rows`: type, state key, event id or `None` for absent).
pub async fn put_fork_state(
    conn: &mut AnyConnection,
    event_id: &str,
    rows: &[(&str, &str, Option<&str>)],
) -> Result<()> {
    for (event_type, state_key, state_event_id) in rows {
        sqlx::query(
            "INSERT INTO fork_states (event_id, event_type, state_key, state_event_id) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (event_id, event_type, state_key) DO UPDATE SET state_event_id = excluded.state_event_id",
        )
        .bind(event_id)
        .bind(*event_type)
        .bind(*state_key)
        .bind(*state_event_id)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The room's state after position `seq` as ids: (type, state key, event
/// id) for each key present there. One seek per key of the room (the keys
/// are those of `room_state`), the events themselves not read.
pub async fn ids_at(
    conn: &mut AnyConnection,
    room_id: &str,
    seq: i64,
) -> Result<Vec<(String, String, String)>> {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT s.event_type, s.state_key, \
           (SELECT r.event_id FROM state_runs r WHERE r.room_id = s.room_id AND r.event_type = s.event_type \
              AND r.state_key = s.state_key AND r.seq <= $2 ORDER BY r.seq DESC LIMIT 1) \
         FROM room_state s WHERE s.room_id = $1",
    )
    .bind(room_id)
    .bind(seq)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().filter_map(|(t, k, e)| Some((t, k, e?))).collect())
}

/// The keys with a row in `(lo, hi]`: where the room's state after `hi`
/// may differ from the state after `lo` (one range scan, whatever the size
/// of the state).
pub async fn keys_changed_between(
    conn: &mut AnyConnection,
    room_id: &str,
    lo: i64,
    hi: i64,
) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT event_type, state_key FROM state_runs WHERE room_id = $1 AND seq > $2 AND seq <= $3",
    )
    .bind(room_id)
    .bind(lo)
    .bind(hi)
    .fetch_all(conn)
    .await?)
}

/// The event holding (type, state key) in the room's state after `seq`
/// (`None`: absent), one seek.
pub async fn id_at(
    conn: &mut AnyConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    seq: i64,
) -> Result<Option<String>> {
    let row: Option<Option<String>> = sqlx::query_scalar(
        "SELECT event_id FROM state_runs WHERE room_id = $1 AND event_type = $2 AND state_key = $3 \
           AND seq <= $4 ORDER BY seq DESC LIMIT 1",
    )
    .bind(room_id)
    .bind(event_type)
    .bind(state_key)
    .bind(seq)
    .fetch_optional(conn)
    .await?;
    Ok(row.flatten())
}
