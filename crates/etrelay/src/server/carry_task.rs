//! The task that keeps the translated sessions on disk (`super::carry`): every
//! [`SAVE_EVERY`] while they changed, and once more when the server stops, taken before its
//! sessions end.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{debug, warn};

use super::carry::{Carried, SAVE_EVERY, collect, save};
use super::shared::Shared;
use crate::clock::{unix, wall_now};

/// Runs until the server stops: writes the translated sessions when they changed, every
/// [`SAVE_EVERY`]. The last write is [`at_stop`]'s.
pub(super) async fn run(shared: Arc<Shared>, path: PathBuf) {
    // What was written last, without the dates.
    let mut written: Vec<Carried> = Vec::new();
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(SAVE_EVERY) => {}
        }
        let entries = collect(&shared.lock().sessions, unix(wall_now()));
        let undated: Vec<Carried> = entries.iter().map(|c| Carried { at: 0, ..*c }).collect();
        if undated != written && write(&shared, &path, entries).await {
            written = undated;
        }
    }
}

/// The server stops: its translated sessions written a last time, taken before they end.
pub(super) async fn at_stop(shared: &Shared, path: &Path) {
    let entries = collect(&shared.lock().sessions, unix(wall_now()));
    write(shared, path, entries).await;
}

/// Writes `entries` off the reactor; a failure is counted and logged (at most once a minute).
async fn write(shared: &Shared, path: &Path, entries: Vec<Carried>) -> bool {
    let n = entries.len();
    let p = path.to_path_buf();
    let r = tokio::task::spawn_blocking(move || save(&p, &entries))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    match r {
        Ok(()) => {
            debug!(sessions = n, path = %path.display(), "sessions to carry over written");
            true
        }
        Err(e) => {
            shared.metrics.state_write_failures.inc();
            shared.throttled(|more| {
                warn!(error = %e, not_logged = more, "sessions to carry over not written");
            });
            false
        }
    }
}
