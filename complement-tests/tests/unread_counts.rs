//! Unread counts exact at any number of unread events, checked against an
//! evaluation of the push rules written here from the spec, over what the
//! test sent: past any former cap, per thread with threaded and unthreaded
//! receipts (the fully-read marker is none), after redactions, after
//! push-rule changes, and across a leave.

use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    counts_are_exact_past_a_thousand_with_threads_receipts_and_redactions,
    counts_follow_push_rule_changes_past_a_thousand,
    counts_start_at_the_current_stay,
    a_thread_root_that_is_no_event_id_counts_in_the_main_timeline,
);

/// One event the test sent, as the oracle sees it.
#[derive(Debug, Clone)]
struct Sent {
    event_id: String,
    kind: &'static str,
    content: Value,
    redacted: bool,
}

impl Sent {
    /// The thread it is in (`None`: main). A redacted event has lost its relation.
    fn thread(&self) -> Option<&str> {
        if self.redacted || self.content["m.relates_to"]["rel_type"] != "m.thread" {
            return None;
        }
        self.content["m.relates_to"]["event_id"].as_str()
    }
}

/// The reader's rules as far as the test goes: the defaults, plus content
/// keywords (notify and highlight), with the room muted by a room rule.
#[derive(Debug, Default, Clone)]
struct Rules {
    keywords: Vec<&'static str>,
    room_muted: bool,
}

fn has_word(body: &str, word: &str) -> bool {
    body.to_lowercase().split(|c: char| !c.is_alphanumeric()).any(|w| w == word.to_lowercase())
}

/// `(notify, highlight)` for `reader` (named `name`) of an event from
/// someone else, by the spec's rule order: override, content, room,
/// underride.
fn outcome(rules: &Rules, reader: &str, name: &str, sent: &Sent) -> (bool, bool) {
    let content = if sent.redacted { json!({}) } else { sent.content.clone() };
    let body = content["body"].as_str().unwrap_or("");
    let mentions = content.get("m.mentions");
    if sent.kind == "m.room.message" && content["msgtype"] == "m.notice" {
        return (false, false);
    }
    if mentions.is_some_and(|m| m["user_ids"].as_array().is_some_and(|ids| ids.iter().any(|u| u == reader))) {
        return (true, true);
    }
    if mentions.is_none() && !body.is_empty() && has_word(body, name) {
        return (true, true);
    }
    if sent.kind == "m.reaction" {
        return (false, false);
    }
    if rules.keywords.iter().any(|k| has_word(body, k)) {
        return (true, true);
    }
    if rules.room_muted {
        return (false, false);
    }
    (sent.kind == "m.room.message", false)
}

/// The reader's read marks, by index into what was sent.
#[derive(Debug, Default, Clone)]
struct Marks {
    unthreaded: Option<usize>,
    main: Option<usize>,
    threads: Vec<(String, usize)>,
}

impl Marks {
    fn is_read(&self, i: usize, thread: Option<&str>) -> bool {
        let upto = match thread {
            None => self.main,
            Some(t) => self.threads.iter().find(|(root, _)| root == t).map(|(_, at)| *at),
        };
        self.unthreaded.into_iter().chain(upto).any(|at| i <= at)
    }
}

/// The counts the oracle expects: in all, and per thread root.
fn expected(
    sent: &[Sent],
    rules: &Rules,
    marks: &Marks,
    reader: &str,
    name: &str,
) -> ((u64, u64), std::collections::BTreeMap<String, (u64, u64)>) {
    let mut all = (0, 0);
    let mut threads = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for (i, s) in sent.iter().enumerate() {
        let (notify, highlight) = outcome(rules, reader, name, s);
        if !notify || marks.is_read(i, s.thread()) {
            continue;
        }
        all.0 += 1;
        all.1 += u64::from(highlight);
        if let Some(root) = s.thread() {
            let t = threads.entry(root.to_owned()).or_default();
            t.0 += 1;
            t.1 += u64::from(highlight);
        }
    }
    (all, threads)
}

