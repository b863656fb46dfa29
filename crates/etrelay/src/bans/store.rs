//! A server's bans on disk: `bans-<port>.db`, an SQLite database (WAL journal, `synchronous =
//! FULL`: a ban answered is on disk, as the JSON file's fsync made it before).
//!
//! A ban or an unban is one row written in one transaction: its cost does not grow with the
//! number of bans (the JSON file was rewritten whole on every change). The journal (`-wal`) is
//! folded back into the database in the background once it passes [`CHECKPOINT_BYTES`], and
//! started over from its beginning ([`Store::checkpoint`], `store/journal.rs`): no request runs
//! a checkpoint, and the state dir stays bounded under any burst of changes. The table never
//! holds more than [`MAX_BANS`] rows plus one: a new ban that would pass it first deletes the
//! expired ones. A `bans-<port>.json` of an earlier version is imported once, in one
//! transaction, then removed.
//!
//! Blocking: every call runs off the reactor (the registry uses `spawn_blocking`). One
//! connection per server, behind a mutex: the changes of one server are applied one at a time,
//! those of different servers side by side.

mod journal;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use guard::sqlite::{Durable, OpenError};
use rusqlite::{Connection, Transaction, params};

use super::{Ban, MAX_BANS};
use crate::clock::{from_unix, unix, wall_now};

pub use self::journal::{CHECKPOINT_BYTES, MAX_WAL_BYTES};

/// Why the ban store could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused.
    #[error("{path}: {source}")]
    Db {
        /// The file concerned.
        path: PathBuf,
        /// SQLite's complaint.
        source: rusqlite::Error,
    },
    /// The database holds something that is not a ban.
    #[error("{path}: not a ban store: {what}")]
    Damaged {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The JSON file of an earlier version could not be imported.
    #[error(transparent)]
    Legacy(#[from] guard::statefile::StateFileError),
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<OpenError> for StoreError {
    /// The shared durable open's errors as this store has always reported them.
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::File { path, source } => StoreError::Io { path, source },
            OpenError::Sqlite { path, source, .. } => StoreError::Db { path, source },
            OpenError::NotWal { path, mode } => StoreError::Damaged {
                path,
                what: format!("journal mode {mode}"),
            },
        }
    }
}

/// Whether `path` (or, when it does not exist, its directory) cannot be written: a read-only
/// file system or no permission.
fn read_only(path: &Path) -> bool {
    const EROFS: i32 = 30;
    const EACCES: i32 = 13;
    let probe = if path.exists() {
        std::fs::OpenOptions::new().append(true).open(path).err()
    } else {
        None
    };
    probe
        .and_then(|e| e.raw_os_error())
        .is_some_and(|n| n == EROFS || n == EACCES)
}

/// Schema version kept in `PRAGMA user_version`.
const SCHEMA: i64 = 1;

/// The ban store of one server.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// The journal, `bans-<port>.db-wal`: its size after each commit says when a checkpoint is
    /// due.
    wal: PathBuf,
    /// The connection that writes, and what it knows of the table.
    writer: Mutex<Writer>,
    /// A second connection that folds the journal back into the database, in the background
    /// ([`journal`]).
    checkpointer: Mutex<Connection>,
    /// Bytes in the journal after the last commit or checkpoint.
    wal_bytes: AtomicU64,
    /// Journal size at which a checkpoint is due: [`CHECKPOINT_BYTES`], further on after one
    /// failed.
    checkpoint_at: AtomicU64,
    /// Opened read-only (a read-only state dir): every write fails.
    read_only: bool,
}

/// The connection that writes (every change goes through it, one at a time) and what it
/// counted of the table, so that a change never has to scan it.
#[derive(Debug)]
struct Writer {
    conn: Connection,
    /// Rows in the table: bans in force and expired ones not deleted yet.
    rows: usize,
    /// No row expires before this (Unix seconds; `None`: none expires): expired rows are
    /// looked for only once it is past.
    first_expiry: Option<i64>,
}

