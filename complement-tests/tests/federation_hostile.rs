//! Hostile servers answering seqline's own requests, played by a
//! `FakeServer`: a room host whose send_join answer holds real, signed
//! events of another room (a local user's join there) must not make that
//! user look joined; the answer is refused whole and nothing is stored. The
//! same for what seqline fetches of a room it is in: /get_missing_events,
//! /backfill, /state_ids with /event. Honest fake answers, as controls, let
//! the user join, hear the host and read the history.

use complement_tests::api::{
    V3, assert_error, create_room, enc, event_id_of, join, reads_agree, room_path, sync_once, text,
};
use complement_tests::backend_tests;
use complement_tests::fake::{FakeRoom, FakeServer, Received};
use complement_tests::federation::{FedServer, now_ms};
use complement_tests::harness::{Backend, User};
use complement_tests::pdu;
use serde_json::{Value, json};

backend_tests!(
    an_honest_host_lets_a_user_join_and_talk,
    a_host_cannot_make_local_users_look_joined_v11,
    a_host_cannot_make_local_users_look_joined_v12,
    missing_events_with_another_rooms_event_are_refused,
    backfill_answers_with_another_rooms_event_are_refused,
    signing_keys_are_judged_at_the_events_time,
    a_hole_nobody_can_fill_is_not_asked_about_again_and_again,
    a_hole_in_the_middle_is_filled_when_someone_pages_into_it,
    a_kick_in_a_hole_ends_the_stay_where_it_was,
    an_event_by_send_and_by_backfill_is_stored_once,
);

const MAKE_JOIN: &str = "/_matrix/federation/v1/make_join/";
const SEND_JOIN: &str = "/_matrix/federation/v2/send_join/";

/// Scripts `fake` to answer make_join for `user` and send_join in `room`
/// with `answer`.
fn host_join(fake: &FakeServer, room: &FakeRoom, user: &str, answer: Value) {
    fake.answer("GET", &format!("{MAKE_JOIN}{}/{user}", room.room_id), 200, room.join_template(user));
    fake.answer("PUT", &format!("{SEND_JOIN}{}/", room.room_id), 200, answer);
}

/// `POST /join/{room}?server_name=<via>` as `user`.
async fn join_via(seq: &FedServer, user: &User, room: &str, via: &str) -> (u16, Value) {
    let path = format!("{V3}/join/{}?server_name={}", enc(room), enc(via));
    seq.server.post(&path, Some(&user.token), json!({})).await
}

