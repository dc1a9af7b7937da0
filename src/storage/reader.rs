//! Reads on one held connection: [`Db::pinned`] checks a connection out
//! for a burst of reads (a `/sync` pass), and [`Db::reader`] runs each
//! statement of that task on it, or outside such a burst on a direct SQLite
//! reader ([`super::direct`]) or the pool.
//!
//! Why: sqlx checks a connection out of the pool for every statement run
//! on the pool, and on its return pings it: on SQLite a second round trip
//! to the connection's worker thread, on PostgreSQL a second network round
//! trip. A pass of a dozen statements paid a dozen checkouts and pings,
//! and visited several worker threads in turn. Held, it pays one of each.

use std::future::Future;
use std::pin::Pin as StdPin;
use std::sync::Arc;

use futures_core::stream::BoxStream;
use sqlx::any::{AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Either, Execute, Executor, SqlStr};
use tokio::sync::{OwnedMappedMutexGuard, OwnedMutexGuard, OwnedSemaphorePermit};

use super::Db;
use super::direct::{DirectConn, Ready};
use crate::error::Result;

/// Connections of the pool that pinned bursts leave to everyone else, so
/// that a statement run on the pool inside a burst (or by a writer) always
/// finds one: a burst never waits on another burst.
const LEFT_TO_THE_POOL: usize = 2;

/// The connection a burst holds: a pooled one, or on SQLite a direct one
/// (see [`super::direct`]).
#[derive(Debug)]
pub enum Held {
    /// Checked out of the pool.
    Pooled(PoolConnection<Any>),
    /// A direct SQLite reader.
    Direct(DirectConn),
}

/// The connection a task holds for its reads, and the permit it holds it by.
struct Pin {
    conn: Arc<tokio::sync::Mutex<Held>>,
    permit: OwnedSemaphorePermit,
}

impl Pin {
    /// Whether it came from `db` (a task may read from two databases, in
    /// tests): the permit is of that database's semaphore.
    fn of(&self, db: &Db) -> bool {
        Arc::ptr_eq(self.permit.semaphore(), &db.pins)
    }
}

tokio::task_local! {
    static PINNED: Pin;
}

/// The permits for pinned bursts of a pool of `max_connections`.
pub(super) fn pins_for(max_connections: u32) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new((max_connections as usize).saturating_sub(LEFT_TO_THE_POOL)))
}

impl Db {
    /// Runs `f` with one connection held for the reads it makes through
    /// [`Db::reader`]: one checkout and one release for the whole burst.
    /// Runs `f` as usual when most connections are held so already, or
    /// when this task holds one of this database already.
    /// Hold a connection only for reads run back to back, never across a
    /// wait for something else (a long-poll waits outside it).
    pub async fn pinned<F: Future>(&self, f: F) -> Result<F::Output> {
        if PINNED.try_with(|p| p.of(self)).unwrap_or(false) {
            return Ok(f.await);
        }
        let Ok(permit) = self.pins.clone().try_acquire_owned() else {
            return Ok(f.await);
        };
        let held = match &self.direct {
            Some(readers) => Held::Direct(readers.get()?),
            None => Held::Pooled(self.pool.acquire().await?),
        };
        let pin = Pin { conn: Arc::new(tokio::sync::Mutex::new(held)), permit };
        Ok(PINNED.scope(pin, f).await)
    }

    /// The connection this task holds (see [`Db::pinned`]) when it is free.
    fn held(&self) -> Option<OwnedMutexGuard<Held>> {
        PINNED
            .try_with(|p| if p.of(self) { p.conn.clone().try_lock_owned().ok() } else { None })
            .ok()
            .flatten()
    }

