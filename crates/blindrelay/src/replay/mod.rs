//! Route replay protection and the terminal's durable inbox.
//!
//! - [`ReplayRegistry`]: every relayed request carries a route id. The registry reserves the
//!   route id for [`WINDOW_SECS`] together with the request digest (SHA-256 over the whole
//!   envelope, see `docs/blindrelay-protocol.md`) and remembers the final response, so a repeated
//!   route id gets one of the outcomes of the design's table ([`Outcome`]) and nothing is ever
//!   forwarded or delivered twice. It keeps its state in SQLite (it survives restarts and kill -9)
//!   or, with the same rules, in memory only.
//! - [`Inbox`]: the payloads delivered to this node as the terminal hop, committed to SQLite
//!   before the delivery receipt is signed.
//!
//! Every call here is blocking (it may wait for the disk): run it off the async reactor
//! (`tokio::task::spawn_blocking`). Time is always passed in as Unix seconds; nothing here reads
//! the clock. Nothing here logs a route id, a digest or a payload.

mod inbox;
mod registry;
mod sqlite;

pub use inbox::{INBOX_MAX_BYTES, INBOX_MAX_ITEMS, Inbox, InboxItem};
pub use registry::{
    CAPACITY, Digest, INTERRUPTED_BODY, INTERRUPTED_STATUS, Outcome, RESPONSE_MAX_AGE_SECS,
    ReplayRegistry, RouteId, StoredResponse, WINDOW_SECS,
};

use std::path::PathBuf;

/// Everything that can go wrong in the replay registry or the inbox.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
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
    /// `complete` was called for a route that has no reservation in flight for this request:
    /// never reserved, already completed, reserved for another digest, or its window has ended.
    #[error("no reservation in flight for this route and request")]
    NotInFlight,
    /// The inbox holds its maximum number of items or bytes; nothing was stored.
    #[error("the inbox is full")]
    InboxFull,
}

/// Adds a context to rusqlite results.
trait SqliteContext<T> {
    fn ctx(self, context: &'static str) -> Result<T, ReplayError>;
}

impl<T> SqliteContext<T> for rusqlite::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T, ReplayError> {
        self.map_err(|source| ReplayError::Sqlite { context, source })
    }
}

/// A time as SQLite stores it.
fn sql_time(t: u64) -> Result<i64, ReplayError> {
    i64::try_from(t).map_err(|_| ReplayError::TimeOutOfRange(t))
}
