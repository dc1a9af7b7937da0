//! Room aliases and the public room directory.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use reqwest::Method;
use serde_json::{Value, json};

backend_tests!(
    aliases_resolve_and_are_guarded,
    canonical_alias_must_point_here,
    public_rooms_list_search_and_pages
);

fn enc(alias: &str) -> String {
    alias.replace('#', "%23").replace(':', "%3A")
}

async fn create(server: &Server, token: &str, body: Value) -> String {
    let (status, created) = server.post("/_matrix/client/v3/createRoom", Some(token), body).await;
    assert_eq!(status, 200, "{created}");
    created["room_id"].as_str().unwrap().to_owned()
}

async fn aliases_resolve_and_are_guarded(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room =
        create(&server, &alice.token, json!({ "room_alias_name": "hike", "preset": "public_chat" })).await;

    let (status, body) =
        server.get(&format!("/_matrix/client/v3/directory/room/{}", enc("#hike:test.local")), None).await;
    assert_eq!((status, body), (200, json!({ "room_id": room, "servers": ["test.local"] })));
    // createRoom with a taken alias: M_ROOM_IN_USE, and no second room.
    let (status, body) = server
        .post("/_matrix/client/v3/createRoom", Some(&bob.token), json!({ "room_alias_name": "hike" }))
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_ROOM_IN_USE")), "{body}");
    let (_, rooms) = server.get("/_matrix/client/v3/joined_rooms", Some(&bob.token)).await;
    assert_eq!(rooms["joined_rooms"], json!([]));

    let path = format!("/_matrix/client/v3/directory/room/{}", enc("#trail:test.local"));
    // Only members may point an alias at a room.
    let (status, _) = server.put(&path, Some(&bob.token), json!({ "room_id": room })).await;
    assert_eq!(status, 403);
    let (status, _) = server.put(&path, Some(&alice.token), json!({ "room_id": room })).await;
    assert_eq!(status, 200);
    let (status, body) = server.put(&path, Some(&alice.token), json!({ "room_id": room })).await;
    assert_eq!((status, body["errcode"].as_str()), (409, Some("M_UNKNOWN")), "taken: {body}");
    let (status, body) = server
        .put(
            &format!("/_matrix/client/v3/directory/room/{}", enc("#x:elsewhere.org")),
            Some(&alice.token),
            json!({ "room_id": room }),
        )
        .await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")), "{body}");
    let (_, list) = server.get(&format!("/_matrix/client/v3/rooms/{room}/aliases"), Some(&alice.token)).await;
    assert_eq!(list, json!({ "aliases": ["#hike:test.local", "#trail:test.local"] }));

    // Deleting: not by a stranger; by the alias's creator.
    let (status, _) = server.request(Method::DELETE, &path, Some(&bob.token), None).await;
    assert_eq!(status, 403);
    let (status, _) = server.request(Method::DELETE, &path, Some(&alice.token), None).await;
    assert_eq!(status, 200);
    let (status, body) = server.get(&path, None).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")));
    let (status, _) = server.request(Method::DELETE, &path, Some(&alice.token), None).await;
    assert_eq!(status, 404);

    // Joining by alias.
    let (status, body) = server
        .post(&format!("/_matrix/client/v3/join/{}", enc("#hike:test.local")), Some(&bob.token), json!({}))
        .await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())));
}

