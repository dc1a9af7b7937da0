//! URL previews (`GET /_matrix/client/v1/media/preview_url`): the page is
//! fetched through [`crate::outbound::Outbound`] (no internal addresses, no
//! proxies; redirects followed here, each hop checked again), read up to
//! `media.url_preview_max_bytes`, and its Open Graph tags returned; the
//! image it names (or the URL itself, when it is an image) is fetched the
//! same way and stored as this server's media, so clients load it from here.
//!
//! The stored image expires after [`IMAGE_LIFETIME_MS`] (`media::expire`,
//! hourly). A preview is kept in `url_previews` for [`CACHE_MS`] and served to anyone
//! who asks for the same URL meanwhile; one fetch per URL runs at a time (the
//! others wait for its result), at most [`MAX_FETCHES`] at once in all and
//! [`MAX_PER_USER`] per user, and each user's fetches are rate limited
//! (`rate_limits.url_preview_*`).

pub mod html;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{ACCEPT, ACCEPT_LANGUAGE, CONTENT_TYPE, LOCATION};
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::outbound::{Outbound, OutboundError, read_capped};
use crate::ratelimit::Action;
use crate::state::AppState;
use crate::storage::{self, media as store};

/// How long a preview is served again before the page is fetched anew.
pub const CACHE_MS: i64 = 60 * 60 * 1000;
/// How long the image a preview stored is kept (Synapse's two days): long
/// after every cached preview naming it has expired.
pub const IMAGE_LIFETIME_MS: i64 = 2 * 24 * 60 * 60 * 1000;
/// Page (and image) fetches under way at once, over all users.
pub const MAX_FETCHES: usize = 8;
/// Previews one user may have under way at once (more: 429), so that no
/// one user holds all of [`MAX_FETCHES`].
pub const MAX_PER_USER: usize = 2;
/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 10;
/// Longest URL previewed.
const MAX_URL_LEN: usize = 2048;
/// Time one fetch may take in all (connect, redirects, body).
const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// What is shared between preview requests.
#[derive(Debug)]
pub struct Previews {
    /// The outbound client previews fetch with: the same refusals as every
    /// outbound request, exempting only `media.url_preview_ip_allow` (not
    /// `outbound.ip_allow`). `Err` when it could not be built.
    client: Result<Outbound, String>,
    /// One lock per URL being previewed now.
    in_flight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Previews under way per user.
    per_user: Mutex<HashMap<String, usize>>,
    slots: tokio::sync::Semaphore,
}

impl Previews {
    /// Previews fetching under the default refusals less `allow`.
    pub fn new(allow: Vec<ipnet::IpNet>) -> Self {
        Self {
            client: Outbound::new(allow).map_err(|e| e.to_string()),
            in_flight: Mutex::default(),
            per_user: Mutex::default(),
            slots: tokio::sync::Semaphore::new(MAX_FETCHES),
        }
    }

    /// One of `user`'s [`MAX_PER_USER`] places, or 429 when all are taken.
    fn user_slot<'a>(&'a self, user: &'a str) -> Result<UserSlot<'a>> {
        let mut counts = self.per_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = counts.entry(user.to_owned()).or_default();
        if *count >= MAX_PER_USER {
            return Err(Error::LimitExceeded { retry_after_ms: 1000 });
        }
        *count += 1;
        Ok(UserSlot { previews: self, user })
    }

    fn lock_for<'a>(&'a self, url: &'a str) -> InFlight<'a> {
        let mut map = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        InFlight { previews: self, url, lock: map.entry(url.to_owned()).or_default().clone() }
    }
}

/// A user's place among their previews under way, given up when dropped.
struct UserSlot<'a> {
    previews: &'a Previews,
    user: &'a str,
}

impl Drop for UserSlot<'_> {
    fn drop(&mut self) {
        let mut counts = self.previews.per_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(self.user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(self.user);
            }
        }
    }
}

/// A URL's place in the in-flight map, given up when dropped (also when the
/// request is abandoned half way: the client went away).
struct InFlight<'a> {
    previews: &'a Previews,
    url: &'a str,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut map = self.previews.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map's reference and this one: no one else waits for the URL.
        if Arc::strong_count(&self.lock) <= 2 {
            map.remove(self.url);
        }
    }
}

