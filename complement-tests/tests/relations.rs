//! Relations, threads and bundled aggregations (client-server API v1.16,
//! "Forming relationships between events", "Threading", "Event
//! replacements"): `/relations` by relation and event type, paged both ways
//! and recursing; `/threads` with `include=all|participated`, paged; the
//! `unsigned.m.relations` every served event carries. And as an attacker: a
//! parent in another room, children in another room, a reader who may see
//! only part of a thread, malformed parameters.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    relations_filter_by_type_and_page_both_ways,
    relations_to_a_sync_token_and_encrypted_children,
    recurse_follows_three_levels,
    threads_ordered_by_latest_reply_and_paged,
    bundles_in_messages_sync_event_and_context,
    edits_bundle_only_valid_replacements,
    parent_in_another_room_is_not_found,
    partial_readers_see_only_their_part_of_a_thread,
    malformed_parameters_are_invalid_param,
    threaded_receipts_count_per_thread,
    threaded_and_unthreaded_receipts_both_reach_sync,
);

const V1: &str = "/_matrix/client/v1";

async fn send(server: &Server, user: &User, room: &str, kind: &str, content: Value) -> String {
    let txn = format!("t{}", rand_suffix());
    let path = room_path(room, &format!("/send/{}/{}", enc(kind), enc(&txn)));
    let (status, body) = server.put(&path, Some(&user.token), content).await;
    assert_eq!(status, 200, "{body}");
    event_id_of(&body)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn reply(body: &str, rel_type: &str, parent: &str) -> Value {
    json!({ "msgtype": "m.text", "body": body, "m.relates_to": { "rel_type": rel_type, "event_id": parent } })
}

fn edit(body: &str, original: &str) -> Value {
    json!({
        "msgtype": "m.text",
        "body": format!("* {body}"),
        "m.new_content": { "msgtype": "m.text", "body": body },
        "m.relates_to": { "rel_type": "m.replace", "event_id": original },
    })
}

/// `GET /_matrix/client/v1/rooms/{room}/relations/{event}{rest}`.
async fn relations(server: &Server, user: &User, room: &str, event: &str, rest: &str) -> (u16, Value) {
    let path = format!("{V1}/rooms/{}/relations/{}{rest}", enc(room), enc(event));
    server.get(&path, Some(&user.token)).await
}

async fn relations_ok(server: &Server, user: &User, room: &str, event: &str, rest: &str) -> Value {
    let response = relations(server, user, room, event, rest).await;
    assert_eq!(response.0, 200, "{rest}: {}", response.1);
    response.1
}

async fn threads(server: &Server, user: &User, room: &str, query: &str) -> (u16, Value) {
    server.get(&format!("{V1}/rooms/{}/threads{query}", enc(room)), Some(&user.token)).await
}

fn ids(page: &Value, key: &str) -> Vec<String> {
    page[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {page}"))
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Walks every page of `/relations` from the first, `limit` at a time.
async fn walk(server: &Server, user: &User, room: &str, event: &str, query: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut from: Option<String> = None;
    loop {
        let rest = match &from {
            Some(f) => format!("{query}&from={}", enc(f)),
            None => query.to_owned(),
        };
        let page = relations_ok(server, user, room, event, &rest).await;
        pages.push(ids(&page, "chunk"));
        match page["next_batch"].as_str() {
            Some(next) => from = Some(next.to_owned()),
            None => return pages,
        }
        assert!(pages.len() < 20, "paging does not end");
    }
}

async fn get_event(server: &Server, user: &User, room: &str, event: &str) -> (u16, Value) {
    server.get(&room_path(room, &format!("/event/{}", enc(event))), Some(&user.token)).await
}

async fn messages(server: &Server, user: &User, room: &str) -> Value {
    let (status, page) = server.get(&room_path(room, "/messages?dir=b&limit=100"), Some(&user.token)).await;
    assert_eq!(status, 200, "{page}");
    page
}

fn find<'a>(events: &'a Value, id: &str) -> &'a Value {
    events
        .as_array()
        .and_then(|a| a.iter().find(|e| e["event_id"] == id))
        .unwrap_or_else(|| panic!("{id} not in {events}"))
}

async fn public_room(server: &Server, user: &User) -> String {
    create_room(server, user, json!({ "preset": "public_chat" })).await
}

async fn relations_filter_by_type_and_page_both_ways(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = public_room(&server, &alice).await;
    let root = send(&server, &alice, &room, "m.room.message", text("root")).await;
    let thread = send(&server, &alice, &room, "m.room.message", reply("in thread", "m.thread", &root)).await;
    let dummy = send(
        &server,
        &alice,
        &room,
        "m.dummy",
        json!({ "m.relates_to": { "rel_type": "m.thread", "event_id": root } }),
    )
    .await;
    let edited = send(&server, &alice, &room, "m.room.message", edit("edited root", &root)).await;
    // A reply (m.in_reply_to alone) is no relation with a rel_type.
    send(&server, &alice, &room, "m.room.message", json!({ "msgtype": "m.text", "body": "re", "m.relates_to": { "m.in_reply_to": { "event_id": root } } })).await;

    let all = relations_ok(&server, &alice, &room, &root, "").await;
    assert_eq!(ids(&all, "chunk"), [edited.clone(), dummy.clone(), thread.clone()], "newest first: {all}");
    assert!(all.get("next_batch").is_none() && all.get("recursion_depth").is_none(), "{all}");
    let by_rel = relations_ok(&server, &alice, &room, &root, "/m.thread").await;
    assert_eq!(ids(&by_rel, "chunk"), [dummy.clone(), thread.clone()]);
    let by_type = relations_ok(&server, &alice, &room, &root, "/m.thread/m.room.message").await;
    assert_eq!(ids(&by_type, "chunk"), std::slice::from_ref(&thread));
    let none = relations_ok(&server, &alice, &room, &root, "/m.annotation").await;
    assert_eq!(ids(&none, "chunk"), Vec::<String>::new());

    // Ten replies of a second thread, paged three at a time both ways.
    let root2 = send(&server, &alice, &room, "m.room.message", text("root 2")).await;
    let mut replies = Vec::new();
    for i in 0..10 {
        replies.push(
            send(&server, &alice, &room, "m.room.message", reply(&format!("r{i}"), "m.thread", &root2)).await,
        );
    }
    let back = walk(&server, &alice, &room, &root2, "?limit=3").await;
    let newest_first: Vec<String> = replies.iter().rev().cloned().collect();
    assert_eq!(back, [&newest_first[0..3], &newest_first[3..6], &newest_first[6..9], &newest_first[9..]]);
    let forward = walk(&server, &alice, &room, &root2, "?limit=3&dir=f").await;
    assert_eq!(forward, [&replies[0..3], &replies[3..6], &replies[6..9], &replies[9..]]);
    // The default page is five; prev_batch is the `from` given.
    let first = relations_ok(&server, &alice, &room, &root2, "").await;
    assert_eq!(ids(&first, "chunk"), newest_first[..5]);
    let next = first["next_batch"].as_str().expect("next_batch").to_owned();
    let second = relations_ok(&server, &alice, &room, &root2, &format!("?from={}", enc(&next))).await;
    assert_eq!(ids(&second, "chunk"), newest_first[5..]);
    assert_eq!(second["prev_batch"], next.as_str());
    // `to` bounds a page: forwards from the start up to the third reply.
    let third_back = relations_ok(&server, &alice, &room, &root2, "?dir=b&limit=8").await;
    let to = third_back["next_batch"].as_str().expect("next_batch");
    let upto = relations_ok(&server, &alice, &room, &root2, &format!("?dir=f&to={}", enc(to))).await;
    assert_eq!(ids(&upto, "chunk"), replies[..2]);
}

async fn relations_to_a_sync_token_and_encrypted_children(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = public_room(&server, &alice).await;
    let root = send(&server, &alice, &room, "m.room.message", text("root")).await;
    let early: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(
                send(&server, &alice, &room, "m.room.message", reply(&format!("e{i}"), "m.thread", &root))
                    .await,
            );
        }
        v
    };
    let token = sync_once(&server, &alice, None).await["next_batch"].as_str().expect("next_batch").to_owned();
    let late = send(&server, &alice, &room, "m.room.message", reply("late", "m.thread", &root)).await;
    // A sync token is a position too: forwards up to it holds the early ones.
    let upto = relations_ok(&server, &alice, &room, &root, &format!("?dir=f&to={}", enc(&token))).await;
    assert_eq!(ids(&upto, "chunk"), early);
    let after = relations_ok(&server, &alice, &room, &root, &format!("?dir=f&from={}", enc(&token))).await;
    assert_eq!(ids(&after, "chunk"), std::slice::from_ref(&late));

    // An encrypted child matches its outer type, as the spec says.
    let sealed = send(
        &server,
        &alice,
        &room,
        "m.room.encrypted",
        json!({
            "algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEn", "sender_key": "k",
            "device_id": "D", "session_id": "s",
            "m.relates_to": { "rel_type": "m.thread", "event_id": root },
        }),
    )
    .await;
    let encrypted = relations_ok(&server, &alice, &room, &root, "/m.thread/m.room.encrypted").await;
    assert_eq!(ids(&encrypted, "chunk"), [sealed]);
    let plain = relations_ok(&server, &alice, &room, &root, "/m.thread/m.room.message?limit=10").await;
    assert_eq!(ids(&plain, "chunk").len(), 4, "{plain}");
}

