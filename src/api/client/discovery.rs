//! Server discovery and capabilities: `.well-known`, `/versions`,
//! `/capabilities`.

use std::collections::BTreeMap;

use axum::Router;
use ruma::api::client::discovery::get_capabilities::v3::{
    Capabilities, RoomVersionStability, RoomVersionsCapability,
};
use ruma::api::client::discovery::{discover_homeserver, get_capabilities, get_supported_versions};

use crate::api::extract::{Ruma, route, route_json};
use crate::error::Result;
use crate::state::AppState;

/// Spec versions whose client-server endpoints seqline serves in their current
/// shapes (v3 paths since v1.1, r0 aliases kept for older clients).
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6", "v1.7", "v1.8", "v1.9", "v1.10", "v1.11",
    "v1.12",
];

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, well_known);
    let router = route(router, versions);
    route_json(router, capabilities)
}

async fn well_known(
    state: AppState,
    _req: Ruma<discover_homeserver::Request>,
) -> Result<discover_homeserver::Response> {
    Ok(discover_homeserver::Response::new(discover_homeserver::HomeserverInfo::new(
        state.settings.public_baseurl.clone().unwrap_or_default(),
    )))
}

async fn versions(
    _state: AppState,
    _req: Ruma<get_supported_versions::Request>,
) -> Result<get_supported_versions::Response> {
    let mut response =
        get_supported_versions::Response::new(SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect());
    // Simplified sliding sync (MSC4186): the only switch Element X and
    // matrix-rust-sdk look at.
    response.unstable_features.insert("org.matrix.simplified_msc3575".to_owned(), true);
    Ok(response)
}

async fn capabilities(
    _state: AppState,
    _req: Ruma<get_capabilities::v3::Request>,
) -> Result<serde_json::Value> {
    let mut capabilities = Capabilities::new();
    let available: BTreeMap<_, _> =
        crate::room::version::CREATABLE.into_iter().map(|v| (v, RoomVersionStability::Stable)).collect();
    capabilities.room_versions = RoomVersionsCapability::new(crate::room::version::DEFAULT, available);
    let mut body = serde_json::json!({ "capabilities": capabilities });
    // ruma leaves a capability out at its default value; clients (and
    // Complement) look for this one explicitly.
    body["capabilities"]["m.change_password"] = serde_json::json!({ "enabled": true });
    Ok(body)
}
