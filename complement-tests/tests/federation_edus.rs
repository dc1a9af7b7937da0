//! EDUs across servers: typing notices (start and stop), read receipts
//! (threaded too; private ones never leave) and presence, between two
//! seqline servers and between seqline and Synapse, both ways. And as a
//! hostile server sends them (a `FakeServer` in the room): EDUs for another
//! server's users, for rooms its user is not in, for users sharing no room,
//! from a server the room's ACL denies; none changes what anyone sees, and
//! none fails the transaction.

use complement_tests::api::{V3, create_room, enc, eventually, room_path};
use complement_tests::backend_tests;
use complement_tests::fake::FakeServer;
use complement_tests::federation::{FedServer, now_ms};
use complement_tests::harness::{Backend, User};
use complement_tests::side::Side;
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    typing_receipts_and_presence_cross_between_seqline_servers,
    typing_receipts_and_presence_cross_with_synapse,
    edus_a_server_may_not_send_change_nothing,
    to_device_messages_cross_once,
    a_server_cannot_send_to_device_messages_for_others,
    device_list_updates_reach_the_users_who_share_a_room,
    our_device_changes_reach_the_other_server,
    a_typing_notice_for_a_server_that_is_down_is_not_kept,
    to_device_messages_for_a_server_that_is_down_are_bounded,
    a_transaction_is_sent_again_as_it_was,
);

/// A user's /sync, followed incrementally (Synapse answers a repeated
/// request from a cache, so polling one position shows nothing new).
struct Watch<'a> {
    side: &'a Side<'a>,
    since: String,
}

impl<'a> Watch<'a> {
    async fn new(side: &'a Side<'a>) -> Self {
        let (status, body) = side.get(&format!("{V3}/sync")).await;
        assert_eq!(status, 200, "{body}");
        Self { side, since: body["next_batch"].as_str().unwrap_or_default().to_owned() }
    }

    /// Follows the /sync until `found` finds something in a response.
    async fn until<T>(&mut self, what: &str, found: impl Fn(&Value) -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let path = format!("{V3}/sync?timeout=500&since={}", enc(&self.since));
            let (status, body) = self.side.get(&path).await;
            assert_eq!(status, 200, "{body}");
            self.since = body["next_batch"].as_str().unwrap_or_default().to_owned();
            if let Some(value) = found(&body) {
                return value;
            }
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        }
    }

    /// Follows the /sync until `room`'s typing notice names exactly `users`.
    async fn typing(&mut self, room: &str, users: &[&str]) {
        let what = format!("{users:?} typing");
        self.until(&what, |sync| {
            let typing = ephemeral(sync, room, "m.typing")?;
            let ids: Vec<&str> =
                typing["content"]["user_ids"].as_array()?.iter().filter_map(Value::as_str).collect();
            (ids == users).then_some(())
        })
        .await;
    }

    /// Follows the /sync until `user`'s public receipt on `event` shows;
    /// answers its data. No private receipt of `user`'s may show on the way.
    async fn receipt(&mut self, room: &str, event: &str, user: &str) -> Value {
        self.until("a receipt", |sync| {
            let receipts = ephemeral(sync, room, "m.receipt")?;
            for by_type in receipts["content"].as_object().into_iter().flat_map(|m| m.values()) {
                assert!(
                    by_type["m.read.private"][user].is_null(),
                    "{user}'s private receipt left: {receipts}"
                );
            }
            let data = &receipts["content"][event]["m.read"][user];
            data.is_object().then(|| data.clone())
        })
        .await
    }
}

/// The room's ephemeral event of `kind` in `sync`.
fn ephemeral<'a>(sync: &'a Value, room: &str, kind: &str) -> Option<&'a Value> {
    sync["rooms"]["join"][room]["ephemeral"]["events"].as_array()?.iter().find(|e| e["type"] == kind)
}

/// `user`'s presence in `sync`, if it tells.
fn presence_in(sync: &Value, user: &str) -> Option<Value> {
    let events = sync["presence"]["events"].as_array()?;
    events.iter().find(|e| e["sender"] == user).map(|e| e["content"].clone())
}

