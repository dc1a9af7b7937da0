//! Hostile request bodies and path segments at the endpoints that write:
//! `/send`, `/state`, `/createRoom` and `/user/{userId}/filter`. Each gets a
//! Matrix error with its status (`M_NOT_JSON`, `M_BAD_JSON`, `M_TOO_LARGE`,
//! `M_INVALID_PARAM`), changes nothing, and the server keeps answering.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, User};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

backend_tests!(
    deep_nesting_is_bad_json_at_every_endpoint,
    content_at_the_nesting_limit_is_stored_and_served,
    numbers_beyond_canonical_json_are_bad_json,
    bodies_over_the_limit_are_too_large,
    invalid_utf8_nul_bytes_and_duplicate_keys,
    long_event_types_and_state_keys_are_too_large,
    pagination_and_sync_tokens_at_the_ends_of_i64,
    upgrade_deactivate_and_hierarchy_refuse_bad_input,
);

/// The body limit the tests start the server with.
const LIMIT: usize = 64 * 1024;

async fn start(backend: &Backend) -> Server {
    Server::start_with(backend, Options::default().env("SEQLINE_MAX_REQUEST_BODY_BYTES", &LIMIT.to_string()))
        .await
}

async fn create_room(server: &Server, user: &User) -> String {
    let (status, body) = server.post(&format!("{V3}/createRoom"), Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["room_id"].as_str().expect("room_id").to_owned()
}

/// The write endpoints a body can reach, as (method, path).
fn endpoints(user: &User, room: &str, txn: &str) -> Vec<(Method, String)> {
    vec![
        (Method::PUT, room_path(room, &format!("/send/m.room.message/{txn}"))),
        (Method::PUT, room_path(room, "/state/org.example.hostile/key")),
        (Method::POST, format!("{V3}/createRoom")),
        (Method::POST, format!("{V3}/user/{}/filter", enc(&user.user_id))),
    ]
}

/// What a room holds: the ids of its state and of its timeline, to compare
/// before and after.
async fn snapshot(server: &Server, user: &User, room: &str) -> (Vec<Value>, Vec<Value>) {
    let ids = |events: &Value| -> Vec<Value> {
        events.as_array().expect("events").iter().map(|e| e["event_id"].clone()).collect()
    };
    let (status, state) = server.get(&room_path(room, "/state"), Some(&user.token)).await;
    assert_eq!(status, 200, "{state}");
    let (status, page) = server.get(&room_path(room, "/messages?dir=b&limit=1000"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    (ids(&state), ids(&page["chunk"]))
}

async fn joined_rooms(server: &Server, user: &User) -> Value {
    let (status, body) = server.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    body["joined_rooms"].clone()
}

/// Still answering, and with the same session.
async fn still_answers(server: &Server, user: &User) {
    let (status, body) = server.get(&format!("{V3}/account/whoami"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
}

/// `[[[...]]]` (arrays) or `{"a":{"a":...}}` (objects) nested `depth` levels.
fn nested(depth: usize, objects: bool) -> Vec<u8> {
    let (open, close) = if objects { ("{\"a\":", "}") } else { ("[", "]") };
    let mut out = open.repeat(depth);
    out.push_str(if objects { "1" } else { "" });
    out.push_str(&close.repeat(depth));
    out.into_bytes()
}

async fn deep_nesting_is_bad_json_at_every_endpoint(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    for (i, (method, path)) in endpoints(&alice, &room, "deep").into_iter().enumerate() {
        for objects in [false, true] {
            let body = nested(10_000, objects);
            assert!(body.len() < LIMIT);
            let response = server.request_raw(method.clone(), &path, Some(&alice.token), body).await;
            assert_error(&response, 400, "M_BAD_JSON", &format!("{i}: {path}"));
            assert!(response.1["error"].as_str().is_some_and(|e| e.contains("deeper")), "{}", response.1);
        }
    }
    // Deep inside a message's content, under a valid top level.
    let mut body = b"{\"msgtype\":\"m.text\",\"body\":\"x\",\"deep\":".to_vec();
    body.extend(nested(5_000, true));
    body.push(b'}');
    let path = room_path(&room, "/send/m.room.message/deep2");
    let response = server.request_raw(Method::PUT, &path, Some(&alice.token), body).await;
    assert_error(&response, 400, "M_BAD_JSON", "deep content");
    let after = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    assert_eq!(before, after, "nothing changed");
    still_answers(&server, &alice).await;
}

/// Content nested as deep as the request parser takes is stored as a PDU,
/// served back by `/event` and `/sync`, or refused with a 400; never a 500.
async fn content_at_the_nesting_limit_is_stored_and_served(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let mut accepted = 0;
    for depth in [60, 98, 99, 100, 110, 126, 127, 130, 500] {
        let mut body = format!("{{\"msgtype\":\"m.text\",\"body\":\"{depth}\",\"deep\":").into_bytes();
        body.extend(nested(depth, true));
        body.push(b'}');
        let path = room_path(&room, &format!("/send/m.room.message/n{depth}"));
        let (status, response) = server.request_raw(Method::PUT, &path, Some(&alice.token), body).await;
        match status {
            200 => {
                accepted += 1;
                let id = event_id_of(&response);
                let (status, event) =
                    server.get(&room_path(&room, &format!("/event/{}", enc(&id))), Some(&alice.token)).await;
                assert_eq!(status, 200, "{depth}: {event}");
                let mut inner = &event["content"]["deep"];
                for _ in 1..depth {
                    inner = &inner["a"];
                }
                assert_eq!(inner["a"], 1, "{depth}: served whole");
            }
            400 => assert!(
                matches!(response["errcode"].as_str(), Some("M_NOT_JSON" | "M_BAD_JSON")),
                "{depth}: {response}"
            ),
            _ => panic!("{depth}: {status} {response}"),
        }
    }
    assert!(accepted >= 3, "reasonable nesting is accepted");
    let filter = enc(r#"{"room":{"timeline":{"limit":50}}}"#);
    let (status, sync) = server.get(&format!("{V3}/sync?filter={filter}"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{sync}");
    let events = sync["rooms"]["join"][&room]["timeline"]["events"].as_array().expect("timeline").clone();
    let served = events.iter().filter(|e| e["content"]["deep"].is_object()).count();
    assert_eq!(served, accepted, "every stored event is in /sync");
    still_answers(&server, &alice).await;
}

async fn numbers_beyond_canonical_json_are_bad_json(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = snapshot(&server, &alice, &room).await;
    for (i, number) in
        ["9007199254740992", "-9007199254740992", "1e30", "1.5", "1e400", "-1e400"].into_iter().enumerate()
    {
        let body = format!("{{\"msgtype\":\"m.text\",\"body\":\"x\",\"n\":{number}}}").into_bytes();
        let path = room_path(&room, &format!("/send/m.room.message/num{i}"));
        let response = server.request_raw(Method::PUT, &path, Some(&alice.token), body.clone()).await;
        assert_error(&response, 400, "M_BAD_JSON", number);
        let path = room_path(&room, "/state/org.example.number/");
        let response = server.request_raw(Method::PUT, &path, Some(&alice.token), body).await;
        assert_error(&response, 400, "M_BAD_JSON", number);
        let body = format!("{{\"creation_content\":{{\"n\":{number}}}}}").into_bytes();
        let response =
            server.request_raw(Method::POST, &format!("{V3}/createRoom"), Some(&alice.token), body).await;
        assert_error(&response, 400, "M_BAD_JSON", number);
    }
    assert_eq!(before, snapshot(&server, &alice, &room).await, "nothing changed");
    assert_eq!(joined_rooms(&server, &alice).await, json!([room]));
    // The largest integers canonical JSON holds go through exactly.
    let content = json!({ "msgtype": "m.text", "body": "x", "max": 9007199254740991_i64, "min": -9007199254740991_i64 });
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/max"), Some(&alice.token), content.clone()).await;
    assert_eq!(status, 200, "{body}");
    let id = event_id_of(&body);
    let (_, event) = server.get(&room_path(&room, &format!("/event/{}", enc(&id))), Some(&alice.token)).await;
    assert_eq!(event["content"], content);
    still_answers(&server, &alice).await;
}

/// Sends `body` with chunked transfer encoding (no Content-Length) over a
/// plain connection; returns the status line and the body.
async fn send_chunked(server: &Server, path: &str, token: &str, body: &[u8]) -> (u16, Value) {
    let url = reqwest::Url::parse(&server.url(path)).expect("url");
    let address = format!("{}:{}", url.host_str().expect("host"), url.port().expect("port"));
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    for chunk in body.chunks(1000) {
        // The server may answer and close before the whole body is sent.
        if stream.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await.is_err()
            || stream.write_all(chunk).await.is_err()
            || stream.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = text.find("\r\n\r\n").map(|i| &text[i + 4..]).unwrap_or("");
    // The answer may itself be chunked: take the JSON object inside.
    let json = json.find('{').and_then(|a| json.rfind('}').map(|b| &json[a..=b])).unwrap_or("");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// A message body of exactly `len` bytes.
fn message_of_len(len: usize) -> Vec<u8> {
    let frame = "{\"msgtype\":\"m.text\",\"body\":\"\"}".len();
    format!("{{\"msgtype\":\"m.text\",\"body\":\"{}\"}}", "x".repeat(len - frame)).into_bytes()
}

async fn bodies_over_the_limit_are_too_large(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    for (i, (method, path)) in endpoints(&alice, &room, "big").into_iter().enumerate() {
        let body = message_of_len(LIMIT + 1);
        let response = server.request_raw(method.clone(), &path, Some(&alice.token), body).await;
        assert_error(&response, 413, "M_TOO_LARGE", &format!("{i}: {path}"));
    }
    // Without a Content-Length the server stops reading at the limit.
    let path = room_path(&room, "/send/m.room.message/chunked");
    let response = send_chunked(&server, &path, &alice.token, &message_of_len(LIMIT * 16)).await;
    assert_error(&response, 413, "M_TOO_LARGE", "chunked");
    let after = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    assert_eq!(before, after, "nothing changed");
    // A body of exactly the limit is read (and, as an event, refused by the PDU size).
    let path = room_path(&room, "/send/m.room.message/exact");
    let response = server.request_raw(Method::PUT, &path, Some(&alice.token), message_of_len(LIMIT)).await;
    assert_error(&response, 413, "M_TOO_LARGE", "PDU over 64 KiB");
    assert!(response.1["error"].as_str().is_some_and(|e| e.contains("event")), "{}", response.1);
    let response = send_chunked(&server, &path, &alice.token, &message_of_len(1000)).await;
    assert_eq!(response.0, 200, "{}", response.1);
    event_id_of(&response.1);
    still_answers(&server, &alice).await;
}

async fn invalid_utf8_nul_bytes_and_duplicate_keys(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    for (i, (method, path)) in endpoints(&alice, &room, "bytes").into_iter().enumerate() {
        for (what, body) in [
            ("invalid UTF-8", b"{\"body\":\"\xff\xfe\"}".to_vec()),
            ("invalid UTF-8 in a key", b"{\"\xc3\":1}".to_vec()),
            ("a raw NUL", b"{\"body\":\"a\x00b\"}".to_vec()),
            ("a NUL after the value", b"{}\x00".to_vec()),
            ("a lone surrogate", b"{\"body\":\"\\ud800\"}".to_vec()),
            ("two values", b"{}{}".to_vec()),
        ] {
            let response = server.request_raw(method.clone(), &path, Some(&alice.token), body).await;
            assert_error(&response, 400, "M_NOT_JSON", &format!("{i} {path}: {what}"));
        }
        for (what, body) in [
            ("duplicate keys", &b"{\"name\":\"a\",\"body\":\"b\",\"name\":\"c\"}"[..]),
            ("duplicate escaped keys", b"{\"name\":\"a\",\"\\u006eame\":\"c\"}"),
            ("nested duplicate keys", b"{\"x\":{\"k\":1,\"k\":2}}"),
        ] {
            let response = server.request_raw(method.clone(), &path, Some(&alice.token), body.to_vec()).await;
            assert_error(&response, 400, "M_BAD_JSON", &format!("{i} {path}: {what}"));
        }
    }
    // NUL in the event type, the state key or the transaction id of the path.
    for path in [
        room_path(&room, "/send/m.room.message%00x/nul1"),
        room_path(&room, "/send/m.room.message/nul%00txn"),
        room_path(&room, "/state/org.example.nul%00/"),
        room_path(&room, "/state/org.example.nul/key%00"),
    ] {
        let response = server.put(&path, Some(&alice.token), text("x")).await;
        assert_error(&response, 400, "M_INVALID_PARAM", &path);
    }
    let body =
        json!({ "initial_state": [{ "type": "org.example.nul", "state_key": "a\u{0}b", "content": {} }] });
    let response = server.post(&format!("{V3}/createRoom"), Some(&alice.token), body).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "createRoom initial_state");
    let after = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    assert_eq!(before, after, "nothing changed");

    // An escaped NUL inside content is a valid string: stored and served as sent.
    let content = json!({ "msgtype": "m.text", "body": "a\u{0}b", "k\u{0}": "\u{0}" });
    let (status, body) = server
        .put(&room_path(&room, "/send/m.room.message/nulcontent"), Some(&alice.token), content.clone())
        .await;
    assert_eq!(status, 200, "{body}");
    let id = event_id_of(&body);
    let (_, event) = server.get(&room_path(&room, &format!("/event/{}", enc(&id))), Some(&alice.token)).await;
    assert_eq!(event["content"], content);
    still_answers(&server, &alice).await;
}

async fn long_event_types_and_state_keys_are_too_large(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    let long = "k".repeat(256);
    // Multi-byte characters count in bytes: 128 × 2 bytes = 256.
    let long_unicode = "é".repeat(128);
    for key in [&long, &long_unicode] {
        let response = server
            .put(
                &room_path(&room, &format!("/state/org.example.long/{}", enc(key))),
                Some(&alice.token),
                json!({}),
            )
            .await;
        assert_error(&response, 413, "M_TOO_LARGE", "state key");
        let response = server
            .put(
                &room_path(&room, &format!("/send/{}/long", enc(&format!("m.{key}")))),
                Some(&alice.token),
                json!({}),
            )
            .await;
        assert_error(&response, 413, "M_TOO_LARGE", "event type");
        let response = server
            .put(
                &room_path(&room, &format!("/state/{}/", enc(&format!("m.{key}")))),
                Some(&alice.token),
                json!({}),
            )
            .await;
        assert_error(&response, 413, "M_TOO_LARGE", "state event type");
        let body =
            json!({ "initial_state": [{ "type": "org.example.long", "state_key": key, "content": {} }] });
        let response = server.post(&format!("{V3}/createRoom"), Some(&alice.token), body).await;
        assert_error(&response, 413, "M_TOO_LARGE", "createRoom initial_state");
    }
    let after = (snapshot(&server, &alice, &room).await, joined_rooms(&server, &alice).await);
    assert_eq!(before, after, "nothing changed");
    // 255 bytes is allowed, for both.
    let key = "k".repeat(255);
    let (status, body) = server
        .put(
            &room_path(&room, &format!("/state/org.example.long/{}", enc(&key))),
            Some(&alice.token),
            json!({ "v": 1 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .get(&room_path(&room, &format!("/state/org.example.long/{}", enc(&key))), Some(&alice.token))
        .await;
    assert_eq!((status, body), (200, json!({ "v": 1 })));
    let kind = format!("m.{}", "t".repeat(253));
    let (status, body) = server
        .put(&room_path(&room, &format!("/send/{}/ok", enc(&kind))), Some(&alice.token), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    still_answers(&server, &alice).await;
}

/// Tokens are positions (`p<pos>`): the largest ones parse and read nothing
/// past the line's end; what does not parse is `M_INVALID_PARAM`.
async fn pagination_and_sync_tokens_at_the_ends_of_i64(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice).await;
    let (status, body) =
        server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("one")).await;
    assert_eq!(status, 200, "{body}");
    let first = event_id_of(&body);
    let max = i64::MAX;
    for (query, expected) in [
        (format!("dir=f&from=p{max}"), 0),
        (format!("dir=b&from=p{max}"), 7),
        (format!("dir=b&to=p{max}"), 0),
        (format!("dir=f&from=p0&to=p{max}"), 7),
        (format!("dir=b&from=s{max}_0"), 7),
    ] {
        let (status, page) =
            server.get(&room_path(&room, &format!("/messages?limit=100&{query}")), Some(&alice.token)).await;
        assert_eq!(status, 200, "{query}: {page}");
        let chunk = page["chunk"].as_array().expect("chunk");
        assert_eq!(chunk.len(), expected, "{query}: {page}");
        if expected > 0 {
            assert!(chunk.iter().any(|e| e["event_id"] == first.as_str()), "{query}");
        }
    }
    // An old dense token (t<seq>) past what the migration to sparse positions
    // can map was never issued.
    let too_old = format!("dir=b&from=t{max}");
    for query in [
        "dir=f&from=p-1",
        "dir=f&from=p9223372036854775808",
        "dir=f&from=t-1",
        too_old.as_str(),
        "dir=b&from=x",
        "dir=b&to=s1",
    ] {
        let response = server.get(&room_path(&room, &format!("/messages?{query}")), Some(&alice.token)).await;
        assert_error(&response, 400, "M_INVALID_PARAM", query);
    }
    let response =
        server.get(&format!("{V3}/sync?since=s{max}_{}&timeout=0", u64::MAX), Some(&alice.token)).await;
    assert_eq!(response.0, 200, "{}", response.1);
    still_answers(&server, &alice).await;
}

/// `/upgrade`, `/account/deactivate` and `/hierarchy` with what an attacker
/// sends: bodies that are not JSON, too large or of the wrong shape, room
/// ids that do not exist or are another's, parameters out of range. Each is
/// a Matrix error and changes nothing: the room is not tombstoned, the
/// account still works.
async fn upgrade_deactivate_and_hierarchy_refuse_bad_input(backend: Backend) {
    let server = start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let mallory = server.register("mallory", "pw").await;
    let room = create_room(&server, &alice).await;
    let before = snapshot(&server, &alice, &room).await;
    let upgrade = room_path(&room, "/upgrade");

    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("not JSON", b"{new_version: 10".to_vec(), 400, "M_NOT_JSON"),
        ("no version", b"{}".to_vec(), 400, "M_BAD_JSON"),
        ("version not a string", br#"{"new_version": 10}"#.to_vec(), 400, "M_BAD_JSON"),
        ("unknown version", br#"{"new_version": "999"}"#.to_vec(), 400, "M_UNSUPPORTED_ROOM_VERSION"),
        ("too large", message_of_len(LIMIT + 1), 413, "M_TOO_LARGE"),
    ];
    for (what, body, status, errcode) in cases {
        let response = server.request_raw(Method::POST, &upgrade, Some(&alice.token), body).await;
        assert_error(&response, status, errcode, &format!("upgrade: {what}"));
    }
    // Another's room, and a room that does not exist: the same 403.
    let body = json!({ "new_version": "11" });
    let response = server.request(Method::POST, &upgrade, Some(&mallory.token), Some(body.clone())).await;
    assert_error(&response, 403, "M_FORBIDDEN", "upgrade by a non-member");
    let nowhere = room_path("!nowhere:localhost", "/upgrade");
    let response = server.request(Method::POST, &nowhere, Some(&alice.token), Some(body)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "upgrade of no room");
    assert_eq!(snapshot(&server, &alice, &room).await, before, "the room was not upgraded");

    let hierarchy = |query: &str| format!("/_matrix/client/v1/rooms/{}/hierarchy{query}", enc(&room));
    for query in ["?limit=abc", "?limit=-1", "?max_depth=-1", "?from=garbage", "?suggested_only=maybe"] {
        let response = server.request(Method::GET, &hierarchy(query), Some(&alice.token), None).await;
        assert_eq!(response.0, 400, "hierarchy{query}: {}", response.1);
        assert!(
            response.1["errcode"].as_str().is_some_and(|e| e.starts_with("M_")),
            "{query}: {}",
            response.1
        );
    }
    let response = server.request(Method::GET, &hierarchy(""), Some(&mallory.token), None).await;
    assert_error(&response, 403, "M_FORBIDDEN", "hierarchy of a private room by a stranger");

    let deactivate = format!("{V3}/account/deactivate");
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("not JSON", b"{auth:".to_vec(), 400, "M_NOT_JSON"),
        ("erase not a bool", br#"{"erase": "yes"}"#.to_vec(), 400, "M_BAD_JSON"),
        ("too large", message_of_len(LIMIT + 1), 413, "M_TOO_LARGE"),
    ];
    for (what, body, status, errcode) in cases {
        let response = server.request_raw(Method::POST, &deactivate, Some(&mallory.token), body).await;
        assert_error(&response, status, errcode, &format!("deactivate: {what}"));
    }
    // The wrong password: the flows again, and the account lives on.
    let wrong = json!({ "auth": { "type": "m.login.password", "password": "not it",
        "identifier": { "type": "m.id.user", "user": mallory.user_id } } });
    let response = server.request(Method::POST, &deactivate, Some(&mallory.token), Some(wrong)).await;
    assert_eq!(response.0, 401, "{}", response.1);
    assert!(response.1["flows"].is_array(), "{}", response.1);
    // Someone else's password does not deactivate Mallory's account for Alice.
    let hers = json!({ "auth": { "type": "m.login.password", "password": "pw",
        "identifier": { "type": "m.id.user", "user": mallory.user_id } } });
    let response = server.request(Method::POST, &deactivate, Some(&alice.token), Some(hers)).await;
    assert!(matches!(response.0, 401 | 403), "another user's id in the identifier: {}", response.1);
    still_answers(&server, &mallory).await;
    still_answers(&server, &alice).await;
}
