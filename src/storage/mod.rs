//! Storage: one sqlx layer over two backends. Queries are written once with
//! `$1` placeholders and run through sqlx's `Any` driver on SQLite (the
//! embedded default: WAL synced on every commit, checkpointed by a background
//! task, foreign keys on; reads through [`Db::reader`] run on our own
//! connections, see [`direct`]) and PostgreSQL (for scale). Where the
//! SQL must differ, a migration set per backend says so (`migrations/`).
//!
//! One module per table family; storage knows tables and queries, not Matrix
//! rules.

pub mod account_data;
pub mod aliases;
pub mod backfill;
pub mod backup;
pub mod dag;
pub mod devices;
mod direct;
pub mod events;
pub mod federation;
pub mod keys;
pub mod media;
pub mod memberships;
pub mod outliers;
pub mod reader;
pub mod receipts;
pub mod relations;
pub mod remote_devices;
pub mod rooms;
pub mod search;
pub mod server_keys;
pub mod sliding;
pub mod state_runs;
pub mod tally;
pub mod uia;
pub mod users;

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AnyPool, Executor};

use crate::config::SqliteSynchronous;
use crate::error::Result;

/// Which database sits behind the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// The database handle shared by the whole server.
#[derive(Debug, Clone)]
pub struct Db {
    /// The connection pool.
    pub pool: AnyPool,
    /// Which backend `pool` talks to.
    pub backend: Backend,
    /// SQLite has one writer at a time: room writes queue here instead of
    /// spinning on SQLITE_BUSY. Unused on PostgreSQL, which locks the room row.
    sqlite_writer: Arc<tokio::sync::Mutex<()>>,
    /// Permits for connections held through a burst of reads ([`Db::pinned`]).
    pins: Arc<tokio::sync::Semaphore>,
    /// SQLite in a file: reads of [`Db::reader`] run on these, on the
    /// calling thread ([`direct`]).
    direct: Option<Arc<direct::Readers>>,
    /// SQLite: the task that checkpoints the WAL, stopped with the last handle.
    _checkpointer: Option<Arc<AbortOnDrop>>,
    /// The hour (since the epoch) in which old inbound transaction answers
    /// were last forgotten ([`federation::save_inbound_txn`]).
    inbound_pruned_hour: Arc<std::sync::atomic::AtomicI64>,
}

/// Stops a spawned task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often SQLite's WAL is copied back into the database file. Commits
/// never do it themselves (`wal_autocheckpoint = 0`): a checkpoint writes
/// and syncs the database file, milliseconds that would otherwise land on
/// whichever request's commit crossed the threshold.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Checkpoints the WAL every [`CHECKPOINT_EVERY`] on a pooled connection.
/// The bulk is copied alongside writers (PASSIVE takes no write lock and
/// waits for no reader); then, holding the writer slot for the moment it
/// takes, what they appended meanwhile, so that the checkpoint is complete
/// and the next commit starts the WAL over instead of letting it grow for
/// as long as writes keep coming.
fn spawn_checkpointer(pool: AnyPool, writer: Arc<tokio::sync::Mutex<()>>) -> AbortOnDrop {
    async fn checkpoint(pool: &AnyPool) -> std::result::Result<(i64, i64), sqlx::Error> {
        let (_busy, log, done): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(pool).await?;
        Ok((log, done))
    }
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_log = 0;
        loop {
            tick.tick().await;
            if pool.is_closed() {
                return;
            }
            let result = async {
                let (log, done) = checkpoint(&pool).await?;
                if log == done && log == last_log {
                    // Nothing written since the last complete checkpoint.
                    return Ok(log);
                }
                let _slot = writer.lock().await;
                Ok::<_, sqlx::Error>(checkpoint(&pool).await?.0)
            }
            .await;
            match result {
                Ok(log) => last_log = log,
                Err(_) if pool.is_closed() => return,
                Err(e) => tracing::warn!("SQLite WAL checkpoint failed: {e}"),
            }
        }
    });
    AbortOnDrop(task.abort_handle())
}

