//! The DAG read from the stored PDUs (migration 0033): auth chains across
//! placed events and outliers (bare ids and v1/v2 pairs, `\u0000` escapes,
//! ids not held, cycles), the migration from the edge tables, and an
//! ignored timing of the edge-table query against the PDU one on a large
//! room. On SQLite and, with `SEQLINE_TEST_POSTGRES_URL`, on PostgreSQL.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use super::events::{self, NewEvent};
use super::outliers::{self, NewOutlier};
use super::state_tests::backends;
use super::{Backend, Db, dag, rooms};
use crate::config::SqliteSynchronous;

/// The schema before migration 0033 (edge tables filled by every write).
const WITH_EDGE_TABLES: i64 = 32;

/// An event of a test room: placed at `seq`, or an outlier.
struct Ev {
    id: String,
    seq: Option<i64>,
    kind: &'static str,
    key: Option<String>,
    json: String,
    prev: Vec<String>,
    auth: Vec<String>,
}

/// A PDU listing `prev` and `auth` as bare ids or, with `pairs`, as the
/// `[id, hashes]` pairs of room versions 1 and 2.
fn pdu(
    kind: &str,
    key: Option<&str>,
    content: Value,
    prev: &[String],
    auth: &[String],
    pairs: bool,
) -> String {
    let list = |ids: &[String]| -> Value {
        if pairs {
            Value::Array(ids.iter().map(|id| json!([id, { "sha256": "x" }])).collect())
        } else {
            json!(ids)
        }
    };
    let mut v = json!({
        "type": kind, "room_id": "!dag:x", "sender": "@a:x", "content": content,
        "prev_events": list(prev), "auth_events": list(auth), "depth": 1, "origin_server_ts": 1,
    });
    if let Some(k) = key {
        v["state_key"] = json!(k);
    }
    v.to_string()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A room joined over federation, and then some: its state held as
/// outliers, placed events citing outliers, outliers (soft-failed events)
/// citing placed ones, v1/v2 pairs, a display name with a `\u0000` escape
/// (PostgreSQL parses no such JSON as it is), an id no event of ours has, a
/// cycle of two outliers.
fn mixed_room() -> Vec<Ev> {
    let mut out = Vec::new();
    let mut seq = 0;
    let mut add = |id: &str,
                   placed: bool,
                   kind: &'static str,
                   key: Option<&str>,
                   content: Value,
                   prev: &[&str],
                   auth: &[&str],
                   pairs: bool| {
        let (prev, auth) = (ids(prev), ids(auth));
        let seq = placed.then(|| {
            seq += 1;
            crate::room::position::from_dense(seq).unwrap_or_default()
        });
        out.push(Ev {
            id: id.to_owned(),
            seq,
            kind,
            key: key.map(str::to_owned),
            json: pdu(kind, key, content, &prev, &auth, pairs),
            prev,
            auth,
        });
    };
    let join = || json!({ "membership": "join" });
    add("$create", false, "m.room.create", Some(""), json!({}), &[], &[], false);
    add("$alice", false, "m.room.member", Some("@a:x"), join(), &["$create"], &["$create"], false);
    add(
        "$power",
        false,
        "m.room.power_levels",
        Some(""),
        json!({}),
        &["$alice"],
        &["$create", "$alice"],
        false,
    );
    add(
        "$rules",
        false,
        "m.room.join_rules",
        Some(""),
        json!({}),
        &["$power"],
        &["$create", "$alice", "$power"],
        false,
    );
    add(
        "$nul",
        false,
        "m.room.member",
        Some("@n:x"),
        json!({ "membership": "join", "displayname": "a\u{0}b" }),
        &["$rules"],
        &["$create", "$power", "$rules"],
        false,
    );
    add(
        "$join",
        true,
        "m.room.member",
        Some("@me:x"),
        join(),
        &["$nul"],
        &["$create", "$power", "$rules"],
        false,
    );
    add(
        "$msg",
        true,
        "m.room.message",
        None,
        json!({ "body": "nul \u{0} here" }),
        &["$join"],
        &["$create", "$power", "$join"],
        false,
    );
    add(
        "$soft",
        false,
        "m.room.topic",
        Some(""),
        json!({ "topic": "t" }),
        &["$msg"],
        &["$create", "$power", "$join", "$gone"],
        false,
    );
    add(
        "$after",
        true,
        "m.room.name",
        Some(""),
        json!({ "name": "n" }),
        &["$msg"],
        &["$create", "$power", "$nul"],
        false,
    );
    add("$old", false, "m.room.member", Some("@o:x"), join(), &["$create"], &["$create", "$alice"], true);
    add(
        "$pairs",
        true,
        "m.room.message",
        None,
        json!({ "body": "v1" }),
        &["$after"],
        &["$old", "$power"],
        true,
    );
    add("$c1", false, "m.room.topic", Some("c"), json!({}), &[], &["$c2"], false);
    add("$c2", false, "m.room.topic", Some("c"), json!({}), &[], &["$c1", "$create"], false);
    add("$cycled", true, "m.room.message", None, json!({ "body": "c" }), &["$pairs"], &["$c1"], false);
    out
}

/// The auth chain of `seeds` walked in memory: every id reached through the
/// auth lists, held or not (the seeds only where reached).
fn oracle(evs: &[Ev], seeds: &[&str]) -> BTreeSet<String> {
    let auth: HashMap<&str, &[String]> = evs.iter().map(|e| (e.id.as_str(), e.auth.as_slice())).collect();
    let mut found = BTreeSet::new();
    let mut todo: Vec<&str> =
        seeds.iter().flat_map(|s| auth.get(s).copied().unwrap_or_default()).map(String::as_str).collect();
    while let Some(id) = todo.pop() {
        if found.insert(id.to_owned()) {
            todo.extend(auth.get(id).copied().unwrap_or_default().iter().map(String::as_str));
        }
    }
    found
}

/// Stores the room through the write path: outliers through
/// `outliers::insert`, placed events through `events::insert`.
async fn store(db: &Db, room: &str, evs: &[Ev]) {
    let mut tx = db.begin_write().await.unwrap();
    rooms::insert(tx.conn(), room, "10", "@a:x", 1).await.unwrap();
    for e in evs {
        match e.seq {
            Some(seq) => events::insert(
                tx.conn(),
                &NewEvent {
                    room_id: room,
                    seq,
                    stream: seq,
                    event_id: &e.id,
                    event_type: e.kind,
                    state_key: e.key.as_deref(),
                    sender: "@a:x",
                    origin_server_ts: 1,
                    json: &e.json,
                    txn: None,
                    membership: (e.kind == "m.room.member").then_some("join"),
                    relation: None,
                },
            )
            .await
            .unwrap(),
            None => {
                let new = NewOutlier {
                    event_id: &e.id,
                    room_id: room,
                    event_type: e.kind,
                    state_key: e.key.as_deref(),
                    sender: "@a:x",
                    origin_server_ts: 1,
                    json: &e.json,
                    received_ts: 2,
                };
                assert!(outliers::insert(tx.conn(), &new).await.unwrap());
            }
        }
    }
    tx.commit().await.unwrap();
}

async fn chain(db: &Db, seeds: &[&str]) -> BTreeSet<String> {
    dag::auth_chain_ids(db, seeds).await.unwrap().into_iter().collect()
}

/// Every event's auth chain and some larger seed sets, against the walk in
/// memory; the PDUs come back from where they are held; prev events of a
/// PDU; the bottom of the line.
#[tokio::test]
async fn auth_chains_cross_placed_events_and_outliers() {
    let room = "!dag:x";
    let evs = mixed_room();
    for fresh in backends().await {
        let label = fresh.label;
        let db = fresh.connect().await;
        store(&db, room, &evs).await;
        for e in &evs {
            assert_eq!(
                chain(&db, &[e.id.as_str()]).await,
                oracle(&evs, &[e.id.as_str()]),
                "{label}: chain of {}",
                e.id
            );
            assert_eq!(dag::prev_events_of(&e.json).unwrap(), e.prev, "{label}: prevs of {}", e.id);
        }
        let all: Vec<&str> = evs.iter().map(|e| e.id.as_str()).collect();
        for seeds in [&all[..], &["$soft", "$cycled"], &["$after", "$pairs", "$nope"], &["$nope"]] {
            assert_eq!(chain(&db, seeds).await, oracle(&evs, seeds), "{label}: chain of {seeds:?}");
        }
        // The chain runs from an outlier through a placed event to outliers
        // ($soft → $join → $rules), and to an id no event of ours has.
        let soft = chain(&db, &["$soft"]).await;
        assert!(
            soft.contains("$join") && soft.contains("$rules") && soft.contains("$gone"),
            "{label}: {soft:?}"
        );
        // auth_chain loads what is held, placed or outlier, and leaves the
        // rest out.
        let held = dag::auth_chain(&db, &["$soft", "$cycled"]).await.unwrap();
        let by_id: HashMap<&str, &Ev> = evs.iter().map(|e| (e.id.as_str(), e)).collect();
        let mut got: Vec<&str> = held.iter().map(|h| h.event_id.as_str()).collect();
        got.sort_unstable();
        let mut want: Vec<String> = oracle(&evs, &["$soft", "$cycled"])
            .into_iter()
            .filter(|id| by_id.contains_key(id.as_str()))
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "{label}");
        for h in &held {
            let e = by_id[h.event_id.as_str()];
            assert_eq!((h.seq, h.json.as_str()), (e.seq, e.json.as_str()), "{label}: {} as held", h.event_id);
        }
        // The cap counts the chain as before.
        let size = oracle(&evs, &all).len();
        assert_eq!(dag::auth_chain_ids_capped(&db, &all, size).await.unwrap().len(), size, "{label}");
        let refused = dag::auth_chain_ids_capped(&db, &all, size - 1).await;
        assert!(matches!(refused, Err(crate::error::Error::TooLarge(_))), "{label}: {refused:?}");
        // The lowest placed event cites an outlier: that is where the line
        // continues below.
        let first = evs.iter().find_map(|e| e.seq).unwrap();
        assert_eq!(
            super::backfill::bottom(&db, room).await.unwrap(),
            Some((first, vec!["$nul".to_owned()])),
            "{label}"
        );
        db.close().await;
        fresh.finish().await;
    }
}

