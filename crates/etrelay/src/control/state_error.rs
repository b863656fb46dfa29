//! The answer to a write of the state dir that failed: 507 `state_disk_full` when the file
//! system is full (or over quota), else 500 `state_write_failed`, with the OS's reason (never
//! a path). Nothing changed in either case (the registry writes before it changes memory).

use guard::statefile::StateFileError;

use super::ControlError;
use crate::bans::store::StoreError;
use crate::registry::RegistryError;

/// ENOSPC and EDQUOT.
const DISK_FULL_ERRNOS: [i32; 2] = [28, 122];

/// Why the write failed, as the caller sees it: (disk full, reason).
fn reason(e: &RegistryError) -> Option<(bool, String)> {
    let io = |source: &std::io::Error| {
        let full = source
            .raw_os_error()
            .is_some_and(|n| DISK_FULL_ERRNOS.contains(&n));
        (full, source.to_string())
    };
    match e {
        RegistryError::State(StateFileError::Io { source, .. })
        | RegistryError::Store(StoreError::Io { source, .. })
        | RegistryError::Store(StoreError::Legacy(StateFileError::Io { source, .. })) => {
            Some(io(source))
        }
        RegistryError::Store(StoreError::Db { source, .. }) => {
            let full = source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
            Some((full, source.to_string()))
        }
        RegistryError::State(_) | RegistryError::Store(_) => None,
        _ => None,
    }
}

/// The API error for a failed write of the state dir.
pub(super) fn control_error(e: &RegistryError) -> ControlError {
    match reason(e) {
        Some((true, why)) => ControlError::StateDiskFull(why),
        Some((false, why)) => ControlError::StateWriteFailed(Some(why)),
        None => ControlError::StateWriteFailed(None),
    }
}