async fn joined_rooms(seq: &FedServer, user: &User) -> Vec<String> {
    let (status, body) = seq.server.get(&format!("{V3}/joined_rooms"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body["joined_rooms"].clone()).unwrap()
}

async fn joined_members(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    complement_tests::api::joined_member_ids(&seq.server, user, room).await
}

async fn message_bodies(seq: &FedServer, user: &User, room: &str) -> Vec<String> {
    let (status, page) =
        seq.server.get(&room_path(room, "/messages?dir=b&limit=50"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    complement_tests::api::message_bodies(&page)
}

/// A room `creator` makes on seqline (public), which `others` join, then the
/// fake's mallory through make_join/send_join; answers its id and the
/// send_join answer the fake got.
async fn seqline_room(
    seq: &FedServer,
    fake: &FakeServer,
    creator: &User,
    others: &[&User],
    version: &str,
) -> (String, Value) {
    let body = json!({ "preset": "public_chat", "room_version": version });
    let room = create_room(&seq.server, creator, body).await;
    for user in others {
        join(&seq.server, user, &room).await;
    }
    let (_, _, answer) = fake.join(seq, &room, &fake.user_id("mallory")).await;
    (room, answer)
}

/// `user`'s join of `room` (from the fake's send_join `answer`), fetched
/// through `/event` as the fake: real and signed by seqline.
async fn member_event(seq: &FedServer, fake: &FakeServer, room: &str, answer: &Value, user: &str) -> Value {
    let id = answer["state"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == user)
        .map(pdu::event_id)
        .unwrap_or_else(|| panic!("no join of {user} in {answer}"));
    let event = fake.event(seq, &id).await;
    assert_eq!(
        (event["sender"].as_str(), event["content"]["membership"].as_str(), event["room_id"].as_str()),
        (Some(user), Some("join"), Some(room))
    );
    event
}

/// A v12 room the fake hosts with one message of mallory's ("before
/// alice") that alice then joins through an honest answer. Answers the
/// room (alice's join its newest event), the message and the state ids
/// before it.
async fn joined_with_history(
    seq: &FedServer,
    fake: &FakeServer,
    alice: &User,
) -> (FakeRoom, Value, Vec<String>) {
    let mallory = fake.user_id("mallory");
    let mut room = fake.create_room("12", &mallory);
    let state_ids: Vec<String> = room.state_events().iter().map(pdu::event_id).collect();
    let (_, message) = fake.add(&mut room, "m.room.message", None, &mallory, text("before alice"));
    host_join(fake, &room, &alice.user_id, room.send_join_answer(&[&fake.name]));
    let (status, joined) = join_via(seq, alice, &room.room_id, &fake.name).await;
    assert_eq!(status, 200, "{joined}");
    let sent = fake.requests_to(&format!("{SEND_JOIN}{}/", room.room_id));
    room.push(sent[0].body.clone());
    (room, message, state_ids)
}

/// A federation answer carrying `pdus`.
fn pdus_answer(fake: &FakeServer, pdus: &[&Value]) -> Value {
    json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": pdus })
}

/// `/get_missing_events`: an answer holding another room's event (alice's
/// real join of a seqline room) is not used at all, so the event that needed
/// it is refused; the same answer without it fills the gap.
async fn missing_events_with_another_rooms_event_are_refused(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let (r2, r2_answer) = seqline_room(&seq, &fake, &alice, &[], "12").await;
    let foreign = member_event(&seq, &fake, &r2, &r2_answer, &alice.user_id).await;
    let (mut room, _, _) = joined_with_history(&seq, &fake, &alice).await;

    // m1 is never sent; m2 names it as its prev.
    let (m1_id, m1) = fake.add(&mut room, "m.room.message", None, &mallory, text("m1"));
    let (m2_id, m2) = fake.add(&mut room, "m.room.message", None, &mallory, text("m2"));
    let gme = format!("/_matrix/federation/v1/get_missing_events/{}", room.room_id);
    fake.answer("POST", &gme, 200, json!({ "events": [m1, foreign] }));
    let (status, results) = fake.send_txn(&seq, "t1", &[&m2]).await;
    assert_eq!(status, 200, "{results}");
    assert!(results["pdus"][&m2_id]["error"].is_string(), "{results}");
    let asked = fake.requests_to(&gme);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].body["latest_events"], json!([m2_id]));
    assert!(message_bodies(&seq, &alice, &room.room_id).await.iter().all(|b| b != "m1" && b != "m2"));
    assert_eq!(joined_rooms(&seq, &alice).await.len(), 2);

    // The honest answer fills the gap.
    fake.answer("POST", &gme, 200, json!({ "events": [m1] }));
    let (status, results) = fake.send_txn(&seq, "t2", &[&m2]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&m2_id], json!({}), "{results}");
    let (status, event) = seq
        .server
        .get(&room_path(&room.room_id, &format!("/event/{}", enc(&m1_id))), Some(&alice.token))
        .await;
    assert_eq!((status, event["content"]["body"].as_str()), (200, Some("m1")), "{event}");
    let bodies = message_bodies(&seq, &alice, &room.room_id).await;
    assert_eq!(bodies[bodies.len() - 2..], ["m1", "m2"], "{bodies:?}");
}

