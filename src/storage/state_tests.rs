//! Storage tests of the federation foundations (`state_runs`, outliers, DAG
//! edges read from the PDUs), on SQLite and, when `SEQLINE_TEST_POSTGRES_URL` is set, on
//! PostgreSQL (each run in its own schema).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

use super::events::{self, NewEvent, StoredEvent};
use super::outliers::{self, NewOutlier};
use super::{Db, dag, rooms, state_runs};
use crate::config::SqliteSynchronous;

/// A database for one test run, removed by [`Fresh::finish`].
pub(crate) struct Fresh {
    pub(crate) label: &'static str,
    pub(crate) url: String,
    dir: Option<std::path::PathBuf>,
    pg_schema: Option<(String, String)>,
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// SQLite always; PostgreSQL when `SEQLINE_TEST_POSTGRES_URL` is set.
pub(crate) async fn backends() -> Vec<Fresh> {
    let dir = std::env::temp_dir().join(unique("seqline-state"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = vec![Fresh {
        label: "sqlite",
        url: format!("sqlite://{}", dir.join("seqline.db").display()),
        dir: Some(dir),
        pg_schema: None,
    }];
    match std::env::var("SEQLINE_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()) {
        Some(base) => {
            let schema = unique("seqline_s");
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&base).await.expect("connect to SEQLINE_TEST_POSTGRES_URL");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
            let sep = if base.contains('?') { '&' } else { '?' };
            out.push(Fresh {
                label: "postgres",
                url: format!("{base}{sep}options=-c%20search_path%3D{schema}"),
                dir: None,
                pg_schema: Some((base, schema)),
            });
        }
        None => eprintln!("postgres skipped: SEQLINE_TEST_POSTGRES_URL is not set"),
    }
    out
}

impl Fresh {
    pub(crate) async fn connect(&self) -> Db {
        Db::connect(&self.url, SqliteSynchronous::Full).await.unwrap()
    }

    pub(super) async fn finish(self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((base, schema)) = &self.pg_schema {
            let pool = sqlx::AnyPool::connect(base).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
    }
}

/// What a reader answered, comparable: (seq, event id, json).
fn ids(events: &[StoredEvent]) -> Vec<(i64, String, String)> {
    events.iter().map(|e| (e.seq, e.event_id.clone(), e.json.clone())).collect()
}

/// A tiny deterministic generator (no dependency, same rooms every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One generated event of an old-format room.
struct OldEvent {
    seq: i64,
    event_id: String,
    event_type: String,
    state_key: Option<String>,
    json: String,
    prev: Vec<String>,
    auth: Vec<String>,
}

/// A room of `n` events mixing messages and changes of a few state keys
/// (members joining, leaving, rejoining; history visibility; name; power),
/// as the events table held it before `state_runs`. `pairs`: prev and auth
/// events in the [id, hashes] form of room versions 1 and 2.
fn generate_room(room_id: &str, n: i64, seed: u64, pairs: bool) -> Vec<OldEvent> {
    let mut rng = Lcg(seed);
    let users = ["@a:x", "@b:x", "@c:x", "@d:x"];
    let mut out: Vec<OldEvent> = Vec::new();
    let mut current: HashMap<(String, String), String> = HashMap::new();
    for seq in 1..=n {
        let (kind, key, content) = if seq == 1 {
            ("m.room.create", Some(String::new()), json!({ "creator": "@a:x" }))
        } else if seq == 2 {
            ("m.room.member", Some("@a:x".to_owned()), json!({ "membership": "join" }))
        } else {
            match rng.next(8) {
                0 | 1 => {
                    let user = users[rng.next(4) as usize];
                    let m = ["join", "leave", "invite", "ban"][rng.next(4) as usize];
                    (
                        "m.room.member",
                        Some(user.to_owned()),
                        json!({ "membership": m, "displayname": format!("{user}{seq}") }),
                    )
                }
                2 => {
                    let hv = ["joined", "shared", "invited", "world_readable"][rng.next(4) as usize];
                    ("m.room.history_visibility", Some(String::new()), json!({ "history_visibility": hv }))
                }
                3 => ("m.room.name", Some(String::new()), json!({ "name": format!("name {seq}") })),
                4 => ("m.room.power_levels", Some(String::new()), json!({ "users": { "@a:x": 100 + seq } })),
                _ => ("m.room.message", None, json!({ "body": format!("message {seq}") })),
            }
        };
        let event_id = format!("$e{seq}_{}", &room_id[1..]);
        let prev: Vec<String> = out.last().map(|e| vec![e.event_id.clone()]).unwrap_or_default();
        let mut auth: Vec<String> = Vec::new();
        for k in [("m.room.create", ""), ("m.room.power_levels", "")] {
            if let Some(id) = current.get(&(k.0.to_owned(), k.1.to_owned())) {
                auth.push(id.clone());
            }
        }
        let list = |ids: &[String]| -> Value {
            if pairs {
                Value::Array(ids.iter().map(|id| json!([id, { "sha256": "x" }])).collect())
            } else {
                json!(ids)
            }
        };
        let mut pdu = json!({
            "type": kind, "room_id": room_id, "sender": "@a:x", "content": content,
            "prev_events": list(&prev), "auth_events": list(&auth), "depth": seq,
            "origin_server_ts": 1_000 + seq,
        });
        if let Some(k) = &key {
            pdu["state_key"] = json!(k);
            current.insert((kind.to_owned(), k.clone()), event_id.clone());
        }
        out.push(OldEvent {
            seq,
            event_id,
            event_type: kind.to_owned(),
            state_key: key,
            json: pdu.to_string(),
            prev,
            auth,
        });
    }
    out
}

/// Stores a generated room the way the schema before `state_runs` held it.
async fn store_old_room(db: &Db, room_id: &str, events: &[OldEvent]) {
    let mut tx = db.begin_write().await.unwrap();
    rooms::insert(tx.conn(), room_id, "10", "@a:x", 1).await.unwrap();
    for (i, e) in events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO events (room_id, seq, stream, event_id, event_type, state_key, sender, origin_server_ts, json) \
             VALUES ($1, $2, $3, $4, $5, $6, '@a:x', $7, $8)",
        )
        .bind(room_id)
        .bind(e.seq)
        .bind(i64::try_from(i).unwrap() + 1_000 * e.seq)
        .bind(&e.event_id)
        .bind(&e.event_type)
        .bind(e.state_key.as_deref())
        .bind(1_000 + e.seq)
        .bind(&e.json)
        .execute(tx.conn())
        .await
        .unwrap();
        if let Some(k) = &e.state_key {
            let membership = (e.event_type == "m.room.member").then(|| {
                serde_json::from_str::<Value>(&e.json).unwrap()["content"]["membership"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            });
            events::set_current(
                tx.conn(),
                room_id,
                &e.event_type,
                k,
                &e.event_id,
                membership.as_deref(),
                e.seq,
            )
            .await
            .unwrap();
        }
    }
    tx.commit().await.unwrap();
}

type Answer = Vec<(i64, String, String)>;

/// The columns a reader returns, as the old readers selected them.
type OldRow = (String, i64, String, String, Option<String>, Option<String>, Option<String>);
const OLD_COLUMNS: &str = "e.room_id, e.seq, e.event_id, e.json, e.redacted_by, e.txn_device_id, e.txn_id";

fn answer(rows: Vec<OldRow>) -> Answer {
    rows.into_iter().map(|(_, seq, id, json, ..)| (seq, id, json)).collect()
}

/// The state readers as they were before `state_runs` (reading `events`).
async fn old_state_at(db: &Db, room_id: &str, at: i64, extra: &str) -> Answer {
    answer(
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {OLD_COLUMNS} FROM events e WHERE e.room_id = $1 AND e.seq IN \
           (SELECT (SELECT MAX(x.seq) FROM events x WHERE x.room_id = s.room_id \
                      AND x.event_type = s.event_type AND x.state_key = s.state_key AND x.seq <= $2) \
            FROM room_state s WHERE s.room_id = $1 {extra}) \
         ORDER BY e.seq"
        )))
        .bind(room_id)
        .bind(at)
        .fetch_all(&mut db.reader())
        .await
        .unwrap(),
    )
}

