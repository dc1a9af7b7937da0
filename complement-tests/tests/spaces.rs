//! Space hierarchies (`/v1/rooms/{roomId}/hierarchy`): depth first from the
//! space, children in the spec's order, only rooms the caller may see,
//! paging, depth and `suggested_only`.

use complement_tests::api::{assert_error, create_room, enc, room_path};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(space_hierarchy_walks_what_the_caller_may_see);

async fn link(server: &Server, user: &User, parent: &str, child: &str, content: Value) {
    let path = room_path(parent, &format!("/state/m.space.child/{}", enc(child)));
    let (status, body) = server.put(&path, Some(&user.token), content).await;
    assert_eq!(status, 200, "{body}");
}

async fn hierarchy(server: &Server, user: &User, root: &str, query: &str) -> (u16, Value) {
    server.get(&format!("/_matrix/client/v1/rooms/{}/hierarchy{query}", enc(root)), Some(&user.token)).await
}

fn ids(body: &Value) -> Vec<&str> {
    body["rooms"].as_array().unwrap().iter().map(|r| r["room_id"].as_str().unwrap()).collect()
}

async fn space_hierarchy_walks_what_the_caller_may_see(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let space = |name: &str, preset: &str| json!({ "preset": preset, "name": name, "creation_content": { "type": "m.space" } });
    let room = |name: &str, preset: &str| json!({ "preset": preset, "name": name });
    let root = create_room(&server, &alice, space("Root", "public_chat")).await;
    let r1 = create_room(&server, &alice, room("R1", "public_chat")).await;
    let ss1 = create_room(&server, &alice, space("SS1", "private_chat")).await;
    let r2 = create_room(&server, &alice, room("R2", "public_chat")).await;
    let ss2 = create_room(&server, &alice, space("SS2", "public_chat")).await;
    let r3 = create_room(&server, &alice, room("R3", "public_chat")).await;
    let r4 = create_room(&server, &alice, room("R4", "private_chat")).await;
    let r5 = create_room(&server, &alice, room("R5", "public_chat")).await;
    let via = json!({ "via": ["test.local"] });
    for child in [&r1, &ss1, &r2] {
        link(&server, &alice, &root, child, via.clone()).await;
    }
    link(&server, &alice, &ss1, &ss2, via.clone()).await;
    link(&server, &alice, &ss2, &r3, via.clone()).await;
    link(&server, &alice, &ss2, &r4, via.clone()).await;
    // R2 is no space: its link is not followed.
    link(&server, &alice, &r2, &r5, via.clone()).await;
    // A link without `via` is no link.
    link(&server, &alice, &root, &r5, json!({})).await;

    // Alice sees everything, depth first, children by link age.
    let (status, all) = hierarchy(&server, &alice, &root, "").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(
        ids(&all),
        [root.as_str(), r1.as_str(), ss1.as_str(), ss2.as_str(), r3.as_str(), r4.as_str(), r2.as_str()]
    );
    assert!(all.get("next_batch").is_none(), "{all}");
    let first = &all["rooms"][0];
    assert_eq!((first["name"].as_str(), first["room_type"].as_str()), (Some("Root"), Some("m.space")));
    let children: Vec<&str> = first["children_state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state_key"].as_str().unwrap())
        .collect();
    assert_eq!(children, [r1.as_str(), ss1.as_str(), r2.as_str()]);
    assert_eq!(first["children_state"][0]["type"], "m.space.child");
    assert!(first["children_state"][0].get("event_id").is_none(), "stripped: {first}");
    assert_eq!(all["rooms"][6]["children_state"], json!([]), "R2's links are not listed");

    // Pages of four, then the rest.
    let (_, page1) = hierarchy(&server, &alice, &root, "?limit=4").await;
    assert_eq!(ids(&page1), [root.as_str(), r1.as_str(), ss1.as_str(), ss2.as_str()]);
    let next = page1["next_batch"].as_str().unwrap().to_owned();
    let (_, page2) = hierarchy(&server, &alice, &root, &format!("?limit=4&from={}", enc(&next))).await;
    assert_eq!(ids(&page2), [r3.as_str(), r4.as_str(), r2.as_str()]);
    assert!(page2.get("next_batch").is_none(), "{page2}");
    let other = hierarchy(&server, &alice, &root, &format!("?limit=4&max_depth=1&from={}", enc(&next))).await;
    assert_error(&other, 400, "M_INVALID_PARAM", "a token with other parameters");
    let garbage = hierarchy(&server, &alice, &root, "?from=zzz").await;
    assert_error(&garbage, 400, "M_INVALID_PARAM", "a garbage token");

    // Depth and suggestions.
    let (_, shallow) = hierarchy(&server, &alice, &root, "?max_depth=1").await;
    assert_eq!(ids(&shallow), [root.as_str(), r1.as_str(), ss1.as_str(), r2.as_str()]);
    link(&server, &alice, &root, &r2, json!({ "via": ["test.local"], "suggested": true })).await;
    let (_, suggested) = hierarchy(&server, &alice, &root, "?suggested_only=true").await;
    assert_eq!(ids(&suggested), [root.as_str(), r2.as_str()]);

    // Bob is in nothing: SS1 (invite only) and what lies under it are
    // hidden, though the root still shows its link.
    let (status, bobs) = hierarchy(&server, &bob, &root, "").await;
    assert_eq!(status, 200, "{bobs}");
    assert_eq!(ids(&bobs), [root.as_str(), r1.as_str(), r2.as_str()]);
    assert_eq!(bobs["rooms"][0]["children_state"].as_array().unwrap().len(), 3);
    // Invited to SS1, he sees it and the public rooms under it, not R4.
    let (status, _) =
        server.post(&room_path(&ss1, "/invite"), Some(&alice.token), json!({ "user_id": bob.user_id })).await;
    assert_eq!(status, 200);
    let (_, bobs) = hierarchy(&server, &bob, &root, "").await;
    assert_eq!(
        ids(&bobs),
        [root.as_str(), r1.as_str(), ss1.as_str(), ss2.as_str(), r3.as_str(), r2.as_str()]
    );
    // A space he may not see at all is 403, like one that does not exist.
    let private = hierarchy(&server, &bob, &r4, "").await;
    assert_error(&private, 403, "M_FORBIDDEN", "an invite-only room");
    let unknown = hierarchy(&server, &bob, "!nope:test.local", "").await;
    assert_error(&unknown, 403, "M_FORBIDDEN", "an unknown room");

    // Emptying a link removes it.
    link(&server, &alice, &root, &ss1, json!({})).await;
    let (_, after) = hierarchy(&server, &alice, &root, "").await;
    assert_eq!(ids(&after), [root.as_str(), r1.as_str(), r2.as_str()]);
}