async fn type_in(side: &Side<'_>, room: &str, user: &str, typing: bool) {
    let path = room_path(room, &format!("/typing/{}", enc(user)));
    let (status, body) = side.put(&path, json!({ "typing": typing, "timeout": 30_000 })).await;
    assert_eq!(status, 200, "{body}");
}

async fn receipt(side: &Side<'_>, room: &str, kind: &str, event: &str, body: Value) {
    let path = room_path(room, &format!("/receipt/{kind}/{}", enc(event)));
    let (status, answer) = side.post(&path, body).await;
    assert_eq!(status, 200, "{answer}");
}

/// `a` and `b` share `room` (`b` joined it); each types, stops, reads the
/// other's message (`b` in a thread, and privately first, which `a` must
/// never see).
async fn exchange(a: &Side<'_>, a_id: &str, b: &Side<'_>, b_id: &str, room: &str) {
    let (mut wa, mut wb) = (Watch::new(a).await, Watch::new(b).await);
    // Typing, both ways, start and stop.
    type_in(a, room, a_id, true).await;
    wb.typing(room, &[a_id]).await;
    type_in(a, room, a_id, false).await;
    wb.typing(room, &[]).await;
    type_in(b, room, b_id, true).await;
    wa.typing(room, &[b_id]).await;
    type_in(b, room, b_id, false).await;
    wa.typing(room, &[]).await;

    // Receipts: a private one first, then a threaded public one; a sees the
    // public one and never the private one.
    let first = a.say(room, "r1", "read me").await;
    let second = a.say(room, "r2", "and me").await;
    wb.until("a's messages at b's", |sync| {
        let events = sync["rooms"]["join"][room]["timeline"]["events"].as_array()?;
        events.iter().any(|e| e["event_id"] == second.as_str()).then_some(())
    })
    .await;
    receipt(b, room, "m.read.private", &first, json!({})).await;
    receipt(b, room, "m.read", &second, json!({ "thread_id": "main" })).await;
    let data = wa.receipt(room, &second, b_id).await;
    assert_eq!(data["thread_id"], "main", "{data}");
    // And back: a's unthreaded receipt on b's message.
    let reply = b.say(room, "r3", "read mine").await;
    wa.until("b's message at a's", |sync| {
        let events = sync["rooms"]["join"][room]["timeline"]["events"].as_array()?;
        events.iter().any(|e| e["event_id"] == reply.as_str()).then_some(())
    })
    .await;
    receipt(a, room, "m.read", &reply, json!({})).await;
    let data = wb.receipt(room, &reply, a_id).await;
    assert!(data.get("thread_id").is_none(), "{data}");
}

/// Two seqline servers: typing, receipts and presence both ways.
async fn typing_receipts_and_presence_cross_between_seqline_servers(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let (alice_id, bob_id) = (a.user_id("alice"), b.user_id("bob"));
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    let (sa, sb) = (Side::Seqline(&a, &alice), Side::Seqline(&b, &bob));
    let (status, body) =
        sb.post(&format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name)), json!({})).await;
    assert_eq!(status, 200, "{body}");
    exchange(&sa, &alice_id, &sb, &bob_id, &room).await;

    // Presence: bob goes away with a message; alice sees it, and back.
    let (mut wa, mut wb) = (Watch::new(&sa).await, Watch::new(&sb).await);
    presence_reaches(&sb, &bob_id, &mut wa, "unavailable", "lunch").await;
    presence_reaches(&sa, &alice_id, &mut wb, "online", "here").await;
}

/// `from` (user `from_id`) sets `presence` with `message`; `to` sees both.
async fn presence_reaches(from: &Side<'_>, from_id: &str, to: &mut Watch<'_>, presence: &str, message: &str) {
    let path = format!("{V3}/presence/{}/status", enc(from_id));
    let (status, body) = from.put(&path, json!({ "presence": presence, "status_msg": message })).await;
    assert_eq!(status, 200, "{body}");
    to.until("the presence", |sync| {
        presence_in(sync, from_id).filter(|p| p["presence"] == presence && p["status_msg"] == message)
    })
    .await;
}

