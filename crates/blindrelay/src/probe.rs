//! Synthetic probes: evidence that the node reaches its peers through the real relay path,
//! kept apart from user traffic.
//!
//! - **Single-hop probe**: a one-hop route to a peer, whose terminal slot carries the probe
//!   flag (authenticated inside the layer; the payload is empty). The packet is of the 2 KiB
//!   class, the class of most messages, so its size tells nothing. The peer answers like any
//!   terminal (a signed receipt sealed to this node) but stores nothing and counts it as
//!   `probes_answered`, not as user traffic.
//! - **Two-hop probe**: the same through a middle peer to a terminal peer and back. Middle hops
//!   cannot tell a probe from a message of the same class.
//!
//! A probe succeeds only when its receipt opens and verifies. Its outcome moves only the probe
//! counters (`probe_*`, `two_hop_probe_*`) and the peer's route health, never `received`,
//! `terminal`, `forwarded` or `verified_client_onion_deliveries`.
//!
//! Depends on the shared [`Context`] and the sender's route delivery only.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::context::Context;
use crate::proto::Prefix;
use crate::proto::descriptor::Descriptor;
use crate::send::{Hop, deliver_along, hop};

/// Time between probe rounds unless told otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);

/// Sends one probe along `path` (1 or 2 hops): true only on a verified receipt.
async fn probe_path(ctx: &Context, path: Vec<Hop>) -> bool {
    deliver_along(ctx, path, Vec::new(), true).await.is_ok()
}

/// The two-hop probe's path: a random middle and a random terminal, when at least two peers are
/// routable.
fn two_hop_path(mut peers: Vec<Descriptor>, rng: &mut impl Rng) -> Option<Vec<Hop>> {
    if peers.len() < 2 {
        return None;
    }
    peers.shuffle(rng);
    Some(peers[..2].iter().map(hop).collect())
}

/// One round: a single-hop probe of every routable peer, and one two-hop probe (a random middle
/// and terminal) when at least two peers are routable.
pub async fn round(ctx: &Context) {
    let now = ctx.clock.unix();
    let peers = ctx.peers.routable(now);
    let c = &ctx.counters;
    for d in &peers {
        c.probe_attempted.inc();
        c.last_probe_at.set(now);
        if probe_path(ctx, vec![hop(d)]).await {
            c.probe_succeeded.inc();
            c.last_probe_succeeded_at.set(ctx.clock.unix());
        } else {
            c.probe_failed.inc();
            c.last_probe_failed_at.set(ctx.clock.unix());
            debug!(peer = %Prefix(&d.node_id), "probe failed");
        }
    }
    let Some(path) = two_hop_path(peers, &mut rand::rng()) else {
        return;
    };
    c.two_hop_probe_attempted.inc();
    c.last_two_hop_probe_at.set(now);
    if probe_path(ctx, path).await {
        c.two_hop_probe_succeeded.inc();
        c.last_two_hop_probe_succeeded_at.set(ctx.clock.unix());
    } else {
        c.two_hop_probe_failed.inc();
        c.last_two_hop_probe_failed_at.set(ctx.clock.unix());
        debug!("two-hop probe failed");
    }
}

/// Probes every `interval` until `cancel` (no probes when `interval` is zero).
pub async fn run(ctx: Arc<Context>, interval: Duration, cancel: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        round(&ctx).await;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn descriptor(seed: u8) -> Descriptor {
        crate::proto::descriptor::for_test([seed; 32], "https://127.0.0.1:7001", 0)
    }

    #[test]
    fn the_two_hop_path_takes_two_distinct_peers() {
        let mut rng = StdRng::seed_from_u64(1);
        assert!(two_hop_path(vec![], &mut rng).is_none());
        assert!(two_hop_path(vec![descriptor(1)], &mut rng).is_none());
        let peers: Vec<_> = (1..=5).map(descriptor).collect();
        for _ in 0..20 {
            let path = two_hop_path(peers.clone(), &mut rng).unwrap();
            assert_eq!(path.len(), 2);
            assert_ne!(path[0].node_id, path[1].node_id);
            assert!(path.iter().all(|h| peers.iter().any(|d| hop(d) == *h)));
        }
    }
}
