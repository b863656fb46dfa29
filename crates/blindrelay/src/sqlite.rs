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
    /// The file is a SQLite database of something else: another store's, or not this node's.
    #[error("it is not {0} (another store's file, or not this node's)")]
    WrongStore(&'static str),
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

/// Claims the file for a store: `id` in its `application_id`. A new file (no table) and one this
/// store wrote before the stamp existed (its `table` there, no other id) are claimed; a file
/// with another id, or with tables of something else and none, is refused: the store does not
/// write its tables into another store's file.
///
/// # Errors
/// [`StoreError::WrongStore`] naming `what` the file should be; a SQLite error reading it.
pub(crate) fn claim(
    conn: &Connection,
    id: i32,
    table: &str,
    what: &'static str,
) -> Result<(), StoreError> {
    let current: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .ctx("read the file's application id")?;
    if current == id {
        return Ok(());
    }
    let (tables, ours): (i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COALESCE(SUM(name = ?1), 0) FROM sqlite_master
             WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            [table],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ctx("list the file's tables")?;
    if current != 0 || (tables > 0 && ours == 0) {
        return Err(StoreError::WrongStore(what));
    }
    conn.pragma_update(None, "application_id", id)
        .ctx("stamp the file's application id")
}

/// Moves the write-ahead log into the database file (`wal_checkpoint(TRUNCATE)`): called once
/// a store has created its table, so a store opened once is never a 0-byte file on disk
/// (`crate::stores` takes a 0-byte store for a lost one).
pub(crate) fn settle(conn: &Connection) -> Result<(), StoreError> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .ctx("checkpoint the write-ahead log")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_claims_a_new_file_or_its_own_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| Connection::open(dir.path().join(name)).unwrap();
        // New: claimed.
        let conn = open("new.db");
        claim(&conn, 7, "things", "a thing store").unwrap();
        let id: i32 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .unwrap();
        assert_eq!(id, 7);
        claim(&conn, 7, "things", "a thing store").unwrap();
        // Its own table from before the stamp: claimed.
        let old = open("old.db");
        old.execute_batch("CREATE TABLE things (x)").unwrap();
        claim(&old, 7, "things", "a thing store").unwrap();
        // Another store's stamp, or a database of something else: refused, left as it was.
        assert!(matches!(
            claim(&conn, 8, "others", "another store"),
            Err(StoreError::WrongStore("another store"))
        ));
        let foreign = open("foreign.db");
        foreign.execute_batch("CREATE TABLE recipes (x)").unwrap();
        assert!(matches!(
            claim(&foreign, 7, "things", "a thing store"),
            Err(StoreError::WrongStore(_))
        ));
        let id: i32 = foreign
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .unwrap();
        assert_eq!(id, 0);
    }
}
