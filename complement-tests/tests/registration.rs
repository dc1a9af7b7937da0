//! Registration: the dummy and token UIA flows, username rules, availability,
//! registration switched off, and the `register-user` command.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use serde_json::json;

backend_tests!(
    dummy_flow_creates_a_logged_in_user,
    taken_and_bad_names_are_refused,
    token_flow_needs_a_configured_token,
    registration_off_refuses_and_cli_creates_users,
    inhibit_login_and_chosen_device,
    auth_without_type_or_session_gets_the_flows,
);

const REGISTER: &str = "/_matrix/client/v3/register";

async fn dummy_flow_creates_a_logged_in_user(backend: Backend) {
    let server = Server::start(&backend).await;
    // First round: no auth, the server offers the dummy flow and a session.
    let (status, body) = server.post(REGISTER, None, json!({ "username": "alice", "password": "pw1" })).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.dummy"] }]));
    let session = body["session"].as_str().expect("session").to_owned();
    assert!(body.get("completed").is_none());
    // An empty body (what Element sends first) gets the flows too.
    let (status, body) = server.post(REGISTER, None, json!({})).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.dummy"] }]));

    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({
                "username": "alice", "password": "pw1",
                "initial_device_display_name": "Alice's laptop",
                "auth": { "type": "m.login.dummy", "session": session },
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user_id"], "@alice:test.local");
    let token = body["access_token"].as_str().unwrap();
    let device_id = body["device_id"].as_str().unwrap();
    assert!(token.len() >= 43, "a 256-bit token: {token}");

    let (status, me) = server.get("/_matrix/client/v3/account/whoami", Some(token)).await;
    assert_eq!(status, 200);
    assert_eq!(me["user_id"], "@alice:test.local");
    assert_eq!(me["device_id"], device_id);
    assert_ne!(me["is_guest"], true);

    let (_, devices) = server.get("/_matrix/client/v3/devices", Some(token)).await;
    assert_eq!(devices["devices"][0]["display_name"], "Alice's laptop");

    // The session is used up: replaying it does not register again.
    let (status, body) = server
        .post(REGISTER, None, json!({ "username": "alice2", "password": "pw", "auth": { "type": "m.login.dummy", "session": session } }))
        .await;
    assert_eq!(status, 400, "{body}");

    // The r0 form answers as well.
    let (status, body) = server
        .post(
            "/_matrix/client/r0/register",
            None,
            json!({ "username": "bob", "password": "pw", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user_id"], "@bob:test.local");
}

async fn taken_and_bad_names_are_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    server.register("carol", "pw").await;

    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "carol", "password": "x", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_USER_IN_USE")), "{body}");
    // Taken is reported before any UIA round.
    let (status, body) = server.post(REGISTER, None, json!({ "username": "carol", "password": "x" })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_USER_IN_USE")), "{body}");

    // Capitals are mapped to lower case (as Synapse does), so "Carol" is taken too.
    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "Carol", "password": "x", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_USER_IN_USE")), "{body}");
    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "User-UPPER", "password": "x", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!((status, body["user_id"].as_str()), (200, Some("@user-upper:test.local")), "{body}");

    for bad in ["car ol", "car:ol", "_carol", "12345", "ünïcode"] {
        let (status, body) = server
            .post(
                REGISTER,
                None,
                json!({ "username": bad, "password": "x", "auth": { "type": "m.login.dummy" } }),
            )
            .await;
        assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_USERNAME")), "{bad}: {body}");
    }
    let long = "a".repeat(260);
    let (status, body) = server.post(REGISTER, None, json!({ "username": long, "password": "x" })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_USERNAME")), "{body}");

    let (status, body) = server.get("/_matrix/client/v3/register/available?username=dave", None).await;
    assert_eq!((status, &body), (200, &json!({ "available": true })));
    let (status, body) = server.get("/_matrix/client/v3/register/available?username=carol", None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_USER_IN_USE")));
    let (status, body) = server.get("/_matrix/client/v3/register/available?username=Dave", None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_USERNAME")));

    // Guests are not offered.
    let (status, body) = server.post("/_matrix/client/v3/register?kind=guest", None, json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_GUEST_ACCESS_FORBIDDEN")), "{body}");
    // Nothing was created by the refused attempts.
    let (status, _) = server.get("/_matrix/client/v3/register/available?username=dave", None).await;
    assert_eq!(status, 200);
}

async fn token_flow_needs_a_configured_token(backend: Backend) {
    let options = Options::default()
        .env("SEQLINE_REGISTRATION", "token")
        .env("SEQLINE_REGISTRATION_TOKENS", "sesame,open-up");
    let server = Server::start_with(&backend, options).await;

    let (status, body) = server.post(REGISTER, None, json!({ "username": "erin", "password": "pw" })).await;
    assert_eq!(status, 401);
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.registration_token"] }]));
    let session = body["session"].as_str().unwrap().to_owned();

    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "erin", "password": "pw", "auth": { "type": "m.login.registration_token", "token": "wrong", "session": session } }),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["errcode"], "M_FORBIDDEN");
    assert_eq!(body["session"], session.as_str());
    // The dummy stage is not offered in token mode.
    let (status, body) = server
        .post(REGISTER, None, json!({ "username": "erin", "password": "pw", "auth": { "type": "m.login.dummy", "session": session } }))
        .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.get("completed").is_none(), "{body}");

    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "erin", "password": "pw", "auth": { "type": "m.login.registration_token", "token": "open-up", "session": session } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user_id"], "@erin:test.local");

    let validity = "/_matrix/client/v1/register/m.login.registration_token/validity";
    let (status, body) = server.get(&format!("{validity}?token=sesame"), None).await;
    assert_eq!((status, &body), (200, &json!({ "valid": true })));
    let (status, body) = server.get(&format!("{validity}?token=nope"), None).await;
    assert_eq!((status, &body), (200, &json!({ "valid": false })));
    let (status, body) = server.get(validity, None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_MISSING_PARAM")), "{body}");
}

async fn registration_off_refuses_and_cli_creates_users(backend: Backend) {
    let server = Server::start_with(&backend, Options::default().env("SEQLINE_REGISTRATION", "off")).await;
    let (status, body) = server
        .post(
            REGISTER,
            None,
            json!({ "username": "frank", "password": "pw", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")), "{body}");
    let (status, body) = server.get("/_matrix/client/v3/register/available?username=frank", None).await;
    assert_eq!((status, body["errcode"].as_str()), (403, Some("M_FORBIDDEN")), "{body}");

    // The operator creates accounts from the command line, against the same database.
    let output = server
        .command()
        .args(["register-user", "--user", "frank", "--password", "s3cret", "--admin"])
        .output()
        .await
        .expect("run register-user");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("created @frank:test.local (admin)"));
    let frank = server.login("frank", "s3cret").await;
    assert_eq!(frank.user_id, "@frank:test.local");

    // A second account with the same name is refused with a clear message.
    let output = server
        .command()
        .args(["register-user", "--user", "frank", "--password", "other"])
        .output()
        .await
        .expect("run register-user");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("User ID already taken"));
}

async fn inhibit_login_and_chosen_device(backend: Backend) {
    let server = Server::start(&backend).await;
    let (status, body) = server
        .post(REGISTER, None, json!({ "username": "gina", "password": "pw", "inhibit_login": true, "auth": { "type": "m.login.dummy" } }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user_id"], "@gina:test.local");
    assert!(body.get("access_token").is_none(), "{body}");

    let (status, body) = server
        .post(REGISTER, None, json!({ "username": "hank", "password": "pw", "device_id": "HANKPHONE", "auth": { "type": "m.login.dummy" } }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["device_id"], "HANKPHONE");
}

/// matrix-nio's token registration (and other clients) first send an `auth`
/// with neither `type` nor `session`: the answer is the 401 with the flows
/// and a new session (as Synapse), which then completes; the same holds for
/// a password change.
async fn auth_without_type_or_session_gets_the_flows(backend: Backend) {
    let options =
        Options::default().env("SEQLINE_REGISTRATION", "token").env("SEQLINE_REGISTRATION_TOKENS", "sesame");
    let server = Server::start_with(&backend, options).await;
    let (status, body) =
        server.post(REGISTER, None, json!({ "username": "nio", "password": "pw", "auth": {} })).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.registration_token"] }]));
    let session = body["session"].as_str().expect("a new session").to_owned();
    let auth = json!({ "type": "m.login.registration_token", "token": "sesame", "session": session });
    let (status, body) =
        server.post(REGISTER, None, json!({ "username": "nio", "password": "pw", "auth": auth })).await;
    assert_eq!(status, 200, "{body}");
    let token = body["access_token"].as_str().expect("access_token").to_owned();

    let password = "/_matrix/client/v3/account/password";
    let (status, body) =
        server.post(password, Some(&token), json!({ "new_password": "pw2", "auth": {} })).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["flows"], json!([{ "stages": ["m.login.password"] }]));
    assert!(body["session"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    // A malformed auth (a type but no stage fields) is still an error.
    let (status, body) =
        server.post(password, Some(&token), json!({ "new_password": "pw2", "auth": { "type": 5 } })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
}
