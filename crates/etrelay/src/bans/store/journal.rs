//! The ban store's journal kept small: when a checkpoint runs, what it locks, and why the state
//! dir stays bounded.
//!
//! Every change appends its pages to the write-ahead log (`bans-<port>.db-wal`) and syncs it;
//! nothing folds them back into the database on the committing path (`wal_autocheckpoint=0`).
//! After each commit the store notes the journal file's size (one `stat`). Once it passes
//! [`CHECKPOINT_BYTES`], [`Store::needs_checkpoint`] says so and the registry runs
//! [`Store::checkpoint`] on the blocking pool, which no request waits for:
//!
//! 1. a passive checkpoint on the second connection copies the journal's pages into the
//!    database and syncs it, while changes go on;
//! 2. then, holding the writer's lock (no change is written meanwhile), a restarting checkpoint
//!    copies what step 1 missed (the changes made during it) and syncs the database: the next
//!    change writes the journal from its beginning again. A change waits for this step at
//!    most: a few pages and one fsync.
//!
//! The journal file is reused, not truncated: a commit overwrites blocks the file already has,
//! which costs the disk less than growing a file (measured: a burst of bans ran faster than
//! with a journal truncated to 0 at each checkpoint, and than before). The writer's
//! `journal_size_limit` is [`CHECKPOINT_BYTES`]: the first commit after a restart trims a file
//! a burst made longer back to that size. So the file's size says how far the current journal
//! went once it is past [`CHECKPOINT_BYTES`], which is what the trigger reads.
//!
//! Before, a passive checkpoint alone never caught up with a burst: SQLite starts the journal
//! over only when it was wholly copied with no change in between, so it grew as long as the
//! burst lasted (209 MiB for 65 536 bans through the API in 58 s, `tests/it/ban_burst.rs`).
//!
//! **Bound.** While checkpoints succeed, the journal passes [`CHECKPOINT_BYTES`] only by the
//! changes committed during a checkpoint's first step, and a change that finds it at
//! [`MAX_WAL_BYTES`] waits for the running checkpoint before it writes. So the journal file
//! stays under [`MAX_WAL_BYTES`] plus the pages of one change, and the `-shm` index (32 KiB per
//! 4 062 journal pages) at 32 KiB; the database holds at most [`MAX_BANS`](super::MAX_BANS)
//! rows plus one (see [`Store::put`]). A change is not held when no checkpoint runs at that
//! moment (one just being started, or the last one failed): in the bursts measured (65 536 bans
//! from 8 writers, on a disk and on a tmpfs) it peaked between 1.1 and 1.4 MiB. A checkpoint
//! that fails (a full disk, where changes fail too) or finds another process reading the file
//! is tried again once the journal grew by [`CHECKPOINT_BYTES`] more, not on every change.
//!
//! **Durability.** SQLite copies nothing into the database before the journal is synced, and
//! lets the journal be started over only once the database is synced (`synchronous = FULL` on
//! both connections; pages of the journal's previous round left behind the new ones carry an
//! old salt and are ignored): a kill -9 or a power cut at any moment leaves every committed
//! change in one or the other.

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, TryLockError};

use rusqlite::Connection;

use super::{Store, StoreError, Writer};

/// Journal size past which a checkpoint is due (about 256 pages of 4 KiB), and the size its
/// file is trimmed back to after a burst (`journal_size_limit`).
pub const CHECKPOINT_BYTES: u64 = 1024 * 1024;
/// Journal size at which a change waits for the running checkpoint before it writes.
pub const MAX_WAL_BYTES: u64 = 4 * 1024 * 1024;

impl Store {
    /// True when the journal passed [`CHECKPOINT_BYTES`]: [`Store::checkpoint`] is due. After
    /// one failed, only once the journal grew by as much again: a failing checkpoint is not
    /// tried (and logged) on every change.
    pub fn needs_checkpoint(&self) -> bool {
        // Past, not at: a file trimmed back to `CHECKPOINT_BYTES` may hold a short journal.
        self.wal_bytes.load(Ordering::Relaxed) > self.checkpoint_at.load(Ordering::Relaxed)
    }

