//! Space hierarchies across two seqline servers: a user of A in a space
//! whose rooms live on B sees them through `/hierarchy` (A asks B over
//! `/_matrix/federation/v1/hierarchy`), held to the same rules as local
//! rooms; B answers a server only what that server may see.

use complement_tests::api::{V3, assert_error, create_room, enc, room_path};
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, x_matrix};
use complement_tests::harness::{Backend, User};
use serde_json::{Value, json};

backend_tests!(remote_space_rooms_are_listed_as_the_user_may_see_them);

async fn link(b: &FedServer, owner: &User, space: &str, child: &str, order: &str) {
    let path = room_path(space, &format!("/state/m.space.child/{}", enc(child)));
    let content = json!({ "via": [b.name], "order": order });
    let (status, body) = b.server.put(&path, Some(&owner.token), content).await;
    assert_eq!(status, 200, "{body}");
}

async fn named_room(b: &FedServer, owner: &User, name: &str, extra: Value) -> String {
    let mut body = json!({ "preset": "public_chat", "name": name, "room_version": "10" });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    create_room(&b.server, owner, body).await
}

fn names(body: &Value) -> Vec<String> {
    body["rooms"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap_or("?").to_owned()).collect()
}

async fn remote_space_rooms_are_listed_as_the_user_may_see_them(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let space_type = json!({ "creation_content": { "type": "m.space" } });
    let space = named_room(&b, &bob, "Space", space_type.clone()).await;
    let public = named_room(&b, &bob, "Public child", json!({})).await;
    let private = named_room(&b, &bob, "Private child", json!({ "preset": "private_chat" })).await;
    let subspace = named_room(&b, &bob, "Subspace", space_type).await;
    let deep = named_room(&b, &bob, "Deep child", json!({})).await;
    let restricted_rule = json!({ "initial_state": [{
        "type": "m.room.join_rules", "state_key": "",
        "content": { "join_rule": "restricted", "allow": [{ "type": "m.room_membership", "room_id": space }] },
    }] });
    let members_only = named_room(&b, &bob, "Members only", restricted_rule).await;
    link(&b, &bob, &space, &public, "a").await;
    link(&b, &bob, &space, &private, "b").await;
    link(&b, &bob, &space, &subspace, "c").await;
    link(&b, &bob, &space, &members_only, "d").await;
    link(&b, &bob, &subspace, &deep, "a").await;

    // What B tells A before any user of A is in the space: the open rooms.
    let ask = |room: &str| {
        let uri = format!("/_matrix/federation/v1/hierarchy/{}", enc(room));
        let auth = x_matrix(&a.name, &b.name, &a.signing_key(), "GET", &uri, None);
        (uri, auth)
    };
    let (uri, auth) = ask(&space);
    let (status, answer) = b.send("GET", &uri, Some(auth), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["room"]["name"], "Space");
    assert_eq!(answer["room"]["children_state"].as_array().unwrap().len(), 4, "{answer}");
    let mut children: Vec<&str> =
        answer["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    children.sort_unstable();
    assert_eq!(children, ["Public child", "Subspace"], "{answer}");
    let mut hidden: Vec<&str> =
        answer["inaccessible_children"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    hidden.sort_unstable();
    let mut expected = vec![private.as_str(), members_only.as_str()];
    expected.sort_unstable();
    assert_eq!(hidden, expected, "{answer}");
    assert!(!answer.to_string().contains("Private child"), "{answer}");
    // A room A may not see, an unknown room, an unsigned request.
    let (uri, auth) = ask(&private);
    assert_error(&b.send("GET", &uri, Some(auth), None).await, 404, "M_NOT_FOUND", "a private room");
    let (uri, auth) = ask("!unknown:elsewhere");
    assert_error(&b.send("GET", &uri, Some(auth), None).await, 404, "M_NOT_FOUND", "an unknown room");
    let (uri, _) = ask(&space);
    assert_error(&b.send("GET", &uri, None, None).await, 401, "M_UNAUTHORIZED", "unsigned");

    // Alice of A joins the space through B and walks it from A.
    let path = format!("{V3}/join/{}?server_name={}", enc(&space), enc(&b.name));
    let (status, body) = a.server.post(&path, Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let hierarchy = format!("/_matrix/client/v1/rooms/{}/hierarchy", enc(&space));
    let (status, page) = a.server.get(&hierarchy, Some(&alice.token)).await;
    assert_eq!(status, 200, "{page}");
    // Depth first in the links' order; the private room left out; the
    // restricted one shown, since she is in the space it allows.
    assert_eq!(names(&page), ["Space", "Public child", "Subspace", "Deep child", "Members only"], "{page}");
    let rooms = page["rooms"].as_array().unwrap();
    assert_eq!(rooms[0]["room_id"], space.as_str());
    assert_eq!(rooms[0]["children_state"].as_array().unwrap().len(), 4);
    assert_eq!(rooms[2]["room_type"], "m.space");
    assert_eq!(rooms[2]["children_state"][0]["state_key"], deep.as_str(), "{page}");
    assert_eq!(rooms[4]["join_rule"], "restricted");
    assert_eq!(rooms[4]["allowed_room_ids"], json!([space]), "{page}");
    // Paged and bounded like local walks.
    let (status, first) = a.server.get(&format!("{hierarchy}?limit=2"), Some(&alice.token)).await;
    assert_eq!((status, names(&first)), (200, vec!["Space".to_owned(), "Public child".to_owned()]));
    let next = first["next_batch"].as_str().expect("next_batch");
    let (status, rest) =
        a.server.get(&format!("{hierarchy}?limit=2&from={}", enc(next)), Some(&alice.token)).await;
    assert_eq!((status, names(&rest)), (200, vec!["Subspace".to_owned(), "Deep child".to_owned()]));
    let (status, shallow) = a.server.get(&format!("{hierarchy}?max_depth=1"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{shallow}");
    assert_eq!(names(&shallow), ["Space", "Public child", "Subspace", "Members only"]);
}
