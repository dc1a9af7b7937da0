//! Bridges ruma's typed endpoints into axum: [`Ruma<T>`] authenticates the
//! caller as the endpoint's auth scheme demands, reads the body within the
//! configured limit, tells "not JSON" from "wrong JSON", and parses the request
//! with ruma; [`RumaResponse`] serialises the typed response; [`route`]
//! mounts a handler on every path (r0 and v3) the endpoint has had.

use std::any::Any;
use std::future::Future;
use std::net::IpAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use ruma::api::auth_scheme::{
    AccessToken, AccessTokenOptional, AppserviceTokenOptional, NoAccessToken, NoAuthentication,
};
use ruma::api::error::{DeserializationError, FromHttpRequestError};
use ruma::api::path_builder::PathBuilder;
use ruma::api::{IncomingRequest, Metadata, OutgoingResponse};
use ruma::api::{IncomingRequestExt, OutgoingResponseExt};

use super::ClientAddress;
use crate::account::{self, Requester};
use crate::error::{Error, Result};
use crate::state::AppState;

/// Whether an endpoint needs an access token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRule {
    /// Never looked at.
    None,
    /// Used when present.
    Optional,
    /// Must be present and valid.
    Required,
}

/// Maps ruma's auth-scheme marker types to what the server checks.
pub trait AuthRule {
    /// The rule for this scheme.
    const RULE: TokenRule;
}

impl AuthRule for NoAuthentication {
    const RULE: TokenRule = TokenRule::None;
}
impl AuthRule for NoAccessToken {
    const RULE: TokenRule = TokenRule::None;
}
/// Login and registration take an optional application-service token; with no
/// application services configured there is nothing to check.
impl AuthRule for AppserviceTokenOptional {
    const RULE: TokenRule = TokenRule::None;
}
impl AuthRule for AccessTokenOptional {
    const RULE: TokenRule = TokenRule::Optional;
}
impl AuthRule for AccessToken {
    const RULE: TokenRule = TokenRule::Required;
}

/// A parsed, authenticated request for endpoint `T`.
#[derive(Debug)]
pub struct Ruma<T> {
    /// The typed request.
    pub body: T,
    /// The caller, when a valid token came with the request.
    pub requester: Option<Requester>,
    /// The peer address of the connection.
    pub client_ip: Option<IpAddr>,
    /// The raw query string, for unstable parameter names ruma does not know.
    pub query: String,
    /// The request body as sent (checked JSON when the endpoint takes one),
    /// for keys ruma's request type has no place for.
    pub raw_body: axum::body::Bytes,
}

impl<T> Ruma<T> {
    /// The caller, for endpoints whose auth scheme requires a token.
    pub fn requester(&self) -> Result<&Requester> {
        self.requester.as_ref().ok_or(Error::MissingToken)
    }

    /// A query parameter by its exact name.
    pub fn query_param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    }

    /// The client address as text, for `last_seen_ip`.
    pub fn ip_string(&self) -> Option<String> {
        self.client_ip.map(|ip| ip.to_string())
    }
}

/// The access token of a request: `Authorization: Bearer` first, else the
/// `access_token` query parameter.
fn access_token(parts: &http::request::Parts) -> Result<Option<String>> {
    if let Some(value) = parts.headers.get(http::header::AUTHORIZATION) {
        let value = value.to_str().map_err(|_| Error::UnknownToken)?;
        // The scheme name is case-insensitive (RFC 6750 / RFC 9110).
        return match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
                Ok(Some(token.trim().to_owned()))
            }
            _ => Err(Error::MissingToken),
        };
    }
    let query = parts.uri.query().unwrap_or("");
    Ok(form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned()))
}

/// A ruma parse failure as a Matrix error.
fn map_parse_error(e: FromHttpRequestError) -> Error {
    match e {
        FromHttpRequestError::MethodMismatch { .. } => Error::MethodNotAllowed,
        FromHttpRequestError::Deserialization(e) => match e {
            DeserializationError::Json(e) => Error::BadJson(format!("Invalid request body: {e}")),
            DeserializationError::Query(e) if e.to_string().starts_with("missing field") => {
                Error::MissingParam(format!("Missing query parameter: {e}"))
            }
            DeserializationError::Query(e) => Error::InvalidParam(format!("Invalid query parameter: {e}")),
            DeserializationError::Ident(e) => Error::InvalidParam(format!("Invalid identifier: {e}")),
            DeserializationError::Header(e) => Error::InvalidParam(format!("Invalid header: {e}")),
            other => Error::BadJson(other.to_string()),
        },
        other => Error::BadJson(other.to_string()),
    }
}

