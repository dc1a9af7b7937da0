//! Media: upload, async create + PUT, download (authenticated and legacy),
//! safe serving headers, thumbnails, limits.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use reqwest::Method;
use serde_json::json;

backend_tests!(upload_download_and_safe_headers, async_upload_and_thumbnails, upload_limit_and_errors);

fn png(width: u32, height: u32) -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(width, height, |x, y| image::Rgb([(x % 256) as u8, (y % 256) as u8, 128]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

async fn upload(
    server: &Server,
    token: &str,
    content_type: &str,
    name: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let response = server
        .http()
        .post(server.url(&format!("/_matrix/media/v3/upload?filename={name}")))
        .bearer_auth(token)
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

async fn upload_download_and_safe_headers(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) =
        upload(&server, &alice.token, "text/plain", "notes.txt", b"hello media".to_vec()).await;
    assert_eq!(status, 200, "{body}");
    let uri = body["content_uri"].as_str().unwrap();
    let rest = uri.strip_prefix("mxc://test.local/").expect("an mxc uri of this server");

    let authed = server
        .http()
        .get(server.url(&format!("/_matrix/client/v1/media/download/test.local/{rest}")))
        .bearer_auth(&alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(authed.status(), 200);
    let h = authed.headers().clone();
    assert_eq!(h["content-type"], "text/plain");
    assert!(h["content-disposition"].to_str().unwrap().starts_with("inline; filename*=utf-8''notes.txt"));
    assert!(h["content-security-policy"].to_str().unwrap().starts_with("sandbox"));
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(authed.bytes().await.unwrap().as_ref(), b"hello media");
    // The authenticated path needs a token.
    let (status, body) =
        server.get(&format!("/_matrix/client/v1/media/download/test.local/{rest}"), None).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_MISSING_TOKEN")));

    // HTML is never served for a browser to render.
    let (_, body) =
        upload(&server, &alice.token, "text/html", "page.html", b"<script>alert(1)</script>".to_vec()).await;
    let id = body["content_uri"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
    let legacy = server
        .http()
        .get(server.url(&format!("/_matrix/media/v3/download/test.local/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(legacy.status(), 200);
    assert!(legacy.headers()["content-disposition"].to_str().unwrap().starts_with("attachment"));
    assert!(legacy.headers()["content-security-policy"].to_str().unwrap().contains("script-src 'none'"));

    let (status, body) = server.get("/_matrix/client/v1/media/config", Some(&alice.token)).await;
    assert_eq!((status, body["m.upload.size"].as_u64()), (200, Some(50 * 1024 * 1024)));
    let (status, body) =
        server.get("/_matrix/client/v1/media/download/test.local/doesnotexist", Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")));
    let (status, body) =
        server.get("/_matrix/client/v1/media/download/elsewhere.org/abc", Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")));
}

async fn async_upload_and_thumbnails(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (status, body) = server.post("/_matrix/media/v1/create", Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let id = body["content_uri"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
    assert!(body["unused_expires_at"].as_i64().is_some());
    // Not there yet.
    let (status, body) =
        server.get(&format!("/_matrix/client/v1/media/download/test.local/{id}"), Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (504, Some("M_NOT_YET_UPLOADED")));
    let put = |token: &str, bytes: Vec<u8>| {
        server
            .http()
            .put(server.url(&format!("/_matrix/media/v3/upload/test.local/{id}")))
            .bearer_auth(token.to_owned())
            .header("Content-Type", "image/png")
            .body(bytes)
            .send()
    };
    let response = put(&bob.token, png(4, 4)).await.unwrap();
    assert_eq!(response.status(), 403, "only the creator uploads");
    let response = put(&alice.token, png(200, 100)).await.unwrap();
    assert_eq!(response.status(), 200);
    let response = put(&alice.token, png(5, 5)).await.unwrap();
    assert_eq!(response.status(), 409);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_CANNOT_OVERWRITE_MEDIA");

    for (method, w, h, want) in [("crop", 32, 32, (32, 32)), ("scale", 50, 50, (50, 25))] {
        let response = server
            .http()
            .get(server.url(&format!(
                "/_matrix/client/v1/media/thumbnail/test.local/{id}?width={w}&height={h}&method={method}"
            )))
            .bearer_auth(&alice.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "image/png");
        let img = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
        assert_eq!((img.width(), img.height()), want, "{method}");
    }
    let (status, body) = server
        .request(
            Method::GET,
            &format!("/_matrix/client/v1/media/thumbnail/test.local/{id}?width=0&height=5"),
            Some(&alice.token),
            None,
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")));
}

async fn upload_limit_and_errors(backend: Backend) {
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_MAX_UPLOAD_BYTES", "1000")).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) =
        upload(&server, &alice.token, "application/octet-stream", "big.bin", vec![7u8; 2000]).await;
    assert_eq!((status, body["errcode"].as_str()), (413, Some("M_TOO_LARGE")), "{body}");
    let (status, _) =
        upload(&server, &alice.token, "application/octet-stream", "ok.bin", vec![7u8; 900]).await;
    assert_eq!(status, 200);
    let response =
        server.http().post(server.url("/_matrix/media/v3/upload")).body(vec![1u8]).send().await.unwrap();
    assert_eq!(response.status(), 401);
}
