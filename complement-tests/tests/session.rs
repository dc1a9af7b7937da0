//! Login, logout, whoami, devices and password changes.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use reqwest::Method;
use serde_json::{Value, json};

backend_tests!(
    login_accepts_identifier_and_legacy_user,
    logout_and_logout_all_revoke_tokens,
    devices_list_rename_and_delete_with_uia,
    password_change_logs_out_other_devices,
    refresh_tokens_expire_rotate_and_keep_txn_ids,
);

fn password_login(user: Value, password: &str) -> Value {
    json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": user }, "password": password })
}

async fn login_accepts_identifier_and_legacy_user(backend: Backend) {
    let server = Server::start(&backend).await;
    server.register("alice", "correct horse").await;

    let (status, flows) = server.get("/_matrix/client/v3/login", None).await;
    assert_eq!(status, 200);
    assert!(flows["flows"].as_array().unwrap().iter().any(|f| f["type"] == "m.login.password"), "{flows}");

    for user in ["alice", "@alice:test.local", "ALICE"] {
        let (status, body) =
            server.post("/_matrix/client/v3/login", None, password_login(json!(user), "correct horse")).await;
        assert_eq!(status, 200, "{user}: {body}");
        assert_eq!(body["user_id"], "@alice:test.local");
    }
    // Legacy top-level `user`, on the r0 path as old clients send it.
    let (status, body) = server
        .post(
            "/_matrix/client/r0/login",
            None,
            json!({ "type": "m.login.password", "user": "alice", "password": "correct horse" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let token = body["access_token"].as_str().unwrap().to_owned();
    let (status, me) = server.get("/_matrix/client/r0/account/whoami", Some(&token)).await;
    assert_eq!((status, me["user_id"].as_str()), (200, Some("@alice:test.local")));

    for (user, password) in [("alice", "wrong"), ("nobody", "correct horse")] {
        let (status, body) =
            server.post("/_matrix/client/v3/login", None, password_login(json!(user), password)).await;
        assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")), "{user}: {body}");
    }
    let (status, body) =
        server.post("/_matrix/client/v3/login", None, json!({ "type": "m.login.token", "token": "x" })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_UNKNOWN")), "{body}");

    // Logging in again on a known device replaces that device's token.
    let mut req = password_login(json!("alice"), "correct horse");
    req["device_id"] = json!("PHONE");
    req["initial_device_display_name"] = json!("Phone");
    let (_, first) = server.post("/_matrix/client/v3/login", None, req.clone()).await;
    // Used once (so the server has resolved it) before it is replaced.
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", first["access_token"].as_str()).await;
    assert_eq!(status, 200);
    // The display name of a known device is not replaced on login.
    req["initial_device_display_name"] = json!("Renamed");
    let (_, second) = server.post("/_matrix/client/v3/login", None, req).await;
    let (_, device) = server.get("/_matrix/client/v3/devices/PHONE", second["access_token"].as_str()).await;
    assert_eq!(device["display_name"], "Phone");
    assert_eq!(first["device_id"], "PHONE");
    assert_eq!(second["device_id"], "PHONE");
    let (status, body) =
        server.get("/_matrix/client/v3/account/whoami", first["access_token"].as_str()).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")));
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", second["access_token"].as_str()).await;
    assert_eq!(status, 200);
}

async fn logout_and_logout_all_revoke_tokens(backend: Backend) {
    let server = Server::start(&backend).await;
    let a = server.register("bob", "pw").await;
    let b = server.login("bob", "pw").await;
    let c = server.login("bob", "pw").await;

    let (status, _) = server.post("/_matrix/client/v3/logout", Some(&a.token), json!({})).await;
    assert_eq!(status, 200);
    let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some(&a.token)).await;
    assert_eq!(status, 401);
    assert_eq!(
        body,
        json!({ "errcode": "M_UNKNOWN_TOKEN", "error": "Unknown access token", "soft_logout": false })
    );
    // The logged-out device is gone.
    let (_, devices) = server.get("/_matrix/client/v3/devices", Some(&b.token)).await;
    let mut ids: Vec<&str> =
        devices["devices"].as_array().unwrap().iter().map(|d| d["device_id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut expected = vec![b.device_id.as_str(), c.device_id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected);

    let (status, _) = server.post("/_matrix/client/v3/logout/all", Some(&b.token), json!({})).await;
    assert_eq!(status, 200);
    for token in [&b.token, &c.token] {
        let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some(token)).await;
        assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")));
    }
    // The password still works.
    server.login("bob", "pw").await;
}

async fn devices_list_rename_and_delete_with_uia(backend: Backend) {
    let server = Server::start(&backend).await;
    let me = server.register("carol", "pw").await;
    let other = server.login("carol", "pw").await;
    let t = Some(me.token.as_str());

    let (status, device) = server.get(&format!("/_matrix/client/v3/devices/{}", other.device_id), t).await;
    assert_eq!(status, 200, "{device}");
    assert_eq!(device["device_id"], other.device_id.as_str());
    assert!(device["last_seen_ts"].as_u64().is_some(), "{device}");

    let (status, _) = server
        .put(
            &format!("/_matrix/client/v3/devices/{}", other.device_id),
            t,
            json!({ "display_name": "Tablet" }),
        )
        .await;
    assert_eq!(status, 200);
    // Without display_name the name stays.
    let (status, _) =
        server.put(&format!("/_matrix/client/v3/devices/{}", other.device_id), t, json!({})).await;
    assert_eq!(status, 200);
    let (_, device) = server.get(&format!("/_matrix/client/v3/devices/{}", other.device_id), t).await;
    assert_eq!(device["display_name"], "Tablet");

    for method in [Method::GET, Method::PUT, Method::DELETE] {
        let (status, body) =
            server.request(method.clone(), "/_matrix/client/v3/devices/NOSUCH", t, Some(json!({}))).await;
        assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{method}: {body}");
    }

    // Deleting needs the password.
    let path = format!("/_matrix/client/v3/devices/{}", other.device_id);
    let (status, body) = server.request(Method::DELETE, &path, t, Some(json!({}))).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.password"] }]));
    let session = body["session"].as_str().unwrap().to_owned();
    let auth = |password: &str| json!({ "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "carol" }, "password": password, "session": session } });
    // Another user's identity is refused outright.
    server.register("mallory", "mpw").await;
    let as_mallory = json!({ "auth": { "type": "m.login.password", "password": "mpw", "session": session,
                                       "identifier": { "type": "m.id.user", "user": "mallory" } } });
    let (status, body) = server.request(Method::DELETE, &path, t, Some(as_mallory)).await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")), "{body}");
    let (status, body) = server.request(Method::DELETE, &path, t, Some(auth("wrong"))).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_FORBIDDEN")), "{body}");
    // Still there, still working.
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", Some(&other.token)).await;
    assert_eq!(status, 200);
    let (status, body) = server.request(Method::DELETE, &path, t, Some(auth("pw"))).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", Some(&other.token)).await;
    assert_eq!(status, 401);
    let (status, _) = server.get(&path, t).await;
    assert_eq!(status, 404);

    // Bulk delete, password given up front (no session yet).
    let x = server.login("carol", "pw").await;
    let y = server.login("carol", "pw").await;
    let (status, body) = server
        .post(
            "/_matrix/client/v3/delete_devices",
            t,
            json!({ "devices": [x.device_id, y.device_id],
                    "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "carol" }, "password": "pw" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, devices) = server.get("/_matrix/client/v3/devices", t).await;
    let ids: Vec<&str> =
        devices["devices"].as_array().unwrap().iter().map(|d| d["device_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![me.device_id.as_str()]);
}

async fn password_change_logs_out_other_devices(backend: Backend) {
    let server = Server::start(&backend).await;
    let me = server.register("dave", "old-pw").await;
    let other = server.login("dave", "old-pw").await;
    let keeper = server.login("dave", "old-pw").await;
    for token in [&other.token, &keeper.token] {
        let (status, _) = server.get("/_matrix/client/v3/account/whoami", Some(token)).await;
        assert_eq!(status, 200);
    }

    let path = "/_matrix/client/v3/account/password";
    let (status, body) = server.post(path, Some(&me.token), json!({ "new_password": "new-pw" })).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.password"] }]));
    let session = body["session"].as_str().unwrap();
    let (status, body) = server
        .post(
            path,
            Some(&me.token),
            json!({ "new_password": "new-pw",
                    "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "@dave:test.local" }, "password": "old-pw", "session": session } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // This session stays; every other one is logged out (also those the
    // server resolved a moment ago).
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", Some(&me.token)).await;
    assert_eq!(status, 200);
    for token in [&other.token, &keeper.token] {
        let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some(token)).await;
        assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")));
    }
    let (status, _) =
        server.post("/_matrix/client/v3/login", None, password_login(json!("dave"), "old-pw")).await;
    assert_eq!(status, 403);
    let kept = server.login("dave", "new-pw").await;

    // logout_devices: false keeps the other sessions.
    let (status, body) = server
        .post(
            path,
            Some(&me.token),
            json!({ "new_password": "newer-pw", "logout_devices": false,
                    "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "dave" }, "password": "new-pw" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = server.get("/_matrix/client/v3/account/whoami", Some(&kept.token)).await;
    assert_eq!(status, 200);
    server.login("dave", "newer-pw").await;
}

/// Refresh tokens: asked for at login, the access token expires (soft
/// logout), /refresh gives a new pair, the old refresh token works until the
/// new access token is used, and a transaction id stays the device's across
/// a refresh.
async fn refresh_tokens_expire_rotate_and_keep_txn_ids(backend: Backend) {
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_ACCESS_TOKEN_LIFETIME_MS", "1500"))
            .await;
    server.register("erin", "pw").await;
    // Without asking: no refresh token, no expiry.
    let (status, plain) =
        server.post("/_matrix/client/v3/login", None, password_login(json!("erin"), "pw")).await;
    assert_eq!(status, 200, "{plain}");
    assert!(plain.get("refresh_token").is_none() && plain.get("expires_in_ms").is_none(), "{plain}");

    let mut login = password_login(json!("erin"), "pw");
    login["refresh_token"] = json!(true);
    let (status, session) = server.post("/_matrix/client/v3/login", None, login).await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["expires_in_ms"], 1500, "{session}");
    let token = session["access_token"].as_str().unwrap().to_owned();
    let first_refresh = session["refresh_token"].as_str().unwrap().to_owned();
    let room = {
        let (status, body) = server.post("/_matrix/client/v3/createRoom", Some(&token), json!({})).await;
        assert_eq!(status, 200, "{body}");
        body["room_id"].as_str().unwrap().to_owned()
    };
    let send =
        format!("/_matrix/client/v3/rooms/{}/send/m.room.message/txn1", complement_tests::api::enc(&room));
    let message = json!({ "msgtype": "m.text", "body": "once" });
    let (status, sent) = server.put(&send, Some(&token), message.clone()).await;
    assert_eq!(status, 200, "{sent}");

    // The access token expires: 401 with soft_logout.
    let expired = complement_tests::api::eventually("the access token to expire", || async {
        let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some(&token)).await;
        (status == 401).then_some(body)
    })
    .await;
    assert_eq!(
        (expired["errcode"].as_str(), expired["soft_logout"].as_bool()),
        (Some("M_UNKNOWN_TOKEN"), Some(true))
    );

    let refresh =
        |token: &str| server.post("/_matrix/client/v3/refresh", None, json!({ "refresh_token": token }));
    let (status, bad) = refresh("not-a-refresh-token").await;
    assert_eq!((status, bad["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")), "{bad}");
    let (status, renewed) = refresh(&first_refresh).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["expires_in_ms"], 1500);
    // The answer was lost: the old refresh token still works, once more.
    let (status, renewed) = refresh(&first_refresh).await;
    assert_eq!(status, 200, "{renewed}");
    let new_token = renewed["access_token"].as_str().unwrap().to_owned();
    let new_refresh = renewed["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(new_token, token);
    assert_ne!(new_refresh, first_refresh);

    // The same transaction id on the same device names the same event.
    let (status, again) = server.put(&send, Some(&new_token), message).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["event_id"], sent["event_id"]);
    // The new access token was used: the old refresh token is spent.
    let (status, spent) = refresh(&first_refresh).await;
    assert_eq!((status, spent["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")), "{spent}");
    let (status, _) = refresh(&new_refresh).await;
    assert_eq!(status, 200);
    // The token from the plain login never expires.
    let (status, _) =
        server.get("/_matrix/client/v3/account/whoami", Some(plain["access_token"].as_str().unwrap())).await;
    assert_eq!(status, 200);
}