/// The preview of `url` for `user`: from the cache, or fetched now.
pub async fn preview(state: &AppState, user: &str, url: &str) -> Result<Map<String, Value>> {
    if !state.settings.media.url_previews {
        return Err(Error::Unrecognized);
    }
    let mut parsed = parse_url(url)?;
    // The fragment never reaches the page's server: one preview for all of them.
    parsed.set_fragment(None);
    let key = parsed.as_str().to_owned();
    let url = key.as_str();
    if let Some(cached) = cached(state, url).await? {
        return Ok(cached);
    }
    let _mine = state.previews.user_slot(user)?;
    state.rate_limiter.check(Action::UrlPreview, user)?;
    let in_flight = state.previews.lock_for(url);
    let _turn = in_flight.lock.lock().await;
    // Another request may have made it while this one waited.
    if let Some(cached) = cached(state, url).await? {
        return Ok(cached);
    }
    let preview = make(state, user, parsed).await?;
    let now = storage::now_ms();
    store::cache_preview(&state.db, url, &Value::Object(preview.clone()).to_string(), now, now + CACHE_MS)
        .await?;
    Ok(preview)
}

/// `url` as an http(s) URL with a host: 400 M_INVALID_PARAM otherwise.
fn parse_url(url: &str) -> Result<Url> {
    let invalid = |why: &str| Error::InvalidParam(format!("url: {why}"));
    if url.len() > MAX_URL_LEN {
        return Err(invalid(&format!("longer than {MAX_URL_LEN} bytes")));
    }
    let parsed = Url::parse(url).map_err(|_| invalid("not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("only http and https URLs are previewed"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("the URL has no host"));
    }
    Ok(parsed)
}

async fn cached(state: &AppState, url: &str) -> Result<Option<Map<String, Value>>> {
    let Some(text) = store::cached_preview(&state.db, url, storage::now_ms()).await? else { return Ok(None) };
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        _ => Ok(None),
    }
}

/// Fetches `url` and makes its preview: an HTML page's Open Graph tags with
/// its image stored here, or an image's own details; anything else previews
/// as nothing (`{}`).
async fn make(state: &AppState, user: &str, url: Url) -> Result<Map<String, Value>> {
    let page = fetch(state, url).await?;
    let media_type = page.media_type();
    if media_type.starts_with("image/") {
        return Ok(store_image(state, user, page).await?.unwrap_or_default());
    }
    if !matches!(media_type.as_str(), "text/html" | "application/xhtml+xml") {
        return Ok(Map::new());
    }
    let charset = page.content_type.as_deref().and_then(html::charset_param);
    let base = page.url.clone();
    let body = page.body;
    // Tokenizing megabytes of HTML is CPU work: off the async threads.
    let mut og = tokio::task::spawn_blocking(move || {
        let text = html::decode(&body, charset.as_deref());
        html::open_graph(&text, &base)
    })
    .await
    .map_err(|e| Error::Internal(format!("preview parsing: {e}")))?;
    let image = og.get("og:image").and_then(Value::as_str).and_then(|u| Url::parse(u).ok());
    if let Some(image_url) = image {
        let stored = match fetch(state, image_url.clone()).await {
            Ok(fetched) if fetched.media_type().starts_with("image/") => {
                store_image(state, user, fetched).await?
            }
            Ok(_) => None,
            Err(e) => {
                tracing::info!(url = %image_url, error = %e, "a preview's image could not be fetched");
                None
            }
        };
        // Nothing may send clients to the image's own host (their address
        // would go with it): the stored copy stands for all of these.
        for key in
            ["og:image:width", "og:image:height", "og:image:type", "og:image:url", "og:image:secure_url"]
        {
            og.remove(key);
        }
        match stored {
            Some(details) => og.extend(details),
            None => {
                og.remove("og:image");
            }
        }
    }
    Ok(og)
}

/// An image fetched, stored as media of `user`: `og:image` (its mxc URI),
/// `og:image:type`, `matrix:image:size` and, when its header tells,
/// `og:image:width` and `og:image:height`. `None` when it is empty.
async fn store_image(state: &AppState, user: &str, image: Fetched) -> Result<Option<Map<String, Value>>> {
    if image.body.is_empty() {
        return Ok(None);
    }
    let media_type = image.media_type();
    let filename = image.url.path_segments().and_then(|mut s| s.next_back()).filter(|s| !s.is_empty());
    // The expiry is in the row from the start: no crash leaves it for good.
    let expires = storage::now_ms() + IMAGE_LIFETIME_MS;
    let id =
        crate::media::store_new(state, user, Some(&media_type), filename, &image.body, Some(expires)).await?;
    let mut details = Map::new();
    details.insert("og:image".into(), json!(format!("mxc://{}/{id}", state.settings.server_name)));
    details.insert("og:image:type".into(), json!(media_type));
    details.insert("matrix:image:size".into(), json!(image.body.len()));
    let dimensions = image::ImageReader::new(std::io::Cursor::new(&image.body))
        .with_guessed_format()
        .ok()
        .and_then(|reader| reader.into_dimensions().ok());
    if let Some((width, height)) = dimensions {
        details.insert("og:image:width".into(), json!(width));
        details.insert("og:image:height".into(), json!(height));
    }
    Ok(Some(details))
}