/// seqline and Synapse: typing, receipts and presence both ways.
async fn typing_receipts_and_presence_cross_with_synapse(backend: Backend) {
    let (a, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = a.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let (alice_id, bob_id) = (a.user_id("alice"), syn.user_id("bob"));
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    let (sa, sb) = (Side::Seqline(&a, &alice), Side::Synapse(&syn, bob.token.as_str()));
    let (status, body) =
        sb.post(&format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name)), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    exchange(&sa, &alice_id, &sb, &bob_id, &room).await;
    let (mut wa, mut wb) = (Watch::new(&sa).await, Watch::new(&sb).await);
    presence_reaches(&sb, &bob_id, &mut wa, "unavailable", "lunch").await;
    presence_reaches(&sa, &alice_id, &mut wb, "online", "here").await;
}

/// A typing EDU from `fake`.
fn typing_edu(room: &str, user: &str) -> Value {
    json!({ "edu_type": "m.typing", "content": { "room_id": room, "user_id": user, "typing": true } })
}

/// The fake's mallory joins alice's room, then the fake sends EDUs it may
/// not: typing for alice (another server's user), typing in a room mallory
/// is not in, a receipt for alice, presence for a user of a third server,
/// garbage; the transaction itself is taken (200). Then the room's server
/// ACL denies the fake, and its typing notice (a stop, after a start it was
/// let in with) is dropped. A last
/// rightful notice shows the ones before it were processed: alice sees
/// exactly mallory typing, and no forged receipt or presence.
async fn edus_a_server_may_not_send_change_nothing(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let room = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    let other = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    let mallory = fake.user_id("mallory");
    fake.join(&seq, &room, &mallory).await;
    let sa = Side::Seqline(&seq, &alice);
    let said = sa.say(&room, "m1", "hello").await;
    let edus = [
        typing_edu(&room, &alice_id),
        typing_edu(&other, &mallory),
        json!({ "edu_type": "m.receipt", "content": { room.as_str(): { "m.read": {
            alice_id.as_str(): { "event_ids": [said], "data": { "ts": 1 } } } } } }),
        json!({ "edu_type": "m.presence", "content": { "push": [
            { "user_id": "@carol:third.example", "presence": "online", "last_active_ago": 0 },
            { "user_id": alice_id, "presence": "offline", "last_active_ago": 0 },
        ] } }),
        json!({ "edu_type": "m.typing", "content": "not an object" }),
        json!("not an edu"),
    ];
    let body = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": edus });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/bad-edus", Some(&body)).await;
    assert_eq!((status, &answer["pdus"]), (200, &json!({})), "{answer}");

    // The ACL turns the fake away: its typing notice is dropped, also
    // right after one it was let in with (the room as that one found it is
    // not the room now).
    // (Every server here is 127.0.0.1: an ACL matches names without ports.)
    let let_in = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": [typing_edu(&room, &mallory)] });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/let-in", Some(&let_in)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(typing_of(&initial_sync(&sa).await, &room), std::slice::from_ref(&mallory));
    let acl = json!({ "allow": ["*"], "deny": ["127.0.0.1"] });
    let (status, set) = sa.put(&room_path(&room, "/state/m.room.server_acl/"), acl).await;
    assert_eq!(status, 200, "{set}");
    let stop = json!({ "edu_type": "m.typing", "content": { "room_id": room, "user_id": mallory, "typing": false } });
    let denied = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": [stop] });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/denied", Some(&denied)).await;
    assert_eq!(status, 200, "{answer}");
    let sync = initial_sync(&sa).await;
    assert_eq!(typing_of(&sync, &room), std::slice::from_ref(&mallory), "the denied stop was taken");
    let (status, _) = sa.put(&room_path(&room, "/state/m.room.server_acl/"), json!({ "allow": ["*"] })).await;
    assert_eq!(status, 200);

    let good = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": [typing_edu(&room, &mallory)] });
    // Sent twice (a retry: typing notices alone are not remembered).
    for _ in 0..2 {
        let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/good", Some(&good)).await;
        assert_eq!(status, 200, "{answer}");
    }
    // seqline takes a transaction's EDUs before it answers.
    let sync = initial_sync(&sa).await;
    assert_eq!(typing_of(&sync, &room), std::slice::from_ref(&mallory));
    assert_eq!(typing_of(&sync, &other), Vec::<String>::new());
    let receipts = ephemeral(&sync, &room, "m.receipt").cloned().unwrap_or(json!({}));
    assert!(receipts["content"][&said]["m.read"][&alice_id].is_null(), "{receipts}");
    assert!(presence_in(&sync, "@carol:third.example").is_none(), "{sync}");
    assert_ne!(presence_in(&sync, &alice_id).map(|p| p["presence"].clone()), Some(json!("offline")));
}

