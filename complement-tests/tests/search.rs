//! `POST /search` (`room_events`): matches, both orders, paging with
//! `next_batch`, filters, context with profiles, groupings, redactions; and
//! as an attacker: history before a `joined`-visibility join, events after a
//! leave, another user's private room, forged tokens, malformed and huge
//! bodies. Each search answers only from the caller's readable ranges:
//! nothing else is returned, counted, highlighted or shown as context.

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    finds_messages_names_and_topics_by_prefix,
    rank_and_recent_orders,
    next_batch_pages_through_many_results,
    filter_by_rooms_senders_types_and_url,
    context_before_and_after_with_profiles,
    groupings_by_room_and_sender,
    include_state_gives_each_result_rooms_state,
    redacted_messages_are_not_found,
    history_before_a_joined_visibility_join_is_not_found,
    events_after_a_leave_are_not_found,
    another_users_private_room_is_never_searched,
    malformed_and_unknown_bodies,
    huge_and_hostile_search_terms,
);

fn search_path(next_batch: Option<&str>) -> String {
    match next_batch {
        Some(t) => format!("{V3}/search?next_batch={}", enc(t)),
        None => format!("{V3}/search"),
    }
}

/// One search with `criteria` as the `room_events` category; asserts 200 and
/// returns the category's answer.
async fn search(server: &Server, user: &User, criteria: Value, next_batch: Option<&str>) -> Value {
    let body = json!({ "search_categories": { "room_events": criteria } });
    let (status, answer) = server.post(&search_path(next_batch), Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
    answer["search_categories"]["room_events"].clone()
}

async fn send(server: &Server, user: &User, room: &str, body: &str) -> String {
    send_content(server, user, room, text(body)).await
}

async fn send_content(server: &Server, user: &User, room: &str, content: Value) -> String {
    let txn = format!("t{}", rand_suffix());
    let path = room_path(room, &format!("/send/m.room.message/{txn}"));
    let (status, body) = server.put(&path, Some(&user.token), content).await;
    assert_eq!(status, 200, "{body}");
    event_id_of(&body)
}

fn rand_suffix() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    t * 1000 + u128::from(n)
}

/// The event ids of the results, in order.
fn ids(answer: &Value) -> Vec<String> {
    answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {answer}"))
        .iter()
        .map(|r| r["result"]["event_id"].as_str().expect("event_id").to_owned())
        .collect()
}

