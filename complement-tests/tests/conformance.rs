//! Behaviours where seqline followed the spec (or every other server) less
//! closely than Complement checks: kicking someone who is not in the room,
//! reading a forgotten room, the order one-time keys are handed out in,
//! avatar URLs that are not mxc://, what /sync carries (push rules,
//! invites from ignored users, left rooms under a zero timeline limit).

use complement_tests::api::{V3, assert_error, create_room, enc, join, room_path, sync_once, text};
use complement_tests::backend_tests;
use complement_tests::e2ee::{Key, device_keys, signed_one_time_key};
use complement_tests::harness::{Backend, Server};
use serde_json::json;

backend_tests!(
    kicking_someone_not_in_the_room_is_forbidden,
    a_forgotten_room_cannot_be_read,
    one_time_keys_are_claimed_in_upload_order,
    avatar_urls_may_be_any_uri,
    initial_sync_carries_the_push_rules,
    invites_from_ignored_users_are_not_shown,
    a_left_room_with_a_zero_timeline_limit_has_no_events,
    v12_creators_are_never_in_the_power_levels,
    device_lists_follow_who_shares_a_room,
    a_filtered_messages_page_that_found_events_has_an_end,
    members_at_a_sync_token,
    presence_of_a_newly_shared_member_arrives,
    a_joins_extra_content_is_kept,
);

async fn kicking_someone_not_in_the_room_is_forbidden(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    for (who, what) in
        [(server.user_id("bob"), "a user who left"), (server.user_id("carol"), "a user never there")]
    {
        let kick =
            server.post(&room_path(&room, "/kick"), Some(&alice.token), json!({ "user_id": who })).await;
        assert_error(&kick, 403, "M_FORBIDDEN", what);
    }
    // A member can still be kicked.
    join(&server, &bob, &room).await;
    let (status, body) = server
        .post(&room_path(&room, "/kick"), Some(&alice.token), json!({ "user_id": server.user_id("bob") }))
        .await;
    assert_eq!(status, 200, "{body}");
}