async fn recurse_follows_three_levels(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = public_room(&server, &alice).await;
    let root = send(&server, &alice, &room, "m.room.message", text("root")).await;
    let a = send(&server, &alice, &room, "m.room.message", reply("a", "m.thread", &root)).await;
    let b = send(&server, &alice, &room, "m.room.message", reply("b", "m.reference", &a)).await;
    let c = send(&server, &alice, &room, "m.room.message", reply("c", "m.reference", &b)).await;
    let d = send(&server, &alice, &room, "m.room.message", reply("d", "m.reference", &c)).await;

    let direct = relations_ok(&server, &alice, &room, &root, "?limit=10").await;
    assert_eq!(ids(&direct, "chunk"), std::slice::from_ref(&a));
    let deep = relations_ok(&server, &alice, &room, &root, "?limit=10&recurse=true").await;
    assert_eq!(ids(&deep, "chunk"), [c.clone(), b.clone(), a.clone()], "three levels, not {d}: {deep}");
    assert_eq!(deep["recursion_depth"], 3);
    // Filters apply at every level.
    let refs = relations_ok(&server, &alice, &room, &root, "/m.reference?limit=10&recurse=true").await;
    assert_eq!(ids(&refs, "chunk"), [c.clone(), b.clone()]);
    // Paged like the rest.
    let pages = walk(&server, &alice, &room, &root, "?limit=2&recurse=true&dir=f").await;
    assert_eq!(pages, [vec![a, b], vec![c]]);
}

