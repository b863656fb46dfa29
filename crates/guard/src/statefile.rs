//! JSON state files written atomically.
//!
//! [`save_json`] writes the new version to a temporary file in the same directory, fsyncs it,
//! renames it over the old one and fsyncs the directory. A crash (kill -9, power loss) at any
//! moment leaves either the previous version or the new one under the final name, never a
//! truncated file. [`load_json`] reads it back; a missing file is `Ok(None)`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file is not the JSON we wrote.
    #[error("{path}: not a valid state file: {source}")]
    Parse {
        /// The file concerned.
        path: PathBuf,
        /// The parser's complaint.
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateFileError + '_ {
    move |source| StateFileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically (see the module docs).
///
/// # Errors
/// Any I/O error, with the path it concerns. On error the previous file is untouched and the
/// temporary file is removed when possible.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    write_atomic_mode(path, bytes, 0o644)
}

/// As [`write_atomic`], for a secret: the file is created with mode 0600.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_atomic_private(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    write_atomic_mode(path, bytes, 0o600)
}

/// Creates `path`, which must not exist, readable by its owner only, writes `bytes` to it and
/// makes both the contents and the new directory entry durable. For secrets written once (a key)
/// and for files whose permissions later files inherit (SQLite's `-wal` and `-shm` take the
/// database's).
///
/// # Errors
/// `AlreadyExists` when `path` exists (nothing is written), or any other I/O error. A directory
/// that cannot be synced (some file systems) is not an error: the file itself is synced.
pub fn create_new_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create_new_synced(path, bytes, 0o600)?;
    let _ = File::open(parent_dir(path)).and_then(|d| d.sync_all());
    Ok(())
}

/// Creates `path` (which must not exist) with `mode`, writes `bytes` and fsyncs it.
fn create_new_synced(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateFileError> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let _ = fs::remove_file(&tmp);
        create_new_synced(&tmp, bytes, mode).map_err(io_err(&tmp))?;
        fs::rename(&tmp, path).map_err(io_err(path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Serializes `value` as pretty JSON and writes it with [`write_atomic`].
///
/// # Errors
/// As [`write_atomic`].
pub fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| StateFileError::Parse {
        path: path.to_owned(),
        source,
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Reads `path` as JSON; `Ok(None)` when it does not exist.
///
/// # Errors
/// An I/O error other than "not found", or a file that does not parse.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateFileError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| StateFileError::Parse {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert!(load_json::<BTreeMap<String, u32>>(&path).unwrap().is_none());
        let mut m = BTreeMap::new();
        m.insert("a".to_string(), 1u32);
        save_json(&path, &m).unwrap();
        m.insert("b".to_string(), 2);
        save_json(&path, &m).unwrap();
        assert_eq!(load_json::<BTreeMap<String, u32>>(&path).unwrap(), Some(m));
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn private_files_are_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic_private(&path, b"k").unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn create_new_private_never_overwrites() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        create_new_private(&path, b"first\n").unwrap();
        let err = create_new_private(&path, b"second\n").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&path).unwrap(), b"first\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        fs::write(&path, b"{\"a\":").unwrap();
        assert!(matches!(
            load_json::<BTreeMap<String, u32>>(&path),
            Err(StateFileError::Parse { .. })
        ));
    }

    #[test]
    fn failed_write_keeps_old_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        save_json(&path, &1u32).unwrap();
        // Renaming onto a directory fails: the old file must stay as it was.
        let bad = dir.path().join("sub");
        fs::create_dir(&bad).unwrap();
        fs::write(bad.join("x"), b"x").unwrap();
        assert!(write_atomic(&bad, b"2").is_err());
        assert_eq!(load_json::<u32>(&path).unwrap(), Some(1));
    }
}
