//! Opening a SQLite file the way both stores need it: WAL, every commit synced, a busy timeout.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::{ReplayError, SqliteContext};

/// How long a statement waits for another connection's lock before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (or creates, mode 0600) the database at `path` with `journal_mode=WAL`,
/// `synchronous=FULL` (a commit has reached the disk when it returns) and a busy timeout.
pub(super) fn open_durable(path: &Path) -> Result<Connection, ReplayError> {
    create_private(path)?;
    let conn = Connection::open(path).ctx("open the database")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .ctx("set journal_mode=WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(ReplayError::NotWal {
            path: path.to_path_buf(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("set synchronous=FULL")?;
    Ok(conn)
}

/// Creates an empty file readable by its owner only, unless it exists. SQLite gives its `-wal`
/// and `-shm` files the database file's permissions.
#[cfg(unix)]
fn create_private(path: &Path) -> Result<(), ReplayError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(ReplayError::File {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(not(unix))]
fn create_private(_path: &Path) -> Result<(), ReplayError> {
    Ok(())
}