    /// Where to run a read: the connection this task holds (see
    /// [`Db::pinned`]) when it is free, else a direct SQLite reader, else
    /// the pool. Pass it as `&mut db.reader()` where sqlx wants an executor.
    pub fn reader(&self) -> Reader<'_> {
        let on = match self.held() {
            Some(guard) => On::Held(guard),
            None => match self.direct.as_ref().map(|readers| readers.get()) {
                Some(Ok(conn)) => On::Direct(conn),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "no direct SQLite reader; reading on the pool");
                    On::Pool
                }
                None => On::Pool,
            },
        };
        Reader { pool: &self.pool, on }
    }

    /// A connection for reads that take one (`&mut AnyConnection`): the
    /// pooled one this task holds (see [`Db::pinned`]) when it is free,
    /// else one checked out of the pool.
    pub async fn read_conn(&self) -> Result<ReadConn> {
        let held = self.held().and_then(|guard| {
            OwnedMutexGuard::try_map(guard, |held| match held {
                Held::Pooled(conn) => Some(conn),
                Held::Direct(_) => None,
            })
            .ok()
        });
        Ok(match held {
            Some(guard) => ReadConn::Held(guard),
            None => ReadConn::Pooled(self.pool.acquire().await?),
        })
    }
}

/// A connection for reads: see [`Db::read_conn`].
#[derive(Debug)]
pub enum ReadConn {
    /// Checked out for this read.
    Pooled(PoolConnection<Any>),
    /// The connection the task holds.
    Held(OwnedMappedMutexGuard<Held, PoolConnection<Any>>),
}

impl ReadConn {
    /// The connection to run statements on.
    pub fn conn(&mut self) -> &mut AnyConnection {
        match self {
            ReadConn::Pooled(conn) => conn,
            ReadConn::Held(guard) => guard,
        }
    }
}

/// A read's executor: see [`Db::reader`].
#[derive(Debug)]
pub struct Reader<'a> {
    /// The pool, also for what a direct reader does not run.
    pool: &'a AnyPool,
    on: On,
}

/// Where a [`Reader`] runs its statement.
#[derive(Debug)]
enum On {
    /// A connection checked out of the pool for this statement alone.
    Pool,
    /// The connection the task holds.
    Held(OwnedMutexGuard<Held>),
    /// A direct SQLite reader checked out for this statement alone.
    Direct(DirectConn),
}

impl Reader<'_> {
    /// The direct reader this runs on, if it does.
    fn direct(&mut self) -> Option<&mut DirectConn> {
        match &mut self.on {
            On::Direct(conn) => Some(conn),
            On::Held(guard) => match &mut **guard {
                Held::Direct(conn) => Some(conn),
                Held::Pooled(_) => None,
            },
            On::Pool => None,
        }
    }

    /// The pooled connection the task holds, if this runs on it.
    fn held_pooled(&mut self) -> Option<&mut AnyConnection> {
        match &mut self.on {
            On::Held(guard) => match &mut **guard {
                Held::Pooled(conn) => Some(conn),
                Held::Direct(_) => None,
            },
            _ => None,
        }
    }
}

type BoxFuture<'e, T> = StdPin<Box<dyn Future<Output = T> + Send + 'e>>;

/// A direct read of `query` (at most `limit` rows), or the query back with
/// its parts when it must run on the pool (several statements).
fn run_direct<'q, E: Execute<'q, Any>>(
    conn: &mut DirectConn,
    mut query: E,
    limit: Option<usize>,
) -> std::result::Result<
    std::result::Result<super::direct::Items, sqlx::Error>,
    (SqlStr, Option<sqlx::any::AnyArguments>),
> {
    let args = match query.take_arguments() {
        Ok(args) => args,
        Err(e) => return Ok(Err(sqlx::Error::Encode(e))),
    };
    let sql = query.sql();
    match conn.run(sql.as_str(), args.as_ref(), limit) {
        Ok(Some(items)) => Ok(Ok(items)),
        Ok(None) => Err((sql, args)),
        Err(e) => Ok(Err(e)),
    }
}