async fn threads_ordered_by_latest_reply_and_paged(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &alice).await;
    join(&server, &bob, &room).await;
    let t1 = send(&server, &alice, &room, "m.room.message", text("thread 1")).await;
    let t2 = send(&server, &alice, &room, "m.room.message", text("thread 2")).await;
    let t3 = send(&server, &bob, &room, "m.room.message", text("thread 3")).await;
    let r1 = send(&server, &alice, &room, "m.room.message", reply("r1", "m.thread", &t1)).await;
    let r2 = send(&server, &alice, &room, "m.room.message", reply("r2", "m.thread", &t2)).await;
    let r3 = send(&server, &alice, &room, "m.room.message", reply("r3", "m.thread", &t3)).await;
    // No thread: a root without replies, and an edit.
    send(&server, &alice, &room, "m.room.message", edit("x", &t1)).await;

    let latest = |page: &Value| -> Vec<(String, String)> {
        page["chunk"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let latest = e["unsigned"]["m.relations"]["m.thread"]["latest_event"]["event_id"].as_str();
                (e["event_id"].as_str().unwrap_or_default().to_owned(), latest.unwrap_or_default().to_owned())
            })
            .collect()
    };
    let (status, all) = threads(&server, &alice, &room, "").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(latest(&all), [(t3.clone(), r3.clone()), (t2.clone(), r2.clone()), (t1.clone(), r1.clone())]);
    // A new reply moves its thread to the front.
    let r1b = send(&server, &bob, &room, "m.room.message", reply("r1b", "m.thread", &t1)).await;
    let (_, all) = threads(&server, &alice, &room, "?include=all").await;
    assert_eq!(latest(&all), [(t1.clone(), r1b.clone()), (t3.clone(), r3.clone()), (t2.clone(), r2.clone())]);
    let bundle = &all["chunk"][0]["unsigned"]["m.relations"]["m.thread"];
    assert_eq!(
        (bundle["count"].as_i64(), bundle["current_user_participated"].as_bool()),
        (Some(2), Some(true))
    );

    // Paged one at a time.
    let mut seen = Vec::new();
    let mut from = String::new();
    loop {
        let (status, page) = threads(&server, &alice, &room, &format!("?limit=1{from}")).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(latest(&page));
        match page["next_batch"].as_str() {
            Some(next) => from = format!("&from={}", enc(next)),
            None => break,
        }
        assert!(seen.len() < 10, "paging does not end");
    }
    assert_eq!(seen, [(t1.clone(), r1b.clone()), (t3.clone(), r3.clone()), (t2.clone(), r2.clone())]);

    // Bob started thread 3 and replied in thread 1.
    let (_, mine) = threads(&server, &bob, &room, "?include=participated").await;
    assert_eq!(latest(&mine), [(t1, r1b), (t3, r3)]);
}