/// A write transaction on one room: holds the room's lock (the SQLite writer
/// slot, or the PostgreSQL row lock) until commit or drop.
pub struct RoomTx {
    /// The transaction.
    pub tx: sqlx::Transaction<'static, sqlx::Any>,
    _writer: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl RoomTx {
    /// The connection to run statements on.
    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }

    /// Commits.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }
}

/// A migration set: (version, description, SQL).
type MigrationSet = &'static [(i64, &'static str, &'static str)];

const SQLITE_MIGRATIONS: MigrationSet = &[
    (1, "accounts", include_str!("../../migrations/sqlite/0001_accounts.sql")),
    (2, "rooms", include_str!("../../migrations/sqlite/0002_rooms.sql")),
    (3, "memberships", include_str!("../../migrations/sqlite/0003_memberships.sql")),
    (4, "sync", include_str!("../../migrations/sqlite/0004_sync.sql")),
    (5, "profiles", include_str!("../../migrations/sqlite/0005_profiles.sql")),
    (6, "pushers", include_str!("../../migrations/sqlite/0006_pushers.sql")),
    (7, "e2ee", include_str!("../../migrations/sqlite/0007_e2ee.sql")),
    (8, "media", include_str!("../../migrations/sqlite/0008_media.sql")),
    (9, "key_backup", include_str!("../../migrations/sqlite/0009_key_backup.sql")),
    (10, "read_epoch", include_str!("../../migrations/sqlite/0010_read_epoch.sql")),
    (11, "state_changes", include_str!("../../migrations/sqlite/0011_state_changes.sql")),
    (12, "key_signatures", include_str!("../../migrations/sqlite/0012_key_signatures.sql")),
    (13, "media_pending", include_str!("../../migrations/sqlite/0013_media_pending.sql")),
    (14, "pusher_device", include_str!("../../migrations/sqlite/0014_pusher_device.sql")),
    (15, "room_summaries", include_str!("../../migrations/sqlite/0015_room_summaries.sql")),
    (16, "server_keys", include_str!("../../migrations/sqlite/0016_server_keys.sql")),
    (17, "state_runs", include_str!("../../migrations/sqlite/0017_state_runs.sql")),
    (18, "federation_rooms", include_str!("../../migrations/sqlite/0018_federation_rooms.sql")),
    (19, "remote_invites", include_str!("../../migrations/sqlite/0019_remote_invites.sql")),
    (20, "sparse_positions", include_str!("../../migrations/sqlite/0020_sparse_positions.sql")),
    (22, "event_relations", include_str!("../../migrations/sqlite/0022_event_relations.sql")),
    (23, "event_search", include_str!("../../migrations/sqlite/0023_event_search.sql")),
    (24, "pending_redactions", include_str!("../../migrations/sqlite/0024_pending_redactions.sql")),
    (25, "refresh_tokens", include_str!("../../migrations/sqlite/0025_refresh_tokens.sql")),
    (26, "one_time_key_order", include_str!("../../migrations/sqlite/0026_one_time_key_order.sql")),
    (27, "erased_users", include_str!("../../migrations/sqlite/0027_erased_users.sql")),
    (28, "url_previews", include_str!("../../migrations/sqlite/0028_url_previews.sql")),
    (29, "media_expiry", include_str!("../../migrations/sqlite/0029_media_expiry.sql")),
    (30, "unread_candidates", include_str!("../../migrations/sqlite/0030_unread_candidates.sql")),
    (31, "fork_states", include_str!("../../migrations/sqlite/0031_fork_states.sql")),
    (32, "remote_knocks", include_str!("../../migrations/sqlite/0032_remote_knocks.sql")),
    (33, "edges_from_pdus", include_str!("../../migrations/sqlite/0033_edges_from_pdus.sql")),
    (35, "edu_outbox", include_str!("../../migrations/sqlite/0035_edu_outbox.sql")),
    (36, "remote_device_lists", include_str!("../../migrations/sqlite/0036_remote_device_lists.sql")),
    (37, "typing_in_memory", include_str!("../../migrations/sqlite/0037_typing_in_memory.sql")),
    (38, "push_tally", include_str!("../../migrations/sqlite/0038_push_tally.sql")),
    (39, "push_threads_main", include_str!("../../migrations/sqlite/0039_push_threads_main.sql")),
];

