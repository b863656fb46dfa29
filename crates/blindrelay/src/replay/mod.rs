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
//! Every call here may block (it may wait for the disk): run it off the async reactor and off
//! the crypto slots (`tokio::task::spawn_blocking`). Time is always passed in as Unix seconds;
//! nothing here reads the clock. Nothing here logs a replay tag, a digest or a payload.

mod registry;

pub use registry::{
    CAPACITY, Digest, INTERRUPTED_BODY, INTERRUPTED_STATUS, MAX_BATCH_BYTES, MAX_BATCH_WRITES,
    Outcome, RESPONSE_MAX_AGE_SECS, ReplayRegistry, RouteId, StoredResponse, WINDOW_SECS,
};

use crate::sqlite::StoreError;

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
