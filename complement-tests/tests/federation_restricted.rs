//! Restricted rooms across servers: another server's user who is joined to
//! a room the join rule allows joins a restricted room of ours (make_join
//! names one of our members who may invite as the authoriser, send_join is
//! checked against the allow rules and countersigned), and every other way
//! in is refused with nothing stored: an authoriser without the power to
//! invite, one on another server, one who is not in the room, and a joiner
//! in none of the allowed rooms. make_join says, as the spec asks, when we
//! cannot tell (M_UNABLE_TO_AUTHORISE_JOIN: we are in none of the allowed
//! rooms) and when nobody here may let the joiner in (M_UNABLE_TO_GRANT_JOIN).

use complement_tests::acting::Acting;
use complement_tests::api::{
    V3, assert_error, create_room, enc, eventually, join as join_locally, message_bodies, room_path, text,
};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, Server, User};
use complement_tests::pdu;
use serde_json::{Value, json};

backend_tests!(
    a_remote_member_of_the_allowed_room_joins_a_restricted_room,
    remote_restricted_joins_are_checked,
);

const AUTHORISER: &str = "join_authorised_via_users_server";

/// A room of `owner` whose join rule is `rule`, allowing members of
/// `allowed`; inviting takes power 50.
async fn restricted_room(server: &Server, owner: &User, rule: &str, allowed: &str) -> String {
    let content = json!({
        "join_rule": rule,
        "allow": [{ "type": "m.room_membership", "room_id": allowed }],
    });
    create_room(
        server,
        owner,
        json!({
            "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": content }],
            "power_level_content_override": { "invite": 50 },
        }),
    )
    .await
}

/// The member event of `user` in `room` as `viewer` sees it (status, event).
async fn member_event(server: &Server, viewer: &User, room: &str, user: &str) -> (u16, Value) {
    let (status, events) = server.get(&room_path(room, "/state"), Some(&viewer.token)).await;
    assert_eq!(status, 200, "{events}");
    let found = events
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == user)
        .cloned();
    match found {
        Some(event) => (200, event),
        None => (404, Value::Null),
    }
}

fn join_via(room: &str, via: &FedServer) -> String {
    format!("{V3}/join/{}?server_name={}", enc(room), enc(&via.name))
}