const POSTGRES_MIGRATIONS: MigrationSet = &[
    (1, "accounts", include_str!("../../migrations/postgres/0001_accounts.sql")),
    (2, "rooms", include_str!("../../migrations/postgres/0002_rooms.sql")),
    (3, "memberships", include_str!("../../migrations/postgres/0003_memberships.sql")),
    (4, "sync", include_str!("../../migrations/postgres/0004_sync.sql")),
    (5, "profiles", include_str!("../../migrations/postgres/0005_profiles.sql")),
    (6, "pushers", include_str!("../../migrations/postgres/0006_pushers.sql")),
    (7, "e2ee", include_str!("../../migrations/postgres/0007_e2ee.sql")),
    (8, "media", include_str!("../../migrations/postgres/0008_media.sql")),
    (9, "key_backup", include_str!("../../migrations/postgres/0009_key_backup.sql")),
    (10, "read_epoch", include_str!("../../migrations/postgres/0010_read_epoch.sql")),
    (11, "state_changes", include_str!("../../migrations/postgres/0011_state_changes.sql")),
    (12, "key_signatures", include_str!("../../migrations/postgres/0012_key_signatures.sql")),
    (13, "media_pending", include_str!("../../migrations/postgres/0013_media_pending.sql")),
    (14, "pusher_device", include_str!("../../migrations/postgres/0014_pusher_device.sql")),
    (15, "room_summaries", include_str!("../../migrations/postgres/0015_room_summaries.sql")),
    (16, "server_keys", include_str!("../../migrations/postgres/0016_server_keys.sql")),
    (17, "state_runs", include_str!("../../migrations/postgres/0017_state_runs.sql")),
    (18, "federation_rooms", include_str!("../../migrations/postgres/0018_federation_rooms.sql")),
    (19, "remote_invites", include_str!("../../migrations/postgres/0019_remote_invites.sql")),
    (20, "sparse_positions", include_str!("../../migrations/postgres/0020_sparse_positions.sql")),
    (22, "event_relations", include_str!("../../migrations/postgres/0022_event_relations.sql")),
    (23, "event_search", include_str!("../../migrations/postgres/0023_event_search.sql")),
    (24, "pending_redactions", include_str!("../../migrations/postgres/0024_pending_redactions.sql")),
    (25, "refresh_tokens", include_str!("../../migrations/postgres/0025_refresh_tokens.sql")),
    (26, "one_time_key_order", include_str!("../../migrations/postgres/0026_one_time_key_order.sql")),
    (27, "erased_users", include_str!("../../migrations/postgres/0027_erased_users.sql")),
    (28, "url_previews", include_str!("../../migrations/postgres/0028_url_previews.sql")),
    (29, "media_expiry", include_str!("../../migrations/postgres/0029_media_expiry.sql")),
    (30, "unread_candidates", include_str!("../../migrations/postgres/0030_unread_candidates.sql")),
    (31, "fork_states", include_str!("../../migrations/postgres/0031_fork_states.sql")),
    (32, "remote_knocks", include_str!("../../migrations/postgres/0032_remote_knocks.sql")),
    (33, "edges_from_pdus", include_str!("../../migrations/postgres/0033_edges_from_pdus.sql")),
    (35, "edu_outbox", include_str!("../../migrations/postgres/0035_edu_outbox.sql")),
    (36, "remote_device_lists", include_str!("../../migrations/postgres/0036_remote_device_lists.sql")),
    (37, "typing_in_memory", include_str!("../../migrations/postgres/0037_typing_in_memory.sql")),
    (38, "push_tally", include_str!("../../migrations/postgres/0038_push_tally.sql")),
    (39, "push_threads_main", include_str!("../../migrations/postgres/0039_push_threads_main.sql")),
];

impl Db {
    /// Connects (creating the SQLite file if needed) and applies pending
    /// migrations.
    pub async fn connect(url: &str, synchronous: SqliteSynchronous) -> Result<Self> {
        Self::connect_migrated_to(url, synchronous, i64::MAX).await
    }

