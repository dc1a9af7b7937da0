//! Bounded work per request: a `/messages` filter that matches nothing reads
//! a bounded number of rows per page, oversized filters are refused, a state
//! lookup keeps its read rules, `/publicRooms` reads summaries the write path
//! keeps current, the user directory, and slow clients are cut off.

use std::time::Duration;

use complement_tests::api::{V3, assert_error, create_room, enc, event_id_of, room_path, text};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Options, Server, User};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

backend_tests!(
    messages_filter_matching_nothing_reads_bounded_pages,
    oversized_filters_are_refused,
    state_lookup_keeps_its_read_rules,
    public_rooms_follow_state_and_members_at_once,
    user_directory_finds_peers_and_public_room_members,
    slow_clients_are_cut_off,
);

/// Sends `count` text messages, a few requests at a time.
async fn send_many(server: &Server, user: &User, room_id: &str, count: usize) {
    const WORKERS: usize = 8;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let http = server.http().clone();
        let base = server.url(&room_path(room_id, "/send/m.room.message/"));
        let token = user.token.clone();
        tasks.spawn(async move {
            for i in (w..count).step_by(WORKERS) {
                let response = http
                    .put(format!("{base}t{i}"))
                    .bearer_auth(&token)
                    .json(&text(&format!("message {i}")))
                    .send()
                    .await
                    .expect("send");
                assert_eq!(response.status().as_u16(), 200, "message {i}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("sender task");
    }
}

fn messages_path(room_id: &str, query: &str) -> String {
    room_path(room_id, &format!("/messages?{query}"))
}

async fn messages_filter_matching_nothing_reads_bounded_pages(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    send_many(&server, &alice, &room, 3000).await;

    // A type nobody sent: each page ends after a bounded scan, empty, with
    // `end` to go on from, until the start of the room (no `end`).
    let nothing = enc(r#"{"types":["org.example.never_sent"]}"#);
    let mut from: Option<String> = None;
    let mut pages = 0;
    loop {
        let from_param = from.as_ref().map(|f| format!("&from={f}")).unwrap_or_default();
        let (status, page) = server
            .get(
                &messages_path(&room, &format!("dir=b&limit=10&filter={nothing}{from_param}")),
                Some(&alice.token),
            )
            .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["chunk"], json!([]), "{page}");
        pages += 1;
        assert!(pages <= 10, "paging does not end: {page}");
        match page["end"].as_str() {
            Some(end) => from = Some(end.to_owned()),
            None => break,
        }
    }
    // Over 3000 events at no more than 1000 rows a page.
    assert!(pages >= 4, "{pages} pages: the rows read per page are not bounded");

    // A filter matching only the create event: the empty pages lead to it.
    let create_only = enc(r#"{"types":["m.room.create"]}"#);
    let mut from: Option<String> = None;
    let mut found = Vec::new();
    for _ in 0..10 {
        let from_param = from.as_ref().map(|f| format!("&from={f}")).unwrap_or_default();
        let (status, page) = server
            .get(
                &messages_path(&room, &format!("dir=b&limit=10&filter={create_only}{from_param}")),
                Some(&alice.token),
            )
            .await;
        assert_eq!(status, 200, "{page}");
        found.extend(page["chunk"].as_array().unwrap().iter().map(|e| e["type"].clone()));
        match page["end"].as_str() {
            Some(end) => from = Some(end.to_owned()),
            None => break,
        }
    }
    assert_eq!(found, vec![json!("m.room.create")]);

    // Unfiltered pages are not cut short.
    let (_, page) = server.get(&messages_path(&room, "dir=b&limit=1000"), Some(&alice.token)).await;
    let chunk = page["chunk"].as_array().unwrap();
    assert_eq!(chunk.len(), 1000, "{}", chunk.len());
    assert!(chunk.iter().all(|e| e["type"] == "m.room.message"));
    assert!(page["end"].is_string());
}

async fn oversized_filters_are_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let sent = event_id_of(
        &server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("hello")).await.1,
    );
    let types = |n: usize| {
        (0..n).map(|i| format!("org.example.t{i}")).chain(["m.room.message".into()]).collect::<Vec<_>>()
    };

    // 100 entries are fine; 101 are not.
    let ok = enc(&json!({ "types": types(99) }).to_string());
    let (status, page) =
        server.get(&messages_path(&room, &format!("dir=b&filter={ok}")), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["chunk"][0]["event_id"], sent.as_str());
    let big = enc(&json!({ "types": types(100) }).to_string());
    let refused = server.get(&messages_path(&room, &format!("dir=b&filter={big}")), Some(&alice.token)).await;
    assert_error(&refused, 400, "M_BAD_JSON", "/messages with 101 types");
    let refused = server
        .get(&room_path(&room, &format!("/context/{}?filter={big}", enc(&sent))), Some(&alice.token))
        .await;
    assert_error(&refused, 400, "M_BAD_JSON", "/context with 101 types");

    let senders: Vec<String> = (0..101).map(|i| format!("@u{i}:test.local")).collect();
    let inline = enc(&json!({ "room": { "timeline": { "not_senders": senders } } }).to_string());
    let refused = server.get(&format!("{V3}/sync?filter={inline}"), Some(&alice.token)).await;
    assert_error(&refused, 400, "M_BAD_JSON", "/sync with 101 not_senders");

    let rooms: Vec<String> = (0..101).map(|i| format!("!r{i}:test.local")).collect();
    let filter_path = format!("{V3}/user/{}/filter", enc(&alice.user_id));
    let refused = server.post(&filter_path, Some(&alice.token), json!({ "room": { "rooms": rooms } })).await;
    assert_error(&refused, 400, "M_BAD_JSON", "stored filter with 101 rooms");
    let refused =
        server.post(&filter_path, Some(&alice.token), json!({ "presence": { "senders": senders } })).await;
    assert_error(&refused, 400, "M_BAD_JSON", "stored filter with 101 presence senders");
    let (status, stored) =
        server.post(&filter_path, Some(&alice.token), json!({ "room": { "rooms": rooms[..100] } })).await;
    assert_eq!(status, 200, "{stored}");
}

async fn get_state(server: &Server, user: &User, room: &str, rest: &str) -> (u16, Value) {
    server.get(&room_path(room, &format!("/state/{rest}")), Some(&user.token)).await
}

async fn state_lookup_keeps_its_read_rules(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat", "name": "Before" })).await;
    let (status, _) = server.post(&format!("{V3}/join/{}", enc(&room)), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let (status, name) = get_state(&server, &bob, &room, "m.room.name/").await;
    assert_eq!((status, name), (200, json!({ "name": "Before" })));
    let (status, member) =
        get_state(&server, &bob, &room, &format!("m.room.member/{}", enc(&bob.user_id))).await;
    assert_eq!((status, member["membership"].as_str()), (200, Some("join")), "{member}");
    let (status, event) = get_state(&server, &bob, &room, "m.room.name?format=event").await;
    assert_eq!((status, event["content"]["name"].as_str()), (200, Some("Before")), "{event}");

    // After bob leaves, the name changes: he still reads it as of his leave.
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let (status, _) = server
        .put(&room_path(&room, "/state/m.room.name/"), Some(&alice.token), json!({ "name": "After" }))
        .await;
    assert_eq!(status, 200);
    let (status, topic) = server
        .put(&room_path(&room, "/state/m.room.topic/"), Some(&alice.token), json!({ "topic": "new" }))
        .await;
    assert_eq!(status, 200, "{topic}");
    assert_eq!(get_state(&server, &bob, &room, "m.room.name/").await, (200, json!({ "name": "Before" })));
    assert_eq!(get_state(&server, &alice, &room, "m.room.name/").await, (200, json!({ "name": "After" })));
    // A key set only after his leave is not there for him.
    assert_error(
        &get_state(&server, &bob, &room, "m.room.topic/").await,
        404,
        "M_NOT_FOUND",
        "topic after leave",
    );
    assert_error(
        &get_state(&server, &alice, &room, "m.room.nothing/").await,
        404,
        "M_NOT_FOUND",
        "unset key",
    );
    // Never a member, room not world-readable: 403, for set and unset keys alike.
    assert_error(&get_state(&server, &carol, &room, "m.room.name/").await, 403, "M_FORBIDDEN", "outsider");
    assert_error(&get_state(&server, &carol, &room, "m.room.nothing/").await, 403, "M_FORBIDDEN", "outsider");
    // World-readable: anyone reads the current state.
    let (status, _) = server
        .put(
            &room_path(&room, "/state/m.room.history_visibility/"),
            Some(&alice.token),
            json!({ "history_visibility": "world_readable" }),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(get_state(&server, &carol, &room, "m.room.name/").await, (200, json!({ "name": "After" })));
}

async fn public_rooms(server: &Server, query: &str) -> Value {
    let (status, body) = server.get(&format!("{V3}/publicRooms{query}"), None).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn public_rooms_follow_state_and_members_at_once(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "preset": "public_chat", "visibility": "public", "name": "Lakeside", "topic": "boats",
                "room_alias_name": "lake" }),
    )
    .await;
    let private = create_room(&server, &alice, json!({ "name": "Hidden" })).await;
    let listed = public_rooms(&server, "").await;
    assert_eq!(
        listed["chunk"],
        json!([{ "room_id": room, "name": "Lakeside", "topic": "boats", "canonical_alias": "#lake:test.local",
                 "join_rule": "public", "num_joined_members": 1, "world_readable": false,
                 "guest_can_join": false }]),
        "{listed}"
    );
    assert_eq!(listed["total_room_count_estimate"], 1);

    let (status, _) = server
        .put(&room_path(&room, "/state/m.room.name/"), Some(&alice.token), json!({ "name": "Harbour" }))
        .await;
    assert_eq!(status, 200);
    for user in [&bob, &carol] {
        let (status, _) =
            server.post(&format!("{V3}/join/{}", enc(&room)), Some(&user.token), json!({})).await;
        assert_eq!(status, 200);
    }
    let listed = public_rooms(&server, "").await;
    assert_eq!(listed["chunk"][0]["name"], "Harbour", "{listed}");
    assert_eq!(listed["chunk"][0]["num_joined_members"], 3, "{listed}");

    // A leave, a kick-free re-join, history visibility and guest access.
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&carol.token), json!({})).await;
    assert_eq!(status, 200);
    for (kind, content) in [
        ("m.room.history_visibility", json!({ "history_visibility": "world_readable" })),
        ("m.room.guest_access", json!({ "guest_access": "can_join" })),
        ("m.room.avatar", json!({ "url": "mxc://test.local/abc" })),
    ] {
        let (status, body) =
            server.put(&room_path(&room, &format!("/state/{kind}/")), Some(&alice.token), content).await;
        assert_eq!(status, 200, "{body}");
    }
    let listed = public_rooms(&server, "").await;
    let chunk = &listed["chunk"][0];
    assert_eq!(
        (
            &chunk["num_joined_members"],
            &chunk["world_readable"],
            &chunk["guest_can_join"],
            &chunk["avatar_url"]
        ),
        (&json!(2), &json!(true), &json!(true), &json!("mxc://test.local/abc")),
        "{listed}"
    );

    // Search by the new name, not the old; a literal `%` matches nothing.
    let (status, found) = server
        .post(
            &format!("{V3}/publicRooms"),
            Some(&bob.token),
            json!({ "filter": { "generic_search_term": "harb" } }),
        )
        .await;
    assert_eq!((status, found["chunk"].as_array().map(Vec::len)), (200, Some(1)), "{found}");
    for term in ["lakeside", "%"] {
        let (_, found) = server
            .post(
                &format!("{V3}/publicRooms"),
                Some(&bob.token),
                json!({ "filter": { "generic_search_term": term } }),
            )
            .await;
        assert_eq!(found["chunk"], json!([]), "{term}: {found}");
    }

    // Publishing the other room lists it with its own summary, by members.
    let (status, _) = server
        .put(
            &format!("{V3}/directory/list/room/{}", enc(&private)),
            Some(&alice.token),
            json!({ "visibility": "public" }),
        )
        .await;
    assert_eq!(status, 200);
    let listed = public_rooms(&server, "?limit=1").await;
    assert_eq!(listed["chunk"][0]["room_id"], room.as_str(), "{listed}");
    assert_eq!(listed["total_room_count_estimate"], 2);
    let next = listed["next_batch"].as_str().unwrap().to_owned();
    let listed = public_rooms(&server, &format!("?limit=1&since={next}")).await;
    assert_eq!(
        (&listed["chunk"][0]["room_id"], &listed["chunk"][0]["name"], &listed["chunk"][0]["join_rule"]),
        (&json!(private), &json!("Hidden"), &json!("invite")),
        "{listed}"
    );
    assert!(listed.get("next_batch").is_none(), "{listed}");
}