/// Backfill: history before alice's join is not taken from a /backfill
/// answer holding another room's event, nor when the state before it
/// (/state_ids) names another room's event that /event then serves; the
/// honest answers give it.
async fn backfill_answers_with_another_rooms_event_are_refused(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let (r2, r2_answer) = seqline_room(&seq, &fake, &alice, &[], "12").await;
    let foreign = member_event(&seq, &fake, &r2, &r2_answer, &alice.user_id).await;
    let foreign_id = pdu::event_id(&foreign);
    fake.answer(
        "GET",
        &format!("/_matrix/federation/v1/event/{foreign_id}"),
        200,
        pdus_answer(&fake, &[&foreign]),
    );

    for case in ["/backfill", "/state_ids", "honest"] {
        let (room, before, state_ids) = joined_with_history(&seq, &fake, &alice).await;
        let r = &room.room_id;
        let backfill = format!("/_matrix/federation/v1/backfill/{r}");
        let pdus: Vec<&Value> = if case == "/backfill" { vec![&before, &foreign] } else { vec![&before] };
        fake.answer("GET", &backfill, 200, pdus_answer(&fake, &pdus));
        let mut pdu_ids = state_ids.clone();
        if case == "/state_ids" {
            pdu_ids.push(foreign_id.clone());
        }
        let state_ids_path = format!("/_matrix/federation/v1/state_ids/{r}");
        fake.answer("GET", &state_ids_path, 200, json!({ "pdu_ids": pdu_ids, "auth_chain_ids": state_ids }));

        let bodies = message_bodies(&seq, &alice, r).await;
        let asked = fake.requests_to(&backfill);
        assert!(
            !asked.is_empty() && asked[0].query.contains(&enc(&pdu::event_id(&before))),
            "{case}: {asked:?}"
        );
        if case == "honest" {
            assert_eq!(bodies, ["before alice"], "{case}");
        } else {
            assert!(bodies.is_empty(), "{case}: {bodies:?}");
        }
        if case == "/state_ids" {
            assert!(!fake.requests_to(&format!("/_matrix/federation/v1/event/{foreign_id}")).is_empty());
        }
    }
}

/// The control: the fake hosts a room and answers honestly; alice joins
/// through it and reads what its user says afterwards.
async fn an_honest_host_lets_a_user_join_and_talk(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let mut room = fake.create_room("12", &mallory);
    host_join(&fake, &room, &alice.user_id, room.send_join_answer(&[&fake.name]));

    let (status, joined) = join_via(&seq, &alice, &room.room_id, &fake.name).await;
    assert_eq!(status, 200, "{joined}\n{}", seq.server.log());
    assert_eq!(joined["room_id"], room.room_id.as_str());
    // seqline offered the versions it takes part in, and sent its signed join.
    let asked = fake.requests_to(MAKE_JOIN);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].query.contains("ver=12") && asked[0].origin.as_deref() == Some(seq.name.as_str()));
    let sent = fake.requests_to(SEND_JOIN);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let alice_join = sent[0].body.clone();
    assert_eq!(
        (alice_join["sender"].as_str(), alice_join["state_key"].as_str()),
        (Some(&*alice.user_id), Some(&*alice.user_id))
    );
    let join_id = room.push(alice_join);
    assert!(sent[0].path.ends_with(&join_id), "{}", sent[0].path);

    let mut members = vec![alice.user_id.clone(), mallory.clone()];
    members.sort_unstable();
    assert_eq!(joined_members(&seq, &alice, &room.room_id).await, members);
    assert_eq!(joined_rooms(&seq, &alice).await, [room.room_id.clone()]);

    // The host talks; alice reads it.
    let (message_id, message) =
        fake.add(&mut room, "m.room.message", None, &mallory, text("hello from the fake"));
    assert_eq!(message["prev_events"], json!([join_id]));
    let (status, results) = fake.send_txn(&seq, "t1", &[&message]).await;
    assert_eq!(status, 200, "{results}");
    assert_eq!(results["pdus"][&message_id], json!({}), "{results}");
    assert_eq!(message_bodies(&seq, &alice, &room.room_id).await, ["hello from the fake"]);
    let sync = sync_once(&seq.server, &alice, None).await;
    let timeline = &sync["rooms"]["join"][&room.room_id]["timeline"]["events"];
    assert!(timeline.as_array().unwrap().iter().any(|e| e["event_id"] == message_id.as_str()), "{sync}");
}

async fn a_host_cannot_make_local_users_look_joined_v11(backend: Backend) {
    a_host_cannot_make_local_users_look_joined(backend, "11").await;
}

