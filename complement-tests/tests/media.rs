//! Media: upload, async create + PUT, download (authenticated and legacy),
//! safe serving headers, thumbnails, limits: the thumbnail pixel cap, the fixed
//! thumbnail sizes, the cap on pending `/v1/create` reservations, tokens on the
//! `/_matrix/client/v1/media` paths, large downloads.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use reqwest::Method;
use serde_json::json;

backend_tests!(
    upload_download_and_safe_headers,
    async_upload_and_thumbnails,
    upload_limit_and_errors,
    thumbnail_pixel_cap_is_a_setting,
    thumbnail_of_a_huge_image_is_refused,
    thumbnails_come_in_fixed_sizes,
    pending_creates_are_capped,
    client_v1_media_needs_a_token,
    large_download_streams_whole,
);

fn png(width: u32, height: u32) -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(width, height, |x, y| image::Rgb([(x % 256) as u8, (y % 256) as u8, 128]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A valid 1x1 PNG whose header claims `width` x `height` pixels (IHDR patched,
/// its CRC recomputed): what a decompression bomb looks like before decoding.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = png(1, 1);
    // Signature (8), IHDR length (4), "IHDR" (4), then width and height.
    assert_eq!(&bytes[12..16], b"IHDR");
    bytes[16..20].copy_from_slice(&width.to_be_bytes());
    bytes[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32fast::hash(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

fn media_id(body: &serde_json::Value) -> String {
    body["content_uri"].as_str().expect("content_uri").rsplit('/').next().unwrap().to_owned()
}

async fn thumbnail(server: &Server, token: &str, id: &str, query: &str) -> reqwest::Response {
    server
        .http()
        .get(server.url(&format!("/_matrix/client/v1/media/thumbnail/test.local/{id}?{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
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

    for (method, w, h, want) in [("crop", 32, 32, (32, 32)), ("scale", 50, 50, (200, 100))] {
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
        // 50x50 scale is served the 320x240 size, which the image fits whole.
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

async fn thumbnail_pixel_cap_is_a_setting(backend: Backend) {
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_MAX_THUMBNAIL_PIXELS", "10000")).await;
    let alice = server.register("alice", "pw").await;
    // 200x100 is over 10000 pixels, 50x50 is not.
    let (_, body) = upload(&server, &alice.token, "image/png", "wide.png", png(200, 100)).await;
    let response = thumbnail(&server, &alice.token, &media_id(&body), "width=32&height=32&method=crop").await;
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_UNKNOWN", "{body}");
    let (_, body) = upload(&server, &alice.token, "image/png", "small.png", png(50, 50)).await;
    let response = thumbnail(&server, &alice.token, &media_id(&body), "width=32&height=32&method=crop").await;
    assert_eq!(response.status(), 200);
    let img = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
    assert_eq!((img.width(), img.height()), (32, 32));
}

async fn thumbnail_of_a_huge_image_is_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) =
        upload(&server, &alice.token, "image/png", "bomb.png", png_claiming(30_000, 30_000)).await;
    assert_eq!(status, 200, "{body}");
    let bomb = media_id(&body);
    // Many at once: each is refused from the header alone.
    let requests = (0..8).map(|i| {
        let query = format!("width={}&height={}&method={}", 32 + i, 32 + i, ["crop", "scale"][i % 2]);
        let url = server.url(&format!("/_matrix/client/v1/media/thumbnail/test.local/{bomb}?{query}"));
        let request = server.http().get(url).bearer_auth(&alice.token);
        async move { request.send().await.unwrap() }
    });
    for response in futures_join(requests).await {
        assert_eq!(response.status(), 400);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["errcode"], "M_UNKNOWN", "{body}");
        assert!(body["error"].as_str().unwrap().contains("30000x30000"), "{body}");
    }
    // The original is still served as uploaded, and the server goes on serving.
    let response = server
        .http()
        .get(server.url(&format!("/_matrix/client/v1/media/download/test.local/{bomb}")))
        .bearer_auth(&alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().as_ref(), png_claiming(30_000, 30_000).as_slice());
    let (status, body) = server.get("/_matrix/client/v3/account/whoami", Some(&alice.token)).await;
    assert_eq!((status, body["user_id"].as_str()), (200, Some(alice.user_id.as_str())));
    let (_, body) = upload(&server, &alice.token, "image/png", "fine.png", png(200, 100)).await;
    let response = thumbnail(&server, &alice.token, &media_id(&body), "width=32&height=32&method=crop").await;
    assert_eq!(response.status(), 200);
}

/// Sends every request at once and waits for all the answers, in order.
async fn futures_join(
    requests: impl Iterator<Item = impl std::future::Future<Output = reqwest::Response> + Send + 'static>,
) -> Vec<reqwest::Response> {
    let handles: Vec<_> = requests.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

async fn thumbnails_come_in_fixed_sizes(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, body) = upload(&server, &alice.token, "image/png", "photo.png", png(1000, 750)).await;
    let id = media_id(&body);
    let mut got = Vec::new();
    for query in ["width=33&height=33&method=crop", "width=90&height=90&method=crop"] {
        let response = thumbnail(&server, &alice.token, &id, query).await;
        assert_eq!(response.status(), 200, "{query}");
        assert_eq!(response.headers()["content-type"], "image/png");
        got.push(response.bytes().await.unwrap());
    }
    assert!(got[0] == got[1], "33x33 and 90x90 are both served the 96x96 crop");
    let img = image::load_from_memory(&got[0]).unwrap();
    assert_eq!((img.width(), img.height()), (96, 96));
    for (query, want) in [
        ("width=32&height=32&method=crop", (32, 32)),
        ("width=20&height=10&method=crop", (32, 32)),
        // Scale: the smallest box at least as large (320x240, 640x480, 800x600).
        ("width=100&height=100&method=scale", (320, 240)),
        ("width=321&height=200&method=scale", (640, 480)),
        ("width=640&height=480", (640, 480)),
        // Larger than every size: the largest.
        ("width=1000&height=1000&method=scale", (800, 600)),
        ("width=500&height=500&method=crop", (96, 96)),
    ] {
        let response = thumbnail(&server, &alice.token, &id, query).await;
        assert_eq!(response.status(), 200, "{query}");
        let img = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
        assert_eq!((img.width(), img.height()), want, "{query}");
    }
    // An image smaller than the size is served as it is.
    let small = png(40, 30);
    let (_, body) = upload(&server, &alice.token, "image/png", "small.png", small.clone()).await;
    let response =
        thumbnail(&server, &alice.token, &media_id(&body), "width=300&height=300&method=scale").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().as_ref(), small.as_slice());
    // Not an image: no thumbnail.
    let (_, body) = upload(&server, &alice.token, "text/plain", "a.txt", b"not an image".to_vec()).await;
    let response = thumbnail(&server, &alice.token, &media_id(&body), "width=32&height=32&method=crop").await;
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_UNKNOWN", "{body}");
}

async fn pending_creates_are_capped(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (status, body) = server.post("/_matrix/media/v1/create", Some(&alice.token), json!({})).await;
        assert_eq!(status, 200, "{body}");
        ids.push(media_id(&body));
    }
    let (status, body) = server.post("/_matrix/media/v1/create", Some(&alice.token), json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (429, Some("M_LIMIT_EXCEEDED")), "{body}");
    let retry = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(retry > 23 * 3600 * 1000 && retry <= 24 * 3600 * 1000, "{retry}");
    // Others are not affected, and a direct upload is no reservation.
    let (status, _) = server.post("/_matrix/media/v1/create", Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let (status, _) = upload(&server, &alice.token, "text/plain", "a.txt", b"direct".to_vec()).await;
    assert_eq!(status, 200);
    // Uploading to one of the five frees a place.
    let (status, body) = server
        .request_raw(
            Method::PUT,
            &format!("/_matrix/media/v3/upload/test.local/{}", ids[0]),
            Some(&alice.token),
            b"filled".to_vec(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post("/_matrix/media/v1/create", Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post("/_matrix/media/v1/create", Some(&alice.token), json!({})).await;
    assert_eq!((status, body["errcode"].as_str()), (429, Some("M_LIMIT_EXCEEDED")), "{body}");
}

async fn client_v1_media_needs_a_token(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (_, body) = upload(&server, &alice.token, "image/png", "p.png", png(200, 100)).await;
    let id = media_id(&body);
    for path in [
        "/_matrix/client/v1/media/config".to_owned(),
        format!("/_matrix/client/v1/media/download/test.local/{id}"),
        format!("/_matrix/client/v1/media/download/test.local/{id}/p.png"),
        format!("/_matrix/client/v1/media/thumbnail/test.local/{id}?width=32&height=32&method=crop"),
    ] {
        let (status, body) = server.get(&path, None).await;
        assert_eq!((status, body["errcode"].as_str()), (401, Some("M_MISSING_TOKEN")), "{path}");
        let (status, body) = server.get(&path, Some("not-a-token")).await;
        assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNKNOWN_TOKEN")), "{path}");
    }
    // The legacy paths stay open.
    let (status, body) = server.get("/_matrix/media/v3/config", None).await;
    assert_eq!((status, body["m.upload.size"].as_u64()), (200, Some(50 * 1024 * 1024)));
    for path in [
        format!("/_matrix/media/v3/download/test.local/{id}"),
        format!("/_matrix/media/v3/thumbnail/test.local/{id}?width=32&height=32&method=crop"),
    ] {
        let response = server.http().get(server.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
}

async fn large_download_streams_whole(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let size = 20 * 1024 * 1024;
    let mut state = 0x2545_f491_u32;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 24) as u8
        })
        .collect();
    let (status, body) =
        upload(&server, &alice.token, "application/octet-stream", "big.bin", data.clone()).await;
    assert_eq!(status, 200, "{body}");
    let id = media_id(&body);
    for (path, token) in [
        (format!("/_matrix/client/v1/media/download/test.local/{id}"), Some(&alice.token)),
        (format!("/_matrix/media/v3/download/test.local/{id}/big.bin"), None),
    ] {
        let mut request = server.http().get(server.url(&path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["content-length"], size.to_string().as_str(), "{path}");
        assert_eq!(response.headers()["content-type"], "application/octet-stream");
        let got = response.bytes().await.unwrap();
        assert!(got.as_ref() == data.as_slice(), "{path}: {} bytes, not the upload", got.len());
    }
}
