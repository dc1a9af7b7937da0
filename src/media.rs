//! Media: files under `<data_dir>/media`, indexed in the database; thumbnails
//! made with the `image` crate (crop or scale) in a fixed set of sizes and
//! cached beside them.
//!
//! Bounds: a file is on disk (synced, and its directory entry too) before the
//! row that acknowledges it commits; a user holds at most
//! `media.max_pending_uploads` unused `/v1/create` reservations, which expire
//! after 24 hours; an image gets a thumbnail only if its header claims at most
//! `media.max_thumbnail_pixels` pixels, its decoding is held to a memory
//! budget, and only as many thumbnails are made at once as there are cores.
//! Downloads are streamed from the file.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;
use rand::Rng;
use tokio::io::AsyncWriteExt;

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

/// A Content-Type's media type: without parameters, trimmed, lower case.
pub fn media_type(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

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

/// How long a `/v1/create` reservation waits for its upload.
pub const UNUSED_EXPIRY_MS: i64 = 24 * 3600 * 1000;

/// A reserved media id.
#[derive(Debug)]
pub struct Reservation {
    /// The media id.
    pub id: String,
    /// When it expires unless uploaded to (ms since the epoch).
    pub expires_at: i64,
}

/// Reserves a media id for an upload to follow (`/v1/create`): 429 when the
/// user already holds `media.max_pending_uploads` unused ones.
pub async fn create(state: &AppState, uploader: &str) -> Result<Reservation> {
    let id = new_media_id();
    let now = storage::now_ms();
    let since = now - UNUSED_EXPIRY_MS;
    let max = state.settings.media.max_pending_uploads;
    if !media::reserve(&state.db, &id, uploader, now, since, max).await? {
        let oldest = media::oldest_pending(&state.db, uploader, since).await?.unwrap_or(now);
        let wait = (oldest + UNUSED_EXPIRY_MS - now).max(1000);
        return Err(Error::LimitExceeded { retry_after_ms: u64::try_from(wait).unwrap_or(1000) });
    }
    Ok(Reservation { id, expires_at: now + UNUSED_EXPIRY_MS })
}

/// Stores uploaded bytes under `id` (reserved before by [`create`]) or under a
/// new id. The file is synced to disk before the row that says it is there.
pub async fn store(
    state: &AppState,
    uploader: &str,
    id: Option<&str>,
    content_type: Option<&str>,
    filename: Option<&str>,
    bytes: &[u8],
) -> Result<String> {
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    match id {
        Some(id) => {
            let unknown = || Error::NotFound("Unknown media id".into());
            if !valid_media_id(id) {
                return Err(unknown());
            }
            let row = media::get(&state.db, id).await?.ok_or_else(unknown)?;
            if row.uploader != uploader {
                return Err(Error::Forbidden("This media id belongs to another user".into()));
            }
            if row.uploaded {
                return Err(Error::CannotOverwriteMedia);
            }
            if row.created_ts + UNUSED_EXPIRY_MS <= storage::now_ms() {
                return Err(unknown());
            }
            if !write_file(state, id, bytes).await? {
                return Err(Error::CannotOverwriteMedia);
            }
            if !media::set_uploaded(&state.db, id, content_type, filename, size).await? {
                return Err(Error::CannotOverwriteMedia);
            }
            Ok(id.to_owned())
        }
        None => store_new(state, uploader, content_type, filename, bytes, None).await,
    }
}

/// Stores bytes under a new id (synced before the row), going away by
/// itself at `expires` when given (see [`expire`]).
pub async fn store_new(
    state: &AppState,
    uploader: &str,
    content_type: Option<&str>,
    filename: Option<&str>,
    bytes: &[u8],
    expires: Option<i64>,
) -> Result<String> {
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    let id = new_media_id();
    if !write_file(state, &id, bytes).await? {
        return Err(Error::Internal("a new media id is taken".into()));
    }
    let row = media::NewMedia {
        media_id: &id,
        uploader,
        now: storage::now_ms(),
        content_type,
        filename,
        size,
        expires_ts: expires,
    };
    media::insert_uploaded(&state.db, row).await?;
    Ok(id)
}

fn io_error(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("media {what}: {e}"))
}

/// Syncs a directory, so the entries made in it survive a power cut.
async fn sync_dir(dir: &Path) -> Result<()> {
    let dir = tokio::fs::File::open(dir).await.map_err(io_error("open dir"))?;
    dir.sync_all().await.map_err(io_error("sync dir"))
}