async fn user_directory_finds_peers_and_public_room_members(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let dora = server.register("dora", "pw").await;
    let erin = server.register("erin", "pw").await;
    let (status, _) = server
        .put(
            &format!("{V3}/profile/{}/displayname", enc(&dora.user_id)),
            Some(&dora.token),
            json!({ "displayname": "Dora_Explorer" }),
        )
        .await;
    assert_eq!(status, 200);
    // Dora is in a public room alice is not in; erin in a private one.
    create_room(&server, &dora, json!({ "preset": "public_chat" })).await;
    create_room(&server, &erin, json!({})).await;
    let shared = create_room(&server, &alice, json!({ "invite": [bob.user_id] })).await;
    let (status, _) = server.post(&format!("{V3}/join/{}", enc(&shared)), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);

    let search = |term: &'static str, limit: u64| {
        let server = &server;
        let token = alice.token.clone();
        async move {
            let (status, found) = server
                .post(
                    &format!("{V3}/user_directory/search"),
                    Some(&token),
                    json!({ "search_term": term, "limit": limit }),
                )
                .await;
            assert_eq!(status, 200, "{found}");
            found
        }
    };
    let found = search("explorer", 10).await;
    assert_eq!(
        found,
        json!({ "results": [{ "user_id": dora.user_id, "display_name": "Dora_Explorer" }], "limited": false })
    );
    // `_` is a literal underscore, not a wildcard (which would find bob).
    assert_eq!(search("a_e", 10).await["results"].as_array().map(Vec::len), Some(1));
    assert_eq!(search("b_b", 10).await["results"], json!([]));
    assert_eq!(
        search("erin", 10).await["results"],
        json!([]),
        "erin shares no room and is in no public room"
    );
    let found = search("test.local", 2).await;
    let ids: Vec<&str> =
        found["results"].as_array().unwrap().iter().filter_map(|r| r["user_id"].as_str()).collect();
    assert_eq!(ids, vec![alice.user_id.as_str(), bob.user_id.as_str()], "{found}");
    assert_eq!(found["limited"], true);
}