/// The auth chain query as it was over `event_auth_edges` (schema 17-32).
fn edge_table_sql(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => {
            "WITH RECURSIVE chain(id) AS ( \
                 SELECT a.auth_id FROM event_auth_edges a WHERE a.event_id IN (SELECT value FROM json_each($1)) \
                 UNION SELECT a.auth_id FROM chain c JOIN event_auth_edges a ON a.event_id = c.id \
             ) SELECT id FROM chain LIMIT $2 + 0"
        }
        Backend::Postgres => {
            "WITH RECURSIVE chain(id) AS ( \
                 SELECT a.auth_id FROM event_auth_edges a WHERE a.event_id IN (SELECT json_array_elements_text($1::json)) \
                 UNION SELECT a.auth_id FROM chain c CROSS JOIN LATERAL \
                   (SELECT x.auth_id FROM event_auth_edges x WHERE x.event_id = c.id OFFSET 0) a \
             ) SELECT id FROM chain LIMIT $2 + 0"
        }
    }
}

async fn edge_table_chain(db: &Db, seeds: &[&str]) -> BTreeSet<String> {
    sqlx::query_scalar(edge_table_sql(db.backend))
        .bind(serde_json::to_string(seeds).unwrap())
        .bind(i64::MAX)
        .fetch_all(&mut db.reader())
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Writes the edge rows schema 17-32 kept for an event (prev edges for
/// placed events only).
async fn write_edge_rows(conn: &mut sqlx::AnyConnection, e: &Ev) {
    let placed_prevs = if e.seq.is_some() { e.prev.as_slice() } else { &[] };
    for (table, column, list) in
        [("event_edges", "prev_id", placed_prevs), ("event_auth_edges", "auth_id", e.auth.as_slice())]
    {
        for id in list {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table} (event_id, {column}) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            )))
            .bind(&e.id)
            .bind(id)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
    }
}

