//! The node's shared context: what the inbound pipeline and the outbound side (client sends,
//! probes) both use. Outbound code depends on this, never on the pipeline, so it runs and is
//! tested without a replay registry, an inbox or a listener.
//!
//! The crypto gate is the design's crypto admission budget: signature checks, onion layers and
//! receipt signing take a slot. Inbound requests may use all but one slot
//! (the pipeline's step 2); outbound work (route building, receipt checking) may use them
//! all, so it proceeds under an inbound burst. Nothing waits for a slot: no free slot is a
//! refusal. Disk work never holds a slot.

use std::sync::Arc;

use guard::admission::{Gate, Permit};

use crate::clock::Clock;
use crate::counters::Counters;
use crate::forward;
use crate::health::Health;
use crate::node::Node;
use crate::peers::Peers;

/// Crypto slots for a host with `threads` CPU threads: half of them rounded up, at least 4, at
/// most 8.
pub fn crypto_slots(threads: usize) -> usize {
    threads.div_ceil(2).clamp(4, 8)
}

/// Crypto slots for this host.
pub fn default_crypto_slots() -> usize {
    crypto_slots(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// What the node's inbound and outbound work share, process-wide.
#[derive(Debug)]
pub struct Context {
    /// Identity and keys.
    pub node: Arc<Node>,
    /// Known peers.
    pub peers: Arc<Peers>,
    /// Time.
    pub clock: Clock,
    /// Aggregate counters.
    pub counters: Counters,
    /// Per-peer health.
    pub health: Health,
    /// The crypto slots, shared by inbound and outbound work.
    pub crypto: Gate,
    /// The HTTP client for next hops and descriptor fetches.
    pub http: reqwest::Client,
}

impl Context {
    /// A context with `crypto_slots` slots in all.
    pub fn new(node: Arc<Node>, peers: Arc<Peers>, clock: Clock, crypto_slots: usize) -> Self {
        Context {
            node,
            peers,
            clock,
            counters: Counters::default(),
            health: Health::default(),
            crypto: Gate::new(crypto_slots),
            http: forward::client(),
        }
    }
}

/// Runs CPU-heavy crypto `work` on a blocking thread (off the async reactor) while holding
/// `slot`, which is given back as soon as the work is done. `None` if the work panicked.
pub async fn on_crypto_slot<T: Send + 'static>(
    slot: Permit,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(move || {
        let out = work();
        drop(slot);
        out
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_slots_follow_the_design() {
        assert_eq!(crypto_slots(1), 4);
        assert_eq!(crypto_slots(2), 4);
        assert_eq!(crypto_slots(12), 6);
        assert_eq!(crypto_slots(64), 8);
    }

    #[tokio::test]
    async fn the_slot_is_held_only_while_the_work_runs() {
        let gate = Gate::new(1);
        let slot = gate.try_acquire().unwrap();
        let g = gate.clone();
        let seen = on_crypto_slot(slot, move || g.in_use()).await;
        assert_eq!(seen, Some(1));
        assert_eq!(gate.in_use(), 0);
        let slot = gate.try_acquire().unwrap();
        assert_eq!(on_crypto_slot(slot, || panic!("boom")).await, None::<()>);
        assert_eq!(gate.in_use(), 0, "given back after a panic too");
    }
}
