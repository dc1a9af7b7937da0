//! Membership ranges, black-box: every membership change takes a place on the
//! room's seq line, and what each user may read is a set of ranges on it (one
//! per stay, one per invite), cut by history visibility, the pre-join window
//! and the floors. The chapter's hiking group (small and at full size), the
//! spec's history-visibility settings, kicks and bans, floors, the send/leave
//! race, pagination edges, bulk membership, forget, join by alias and
//! membership through PUT state.
//!
//! Seqs are read from the outside: the creator of each room is joined from
//! seq 2 on and, being joined now, sees the creation events before (shared by
//! default), so the creator's whole timeline, oldest first, is the room's seq
//! line (`Line`). Tokens are opaque positions on it, learnt from /context
//! (`around`): seqs are sparse, so no test does arithmetic on them.
//!
//! A room created with `initial_state` setting `m.room.history_visibility`
//! gets that setting instead of the preset's (createRoom's default before it
//! is `shared`), so the creation events up to and including the setting are
//! readable by everyone joined now: the "shared prefix". `public_room` also
//! sets `m.room.guest_access` first, so that its creation events are seqs
//! 1..=6 and the setting is seq 6, the numbers the chapter's tests use.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use complement_tests::api::*;
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    hiking_group_small_scale,
    hiking_group_as_in_the_chapter,
    shared_history_and_leaving,
    invited_history_starts_at_the_invite,
    world_readable_needs_no_membership,
    visibility_change_hides_exactly_what_was_sent_under_joined,
    history_visibility_counts_only_with_the_empty_state_key,
    kick_and_ban_end_the_stay_and_unban_allows_a_rejoin,
    room_floor_by_purge,
    user_floor_holds_on_every_device,
    send_racing_the_senders_leave,
    pagination_edges,
    bulk_membership_is_consecutive_and_all_or_nothing,
    forget_alias_join_and_membership_through_state,
    membership_through_state_refuses_what_invite_refuses,
);

const SEQLINE: &str = "/_matrix/client/unstable/org.seqline";

// ---------------------------------------------------------------------------
// Helpers (the small ones copied from rooms.rs)

#[track_caller]
fn assert_ok(response: &(u16, Value), what: &str) {
    assert_eq!(response.0, 200, "{what}: {}", response.1);
}

async fn create_room(server: &Server, user: &User, body: Value) -> String {
    let (status, response) = server.post(&format!("{V3}/createRoom"), Some(&user.token), body.clone()).await;
    assert_eq!(status, 200, "createRoom {body}: {response}");
    response["room_id"].as_str().unwrap_or_else(|| panic!("no room_id in {response}")).to_owned()
}

/// A public room (anyone may join) whose history visibility `initial_state` sets.
async fn public_room(server: &Server, user: &User, visibility: &str) -> String {
    create_room(
        server,
        user,
        json!({
            "preset": "public_chat",
            "initial_state": [{
                "type": "m.room.guest_access",
                "state_key": "",
                "content": { "guest_access": "forbidden" },
            }, {
                "type": "m.room.history_visibility",
                "state_key": "",
                "content": { "history_visibility": visibility },
            }],
        }),
    )
    .await
}

async fn send(server: &Server, user: &User, room_id: &str, txn_id: &str, content: Value) -> (u16, Value) {
    let path = room_path(room_id, &format!("/send/m.room.message/{}", enc(txn_id)));
    server.put(&path, Some(&user.token), content).await
}

static TXN: AtomicUsize = AtomicUsize::new(0);

/// Sends an m.text message, which must succeed; returns its event id.
async fn say(server: &Server, user: &User, room_id: &str, body: &str) -> String {
    let txn = format!("m{}", TXN.fetch_add(1, Ordering::Relaxed));
    let response = send(server, user, room_id, &txn, text(body)).await;
    assert_eq!(response.0, 200, "send {body:?} as {}: {}", user.user_id, response.1);
    event_id_of(&response.1)
}

async fn get_event(server: &Server, user: &User, room_id: &str, event_id: &str) -> (u16, Value) {
    server.get(&room_path(room_id, &format!("/event/{}", enc(event_id))), Some(&user.token)).await
}

fn state_path(room_id: &str, kind: &str, state_key: &str) -> String {
    room_path(room_id, &format!("/state/{}/{}", enc(kind), enc(state_key)))
}

async fn put_state(
    server: &Server,
    user: &User,
    room_id: &str,
    kind: &str,
    state_key: &str,
    content: Value,
) -> (u16, Value) {
    server.put(&state_path(room_id, kind, state_key), Some(&user.token), content).await
}

/// PUT state that must succeed; returns the event id.
async fn set_state(server: &Server, user: &User, room_id: &str, kind: &str, content: Value) -> String {
    let response = put_state(server, user, room_id, kind, "", content).await;
    assert_ok(&response, kind);
    event_id_of(&response.1)
}

async fn room_state(server: &Server, user: &User, room_id: &str) -> Vec<Value> {
    let (status, body) = server.get(&room_path(room_id, "/state"), Some(&user.token)).await;
    assert_eq!(status, 200, "state of {room_id}: {body}");
    body.as_array().unwrap_or_else(|| panic!("state is not an array: {body}")).clone()
}

/// The state event of (type, key), if present.
fn find<'a>(state: &'a [Value], kind: &str, state_key: &str) -> Option<&'a Value> {
    state.iter().find(|e| e["type"] == kind && e["state_key"] == state_key)
}

/// POST /rooms/{id}/{action} (join, leave, invite, kick, ban, unban, forget).
async fn membership_call(
    server: &Server,
    user: &User,
    room_id: &str,
    action: &str,
    body: Value,
) -> (u16, Value) {
    server.post(&room_path(room_id, &format!("/{action}")), Some(&user.token), body).await
}

async fn join(server: &Server, user: &User, room_id: &str) {
    let response = membership_call(server, user, room_id, "join", json!({})).await;
    assert_ok(&response, &format!("{} joins", user.user_id));
    assert_eq!(response.1["room_id"], room_id);
}

async fn leave(server: &Server, user: &User, room_id: &str) {
    let response = membership_call(server, user, room_id, "leave", json!({})).await;
    assert_ok(&response, &format!("{} leaves", user.user_id));
}

async fn invite(server: &Server, by: &User, room_id: &str, whom: &User) {
    let response = membership_call(server, by, room_id, "invite", json!({ "user_id": whom.user_id })).await;
    assert_ok(&response, &format!("invite {}", whom.user_id));
}

/// GET /rooms/{id}/messages?{query}.
async fn messages(server: &Server, user: &User, room_id: &str, query: &str) -> (u16, Value) {
    server.get(&room_path(room_id, &format!("/messages?{query}")), Some(&user.token)).await
}

/// A `filter=` query parameter.
fn filter_param(filter: &Value) -> String {
    format!("&filter={}", enc(&filter.to_string()))
}

/// One /messages page that must succeed.
async fn page(server: &Server, user: &User, room_id: &str, query: &str) -> Value {
    let (status, body) = messages(server, user, room_id, query).await;
    assert_eq!(status, 200, "{} /messages?{query}: {body}", user.user_id);
    assert!(body["chunk"].is_array(), "no chunk: {body}");
    body
}

fn chunk_ids(body: &Value) -> Vec<String> {
    body["chunk"].as_array().map(|c| c.iter().map(id_of).collect()).unwrap_or_default()
}

fn id_of(event: &Value) -> String {
    event["event_id"].as_str().unwrap_or_else(|| panic!("no event_id in {event}")).to_owned()
}

/// Every event of a walk through /messages, following `end` until it is gone.
struct Walk {
    events: Vec<Value>,
    pages: usize,
}

impl Walk {
    fn ids(&self) -> Vec<String> {
        self.events.iter().map(id_of).collect()
    }
}

/// Pages through /messages from `from` (none: the default start of `dir`),
/// checking each page's `start` and size, until a page has no `end`.
async fn walk(
    server: &Server,
    user: &User,
    room_id: &str,
    dir: &str,
    limit: usize,
    from: Option<&str>,
    extra: &str,
) -> Walk {
    let mut from = from.map(str::to_owned);
    let mut events = Vec::new();
    let mut pages = 0;
    loop {
        let mut query = format!("dir={dir}&limit={limit}{extra}");
        if let Some(f) = &from {
            let _ = write!(query, "&from={}", enc(f));
        }
        let body = page(server, user, room_id, &query).await;
        if let Some(f) = &from {
            assert_eq!(body["start"], f.as_str(), "start is the from token: {body}");
        }
        let chunk = body["chunk"].as_array().expect("chunk");
        assert!(chunk.len() <= limit, "{} events for limit {limit}", chunk.len());
        events.extend(chunk.iter().cloned());
        pages += 1;
        assert!(pages < 10_000, "paging does not end");
        match body.get("end") {
            None => break,
            Some(Value::String(end)) => {
                assert!(!chunk.is_empty(), "an empty page with an end token: {body}");
                from = Some(end.clone());
            }
            Some(other) => panic!("end is not a string: {other}"),
        }
    }
    Walk { events, pages }
}

/// Everything `user` can read, newest first (dir=b from the newest).
async fn view_newest_first(server: &Server, user: &User, room_id: &str, limit: usize) -> Vec<String> {
    walk(server, user, room_id, "b", limit, None, "").await.ids()
}

#[track_caller]
fn assert_no_duplicates(ids: &[String], what: &str) {
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{what}: duplicates in {ids:?}");
}

/// The points just before and just after an event, as pagination tokens:
/// `start` and `end` of /context with limit 0. Tokens are opaque positions
/// (sparse ones: no arithmetic on them), so tests learn them from the server.
async fn around(server: &Server, user: &User, room_id: &str, event_id: &str) -> (String, String) {
    let path = room_path(room_id, &format!("/context/{}?limit=0", enc(event_id)));
    let (status, body) = server.get(&path, Some(&user.token)).await;
    assert_eq!(status, 200, "/context of {event_id}: {body}");
    let token = |k: &str| body[k].as_str().unwrap_or_else(|| panic!("no {k}: {body}")).to_owned();
    (token("start"), token("end"))
}

