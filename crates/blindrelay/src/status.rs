//! What the operator sees: evidence quality, proof scope, counters, peer health, and the
//! Prometheus text. Rules: `docs/blindrelay-status.md`.
//!
//! The four kinds of evidence are kept apart: accepted opaque relay work, synthetic single-hop
//! probes, synthetic two-hop probes, and terminal-signed receipts of client deliveries this node
//! verified. `status` looks at **recent** events only (a window of [`RECENT`] seconds), so a
//! node that was attacked or overloaded returns to `ready` by itself once the trouble stops.

use std::collections::HashMap;

use guard::counters::{Kind, PromText};
use serde::Serialize;

use crate::counters::Snapshot;
use crate::pipeline::Relay;
use crate::proto::Prefix;

/// Evidence younger than this is fresh.
pub const FRESH: u64 = 1800;
/// Problems younger than this set `protecting`, `degraded` or `attention`.
pub const RECENT: u64 = 1800;

/// One kind of evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// How many, since start.
    pub total: u64,
    /// Last one (Unix seconds).
    pub last_at: Option<u64>,
    /// `last_at` within [`FRESH`].
    pub fresh: bool,
}

/// The quality summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quality {
    /// idle, observing, stale, ready, protecting, degraded, attention.
    pub status: &'static str,
    /// The strongest evidence ever observed.
    pub proof_scope: &'static str,
    /// A fresh client delivery receipt, verified by this node.
    pub real_relay_ready: bool,
    /// Why `status` is what it is.
    pub reason: &'static str,
    /// What the operator should do.
    pub next_action: &'static str,
    /// Accepted opaque relay work (terminal + forwarded).
    pub relay_acceptance: Evidence,
    /// Synthetic single-hop probes that succeeded.
    pub synthetic_probes: Evidence,
    /// Synthetic two-hop probes that succeeded.
    pub synthetic_two_hop_probes: Evidence,
    /// Client deliveries whose terminal receipt this node verified.
    pub client_delivery_receipts: Evidence,
}

fn within(t: Option<u64>, now: u64, window: u64) -> bool {
    t.is_some_and(|t| now.saturating_sub(t) < window)
}

fn evidence(total: u64, last_at: Option<u64>, now: u64) -> Evidence {
    Evidence {
        total,
        last_at,
        fresh: total > 0 && within(last_at, now, FRESH),
    }
}