async fn a_host_cannot_make_local_users_look_joined_v12(backend: Backend) {
    a_host_cannot_make_local_users_look_joined(backend, "12").await;
}

/// Alice's and bob's real joins of a seqline room R2, put by the host of R1
/// into R1's send_join answer, do not make them members of R1: alice's join
/// fails and neither looks joined; R2 goes on as before.
async fn a_host_cannot_make_local_users_look_joined(backend: Backend, version: &str) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let bob = seq.server.register("bob", "pw").await;
    let mallory = fake.user_id("mallory");

    // R2 on seqline, with alice, bob and (through make_join/send_join) mallory;
    // their real, signed joins, fetched as any server in R2 may.
    let (r2, r2_answer) = seqline_room(&seq, &fake, &alice, &[&bob], version).await;
    let alice_r2_join = member_event(&seq, &fake, &r2, &r2_answer, &alice.user_id).await;
    let bob_r2_join = member_event(&seq, &fake, &r2, &r2_answer, &bob.user_id).await;

    // R1, hosted by the fake: its answer's state adds both R2 joins, and its
    // auth chain everything of R2 they need.
    let r1 = fake.create_room(version, &mallory);
    let mut answer = r1.send_join_answer(&[&fake.name]);
    let state = answer["state"].as_array_mut().unwrap();
    state.retain(|e| e["type"] != "m.room.member" || e["state_key"] == mallory.as_str());
    state.extend([alice_r2_join.clone(), bob_r2_join.clone()]);
    let chain = answer["auth_chain"].as_array_mut().unwrap();
    chain.extend(r2_answer["state"].as_array().unwrap().iter().cloned());
    chain.extend(r2_answer["auth_chain"].as_array().unwrap().iter().cloned());
    host_join(&fake, &r1, &alice.user_id, answer);

    let refused = join_via(&seq, &alice, &r1.room_id, &fake.name).await;
    assert_error(&refused, 502, "M_UNKNOWN", "a send_join answer with another room's events");
    assert!(refused.1["error"].as_str().unwrap().contains("another room"), "{}", refused.1);
    assert_eq!(fake.requests_to(SEND_JOIN).len(), 1, "the answer was asked for and refused");

    // Nothing of R1 was stored: nobody looks joined.
    for user in [&alice, &bob] {
        assert_eq!(joined_rooms(&seq, user).await, std::slice::from_ref(&r2), "{}", user.user_id);
        let sync = sync_once(&seq.server, user, None).await;
        assert!(sync["rooms"]["join"].get(&r1.room_id).is_none(), "{sync}");
        assert!(sync["rooms"]["join"].get(&r2).is_some(), "{sync}");
    }
    let (status, members) =
        seq.server.get(&room_path(&r1.room_id, "/joined_members"), Some(&alice.token)).await;
    assert_eq!(status, 403, "{members}");

    // R2 goes on: alice talks, bob reads, the members are the three.
    let (status, sent) = seq
        .server
        .put(&room_path(&r2, "/send/m.room.message/a1"), Some(&alice.token), text("still here"))
        .await;
    assert_eq!(status, 200, "{sent}");
    event_id_of(&sent);
    assert_eq!(message_bodies(&seq, &bob, &r2).await, ["still here"]);
    let mut members = vec![alice.user_id.clone(), bob.user_id.clone(), mallory];
    members.sort_unstable();
    assert_eq!(joined_members(&seq, &bob, &r2).await, members);
}