/// A database written before migration 0033 (events, outliers and their
/// edge rows): after it, every auth chain is the one the edge tables gave,
/// and the tables are gone.
#[tokio::test]
async fn migration_0033_keeps_every_auth_chain() {
    let room = "!dag:x";
    let evs = mixed_room();
    for fresh in backends().await {
        let label = fresh.label;
        let old =
            Db::connect_migrated_to(&fresh.url, SqliteSynchronous::Full, WITH_EDGE_TABLES).await.unwrap();
        store(&old, room, &evs).await;
        let mut tx = old.begin_write().await.unwrap();
        for e in &evs {
            write_edge_rows(tx.conn(), e).await;
        }
        tx.commit().await.unwrap();
        let all: Vec<&str> = evs.iter().map(|e| e.id.as_str()).collect();
        let mut seed_sets: Vec<Vec<&str>> = all.iter().map(|id| vec![*id]).collect();
        seed_sets.push(all.clone());
        seed_sets.push(vec!["$soft", "$cycled", "$nope"]);
        let mut before = Vec::new();
        for seeds in &seed_sets {
            before.push(edge_table_chain(&old, seeds).await);
        }
        old.close().await;

        let db = fresh.connect().await;
        for (seeds, before) in seed_sets.iter().zip(&before) {
            assert_eq!(&chain(&db, seeds).await, before, "{label}: chain of {seeds:?}");
            assert_eq!(before, &oracle(&evs, seeds), "{label}: the edge tables agreed with the PDUs");
        }
        for table in ["event_edges", "event_auth_edges"] {
            let gone = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT 1 FROM {table}")))
                .fetch_optional(&mut db.reader())
                .await;
            assert!(gone.is_err(), "{label}: {table} dropped");
        }
        db.close().await;
        fresh.finish().await;
    }
}

