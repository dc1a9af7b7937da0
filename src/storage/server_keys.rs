//! Other servers' signing keys (`server_keys`), as verified by `federation::keys`.

use super::Db;
use crate::error::Result;

/// One stored key of a server.
#[derive(Debug, Clone)]
pub struct StoredKey {
    /// `ed25519:<version>`.
    pub key_id: String,
    /// Unpadded base64.
    pub public_key: String,
    /// Until when the origin said its key set is valid (ms).
    pub valid_until_ts: i64,
    /// For an old key: when it stopped being used (ms).
    pub expired_ts: Option<i64>,
    /// The whole key object the origin signed.
    pub json: String,
}

/// A key to store: its id, public key, and `expired_ts` for an old key.
pub type NewKey<'a> = (&'a str, &'a str, Option<i64>);

/// Stores the keys of one fetched key object (replacing earlier rows of the
/// same key ids, but a key's validity never shrinks: what it signed while
/// an earlier object said it was valid stays verifiable), in one
/// transaction. Rows of keys the object no longer lists are kept.
pub async fn put(
    db: &Db,
    server: &str,
    keys: &[NewKey<'_>],
    valid_until_ts: i64,
    fetched_ts: i64,
    json: &str,
) -> Result<()> {
    let mut tx = db.begin_write().await?;
    for (key_id, public_key, expired_ts) in keys {
        sqlx::query(
            "INSERT INTO server_keys (server_name, key_id, public_key, valid_until_ts, expired_ts, fetched_ts, json) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (server_name, key_id) DO UPDATE SET \
             valid_until_ts = CASE WHEN server_keys.public_key = excluded.public_key \
               AND server_keys.valid_until_ts > excluded.valid_until_ts \
               THEN server_keys.valid_until_ts ELSE excluded.valid_until_ts END, \
             public_key = excluded.public_key, \
             expired_ts = excluded.expired_ts, fetched_ts = excluded.fetched_ts, json = excluded.json",
        )
        .bind(server)
        .bind(*key_id)
        .bind(*public_key)
        .bind(valid_until_ts)
        .bind(*expired_ts)
        .bind(fetched_ts)
        .bind(json)
        .execute(tx.conn())
        .await?;
    }
    tx.commit().await
}

/// Every stored key of `server`.
pub async fn get(db: &Db, server: &str) -> Result<Vec<StoredKey>> {
    let rows: Vec<(String, String, i64, Option<i64>, String)> = sqlx::query_as(
        "SELECT key_id, public_key, valid_until_ts, expired_ts, json FROM server_keys \
         WHERE server_name = $1 ORDER BY key_id",
    )
    .bind(server)
    .fetch_all(&mut db.reader())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(key_id, public_key, valid_until_ts, expired_ts, json)| StoredKey {
            key_id,
            public_key,
            valid_until_ts,
            expired_ts,
            json,
        })
        .collect())
}