/// Writes `bytes` as the file of `id`: to a temporary file first, synced, then
/// linked into place (never over an existing file: of two racing uploads to
/// one id the first keeps it, and this returns false for the other), then the
/// directory synced.
async fn write_file(state: &AppState, id: &str, bytes: &[u8]) -> Result<bool> {
    let path = file_path(state, id);
    let dir = path.parent().ok_or_else(|| Error::Internal("media path without a directory".into()))?;
    if !tokio::fs::try_exists(dir).await.map_err(io_error("dir"))? {
        tokio::fs::create_dir_all(dir).await.map_err(io_error("create dir"))?;
        sync_dir(&media_dir(state)).await?;
    }
    let tmp = dir.join(format!("{id}.{}.part", new_media_id()));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp).await.map_err(io_error("create"))?;
        file.write_all(bytes).await.map_err(io_error("write"))?;
        file.sync_all().await.map_err(io_error("sync"))?;
        drop(file);
        match tokio::fs::hard_link(&tmp, &path).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_error("link")(e)),
        }
    }
    .await;
    let _ = tokio::fs::remove_file(&tmp).await;
    let placed = result?;
    if placed {
        sync_dir(dir).await?;
    }
    Ok(placed)
}

/// Deletes the media whose time ran out by `now` (rows first, then files
/// and thumbnails: a crash in between leaves a file no row names, never a
/// row without its file); returns how many.
pub async fn expire(state: &AppState, now: i64) -> Result<usize> {
    let mut removed = 0;
    loop {
        let ids = media::expired(&state.db, now, 100).await?;
        if ids.is_empty() {
            return Ok(removed);
        }
        for id in ids {
            media::delete(&state.db, &id).await?;
            if valid_media_id(&id) {
                let _ = tokio::fs::remove_file(file_path(state, &id)).await;
                for &(w, h, method) in THUMBNAIL_SIZES {
                    let _ = tokio::fs::remove_file(thumbnail_path(state, &id, w, h, method)).await;
                }
            }
            removed += 1;
        }
    }
}

fn thumbnail_path(state: &AppState, id: &str, w: u32, h: u32, method: Method) -> PathBuf {
    let tag = match method {
        Method::Crop => "crop",
        Method::Scale => "scale",
    };
    media_dir(state).join("thumbnails").join(format!("{id}-{w}x{h}-{tag}.png"))
}

/// What a response body is made of.
#[derive(Debug)]
pub enum Body {
    /// A file, streamed; its length.
    File(tokio::fs::File, u64),
    /// Bytes made in memory (a new thumbnail).
    Bytes(Vec<u8>),
}

/// A stored file (or a thumbnail).
#[derive(Debug)]
pub struct Content {
    /// The bytes.
    pub body: Body,
    /// Declared content type.
    pub content_type: Option<String>,
    /// Declared file name.
    pub filename: Option<String>,
}

async fn open_file(path: &Path) -> std::io::Result<Body> {
    let file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    Ok(Body::File(file, len))
}

fn not_found() -> Error {
    Error::NotFound("Media not found".into())
}

/// The row of local, uploaded media: 404 for unknown ids and for other
/// servers' media (no federation yet), 504 while not yet uploaded.
async fn uploaded_row(state: &AppState, server: &str, id: &str) -> Result<media::MediaRow> {
    if server != state.settings.server_name.as_str() || !valid_media_id(id) {
        return Err(not_found());
    }
    let row = media::get(&state.db, id).await?.ok_or_else(not_found)?;
    if !row.uploaded {
        return Err(Error::NotYetUploaded);
    }
    Ok(row)
}

/// Opens local media for streaming.
pub async fn fetch(state: &AppState, server: &str, id: &str) -> Result<Content> {
    let row = uploaded_row(state, server, id).await?;
    let body = open_file(&file_path(state, id)).await.map_err(|_| not_found())?;
    Ok(Content { body, content_type: row.content_type, filename: row.filename })
}

/// How to fit a thumbnail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Fill the box exactly, cropping.
    Crop,
    /// Fit inside the box, keeping the aspect ratio.
    Scale,
}

/// The thumbnail sizes made, smallest first per method (Synapse's defaults).
pub const THUMBNAIL_SIZES: &[(u32, u32, Method)] = &[
    (32, 32, Method::Crop),
    (96, 96, Method::Crop),
    (320, 240, Method::Scale),
    (640, 480, Method::Scale),
    (800, 600, Method::Scale),
];

/// The size served for a request: the smallest of the method's sizes at
/// least as wide and as high as asked, else the method's largest.
pub fn thumbnail_size(width: u32, height: u32, method: Method) -> (u32, u32) {
    let mut sizes = THUMBNAIL_SIZES.iter().filter(|s| s.2 == method);
    let mut largest = (0, 0);
    for &(w, h, _) in sizes.by_ref() {
        if w >= width && h >= height {
            return (w, h);
        }
        largest = (w, h);
    }
    largest
}