impl<T> FromRequest<AppState> for Ruma<T>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: AuthRule,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let (mut parts, body) = req.into_parts();
        let empty_state_key = parts.extensions.get::<EmptyStateKey>().is_some();
        let client_ip = parts.extensions.get::<ClientAddress>().map(|c| c.0);
        let path_args = path_args(&mut parts, state).await?;

        let requester = match <T::Authentication as AuthRule>::RULE {
            TokenRule::None => None,
            rule => match access_token(&parts)? {
                Some(token) => {
                    let ip = client_ip.map(|ip| ip.to_string());
                    Some(account::authenticate(state, &token, ip.as_deref()).await?)
                }
                None if rule == TokenRule::Required => return Err(Error::MissingToken),
                None => None,
            },
        };

        let bytes = limited_body(state, &parts, body).await?;
        let query = parts.uri.query().unwrap_or("").to_owned();
        let body = parse_request::<T>(parts, &bytes, &path_args, empty_state_key)?;
        if let Some(requester) = &requester {
            limit_per_user(state, requester, &body)?;
        }
        Ok(Self { body, requester, client_ip, query, raw_body: bytes })
    }
}

/// A request's path parameters, in order.
pub async fn path_args(parts: &mut http::request::Parts, state: &AppState) -> Result<Vec<String>> {
    Ok(RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|e| Error::InvalidParam(format!("Invalid path: {e}")))?
        .iter()
        .map(|(_, v)| v.to_owned())
        .collect())
}

/// A JSON request's whole body: refused before reading when its
/// Content-Length is over the limit, else read within the limit and the body
/// read timeout.
pub async fn limited_body(
    state: &AppState,
    parts: &http::request::Parts,
    body: Body,
) -> Result<axum::body::Bytes> {
    limited_body_to(state, parts, body, state.settings.max_request_body_bytes).await
}

/// [`limited_body`] with another limit (`limit` bytes).
pub async fn limited_body_to(
    state: &AppState,
    parts: &http::request::Parts,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes> {
    if let Some(len) = parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok())
        && len.parse::<usize>().is_ok_and(|n| n > limit)
    {
        return Err(too_large(limit));
    }
    read_body(state, body, limit, || too_large(limit)).await
}

/// User-interactive auth: an `auth` object with neither `type` nor `session`
/// (what some clients, matrix-nio's token registration among them, send
/// first) asks for nothing yet. It is dropped, so the endpoint answers 401
/// with its flows and a new session, as if `auth` were absent.
fn without_empty_auth(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    const KEY: &[u8] = b"\"auth\"";
    if !bytes.windows(KEY.len()).any(|w| w == KEY) {
        return Cow::Borrowed(bytes);
    }
    let Ok(mut body) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes) else {
        return Cow::Borrowed(bytes);
    };
    let empty = body
        .get("auth")
        .and_then(serde_json::Value::as_object)
        .is_some_and(|auth| !auth.contains_key("type") && !auth.contains_key("session"));
    if !empty {
        return Cow::Borrowed(bytes);
    }
    body.remove("auth");
    serde_json::to_vec(&body).map_or(Cow::Borrowed(bytes), Cow::Owned)
}

