//! SQLite reads run on the calling thread.
//!
//! sqlx runs every SQLite statement on its connection's own worker thread:
//! the task sends the statement over a channel, the worker wakes, steps it,
//! and sends the rows back, and the task wakes in turn. On this project's
//! machines that hand-off costs 40–50 µs a statement, more than most of our
//! statements take to run (an indexed look-up is a few µs), and a `/sync`
//! pass makes a dozen of them. Reads made through [`super::Db::reader`]
//! therefore run here instead: on a connection of our own to the same file
//! (WAL: it sees every committed write, as a pooled connection would),
//! stepped right away on the thread that asks, with the statement cached
//! per connection. The rows come back as sqlx's own `AnyRow`s, the values
//! of the kinds sqlx's SQLite driver gives (integers as 64-bit, reals as
//! doubles, text, blobs, nulls), so every query and row decoder is the one
//! PostgreSQL runs too.
//!
//! These connections only read (`query_only`): writes keep to the pool and
//! the one writer. A statement that is several statements runs on the pool.
//! Statements read through here are bounded look-ups; a read that may run
//! long belongs on the pool, where it waits on its own thread.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_core::Stream;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use sqlx::Either;
use sqlx::any::{AnyArguments, AnyQueryResult, AnyRow, AnyTypeInfo, AnyTypeInfoKind, AnyValue};
use sqlx_core::any::{AnyColumn, AnyValueKind};
use sqlx_core::ext::ustr::UStr;

/// Idle connections kept for the next read; more are opened when more
/// reads run at once, and closed on their return past this many.
const IDLE: usize = 16;

/// Prepared statements kept per connection: more than the distinct reads
/// a server makes, so each is prepared once per connection.
const CACHED_STATEMENTS: usize = 512;

/// Statements with more parameters than this have their parameters'
/// arguments kept per connection: SQLite finds a parameter's name by a
/// walk of the statement's list of names, so naming each of n parameters
/// costs n² (an `IN` list of a thousand rooms: a million steps).
const FEW_PARAMETERS: usize = 16;

/// How many statements' parameter slots a connection keeps before it
/// starts over.
const KEPT_SLOTS: usize = 64;

/// What a direct read gives: each row, then the statement's result, as
/// sqlx's `fetch_many` does.
pub(super) type Items = Vec<Either<AnyQueryResult, AnyRow>>;

/// The direct connections of one database file.
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Reading>>,
}

/// A reading connection, and which argument each parameter of its many-
/// parameter statements takes (by the statement's text).
struct Reading {
    conn: Connection,
    slots: std::collections::HashMap<String, Arc<[usize]>>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Readers {
    /// Direct readers of the database at `url`, or none when it is not a
    /// file (an in-memory database is one connection's own).
    pub(super) fn for_url(url: &str) -> Option<Arc<Self>> {
        use std::str::FromStr;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
        let path = options.get_filename();
        let text = path.to_string_lossy();
        if url.contains("mode=memory")
            || url.contains(":memory:")
            || text.is_empty()
            || text.contains(":memory:")
        {
            return None;
        }
        Some(Arc::new(Self { path: path.to_path_buf(), idle: Mutex::new(Vec::new()) }))
    }

    /// A connection for one read or one burst: an idle one, or a new one.
    pub(super) fn get(self: &Arc<Self>) -> Result<DirectConn, sqlx::Error> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match idle {
            Some(conn) => conn,
            None => Reading { conn: open(&self.path).map_err(driver)?, slots: Default::default() },
        };
        Ok(DirectConn { conn: Some(conn), home: self.clone() })
    }

    /// Closes the idle connections (the database is closing).
    pub(super) fn close(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

/// Opens a reading connection to `path`.
fn open(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    // The pool's settings that matter to a reader, and no writing at all.
    conn.execute_batch("PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; PRAGMA query_only = 1;")?;
    conn.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
    Ok(conn)
}

/// A direct connection checked out; back to the idle ones when dropped.
pub struct DirectConn {
    conn: Option<Reading>,
    home: Arc<Readers>,
}

impl std::fmt::Debug for DirectConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectConn").finish_non_exhaustive()
    }
}

impl Drop for DirectConn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if let Ok(mut idle) = self.home.idle.lock()
            && idle.len() < IDLE
        {
            idle.push(conn);
        }
    }
}

