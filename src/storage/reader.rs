//! Reads on one held connection: [`Db::pinned`] checks a connection out
//! for a burst of reads (a `/sync` pass), and [`Db::reader`] runs each
//! statement of that task on it, or on the pool outside such a burst.
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
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit};

use super::Db;
use crate::error::Result;

/// Connections of the pool that pinned bursts leave to everyone else, so
/// that a statement run on the pool inside a burst (or by a writer) always
/// finds one: a burst never waits on another burst.
const LEFT_TO_THE_POOL: usize = 2;

/// The connection a task holds for its reads, and the permit it holds it by.
struct Pin {
    conn: Arc<tokio::sync::Mutex<PoolConnection<Any>>>,
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
    /// Runs `f` with one pooled connection held for the reads it makes
    /// through [`Db::reader`]: one checkout and one release for the whole
    /// burst. Runs `f` on the pool as usual when most connections are held
    /// so already, or when this task holds one of this database already.
    /// Hold a connection only for reads run back to back, never across a
    /// wait for something else (a long-poll waits outside it).
    pub async fn pinned<F: Future>(&self, f: F) -> Result<F::Output> {
        if PINNED.try_with(|p| p.of(self)).unwrap_or(false) {
            return Ok(f.await);
        }
        let Ok(permit) = self.pins.clone().try_acquire_owned() else {
            return Ok(f.await);
        };
        let conn = self.pool.acquire().await?;
        let pin = Pin { conn: Arc::new(tokio::sync::Mutex::new(conn)), permit };
        Ok(PINNED.scope(pin, f).await)
    }

    /// Where to run a read: the connection this task holds (see
    /// [`Db::pinned`]) when it is free, else the pool. Pass it as
    /// `&mut db.reader()` where sqlx wants an executor.
    pub fn reader(&self) -> Reader<'_> {
        let held = PINNED.try_with(|p| if p.of(self) { p.conn.clone().try_lock_owned().ok() } else { None });
        held.ok().flatten().map_or(Reader::Pool(&self.pool), Reader::Held)
    }

    /// A connection for reads that take one (`&mut AnyConnection`): the one
    /// this task holds (see [`Db::pinned`]) when it is free, else one
    /// checked out of the pool.
    pub async fn read_conn(&self) -> Result<ReadConn> {
        Ok(match self.reader() {
            Reader::Held(guard) => ReadConn::Held(guard),
            Reader::Pool(pool) => ReadConn::Pooled(pool.acquire().await?),
        })
    }
}

/// A connection for reads: see [`Db::read_conn`].
#[derive(Debug)]
pub enum ReadConn {
    /// Checked out for this read.
    Pooled(PoolConnection<Any>),
    /// The connection the task holds.
    Held(OwnedMutexGuard<PoolConnection<Any>>),
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
pub enum Reader<'a> {
    /// A connection checked out for this statement alone.
    Pool(&'a AnyPool),
    /// The connection the task holds.
    Held(OwnedMutexGuard<PoolConnection<Any>>),
}

/// Calls an [`Executor`] method on whichever a [`Reader`] holds.
macro_rules! on_either {
    ($reader:expr, $method:ident($($arg:expr),*)) => {
        match $reader {
            Reader::Pool(pool) => pool.$method($($arg),*),
            Reader::Held(conn) => held(conn).$method($($arg),*),
        }
    };
}

type BoxFuture<'e, T> = StdPin<Box<dyn Future<Output = T> + Send + 'e>>;

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
        on_either!(self, fetch_many(query))
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<AnyRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        on_either!(self, fetch_optional(query))
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [AnyTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<AnyStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        on_either!(self, prepare_with(sql, parameters))
    }
}

/// The connection behind a held guard.
fn held(guard: &mut OwnedMutexGuard<PoolConnection<Any>>) -> &mut AnyConnection {
    guard
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn fresh(name: &str) -> (Db, std::path::PathBuf) {
        crate::storage::tests::scratch_db(&format!("reader-{name}")).await
    }

    async fn count(db: &Db) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM temp.marks").fetch_one(&mut db.reader()).await
    }

    async fn one(db: &Db) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT 1").fetch_one(&mut db.reader()).await
    }

    /// Inside a burst every read runs on the held connection: a temporary
    /// table (one connection's own) made by the first is seen by the rest.
    /// Outside, reads go to the pool again.
    #[tokio::test]
    async fn a_burst_reads_on_one_connection() {
        let (db, dir) = fresh("one").await;
        db.pinned(async {
            sqlx::query("CREATE TEMP TABLE marks (x INTEGER)").execute(&mut db.reader()).await.unwrap();
            sqlx::query("INSERT INTO temp.marks VALUES (1)").execute(&mut db.reader()).await.unwrap();
            for _ in 0..20 {
                assert_eq!(count(&db).await.unwrap(), 1);
            }
            // A read while the held connection is busy runs on the pool
            // (which cannot see the held connection's table) instead of
            // waiting for it.
            let busy = db.reader();
            assert!(matches!(busy, Reader::Held(_)));
            let other = count(&db).await;
            assert!(other.is_err(), "{other:?}");
            drop(busy);
            assert_eq!(count(&db).await.unwrap(), 1);
        })
        .await
        .unwrap();
        assert!(matches!(db.reader(), Reader::Pool(_)));
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