/// The per-user and per-room limits, all in one place, by the endpoint's
/// request type: sends, state and redactions; joins; invites per room and per
/// invitee (createRoom's included); presence. Charged once the request has
/// parsed (a malformed request costs nothing), before the handler changes anything.
fn limit_per_user(state: &AppState, requester: &Requester, body: &dyn Any) -> Result<()> {
    use crate::ratelimit::Action;
    use ruma::api::client::{
        knock, membership, message, presence, profile, redact, room, state as room_state,
    };

    let limiter = &state.rate_limiter;
    let user = requester.user_id.as_str();
    // Every request that puts an event into rooms counts as a send:
    // messages, state, redactions, leaves, kicks, bans, unbans, and profile
    // changes (copied into the member event of every joined room).
    if body.is::<message::send_message_event::v3::Request>()
        || body.is::<room_state::send_state_event::v3::Request>()
        || body.is::<redact::redact_event::v3::Request>()
        || body.is::<membership::leave_room::v3::Request>()
        || body.is::<membership::kick_user::v3::Request>()
        || body.is::<membership::ban_user::v3::Request>()
        || body.is::<membership::unban_user::v3::Request>()
        || body.is::<profile::set_profile_field::v3::Request>()
        || body.is::<profile::delete_profile_field::v3::Request>()
    {
        limiter.check(Action::Message, user)
    } else if body.is::<membership::join_room_by_id::v3::Request>()
        || body.is::<membership::join_room_by_id_or_alias::v3::Request>()
        || body.is::<knock::knock_room::v3::Request>()
    {
        limiter.check(Action::Join, user)
    } else if let Some(invite) = body.downcast_ref::<membership::invite_user::v3::Request>() {
        match &invite.recipient {
            membership::invite_user::v3::InvitationRecipient::UserId(recipient) => {
                // Neither bucket is charged unless both have room.
                limiter.peek(Action::InviteUser, recipient.user_id.as_str())?;
                limiter.check(Action::InviteRoom, invite.room_id.as_str())?;
                limiter.check(Action::InviteUser, recipient.user_id.as_str())
            }
            _ => limiter.check(Action::InviteRoom, invite.room_id.as_str()),
        }
    } else if let Some(create) = body.downcast_ref::<room::create_room::v3::Request>() {
        // A new room is a send (of several events); its invitees count as
        // invited: all have room, or none is charged.
        limiter.peek(Action::Message, user)?;
        for invitee in &create.invite {
            limiter.peek(Action::InviteUser, invitee.as_str())?;
        }
        limiter.check(Action::Message, user)?;
        create.invite.iter().try_for_each(|invitee| limiter.check(Action::InviteUser, invitee.as_str()))
    } else if body.is::<presence::set_presence::v3::Request>() {
        limiter.check(Action::Presence, user)
    } else {
        Ok(())
    }
}

/// Parses endpoint `T`'s request from its head, its whole body and its path
/// arguments: the body must be JSON ([`check_json`]), an empty POST or PUT
/// body means `{}`, and no path argument may hold a NUL. Every error is a
/// Matrix error; nothing here panics on any input (the fuzz targets and the
/// property tests drive it).
pub fn parse_request<T: IncomingRequest>(
    parts: http::request::Parts,
    bytes: &[u8],
    path_args: &[String],
    empty_state_key: bool,
) -> Result<T> {
    if !bytes.is_empty() {
        check_json(bytes)?;
    }
    if path_args.iter().any(|a| a.contains('\0')) {
        return Err(Error::InvalidParam("Path parameters must not contain NUL characters".into()));
    }
    // An empty body means no parameters (clients send none for e.g. POST /join).
    let bytes: std::borrow::Cow<'_, [u8]> =
        if bytes.is_empty() && matches!(parts.method, http::Method::POST | http::Method::PUT) {
            std::borrow::Cow::Borrowed(b"{}")
        } else if matches!(parts.method, http::Method::POST | http::Method::DELETE) {
            without_empty_auth(bytes)
        } else {
            std::borrow::Cow::Borrowed(bytes)
        };
    let mut args: Vec<&str> = path_args.iter().map(String::as_str).collect();
    if empty_state_key {
        args.push("");
    }
    let request = http::Request::from_parts(parts, &bytes[..]);
    T::try_from_http_request(request, &args).map_err(map_parse_error)
}

/// How deeply a request body may nest arrays and objects. Below serde_json's
/// own limit (128), so that an event's content, wrapped in a PDU and in a
/// `/sync` response, still parses for clients and servers that use it.
pub const MAX_BODY_DEPTH: usize = 100;