async fn bundles_in_messages_sync_event_and_context(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &alice).await;
    join(&server, &bob, &room).await;
    let root = send(&server, &alice, &room, "m.room.message", text("root")).await;
    send(&server, &bob, &room, "m.room.message", reply("one", "m.thread", &root)).await;
    let two = send(&server, &bob, &room, "m.room.message", reply("two", "m.thread", &root)).await;
    let reference = send(&server, &bob, &room, "m.room.message", reply("see", "m.reference", &root)).await;
    let new_text = send(&server, &alice, &room, "m.room.message", edit("root, edited", &root)).await;
    // The latest reply's own edit rides along inside `latest_event`.
    let two_edit = send(&server, &bob, &room, "m.room.message", edit("two, edited", &two)).await;

    let check = |event: &Value, me_participated: bool, what: &str| {
        let rel = &event["unsigned"]["m.relations"];
        let thread = &rel["m.thread"];
        assert_eq!(thread["latest_event"]["event_id"], two.as_str(), "{what}: {event}");
        assert_eq!(thread["latest_event"]["content"]["body"], "two", "{what}: content is the original's");
        assert_eq!(
            thread["latest_event"]["unsigned"]["m.relations"]["m.replace"]["event_id"],
            two_edit.as_str(),
            "{what}"
        );
        assert_eq!(thread["count"], 2, "{what}");
        assert_eq!(thread["current_user_participated"], me_participated, "{what}");
        assert_eq!(rel["m.reference"], json!({ "chunk": [{ "event_id": reference }] }), "{what}");
        assert_eq!(rel["m.replace"]["event_id"], new_text.as_str(), "{what}");
        assert_eq!(rel["m.replace"]["content"]["m.new_content"]["body"], "root, edited", "{what}");
        assert_eq!(event["content"]["body"], "root", "{what}: the server does not apply edits");
    };
    let page = messages(&server, &alice, &room).await;
    check(find(&page["chunk"], &root), true, "alice's /messages");
    let page = messages(&server, &bob, &room).await;
    check(find(&page["chunk"], &root), true, "bob's /messages (he replied)");
    let carol = server.register("carol", "pw").await;
    join(&server, &carol, &room).await;
    let (status, event) = get_event(&server, &carol, &room, &root).await;
    assert_eq!(status, 200, "{event}");
    check(&event, false, "carol's /event");
    let sync = sync_once(&server, &alice, None).await;
    let timeline = &sync["rooms"]["join"][&room]["timeline"]["events"];
    check(find(timeline, &root), true, "alice's /sync");
    let (status, context) =
        server.get(&room_path(&room, &format!("/context/{}?limit=4", enc(&root))), Some(&alice.token)).await;
    assert_eq!(status, 200, "{context}");
    check(&context["event"], true, "/context");
    // /relations bundles too: the thread's latest reply carries its edit.
    let children = relations_ok(&server, &alice, &room, &root, "/m.thread").await;
    assert_eq!(
        find(&children["chunk"], &two)["unsigned"]["m.relations"]["m.replace"]["event_id"],
        two_edit.as_str()
    );
    // An event with no relations carries none.
    let plain = find(&page["chunk"], &reference);
    assert!(plain["unsigned"].get("m.relations").is_none(), "{plain}");
}