fn bodies(events: &Value) -> Vec<String> {
    events
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {events}"))
        .iter()
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

fn count(answer: &Value) -> i64 {
    answer["count"].as_i64().unwrap_or_else(|| panic!("no count in {answer}"))
}

async fn private_room(server: &Server, user: &User) -> String {
    create_room(server, user, json!({ "preset": "private_chat" })).await
}

async fn leave(server: &Server, user: &User, room: &str) {
    let (status, body) = server.post(&room_path(room, "/leave"), Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
}

/// A message body, a room name and a topic are found by a word and by a
/// prefix of one, with the event as clients see it, count and highlights.
async fn finds_messages_names_and_topics_by_prefix(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = create_room(
        &server,
        &alice,
        json!({ "preset": "private_chat", "name": "Quarterly planning", "topic": "Budgets and roadmaps" }),
    )
    .await;
    let hello = send(&server, &alice, &room, "hello, world").await;
    send(&server, &alice, &room, "something else entirely").await;

    let answer = search(
        &server,
        &alice,
        json!({ "search_term": "hello", "keys": ["content.body"], "filter": { "rooms": [room] } }),
        None,
    )
    .await;
    assert_eq!(count(&answer), 1, "{answer}");
    assert_eq!(ids(&answer), vec![hello.clone()]);
    let result = &answer["results"][0];
    assert_eq!(result["result"]["room_id"], room);
    assert_eq!(result["result"]["type"], "m.room.message");
    assert_eq!(result["result"]["content"]["body"], "hello, world");
    assert_eq!(result["result"]["sender"], alice.user_id);
    assert!(result["rank"].as_f64().is_some_and(|r| r > 0.0), "{result}");
    assert!(answer["highlights"].as_array().unwrap().contains(&json!("hello")), "{answer}");
    assert!(answer.get("next_batch").is_none(), "{answer}");
    assert!(result.get("context").is_none(), "no event_context asked, none given: {result}");

    // A prefix of a word finds it; the highlight names the word found.
    let answer = search(&server, &alice, json!({ "search_term": "HEL" }), None).await;
    assert_eq!(ids(&answer), vec![hello.clone()]);
    assert!(answer["highlights"].as_array().unwrap().contains(&json!("hello")), "{answer}");

    // Every word must occur.
    let answer = search(&server, &alice, json!({ "search_term": "hello nowhere" }), None).await;
    assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");

    // Names and topics, each under its own key only.
    let answer =
        search(&server, &alice, json!({ "search_term": "quarterly", "keys": ["content.name"] }), None).await;
    assert_eq!(count(&answer), 1, "{answer}");
    assert_eq!(answer["results"][0]["result"]["type"], "m.room.name");
    assert_eq!(answer["results"][0]["result"]["content"]["name"], "Quarterly planning");
    let answer =
        search(&server, &alice, json!({ "search_term": "roadmaps", "keys": ["content.topic"] }), None).await;
    assert_eq!(answer["results"][0]["result"]["type"], "m.room.topic");
    let answer =
        search(&server, &alice, json!({ "search_term": "roadmaps", "keys": ["content.body"] }), None).await;
    assert_eq!(count(&answer), 0, "{answer}");
    // Without keys: all three.
    let answer = search(&server, &alice, json!({ "search_term": "planning" }), None).await;
    assert_eq!(count(&answer), 1, "{answer}");
}

/// `rank` puts the best match first (ranks never rise down the list);
/// `recent` the newest first.
async fn rank_and_recent_orders(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = private_room(&server, &alice).await;
    let long =
        send(&server, &alice, &room, "an apple among many other words in a rather long sentence here").await;
    let best = send(&server, &alice, &room, "apple apple apple").await;
    let short = send(&server, &alice, &room, "apple tart").await;
    send(&server, &alice, &room, "pear").await;

    let criteria =
        |order: &str| json!({ "search_term": "apple", "order_by": order, "filter": { "rooms": [room] } });
    let recent = search(&server, &alice, criteria("recent"), None).await;
    assert_eq!(ids(&recent), vec![short.clone(), best.clone(), long.clone()]);
    assert_eq!(count(&recent), 3);

    let ranked = search(&server, &alice, criteria("rank"), None).await;
    let order = ids(&ranked);
    assert_eq!(order.len(), 3, "{ranked}");
    assert_eq!(order[0], best, "{ranked}");
    let ranks: Vec<f64> =
        ranked["results"].as_array().unwrap().iter().map(|r| r["rank"].as_f64().unwrap()).collect();
    assert!(ranks.windows(2).all(|w| w[0] >= w[1]), "{ranks:?}");
    // The default order is rank.
    let default =
        search(&server, &alice, json!({ "search_term": "apple", "filter": { "rooms": [room] } }), None).await;
    assert_eq!(ids(&default), order);
}

/// 25 matches, 10 a page: three pages in order, each with the full count,
/// the last with no next_batch; an event sent meanwhile does not shift the
/// pages. Rank order pages through the same set without repeats.
async fn next_batch_pages_through_many_results(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = private_room(&server, &alice).await;
    let mut sent = Vec::new();
    for i in 0..25 {
        sent.push(send(&server, &alice, &room, &format!("Message number {i}")).await);
    }
    let newest_first: Vec<String> = sent.iter().rev().cloned().collect();
    let criteria = |order: &str| json!({ "search_term": "message", "order_by": order, "filter": { "rooms": [room], "limit": 10 } });

    let first = search(&server, &alice, criteria("recent"), None).await;
    assert_eq!((count(&first), ids(&first)), (25, newest_first[..10].to_vec()));
    // Sent after the first page: not in the later pages, which do not shift.
    send(&server, &alice, &room, "Message arriving late").await;
    let token = first["next_batch"].as_str().expect("next_batch").to_owned();
    let second = search(&server, &alice, criteria("recent"), Some(&token)).await;
    assert_eq!((count(&second), ids(&second)), (25, newest_first[10..20].to_vec()));
    let token = second["next_batch"].as_str().expect("next_batch").to_owned();
    let third = search(&server, &alice, criteria("recent"), Some(&token)).await;
    assert_eq!((count(&third), ids(&third)), (25, newest_first[20..].to_vec()));
    assert!(third.get("next_batch").is_none(), "{third}");

    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..5 {
        let page = search(&server, &alice, criteria("rank"), token.as_deref()).await;
        seen.extend(ids(&page));
        token = page["next_batch"].as_str().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    assert!(token.is_none(), "rank paging did not end");
    let mut expected = sent.clone();
    expected.push(ids(&search(&server, &alice, json!({ "search_term": "arriving" }), None).await)[0].clone());
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected, "every match once (the late one too: a new search)");

    // A token of one order is refused for the other.
    let token = first["next_batch"].as_str().unwrap();
    let (status, body) = server
        .post(
            &search_path(Some(token)),
            Some(&alice.token),
            json!({ "search_categories": { "room_events": criteria("rank") } }),
        )
        .await;
    assert_error(&(status, body), 400, "M_INVALID_PARAM", "recent token, rank search");
}

/// rooms / not_rooms, senders / not_senders, types and contains_url narrow
/// the results and the count.
async fn filter_by_rooms_senders_types_and_url(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let bob = server.register("bob", "pw-bob-12345").await;
    let one = create_room(&server, &alice, json!({ "preset": "public_chat", "name": "coffee corner" })).await;
    let two = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &one).await;
    join(&server, &bob, &two).await;
    let a1 = send(&server, &alice, &one, "coffee time").await;
    let b1 = send(&server, &bob, &one, "coffee please").await;
    let a2 = send(&server, &alice, &two, "coffee again").await;
    let img = send_content(
        &server,
        &bob,
        &two,
        json!({ "msgtype": "m.image", "body": "coffee.png", "url": "mxc://example.org/abc" }),
    )
    .await;

    let found = |filter: Value| {
        let server = &server;
        let bob = &bob;
        async move {
            let answer = search(
                server,
                bob,
                json!({ "search_term": "coffee", "order_by": "recent", "filter": filter }),
                None,
            )
            .await;
            let mut got = ids(&answer);
            assert_eq!(count(&answer), i64::try_from(got.len()).unwrap(), "{answer}");
            got.sort();
            got
        }
    };
    let sorted = |mut v: Vec<&String>| {
        v.sort();
        v.into_iter().cloned().collect::<Vec<_>>()
    };
    let name_event = {
        let answer =
            search(&server, &bob, json!({ "search_term": "coffee", "keys": ["content.name"] }), None).await;
        ids(&answer)[0].clone()
    };
    assert_eq!(found(json!({})).await, sorted(vec![&a1, &b1, &a2, &img, &name_event]));
    assert_eq!(found(json!({ "rooms": [one] })).await, sorted(vec![&a1, &b1, &name_event]));
    assert_eq!(found(json!({ "not_rooms": [one] })).await, sorted(vec![&a2, &img]));
    assert_eq!(found(json!({ "senders": [bob.user_id] })).await, sorted(vec![&b1, &img]));
    assert_eq!(found(json!({ "not_senders": [bob.user_id] })).await, sorted(vec![&a1, &a2, &name_event]));
    assert_eq!(found(json!({ "types": ["m.room.name"] })).await, sorted(vec![&name_event]));
    assert_eq!(found(json!({ "not_types": ["m.room.*"] })).await, Vec::<String>::new());
    assert_eq!(found(json!({ "contains_url": true })).await, sorted(vec![&img]));
    assert_eq!(found(json!({ "contains_url": false, "rooms": [two] })).await, sorted(vec![&a2]));
    assert_eq!(found(json!({ "limit": 2, "rooms": [two] })).await.len(), 2);
}

/// event_context: the readable events before and after each result, the
/// tokens around them and, with include_profile, the senders' names then.
async fn context_before_and_after_with_profiles(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let (status, body) = server
        .put(
            &format!("{V3}/profile/{}/displayname", enc(&alice.user_id)),
            Some(&alice.token),
            json!({ "displayname": "Alice Liddell" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let room = private_room(&server, &alice).await;
    for i in 1..=7 {
        send(&server, &alice, &room, &format!("Message number {i}")).await;
    }
    let answer = search(
        &server,
        &alice,
        json!({
            "search_term": "Message 4",
            "order_by": "recent",
            "filter": { "rooms": [room], "limit": 1 },
            "event_context": { "before_limit": 2, "after_limit": 2, "include_profile": true },
        }),
        None,
    )
    .await;
    assert_eq!(count(&answer), 1, "{answer}");
    let result = &answer["results"][0];
    assert_eq!(result["result"]["content"]["body"], "Message number 4");
    let context = &result["context"];
    assert_eq!(bodies(&context["events_before"]), vec!["Message number 3", "Message number 2"]);
    assert_eq!(bodies(&context["events_after"]), vec!["Message number 5", "Message number 6"]);
    assert!(context["start"].is_string() && context["end"].is_string(), "{context}");
    assert_eq!(context["profile_info"][&alice.user_id]["displayname"], "Alice Liddell", "{context}");

    // The start token pages on backwards from the context through /messages.
    let start = context["start"].as_str().unwrap();
    let (status, page) = server
        .get(&room_path(&room, &format!("/messages?dir=b&limit=1&from={}", enc(start))), Some(&alice.token))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(message_bodies(&page), vec!["Message number 1"]);
}

/// group_by room_id and sender: each group lists its results with an order;
/// a group's next_batch continues that group alone.
async fn groupings_by_room_and_sender(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let bob = server.register("bob", "pw-bob-12345").await;
    let one = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    let two = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &one).await;
    let mut in_one = Vec::new();
    for i in 0..4 {
        let who = if i % 2 == 0 { &alice } else { &bob };
        in_one.push(send(&server, who, &one, &format!("cake {i}")).await);
    }
    let in_two = send(&server, &alice, &two, "cake in two").await;

    let criteria = json!({
        "search_term": "cake",
        "order_by": "recent",
        "filter": { "limit": 2 },
        "groupings": { "group_by": [{ "key": "room_id" }, { "key": "sender" }] },
    });
    let answer = search(&server, &alice, criteria.clone(), None).await;
    // Newest first: two's message, then one's last.
    assert_eq!(ids(&answer), vec![in_two.clone(), in_one[3].clone()]);
    let rooms = &answer["groups"]["room_id"];
    assert_eq!(rooms[&two]["results"], json!([in_two]));
    assert_eq!(rooms[&two]["order"], 1);
    assert!(rooms[&two].get("next_batch").is_none(), "two has no more: {rooms}");
    assert_eq!(rooms[&one]["results"], json!([in_one[3]]));
    assert_eq!(rooms[&one]["order"], 2);
    let senders = &answer["groups"]["sender"];
    assert_eq!(senders[&alice.user_id]["results"], json!([in_two]));
    assert_eq!(senders[&bob.user_id]["results"], json!([in_one[3]]));

    // Room one's token: the rest of room one only, newest first.
    let token = rooms[&one]["next_batch"].as_str().expect("one has more").to_owned();
    let more = search(&server, &alice, criteria.clone(), Some(&token)).await;
    assert_eq!(ids(&more), vec![in_one[2].clone(), in_one[1].clone()]);
    assert_eq!(count(&more), 4, "the group's count: {more}");
    // Bob's token: his other message only.
    let token = senders[&bob.user_id]["next_batch"].as_str().expect("bob has more").to_owned();
    let more = search(&server, &alice, criteria, Some(&token)).await;
    assert_eq!(ids(&more), vec![in_one[1].clone()]);
    assert!(more.get("next_batch").is_none(), "{more}");
}

/// include_state: the state of each room with results, as the caller sees it.
async fn include_state_gives_each_result_rooms_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = create_room(&server, &alice, json!({ "preset": "private_chat", "name": "Garden" })).await;
    let other = private_room(&server, &alice).await;
    send(&server, &alice, &room, "tomatoes are ripe").await;
    send(&server, &alice, &other, "nothing to see").await;
    let answer =
        search(&server, &alice, json!({ "search_term": "tomatoes", "include_state": true }), None).await;
    let state = answer["state"].as_object().unwrap_or_else(|| panic!("no state: {answer}"));
    assert_eq!(state.keys().collect::<Vec<_>>(), vec![&room]);
    let events = state[&room].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["type"] == "m.room.name" && e["content"]["name"] == "Garden"),
        "{answer}"
    );
    assert!(
        events.iter().any(|e| e["type"] == "m.room.member" && e["state_key"] == alice.user_id),
        "{answer}"
    );
}