async fn a_forgotten_room_cannot_be_read(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let (status, sent) =
        server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("hi")).await;
    assert_eq!(status, 200);
    let event = sent["event_id"].as_str().unwrap().to_owned();
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    // Left, not forgotten: the stay is still readable.
    let (status, page) = server.get(&room_path(&room, "/messages?dir=b"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{page}");
    let (status, _) = server.post(&room_path(&room, "/forget"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let messages = server.get(&room_path(&room, "/messages?dir=b"), Some(&bob.token)).await;
    assert_error(&messages, 403, "M_FORBIDDEN", "/messages of a forgotten room");
    let context = server.get(&room_path(&room, &format!("/context/{event}")), Some(&bob.token)).await;
    assert_error(&context, 403, "M_FORBIDDEN", "/context of a forgotten room");
    // Alice, who did not forget, reads on.
    let (status, _) = server.get(&room_path(&room, "/messages?dir=b"), Some(&alice.token)).await;
    assert_eq!(status, 200);
}

async fn one_time_keys_are_claimed_in_upload_order(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let key = Key::new("alice-device");
    let (a, d) = (alice.user_id.as_str(), alice.device_id.as_str());
    let upload_path = format!("{V3}/keys/upload");
    let upload = |body: serde_json::Value| server.post(&upload_path, Some(&alice.token), body);
    let (status, body) = upload(json!({ "device_keys": device_keys(a, d, &key) })).await;
    assert_eq!(status, 200, "{body}");
    // Key 1 first, then key 0 (whose id sorts first).
    for (id, value) in [("signed_curve25519:1", "first"), ("signed_curve25519:0", "second")] {
        let (status, body) =
            upload(json!({ "one_time_keys": { id: signed_one_time_key(a, d, &key, value) } })).await;
        assert_eq!(status, 200, "{body}");
    }
    let claim = json!({ "one_time_keys": { a: { d: "signed_curve25519" } } });
    let mut got = Vec::new();
    for _ in 0..2 {
        let (status, body) = server.post(&format!("{V3}/keys/claim"), Some(&bob.token), claim.clone()).await;
        assert_eq!(status, 200, "{body}");
        let keys = body["one_time_keys"][a][d].as_object().unwrap().clone();
        let (id, value) = keys.into_iter().next().unwrap();
        got.push((id, value["key"].as_str().unwrap().to_owned()));
    }
    assert_eq!(
        got,
        [
            ("signed_curve25519:1".to_owned(), "first".to_owned()),
            ("signed_curve25519:0".to_owned(), "second".to_owned())
        ]
    );
}

async fn avatar_urls_may_be_any_uri(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let path = format!("{V3}/profile/{}/avatar_url", alice.user_id);
    for url in ["mxc://example.org/abc", "https://example.org/me.png", ""] {
        let (status, body) = server.put(&path, Some(&alice.token), json!({ "avatar_url": url })).await;
        assert_eq!(status, 200, "{url}: {body}");
        let (_, got) = server.get(&path, None).await;
        assert_eq!(got["avatar_url"], url, "{got}");
    }
    for bad in [json!("no scheme"), json!("has space:x y"), json!(5)] {
        let answer = server.put(&path, Some(&alice.token), json!({ "avatar_url": bad })).await;
        assert_eq!(answer.0, 400, "{bad}: {answer:?}");
    }
}

async fn initial_sync_carries_the_push_rules(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let sync = sync_once(&server, &alice, None).await;
    let rules = sync["account_data"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.push_rules")
        .unwrap_or_else(|| panic!("no push rules: {sync}"));
    let overrides = rules["content"]["global"]["override"].as_array().unwrap();
    assert!(overrides.iter().any(|r| r["rule_id"] == ".m.rule.master"), "{rules}");
    // An incremental sync with nothing new does not repeat them.
    let since = sync["next_batch"].as_str().unwrap();
    let (status, again) =
        server.get(&format!("{V3}/sync?since={}&timeout=0", enc(since)), Some(&alice.token)).await;
    assert_eq!(status, 200);
    assert!(!again.to_string().contains("m.push_rules"), "{again}");
}

async fn invites_from_ignored_users_are_not_shown(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let path = format!("{V3}/user/{}/account_data/m.ignored_user_list", enc(&alice.user_id));
    let (status, _) =
        server.put(&path, Some(&alice.token), json!({ "ignored_users": { bob.user_id.clone(): {} } })).await;
    assert_eq!(status, 200);
    let from_bob = create_room(&server, &bob, json!({ "invite": [alice.user_id] })).await;
    let from_carol = create_room(&server, &carol, json!({ "invite": [alice.user_id] })).await;
    let sync = sync_once(&server, &alice, None).await;
    let invites = sync["rooms"]["invite"].as_object().unwrap();
    assert!(invites.contains_key(&from_carol), "{sync}");
    assert!(!invites.contains_key(&from_bob), "{sync}");
    // The create event comes whole (MSC4311).
    let create = invites[&from_carol]["invite_state"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.room.create")
        .unwrap_or_else(|| panic!("no create event: {sync}"));
    assert!(create["origin_server_ts"].is_i64() && create["event_id"].is_string(), "{create}");
    assert_eq!(create["room_id"], from_carol.as_str());
}

async fn a_left_room_with_a_zero_timeline_limit_has_no_events(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let (status, _) =
        server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("hi")).await;
    assert_eq!(status, 200);
    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let filter = json!({ "room": { "include_leave": true, "timeline": { "limit": 0 } } });
    let (status, sync) =
        server.get(&format!("{V3}/sync?filter={}", enc(&filter.to_string())), Some(&bob.token)).await;
    assert_eq!(status, 200, "{sync}");
    let left = &sync["rooms"]["leave"][&room];
    assert!(left.is_object(), "{sync}");
    assert_eq!(left["timeline"]["events"], json!([]), "{left}");
}

/// v12 (MSC4289): creators have infinite power, so power levels naming one
/// in `users` are a bad request (400, not the auth rules' 403), at
/// createRoom and later; additional_creators is validated; nobody sends a
/// create event.
async fn v12_creators_are_never_in_the_power_levels(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let create_path = format!("{V3}/createRoom");
    let create = |body: serde_json::Value| server.post(&create_path, Some(&alice.token), body);
    let answer = create(json!({ "room_version": "12",
        "power_level_content_override": { "users": { alice.user_id.clone(): 100 } } }))
    .await;
    assert_error(&answer, 400, "M_BAD_JSON", "the creator in power_level_content_override");
    for bad in [json!("not-an-array"), json!(["@foo:example.com", 42]), json!(["not-a-user-id"])] {
        let answer =
            create(json!({ "room_version": "12", "creation_content": { "additional_creators": bad } })).await;
        assert_eq!(answer.0, 400, "{bad}: {answer:?}");
    }
    // Another user in the override is fine.
    let (status, body) = create(json!({ "room_version": "12", "invite": [bob.user_id],
        "creation_content": { "additional_creators": ["@carol:example.com"] },
        "power_level_content_override": { "users": { bob.user_id.clone(): 100 } } }))
    .await;
    assert_eq!(status, 200, "{body}");
    let room = body["room_id"].as_str().unwrap().to_owned();
    let power = room_path(&room, "/state/m.room.power_levels/");
    for creator in [alice.user_id.as_str(), "@carol:example.com"] {
        let answer = server.put(&power, Some(&alice.token), json!({ "users": { creator: 100 } })).await;
        assert_error(&answer, 400, "M_BAD_JSON", "a creator in the power levels");
    }
    let (status, body) =
        server.put(&power, Some(&alice.token), json!({ "users": { bob.user_id.clone(): 50 } })).await;
    assert_eq!(status, 200, "{body}");
    let answer = server
        .put(&room_path(&room, "/state/m.room.create/"), Some(&alice.token), json!({ "room_version": "12" }))
        .await;
    assert_error(&answer, 400, "M_BAD_JSON", "a create event sent by a client");
    // Before v12 the creator is an ordinary user of the power levels.
    let (status, body) = create(json!({ "room_version": "11",
        "power_level_content_override": { "users": { alice.user_id.clone(): 100 } } }))
    .await;
    assert_eq!(status, 200, "{body}");
}

/// `device_lists` in `/sync` and `/keys/changes`: a user who comes to share a
/// room is `changed` (their keys are now the reader's business), one who
/// shares none any more is `left`; someone who left one of two shared rooms
/// is neither.
async fn device_lists_follow_who_shares_a_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let other = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &carol, &room).await;
    join(&server, &carol, &other).await;
    let since = sync_once(&server, &alice, None).await["next_batch"].as_str().unwrap().to_owned();
    let incremental = |since: String| {
        let (server, alice) = (&server, &alice);
        async move {
            let (status, body) =
                server.get(&format!("{V3}/sync?since={}&timeout=0", enc(&since)), Some(&alice.token)).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    join(&server, &bob, &room).await;
    let (status, _) = server.post(&room_path(&other, "/leave"), Some(&carol.token), json!({})).await;
    assert_eq!(status, 200);
    let body = incremental(since.clone()).await;
    assert_eq!(body["device_lists"]["changed"], json!([bob.user_id]), "{body}");
    assert_eq!(body["device_lists"]["left"], json!([]), "carol still shares a room: {body}");
    let next = body["next_batch"].as_str().unwrap().to_owned();

    let (status, _) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    let body = incremental(next.clone()).await;
    assert_eq!(body["device_lists"]["left"], json!([bob.user_id]), "{body}");
    let end = body["next_batch"].as_str().unwrap().to_owned();
    let (status, keys) = server
        .get(&format!("{V3}/keys/changes?from={}&to={}", enc(&since), enc(&end)), Some(&alice.token))
        .await;
    assert_eq!(status, 200, "{keys}");
    assert_eq!(keys["left"], json!([bob.user_id]), "{keys}");
}

/// `/messages` with a filter: a page that found events carries `end` (as
/// other servers answer; Complement's TestRoomImageRoundtrip reads it), and
/// the page after it, with nothing more, carries none.
async fn a_filtered_messages_page_that_found_events_has_an_end(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create_room(&server, &alice, json!({})).await;
    let image = json!({ "msgtype": "m.image", "body": "cat.png", "url": "mxc://test.local/cat" });
    let (status, sent) =
        server.put(&room_path(&room, "/send/m.room.message/i1"), Some(&alice.token), image).await;
    assert_eq!(status, 200);
    let (status, _) =
        server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("words")).await;
    assert_eq!(status, 200);
    let filter = enc(r#"{"contains_url":true}"#);
    let (status, page) =
        server.get(&room_path(&room, &format!("/messages?dir=b&filter={filter}")), Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<&str> =
        page["chunk"].as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [sent["event_id"].as_str().unwrap()]);
    let end = page["end"].as_str().unwrap_or_else(|| panic!("no end: {page}"));
    let (status, next) = server
        .get(
            &room_path(&room, &format!("/messages?dir=b&filter={filter}&from={}", enc(end))),
            Some(&alice.token),
        )
        .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["chunk"], json!([]));
    assert!(next.get("end").is_none(), "{next}");
}

/// `/members?at=` takes a `/sync` `next_batch` too: the members at that point.
async fn members_at_a_sync_token(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let before_bob = sync_once(&server, &alice, None).await["next_batch"].as_str().unwrap().to_owned();
    join(&server, &bob, &room).await;
    let members = |at: String| {
        let (server, alice, room) = (&server, &alice, &room);
        async move {
            let (status, body) =
                server.get(&room_path(room, &format!("/members?at={}", enc(&at))), Some(&alice.token)).await;
            assert_eq!(status, 200, "{body}");
            let mut who: Vec<String> = body["chunk"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["content"]["membership"] == "join")
                .map(|e| e["state_key"].as_str().unwrap().to_owned())
                .collect();
            who.sort();
            who
        }
    };
    assert_eq!(members(before_bob).await, std::slice::from_ref(&alice.user_id));
    let now = sync_once(&server, &alice, None).await["next_batch"].as_str().unwrap().to_owned();
    let mut both = vec![alice.user_id.clone(), bob.user_id.clone()];
    both.sort();
    assert_eq!(members(now).await, both);
}

/// Someone who comes to share a room shows up in `/sync`'s presence with
/// their presence as it stands, though it did not change in the window.
async fn presence_of_a_newly_shared_member_arrives(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let path = format!("{V3}/presence/{}/status", enc(&alice.user_id));
    let (status, _) =
        server.put(&path, Some(&alice.token), json!({ "presence": "online", "status_msg": "here" })).await;
    assert_eq!(status, 200);
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let since = sync_once(&server, &bob, None).await["next_batch"].as_str().unwrap().to_owned();
    join(&server, &bob, &room).await;
    let (status, body) =
        server.get(&format!("{V3}/sync?since={}&timeout=0", enc(&since)), Some(&bob.token)).await;
    assert_eq!(status, 200, "{body}");
    let presence: Vec<&serde_json::Value> = body["presence"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["sender"] == alice.user_id.as_str())
        .collect();
    assert_eq!(presence.len(), 1, "{body}");
    assert_eq!(presence[0]["content"]["status_msg"], "here");
}

/// Keys a client adds to a join (`reason`, custom ones) are kept in the
/// member event; the server's own (membership, profile) are not overridden.
async fn a_joins_extra_content_is_kept(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room =
        create_room(&server, &alice, json!({ "preset": "public_chat", "room_alias_name": "hall" })).await;
    let body = json!({ "reason": "hello", "foo": "bar", "membership": "leave", "displayname": "Not Bob" });
    let (status, answer) =
        server.post(&format!("{V3}/join/{}", enc("#hall:test.local")), Some(&bob.token), body).await;
    assert_eq!(status, 200, "{answer}");
    let (status, member) = server
        .get(&room_path(&room, &format!("/state/m.room.member/{}", bob.user_id)), Some(&alice.token))
        .await;
    assert_eq!(status, 200, "{member}");
    assert_eq!(member["membership"], "join");
    assert_eq!(member["reason"], "hello");
    assert_eq!(member["foo"], "bar", "{member}");
    assert_eq!(member["displayname"], "bob", "{member}");
}