/// Whether `bytes` is one JSON value the server takes: UTF-8 JSON text
/// (else `M_NOT_JSON`), with no object holding a key twice, nothing nested
/// deeper than [`MAX_BODY_DEPTH`] and no number beyond a double (else
/// `M_BAD_JSON`: valid JSON, refused). Duplicate keys are refused because
/// parsers disagree on them (first wins, last wins, or an error).
pub fn check_json(bytes: &[u8]) -> Result<()> {
    use serde::de::DeserializeSeed as _;
    let not_json =
        |e: &dyn std::fmt::Display| Error::NotJson(format!("The request body is not valid JSON: {e}"));
    // serde_json checks the UTF-8 of the strings it reads, but not of
    // whitespace errors it reports; checking the whole text first is simplest.
    std::str::from_utf8(bytes).map_err(|e| not_json(&e))?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let checked = JsonCheck { depth: 0 }.deserialize(&mut de).and_then(|()| de.end());
    match checked {
        Ok(()) => Ok(()),
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            Err(Error::BadJson(format!("Invalid request body: {e}")))
        }
        // serde_json calls this a syntax error; it is valid JSON that no
        // canonical JSON number can hold.
        Err(e) if e.to_string().starts_with("number out of range") => {
            Err(Error::BadJson(format!("Invalid request body: {e}")))
        }
        Err(e) => Err(not_json(&e)),
    }
}

/// Walks a JSON value checking depth and key uniqueness, keeping nothing
/// but the keys of the object being read.
#[derive(Clone, Copy)]
struct JsonCheck {
    depth: usize,
}

impl JsonCheck {
    fn deeper<E: serde::de::Error>(self) -> std::result::Result<Self, E> {
        if self.depth >= MAX_BODY_DEPTH {
            return Err(E::custom(format!("nested deeper than {MAX_BODY_DEPTH} levels")));
        }
        Ok(Self { depth: self.depth + 1 })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonCheck {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonCheck {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        use serde::de::Error as _;
        let inner = self.deeper()?;
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            map.next_value_seed(inner)?;
            if keys.contains(&key) {
                return Err(A::Error::custom(format!("the key {key:?} appears twice in one object")));
            }
            keys.insert(key);
        }
        Ok(())
    }
}

/// Reads a whole JSON request body: at most `limit` bytes (else `too_large`),
/// within the body read timeout in all (else 408). Media uploads, which may be
/// large, use [`read_upload_body`] instead.
pub async fn read_body(
    state: &AppState,
    body: Body,
    limit: usize,
    too_large: impl FnOnce() -> Error,
) -> Result<axum::body::Bytes> {
    match tokio::time::timeout(state.settings.body_read_timeout, read_upload_body(body, limit, too_large))
        .await
    {
        Ok(read) => read,
        Err(_) => Err(body_timeout()),
    }
}

/// Reads a whole request body of at most `limit` bytes. No total deadline:
/// the router's body timeout closes one that stalls between chunks for longer
/// than the body read timeout (then 408).
pub async fn read_upload_body(
    body: Body,
    limit: usize,
    too_large: impl FnOnce() -> Error,
) -> Result<axum::body::Bytes> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let inner = e.into_inner();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
        while let Some(err) = source {
            if err.is::<tower_http::timeout::TimeoutError>() {
                return body_timeout();
            }
            source = err.source();
        }
        too_large()
    })
}

fn body_timeout() -> Error {
    Error::RequestTimeout("The request body was not received in time".into())
}

fn too_large(limit: usize) -> Error {
    Error::TooLarge(format!("The request body is larger than {limit} bytes"))
}

/// The authenticated caller, for seqline's own endpoints (which have no ruma
/// request type): the same token rules as [`Ruma`] with a required token.
#[derive(Debug)]
pub struct Authed(pub Requester);

impl FromRequestParts<AppState> for Authed {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut http::request::Parts, state: &AppState) -> Result<Self> {
        let token = access_token(parts)?.ok_or(Error::MissingToken)?;
        let ip = parts.extensions.get::<ClientAddress>().map(|c| c.0.to_string());
        Ok(Self(account::authenticate(state, &token, ip.as_deref()).await?))
    }
}

/// A request body checked to be JSON (or empty), kept as bytes for a
/// parser of its own: the same limit and M_NOT_JSON as [`JsonBody`].
#[derive(Debug)]
pub struct RawJson(pub axum::body::Bytes);

impl FromRequest<AppState> for RawJson {
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let limit = state.settings.max_request_body_bytes;
        let bytes = read_body(state, req.into_body(), limit, || too_large(limit)).await?;
        if !bytes.iter().all(u8::is_ascii_whitespace) {
            check_json(&bytes)?;
        }
        Ok(Self(bytes))
    }
}

