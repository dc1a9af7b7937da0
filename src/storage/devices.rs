//! The `devices` table. A device holds at most one access token (stored as a
//! sha-256 hash); logging out deletes the device, as the spec asks.

use super::Db;
use crate::error::Result;

/// A device as listed to its owner.
#[derive(Debug, Clone)]
pub struct DeviceRow {
    /// Device id.
    pub device_id: String,
    /// Display name set by the client or the user.
    pub display_name: Option<String>,
    /// When a request with this device's token was last seen.
    pub last_seen_ts: Option<i64>,
    /// From where.
    pub last_seen_ip: Option<String>,
}

/// Who an access token belongs to.
#[derive(Debug, Clone)]
pub struct TokenOwner {
    /// The user.
    pub user_id: String,
    /// The device the token was issued to.
    pub device_id: String,
    /// Server administrator.
    pub is_admin: bool,
    /// Last activity, to rate-limit `last_seen` writes.
    pub last_seen_ts: Option<i64>,
}

/// Gives the device a new token, creating the device if it does not exist
/// (an existing device keeps its display name: the spec ignores
/// `initial_device_display_name` for a known device). The pushers set with
/// the device's previous token go with it.
pub async fn login(
    db: &Db,
    user_id: &str,
    device_id: &str,
    display_name: Option<&str>,
    token_hash: &str,
    now: i64,
    ip: Option<&str>,
) -> Result<()> {
    let mut tx = db.begin_write().await?;
    sqlx::query("DELETE FROM pushers WHERE user_id = $1 AND device_id = $2")
        .bind(user_id)
        .bind(device_id)
        .execute(tx.conn())
        .await?;
    sqlx::query(
        "INSERT INTO devices (user_id, device_id, display_name, token_hash, created_ts, last_seen_ts, last_seen_ip) \
         VALUES ($1, $2, $3, $4, $5, $5, $6) \
         ON CONFLICT (user_id, device_id) DO UPDATE SET \
           token_hash = excluded.token_hash, \
           last_seen_ts = excluded.last_seen_ts, last_seen_ip = excluded.last_seen_ip",
    )
    .bind(user_id)
    .bind(device_id)
    .bind(display_name)
    .bind(token_hash)
    .bind(now)
    .bind(ip)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Resolves an access-token hash to its owner.
pub async fn by_token(db: &Db, token_hash: &str) -> Result<Option<TokenOwner>> {
    let row: Option<(String, String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT d.user_id, d.device_id, u.is_admin, d.last_seen_ts \
         FROM devices d JOIN users u ON u.user_id = d.user_id \
         WHERE d.token_hash = $1 AND u.deactivated = 0",
    )
    .bind(token_hash)
    .fetch_optional(&db.pool)
    .await?;
    Ok(row.map(|(user_id, device_id, is_admin, last_seen_ts)| TokenOwner {
        user_id,
        device_id,
        is_admin: is_admin != 0,
        last_seen_ts,
    }))
}

/// Records activity of a device.
pub async fn touch(db: &Db, user_id: &str, device_id: &str, now: i64, ip: Option<&str>) -> Result<()> {
    sqlx::query(
        "UPDATE devices SET last_seen_ts = $1, last_seen_ip = COALESCE($2, last_seen_ip) \
         WHERE user_id = $3 AND device_id = $4",
    )
    .bind(now)
    .bind(ip)
    .bind(user_id)
    .bind(device_id)
    .execute(&db.pool)
    .await?;
    Ok(())
}

fn row(
    (device_id, display_name, last_seen_ts, last_seen_ip): (
        String,
        Option<String>,
        Option<i64>,
        Option<String>,
    ),
) -> DeviceRow {
    DeviceRow { device_id, display_name, last_seen_ts, last_seen_ip }
}

/// All devices of a user, by device id.
pub async fn list(db: &Db, user_id: &str) -> Result<Vec<DeviceRow>> {
    let rows = sqlx::query_as(
        "SELECT device_id, display_name, last_seen_ts, last_seen_ip FROM devices \
         WHERE user_id = $1 ORDER BY device_id",
    )
    .bind(user_id)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows.into_iter().map(row).collect())
}

/// One device of a user.
pub async fn get(db: &Db, user_id: &str, device_id: &str) -> Result<Option<DeviceRow>> {
    let r = sqlx::query_as(
        "SELECT device_id, display_name, last_seen_ts, last_seen_ip FROM devices \
         WHERE user_id = $1 AND device_id = $2",
    )
    .bind(user_id)
    .bind(device_id)
    .fetch_optional(&db.pool)
    .await?;
    Ok(r.map(row))
}

/// Renames a device; false if the user has no such device.
pub async fn set_display_name(
    db: &Db,
    user_id: &str,
    device_id: &str,
    display_name: Option<&str>,
) -> Result<bool> {
    let r = sqlx::query("UPDATE devices SET display_name = $1 WHERE user_id = $2 AND device_id = $3")
        .bind(display_name)
        .bind(user_id)
        .bind(device_id)
        .execute(&db.pool)
        .await?;
    Ok(r.rows_affected() > 0)
}

/// Deletes several devices of a user in one transaction; unknown ids are
/// skipped. Their pushers go with them (the foreign key cascades).
pub async fn delete_many(db: &Db, user_id: &str, device_ids: &[&str], stream: i64) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for device_id in device_ids {
        sqlx::query("DELETE FROM devices WHERE user_id = $1 AND device_id = $2")
            .bind(user_id)
            .bind(*device_id)
            .execute(tx.conn())
            .await?;
        super::keys::delete_device(tx.conn(), user_id, device_id).await?;
    }
    super::keys::device_list_changed_in(tx.conn(), user_id, stream).await?;
    tx.commit().await?;
    Ok(())
}
