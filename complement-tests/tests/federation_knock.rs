//! Knocking across servers. The resident side: make_knock gives a template
//! only for rooms whose version knows knocking and whose join rule takes
//! knocks, send_knock checks the knock like send_join (the origin's user,
//! signatures, the auth rules), places it where local members see it, and
//! answers the room's stripped state. The knocking side: a local user's
//! `/knock` on a room of another server goes make_knock, sign, send_knock,
//! and the room shows under `rooms.knock` in their `/sync`; the host's
//! invite moves it to `invite`, the host's kick to `leave`.

use complement_tests::acting::Acting;
use complement_tests::api::{V3, assert_error, create_room, enc, eventually, room_path, sync_once};
use complement_tests::backend_tests;
use complement_tests::federation::FedServer;
use complement_tests::harness::{Backend, Server, User};
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    a_remote_knock_is_seen_and_accepted_by_invite,
    a_remote_knock_refused_by_kick_shows_as_left,
    remote_knocks_are_checked,
    a_synapse_user_knocks_on_a_seqline_room,
    a_seqline_user_knocks_on_a_synapse_room,
);

/// A room of `owner` that takes knocks (`version`: the server's default when `None`).
async fn knock_room(server: &Server, owner: &User, version: Option<&str>) -> String {
    let mut body = json!({
        "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" } }],
    });
    if let Some(version) = version {
        body["room_version"] = json!(version);
    }
    create_room(server, owner, body).await
}

/// The membership content of `user` in `room` as `viewer` sees it (404 when none).
async fn member_content(server: &Server, viewer: &User, room: &str, user: &str) -> (u16, Value) {
    let path = room_path(room, &format!("/state/m.room.member/{}", enc(user)));
    server.get(&path, Some(&viewer.token)).await
}

fn knock_path(room: &str, via: &FedServer) -> String {
    format!("{V3}/knock/{}?via={}", enc(room), enc(&via.name))
}

/// The stripped event of `kind` (and `state_key`) among `events`.
fn stripped<'a>(events: &'a Value, kind: &str, state_key: &str) -> &'a Value {
    events
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == kind && e["state_key"] == state_key)
        .unwrap_or_else(|| panic!("no {kind} {state_key} in {events}"))
}

/// Bob of B knocks on alice's room on A: A places the knock (alice sees
/// it, with his reason), bob's /sync shows the room under `knock` with its
/// stripped state; alice's invite moves it to `invite`, and bob joins.
async fn a_remote_knock_is_seen_and_accepted_by_invite(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = knock_room(&a.server, &alice, None).await;
    let before = sync_once(&b.server, &bob, None).await;
    let since = before["next_batch"].as_str().unwrap().to_owned();

    let (status, body) =
        b.server.post(&knock_path(&room, &a), Some(&bob.token), json!({ "reason": "let me in" })).await;
    assert_eq!((status, body["room_id"].as_str()), (200, Some(room.as_str())), "{body}\n{}", a.server.log());

    let (status, content) = member_content(&a.server, &alice, &room, &bob.user_id).await;
    assert_eq!(status, 200, "{content}");
    assert_eq!((&content["membership"], &content["reason"]), (&json!("knock"), &json!("let me in")));

    let synced = sync_once(&b.server, &bob, Some(&since)).await;
    let events = &synced["rooms"]["knock"][&room]["knock_state"]["events"];
    assert_eq!(stripped(events, "m.room.join_rules", "")["content"]["join_rule"], "knock", "{synced}");
    assert_eq!(stripped(events, "m.room.member", &bob.user_id)["content"]["membership"], "knock");
    assert!(synced["rooms"]["join"].get(&room).is_none(), "{synced}");
    let since = synced["next_batch"].as_str().unwrap().to_owned();

    let invite = json!({ "user_id": bob.user_id });
    let (status, body) = a.server.post(&room_path(&room, "/invite"), Some(&alice.token), invite).await;
    assert_eq!(status, 200, "{body}");
    let invited = eventually("the invite on B", || async {
        let synced = sync_once(&b.server, &bob, Some(&since)).await;
        synced["rooms"]["invite"].get(&room).is_some().then_some(synced)
    })
    .await;
    assert!(invited["rooms"]["knock"].get(&room).is_none(), "{invited}");

    let (status, body) = b.server.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, content) = member_content(&a.server, &alice, &room, &bob.user_id).await;
    assert_eq!((status, &content["membership"]), (200, &json!("join")), "{content}");
}

