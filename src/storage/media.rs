//! The `media` index.

use super::Db;
use crate::error::Result;

/// A media item.
#[derive(Debug, Clone)]
pub struct MediaRow {
    /// Who created it.
    pub uploader: String,
    /// Declared content type.
    pub content_type: Option<String>,
    /// Declared file name.
    pub filename: Option<String>,
    /// Whether the bytes are there.
    pub uploaded: bool,
    /// Creation time.
    pub created_ts: i64,
}

/// Reserves a media id for content to follow, unless `uploader` already holds
/// `max_pending` unused reservations made after `since` (older ones are
/// expired: they are deleted here and not counted). The count and the insert
/// are one statement. Returns whether the reservation was made.
pub async fn reserve(
    db: &Db,
    media_id: &str,
    uploader: &str,
    now: i64,
    since: i64,
    max_pending: u32,
) -> Result<bool> {
    let mut tx = db.begin_write().await?;
    // Two concurrent reservations of one user count one after the other.
    super::users::lock_for_count(db, tx.conn(), uploader).await?;
    sqlx::query("DELETE FROM media WHERE uploader = $1 AND uploaded = 0 AND created_ts <= $2")
        .bind(uploader)
        .bind(since)
        .execute(tx.conn())
        .await?;
    let r = sqlx::query(
        "INSERT INTO media (media_id, uploader, created_ts) SELECT $1, $2, $3 \
         WHERE (SELECT COUNT(*) FROM media WHERE uploader = $2 AND uploaded = 0 AND created_ts > $4) < $5",
    )
    .bind(media_id)
    .bind(uploader)
    .bind(now)
    .bind(since)
    .bind(i64::from(max_pending))
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(r.rows_affected() > 0)
}

/// When the oldest of `uploader`'s unused reservations made after `since` was made.
pub async fn oldest_pending(db: &Db, uploader: &str, since: i64) -> Result<Option<i64>> {
    let row: (Option<i64>,) = sqlx::query_as(
        "SELECT MIN(created_ts) FROM media WHERE uploader = $1 AND uploaded = 0 AND created_ts > $2",
    )
    .bind(uploader)
    .bind(since)
    .fetch_one(&mut db.reader())
    .await?;
    Ok(row.0)
}

/// Records media whose content is stored already (a direct upload).
pub async fn insert_uploaded(db: &Db, m: NewMedia<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO media (media_id, uploader, content_type, filename, size, created_ts, uploaded, expires_ts) \
         VALUES ($1, $2, $3, $4, $5, $6, 1, $7)",
    )
    .bind(m.media_id)
    .bind(m.uploader)
    .bind(m.content_type)
    .bind(m.filename)
    .bind(m.size)
    .bind(m.now)
    .bind(m.expires_ts)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// A media row whose content is stored already.
#[derive(Debug, Clone, Copy)]
pub struct NewMedia<'a> {
    /// Its id.
    pub media_id: &'a str,
    /// Who uploaded it (or for whom a preview stored it).
    pub uploader: &'a str,
    /// When.
    pub now: i64,
    /// Declared content type.
    pub content_type: Option<&'a str>,
    /// Declared file name.
    pub filename: Option<&'a str>,
    /// Bytes.
    pub size: i64,
    /// When it goes away by itself (see [`expired`]), if ever.
    pub expires_ts: Option<i64>,
}

/// Marks the content stored.
pub async fn set_uploaded(
    db: &Db,
    media_id: &str,
    content_type: Option<&str>,
    filename: Option<&str>,
    size: i64,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE media SET content_type = $1, filename = $2, size = $3, uploaded = 1 WHERE media_id = $4 AND uploaded = 0",
    )
    .bind(content_type)
    .bind(filename)
    .bind(size)
    .bind(media_id)
    .execute(&db.pool)
    .await?;
    Ok(r.rows_affected() > 0)
}

type Row = (String, Option<String>, Option<String>, i64, i64);

/// One media item.
pub async fn get(db: &Db, media_id: &str) -> Result<Option<MediaRow>> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT uploader, content_type, filename, uploaded, created_ts FROM media WHERE media_id = $1",
    )
    .bind(media_id)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(|(uploader, content_type, filename, uploaded, created_ts)| MediaRow {
        uploader,
        content_type,
        filename,
        uploaded: uploaded != 0,
        created_ts,
    }))
}

/// The preview of `url` made last, unless it expired by `now`.
pub async fn cached_preview(db: &Db, url: &str, now: i64) -> Result<Option<String>> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT preview FROM url_previews WHERE url = $1 AND expires_ts > $2")
            .bind(url)
            .bind(now)
            .fetch_optional(&mut db.reader())
            .await?;
    Ok(row.map(|r| r.0))
}

/// Keeps the preview of `url` until `expires`, in place of an older one; and
/// forgets previews that expired before `now`.
pub async fn cache_preview(db: &Db, url: &str, preview: &str, now: i64, expires: i64) -> Result<()> {
    let mut tx = db.begin_write().await?;
    sqlx::query("DELETE FROM url_previews WHERE expires_ts <= $1").bind(now).execute(tx.conn()).await?;
    sqlx::query(
        "INSERT INTO url_previews (url, preview, fetched_ts, expires_ts) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (url) DO UPDATE SET preview = excluded.preview, fetched_ts = excluded.fetched_ts, \
         expires_ts = excluded.expires_ts",
    )
    .bind(url)
    .bind(preview)
    .bind(now)
    .bind(expires)
    .execute(tx.conn())
    .await?;
    tx.commit().await
}

/// Up to `limit` media ids whose time ran out by `now`.
pub async fn expired(db: &Db, now: i64, limit: i64) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT media_id FROM media WHERE expires_ts IS NOT NULL AND expires_ts <= $1 ORDER BY expires_ts LIMIT $2 + 0",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(&mut db.reader())
    .await?)
}

/// Forgets a media row.
pub async fn delete(db: &Db, media_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM media WHERE media_id = $1").bind(media_id).execute(&db.pool).await?;
    Ok(())
}