/// A room's seq line as its creator (joined throughout) reads it.
struct Line {
    events: Vec<Value>,
    index: HashMap<String, i64>,
}

impl Line {
    async fn load(server: &Server, creator: &User, room_id: &str) -> Self {
        let events = walk(server, creator, room_id, "f", 1000, None, "").await.events;
        let index: HashMap<String, i64> =
            events.iter().enumerate().map(|(i, e)| (id_of(e), i64::try_from(i).unwrap() + 1)).collect();
        assert_eq!(index.len(), events.len(), "duplicate events in the creator's timeline");
        // dir=b without `from` starts at the newest seq: the line is complete.
        let newest = page(server, creator, room_id, "dir=b&limit=1").await;
        let (_, after_last) = around(server, creator, room_id, &id_of(events.last().expect("events"))).await;
        assert_eq!(newest["start"], after_last.as_str(), "the creator sees every seq");
        assert_eq!(chunk_ids(&newest), vec![id_of(events.last().expect("events"))]);
        Self { events, index }
    }

    fn last(&self) -> i64 {
        i64::try_from(self.events.len()).unwrap()
    }

    #[track_caller]
    fn seq(&self, event_id: &str) -> i64 {
        *self.index.get(event_id).unwrap_or_else(|| panic!("{event_id} is not on the line"))
    }

    fn event(&self, seq: i64) -> &Value {
        &self.events[usize::try_from(seq - 1).unwrap()]
    }

    fn id(&self, seq: i64) -> String {
        id_of(self.event(seq))
    }

    /// The seq of the last history-visibility event setting `value`.
    fn hv_seq(&self, value: &str) -> i64 {
        (1..=self.last())
            .rev()
            .find(|s| {
                let e = self.event(*s);
                e["type"] == "m.room.history_visibility" && e["content"]["history_visibility"] == value
            })
            .unwrap_or_else(|| panic!("no history_visibility {value} on the line"))
    }

    /// The ids of the seqs in `ranges` (inclusive), oldest first.
    fn ids_in(&self, ranges: &[(i64, i64)]) -> Vec<String> {
        let mut seqs: Vec<i64> = ranges.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.into_iter().map(|s| self.id(s)).collect()
    }

    /// Newest first, as dir=b returns them.
    fn newest_first(&self, ranges: &[(i64, i64)]) -> Vec<String> {
        let mut ids = self.ids_in(ranges);
        ids.reverse();
        ids
    }

    /// Describes ids by seq, for failure messages.
    fn describe(&self, ids: &[String]) -> String {
        let seqs: Vec<i64> = ids.iter().map(|id| self.index.get(id).copied().unwrap_or(-1)).collect();
        format!("{seqs:?}")
    }
}

/// Asserts a user's view (newest first) is exactly `ranges` of the line.
#[track_caller]
fn assert_view(line: &Line, got: &[String], ranges: &[(i64, i64)], what: &str) {
    assert_no_duplicates(got, what);
    let want = line.newest_first(ranges);
    assert!(got == want, "{what}: got seqs {} want {}", line.describe(got), line.describe(&want));
}

/// The membership in force after `seq`, given (seq, membership) changes in order.
fn membership_after<'a>(changes: &[(i64, &'a str)], seq: i64) -> &'a str {
    changes.iter().take_while(|(s, _)| *s <= seq).last().map_or("leave", |(_, m)| m)
}

/// Checks `unsigned.membership` of every served event against the requester's changes.
#[track_caller]
fn assert_unsigned_membership(line: &Line, events: &[Value], changes: &[(i64, &str)], what: &str) {
    for event in events {
        let seq = line.seq(&id_of(event));
        assert_eq!(
            event["unsigned"]["membership"],
            membership_after(changes, seq),
            "{what}: unsigned.membership of seq {seq}: {event}"
        );
    }
}

/// Asserts the event at `seq` is `user`'s member event with `membership`.
#[track_caller]
fn assert_member(line: &Line, seq: i64, user: &User, membership: &str) {
    let e = line.event(seq);
    assert_eq!(
        (e["type"].as_str(), e["state_key"].as_str(), e["content"]["membership"].as_str()),
        (Some("m.room.member"), Some(user.user_id.as_str()), Some(membership)),
        "seq {seq}: {e}"
    );
}

/// Runs `f` over `items` with at most `workers` in flight; results in item order.
async fn bounded<T, R, F, Fut>(workers: usize, items: Vec<T>, f: F) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let total = items.len();
    let queue = Arc::new(Mutex::new(items.into_iter().enumerate()));
    let f = Arc::new(f);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let queue = Arc::clone(&queue);
        let f = Arc::clone(&f);
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let next = queue.lock().expect("queue").next();
                let Some((i, item)) = next else { break };
                done.push((i, f(item).await));
            }
            done
        });
    }
    let mut out: Vec<Option<R>> = (0..total).map(|_| None).collect();
    while let Some(result) = tasks.join_next().await {
        for (i, r) in result.expect("worker panicked") {
            out[i] = Some(r);
        }
    }
    out.into_iter().map(|r| r.expect("every item ran")).collect()
}

/// Registers `names` with at most 8 registrations in flight.
async fn register_all(server: &Arc<Server>, names: Vec<String>) -> Vec<User> {
    let server = Arc::clone(server);
    bounded(8, names, move |name| {
        let server = Arc::clone(&server);
        async move { server.register(&name, "pw").await }
    })
    .await
}

/// Sends `(sender, body)` messages with 8 senders in flight; returns the ids.
async fn say_all(server: &Arc<Server>, room_id: &str, items: Vec<(User, String)>) -> Vec<String> {
    let server = Arc::clone(server);
    let room_id = room_id.to_owned();
    bounded(8, items, move |(user, body)| {
        let server = Arc::clone(&server);
        let room_id = room_id.clone();
        async move { say(&server, &user, &room_id, &body).await }
    })
    .await
}

// ---------------------------------------------------------------------------
// 1. The chapter's hiking group, small

async fn hiking_group_small_scale(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let ben = server.register("ben", "pw").await;
    let cara = server.register("cara", "pw").await;
    let dan = server.register("dan", "pw").await;
    let room = public_room(&server, &ana, "joined").await;

    join(&server, &ben, &room).await;
    let mut bodies: HashMap<String, (String, String)> = HashMap::new();
    for i in 0..12 {
        let (who, body) =
            if i % 3 == 0 { (&ben, format!("ben before {i}")) } else { (&ana, format!("ana {i}")) };
        bodies.insert(say(&server, who, &room, &body).await, (who.user_id.clone(), body));
    }
    leave(&server, &ben, &room).await;
    let mut gap = Vec::new();
    for i in 0..64 {
        let body = format!("while ben was away {i}");
        let id = say(&server, &ana, &room, &body).await;
        bodies.insert(id.clone(), (ana.user_id.clone(), body));
        gap.push(id);
    }
    join(&server, &ben, &room).await;
    for i in 0..8 {
        let (who, body) =
            if i % 2 == 0 { (&ben, format!("ben back {i}")) } else { (&ana, format!("ana back {i}")) };
        bodies.insert(say(&server, who, &room, &body).await, (who.user_id.clone(), body));
    }
    join(&server, &cara, &room).await;
    for (i, who) in [&ana, &ben, &cara, &ana, &cara, &ben].into_iter().enumerate() {
        let body = format!("all three {i}");
        bodies.insert(say(&server, who, &room, &body).await, (who.user_id.clone(), body));
    }

    let line = Line::load(&server, &ana, &room).await;
    let prefix = line.hv_seq("joined");
    let member_seqs = |user: &User| -> Vec<(i64, String)> {
        (1..=line.last())
            .filter(|s| {
                line.event(*s)["type"] == "m.room.member"
                    && line.event(*s)["state_key"] == user.user_id.as_str()
            })
            .map(|s| (s, line.event(s)["content"]["membership"].as_str().unwrap().to_owned()))
            .collect()
    };
    let ben_changes = member_seqs(&ben);
    let ben_kinds: Vec<&str> = ben_changes.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(ben_kinds, vec!["join", "leave", "join"]);
    let (join1, leave1, join2) = (ben_changes[0].0, ben_changes[1].0, ben_changes[2].0);
    // Exactly 64 events between Ben's leave and his return: the gap.
    assert_eq!(join2 - leave1 - 1, 64);
    assert_eq!(line.ids_in(&[(leave1 + 1, join2 - 1)]), gap);
    assert_eq!(line.event(leave1)["sender"], ben.user_id.as_str());
    let cara_join = member_seqs(&cara)[0].0;

    // Ben, seven at a time: the shared creation prefix, his two stays (with his
    // own leave and rejoin), none of the gap; strictly newest first.
    let ben_walk = walk(&server, &ben, &room, "b", 7, None, "").await;
    let got = ben_walk.ids();
    let ben_ranges = [(1, prefix), (join1, leave1), (join2, line.last())];
    assert_view(&line, &got, &ben_ranges, "ben's history");
    assert!(ben_walk.pages >= 5, "{} pages", ben_walk.pages);
    for id in &gap {
        assert!(!got.contains(id), "ben sees the gap event {id}");
    }
    assert_eq!(got.last(), Some(&line.id(1)), "paging ends at the room's first event he can see");
    assert!(got.contains(&line.id(leave1)) && got.contains(&line.id(join2)));
    let seqs: Vec<i64> = got.iter().map(|id| line.seq(id)).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "not strictly newest first: {seqs:?}");
    // Real content: each message's body and sender as sent.
    for event in &ben_walk.events {
        if let Some((sender, body)) = bodies.get(&id_of(event)) {
            assert_eq!(event["content"]["body"], body.as_str(), "{event}");
            assert_eq!(event["sender"], sender.as_str(), "{event}");
            assert_eq!(event["type"], "m.room.message");
        }
    }
    let changes: Vec<(i64, &str)> = ben_changes.iter().map(|(s, m)| (*s, m.as_str())).collect();
    assert_unsigned_membership(&line, &ben_walk.events, &changes, "ben");
    // The gap is 404 through /event as well, and his own leave is readable.
    let response = get_event(&server, &ben, &room, &gap[0]).await;
    assert_error(&response, 404, "M_NOT_FOUND", "a gap event for ben");
    let (status, own_leave) = get_event(&server, &ben, &room, &line.id(leave1)).await;
    assert_eq!(status, 200, "{own_leave}");
    assert_eq!(own_leave["content"]["membership"], "leave");
    assert_eq!(own_leave["unsigned"]["membership"], "leave");

    // Cara: nothing before her join beyond the shared creation prefix.
    let cara_view = view_newest_first(&server, &cara, &room, 10).await;
    assert_view(&line, &cara_view, &[(1, prefix), (cara_join, line.last())], "cara's history");
    let response = get_event(&server, &cara, &room, &line.id(cara_join - 1)).await;
    assert_error(&response, 404, "M_NOT_FOUND", "the event before cara's join");

    // The pre-join window: later joins also read the 10 events before them.
    set_state(&server, &ana, &room, "org.seqline.prejoin_window", json!({ "events": 10 })).await;
    for i in 0..14 {
        say(&server, &ana, &room, &format!("before dan {i}")).await;
    }
    join(&server, &dan, &room).await;
    say(&server, &dan, &room, "dan here").await;
    let line = Line::load(&server, &ana, &room).await;
    let dan_join = line.last() - 1;
    assert_eq!(line.event(dan_join)["state_key"], dan.user_id.as_str());
    let dan_view = view_newest_first(&server, &dan, &room, 10).await;
    assert_view(&line, &dan_view, &[(1, prefix), (dan_join - 10, line.last())], "dan's history");
    // Past the creation prefix, his first event is the 10th before his join.
    let (_, after_prefix) = around(&server, &ana, &room, &line.id(prefix)).await;
    let first = page(&server, &dan, &room, &format!("dir=f&limit=1&from={after_prefix}")).await;
    assert_eq!(chunk_ids(&first), vec![line.id(dan_join - 10)]);
    assert_eq!(line.event(dan_join - 10)["content"]["body"], "before dan 4");
    // Joins before the setting keep their start.
    let cara_view = view_newest_first(&server, &cara, &room, 50).await;
    assert_view(&line, &cara_view, &[(1, prefix), (cara_join, line.last())], "cara after the window");

    // A rejoin is a later join: Cara's new stay starts 10 before it, the rest
    // of her time away stays hidden.
    leave(&server, &cara, &room).await;
    for i in 0..12 {
        say(&server, &ana, &room, &format!("cara away {i}")).await;
    }
    join(&server, &cara, &room).await;
    let line = Line::load(&server, &ana, &room).await;
    let (cara_leave, cara_rejoin) = (line.last() - 13, line.last());
    assert_member(&line, cara_leave, &cara, "leave");
    assert_member(&line, cara_rejoin, &cara, "join");
    let cara_view = view_newest_first(&server, &cara, &room, 50).await;
    assert_view(
        &line,
        &cara_view,
        &[(1, prefix), (cara_join, cara_leave), (cara_rejoin - 10, cara_rejoin)],
        "cara after rejoining",
    );
    assert_eq!(line.event(cara_rejoin - 10)["content"]["body"], "cara away 2");
}

