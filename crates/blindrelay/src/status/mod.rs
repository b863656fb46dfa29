//! What the operator sees: the status document (`GET /v1/status`, typed, read back by the
//! operator client) and the Prometheus text (`GET /metrics`). Rules: `docs/blindrelay-status.md`.
//!
//! - [`quality`]: the evidence, `status` and `proof_scope` rules over the counters;
//! - [`metrics`]: the Prometheus text;
//! - here: the document, assembled from the counters, the peer health summary, the guard's
//!   quarantines, the replay registry and the inbox. Each is read under its own lock, one at a
//!   time.

pub mod metrics;
pub mod quality;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use self::quality::{Evidence, ProofScope, Quality, Status};
use crate::counters::Snapshot;
use crate::health::Summary;
use crate::pipeline::Pipeline;
use crate::proto::Prefix;
use crate::replay::ReplayStore;

/// The replay registry, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayInfo {
    /// Where reservations are kept.
    pub store: ReplayStore,
    /// Routes reserved now.
    pub live_routes: usize,
}

/// The peer table, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeersInfo {
    /// Descriptors held, valid or not.
    pub known: usize,
    /// Peers with a current descriptor and an allowed endpoint.
    pub routable: usize,
}

/// The inbox, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxInfo {
    /// Items stored.
    pub items: usize,
}

/// The status document. The server fills `counters` with a [`Snapshot`]; a reader may take
/// them as a map of names to values (the operator client does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document<C = Snapshot> {
    /// The node's 8-hex prefix.
    pub node: String,
    /// Evidence, status, proof scope.
    pub quality: Quality,
    /// Every counter.
    pub counters: C,
    /// Per-peer health.
    pub peer_health: Summary,
    /// The replay registry.
    pub replay: ReplayInfo,
    /// Known peers.
    pub peers: PeersInfo,
    /// The inbox.
    pub inbox: InboxInfo,
}

/// The whole status document now. Reads the replay registry's and the inbox's in-memory state
/// (no disk read), but their locks may wait for a commit: call it off the async reactor.
pub fn document(pipeline: &Pipeline) -> Document {
    let ctx = pipeline.ctx();
    let now = ctx.clock.unix();
    let counters = ctx.counters.snapshot();
    let descriptors: HashMap<_, _> = ctx
        .peers
        .all()
        .into_iter()
        .map(|d| (d.node_id, d.expires_at))
        .collect();
    let quarantines = pipeline.hops().quarantines(ctx.clock.instant());
    let peer_health = ctx.health.summary(now, &descriptors, |id| {
        quarantines.get(id).copied().unwrap_or(0)
    });
    Document {
        node: Prefix(ctx.node.id()).to_string(),
        quality: quality::quality(&counters, now),
        counters,
        peer_health,
        replay: ReplayInfo {
            store: pipeline.replay().kind(),
            live_routes: pipeline.replay().live(now),
        },
        peers: PeersInfo {
            known: descriptors.len(),
            routable: ctx.peers.routable(now).len(),
        },
        inbox: InboxInfo {
            items: pipeline.terminal().inbox().len(),
        },
    }
}