    /// [`Db::connect`], applying the migrations up to version `last` only
    /// (tests of a migration open the database at the version before it).
    pub(crate) async fn connect_migrated_to(
        url: &str,
        synchronous: SqliteSynchronous,
        last: i64,
    ) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") { Backend::Sqlite } else { Backend::Postgres };
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_owned(),
        };
        let options = AnyConnectOptions::from_str(&url)?;
        let pool_options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(30));
        let max_connections = match backend {
            Backend::Sqlite => 8,
            Backend::Postgres => 16,
        };
        let pool_options = pool_options.max_connections(max_connections);
        let pool = match backend {
            Backend::Sqlite => {
                pool_options
                    // A ping before every checkout is one more hand-off to the
                    // connection's worker thread per query; an embedded file
                    // has no connection to lose.
                    .test_before_acquire(false)
                    .after_connect(move |conn, _| {
                        Box::pin(async move {
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            // FULL (the default): every commit is on disk
                            // before it is answered.
                            let sync = format!("PRAGMA synchronous = {}", synchronous.as_pragma());
                            conn.execute(sqlx::AssertSqlSafe(sync)).await?;
                            conn.execute("PRAGMA wal_autocheckpoint = 0").await?;
                            conn.execute("PRAGMA journal_size_limit = 67108864").await?;
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                            conn.execute("PRAGMA busy_timeout = 10000").await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await?
            }
            Backend::Postgres => pool_options.connect_with(options).await?,
        };
        let sqlite_writer = Arc::new(tokio::sync::Mutex::new(()));
        let checkpointer = (backend == Backend::Sqlite)
            .then(|| Arc::new(spawn_checkpointer(pool.clone(), sqlite_writer.clone())));
        let pins = reader::pins_for(max_connections);
        let inbound_pruned_hour = Arc::new(std::sync::atomic::AtomicI64::new(-1));
        let direct = match backend {
            Backend::Sqlite => direct::Readers::for_url(&url),
            Backend::Postgres => None,
        };
        let db = Self {
            pool,
            backend,
            sqlite_writer,
            pins,
            direct,
            _checkpointer: checkpointer,
            inbound_pruned_hour,
        };
        db.migrate(last).await?;
        Ok(db)
    }

    /// Applies the pending migrations up to version `last`.
    async fn migrate(&self, last: i64) -> Result<()> {
        let set = match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
        };
        let migrations = set
            .iter()
            .filter(|(version, _, _)| *version <= last)
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    Cow::Borrowed(*description),
                    MigrationType::Simple,
                    sqlx::SqlStr::from_static(sql),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        // Opened at an older version (tests of one migration): later ones
        // applied before are no error.
        migrator.set_ignore_missing(last != i64::MAX);
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// Starts a write transaction that serialises with every other write to
    /// `room_id` (pass `None` to create a room: only the SQLite writer slot
    /// is taken, and the new room's row is the lock from then on).
    pub async fn begin_room_write(&self, room_id: Option<&str>) -> Result<RoomTx> {
        match self.backend {
            Backend::Sqlite => {
                let guard = self.sqlite_writer.clone().lock_owned().await;
                let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
                Ok(RoomTx { tx, _writer: Some(guard) })
            }
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                if let Some(room_id) = room_id {
                    sqlx::query("SELECT room_id FROM rooms WHERE room_id = $1 FOR UPDATE")
                        .bind(room_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                }
                Ok(RoomTx { tx, _writer: None })
            }
        }
    }

    /// A write transaction not tied to a room (several statements that must
    /// commit together): the SQLite writer slot with BEGIN IMMEDIATE, or a
    /// plain PostgreSQL transaction.
    pub async fn begin_write(&self) -> Result<RoomTx> {
        self.begin_room_write(None).await
    }

    /// `SELECT` of one text column `v` of `inner` as a single row: the values
    /// joined by newlines (see [`split_column`]). For queries with many rows
    /// on hot paths: on the pool, sqlx's SQLite worker hands rows over one at
    /// a time, each a thread wake-up, so one row is much cheaper than
    /// hundreds (a direct reader, [`direct`], reads them all either way).
    pub fn joined_column(&self, inner: &str) -> String {
        let aggregate = match self.backend {
            Backend::Sqlite => "group_concat(v, char(10))",
            Backend::Postgres => "string_agg(v, chr(10))",
        };
        format!("SELECT {aggregate} FROM ({inner}) AS joined")
    }

    /// Closes every connection; SQLite checkpoints its WAL on the last close.
    pub async fn close(&self) {
        if let Some(direct) = &self.direct {
            direct.close();
        }
        self.pool.close().await;
    }
}

/// `$from, $from+1, …`: `n` placeholders, for an `IN (…)` list bound after
/// `from - 1` other parameters.
pub(crate) fn params(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// `{insert} VALUES ($1, …), (…)`: a multi-row insert of `rows` rows of
/// `columns` values each.
pub(crate) fn values_sql(insert: &str, columns: usize, rows: usize) -> String {
    let tuples: Vec<String> = (0..rows).map(|r| format!("({})", params(r * columns + 1, columns))).collect();
    format!("{insert} VALUES {}", tuples.join(", "))
}

/// Milliseconds since the Unix epoch, as stored in `*_ts` columns.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The values of a [`Db::joined_column`] query (none when it had no rows).
/// Only for values that cannot hold a newline (Matrix ids).
pub fn split_column(joined: Option<String>) -> Vec<String> {
    joined.map(|j| j.split('\n').map(str::to_owned).collect()).unwrap_or_default()
}

/// True when `e` is a unique-key violation: the caller maps it to the right 4xx.
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

#[cfg(test)]
mod dag_tests;
#[cfg(test)]
mod media_tests;
#[cfg(test)]
mod search_tests;
#[cfg(test)]
pub(crate) mod sparse_tests;
#[cfg(test)]
pub(crate) mod state_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// No query binds its `LIMIT` bare (`LIMIT $2`): SQLite (3.51) reads a
    /// bound LIMIT's value into the statement's program, so every binding
    /// marks the statement to be prepared again when it runs, a parse and a
    /// plan per run (a tenth of a sync's time went there). A bound value
    /// inside an expression (`LIMIT $2 + 0`) is read when the statement runs.
    #[test]
    fn no_query_binds_a_bare_limit() {
        fn visit(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    visit(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        if line.trim_start().starts_with("//") {
                            continue;
                        }
                        for (at, _) in line.match_indices("LIMIT $") {
                            let after = &line[at + "LIMIT $".len()..];
                            let rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
                            if rest.len() < after.len() && !rest.starts_with(" + 0") {
                                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                            }
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        visit(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
        assert!(found.is_empty(), "write `LIMIT $n + 0`:\n{}", found.join("\n"));
    }

    /// The device-list and presence queries start from the user's own
    /// member rows. Left to itself, SQLite started one half of each from
    /// every member row of every room on the server (a scan that grew with
    /// the whole server on each incremental sync).
    #[tokio::test]
    async fn room_sharing_queries_start_from_the_users_rooms() {
        let (db, dir) = scratch_db("plans").await;
        for sql in [events::sql::device_list_window().as_str(), events::sql::ROOM_PEERS] {
            let query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            let plan = plan_of(&db, query.bind("@u:x").bind(1_i64).bind(2_i64)).await;
            let scans_every_member = |line: &&String| {
                // (`x` is a subquery's result, not a table.)
                (line.starts_with("SCAN") && line.as_str() != "SCAN x")
                    || line.ends_with("room_state_members (event_type=?)")
            };
            assert!(!plan.iter().any(|l| scans_every_member(&l)), "{sql}\n{plan:#?}");
        }
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fresh SQLite database in a directory of its own (`tag` names it).
    pub(in crate::storage) async fn scratch_db(tag: &str) -> (Db, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("seqline-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("seqline.db").display());
        (Db::connect(&url, SqliteSynchronous::Full).await.unwrap(), dir)
    }

    /// The detail lines of an `EXPLAIN QUERY PLAN` query's answer.
    async fn plan_of(
        db: &Db,
        query: sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> Vec<String> {
        let rows = query.fetch_all(&mut db.reader()).await.unwrap();
        rows.iter().map(|row| sqlx::Row::get::<String, _>(row, 3)).collect()
    }

    /// The readers of a first sync that must not grow with the room: the
    /// non-member state (alone and with lazy members) seeks each side of
    /// the member keys, and unread counting reads the two partial indexes,
    /// never every state key or every event of the room.
    #[tokio::test]
    async fn first_sync_readers_do_not_walk_the_members() {
        let (db, dir) = scratch_db("plans-members").await;
        let cases = [
            (events::sql::state_at_without_members(), 2, vec![]),
            (events::sql::unread_candidates(true), 5, vec!["events_not_members", "events_members_by_target"]),
        ];
        for (sql, params, must_use) in cases {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            for i in 0..params {
                query = query.bind(i64::from(i));
            }
            let plan = plan_of(&db, query).await;
            // A search on the room alone reads every row the room has.
            let walks_the_room = |line: &&String| line.ends_with("(room_id=?)") || line.starts_with("SCAN e");
            assert!(!plan.iter().any(|l| walks_the_room(&l)), "{sql}\n{plan:#?}");
            for index in must_use {
                assert!(plan.iter().any(|l| l.contains(index)), "{index} unused: {sql}\n{plan:#?}");
            }
        }
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Unread counts read index seeks and the reader's own rows: never a
    /// range of every counted event of the window (the rows naming the
    /// reader, found the other way round, walked 10,000 rows at 10,000
    /// unread).
    #[tokio::test]
    async fn unread_windows_seek_the_readers_rows() {
        let (db, dir) = scratch_db("plans-tally").await;
        let sql = tally::window_sql();
        let query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        let plan =
            plan_of(&db, query.bind("!a:x").bind(1_i64).bind(2_i64).bind("@u:x").bind(3_i64).bind(4_i64))
                .await;
        let walks = |line: &&String| {
            line.starts_with("SCAN") || line.ends_with("push_tally_1 (room_id=? AND seq>? AND seq<?)")
        };
        assert!(!plan.iter().any(|l| walks(&l)), "{sql}\n{plan:#?}");
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Sliding sync's positions of a room: each a walk down an index from
    /// the top, never every event of the room read and sorted (the bump
    /// stamp of a room with a thousand joins since its last message read a
    /// thousand rows so).
    #[tokio::test]
    async fn sliding_positions_walk_down_from_the_top() {
        let (db, dir) = scratch_db("plans-positions").await;
        let sql = sliding::positions_sql(2);
        let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        query = query.bind(9_i64).bind(5_i64);
        for kind in sliding::BUMP_TYPES {
            query = query.bind(kind);
        }
        let plan = plan_of(&db, query.bind("!a:x").bind("!b:x")).await;
        assert!(!plan.iter().any(|l| l.contains("TEMP B-TREE")), "{sql}\n{plan:#?}");
        assert!(plan.iter().any(|l| l.contains("events_not_members")), "{sql}\n{plan:#?}");
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Commits are synced (FULL) and reach the database file itself through
    /// the background checkpointer alone (commits never checkpoint).
    #[tokio::test]
    async fn sqlite_commits_are_synced_and_checkpointed_in_the_background() {
        let dir = std::env::temp_dir().join(format!("seqline-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("seqline.db");
        let db = Db::connect(&format!("sqlite://{}", path.display()), SqliteSynchronous::Full).await.unwrap();
        // The pool's connections make the commits (direct readers only read).
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&db.pool).await.unwrap();
        assert_eq!(sync, 2, "PRAGMA synchronous = FULL");
        let auto: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(&db.pool).await.unwrap();
        assert_eq!(auto, 0, "commits must not checkpoint");
        sqlx::query("CREATE TABLE probe (v TEXT)").execute(&db.pool).await.unwrap();
        sqlx::query("INSERT INTO probe (v) VALUES ('checkpointed')").execute(&db.pool).await.unwrap();
        // `immutable=1` reads the database file and ignores the WAL: the row
        // shows there only once a checkpoint has copied it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let url = format!("sqlite://{}?immutable=1&mode=ro", path.display());
            let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url).await.unwrap();
            let found: Option<String> =
                sqlx::query_scalar("SELECT v FROM probe").fetch_optional(&mut conn).await.unwrap_or(None);
            if found.as_deref() == Some("checkpointed") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the WAL was never checkpointed");
            tokio::time::sleep(CHECKPOINT_EVERY / 5).await;
        }
        db.close().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