/// A JSON body for seqline's own endpoints, with the same limit and the same
/// M_NOT_JSON / M_BAD_JSON distinction as [`Ruma`].
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let limit = state.settings.max_request_body_bytes;
        let bytes = read_body(state, req.into_body(), limit, || too_large(limit)).await?;
        let bytes = if bytes.is_empty() { axum::body::Bytes::from_static(b"{}") } else { bytes };
        check_json(&bytes)?;
        serde_json::from_slice(&bytes)
            .map(Self)
            .map_err(|e| Error::BadJson(format!("Invalid request body: {e}")))
    }
}

/// A typed ruma response as an axum response.
#[derive(Debug)]
pub struct RumaResponse<R>(pub R);

impl<R: OutgoingResponse> IntoResponse for RumaResponse<R> {
    fn into_response(self) -> Response {
        match self.0.try_into_http_response::<Vec<u8>>() {
            Ok(response) => response.map(Body::from),
            Err(e) => Error::Internal(format!("cannot serialise the response: {e}")).into_response(),
        }
    }
}

/// Mounts `handler` for endpoint `T` on every path the spec has given it.
pub fn route<T, F, Fut>(router: Router<AppState>, handler: F) -> Router<AppState>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: AuthRule,
    T::OutgoingResponse: Send + 'static,
    F: Fn(AppState, Ruma<T>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T::OutgoingResponse>> + Send + 'static,
{
    mount::<T, _, _, _>(router, move |state, req| {
        let handler = handler.clone();
        async move { handler(state, req).await.map(RumaResponse) }
    })
}

/// Like [`route`], for handlers that answer with JSON they build themselves:
/// where ruma's response type cannot say what clients need (a field ruma
/// omits at its default value, say).
pub fn route_json<T, F, Fut>(router: Router<AppState>, handler: F) -> Router<AppState>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: AuthRule,
    F: Fn(AppState, Ruma<T>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<serde_json::Value>> + Send + 'static,
{
    mount::<T, _, _, _>(router, move |state, req| {
        let handler = handler.clone();
        async move { handler(state, req).await.map(axum::Json) }
    })
}

/// Marks a request routed to a state endpoint without its `{state_key}`
/// segment (`.../state/m.room.name` or `.../state/m.room.name/`, as clients
/// send for the empty state key).
#[derive(Debug, Clone, Copy)]
struct EmptyStateKey;

/// Like [`route`] for endpoints whose last path segment is `{state_key}`:
/// also answers the forms without it, meaning the empty state key.
pub fn route_state<T, F, Fut, R>(router: Router<AppState>, handler: F) -> Router<AppState>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: AuthRule,
    F: Fn(AppState, Ruma<T>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<R>> + Send + 'static,
    R: IntoResponse + 'static,
{
    let filter = method_filter::<T>();
    let mut router = mount::<T, _, _, _>(router, handler.clone());
    for path in <T as Metadata>::PATH_BUILDER.all_paths() {
        let Some(base) = path.strip_suffix("/{state_key}") else { continue };
        for short in [base.to_owned(), format!("{base}/")] {
            let handler = handler.clone();
            router = router.route(
                &short,
                on(filter, move |State(state): State<AppState>, mut req: Request| async move {
                    req.extensions_mut().insert(EmptyStateKey);
                    match Ruma::<T>::from_request(req, &state).await {
                        Ok(parsed) => handler(state, parsed).await.map(IntoResponse::into_response),
                        Err(e) => Err(e),
                    }
                }),
            );
        }
    }
    router
}

fn method_filter<T: Metadata>() -> MethodFilter {
    match MethodFilter::try_from(<T as Metadata>::METHOD) {
        Ok(filter) => filter,
        Err(_) => panic!("endpoint with unsupported method {}", <T as Metadata>::METHOD),
    }
}

fn mount<T, F, Fut, R>(mut router: Router<AppState>, handler: F) -> Router<AppState>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: AuthRule,
    F: Fn(AppState, Ruma<T>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<R>> + Send + 'static,
    R: IntoResponse + 'static,
{
    let filter = method_filter::<T>();
    for path in <T as Metadata>::PATH_BUILDER.all_paths() {
        let handler = handler.clone();
        router = router.route(
            path,
            on(filter, move |State(state): State<AppState>, req: Ruma<T>| async move {
                handler(state, req).await
            }),
        );
    }
    router
}
