//! Migration 0020 (sparse positions), end to end through the client API: a
//! database of the dense line, with messages, joins, leaves, a pre-join
//! window, a history-visibility change, a user's floor, a room floor (purge)
//! and state changes, answers /messages, /context, /sync, /state and
//! /members exactly as before once migrated (tokens map as the seqs did), and
//! every pagination token handed out before the migration (`t<seq>`, dense)
//! still pages to the same events after it.
//!
//! The dense database is made by the write path itself (on sparse positions)
//! and then mapped back to dense seqs with migration 0020 marked as not run:
//! exactly what the dense write path stored (the pre-join window's start,
//! the Nth event before the join, is `seq - N` on a dense line). The read path
//! compares positions only, so its answers on the dense database are those
//! of the dense code; what changes is the tokens' form (`p<pos>`).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use axum::Router;
use axum::body::Body;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::Db;
use super::state_tests::backends;
use crate::config::Config;
use crate::room::position::{self, STEP};
use crate::state::AppState;

const ORIGIN_SQL: &str = "4611686018427387904";

pub(crate) async fn app_state(url: &str, data_dir: &Path, migrated_to: i64) -> AppState {
    let mut config = Config {
        server_name: "sparse.test".into(),
        data_dir: data_dir.to_owned(),
        database_url: url.to_owned(),
        ..Default::default()
    };
    config.rate_limits.enabled = false;
    let settings = config.validate().unwrap();
    let db = Db::connect_migrated_to(url, settings.sqlite_synchronous, migrated_to).await.unwrap();
    let key = crate::signing_key::load_or_generate(&settings.signing_key_path).unwrap();
    let last_stream = super::account_data::max_stream(&db).await.unwrap();
    let outbound = crate::outbound::Outbound::new(settings.outbound_ip_allow.clone()).unwrap();
    AppState::new(settings, db, key, last_stream, HashSet::new(), outbound)
}

pub(crate) async fn call(
    app: &Router,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let builder =
        http::Request::builder().method(method).uri(path).header("authorization", format!("Bearer {token}"));
    let mut request = match body {
        Some(b) => builder.header("content-type", "application/json").body(Body::from(b.to_string())),
        None => builder.body(Body::empty()),
    }
    .unwrap();
    request.extensions_mut().insert(axum::extract::ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 1))));
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn ids(events: &Value) -> Vec<String> {
    events
        .as_array()
        .map_or(Vec::new(), |a| a.iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect())
}

fn sorted_ids(events: &Value) -> Vec<String> {
    let mut out = ids(events);
    out.sort();
    out
}

/// One /messages request and what it answered.
#[derive(Debug, Clone, PartialEq)]
struct Page {
    from: Option<String>,
    dir: &'static str,
    status: u16,
    chunk: Vec<String>,
    start: Value,
    end: Value,
}

async fn messages(app: &Router, room: &str, token: &str, dir: &'static str, from: Option<&str>) -> Page {
    let mut path = format!("/_matrix/client/v3/rooms/{}/messages?dir={dir}&limit=3", enc(room));
    if let Some(from) = from {
        path.push_str(&format!("&from={from}"));
    }
    let (status, body) = call(app, "GET", &path, token, None).await;
    Page {
        from: from.map(str::to_owned),
        dir,
        status,
        chunk: ids(&body["chunk"]),
        start: body["start"].clone(),
        end: body["end"].clone(),
    }
}

/// Every page of the room in `dir` from `from`, following `end`.
async fn walk(app: &Router, room: &str, token: &str, dir: &'static str, from: Option<String>) -> Vec<Page> {
    let mut pages = Vec::new();
    let mut from = from;
    loop {
        let page = messages(app, room, token, dir, from.as_deref()).await;
        let next = page.end.as_str().map(str::to_owned);
        pages.push(page);
        match next {
            Some(n) if pages.len() < 50 => from = Some(n),
            _ => return pages,
        }
    }
}