/// A large room's events for the timing: `members` joins (auth: create,
/// power levels, join rules; with `invited`, the previous member's
/// membership instead of the join rules, as for a join by invite, so that
/// the chain runs through every member), each followed by `messages` messages (auth:
/// create, power levels, the sender's membership); every tenth join by a
/// rename of an earlier member (auth: create, power, their membership) and
/// every 500th by a power level change (auth: create, the previous power
/// levels, the creator). The state: create, power levels, join rules, the
/// latest membership of each member.
fn large_room(members: usize, messages: usize, invited: bool) -> (Vec<Ev>, Vec<String>) {
    let mut evs = Vec::new();
    let mut seq = 0;
    let mut push = |kind: &'static str, key: Option<String>, content: Value, auth: Vec<String>| {
        seq += 1;
        let id = format!("${seq:043}");
        let prev = if seq > 1 { vec![format!("${:043}", seq - 1)] } else { vec![] };
        let json = pdu(kind, key.as_deref(), content, &prev, &auth, false);
        let seq = crate::room::position::from_dense(seq).unwrap_or_default();
        evs.push(Ev { id: id.clone(), seq: Some(seq), kind, key, json, prev, auth });
        id
    };
    let create = push("m.room.create", Some(String::new()), json!({ "creator": "@u0:x" }), vec![]);
    let creator =
        push("m.room.member", Some("@u0:x".into()), json!({ "membership": "join" }), vec![create.clone()]);
    let mut power = push(
        "m.room.power_levels",
        Some(String::new()),
        json!({ "users": { "@u0:x": 100 } }),
        vec![create.clone(), creator.clone()],
    );
    let rules = push(
        "m.room.join_rules",
        Some(String::new()),
        json!({ "join_rule": "public" }),
        vec![create.clone(), power.clone(), creator.clone()],
    );
    let mut member: Vec<String> = vec![creator.clone()];
    for m in 1..members {
        let user = format!("@u{m}:x");
        let join = push(
            "m.room.member",
            Some(user),
            json!({ "membership": "join", "displayname": format!("user {m}") }),
            if invited {
                vec![create.clone(), power.clone(), member[m - 1].clone()]
            } else {
                vec![create.clone(), power.clone(), rules.clone()]
            },
        );
        member.push(join.clone());
        for i in 0..messages {
            push(
                "m.room.message",
                None,
                json!({ "msgtype": "m.text", "body": format!("message {i} of {m}, some words to make it longer") }),
                vec![create.clone(), power.clone(), join.clone()],
            );
        }
        if m % 10 == 9 {
            let who = (m.wrapping_mul(2_654_435_761) >> 7) % m;
            let rename = push(
                "m.room.member",
                Some(format!("@u{who}:x")),
                json!({ "membership": "join", "displayname": format!("renamed at {m}") }),
                vec![create.clone(), power.clone(), member[who].clone()],
            );
            member[who] = rename;
        }
        if m % 500 == 499 {
            power = push(
                "m.room.power_levels",
                Some(String::new()),
                json!({ "users": { "@u0:x": 100, format!("@u{m}:x"): 50 } }),
                vec![create.clone(), power.clone(), member[0].clone()],
            );
        }
    }
    let mut state = vec![create, power, rules];
    state.extend(member);
    (evs, state)
}