/// `side`'s initial /sync (seqline's: it keeps no answer cache).
async fn initial_sync(side: &Side<'_>) -> Value {
    let (status, body) = side.get(&format!("{V3}/sync")).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Who is typing in `room` by `sync`, sorted.
fn typing_of(sync: &Value, room: &str) -> Vec<String> {
    let mut users: Vec<String> = ephemeral(sync, room, "m.typing")
        .and_then(|e| e["content"]["user_ids"].as_array())
        .map(|ids| ids.iter().filter_map(|u| u.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    users.sort_unstable();
    users
}

/// `user`'s to-device messages from a /sync followed from `since` until
/// `count` have come: (sender, type, content), and the position after.
async fn to_device_until(seq: &FedServer, user: &User, since: &str, count: usize) -> (Vec<Value>, String) {
    let mut got = Vec::new();
    let mut since = since.to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while got.len() < count {
        assert!(std::time::Instant::now() < deadline, "timed out: {got:?}");
        let path = format!("{V3}/sync?timeout=500&since={}", enc(&since));
        let (status, body) = seq.server.get(&path, Some(&user.token)).await;
        assert_eq!(status, 200, "{body}");
        since = body["next_batch"].as_str().unwrap_or_default().to_owned();
        for event in body["to_device"]["events"].as_array().into_iter().flatten() {
            got.push(json!([event["sender"], event["type"], event["content"]]));
        }
    }
    (got, since)
}

async fn send_to_device(seq: &FedServer, user: &User, txn: &str, to: &str, device: &str, n: i64) {
    let path = format!("{V3}/sendToDevice/m.test.ping/{txn}");
    let body = json!({ "messages": { to: { device: { "n": n } } } });
    let (status, answer) = seq.server.put(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
}

/// alice (on A) sends to-device messages to bob's device (on B): each
/// arrives once, also when alice repeats a transaction id, and one sent
/// while B is down arrives once B is back (after A restarted too).
async fn to_device_messages_cross_once(backend: Backend) {
    let (mut a, mut b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let (alice_id, bob_id) = (a.user_id("alice"), b.user_id("bob"));
    let (status, first) = b.server.get(&format!("{V3}/sync"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{first}");
    let since = first["next_batch"].as_str().unwrap().to_owned();

    send_to_device(&a, &alice, "t1", &bob_id, &bob.device_id, 1).await;
    send_to_device(&a, &alice, "t1", &bob_id, &bob.device_id, 1).await;
    send_to_device(&a, &alice, "t2", &bob_id, "*", 2).await;
    let (got, since) = to_device_until(&b, &bob, &since, 2).await;
    let ping = |n: i64| json!([alice_id, "m.test.ping", { "n": n }]);
    assert_eq!(got, [ping(1), ping(2)]);

    b.server.stop().await;
    send_to_device(&a, &alice, "t3", &bob_id, &bob.device_id, 3).await;
    a.server.restart().await;
    b.server.start_again().await;
    send_to_device(&a, &alice, "t4", &bob_id, &bob.device_id, 4).await;
    let (got, _) = to_device_until(&b, &bob, &since, 2).await;
    assert_eq!(got, [ping(3), ping(4)]);
}

/// A server sending a to-device EDU for another server's user, or the same
/// message twice (one `message_id`; and the whole transaction twice), or
/// for a device of nobody: bob gets the one rightful message once.
async fn a_server_cannot_send_to_device_messages_for_others(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let bob = seq.server.register("bob", "pw").await;
    let bob_id = seq.user_id("bob");
    let (status, first) = seq.server.get(&format!("{V3}/sync"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{first}");
    let since = first["next_batch"].as_str().unwrap().to_owned();
    let edu = |sender: &str, id: &str, n: i64| {
        json!({ "edu_type": "m.direct_to_device", "content": {
            "sender": sender, "type": "m.test.ping", "message_id": id,
            "messages": { bob_id.as_str(): { bob.device_id.as_str(): { "n": n } } },
        } })
    };
    let mallory = fake.user_id("mallory");
    let forged = format!("@eve:{}", seq.name);
    let edus = [
        edu(&forged, "m1", 1),
        edu(&mallory, "m2", 2),
        edu(&mallory, "m2", 3),
        edu("@carol:third.example", "m4", 4),
    ];
    let body = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": edus });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/td1", Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    // Sent again (an answer lost on the way): not remembered, as it holds
    // to-device EDUs alone, and still it changes nothing.
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/td1", Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    let again = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": [edu(&mallory, "m2", 5), edu(&mallory, "m5", 6)] });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/td2", Some(&again)).await;
    assert_eq!(status, 200, "{answer}");
    let (got, _) = to_device_until(&seq, &bob, &since, 2).await;
    assert_eq!(
        got,
        [json!([mallory, "m.test.ping", { "n": 2 }]), json!([mallory, "m.test.ping", { "n": 6 }])]
    );
}

/// The fake's mallory shares a room with alice; the fake says mallory's
/// devices and cross-signing keys changed, and also, which it may not,
/// those of alice's neighbour eve (a user of the server under test), of a
/// third server's user and of a user of its own who shares no room. alice's
/// /sync lists mallory under `device_lists.changed`, and no one else.
async fn device_list_updates_reach_the_users_who_share_a_room(backend: Backend) {
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let room = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    let mallory = fake.user_id("mallory");
    fake.join(&seq, &room, &mallory).await;
    let (status, first) = seq.server.get(&format!("{V3}/sync"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{first}");
    let since = first["next_batch"].as_str().unwrap().to_owned();

    let update = |user: &str, stream: i64| {
        json!({ "edu_type": "m.device_list_update", "content": {
            "user_id": user, "device_id": "DEV", "stream_id": stream, "prev_id": [stream - 1], "deleted": false,
        } })
    };
    let edus = [
        update(&format!("@eve:{}", seq.name), 2),
        update("@carol:third.example", 3),
        update(&fake.user_id("nobody"), 4),
        json!({ "edu_type": "m.signing_key_update", "content": { "user_id": fake.user_id("nobody") } }),
        update(&mallory, 5),
    ];
    let body = json!({ "origin": fake.name, "origin_server_ts": now_ms(), "pdus": [], "edus": edus });
    let (status, answer) = fake.call(&seq, "PUT", "/_matrix/federation/v1/send/dl1", Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    let path = format!("{V3}/sync?since={}", enc(&since));
    let (status, sync) = seq.server.get(&path, Some(&alice.token)).await;
    assert_eq!(status, 200, "{sync}");
    assert_eq!(sync["device_lists"]["changed"], json!([mallory]), "{sync}");
    let path =
        format!("{V3}/keys/changes?from={}&to={}", enc(&since), enc(sync["next_batch"].as_str().unwrap()));
    let (status, changes) = seq.server.get(&path, Some(&alice.token)).await;
    assert_eq!((status, &changes["changed"]), (200, &json!([mallory])), "{changes}");
}

/// bob (on B) follows his /sync until alice (on A) is listed under
/// `device_lists.changed`.
async fn until_changed(watch: &mut Watch<'_>, alice: &str, what: &str) {
    watch
        .until(what, |sync| {
            let changed = sync["device_lists"]["changed"].as_array()?;
            changed.iter().any(|u| u == alice).then_some(())
        })
        .await;
}

/// alice on A shares a room with bob on B. Each change of alice's devices
/// or keys reaches B as an EDU and bob's /sync lists alice under
/// `device_lists.changed`: her device keys uploaded, a device renamed, her
/// cross-signing keys uploaded, a device deleted.
async fn our_device_changes_reach_the_other_server(backend: Backend) {
    use complement_tests::e2ee::{Key, cross_signing_key, device_keys};
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let alice_id = a.user_id("alice");
    let room = create_room(&a.server, &alice, json!({ "preset": "public_chat" })).await;
    let (sa, sb) = (Side::Seqline(&a, &alice), Side::Seqline(&b, &bob));
    let (status, body) =
        sb.post(&format!("{V3}/join/{}?server_name={}", enc(&room), enc(&a.name)), json!({})).await;
    assert_eq!(status, 200, "{body}");
    // bob joining lists alice once: what follows must come from the EDUs.
    let mut wb = Watch::new(&sb).await;

    let key = Key::new("alice-device");
    let upload = json!({ "device_keys": device_keys(&alice_id, &alice.device_id, &key) });
    let (status, body) = sa.post(&format!("{V3}/keys/upload"), upload).await;
    assert_eq!(status, 200, "{body}");
    until_changed(&mut wb, &alice_id, "alice's device keys").await;

    let path = format!("{V3}/devices/{}", enc(&alice.device_id));
    let (status, body) = sa.put(&path, json!({ "display_name": "alice's phone" })).await;
    assert_eq!(status, 200, "{body}");
    until_changed(&mut wb, &alice_id, "alice's device renamed").await;

    let master = Key::new("alice-master");
    let self_signing = Key::new("alice-self");
    let user_signing = Key::new("alice-user");
    let body = json!({
        "master_key": cross_signing_key(&alice_id, "master", &master, None),
        "self_signing_key": cross_signing_key(&alice_id, "self_signing", &self_signing, Some(&master)),
        "user_signing_key": cross_signing_key(&alice_id, "user_signing", &user_signing, Some(&master)),
        "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "pw" },
    });
    let (status, answer) = sa.post(&format!("{V3}/keys/device_signing/upload"), body).await;
    assert_eq!(status, 200, "{answer}");
    until_changed(&mut wb, &alice_id, "alice's cross-signing keys").await;

    let second = a.server.login("alice", "pw").await;
    let body = json!({
        "devices": [second.device_id],
        "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "pw" },
    });
    let (status, answer) = sa.post(&format!("{V3}/delete_devices"), body).await;
    assert_eq!(status, 200, "{answer}");
    until_changed(&mut wb, &alice_id, "alice's device deleted").await;
}

/// Whether a received `/send` body carries an `m.typing` EDU.
fn carries_typing(body: &Value) -> bool {
    body["edus"].as_array().into_iter().flatten().any(|edu| edu["edu_type"] == "m.typing")
}

/// alice types while the fake, in her room, answers no transaction: the
/// notice is tried and kept in memory only. seqline restarts, the fake
/// answers again, and alice says something: the message reaches the fake,
/// the notice (stale by now) never does.
async fn a_typing_notice_for_a_server_that_is_down_is_not_kept(backend: Backend) {
    const SEND: &str = "/_matrix/federation/v1/send/";
    let (mut seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let room = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    fake.join(&seq, &room, &fake.user_id("mallory")).await;
    fake.answer("PUT", SEND, 503, json!({ "errcode": "M_UNKNOWN", "error": "down for the test" }));
    type_in(&Side::Seqline(&seq, &alice), &room, &alice_id, true).await;
    eventually("the typing notice tried at the fake", || async {
        fake.requests_to(SEND).iter().any(|r| carries_typing(&r.body)).then_some(())
    })
    .await;

    seq.server.restart().await;
    fake.answer("PUT", SEND, 200, json!({ "pdus": {} }));
    let tried = fake.requests().len();
    // The fake calls: seqline forgets its backoff and tries it at once.
    let profile = format!("/_matrix/federation/v1/query/profile?user_id={}", enc(&alice_id));
    let (status, answer) = fake.call(&seq, "GET", &profile, None).await;
    assert_ne!(status, 401, "{answer}");
    Side::Seqline(&seq, &alice).say(&room, "after", "back again").await;
    let sent_after =
        || fake.requests().into_iter().skip(tried).filter(|r| r.method == "PUT" && r.path.starts_with(SEND));
    eventually("alice's message at the fake", || async {
        let pdus: Vec<Value> =
            sent_after().flat_map(|r| r.body["pdus"].as_array().cloned().unwrap_or_default()).collect();
        pdus.iter().any(|pdu| pdu["content"]["body"] == "back again").then_some(())
    })
    .await;
    let typing: Vec<Value> = sent_after().filter(|r| carries_typing(&r.body)).map(|r| r.body).collect();
    assert!(typing.is_empty(), "a typing notice from before the restart was sent: {typing:?}");
}

/// eve sends to-device messages to mallory, a user of the fake, which
/// answers no transaction: 1000 wait for it, eve's next request is refused
/// (429) and nothing of it kept, while carol's still goes. Once the fake
/// answers, each waiting message reaches it, eve's refused one never, and
/// eve may send again.
async fn to_device_messages_for_a_server_that_is_down_are_bounded(backend: Backend) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const SEND: &str = "/_matrix/federation/v1/send/";
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let eve = seq.server.register("eve", "pw").await;
    let carol = seq.server.register("carol", "pw").await;
    let (eve_id, carol_id, mallory) = (seq.user_id("eve"), seq.user_id("carol"), fake.user_id("mallory"));
    let (up, taken) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::<Value>::new())));
    let (up_in, taken_in) = (up.clone(), taken.clone());
    fake.answer_with("PUT", SEND, move |request| {
        if !up_in.load(Ordering::SeqCst) {
            return Some((503, json!({ "errcode": "M_UNKNOWN", "error": "down for the test" })));
        }
        let edus = request.body["edus"].as_array().cloned().unwrap_or_default();
        taken_in.lock().unwrap().extend(edus);
        Some((200, json!({ "pdus": {} })))
    });
    for n in 0..1000 {
        send_to_device(&seq, &eve, &format!("e{n}"), &mallory, "PHONE", n).await;
    }
    let over = json!({ "messages": { mallory.as_str(): { "PHONE": { "n": 1000 } } } });
    let (status, answer) =
        seq.server.put(&format!("{V3}/sendToDevice/m.test.ping/over"), Some(&eve.token), over).await;
    assert_eq!((status, answer["errcode"].as_str()), (429, Some("M_LIMIT_EXCEEDED")), "{answer}");
    send_to_device(&seq, &carol, "c1", &mallory, "PHONE", 5000).await;

    up.store(true, Ordering::SeqCst);
    // The fake calls: seqline forgets its backoff and tries it at once.
    let profile = format!("/_matrix/federation/v1/query/profile?user_id={}", enc(&eve_id));
    let (status, answer) = fake.call(&seq, "GET", &profile, None).await;
    assert_eq!(status, 200, "{answer}");
    // (sender, n) of each message_id that reached the fake.
    let reached = || {
        let mut by_id = std::collections::BTreeMap::new();
        for edu in taken.lock().unwrap().iter().filter(|e| e["edu_type"] == "m.direct_to_device") {
            let c = &edu["content"];
            let n = c["messages"][mallory.as_str()]["PHONE"]["n"].as_i64();
            by_id.insert(c["message_id"].as_str().unwrap_or_default().to_owned(), (c["sender"].clone(), n));
        }
        let mut got: Vec<(Value, Option<i64>)> = by_id.into_values().collect();
        got.sort_by_key(|(sender, n)| (sender.to_string(), *n));
        got
    };
    let got = eventually("every waiting message at the fake", || async {
        let got = reached();
        (got.len() >= 1001).then_some(got)
    })
    .await;
    let mut want: Vec<(Value, Option<i64>)> = vec![(json!(carol_id), Some(5000))];
    want.extend((0..1000).map(|n| (json!(eve_id), Some(n))));
    want.sort_by_key(|(sender, n)| (sender.to_string(), *n));
    assert_eq!(got, want);
    send_to_device(&seq, &eve, "after", &mallory, "PHONE", 1001).await;
}

/// The fake takes alice's first transaction of events but answers 500 (an
/// answer lost on the way). alice goes on speaking; the fake calls, so
/// seqline tries again at once: the failed transaction goes again under
/// its id with exactly its events, what she said meanwhile under other
/// ids, every id always with the same events, and each event arrives.
async fn a_transaction_is_sent_again_as_it_was(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const SEND: &str = "/_matrix/federation/v1/send/";
    let (seq, fake) = tokio::join!(FedServer::start(&backend), FakeServer::start());
    let alice = seq.server.register("alice", "pw").await;
    let alice_id = seq.user_id("alice");
    let room = create_room(&seq.server, &alice, json!({ "preset": "public_chat" })).await;
    fake.join(&seq, &room, &fake.user_id("mallory")).await;
    let failed = Arc::new(AtomicBool::new(false));
    let failed_in = failed.clone();
    fake.answer_with("PUT", SEND, move |request| {
        let events = request.body["pdus"].as_array().is_some_and(|p| !p.is_empty());
        (events && !failed_in.swap(true, Ordering::SeqCst))
            .then(|| (500, json!({ "errcode": "M_UNKNOWN", "error": "the answer was lost" })))
    });
    let side = Side::Seqline(&seq, &alice);
    side.say(&room, "m0", "m0").await;
    eventually("the first transaction refused", || async { failed.load(Ordering::SeqCst).then_some(()) })
        .await;
    for body in ["m1", "m2"] {
        side.say(&room, body, body).await;
    }
    let profile = format!("/_matrix/federation/v1/query/profile?user_id={}", enc(&alice_id));
    let (status, answer) = fake.call(&seq, "GET", &profile, None).await;
    assert_eq!(status, 200, "{answer}");
    // (txn id, the bodies of its events) of each transaction with events.
    let sent = || -> Vec<(String, Vec<String>)> {
        fake.requests_to(SEND)
            .into_iter()
            .filter(|r| r.method == "PUT")
            .map(|r| {
                let bodies = r.body["pdus"].as_array().into_iter().flatten();
                let bodies =
                    bodies.filter_map(|p| p["content"]["body"].as_str().map(str::to_owned)).collect();
                (r.path[SEND.len()..].to_owned(), bodies)
            })
            .filter(|(_, bodies): &(String, Vec<String>)| !bodies.is_empty())
            .collect()
    };
    let sent = eventually("every event at the fake", || async {
        let sent = sent();
        let all: Vec<&String> = sent.iter().flat_map(|(_, b)| b).collect();
        ["m0", "m1", "m2"].iter().all(|m| all.iter().any(|b| b == m)).then_some(sent)
    })
    .await;
    let (first_id, first) = sent[0].clone();
    assert_eq!(first.first().map(String::as_str), Some("m0"), "{sent:?}");
    let again: Vec<&(String, Vec<String>)> = sent.iter().filter(|(id, _)| *id == first_id).collect();
    assert!(again.len() >= 2, "the failed transaction was not sent again: {sent:?}");
    for (id, bodies) in &sent {
        let same = sent.iter().filter(|(other, _)| other == id).all(|(_, b)| b == bodies);
        assert!(same, "{id} carried different events: {sent:?}");
    }
    // In order, each once, across the transactions (the retry aside).
    let mut seen: Vec<String> = Vec::new();
    let mut ids: Vec<&String> = Vec::new();
    for (id, bodies) in &sent {
        if !ids.contains(&id) {
            ids.push(id);
            seen.extend(bodies.iter().cloned());
        }
    }
    assert_eq!(seen, ["m0", "m1", "m2"], "{sent:?}");
}