/// Everything the read path answers one user about the room.
async fn answers(app: &Router, room: &str, token: &str, events: &[String]) -> (Value, Vec<Page>) {
    let mut out = BTreeMap::new();
    let mut pages = walk(app, room, token, "b", None).await;
    pages.extend(walk(app, room, token, "f", None).await);
    let filter = enc(&json!({ "room": { "timeline": { "limit": 3 } } }).to_string());
    let (status, sync) =
        call(app, "GET", &format!("/_matrix/client/v3/sync?filter={filter}"), token, None).await;
    assert_eq!(status, 200, "{sync}");
    for section in ["join", "leave"] {
        if let Some(r) = sync["rooms"][section].get(room) {
            out.insert(
                format!("sync {section}"),
                json!({
                    "timeline": ids(&r["timeline"]["events"]),
                    "limited": r["timeline"]["limited"],
                    "prev_batch": r["timeline"]["prev_batch"],
                    "state": sorted_ids(&r["state"]["events"]),
                }),
            );
            let prev = r["timeline"]["prev_batch"].as_str().unwrap().to_owned();
            pages.extend(walk(app, room, token, "b", Some(prev)).await);
        }
    }
    for id in events {
        let path = format!("/_matrix/client/v3/rooms/{}/context/{}?limit=4", enc(room), enc(id));
        let (status, c) = call(app, "GET", &path, token, None).await;
        out.insert(
            format!("context {id}"),
            json!({
                "status": status,
                "before": ids(&c["events_before"]),
                "after": ids(&c["events_after"]),
                "start": c["start"],
                "end": c["end"],
                "state": sorted_ids(&c["state"]),
            }),
        );
        if let (Some(start), Some(end)) = (c["start"].as_str(), c["end"].as_str()) {
            pages.push(messages(app, room, token, "b", Some(start)).await);
            pages.push(messages(app, room, token, "f", Some(end)).await);
            let members = format!("/_matrix/client/v3/rooms/{}/members?at={}", enc(room), enc(start));
            let (status, m) = call(app, "GET", &members, token, None).await;
            out.insert(
                format!("members at {id}"),
                json!({ "status": status, "chunk": sorted_ids(&m["chunk"]) }),
            );
        }
    }
    let (status, state) =
        call(app, "GET", &format!("/_matrix/client/v3/rooms/{}/state", enc(room)), token, None).await;
    out.insert(
        "state".into(),
        json!({ "status": status, "ids": if status == 200 { sorted_ids(&state) } else { vec![] } }),
    );
    let pages_json: Vec<Value> = pages
        .iter()
        .map(|p| json!({ "from": p.from, "dir": p.dir, "status": p.status, "chunk": p.chunk, "start": p.start, "end": p.end }))
        .collect();
    out.insert("pages".into(), json!(pages_json));
    (Value::Object(out.into_iter().collect()), pages)
}

/// An answer with each `p<pos>` token replaced by the point it names: how
/// many of the room's events (`seqs`, in order) lie at or below it. Both lines
/// hold the same events in the same order, so equal points mean the same
/// place whatever the spacing (`p<S-1>` just before the event at S, dense,
/// is `p<P-1>` just before it, sparse).
fn points(v: &Value, seqs: &[i64]) -> Value {
    match v {
        Value::String(s) => match s.strip_prefix('p').and_then(|n| n.parse::<i64>().ok()) {
            Some(n) => json!(format!("after {} events", seqs.partition_point(|seq| *seq <= n))),
            None => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|x| points(x, seqs)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), points(x, seqs))).collect()),
        other => other.clone(),
    }
}

async fn seqs(db: &Db) -> Vec<i64> {
    sqlx::query_scalar("SELECT seq FROM events ORDER BY seq").fetch_all(&mut db.reader()).await.unwrap()
}

async fn send(app: &Router, room: &str, who: &str, body: &str) -> String {
    let txn = format!("txn-{body}");
    let path = format!("/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}", enc(room));
    let (status, b) = call(app, "PUT", &path, who, Some(json!({ "msgtype": "m.text", "body": body }))).await;
    assert_eq!(status, 200, "{b}");
    b["event_id"].as_str().unwrap().to_owned()
}

/// A dense `p<seq>` token as the dense server wrote it: `t<seq>`.
fn old_form(token: &str) -> String {
    format!("t{}", token.strip_prefix('p').unwrap())
}

async fn scalar(db: &Db, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())).fetch_one(&mut db.reader()).await.unwrap()
}

