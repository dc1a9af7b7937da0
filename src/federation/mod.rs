//! Federation, the domain side: where another server is reached
//! ([`base_url`]), requests to it signed with our key (X-Matrix) and sent
//! through the one outbound client ([`send`]), and the server keys
//! ([`keys`]: ours as published, other servers' fetched and cached).

pub mod incoming;
pub mod invites;
pub mod joining;
pub mod keys;
pub mod resident;
pub mod sender;

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
}

/// The base URL of `server`'s federation API. A server name that is an IP
/// address or carries a port is contacted there directly; a bare host name on
/// port 8448. `.well-known/matrix/server` and SRV records are not consulted yet.
pub fn base_url(server: &ServerName) -> String {
    if server.port().is_some() { format!("https://{server}") } else { format!("https://{server}:8448") }
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
/// asks for X-Matrix) and parses the answer.
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
    let http_request: http::Request<Vec<u8>> = request
        .try_into_http_request(&base_url(destination), input, ())
        .map_err(|e| FederationError::Build(e.to_string()))?;
    let (parts, body) = http_request.into_parts();
    let mut builder = state.outbound.federation_request(parts.method, &parts.uri.to_string())?;
    for (name, value) in &parts.headers {
        builder = builder.header(name, value);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_with_a_port_or_an_ip_are_contacted_directly() {
        let url = |s: &str| base_url(<&ServerName>::try_from(s).unwrap());
        assert_eq!(url("127.0.0.1:8448"), "https://127.0.0.1:8448");
        assert_eq!(url("localhost:18612"), "https://localhost:18612");
        assert_eq!(url("[::1]:8448"), "https://[::1]:8448");
        assert_eq!(url("example.org"), "https://example.org:8448");
        assert_eq!(url("1.2.3.4"), "https://1.2.3.4:8448");
    }
}
