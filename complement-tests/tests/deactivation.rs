//! Account deactivation: after the password, the account is gone for good
//! (no login, no token, no registering the name again), its rooms are left,
//! invites turned down, and what the server kept for it alone is deleted.

use complement_tests::api::{V3, assert_error, create_room, deactivate, join, room_path, text};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use serde_json::{Value, json};

backend_tests!(
    deactivation_needs_the_password_and_ends_the_account,
    erased_messages_are_redacted_for_later_joiners
);

async fn deactivation_needs_the_password_and_ends_the_account(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice").await;
    let bob = server.register("bob", "pw-bob").await;
    let alice_id = server.user_id("alice");
    let room = create_room(&server, &bob, json!({ "preset": "public_chat" })).await;
    join(&server, &alice, &room).await;
    let (status, _) =
        server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("hi")).await;
    assert_eq!(status, 200);
    let invited = create_room(&server, &bob, json!({ "preset": "private_chat", "invite": [alice_id] })).await;
    let (status, _) = server
        .put(
            &format!("{V3}/profile/{alice_id}/displayname"),
            Some(&alice.token),
            json!({ "displayname": "Alice A." }),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = server
        .put(
            &format!("{V3}/user/{alice_id}/account_data/org.example.secret"),
            Some(&alice.token),
            json!({ "a": 1 }),
        )
        .await;
    assert_eq!(status, 200);

    // The password flow is offered; a wrong password changes nothing.
    let (status, flows) =
        server.post(&format!("{V3}/account/deactivate"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 401, "{flows}");
    assert!(flows["flows"].to_string().contains("m.login.password"), "{flows}");
    let session = flows["session"].as_str().unwrap().to_owned();
    let auth = |password: &str| {
        json!({ "auth": { "type": "m.login.password", "session": session, "password": password,
                          "identifier": { "type": "m.id.user", "user": "alice" } } })
    };
    let (status, wrong) =
        server.post(&format!("{V3}/account/deactivate"), Some(&alice.token), auth("nope")).await;
    assert_eq!((status, wrong["errcode"].as_str()), (401, Some("M_FORBIDDEN")), "{wrong}");
    let (status, _) = server.get(&format!("{V3}/account/whoami"), Some(&alice.token)).await;
    assert_eq!(status, 200, "still active after a wrong password");
    // Bob cannot deactivate alice: his own session is his.
    let (status, _) =
        server.post(&format!("{V3}/account/deactivate"), Some(&bob.token), auth("pw-alice")).await;
    assert!(matches!(status, 401 | 403), "{status}");
    let (status, _) = server.get(&format!("{V3}/account/whoami"), Some(&bob.token)).await;
    assert_eq!(status, 200, "bob's account is untouched");

    let (status, done) =
        server.post(&format!("{V3}/account/deactivate"), Some(&alice.token), auth("pw-alice")).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["id_server_unbind_result"], "no-support");

    // The token, the login and the name are gone for good.
    let whoami = server.get(&format!("{V3}/account/whoami"), Some(&alice.token)).await;
    assert_error(&whoami, 401, "M_UNKNOWN_TOKEN", "the old token");
    let login = server
        .post(
            &format!("{V3}/login"),
            None,
            json!({ "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "pw-alice" }),
        )
        .await;
    assert_error(&login, 403, "M_USER_DEACTIVATED", "login after deactivation");
    let again = server
        .post(
            &format!("{V3}/register"),
            None,
            json!({ "username": "alice", "password": "new", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_error(&again, 400, "M_USER_IN_USE", "registering the name again");

    // She left the room (her message stays) and turned the invite down.
    let (status, members) = server.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
    assert_eq!(status, 200);
    assert!(!members["joined"].as_object().unwrap().contains_key(&alice_id), "{members}");
    let (_, page) = server.get(&room_path(&room, "/messages?dir=b&limit=20"), Some(&bob.token)).await;
    assert!(page["chunk"].as_array().unwrap().iter().any(|e| e["content"]["body"] == "hi"), "{page}");
    let (status, member) =
        server.get(&room_path(&invited, &format!("/state/m.room.member/{alice_id}")), Some(&bob.token)).await;
    assert_eq!((status, member["membership"].as_str()), (200, Some("leave")), "{member}");
    // Her profile is cleared.
    let (_, profile) = server.get(&format!("{V3}/profile/{alice_id}"), Some(&bob.token)).await;
    assert!(profile.get("displayname").is_none(), "{profile}");
}

/// `erase: true`: what the erased user sent is served redacted to whoever
/// was not joined when it was sent (a later joiner with shared history),
/// while those who were there keep it. Without `erase`, messages stay.
async fn erased_messages_are_redacted_for_later_joiners(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice").await;
    let eve = server.register("eve", "pw-eve").await;
    let bob = server.register("bob", "pw-bob").await;
    let carol = server.register("carol", "pw-carol").await;
    let room = create_room(&server, &bob, json!({ "preset": "public_chat" })).await;
    join(&server, &alice, &room).await;
    join(&server, &eve, &room).await;
    for (user, txn, body) in [(&alice, "a1", "alice was here"), (&eve, "e1", "eve was here")] {
        let (status, _) = server
            .put(&room_path(&room, &format!("/send/m.room.message/{txn}")), Some(&user.token), text(body))
            .await;
        assert_eq!(status, 200);
    }
    for (user, localpart, password, erase) in
        [(&alice, "alice", "pw-alice", true), (&eve, "eve", "pw-eve", false)]
    {
        deactivate(&server, user, localpart, password, erase).await;
    }
    join(&server, &carol, &room).await;
    let bodies = |page: &Value| -> Vec<(String, Value)> {
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "m.room.message")
            .map(|e| (e["sender"].as_str().unwrap().to_owned(), e["content"]["body"].clone()))
            .collect()
    };
    let messages = room_path(&room, "/messages?dir=f&limit=100");
    let (status, page) = server.get(&messages, Some(&bob.token)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        bodies(&page),
        vec![(alice.user_id.clone(), json!("alice was here")), (eve.user_id.clone(), json!("eve was here"))],
        "bob was there: he keeps what he saw: {page}"
    );
    let (status, page) = server.get(&messages, Some(&carol.token)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        bodies(&page),
        vec![(alice.user_id.clone(), Value::Null), (eve.user_id.clone(), json!("eve was here"))],
        "carol came later: the erased user's message is redacted, the other stays: {page}"
    );
    // The same through /sync and /event.
    let (_, sync) = server.get(&format!("{V3}/sync"), Some(&carol.token)).await;
    let timeline = &sync["rooms"]["join"][&room]["timeline"]["events"];
    let from_alice: Vec<&Value> = timeline
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.room.message" && e["sender"] == alice.user_id.as_str())
        .collect();
    assert_eq!(from_alice.len(), 1, "{sync}");
    assert_eq!(from_alice[0]["content"], json!({}), "{sync}");
    let id = from_alice[0]["event_id"].as_str().unwrap();
    let (status, event) = server.get(&room_path(&room, &format!("/event/{id}")), Some(&carol.token)).await;
    assert_eq!((status, &event["content"]), (200, &json!({})), "{event}");
    let (status, event) = server.get(&room_path(&room, &format!("/event/{id}")), Some(&bob.token)).await;
    assert_eq!((status, &event["content"]["body"]), (200, &json!("alice was here")), "{event}");
}