/// Alice kicks bob's knock: bob's /sync moves the room to `leave` (a
/// third server's leave for him does not). His next knock he withdraws
/// himself (a leave through A).
async fn a_remote_knock_refused_by_kick_shows_as_left(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let alice = a.server.register("alice", "pw").await;
    let bob = b.server.register("bob", "pw").await;
    let room = knock_room(&a.server, &alice, None).await;
    let (status, body) = b.server.post(&knock_path(&room, &a), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let synced = sync_once(&b.server, &bob, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_some(), "{synced}");
    let since = synced["next_batch"].as_str().unwrap().to_owned();

    // A third server's leave for bob (it neither took the knock nor is bob's)
    // ends nothing.
    let c = FedServer::start(&backend).await;
    let acting = Acting::new(&b, &c);
    let mut leave = json!({
        "type": "m.room.member", "room_id": room, "sender": c.user_id("mallory"), "state_key": bob.user_id,
        "content": { "membership": "leave" }, "prev_events": [], "auth_events": [], "depth": 9,
        "origin_server_ts": complement_tests::federation::now_ms(),
    });
    let leave_id = acting.sign(&mut leave);
    let (status, results) = acting.send_txn("t1", &[&leave]).await;
    assert_eq!(status, 200, "{results}");
    assert!(results["pdus"][&leave_id]["error"].is_string(), "{results}");
    let synced = sync_once(&b.server, &bob, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_some(), "the knock stands: {synced}");

    let kick = json!({ "user_id": bob.user_id, "reason": "no" });
    let (status, body) = a.server.post(&room_path(&room, "/kick"), Some(&alice.token), kick).await;
    assert_eq!(status, 200, "{body}");
    let left = eventually("the refusal on B", || async {
        let synced = sync_once(&b.server, &bob, Some(&since)).await;
        synced["rooms"]["leave"].get(&room).is_some().then_some(synced)
    })
    .await;
    assert!(left["rooms"]["knock"].get(&room).is_none(), "{left}");
    let synced = sync_once(&b.server, &bob, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_none(), "no knock after a fresh sync: {synced}");

    // He knocks again and withdraws: A has his leave.
    let (status, body) = b.server.post(&knock_path(&room, &a), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, content) = member_content(&a.server, &alice, &room, &bob.user_id).await;
    assert_eq!(content["membership"], "knock", "{content}");
    let (status, body) = b.server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, content) = member_content(&a.server, &alice, &room, &bob.user_id).await;
    assert_eq!(content["membership"], "leave", "{content}");
    let synced = sync_once(&b.server, &bob, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");
}

/// Acting as server B toward A: make_knock and send_knock refuse what may
/// not knock, and nothing of it is stored; a proper knock is placed and
/// answered with the room's stripped state.
async fn remote_knocks_are_checked(backend: Backend) {
    let (a, b) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend));
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let (bob, carol) = (b.user_id("bob"), b.user_id("carol"));
    let room = knock_room(&a.server, &alice, None).await;
    let invite_only = create_room(&a.server, &alice, json!({ "preset": "private_chat" })).await;
    let old = create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": "6" })).await;
    let make_knock = |room: &str, user: &str, ver: &str| {
        format!("/_matrix/federation/v1/make_knock/{}/{}?ver={ver}", enc(room), enc(user))
    };

    let other = format!("@dave:{}", a.name);
    assert_error(
        &acting.call("GET", &make_knock(&room, &other, "12"), None).await,
        403,
        "M_FORBIDDEN",
        "A's user",
    );
    let answer = acting.call("GET", &make_knock(&room, &bob, "11"), None).await;
    assert_error(&answer, 400, "M_INCOMPATIBLE_ROOM_VERSION", "a version B lacks");
    let answer = acting.call("GET", &make_knock(&old, &bob, "6"), None).await;
    assert_error(&answer, 400, "M_INCOMPATIBLE_ROOM_VERSION", "a version without knocking");
    let answer = acting.call("GET", &make_knock(&invite_only, &bob, "12"), None).await;
    assert_error(&answer, 403, "M_FORBIDDEN", "an invite-only room");

    let (status, template) = acting.call("GET", &make_knock(&room, &bob, "12"), None).await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(template["room_version"], "12");
    let mut knock = template["event"].clone();
    assert_eq!(knock["content"], json!({ "membership": "knock" }), "{knock}");
    assert_eq!(knock["state_key"], bob.as_str());
    let send_knock =
        |room: &str, id: &str| format!("/_matrix/federation/v1/send_knock/{}/{}", enc(room), enc(id));

    // Carol's knock on the invite-only room (the same template, retargeted):
    // refused by the auth rules.
    let mut carols = knock.clone();
    carols["sender"] = json!(carol);
    carols["state_key"] = json!(carol);
    carols["room_id"] = json!(invite_only);
    let carols_id = acting.sign(&mut carols);
    let answer = acting.call("PUT", &send_knock(&invite_only, &carols_id), Some(&carols)).await;
    assert!(matches!(answer.0, 400 | 403), "{answer:?}");
    // A join sent as a knock; a knock under another id; a forged signature.
    let mut join = knock.clone();
    join["content"]["membership"] = json!("join");
    let join_id = acting.sign(&mut join);
    let answer = acting.call("PUT", &send_knock(&room, &join_id), Some(&join)).await;
    assert_error(&answer, 400, "M_BAD_JSON", "a join through send_knock");
    let knock_id = acting.sign(&mut knock);
    let answer = acting.call("PUT", &send_knock(&room, &join_id), Some(&knock)).await;
    assert_error(&answer, 400, "M_BAD_JSON", "another id");
    let mut forged = knock.clone();
    forged["content"]["reason"] = json!("changed after signing, signature kept");
    forged["hashes"] = json!({ "sha256": "AAAA" });
    let forged_id = complement_tests::pdu::event_id(&forged);
    let answer = acting.call("PUT", &send_knock(&room, &forged_id), Some(&forged)).await;
    assert_error(&answer, 400, "M_INVALID_SIGNATURE", "forged");
    for (room, id) in [(&invite_only, &carols_id), (&room, &join_id), (&room, &forged_id)] {
        let path = room_path(room, &format!("/event/{}", enc(id)));
        assert_eq!(a.server.get(&path, Some(&alice.token)).await.0, 404, "{id} stored");
    }
    assert_eq!(member_content(&a.server, &alice, &room, &bob).await.0, 404);

    let (status, answer) = acting.call("PUT", &send_knock(&room, &knock_id), Some(&knock)).await;
    assert_eq!(status, 200, "{answer}\n{}", a.server.log());
    let state = &answer["knock_room_state"];
    assert_eq!(stripped(state, "m.room.join_rules", "")["content"]["join_rule"], "knock", "{answer}");
    assert_eq!(stripped(state, "m.room.create", "")["sender"], alice.user_id.as_str());
    let (status, content) = member_content(&a.server, &alice, &room, &bob).await;
    assert_eq!((status, &content["membership"]), (200, &json!("knock")), "{content}");
    let synced = sync_once(&a.server, &alice, None).await;
    let timeline = &synced["rooms"]["join"][&room]["timeline"]["events"];
    assert!(
        timeline.as_array().unwrap().iter().any(|e| e["event_id"] == knock_id.as_str()),
        "alice sees the knock: {timeline}"
    );
}

