//! A durable SQLite file, as both stores open it (the replay registry and the terminal's
//! inbox): `guard::sqlite::open_durable`, created readable by its owner only (WAL, every commit
//! synced, a busy timeout); the error both stores report for it; and their group commit
//! ([`group_commit`]).
//!
//! Every call on such a file blocks (it may wait for the disk): callers run it off the async
//! reactor and off the crypto slots (`tokio::task::spawn_blocking`).

use std::path::Path;

use guard::sqlite::{Durable, OpenError};
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
    /// The database file could not be created or opened durably (the error names the file).
    #[error(transparent)]
    Open(#[from] OpenError),
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

/// Opens (or creates, mode 0600) the database at `path` durably (`guard::sqlite::open_durable`:
/// `journal_mode=WAL`, `synchronous=FULL`, a busy timeout).
pub(crate) fn open_durable(path: &Path) -> Result<Connection, StoreError> {
    let how = Durable {
        private: true,
        manual_checkpoints: false,
    };
    Ok(guard::sqlite::open_durable(path, how)?)
}

/// Moves the write-ahead log into the database file (`wal_checkpoint(TRUNCATE)`): called once
/// a store has created its table, so a store opened once is never a 0-byte file on disk
/// (`crate::stores` takes a 0-byte store for a lost one).
pub(crate) fn settle(conn: &Connection) -> Result<(), StoreError> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpoint the write-ahead log")
}
