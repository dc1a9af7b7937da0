//! Media endpoints: upload (direct, and `/v1/create` + `PUT`), download and
//! thumbnails (authenticated `/_matrix/client/v1/media/...` and the legacy
//! `/_matrix/media/v3/...`), config, URL previews (see [`crate::preview`]).
//!
//! Downloads are served so a browser never runs them: a sandboxing CSP,
//! `nosniff`, and `attachment` unless the type is on the spec's inline list.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde_json::json;

use crate::api::extract::Authed;
use crate::error::{Error, Result};
use crate::media::{self, Content, INLINE_TYPES, Method};
use crate::state::AppState;
use tokio_util::io::ReaderStream;

/// Adds the media routes.
pub fn routes(router: Router<AppState>) -> Router<AppState> {
    let mut router = router
        .route("/_matrix/media/v1/create", post(create))
        .route("/_matrix/client/v1/media/config", get(config_authed))
        .route("/_matrix/client/v1/media/download/{server}/{id}", get(download_authed))
        .route("/_matrix/client/v1/media/download/{server}/{id}/{filename}", get(download_authed_named))
        .route("/_matrix/client/v1/media/thumbnail/{server}/{id}", get(thumbnail_authed))
        .route("/_matrix/client/v1/media/preview_url", get(preview));
    for version in ["v3", "r0"] {
        router = router
            .route(&format!("/_matrix/media/{version}/upload"), post(upload))
            .route(&format!("/_matrix/media/{version}/upload/{{server}}/{{id}}"), put(upload_to))
            .route(&format!("/_matrix/media/{version}/config"), get(config))
            .route(&format!("/_matrix/media/{version}/download/{{server}}/{{id}}"), get(download_legacy))
            .route(
                &format!("/_matrix/media/{version}/download/{{server}}/{{id}}/{{filename}}"),
                get(download_legacy_named),
            )
            .route(&format!("/_matrix/media/{version}/thumbnail/{{server}}/{{id}}"), get(thumbnail_legacy))
            .route(&format!("/_matrix/media/{version}/preview_url"), get(preview));
    }
    router
}

#[derive(Debug, Deserialize)]
struct UploadQuery {
    filename: Option<String>,
}

fn content_uri(state: &AppState, id: &str) -> String {
    format!("mxc://{}/{id}", state.settings.server_name)
}

async fn read_upload(state: &AppState, req: Request) -> Result<(Option<String>, axum::body::Bytes)> {
    let limit = state.settings.max_upload_bytes;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(media::media_type)
        .filter(|s| !s.is_empty());
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok())
        && len.parse::<usize>().is_ok_and(|n| n > limit)
    {
        return Err(Error::TooLarge(format!("Uploads are limited to {limit} bytes")));
    }
    let bytes = crate::api::extract::read_upload_body(req.into_body(), limit, || {
        Error::TooLarge(format!("Uploads are limited to {limit} bytes"))
    })
    .await?;
    Ok((content_type, bytes))
}

async fn upload(
    State(state): State<AppState>,
    Authed(me): Authed,
    Query(q): Query<UploadQuery>,
    req: Request,
) -> Result<axum::Json<serde_json::Value>> {
    let (content_type, bytes) = read_upload(&state, req).await?;
    let id = media::store(
        &state,
        me.user_id.as_str(),
        None,
        content_type.as_deref(),
        q.filename.as_deref(),
        &bytes,
    )
    .await?;
    Ok(axum::Json(json!({ "content_uri": content_uri(&state, &id) })))
}

async fn create(State(state): State<AppState>, Authed(me): Authed) -> Result<axum::Json<serde_json::Value>> {
    let reserved = media::create(&state, me.user_id.as_str()).await?;
    Ok(axum::Json(json!({
        "content_uri": content_uri(&state, &reserved.id),
        "unused_expires_at": reserved.expires_at,
    })))
}

async fn upload_to(
    State(state): State<AppState>,
    Authed(me): Authed,
    Path((server, id)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    req: Request,
) -> Result<axum::Json<serde_json::Value>> {
    if server != state.settings.server_name.as_str() {
        return Err(Error::Forbidden("Uploads go to this server's own media ids".into()));
    }
    let (content_type, bytes) = read_upload(&state, req).await?;
    media::store(
        &state,
        me.user_id.as_str(),
        Some(&id),
        content_type.as_deref(),
        q.filename.as_deref(),
        &bytes,
    )
    .await?;
    Ok(axum::Json(json!({})))
}

async fn config(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "m.upload.size": state.settings.max_upload_bytes }))
}