/// Room versions 5 on: a server's key must have been valid when the event
/// says it was made. A retired key still verifies what it signed while in
/// use, not later; a current key the validity we hold does not cover is
/// asked for again with `minimum_valid_until_ts` (and the longer validity
/// the server now publishes is used), but what lies past it is refused.
async fn signing_keys_are_judged_at_the_events_time(backend: Backend) {
    use base64::Engine;
    const HOUR: i64 = 3_600_000;
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let now = now_ms();
    // The fake's previous key, retired an hour ago; its current one valid for an hour.
    let old = ("ed25519:old".to_owned(), ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]));
    let old_public =
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(old.1.verifying_key().to_bytes());
    fake.set_old_verify_keys(json!({ &old.0: { "key": old_public, "expired_ts": now - HOUR } }));
    fake.set_key_validity(now + HOUR);
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let (mut room, _, _) = joined_with_history(&seq, &fake, &alice).await;

    // A message of mallory's made at `ts`, signed with `key`, offered in
    // transaction `txn`: the per-PDU answer (a taken one joins the room's events).
    let mut offer = async |txn: &str, body: &str, ts: i64, key: &(String, ed25519_dalek::SigningKey)| {
        let mut event = room.draft("m.room.message", None, &mallory, text(body));
        event["origin_server_ts"] = json!(ts);
        let id = pdu::sign(&mut event, &fake.name, &key.0, &key.1);
        let (status, results) = fake.send_txn(&seq, txn, &[&event]).await;
        assert_eq!(status, 200, "{results}");
        let result = results["pdus"][&id].clone();
        if result == json!({}) {
            room.push(event);
        }
        result
    };

    // Signed with the old key while it was in use.
    assert_eq!(offer("t1", "old key in use", now - 2 * HOUR, &old).await, json!({}));
    // Past the validity seqline holds: asked again; the fake now says three hours.
    fake.set_key_validity(now + 3 * HOUR);
    let later = now + 2 * HOUR;
    assert_eq!(offer("t2", "current key, extended", later, &fake.key).await, json!({}));
    let asked = fake.requests_to(&format!("/_matrix/key/v2/query/{}", fake.name));
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].query.contains(&format!("minimum_valid_until_ts={later}")), "{}", asked[0].query);
    // Past even that, and the old key after it was retired: refused.
    let refused = offer("t3", "current key, too late", now + 5 * HOUR, &fake.key).await;
    assert!(refused["error"].as_str().unwrap_or_default().contains("signature"), "{refused}");
    let refused = offer("t4", "old key, retired", now, &old).await;
    assert!(refused["error"].as_str().unwrap_or_default().contains("signature"), "{refused}");

    assert_eq!(
        message_bodies(&seq, &alice, &room.room_id).await,
        ["old key in use", "current key, extended"]
    );
}

/// A server sending, again and again, an event whose prev event it will not
/// give (no /get_missing_events, no /state_ids): seqline asks for the state
/// across the hole once, then not again for an hour; each try is refused
/// and nothing is placed.
async fn a_hole_nobody_can_fill_is_not_asked_about_again_and_again(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let (mut room, _, _) = joined_with_history(&seq, &fake, &alice).await;
    let (_, _never_sent) = fake.add(&mut room, "m.room.message", None, &mallory, text("never sent"));
    let (orphan_id, orphan) = fake.add(&mut room, "m.room.message", None, &mallory, text("orphan"));
    for txn in ["h1", "h2", "h3"] {
        let (status, results) = fake.send_txn(&seq, txn, &[&orphan]).await;
        assert_eq!(status, 200, "{results}");
        assert!(results["pdus"][&orphan_id]["error"].is_string(), "{results}");
    }
    let state_ids = format!("/_matrix/federation/v1/state_ids/{}", room.room_id);
    assert_eq!(fake.requests_to(&state_ids).len(), 1, "{:?}", fake.requests());
    assert!(message_bodies(&seq, &alice, &room.room_id).await.iter().all(|b| b != "orphan"));
}

/// Every page of `/messages` in `dir` (`b` or `f`) as `user`, limit 10,
/// the messages' bodies in the room's order.
async fn all_bodies(seq: &FedServer, user: &User, room: &str, dir: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut from = String::new();
    for _ in 0..20 {
        let path = format!("/messages?dir={dir}&limit=10{from}");
        let (status, page) = seq.server.get(&room_path(room, &path), Some(&user.token)).await;
        assert_eq!(status, 200, "{page}");
        let mut chunk = complement_tests::api::message_bodies(&page);
        if dir == "f" {
            chunk.reverse();
        }
        match dir {
            "b" => bodies.splice(0..0, chunk),
            _ => bodies.splice(bodies.len().., chunk),
        };
        let Some(end) = page["end"].as_str() else { return bodies };
        from = format!("&from={}", enc(end));
    }
    panic!("more than 20 pages: {bodies:?}");
}

