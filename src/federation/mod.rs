//! Federation, the domain side: where another server is reached
//! ([`resolve`]: the spec's server name resolution), requests to it signed
//! with our key (X-Matrix) and sent through the one outbound client
//! ([`send`]), and the server keys ([`keys`]: ours as published, other
//! servers' fetched and cached).

pub mod acl;
pub mod backfill;
pub mod edus;
pub mod incoming;
pub mod invites;
pub mod joining;
pub mod keys;
pub mod knocking;
pub mod resident;
pub mod resolve;
pub mod sender;
pub mod user_keys;

use ruma::api::auth_scheme::{AuthScheme, NoAuthentication};
use ruma::api::federation::authentication::{ServerSignatures, XMatrixSigningInput};
use ruma::api::path_builder::SinglePath;
use ruma::api::{IncomingResponseExt, OutgoingRequest, OutgoingRequestExt};
use ruma::{OwnedServerName, ServerName};

use crate::state::AppState;

/// Largest answer read from another server (key responses and queries are small).
const MAX_REPLY_BYTES: usize = 1024 * 1024;

/// Why a request to another server failed.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    /// The request could not be built or signed.
    #[error("cannot build the request: {0}")]
    Build(String),
    /// Not sent or not answered (refused address, TLS, timeout, size).
    #[error("{0}")]
    Transport(#[from] crate::outbound::OutboundError),
    /// The server answered with an error status (and this body).
    #[error("answered {0}: {1}")]
    Status(u16, String),
    /// The server answered with a body that does not parse.
    #[error("{0}")]
    Response(String),
    /// The server's SRV record says it offers no federation (target ".").
    #[error("{0} offers no federation service (SRV target \".\")")]
    NoService(String),
}

/// How a request authenticates: signed by us (X-Matrix) or not at all.
pub trait Signing: AuthScheme {
    /// The scheme's input for a request from `origin` to `destination`.
    fn input<'a>(
        origin: OwnedServerName,
        destination: OwnedServerName,
        key: &'a ruma::signatures::Ed25519KeyPair,
    ) -> Self::Input<'a>;
}

impl Signing for ServerSignatures {
    fn input<'a>(
        origin: OwnedServerName,
        destination: OwnedServerName,
        key: &'a ruma::signatures::Ed25519KeyPair,
    ) -> XMatrixSigningInput<'a> {
        XMatrixSigningInput::new(origin, destination, key)
    }
}

impl Signing for NoAuthentication {
    fn input(_: OwnedServerName, _: OwnedServerName, _: &ruma::signatures::Ed25519KeyPair) {}
}

/// Sends `request` to `destination` (signed with our key when the endpoint
/// asks for X-Matrix; `destination` is the server name, whatever delegation
/// says) where [`resolve`] says it goes, and parses the answer.
pub async fn send<T>(
    state: &AppState,
    destination: &ServerName,
    request: T,
) -> Result<T::IncomingResponse, FederationError>
where
    T: OutgoingRequest<PathBuilder = SinglePath>,
    T::Authentication: Signing,
{
    send_capped(state, destination, request, MAX_REPLY_BYTES).await
}

/// [`send`], reading at most `max_reply` bytes of the answer (a room's state
/// in a send_join answer is far larger than a query's).
pub async fn send_capped<T>(
    state: &AppState,
    destination: &ServerName,
    request: T,
    max_reply: usize,
) -> Result<T::IncomingResponse, FederationError>
where
    T: OutgoingRequest<PathBuilder = SinglePath>,
    T::Authentication: Signing,
{
    let input = <T::Authentication as Signing>::input(
        state.settings.server_name.clone(),
        destination.to_owned(),
        &state.signing_key.pair,
    );
    let route = state.server_resolver.resolve(destination).await?;
    let http_request: http::Request<Vec<u8>> = request
        .try_into_http_request(&route.base_url(), input, ())
        .map_err(|e| FederationError::Build(e.to_string()))?;
    let (parts, body) = http_request.into_parts();
    let mut builder = state.outbound.federation_request_via(
        parts.method,
        &parts.uri.to_string(),
        route.connect_to.as_deref(),
    )?;
    for (name, value) in &parts.headers {
        builder = builder.header(name, value);
    }
    builder = builder.header(http::header::HOST, route.host_header.as_str());
    let response = builder.body(body).send().await.map_err(crate::outbound::OutboundError::from)?;
    let status = response.status();
    let bytes = crate::outbound::read_capped(response, max_reply).await?;
    if status.as_u16() >= 400 {
        let text: String = String::from_utf8_lossy(&bytes).chars().take(200).collect();
        return Err(FederationError::Status(status.as_u16(), text));
    }
    let http_response = http::Response::builder()
        .status(status)
        .body(&bytes[..])
        .map_err(|e| FederationError::Response(e.to_string()))?;
    T::IncomingResponse::try_from_http_response(http_response)
        .map_err(|e| FederationError::Response(format!("{destination} answered {status}: {e}")))
}