async fn config_authed(state: State<AppState>, _me: Authed) -> axum::Json<serde_json::Value> {
    config(state).await
}

/// RFC 5987 encoding for `filename*`.
fn encode_filename(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn serve(content: Content, filename: Option<&str>) -> Response {
    let content_type = content.content_type.unwrap_or_else(|| "application/octet-stream".to_owned());
    let inline = INLINE_TYPES.contains(&content_type.as_str());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    let disposition = match filename.or(content.filename.as_deref()) {
        Some(name) => format!(
            "{}; filename*=utf-8''{}",
            if inline { "inline" } else { "attachment" },
            encode_filename(name)
        ),
        None => (if inline { "inline" } else { "attachment" }).to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf; style-src 'unsafe-inline'; media-src 'self'; object-src 'self';",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert("cross-origin-resource-policy", HeaderValue::from_static("cross-origin"));
    let body = match content.body {
        media::Body::Bytes(bytes) => Body::from(bytes),
        media::Body::File(file, len) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            Body::from_stream(ReaderStream::with_capacity(file, 64 * 1024))
        }
    };
    (StatusCode::OK, headers, body).into_response()
}

async fn download(state: &AppState, server: &str, id: &str, filename: Option<&str>) -> Result<Response> {
    Ok(serve(media::fetch(state, server, id).await?, filename))
}

async fn download_authed(
    State(state): State<AppState>,
    _me: Authed,
    Path((server, id)): Path<(String, String)>,
) -> Result<Response> {
    download(&state, &server, &id, None).await
}

async fn download_authed_named(
    State(state): State<AppState>,
    _me: Authed,
    Path((server, id, filename)): Path<(String, String, String)>,
) -> Result<Response> {
    download(&state, &server, &id, Some(&filename)).await
}

async fn download_legacy(
    State(state): State<AppState>,
    Path((server, id)): Path<(String, String)>,
) -> Result<Response> {
    download(&state, &server, &id, None).await
}

async fn download_legacy_named(
    State(state): State<AppState>,
    Path((server, id, filename)): Path<(String, String, String)>,
) -> Result<Response> {
    download(&state, &server, &id, Some(&filename)).await
}

#[derive(Debug, Deserialize)]
struct ThumbQuery {
    width: Option<String>,
    height: Option<String>,
    method: Option<String>,
}

async fn thumb(state: &AppState, server: &str, id: &str, q: ThumbQuery) -> Result<Response> {
    let dim = |v: Option<String>, name: &str| -> Result<u32> {
        v.ok_or_else(|| Error::MissingParam(format!("{name} is required")))?
            .parse()
            .map_err(|_| Error::InvalidParam(format!("{name} must be a number")))
    };
    let width = dim(q.width, "width")?;
    let height = dim(q.height, "height")?;
    let method = match q.method.as_deref() {
        None | Some("scale") => Method::Scale,
        Some("crop") => Method::Crop,
        Some(other) => return Err(Error::InvalidParam(format!("Unknown thumbnail method {other:?}"))),
    };
    Ok(serve(media::thumbnail(state, server, id, width, height, method).await?, None))
}

async fn thumbnail_authed(
    State(state): State<AppState>,
    _me: Authed,
    Path((server, id)): Path<(String, String)>,
    Query(q): Query<ThumbQuery>,
) -> Result<Response> {
    thumb(&state, &server, &id, q).await
}

async fn thumbnail_legacy(
    State(state): State<AppState>,
    Path((server, id)): Path<(String, String)>,
    Query(q): Query<ThumbQuery>,
) -> Result<Response> {
    thumb(&state, &server, &id, q).await
}

#[derive(Debug, Deserialize)]
struct PreviewQuery {
    url: Option<String>,
    /// The point in time wanted; previews are served as made last, so
    /// this is only checked to be a number.
    ts: Option<String>,
}

async fn preview(
    State(state): State<AppState>,
    Authed(me): Authed,
    Query(q): Query<PreviewQuery>,
) -> Result<axum::Json<serde_json::Value>> {
    let url = q.url.ok_or_else(|| Error::MissingParam("url is required".into()))?;
    if let Some(ts) = q.ts
        && ts.parse::<i64>().is_err()
    {
        return Err(Error::InvalidParam("ts must be a number of milliseconds".into()));
    }
    let og = crate::preview::preview(&state, me.user_id.as_str(), &url).await?;
    Ok(axum::Json(serde_json::Value::Object(og)))
}
