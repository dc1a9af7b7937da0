//! Device keys, one-time and fallback keys, cross-signing keys, device-list
//! updates and to-device messages.

use sqlx::AnyConnection;

use super::Db;
use crate::error::Result;

/// Stores a device's keys.
pub async fn put_device_keys(db: &Db, user: &str, device: &str, keys: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO device_keys (user_id, device_id, keys) VALUES ($1, $2, $3) \
         ON CONFLICT (user_id, device_id) DO UPDATE SET keys = excluded.keys",
    )
    .bind(user)
    .bind(device)
    .bind(keys)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Device keys of a user: (device id, keys JSON).
pub async fn device_keys(db: &Db, user: &str) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as("SELECT device_id, keys FROM device_keys WHERE user_id = $1 ORDER BY device_id")
        .bind(user)
        .fetch_all(&mut db.reader())
        .await?)
}

/// Adds one-time keys (existing ids are kept as they are), numbered after
/// the device's last upload so that claims take the oldest first.
pub async fn add_one_time_key(
    db: &Db,
    user: &str,
    device: &str,
    key_id: &str,
    algorithm: &str,
    key: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO one_time_keys (user_id, device_id, key_id, algorithm, key, upload_order) \
         SELECT $1, $2, $3, $4, $5, COALESCE(MAX(upload_order), 0) + 1 FROM one_time_keys \
          WHERE user_id = $1 AND device_id = $2 \
         ON CONFLICT (user_id, device_id, key_id) DO NOTHING",
    )
    .bind(user)
    .bind(device)
    .bind(key_id)
    .bind(algorithm)
    .bind(key)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Unclaimed one-time keys per algorithm.
pub async fn one_time_key_counts(db: &Db, user: &str, device: &str) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT algorithm, COUNT(*) FROM one_time_keys WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm",
    )
    .bind(user)
    .bind(device)
    .fetch_all(&mut db.reader())
    .await?)
}

/// Claims (removes and returns) one one-time key of `algorithm`.
pub async fn claim_one_time_key(
    db: &Db,
    user: &str,
    device: &str,
    algorithm: &str,
) -> Result<Option<(String, String)>> {
    // A read then a write: it holds the write lock from the start (on SQLite a
    // deferred transaction cannot upgrade while another writer commits).
    let mut tx = db.begin_write().await?;
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT key_id, key FROM one_time_keys WHERE user_id = $1 AND device_id = $2 AND algorithm = $3 \
         ORDER BY upload_order, key_id LIMIT 1",
    )
    .bind(user)
    .bind(device)
    .bind(algorithm)
    .fetch_optional(tx.conn())
    .await?;
    if let Some((key_id, _)) = &row {
        sqlx::query("DELETE FROM one_time_keys WHERE user_id = $1 AND device_id = $2 AND key_id = $3")
            .bind(user)
            .bind(device)
            .bind(key_id)
            .execute(tx.conn())
            .await?;
    }
    tx.commit().await?;
    Ok(row)
}

/// Sets the fallback key of `algorithm` (unused again).
pub async fn put_fallback_key(
    db: &Db,
    user: &str,
    device: &str,
    algorithm: &str,
    key_id: &str,
    key: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO fallback_keys (user_id, device_id, algorithm, key_id, key, used) VALUES ($1, $2, $3, $4, $5, 0) \
         ON CONFLICT (user_id, device_id, algorithm) DO UPDATE SET key_id = excluded.key_id, key = excluded.key, used = 0",
    )
    .bind(user)
    .bind(device)
    .bind(algorithm)
    .bind(key_id)
    .bind(key)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// The fallback key of `algorithm`, marking it used.
pub async fn use_fallback_key(
    db: &Db,
    user: &str,
    device: &str,
    algorithm: &str,
) -> Result<Option<(String, String)>> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT key_id, key FROM fallback_keys WHERE user_id = $1 AND device_id = $2 AND algorithm = $3",
    )
    .bind(user)
    .bind(device)
    .bind(algorithm)
    .fetch_optional(&mut db.reader())
    .await?;
    if row.is_some() {
        sqlx::query(
            "UPDATE fallback_keys SET used = 1 WHERE user_id = $1 AND device_id = $2 AND algorithm = $3",
        )
        .bind(user)
        .bind(device)
        .bind(algorithm)
        .execute(&db.pool)
        .await?;
    }
    Ok(row)
}

