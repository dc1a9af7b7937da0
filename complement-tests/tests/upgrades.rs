//! Room upgrades: the new room names its predecessor and carries the old
//! one's state; the old room gets its tombstone and goes quiet; aliases move;
//! only who may send the tombstone upgrades.

use complement_tests::api::{V3, assert_error, create_room, enc, join, room_path, text};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    an_upgrade_replaces_the_room,
    a_moderator_who_may_tombstone_may_upgrade,
    upgrades_to_v12_name_the_creators_and_drop_them_from_the_levels,
);

async fn state(server: &Server, user: &User, room: &str, kind: &str) -> (u16, Value) {
    server.get(&room_path(room, &format!("/state/{kind}/")), Some(&user.token)).await
}

async fn an_upgrade_replaces_the_room(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "room_version": "10", "preset": "public_chat", "name": "Old name", "topic": "Old topic",
                "room_alias_name": "town" }),
    )
    .await;
    join(&server, &bob, &room).await;
    // Bob's push rule and tag for the room go with it.
    let rule = |room: &str| format!("{V3}/pushrules/global/room/{}", enc(room));
    let (status, body) =
        server.put(&rule(&room), Some(&bob.token), json!({ "actions": ["dont_notify"] })).await;
    assert_eq!(status, 200, "{body}");
    let tags = |room: &str| format!("{V3}/user/{}/rooms/{}/tags", enc(&bob.user_id), enc(room));
    let (status, body) =
        server.put(&format!("{}/u.work", tags(&room)), Some(&bob.token), json!({ "order": 0.5 })).await;
    assert_eq!(status, 200, "{body}");
    let upgrade = format!("{V3}/rooms/{}/upgrade", enc(&room));

    // Bob may not; an unknown version is refused.
    let answer = server.post(&upgrade, Some(&bob.token), json!({ "new_version": "12" })).await;
    assert_error(&answer, 403, "M_FORBIDDEN", "a member without the tombstone's power");
    let answer = server.post(&upgrade, Some(&alice.token), json!({ "new_version": "99" })).await;
    assert_error(&answer, 400, "M_UNSUPPORTED_ROOM_VERSION", "an unknown version");

    let (status, body) = server.post(&upgrade, Some(&alice.token), json!({ "new_version": "12" })).await;
    assert_eq!(status, 200, "{body}");
    let new_room = body["replacement_room"].as_str().unwrap().to_owned();
    assert_ne!(new_room, room);

    // The new room: its predecessor, the old state, no creator in the power levels.
    let (_, create) = state(&server, &alice, &new_room, "m.room.create").await;
    assert_eq!(create["room_version"], "12");
    assert_eq!(create["predecessor"]["room_id"], room.as_str(), "{create}");
    let (_, name) = state(&server, &alice, &new_room, "m.room.name").await;
    assert_eq!(name["name"], "Old name");
    let (_, topic) = state(&server, &alice, &new_room, "m.room.topic").await;
    assert_eq!(topic["topic"], "Old topic");
    let (_, rules) = state(&server, &alice, &new_room, "m.room.join_rules").await;
    assert_eq!(rules["join_rule"], "public");
    let (_, power) = state(&server, &alice, &new_room, "m.room.power_levels").await;
    assert!(power["users"].get(&alice.user_id).is_none(), "{power}");

    // The old room: its tombstone, and ordinary members quiet.
    let (status, tombstone) = state(&server, &alice, &room, "m.room.tombstone").await;
    assert_eq!(status, 200, "{tombstone}");
    assert_eq!(tombstone["replacement_room"], new_room.as_str());
    let (status, _) =
        server.put(&room_path(&room, "/send/m.room.message/b1"), Some(&bob.token), text("hi")).await;
    assert_eq!(status, 403, "bob can no longer talk in the old room");

    // The alias now leads to the new room, which holds it as canonical.
    let (status, alias) = server.get(&format!("{V3}/directory/room/{}", enc("#town:test.local")), None).await;
    assert_eq!(status, 200, "{alias}");
    assert_eq!(alias["room_id"], new_room.as_str());
    let (_, canonical) = state(&server, &alice, &new_room, "m.room.canonical_alias").await;
    assert_eq!(canonical["alias"], "#town:test.local", "{canonical}");
    let (_, old_canonical) = state(&server, &alice, &room, "m.room.canonical_alias").await;
    assert!(old_canonical.get("alias").is_none(), "{old_canonical}");

    let (status, copied) = server.get(&rule(&new_room), Some(&bob.token)).await;
    assert_eq!(status, 200, "{copied}");
    assert_eq!(copied["actions"], json!(["dont_notify"]), "{copied}");
    let (_, new_tags) = server.get(&tags(&new_room), Some(&bob.token)).await;
    assert_eq!(new_tags["tags"]["u.work"]["order"], 0.5, "{new_tags}");

    // Bob follows into the new room.
    join(&server, &bob, &new_room).await;
    let (status, _) =
        server.put(&room_path(&new_room, "/send/m.room.message/b2"), Some(&bob.token), text("here")).await;
    assert_eq!(status, 200);
}

