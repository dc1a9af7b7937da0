//! The federation listener's application: `/_matrix/federation/*` and
//! `/_matrix/key/*` only. [`Federation<T>`] authenticates the calling server
//! (X-Matrix, verified against the original URI with the origin's keys) for
//! endpoints whose auth scheme asks for it, then parses the request with ruma.

use std::future::Future;

use axum::Router;
use axum::extract::{FromRequest, OriginalUri, Request, State};
use axum::response::IntoResponse;
use axum::routing::{MethodFilter, on, put};
use ruma::api::auth_scheme::NoAuthentication;
use ruma::api::federation::authentication::{ServerSignatures, XMatrix, XMatrixExtractError};
use ruma::api::federation::discovery::{
    get_remote_server_keys, get_remote_server_keys_batch, get_server_keys, get_server_version,
};
use ruma::api::federation::query::{get_profile_information, get_room_information};
use ruma::api::path_builder::PathBuilder;
use ruma::api::{IncomingRequest, Metadata};
use ruma::{OwnedServerName, ServerName, UserId};

mod rooms;
mod user;
mod v1;

use super::extract::RumaResponse;
use crate::error::{Error, Result};
use crate::federation::keys;
use crate::state::AppState;

/// The largest body the federation listener reads (at least: the client
/// API's limit counts when it is larger).
const MAX_FEDERATION_BODY_BYTES: usize = 12 * 1024 * 1024;

/// Whether an endpoint's auth scheme asks for an X-Matrix signature.
pub trait FederationAuth {
    /// True for [`ServerSignatures`].
    const SIGNED: bool;
}

impl FederationAuth for ServerSignatures {
    const SIGNED: bool = true;
}

impl FederationAuth for NoAuthentication {
    const SIGNED: bool = false;
}

/// A parsed federation request for endpoint `T`, with the server that
/// signed it (for signed endpoints).
#[derive(Debug)]
pub struct Federation<T> {
    /// The typed request.
    pub body: T,
    /// The authenticated origin; `None` only for unsigned endpoints.
    pub origin: Option<OwnedServerName>,
}

impl<T> FromRequest<AppState> for Federation<T>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: FederationAuth,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let (parts, path_args, bytes, origin) =
            read(req, state, <T::Authentication as FederationAuth>::SIGNED).await?;
        let body = super::extract::parse_request::<T>(parts, &bytes, &path_args, false)?;
        Ok(Self { body, origin })
    }
}

/// A federation request's parts, path parameters, body (JSON by the client
/// API's rules when not empty) and, when `signed`, the server that signed it.
async fn read(
    req: Request,
    state: &AppState,
    signed: bool,
) -> Result<(http::request::Parts, Vec<String>, axum::body::Bytes, Option<OwnedServerName>)> {
    let (mut parts, body) = req.into_parts();
    let path_args = super::extract::path_args(&mut parts, state).await?;
    // A transaction may hold 50 PDUs of up to 64 KiB and 100 EDUs.
    let limit = state.settings.max_request_body_bytes.max(MAX_FEDERATION_BODY_BYTES);
    let bytes = super::extract::limited_body_to(state, &parts, body, limit).await?;
    // The same body rules as the client API (UTF-8 JSON, no duplicate
    // keys, bounded nesting and numbers), checked before the signature.
    if !bytes.is_empty() {
        super::extract::check_json(&bytes)?;
    }
    let origin = if signed {
        let origin = authenticate(state, &parts, &bytes).await?;
        // It reached us: whatever we queued for it may go now (found out
        // beside the request, not on its way: it is a read, rarely a write).
        // Known to have no failure recorded: nothing to look at.
        if !crate::federation::sender::known_healthy(state, &origin) {
            let (state_, caller) = (state.clone(), origin.clone());
            tokio::spawn(async move { crate::federation::sender::contact_from(&state_, &caller).await });
        }
        Some(origin)
    } else {
        None
    };
    Ok((parts, path_args, bytes, origin))
}

/// A signed federation request taken raw, for the endpoints ruma has no
/// server side for (the v1 membership endpoints): the authenticated origin,
/// the path's parameters (decoded) and the JSON body, checked as
/// [`Federation`]'s.
#[derive(Debug)]
pub struct Signed {
    /// The server that signed it.
    pub origin: OwnedServerName,
    /// The path parameters, in order.
    pub args: Vec<String>,
    /// The body (JSON, the client API's rules).
    pub body: axum::body::Bytes,
}