async fn edits_bundle_only_valid_replacements(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &alice).await;
    join(&server, &bob, &room).await;
    let original = send(&server, &alice, &room, "m.room.message", text("original")).await;
    let first = send(&server, &alice, &room, "m.room.message", edit("first", &original)).await;
    let second = send(&server, &alice, &room, "m.room.message", edit("second", &original)).await;
    // Not valid: another sender, another type, no m.new_content.
    send(&server, &bob, &room, "m.room.message", edit("bob's", &original)).await;
    send(&server, &alice, &room, "m.other", edit("other type", &original)).await;
    send(&server, &alice, &room, "m.room.message", json!({ "msgtype": "m.text", "body": "* bare", "m.relates_to": { "rel_type": "m.replace", "event_id": original } })).await;
    let replace_of =
        |event: &Value| event["unsigned"]["m.relations"]["m.replace"]["event_id"].as_str().map(str::to_owned);
    // The newest by origin_server_ts, then by event id (the two may share a millisecond).
    let newest = newest_of(&server, &alice, &room, &[&first, &second]).await;
    let (_, event) = get_event(&server, &bob, &room, &original).await;
    assert_eq!(replace_of(&event), Some(newest.clone()), "{event}");
    let (older, newest) = if newest == second { (first, second) } else { (second, first) };
    let (first, second) = (older, newest);

    // An edit of an edit bundles nothing on the edit.
    send(&server, &alice, &room, "m.room.message", edit("edit of edit", &second)).await;
    let (_, event) = get_event(&server, &alice, &room, &second).await;
    assert_eq!(replace_of(&event), None, "{event}");

    // A redacted edit loses its relation: the one before it is bundled.
    let (status, body) = server
        .put(&room_path(&room, &format!("/redact/{}/r1", enc(&second))), Some(&alice.token), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, event) = get_event(&server, &alice, &room, &original).await;
    assert_eq!(replace_of(&event), Some(first.clone()), "{event}");
    let listed = relations_ok(&server, &alice, &room, &original, "/m.replace?limit=20").await;
    assert!(!ids(&listed, "chunk").contains(&second), "{listed}");

    // A redacted original shows none of its edits.
    let (status, body) = server
        .put(&room_path(&room, &format!("/redact/{}/r2", enc(&original))), Some(&alice.token), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, event) = get_event(&server, &alice, &room, &original).await;
    assert_eq!(replace_of(&event), None, "{event}");
}

/// The spec's "most recent" of some events: by `origin_server_ts`, ties
/// broken by the lexicographically largest event id.
async fn newest_of(server: &Server, user: &User, room: &str, ids: &[&String]) -> String {
    let mut keyed = Vec::new();
    for id in ids {
        let (status, event) = get_event(server, user, room, id).await;
        assert_eq!(status, 200, "{event}");
        keyed.push((event["origin_server_ts"].as_i64().unwrap_or_default(), (*id).clone()));
    }
    keyed.into_iter().max().map(|(_, id)| id).unwrap_or_default()
}

