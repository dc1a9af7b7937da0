//! Every error a client can get, with its errcode and status; CORS; discovery.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use reqwest::Method;
use serde_json::json;

backend_tests!(
    body_errors_are_not_json_bad_json_and_too_large,
    unknown_paths_and_methods_are_unrecognized,
    tokens_are_checked_from_header_and_query,
    login_and_register_are_rate_limited,
    cors_headers_and_preflight,
    discovery_endpoints,
);

async fn body_errors_are_not_json_bad_json_and_too_large(backend: Backend) {
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_MAX_REQUEST_BODY_BYTES", "2048")).await;
    let (status, body) =
        server.request_raw(Method::POST, "/_matrix/client/v3/login", None, b"{not json".to_vec()).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_NOT_JSON")), "{body}");
    // Valid JSON syntax but invalid UTF-8 inside a string is not JSON either.
    let (status, body) = server
        .request_raw(Method::POST, "/_matrix/client/v3/register", None, b"{\"test\":\"a\x81\"}".to_vec())
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_NOT_JSON")), "{body}");
    let (status, body) = server.post("/_matrix/client/v3/login", None, json!({ "type": 7 })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");
    let (status, body) = server.post("/_matrix/client/v3/register", None, json!({ "username": ["x"] })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_JSON")), "{body}");

    let big = json!({ "username": "big", "password": "x".repeat(4096), "auth": { "type": "m.login.dummy" } });
    let (status, body) = server.post("/_matrix/client/v3/register", None, big).await;
    assert_eq!((status, body["errcode"].as_str()), (413, Some("M_TOO_LARGE")), "{body}");
    // ... and it changed nothing.
    let (status, _) = server.get("/_matrix/client/v3/register/available?username=big", None).await;
    assert_eq!(status, 200);
}

async fn unknown_paths_and_methods_are_unrecognized(backend: Backend) {
    let server = Server::start(&backend).await;
    for path in [
        "/_matrix/client/v3/nonsense",
        "/_matrix/client/unstable/org.matrix.msc2697.v2/dehydrated_device",
        "/anything/else",
    ] {
        let (status, body) = server.get(path, None).await;
        assert_eq!((status, body["errcode"].as_str()), (404, Some("M_UNRECOGNIZED")), "{path}: {body}");
        assert!(body["error"].is_string());
    }
    let (status, body) = server.request(Method::DELETE, "/_matrix/client/v3/login", None, None).await;
    assert_eq!((status, body["errcode"].as_str()), (405, Some("M_UNRECOGNIZED")), "{body}");
    // Unknown query parameters are ignored.
    let (status, body) = server.get("/_matrix/client/versions?_cacheBuster=123", None).await;
    assert_eq!(status, 200, "{body}");
}

async fn tokens_are_checked_from_header_and_query(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) = server.get("/_matrix/client/v3/account/whoami", None).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_MISSING_TOKEN")), "{body}");
    let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some("slt_bogus")).await;
    assert_eq!(
        (status, body["errcode"].as_str(), body["soft_logout"].as_bool()),
        (401, Some("M_UNKNOWN_TOKEN"), Some(false))
    );
    let (status, body) =
        server.get(&format!("/_matrix/client/v3/account/whoami?access_token={}", alice.token), None).await;
    assert_eq!((status, body["user_id"].as_str()), (200, Some("@alice:test.local")), "{body}");
    // The scheme name is case-insensitive.
    let response = server
        .http()
        .get(server.url("/_matrix/client/v3/account/whoami"))
        .header("Authorization", format!("bearer {}", alice.token))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (status, body) = server.get("/_matrix/client/v3/devices?access_token=nope", None).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")));
}

async fn login_and_register_are_rate_limited(backend: Backend) {
    let config = "[rate_limits]\nenabled = true\nlogin_burst = 2\nlogin_per_second = 0.01\nregister_burst = 3\nregister_per_second = 0.01\n";
    // The harness switches limits off by default; switch them on so the file's rates apply.
    let options = Options::default().config(config).env("SEQLINE_RATE_LIMITS", "on");
    let server = Server::start_with(&backend, options).await;
    server.register("erin", "pw").await;
    let login = json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "erin" }, "password": "pw" });
    for _ in 0..2 {
        let (status, body) = server.post("/_matrix/client/v3/login", None, login.clone()).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server.post("/_matrix/client/v3/login", None, login).await;
    assert_eq!((status, body["errcode"].as_str()), (429, Some("M_LIMIT_EXCEEDED")), "{body}");
    let retry = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry > 1000 && retry <= 100_000, "{retry}");

    // Registration has its own bucket: two more attempts, then limited.
    for name in ["f1", "f2"] {
        let (status, body) = server
            .post(
                "/_matrix/client/v3/register",
                None,
                json!({ "username": name, "password": "pw", "auth": { "type": "m.login.dummy" } }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server
        .post(
            "/_matrix/client/v3/register",
            None,
            json!({ "username": "f3", "password": "pw", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (429, Some("M_LIMIT_EXCEEDED")), "{body}");
    let (status, _) = server.get("/_matrix/client/v3/register/available?username=f3", None).await;
    assert_eq!(status, 200, "the limited registration created nothing");
}

async fn cors_headers_and_preflight(backend: Backend) {
    let server = Server::start(&backend).await;
    let response = server
        .http()
        .request(Method::OPTIONS, server.url("/_matrix/client/v3/login"))
        .header("Origin", "https://app.element.io")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let h = response.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert!(h["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    assert!(h["access-control-allow-headers"].to_str().unwrap().contains("Authorization"));

    for path in ["/_matrix/client/versions", "/_matrix/client/v3/nonsense"] {
        let response = server.http().get(server.url(path)).send().await.unwrap();
        assert_eq!(response.headers()["access-control-allow-origin"], "*", "{path}");
    }
}

async fn discovery_endpoints(backend: Backend) {
    let server = Server::start(&backend).await;
    let (status, body) = server.get("/.well-known/matrix/client", None).await;
    assert_eq!(status, 200);
    assert_eq!(body["m.homeserver"]["base_url"], format!("{}/", server.base_url));

    let (_, body) = server.get("/_matrix/client/versions", None).await;
    let versions: Vec<&str> =
        body["versions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(versions.contains(&"v1.12") && versions.contains(&"r0.6.1"), "{versions:?}");

    let user = server.register("gus", "pw").await;
    let (status, body) = server.get("/_matrix/client/v3/capabilities", Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["capabilities"]["m.change_password"]["enabled"], true, "{body}");
    let rooms = &body["capabilities"]["m.room_versions"];
    assert_eq!(rooms["default"], "12");
    for v in ["10", "11", "12"] {
        assert_eq!(rooms["available"][v], "stable", "{body}");
    }
}