/// The counts `/sync` gives the reader for the room: in all, and with
/// `unread_thread_notifications` the main timeline's and each thread's.
async fn counts_seen(
    server: &Server,
    reader: &User,
    room: &str,
) -> ((u64, u64), (u64, u64), std::collections::BTreeMap<String, (u64, u64)>) {
    let pair = |v: &Value| {
        (
            v["notification_count"].as_u64().unwrap_or(u64::MAX),
            v["highlight_count"].as_u64().unwrap_or(u64::MAX),
        )
    };
    let (status, sync) = server.get("/_matrix/client/v3/sync", Some(&reader.token)).await;
    assert_eq!(status, 200, "{sync}");
    let all = pair(&sync["rooms"]["join"][room]["unread_notifications"]);
    let filter = json!({ "room": { "timeline": { "limit": 1, "unread_thread_notifications": true } } });
    let path = format!("/_matrix/client/v3/sync?filter={}", urlencode(&filter.to_string()));
    let (status, sync) = server.get(&path, Some(&reader.token)).await;
    assert_eq!(status, 200, "{sync}");
    let joined = &sync["rooms"]["join"][room];
    let main = pair(&joined["unread_notifications"]);
    let threads = joined["unread_thread_notifications"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), pair(v))).collect())
        .unwrap_or_default();
    (all, main, threads)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Checks what `/sync` gives against the oracle.
async fn check(
    server: &Server,
    reader: &User,
    room: &str,
    sent: &[Sent],
    rules: &Rules,
    marks: &Marks,
    what: &str,
) {
    let name = reader.user_id.trim_start_matches('@').split(':').next().unwrap_or_default();
    let (all, threads) = expected(sent, rules, marks, &reader.user_id, name);
    let main = threads.values().fold(all, |(n, h), (tn, th)| (n - tn, h - th));
    let seen = counts_seen(server, reader, room).await;
    assert_eq!(seen, (all, main, threads), "{what}: (all, main, threads) seen vs expected");
}

/// A room of `alice` that `bob` joined.
async fn room_of_two(server: &Server, alice: &User, bob: &User) -> String {
    let (_, created) = server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "preset": "public_chat" }))
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    let (status, body) =
        server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    room
}

async fn send(
    server: &Server,
    user: &User,
    room: &str,
    kind: &'static str,
    content: Value,
    txn: usize,
) -> Sent {
    let path = format!("/_matrix/client/v3/rooms/{room}/send/{kind}/t{txn}");
    let (status, body) = server.put(&path, Some(&user.token), content.clone()).await;
    assert_eq!(status, 200, "{body}");
    Sent { event_id: body["event_id"].as_str().unwrap().to_owned(), kind, content, redacted: false }
}

/// The `i`th message of the mix: plain ones with `m.mentions`, thread
/// replies, notices, mentions of bob (in `m.mentions` or, without it, by
/// name), reactions, and keyword bait.
fn mix(i: usize, root: &str, bob: &str) -> (&'static str, Value) {
    let thread = json!({ "rel_type": "m.thread", "event_id": root });
    if i.is_multiple_of(50) {
        (
            "m.room.message",
            json!({ "msgtype": "m.text", "body": format!("thread {i}"), "m.relates_to": thread, "m.mentions": { "user_ids": [bob] } }),
        )
    } else if i.is_multiple_of(5) {
        (
            "m.room.message",
            json!({ "msgtype": "m.text", "body": format!("thread {i}"), "m.relates_to": thread, "m.mentions": {} }),
        )
    } else if i.is_multiple_of(11) {
        (
            "m.room.message",
            json!({ "msgtype": "m.notice", "body": format!("notice {i} for bob"), "m.mentions": {} }),
        )
    } else if i.is_multiple_of(17) {
        (
            "m.room.message",
            json!({ "msgtype": "m.text", "body": format!("hey {i}"), "m.mentions": { "user_ids": [bob] } }),
        )
    } else if i.is_multiple_of(29) {
        ("m.room.message", json!({ "msgtype": "m.text", "body": format!("lunch, Bob? {i}") }))
    } else if i.is_multiple_of(41) {
        ("m.room.message", json!({ "msgtype": "m.text", "body": format!("hello all {i}") }))
    } else if i.is_multiple_of(31) {
        (
            "m.reaction",
            json!({ "m.relates_to": { "rel_type": "m.annotation", "event_id": root, "key": format!("{i}") } }),
        )
    } else if i.is_multiple_of(37) {
        (
            "m.room.message",
            json!({ "msgtype": "m.text", "body": format!("banana split {i}"), "m.mentions": {} }),
        )
    } else {
        ("m.room.message", json!({ "msgtype": "m.text", "body": format!("message {i}"), "m.mentions": {} }))
    }
}

