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
    /// When the token stops working (tokens issued with a refresh token).
    pub expires_ts: Option<i64>,
    /// The refresh token this access token's refresh replaced is still taken.
    pub refresh_pending: bool,
}

/// Gives the device a new token, creating the device if it does not exist
/// (an existing device keeps its display name: the spec ignores
/// `initial_device_display_name` for a known device). The pushers set with
/// the device's previous token go with it. True when the device is new.
#[allow(clippy::too_many_arguments)]
pub async fn login(
    db: &Db,
    user_id: &str,
    device_id: &str,
    display_name: Option<&str>,
    token_hash: &str,
    refresh: Option<Refresh<'_>>,
    now: i64,
    ip: Option<&str>,
) -> Result<bool> {
    let mut tx = db.begin_write().await?;
    let existed: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM devices WHERE user_id = $1 AND device_id = $2")
            .bind(user_id)
            .bind(device_id)
            .fetch_optional(tx.conn())
            .await?;
    sqlx::query("DELETE FROM pushers WHERE user_id = $1 AND device_id = $2")
        .bind(user_id)
        .bind(device_id)
        .execute(tx.conn())
        .await?;
    sqlx::query(
        "INSERT INTO devices (user_id, device_id, display_name, token_hash, created_ts, last_seen_ts, last_seen_ip, \
           token_expires_ts, refresh_hash, prev_refresh_hash) \
         VALUES ($1, $2, $3, $4, $5, $5, $6, $7, $8, NULL) \
         ON CONFLICT (user_id, device_id) DO UPDATE SET \
           token_hash = excluded.token_hash, \
           last_seen_ts = excluded.last_seen_ts, last_seen_ip = excluded.last_seen_ip, \
           token_expires_ts = excluded.token_expires_ts, refresh_hash = excluded.refresh_hash, \
           prev_refresh_hash = NULL",
    )
    .bind(user_id)
    .bind(device_id)
    .bind(display_name)
    .bind(token_hash)
    .bind(now)
    .bind(ip)
    .bind(refresh.map(|r| r.expires_ts))
    .bind(refresh.map(|r| r.refresh_hash))
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(existed.is_none())
}

/// A refresh token issued with an access token.
#[derive(Debug, Clone, Copy)]
pub struct Refresh<'a> {
    /// sha-256 of the refresh token.
    pub refresh_hash: &'a str,
    /// When the access token stops working.
    pub expires_ts: i64,
}

/// Resolves an access-token hash to its owner.
pub async fn by_token(db: &Db, token_hash: &str) -> Result<Option<TokenOwner>> {
    type OwnerRow = (String, String, i64, Option<i64>, Option<i64>, Option<String>);
    let row: Option<OwnerRow> = sqlx::query_as(
        "SELECT d.user_id, d.device_id, u.is_admin, d.last_seen_ts, d.token_expires_ts, d.prev_refresh_hash \
         FROM devices d JOIN users u ON u.user_id = d.user_id \
         WHERE d.token_hash = $1 AND u.deactivated = 0",
    )
    .bind(token_hash)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(|(user_id, device_id, is_admin, last_seen_ts, expires_ts, prev_refresh)| TokenOwner {
        user_id,
        device_id,
        is_admin: is_admin != 0,
        last_seen_ts,
        expires_ts,
        refresh_pending: prev_refresh.is_some(),
    }))
}

/// Gives the device holding the refresh token `old_hash` (as its current
/// one, or as the one replaced by a refresh whose access token is still
/// unused) a new access token and refresh token; answers (user, device), or
/// `None` for a refresh token no live device holds.
pub async fn refresh(
    db: &Db,
    old_hash: &str,
    token_hash: &str,
    next: Refresh<'_>,
) -> Result<Option<(String, String)>> {
    let mut tx = db.begin_write().await?;
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT d.user_id, d.device_id FROM devices d JOIN users u ON u.user_id = d.user_id \
         WHERE (d.refresh_hash = $1 OR d.prev_refresh_hash = $1) AND d.token_hash IS NOT NULL \
           AND u.deactivated = 0",
    )
    .bind(old_hash)
    .fetch_optional(tx.conn())
    .await?;
    let Some((user_id, device_id)) = row else { return Ok(None) };
    // The token refreshed with stays usable until the new access token is
    // used (whether it was the current one or, on a retry, the previous).
    sqlx::query(
        "UPDATE devices SET token_hash = $1, refresh_hash = $2, prev_refresh_hash = $3, token_expires_ts = $4 \
         WHERE user_id = $5 AND device_id = $6",
    )
    .bind(token_hash)
    .bind(next.refresh_hash)
    .bind(old_hash)
    .bind(next.expires_ts)
    .bind(&user_id)
    .bind(&device_id)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(Some((user_id, device_id)))
}

/// The device's new access token was used: the refresh token it replaced
/// stops working.
pub async fn refresh_used(db: &Db, user_id: &str, device_id: &str) -> Result<()> {
    sqlx::query("UPDATE devices SET prev_refresh_hash = NULL WHERE user_id = $1 AND device_id = $2")
        .bind(user_id)
        .bind(device_id)
        .execute(&db.pool)
        .await?;
    Ok(())
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
    .fetch_all(&mut db.reader())
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
    .fetch_optional(&mut db.reader())
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