/// The same event by two roads: mallory's message from before alice's join
/// is pushed late through /send (placed where it arrives), then comes again
/// in the /backfill answer when alice pages back past her join. It is
/// stored once, where it was placed first, and alice reads it once.
async fn an_event_by_send_and_by_backfill_is_stored_once(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let (room, before_alice, state_ids) = joined_with_history(&seq, &fake, &alice).await;
    let r = room.room_id.clone();
    let id = pdu::event_id(&before_alice);
    fake.answer(
        "GET",
        &format!("/_matrix/federation/v1/state_ids/{r}"),
        200,
        json!({ "pdu_ids": state_ids, "auth_chain_ids": state_ids }),
    );
    let (status, results) = fake.send_txn(&seq, "late", &[&before_alice]).await;
    assert_eq!((status, &results["pdus"][&id]), (200, &json!({})), "{results}");
    let bodies = all_bodies(&seq, &alice, &r, "b").await;
    assert!(!fake.requests_to(&format!("/_matrix/federation/v1/backfill/{r}")).is_empty(), "paged back to A");
    assert_eq!(bodies, ["before alice"], "{}", seq.server.log());
    assert_eq!(all_bodies(&seq, &alice, &r, "f").await, ["before alice"]);
    let (status, event) =
        seq.server.get(&room_path(&r, &format!("/event/{}", enc(&id))), Some(&alice.token)).await;
    assert_eq!((status, event["content"]["body"].as_str()), (200, Some("before alice")), "{event}");
}

/// Scripts `fake`'s /backfill in `room` to give, for `v` = one of `events`,
/// that event and at most `per_page - 1` before it (newest first), as a
/// server with a small page would; anything else is left to the default.
fn backfill_pages(fake: &FakeServer, room: &str, events: Vec<Value>, per_page: usize) {
    let answer_from = fake.name.clone();
    fake.answer_with("GET", &format!("/_matrix/federation/v1/backfill/{room}"), move |r: &Received| {
        let at = events.iter().position(|e| r.query.contains(&format!("v={}", enc(&pdu::event_id(e)))))?;
        let page: Vec<&Value> = events[at.saturating_sub(per_page - 1)..=at].iter().rev().collect();
        Some((200, json!({ "origin": answer_from, "origin_server_ts": now_ms(), "pdus": page })))
    });
}