/// Sends the root and `n` more of the mix from alice.
async fn fill(server: &Server, alice: &User, bob: &User, room: &str, n: usize) -> Vec<Sent> {
    let root = send(
        server,
        alice,
        room,
        "m.room.message",
        json!({ "msgtype": "m.text", "body": "root", "m.mentions": {} }),
        0,
    )
    .await;
    let mut sent = vec![root.clone()];
    for i in 1..=n {
        let (kind, content) = mix(i, &root.event_id, &bob.user_id);
        sent.push(send(server, alice, room, kind, content, i).await);
    }
    sent
}

async fn receipt(server: &Server, user: &User, room: &str, event: &str, thread: Option<&str>) {
    let body = thread.map_or(json!({}), |t| json!({ "thread_id": t }));
    let path = format!("/_matrix/client/v3/rooms/{room}/receipt/m.read/{event}");
    let (status, answer) = server.post(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
}

async fn redact(server: &Server, user: &User, room: &str, sent: &mut Sent, txn: &str) {
    let path = format!("/_matrix/client/v3/rooms/{room}/redact/{}/{txn}", sent.event_id);
    let (status, body) = server.put(&path, Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    sent.redacted = true;
}

async fn counts_are_exact_past_a_thousand_with_threads_receipts_and_redactions(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = room_of_two(&server, &alice, &bob).await;
    let mut sent = fill(&server, &alice, &bob, &room, 1300).await;
    // Bob's own messages never count for him, mentions of himself included.
    let own =
        send(&server, &bob, &room, "m.room.message", json!({ "msgtype": "m.text", "body": "me, bob" }), 0)
            .await;
    let rules = Rules::default();
    let mut marks = Marks::default();
    let (all, _) = expected(&sent, &rules, &marks, &bob.user_id, "bob");
    assert!(all.0 > 1000 && all.1 > 50, "the mix is past the former cap of 1,000: {all:?}");
    check(&server, &bob, &room, &sent, &rules, &marks, "nothing read").await;

    let root = sent[0].event_id.clone();
    receipt(&server, &bob, &room, &sent[600].event_id, Some(&root)).await;
    marks.threads.push((root.clone(), 600));
    check(&server, &bob, &room, &sent, &rules, &marks, "the thread read to 600").await;
    receipt(&server, &bob, &room, &sent[901].event_id, Some("main")).await;
    marks.main = Some(901);
    check(&server, &bob, &room, &sent, &rules, &marks, "the main timeline read to 901").await;
    receipt(&server, &bob, &room, &sent[1000].event_id, None).await;
    marks.unthreaded = Some(1000);
    check(&server, &bob, &room, &sent, &rules, &marks, "everything read to 1000").await;

    // A mention redacted no longer highlights; a thread reply redacted has
    // lost its relation and counts in the main timeline.
    assert!(sent[1003].content["m.mentions"]["user_ids"][0] == bob.user_id.as_str());
    redact(&server, &alice, &room, &mut sent[1003], "r1").await;
    assert!(sent[1005].thread().is_some());
    redact(&server, &alice, &room, &mut sent[1005], "r2").await;
    let mut with_redactions = sent.clone();
    // The redactions themselves notify no one.
    with_redactions.push(Sent {
        event_id: String::new(),
        kind: "m.room.redaction",
        content: json!({}),
        redacted: false,
    });
    check(&server, &bob, &room, &with_redactions, &rules, &marks, "after two redactions").await;

    // Bob's receipt on his own last message reads everything.
    receipt(&server, &bob, &room, &own.event_id, None).await;
    marks.unthreaded = Some(with_redactions.len());
    check(&server, &bob, &room, &with_redactions, &rules, &marks, "all read").await;
}

async fn put_rule(server: &Server, user: &User, kind: &str, id: &str, body: Value) {
    let path = format!("/_matrix/client/v3/pushrules/global/{kind}/{}", urlencode(id));
    let (status, answer) = server.put(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
}

async fn delete_rule(server: &Server, user: &User, kind: &str, id: &str) {
    let path = format!("/_matrix/client/v3/pushrules/global/{kind}/{}", urlencode(id));
    let (status, answer) = server.request(reqwest::Method::DELETE, &path, Some(&user.token), None).await;
    assert_eq!(status, 200, "{answer}");
}

async fn counts_follow_push_rule_changes_past_a_thousand(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = room_of_two(&server, &alice, &bob).await;
    let sent = fill(&server, &alice, &bob, &room, 1100).await;
    let marks = Marks::default();
    let mut rules = Rules::default();
    check(&server, &bob, &room, &sent, &rules, &marks, "default rules").await;

    put_rule(
        &server,
        &bob,
        "content",
        "banana",
        json!({ "pattern": "banana", "actions": ["notify", { "set_tweak": "highlight" }] }),
    )
    .await;
    rules.keywords.push("banana");
    check(&server, &bob, &room, &sent, &rules, &marks, "with a keyword").await;

    put_rule(&server, &bob, "room", &room, json!({ "actions": [] })).await;
    rules.room_muted = true;
    check(&server, &bob, &room, &sent, &rules, &marks, "room muted, keyword kept").await;

    // A rule for another room changes nothing here.
    let other = room_of_two(&server, &alice, &bob).await;
    delete_rule(&server, &bob, "room", &room).await;
    delete_rule(&server, &bob, "content", "banana").await;
    put_rule(&server, &bob, "room", &other, json!({ "actions": [] })).await;
    let rules = Rules::default();
    check(&server, &bob, &room, &sent, &rules, &marks, "back to the defaults, another room muted").await;
}

async fn counts_start_at_the_current_stay(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = room_of_two(&server, &alice, &bob).await;
    let msg = |body: &str| json!({ "msgtype": "m.text", "body": body, "m.mentions": {} });
    let mut sent = vec![send(&server, &alice, &room, "m.room.message", msg("first stay"), 1).await];
    let (status, _) =
        server.post(&format!("/_matrix/client/v3/rooms/{room}/leave"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    send(&server, &alice, &room, "m.room.message", msg("while bob is away"), 2).await;
    let (status, _) =
        server.post(&format!("/_matrix/client/v3/join/{room}"), Some(&bob.token), json!({})).await;
    assert_eq!(status, 200);
    sent.clear();
    for i in 3..6 {
        sent.push(send(&server, &alice, &room, "m.room.message", msg("after the return"), i).await);
    }
    check(&server, &bob, &room, &sent, &Rules::default(), &Marks::default(), "only the current stay").await;
    // The fully-read marker is not a read receipt: it moves no count.
    let last = sent.last().map(|s| s.event_id.clone()).unwrap_or_default();
    let path = format!("/_matrix/client/v3/rooms/{room}/read_markers");
    let (status, body) = server.post(&path, Some(&bob.token), json!({ "m.fully_read": last })).await;
    assert_eq!(status, 200, "{body}");
    check(&server, &bob, &room, &sent, &Rules::default(), &Marks::default(), "after m.fully_read").await;
}

/// A thread reply naming a root that is no event id (here 3,000 bytes,
/// past what a PostgreSQL index entry holds) is stored, related to nothing,
/// and counts in the main timeline; the sends beside it are not failed.
async fn a_thread_root_that_is_no_event_id_counts_in_the_main_timeline(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = room_of_two(&server, &alice, &bob).await;
    // Characters that do not compress: PostgreSQL compresses long index keys.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: String = (0..3000)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect();
    let root = format!("${noise}");
    let bogus = json!({ "msgtype": "m.text", "body": "odd", "m.mentions": {},
                        "m.relates_to": { "rel_type": "m.thread", "event_id": root } });
    // Before the bound, PostgreSQL failed this send (and the sends written
    // with it) with a 500: the key was too long for its index entries.
    send(&server, &alice, &room, "m.room.message", bogus, 1).await;
    let plain = json!({ "msgtype": "m.text", "body": "plain", "m.mentions": {} });
    send(&server, &alice, &room, "m.room.message", plain, 2).await;
    let (all, main, threads) = counts_seen(&server, &bob, &room).await;
    assert_eq!((all, main, threads), ((2, 0), (2, 0), Default::default()));
}