async fn old_changed_between(db: &Db, room_id: &str, after: i64, at: i64) -> Answer {
    answer(
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {OLD_COLUMNS} FROM events e WHERE e.room_id = $1 AND e.seq > $2 AND e.seq <= $3 \
           AND e.state_key IS NOT NULL AND NOT EXISTS \
           (SELECT 1 FROM events y WHERE y.room_id = e.room_id AND y.event_type = e.event_type \
              AND y.state_key = e.state_key AND y.seq > e.seq AND y.seq <= $3) \
         ORDER BY e.seq"
        )))
        .bind(room_id)
        .bind(after)
        .bind(at)
        .fetch_all(&mut db.reader())
        .await
        .unwrap(),
    )
}

async fn old_state_event_at(db: &Db, room_id: &str, kind: &str, key: &str, at: i64) -> Answer {
    answer(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {OLD_COLUMNS} FROM events e WHERE e.room_id = $1 AND e.event_type = $2 AND e.state_key = $3 \
           AND e.seq <= $4 ORDER BY e.seq DESC LIMIT 1"
    )))
    .bind(room_id)
    .bind(kind)
    .bind(key)
    .bind(at)
    .fetch_all(&mut db.reader())
    .await
    .unwrap())
}

async fn old_key_changes(db: &Db, room_id: &str, kind: &str, key: &str) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT seq, json FROM events WHERE room_id = $1 AND event_type = $2 AND state_key = $3 ORDER BY seq",
    )
    .bind(room_id)
    .bind(kind)
    .bind(key)
    .fetch_all(&mut db.reader())
    .await
    .unwrap()
}