/// A user whose power level allows the tombstone but not the other state
/// the new room is built with (`state_default` above theirs) still upgrades:
/// their power is raised while the new room's state is copied, and the new
/// room ends with the old room's power levels, theirs included as it was.
async fn a_moderator_who_may_tombstone_may_upgrade(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room =
        create_room(&server, &alice, json!({ "room_version": "10", "preset": "public_chat", "topic": "t" }))
            .await;
    join(&server, &bob, &room).await;
    let (status, mut levels) = state(&server, &alice, &room, "m.room.power_levels").await;
    assert_eq!(status, 200, "{levels}");
    levels["users"][&bob.user_id] = json!(50);
    levels["state_default"] = json!(100);
    levels["events"]["m.room.tombstone"] = json!(50);
    let path = room_path(&room, "/state/m.room.power_levels/");
    let (status, body) = server.put(&path, Some(&alice.token), levels.clone()).await;
    assert_eq!(status, 200, "{body}");

    let upgrade = format!("{V3}/rooms/{}/upgrade", enc(&room));
    let (status, body) = server.post(&upgrade, Some(&bob.token), json!({ "new_version": "11" })).await;
    assert_eq!(status, 200, "{body}");
    let new_room = body["replacement_room"].as_str().expect("replacement_room").to_owned();
    let (status, topic) = state(&server, &bob, &new_room, "m.room.topic").await;
    assert_eq!((status, topic["topic"].as_str()), (200, Some("t")), "{topic}");
    let (status, copied) = state(&server, &bob, &new_room, "m.room.power_levels").await;
    assert_eq!(status, 200, "{copied}");
    assert_eq!(copied["users"][&bob.user_id], json!(50), "bob's own level, not a raised one: {copied}");
    assert_eq!(copied["users"][&alice.user_id], json!(100), "{copied}");
    assert_eq!(copied["state_default"], json!(100), "{copied}");
    let (status, tombstone) = state(&server, &alice, &room, "m.room.tombstone").await;
    assert_eq!(
        (status, tombstone["replacement_room"].as_str()),
        (200, Some(new_room.as_str())),
        "{tombstone}"
    );
}

/// Upgrades to v12 (MSC4289): whoever upgrades (a creator or not) creates
/// the new room; `additional_creators` become its other creators; creators
/// have no entry in the new room's power levels, everyone else keeps theirs.
async fn upgrades_to_v12_name_the_creators_and_drop_them_from_the_levels(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let charlie = server.register("charlie", "pw").await;
    let (a, b, c) = (alice.user_id.as_str(), bob.user_id.as_str(), charlie.user_id.as_str());
    struct Case<'a> {
        what: &'a str,
        version: &'a str,
        levels: Value,
        upgrader: &'a User,
        additional: Option<Vec<&'a str>>,
        want_users: Value,
    }
    let cases = [
        Case {
            what: "a non-creator admin upgrades v11",
            version: "11",
            levels: json!({ b: 100 }),
            upgrader: &bob,
            additional: None,
            want_users: json!({}),
        },
        Case {
            what: "a non-creator admin upgrades v11, a moderator stays",
            version: "11",
            levels: json!({ b: 100, c: 100 }),
            upgrader: &bob,
            additional: None,
            want_users: json!({ c: 100 }),
        },
        Case {
            what: "a non-creator admin upgrades v12 with another creator",
            version: "12",
            levels: json!({ b: 150 }),
            upgrader: &bob,
            additional: Some(vec![c]),
            want_users: json!({}),
        },
        Case {
            what: "a non-creator admin upgrades v12; the new creator loses his level entry",
            version: "12",
            levels: json!({ b: 150, c: 50 }),
            upgrader: &bob,
            additional: Some(vec![c]),
            want_users: json!({}),
        },
        Case {
            what: "the creator upgrades v11 with an additional creator",
            version: "11",
            levels: json!({ a: 100, b: 100 }),
            upgrader: &alice,
            additional: Some(vec![b]),
            want_users: json!({}),
        },
        Case {
            what: "the creator upgrades v11 with an additional creator and a moderator",
            version: "11",
            levels: json!({ a: 100, b: 100, c: 50 }),
            upgrader: &alice,
            additional: Some(vec![b]),
            want_users: json!({ c: 50 }),
        },
    ];
    for case in cases {
        let room =
            create_room(&server, &alice, json!({ "room_version": case.version, "preset": "public_chat" }))
                .await;
        join(&server, &bob, &room).await;
        join(&server, &charlie, &room).await;
        let path = room_path(&room, "/state/m.room.power_levels/");
        let (status, body) = server.put(&path, Some(&alice.token), json!({ "users": case.levels })).await;
        assert_eq!(status, 200, "{}: {body}", case.what);
        let mut upgrade = json!({ "new_version": "12" });
        if let Some(additional) = &case.additional {
            upgrade["additional_creators"] = json!(additional);
        }
        let path = format!("{V3}/rooms/{}/upgrade", enc(&room));
        let (status, body) = server.post(&path, Some(&case.upgrader.token), upgrade).await;
        assert_eq!(status, 200, "{}: {body}", case.what);
        let new_room = body["replacement_room"].as_str().expect("replacement_room").to_owned();
        let (status, create) = state(&server, case.upgrader, &new_room, "m.room.create").await;
        assert_eq!(status, 200, "{}: {create}", case.what);
        assert_eq!(create["room_version"], "12", "{}", case.what);
        match &case.additional {
            Some(additional) => assert_eq!(create["additional_creators"], json!(additional), "{}", case.what),
            None => assert!(create.get("additional_creators").is_none(), "{}: {create}", case.what),
        }
        let (status, levels) = state(&server, case.upgrader, &new_room, "m.room.power_levels").await;
        assert_eq!(status, 200, "{}: {levels}", case.what);
        assert_eq!(levels["users"], case.want_users, "{}: {levels}", case.what);
    }
}
