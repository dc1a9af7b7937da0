//! URL previews (`/_matrix/client/v1/media/preview_url` and the legacy
//! `/_matrix/media/v3/preview_url`) against a small web server of the test's
//! own on loopback (allowed by `SEQLINE_URL_PREVIEW_IP_ALLOW` where a test
//! needs it; `SEQLINE_OUTBOUND_IP_ALLOW` does not open it to previews): Open Graph tags, the image stored as media, images previewed
//! directly, redirects, the cache, and every refusal (internal addresses,
//! also behind a redirect; bad parameters; oversized and failing pages;
//! previews switched off; the per-user rate limit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use complement_tests::api::{assert_error, enc, eventually};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

backend_tests!(
    open_graph_and_image_are_previewed_and_cached,
    an_image_url_previews_as_the_image,
    internal_addresses_are_refused_also_behind_redirects,
    bad_requests_and_failing_pages_get_matrix_errors,
    previews_can_be_switched_off,
    fetches_are_rate_limited_per_user_but_cached_answers_are_not,
    one_user_has_at_most_two_previews_under_way,
);

fn png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// One canned answer: status, extra headers, body; `held` ones wait for
/// [`Web::release`] before answering.
#[derive(Clone)]
struct Page {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    held: bool,
}

impl Page {
    fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
            held: false,
        }
    }

    fn redirect(to: &str) -> Self {
        Self { status: 302, headers: vec![("Location".into(), to.into())], body: Vec::new(), held: false }
    }

    fn held(mut self) -> Self {
        self.held = true;
        self
    }
}