/// A fetched resource.
#[derive(Debug)]
struct Fetched {
    /// Where it was found (after redirects).
    url: Url,
    content_type: Option<String>,
    body: Vec<u8>,
}

impl Fetched {
    /// The Content-Type without parameters, lower case.
    fn media_type(&self) -> String {
        crate::media::media_type(self.content_type.as_deref().unwrap_or_default())
    }
}

/// GETs `url`, following redirects (each hop held to the address policy),
/// reading at most `media.url_preview_max_bytes`. Waits for one of the
/// [`MAX_FETCHES`] slots.
async fn fetch(state: &AppState, url: Url) -> Result<Fetched> {
    let max = state.settings.media.url_preview_max_bytes;
    // Waiting for a slot counts against the time too: slow pages holding
    // every slot make the others time out, not hang.
    let fetched = async {
        let _slot = state.previews.slots.acquire().await.map_err(|e| Error::Internal(e.to_string()))?;
        fetch_following(state, url, max).await
    };
    tokio::time::timeout(FETCH_TIMEOUT, fetched)
        .await
        .map_err(|_| Error::RemoteTimeout("The page took too long to answer".into()))?
}

async fn fetch_following(state: &AppState, mut url: Url, max: usize) -> Result<Fetched> {
    let client =
        state.previews.client.as_ref().map_err(|e| Error::Internal(format!("preview client: {e}")))?;
    for _ in 0..=MAX_REDIRECTS {
        let response = client
            .request(reqwest::Method::GET, url.as_str())
            .map_err(outbound_error)?
            .header(ACCEPT, "text/html,application/xhtml+xml;q=0.9,image/*;q=0.8,*/*;q=0.5")
            .header(ACCEPT_LANGUAGE, "en")
            .send()
            .await
            .map_err(|e| outbound_error(e.into()))?;
        let status = response.status();
        if status.is_redirection() {
            let next = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|location| url.join(location).ok())
                .filter(|next| matches!(next.scheme(), "http" | "https"))
                .ok_or_else(|| {
                    Error::RemoteUnavailable(format!("The page redirected ({status}) nowhere usable"))
                })?;
            url = next;
            continue;
        }
        if !status.is_success() {
            return Err(Error::RemoteUnavailable(format!("The page answered {status}")));
        }
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = read_capped(response, max).await.map_err(outbound_error)?;
        return Ok(Fetched { url, content_type, body });
    }
    Err(Error::RemoteUnavailable(format!("The page redirected more than {MAX_REDIRECTS} times")))
}

/// An outbound failure as the client sees it: a refused address 403, too
/// large 502 M_TOO_LARGE, too slow 504, the rest 502 (unreachable, a name
/// resolving to refused addresses only, TLS).
fn outbound_error(e: OutboundError) -> Error {
    match e {
        OutboundError::Refused(host) => {
            Error::Forbidden(format!("{host}: previews of this address are not allowed"))
        }
        OutboundError::BadUrl(url) => Error::RemoteUnavailable(format!("{url}: not an http(s) URL")),
        OutboundError::TooLarge(max) => Error::RemoteTooLarge(format!("The page is larger than {max} bytes")),
        OutboundError::Http(e) if e.is_timeout() => {
            Error::RemoteTimeout("The page took too long to answer".into())
        }
        other => {
            // The cause stays in the log: its wording (a name that resolves
            // to a refused address, or not at all) would map the network.
            tracing::info!(error = %other, "a page to preview could not be fetched");
            Error::RemoteUnavailable("The page could not be fetched".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_with_a_host_are_previewed() {
        for bad in
            ["", "not a url", "ftp://example.org/x", "file:///etc/passwd", "javascript:alert(1)", "http://"]
        {
            assert!(matches!(parse_url(bad), Err(Error::InvalidParam(_))), "{bad:?}");
        }
        let long = format!("https://example.org/{}", "a".repeat(MAX_URL_LEN));
        assert!(matches!(parse_url(&long), Err(Error::InvalidParam(_))));
        assert!(parse_url("https://example.org/page?q=1#x").is_ok());
    }
}