impl<'c> Executor<'c> for &'c mut Reader<'_> {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, std::result::Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        let pool = self.pool;
        if let Some(conn) = self.direct() {
            return match run_direct(conn, query, None) {
                Ok(result) => Box::pin(Ready::of(result)),
                Err((sql, args)) => pool.fetch_many(sqlx::query_with(sql, args.unwrap_or_default())),
            };
        }
        match self.held_pooled() {
            Some(conn) => conn.fetch_many(query),
            None => pool.fetch_many(query),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<AnyRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        let pool = self.pool;
        if let Some(conn) = self.direct() {
            return match run_direct(conn, query, Some(1)) {
                Ok(result) => {
                    let row = result.map(|items| items.into_iter().find_map(|item| item.right()));
                    Box::pin(std::future::ready(row))
                }
                Err((sql, args)) => pool.fetch_optional(sqlx::query_with(sql, args.unwrap_or_default())),
            };
        }
        match self.held_pooled() {
            Some(conn) => conn.fetch_optional(query),
            None => pool.fetch_optional(query),
        }
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [AnyTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<AnyStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        let pool = self.pool;
        match self.held_pooled() {
            Some(conn) => conn.prepare_with(sql, parameters),
            None => pool.prepare_with(sql, parameters),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn fresh(name: &str) -> (Db, std::path::PathBuf) {
        crate::storage::tests::scratch_db(&format!("reader-{name}")).await
    }

    async fn cache_size(db: &Db) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query_scalar("PRAGMA cache_size").fetch_one(&mut db.reader()).await
    }

    async fn one(db: &Db) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT 1").fetch_one(&mut db.reader()).await
    }

    /// Inside a burst every read runs on the held connection: a setting
    /// (one connection's own) made by the first is seen by the rest.
    /// Outside, reads check a direct reader out each.
    #[tokio::test]
    async fn a_burst_reads_on_one_connection() {
        let (db, dir) = fresh("one").await;
        db.pinned(async {
            sqlx::query("PRAGMA cache_size = -4321").execute(&mut db.reader()).await.unwrap();
            for _ in 0..20 {
                assert_eq!(cache_size(&db).await.unwrap(), -4321);
            }
            // A read while the held connection is busy runs on another
            // (which has its own setting) instead of waiting for it.
            let busy = db.reader();
            assert!(matches!(busy.on, On::Held(_)));
            assert_ne!(cache_size(&db).await.unwrap(), -4321);
            drop(busy);
            assert_eq!(cache_size(&db).await.unwrap(), -4321);
        })
        .await
        .unwrap();
        assert!(db.held().is_none());
        assert!(matches!(db.reader().on, On::Direct(_)));
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A direct read gives what the pool gives for the same statement:
    /// every kind of value (also NULL and non-ASCII text), parameters
    /// named out of order and repeated, a row limit, and no row.
    #[tokio::test]
    async fn a_direct_read_gives_the_pools_rows() {
        let (db, dir) = fresh("same").await;
        sqlx::query("CREATE TABLE kinds (i INTEGER, r REAL, t TEXT, b BLOB, n TEXT)")
            .execute(&db.pool)
            .await
            .unwrap();
        for (i, t) in [(1_i64, "één"), (2, "two"), (i64::MAX, "")] {
            sqlx::query("INSERT INTO kinds (i, r, t, b, n) VALUES ($1, $2, $3, $4, NULL)")
                .bind(i)
                .bind(i as f64 / 4.0)
                .bind(t)
                .bind(vec![0_u8, 255, i as u8])
                .execute(&db.pool)
                .await
                .unwrap();
        }
        type Kinds = (i64, f64, String, Vec<u8>, Option<String>);
        let sql = "SELECT i, r, t, b, n FROM kinds WHERE i >= $2 AND t <> $1 AND i <> $2 + 100 ORDER BY i";
        let on_pool: Vec<Kinds> =
            sqlx::query_as(sql).bind("two").bind(1_i64).fetch_all(&db.pool).await.unwrap();
        let mut reader = db.reader();
        assert!(matches!(reader.on, On::Direct(_)));
        let direct: Vec<Kinds> =
            sqlx::query_as(sql).bind("two").bind(1_i64).fetch_all(&mut reader).await.unwrap();
        assert_eq!(direct, on_pool);
        assert_eq!(direct.iter().map(|k| k.0).collect::<Vec<_>>(), vec![1, i64::MAX]);
        assert_eq!(direct[0].2, "één");
        let first: Option<Kinds> =
            sqlx::query_as(sql).bind("none").bind(0_i64).fetch_optional(&mut db.reader()).await.unwrap();
        assert_eq!(first.map(|k| k.0), Some(1));
        let none: Option<i64> = sqlx::query_scalar("SELECT i FROM kinds WHERE i = $1")
            .bind(7_i64)
            .fetch_optional(&mut db.reader())
            .await
            .unwrap();
        assert_eq!(none, None);
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A statement of many parameters (their arguments kept per connection
    /// after the first run) binds as on the pool, each run its own values:
    /// parameters named from the last to the first, one named twice.
    #[tokio::test]
    async fn many_parameters_bind_as_on_the_pool() {
        let (db, dir) = fresh("many").await;
        let n = 40;
        let named: Vec<String> = (1..=n).rev().map(|i| format!("${i}")).collect();
        let sql = format!("SELECT {}, $7 || '!'", named.join(" || ',' || "));
        type Out = (String, String);
        for run in 0..3 {
            let values: Vec<String> = (1..=n).map(|i| format!("v{run}-{i}")).collect();
            let bound = |mut q: sqlx::query::QueryAs<'static, Any, Out, sqlx::any::AnyArguments>| {
                for v in &values {
                    q = q.bind(v.clone());
                }
                q
            };
            let on_pool: Out =
                bound(sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))).fetch_one(&db.pool).await.unwrap();
            let mut reader = db.reader();
            assert!(matches!(reader.on, On::Direct(_)));
            let direct: Out =
                bound(sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))).fetch_one(&mut reader).await.unwrap();
            assert_eq!(direct, on_pool);
            let expected: Vec<String> = values.iter().rev().cloned().collect();
            assert_eq!(direct.0, expected.join(","));
            assert_eq!(direct.1, format!("v{run}-7!"));
        }
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A direct reader sees every commit made before it reads, cannot
    /// write (the one writer does), and hands a text of several statements
    /// to the pool.
    #[tokio::test]
    async fn a_direct_reader_sees_commits_and_never_writes() {
        let (db, dir) = fresh("writes").await;
        sqlx::query("CREATE TABLE seen (v INTEGER)").execute(&db.pool).await.unwrap();
        db.pinned(async {
            for v in 1..=3_i64 {
                sqlx::query("INSERT INTO seen (v) VALUES ($1)").bind(v).execute(&db.pool).await.unwrap();
                let max: i64 =
                    sqlx::query_scalar("SELECT MAX(v) FROM seen").fetch_one(&mut db.reader()).await.unwrap();
                assert_eq!(max, v);
            }
            let write = sqlx::query("DELETE FROM seen").execute(&mut db.reader()).await;
            assert!(write.is_err(), "{write:?}");
        })
        .await
        .unwrap();
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen").fetch_one(&db.pool).await.unwrap();
        assert_eq!(count, 3);
        let both: Vec<i64> =
            sqlx::query_scalar("SELECT 1; SELECT 2").fetch_all(&mut db.reader()).await.unwrap();
        assert_eq!(both, vec![1, 2]);
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// As many bursts as the pool has connections, each making a read on
    /// the pool while it holds one: none waits for ever, since bursts leave
    /// connections to the pool (holding all eight, each would wait for a
    /// connection the others hold).
    #[tokio::test]
    async fn bursts_leave_connections_to_the_pool() {
        let (db, dir) = fresh("leave").await;
        let tasks = 8;
        let all_in = Arc::new(tokio::sync::Barrier::new(tasks));
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let (db, all_in) = (db.clone(), all_in.clone());
            handles.push(tokio::spawn(async move {
                db.pinned(async {
                    all_in.wait().await;
                    let (a, b) = tokio::join!(one(&db), one(&db));
                    a.unwrap() + b.unwrap()
                })
                .await
                .unwrap()
            }));
        }
        for handle in handles {
            let sum = tokio::time::timeout(std::time::Duration::from_secs(10), handle).await;
            assert_eq!(sum.expect("a burst waited for a connection").unwrap(), 2);
        }
        db.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