async fn slow_clients_are_cut_off(backend: Backend) {
    let server = Server::start_with(
        &backend,
        Options::default()
            .env("SEQLINE_HEADER_READ_TIMEOUT_SECS", "1")
            .env("SEQLINE_BODY_READ_TIMEOUT_SECS", "1"),
    )
    .await;
    let alice = server.register("alice", "pw").await;
    let addr = server.base_url.trim_start_matches("http://").to_owned();

    // Half the headers, then nothing: the server closes the connection.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\nAccept: appl").await.expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection is still open after 20 s");
    assert!(
        !String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"),
        "answered: {:?}",
        String::from_utf8_lossy(&buf)
    );

    // A body that stops half-way: 408 M_UNKNOWN.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let path = format!("{V3}/profile/{}/displayname", enc(&alice.user_id));
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"displayname\":",
        alice.token
    );
    slow.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut chunk = [0u8; 4096];
        // Read until the JSON error body has arrived (or the server closes).
        loop {
            let n = slow.read(&mut chunk).await.expect("read");
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || String::from_utf8_lossy(&buf).contains("M_UNKNOWN") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer after 20 s");
    let answer = String::from_utf8_lossy(&buf);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"errcode\":\"M_UNKNOWN\""), "{answer}");

    // Ordinary clients are served, and the stalled profile write changed nothing.
    let (status, profile) = server.get(&format!("{V3}/profile/{}", enc(&alice.user_id)), None).await;
    assert_eq!((status, profile["displayname"].as_str()), (200, Some("alice")), "{profile}");
}