#[tokio::test]
async fn migration_to_sparse_positions_keeps_every_answer() {
    for fresh in backends().await {
        let label = fresh.label;
        let data_dir = std::env::temp_dir().join(format!("seqline-sparse-{}-{label}", std::process::id()));
        std::fs::create_dir_all(&data_dir).unwrap();

        // 1. The room, through the client API.
        let state = app_state(&fresh.url, &data_dir, i64::MAX).await;
        let app = crate::api::router(state.clone());
        let mut tokens = BTreeMap::new();
        for name in ["alice", "bob", "carol"] {
            let user = crate::account::create_user(&state, name, None, false).await.unwrap();
            let session =
                crate::account::issue_session(&state, &user, None, None, None, false).await.unwrap();
            tokens.insert(name, session.access_token);
        }
        let (alice, bob, carol) = (&tokens["alice"], &tokens["bob"], &tokens["carol"]);
        let (status, body) = call(
            &app,
            "POST",
            "/_matrix/client/v3/createRoom",
            alice,
            Some(json!({ "preset": "public_chat", "name": "dense" })),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let room = body["room_id"].as_str().unwrap().to_owned();
        let r = |rest: &str| format!("/_matrix/client/v3/rooms/{}{rest}", enc(&room));
        let mut sent = Vec::new();
        for i in 1..=5 {
            sent.push(send(&app, &room, alice, &format!("m{i}")).await);
        }
        let (status, b) =
            call(&app, "PUT", &r("/state/org.seqline.prejoin_window/"), alice, Some(json!({ "events": 3 })))
                .await;
        assert_eq!(status, 200, "{b}");
        assert_eq!(call(&app, "POST", &r("/join"), bob, Some(json!({}))).await.0, 200);
        sent.push(send(&app, &room, alice, "m6").await);
        sent.push(send(&app, &room, bob, "b1").await);
        let (status, b) = call(
            &app,
            "PUT",
            &r("/state/m.room.history_visibility/"),
            alice,
            Some(json!({ "history_visibility": "joined" })),
        )
        .await;
        assert_eq!(status, 200, "{b}");
        sent.push(send(&app, &room, alice, "m7").await);
        sent.push(send(&app, &room, alice, "m8").await);
        assert_eq!(call(&app, "POST", &r("/join"), carol, Some(json!({}))).await.0, 200);
        sent.push(send(&app, &room, carol, "c1").await);
        assert_eq!(call(&app, "POST", &r("/leave"), bob, Some(json!({}))).await.0, 200);
        let (status, b) =
            call(&app, "PUT", &r("/state/m.room.name/"), alice, Some(json!({ "name": "renamed" }))).await;
        assert_eq!(status, 200, "{b}");
        for i in 9..=11 {
            sent.push(send(&app, &room, alice, &format!("m{i}")).await);
        }
        let clear = format!("{}/rooms/{}/clear_history", "/_matrix/client/unstable/org.seqline", enc(&room));
        assert_eq!(call(&app, "POST", &clear, carol, Some(json!({}))).await.0, 200);
        sent.push(send(&app, &room, alice, "m12").await);
        let purge = format!("{}/rooms/{}/purge", "/_matrix/client/unstable/org.seqline", enc(&room));
        let (status, b) =
            call(&app, "POST", &purge, alice, Some(json!({ "before_event_id": sent[1] }))).await;
        assert_eq!(status, 200, "{b}");
        sent.push(send(&app, &room, alice, "m13").await);
        // Sparse on the way in: the create event at the origin, a STEP apart.
        assert_eq!(scalar(&state.db, "SELECT MIN(seq) FROM events").await, position::ORIGIN);
        let events_count = scalar(&state.db, "SELECT COUNT(*) FROM events").await;
        assert_eq!(
            scalar(&state.db, "SELECT MAX(seq) FROM events").await,
            position::ORIGIN + (events_count - 1) * STEP
        );
        state.db.close().await;
        drop(app);
        drop(state);

        // 2. Back to the dense line, migration 0020 (and those after it) not run.
        let db = Db::connect_migrated_to(&fresh.url, crate::config::SqliteSynchronous::Full, i64::MAX)
            .await
            .unwrap();
        let d =
            |c: &str| format!("{c} = CASE WHEN {c} > 0 THEN ({c} - {ORIGIN_SQL}) / 1048576 + 1 ELSE {c} END");
        for sql in [
            format!("UPDATE events SET {}", d("seq")),
            format!("UPDATE room_state SET {}", d("seq")),
            format!("UPDATE state_runs SET {}", d("seq")),
            format!("UPDATE memberships SET {}, {}, {}", d("min_seq"), d("max_seq"), d("window_seq")),
            format!("UPDATE user_room_floors SET {}", d("floor_seq")),
            format!("UPDATE rooms SET {}, {}", d("last_seq"), d("floor_seq")),
            // The later migrations that copy positions run again after it
            // (0022 refills event_relations and 0023 builds the search index
            // from the events at their new positions; the code reading the
            // dense database finds their tables empty); the others stay
            // applied.
            "DELETE FROM event_relations".to_owned(),
            "DROP TABLE IF EXISTS event_search_fts".to_owned(),
            "DROP TABLE event_search".to_owned(),
            "DELETE FROM _sqlx_migrations WHERE version IN (20, 22, 23)".to_owned(),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&db.pool).await.unwrap();
        }
        db.close().await;

        // 3. What the dense database answers.
        let state = app_state(&fresh.url, &data_dir, 19).await;
        assert_eq!(scalar(&state.db, "SELECT MAX(seq) FROM events").await, events_count, "{label}: dense");
        let window: i64 =
            scalar(&state.db, "SELECT MAX(window_seq) FROM memberships WHERE user_id = '@carol:sparse.test'")
                .await;
        let joined: i64 =
            scalar(&state.db, "SELECT MAX(min_seq) FROM memberships WHERE user_id = '@carol:sparse.test'")
                .await;
        assert_eq!(joined - window, 3, "{label}: carol's pre-join window, dense");
        let app = crate::api::router(state.clone());
        let mut all = Vec::new();
        for page in walk(&app, &room, alice, "b", None).await {
            all.extend(page.chunk);
        }
        assert!(all.len() >= 12, "{label}: {all:?}");
        let dense_seqs = seqs(&state.db).await;
        let mut before = BTreeMap::new();
        for (name, token) in &tokens {
            before.insert(*name, answers(&app, &room, token, &all).await);
        }
        state.db.close().await;
        drop(app);
        drop(state);

        // 4. Migrated: the same answers, every old token still good.
        let state = app_state(&fresh.url, &data_dir, i64::MAX).await;
        assert_eq!(scalar(&state.db, "SELECT MIN(seq) FROM events").await, position::ORIGIN, "{label}");
        assert_eq!(
            scalar(&state.db, "SELECT MAX(seq) FROM events").await,
            position::ORIGIN + (events_count - 1) * STEP
        );
        let window: i64 =
            scalar(&state.db, "SELECT MAX(window_seq) FROM memberships WHERE user_id = '@carol:sparse.test'")
                .await;
        let joined: i64 =
            scalar(&state.db, "SELECT MAX(min_seq) FROM memberships WHERE user_id = '@carol:sparse.test'")
                .await;
        assert_eq!(joined - window, 3 * STEP, "{label}: carol's pre-join window, sparse");
        let app = crate::api::router(state.clone());
        let sparse_seqs = seqs(&state.db).await;
        let mut replayed = 0;
        for (name, token) in &tokens {
            let (dense, dense_pages) = &before[name];
            let (sparse, _) = answers(&app, &room, token, &all).await;
            assert_eq!(
                points(&sparse, &sparse_seqs),
                points(dense, &dense_seqs),
                "{label}: {name}'s answers"
            );
            for page in dense_pages {
                let Some(from) = &page.from else { continue };
                let again = messages(&app, &room, token, page.dir, Some(&old_form(from))).await;
                assert_eq!(
                    (again.status, &again.chunk, points(&again.end, &sparse_seqs)),
                    (page.status, &page.chunk, points(&page.end, &dense_seqs)),
                    "{label}: {name} {} from {from} as an old token",
                    page.dir
                );
                replayed += 1;
            }
        }
        assert!(replayed > 20, "{label}: {replayed}");
        // The line goes on a STEP above the migrated head.
        let next = send(&app, &room, alice, "after").await;
        let (status, page) = call(&app, "GET", &r("/messages?dir=b&limit=1"), alice, None).await;
        assert_eq!((status, ids(&page["chunk"])), (200, vec![next.clone()]));
        let head = scalar(&state.db, &format!("SELECT seq FROM events WHERE event_id = '{next}'")).await;
        assert_eq!(head, position::ORIGIN + events_count * STEP, "{label}");
        state.db.close().await;
        let _ = std::fs::remove_dir_all(&data_dir);
        fresh.finish().await;
    }
}