/// A Synapse /sync that does not wait. Synapse keeps the answer to a sync
/// request for two minutes and answers the same request with it: each one
/// here differs in its timeout (`fresh`, a millisecond more each time).
async fn synapse_sync(syn: &Synapse, user: &User) -> Value {
    static FRESH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let fresh = FRESH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (status, synced) = syn.get(&format!("{V3}/sync?timeout={fresh}"), Some(&user.token)).await;
    assert_eq!(status, 200, "{synced}");
    synced
}

/// The `knock_state` events of `room` in a /sync answer.
fn knock_state<'a>(synced: &'a Value, room: &str) -> &'a Value {
    &synced["rooms"]["knock"][room]["knock_state"]["events"]
}

/// Synapse's bob knocks on alice's seqline room: seqline places the knock
/// (alice sees it), Synapse shows bob the room under `knock`; alice's invite
/// reaches him and he joins.
async fn a_synapse_user_knocks_on_a_seqline_room(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let alice = seq.server.register("alice", "pw").await;
    let bob = syn.register("bob", "pw").await;
    let room = knock_room(&seq.server, &alice, None).await;

    let path = format!("{V3}/knock/{}?via={}", enc(&room), enc(&seq.name));
    let (status, body) = syn.post(&path, Some(&bob.token), json!({ "reason": "hello" })).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    let (status, content) = member_content(&seq.server, &alice, &room, &bob.user_id).await;
    assert_eq!((status, &content["membership"], &content["reason"]), (200, &json!("knock"), &json!("hello")));
    let synced = synapse_sync(&syn, &bob).await;
    let events = knock_state(&synced, &room);
    assert_eq!(stripped(events, "m.room.join_rules", "")["content"]["join_rule"], "knock", "{synced}");

    let invite = json!({ "user_id": bob.user_id });
    let (status, body) = seq.server.post(&room_path(&room, "/invite"), Some(&alice.token), invite).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    eventually("the invite on Synapse", || async {
        let synced = synapse_sync(&syn, &bob).await;
        synced["rooms"]["invite"].get(&room).is_some().then_some(())
    })
    .await;
    let (status, body) = syn.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    eventually("bob's join on seqline", || async {
        let (status, content) = member_content(&seq.server, &alice, &room, &bob.user_id).await;
        (status == 200 && content["membership"] == "join").then_some(())
    })
    .await;
}