/// Stores a cross-signing key.
pub async fn put_cross_signing_key(db: &Db, user: &str, key_type: &str, key: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO cross_signing_keys (user_id, key_type, key) VALUES ($1, $2, $3) \
         ON CONFLICT (user_id, key_type) DO UPDATE SET key = excluded.key",
    )
    .bind(user)
    .bind(key_type)
    .bind(key)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// A cross-signing key.
pub async fn cross_signing_key(db: &Db, user: &str, key_type: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT key FROM cross_signing_keys WHERE user_id = $1 AND key_type = $2")
        .bind(user)
        .bind(key_type)
        .fetch_optional(&mut db.reader())
        .await?)
}

/// One stored signature of a device or cross-signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySignature {
    /// The signed device's id, or the signed cross-signing key's public key.
    pub target_key_id: String,
    /// Who signed.
    pub signer_user_id: String,
    /// With which key (`ed25519:<id>`).
    pub signer_key_id: String,
    /// The unpadded base64 signature.
    pub signature: String,
}

/// Stores signatures of `target_user`'s keys: a signer's signature with one
/// key replaces only that signer's earlier one with the same key.
pub async fn put_key_signatures(db: &Db, target_user: &str, signatures: &[KeySignature]) -> Result<()> {
    if signatures.is_empty() {
        return Ok(());
    }
    let mut tx = db.begin_write().await?;
    for s in signatures {
        sqlx::query(
            "INSERT INTO key_signatures (target_user_id, target_key_id, signer_user_id, signer_key_id, signature) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (target_user_id, target_key_id, signer_user_id, signer_key_id) \
             DO UPDATE SET signature = excluded.signature",
        )
        .bind(target_user)
        .bind(&s.target_key_id)
        .bind(&s.signer_user_id)
        .bind(&s.signer_key_id)
        .bind(&s.signature)
        .execute(tx.conn())
        .await?;
    }
    tx.commit().await
}

/// The stored signatures of `target_user`'s devices and cross-signing keys.
pub async fn key_signatures(db: &Db, target_user: &str) -> Result<Vec<KeySignature>> {
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT target_key_id, signer_user_id, signer_key_id, signature FROM key_signatures \
         WHERE target_user_id = $1 ORDER BY target_key_id, signer_user_id, signer_key_id",
    )
    .bind(target_user)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(target_key_id, signer_user_id, signer_key_id, signature)| KeySignature {
            target_key_id,
            signer_user_id,
            signer_key_id,
            signature,
        })
        .collect())
}

/// Forgets a key of `user` that is gone or replaced: the signatures of it
/// (`target_key_id`) and those made with it (`ed25519:<target_key_id>`).
pub async fn drop_key_signatures(db: &Db, user: &str, target_key_id: &str) -> Result<()> {
    let mut conn = db.pool.acquire().await?;
    drop_key_signatures_in(&mut conn, user, target_key_id).await
}

async fn drop_key_signatures_in(conn: &mut AnyConnection, user: &str, target_key_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM key_signatures WHERE target_user_id = $1 AND target_key_id = $2")
        .bind(user)
        .bind(target_key_id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM key_signatures WHERE signer_user_id = $1 AND signer_key_id = $2")
        .bind(user)
        .bind(format!("ed25519:{target_key_id}"))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Records that a user's devices or keys changed.
pub async fn device_list_changed(db: &Db, user: &str, stream: i64) -> Result<()> {
    let mut conn = db.pool.acquire().await?;
    device_list_changed_in(&mut conn, user, stream).await
}

/// The device-list position of `user`'s latest change, if any.
pub async fn last_device_list_change(db: &Db, user: &str) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT MAX(stream) FROM device_list_updates WHERE user_id = $1")
        .bind(user)
        .fetch_one(&mut db.reader())
        .await?)
}

/// [`device_list_changed`] inside a transaction.
pub async fn device_list_changed_in(conn: &mut AnyConnection, user: &str, stream: i64) -> Result<()> {
    sqlx::query("INSERT INTO device_list_updates (user_id, stream) VALUES ($1, $2)")
        .bind(user)
        .bind(stream)
        .execute(conn)
        .await?;
    Ok(())
}

/// Queues a to-device message (inside the sender's transaction).
#[allow(clippy::too_many_arguments)]
pub async fn put_to_device(
    conn: &mut AnyConnection,
    user: &str,
    device: &str,
    stream: i64,
    sender: &str,
    event_type: &str,
    content: &str,
) -> Result<()> {
    // One message per device and request: a device named twice (by id and
    // by `*`) gets the first.
    sqlx::query(
        "INSERT INTO to_device (user_id, device_id, stream, sender, event_type, content) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT DO NOTHING",
    )
    .bind(user)
    .bind(device)
    .bind(stream)
    .bind(sender)
    .bind(event_type)
    .bind(content)
    .execute(conn)
    .await?;
    Ok(())
}