/// A hole in the middle of the line: after an outage the fake sends one
/// event whose 30 parents it will not list (/get_missing_events unknown);
/// it is placed across the hole with the state the fake tells. Nothing is
/// fetched until alice pages back into the hole: then /backfill fills it,
/// 10 events a request, the hole moving down each time, and alice reads
/// every message in order, also through /event and /context.
async fn a_hole_in_the_middle_is_filled_when_someone_pages_into_it(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let mallory = fake.user_id("mallory");
    let (mut room, before_alice, _) = joined_with_history(&seq, &fake, &alice).await;
    let r = room.room_id.clone();
    let (heard_id, heard) = fake.add(&mut room, "m.room.message", None, &mallory, text("before the outage"));
    let (status, results) = fake.send_txn(&seq, "before-outage", &[&heard]).await;
    assert_eq!((status, &results["pdus"][&heard_id]), (200, &json!({})), "{results}");
    let mut hole = Vec::new();
    for i in 1..=30 {
        hole.push(fake.add(&mut room, "m.room.message", None, &mallory, text(&format!("hole {i}"))).1);
    }
    let state_ids: Vec<String> = room.state_events().iter().map(pdu::event_id).collect();
    let (top_id, top) = fake.add(&mut room, "m.room.message", None, &mallory, text("after the hole"));
    fake.answer(
        "GET",
        &format!("/_matrix/federation/v1/state_ids/{r}"),
        200,
        json!({ "pdu_ids": state_ids, "auth_chain_ids": state_ids }),
    );
    backfill_pages(&fake, &r, hole.clone(), 10);

    let (status, results) = fake.send_txn(&seq, "after-outage", &[&top]).await;
    assert_eq!((status, &results["pdus"][&top_id]), (200, &json!({})), "{results}");
    let backfill = format!("/_matrix/federation/v1/backfill/{r}");
    assert!(fake.requests_to(&backfill).is_empty(), "nothing is fetched before a reader comes");

    let mut expected: Vec<String> = vec!["before the outage".into()];
    expected.extend((1..=30).map(|i| format!("hole {i}")));
    expected.push("after the hole".into());
    assert_eq!(all_bodies(&seq, &alice, &r, "b").await, expected, "{}", seq.server.log());
    // Three requests into the hole, from its top down; then the history
    // below the bottom (before alice's join, which the fake does not give).
    let bottom = format!("v={}", enc(&pdu::event_id(&before_alice)));
    let into_hole = || -> Vec<String> {
        let asked = fake.requests_to(&backfill).into_iter().map(|r| r.query);
        asked.filter(|q| !q.contains(&bottom)).collect()
    };
    let asked = into_hole();
    assert_eq!(asked.len(), 3, "{asked:?}");
    for (n, query) in asked.iter().enumerate() {
        let v = pdu::event_id(&hole[29 - 10 * n]);
        assert!(query.contains(&format!("v={}", enc(&v))), "{n}: {query}");
    }
    // Filled for good: paging again asks nothing of it, forwards reads the same.
    assert_eq!(all_bodies(&seq, &alice, &r, "f").await, expected);
    assert_eq!(into_hole().len(), 3);
    let h15 = pdu::event_id(&hole[14]);
    let (status, event) =
        seq.server.get(&room_path(&r, &format!("/event/{}", enc(&h15))), Some(&alice.token)).await;
    assert_eq!((status, event["content"]["body"].as_str()), (200, Some("hole 15")), "{event}");
    let (status, context) =
        seq.server.get(&room_path(&r, &format!("/context/{}?limit=2", enc(&h15))), Some(&alice.token)).await;
    assert_eq!(status, 200, "{context}");
    let bodies = |list: &Value| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(bodies(&context["events_before"]), ["hole 14"], "{context}");
    assert_eq!(bodies(&context["events_after"]), ["hole 16"], "{context}");
    // alice can still talk; her message follows the one after the hole
    // (and the last one heard before the outage: backfilled events move
    // no forward extremity, as on Synapse).
    let (status, sent) = seq
        .server
        .put(&room_path(&r, "/send/m.room.message/after-fill"), Some(&alice.token), text("still here"))
        .await;
    assert_eq!(status, 200, "{sent}");
    let event = fake.event(&seq, sent["event_id"].as_str().unwrap()).await;
    let prevs: Vec<&str> =
        event["prev_events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(prevs.contains(&top_id.as_str()), "{prevs:?}");
}

/// A kick in the hole: mallory kicks alice while seqline cannot hear, and
/// talks on. The event after the hole, placed with the state the fake
/// tells, ends alice's stay (she is no longer joined). When bob, who
/// stays, pages forwards into the hole, it is filled: bob reads every
/// message, alice only those before her kick, through /messages and /event.
async fn a_kick_in_a_hole_ends_the_stay_where_it_was(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let bob = seq.server.register("bob", "pw").await;
    let mallory = fake.user_id("mallory");
    let (mut room, _, _) = joined_with_history(&seq, &fake, &alice).await;
    let r = room.room_id.clone();
    host_join(&fake, &room, &bob.user_id, room.send_join_answer(&[&fake.name]));
    let (status, joined) = join_via(&seq, &bob, &r, &fake.name).await;
    assert_eq!(status, 200, "{joined}");
    room.push(fake.requests_to(&format!("{SEND_JOIN}{r}/")).last().unwrap().body.clone());

    let state_before: Vec<String> = room.state_events().iter().map(pdu::event_id).collect();
    let mut hole = Vec::new();
    for i in 1..=5 {
        hole.push(fake.add(&mut room, "m.room.message", None, &mallory, text(&format!("hole {i}"))).1);
    }
    let (kick_id, kick) = fake.add(
        &mut room,
        "m.room.member",
        Some(&alice.user_id),
        &mallory,
        json!({ "membership": "leave" }),
    );
    hole.push(kick);
    for i in 7..=10 {
        hole.push(fake.add(&mut room, "m.room.message", None, &mallory, text(&format!("hole {i}"))).1);
    }
    let state_after: Vec<String> = room.state_events().iter().map(pdu::event_id).collect();
    let mut auth_chain = state_before.clone();
    auth_chain.extend(state_after.iter().cloned());
    let (top_id, top) = fake.add(&mut room, "m.room.message", None, &mallory, text("after the hole"));
    let top_query = format!("event_id={}", enc(&top_id));
    fake.answer_with("GET", &format!("/_matrix/federation/v1/state_ids/{r}"), move |req: &Received| {
        let ids = if req.query.contains(&top_query) { &state_after } else { &state_before };
        Some((200, json!({ "pdu_ids": ids, "auth_chain_ids": auth_chain })))
    });
    backfill_pages(&fake, &r, hole.clone(), 100);
    for event in &hole {
        let path = format!("/_matrix/federation/v1/event/{}", pdu::event_id(event));
        fake.answer("GET", &path, 200, pdus_answer(&fake, &[event]));
    }

    let sync = |user: &User, since: Option<String>| {
        let query = since.map_or(String::new(), |s| format!("&since={}", enc(&s)));
        let path = format!("{V3}/sync?timeout=0{query}");
        let token = user.token.clone();
        let server = &seq.server;
        async move {
            let (status, body) = server.get(&path, Some(&token)).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let bob_since = sync(&bob, None).await["next_batch"].as_str().map(str::to_owned);
    let (status, results) = fake.send_txn(&seq, "after-outage", &[&top]).await;
    assert_eq!((status, &results["pdus"][&top_id]), (200, &json!({})), "{results}");
    assert!(joined_rooms(&seq, &alice).await.is_empty());
    // Bob's next sync: the kick lies in the hole, in no timeline he is sent,
    // yet alice's membership moved; the state section says so.
    let body = sync(&bob, bob_since).await;
    let joined = &body["rooms"]["join"][&r];
    let kicked = joined["state"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(joined["timeline"]["events"].as_array().into_iter().flatten())
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == alice.user_id.as_str());
    assert_eq!(kicked.map(|e| &e["event_id"]), Some(&json!(kick_id)), "{body}");
    assert_eq!(kicked.map(|e| &e["content"]["membership"]), Some(&json!("leave")), "{body}");
    let (got, _) =
        seq.server.get(&room_path(&r, &format!("/event/{}", enc(&top_id))), Some(&alice.token)).await;
    assert_eq!(got, 404, "the event after the hole is past her stay");
    assert_eq!(joined_members(&seq, &bob, &r).await.len(), 2, "bob and mallory");

    let bob_reads = all_bodies(&seq, &bob, &r, "f").await;
    let mut everything: Vec<String> = (1..=10).filter(|i| *i != 6).map(|i| format!("hole {i}")).collect();
    everything.push("after the hole".into());
    assert_eq!(bob_reads, everything, "{}", seq.server.log());
    let alice_reads = all_bodies(&seq, &alice, &r, "b").await;
    assert_eq!(alice_reads, everything[..5], "alice reads up to her kick");
    for (id, status) in [(pdu::event_id(&hole[2]), 200), (kick_id, 200), (pdu::event_id(&hole[7]), 404)] {
        let (got, body) =
            seq.server.get(&room_path(&r, &format!("/event/{}", enc(&id))), Some(&alice.token)).await;
        assert_eq!(got, status, "{id}: {body}");
    }
    let (got, _) =
        seq.server.get(&room_path(&r, &format!("/event/{}", enc(&top_id))), Some(&alice.token)).await;
    assert_eq!(got, 404, "the event after the hole is past her stay");
    for user in [&alice, &bob] {
        reads_agree(&seq.server, user, &r).await;
    }
}
