//! Media: files under `<data_dir>/media`, indexed in the database; thumbnails
//! made with the `image` crate (crop or scale) and cached beside them.

use std::path::PathBuf;

use image::imageops::FilterType;
use rand::Rng;

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{self, media};

/// Content types served inline; everything else is served as an attachment
/// (the spec's list of safe types), always under a sandboxing CSP.
pub const INLINE_TYPES: &[&str] = &[
    "text/css",
    "text/plain",
    "text/csv",
    "application/json",
    "application/ld+json",
    "image/jpeg",
    "image/gif",
    "image/png",
    "image/apng",
    "image/webp",
    "image/avif",
    "video/mp4",
    "video/webm",
    "video/ogg",
    "video/quicktime",
    "audio/mp4",
    "audio/webm",
    "audio/aac",
    "audio/mpeg",
    "audio/ogg",
    "audio/wave",
    "audio/wav",
    "audio/x-wav",
    "audio/x-pn-wav",
    "audio/flac",
    "audio/x-flac",
];

/// A media id: 24 random alphanumerics, safe as a file name.
fn new_media_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..24).map(|_| char::from(ALPHABET[(rng.next_u32() as usize) % ALPHABET.len()])).collect()
}

fn valid_media_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 255
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn media_dir(state: &AppState) -> PathBuf {
    state.settings.data_dir.join("media")
}

fn file_path(state: &AppState, id: &str) -> PathBuf {
    media_dir(state).join(&id[..2.min(id.len())]).join(id)
}

/// Reserves a media id for an upload to follow (`/v1/create`).
pub async fn create(state: &AppState, uploader: &str) -> Result<String> {
    let id = new_media_id();
    media::create(&state.db, &id, uploader, storage::now_ms()).await?;
    Ok(id)
}

/// Stores uploaded bytes under `id` (created before by [`create`], or new).
pub async fn store(
    state: &AppState,
    uploader: &str,
    id: Option<&str>,
    content_type: Option<&str>,
    filename: Option<&str>,
    bytes: &[u8],
) -> Result<String> {
    let id = match id {
        Some(id) => {
            let row =
                media::get(&state.db, id).await?.ok_or_else(|| Error::NotFound("Unknown media id".into()))?;
            if row.uploader != uploader {
                return Err(Error::Forbidden("This media id belongs to another user".into()));
            }
            if row.uploaded {
                return Err(Error::CannotOverwriteMedia);
            }
            id.to_owned()
        }
        None => create(state, uploader).await?,
    };
    let path = file_path(state, &id);
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(|e| Error::Internal(format!("media dir: {e}")))?;
    }
    let tmp = path.with_extension("part");
    tokio::fs::write(&tmp, bytes).await.map_err(|e| Error::Internal(format!("media write: {e}")))?;
    tokio::fs::rename(&tmp, &path).await.map_err(|e| Error::Internal(format!("media rename: {e}")))?;
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    if !media::set_uploaded(&state.db, &id, content_type, filename, size).await? {
        return Err(Error::CannotOverwriteMedia);
    }
    Ok(id)
}

/// A stored file.
#[derive(Debug)]
pub struct Content {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Declared content type.
    pub content_type: Option<String>,
    /// Declared file name.
    pub filename: Option<String>,
}

/// Reads local media; 404 for unknown or not-yet-uploaded ids, and for other
/// servers' media (no federation yet).
pub async fn fetch(state: &AppState, server: &str, id: &str) -> Result<Content> {
    let not_found = || Error::NotFound("Media not found".into());
    if server != state.settings.server_name.as_str() || !valid_media_id(id) {
        return Err(not_found());
    }
    let row = media::get(&state.db, id).await?.ok_or_else(not_found)?;
    if !row.uploaded {
        return Err(Error::NotYetUploaded);
    }
    let bytes = tokio::fs::read(file_path(state, id)).await.map_err(|_| not_found())?;
    Ok(Content { bytes, content_type: row.content_type, filename: row.filename })
}

/// How to fit a thumbnail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Fill the box exactly, cropping.
    Crop,
    /// Fit inside the box, keeping the aspect ratio.
    Scale,
}

/// A thumbnail of local media as PNG (or the original when it is no image or
/// already small enough).
pub async fn thumbnail(
    state: &AppState,
    server: &str,
    id: &str,
    width: u32,
    height: u32,
    method: Method,
) -> Result<Content> {
    if width == 0 || height == 0 || width > 2000 || height > 2000 {
        return Err(Error::InvalidParam("width and height must be 1 to 2000".into()));
    }
    let original = fetch(state, server, id).await?;
    let tag = match method {
        Method::Crop => "crop",
        Method::Scale => "scale",
    };
    let cache = media_dir(state).join("thumbnails").join(format!("{id}-{width}x{height}-{tag}.png"));
    if let Ok(bytes) = tokio::fs::read(&cache).await {
        return Ok(Content { bytes, content_type: Some("image/png".into()), filename: None });
    }
    let source = original.bytes.clone();
    let made = tokio::task::spawn_blocking(move || -> Option<Vec<u8>> {
        let img = image::load_from_memory(&source).ok()?;
        if img.width() <= width && img.height() <= height {
            return None;
        }
        let thumb = match method {
            Method::Crop => img.resize_to_fill(width, height, FilterType::Triangle),
            Method::Scale => img.resize(width, height, FilterType::Triangle),
        };
        let mut out = std::io::Cursor::new(Vec::new());
        thumb.write_to(&mut out, image::ImageFormat::Png).ok()?;
        Some(out.into_inner())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    match made {
        Some(bytes) => {
            if let Some(dir) = cache.parent() {
                let _ = tokio::fs::create_dir_all(dir).await;
            }
            let _ = tokio::fs::write(&cache, &bytes).await;
            Ok(Content { bytes, content_type: Some("image/png".into()), filename: None })
        }
        None => Ok(original),
    }
}