// ---------------------------------------------------------------------------
// 2. The chapter literally: 500 members at message 4,900

async fn hiking_group_as_in_the_chapter(backend: Backend) {
    let started = Instant::now();
    let server = Arc::new(Server::start(&backend).await);
    let ana = server.register("ana", "pw").await;
    let mut names = vec!["ben".to_owned(), "cara".to_owned(), "dan".to_owned()];
    names.extend((1..=497).map(|i| format!("hiker{i:03}")));
    let mut users = register_all(&server, names).await;
    let hikers = users.split_off(3);
    let (ben, cara, dan) = (users[0].clone(), users[1].clone(), users[2].clone());
    eprintln!("registered 500 users in {:?}", started.elapsed());

    // Seqs 1..=6: creation, with `joined` last (the shared prefix).
    let room = public_room(&server, &ana, "joined").await;
    join(&server, &ben, &room).await; // seq 7: Ben is in from the start
    {
        let server = Arc::clone(&server);
        let room = room.clone();
        bounded(8, hikers.clone(), move |user| {
            let server = Arc::clone(&server);
            let room = room.clone();
            async move { join(&server, &user, &room).await }
        })
        .await;
    } // seqs 8..=504

    let mut senders = vec![ana.clone(), ben.clone()];
    senders.extend(hikers.iter().cloned());
    let batch = |senders: &[User], from: i64, to: i64| -> Vec<(User, String)> {
        (from..=to)
            .map(|s| {
                (senders[usize::try_from(s).unwrap() % senders.len()].clone(), format!("message at {s}"))
            })
            .collect()
    };
    say_all(&server, &room, batch(&senders, 505, 4815)).await;
    leave(&server, &ben, &room).await; // 4,816
    senders.remove(1);
    say_all(&server, &room, batch(&senders, 4817, 4836)).await;
    join(&server, &cara, &room).await; // 4,837
    senders.push(cara.clone());
    say_all(&server, &room, batch(&senders, 4838, 4880)).await;
    join(&server, &ben, &room).await; // 4,881
    senders.push(ben.clone());
    say_all(&server, &room, batch(&senders, 4882, 4900)).await;
    eprintln!("room at 4,900 after {:?}", started.elapsed());

    let line = Line::load(&server, &ana, &room).await;
    assert_eq!(line.last(), 4900);
    let prefix = line.hv_seq("joined");
    assert_eq!(prefix, 6);
    assert_member(&line, 7, &ben, "join");
    assert_member(&line, 4816, &ben, "leave");
    assert_member(&line, 4837, &cara, "join");
    assert_member(&line, 4881, &ben, "join");
    // Messages are where the batches put them, from the senders they were given.
    // Each batch's messages fill exactly its stretch of the line (in whatever
    // order the 8 concurrent senders got their seqs).
    for (lo, hi) in [(505, 4815), (4817, 4836), (4838, 4880), (4882, 4900)] {
        let got: BTreeSet<String> = (lo..=hi)
            .map(|s| line.event(s)["content"]["body"].as_str().unwrap_or_default().to_owned())
            .collect();
        let want: BTreeSet<String> = (lo..=hi).map(|s| format!("message at {s}")).collect();
        assert!(got == want, "messages {lo}..={hi} are not exactly that batch");
    }
    let (status, members) = server.get(&room_path(&room, "/joined_members"), Some(&ana.token)).await;
    assert_eq!(status, 200, "{members}");
    assert_eq!(members["joined"].as_object().map(serde_json::Map::len), Some(500));

    // Ben: exactly his two stays (and the creation prefix); not the 64 of the gap.
    let got = view_newest_first(&server, &ben, &room, 100).await;
    assert_view(&line, &got, &[(1, 6), (7, 4816), (4881, 4900)], "ben");
    let gap: BTreeSet<String> = line.ids_in(&[(4817, 4880)]).into_iter().collect();
    assert_eq!(gap.len(), 64);
    assert!(got.iter().all(|id| !gap.contains(id)), "ben sees part of the gap");
    eprintln!("ben paged after {:?}", started.elapsed());

    // Cara: nothing of the 4,830 messages and joins before hers (past the prefix).
    let got = view_newest_first(&server, &cara, &room, 100).await;
    assert_view(&line, &got, &[(1, 6), (4837, 4900)], "cara");
    // A hiker (the joins ran concurrently: wherever his fell) sees from his join on.
    let got = view_newest_first(&server, &hikers[0], &room, 100).await;
    let hiker_join = line.seq(&got[got.len() - 7]);
    assert_member(&line, hiker_join, &hikers[0], "join");
    assert_view(&line, &got, &[(1, 6), (hiker_join, 4900)], "first hiker");

    // "Newcomers see the 100 messages before they joined": Dan's start moves back 100.
    set_state(&server, &ana, &room, "org.seqline.prejoin_window", json!({ "events": 100 })).await; // 4,901
    join(&server, &dan, &room).await; // 4,902
    let line = Line::load(&server, &ana, &room).await;
    assert_member(&line, 4902, &dan, "join");
    let got = view_newest_first(&server, &dan, &room, 100).await;
    assert_view(&line, &got, &[(1, 6), (4802, 4902)], "dan");
    let first = page(&server, &dan, &room, "dir=f&limit=1&from=t6").await;
    assert_eq!(chunk_ids(&first), vec![line.id(4802)]);
    assert_eq!(line.event(4802)["type"], "m.room.message");
    // Cara's start did not move.
    let got = view_newest_first(&server, &cara, &room, 100).await;
    assert_view(&line, &got, &[(1, 6), (4837, 4902)], "cara after the window");
    eprintln!("chapter test done in {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// 3. History visibility settings

async fn shared_history_and_leaving(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let cara = server.register("cara", "pw").await;
    let eve = server.register("eve", "pw").await;
    // public_chat: shared history.
    let room = create_room(&server, &ana, json!({ "preset": "public_chat" })).await;
    set_state(&server, &ana, &room, "m.room.name", json!({ "name": "Before" })).await;
    let m1 = say(&server, &ana, &room, "m1").await;
    say(&server, &ana, &room, "m2").await;

    // A later joiner reads all the shared history before their join.
    join(&server, &bob, &room).await;
    let line = Line::load(&server, &ana, &room).await;
    let bob_join = line.last();
    let got = view_newest_first(&server, &bob, &room, 3).await;
    assert_view(&line, &got, &[(1, bob_join)], "bob while joined");
    let (status, event) = get_event(&server, &bob, &room, &m1).await;
    assert_eq!((status, &event["content"]["body"]), (200, &json!("m1")), "{event}");
    assert_eq!(event["unsigned"]["membership"], "leave", "bob was not in the room at m1");

    say(&server, &bob, &room, "m3").await;
    let response = membership_call(&server, &bob, &room, "leave", json!({ "reason": "off hiking" })).await;
    assert_ok(&response, "bob leaves");
    set_state(&server, &ana, &room, "m.room.name", json!({ "name": "After" })).await;
    say(&server, &ana, &room, "m4").await;
    join(&server, &cara, &room).await;

    let line = Line::load(&server, &ana, &room).await;
    let bob_leave = bob_join + 2;
    assert_eq!(line.event(bob_leave)["content"], json!({ "membership": "leave", "reason": "off hiking" }));
    // Having left, Bob keeps what he could read (the spec: shared history is
    // open to anyone who joined after it was sent): everything up to his own
    // leave, nothing after.
    let walked = walk(&server, &bob, &room, "b", 2, None, "").await;
    assert_view(&line, &walked.ids(), &[(1, bob_leave)], "bob after leaving");
    assert_unsigned_membership(&line, &walked.events, &[(bob_join, "join"), (bob_leave, "leave")], "bob");
    let (status, event) = get_event(&server, &bob, &room, &m1).await;
    assert_eq!(
        (status, &event["content"]["body"]),
        (200, &json!("m1")),
        "m1 stays readable after leaving: {event}"
    );
    // Nothing after his leave, forwards from it.
    let (_, after_leave) = around(&server, &bob, &room, &line.id(bob_leave)).await;
    let after = page(&server, &bob, &room, &format!("dir=f&limit=10&from={after_leave}")).await;
    assert_eq!(chunk_ids(&after), Vec::<String>::new());
    assert!(after.get("end").is_none(), "{after}");

    // The room as of his leave: the old name, himself as left, no Cara.
    let state = room_state(&server, &bob, &room).await;
    assert_eq!(find(&state, "m.room.name", "").expect("name")["content"], json!({ "name": "Before" }));
    assert_eq!(find(&state, "m.room.member", &bob.user_id).expect("bob")["event_id"], line.id(bob_leave));
    assert!(find(&state, "m.room.member", &cara.user_id).is_none(), "cara joined after bob left");
    let (status, name) = server.get(&state_path(&room, "m.room.name", ""), Some(&bob.token)).await;
    assert_eq!((status, name), (200, json!({ "name": "Before" })));
    let (status, body) = server.get(&room_path(&room, "/members"), Some(&bob.token)).await;
    assert_eq!(status, 200, "{body}");
    let mut listed: Vec<(String, String)> = body["chunk"]
        .as_array()
        .expect("chunk")
        .iter()
        .map(|e| {
            (
                e["state_key"].as_str().unwrap().to_owned(),
                e["content"]["membership"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![(ana.user_id.clone(), "join".to_owned()), (bob.user_id.clone(), "leave".to_owned())]
    );
    let response = server.get(&room_path(&room, "/joined_members"), Some(&bob.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "joined_members after leaving");

    // Cara, joined later, reads everything (shared).
    let got = view_newest_first(&server, &cara, &room, 5).await;
    assert_view(&line, &got, &[(1, line.last())], "cara");

    // Eve was never in the room: 403 for /messages and /context, 404 for /event.
    let response = messages(&server, &eve, &room, "dir=b&limit=10").await;
    assert_error(&response, 403, "M_FORBIDDEN", "/messages for a non-member");
    let response =
        server.get(&room_path(&room, &format!("/context/{}?limit=4", enc(&m1))), Some(&eve.token)).await;
    assert_error(&response, 403, "M_FORBIDDEN", "/context for a non-member");
    let response = get_event(&server, &eve, &room, &m1).await;
    assert_error(&response, 404, "M_NOT_FOUND", "/event for a non-member");
}

async fn invited_history_starts_at_the_invite(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(
        &server,
        &ana,
        json!({
            "preset": "private_chat",
            "initial_state": [{
                "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "invited" },
            }],
        }),
    )
    .await;
    let m1 = say(&server, &ana, &room, "before the invite").await;
    invite(&server, &ana, &room, &bob).await;
    let m2 = say(&server, &ana, &room, "after the invite").await;
    join(&server, &bob, &room).await;
    say(&server, &bob, &room, "bob joined").await;

    let line = Line::load(&server, &ana, &room).await;
    let prefix = line.hv_seq("invited");
    let invite_seq = line.seq(&m1) + 1;
    assert_eq!(line.event(invite_seq)["content"]["membership"], "invite");
    let walked = walk(&server, &bob, &room, "b", 3, None, "").await;
    assert_view(&line, &walked.ids(), &[(1, prefix), (invite_seq, line.last())], "bob");
    let changes = [(invite_seq, "invite"), (invite_seq + 2, "join")];
    assert_unsigned_membership(&line, &walked.events, &changes, "bob");
    let response = get_event(&server, &bob, &room, &m1).await;
    assert_error(&response, 404, "M_NOT_FOUND", "the message before the invite");
    let (status, event) = get_event(&server, &bob, &room, &m2).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "after the invite");
    assert_eq!(event["unsigned"]["membership"], "invite");

    // An invite rejected without ever joining: the invite through the rejection.
    let carl = server.register("carl", "pw").await;
    invite(&server, &ana, &room, &carl).await;
    let while_invited = say(&server, &ana, &room, "while carl is invited").await;
    leave(&server, &carl, &room).await;
    say(&server, &ana, &room, "after carl declined").await;
    let line = Line::load(&server, &ana, &room).await;
    let carl_invite = line.seq(&while_invited) - 1;
    assert_member(&line, carl_invite, &carl, "invite");
    assert_member(&line, carl_invite + 2, &carl, "leave");
    let walked = walk(&server, &carl, &room, "b", 10, None, "").await;
    assert_view(&line, &walked.ids(), &[(carl_invite, carl_invite + 2)], "carl");
    assert_unsigned_membership(
        &line,
        &walked.events,
        &[(carl_invite, "invite"), (carl_invite + 2, "leave")],
        "carl",
    );
}

async fn world_readable_needs_no_membership(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = create_room(
        &server,
        &ana,
        json!({
            "preset": "private_chat",
            "initial_state": [{
                "type": "m.room.history_visibility", "state_key": "",
                "content": { "history_visibility": "world_readable" },
            }],
        }),
    )
    .await;
    let m1 = say(&server, &ana, &room, "for everyone").await;
    say(&server, &ana, &room, "also for everyone").await;
    let line = Line::load(&server, &ana, &room).await;
    let readable_from = line.hv_seq("world_readable");

    // Eve never joined: she reads from the world_readable setting on (what
    // came before it was sent under `shared`, for members only).
    let walked = walk(&server, &eve, &room, "b", 2, None, "").await;
    assert_view(&line, &walked.ids(), &[(readable_from, line.last())], "eve");
    assert_unsigned_membership(&line, &walked.events, &[], "eve");
    let (status, event) = get_event(&server, &eve, &room, &m1).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["content"]["body"], "for everyone");
    assert_eq!(event["sender"], ana.user_id.as_str());
    let response = get_event(&server, &eve, &room, &line.id(1)).await;
    assert_error(&response, 404, "M_NOT_FOUND", "the create event, sent under shared");
    let (status, context) =
        server.get(&room_path(&room, &format!("/context/{}?limit=10", enc(&m1))), Some(&eve.token)).await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(context["event"]["event_id"], m1.as_str());
    assert_eq!(chunk_of(&context, "events_before"), vec![line.id(readable_from)]);
    assert_eq!(chunk_of(&context, "events_after"), vec![line.id(line.last())]);

    // Back to `joined`: the change itself still counts as world_readable, what
    // follows is for members only, and what came before stays readable.
    let to_joined = set_state(
        &server,
        &ana,
        &room,
        "m.room.history_visibility",
        json!({ "history_visibility": "joined" }),
    )
    .await;
    let members_only = say(&server, &ana, &room, "members only").await;
    let line = Line::load(&server, &ana, &room).await;
    let got = view_newest_first(&server, &eve, &room, 10).await;
    assert_view(&line, &got, &[(readable_from, line.seq(&to_joined))], "eve after the change to joined");
    let response = get_event(&server, &eve, &room, &members_only).await;
    assert_error(&response, 404, "M_NOT_FOUND", "a members-only event for a non-member");
    let (status, event) = get_event(&server, &eve, &room, &to_joined).await;
    assert_eq!((status, &event["content"]["history_visibility"]), (200, &json!("joined")), "{event}");
}

fn chunk_of(body: &Value, key: &str) -> Vec<String> {
    body[key].as_array().unwrap_or_else(|| panic!("no {key} in {body}")).iter().map(id_of).collect()
}

async fn visibility_change_hides_exactly_what_was_sent_under_joined(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let cara = server.register("cara", "pw").await;
    let room = create_room(&server, &ana, json!({ "preset": "public_chat" })).await;
    let m1 = say(&server, &ana, &room, "shared 1").await;
    let to_joined = set_state(
        &server,
        &ana,
        &room,
        "m.room.history_visibility",
        json!({ "history_visibility": "joined" }),
    )
    .await;
    let m2 = say(&server, &ana, &room, "joined 2").await;
    let m3 = say(&server, &ana, &room, "joined 3").await;
    let to_shared = set_state(
        &server,
        &ana,
        &room,
        "m.room.history_visibility",
        json!({ "history_visibility": "shared" }),
    )
    .await;
    say(&server, &ana, &room, "shared 4").await;
    join(&server, &cara, &room).await;
    say(&server, &cara, &room, "shared 5").await;

    let line = Line::load(&server, &ana, &room).await;
    let (j, s) = (line.seq(&to_joined), line.seq(&to_shared));
    assert_eq!((line.seq(&m2), line.seq(&m3)), (j + 1, j + 2));
    // Both setting events count as the more permissive setting: shared.
    let got = view_newest_first(&server, &cara, &room, 4).await;
    assert_view(&line, &got, &[(1, j), (s, line.last())], "cara");
    for hidden in [&m2, &m3] {
        let response = get_event(&server, &cara, &room, hidden).await;
        assert_error(&response, 404, "M_NOT_FOUND", "an event sent under joined");
    }
    let (status, context) =
        server.get(&room_path(&room, &format!("/context/{}?limit=4", enc(&m1))), Some(&cara.token)).await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(chunk_of(&context, "events_after"), vec![to_joined.clone(), to_shared.clone()]);
    assert_eq!(
        chunk_of(&context, "events_before"),
        vec![line.id(line.seq(&m1) - 1), line.id(line.seq(&m1) - 2)]
    );
}

/// Only the `m.room.history_visibility` event with state key "" is the room's
/// setting (the spec's state key for it); one with another state key is just
/// some state and opens nothing.
async fn history_visibility_counts_only_with_the_empty_state_key(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let eve = server.register("eve", "pw").await;
    let room = public_room(&server, &ana, "joined").await;
    let response = put_state(
        &server,
        &ana,
        &room,
        "m.room.history_visibility",
        "decoy",
        json!({ "history_visibility": "world_readable" }),
    )
    .await;
    assert_ok(&response, "history_visibility with state key decoy");
    let response_decoy = response.1;
    let secret = say(&server, &ana, &room, "members only").await;
    join(&server, &bob, &room).await;
    say(&server, &bob, &room, "hi").await;

    let line = Line::load(&server, &ana, &room).await;
    let prefix = line.hv_seq("joined");
    let (status, setting) =
        server.get(&state_path(&room, "m.room.history_visibility", ""), Some(&ana.token)).await;
    assert_eq!((status, setting), (200, json!({ "history_visibility": "joined" })));
    // Eve, never a member: nothing (the room is `joined`). Bob, joined later:
    // the creation prefix and his own stay only. (Checked all together, so a
    // failure shows each answer.)
    let mut failures = Vec::new();
    let response = get_event(&server, &eve, &room, &secret).await;
    if (response.0, response.1["errcode"].as_str()) != (404, Some("M_NOT_FOUND")) {
        failures
            .push(format!("eve GET /event {secret}: {} {} (want 404 M_NOT_FOUND)", response.0, response.1));
    }
    let response = messages(&server, &eve, &room, "dir=b&limit=10").await;
    if (response.0, response.1["errcode"].as_str()) != (403, Some("M_FORBIDDEN")) {
        let seqs = line.describe(&chunk_ids(&response.1));
        failures.push(format!(
            "eve GET /messages?dir=b&limit=10: {} with seqs {seqs} (want 403 M_FORBIDDEN)",
            response.0
        ));
    }
    let got = view_newest_first(&server, &bob, &room, 10).await;
    let bob_join = line.last() - 1;
    assert_member(&line, bob_join, &bob, "join");
    let want = line.newest_first(&[(1, prefix), (bob_join, line.last())]);
    if got != want {
        failures.push(format!("bob reads seqs {} (want {})", line.describe(&got), line.describe(&want)));
    }
    let decoy = line.seq(&event_id_of(&response_decoy));
    assert!(failures.is_empty(), "decoy setting at seq {decoy}, joined at {prefix}: {failures:#?}");
}

// ---------------------------------------------------------------------------
// 4. Kick and ban

async fn kick_and_ban_end_the_stay_and_unban_allows_a_rejoin(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = public_room(&server, &ana, "joined").await;

    join(&server, &bob, &room).await;
    say(&server, &bob, &room, "hello").await;
    let response =
        membership_call(&server, &ana, &room, "kick", json!({ "user_id": bob.user_id, "reason": "spam" }))
            .await;
    assert_ok(&response, "kick");
    let after_kick = say(&server, &ana, &room, "after the kick").await;

    let line = Line::load(&server, &ana, &room).await;
    let prefix = line.hv_seq("joined");
    let kick = line.seq(&after_kick) - 1;
    let join1 = kick - 2;
    let kick_event = line.event(kick);
    assert_eq!(kick_event["content"], json!({ "membership": "leave", "reason": "spam" }));
    assert_eq!(kick_event["sender"], ana.user_id.as_str());
    assert_eq!(kick_event["state_key"], bob.user_id.as_str());

    // Bob sees up to and including his kick, with the reason, and nothing after.
    let first = page(&server, &bob, &room, "dir=b&limit=1").await;
    assert_eq!(chunk_ids(&first), vec![line.id(kick)]);
    assert_eq!(first["chunk"][0]["content"]["reason"], "spam");
    assert_eq!(first["chunk"][0]["unsigned"]["membership"], "leave");
    let got = view_newest_first(&server, &bob, &room, 3).await;
    // The shared creation prefix was sent before his join: still his to read.
    assert_view(&line, &got, &[(1, prefix), (join1, kick)], "bob after the kick");
    let response = get_event(&server, &bob, &room, &after_kick).await;
    assert_error(&response, 404, "M_NOT_FOUND", "the message after the kick");
    let response = send(&server, &bob, &room, "kicked", text("still here?")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a kicked user sends");

    // A kicked user may come back to a public room; then Ana bans him.
    join(&server, &bob, &room).await;
    say(&server, &bob, &room, "back again").await;
    let response =
        membership_call(&server, &ana, &room, "ban", json!({ "user_id": bob.user_id, "reason": "abuse" }))
            .await;
    assert_ok(&response, "ban");
    let during_ban = say(&server, &ana, &room, "during the ban").await;
    for path in [room_path(&room, "/join"), format!("{V3}/join/{}", enc(&room))] {
        let response = server.post(&path, Some(&bob.token), json!({})).await;
        assert_error(&response, 403, "M_FORBIDDEN", &format!("banned user joins via {path}"));
    }
    let response = send(&server, &bob, &room, "banned", text("let me in")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a banned user sends");
    let response = membership_call(&server, &ana, &room, "unban", json!({ "user_id": bob.user_id })).await;
    assert_ok(&response, "unban");
    let after_unban = say(&server, &ana, &room, "after the unban").await;
    let response = server.post(&format!("{V3}/join/{}", enc(&room)), Some(&bob.token), json!({})).await;
    assert_ok(&response, "join after the unban");
    assert_eq!(response.1["room_id"], room.as_str());
    say(&server, &bob, &room, "third stay").await;

    let line = Line::load(&server, &ana, &room).await;
    let ban = line.seq(&during_ban) - 1;
    let join2 = ban - 2;
    let unban = line.seq(&during_ban) + 1;
    let join3 = line.seq(&after_unban) + 1;
    assert_eq!(line.event(ban)["content"], json!({ "membership": "ban", "reason": "abuse" }));
    assert_eq!(line.event(unban)["content"], json!({ "membership": "leave" }));
    assert_eq!(line.event(unban)["sender"], ana.user_id.as_str());
    assert_eq!(line.event(join2)["content"]["membership"], "join");
    assert_eq!(line.event(join3)["content"]["membership"], "join");
    assert_eq!(line.event(join3)["state_key"], bob.user_id.as_str());

    // Three stays; the gaps (after the kick; the ban to the rejoin) hidden.
    let walked = walk(&server, &bob, &room, "b", 4, None, "").await;
    assert_view(
        &line,
        &walked.ids(),
        &[(1, prefix), (join1, kick), (join2, ban), (join3, line.last())],
        "bob",
    );
    let changes =
        [(join1, "join"), (kick, "leave"), (join2, "join"), (ban, "ban"), (unban, "leave"), (join3, "join")];
    assert_unsigned_membership(&line, &walked.events, &changes, "bob");
    for hidden in [&after_kick, &during_ban, &after_unban, &line.id(unban)] {
        let response = get_event(&server, &bob, &room, hidden).await;
        assert_error(&response, 404, "M_NOT_FOUND", "an event between stays");
    }
    let (status, ban_event) = get_event(&server, &bob, &room, &line.id(ban)).await;
    assert_eq!(status, 200, "{ban_event}");
    assert_eq!(ban_event["content"]["reason"], "abuse");
    assert_eq!(ban_event["unsigned"]["membership"], "ban");
}

// ---------------------------------------------------------------------------
// 5. Floors

async fn room_floor_by_purge(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let dan = server.register("dan", "pw").await;
    let room = public_room(&server, &ana, "joined").await;
    join(&server, &bob, &room).await;
    let mut ids = Vec::new();
    for i in 1..=6 {
        let who = if i % 2 == 0 { &bob } else { &ana };
        ids.push(say(&server, who, &room, &format!("m{i}")).await);
    }
    let line = Line::load(&server, &ana, &room).await;
    let m4 = line.seq(&ids[3]);

    // Only a room admin may purge.
    let purge = format!("{SEQLINE}/rooms/{}/purge", enc(&room));
    let response = server.post(&purge, Some(&bob.token), json!({ "before_event_id": ids[3] })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "purge by a member at power 0");
    let (status, event) = get_event(&server, &bob, &room, &ids[0]).await;
    assert_eq!((status, &event["content"]["body"]), (200, &json!("m1")), "nothing purged: {event}");

    let unknown = "$unknownevent000000000000000000000000000000";
    let response = server.post(&purge, Some(&ana.token), json!({ "before_event_id": unknown })).await;
    assert_error(&response, 404, "M_NOT_FOUND", "purge before an unknown event");
    let got = view_newest_first(&server, &bob, &room, 100).await;
    assert_view(&line, &got, &[(1, line.last())], "bob after the refused purges");
    let response = server.post(&purge, Some(&ana.token), json!({ "before_event_id": ids[3] })).await;
    assert_ok(&response, "purge by the creator");
    let last = line.last();
    for user in [&ana, &bob] {
        let got = view_newest_first(&server, user, &room, 2).await;
        assert_view(&line, &got, &[(m4, last)], &format!("{} after the purge", user.user_id));
        let forward = walk(&server, user, &room, "f", 2, None, "").await;
        assert_eq!(forward.ids(), line.ids_in(&[(m4, last)]), "dir=f for {}", user.user_id);
        let response = get_event(&server, user, &room, &ids[2]).await;
        assert_error(&response, 404, "M_NOT_FOUND", "an event below the floor");
        let (status, event) = get_event(&server, user, &room, &ids[3]).await;
        assert_eq!((status, &event["content"]["body"]), (200, &json!("m4")), "{event}");
        let response = server
            .get(&room_path(&room, &format!("/context/{}?limit=10", enc(&ids[2]))), Some(&user.token))
            .await;
        assert_error(&response, 404, "M_NOT_FOUND", "/context below the floor");
        let (status, context) = server
            .get(&room_path(&room, &format!("/context/{}?limit=10", enc(&ids[4]))), Some(&user.token))
            .await;
        assert_eq!(status, 200, "{context}");
        assert_eq!(chunk_of(&context, "events_before"), vec![ids[3].clone()]);
        assert_eq!(chunk_of(&context, "events_after"), vec![ids[5].clone()]);
    }

    // A purge before an earlier event does not bring anything back.
    let response = server.post(&purge, Some(&ana.token), json!({ "before_event_id": ids[1] })).await;
    assert!(response.0 == 200 || response.0 >= 400, "{response:?}");
    for user in [&ana, &bob] {
        let got = view_newest_first(&server, user, &room, 10).await;
        assert_view(&line, &got, &[(m4, last)], &format!("{} after purging lower", user.user_id));
    }

    // A pre-join window never reaches below the floor.
    set_state(&server, &ana, &room, "org.seqline.prejoin_window", json!({ "events": 1000 })).await;
    join(&server, &dan, &room).await;
    let line = Line::load_from(&server, &ana, &room, &line).await;
    let got = view_newest_first(&server, &dan, &room, 3).await;
    assert_view(&line, &got, &[(m4, line.last())], "dan with a window of 1000");

    // In a v11 room the creator is at power 100, the level purging needs.
    let old_room = create_room(&server, &ana, json!({ "room_version": "11", "preset": "public_chat" })).await;
    let (status, power) =
        server.get(&state_path(&old_room, "m.room.power_levels", ""), Some(&ana.token)).await;
    assert_eq!((status, &power["users"][&ana.user_id]), (200, &json!(100)), "{power}");
    join(&server, &bob, &old_room).await;
    let first = say(&server, &ana, &old_room, "first").await;
    let second = say(&server, &bob, &old_room, "second").await;
    let purge = format!("{SEQLINE}/rooms/{}/purge", enc(&old_room));
    let response = server.post(&purge, Some(&bob.token), json!({ "before_event_id": second })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "purge by a member at power 0 (v11)");
    let response = server.post(&purge, Some(&ana.token), json!({ "before_event_id": second })).await;
    assert_ok(&response, "purge by the v11 creator");
    for user in [&ana, &bob] {
        assert_eq!(view_newest_first(&server, user, &old_room, 10).await, vec![second.clone()]);
        let response = get_event(&server, user, &old_room, &first).await;
        assert_error(&response, 404, "M_NOT_FOUND", "below the v11 floor");
    }
}

impl Line {
    /// The line after more events were appended, for a user who can no longer
    /// read the start (a floor): the known prefix plus what the user reads
    /// forwards from its end.
    async fn load_from(server: &Server, user: &User, room_id: &str, known: &Line) -> Self {
        let (_, after_known) = around(server, user, room_id, &known.id(known.last())).await;
        let more = walk(server, user, room_id, "f", 1000, Some(&after_known), "").await.events;
        let mut events = known.events.clone();
        events.extend(more);
        let index: HashMap<String, i64> =
            events.iter().enumerate().map(|(i, e)| (id_of(e), i64::try_from(i).unwrap() + 1)).collect();
        let newest = page(server, user, room_id, "dir=b&limit=1").await;
        let (_, after_last) = around(server, user, room_id, &id_of(events.last().expect("events"))).await;
        assert_eq!(newest["start"], after_last.as_str(), "the line is complete");
        Self { events, index }
    }
}

async fn user_floor_holds_on_every_device(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &ana, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let m1 = say(&server, &ana, &room, "m1").await;
    say(&server, &bob, &room, "m2").await;
    let m3 = say(&server, &ana, &room, "m3").await;
    let ana_phone = server.login("ana", "pw").await;
    assert_ne!(ana_phone.device_id, ana.device_id);
    let line = Line::load(&server, &ana, &room).await;

    let clear = format!("{SEQLINE}/rooms/{}/clear_history", enc(&room));
    let response = server.post(&clear, Some(&ana.token), json!({})).await;
    assert_ok(&response, "clear_history");
    let ana_tablet = server.login("ana", "pw").await;
    for device in [&ana, &ana_phone, &ana_tablet] {
        for query in ["dir=b&limit=10", "dir=f&limit=10"] {
            let body = page(&server, device, &room, query).await;
            assert_eq!(chunk_ids(&body), Vec::<String>::new(), "{} {query}", device.device_id);
            assert!(body.get("end").is_none(), "{body}");
        }
        for id in [&m1, &m3] {
            let response = get_event(&server, device, &room, id).await;
            assert_error(&response, 404, "M_NOT_FOUND", "an event below ana's floor");
        }
    }
    // Bob is not affected.
    let got = view_newest_first(&server, &bob, &room, 3).await;
    assert_view(&line, &got, &[(1, line.last())], "bob");

    // Newer events are visible to Ana again.
    let m4 = say(&server, &bob, &room, "m4").await;
    let m5 = say(&server, &ana, &room, "m5").await;
    for device in [&ana, &ana_phone, &ana_tablet] {
        let got = view_newest_first(&server, device, &room, 1).await;
        assert_eq!(got, vec![m5.clone(), m4.clone()], "{}", device.device_id);
        let (status, context) = server
            .get(&room_path(&room, &format!("/context/{}?limit=10", enc(&m4))), Some(&device.token))
            .await;
        assert_eq!(status, 200, "{context}");
        assert_eq!(chunk_of(&context, "events_before"), Vec::<String>::new());
        assert_eq!(chunk_of(&context, "events_after"), vec![m5.clone()]);
        let response = server
            .get(&room_path(&room, &format!("/context/{}?limit=10", enc(&m3))), Some(&device.token))
            .await;
        assert_error(&response, 404, "M_NOT_FOUND", "/context below ana's floor");
        let (status, event) = get_event(&server, device, &room, &m4).await;
        assert_eq!((status, &event["content"]["body"]), (200, &json!("m4")), "{event}");
    }
    let (status, context) =
        server.get(&room_path(&room, &format!("/context/{}?limit=10", enc(&m4))), Some(&bob.token)).await;
    assert_eq!(status, 200, "{context}");
    // Bob's context reaches below Ana's floor: m3, m2, m1, his join, the setting.
    let five_before = line.newest_first(&[(line.last() - 4, line.last())]);
    assert_eq!(five_before[0], m3);
    assert_eq!(chunk_of(&context, "events_before"), five_before);
}

// ---------------------------------------------------------------------------
// 6. The race between sends and the sender's leave

async fn send_racing_the_senders_leave(backend: Backend) {
    let server = Arc::new(Server::start(&backend).await);
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let room = create_room(&server, &ana, json!({ "preset": "public_chat" })).await;
    join(&server, &bob, &room).await;
    let before = Line::load(&server, &ana, &room).await;
    let bob_join = before.last();

    let mut tasks = tokio::task::JoinSet::new();
    let spawn_send = |tasks: &mut tokio::task::JoinSet<(usize, u16, Value)>, i: usize| {
        let (server, bob, room) = (Arc::clone(&server), bob.clone(), room.clone());
        tasks.spawn(async move {
            let (status, body) =
                send(&server, &bob, &room, &format!("race{i}"), text(&format!("race {i}"))).await;
            (i, status, body)
        });
    };
    for i in 0..10 {
        spawn_send(&mut tasks, i);
    }
    let leave_task = {
        let (server, bob, room) = (Arc::clone(&server), bob.clone(), room.clone());
        tokio::spawn(async move { membership_call(&server, &bob, &room, "leave", json!({})).await })
    };
    for i in 10..20 {
        spawn_send(&mut tasks, i);
    }
    let mut acked: HashMap<String, String> = HashMap::new();
    let mut refused = Vec::new();
    while let Some(result) = tasks.join_next().await {
        let (i, status, body) = result.expect("send task");
        match status {
            200 => {
                acked.insert(event_id_of(&body), format!("race {i}"));
            }
            403 => {
                assert_eq!(body["errcode"], "M_FORBIDDEN", "{body}");
                refused.push(i);
            }
            other => panic!("send {i}: {other} {body}"),
        }
    }
    let leave_response = leave_task.await.expect("leave task");
    assert_ok(&leave_response, "the leave");
    eprintln!("race: {} sends acknowledged, {} refused", acked.len(), refused.len());
    // A send after the leave returned is refused, too.
    let response = send(&server, &bob, &room, "late", text("late")).await;
    assert_error(&response, 403, "M_FORBIDDEN", "a send after the leave");

    let line = Line::load(&server, &ana, &room).await;
    let after: Vec<&Value> = (bob_join + 1..=line.last()).map(|s| line.event(s)).collect();
    let leave_at = after
        .iter()
        .position(|e| e["type"] == "m.room.member" && e["state_key"] == bob.user_id.as_str())
        .expect("bob's leave on the line");
    assert_eq!(after[leave_at]["content"]["membership"], "leave");
    // Exactly the acknowledged messages before the leave, nothing after it.
    assert_eq!(leave_at, after.len() - 1, "events after bob's leave: {:?}", &after[leave_at..]);
    let stored: HashMap<String, String> = after[..leave_at]
        .iter()
        .map(|e| {
            assert_eq!(e["sender"], bob.user_id.as_str(), "{e}");
            (id_of(e), e["content"]["body"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(stored.len(), leave_at, "duplicate events");
    assert_eq!(stored, acked, "the timeline holds exactly the acknowledged sends");
    assert_eq!(acked.len() + refused.len(), 20);

    // Bob's own view: the shared history before his join and his stay, ending
    // with his leave.
    let got = view_newest_first(&server, &bob, &room, 5).await;
    assert_view(&line, &got, &[(1, line.last())], "bob");
}

// ---------------------------------------------------------------------------
// 7. Pagination edges

async fn pagination_edges(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let cy = server.register("cy", "pw").await;
    let room = public_room(&server, &ana, "joined").await;

    join(&server, &bob, &room).await; // J1
    say(&server, &ana, &room, "a1").await;
    say(&server, &bob, &room, "a2").await;
    leave(&server, &bob, &room).await; // L1
    say(&server, &ana, &room, "g1").await;
    join(&server, &cy, &room).await;
    say(&server, &cy, &room, "g2").await;
    join(&server, &bob, &room).await; // J2
    say(&server, &ana, &room, "b1").await;
    say(&server, &cy, &room, "b2").await;
    let image = json!({ "msgtype": "m.image", "body": "b3.png", "url": "mxc://test.local/b3" });
    let response = send(&server, &bob, &room, "img", image).await;
    assert_ok(&response, "image");

    let line = Line::load(&server, &ana, &room).await;
    let prefix = line.hv_seq("joined");
    assert_eq!(prefix, 6);
    let last = line.last();
    let (j1, l1, j2) = (prefix + 1, prefix + 4, last - 3);
    assert_eq!(line.event(l1)["content"]["membership"], "leave");
    assert_eq!(line.event(j2)["content"]["membership"], "join");
    assert_eq!(line.event(j2)["state_key"], bob.user_id.as_str());
    let ids = |seqs: &[i64]| -> Vec<String> { seqs.iter().map(|s| line.id(*s)).collect() };
    // pt[s]: the point just after the line's s-th event (pt[0]: before the first).
    let mut pt = vec![around(&server, &ana, &room, &line.id(1)).await.0];
    for s in 1..=last {
        pt.push(around(&server, &ana, &room, &line.id(s)).await.1);
    }
    let pt = |s: i64| pt[usize::try_from(s).unwrap()].clone();
    let q = |query: String| {
        let (server, bob, room) = (&server, &bob, &room);
        async move { page(server, bob, room, &query).await }
    };

    // dir=b, 4 a page: the first page is exactly the second stay, the next
    // exactly the first, the gap skipped; the last page full and without `end`.
    let p1 = q("dir=b&limit=4".into()).await;
    assert_eq!(p1["start"], pt(last).as_str());
    assert_eq!(chunk_ids(&p1), ids(&[last, last - 1, last - 2, j2]));
    let end = p1["end"].as_str().expect("more to read").to_owned();
    let p2 = q(format!("dir=b&limit=4&from={end}")).await;
    assert_eq!(chunk_ids(&p2), ids(&[l1, l1 - 1, l1 - 2, j1]));
    let end = p2["end"].as_str().expect("the prefix is left").to_owned();
    let p3 = q(format!("dir=b&limit=4&from={end}")).await;
    assert_eq!(chunk_ids(&p3), ids(&[6, 5, 4, 3]));
    let end = p3["end"].as_str().expect("two left").to_owned();
    let p4 = q(format!("dir=b&limit=2&from={end}")).await;
    assert_eq!(chunk_ids(&p4), ids(&[2, 1]));
    assert!(p4.get("end").is_none(), "seq 1 was the last: {p4}");

    // dir=f, 2 a page from the start: boundaries fall on the prefix's end and
    // both stays' edges; the last page is full and has no `end`.
    let forward = walk(&server, &bob, &room, "f", 2, None, "").await;
    assert_eq!(forward.ids(), line.ids_in(&[(1, prefix), (j1, l1), (j2, last)]));
    assert_eq!(forward.pages, 7);
    // dir=f without `from` starts before everything: its `start` and the
    // point before the first event page alike.
    let first = q("dir=f&limit=2".into()).await;
    assert_eq!(chunk_ids(&first), ids(&[1, 2]));
    let start = first["start"].as_str().expect("start").to_owned();
    assert_eq!(chunk_ids(&q(format!("dir=f&limit=2&from={start}")).await), ids(&[1, 2]));
    assert_eq!(chunk_ids(&q(format!("dir=f&limit=2&from={}", pt(0))).await), ids(&[1, 2]));

    // First and last visible events around the gap, both directions.
    assert_eq!(chunk_ids(&q(format!("dir=b&limit=1&from={}", pt(l1))).await), ids(&[l1]));
    assert_eq!(chunk_ids(&q(format!("dir=b&limit=1&from={}", pt(l1 + 2))).await), ids(&[l1]));
    assert_eq!(chunk_ids(&q(format!("dir=b&limit=1&from={}", pt(j2 - 1))).await), ids(&[l1]));
    assert_eq!(chunk_ids(&q(format!("dir=f&limit=1&from={}", pt(l1))).await), ids(&[j2]));
    assert_eq!(chunk_ids(&q(format!("dir=f&limit=1&from={}", pt(j1 - 1))).await), ids(&[j1]));
    assert_eq!(chunk_ids(&q(format!("dir=f&limit=1&from={}", pt(l1 - 1))).await), ids(&[l1]));
    for query in [format!("dir=b&limit=5&from={}", pt(0)), format!("dir=f&limit=5&from={}", pt(last))] {
        let body = q(query.clone()).await;
        assert_eq!(chunk_ids(&body), Vec::<String>::new(), "{query}");
        assert!(body.get("end").is_none(), "{query}: {body}");
    }

    // `to`: stop at a position; the gap still skipped; no `end` once `to` is reached.
    let body = q(format!("dir=b&limit=10&to={}", pt(l1))).await;
    assert_eq!(chunk_ids(&body), ids(&[last, last - 1, last - 2, j2]));
    assert!(body.get("end").is_none(), "{body}");
    let body = q(format!("dir=b&limit=3&to={}", pt(l1 - 2))).await;
    assert_eq!(chunk_ids(&body), ids(&[last, last - 1, last - 2]));
    let end = body["end"].as_str().expect("more before to").to_owned();
    let body = q(format!("dir=b&limit=3&from={end}&to={}", pt(l1 - 2))).await;
    assert_eq!(chunk_ids(&body), ids(&[j2, l1, l1 - 1]));
    assert!(body.get("end").is_none(), "to reached: {body}");
    let body = q(format!("dir=f&limit=10&from={}&to={}", pt(0), pt(j1))).await;
    assert_eq!(chunk_ids(&body), line.ids_in(&[(1, j1)]));
    assert!(body.get("end").is_none(), "{body}");
    let body = q(format!("dir=f&limit=10&from={}&to={}", pt(j1), pt(last - 1))).await;
    assert_eq!(chunk_ids(&body), line.ids_in(&[(j1 + 1, l1), (j2, last - 1)]));
    assert!(body.get("end").is_none(), "{body}");

    // /context around the leave: never the gap.
    let (status, context) = server
        .get(&room_path(&room, &format!("/context/{}?limit=6", enc(&line.id(l1)))), Some(&bob.token))
        .await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(chunk_of(&context, "events_before"), ids(&[l1 - 1, l1 - 2, j1]));
    assert_eq!(chunk_of(&context, "events_after"), ids(&[j2, j2 + 1, j2 + 2]));
    // Its tokens continue the walk on either side, still around the gap.
    let start = context["start"].as_str().expect("start").to_owned();
    let end = context["end"].as_str().expect("end").to_owned();
    let before = q(format!("dir=b&limit=3&from={start}")).await;
    assert_eq!(chunk_ids(&before), ids(&[6, 5, 4]));
    let after = q(format!("dir=f&limit=3&from={end}")).await;
    assert_eq!(chunk_ids(&after), ids(&[last]));
    assert!(after.get("end").is_none(), "{after}");
    let (status, context) = server
        .get(&room_path(&room, &format!("/context/{}?limit=2", enc(&line.id(j2)))), Some(&bob.token))
        .await;
    assert_eq!(status, 200, "{context}");
    assert_eq!(chunk_of(&context, "events_before"), ids(&[l1]));
    assert_eq!(chunk_of(&context, "events_after"), ids(&[j2 + 1]));
    let response = server
        .get(&room_path(&room, &format!("/context/{}?limit=6", enc(&line.id(l1 + 1)))), Some(&bob.token))
        .await;
    assert_error(&response, 404, "M_NOT_FOUND", "/context on a gap event");

    // Filters.
    let filtered = |filter: Value| {
        let (server, bob, room) = (&server, &bob, &room);
        async move { walk(server, bob, room, "b", 3, None, &filter_param(&filter)).await.ids() }
    };
    let messages_only = [last, last - 1, last - 2, l1 - 1, l1 - 2];
    assert_eq!(filtered(json!({ "types": ["m.room.message"] })).await, ids(&messages_only));
    assert_eq!(filtered(json!({ "types": ["m.room.mem*"] })).await, ids(&[j2, l1, j1, 2]));
    assert_eq!(filtered(json!({ "senders": [bob.user_id] })).await, ids(&[last, j2, l1, l1 - 1, j1]));
    assert_eq!(
        filtered(json!({ "not_senders": [ana.user_id], "not_types": ["m.room.member"] })).await,
        ids(&[last, last - 1, l1 - 1])
    );
    assert_eq!(filtered(json!({ "contains_url": true })).await, ids(&[last]));
    assert_eq!(
        filtered(json!({ "contains_url": false, "types": ["m.room.message"] })).await,
        ids(&[last - 1, last - 2, l1 - 1, l1 - 2])
    );

    // lazy_load_members: the member events of exactly the page's senders.
    let body = q(format!("dir=b&limit=3{}", filter_param(&json!({ "lazy_load_members": true })))).await;
    assert_eq!(chunk_ids(&body), ids(&[last, last - 1, last - 2]));
    let mut members: Vec<(String, String, String)> = body["state"]
        .as_array()
        .unwrap_or_else(|| panic!("no state: {body}"))
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "m.room.member", "{e}");
            (
                e["state_key"].as_str().unwrap().to_owned(),
                e["content"]["membership"].as_str().unwrap().to_owned(),
                id_of(e),
            )
        })
        .collect();
    members.sort();
    let cy_join = (1..=last).find(|s| line.event(*s)["state_key"] == cy.user_id.as_str()).expect("cy's join");
    let mut want = vec![
        (ana.user_id.clone(), "join".to_owned(), line.id(2)),
        (bob.user_id.clone(), "join".to_owned(), line.id(j2)),
        (cy.user_id.clone(), "join".to_owned(), line.id(cy_join)),
    ];
    want.sort();
    assert_eq!(members, want);
    let body = q(format!("dir=b&limit=1{}", filter_param(&json!({ "lazy_load_members": true })))).await;
    let senders: Vec<&str> =
        body["state"].as_array().expect("state").iter().map(|e| e["state_key"].as_str().unwrap()).collect();
    assert_eq!(senders, vec![bob.user_id.as_str()]);
}

// ---------------------------------------------------------------------------
// 8. Bulk membership, forget, join by alias, membership through state

async fn bulk_membership_is_consecutive_and_all_or_nothing(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carl = server.register("carl", "pw").await;
    let dan = server.register("dan", "pw").await;
    let eve = server.register("eve", "pw").await;
    let frank = server.register("frank", "pw").await;
    let room = create_room(&server, &ana, json!({ "preset": "private_chat" })).await;
    for user in [&bob, &carl] {
        invite(&server, &ana, &room, user).await;
        join(&server, user, &room).await;
    }
    say(&server, &ana, &room, "before the bulk change").await;
    let before = Line::load(&server, &ana, &room).await;

    let bulk = format!("{SEQLINE}/rooms/{}/bulk_membership", enc(&room));
    let (status, body) = server
        .post(
            &bulk,
            Some(&ana.token),
            json!({
                "invite": [dan.user_id, eve.user_id], "kick": [bob.user_id], "ban": [carl.user_id], "reason": "tidy",
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let event_ids: Vec<String> = body["event_ids"]
        .as_array()
        .expect("event_ids")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(event_ids.len(), 4, "{body}");

    let line = Line::load(&server, &ana, &room).await;
    // Consecutive seqs right after what was there, in the order given.
    assert_eq!(line.last(), before.last() + 4);
    assert_eq!(line.ids_in(&[(before.last() + 1, line.last())]), event_ids);
    let expected = [(&dan, "invite"), (&eve, "invite"), (&bob, "leave"), (&carl, "ban")];
    for (id, (user, membership)) in event_ids.iter().zip(expected) {
        let e = line.event(line.seq(id));
        assert_eq!(e["type"], "m.room.member");
        assert_eq!(e["sender"], ana.user_id.as_str());
        assert_eq!(e["state_key"], user.user_id.as_str());
        assert_eq!(e["content"]["membership"], membership, "{e}");
        assert_eq!(e["content"]["reason"], "tidy", "{e}");
    }
    let newest = page(&server, &ana, &room, "dir=b&limit=4").await;
    let mut reversed = event_ids.clone();
    reversed.reverse();
    assert_eq!(chunk_ids(&newest), reversed, "adjacent in /messages");
    // Bob's stay ends with his kick; Carl cannot come back.
    let first = page(&server, &bob, &room, "dir=b&limit=1").await;
    assert_eq!(chunk_ids(&first), vec![event_ids[2].clone()]);
    let response = membership_call(&server, &carl, &room, "join", json!({})).await;
    assert_error(&response, 403, "M_FORBIDDEN", "banned carl joins");

    // All or nothing: an unknown user fails the whole call.
    let response = server
        .post(
            &bulk,
            Some(&ana.token),
            json!({ "invite": [frank.user_id, "@nobody:test.local"], "reason": "x" }),
        )
        .await;
    assert_error(&response, 404, "M_NOT_FOUND", "bulk with an unknown user");
    // So does a change the auth rules refuse after an allowed one (banning
    // the room's creator): the invite before it is rolled back.
    let response = server
        .post(&bulk, Some(&ana.token), json!({ "invite": [frank.user_id], "ban": [ana.user_id] }))
        .await;
    assert_error(&response, 403, "M_FORBIDDEN", "bulk with a refused ban");
    // And a member without the power to kick changes nothing.
    join(&server, &dan, &room).await;
    let response = server.post(&bulk, Some(&dan.token), json!({ "kick": [eve.user_id] })).await;
    assert_error(&response, 403, "M_FORBIDDEN", "bulk by a member at power 0");

    let after = Line::load(&server, &ana, &room).await;
    assert_eq!(after.last(), line.last() + 1, "only dan's join was added");
    assert_eq!(after.event(after.last())["state_key"], dan.user_id.as_str());
    let state = room_state(&server, &ana, &room).await;
    assert!(find(&state, "m.room.member", &frank.user_id).is_none(), "frank was not invited");
    assert_eq!(find(&state, "m.room.member", &eve.user_id).expect("eve")["content"]["membership"], "invite");
    let response = membership_call(&server, &frank, &room, "join", json!({})).await;
    assert_error(&response, 403, "M_FORBIDDEN", "frank joins an invite-only room uninvited");
}

async fn forget_alias_join_and_membership_through_state(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carl = server.register("carl", "pw").await;

    // Join by alias.
    let trail =
        create_room(&server, &ana, json!({ "preset": "public_chat", "room_alias_name": "trail" })).await;
    let (status, body) =
        server.post(&format!("{V3}/join/{}", enc("#trail:test.local")), Some(&bob.token), json!({})).await;
    assert_eq!((status, &body["room_id"]), (200, &json!(trail)), "{body}");
    let line = Line::load(&server, &ana, &trail).await;
    let joined = line.event(line.last());
    assert_eq!(
        (joined["state_key"].as_str(), joined["content"]["membership"].as_str()),
        (Some(bob.user_id.as_str()), Some("join"))
    );
    let response =
        server.post(&format!("{V3}/join/{}", enc("#nowhere:test.local")), Some(&bob.token), json!({})).await;
    assert_error(&response, 404, "M_NOT_FOUND", "join an unknown alias");

    // Forget: refused while joined, allowed after leaving.
    let forget = room_path(&trail, "/forget");
    let response = server.post(&forget, Some(&bob.token), json!({})).await;
    assert_error(&response, 400, "M_UNKNOWN", "forget while joined");
    leave(&server, &bob, &trail).await;
    let (status, body) = server.post(&forget, Some(&bob.token), json!({})).await;
    assert_eq!((status, body), (200, json!({})));

    // Membership through PUT /state/m.room.member: the same path, ranges included.
    let room = public_room(&server, &ana, "joined").await;
    let (status, body) =
        put_state(&server, &ana, &room, "m.room.join_rules", "", json!({ "join_rule": "invite" })).await;
    assert_eq!(status, 200, "{body}");
    let response = membership_call(&server, &carl, &room, "join", json!({})).await;
    assert_error(&response, 403, "M_FORBIDDEN", "join an invite-only room uninvited");
    let response =
        put_state(&server, &ana, &room, "m.room.member", &bob.user_id, json!({ "membership": "invite" }))
            .await;
    assert_ok(&response, "invite through state");
    let invite_id = event_id_of(&response.1);
    let state = room_state(&server, &ana, &room).await;
    assert_eq!(find(&state, "m.room.member", &bob.user_id).expect("bob")["event_id"], invite_id.as_str());
    let response =
        put_state(&server, &bob, &room, "m.room.member", &bob.user_id, json!({ "membership": "join" })).await;
    assert_ok(&response, "join through state");
    let join_id = event_id_of(&response.1);
    let m1 = say(&server, &ana, &room, "while bob is in").await;
    let response = put_state(
        &server,
        &bob,
        &room,
        "m.room.member",
        &bob.user_id,
        json!({ "membership": "leave", "reason": "bye" }),
    )
    .await;
    assert_ok(&response, "leave through state");
    let leave_id = event_id_of(&response.1);
    let m2 = say(&server, &ana, &room, "after bob left").await;

    let line = Line::load(&server, &ana, &room).await;
    let got = view_newest_first(&server, &bob, &room, 2).await;
    // A `joined` room: the shared creation prefix (he joined after it), then
    // his stay; not the invite-only change or his invite, sent under `joined`.
    let prefix = line.hv_seq("joined");
    assert_view(&line, &got, &[(1, prefix), (line.seq(&join_id), line.seq(&leave_id))], "bob");
    assert!(got.contains(&m1) && !got.contains(&m2));
    assert_eq!(line.event(line.seq(&leave_id))["content"], json!({ "membership": "leave", "reason": "bye" }));
    let response = get_event(&server, &bob, &room, &m2).await;
    assert_error(&response, 404, "M_NOT_FOUND", "after the leave through state");

    // A ban through state keeps him out.
    let response = put_state(
        &server,
        &ana,
        &room,
        "m.room.member",
        &bob.user_id,
        json!({ "membership": "ban", "reason": "gone" }),
    )
    .await;
    assert_ok(&response, "ban through state");
    let response = membership_call(&server, &bob, &room, "join", json!({})).await;
    assert_error(&response, 403, "M_FORBIDDEN", "join after a ban through state");
    let state = room_state(&server, &ana, &room).await;
    assert_eq!(
        find(&state, "m.room.member", &bob.user_id).expect("bob")["content"],
        json!({ "membership": "ban", "reason": "gone" })
    );
}

/// PUT /state/m.room.member is the same membership path as /invite: the same
/// targets are refused with the same errors, and nothing is stored.
async fn membership_through_state_refuses_what_invite_refuses(backend: Backend) {
    let server = Server::start(&backend).await;
    let ana = server.register("ana", "pw").await;
    let room = create_room(&server, &ana, json!({ "preset": "private_chat" })).await;
    let before = Line::load(&server, &ana, &room).await;
    let mut failures = Vec::new();
    for (target, status, errcode) in
        [("@nobody:test.local", 404, "M_NOT_FOUND"), ("@someone:elsewhere.example", 403, "M_FORBIDDEN")]
    {
        let response = membership_call(&server, &ana, &room, "invite", json!({ "user_id": target })).await;
        assert_error(&response, status, errcode, &format!("/invite {target}"));
        let path = state_path(&room, "m.room.member", target);
        let response =
            put_state(&server, &ana, &room, "m.room.member", target, json!({ "membership": "invite" })).await;
        if (response.0, response.1["errcode"].as_str()) != (status, Some(errcode)) {
            failures.push(format!(
                "PUT {path} {{\"membership\":\"invite\"}} -> {} {}; /invite gives {status} {errcode}",
                response.0, response.1
            ));
        }
    }
    let after = Line::load(&server, &ana, &room).await;
    let stored: Vec<Value> = (before.last() + 1..=after.last()).map(|s| after.event(s).clone()).collect();
    assert!(failures.is_empty() && stored.is_empty(), "{failures:#?}\nstored: {stored:#?}");
}
