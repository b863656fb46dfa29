//! Layer replay protection: every onion layer a hop peels carries a 16-byte **replay tag**
//! (derived from the hop's shared secret for that layer: the same whatever frame carries it).
//! The registry reserves the tag for the request digest (SHA-256(`blindrelay/request/v3` ‖
//! previous hop ‖ version ‖ class ‖ alpha ‖ gamma), `Frame::request_digest`: the same previous
//! hop sending the same packet again has the same digest; see `docs/blindrelay-protocol.md`),
//! through the later of [`WINDOW_SECS`] from now and the last second the layer is accepted (its
//! sealed expiry + 120 s, [`ReplayRegistry::reserve_through`]), and remembers the final
//! response. A tag met again gets one of the outcomes of the design's table ([`Outcome`]): the
//! same request is a duplicate (its stored answer) or in flight, another frame carrying the
//! same layer (a re-wrap) is a conflict, and nothing is ever forwarded or delivered twice. It
//! keeps its state in SQLite (it survives restarts and kill -9) or, with the same rules, in
//! memory only ([`ReplayStore`]).
//!
//! Every call here but [`ReplayRegistry::complete`] may block (it may wait for the disk): run
//! it off the async reactor and off the crypto slots (`tokio::task::spawn_blocking`). Time is always passed in as Unix seconds;
//! nothing here reads the clock. Nothing here logs a replay tag, a digest or a payload.

mod registry;

pub use registry::{
    ANSWER_FLUSH, CAPACITY, Digest, INTERRUPTED_BODY, INTERRUPTED_STATUS, MAX_BATCH_WRITES,
    Outcome, RESPONSE_MAX_AGE_SECS, ReplayRegistry, ReplayTag, StoredResponse, WINDOW_SECS,
};

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::sqlite::StoreError;

/// Writes the stored responses that no reservation carried to disk ([`ReplayRegistry::flush`])
/// each [`ANSWER_FLUSH`], until `cancel`; then once more.
pub async fn write_answers(registry: Arc<ReplayRegistry>, cancel: CancellationToken) {
    loop {
        let stop = tokio::select! {
            () = cancel.cancelled() => true,
            () = tokio::time::sleep(ANSWER_FLUSH) => false,
        };
        if registry.unwritten() > 0 {
            let r = Arc::clone(&registry);
            // A failure is logged by the registry; what it carried waits for the next batch.
            let _ = tokio::task::spawn_blocking(move || r.flush()).await;
        }
        if stop {
            return;
        }
    }
}

/// Where the registry keeps its state.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ReplayStore {
    /// SQLite in the state dir: survives restarts.
    Sqlite,
    /// Memory, same capacity and window: lost on restart.
    Memory,
}

/// Everything that can go wrong in the replay registry.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The SQLite file.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `complete` was called for a route that has no reservation in flight for this request:
    /// never reserved, already completed, reserved for another digest, or its window has ended.
    #[error("no reservation in flight for this route and request")]
    NotInFlight,
    /// The group commit this write was part of failed: every write of the batch failed with it
    /// and none of them is reported as done.
    #[error("group commit failed: {0}")]
    GroupCommit(std::sync::Arc<ReplayError>),
    /// The thread committing a batch panicked; the batch is rolled back and failed.
    #[error("the group commit panicked")]
    CommitPanicked,
}
