//! A durable SQLite file, as the relays' stores open it: write-ahead logging (refused if SQLite
//! cannot give it), every commit synced (`synchronous=FULL`: a commit has reached the disk when
//! it returns), a busy timeout; optionally created readable by its owner only, and optionally
//! without automatic checkpoints (the store checkpoints on a second connection,
//! [`open_checkpointer`]). Every error names the file. Each store's schema and checks stay with
//! the store.
//!
//! Every call on such a file blocks (it may wait for the disk): callers run it off the async
//! reactor.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

/// How long a statement waits for another connection's lock before it fails.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a durable SQLite file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The database file could not be created.
    #[error("cannot create the database file {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A SQLite call failed (a file that is not a database fails at the first statement).
    #[error("{}: {step}: {source}", path.display())]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// The step that failed, e.g. "set journal_mode=WAL".
        step: &'static str,
        /// The error SQLite reported.
        #[source]
        source: rusqlite::Error,
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
}

/// How [`open_durable`] opens a file, beyond what every durable file gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Durable {
    /// Create the file (if missing) readable by its owner only, before SQLite opens it; SQLite
    /// gives its `-wal` and `-shm` files the database file's permissions.
    pub private: bool,
    /// No automatic checkpoint when a commit grows the write-ahead log (`wal_autocheckpoint=0`):
    /// the store folds the log back itself, off the committing path ([`open_checkpointer`]).
    pub manual_checkpoints: bool,
}

/// Opens (or creates) the database at `path` with `journal_mode=WAL`, `synchronous=FULL` and
/// [`BUSY_TIMEOUT`], as `how` says.
///
/// # Errors
/// The file cannot be created or opened, is not a database, or cannot use WAL.
pub fn open_durable(path: &Path, how: Durable) -> Result<Connection, OpenError> {
    if how.private {
        create_private(path)?;
    }
    let step = |step| {
        move |source| OpenError::Sqlite {
            path: path.to_path_buf(),
            step,
            source,
        }
    };
    let conn = Connection::open(path).map_err(step("open the database"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(step("set busy_timeout"))?;
    // The first statement reads the file: a file that is not a database fails here.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(step("set journal_mode=WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::NotWal {
            path: path.to_path_buf(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(step("set synchronous=FULL"))?;
    if how.manual_checkpoints {
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(step("set wal_autocheckpoint=0"))?;
    }
    Ok(conn)
}

/// A second connection to the file at `path` (opened with [`open_durable`] and
/// [`Durable::manual_checkpoints`]) that folds the write-ahead log back into the database: it
/// never checkpoints automatically either, and syncs as the writer does (`synchronous=FULL`: a
/// checkpoint syncs the log before it copies pages into the database, and the database before
/// it lets the log be started over or truncated). It has no busy timeout: a checkpoint that
/// would have to wait for another connection does what it can at once instead.
///
/// # Errors
/// The file cannot be opened.
pub fn open_checkpointer(path: &Path) -> Result<Connection, OpenError> {
    let step = |step| {
        move |source| OpenError::Sqlite {
            path: path.to_path_buf(),
            step,
            source,
        }
    };
    let conn = Connection::open(path).map_err(step("open the checkpointing connection"))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(step("set wal_autocheckpoint=0"))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(step("set synchronous=FULL"))?;
    // rusqlite gives every connection a 5 s busy timeout.
    conn.busy_timeout(Duration::ZERO)
        .map_err(step("set busy_timeout=0"))?;
    Ok(conn)
}

/// Creates an empty file readable by its owner only, unless it exists.
fn create_private(path: &Path) -> Result<(), OpenError> {
    match crate::statefile::create_new_private(path, b"") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(OpenError::File {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma(conn: &Connection, name: &str) -> String {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| {
            r.get::<_, rusqlite::types::Value>(0)
        })
        .map(|v| match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t,
            other => format!("{other:?}"),
        })
        .unwrap()
    }

    #[test]
    fn a_durable_file_is_wal_synchronous_full_with_a_busy_timeout() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let how = Durable {
            private: true,
            manual_checkpoints: false,
        };
        let conn = open_durable(&path, how).unwrap();
        assert_eq!(pragma(&conn, "journal_mode"), "wal");
        assert_eq!(pragma(&conn, "synchronous"), "2");
        assert_eq!(pragma(&conn, "busy_timeout"), "5000");
        assert_eq!(pragma(&conn, "wal_autocheckpoint"), "1000");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let manual = Durable {
            private: false,
            manual_checkpoints: true,
        };
        let conn = open_durable(&path, manual).unwrap();
        assert_eq!(pragma(&conn, "wal_autocheckpoint"), "0");
        let checkpointer = open_checkpointer(&path).unwrap();
        assert_eq!(pragma(&checkpointer, "wal_autocheckpoint"), "0");
        assert_eq!(pragma(&checkpointer, "synchronous"), "2");
        assert_eq!(pragma(&checkpointer, "busy_timeout"), "0");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.db");
        std::fs::write(&path, b"not a database, just text").unwrap();
        let e = open_durable(&path, Durable::default()).unwrap_err();
        assert!(matches!(e, OpenError::Sqlite { .. }), "{e:?}");
        assert!(e.to_string().contains("text.db"), "{e}");
        let missing = dir.path().join("no/such/dir/x.db");
        let how = Durable {
            private: true,
            manual_checkpoints: false,
        };
        let e = open_durable(&missing, how).unwrap_err();
        assert!(matches!(e, OpenError::File { .. }), "{e:?}");
        assert!(e.to_string().contains("x.db"), "{e}");
        let e = open_durable(Path::new(":memory:"), Durable::default()).unwrap_err();
        assert!(matches!(e, OpenError::NotWal { .. }), "{e:?}");
    }
}
