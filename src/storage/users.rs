//! The `users` table: one row per local account.

use super::{Db, is_unique_violation};
use crate::error::{Error, Result};

/// A stored account.
#[derive(Debug, Clone)]
pub struct UserRow {
    /// Full user id, `@localpart:server`.
    pub user_id: String,
    /// argon2id PHC string; `None` for accounts that cannot log in by password.
    pub password_hash: Option<String>,
    /// Server administrator.
    pub is_admin: bool,
    /// Deactivated accounts keep their row (the id is never reused).
    pub deactivated: bool,
}

/// Inserts a new account; a taken localpart is `UserInUse`.
pub async fn create(
    db: &Db,
    user_id: &str,
    localpart: &str,
    password_hash: Option<&str>,
    is_admin: bool,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO users (user_id, localpart, password_hash, is_admin, created_ts) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(user_id)
    .bind(localpart)
    .bind(password_hash)
    .bind(i64::from(is_admin))
    .bind(now)
    .execute(&db.pool)
    .await
    .map_err(|e| if is_unique_violation(&e) { Error::UserInUse } else { e.into() })?;
    Ok(())
}

/// Looks an account up by localpart.
pub async fn by_localpart(db: &Db, localpart: &str) -> Result<Option<UserRow>> {
    let row: Option<(String, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT user_id, password_hash, is_admin, deactivated FROM users WHERE localpart = $1",
    )
    .bind(localpart)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(|(user_id, password_hash, is_admin, deactivated)| UserRow {
        user_id,
        password_hash,
        is_admin: is_admin != 0,
        deactivated: deactivated != 0,
    }))
}

/// Whether the localpart is taken (by a live or a deactivated account).
pub async fn localpart_exists(db: &Db, localpart: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE localpart = $1")
        .bind(localpart)
        .fetch_one(&mut db.reader())
        .await?;
    Ok(n > 0)
}

/// Replaces the password hash.
pub async fn set_password_hash(db: &Db, user_id: &str, hash: &str) -> Result<()> {
    sqlx::query("UPDATE users SET password_hash = $1 WHERE user_id = $2")
        .bind(hash)
        .bind(user_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Marks the account deactivated: no login, no token resolves; the localpart
/// stays taken.
pub async fn set_deactivated(db: &Db, user_id: &str) -> Result<()> {
    sqlx::query("UPDATE users SET deactivated = 1 WHERE user_id = $1")
        .bind(user_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Deletes what the server keeps for a deactivated user alone: profile
/// fields, account data, filters, room-key backups, cross-signing keys.
pub async fn erase_private_data(db: &Db, user_id: &str) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for table in
        ["profile_fields", "account_data", "filters", "backup_keys", "backup_versions", "cross_signing_keys"]
    {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE user_id = $1")))
            .bind(user_id)
            .execute(tx.conn())
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Every profile field of a user: (field, JSON value).
pub async fn profile(db: &Db, user_id: &str) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as("SELECT field, value FROM profile_fields WHERE user_id = $1 ORDER BY field")
        .bind(user_id)
        .fetch_all(&mut db.reader())
        .await?)
}

/// Sets (`Some`) or removes (`None`) one profile field.
pub async fn set_profile_field(db: &Db, user_id: &str, field: &str, value: Option<&str>) -> Result<()> {
    match value {
        Some(v) => {
            sqlx::query(
                "INSERT INTO profile_fields (user_id, field, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (user_id, field) DO UPDATE SET value = excluded.value",
            )
            .bind(user_id)
            .bind(field)
            .bind(v)
            .execute(&db.pool)
            .await?;
        }
        None => {
            sqlx::query("DELETE FROM profile_fields WHERE user_id = $1 AND field = $2")
                .bind(user_id)
                .bind(field)
                .execute(&db.pool)
                .await?;
        }
    }
    Ok(())
}

/// The user directory in one query: users sharing a room with `searcher` (and
/// the searcher), or joined to a room whose join rule is public, whose id or
/// stored display name (JSON text, lower-cased) matches `pattern` (a
/// lower-case LIKE pattern); by user id, at most `limit`. Each with their
/// display name and avatar URL fields as stored (JSON text).
pub async fn directory_search(
    db: &Db,
    searcher: &str,
    pattern: &str,
    limit: i64,
) -> Result<Vec<(String, Option<String>, Option<String>)>> {
    Ok(sqlx::query_as(
        "WITH candidates AS ( \
           SELECT b.state_key AS user_id FROM room_state a CROSS JOIN room_state b \
            WHERE a.event_type = 'm.room.member' AND a.state_key = $1 AND a.membership = 'join' \
              AND b.room_id = a.room_id AND b.event_type = 'm.room.member' AND b.membership = 'join' \
           UNION \
           SELECT m.state_key FROM room_state m JOIN room_summaries s ON s.room_id = m.room_id \
            WHERE m.event_type = 'm.room.member' AND m.membership = 'join' AND s.join_rule = 'public' \
           UNION \
           SELECT user_id FROM users WHERE user_id = $1) \
         SELECT c.user_id, d.value, a.value FROM candidates c \
           LEFT JOIN profile_fields d ON d.user_id = c.user_id AND d.field = 'displayname' \
           LEFT JOIN profile_fields a ON a.user_id = c.user_id AND a.field = 'avatar_url' \
          WHERE LOWER(c.user_id) LIKE $2 ESCAPE '\\' OR LOWER(d.value) LIKE $2 ESCAPE '\\' \
          ORDER BY c.user_id LIMIT $3 + 0",
    )
    .bind(searcher)
    .bind(pattern)
    .bind(limit)
    .fetch_all(&mut db.reader())
    .await?)
}

/// Serialises, on PostgreSQL, the transactions of one user that count rows
/// and then insert under a cap (pushers, to-device messages, media
/// reservations): the row lock makes the second wait for the first. SQLite's
/// write transactions are serial already.
pub async fn lock_for_count(db: &Db, conn: &mut sqlx::AnyConnection, user_id: &str) -> Result<()> {
    if db.backend == super::Backend::Postgres {
        sqlx::query("SELECT user_id FROM users WHERE user_id = $1 FOR UPDATE")
            .bind(user_id)
            .fetch_optional(conn)
            .await?;
    }
    Ok(())
}

/// Marks a user erased (deactivated with `erase: true`).
pub async fn set_erased(db: &Db, user_id: &str) -> Result<()> {
    sqlx::query("UPDATE users SET erased = 1 WHERE user_id = $1").bind(user_id).execute(&db.pool).await?;
    Ok(())
}

/// The erased users.
pub async fn erased(db: &Db) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT user_id FROM users WHERE erased = 1").fetch_all(&mut db.reader()).await?)
}