/// Bulk rows of a large room, as `events::insert` would leave them at
/// `schema` (with the edge rows before 0033).
async fn fill_large(db: &Db, room: &str, evs: &[Ev], edge_rows: bool) {
    let mut tx = db.begin_write().await.unwrap();
    rooms::insert(tx.conn(), room, "10", "@u0:x", 1).await.unwrap();
    for chunk in evs.chunks(100) {
        let mut sql = String::from(
            "INSERT INTO events (room_id, seq, stream, event_id, event_type, state_key, sender, origin_server_ts, json) VALUES ",
        );
        for i in 0..chunk.len() {
            let p = i * 6;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "('{room}', ${}, ${}, ${}, ${}, ${}, '@u0:x', 1, ${})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 5,
                p + 6
            ));
        }
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for e in chunk {
            let seq = e.seq.unwrap_or_default();
            q = q
                .bind(seq)
                .bind(seq)
                .bind(e.id.as_str())
                .bind(e.kind)
                .bind(e.key.as_deref())
                .bind(e.json.as_str());
        }
        q.execute(tx.conn()).await.unwrap();
        if edge_rows {
            for e in chunk {
                write_edge_rows(tx.conn(), e).await;
            }
        }
    }
    tx.commit().await.unwrap();
}

/// Timings of the auth chain query over the edge tables (schema 32) and
/// over the PDUs (schema 33) on two copies of one large room, taking
/// turns: `cargo test -p seqline --lib auth_chain_timings -- --ignored
/// --nocapture` (a measurement, not a test; sizes from
/// `SEQLINE_TIMING_MEMBERS` (5,000), `SEQLINE_TIMING_MESSAGES` (4 per
/// member), `SEQLINE_TIMING_ROUNDS` (9); `SEQLINE_TIMING_INVITED=1`: each
/// member joins by the invite of the one before, the chains run through
/// them all).
#[tokio::test]
#[ignore = "a measurement: run by hand"]
async fn auth_chain_timings() {
    let param =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let members = param("SEQLINE_TIMING_MEMBERS", 5_000);
    let messages = param("SEQLINE_TIMING_MESSAGES", 4);
    let rounds = param("SEQLINE_TIMING_ROUNDS", 9);
    let room = "!big:x";
    let invited = std::env::var("SEQLINE_TIMING_INVITED").is_ok();
    let (evs, state) = large_room(members, messages, invited);
    let state: Vec<&str> = state.iter().map(String::as_str).collect();
    let last_message = evs.iter().rev().find(|e| e.kind == "m.room.message").map(|e| e.id.as_str());
    let last_message: Vec<&str> = last_message.into_iter().collect();
    let old_copies = backends().await;
    let new_copies = backends().await;
    for (old_fresh, new_fresh) in old_copies.into_iter().zip(new_copies) {
        let label = old_fresh.label;
        let old = Db::connect_migrated_to(&old_fresh.url, SqliteSynchronous::Normal, WITH_EDGE_TABLES)
            .await
            .unwrap();
        fill_large(&old, room, &evs, true).await;
        let before = Db::connect_migrated_to(&new_fresh.url, SqliteSynchronous::Normal, WITH_EDGE_TABLES)
            .await
            .unwrap();
        fill_large(&before, room, &evs, true).await;
        before.close().await;
        let t = std::time::Instant::now();
        let new = new_fresh.connect().await;
        eprintln!("{label:9} migration 0033 on {} events: {:.2?}", evs.len(), t.elapsed());
        for (what, seeds) in [("the current state", &state), ("the last message", &last_message)] {
            let (mut t_old, mut t_new) = (Vec::new(), Vec::new());
            let mut sizes = (0, 0);
            for _ in 0..rounds {
                let t = std::time::Instant::now();
                sizes.0 = edge_table_chain(&old, seeds).await.len();
                t_old.push(t.elapsed());
                let t = std::time::Instant::now();
                sizes.1 = dag::auth_chain_ids(&new, seeds).await.unwrap().len();
                t_new.push(t.elapsed());
            }
            assert_eq!(sizes.0, sizes.1, "{label} {what}: the same chain");
            t_old.sort();
            t_new.sort();
            let show = |t: &[std::time::Duration]| format!("{:.2?} / {:.2?}", t[0], t[t.len() / 2]);
            eprintln!(
                "{label:9} auth chain of {what:18} ({} seeds, {} ids): edge tables {}, PDUs {} (min / median)",
                seeds.len(),
                sizes.1,
                show(&t_old),
                show(&t_new)
            );
        }
        old.close().await;
        new.close().await;
        old_fresh.finish().await;
        new_fresh.finish().await;
    }
}
