//! Login and logout: `/login`, `/refresh`, `/logout`, `/logout/all`, `/account/whoami`.

use axum::Router;
use ruma::api::client::account::whoami;
use ruma::api::client::session::get_login_types::v3::{LoginType, PasswordLoginType};
use ruma::api::client::session::login::v3::LoginInfo;
use ruma::api::client::session::{get_login_types, login, logout, logout_all, refresh_token};
use ruma::api::client::uiaa::UserIdentifier;

use crate::account;
use crate::api::extract::{Ruma, route};
use crate::error::{Error, Result};
use crate::ratelimit::Action;
use crate::state::AppState;
use crate::storage::devices;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, login_types);
    let router = route(router, login);
    let router = route(router, refresh);
    let router = route(router, logout);
    let router = route(router, logout_all);
    route(router, whoami)
}

async fn login_types(
    _state: AppState,
    _req: Ruma<get_login_types::v3::Request>,
) -> Result<get_login_types::v3::Response> {
    Ok(get_login_types::v3::Response::new(vec![LoginType::Password(PasswordLoginType::new())]))
}

#[allow(deprecated)] // the legacy top-level `user` field is still sent by older clients
async fn login(state: AppState, req: Ruma<login::v3::Request>) -> Result<login::v3::Response> {
    if let Some(ip) = req.client_ip {
        state.rate_limiter.check(Action::Login, ip)?;
    }
    let ip = req.ip_string();
    let body = req.body;
    let LoginInfo::Password(password) = &body.login_info else {
        return Err(Error::Unknown("Only m.login.password is supported".into()));
    };
    let user_input = match (&password.identifier, &password.user) {
        (Some(UserIdentifier::Matrix(id)), _) => id.user.clone(),
        (Some(_), _) => return Err(Error::Unknown("Only m.id.user identifiers are supported".into())),
        (None, Some(user)) => user.clone(),
        (None, None) => return Err(Error::MissingParam("identifier or user is required".into())),
    };
    let localpart = account::local_localpart(&user_input, &state.settings.server_name)?;
    let user_id = account::login_with_password(&state, &localpart, &password.password).await?;
    let session = account::issue_session(
        &state,
        &user_id,
        body.device_id.clone(),
        body.initial_device_display_name.as_deref(),
        ip.as_deref(),
        body.refresh_token,
    )
    .await?;
    let mut response = login::v3::Response::new(session.user_id, session.access_token, session.device_id);
    response.home_server = Some(state.settings.server_name.clone());
    if let Some((refresh_token, lifetime)) = session.refresh {
        response.refresh_token = Some(refresh_token);
        response.expires_in = Some(lifetime_duration(lifetime));
    }
    Ok(response)
}

/// A token lifetime in milliseconds as the API's duration.
pub(super) fn lifetime_duration(ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `POST /refresh`: no access token needed (it may have expired); a refresh
/// token no device holds is 401 `M_UNKNOWN_TOKEN`.
async fn refresh(
    state: AppState,
    req: Ruma<refresh_token::v3::Request>,
) -> Result<refresh_token::v3::Response> {
    if let Some(ip) = req.client_ip {
        state.rate_limiter.check(Action::Login, ip)?;
    }
    let session = account::refresh(&state, &req.body.refresh_token).await?;
    let mut response = refresh_token::v3::Response::new(session.access_token);
    if let Some((refresh_token, lifetime)) = session.refresh {
        response.refresh_token = Some(refresh_token);
        response.expires_in_ms = Some(lifetime_duration(lifetime));
    }
    Ok(response)
}

async fn logout(state: AppState, req: Ruma<logout::v3::Request>) -> Result<logout::v3::Response> {
    let me = req.requester()?;
    crate::account::e2ee::remove_devices(&state, &me.user_id, &[me.device_id.as_str()]).await?;
    Ok(logout::v3::Response::new())
}

async fn logout_all(state: AppState, req: Ruma<logout_all::v3::Request>) -> Result<logout_all::v3::Response> {
    let me = req.requester()?;
    let all = devices::list(&state.db, me.user_id.as_str()).await?;
    let ids: Vec<&str> = all.iter().map(|d| d.device_id.as_str()).collect();
    crate::account::e2ee::remove_devices(&state, &me.user_id, &ids).await?;
    Ok(logout_all::v3::Response::new())
}

async fn whoami(_state: AppState, req: Ruma<whoami::v3::Request>) -> Result<whoami::v3::Response> {
    let me = req.requester()?;
    let mut response = whoami::v3::Response::new(me.user_id.clone(), false);
    response.device_id = Some(me.device_id.clone());
    Ok(response)
}
