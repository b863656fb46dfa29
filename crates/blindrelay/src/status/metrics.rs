//! The Prometheus text (`GET /metrics`): the counters, the status, and a few gauges.

use guard::counters::{Kind, PromText};

use super::quality::{Status, quality};
use super::stores;
use crate::pipeline::Pipeline;

/// The Prometheus text (`GET /metrics`): aggregates only, no label names a peer, route or
/// address.
pub fn render(pipeline: &Pipeline) -> String {
    let ctx = pipeline.ctx();
    let now = ctx.clock.unix();
    let c = &ctx.counters;
    let snap = c.snapshot();
    let st = stores(pipeline, &snap, now);
    let q = quality(&snap, now, st);
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
    let inbox = pipeline.terminal().inbox();
    let gauges: [(&str, &str, u64); 7] = [
        (
            "blindrelay_replay_full",
            "1 while every replay slot holds a live route.",
            u64::from(st.replay_full),
        ),
        (
            "blindrelay_inbox_items",
            "Items in the inbox.",
            inbox.len() as u64,
        ),
        (
            "blindrelay_inbox_bytes",
            "Payload bytes in the inbox.",
            inbox.bytes(),
        ),
        (
            "blindrelay_inbox_full",
            "1 while deliveries are refused for lack of inbox room.",
            u64::from(st.inbox_full),
        ),
        (
            "blindrelay_in_flight",
            "Relay requests in flight.",
            pipeline.gate().in_flight() as u64,
        ),
        (
            "blindrelay_connections_open",
            "Open connections of the relay listener.",
            pipeline.connections().open() as u64,
        ),
        (
            "blindrelay_admission_sources",
            "Sources the request gate's rate pools remember (a count, no addresses).",
            pipeline.gate().sources() as u64,
        ),
    ];
    for (name, help, v) in gauges {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], v);
    }
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
