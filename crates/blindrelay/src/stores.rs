//! Which durable stores a state dir holds, so a node that has run before never starts silently
//! on lost state.
//!
//! `blindrelay init` writes `stores.json` with no store in it; every start records the SQLite
//! files it opened (`replay.db`, `inbox.db`). Before opening them, a start checks every file
//! recorded there: one that is missing or empty (0 bytes) was lost — deleted, truncated, a
//! restore that left it out — and starting on an empty one would let earlier routes run again
//! (a lost `replay.db`) or drop delivered messages without a word (a lost `inbox.db`). The
//! node then refuses to start with an error naming the file, unless the operator says so
//! (`--accept-lost-state`): then it starts on an empty store, logging a warning per lost file
//! (and removing the lost file's stale `-wal` and `-shm`, which belong to the lost database). A state dir with
//! an identity but no `stores.json` (lost too, or made by an older version) is treated alike.
//!
//! Both stores checkpoint their write-ahead log when opened (`sqlite::open_durable`'s callers),
//! so a store that has been opened once is never 0 bytes on disk, whatever happens to its
//! `-wal` file after.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use guard::statefile::{self, StateFileError};
use serde::{Deserialize, Serialize};

/// The record's file name in the state dir.
pub const FILE: &str = "stores.json";

/// What `stores.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The store files (names in the state dir) the node has opened.
    stores: BTreeSet<String>,
}

/// Why the state dir's stores cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum LostState {
    /// A store the node opened before is missing or empty.
    #[error(
        "{} is {what}, but this node has run with it before: starting on an empty one would let \
         earlier routes run again or lose delivered messages without a word. Restore it, or \
         start with --accept-lost-state to accept the loss",
        path.display()
    )]
    Lost {
        /// The store's file.
        path: PathBuf,
        /// "missing" or "empty (0 bytes)".
        what: &'static str,
    },
    /// The state dir has an identity but no record of its stores.
    #[error(
        "{} is missing, but {} holds a node identity: its stores may have been lost (or it \
         was made by an older version). Start with --accept-lost-state to accept what is there",
        path.display(),
        dir.display()
    )]
    NoRecord {
        /// The record's path.
        path: PathBuf,
        /// The state dir.
        dir: PathBuf,
    },
    /// The record cannot be read or written.
    #[error(transparent)]
    File(#[from] StateFileError),
}

/// Writes an empty record: a fresh state dir (`blindrelay init`).
///
/// # Errors
/// The file cannot be written.
pub fn init(dir: &Path) -> Result<(), StateFileError> {
    statefile::save_json(&dir.join(FILE), &Record::default())
}

/// Checks the stores about to be opened (`opening`, file names in `dir`) that the record says
/// were opened before. With `accept`, a loss is returned instead of refused: the caller logs
/// it. Returns the lost files.
///
/// # Errors
/// [`LostState`] for the first lost store (without `accept`), or a record that cannot be read.
pub fn check(dir: &Path, opening: &[&str], accept: bool) -> Result<Vec<LostState>, LostState> {
    let path = dir.join(FILE);
    let Some(record) = statefile::load_json::<Record>(&path)? else {
        let lost = LostState::NoRecord {
            path,
            dir: dir.to_owned(),
        };
        return if accept { Ok(vec![lost]) } else { Err(lost) };
    };
    let mut lost = Vec::new();
    for name in opening.iter().filter(|n| record.stores.contains(**n)) {
        let file = dir.join(name);
        let what = match std::fs::metadata(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing",
            Ok(m) if m.len() == 0 => "empty (0 bytes)",
            _ => continue,
        };
        if !accept {
            return Err(LostState::Lost { path: file, what });
        }
        // The write-ahead log of a lost file belongs to a database that is gone: SQLite must
        // not replay it into the new, empty one.
        for suffix in ["-wal", "-shm"] {
            let mut side = file.clone().into_os_string();
            side.push(suffix);
            let _ = std::fs::remove_file(side);
        }
        lost.push(LostState::Lost { path: file, what });
    }
    Ok(lost)
}

/// Records that the node opened `opened` (file names in `dir`), keeping what was recorded.
///
/// # Errors
/// The record cannot be read or written.
pub fn record(dir: &Path, opened: &[&str]) -> Result<(), StateFileError> {
    let path = dir.join(FILE);
    let mut record = statefile::load_json::<Record>(&path)?.unwrap_or_default();
    let before = record.stores.len();
    record.stores.extend(opened.iter().map(|s| s.to_string()));
    if record.stores.len() != before || !path.exists() {
        statefile::save_json(&path, &record)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: &[&str] = &["replay.db", "inbox.db"];

    #[test]
    fn fresh_dirs_start_and_lost_stores_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(matches!(
            check(d, BOTH, false),
            Err(LostState::NoRecord { .. })
        ));
        init(d).unwrap();
        assert!(check(d, BOTH, false).unwrap().is_empty());
        std::fs::write(d.join("replay.db"), b"SQLite format 3\0").unwrap();
        std::fs::write(d.join("inbox.db"), b"SQLite format 3\0").unwrap();
        record(d, &["replay.db", "inbox.db"]).unwrap();
        assert!(check(d, BOTH, false).unwrap().is_empty());
        std::fs::write(d.join("inbox.db"), b"").unwrap();
        let e = check(d, BOTH, false).unwrap_err().to_string();
        assert!(e.contains("inbox.db") && e.contains("empty"), "{e}");
        std::fs::remove_file(d.join("replay.db")).unwrap();
        let lost = check(d, BOTH, true).unwrap();
        assert_eq!(lost.len(), 2);
        assert!(lost[0].to_string().contains("replay.db is missing"));
        assert!(lost[1].to_string().contains("inbox.db is empty"));
        // A node that runs with the memory replay store does not look at `replay.db`.
        assert_eq!(check(d, &["inbox.db"], true).unwrap().len(), 1);
        // A store never opened before is not lost.
        std::fs::write(d.join("inbox.db"), b"SQLite format 3\0").unwrap();
        record(d, &["inbox.db"]).unwrap();
        assert!(
            check(d, &["inbox.db", "other.db"], false)
                .unwrap()
                .is_empty()
        );
    }
}