impl Writer {
    /// `conn` with the table's rows counted.
    fn counted(conn: Connection, path: &Path) -> Result<Writer, StoreError> {
        let (rows, first_expiry) = census(&conn).map_err(|source| StoreError::Db {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Writer {
            conn,
            rows,
            first_expiry,
        })
    }
}

/// The rows of the table and its first expiry (a scan: at open, after a bulk write or a purge).
fn census(conn: &Connection) -> rusqlite::Result<(usize, Option<i64>)> {
    let (rows, first): (i64, Option<i64>) =
        conn.query_row("SELECT count(*), min(expires_at) FROM bans", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok((usize::try_from(rows).unwrap_or(0), first))
}

/// `bans-<port>.db` in `dir`.
pub fn db_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("bans-{port}.db"))
}

/// Removes the store of `port` in `dir` (database and journal files); missing files are fine.
pub fn remove(dir: &Path, port: u16) -> std::io::Result<()> {
    let db = db_path(dir, port);
    for p in [
        db.clone(),
        with_suffix(&db, "-wal"),
        with_suffix(&db, "-shm"),
    ] {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

impl Store {
    /// Opens (or creates) the store of `port` in `dir`, imports a JSON file of an earlier
    /// version, drops the bans expired at `now`, and returns the bans in force.
    ///
    /// # Errors
    /// The database cannot be opened, is damaged, or holds something else.
    pub fn open(dir: &Path, port: u16, now: SystemTime) -> Result<(Store, Vec<Ban>), StoreError> {
        let store = Store::connect(db_path(dir, port))?;
        let legacy = super::path(dir, port);
        if legacy.exists() {
            let bans = super::load(&legacy)?;
            store.put_all(&bans, false)?;
            std::fs::remove_file(&legacy).map_err(|source| StoreError::Io {
                path: legacy.clone(),
                source,
            })?;
            tracing::info!(
                port,
                bans = bans.len(),
                from = %legacy.display(),
                into = %store.path.display(),
                "bans imported"
            );
        }
        let bans = store.load(now)?;
        Ok((store, bans))
    }

    /// [`Store::open`] without holding the bans: each is read, checked and let go (the server
    /// starts with them later, [`Store::load`]); returns how many are in force.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_checked(
        dir: &Path,
        port: u16,
        now: SystemTime,
    ) -> Result<(Store, usize), StoreError> {
        let store = Store::connect(db_path(dir, port))?;
        let legacy = super::path(dir, port);
        if legacy.exists() {
            drop(store);
            let (store, bans) = Store::open(dir, port, now)?;
            return Ok((store, bans.len()));
        }
        let mut n = 0;
        store.each(now, |_| n += 1)?;
        Ok((store, n))
    }

    /// Creates the store of `port` in `dir` holding exactly `bans` (a server moving to `port`
    /// takes its bans along; whatever was there before is dropped).
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn create_with(dir: &Path, port: u16, bans: &[Ban]) -> Result<Store, StoreError> {
        let store = Store::connect(db_path(dir, port))?;
        store.put_all(bans, true)?;
        Ok(store)
    }

    /// Opens the store for writing; on a read-only file system (or directory), read-only: the
    /// server is relayed with its bans and every write is refused (the operator sees a warning
    /// here and `state_write_failed` on each write).
    fn connect(path: PathBuf) -> Result<Store, StoreError> {
        match Store::connect_rw(path.clone()) {
            Err(e) if read_only(&path) => {
                let store = Store::connect_read_only(path)?;
                tracing::warn!(
                    path = %store.path.display(),
                    error = %e,
                    "the state dir is read-only: bans kept, no ban can change until it is \
                     writable and etrelay restarted"
                );
                Ok(store)
            }
            r => r,
        }
    }

    /// The store opened read-only (`immutable`: no journal or lock file is written).
    fn connect_read_only(path: PathBuf) -> Result<Store, StoreError> {
        use rusqlite::OpenFlags;
        let db = |source| StoreError::Db {
            path: path.clone(),
            source,
        };
        let escaped: String = path
            .display()
            .to_string()
            .chars()
            .map(|c| match c {
                '%' => "%25".to_string(),
                '?' => "%3f".to_string(),
                '#' => "%23".to_string(),
                c => c.to_string(),
            })
            .collect();
        let uri = format!("file:{escaped}?immutable=1");
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(&uri, flags).map_err(db)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(db)?;
        if version != SCHEMA {
            return Err(StoreError::Damaged {
                path,
                what: format!("schema version {version} in a read-only store"),
            });
        }
        let checkpointer = Connection::open_with_flags(&uri, flags).map_err(db)?;
        let writer = Writer::counted(conn, &path)?;
        Ok(Store {
            wal: with_suffix(&path, "-wal"),
            path,
            writer: Mutex::new(writer),
            checkpointer: Mutex::new(checkpointer),
            wal_bytes: AtomicU64::new(0),
            checkpoint_at: AtomicU64::new(CHECKPOINT_BYTES),
            read_only: true,
        })
    }

    fn connect_rw(path: PathBuf) -> Result<Store, StoreError> {
        let db = |source| StoreError::Db {
            path: path.clone(),
            source,
        };
        // WAL, `synchronous = FULL`, a busy timeout; no checkpoint in the committing request:
        // `Store::checkpoint` does it, off the path, on the checkpointer.
        let durable = Durable {
            private: false,
            manual_checkpoints: true,
        };
        let conn = guard::sqlite::open_durable(&path, durable)?;
        // The journal file is reused from its start after each checkpoint, and trimmed back to
        // this size when a burst made it longer ([`journal`]).
        conn.pragma_update(None, "journal_size_limit", CHECKPOINT_BYTES as i64)
            .map_err(db)?;
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(db)?;
        if check != "ok" {
            return Err(StoreError::Damaged { path, what: check });
        }
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(db)?;
        match version {
            0 => conn
                .execute_batch(
                    "BEGIN;
                     CREATE TABLE IF NOT EXISTS bans (
                         ip TEXT PRIMARY KEY NOT NULL,
                         reason TEXT NOT NULL,
                         since INTEGER NOT NULL,
                         expires_at INTEGER
                     ) WITHOUT ROWID;
                     PRAGMA user_version = 1;
                     COMMIT;",
                )
                .map_err(db)?,
            SCHEMA => {}
            v => {
                return Err(StoreError::Damaged {
                    path,
                    what: format!("schema version {v}, this etrelay knows {SCHEMA}"),
                });
            }
        }
        let checkpointer = guard::sqlite::open_checkpointer(&path)?;
        let writer = Writer::counted(conn, &path)?;
        let store = Store {
            wal: with_suffix(&path, "-wal"),
            path,
            writer: Mutex::new(writer),
            checkpointer: Mutex::new(checkpointer),
            wal_bytes: AtomicU64::new(0),
            checkpoint_at: AtomicU64::new(CHECKPOINT_BYTES),
            read_only: false,
        };
        // A journal left by a kill: its size says whether a checkpoint is due.
        store.note_wal();
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn db(&self) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Db {
            path: self.path.clone(),
            source,
        }
    }

    /// Puts `bans` in, in one transaction; `replace`: drops every other ban first. A bulk
    /// write (an import, a move): the journal then holds about the whole table, so it is folded
    /// back at once.
    fn put_all(&self, bans: &[Ban], replace: bool) -> Result<(), StoreError> {
        {
            let mut w = self.lock();
            let tx = w.conn.transaction().map_err(self.db())?;
            if replace {
                tx.execute("DELETE FROM bans", []).map_err(self.db())?;
            }
            for b in bans {
                upsert(&tx, b).map_err(self.db())?;
            }
            let counted = census(&tx).map_err(self.db())?;
            tx.commit().map_err(self.db())?;
            (w.rows, w.first_expiry) = counted;
            self.note_wal();
        }
        // The bans are in; a checkpoint that fails leaves them in the journal.
        if let Err(e) = self.checkpoint_now() {
            tracing::warn!(error = %e, "ban store checkpoint failed");
        }
        Ok(())
    }

    /// Drops the bans expired at `now`; returns the rest (at most [`MAX_BANS`], oldest first).
    ///
    /// # Errors
    /// The database refused, or holds a row that is not a ban.
    pub fn load(&self, now: SystemTime) -> Result<Vec<Ban>, StoreError> {
        let mut out = Vec::new();
        self.each(now, |b| out.push(b))?;
        Ok(out)
    }

    /// [`Store::load`], each ban handed to `each` as it is read, none held here.
    ///
    /// # Errors
    /// As [`Store::load`].
    pub fn each(&self, now: SystemTime, mut each: impl FnMut(Ban)) -> Result<(), StoreError> {
        let mut w = self.lock();
        // A read-only store keeps its expired bans on disk; they are skipped below.
        if !self.read_only {
            let n = delete_expired(&w.conn, now).map_err(self.db())?;
            w.rows = w.rows.saturating_sub(n);
            self.note_wal();
        }
        let mut stmt = w
            .conn
            .prepare(
                "SELECT ip, reason, since, expires_at FROM bans
                 WHERE expires_at IS NULL OR expires_at > ?2 ORDER BY since, ip LIMIT ?1",
            )
            .map_err(self.db())?;
        let rows = stmt
            .query_map(params![MAX_BANS as i64, unix(now) as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .map_err(self.db())?;
        for row in rows {
            let (ip, reason, since, expires) = row.map_err(self.db())?;
            let ip: IpAddr = ip.parse().map_err(|_| StoreError::Damaged {
                path: self.path.clone(),
                what: format!("{ip:?} is not an address"),
            })?;
            each(Ban {
                ip: crate::net::canonical_ip(ip),
                reason,
                since: from_unix(since.max(0) as u64),
                expires: expires.map(|e| from_unix(e.max(0) as u64)),
            });
        }
        Ok(())
    }

    /// Saves `ban` (replacing a ban of the same address): durable when this returns. A new
    /// address that would take the table past [`MAX_BANS`] rows first deletes the expired ones,
    /// in the same transaction.
    ///
    /// # Errors
    /// The database refused; nothing changed.
    pub fn put(&self, ban: &Ban) -> Result<(), StoreError> {
        let mut w = self.writer();
        let now = wall_now();
        let full = w.rows >= MAX_BANS;
        let due = w.first_expiry.is_some_and(|t| t <= unix(now) as i64);
        let tx = w.conn.transaction().map_err(self.db())?;
        let added = upsert(&tx, ban).map_err(self.db())?;
        // After a purge the next expiry is further on: found once here, not on every change.
        let counted = if added && full && due {
            delete_expired(&tx, now).map_err(self.db())?;
            Some(census(&tx).map_err(self.db())?)
        } else {
            None
        };
        tx.commit().map_err(self.db())?;
        let expires = ban.expires.map(|e| unix(e) as i64);
        (w.rows, w.first_expiry) = match counted {
            Some(c) => c,
            None => (
                w.rows + usize::from(added),
                min_expiry(w.first_expiry, expires),
            ),
        };
        self.note_wal();
        Ok(())
    }

    /// Deletes the ban of `ip`; false when there was none.
    ///
    /// # Errors
    /// The database refused; nothing changed.
    pub fn delete(&self, ip: IpAddr) -> Result<bool, StoreError> {
        let mut w = self.writer();
        let n = w
            .conn
            .execute("DELETE FROM bans WHERE ip = ?1", params![ip.to_string()])
            .map_err(self.db())?;
        w.rows = w.rows.saturating_sub(n);
        self.note_wal();
        Ok(n > 0)
    }

    /// Deletes the bans expired at `now`; returns how many.
    ///
    /// # Errors
    /// The database refused.
    pub fn purge(&self, now: SystemTime) -> Result<usize, StoreError> {
        let mut w = self.writer();
        let tx = w.conn.transaction().map_err(self.db())?;
        let n = delete_expired(&tx, now).map_err(self.db())?;
        let counted = census(&tx).map_err(self.db())?;
        tx.commit().map_err(self.db())?;
        (w.rows, w.first_expiry) = counted;
        self.note_wal();
        Ok(n)
    }

    /// Rows in the table now: bans in force and expired ones not deleted yet.
    pub fn rows(&self) -> usize {
        self.lock().rows
    }
}

/// Writes `b`, replacing a ban of the same address; true when its address is new.
fn upsert(tx: &Transaction<'_>, b: &Ban) -> rusqlite::Result<bool> {
    let (ip, since, expires) = (
        b.ip.to_string(),
        unix(b.since) as i64,
        b.expires.map(|e| unix(e) as i64),
    );
    let values = params![ip, b.reason, since, expires];
    let added = tx
        .prepare_cached(
            "INSERT INTO bans (ip, reason, since, expires_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (ip) DO NOTHING",
        )?
        .execute(values)?;
    if added == 0 {
        tx.prepare_cached(
            "UPDATE bans SET reason = ?2, since = ?3, expires_at = ?4 WHERE ip = ?1",
        )?
        .execute(values)?;
    }
    Ok(added == 1)
}

/// The earlier of two expiries (`None`: none).
fn min_expiry(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Deletes the bans expired at `now`; returns how many.
fn delete_expired(conn: &Connection, now: SystemTime) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM bans WHERE expires_at IS NOT NULL AND expires_at <= ?1",
        params![unix(now) as i64],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock;

    fn ban(i: u32, since: u64, expires: Option<u64>) -> Ban {
        Ban {
            ip: IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)),
            reason: format!("r{i}"),
            since: clock::from_unix(since),
            expires: expires.map(clock::from_unix),
        }
    }

    #[test]
    fn bans_survive_a_reopen_and_expired_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let now = clock::from_unix(10_000);
        let (s, none) = Store::open(dir.path(), 27960, now).unwrap();
        assert!(none.is_empty());
        s.put(&ban(1, 100, None)).unwrap();
        s.put(&ban(2, 200, Some(5_000))).unwrap();
        s.put(&ban(3, 300, Some(20_000))).unwrap();
        let mut again = ban(1, 400, None);
        again.reason = "again".into();
        s.put(&again).unwrap();
        assert!(s.delete(ban(3, 0, None).ip).unwrap());
        assert!(!s.delete(ban(3, 0, None).ip).unwrap());
        s.checkpoint().unwrap();
        drop(s);
        let (_, bans) = Store::open(dir.path(), 27960, now).unwrap();
        assert_eq!(bans, vec![again]);
    }

    #[test]
    fn a_json_file_is_imported_once_and_a_move_replaces_everything() {
        let dir = tempfile::tempdir().unwrap();
        let now = clock::from_unix(10_000);
        let old = vec![ban(1, 100, None), ban(2, 200, None)];
        super::super::save(&super::super::path(dir.path(), 27960), &old).unwrap();
        let (_, bans) = Store::open(dir.path(), 27960, now).unwrap();
        assert_eq!(bans, old);
        assert!(!super::super::path(dir.path(), 27960).exists());
        let moved = Store::create_with(dir.path(), 27960, &old[1..]).unwrap();
        drop(moved);
        let (_, bans) = Store::open(dir.path(), 27960, now).unwrap();
        assert_eq!(bans, old[1..]);
        remove(dir.path(), 27960).unwrap();
        assert!(!db_path(dir.path(), 27960).exists());
    }

    #[test]
    fn a_new_ban_past_the_cap_deletes_the_expired_ones_first() {
        let dir = tempfile::tempdir().unwrap();
        let past = clock::unix(clock::wall_now()) - 10;
        // Every row a ban that ran out 10 s ago (the server's table forgot them already).
        let expired: Vec<Ban> = (0..MAX_BANS as u32)
            .map(|i| ban(i, past - 100, Some(past)))
            .collect();
        let s = Store::create_with(dir.path(), 27960, &expired).unwrap();
        assert_eq!(s.rows(), MAX_BANS);
        // Replacing one adds no row: nothing deleted.
        s.put(&ban(0, past, None)).unwrap();
        assert_eq!(s.rows(), MAX_BANS);
        // A new address deletes the expired ones first.
        s.put(&ban(MAX_BANS as u32, past, None)).unwrap();
        assert_eq!(s.rows(), 2);
        drop(s);
        let (_, bans) = Store::open(dir.path(), 27960, clock::wall_now()).unwrap();
        assert_eq!(
            bans,
            vec![ban(0, past, None), ban(MAX_BANS as u32, past, None)]
        );
    }

    #[test]
    fn a_damaged_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(db_path(dir.path(), 27960), b"not a database, just text").unwrap();
        let e = Store::open(dir.path(), 27960, crate::clock::wall_now()).unwrap_err();
        assert!(e.to_string().contains("bans-27960.db"), "{e}");
        std::fs::write(super::super::path(dir.path(), 27961), b"{\"bans\": [").unwrap();
        let e = Store::open(dir.path(), 27961, crate::clock::wall_now()).unwrap_err();
        assert!(e.to_string().contains("bans-27961.json"), "{e}");
    }
}