/// The quality of a node from its counters at `now`. First match wins:
///
/// 1. `idle`: no request received, no probe sent, no client delivery.
/// 2. `attention`: a backpressure refusal or an exhausted retry within [`RECENT`].
/// 3. `degraded`: a forward failure or a failed probe within [`RECENT`].
/// 4. `protecting`: an abuse-guard refusal (rate, quarantine, authentication, loop, TTL,
///    timestamp) within [`RECENT`].
/// 5. `ready`: fresh evidence of any kind.
/// 6. `stale`: success evidence, none fresh.
/// 7. `observing`: activity without success evidence.
pub fn quality(s: &Snapshot, now: u64) -> Quality {
    let relay_acceptance = evidence(s.terminal + s.forwarded, s.last_accepted_at, now);
    let synthetic_probes = evidence(s.probe_succeeded, s.last_probe_succeeded_at, now);
    let synthetic_two_hop_probes = evidence(
        s.two_hop_probe_succeeded,
        s.last_two_hop_probe_succeeded_at,
        now,
    );
    let client_delivery_receipts = evidence(
        s.verified_client_onion_deliveries,
        s.last_verified_client_onion_delivery_at,
        now,
    );
    let recent = |t| within(t, now, RECENT);
    let any_fresh = relay_acceptance.fresh
        || synthetic_probes.fresh
        || synthetic_two_hop_probes.fresh
        || client_delivery_receipts.fresh;
    let any_success = relay_acceptance.total
        + synthetic_probes.total
        + synthetic_two_hop_probes.total
        + client_delivery_receipts.total
        > 0;
    let any_activity = s.received
        + s.probe_attempted
        + s.two_hop_probe_attempted
        + s.verified_client_onion_deliveries
        > 0;
    let (status, reason, next_action) = if !any_activity {
        (
            "idle",
            "no relay or probe activity yet",
            "add peers with --peer, or wait for relay traffic and probes",
        )
    } else if recent(s.last_backpressure_at) {
        (
            "attention",
            "backpressure: requests refused for lack of CPU slots or in-flight room",
            "give the node more CPU, or take less relay traffic",
        )
    } else if recent(s.last_retry_exhausted_at) {
        (
            "attention",
            "forwards failed after every retry",
            "check that the next hops are reachable (see peer_health)",
        )
    } else if recent(s.last_forward_failed_at)
        || recent(s.last_probe_failed_at)
        || recent(s.last_two_hop_probe_failed_at)
    {
        (
            "degraded",
            "forwards or probes failed recently",
            "look at the failing peers in peer_health",
        )
    } else if recent(s.last_protection_at) {
        (
            "protecting",
            "the abuse guard refused frames recently, the relay keeps working",
            "nothing to do unless it lasts: quarantined peers are in peer_health",
        )
    } else if any_fresh {
        ("ready", "fresh evidence of working relay", "nothing to do")
    } else if any_success {
        (
            "stale",
            "earlier success evidence is no longer fresh",
            "send a message or let the probes run",
        )
    } else {
        (
            "observing",
            "activity without success evidence yet",
            "wait for a delivery or a successful probe",
        )
    };
    let proof_scope = if s.verified_client_onion_deliveries > 0 {
        "client_message_delivery"
    } else if s.terminal + s.forwarded > 0 {
        "relay_acceptance"
    } else if s.two_hop_probe_succeeded > 0 {
        "message_delivery"
    } else if s.two_hop_probe_attempted > 0 {
        "control_plane"
    } else if s.probe_attempted > 0 {
        "single_hop_control_plane"
    } else if s.received > 0 {
        "attempted"
    } else {
        "none"
    };
    Quality {
        status,
        proof_scope,
        real_relay_ready: client_delivery_receipts.fresh,
        reason,
        next_action,
        relay_acceptance,
        synthetic_probes,
        synthetic_two_hop_probes,
        client_delivery_receipts,
    }
}

/// The whole status document (`GET /v1/status`).
pub fn document(relay: &Relay) -> serde_json::Value {
    let now = relay.clock.unix();
    let counters = relay.counters.snapshot();
    let q = quality(&counters, now);
    let descriptors: HashMap<_, _> = relay
        .peers
        .all()
        .into_iter()
        .map(|d| (d.node_id, d.expires_at))
        .collect();
    let instant = relay.clock.instant();
    let hops = relay.hops();
    let quarantine = |id: &crate::proto::NodeId| {
        hops.state(id)
            .map_or(0, |s| s.quarantine_remaining(instant))
    };
    let health = relay.health().summary(now, &descriptors, quarantine);
    drop(hops);
    serde_json::json!({
        "node": Prefix(relay.node.id()).to_string(),
        "quality": q,
        "counters": counters,
        "peer_health": health,
        "replay": {
            "store": relay.replay().kind(),
            "live_routes": relay.replay().live(now),
        },
        "peers": { "known": descriptors.len(), "routable": relay.peers.routable(now).len() },
        "inbox": { "items": relay.inbox().len() },
    })
}