impl FromRequest<AppState> for Signed {
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let (_, args, body, origin) = read(req, state, true).await?;
        let origin = origin.ok_or_else(|| Error::Unauthorized("The request is not signed".into()))?;
        Ok(Self { origin, args, body })
    }
}

/// Checks the request's X-Matrix header: addressed to us, signed by a
/// current key of its origin over the method, the original URI and the body.
/// Answers the origin.
async fn authenticate(
    state: &AppState,
    parts: &http::request::Parts,
    body: &[u8],
) -> Result<OwnedServerName> {
    let ours = &state.settings.server_name;
    let xmatrix = parse_header(&parts.headers, ours)?;
    let keys = keys::public_keys(state, &xmatrix.origin, xmatrix.key.as_str()).await.map_err(|e| {
        tracing::info!(origin = %xmatrix.origin, "request not authenticated: {e}");
        Error::Unauthorized(format!("Cannot get the signing keys of {}", xmatrix.origin))
    })?;
    // Verify over the URI as the client sent it: routing may have stripped prefixes.
    let uri = parts.extensions.get::<OriginalUri>().map_or_else(|| parts.uri.clone(), |o| o.0.clone());
    verify(&xmatrix, &parts.method, uri, body, ours, keys)?;
    Ok(xmatrix.origin)
}

/// The X-Matrix header of a request to `ours`: present, well-formed, and not
/// addressed to another server.
fn parse_header(headers: &http::HeaderMap, ours: &ServerName) -> Result<XMatrix> {
    let xmatrix = XMatrix::extract_from_http_headers(headers).map_err(|e| match e {
        XMatrixExtractError::MissingAuthorizationHeader => {
            Error::Unauthorized("Missing Authorization header".into())
        }
        other => Error::Unauthorized(format!("Malformed X-Matrix Authorization header: {other}")),
    })?;
    if xmatrix.destination.as_deref().is_some_and(|d| d != ours) {
        return Err(Error::Unauthorized("Destination mismatch in the Authorization header".into()));
    }
    Ok(xmatrix)
}

/// Whether `xmatrix` signs this request (method, URI, JSON body) to `ours`
/// with one of `keys`, the origin's current keys.
fn verify(
    xmatrix: &XMatrix,
    method: &http::Method,
    uri: http::Uri,
    body: &[u8],
    ours: &ServerName,
    keys: ruma::signatures::PublicKeySet,
) -> Result<()> {
    let mut signed = http::Request::new(body);
    *signed.method_mut() = method.clone();
    *signed.uri_mut() = uri;
    let map = std::collections::BTreeMap::from([(xmatrix.origin.to_string(), keys)]);
    xmatrix.verify_http_request(&signed, ours, &map).map_err(|e| {
        tracing::info!(origin = %xmatrix.origin, "request not authenticated: {e}");
        Error::Unauthorized("Invalid X-Matrix signature".into())
    })
}

/// The federation application.
pub fn router(state: AppState) -> Router {
    let router = Router::new();
    let router = route(router, server_keys);
    let router = route(router, notary_query);
    let router = route(router, notary_query_one);
    let router = route(router, version);
    let router = route(router, query_profile);
    let router = route(router, query_directory);
    let router = route(router, rooms::make_join);
    let router = route(router, rooms::send_join);
    let router = route(router, rooms::make_knock);
    let router = route(router, rooms::send_knock);
    let router = route(router, rooms::make_leave);
    let router = route(router, rooms::send_leave);
    let router = route(router, rooms::send_transaction);
    let router = route(router, rooms::invite);
    let router = router
        .route("/_matrix/federation/v1/send_join/{room_id}/{event_id}", put(v1::send_join))
        .route("/_matrix/federation/v1/send_leave/{room_id}/{event_id}", put(v1::send_leave))
        .route("/_matrix/federation/v1/invite/{room_id}/{event_id}", put(v1::invite));
    let router = route(router, rooms::public_rooms);
    let router = route(router, rooms::public_rooms_filtered);
    let router = route(router, rooms::event);
    let router = route(router, rooms::room_state);
    let router = route(router, rooms::room_state_ids);
    let router = route(router, rooms::event_auth);
    let router = route(router, rooms::backfill);
    let router = route(router, rooms::missing_events);
    let router = route(router, rooms::hierarchy);
    let router = route(router, user::devices);
    let router = route(router, user::query);
    let router = route(router, user::claim);
    router
        .fallback(|| async { Error::Unrecognized })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(state.settings.body_read_timeout))
        .with_state(state)
}