async fn parent_in_another_room_is_not_found(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(&server, &alice, json!({ "preset": "private_chat" })).await;
    let secret = send(&server, &alice, &room, "m.room.message", text("secret")).await;
    send(&server, &alice, &room, "m.room.message", reply("secret reply", "m.thread", &secret)).await;
    let eves = public_room(&server, &eve).await;
    // Eve's own children of Alice's event, in her room.
    let planted = send(&server, &eve, &eves, "m.room.message", reply("planted", "m.thread", &secret)).await;
    send(&server, &eve, &eves, "m.room.message", edit("hijacked", &secret)).await;

    // Through her room, through Alice's, unknown: the same 404.
    for (r, e, what) in [
        (&eves, &secret, "another room's event"),
        (&room, &secret, "a room she is not in"),
        (&eves, &"$nothing:x".to_owned(), "an unknown event"),
    ] {
        for rest in ["", "/m.thread", "/m.thread/m.room.message"] {
            let response = relations(&server, &eve, r, e, rest).await;
            assert_error(&response, 404, "M_NOT_FOUND", what);
        }
    }
    let response = threads(&server, &eve, &room, "").await;
    assert_error(&response, 403, "M_FORBIDDEN", "threads of a room she is not in");
    let (status, hers) = threads(&server, &eve, &eves, "").await;
    assert_eq!(status, 200, "{hers}");
    assert_eq!(hers["chunk"], json!([]), "a root in another room is no thread of hers");

    // Alice sees neither Eve's reply nor her edit.
    let listed = relations_ok(&server, &alice, &room, &secret, "?limit=50").await;
    assert!(!ids(&listed, "chunk").contains(&planted), "{listed}");
    assert_eq!(ids(&listed, "chunk").len(), 1, "{listed}");
    let (_, event) = get_event(&server, &alice, &room, &secret).await;
    let rel = &event["unsigned"]["m.relations"];
    assert_eq!(rel["m.thread"]["count"], 1, "{event}");
    assert!(rel.get("m.replace").is_none(), "{event}");
}

