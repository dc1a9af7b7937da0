//! Devices: list, get, rename, delete (one or many, behind UIA).

use axum::Router;
use ruma::api::client::device::{
    Device, delete_device, delete_devices, get_device, get_devices, update_device,
};
use ruma::{MilliSecondsSinceUnixEpoch, OwnedDeviceId, UInt};

use crate::account::uia;
use crate::api::extract::{Ruma, route};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::devices::{self, DeviceRow};

pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    let router = route(router, list);
    let router = route(router, get);
    let router = route(router, update);
    let router = route(router, delete);
    route(router, delete_many)
}

fn to_device(row: DeviceRow) -> Device {
    let mut device = Device::new(OwnedDeviceId::from(row.device_id));
    device.display_name = row.display_name;
    device.last_seen_ip = row.last_seen_ip;
    device.last_seen_ts =
        row.last_seen_ts.and_then(|ts| UInt::try_from(ts).ok()).map(MilliSecondsSinceUnixEpoch);
    device
}

async fn authorize_with_password(
    state: &AppState,
    me: &crate::account::Requester,
    devices: &[&str],
    auth: &Option<ruma::api::client::uiaa::AuthData>,
) -> Result<uia::Grant> {
    uia::authorize(state, uia::Purpose::DeleteDevices(devices), Some(me), &[&[uia::PASSWORD]], auth.as_ref())
        .await
}

fn no_such_device() -> Error {
    Error::NotFound("No device with that id".into())
}

async fn list(state: AppState, req: Ruma<get_devices::v3::Request>) -> Result<get_devices::v3::Response> {
    let me = req.requester()?;
    let rows = devices::list(&state.db, me.user_id.as_str()).await?;
    Ok(get_devices::v3::Response::new(rows.into_iter().map(to_device).collect()))
}

async fn get(state: AppState, req: Ruma<get_device::v3::Request>) -> Result<get_device::v3::Response> {
    let me = req.requester()?;
    let row = devices::get(&state.db, me.user_id.as_str(), req.body.device_id.as_str())
        .await?
        .ok_or_else(no_such_device)?;
    Ok(get_device::v3::Response::new(to_device(row)))
}

async fn update(
    state: AppState,
    req: Ruma<update_device::v3::Request>,
) -> Result<update_device::v3::Response> {
    let me = req.requester()?;
    // Without `display_name` the name is unchanged; the device must still exist.
    let found = match req.body.display_name.as_deref() {
        Some(name) => {
            devices::set_display_name(&state.db, me.user_id.as_str(), req.body.device_id.as_str(), Some(name))
                .await?
        }
        None => devices::get(&state.db, me.user_id.as_str(), req.body.device_id.as_str()).await?.is_some(),
    };
    if !found {
        return Err(no_such_device());
    }
    if req.body.display_name.is_some() {
        let device = [req.body.device_id.as_str()];
        crate::account::e2ee::device_list_changed(
            &state,
            &me.user_id,
            crate::account::e2ee::DeviceChange::Devices(&device),
        )
        .await?;
    }
    Ok(update_device::v3::Response::new())
}

async fn delete(
    state: AppState,
    req: Ruma<delete_device::v3::Request>,
) -> Result<delete_device::v3::Response> {
    let me = req.requester()?;
    // An unknown device is reported before any UIA round, so the client is not
    // asked for a password to delete nothing.
    if devices::get(&state.db, me.user_id.as_str(), req.body.device_id.as_str()).await?.is_none() {
        return Err(no_such_device());
    }
    let ids = [req.body.device_id.as_str()];
    let grant = authorize_with_password(&state, me, &ids, &req.body.auth).await?;
    crate::account::e2ee::remove_devices(&state, &me.user_id, &ids).await?;
    grant.finish(&state).await?;
    Ok(delete_device::v3::Response::new())
}

async fn delete_many(
    state: AppState,
    req: Ruma<delete_devices::v3::Request>,
) -> Result<delete_devices::v3::Response> {
    let me = req.requester()?;
    let ids: Vec<&str> = req.body.devices.iter().map(|d| d.as_str()).collect();
    let grant = authorize_with_password(&state, me, &ids, &req.body.auth).await?;
    crate::account::e2ee::remove_devices(&state, &me.user_id, &ids).await?;
    grant.finish(&state).await?;
    Ok(delete_devices::v3::Response::new())
}
