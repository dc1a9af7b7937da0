//! The sliding sync figures (`--sliding`): what Element X's room list costs
//! a person in many rooms.
//!
//! A user is in `--sliding-rooms` rooms, `--sliding-big-rooms` of them with
//! `--members` members (the rest: the creator and the user), every room with
//! messages the user has not read (`--sliding-unread` each). Then, each over
//! `POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync` with
//! Element X's room-list request (its `required_state`, `timeline_limit` 1,
//! the account data, receipts and typing extensions):
//!
//! - **first response**: a new connection asks for the first 20 rooms
//!   (`--sliding-samples` connections, one after the other);
//! - **full list**: a new connection grows its range by 100 as Element X
//!   does (`timeout=0`) until it holds every room; the time for all of it;
//! - **woken response**: that connection long-polls; another user sends a
//!   message into one of the rooms; from the send's answer to the response
//!   carrying it;
//! - **RSS while connections wait**: `--sliding-connections` devices of the
//!   user each open a connection and long-poll at once; the server's RSS
//!   while they wait (`--pid`), then one message wakes them all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::{
    Better, Config, Hs, PASSWORD, Progress, Report, Res, User, err, join_all, ms, pool, prefix, register_all,
    rss_kib,
};

/// The unstable path every client speaks.
pub const PATH: &str = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync";

/// Element X's room list `required_state` (matrix-sdk-ui 0.18).
const REQUIRED_STATE: &[(&str, &str)] = &[
    ("m.room.name", ""),
    ("m.room.encryption", ""),
    ("m.room.member", "$LAZY"),
    ("m.room.member", "$ME"),
    ("m.room.topic", ""),
    ("m.room.avatar", ""),
    ("m.room.canonical_alias", ""),
    ("m.room.power_levels", ""),
    ("org.matrix.msc3401.call.member", "*"),
    ("m.room.join_rules", ""),
    ("m.room.tombstone", ""),
    ("m.room.create", ""),
    ("m.room.history_visibility", ""),
    ("io.element.functional_members", ""),
    ("m.space.parent", "*"),
    ("m.space.child", "*"),
    ("org.matrix.msc3672.beacon_info", "*"),
];

/// Element X's room-list request for rooms `0..=end`.
fn room_list(conn: &str, end: usize) -> Value {
    let required: Vec<Value> = REQUIRED_STATE.iter().map(|(t, k)| json!([t, k])).collect();
    json!({
        "conn_id": conn,
        "lists": { "all_rooms": {
            "ranges": [[0, end]],
            "timeline_limit": 1,
            "required_state": required,
            "filters": {},
        } },
        "extensions": {
            "account_data": { "enabled": true },
            "receipts": { "enabled": true, "rooms": ["*"] },
            "typing": { "enabled": true },
        },
    })
}

/// One sliding sync request; its answer.
async fn request(hs: &Hs, user: &User, pos: Option<&str>, timeout: u64, body: &Value) -> Res<Value> {
    let path = match pos {
        Some(p) => format!("{PATH}?pos={}&timeout={timeout}", super::enc(p)),
        None => format!("{PATH}?timeout={timeout}"),
    };
    let (v, _) = hs.ok("sliding", Method::POST, &path, Some(&user.token), Some(body)).await?;
    if !v["pos"].is_string() {
        return err(format!("sliding sync answered without a pos: {v}"));
    }
    Ok(v)
}

fn pos(v: &Value) -> String {
    v["pos"].as_str().unwrap_or_default().to_owned()
}

fn count(v: &Value) -> usize {
    v["lists"]["all_rooms"]["count"].as_u64().map_or(0, |c| c as usize)
}

/// Whether `answer` carries event `id` in room `room`'s timeline.
fn carries(answer: &Value, room: &str, id: &str) -> bool {
    answer["rooms"][room]["timeline"].as_array().is_some_and(|t| t.iter().any(|e| e["event_id"] == id))
}

