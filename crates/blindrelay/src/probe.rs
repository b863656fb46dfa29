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
//! - **Reach probes** ([`reach`]), every [`REACH_ROUND`]: a single-hop probe of each peer route
//!   choice may not use yet: one this node has never reached at its endpoint (learned by
//!   gossip or read from the peer store, before any contact), and one that failed, once its
//!   recovery wait is over ([`crate::health::Health::recovery_due`]: 5 s after the first
//!   failure, doubling to 5 min). At most [`REACH_PER_ROUND`] a round, each within
//!   [`REACH_DEADLINE`], so a table full of identities whose endpoints answer nothing costs a
//!   few probes a second, and a dead peer fewer and fewer. A round runs at once when an
//!   identity this node has not reached is kept (at most one per [`REACH_GAP`]), so a newcomer
//!   is reached, and passed on by gossip, within moments.
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
/// Time between reach rounds.
pub const REACH_ROUND: Duration = Duration::from_secs(1);
/// Peers a reach round probes at most.
pub const REACH_PER_ROUND: usize = 4;
/// The shortest time between two reach rounds (a flood of newcomers costs at most
/// [`REACH_PER_ROUND`] probes per this gap).
pub const REACH_GAP: Duration = Duration::from_millis(250);
/// How long a reach probe may take.
pub const REACH_DEADLINE: Duration = Duration::from_secs(5);

/// Sends one probe along `path` (1 or 2 hops) within `within`: true only on a verified
/// receipt (the path's peers are then reached).
async fn probe_path(ctx: &Context, path: Vec<Hop>, within: Duration) -> bool {
    let deadline = ctx.clock.now() + within;
    let ids: Vec<_> = path.iter().map(|h| h.node_id).collect();
    let ok = deliver_along(ctx, path, &[], rand::random(), true, deadline)
        .await
        .is_ok();
    if ok {
        for id in &ids {
            ctx.peers.mark_reached(id);
        }
    }
    ok
}

/// One single-hop probe of `d`, counted.
async fn probe_one(ctx: &Context, d: &Descriptor, within: Duration) -> bool {
    let c = &ctx.counters;
    c.probe_attempted.inc();
    c.last_probe_at.set(ctx.clock.unix());
    let ok = probe_path(ctx, vec![hop(d)], within).await;
    if ok {
        c.probe_succeeded.inc();
        c.last_probe_succeeded_at.set(ctx.clock.unix());
    } else {
        c.probe_failed.inc();
        c.last_probe_failed_at.set(ctx.clock.unix());
        debug!(peer = %Prefix(&d.node_id), "probe failed");
    }
    ok
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
        probe_one(ctx, d, crate::forward::SENDER_DEADLINE).await;
    }
    let Some(path) = two_hop_path(peers, &mut rand::rng()) else {
        return;
    };
    c.two_hop_probe_attempted.inc();
    c.last_two_hop_probe_at.set(now);
    if probe_path(ctx, path, crate::forward::SENDER_DEADLINE).await {
        c.two_hop_probe_succeeded.inc();
        c.last_two_hop_probe_succeeded_at.set(ctx.clock.unix());
    } else {
        c.two_hop_probe_failed.inc();
        c.last_two_hop_probe_failed_at.set(ctx.clock.unix());
        debug!("two-hop probe failed");
    }
}

/// The peers a reach round probes at `now` (see the module docs): at most
/// [`REACH_PER_ROUND`], at random.
fn reach_due(ctx: &Context, now: u64, rng: &mut impl Rng) -> Vec<Descriptor> {
    let mut due: Vec<Descriptor> = ctx
        .peers
        .candidates(now)
        .into_iter()
        .filter(|c| {
            let failing_due = ctx.health.recovery_due(&c.d.node_id, now);
            // A --peer's own URL is fetched (and so reached) by the peer table itself.
            let untried = !c.reached
                && ctx.health.usable(&c.d.node_id, now)
                && !ctx.peers.is_pinned(&c.d.node_id);
            failing_due || untried
        })
        .map(|c| c.d)
        .collect();
    due.shuffle(rng);
    due.truncate(REACH_PER_ROUND);
    due
}

/// One reach round: the due peers probed together; how many answered.
pub async fn reach_round(ctx: &Arc<Context>) -> usize {
    let due = reach_due(ctx, ctx.clock.unix(), &mut rand::rng());
    let mut probes = tokio::task::JoinSet::new();
    for d in due {
        let ctx = Arc::clone(ctx);
        probes.spawn(async move { probe_one(&ctx, &d, REACH_DEADLINE).await });
    }
    probes.join_all().await.into_iter().filter(|ok| *ok).count()
}

/// Reach rounds every [`REACH_ROUND`], and as soon as an identity this node has not reached is
/// kept (at most one round per [`REACH_GAP`]), until `cancel`.
pub async fn reach(ctx: Arc<Context>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(REACH_ROUND) => {}
            () = ctx.peers.unreached_kept() => {}
        }
        reach_round(&ctx).await;
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(REACH_GAP) => {}
        }
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
