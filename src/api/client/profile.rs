//! Profiles: `GET /profile/{userId}`, `GET/PUT/DELETE /profile/{userId}/{field}`
//! (displayname, avatar_url and custom fields).

use axum::Router;
use ruma::api::client::profile::{delete_profile_field, get_profile, get_profile_field, set_profile_field};
use serde_json::{Value, json};

use crate::account::profile;
use crate::api::extract::{Ruma, route, route_json};
use crate::error::{Error, Result};
use crate::state::AppState;

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route_json(router, whole);
    let router = route_json(router, field);
    let router = route(router, set);
    route(router, delete)
}

async fn whole(state: AppState, req: Ruma<get_profile::v3::Request>) -> Result<Value> {
    Ok(Value::Object(profile::lookup(&state, &req.body.user_id).await?))
}

async fn field(state: AppState, req: Ruma<get_profile_field::v3::Request>) -> Result<Value> {
    let name = req.body.field.to_string();
    let all = profile::lookup(&state, &req.body.user_id).await?;
    let value = all.get(&name).ok_or_else(|| Error::NotFound(format!("No {name} in this profile")))?;
    Ok(json!({ name: value }))
}

async fn set(
    state: AppState,
    req: Ruma<set_profile_field::v3::Request>,
) -> Result<set_profile_field::v3::Response> {
    let me = req.requester()?;
    if req.body.user_id != me.user_id {
        return Err(Error::Forbidden("You can only change your own profile".into()));
    }
    let name = req.body.value.field_name().to_string();
    let value = req.body.value.value().into_owned();
    profile::set(&state, &me.user_id, &name, Some(value)).await?;
    Ok(set_profile_field::v3::Response::new())
}

async fn delete(
    state: AppState,
    req: Ruma<delete_profile_field::v3::Request>,
) -> Result<delete_profile_field::v3::Response> {
    let me = req.requester()?;
    if req.body.user_id != me.user_id {
        return Err(Error::Forbidden("You can only change your own profile".into()));
    }
    profile::set(&state, &me.user_id, req.body.field.as_ref(), None).await?;
    Ok(delete_profile_field::v3::Response::new())
}
