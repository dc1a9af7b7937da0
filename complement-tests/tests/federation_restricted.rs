//! Restricted rooms across servers: another server's user who is joined to
//! a room the join rule allows joins a restricted room of ours (make_join
//! names one of our members who may invite as the authoriser, send_join is
//! checked against the allow rules and countersigned), and every other way
//! in is refused with nothing stored: an authoriser without the power to
//! invite, one on another server, one who is not in the room, and a joiner
//! in none of the allowed rooms. make_join says, as the spec asks, when we
//! cannot tell (M_UNABLE_TO_AUTHORISE_JOIN: we are in none of the allowed
//! rooms) and when nobody here may let the joiner in (M_UNABLE_TO_GRANT_JOIN).
//!
//! With a real Synapse, both ways: a Synapse user who joined our space over
//! federation joins our restricted room through us (we authorise and
//! countersign), one outside the space is refused with our M_FORBIDDEN; a
//! seqline user who joined a Synapse room joins Synapse's restricted room
//! that allows it (Synapse authorises), one outside it is refused with
//! Synapse's M_FORBIDDEN. Once the joining server is in the room with nobody
//! there who may invite, the next join still goes through the room's server.

use complement_tests::acting::Acting;
use complement_tests::api::{
    V3, assert_error, create_room, enc, eventually, join as join_locally, joined_member_ids, message_bodies,
    room_path, text,
};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, Server, User};
use complement_tests::pdu;
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    a_remote_member_of_the_allowed_room_joins_a_restricted_room,
    remote_restricted_joins_are_checked,
    a_synapse_member_of_the_allowed_space_joins_a_seqline_restricted_room,
    a_seqline_member_of_the_allowed_room_joins_a_synapse_restricted_room,
);

const AUTHORISER: &str = "join_authorised_via_users_server";

/// The createRoom body of a room whose join rule is `rule`, allowing
/// members of `allowed`; inviting takes power 50 (`version`: the server's
/// default when `None`). Seqline and Synapse take the same body.
fn restricted_body(rule: &str, allowed: &str, version: Option<&str>) -> Value {
    let content = json!({
        "join_rule": rule,
        "allow": [{ "type": "m.room_membership", "room_id": allowed }],
    });
    let mut body = json!({
        "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": content }],
        "power_level_content_override": { "invite": 50 },
    });
    if let Some(version) = version {
        body["room_version"] = json!(version);
    }
    body
}

/// A room of `owner` whose join rule is `rule`, allowing members of
/// `allowed`; inviting takes power 50.
async fn restricted_room(server: &Server, owner: &User, rule: &str, allowed: &str) -> String {
    create_room(server, owner, restricted_body(rule, allowed, None)).await
}

/// The member event of `user` among the state events `events`.
fn member_in(events: &Value, user: &str) -> Option<Value> {
    events
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == user)
        .cloned()
}