/// Seqline's bob knocks on carol's Synapse room: Synapse has the knock, bob
/// sees the room under `knock`; carol's invite moves it to `invite` and he
/// joins; a second knock he withdraws, and the room moves to `leave`.
async fn a_seqline_user_knocks_on_a_synapse_room(backend: Backend) {
    let (seq, syn) = tokio::join!(FedServer::start(&backend), Synapse::start_with(SynapseOptions::default()));
    let bob = seq.server.register("bob", "pw").await;
    let carol = syn.register("carol", "pw").await;
    let create = json!({
        "room_version": "10",
        "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" } }],
    });
    let (status, created) = syn.post(&format!("{V3}/createRoom"), Some(&carol.token), create.clone()).await;
    assert_eq!(status, 200, "{created}");
    let room = created["room_id"].as_str().unwrap().to_owned();
    let knock_path = format!("{V3}/knock/{}?via={}", enc(&room), enc(&syn.name));
    let on_synapse = |room: &str| {
        let path = room_path(room, &format!("/state/m.room.member/{}", enc(&bob.user_id)));
        let (syn, carol) = (&syn, &carol);
        async move { syn.get(&path, Some(&carol.token)).await }
    };

    let (status, body) = seq.server.post(&knock_path, Some(&bob.token), json!({ "reason": "hi" })).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    let (status, content) = on_synapse(&room).await;
    assert_eq!((status, &content["membership"], &content["reason"]), (200, &json!("knock"), &json!("hi")));
    let synced = sync_once(&seq.server, &bob, None).await;
    let events = knock_state(&synced, &room);
    assert_eq!(stripped(events, "m.room.join_rules", "")["content"]["join_rule"], "knock", "{synced}");
    assert_eq!(stripped(events, "m.room.member", &bob.user_id)["content"]["membership"], "knock");
    let since = synced["next_batch"].as_str().unwrap().to_owned();

    let invite = json!({ "user_id": bob.user_id });
    let (status, body) = syn.post(&room_path(&room, "/invite"), Some(&carol.token), invite).await;
    assert_eq!(status, 200, "{body}");
    let invited = eventually("carol's invite on seqline", || async {
        let synced = sync_once(&seq.server, &bob, Some(&since)).await;
        synced["rooms"]["invite"].get(&room).is_some().then_some(synced)
    })
    .await;
    assert!(invited["rooms"]["knock"].get(&room).is_none(), "{invited}");
    let (status, body) = seq.server.post(&room_path(&room, "/join"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", seq.server.log());
    let (status, content) = on_synapse(&room).await;
    assert_eq!((status, &content["membership"]), (200, &json!("join")), "{content}");

    // Another room: the knock withdrawn (a leave through Synapse). Synapse
    // does not tell the knocker's server of a refusal (a kick of a knocker
    // goes to the servers in the room only), so that is not tried here.
    let (status, created) = syn.post(&format!("{V3}/createRoom"), Some(&carol.token), create).await;
    assert_eq!(status, 200, "{created}");
    let other = created["room_id"].as_str().unwrap().to_owned();
    let path = format!("{V3}/knock/{}?via={}", enc(&other), enc(&syn.name));
    let (status, body) = seq.server.post(&path, Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let synced = sync_once(&seq.server, &bob, None).await;
    assert!(synced["rooms"]["knock"].get(&other).is_some(), "{synced}");
    let since = synced["next_batch"].as_str().unwrap().to_owned();
    let (status, body) = seq.server.post(&room_path(&other, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, content) = on_synapse(&other).await;
    assert_eq!((status, &content["membership"]), (200, &json!("leave")), "{content}");
    let synced = sync_once(&seq.server, &bob, Some(&since)).await;
    assert!(synced["rooms"]["leave"].get(&other).is_some(), "{synced}");
}
