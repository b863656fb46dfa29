//! The node's two stores opened from its state dir: the replay registry and the inbox. A store
//! opened before and now lost refuses the start unless `--accept-lost-state` (`crate::stores`);
//! a store whose file cannot be used is refused with its name and the remedy, or with
//! `--accept-lost-state` set aside and started empty.

use std::path::Path;

use tracing::warn;

use super::RunError;
use super::config::StoresConfig;
use crate::replay::{self, ReplayRegistry, ReplayStore};
use crate::stores;
use crate::terminal::Inbox;

/// The replay registry's file in the state dir.
pub const REPLAY_DB: &str = "replay.db";
/// The inbox's file in the state dir.
pub const INBOX_DB: &str = "inbox.db";

/// Refuses a state dir that cannot be written: the node would fail every request (no route can
/// be reserved) after starting as if well.
pub(super) fn check_writable(dir: &Path) -> Result<(), RunError> {
    let probe = dir.join(".write-check");
    std::fs::write(&probe, b"").map_err(RunError::ReadOnly)?;
    std::fs::remove_file(&probe).map_err(RunError::ReadOnly)
}

/// Where the stores are and how they are opened.
#[derive(Debug, Clone, Copy)]
pub(super) struct Opening<'a> {
    /// The state dir.
    pub state_dir: &'a Path,
    /// Where route reservations are kept.
    pub replay_store: ReplayStore,
    /// `--accept-lost-state`.
    pub accept: bool,
    /// The stores' bounds.
    pub bounds: &'a StoresConfig,
}

/// The replay registry and the inbox, opened from the state dir at `now`.
pub(super) fn open(o: Opening<'_>, now: u64) -> Result<(ReplayRegistry, Inbox), RunError> {
    let (dir, bounds) = (o.state_dir, o.bounds);
    let opening: &[&str] = match o.replay_store {
        ReplayStore::Sqlite => &[REPLAY_DB, INBOX_DB],
        ReplayStore::Memory => &[INBOX_DB],
    };
    for lost in stores::check(dir, opening, o.accept)? {
        warn!(%lost, "a lost store accepted; starting anyway (--accept-lost-state)");
    }
    let registry = match o.replay_store {
        ReplayStore::Sqlite => open_store(dir, &REPLAY, o.accept, now, |p| {
            ReplayRegistry::open_sqlite(p, bounds.replay_capacity, replay::WINDOW_SECS, now)
        })?,
        ReplayStore::Memory => ReplayRegistry::memory(bounds.replay_capacity, replay::WINDOW_SECS),
    }
    .with_source_share(bounds.replay_share_percent);
    let inbox = open_store(dir, &INBOX, o.accept, now, |p| {
        Inbox::open_with_limits(p, bounds.inbox_max_items, bounds.inbox_max_bytes)
    })?;
    stores::record(dir, opening).map_err(stores::LostState::File)?;
    Ok((registry, inbox))
}

/// What a store's file holds, and what starting without it loses.
#[derive(Debug)]
pub(super) struct StoreFile {
    name: &'static str,
    holds: &'static str,
    loss: &'static str,
}

const REPLAY: StoreFile = StoreFile {
    name: REPLAY_DB,
    holds: "the layers this node relayed, so that none runs twice",
    loss: "a layer it relayed before may then be relayed once more",
};

const INBOX: StoreFile = StoreFile {
    name: INBOX_DB,
    holds: "the messages delivered to this node",
    loss: "the messages in it are gone",
};

impl StoreFile {
    /// The refusal of `file`, which cannot be used because of `why`.
    fn damaged(&self, file: &Path, why: String) -> RunError {
        RunError::Damaged {
            file: file.display().to_string(),
            why,
            holds: self.holds,
            loss: self.loss,
        }
    }
}