/// The member event of `user` in `room` as `viewer` sees it (status, event).
async fn member_event(server: &Server, viewer: &User, room: &str, user: &str) -> (u16, Value) {
    let (status, events) = server.get(&room_path(room, "/state"), Some(&viewer.token)).await;
    assert_eq!(status, 200, "{events}");
    match member_in(&events, user) {
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

/// `/join/{room}?server_name={via}` (a remote join must name a server).
fn join_through(room: &str, via: &str) -> String {
    format!("{V3}/join/{}?server_name={}", enc(room), enc(via))
}

/// The ids of the room's current state events as `viewer` reads them on
/// seqline, sorted: what a refused join must leave as it was.
async fn state_ids(server: &Server, viewer: &User, room: &str) -> Vec<String> {
    let (status, events) = server.get(&room_path(room, "/state"), Some(&viewer.token)).await;
    assert_eq!(status, 200, "{events}");
    let mut ids: Vec<String> = events
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["event_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort_unstable();
    ids
}

/// The rooms `user` is joined to on seqline (`/joined_rooms`), sorted.
async fn joined_rooms(server: &Server, user: &User) -> Vec<String> {
    let (status, body) = server.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    sorted_strings(&body["joined_rooms"])
}

/// A JSON array of strings, sorted.
fn sorted_strings(values: &Value) -> Vec<String> {
    let mut out: Vec<String> =
        values.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    out.sort_unstable();
    out
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|&id| id.to_owned()).collect();
    out.sort_unstable();
    out
}

/// A room created on Synapse by `owner` with the createRoom `body`.
async fn synapse_room(syn: &Synapse, owner: &User, body: Value) -> String {
    let (status, created) = syn.post(&format!("{V3}/createRoom"), Some(&owner.token), body).await;
    assert_eq!(status, 200, "{created}");
    created["room_id"].as_str().expect("room_id").to_owned()
}

/// The room's joined members as `viewer` reads them on Synapse, sorted.
async fn synapse_members(syn: &Synapse, viewer: &User, room: &str) -> Vec<String> {
    let (status, body) = syn.get(&room_path(room, "/joined_members"), Some(&viewer.token)).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    let mut members: Vec<String> =
        body["joined"].as_object().into_iter().flat_map(|m| m.keys().cloned()).collect();
    members.sort_unstable();
    members
}

/// The member event of `user` in `room` as `viewer` reads it on Synapse.
async fn synapse_member_event(syn: &Synapse, viewer: &User, room: &str, user: &str) -> Option<Value> {
    let (status, events) = syn.get(&room_path(room, "/state"), Some(&viewer.token)).await;
    assert_eq!(status, 200, "{events}\n{}", syn.log_tail());
    member_in(&events, user)
}

/// The rooms `user` is joined to on Synapse, sorted.
async fn synapse_joined_rooms(syn: &Synapse, user: &User) -> Vec<String> {
    let (status, body) = syn.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    sorted_strings(&body["joined_rooms"])
}

/// The Synapse user says `said.0`, the seqline user answers `said.1`; each
/// reads the other's message, in that order after their own, on their own
/// server.
async fn talk_both_ways(
    (seq, seq_user): (&FedServer, &User),
    (syn, syn_user): (&Synapse, &User),
    room: &str,
    said: (&str, &str),
) {
    let (status, sent) =
        syn.put(&room_path(room, "/send/m.room.message/s1"), Some(&syn_user.token), text(said.0)).await;
    assert_eq!(status, 200, "{sent}");
    eventually(&format!("{:?} on seqline", said.0), || async {
        let (status, page) =
            seq.server.get(&room_path(room, "/messages?dir=b&limit=20"), Some(&seq_user.token)).await;
        (status == 200 && message_bodies(&page) == [said.0]).then_some(())
    })
    .await;
    let (status, sent) = seq
        .server
        .put(&room_path(room, "/send/m.room.message/q1"), Some(&seq_user.token), text(said.1))
        .await;
    assert_eq!(status, 200, "{sent}");
    eventually(&format!("{:?} on Synapse", said.1), || async {
        let (status, page) =
            syn.get(&room_path(room, "/messages?dir=b&limit=20"), Some(&syn_user.token)).await;
        (status == 200 && message_bodies(&page) == [said.0, said.1]).then_some(())
    })
    .await;
}

/// Asserts `joiner`'s restricted join of `room` as both servers hold it:
/// the joined members are `members` on each, and the join is one event
/// (same id) naming `authoriser` in `join_authorised_via_users_server`.
/// `viewer` reads on seqline, `syn_viewer` on Synapse.
async fn assert_joined_on_both(
    (seq, viewer): (&FedServer, &User),
    (syn, syn_viewer): (&Synapse, &User),
    room: &str,
    joiner: &str,
    authoriser: &str,
    members: &[&str],
) {
    let members = sorted(members);
    assert_eq!(joined_member_ids(&seq.server, viewer, room).await, members, "on seqline");
    assert_eq!(synapse_members(syn, syn_viewer, room).await, members, "on Synapse");
    let (status, on_seqline) = member_event(&seq.server, viewer, room, joiner).await;
    assert_eq!(status, 200, "{joiner}'s join on seqline");
    assert_eq!(on_seqline["content"]["membership"], "join", "{on_seqline}");
    assert_eq!(on_seqline["content"][AUTHORISER], authoriser, "{on_seqline}");
    let on_synapse = synapse_member_event(syn, syn_viewer, room, joiner)
        .await
        .unwrap_or_else(|| panic!("{joiner}'s join on Synapse"));
    assert_eq!(on_synapse["event_id"], on_seqline["event_id"], "the same join on both servers");
    assert_eq!(on_synapse["content"][AUTHORISER], authoriser, "{on_synapse}");
}

/// Asserts a refused join: 403 M_FORBIDDEN whose message carries `said`
/// (the refusing server's own words, passed on by the joining server).
fn assert_refused(answer: &(u16, Value), said: &str, what: &str) {
    assert_error(answer, 403, "M_FORBIDDEN", what);
    let error = answer.1["error"].as_str().unwrap_or_default();
    assert!(error.contains(said), "{what}: {error:?} does not say {said:?}");
}

/// Seqline's refusal of a joiner in none of the allowed rooms.
const SEQLINE_REFUSAL: &str = "you are in none of them";
/// Synapse's.
const SYNAPSE_REFUSAL: &str = "You do not belong to any of the required rooms/spaces";

/// Alice's restricted room (version 11) on seqline allows the members of her
/// space. Carol of Synapse, in no allowed room, asks Synapse to join it:
/// seqline's make_join refuses, Synapse passes the 403 on, and seqline's
/// room is as it was. Bob of Synapse joins the space over federation, then
/// the room: seqline names alice as the authoriser and countersigns, both
/// servers hold the same join, and they talk. Synapse is now in the room
/// but nobody there may invite, so carol's second try and, once she is in
/// the space, her join again go through seqline.
async fn a_synapse_member_of_the_allowed_space_joins_a_seqline_restricted_room(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let (bob, carol) = tokio::join!(syn.register("bob", "pw"), syn.register("carol", "pw"));
    let space = create_room(
        &seq.server,
        &alice,
        json!({ "preset": "public_chat", "room_version": "11", "creation_content": { "type": "m.space" } }),
    )
    .await;
    let room = create_room(&seq.server, &alice, restricted_body("restricted", &space, Some("11"))).await;
    let before = state_ids(&seq.server, &alice, &room).await;

    let refused = syn.post(&join_through(&room, &seq.name), Some(&carol.token), json!({})).await;
    assert_refused(&refused, SEQLINE_REFUSAL, "carol, in no allowed room");
    assert_eq!(state_ids(&seq.server, &alice, &room).await, before, "the refusal changed the room");
    assert_eq!(synapse_joined_rooms(&syn, &carol).await, Vec::<String>::new());

    let (status, body) = syn.post(&join_through(&space, &seq.name), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    let (status, body) = syn.post(&join_through(&room, &seq.name), Some(&bob.token), json!({})).await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())), "{body}\n{}", syn.log_tail());

    let both = ((&seq, &alice), (&syn, &bob));
    assert_joined_on_both(
        both.0,
        both.1,
        &room,
        &bob.user_id,
        &alice.user_id,
        &[&alice.user_id, &bob.user_id],
    )
    .await;

    talk_both_ways(both.0, both.1, &room, ("hello from synapse", "welcome bob")).await;

    // Synapse is in the room now, but only alice may invite: carol's join is
    // still seqline's to allow, and it is still refused.
    let before = state_ids(&seq.server, &alice, &room).await;
    let refused = syn.post(&join_through(&room, &seq.name), Some(&carol.token), json!({})).await;
    assert_refused(&refused, SEQLINE_REFUSAL, "carol, in no allowed room, Synapse in the room");
    assert_eq!(state_ids(&seq.server, &alice, &room).await, before, "the refusal changed the room");
    assert_eq!(member_event(&seq.server, &alice, &room, &carol.user_id).await.0, 404);

    let (status, body) = syn.post(&join_through(&space, &seq.name), Some(&carol.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    // Synapse is in the space: that join was made there and reaches seqline
    // in its own time, and seqline judges carol by what it knows.
    eventually("carol's join of the space on seqline", || async {
        let (status, event) = member_event(&seq.server, &alice, &space, &carol.user_id).await;
        (status == 200 && event["content"]["membership"] == "join").then_some(())
    })
    .await;
    let (status, body) = syn.post(&join_through(&room, &seq.name), Some(&carol.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    let members = [alice.user_id.as_str(), &bob.user_id, &carol.user_id];
    assert_joined_on_both(both.0, both.1, &room, &carol.user_id, &alice.user_id, &members).await;
}

/// Carol's restricted room (version 10) on Synapse allows the members of
/// another room of hers. Dave of seqline, in neither, is refused by
/// Synapse's make_join and seqline shows no join. Alice of seqline joins
/// the allowed room over federation, then the restricted one: Synapse names
/// carol as the authoriser and countersigns, alice's `/joined_rooms` has
/// both, and they talk. Seqline is then in both rooms, with nobody in the
/// restricted one who may invite: dave joins the allowed room here and the
/// restricted one through Synapse again.
async fn a_seqline_member_of_the_allowed_room_joins_a_synapse_restricted_room(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let carol = syn.register("carol", "pw").await;
    let alice = seq.server.register("alice", "pw").await;
    let dave = seq.server.register("dave", "pw").await;
    let allowed = synapse_room(&syn, &carol, json!({ "preset": "public_chat", "room_version": "10" })).await;
    let room = synapse_room(&syn, &carol, restricted_body("restricted", &allowed, Some("10"))).await;

    let refused = seq.server.post(&join_through(&room, &syn.name), Some(&dave.token), json!({})).await;
    assert_refused(&refused, SYNAPSE_REFUSAL, "dave, in no allowed room");
    assert_eq!(joined_rooms(&seq.server, &dave).await, Vec::<String>::new());
    let synced = complement_tests::api::sync_once(&seq.server, &dave, None).await;
    for section in ["join", "invite", "leave", "knock"] {
        assert!(synced["rooms"][section].get(&room).is_none(), "{section}: {synced}");
    }
    assert_eq!(synapse_member_event(&syn, &carol, &room, &dave.user_id).await, None);

    let (status, body) =
        seq.server.post(&join_through(&allowed, &syn.name), Some(&alice.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", seq.server.log());
    let (status, body) =
        seq.server.post(&join_through(&room, &syn.name), Some(&alice.token), json!({})).await;
    assert_eq!(
        (status, body["room_id"].as_str()),
        (200, Some(room.as_str())),
        "{body}\n{}",
        seq.server.log()
    );

    assert_eq!(joined_rooms(&seq.server, &alice).await, sorted(&[&allowed, &room]));
    let both = ((&seq, &alice), (&syn, &carol));
    let members = [alice.user_id.as_str(), &carol.user_id];
    assert_joined_on_both(both.0, both.1, &room, &alice.user_id, &carol.user_id, &members).await;

    talk_both_ways(both.0, both.1, &room, ("hello alice", "hello from seqline")).await;

    // Seqline is in both rooms now; alice may not invite, so dave's join
    // is still carol's to allow, through Synapse (seqline placed it at once,
    // before answering).
    let (status, body) =
        seq.server.post(&join_through(&allowed, &syn.name), Some(&dave.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    // That join was made here and goes to Synapse in its own time: Synapse
    // judges dave by what it knows.
    let in_allowed = sorted(&[&alice.user_id, &carol.user_id, &dave.user_id]);
    eventually("dave's join of the allowed room on Synapse", || async {
        (synapse_members(&syn, &carol, &allowed).await == in_allowed).then_some(())
    })
    .await;
    let (status, body) = seq.server.post(&join_through(&room, &syn.name), Some(&dave.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", seq.server.log());
    let members = [alice.user_id.as_str(), &carol.user_id, &dave.user_id];
    assert_joined_on_both(both.0, both.1, &room, &dave.user_id, &carol.user_id, &members).await;
    assert_eq!(joined_rooms(&seq.server, &dave).await, sorted(&[&allowed, &room]));
}
