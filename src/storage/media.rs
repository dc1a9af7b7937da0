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

/// Records a new media id (content to follow when `uploaded` is false).
pub async fn create(db: &Db, media_id: &str, uploader: &str, now: i64) -> Result<()> {
    sqlx::query("INSERT INTO media (media_id, uploader, created_ts) VALUES ($1, $2, $3)")
        .bind(media_id)
        .bind(uploader)
        .bind(now)
        .execute(&db.pool)
        .await?;
    Ok(())
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
    .fetch_optional(&db.pool)
    .await?;
    Ok(row.map(|(uploader, content_type, filename, uploaded, created_ts)| MediaRow {
        uploader,
        content_type,
        filename,
        uploaded: uploaded != 0,
        created_ts,
    }))
}