/// The Prometheus text (`GET /metrics`): aggregates only, no label names a peer, route or
/// address.
pub fn metrics(relay: &Relay) -> String {
    let now = relay.clock.unix();
    let c = &relay.counters;
    let q = quality(&c.snapshot(), now);
    let mut out = PromText::new();
    for (name, value) in c.named() {
        let metric = format!("blindrelay_{name}_total");
        out.family(
            &metric,
            Kind::Counter,
            &format!("Requests or events counted as {name}."),
        );
        out.sample(&metric, &[], value);
    }
    const STATUSES: [&str; 7] = [
        "idle",
        "observing",
        "stale",
        "ready",
        "protecting",
        "degraded",
        "attention",
    ];
    out.family(
        "blindrelay_status",
        Kind::Gauge,
        "1 for the node's current quality status.",
    );
    for st in STATUSES {
        out.sample(
            "blindrelay_status",
            &[("status", st)],
            u64::from(q.status == st),
        );
    }
    out.family(
        "blindrelay_real_relay_ready",
        Kind::Gauge,
        "1 when a fresh client delivery receipt was verified.",
    );
    out.sample(
        "blindrelay_real_relay_ready",
        &[],
        u64::from(q.real_relay_ready),
    );
    out.family(
        "blindrelay_replay_live_routes",
        Kind::Gauge,
        "Routes reserved in the replay registry.",
    );
    out.sample(
        "blindrelay_replay_live_routes",
        &[],
        relay.replay().live(now) as u64,
    );
    out.family(
        "blindrelay_peers_routable",
        Kind::Gauge,
        "Peers with a valid descriptor and an allowed endpoint.",
    );
    out.sample(
        "blindrelay_peers_routable",
        &[],
        relay.peers.routable(now).len() as u64,
    );
    out.family(
        "blindrelay_guard_identities",
        Kind::Gauge,
        "Previous hops the guard remembers.",
    );
    out.sample(
        "blindrelay_guard_identities",
        &[],
        relay.hops().len() as u64,
    );
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000;

    #[test]
    fn transitions_follow_the_rules() {
        let mut s = Snapshot::default();
        assert_eq!(quality(&s, T).status, "idle");
        assert_eq!(quality(&s, T).proof_scope, "none");
        // A request refused for no route: activity, no success.
        s.received = 1;
        s.rejected = 1;
        s.no_route = 1;
        assert_eq!(quality(&s, T).status, "observing");
        assert_eq!(quality(&s, T).proof_scope, "attempted");
        // Accepted work: ready, then stale once it is older than FRESH.
        s.received += 1;
        s.forwarded = 1;
        s.last_accepted_at = Some(T);
        assert_eq!(quality(&s, T).status, "ready");
        assert_eq!(quality(&s, T).proof_scope, "relay_acceptance");
        assert_eq!(quality(&s, T + FRESH).status, "stale");
        // A rate limit: protecting, back to ready once RECENT has passed and evidence is fresh.
        s.rate_limited = 1;
        s.last_protection_at = Some(T + 10);
        s.last_accepted_at = Some(T + 20);
        assert_eq!(quality(&s, T + 30).status, "protecting");
        s.last_accepted_at = Some(T + 10 + RECENT);
        assert_eq!(quality(&s, T + 10 + RECENT).status, "ready");
        // Forward failures: degraded; backpressure: attention (it wins).
        s.last_forward_failed_at = Some(T + 5000);
        assert_eq!(quality(&s, T + 5000).status, "degraded");
        s.last_backpressure_at = Some(T + 5000);
        let q = quality(&s, T + 5000);
        assert_eq!(q.status, "attention");
        assert!(q.next_action.contains("CPU"));
        // Both problems age out.
        assert_eq!(quality(&s, T + 5000 + RECENT).status, "stale");
    }

    #[test]
    fn proof_scope_and_real_readiness() {
        let mut s = Snapshot {
            probe_attempted: 1,
            ..Default::default()
        };
        assert_eq!(quality(&s, T).proof_scope, "single_hop_control_plane");
        s.two_hop_probe_attempted = 1;
        assert_eq!(quality(&s, T).proof_scope, "control_plane");
        s.two_hop_probe_succeeded = 1;
        s.last_two_hop_probe_succeeded_at = Some(T);
        let q = quality(&s, T);
        assert_eq!(
            (q.proof_scope, q.status, q.real_relay_ready),
            ("message_delivery", "ready", false)
        );
        s.verified_client_onion_deliveries = 1;
        s.last_verified_client_onion_delivery_at = Some(T);
        let q = quality(&s, T);
        assert_eq!(
            (q.proof_scope, q.real_relay_ready),
            ("client_message_delivery", true)
        );
        assert!(!quality(&s, T + FRESH).real_relay_ready);
        // Probe evidence is never counted as relay acceptance.
        assert_eq!(q.relay_acceptance.total, 0);
    }
}