/// Two seqline servers: bob of B may not join alice's restricted room on A
/// while he is in none of the rooms it allows; once he has joined the
/// allowed room he joins, A names alice as the authoriser, both servers
/// hold the same join, and what alice says then reaches bob. Then B is in
/// the room with nobody there who may invite: erin of B's join still goes
/// through A.
async fn a_remote_member_of_the_allowed_room_joins_a_restricted_room(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let space = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    let room = restricted_room(&a.server, &alice, "restricted", &space).await;

    let refused = b.server.post(&join_via(&room, &a), Some(&bob.token), json!({})).await;
    assert_error(&refused, 403, "M_FORBIDDEN", "a join from outside the allowed room");
    assert_eq!(member_event(&a.server, &alice, &room, &bob.user_id).await.0, 404);

    let (status, body) = b.server.post(&join_via(&space, &a), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = b.server.post(&join_via(&room, &a), Some(&bob.token), json!({})).await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())), "{body}\n{}", a.server.log());

    let (status, on_a) = member_event(&a.server, &alice, &room, &bob.user_id).await;
    assert_eq!(status, 200);
    assert_eq!(on_a["content"]["membership"], "join", "{on_a}");
    assert_eq!(on_a["content"][AUTHORISER], alice.user_id.as_str(), "{on_a}");
    let (status, on_b) = member_event(&b.server, &bob, &room, &bob.user_id).await;
    assert_eq!(status, 200);
    assert_eq!(on_b["event_id"], on_a["event_id"], "the same join on both servers");
    assert_eq!(on_b["content"][AUTHORISER], alice.user_id.as_str(), "{on_b}");

    let (status, sent) =
        a.server.put(&room_path(&room, "/send/m.room.message/t1"), Some(&alice.token), text("welcome")).await;
    assert_eq!(status, 200, "{sent}");
    eventually("alice's message on B", || async {
        let (status, page) =
            b.server.get(&room_path(&room, "/messages?dir=b&limit=10"), Some(&bob.token)).await;
        (status == 200 && message_bodies(&page).contains(&"welcome".to_owned())).then_some(())
    })
    .await;

    // B is in both rooms now and bob may not invite: erin of B joins the
    // space on B, and the room through A, which authorises her as it did bob.
    let erin = b.server.register("erin", "pw").await;
    join_locally(&b.server, &erin, &space).await;
    eventually("erin's join of the space on A", || async {
        (member_event(&a.server, &alice, &space, &erin.user_id).await.0 == 200).then_some(())
    })
    .await;
    let (status, body) = b.server.post(&join_via(&room, &a), Some(&erin.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", b.server.log());
    let (status, on_b) = member_event(&b.server, &bob, &room, &erin.user_id).await;
    assert_eq!(status, 200);
    assert_eq!(on_b["content"][AUTHORISER], alice.user_id.as_str(), "{on_b}");
    let (status, on_a) = member_event(&a.server, &alice, &room, &erin.user_id).await;
    assert_eq!(status, 200);
    assert_eq!(on_a["event_id"], on_b["event_id"], "the same join on both servers");
}

/// Acting as server B toward A: the joins that must not get in do not, and
/// nothing of them is stored; the template's own join does get in,
/// countersigned by A.
async fn remote_restricted_joins_are_checked(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let dave = a.server.register("dave", "pw").await;
    let mallory = a.server.register("mallory", "pw").await;
    let (bob, carol) = (b.user_id("bob"), b.user_id("carol"));
    let space = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    let room = restricted_room(&a.server, &alice, "restricted", &space).await;
    // Dave is in the room, without the power to invite.
    join_locally(&a.server, &dave, &space).await;
    join_locally(&a.server, &dave, &room).await;

    // A rule naming only a room A does not know: A cannot tell.
    let unknown = restricted_room(&a.server, &alice, "restricted", "!elsewhere:example.org").await;
    assert_error(&acting.make_join(&unknown, &bob).await, 400, "M_UNABLE_TO_AUTHORISE_JOIN", "unknown room");
    // A room whose only member here may not invite: nobody here can let Bob in.
    let orphaned = restricted_room(&a.server, &alice, "restricted", &space).await;
    join_locally(&a.server, &dave, &orphaned).await;
    let (status, body) = a.server.post(&room_path(&orphaned, "/leave"), Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_error(&acting.make_join(&orphaned, &bob).await, 403, "M_FORBIDDEN", "outside the allowed room");
    // Bob is in none of the allowed rooms yet.
    assert_error(&acting.make_join(&room, &bob).await, 403, "M_FORBIDDEN", "outside the allowed room");

    acting.join(&space, &bob).await;
    let no_one = acting.make_join(&orphaned, &bob).await;
    assert_error(&no_one, 400, "M_UNABLE_TO_GRANT_JOIN", "no member here may invite");
    let (status, template) = acting.make_join(&room, &bob).await;
    assert_eq!(status, 200, "{template}");
    let join = template["event"].clone();
    assert_eq!(join["content"], json!({ "membership": "join", AUTHORISER: alice.user_id }), "{join}");

    let forged = |sender: &str, authoriser: &str| {
        let mut event = join.clone();
        event["sender"] = json!(sender);
        event["state_key"] = json!(sender);
        event["content"][AUTHORISER] = json!(authoriser);
        let id = acting.sign(&mut event);
        (id, event)
    };
    let refusals = [
        (forged(&bob, &dave.user_id), "an authoriser who may not invite"),
        (forged(&bob, &bob), "an authoriser on another server"),
        (forged(&bob, &mallory.user_id), "an authoriser who is not in the room"),
        (forged(&carol, &alice.user_id), "a joiner in none of the allowed rooms"),
    ];
    for ((id, event), what) in &refusals {
        let answer = acting.send_join(&room, id, event).await;
        assert_error(&answer, 403, "M_FORBIDDEN", what);
        let path = room_path(&room, &format!("/event/{}", enc(id)));
        assert_eq!(a.server.get(&path, Some(&alice.token)).await.0, 404, "{what}: stored");
    }
    for user in [&bob, &carol] {
        assert_eq!(member_event(&a.server, &alice, &room, user).await.0, 404, "{user} is not in the room");
    }

    let mut join = join;
    let join_id = acting.sign(&mut join);
    let (status, answer) = acting.send_join(&room, &join_id, &join).await;
    assert_eq!(status, 200, "{answer}\n{}", a.server.log());
    let event = &answer["event"];
    assert_eq!(pdu::event_id(event), join_id);
    assert!(event["signatures"][&a.name].is_object(), "countersigned by A: {event}");
    assert!(event["signatures"][&b.name].is_object(), "{event}");
    let (status, stored) = member_event(&a.server, &alice, &room, &bob).await;
    assert_eq!(status, 200);
    assert_eq!(
        (stored["event_id"].as_str(), &stored["content"]["membership"]),
        (Some(join_id.as_str()), &json!("join"))
    );
}
