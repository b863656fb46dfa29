//! The Prometheus text (`GET /metrics`): the counters, the status, and a few gauges.

use guard::counters::{Kind, PromText};

use super::quality::{Status, quality};
use crate::pipeline::Pipeline;

/// The Prometheus text (`GET /metrics`): aggregates only, no label names a peer, route or
/// address.
pub fn render(pipeline: &Pipeline) -> String {
    let ctx = pipeline.ctx();
    let now = ctx.clock.unix();
    let c = &ctx.counters;
    let q = quality(&c.snapshot(), now);
    let mut out = PromText::new();
    out.counter_sets(&[(&[], c)]);
    out.family(
        "blindrelay_status",
        Kind::Gauge,
        "1 for the node's current quality status.",
    );
    for st in Status::ALL {
        out.sample(
            "blindrelay_status",
            &[("status", st.as_str())],
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
        pipeline.replay().live(now) as u64,
    );
    out.family(
        "blindrelay_peers_routable",
        Kind::Gauge,
        "Peers with a valid descriptor and an allowed endpoint.",
    );
    out.sample(
        "blindrelay_peers_routable",
        &[],
        ctx.peers.routable(now).len() as u64,
    );
    out.family(
        "blindrelay_guard_identities",
        Kind::Gauge,
        "Previous hops the guard remembers.",
    );
    out.sample(
        "blindrelay_guard_identities",
        &[],
        pipeline.hops().len() as u64,
    );
    out.finish()
}
