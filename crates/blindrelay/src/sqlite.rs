//! A durable SQLite file, as both stores open it (the replay registry and the terminal's
//! inbox): created readable by its owner only, WAL, every commit synced, a busy timeout; and
//! the error both stores report for it.
//!
//! Every call on such a file blocks (it may wait for the disk): callers run it off the async
//! reactor and off the crypto slots (`tokio::task::spawn_blocking`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

pub(crate) mod group_commit;

/// What can go wrong with a store's SQLite file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A SQLite call failed; `context` says which step.
    #[error("sqlite: {context}: {source}")]
    Sqlite {
        /// The step that failed, e.g. "insert a route reservation".
        context: &'static str,
        /// The error SQLite reported.
        #[source]
        source: rusqlite::Error,
    },
    /// The database file could not be created.
    #[error("cannot create the database file {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused write-ahead logging for this file (e.g. `:memory:`), so the durability the
    /// store promises cannot be given.
    #[error("{} cannot use WAL (journal_mode is {mode})", path.display())]
    NotWal {
        /// The file.
        path: PathBuf,
        /// The journal mode SQLite reported instead.
        mode: String,
    },
    /// A stored row does not have the shape this code writes.
    #[error("corrupt {table} row: {what}")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// What is wrong with it.
        what: &'static str,
    },
    /// A time does not fit SQLite's signed 64-bit integers.
    #[error("time {0} is out of range")]
    TimeOutOfRange(u64),
}

/// Adds a context to rusqlite results.
pub(crate) trait SqliteContext<T> {
    /// The result, its error tagged with the step that failed.
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> SqliteContext<T> for rusqlite::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sqlite { context, source })
    }
}

/// A time as SQLite stores it.
pub(crate) fn sql_time(t: u64) -> Result<i64, StoreError> {
    i64::try_from(t).map_err(|_| StoreError::TimeOutOfRange(t))
}

/// How long a statement waits for another connection's lock before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (or creates, mode 0600) the database at `path` with `journal_mode=WAL`,
/// `synchronous=FULL` (a commit has reached the disk when it returns) and a busy timeout.
pub(crate) fn open_durable(path: &Path) -> Result<Connection, StoreError> {
    create_private(path)?;
    let conn = Connection::open(path).ctx("open the database")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .ctx("set journal_mode=WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal {
            path: path.to_path_buf(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("set synchronous=FULL")?;
    Ok(conn)
}

/// Moves the write-ahead log into the database file (`wal_checkpoint(TRUNCATE)`): called once
/// a store has created its table, so a store opened once is never a 0-byte file on disk
/// (`crate::stores` takes a 0-byte store for a lost one).
pub(crate) fn settle(conn: &Connection) -> Result<(), StoreError> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpoint the write-ahead log")
}

/// Creates an empty file readable by its owner only, unless it exists. SQLite gives its `-wal`
/// and `-shm` files the database file's permissions.
fn create_private(path: &Path) -> Result<(), StoreError> {
    match guard::statefile::create_new_private(path, b"") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::File {
            path: path.to_path_buf(),
            source,
        }),
    }
}