/// A redacted message is not found in either order, nor counted.
async fn redacted_messages_are_not_found(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = private_room(&server, &alice).await;
    let gone = send(&server, &alice, &room, "This message is going to be redacted").await;
    let kept = send(&server, &alice, &room, "This message is not going to be redacted").await;
    let path = room_path(&room, &format!("/redact/{}/r1", enc(&gone)));
    let (status, body) = server.put(&path, Some(&alice.token), json!({ "reason": "testing" })).await;
    assert_eq!(status, 200, "{body}");
    for order in ["rank", "recent"] {
        let answer = search(
            &server,
            &alice,
            json!({ "search_term": "redacted", "order_by": order, "filter": { "rooms": [room] } }),
            None,
        )
        .await;
        assert_eq!((count(&answer), ids(&answer)), (1, vec![kept.clone()]), "{order}: {answer}");
    }
    let answer = search(&server, &alice, json!({ "search_term": "going" }), None).await;
    assert_eq!(ids(&answer), vec![kept]);
}

/// Under `joined` visibility, Bob who joined later finds nothing sent before
/// his join: not as a result, not in the count, not as context.
async fn history_before_a_joined_visibility_join_is_not_found(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let bob = server.register("bob", "pw-bob-12345").await;
    let room = create_room(
        &server,
        &alice,
        json!({
            "preset": "public_chat",
            "initial_state": [{ "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } }],
        }),
    )
    .await;
    let secret = send(&server, &alice, &room, "secret plans before bob").await;
    join(&server, &bob, &room).await;
    let later = send(&server, &alice, &room, "public plans after bob").await;

    let answer = search(
        &server,
        &bob,
        json!({
            "search_term": "plans",
            "event_context": { "before_limit": 10, "after_limit": 10 },
            "include_state": true,
        }),
        None,
    )
    .await;
    assert_eq!((count(&answer), ids(&answer)), (1, vec![later.clone()]), "{answer}");
    let text = answer.to_string();
    assert!(!text.contains(&secret) && !text.contains("secret"), "leaked: {answer}");
    let answer = search(&server, &bob, json!({ "search_term": "secret" }), None).await;
    assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");
    // Alice, there all along, finds both.
    let answer = search(&server, &alice, json!({ "search_term": "plans", "order_by": "recent" }), None).await;
    assert_eq!(ids(&answer), vec![later, secret]);
}

/// Bob left: what was sent after his leave is not found, counted or shown as
/// context; what he could read before is.
async fn events_after_a_leave_are_not_found(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let bob = server.register("bob", "pw-bob-12345").await;
    let room = create_room(&server, &alice, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let before = send(&server, &alice, &room, "meeting notes one").await;
    leave(&server, &bob, &room).await;
    let after = send(&server, &alice, &room, "meeting notes two").await;

    let answer = search(
        &server,
        &bob,
        json!({ "search_term": "meeting", "event_context": { "before_limit": 10, "after_limit": 10 } }),
        None,
    )
    .await;
    assert_eq!((count(&answer), ids(&answer)), (1, vec![before]), "{answer}");
    assert!(!answer.to_string().contains(&after), "leaked: {answer}");
    let answer = search(&server, &bob, json!({ "search_term": "two" }), None).await;
    assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");
    // Grouped by sender, the group's token does not reach past the leave.
    let answer = search(
        &server,
        &bob,
        json!({ "search_term": "meeting", "filter": { "limit": 1 }, "groupings": { "group_by": [{ "key": "sender" }] } }),
        None,
    )
    .await;
    assert!(answer["groups"]["sender"][&alice.user_id].get("next_batch").is_none(), "{answer}");
}

/// Eve searches for words of Alice's private room, naming it in the filter
/// and in a forged group token: nothing, nothing counted.
async fn another_users_private_room_is_never_searched(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let eve = server.register("eve", "pw-eve-123456").await;
    let room = private_room(&server, &alice).await;
    send(&server, &alice, &room, "the vault code is zebra").await;
    let own = private_room(&server, &eve).await;
    send(&server, &eve, &own, "nothing here").await;

    for criteria in [
        json!({ "search_term": "zebra" }),
        json!({ "search_term": "zebra", "filter": { "rooms": [room] } }),
        json!({ "search_term": "vault", "include_state": true, "groupings": { "group_by": [{ "key": "room_id" }] } }),
    ] {
        let answer = search(&server, &eve, criteria, None).await;
        assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");
        assert!(!answer.to_string().contains(&room), "{answer}");
    }
    let forged = format!("r0_999999999_R{room}");
    let answer = search(&server, &eve, json!({ "search_term": "zebra" }), Some(&forged)).await;
    assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");
    let forged = format!("r0_999999999_S{}", alice.user_id);
    let answer = search(&server, &eve, json!({ "search_term": "zebra" }), Some(&forged)).await;
    assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{answer}");
}

/// Bad bodies: 400 with the right code; an unknown category is ignored;
/// no token is 401.
async fn malformed_and_unknown_bodies(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let path = search_path(None);
    let post = |body: Value| server.post(&path, Some(&alice.token), body);
    assert_error(&post(json!({})).await, 400, "M_BAD_JSON", "no search_categories");
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "search_term": 5 } } })).await,
        400,
        "M_BAD_JSON",
        "numeric term",
    );
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "keys": ["content.body"] } } })).await,
        400,
        "M_BAD_JSON",
        "no term",
    );
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "search_term": "x", "filter": { "limit": "ten" } } } }))
            .await,
        400,
        "M_BAD_JSON",
        "bad filter",
    );
    assert_error(
        &post(
            json!({ "search_categories": { "room_events": { "search_term": "x", "order_by": "random" } } }),
        )
        .await,
        400,
        "M_INVALID_PARAM",
        "unknown order",
    );
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "search_term": "x", "keys": ["content.url"] } } }))
            .await,
        400,
        "M_INVALID_PARAM",
        "unknown key",
    );
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "search_term": "x", "groupings": { "group_by": [{ "key": "type" }] } } } }))
            .await,
        400,
        "M_INVALID_PARAM",
        "unknown grouping",
    );
    let senders: Vec<String> = (0..101).map(|i| format!("@u{i}:x")).collect();
    assert_error(
        &post(json!({ "search_categories": { "room_events": { "search_term": "x", "filter": { "senders": senders } } } }))
            .await,
        400,
        "M_BAD_JSON",
        "oversized filter list",
    );
    for token in ["", "garbage", "r-1_5", "r1_5_Xfoo", "r99999999999999999999_1"] {
        let (status, body) = server
            .post(
                &search_path(Some(token)),
                Some(&alice.token),
                json!({ "search_categories": { "room_events": { "search_term": "x" } } }),
            )
            .await;
        assert_error(&(status, body), 400, "M_INVALID_PARAM", token);
    }
    let (status, body) =
        server.request_raw(reqwest::Method::POST, &path, Some(&alice.token), b"{not json".to_vec()).await;
    assert_error(&(status, body), 400, "M_NOT_JSON", "not JSON");
    let (status, body) = server.post(&path, None, json!({ "search_categories": {} })).await;
    assert_error(&(status, body), 401, "M_MISSING_TOKEN", "no token");

    // Unknown categories are ignored; none asked, none answered.
    let (status, body) = post(json!({ "search_categories": { "people": { "search_term": "x" } } })).await;
    assert_eq!((status, body), (200, json!({ "search_categories": {} })));
}