/// A thumbnail of local media as PNG, in one of [`THUMBNAIL_SIZES`] (or the
/// original when the image fits that size already). Not an image, or an image
/// of more than `media.max_thumbnail_pixels`: 400 M_UNKNOWN.
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
    let row = uploaded_row(state, server, id).await?;
    let (w, h) = thumbnail_size(width, height, method);
    let dir = media_dir(state).join("thumbnails");
    let cache = thumbnail_path(state, id, w, h, method);
    let png = |body| Content { body, content_type: Some("image/png".into()), filename: None };
    if let Ok(body) = open_file(&cache).await {
        return Ok(png(body));
    }
    let _permit = state.thumbnailing.acquire().await.map_err(|e| Error::Internal(e.to_string()))?;
    // Another request may have made it while this one waited.
    if let Ok(body) = open_file(&cache).await {
        return Ok(png(body));
    }
    let source = file_path(state, id);
    let max_pixels = state.settings.media.max_thumbnail_pixels;
    let made = tokio::task::spawn_blocking(move || make_thumbnail(&source, w, h, method, max_pixels))
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    match made {
        Some(bytes) => {
            // Written aside and renamed, so a concurrent reader never sees half
            // a file; a cache, so not synced.
            let tmp = dir.join(format!("{}.part", new_media_id()));
            let cached = async {
                tokio::fs::create_dir_all(&dir).await?;
                tokio::fs::write(&tmp, &bytes).await?;
                tokio::fs::rename(&tmp, &cache).await
            }
            .await;
            if let Err(e) = cached {
                tracing::warn!(error = %e, "caching a thumbnail failed");
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            Ok(png(Body::Bytes(bytes)))
        }
        None => {
            let body = open_file(&file_path(state, id)).await.map_err(|_| not_found())?;
            Ok(Content { body, content_type: row.content_type, filename: row.filename })
        }
    }
}

/// Decodes the image at `source` and fits it to `width` x `height`, as PNG;
/// `None` when it fits already. The dimensions come from the header first;
/// nothing is decoded above `max_pixels`, and the decoder may allocate at
/// most 8 bytes a pixel of that (16-bit RGBA).
fn make_thumbnail(
    source: &Path,
    width: u32,
    height: u32,
    method: Method,
    max_pixels: u64,
) -> Result<Option<Vec<u8>>> {
    let not_image = || Error::Unknown("This media is not an image a thumbnail can be made of".into());
    let mut reader = image::ImageReader::open(source)
        .map_err(|_| not_found())?
        .with_guessed_format()
        .map_err(|e| Error::Internal(format!("media read: {e}")))?;
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(8));
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(|_| not_image())?;
    let (w, h) = image::ImageDecoder::dimensions(&decoder);
    if u64::from(w) * u64::from(h) > max_pixels {
        return Err(Error::Unknown(format!(
            "The image is too large to thumbnail ({w}x{h} pixels; the limit is {max_pixels})"
        )));
    }
    if w <= width && h <= height {
        return Ok(None);
    }
    let img = image::DynamicImage::from_decoder(decoder).map_err(|e| match e {
        image::ImageError::Limits(_) => {
            Error::Unknown(format!("The image is too large to thumbnail ({w}x{h} pixels)"))
        }
        _ => Error::Unknown("The image could not be decoded".into()),
    })?;
    let thumb = match method {
        Method::Crop => img.resize_to_fill(width.min(w), height.min(h), FilterType::Triangle),
        Method::Scale => img.resize(width, height, FilterType::Triangle),
    };
    let mut out = std::io::Cursor::new(Vec::new());
    thumb
        .write_to(&mut out, image::ImageFormat::Png)
        .map_err(|e| Error::Internal(format!("thumbnail encoding: {e}")))?;
    Ok(Some(out.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbnail_sizes_are_the_smallest_large_enough() {
        assert_eq!(thumbnail_size(33, 33, Method::Crop), (96, 96));
        assert_eq!(thumbnail_size(90, 90, Method::Crop), (96, 96));
        assert_eq!(thumbnail_size(32, 10, Method::Crop), (32, 32));
        assert_eq!(thumbnail_size(97, 1, Method::Crop), (96, 96));
        assert_eq!(thumbnail_size(1, 1, Method::Scale), (320, 240));
        assert_eq!(thumbnail_size(320, 241, Method::Scale), (640, 480));
        assert_eq!(thumbnail_size(2000, 2000, Method::Scale), (800, 600));
    }

    #[test]
    fn decoding_is_bounded() {
        let dir = std::env::temp_dir().join(format!("seqline-media-{}", new_media_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        let img = image::RgbImage::from_pixel(300, 200, image::Rgb([1, 2, 3]));
        img.save_with_format(&path, image::ImageFormat::Png).unwrap();
        // Over the pixel cap: refused from the header.
        let err = make_thumbnail(&path, 32, 32, Method::Crop, 59_999).unwrap_err();
        assert!(err.to_string().contains("300x200"), "{err}");
        // Within it: made.
        let made = make_thumbnail(&path, 32, 32, Method::Crop, 60_000).unwrap().unwrap();
        let thumb = image::load_from_memory(&made).unwrap();
        assert_eq!((thumb.width(), thumb.height()), (32, 32));
        assert!(make_thumbnail(&path, 320, 240, Method::Scale, 60_000).unwrap().is_none());
        std::fs::write(&path, b"not an image").unwrap();
        assert!(matches!(make_thumbnail(&path, 32, 32, Method::Crop, 60_000), Err(Error::Unknown(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
