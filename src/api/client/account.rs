//! Accounts: `/register` (with UIA), `/register/available`, registration-token
//! validity, `/account/password`, `/account/deactivate`.

use axum::Router;
use rand::Rng;
use ruma::api::client::account::register::RegistrationKind;
use ruma::api::client::account::{
    ThirdPartyIdRemovalStatus, change_password, check_registration_token_validity, deactivate,
    get_username_availability, register,
};

use crate::account::{self, uia};
use crate::config::RegistrationMode;
use crate::error::{Error, Result};
use crate::ratelimit::Action;
use crate::state::AppState;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    use crate::api::extract::route;
    let router = route(router, register);
    let router = route(router, username_available);
    let router = route(router, token_validity);
    let router = route(router, change_password);
    route(router, deactivate)
}

use crate::api::extract::Ruma;

fn registration_flows(mode: RegistrationMode) -> Result<&'static [&'static [&'static str]]> {
    match mode {
        RegistrationMode::Off => Err(Error::RegistrationDisabled),
        RegistrationMode::Open => Ok(&[&[uia::DUMMY]]),
        RegistrationMode::Token => Ok(&[&[uia::REGISTRATION_TOKEN]]),
    }
}

/// A localpart for registrations that did not ask for one.
fn generated_localpart() -> String {
    let mut rng = rand::rng();
    let tail: String = (0..12)
        .map(|_| {
            let n = (rng.next_u32() % 36) as u8;
            char::from(if n < 10 { b'0' + n } else { b'a' + n - 10 })
        })
        .collect();
    format!("u{tail}")
}

async fn register(state: AppState, req: Ruma<register::v3::Request>) -> Result<register::v3::Response> {
    let ip = req.ip_string();
    let body = &req.body;
    if body.kind == RegistrationKind::Guest {
        return Err(Error::GuestAccessForbidden);
    }
    let flows = registration_flows(state.settings.registration)?;
    if let Some(ip) = req.client_ip {
        state.rate_limiter.check(Action::Register, ip)?;
    }
    // Check what can be checked before the client does any UIA stage, so a
    // taken or malformed name is reported at once. Names are mapped to lower
    // case, as the spec allows and Synapse does.
    let localpart = match &body.username {
        Some(name) => name.to_lowercase(),
        None => generated_localpart(),
    };
    account::check_available(&state, &localpart).await?;
    if let Some(device_id) = &body.device_id {
        account::validate_device_id(device_id)?;
    }
    let grant = uia::authorize(&state, uia::Purpose::Register, None, flows, body.auth.as_ref()).await?;
    let password = match body.password.clone() {
        Some(p) if !p.is_empty() => p,
        _ => return Err(Error::MissingParam("A non-empty password is required".into())),
    };

    let user_id = account::create_user(&state, &localpart, Some(password), false).await?;
    let mut response = register::v3::Response::new(user_id.clone());
    if !body.inhibit_login {
        let session = account::issue_session(
            &state,
            &user_id,
            body.device_id.clone(),
            body.initial_device_display_name.as_deref(),
            ip.as_deref(),
            body.refresh_token,
        )
        .await?;
        response.access_token = Some(session.access_token);
        response.device_id = Some(session.device_id);
        if let Some((refresh_token, lifetime)) = session.refresh {
            response.refresh_token = Some(refresh_token);
            response.expires_in = Some(super::session::lifetime_duration(lifetime));
        }
    }
    grant.finish(&state).await?;
    Ok(response)
}

async fn username_available(
    state: AppState,
    req: Ruma<get_username_availability::v3::Request>,
) -> Result<get_username_availability::v3::Response> {
    registration_flows(state.settings.registration)?;
    account::check_available(&state, &req.body.username).await?;
    Ok(get_username_availability::v3::Response::new(true))
}

async fn token_validity(
    state: AppState,
    req: Ruma<check_registration_token_validity::v1::Request>,
) -> Result<check_registration_token_validity::v1::Response> {
    if state.settings.registration == RegistrationMode::Off {
        return Err(Error::RegistrationDisabled);
    }
    if let Some(ip) = req.client_ip {
        state.rate_limiter.check(Action::TokenValidity, ip)?;
    }
    let valid = state.settings.registration == RegistrationMode::Token
        && state.settings.registration_tokens.iter().any(|t| t == &req.body.token);
    Ok(check_registration_token_validity::v1::Response::new(valid))
}

async fn change_password(
    state: AppState,
    req: Ruma<change_password::v3::Request>,
) -> Result<change_password::v3::Response> {
    let me = req.requester()?;
    if req.body.new_password.is_empty() {
        return Err(Error::InvalidParam("The new password must not be empty".into()));
    }
    let grant = uia::authorize(
        &state,
        uia::Purpose::ChangePassword,
        Some(me),
        &[&[uia::PASSWORD]],
        req.body.auth.as_ref(),
    )
    .await?;
    account::change_password(&state, me, req.body.new_password.clone(), req.body.logout_devices).await?;
    grant.finish(&state).await?;
    Ok(change_password::v3::Response::new())
}

/// `POST /account/deactivate`: after the password (UIA), the account is
/// gone for good (see `account::deactivate`). No identity server is ever
/// bound here, so there is nothing to unbind.
async fn deactivate(state: AppState, req: Ruma<deactivate::v3::Request>) -> Result<deactivate::v3::Response> {
    let me = req.requester()?;
    let grant = uia::authorize(
        &state,
        uia::Purpose::Deactivate,
        Some(me),
        &[&[uia::PASSWORD]],
        req.body.auth.as_ref(),
    )
    .await?;
    crate::account::deactivate::deactivate(&state, &me.user_id, req.body.erase).await?;
    grant.finish(&state).await?;
    Ok(deactivate::v3::Response::new(ThirdPartyIdRemovalStatus::NoSupport))
}
