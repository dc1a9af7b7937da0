//! HTTP: the axum router, CORS, the JSON 404/405 fallbacks, and the bridge
//! to ruma's typed endpoints. Handlers live in `client/`, one file per spec
//! area; they parse, call the domain, and format.

pub mod client;
pub mod error;
pub mod extract;
pub mod federation;
pub mod media;

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::error::Error;
use crate::state::AppState;

/// The whole HTTP application.
pub fn router(state: AppState) -> Router {
    media::routes(client::routes(Router::new()))
        .fallback(|| async { Error::Unrecognized })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(state.clone(), client_address))
        .layer(middleware::from_fn(cors))
        // A body that stalls between chunks longer than this fails its read (408).
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(state.settings.body_read_timeout))
        .with_state(state)
}

/// The client address of a request, decided once (`ratelimit::client_address`:
/// the peer, or what a trusted proxy forwarded) for the limits and `last_seen_ip`.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub IpAddr);

async fn client_address(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if let Some(peer) = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()) {
        let ip = crate::ratelimit::client_address(peer, request.headers(), &state.settings.trusted_proxies);
        request.extensions_mut().insert(ClientAddress(ip));
    }
    next.run(request).await
}

/// CORS as the spec asks of every endpoint, so browser clients served from
/// another origin can call the API; preflight `OPTIONS` is answered here for
/// every path, known or not.
async fn cors(request: Request, next: Next) -> Response {
    let mut response = if request.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("X-Requested-With, Content-Type, Authorization"),
    );
    response
}
