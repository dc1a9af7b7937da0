//! The `room_aliases` table: local aliases, `#name:server` -> room.

use super::{Db, is_unique_violation};
use crate::error::{Error, Result};

/// Creates an alias; a taken alias is `Conflict`.
pub async fn create(db: &Db, alias: &str, room_id: &str, creator: &str, now: i64) -> Result<()> {
    let mut conn = db.pool.acquire().await?;
    create_tx(&mut conn, alias, room_id, creator, now).await
}

/// Creates an alias inside a transaction; a taken alias is `Conflict`.
pub async fn create_tx(
    conn: &mut sqlx::AnyConnection,
    alias: &str,
    room_id: &str,
    creator: &str,
    now: i64,
) -> Result<()> {
    sqlx::query("INSERT INTO room_aliases (alias, room_id, creator, created_ts) VALUES ($1, $2, $3, $4)")
        .bind(alias)
        .bind(room_id)
        .bind(creator)
        .bind(now)
        .execute(conn)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                Error::Conflict("Room alias already taken".into())
            } else {
                e.into()
            }
        })?;
    Ok(())
}

/// Resolves an alias to (room id, creator).
pub async fn get(db: &Db, alias: &str) -> Result<Option<(String, String)>> {
    Ok(sqlx::query_as("SELECT room_id, creator FROM room_aliases WHERE alias = $1")
        .bind(alias)
        .fetch_optional(&mut db.reader())
        .await?)
}

/// Deletes an alias; false if there was none.
pub async fn delete(db: &Db, alias: &str) -> Result<bool> {
    let r = sqlx::query("DELETE FROM room_aliases WHERE alias = $1").bind(alias).execute(&db.pool).await?;
    Ok(r.rows_affected() > 0)
}

/// Local aliases of a room.
pub async fn for_room(db: &Db, room_id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT alias FROM room_aliases WHERE room_id = $1 ORDER BY alias")
        .bind(room_id)
        .fetch_all(&mut db.reader())
        .await?)
}