/// A web server on 127.0.0.1 answering each path with its page (404
/// otherwise) and counting the requests per path.
struct Web {
    base: String,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Web {
    async fn start(pages: Vec<(&str, Page)>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let pages: Arc<HashMap<String, Page>> =
            Arc::new(pages.into_iter().map(|(p, page)| (p.to_owned(), page)).collect());
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (counted, gated) = (hits.clone(), gate.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (pages, hits, gate) = (pages.clone(), counted.clone(), gated.clone());
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let page = pages.get(&path).cloned().unwrap_or(Page::ok("text/plain", "no such page"));
                    if page.held {
                        let _pass = gate.acquire().await;
                    }
                    let status = if pages.contains_key(&path) { page.status } else { 404 };
                    let mut head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                        page.body.len()
                    );
                    for (k, v) in &page.headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&page.body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { base, hits, gate }
    }

    /// Lets held pages answer.
    fn release(&self) {
        self.gate.add_permits(1);
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn loopback_allowed() -> Options {
    Options::default().env("SEQLINE_URL_PREVIEW_IP_ALLOW", "127.0.0.0/8")
}

const ROCK: &str = r#"<html prefix="og: http://ogp.me/ns#"><head><title>The Rock (1996)</title>
<meta property="og:title" content="The Rock" />
<meta property="og:type" content="video.movie" />
<meta property="og:url" content="http://www.imdb.com/title/tt0117500/" />
<meta property="og:image" content="test.png" />
</head><body></body></html>"#;

async fn preview(server: &Server, token: Option<&str>, query: &str) -> (u16, Value) {
    server.get(&format!("/_matrix/client/v1/media/preview_url?{query}"), token).await
}

fn url_query(url: &str) -> String {
    format!("url={}", enc(url))
}

async fn download(server: &Server, token: &str, mxc: &str) -> Vec<u8> {
    let path = mxc.strip_prefix("mxc://").expect("an mxc URI");
    let response = server
        .http()
        .get(server.url(&format!("/_matrix/client/v1/media/download/{path}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap().to_vec()
}

async fn open_graph_and_image_are_previewed_and_cached(backend: Backend) {
    let image = png(279, 129);
    let web = Web::start(vec![
        ("/films/test.html", Page::ok("text/html", ROCK)),
        ("/films/test.png", Page::ok("image/png", image.clone())),
        ("/moved", Page::redirect("/films/test.html")),
    ])
    .await;
    let server = Server::start_with(&backend, loopback_allowed()).await;
    let alice = server.register("alice", "pw").await;
    let (status, og) = preview(&server, Some(&alice.token), &url_query(&web.url("/films/test.html"))).await;
    assert_eq!(status, 200, "{og}");
    assert_eq!(og["og:title"], "The Rock");
    assert_eq!(og["og:type"], "video.movie");
    assert_eq!(og["og:url"], "http://www.imdb.com/title/tt0117500/");
    assert_eq!(og["og:image:width"], 279);
    assert_eq!(og["og:image:height"], 129);
    assert_eq!(og["og:image:type"], "image/png");
    assert_eq!(og["matrix:image:size"], image.len());
    let mxc = og["og:image"].as_str().expect("og:image").to_owned();
    assert!(mxc.starts_with("mxc://test.local/"), "{mxc}");
    assert_eq!(download(&server, &alice.token, &mxc).await, image, "the stored image is the page's");
    assert_eq!((web.hits("/films/test.html"), web.hits("/films/test.png")), (1, 1));

    // Again, by another user and on the legacy path, with a fragment the
    // page's server never sees: the cached preview, no fetch.
    let bob = server.register("bob", "pw").await;
    let legacy = format!("/_matrix/media/v3/preview_url?{}", url_query(&web.url("/films/test.html#cast")));
    let (status, again) = server.get(&legacy, Some(&bob.token)).await;
    assert_eq!((status, &again), (200, &og));
    assert_eq!((web.hits("/films/test.html"), web.hits("/films/test.png")), (1, 1));

    // A redirect is followed; the image is resolved against the page's own URL.
    let (status, moved) = preview(&server, Some(&bob.token), &url_query(&web.url("/moved"))).await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["og:title"], "The Rock");
    assert_eq!(download(&server, &bob.token, moved["og:image"].as_str().unwrap()).await, image);
    assert_eq!((web.hits("/moved"), web.hits("/films/test.html")), (1, 2));
}

async fn an_image_url_previews_as_the_image(backend: Backend) {
    let image = png(40, 30);
    let web = Web::start(vec![
        ("/cat.png", Page::ok("image/png", image.clone())),
        ("/notes.txt", Page::ok("text/plain; charset=utf-8", "just text")),
        (
            "/no-image.html",
            Page::ok("text/html", "<title>T</title><meta property=og:image content=/gone.png>"),
        ),
    ])
    .await;
    let server = Server::start_with(&backend, loopback_allowed()).await;
    let alice = server.register("alice", "pw").await;
    let (status, og) = preview(&server, Some(&alice.token), &url_query(&web.url("/cat.png"))).await;
    assert_eq!(status, 200, "{og}");
    assert_eq!((og["og:image:width"].as_u64(), og["og:image:height"].as_u64()), (Some(40), Some(30)));
    assert_eq!(og["matrix:image:size"], image.len());
    assert_eq!(download(&server, &alice.token, og["og:image"].as_str().unwrap()).await, image);
    // Neither a page nor an image: an empty preview.
    let (status, og) = preview(&server, Some(&alice.token), &url_query(&web.url("/notes.txt"))).await;
    assert_eq!((status, og), (200, serde_json::json!({})));
    // A page whose image cannot be fetched: the rest of the preview, no image.
    let (status, og) = preview(&server, Some(&alice.token), &url_query(&web.url("/no-image.html"))).await;
    assert_eq!(status, 200, "{og}");
    assert_eq!(og["og:title"], "T");
    assert!(og.get("og:image").is_none(), "{og}");
    assert_eq!(web.hits("/gone.png"), 1);
}

async fn internal_addresses_are_refused_also_behind_redirects(backend: Backend) {
    let web = Web::start(vec![
        ("/page.html", Page::ok("text/html", ROCK)),
        ("/to-metadata", Page::redirect("http://169.254.169.254/latest/meta-data/")),
        ("/to-v6-loopback", Page::redirect("http://[::1]/")),
    ])
    .await;
    // Default policy: loopback is internal.
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let (status, body) = preview(&server, Some(&alice.token), &url_query(&web.url("/page.html"))).await;
    assert_eq!(status, 403, "an IP literal in a refused range: {body}");
    let by_name = web.url("/page.html").replace("127.0.0.1", "localhost");
    let (status, body) = preview(&server, Some(&alice.token), &url_query(&by_name)).await;
    assert_eq!(status, 502, "a name resolving to refused addresses only: {body}");
    assert_eq!(body["errcode"], "M_UNKNOWN");
    assert_eq!(web.hits("/page.html"), 0, "no connection was made");

    // Loopback allowed for push gateways and federation is still refused to
    // previews: any user could otherwise reach what the operator opened.
    let server =
        Server::start_with(&backend, Options::default().env("SEQLINE_OUTBOUND_IP_ALLOW", "127.0.0.0/8"))
            .await;
    let alice = server.register("alice", "pw").await;
    let (status, body) = preview(&server, Some(&alice.token), &url_query(&web.url("/page.html"))).await;
    assert_eq!(status, 403, "outbound.ip_allow does not open loopback to previews: {body}");
    assert_eq!(web.hits("/page.html"), 0);

    // Loopback allowed, yet a redirect to another internal range is refused.
    let server = Server::start_with(&backend, loopback_allowed()).await;
    let alice = server.register("alice", "pw").await;
    for path in ["/to-metadata", "/to-v6-loopback"] {
        let (status, body) = preview(&server, Some(&alice.token), &url_query(&web.url(path))).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(web.hits(path), 1);
    }
}

async fn bad_requests_and_failing_pages_get_matrix_errors(backend: Backend) {
    let web = Web::start(vec![
        ("/big.html", Page::ok("text/html", vec![b'a'; 5000])),
        ("/loop", Page::redirect("/loop")),
        ("/nowhere", Page::redirect("ftp://example.org/")),
        ("/ok.html", Page::ok("text/html", "<title>Fine</title>")),
    ])
    .await;
    let options = loopback_allowed().env("SEQLINE_URL_PREVIEW_MAX_BYTES", "4096");
    let server = Server::start_with(&backend, options).await;
    let alice = server.register("alice", "pw").await;
    let token = Some(alice.token.as_str());
    assert_error(&preview(&server, token, "").await, 400, "M_MISSING_PARAM", "no url");
    for bad in ["ftp://example.org/x", "file:///etc/passwd", "not a url", "http://"] {
        assert_error(&preview(&server, token, &url_query(bad)).await, 400, "M_INVALID_PARAM", bad);
    }
    let long = web.url(&format!("/{}", "a".repeat(3000)));
    assert_error(&preview(&server, token, &url_query(&long)).await, 400, "M_INVALID_PARAM", "a long url");
    let ts = format!("{}&ts=yesterday", url_query(&web.url("/ok.html")));
    assert_error(&preview(&server, token, &ts).await, 400, "M_INVALID_PARAM", "ts not a number");
    let fine = url_query(&web.url("/ok.html"));
    assert_error(&preview(&server, None, &fine).await, 401, "M_MISSING_TOKEN", "no token");
    assert_error(&preview(&server, Some("nonsense"), &fine).await, 401, "M_UNKNOWN_TOKEN", "bad token");
    assert_eq!(web.hits("/ok.html"), 0, "refused requests fetch nothing");

    let big = preview(&server, token, &url_query(&web.url("/big.html"))).await;
    assert_error(&big, 502, "M_TOO_LARGE", "a page over the size cap");
    for (path, what) in [
        ("/missing", "a 404 page"),
        ("/loop", "a redirect loop"),
        ("/nowhere", "a redirect to a non-http URL"),
    ] {
        assert_error(&preview(&server, token, &url_query(&web.url(path))).await, 502, "M_UNKNOWN", what);
    }
    assert_eq!(web.hits("/loop"), 11, "the first request and ten redirects");
    // Failures are not cached: the page is asked again.
    assert_error(&preview(&server, token, &url_query(&web.url("/missing"))).await, 502, "M_UNKNOWN", "again");
    assert_eq!(web.hits("/missing"), 2);
    let (status, og) = preview(&server, token, &format!("{fine}&ts=1700000000000")).await;
    assert_eq!((status, og["og:title"].as_str()), (200, Some("Fine")));
}

async fn previews_can_be_switched_off(backend: Backend) {
    let web = Web::start(vec![("/ok.html", Page::ok("text/html", "<title>Fine</title>"))]).await;
    let server = Server::start_with(&backend, loopback_allowed().env("SEQLINE_URL_PREVIEWS", "off")).await;
    let alice = server.register("alice", "pw").await;
    let answer = preview(&server, Some(&alice.token), &url_query(&web.url("/ok.html"))).await;
    assert_error(&answer, 404, "M_UNRECOGNIZED", "previews off");
    assert_eq!(web.hits("/ok.html"), 0);
}

async fn fetches_are_rate_limited_per_user_but_cached_answers_are_not(backend: Backend) {
    let pages: Vec<(String, Page)> = (0..4)
        .map(|i| (format!("/p{i}.html"), Page::ok("text/html", format!("<title>P{i}</title>"))))
        .collect();
    let web = Web::start(pages.iter().map(|(p, page)| (p.as_str(), page.clone())).collect()).await;
    let config = "[rate_limits]\nenabled = true\nregister_burst = 100\nregister_per_second = 100\n\
                  url_preview_burst = 2\nurl_preview_per_second = 0.001\n";
    let options = loopback_allowed().config(config).env("SEQLINE_RATE_LIMITS", "on");
    let server = Server::start_with(&backend, options).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    for i in 0..2 {
        let (status, og) =
            preview(&server, Some(&alice.token), &url_query(&web.url(&format!("/p{i}.html")))).await;
        assert_eq!((status, og["og:title"].as_str()), (200, Some(format!("P{i}").as_str())));
    }
    let limited = preview(&server, Some(&alice.token), &url_query(&web.url("/p2.html"))).await;
    assert_error(&limited, 429, "M_LIMIT_EXCEEDED", "a third fetch");
    assert_eq!(web.hits("/p2.html"), 0);
    // Cached previews are still served to her; bob has his own budget.
    let (status, _) = preview(&server, Some(&alice.token), &url_query(&web.url("/p0.html"))).await;
    assert_eq!(status, 200);
    let (status, og) = preview(&server, Some(&bob.token), &url_query(&web.url("/p2.html"))).await;
    assert_eq!((status, og["og:title"].as_str()), (200, Some("P2")));
}

/// One user has at most two previews under way (a third is 429 and fetches
/// nothing); another user is not held up by them.
async fn one_user_has_at_most_two_previews_under_way(backend: Backend) {
    let web = Web::start(vec![
        ("/slow1", Page::ok("text/html", "<title>S1</title>").held()),
        ("/slow2", Page::ok("text/html", "<title>S2</title>").held()),
        ("/fast", Page::ok("text/html", "<title>F</title>")),
    ])
    .await;
    let server = Server::start_with(&backend, loopback_allowed()).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let mut slow = Vec::new();
    for path in ["/slow1", "/slow2"] {
        let url = server.url(&format!("/_matrix/client/v1/media/preview_url?{}", url_query(&web.url(path))));
        let (http, token) = (server.http().clone(), alice.token.clone());
        slow.push(tokio::spawn(async move {
            let response = http.get(url).bearer_auth(token).send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        }));
    }
    eventually("both slow pages asked for", || async {
        (web.hits("/slow1") == 1 && web.hits("/slow2") == 1).then_some(())
    })
    .await;
    let third = preview(&server, Some(&alice.token), &url_query(&web.url("/fast"))).await;
    assert_error(&third, 429, "M_LIMIT_EXCEEDED", "a third preview under way");
    assert_eq!(web.hits("/fast"), 0);
    let (status, og) = preview(&server, Some(&bob.token), &url_query(&web.url("/fast"))).await;
    assert_eq!((status, og["og:title"].as_str()), (200, Some("F")), "bob has his own places");

    web.release();
    let mut titles = Vec::new();
    for task in slow {
        let (status, og) = task.await.unwrap();
        assert_eq!(status, 200, "{og}");
        titles.push(og["og:title"].as_str().unwrap().to_owned());
    }
    assert_eq!(titles, ["S1", "S2"]);
    let (status, og) = preview(&server, Some(&alice.token), &url_query(&web.url("/fast"))).await;
    assert_eq!((status, og["og:title"].as_str()), (200, Some("F")), "her places are hers again");
}
