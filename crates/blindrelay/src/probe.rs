//! Synthetic probes: evidence that the node reaches its peers through the real relay path,
//! kept apart from user traffic.
//!
//! - **Single-hop probe**: a one-hop route to a peer, whose terminal layer carries a probe
//!   payload. The peer answers like any terminal (a signed receipt sealed to this node) but
//!   stores nothing and counts it as `probes_answered`, not as user traffic.
//! - **Two-hop probe**: the same through a middle peer to a terminal peer and back. Middle hops
//!   cannot tell a probe from a message.
//!
//! A probe succeeds only when its receipt opens and verifies. Its outcome moves only the probe
//! counters (`probe_*`, `two_hop_probe_*`) and the peer's route health, never `received`,
//! `terminal`, `forwarded` or `verified_client_onion_deliveries`.

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::pipeline::Relay;
use crate::proto::Prefix;
use crate::proto::onion::Hop;
use crate::send::SendError;

/// Start of every probe payload.
pub const PROBE_MAGIC: &[u8] = b"blindrelay/probe/v1";

/// True when a terminal payload is a probe.
pub fn is_probe(payload: &[u8]) -> bool {
    payload.starts_with(PROBE_MAGIC)
}

fn probe_payload() -> Vec<u8> {
    let mut p = PROBE_MAGIC.to_vec();
    p.extend_from_slice(&rand::random::<[u8; 16]>());
    p
}

/// How a probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// Receipt verified.
    Ok,
    /// Anything else.
    Failed,
    /// Not sent (no crypto slot, no route).
    Skipped,
}

/// Sends one probe along `path` (1 or 2 hops); `Ok` only on a verified receipt.
pub async fn probe_path(relay: &Arc<Relay>, path: &[Hop]) -> ProbeResult {
    match crate::send::deliver_along(relay, path.to_vec(), probe_payload()).await {
        Ok(_) => ProbeResult::Ok,
        Err(SendError::Backpressure | SendError::NotEnoughPeers(_) | SendError::NoHops) => {
            ProbeResult::Skipped
        }
        Err(_) => ProbeResult::Failed,
    }
}

/// One round: a single-hop probe of every routable peer, and one two-hop probe (a random middle
/// and terminal) when at least two peers are routable.
pub async fn round(relay: &Arc<Relay>) {
    let now = relay.clock.unix();
    let mut peers = relay.peers.routable(now);
    let c = &relay.counters;
    for d in &peers {
        c.probe_attempted.inc();
        c.last_probe_at.set(now);
        let hop = Hop {
            node_id: d.node_id,
            onion_key: d.onion_key,
        };
        match probe_path(relay, std::slice::from_ref(&hop)).await {
            ProbeResult::Ok => {
                c.probe_succeeded.inc();
                c.last_probe_succeeded_at.set(relay.clock.unix());
            }
            _ => {
                c.probe_failed.inc();
                c.last_probe_failed_at.set(relay.clock.unix());
                debug!(peer = %Prefix(&d.node_id), "probe failed");
            }
        }
    }
    if peers.len() >= 2 {
        peers.shuffle(&mut rand::rng());
        let path: Vec<Hop> = peers[..2]
            .iter()
            .map(|d| Hop {
                node_id: d.node_id,
                onion_key: d.onion_key,
            })
            .collect();
        c.two_hop_probe_attempted.inc();
        c.last_two_hop_probe_at.set(now);
        match probe_path(relay, &path).await {
            ProbeResult::Ok => {
                c.two_hop_probe_succeeded.inc();
                c.last_two_hop_probe_succeeded_at.set(relay.clock.unix());
            }
            _ => {
                c.two_hop_probe_failed.inc();
                c.last_two_hop_probe_failed_at.set(relay.clock.unix());
                debug!("two-hop probe failed");
            }
        }
    }
}

/// Probes every `interval` until `cancel` (no probes when `interval` is zero).
pub async fn run(relay: Arc<Relay>, interval: Duration, cancel: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        round(&relay).await;
    }
}