async fn canonical_alias_must_point_here(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = create(&server, &alice.token, json!({ "room_alias_name": "here" })).await;
    let other = create(&server, &alice.token, json!({ "room_alias_name": "there" })).await;
    let path = format!("/_matrix/client/v3/rooms/{room}/state/m.room.canonical_alias");
    for bad in [
        json!({ "alias": "#there:test.local" }),
        json!({ "alias": "#here:test.local", "alt_aliases": ["#nope:test.local"] }),
    ] {
        let (status, body) = server.put(&path, Some(&alice.token), bad.clone()).await;
        assert_eq!((status, body["errcode"].as_str()), (400, Some("M_BAD_ALIAS")), "{bad}: {body}");
    }
    let (status, body) = server.put(&path, Some(&alice.token), json!({ "alias": "not an alias" })).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")), "{body}");
    let (_, current) = server.get(&path, Some(&alice.token)).await;
    assert_eq!(current, json!({ "alias": "#here:test.local" }), "nothing changed");
    let good =
        json!({ "alias": "#here:test.local", "alt_aliases": ["#here:test.local", "#remote:elsewhere.org"] });
    let (status, body) = server.put(&path, Some(&alice.token), good.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (_, current) = server.get(&path, Some(&alice.token)).await;
    assert_eq!(current, good);
    let _ = other;
}

async fn public_rooms_list_search_and_pages(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let hiking = create(&server, &alice.token, json!({ "visibility": "public", "name": "Hiking", "topic": "Trails and peaks", "room_alias_name": "hiking" })).await;
    let chess = create(&server, &alice.token, json!({ "visibility": "public", "name": "Chess" })).await;
    let secret = create(&server, &alice.token, json!({ "name": "Secret" })).await;
    server.post(&format!("/_matrix/client/v3/join/{chess}"), Some(&bob.token), json!({})).await;

    let (status, body) = server.get("/_matrix/client/v3/publicRooms", None).await;
    assert_eq!(status, 200, "{body}");
    let ids: Vec<&str> =
        body["chunk"].as_array().unwrap().iter().map(|r| r["room_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![chess.as_str(), hiking.as_str()], "most members first; private rooms not listed");
    assert_eq!(body["total_room_count_estimate"], 2);
    let first = &body["chunk"][1];
    assert_eq!(first["name"], "Hiking");
    assert_eq!(first["topic"], "Trails and peaks");
    assert_eq!(first["canonical_alias"], "#hiking:test.local");
    assert_eq!(first["join_rule"], "public");
    assert_eq!(first["num_joined_members"], 1);
    assert_eq!(body["chunk"][0]["num_joined_members"], 2);

    let (_, page1) = server.get("/_matrix/client/v3/publicRooms?limit=1", None).await;
    assert_eq!(page1["chunk"][0]["room_id"], chess.as_str());
    let next = page1["next_batch"].as_str().expect("a next page");
    let (_, page2) = server.get(&format!("/_matrix/client/v3/publicRooms?limit=1&since={next}"), None).await;
    assert_eq!(page2["chunk"][0]["room_id"], hiking.as_str());
    assert!(page2.get("next_batch").is_none(), "{page2}");
    assert!(page2["prev_batch"].is_string());

    let (status, found) = server
        .post(
            "/_matrix/client/v3/publicRooms",
            Some(&bob.token),
            json!({ "filter": { "generic_search_term": "PEAK" } }),
        )
        .await;
    assert_eq!(status, 200);
    let ids: Vec<&str> =
        found["chunk"].as_array().unwrap().iter().map(|r| r["room_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![hiking.as_str()]);

    // Listing and unlisting; only those who may.
    let vis = |room: &str| format!("/_matrix/client/v3/directory/list/room/{room}");
    let (_, v) = server.get(&vis(&secret), None).await;
    assert_eq!(v, json!({ "visibility": "private" }));
    let (status, _) = server.put(&vis(&secret), Some(&bob.token), json!({ "visibility": "public" })).await;
    assert_eq!(status, 403);
    let (status, _) = server.put(&vis(&secret), Some(&alice.token), json!({ "visibility": "public" })).await;
    assert_eq!(status, 200);
    let (_, v) = server.get(&vis(&secret), None).await;
    assert_eq!(v, json!({ "visibility": "public" }));
    let (_, body) = server.get("/_matrix/client/v3/publicRooms", None).await;
    assert_eq!(body["total_room_count_estimate"], 3);
    let (status, body) = server.get("/_matrix/client/v3/publicRooms?since=garbage", None).await;
    assert_eq!((status, body["errcode"].as_str()), (400, Some("M_INVALID_PARAM")));
}