impl DirectConn {
    /// Runs `sql` with `args`, stopping after `limit` rows. `None` when
    /// `sql` holds several statements (run those on the pool).
    pub(super) fn run(
        &mut self,
        sql: &str,
        args: Option<&AnyArguments>,
        limit: Option<usize>,
    ) -> Result<Option<Items>, sqlx::Error> {
        let Some(Reading { conn, slots }) = self.conn.as_mut() else {
            return Err(sqlx::Error::Protocol("a direct reader used after its return".into()));
        };
        let mut stmt = match conn.prepare_cached(sql) {
            Ok(stmt) => stmt,
            Err(rusqlite::Error::MultipleStatement) => return Ok(None),
            Err(e) => return Err(driver(e)),
        };
        let taken: Arc<[usize]> = if stmt.parameter_count() <= FEW_PARAMETERS {
            slots_of(&stmt)?.into()
        } else if let Some(kept) = slots.get(sql) {
            kept.clone()
        } else {
            let found: Arc<[usize]> = slots_of(&stmt)?.into();
            if slots.len() >= KEPT_SLOTS {
                slots.clear();
            }
            slots.insert(sql.to_owned(), found.clone());
            found
        };
        bind(&mut stmt, &taken, args)?;
        let count = stmt.column_count();
        let mut names = sqlx_core::HashMap::with_capacity(count);
        let mut columns = Vec::with_capacity(count);
        for (ordinal, name) in stmt.column_names().into_iter().enumerate() {
            let name = UStr::new(name);
            names.insert(name.clone(), ordinal);
            columns.push(AnyColumn { ordinal, name, type_info: AnyTypeInfo { kind: AnyTypeInfoKind::Null } });
        }
        let names = Arc::new(names);
        let read_only = stmt.readonly();
        let mut items = Vec::new();
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next().map_err(driver)? {
            let mut values = Vec::with_capacity(count);
            for i in 0..count {
                let value = row.get_ref(i).map_err(driver)?;
                values.push(AnyValue { kind: kind(value, i)? });
            }
            items.push(Either::Right(AnyRow {
                column_names: names.clone(),
                columns: columns.clone(),
                values,
            }));
            if limit.is_some_and(|limit| items.len() >= limit) {
                break;
            }
        }
        drop(rows);
        let rows_affected = if read_only { 0 } else { conn.changes() };
        items.push(Either::Left(AnyQueryResult { rows_affected, last_insert_id: None }));
        Ok(Some(items))
    }
}

/// Which argument (from 1) each parameter of `stmt` takes, as sqlx's
/// SQLite driver reads them: `$N` and `?N` name the Nth argument, a bare
/// `?` the next one.
fn slots_of(stmt: &rusqlite::CachedStatement<'_>) -> Result<Vec<usize>, sqlx::Error> {
    let mut next = 0;
    (1..=stmt.parameter_count())
        .map(|param| match stmt.parameter_name(param) {
            Some(name) => {
                let digits = name.strip_prefix('$').or_else(|| name.strip_prefix('?'));
                match digits.and_then(|d| d.parse::<usize>().ok()) {
                    Some(n) if n > 0 => Ok(n),
                    _ => Err(sqlx::Error::Protocol(format!("unsupported SQL parameter: {name}"))),
                }
            }
            None => {
                next += 1;
                Ok(next)
            }
        })
        .collect()
}

/// Binds `args` to the parameters by their `slots` (see [`slots_of`]), as
/// sqlx's SQLite driver does: parameters past the arguments given stay
/// NULL.
fn bind(
    stmt: &mut rusqlite::CachedStatement<'_>,
    slots: &[usize],
    args: Option<&AnyArguments>,
) -> Result<(), sqlx::Error> {
    let values: &[AnyValueKind] = args.map_or(&[], |args| &args.values.0);
    for (param, n) in (1..).zip(slots.iter().copied()) {
        let Some(value) = values.get(n - 1) else { break };
        let bound = match value {
            AnyValueKind::Null(_) => stmt.raw_bind_parameter(param, rusqlite::types::Null),
            AnyValueKind::Bool(b) => stmt.raw_bind_parameter(param, i64::from(*b)),
            AnyValueKind::SmallInt(i) => stmt.raw_bind_parameter(param, i64::from(*i)),
            AnyValueKind::Integer(i) => stmt.raw_bind_parameter(param, i64::from(*i)),
            AnyValueKind::BigInt(i) => stmt.raw_bind_parameter(param, *i),
            AnyValueKind::Real(r) => stmt.raw_bind_parameter(param, f64::from(*r)),
            AnyValueKind::Double(d) => stmt.raw_bind_parameter(param, *d),
            AnyValueKind::Text(t) => stmt.raw_bind_parameter(param, t.as_str()),
            AnyValueKind::TextSlice(t) => stmt.raw_bind_parameter(param, &**t),
            AnyValueKind::Blob(b) => stmt.raw_bind_parameter(param, b.as_slice()),
            other => return Err(sqlx::Error::Protocol(format!("no SQLite binding for {other:?}"))),
        };
        bound.map_err(driver)?;
    }
    Ok(())
}

/// A column's value as sqlx's SQLite driver gives it to `Any`.
fn kind(value: ValueRef<'_>, index: usize) -> Result<AnyValueKind, sqlx::Error> {
    Ok(match value {
        ValueRef::Null => AnyValueKind::Null(AnyTypeInfoKind::Null),
        ValueRef::Integer(i) => AnyValueKind::BigInt(i),
        ValueRef::Real(r) => AnyValueKind::Double(r),
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => AnyValueKind::Text(Arc::new(text.to_owned())),
            Err(e) => {
                return Err(sqlx::Error::ColumnDecode { index: index.to_string(), source: Box::new(e) });
            }
        },
        ValueRef::Blob(bytes) => AnyValueKind::Blob(Arc::new(bytes.to_vec())),
    })
}

/// A rusqlite error as sqlx's.
fn driver(e: rusqlite::Error) -> sqlx::Error {
    sqlx::Error::AnyDriverError(Box::new(e))
}

/// The stream of a direct read's items (already read).
pub(super) struct Ready {
    items: std::vec::IntoIter<Either<AnyQueryResult, AnyRow>>,
    error: Option<sqlx::Error>,
}

impl Ready {
    pub(super) fn of(result: Result<Items, sqlx::Error>) -> Self {
        match result {
            Ok(items) => Self { items: items.into_iter(), error: None },
            Err(e) => Self { items: Vec::new().into_iter(), error: Some(e) },
        }
    }
}

impl Stream for Ready {
    type Item = Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.error.take() {
            Some(e) => Poll::Ready(Some(Err(e))),
            None => Poll::Ready(self.items.next().map(Ok)),
        }
    }
}
