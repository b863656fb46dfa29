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
//! - **Recovery probes** ([`recover`]), every [`RECOVERY_ROUND`]: a single-hop probe of each
//!   peer this node met failing itself (as the entry hop of a route, or in a probe), once its
//!   recovery wait is over ([`crate::health::Health::recovery_due`]: 5 s after the first
//!   failure, doubling to 5 min). At most [`RECOVERY_PER_ROUND`] a round, each within
//!   [`RECOVERY_DEADLINE`]. A hop whose failure this node only heard of in a route's report
//!   (it may be the send's terminal) is never probed for it: it is usable again once the wait
//!   is over. Identities never reached are probed by discovery (`crate::discovery::probes`).
//! - **Rounds** ([`run`]), every `--probe-interval`: single-hop probes of at most
//!   [`ROUND_SAMPLE`] routable peers at random, and one two-hop probe.
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
/// Time between recovery rounds.
pub const RECOVERY_ROUND: Duration = Duration::from_secs(1);
/// Peers a recovery round probes at most.
pub const RECOVERY_PER_ROUND: usize = 4;
/// How long a recovery probe may take.
pub const RECOVERY_DEADLINE: Duration = Duration::from_secs(5);
/// Routable peers a round probes at most (drawn at random).
pub const ROUND_SAMPLE: usize = 16;

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

/// One round: a single-hop probe of up to [`ROUND_SAMPLE`] routable peers at random, and one
/// two-hop probe (a random middle and terminal) when at least two peers are routable.
pub async fn round(ctx: &Context) {
    let now = ctx.clock.unix();
    let mut peers = ctx.peers.routable(now);
    peers.shuffle(&mut rand::rng());
    peers.truncate(ROUND_SAMPLE);
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

/// The peers a recovery round probes at `now` (see the module docs): at most
/// [`RECOVERY_PER_ROUND`], at random.
fn recovery_due(ctx: &Context, now: u64, rng: &mut impl Rng) -> Vec<Descriptor> {
    let mut due: Vec<Descriptor> = ctx
        .peers
        .candidates(now)
        .into_iter()
        .filter(|c| ctx.health.recovery_due(&c.s.d.node_id, now))
        .map(|c| c.s.d.clone())
        .collect();
    due.shuffle(rng);
    due.truncate(RECOVERY_PER_ROUND);
    due
}

/// One recovery round: the due peers probed together; how many answered.
pub async fn recovery_round(ctx: &Arc<Context>) -> usize {
    let due = recovery_due(ctx, ctx.clock.unix(), &mut rand::rng());
    let mut probes = tokio::task::JoinSet::new();
    for d in due {
        let ctx = Arc::clone(ctx);
        probes.spawn(async move { probe_one(&ctx, &d, RECOVERY_DEADLINE).await });
    }
    probes.join_all().await.into_iter().filter(|ok| *ok).count()
}

/// Recovery rounds every [`RECOVERY_ROUND`] until `cancel`.
pub async fn recover(ctx: Arc<Context>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(RECOVERY_ROUND) => {}
        }
        recovery_round(&ctx).await;
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