/// The store `store` of `state_dir`, opened by `open`. A file that cannot be used is refused
/// with its name and the remedy; with `accept` (`--accept-lost-state`) it is set aside as
/// `<name>.damaged-<now>` (its write-ahead log with it) and the store starts empty, said at
/// `warn`.
pub(super) fn open_store<T, E: std::fmt::Display>(
    state_dir: &Path,
    store: &StoreFile,
    accept: bool,
    now: u64,
    open: impl Fn(&Path) -> Result<T, E>,
) -> Result<T, RunError> {
    let path = state_dir.join(store.name);
    let why = match open(&path) {
        Ok(opened) => return Ok(opened),
        Err(e) => e.to_string(),
    };
    if !accept {
        return Err(store.damaged(&path, why));
    }
    let aside = state_dir.join(format!("{}.damaged-{now}", store.name));
    for suffix in ["", "-wal", "-shm"] {
        let from = state_dir.join(format!("{}{suffix}", store.name));
        if from.exists() {
            let to = aside.with_file_name(format!("{}.damaged-{now}{suffix}", store.name));
            std::fs::rename(&from, &to).map_err(|e| {
                store.damaged(&path, format!("{why}; and it cannot be set aside: {e}"))
            })?;
        }
    }
    warn!(
        "{} cannot be used ({why}); set aside as {}, starting on an empty one \
         (--accept-lost-state): {}",
        path.display(),
        aside.display(),
        store.loss
    );
    open(&path).map_err(|e| store.damaged(&path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn corrupt(dir: &Path, name: &str) {
        std::fs::write(dir.join(name), vec![0xA5; 4096]).unwrap();
    }

    fn inbox(dir: &Path, accept: bool) -> Result<Inbox, RunError> {
        open_store(dir, &INBOX, accept, NOW, |p| {
            Inbox::open_with_limits(p, 10, 1 << 20)
        })
    }

    #[test]
    fn a_corrupt_store_is_refused_with_its_file_and_the_remedy() {
        let dir = tempfile::tempdir().unwrap();
        corrupt(dir.path(), INBOX_DB);
        let err = inbox(dir.path(), false).unwrap_err().to_string();
        assert!(
            err.contains(&dir.path().join(INBOX_DB).display().to_string()),
            "{err}"
        );
        assert!(
            err.contains("--accept-lost-state") && err.contains(INBOX.holds),
            "{err}"
        );
        assert!(dir.path().join(INBOX_DB).exists(), "left where it was");
    }

    #[test]
    fn a_corrupt_store_accepted_is_set_aside_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        corrupt(dir.path(), INBOX_DB);
        let opened = inbox(dir.path(), true).unwrap();
        assert_eq!(opened.len(), 0);
        let aside = dir.path().join(format!("{INBOX_DB}.damaged-{NOW}"));
        assert_eq!(std::fs::read(&aside).unwrap(), vec![0xA5; 4096]);
    }

    #[test]
    fn a_store_set_aside_takes_its_write_ahead_log_with_it() {
        let dir = tempfile::tempdir().unwrap();
        corrupt(dir.path(), REPLAY_DB);
        std::fs::write(dir.path().join(format!("{REPLAY_DB}-wal")), b"log").unwrap();
        let tries = std::cell::Cell::new(0);
        let opened = open_store(dir.path(), &REPLAY, true, NOW, |p| {
            tries.set(tries.get() + 1);
            if tries.get() == 1 {
                Err("damaged")
            } else {
                Ok(p.exists())
            }
        });
        assert!(!opened.unwrap(), "opened where nothing is left");
        let log = dir.path().join(format!("{REPLAY_DB}.damaged-{NOW}-wal"));
        assert_eq!(std::fs::read(log).unwrap(), b"log");
    }

    #[test]
    fn a_store_that_cannot_be_set_aside_is_refused_with_both_reasons() {
        let dir = tempfile::tempdir().unwrap();
        corrupt(dir.path(), REPLAY_DB);
        // Where it would go is taken by a directory that is not empty: the rename fails.
        let taken = dir.path().join(format!("{REPLAY_DB}.damaged-{NOW}"));
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("x"), b"x").unwrap();
        let err = open_store(dir.path(), &REPLAY, true, NOW, |p| {
            ReplayRegistry::open_sqlite(p, 8, replay::WINDOW_SECS, NOW)
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot be set aside"), "{err}");
        assert!(
            err.contains(REPLAY_DB) && err.contains(REPLAY.loss),
            "{err}"
        );
    }

    #[test]
    fn a_store_that_fails_again_after_being_set_aside_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        corrupt(dir.path(), INBOX_DB);
        let err = open_store(dir.path(), &INBOX, true, NOW, |_| Err::<(), _>("locked"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("locked") && err.contains(INBOX_DB), "{err}");
    }

    #[test]
    fn a_state_dir_that_cannot_be_written_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_writable(dir.path()).is_ok());
        let gone = dir.path().join("gone");
        let err = check_writable(&gone).unwrap_err().to_string();
        assert!(err.contains("cannot be written"), "{err}");
    }
}