/// Mounts `handler` for endpoint `T` on its paths.
fn route<T, F, Fut>(mut router: Router<AppState>, handler: F) -> Router<AppState>
where
    T: IncomingRequest + Send + 'static,
    T::Authentication: FederationAuth,
    T::OutgoingResponse: Send + 'static,
    F: Fn(AppState, Federation<T>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T::OutgoingResponse>> + Send + 'static,
{
    let Ok(filter) = MethodFilter::try_from(<T as Metadata>::METHOD) else {
        tracing::error!("endpoint with unsupported method {}", <T as Metadata>::METHOD);
        return router;
    };
    for path in <T as Metadata>::PATH_BUILDER.all_paths() {
        let handler = handler.clone();
        router = router.route(
            path,
            on(filter, move |State(state): State<AppState>, req: Federation<T>| async move {
                handler(state, req).await.map(RumaResponse).map(IntoResponse::into_response)
            }),
        );
    }
    router
}

async fn server_keys(
    state: AppState,
    _: Federation<get_server_keys::v2::Request>,
) -> Result<get_server_keys::v2::Response> {
    let object = keys::own_key_object(&state)?;
    let raw = serde_json::value::to_raw_value(&object).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(get_server_keys::v2::Response::new(ruma::serde::Raw::from_json(raw)))
}

async fn notary_query(
    state: AppState,
    req: Federation<get_remote_server_keys_batch::v2::Request>,
) -> Result<get_remote_server_keys_batch::v2::Response> {
    let server_keys = keys::notary_query(&state, &req.body.server_keys).await?;
    Ok(get_remote_server_keys_batch::v2::Response::new(server_keys))
}

async fn notary_query_one(
    state: AppState,
    req: Federation<get_remote_server_keys::v2::Request>,
) -> Result<get_remote_server_keys::v2::Response> {
    let mut criteria = get_remote_server_keys_batch::v2::QueryCriteria::new();
    criteria.minimum_valid_until_ts = Some(req.body.minimum_valid_until_ts);
    let query = std::collections::BTreeMap::from([(
        req.body.server_name,
        std::collections::BTreeMap::from([(
            ruma::OwnedServerSigningKeyId::try_from("ed25519:query")
                .map_err(|e| Error::Internal(e.to_string()))?,
            criteria,
        )]),
    )]);
    let server_keys = keys::notary_query(&state, &query).await?;
    Ok(get_remote_server_keys::v2::Response::new(server_keys))
}

async fn version(
    _: AppState,
    _: Federation<get_server_version::v1::Request>,
) -> Result<get_server_version::v1::Response> {
    let mut server = get_server_version::v1::Server::new();
    server.name = Some("seqline".into());
    server.version = Some(env!("CARGO_PKG_VERSION").into());
    let mut response = get_server_version::v1::Response::new();
    response.server = Some(server);
    Ok(response)
}

async fn query_directory(
    state: AppState,
    req: Federation<get_room_information::v1::Request>,
) -> Result<get_room_information::v1::Response> {
    let alias = &req.body.room_alias;
    if alias.server_name() != state.settings.server_name {
        return Err(Error::InvalidParam(format!("{alias} is not an alias of this server")));
    }
    let (room_id, servers) = crate::room::directory::resolve(&state, alias).await?;
    Ok(get_room_information::v1::Response::new(room_id, servers))
}

async fn query_profile(
    state: AppState,
    req: Federation<get_profile_information::v1::Request>,
) -> Result<get_profile_information::v1::Response> {
    let user: &UserId = &req.body.user_id;
    if user.server_name() != state.settings.server_name {
        return Err(Error::InvalidParam(format!("{user} is not a user of this server")));
    }
    let profile = crate::account::profile::get(&state, user).await?;
    let mut response = get_profile_information::v1::Response::new();
    for (name, value) in profile {
        if req.body.field.as_ref().is_none_or(|f| f.as_str() == name) {
            response.set(name, value);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD_NO_PAD;
    use ruma::api::OutgoingRequestExt;
    use ruma::api::federation::authentication::XMatrixSigningInput;

    use super::*;

    fn key() -> crate::signing_key::ServerKey {
        crate::signing_key::parse(&format!("ed25519 key1 {}", STANDARD_NO_PAD.encode([7u8; 32]))).unwrap()
    }

    fn name(s: &str) -> OwnedServerName {
        s.try_into().unwrap()
    }

    /// A profile query from origin.hs.example.com to destination.hs.example.com,
    /// signed as the outbound path signs it.
    fn signed_request(destination: &str) -> http::Request<Vec<u8>> {
        let key = key();
        let request = get_profile_information::v1::Request::new(
            "@alice:destination.hs.example.com".try_into().unwrap(),
        );
        let input = XMatrixSigningInput::new(name("origin.hs.example.com"), name(destination), &key.pair);
        request.try_into_http_request("https://destination.hs.example.com", input, ()).unwrap()
    }

    fn origin_keys() -> ruma::signatures::PublicKeySet {
        std::collections::BTreeMap::from([(
            "ed25519:key1".to_owned(),
            ruma::serde::Base64::new(key().pair.public_key().to_vec()),
        )])
    }

    fn check(request: &http::Request<Vec<u8>>, ours: &str) -> Result<()> {
        let ours = name(ours);
        let xmatrix = parse_header(request.headers(), &ours)?;
        verify(&xmatrix, request.method(), request.uri().clone(), request.body(), &ours, origin_keys())
    }

    fn code(result: Result<()>) -> (http::StatusCode, &'static str) {
        result.unwrap_err().status_and_code()
    }

    #[test]
    fn header_has_the_spec_shape_and_verifies() {
        let request = signed_request("destination.hs.example.com");
        let header = request.headers()[http::header::AUTHORIZATION].to_str().unwrap().to_owned();
        assert!(header.starts_with("X-Matrix "), "{header}");
        // ruma quotes a value only where it has to.
        for part in [
            "origin=origin.hs.example.com",
            "destination=destination.hs.example.com",
            "key=\"ed25519:key1\"",
            "sig=\"",
        ] {
            assert!(header.contains(part), "{header} lacks {part}");
        }
        assert_eq!(
            request.uri().path_and_query().unwrap().as_str(),
            "/_matrix/federation/v1/query/profile?user_id=%40alice%3Adestination.hs.example.com"
        );
        check(&request, "destination.hs.example.com").unwrap();
    }

    #[test]
    fn the_spec_example_header_parses() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            "X-Matrix origin=\"origin.hs.example.com\",destination=\"destination.hs.example.com\",key=\"ed25519:key1\",sig=\"ABCDEF\"".parse().unwrap(),
        );
        let xmatrix = parse_header(&headers, &name("destination.hs.example.com")).unwrap();
        assert_eq!(xmatrix.origin, "origin.hs.example.com");
        assert_eq!(xmatrix.key, "ed25519:key1");
        let err = parse_header(&headers, &name("elsewhere.example.com")).unwrap_err();
        assert_eq!(err.status_and_code(), (http::StatusCode::UNAUTHORIZED, "M_UNAUTHORIZED"));
    }

    #[test]
    fn bad_requests_are_unauthorized() {
        let unauthorized = (http::StatusCode::UNAUTHORIZED, "M_UNAUTHORIZED");
        // Addressed to another server.
        let request = signed_request("elsewhere.example.com");
        assert_eq!(code(check(&request, "destination.hs.example.com")), unauthorized);
        // Another URI than the one signed (a query parameter changed).
        let mut moved = signed_request("destination.hs.example.com");
        *moved.uri_mut() = "/_matrix/federation/v1/query/profile?user_id=%40bob%3Adestination.hs.example.com"
            .parse()
            .unwrap();
        assert_eq!(code(check(&moved, "destination.hs.example.com")), unauthorized);
        // Another method.
        let mut posted = signed_request("destination.hs.example.com");
        *posted.method_mut() = http::Method::POST;
        assert_eq!(code(check(&posted, "destination.hs.example.com")), unauthorized);
        // A body added after signing.
        let mut grown = signed_request("destination.hs.example.com");
        *grown.body_mut() = b"{\"a\":1}".to_vec();
        assert_eq!(code(check(&grown, "destination.hs.example.com")), unauthorized);
        // No header, or not an X-Matrix one.
        let mut bare = signed_request("destination.hs.example.com");
        bare.headers_mut().remove(http::header::AUTHORIZATION);
        assert_eq!(code(check(&bare, "destination.hs.example.com")), unauthorized);
        bare.headers_mut().insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(code(check(&bare, "destination.hs.example.com")), unauthorized);
    }
}