/// The `--sliding` figures.
pub async fn series(hs: &Hs, config: &Config, progress: &Progress, report: &mut Report) -> Res<()> {
    let run = prefix(config);
    let rooms_n = config.sliding_rooms.max(2);
    let big_n = config.sliding_big_rooms.min(rooms_n);
    let members = config.members.max(2);
    progress.say(&format!("sliding: registering {members} users"));
    let names: Vec<String> = (0..members).map(|i| format!("{run}_l{i}")).collect();
    let users = register_all(hs, config, names, &mut Report::default(), "register").await?;
    let (creator, me) = (users[0].clone(), users[1].clone());
    let crowd: Vec<User> = users[2..].to_vec();

    progress.say(&format!(
        "sliding: {rooms_n} rooms ({big_n} of {members} members), {} unread each",
        config.sliding_unread
    ));
    let (hs2, creator2, me2, version) =
        (hs.clone(), Arc::new(creator.clone()), Arc::new(me.clone()), config.room_version.clone());
    let unread = config.sliding_unread;
    let made = pool(rooms_n, config.concurrency, move |i| {
        let (hs, creator, me, version) = (hs2.clone(), creator2.clone(), me2.clone(), version.clone());
        async move {
            let room = hs.create_room(&creator, version.as_deref()).await?;
            hs.join(&me, &room).await?;
            for m in 0..unread {
                hs.send(&creator, &room, &format!("r{i}m{m}"), &format!("message {m} in room {i}")).await?;
            }
            Ok(room)
        }
    })
    .await?;
    let rooms: Vec<String> = made.into_iter().map(|(_, r)| r).collect();
    for (b, room) in rooms.iter().take(big_n).enumerate() {
        progress.say(&format!("sliding: big room {} of {big_n}: {} join", b + 1, crowd.len()));
        join_all(hs, config, room, &crowd, &mut Report::default()).await?;
    }
    report.push("sliding.rooms", rooms_n as f64, "rooms", Better::Info);

    // First response: a new connection asks for the first 20 rooms.
    progress.say(&format!("sliding: {} first responses", config.sliding_samples));
    let mut first = Vec::new();
    for i in 0..config.sliding_samples.max(1) {
        let t = Instant::now();
        let v = request(hs, &me, None, 0, &room_list(&format!("first{i}"), 19)).await?;
        first.push(ms(t.elapsed()));
        let got = v["rooms"].as_object().map_or(0, serde_json::Map::len);
        if count(&v) != rooms_n || got != 20.min(rooms_n) {
            return err(format!("sliding: first response counted {} rooms and held {got}", count(&v)));
        }
    }
    report.lat("sliding.first_20", &first, &[50, 95]);

    // The whole list, grown by 100 as Element X does.
    progress.say("sliding: the full list");
    let t = Instant::now();
    let mut end = 19;
    let mut v = request(hs, &me, None, 0, &room_list("full", end)).await?;
    let mut seen: usize = v["rooms"].as_object().map_or(0, serde_json::Map::len);
    let mut requests = 1;
    while end + 1 < count(&v) {
        end += 100;
        v = request(hs, &me, Some(&pos(&v)), 0, &room_list("full", end)).await?;
        seen += v["rooms"].as_object().map_or(0, serde_json::Map::len);
        requests += 1;
    }
    report.push("sliding.full_list_ms", ms(t.elapsed()), "ms", Better::Lower);
    report.push("sliding.full_list_requests", requests as f64, "requests", Better::Info);
    if seen != rooms_n {
        return err(format!("sliding: the full list brought {seen} rooms of {rooms_n}"));
    }

    // Woken responses on that connection.
    progress.say(&format!("sliding: {} woken responses", config.sliding_samples));
    let mut woken = Vec::new();
    let mut at = pos(&v);
    for i in 0..config.sliding_samples.max(1) {
        let room = rooms[(i * 7919) % rooms.len()].clone();
        let poll = {
            let (hs, me, at, body) = (hs.clone(), me.clone(), at.clone(), room_list("full", end));
            tokio::spawn(async move {
                request(&hs, &me, Some(&at), 30_000, &body).await.map(|v| (v, Instant::now()))
            })
        };
        // Let the long-poll reach the server and start waiting.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let id = hs.send(&creator, &room, &format!("{run}-wake{i}"), "wake up").await?;
        let sent = Instant::now();
        let (mut answer, mut when) = poll.await.map_err(|e| super::BenchError(format!("poll: {e}")))??;
        // Woken by something else first: poll on until the message comes.
        for _ in 0..10 {
            if carries(&answer, &room, &id) {
                break;
            }
            let next = request(hs, &me, Some(&pos(&answer)), 30_000, &room_list("full", end)).await?;
            (answer, when) = (next, Instant::now());
        }
        if !carries(&answer, &room, &id) {
            return err(format!("sliding: the message {id} never came down the connection"));
        }
        woken.push(if when > sent { ms(when - sent) } else { 0.0 });
        at = pos(&answer);
    }
    report.lat("sliding.woken", &woken, &[50, 95]);

    // Many connections waiting at once.
    let n = config.sliding_connections;
    if n > 0 {
        progress.say(&format!("sliding: {n} connections waiting"));
        let local = me.user_id.trim_start_matches('@').split(':').next().unwrap_or_default().to_owned();
        let (hs2, local2) = (hs.clone(), Arc::new(local));
        let devices = pool(n, config.concurrency, move |_| {
            let (hs, local) = (hs2.clone(), local2.clone());
            async move {
                let user = hs.login(&local, PASSWORD).await?;
                let v = request(&hs, &user, None, 0, &room_list("room-list", 19)).await?;
                Ok((user, pos(&v)))
            }
        })
        .await?;
        let before = config.pid.and_then(rss_kib);
        let mut polls = Vec::new();
        for (_, (user, at)) in devices {
            let (hs, body) = (hs.clone(), room_list("room-list", 19));
            polls.push(tokio::spawn(async move { request(&hs, &user, Some(&at), 30_000, &body).await }));
        }
        // Give every long-poll time to reach the server and park.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let waiting = config.pid.and_then(rss_kib);
        hs.send(&creator, &rooms[0], &format!("{run}-all"), "wake everyone").await?;
        for p in polls {
            p.await.map_err(|e| super::BenchError(format!("poll: {e}")))??;
        }
        if let (Some((b, _)), Some((w, _))) = (before, waiting) {
            report.push("sliding.rss_before_mib", b as f64 / 1024.0, "MiB", Better::Lower);
            report.push("sliding.rss_waiting_mib", w as f64 / 1024.0, "MiB", Better::Lower);
        }
        report.push("sliding.connections", n as f64, "connections", Better::Info);
    }
    Ok(())
}