/// A huge term is refused with 400 before any lookup; query syntax in a term
/// is only words; a term with no words finds nothing.
async fn huge_and_hostile_search_terms(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw-alice-123").await;
    let room = private_room(&server, &alice).await;
    let hello = send(&server, &alice, &room, "hello there").await;
    let path = search_path(None);
    let category = |term: String| json!({ "search_categories": { "room_events": { "search_term": term } } });

    let response = server.post(&path, Some(&alice.token), category("a".repeat(100_000))).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "100 kB term");
    let many: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let response = server.post(&path, Some(&alice.token), category(many.join(" "))).await;
    assert_error(&response, 400, "M_INVALID_PARAM", "100 words");
    let response = server.post(&path, Some(&alice.token), category("x".repeat(1_000_000))).await;
    assert!(response.0 == 400 || response.0 == 413, "a megabyte term: {response:?}");

    for term in [
        "\"hello\" * -there",
        "(hello there)",
        "hello*) (^",
        "hello:* | !there",
        "hello:there",
        "'hello' & (",
        "hello\u{0}",
    ] {
        let answer = search(&server, &alice, json!({ "search_term": term }), None).await;
        assert_eq!(ids(&answer), vec![hello.clone()], "{term}: {answer}");
    }
    for term in ["", "   ", "!!! ???", "*"] {
        let answer = search(&server, &alice, json!({ "search_term": term }), None).await;
        assert_eq!((count(&answer), ids(&answer).len()), (0, 0), "{term:?}: {answer}");
    }
    // The largest term taken still answers.
    let many: Vec<String> = (0..32).map(|i| format!("w{i}")).collect();
    let answer = search(&server, &alice, json!({ "search_term": many.join(" ") }), None).await;
    assert_eq!(count(&answer), 0, "{answer}");
}
