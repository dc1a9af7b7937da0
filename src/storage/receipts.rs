//! Read receipts, one per (room, user, receipt type, thread).

use super::Db;
use crate::error::Result;

/// A stored receipt.
#[derive(Debug, Clone)]
pub struct Receipt {
    /// Room.
    pub room_id: String,
    /// Who read.
    pub user_id: String,
    /// `m.read` or `m.read.private`.
    pub receipt_type: String,
    /// Thread, '' when unthreaded.
    pub thread_id: String,
    /// Up to which event.
    pub event_id: String,
    /// When.
    pub ts: i64,
}

/// Sets a receipt at stream position `stream`.
pub async fn put(db: &Db, r: &Receipt, stream: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO receipts (room_id, user_id, receipt_type, thread_id, event_id, ts, stream) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (room_id, user_id, receipt_type, thread_id) DO UPDATE SET \
           event_id = excluded.event_id, ts = excluded.ts, stream = excluded.stream",
    )
    .bind(&r.room_id)
    .bind(&r.user_id)
    .bind(&r.receipt_type)
    .bind(&r.thread_id)
    .bind(&r.event_id)
    .bind(r.ts)
    .bind(stream)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Receipts in a room changed in `(after, upto]` (all of them for `after` = 0).
pub async fn changed(db: &Db, room_id: &str, after: i64, upto: i64) -> Result<Vec<Receipt>> {
    let rows: Vec<(String, String, String, String, String, i64)> = sqlx::query_as(
        "SELECT room_id, user_id, receipt_type, thread_id, event_id, ts FROM receipts \
         WHERE room_id = $1 AND stream > $2 AND stream <= $3 ORDER BY stream",
    )
    .bind(room_id)
    .bind(after)
    .bind(upto)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(room_id, user_id, receipt_type, thread_id, event_id, ts)| Receipt {
            room_id,
            user_id,
            receipt_type,
            thread_id,
            event_id,
            ts,
        })
        .collect())
}
