//! The task that keeps the proven sources (`super::proven`) on disk: once a
//! [`SAVE_EVERY`] it forgets the expired ones and, when the set changed, writes it (off the
//! reactor, atomically); once more when the server stops. A failed write is logged at most once
//! a minute and tried again at the next turn: nothing is lost but what a crash before it
//! would lose (at most one minute of new proven sources).

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use super::proven;
use super::shared::Shared;
use crate::clock::{unix, wall_now};

/// How often the set is looked at.
pub(super) const SAVE_EVERY: Duration = Duration::from_secs(60);

/// Runs until the server is stopped, then writes the set a last time.
pub(super) async fn run(shared: Arc<Shared>) {
    let Some(path) = shared.config.proven_file.clone() else {
        // Kept in memory only: still pruned.
        loop {
            tokio::select! {
                () = shared.cancel.cancelled() => return,
                () = tokio::time::sleep(SAVE_EVERY) => prune(&shared),
            }
        }
    };
    let path = Arc::new(path);
    loop {
        let stopping = tokio::select! {
            () = shared.cancel.cancelled() => true,
            () = tokio::time::sleep(SAVE_EVERY) => false,
        };
        prune(&shared);
        let changes = shared.lock().proven.take_changes();
        if let Some(entries) = changes {
            let p = Arc::clone(&path);
            let n = entries.len();
            let written = tokio::task::spawn_blocking(move || {
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                }
                proven::save(&p, &entries).map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            match written {
                Ok(()) => debug!(sources = n, path = %path.display(), "proven sources written"),
                Err(e) => {
                    // Written again at the next turn.
                    shared.lock().proven.mark_changed();
                    shared.metrics.state_write_failures.inc();
                    shared.throttled(|more| {
                        warn!(error = %e, not_logged = more, "proven sources not written");
                    });
                }
            }
        }
        if stopping {
            return;
        }
    }
}

fn prune(shared: &Shared) {
    let mut st = shared.lock();
    st.proven.prune(unix(wall_now()));
    shared.metrics.proven_sources.set(st.proven.len() as u64);
}