async fn partial_readers_see_only_their_part_of_a_thread(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &alice).await;
    let (status, body) = server
        .put(
            &room_path(&room, "/state/m.room.history_visibility/"),
            Some(&alice.token),
            json!({ "history_visibility": "joined" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A thread from before Bob joined.
    let old_root = send(&server, &alice, &room, "m.room.message", text("before bob")).await;
    let old_reply =
        send(&server, &alice, &room, "m.room.message", reply("old reply", "m.thread", &old_root)).await;
    join(&server, &bob, &room).await;
    let late_reply =
        send(&server, &alice, &room, "m.room.message", reply("late reply", "m.thread", &old_root)).await;
    // A thread Bob sees begin, then leaves.
    let root = send(&server, &alice, &room, "m.room.message", text("while bob is here")).await;
    let seen = send(&server, &alice, &room, "m.room.message", reply("seen", "m.thread", &root)).await;
    let (status, body) = server.post(&room_path(&room, "/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let unseen = send(&server, &alice, &room, "m.room.message", reply("unseen", "m.thread", &root)).await;
    send(&server, &alice, &room, "m.room.message", edit("edited after bob left", &root)).await;

    // The old root is not his to read: 404, not even an empty list.
    assert_error(
        &relations(&server, &bob, &room, &old_root, "").await,
        404,
        "M_NOT_FOUND",
        "an unreadable parent",
    );
    assert_error(
        &get_event(&server, &bob, &room, &old_root).await,
        404,
        "M_NOT_FOUND",
        "the unreadable root",
    );
    // The reply he could read carries no bundle naming earlier ones.
    let (status, event) = get_event(&server, &bob, &room, &late_reply).await;
    assert_eq!(status, 200, "{event}");
    assert!(!event.to_string().contains(&old_reply), "{event}");

    // His part of the second thread: one reply, no edit after he left.
    let listed = relations_ok(&server, &bob, &room, &root, "?limit=50&dir=f").await;
    assert_eq!(ids(&listed, "chunk"), std::slice::from_ref(&seen));
    let (status, event) = get_event(&server, &bob, &room, &root).await;
    assert_eq!(status, 200, "{event}");
    let rel = &event["unsigned"]["m.relations"];
    assert_eq!(rel["m.thread"]["latest_event"]["event_id"], seen.as_str(), "{event}");
    assert_eq!(rel["m.thread"]["count"], 1, "{event}");
    assert!(rel.get("m.replace").is_none(), "{event}");
    let page = messages(&server, &bob, &room).await;
    let text_of_page = page.to_string();
    // (The old root's id is in the late reply's own `m.relates_to`: its content, his to read.)
    for hidden in [&old_reply, &unseen] {
        assert!(!text_of_page.contains(hidden.as_str()), "{hidden} leaked into {page}");
    }
    // /threads lists the thread he may read, at his latest reply, and not the old one.
    let (status, list) = threads(&server, &bob, &room, "").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(ids(&list, "chunk"), std::slice::from_ref(&root));
    assert!(!list.to_string().contains(&unseen) && !list.to_string().contains(&old_reply), "{list}");
    // Alice sees it all.
    let listed = relations_ok(&server, &alice, &room, &root, "/m.thread?limit=50&dir=f").await;
    assert_eq!(ids(&listed, "chunk"), [seen, unseen]);
    let (_, list) = threads(&server, &alice, &room, "").await;
    assert_eq!(ids(&list, "chunk"), [root, old_root]);
}

async fn malformed_parameters_are_invalid_param(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = public_room(&server, &alice).await;
    let root = send(&server, &alice, &room, "m.room.message", text("root")).await;
    for query in [
        "?from=garbage",
        "?to=p-5",
        "?from=s1_x",
        "?limit=abc",
        "?limit=-1",
        "?limit=99999999999999999999999",
        "?dir=sideways",
        "?recurse=maybe",
    ] {
        let response = relations(&server, &alice, &room, &root, query).await;
        assert_error(&response, 400, "M_INVALID_PARAM", query);
    }
    for query in ["?include=mine", "?from=nonsense", "?limit=x"] {
        let response = threads(&server, &alice, &room, query).await;
        assert_error(&response, 400, "M_INVALID_PARAM", query);
    }
    // A huge but valid limit is capped, not refused.
    let page = relations_ok(&server, &alice, &room, &root, "?limit=100000").await;
    assert_eq!(page["chunk"], json!([]));
}

async fn receipt(server: &Server, user: &User, room: &str, event: &str, body: Value) {
    let path = room_path(room, &format!("/receipt/m.read/{}", enc(event)));
    let (status, answer) = server.post(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
}

/// `(unread_notifications, unread_thread_notifications)` of one room in an
/// initial `/sync`, with or without the filter that splits threads out.
async fn unread(server: &Server, user: &User, room: &str, threaded: bool) -> ((i64, i64), Value) {
    let filter = if threaded {
        r#"{"room":{"timeline":{"unread_thread_notifications":true}}}"#
    } else {
        r#"{"room":{"timeline":{}}}"#
    };
    let (status, sync) =
        server.get(&format!("{V3}/sync?timeout=0&filter={}", enc(filter)), Some(&user.token)).await;
    assert_eq!(status, 200, "{sync}");
    let joined = &sync["rooms"]["join"][room];
    let counts = &joined["unread_notifications"];
    let pair = (
        counts["notification_count"].as_i64().unwrap_or(-1),
        counts["highlight_count"].as_i64().unwrap_or(-1),
    );
    (pair, joined.get("unread_thread_notifications").cloned().unwrap_or(Value::Null))
}

fn thread_pair(threads: &Value, root: &str) -> (i64, i64) {
    let t = &threads[root];
    (t["notification_count"].as_i64().unwrap_or(-1), t["highlight_count"].as_i64().unwrap_or(-1))
}

/// Complement's TestThreadedReceipts: A, a thread B, C (mentions Bob), E on
/// A, D (mentions Bob) in the main timeline, F a reference to A, G a
/// reaction to F; Bob's receipts, threaded and not, read each part.
async fn threaded_receipts_count_per_thread(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &alice).await;
    join(&server, &bob, &room).await;
    let bob_id = server.user_id("bob");
    let a = send(&server, &alice, &room, "m.room.message", text("Hello world!")).await;
    let b = send(&server, &alice, &room, "m.room.message", reply("Start thread!", "m.thread", &a)).await;
    send(
        &server,
        &alice,
        &room,
        "m.room.message",
        reply(&format!("Thread response {bob_id}!"), "m.thread", &a),
    )
    .await;
    let d = send(&server, &alice, &room, "m.room.message", text(&format!("Hello {bob_id}!"))).await;
    send(&server, &alice, &room, "m.room.message", reply("End thread", "m.thread", &a)).await;
    let f = send(&server, &alice, &room, "m.room.message", reply("Reference!", "m.reference", &a)).await;
    let g = send(
        &server,
        &alice,
        &room,
        "m.reaction",
        json!({ "m.relates_to": { "rel_type": "m.annotation", "event_id": f, "key": "test" } }),
    )
    .await;

    let check = |all: (i64, i64), main: (i64, i64), thread: Option<(i64, i64)>| {
        let (server, bob, room, a) = (&server, &bob, &room, &a);
        async move {
            let (counts, threads) = unread(server, bob, room, false).await;
            assert_eq!(counts, all, "unfiltered");
            assert!(threads.is_null(), "no thread counts without the filter: {threads}");
            let (counts, threads) = unread(server, bob, room, true).await;
            assert_eq!(counts, main, "main timeline");
            match thread {
                Some(pair) => assert_eq!(thread_pair(&threads, a), pair, "{threads}"),
                None => assert!(threads.is_null(), "nothing unread in threads: {threads}"),
            }
        }
    };
    check((6, 2), (3, 1), Some((3, 1))).await;
    receipt(&server, &bob, &room, &a, json!({ "thread_id": "main" })).await;
    check((5, 2), (2, 1), Some((3, 1))).await;
    receipt(&server, &bob, &room, &b, json!({ "thread_id": a })).await;
    check((4, 2), (2, 1), Some((2, 1))).await;
    receipt(&server, &bob, &room, &d, json!({})).await;
    check((2, 0), (1, 0), Some((1, 0))).await;
    receipt(&server, &bob, &room, &g, json!({ "thread_id": a })).await;
    check((1, 0), (1, 0), None).await;
}

/// Complement's TestThreadReceiptsInSync: an unthreaded and a threaded
/// receipt at one event both reach /sync, the threaded one with its thread.
async fn threaded_and_unthreaded_receipts_both_reach_sync(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let room = public_room(&server, &alice).await;
    let a = send(&server, &alice, &room, "m.room.message", text("Hello world!")).await;
    let b = send(&server, &alice, &room, "m.room.message", reply("Start thread!", "m.thread", &a)).await;
    receipt(&server, &alice, &room, &b, json!({})).await;
    receipt(&server, &alice, &room, &b, json!({ "thread_id": a })).await;
    let sync = sync_once(&server, &alice, None).await;
    let ephemeral = &sync["rooms"]["join"][&room]["ephemeral"]["events"];
    let mut threads: Vec<Option<String>> = ephemeral
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.receipt")
        .filter_map(|e| e["content"][&b]["m.read"].get(alice.user_id.as_str()).cloned())
        .map(|r| r["thread_id"].as_str().map(str::to_owned))
        .collect();
    threads.sort();
    assert_eq!(threads, [None, Some(a)], "{ephemeral}");
}