/// Every question the readers answer, asked of the old queries before the
/// migration and of the new readers after it: the same answers, for every
/// seq and every stretch of three rooms (one with v1-style pairs).
#[tokio::test]
async fn migration_keeps_every_state_answer() {
    const LAST_BEFORE: i64 = 16;
    let rooms: Vec<(String, Vec<OldEvent>)> = vec![
        ("!one:x".to_owned(), generate_room("!one:x", 70, 1, false)),
        ("!two:x".to_owned(), generate_room("!two:x", 40, 7, true)),
        ("!three:x".to_owned(), generate_room("!three:x", 2, 3, false)),
    ];
    for fresh in backends().await {
        let old = Db::connect_migrated_to(&fresh.url, SqliteSynchronous::Full, LAST_BEFORE).await.unwrap();
        let mut keys: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
        for (room_id, evs) in &rooms {
            store_old_room(&old, room_id, evs).await;
            keys.insert(
                room_id,
                evs.iter().filter_map(|e| Some((e.event_type.clone(), e.state_key.clone()?))).collect(),
            );
        }
        let mut expected: HashMap<String, Answer> = HashMap::new();
        let mut expected_changes: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        for (room_id, evs) in &rooms {
            let last = evs.len() as i64;
            for at in 0..=last + 1 {
                expected.insert(format!("{room_id} all {at}"), old_state_at(&old, room_id, at, "").await);
                let no_members = "AND s.event_type <> 'm.room.member'";
                expected.insert(
                    format!("{room_id} nomem {at}"),
                    old_state_at(&old, room_id, at, no_members).await,
                );
                for after in 0..at {
                    expected.insert(
                        format!("{room_id} diff {after} {at}"),
                        old_changed_between(&old, room_id, after, at).await,
                    );
                }
                for (kind, key) in &keys[room_id.as_str()] {
                    expected.insert(
                        format!("{room_id} key {kind} {key} {at}"),
                        old_state_event_at(&old, room_id, kind, key, at).await,
                    );
                }
            }
            for (kind, key) in &keys[room_id.as_str()] {
                expected_changes.insert(
                    format!("{room_id} {kind} {key}"),
                    old_key_changes(&old, room_id, kind, key).await,
                );
            }
        }
        old.close().await;

        let db = fresh.connect().await;
        let label = fresh.label;
        let mut checked = 0;
        // Migration 0020 made positions sparse: ask at the points the old
        // seqs became.
        let p = |seq: i64| crate::room::position::from_dense(seq).unwrap();
        let sparse = |answer: &Answer| -> Answer {
            answer.iter().map(|(seq, id, json)| (p(*seq), id.clone(), json.clone())).collect()
        };
        for (room_id, evs) in &rooms {
            let last = evs.len() as i64;
            for dense_at in 0..=last + 1 {
                let at = p(dense_at);
                assert_eq!(
                    ids(&events::state_at(&db, room_id, at).await.unwrap()),
                    sparse(&expected[&format!("{room_id} all {dense_at}")]),
                    "{label}: state_at({room_id}, {at})"
                );
                assert_eq!(
                    ids(&events::state_at_without_members(&db, room_id, at).await.unwrap()),
                    sparse(&expected[&format!("{room_id} nomem {dense_at}")]),
                    "{label}: state_at_without_members({room_id}, {at})"
                );
                // Lazy members: the state but its members, and the member
                // events of the users named, are the whole state less the
                // other members.
                let users: Vec<&str> = keys[room_id.as_str()]
                    .iter()
                    .filter(|(kind, _)| kind == "m.room.member")
                    .map(|(_, key)| key.as_str())
                    .take(2)
                    .collect();
                let mut lazy = events::state_at_without_members(&db, room_id, at).await.unwrap();
                lazy.extend(events::members_at(&db, room_id, &users, at).await.unwrap());
                lazy.sort_by(|a, b| (a.seq, &a.event_id).cmp(&(b.seq, &b.event_id)));
                let whole = events::state_at(&db, room_id, at).await.unwrap();
                let wanted: Vec<_> = whole
                    .into_iter()
                    .filter(|e| {
                        let pdu: serde_json::Value = serde_json::from_str(&e.json).unwrap();
                        pdu["type"] != "m.room.member"
                            || pdu["state_key"].as_str().is_some_and(|k| users.contains(&k))
                    })
                    .collect();
                assert_eq!(ids(&lazy), ids(&wanted), "{label}: lazy state ({room_id}, {users:?}, {at})");
                for dense_after in 0..dense_at {
                    let after = p(dense_after);
                    assert_eq!(
                        ids(&events::state_changed_between(&db, room_id, after, at).await.unwrap()),
                        sparse(&expected[&format!("{room_id} diff {dense_after} {dense_at}")]),
                        "{label}: state_changed_between({room_id}, {after}, {at})"
                    );
                    checked += 1;
                }
                for (kind, key) in &keys[room_id.as_str()] {
                    let got = events::state_event_at(&db, room_id, kind, key, at).await.unwrap();
                    assert_eq!(
                        ids(&got.into_iter().collect::<Vec<_>>()),
                        sparse(&expected[&format!("{room_id} key {kind} {key} {dense_at}")]),
                        "{label}: state_event_at({room_id}, {kind}, {key}, {at})"
                    );
                }
                checked += 2;
            }
            for (kind, key) in &keys[room_id.as_str()] {
                let got: Vec<(i64, String)> = events::state_changes(&db, room_id, kind, key)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|(seq, json)| (seq, json.expect("no absent keys in a linear room")))
                    .collect();
                let want: Vec<(i64, String)> = expected_changes[&format!("{room_id} {kind} {key}")]
                    .iter()
                    .map(|(seq, json)| (p(*seq), json.clone()))
                    .collect();
                assert_eq!(got, want, "{label}: {kind} {key}");
            }
            // The current state is the state at the head.
            assert_eq!(
                ids(&events::current_state(&db, room_id).await.unwrap()),
                sparse(&expected[&format!("{room_id} all {last}")]),
                "{label}: current state of {room_id}"
            );

            // Unread candidates: every event of the range from someone else,
            // newest first, but (when asked) member events about others.
            for me in ["@a:x", "@b:x", "@c:x"] {
                for others_membership in [false, true] {
                    let skip = events::CandidateSkip { sender: me, others_membership };
                    for (lo, hi, limit) in [(1, last, 1_000), (3, last - 5, 1_000), (1, last, 4), (9, 9, 10)]
                    {
                        let want: Vec<i64> = evs
                            .iter()
                            .rev()
                            .filter(|e| (lo..=hi).contains(&e.seq) && me != "@a:x")
                            .filter(|e| {
                                !(others_membership
                                    && e.event_type == "m.room.member"
                                    && e.state_key.as_deref() != Some(me))
                            })
                            .map(|e| p(e.seq))
                            .take(limit)
                            .collect();
                        let got: Vec<i64> =
                            events::unread_candidates(&db, room_id, p(lo), p(hi), &skip, limit as i64)
                                .await
                                .unwrap()
                                .iter()
                                .map(|e| e.seq)
                                .collect();
                        assert_eq!(
                            got, want,
                            "{label}: unread_candidates {room_id} {me} {lo}..={hi} {limit}"
                        );
                    }
                }
            }

            // One state_runs row per state event, and the edges read from
            // the PDUs (the edge tables 0017 filled are gone since 0033):
            // each event's prev events, and its auth chain, the closure of
            // the generated auth lists (v1/v2 pairs in room two).
            let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM state_runs WHERE room_id = $1")
                .bind(room_id)
                .fetch_one(&mut db.reader())
                .await
                .unwrap();
            assert_eq!(runs, evs.iter().filter(|e| e.state_key.is_some()).count() as i64, "{label}");
            let auth_of: HashMap<&str, &[String]> =
                evs.iter().map(|e| (e.event_id.as_str(), e.auth.as_slice())).collect();
            for e in evs {
                let stored = events::by_id(&db, &e.event_id).await.unwrap().unwrap();
                assert_eq!(
                    dag::prev_events_of(&stored.json).unwrap(),
                    e.prev,
                    "{label}: prevs of {}",
                    e.event_id
                );
                let mut want = BTreeSet::new();
                let mut todo: Vec<&str> = e.auth.iter().map(String::as_str).collect();
                while let Some(id) = todo.pop() {
                    if want.insert(id.to_owned()) {
                        todo.extend(auth_of[id].iter().map(String::as_str));
                    }
                }
                let chain: BTreeSet<String> =
                    dag::auth_chain_ids(&db, &[e.event_id.as_str()]).await.unwrap().into_iter().collect();
                assert_eq!(chain, want, "{label}: auth chain of {}", e.event_id);
            }
            let bottom = super::backfill::bottom(&db, room_id).await.unwrap();
            assert_eq!(bottom, Some((p(1), Vec::new())), "{label}: nothing missing below {room_id}");
        }
        assert!(checked > 3_000, "{label}: {checked} answers compared");
        db.close().await;
        fresh.finish().await;
    }
}