/// Undelivered to-device messages from `sender` to each of `user`'s devices.
pub async fn pending_to_device(
    conn: &mut AnyConnection,
    user: &str,
    sender: &str,
) -> Result<std::collections::HashMap<String, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT device_id, COUNT(*) FROM to_device WHERE user_id = $1 AND sender = $2 GROUP BY device_id",
    )
    .bind(user)
    .bind(sender)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Drops a device's to-device messages at or below `acked` (the client's
/// token says it has them).
pub async fn ack_to_device(db: &Db, user: &str, device: &str, acked: i64) -> Result<()> {
    sqlx::query("DELETE FROM to_device WHERE user_id = $1 AND device_id = $2 AND stream <= $3")
        .bind(user)
        .bind(device)
        .bind(acked)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Drops a deleted device's keys, queued messages and the signatures of and
/// by its key.
pub async fn delete_device(conn: &mut AnyConnection, user: &str, device: &str) -> Result<()> {
    for table in ["device_keys", "one_time_keys", "fallback_keys", "to_device"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE user_id = $1 AND device_id = $2"
        )))
        .bind(user)
        .bind(device)
        .execute(&mut *conn)
        .await?;
    }
    drop_key_signatures_in(conn, user, device).await
}

/// What one `/sync` answer reads for a device and its user, besides rooms.
#[derive(Debug, Clone, Default)]
pub struct DeviceWindow {
    /// To-device messages in the window: (stream, sender, type, content).
    pub to_device: Vec<(i64, String, String, String)>,
    /// One-time key counts by algorithm.
    pub one_time_keys: Vec<(String, i64)>,
    /// Algorithms with an unused fallback key.
    pub fallback: Vec<String>,
    /// The user's remote invites changed in the window, pending and rejected.
    pub remote_invites: Vec<super::federation::RemoteInvite>,
}

/// A row of [`device_window`]: which part it belongs to (0 to-device, 1
/// one-time keys, 2 fallback keys, 3 remote invites and knocks), a stream
/// position, seven texts and a number.
type WindowRow = (i64, i64, String, String, String, String, String, String, String, i64);

/// [`DeviceWindow`] in one statement: to-device messages in
/// `(to_device_after, upto]` (at most `limit`, oldest first), the key counts,
/// and the remote invites changed in `(invites_after, upto]`.
pub async fn device_window(
    db: &Db,
    user: &str,
    device: &str,
    to_device_after: i64,
    invites_after: i64,
    upto: i64,
    limit: i64,
) -> Result<DeviceWindow> {
    let rows: Vec<WindowRow> = sqlx::query_as(
        "SELECT * FROM (SELECT 0, stream, sender, event_type, content, '', '', '', '', 0 FROM to_device \
           WHERE user_id = $1 AND device_id = $2 AND stream > $3 AND stream <= $4 ORDER BY stream LIMIT $5 + 0) t \
         UNION ALL \
         SELECT 1, 0, algorithm, '', '', '', '', '', '', COUNT(*) FROM one_time_keys \
           WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm \
         UNION ALL \
         SELECT 2, 0, algorithm, '', '', '', '', '', '', 0 FROM fallback_keys \
           WHERE user_id = $1 AND device_id = $2 AND used = 0 \
         UNION ALL \
         SELECT 3, stream, room_id, event_id, room_version, json, stripped_state, via, membership, rejected \
           FROM remote_invites WHERE user_id = $1 AND stream > $6 AND stream <= $4 \
         ORDER BY 1, 2, 3",
    )
    .bind(user)
    .bind(device)
    .bind(to_device_after)
    .bind(upto)
    .bind(limit)
    .bind(invites_after)
    .fetch_all(&mut db.reader())
    .await?;
    let mut out = DeviceWindow::default();
    for (part, stream, a, b, c, d, e, f, g, n) in rows {
        match part {
            0 => out.to_device.push((stream, a, b, c)),
            1 => out.one_time_keys.push((a, n)),
            2 => out.fallback.push(a),
            _ => out.remote_invites.push(super::federation::RemoteInvite {
                user_id: user.to_owned(),
                room_id: a,
                event_id: b,
                room_version: c,
                json: d,
                stripped_state: e,
                via: f,
                stream,
                rejected: n,
                membership: g,
            }),
        }
    }
    Ok(out)
}
