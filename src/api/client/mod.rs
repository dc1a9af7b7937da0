//! Client-server API endpoints, one file per area of the spec.

mod account;
mod backup;
mod devices;
mod directory;
mod discovery;
mod ephemeral;
mod keys;
mod membership;
mod messages;
mod presence;
mod profile;
mod push;
mod relations;
mod rooms;
mod search;
mod seqline;
mod session;
mod sync;

use axum::Router;

use crate::state::AppState;

/// Adds every client-server endpoint to `router`.
pub fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = discovery::routes(router);
    let router = session::routes(router);
    let router = account::routes(router);
    let router = devices::routes(router);
    let router = directory::routes(router);
    let router = membership::routes(router);
    let router = messages::routes(router);
    let router = seqline::routes(router);
    let router = sync::routes(router);
    let router = ephemeral::routes(router);
    let router = profile::routes(router);
    let router = push::routes(router);
    let router = relations::routes(router);
    let router = keys::routes(router);
    let router = backup::routes(router);
    let router = presence::routes(router);
    let router = search::routes(router);
    rooms::routes(router)
}