/// A minimal PDU for the snapshot test.
fn pdu(event_id: &str, kind: &str, key: Option<&str>, auth: &[&str]) -> String {
    let content = if kind == "m.room.member" { json!({ "membership": "join" }) } else { json!({}) };
    let mut v = json!({ "event_id": event_id, "type": kind, "sender": "@r:remote", "content": content, "auth_events": auth });
    if let Some(k) = key {
        v["state_key"] = json!(k);
    }
    v.to_string()
}

async fn outlier(
    db: &Db,
    room_id: &str,
    event_id: &str,
    kind: &str,
    key: Option<&str>,
    auth: &[&str],
) -> bool {
    let json = pdu(event_id, kind, key, auth);
    let mut tx = db.begin_write().await.unwrap();
    let new = outliers::insert(
        tx.conn(),
        &NewOutlier {
            event_id,
            room_id,
            event_type: kind,
            state_key: key,
            sender: "@r:remote",
            origin_server_ts: 5,
            json: &json,
            received_ts: 6,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    new
}

fn keyed(events: &[StoredEvent]) -> BTreeMap<String, i64> {
    events.iter().map(|e| (e.event_id.clone(), e.seq)).collect()
}

/// A room joined over federation: its state arrives as outliers, the join
/// is the first placed event, and the snapshot at the join's position is
/// what every state reader answers there; later positions build on it.
#[tokio::test]
async fn snapshot_of_outliers_is_the_state_at_its_seq() {
    let room = "!remote:elsewhere";
    for fresh in backends().await {
        let label = fresh.label;
        let db = fresh.connect().await;
        // The state of the room before our join, as send_join returns it.
        assert!(outlier(&db, room, "$create", "m.room.create", Some(""), &[]).await);
        assert!(outlier(&db, room, "$creator", "m.room.member", Some("@r:remote"), &["$create"]).await);
        assert!(
            outlier(&db, room, "$power", "m.room.power_levels", Some(""), &["$create", "$creator"]).await
        );
        assert!(
            outlier(&db, room, "$rules", "m.room.join_rules", Some(""), &["$create", "$creator", "$power"])
                .await
        );
        assert!(
            outlier(&db, room, "$topic", "m.room.topic", Some(""), &["$create", "$creator", "$power"]).await
        );
        // An outlier is stored once.
        assert!(!outlier(&db, room, "$rules", "m.room.join_rules", Some(""), &[]).await, "{label}");

        let mut tx = db.begin_write().await.unwrap();
        rooms::insert(tx.conn(), room, "10", "@r:remote", 1).await.unwrap();
        let join = pdu("$join", "m.room.member", Some("@me:here"), &["$create", "$power", "$rules"]);
        events::insert(
            tx.conn(),
            &NewEvent {
                room_id: room,
                seq: 1,
                stream: 1,
                event_id: "$join",
                event_type: "m.room.member",
                state_key: Some("@me:here"),
                sender: "@me:here",
                origin_server_ts: 7,
                json: &join,
                txn: None,
                membership: Some("join"),
                relation: None,
            },
        )
        .await
        .unwrap();
        let snapshot = [
            ("m.room.create", "", "$create"),
            ("m.room.member", "@r:remote", "$creator"),
            ("m.room.power_levels", "", "$power"),
            ("m.room.join_rules", "", "$rules"),
            ("m.room.topic", "", "$topic"),
            ("m.room.member", "@me:here", "$join"),
        ];
        let written = state_runs::write_snapshot(tx.conn(), room, 1, &snapshot).await.unwrap();
        assert_eq!(written, 6, "{label}: a room with no state gets a row per key");
        for (kind, key, id) in snapshot {
            let membership = match id {
                "$join" | "$creator" => Some("join"),
                _ => None,
            };
            events::set_current(tx.conn(), room, kind, key, id, membership, 1).await.unwrap();
        }
        tx.commit().await.unwrap();

        let all: BTreeMap<String, i64> = snapshot.iter().map(|(_, _, id)| ((*id).to_owned(), 1)).collect();
        assert_eq!(keyed(&events::state_at(&db, room, 1).await.unwrap()), all, "{label}: state_at the join");
        assert_eq!(keyed(&events::current_state(&db, room).await.unwrap()), all, "{label}: current state");
        assert_eq!(keyed(&events::state_changed_between(&db, room, 0, 1).await.unwrap()), all, "{label}");
        assert!(events::state_at(&db, room, 0).await.unwrap().is_empty(), "{label}: nothing before the join");
        let no_members = keyed(&events::state_at_without_members(&db, room, 1).await.unwrap());
        assert_eq!(
            no_members.keys().collect::<Vec<_>>(),
            ["$create", "$power", "$rules", "$topic"],
            "{label}"
        );
        let topic = events::state_event_at(&db, room, "m.room.topic", "", 1).await.unwrap().unwrap();
        assert_eq!((topic.event_id.as_str(), topic.seq), ("$topic", 1), "{label}");
        assert_eq!(topic.json, pdu("$topic", "m.room.topic", Some(""), &["$create", "$creator", "$power"]));
        let creator = events::membership_changes(&db, room, "@r:remote").await.unwrap();
        assert_eq!(creator.iter().map(|c| (c.seq, c.membership.as_str())).collect::<Vec<_>>(), [(1, "join")]);

        // Clients never get an outlier by id; federation does.
        assert!(events::by_id(&db, "$topic").await.unwrap().is_none(), "{label}");
        assert_eq!(events::by_id(&db, "$join").await.unwrap().unwrap().seq, 1, "{label}");
        let held = outliers::held_by_id(&db, "$topic").await.unwrap().unwrap();
        assert_eq!((held.room_id.as_str(), held.seq), (room, None), "{label}");
        assert_eq!(outliers::held_by_id(&db, "$join").await.unwrap().unwrap().seq, Some(1), "{label}");
        assert!(outliers::held_by_id(&db, "$nope").await.unwrap().is_none(), "{label}");
        // A placed event is never stored again as an outlier.
        assert!(!outlier(&db, room, "$join", "m.room.member", Some("@me:here"), &[]).await, "{label}");
        assert_eq!(
            dag::missing(&db, &["$topic", "$gone", "$join", "$gone", "$other"]).await.unwrap(),
            ["$gone", "$other"],
            "{label}"
        );

        // The auth chain of the join runs through outliers.
        let mut chain: Vec<String> =
            dag::auth_chain(&db, &["$join"]).await.unwrap().into_iter().map(|h| h.event_id).collect();
        chain.sort();
        assert_eq!(chain, ["$create", "$creator", "$power", "$rules"], "{label}");
        let mut chain = dag::auth_chain_ids(&db, &["$topic", "$join"]).await.unwrap();
        chain.sort();
        assert_eq!(chain, ["$create", "$creator", "$power", "$rules"], "{label}");
        assert!(dag::auth_chain_ids(&db, &["$create"]).await.unwrap().is_empty(), "{label}");
        // Past the cap: refused, not cut short.
        assert_eq!(dag::auth_chain_ids_capped(&db, &["$join"], 4).await.unwrap().len(), 4, "{label}");
        let refused = dag::auth_chain_ids_capped(&db, &["$join"], 3).await;
        assert!(matches!(refused, Err(crate::error::Error::TooLarge(_))), "{label}: {refused:?}");

        // Seq 2: a placed topic change; seq 3: a snapshot that changes the
        // name, keeps the rest and drops the topic.
        assert!(outlier(&db, room, "$name", "m.room.name", Some(""), &["$create"]).await);
        let mut tx = db.begin_write().await.unwrap();
        let topic2 = pdu("$topic2", "m.room.topic", Some(""), &["$create", "$power"]);
        events::insert(
            tx.conn(),
            &NewEvent {
                room_id: room,
                seq: 2,
                stream: 2,
                event_id: "$topic2",
                event_type: "m.room.topic",
                state_key: Some(""),
                sender: "@me:here",
                origin_server_ts: 8,
                json: &topic2,
                txn: None,
                membership: None,
                relation: None,
            },
        )
        .await
        .unwrap();
        let later = [
            ("m.room.create", "", "$create"),
            ("m.room.member", "@r:remote", "$creator"),
            ("m.room.power_levels", "", "$power"),
            ("m.room.join_rules", "", "$rules"),
            ("m.room.member", "@me:here", "$join"),
            ("m.room.name", "", "$name"),
        ];
        let written = state_runs::write_snapshot(tx.conn(), room, 3, &later).await.unwrap();
        assert_eq!(written, 2, "{label}: the name appears, the topic goes");
        events::set_current(tx.conn(), room, "m.room.name", "", "$name", None, 3).await.unwrap();
        tx.commit().await.unwrap();

        let at2 = keyed(&events::state_at(&db, room, 2).await.unwrap());
        assert_eq!(at2.get("$topic2"), Some(&2), "{label}");
        assert!(!at2.contains_key("$topic") && !at2.contains_key("$name"), "{label}: {at2:?}");
        let at3 = keyed(&events::state_at(&db, room, 3).await.unwrap());
        let want3: BTreeMap<String, i64> =
            [("$create", 1), ("$creator", 1), ("$power", 1), ("$rules", 1), ("$join", 1), ("$name", 3)]
                .into_iter()
                .map(|(id, seq)| (id.to_owned(), seq))
                .collect();
        assert_eq!(at3, want3, "{label}: state_at after the snapshot");
        assert!(events::state_event_at(&db, room, "m.room.topic", "", 3).await.unwrap().is_none(), "{label}");
        assert_eq!(
            events::state_event_at(&db, room, "m.room.topic", "", 2).await.unwrap().unwrap().event_id,
            "$topic2",
            "{label}"
        );
        // The topic's absence has nothing to send; the name is new.
        assert_eq!(
            keyed(&events::state_changed_between(&db, room, 1, 3).await.unwrap()),
            [("$name".to_owned(), 3)].into(),
            "{label}"
        );
        assert_eq!(
            events::state_changes(&db, room, "m.room.topic", "")
                .await
                .unwrap()
                .into_iter()
                .map(|(s, j)| (s, j.is_some()))
                .collect::<Vec<_>>(),
            [(1, true), (2, true), (3, false)],
            "{label}"
        );
        // Rewriting a position replaces its rows.
        let mut tx = db.begin_write().await.unwrap();
        assert_eq!(state_runs::write_snapshot(tx.conn(), room, 3, &later[..5]).await.unwrap(), 1, "{label}");
        tx.commit().await.unwrap();
        assert!(!keyed(&events::state_at(&db, room, 3).await.unwrap()).contains_key("$name"), "{label}");

        // A position's snapshot may also be written before its event is placed.
        let mut tx = db.begin_write().await.unwrap();
        let mut with_topic = later[..5].to_vec();
        with_topic.push(("m.room.topic", "", "$topic3"));
        assert_eq!(state_runs::write_snapshot(tx.conn(), room, 4, &with_topic).await.unwrap(), 1, "{label}");
        let topic3 = pdu("$topic3", "m.room.topic", Some(""), &["$create", "$power"]);
        events::insert(
            tx.conn(),
            &NewEvent {
                room_id: room,
                seq: 4,
                stream: 4,
                event_id: "$topic3",
                event_type: "m.room.topic",
                state_key: Some(""),
                sender: "@me:here",
                origin_server_ts: 9,
                json: &topic3,
                txn: None,
                membership: None,
                relation: None,
            },
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let at4 = keyed(&events::state_at(&db, room, 4).await.unwrap());
        assert_eq!((at4.len(), at4.get("$topic3")), (6, Some(&4)), "{label}: {at4:?}");

        db.close().await;
        fresh.finish().await;
    }
}

/// The auth chain of a local room's events, from the edges the write path
/// records, equals the chain found by walking the PDUs' own `auth_events`,
/// and holds what the spec says it must: the create event, the power
/// levels, the join rules and the sender's own membership.
#[tokio::test]
async fn auth_chain_of_a_local_room() {
    use ruma::RoomVersionId;

    use crate::room::create::{CreateRoom, Preset, create_room};
    use crate::room::membership::{self, Change};
    use crate::room::pdu::{Draft, canonical_content};

    for fresh in backends().await {
        let label = fresh.label;
        let dir = std::env::temp_dir().join(unique("seqline-state-app"));
        let url = fresh.url.clone();
        let data_dir = dir.display().to_string();
        let env = |k: &str| match k {
            "SEQLINE_SERVER_NAME" => Some("example.org".to_owned()),
            "SEQLINE_DATA_DIR" => Some(data_dir.clone()),
            "SEQLINE_DATABASE_URL" => Some(url.clone()),
            _ => None,
        };
        let settings = crate::config::Config::load(None, env).unwrap().validate().unwrap();
        let state = crate::server::open(settings).await.unwrap();
        let alice = crate::account::create_user(&state, "alice", None, false).await.unwrap();
        let bob = crate::account::create_user(&state, "bob", None, false).await.unwrap();
        for version in [RoomVersionId::V10, RoomVersionId::V12] {
            let room_id = create_room(
                &state,
                &alice,
                CreateRoom {
                    version: version.clone(),
                    preset: Preset::PublicChat,
                    creation_content: Default::default(),
                    power_level_override: Default::default(),
                    initial_state: vec![],
                    name: Some("chained".into()),
                    topic: None,
                    alias: None,
                    invite: vec![],
                    is_direct: false,
                    publish: false,
                },
            )
            .await
            .unwrap();
            membership::change(
                &state,
                &room_id,
                &bob,
                Change { target: bob.clone(), membership: "join", reason: None },
            )
            .await
            .unwrap();
            let sent = crate::room::timeline::append(
                &state,
                &room_id,
                &Draft {
                    kind: "m.room.message".into(),
                    state_key: None,
                    content: canonical_content(json!({ "msgtype": "m.text", "body": "hi" })).unwrap(),
                    sender: bob.clone(),
                    redacts: None,
                },
                None,
            )
            .await
            .unwrap();
            let message = sent.pdu.event_id.to_string();

            // The oracle: walk auth_events in the stored PDUs themselves.
            let room_events =
                events::range(&state.db, room_id.as_str(), 0, i64::MAX, false, 1_000).await.unwrap();
            let by_id: HashMap<String, Value> = room_events
                .iter()
                .map(|e| (e.event_id.clone(), serde_json::from_str(&e.json).unwrap()))
                .collect();
            let stored: HashMap<&str, &str> =
                room_events.iter().map(|e| (e.event_id.as_str(), e.json.as_str())).collect();
            let mut walk: BTreeSet<String> = BTreeSet::new();
            let mut todo = vec![message.clone()];
            while let Some(id) = todo.pop() {
                for a in by_id[&id]["auth_events"].as_array().unwrap() {
                    let a = a.as_str().unwrap().to_owned();
                    if walk.insert(a.clone()) {
                        todo.push(a);
                    }
                }
            }
            let chain: BTreeSet<String> = dag::auth_chain(&state.db, &[message.as_str()])
                .await
                .unwrap()
                .into_iter()
                .map(|h| {
                    assert_eq!(h.json, stored[h.event_id.as_str()], "{label}: the PDU as stored");
                    h.event_id
                })
                .collect();
            assert_eq!(chain, walk, "{label} {version}: auth chain of the message");

            let current = |kind: &str, key: &str| {
                let state = state.clone();
                let room_id = room_id.clone();
                let (kind, key) = (kind.to_owned(), key.to_owned());
                async move {
                    events::state_event(&state.db, room_id.as_str(), &kind, &key)
                        .await
                        .unwrap()
                        .unwrap()
                        .event_id
                }
            };
            let create = current("m.room.create", "").await;
            let power = current("m.room.power_levels", "").await;
            let rules = current("m.room.join_rules", "").await;
            let bob_join = current("m.room.member", bob.as_str()).await;
            let alice_join = current("m.room.member", alice.as_str()).await;
            // v12 leaves the create event out of auth_events.
            let v12 = version == RoomVersionId::V12;
            assert_eq!(chain.contains(&create), !v12, "{label} {version}: create event");
            for (what, id) in [
                ("power levels", &power),
                ("join rules", &rules),
                ("bob's join", &bob_join),
                ("alice's join", &alice_join),
            ] {
                assert!(chain.contains(id), "{label} {version}: {what} in the chain");
            }
            // The message's own auth events: create (before v12), power
            // levels, bob's join; the join's: its join rules, and what
            // those were authorised by.
            let expected_len = if v12 { 4 } else { 5 };
            assert_eq!(chain.len(), expected_len, "{label} {version}: {chain:?}");

            // The write path wrote a state_runs row per state event and
            // every prev edge.
            let state_events =
                room_events.iter().filter(|e| by_id[&e.event_id].get("state_key").is_some()).count();
            let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM state_runs WHERE room_id = $1")
                .bind(room_id.as_str())
                .fetch_one(&state.db.pool)
                .await
                .unwrap();
            assert_eq!(runs, state_events as i64, "{label} {version}");
            for e in &room_events {
                let want: Vec<String> = by_id[&e.event_id]["prev_events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(dag::prev_events_of(&e.json).unwrap(), want, "{label} {version}: {}", e.event_id);
            }
            // Nothing is missing below the create event.
            let bottom = crate::storage::backfill::bottom(&state.db, room_id.as_str()).await.unwrap();
            assert_eq!(bottom, Some((crate::room::position::first(), Vec::new())), "{label} {version}");
        }
        state.db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
        fresh.finish().await;
    }
}

/// Timings of the state readers before (`events`, schema 16) and after
/// (`state_runs`, schema 17) on two copies of one large room, the old and
/// the new query taking turns: `cargo test -p seqline --lib
/// state_reader_timings -- --ignored --nocapture` (a measurement, not a
/// test; sizes from `SEQLINE_TIMING_*`, plans with `SEQLINE_PLANS=1`).
#[tokio::test]
#[ignore = "a measurement: run by hand"]
async fn state_reader_timings() {
    let param =
        |name: &str, default: i64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    // Members join one by one, each followed by _MESSAGES messages; every
    // tenth member is followed by _RENAMES display-name changes of earlier
    // members.
    let members = param("SEQLINE_TIMING_MEMBERS", 2_000);
    let messages_per_member = param("SEQLINE_TIMING_MESSAGES", 25);
    let renames = param("SEQLINE_TIMING_RENAMES", 1);
    let rounds = param("SEQLINE_TIMING_ROUNDS", 15);
    let room = "!big:x";
    let mut rows: Vec<(i64, String, String, Option<String>, String)> = Vec::new();
    let mut seq = 0;
    let mut push = |kind: &str, key: Option<String>, content: Value| {
        seq += 1;
        let id = format!("$big{seq}");
        let mut pdu = json!({ "type": kind, "content": content, "prev_events": [format!("$big{}", seq - 1)], "auth_events": ["$big1"] });
        if let Some(k) = &key {
            pdu["state_key"] = json!(k);
        }
        rows.push((seq, id, kind.to_owned(), key, pdu.to_string()));
    };
    push("m.room.create", Some(String::new()), json!({}));
    push("m.room.power_levels", Some(String::new()), json!({}));
    push("m.room.history_visibility", Some(String::new()), json!({ "history_visibility": "shared" }));
    for m in 0..members {
        push("m.room.member", Some(format!("@u{m}:x")), json!({ "membership": "join" }));
        for i in 0..messages_per_member {
            push("m.room.message", None, json!({ "body": format!("{m} {i}") }));
        }
        if m % 10 == 9 {
            for r in 0..renames {
                let who = format!("@u{}:x", (m - 5 + r * 7) % (m + 1));
                push(
                    "m.room.member",
                    Some(who),
                    json!({ "membership": "join", "displayname": format!("n{r}") }),
                );
            }
        }
    }
    let last = seq;
    let state_events = rows.iter().filter(|r| r.3.is_some()).count();

    async fn fill(db: &Db, room: &str, rows: &[(i64, String, String, Option<String>, String)]) {
        let mut tx = db.begin_write().await.unwrap();
        rooms::insert(tx.conn(), room, "10", "@u0:x", 1).await.unwrap();
        for chunk in rows.chunks(100) {
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
            for (seq, id, kind, key, json) in chunk {
                q = q
                    .bind(*seq)
                    .bind(*seq)
                    .bind(id.as_str())
                    .bind(kind.as_str())
                    .bind(key.as_deref())
                    .bind(json.as_str());
            }
            q.execute(tx.conn()).await.unwrap();
        }
        for (seq, id, kind, key, _) in rows {
            if let Some(k) = key {
                events::set_current(tx.conn(), room, kind, k, id, Some("join"), *seq).await.unwrap();
            }
        }
        tx.commit().await.unwrap();
    }

    let old_copies = backends().await;
    let new_copies = backends().await;
    for (old_fresh, new_fresh) in old_copies.into_iter().zip(new_copies) {
        let label = old_fresh.label;
        let old = Db::connect_migrated_to(&old_fresh.url, SqliteSynchronous::Normal, 16).await.unwrap();
        fill(&old, room, &rows).await;
        sqlx::query("ANALYZE").execute(&old.pool).await.unwrap();
        let before = Db::connect_migrated_to(&new_fresh.url, SqliteSynchronous::Normal, 16).await.unwrap();
        fill(&before, room, &rows).await;
        before.close().await;
        let start = std::time::Instant::now();
        // Up to 0019: the answers compared are those of the dense line.
        let db = Db::connect_migrated_to(&new_fresh.url, SqliteSynchronous::Normal, 19).await.unwrap();
        let migration = start.elapsed();
        sqlx::query("ANALYZE").execute(&db.pool).await.unwrap();
        eprintln!(
            "{label}: {last} events, {members} members, {state_events} state events; migration 0017 took {migration:.2?}"
        );
        eprintln!(
            "{label:9} {:44} {:>22} {:>22}",
            "min / median per call", "old (events)", "new (state_runs)"
        );

        let mid = last / 2;
        let (old, db) = (&old, &db);
        let no_members = "AND s.event_type <> 'm.room.member'";
        type Job<'a> = Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + 'a>> + 'a>;
        let cases: Vec<(&str, Job<'_>, Job<'_>)> = vec![
            (
                "state_at(mid)",
                Box::new(move || Box::pin(async move { old_state_at(old, room, mid, "").await.len() })),
                Box::new(move || {
                    Box::pin(async move { events::state_at(db, room, mid).await.unwrap().len() })
                }),
            ),
            (
                "state_at(last)",
                Box::new(move || Box::pin(async move { old_state_at(old, room, last, "").await.len() })),
                Box::new(move || {
                    Box::pin(async move { events::state_at(db, room, last).await.unwrap().len() })
                }),
            ),
            (
                "state_at_without_members(mid)",
                Box::new(move || {
                    Box::pin(async move { old_state_at(old, room, mid, no_members).await.len() })
                }),
                Box::new(move || {
                    Box::pin(
                        async move { events::state_at_without_members(db, room, mid).await.unwrap().len() },
                    )
                }),
            ),
            (
                "state_event_at(member, mid) x100",
                Box::new(move || {
                    Box::pin(async move {
                        let mut n = 0;
                        for m in 0..100 {
                            n += old_state_event_at(old, room, "m.room.member", &format!("@u{m}:x"), mid)
                                .await
                                .len();
                        }
                        n
                    })
                }),
                Box::new(move || {
                    Box::pin(async move {
                        let mut n = 0;
                        for m in 0..100 {
                            let user = format!("@u{m}:x");
                            let e = events::state_event_at(db, room, "m.room.member", &user, mid).await;
                            n += e.unwrap().into_iter().count();
                        }
                        n
                    })
                }),
            ),
            (
                "state_changed_between(last-300, last)",
                Box::new(move || {
                    Box::pin(async move { old_changed_between(old, room, last - 300, last).await.len() })
                }),
                Box::new(move || {
                    Box::pin(async move {
                        events::state_changed_between(db, room, last - 300, last).await.unwrap().len()
                    })
                }),
            ),
            (
                "state_changed_between(mid, last)",
                Box::new(move || {
                    Box::pin(async move { old_changed_between(old, room, mid, last).await.len() })
                }),
                Box::new(move || {
                    Box::pin(async move {
                        events::state_changed_between(db, room, mid, last).await.unwrap().len()
                    })
                }),
            ),
        ];
        for (what, old_job, new_job) in &cases {
            let (n_old, n_new) = (old_job().await, new_job().await);
            assert_eq!(n_old, n_new, "{label} {what}: both answer the same number of events");
            let (mut t_old, mut t_new) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let t = std::time::Instant::now();
                old_job().await;
                t_old.push(t.elapsed());
                let t = std::time::Instant::now();
                new_job().await;
                t_new.push(t.elapsed());
            }
            t_old.sort();
            t_new.sort();
            let show = |t: &[std::time::Duration]| format!("{:.2?} / {:.2?}", t[0], t[t.len() / 2]);
            eprintln!("{label:9} {what:44} {:>22} {:>22}  ({n_new} rows)", show(&t_old), show(&t_new));
        }
        let t = std::time::Instant::now();
        let chain = dag::auth_chain_ids(db, &[format!("$big{last}").as_str()]).await.unwrap();
        eprintln!(
            "{label:9} {:44} {:>22} {:>22.2?}  ({} rows)",
            "auth_chain_ids(last)",
            "",
            t.elapsed(),
            chain.len()
        );
        if std::env::var("SEQLINE_PLANS").is_ok() {
            for (what, sql) in plan_queries(room, mid) {
                let explain = if label == "sqlite" { "EXPLAIN QUERY PLAN" } else { "EXPLAIN" };
                let q = sqlx::query(sqlx::AssertSqlSafe(format!("{explain} {sql}")));
                eprintln!("--- {label} {what}");
                for row in q.fetch_all(&mut db.reader()).await.unwrap() {
                    use sqlx::Row;
                    let line: String = if label == "sqlite" { row.get(3) } else { row.get(0) };
                    eprintln!("    {line}");
                }
            }
        }
        old.close().await;
        db.close().await;
        if std::env::var("SEQLINE_TIMING_KEEP").is_ok() {
            eprintln!("kept: {} {}", old_fresh.url, new_fresh.url);
            continue;
        }
        old_fresh.finish().await;
        new_fresh.finish().await;
    }
}

/// The readers' SQL with its parameters written in, for `SEQLINE_PLANS=1`
/// in [`state_reader_timings`].
fn plan_queries(room: &str, mid: i64) -> Vec<(&'static str, String)> {
    let fill = |sql: String, values: &[String]| {
        values.iter().enumerate().rev().fold(sql, |sql, (i, v)| sql.replace(&format!("${}", i + 1), v))
    };
    let room = format!("'{room}'");
    vec![
        ("state_at", fill(events::sql::state_at(""), &[room.clone(), mid.to_string()])),
        (
            "state_event_at",
            fill(
                events::sql::state_event_at(),
                &[room.clone(), "'m.room.member'".into(), "'@u1:x'".into(), mid.to_string()],
            ),
        ),
        (
            "state_changed_between",
            fill(events::sql::state_changed_between(), &[room, (mid - 300).to_string(), mid.to_string()]),
        ),
    ]
}

/// The outgoing queue read in one statement: the first rows of each table
/// under the id of those rows; once an attempt failed (rows marked as
/// begun), exactly those again, nothing added; then what came after.
#[tokio::test]
async fn the_queue_gives_a_begun_transaction_again_as_it_was() {
    use super::federation::{enqueue, enqueue_edu, next_transaction, rows_begun, transaction_sent};
    for fresh in backends().await {
        let db = fresh.connect().await;
        let to = vec!["b.example".to_owned()];
        let mut tx = db.begin_write().await.unwrap();
        for event in ["$1", "$2", "$3"] {
            enqueue(tx.conn(), &to, "!r:a", event).await.unwrap();
        }
        tx.commit().await.unwrap();
        enqueue_edu(&db, &to, "k1", "{\"edu\":1}").await.unwrap();
        assert_eq!(next_transaction(&db, "c.example", 2, 5).await.unwrap(), None, "{}", fresh.label);

        let first = next_transaction(&db, "b.example", 2, 5).await.unwrap().unwrap();
        let events =
            |o: &super::federation::Outgoing| o.pdus.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>();
        assert_eq!(
            (events(&first), first.edus.clone(), first.retry),
            (vec!["$1".into(), "$2".into()], vec!["{\"edu\":1}".into()], false)
        );
        let rows = first.rows.clone().unwrap();
        assert_eq!(
            next_transaction(&db, "b.example", 2, 5).await.unwrap(),
            Some(first.clone()),
            "read, not taken"
        );

        // The attempt failed; more is queued meanwhile: the retry carries what it carried.
        rows_begun(&db, "b.example", &first.txn_id, &rows).await.unwrap();
        enqueue_edu(&db, &to, "k2", "{\"edu\":2}").await.unwrap();
        let again = next_transaction(&db, "b.example", 2, 5).await.unwrap().unwrap();
        assert_eq!(
            (again.txn_id.clone(), events(&again), again.edus.clone(), again.retry),
            (first.txn_id.clone(), events(&first), first.edus.clone(), true),
            "{}",
            fresh.label
        );

        transaction_sent(&db, "b.example", &first.txn_id).await.unwrap();
        let next = next_transaction(&db, "b.example", 2, 5).await.unwrap().unwrap();
        assert_eq!(
            (events(&next), next.edus.clone(), next.retry),
            (vec!["$3".into()], vec!["{\"edu\":2}".into()], false)
        );
        assert_ne!(next.txn_id, first.txn_id);
        db.close().await;
        fresh.finish().await;
    }
}

/// A transaction's answer is remembered, and those older than a day are
/// forgotten at the first save of a later hour.
#[tokio::test]
async fn inbound_transactions_are_remembered_for_a_day() {
    use super::federation::{inbound_txn, save_inbound_txn};
    for fresh in backends().await {
        let db = fresh.connect().await;
        let day = 24 * 3600 * 1000;
        let t0 = 4_000_000_000_000_i64;
        save_inbound_txn(&db, "a.example", "old", "{\"$e\":null}", t0).await.unwrap();
        save_inbound_txn(&db, "a.example", "later", "{}", t0 + 60_000).await.unwrap();
        assert_eq!(inbound_txn(&db, "a.example", "old").await.unwrap().as_deref(), Some("{\"$e\":null}"));
        assert_eq!(inbound_txn(&db, "b.example", "old").await.unwrap(), None, "{}", fresh.label);
        // A day and an hour on: the first save of that hour forgets both.
        save_inbound_txn(&db, "a.example", "new", "{}", t0 + day + 3_600_000).await.unwrap();
        assert_eq!(inbound_txn(&db, "a.example", "old").await.unwrap(), None, "{}", fresh.label);
        assert_eq!(inbound_txn(&db, "a.example", "later").await.unwrap(), None, "{}", fresh.label);
        assert_eq!(inbound_txn(&db, "a.example", "new").await.unwrap().as_deref(), Some("{}"));
    }
}