    /// Folds the journal back into the database and starts it over, when it is due (the
    /// module doc says how; changes wait only for the last step). Blocking; one at a time: a call
    /// while one runs, or once another has emptied the journal, returns at once.
    ///
    /// # Errors
    /// The database refused.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let checkpointer = match self.checkpointer.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(()),
        };
        if !self.needs_checkpoint() {
            return Ok(());
        }
        self.fold(&checkpointer)
    }

    /// [`Store::checkpoint`] whether due or not, once the one running (if any) is done: after a
    /// bulk write.
    pub(super) fn checkpoint_now(&self) -> Result<(), StoreError> {
        let checkpointer = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        self.fold(&checkpointer)
    }

    /// The two steps of the module doc, on the checkpointing connection. When they fail, or
    /// another process held the file (an operator's `sqlite3` reading it), the journal is left
    /// as it is and the next checkpoint is due once it grew by [`CHECKPOINT_BYTES`] more.
    fn fold(&self, checkpointer: &Connection) -> Result<(), StoreError> {
        let r = self.fold_steps(checkpointer);
        let at = match r {
            Ok(true) => CHECKPOINT_BYTES,
            Ok(false) | Err(_) => self.wal_bytes().saturating_add(CHECKPOINT_BYTES),
        };
        self.checkpoint_at.store(at, Ordering::Relaxed);
        r.map(|_| ())
    }

    /// The two steps; false when the journal cannot be started over (busy).
    fn fold_steps(&self, checkpointer: &Connection) -> Result<bool, StoreError> {
        checkpointer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(self.db())?;
        let _no_change = self.lock();
        let busy: i64 = checkpointer
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))
            .map_err(self.db())?;
        if busy == 0 {
            // Empty: the next change writes from the file's beginning (and trims it).
            self.wal_bytes.store(0, Ordering::Relaxed);
        }
        Ok(busy == 0)
    }

    /// The writer's lock, once the journal has room: a change that finds it at
    /// [`MAX_WAL_BYTES`] first waits for the running checkpoint (none running: no wait).
    pub(super) fn writer(&self) -> MutexGuard<'_, Writer> {
        let w = self.lock();
        if self.wal_bytes.load(Ordering::Relaxed) < MAX_WAL_BYTES {
            return w;
        }
        // The checkpoint takes the writer's lock for its last step: let go of it first.
        drop(w);
        drop(self.checkpointer.lock().unwrap_or_else(|p| p.into_inner()));
        self.lock()
    }

    /// Notes the journal file's size (after a commit, under the writer's lock); a journal that
    /// cannot be looked at counts as empty.
    pub(super) fn note_wal(&self) {
        let bytes = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        self.wal_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of the journal file after the last commit (0 after a checkpoint emptied it).
    pub fn wal_bytes(&self) -> u64 {
        self.wal_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::bans::Ban;
    use crate::clock::{from_unix, wall_now};

    fn ban(i: u32) -> Ban {
        Ban {
            ip: IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i)),
            reason: format!("r{i}"),
            since: from_unix(1_000),
            expires: None,
        }
    }

    fn len(p: &Path) -> u64 {
        std::fs::metadata(p).map_or(0, |m| m.len())
    }

    /// A copy of the store's files as a kill -9 would leave them (no close, no checkpoint).
    fn snapshot(from: &Path, to: &Path, with_journal: bool) {
        std::fs::copy(from.join("bans-27960.db"), to.join("bans-27960.db")).unwrap();
        if with_journal {
            let wal = "bans-27960.db-wal";
            std::fs::copy(from.join(wal), to.join(wal)).unwrap();
        }
    }

    #[test]
    fn the_journal_is_folded_back_and_started_over_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = Store::open(dir.path(), 27960, wall_now()).unwrap();
        let mut n = 0;
        while !s.needs_checkpoint() {
            s.put(&ban(n)).unwrap();
            n += 1;
        }
        let high = len(&s.wal);
        assert!(high > CHECKPOINT_BYTES && n < 1_000, "{n} bans, {high} B");
        s.checkpoint().unwrap();
        assert_eq!(s.wal_bytes(), 0, "empty");
        assert!(!s.needs_checkpoint());
        // The database alone holds every ban now.
        let copy = tempfile::tempdir().unwrap();
        snapshot(dir.path(), copy.path(), false);
        let (_, bans) = Store::open(copy.path(), 27960, wall_now()).unwrap();
        assert_eq!(bans.len(), n as usize);
        // The next changes write the file from its beginning, trimmed back to its limit; the
        // previous round's pages behind them are ignored.
        s.put(&ban(n)).unwrap();
        assert!(s.delete(ban(0).ip).unwrap());
        assert_eq!(s.wal_bytes(), CHECKPOINT_BYTES);
        assert!(!s.needs_checkpoint());
        let copy = tempfile::tempdir().unwrap();
        snapshot(dir.path(), copy.path(), true);
        let (_, bans) = Store::open(copy.path(), 27960, wall_now()).unwrap();
        assert_eq!(bans.len(), n as usize);
        assert!(bans.contains(&ban(n)) && !bans.contains(&ban(0)));
    }

    #[test]
    fn a_reader_in_the_way_puts_the_next_checkpoint_off_by_a_mebibyte() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = Store::open(dir.path(), 27960, wall_now()).unwrap();
        let fill = |mut i: u32| {
            while !s.needs_checkpoint() {
                s.put(&ban(i)).unwrap();
                i += 1;
            }
            i
        };
        let n = fill(0);
        // An operator's `sqlite3` in the middle of a read.
        let reader = Connection::open(dir.path().join("bans-27960.db")).unwrap();
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM bans;")
            .unwrap();
        s.checkpoint().unwrap();
        let left = s.wal_bytes();
        assert!(left > CHECKPOINT_BYTES, "not started over under a reader");
        assert!(!s.needs_checkpoint(), "put off, not tried on every change");
        reader.execute_batch("COMMIT").unwrap();
        fill(n);
        assert!(s.wal_bytes() >= left + CHECKPOINT_BYTES);
        s.checkpoint().unwrap();
        assert_eq!(s.wal_bytes(), 0);
        assert!(!s.needs_checkpoint());
    }

    #[test]
    fn a_change_waits_for_the_running_checkpoint_only_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = Store::open(dir.path(), 27960, wall_now()).unwrap();
        let s = std::sync::Arc::new(s);
        let put = |i: u32| {
            let s = std::sync::Arc::clone(&s);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(s.put(&ban(i)).is_ok()));
            rx
        };
        // A checkpoint running (its lock held): under the cap, a change does not wait for it.
        let running = s.checkpointer.lock().unwrap();
        assert_eq!(put(1).recv_timeout(Duration::from_secs(10)), Ok(true));
        // At the cap it waits until the checkpoint is done.
        s.wal_bytes.store(MAX_WAL_BYTES, Ordering::Relaxed);
        let waiting = put(2);
        let wait = Duration::from_millis(300);
        assert!(waiting.recv_timeout(wait).is_err(), "written past the cap");
        drop(running);
        assert_eq!(waiting.recv_timeout(Duration::from_secs(10)), Ok(true));
        // No checkpoint running: no wait, even at the cap.
        s.wal_bytes.store(MAX_WAL_BYTES, Ordering::Relaxed);
        assert_eq!(put(3).recv_timeout(Duration::from_secs(10)), Ok(true));
    }
}
