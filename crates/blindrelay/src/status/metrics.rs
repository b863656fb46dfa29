//! The Prometheus text (`GET /metrics`): the counters, the status, and a few gauges.

use guard::counters::{Kind, PromText};

use super::quality::{Quality, Status, Stores, quality};
use super::stores;
use crate::relay::Relay;

/// The Prometheus text (`GET /metrics`): aggregates only, no label names a peer, route or
/// address.
pub fn render(relay: &Relay) -> String {
    let ctx = relay.ctx();
    let now = ctx.clock.unix();
    let c = &ctx.counters;
    let snap = c.snapshot();
    let st = stores(relay, &snap, now);
    let standings = relay.pipeline().hops().standings(ctx.clock.instant());
    let q = quality(
        &snap,
        now,
        st,
        super::backpressure_cause(relay, &standings, now),
    );
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
    for (name, help, v) in gauges(relay, &q, &st, now) {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], v);
    }
    out.finish()
}

/// The gauges after the status: name, help, value.
// structure: table
fn gauges(
    relay: &Relay,
    q: &Quality,
    st: &Stores,
    now: u64,
) -> [(&'static str, &'static str, u64); 12] {
    let inbox = relay.terminal().inbox();
    [
        (
            "blindrelay_real_relay_ready",
            "1 when a fresh client delivery receipt was verified.",
            u64::from(q.real_relay_ready),
        ),
        (
            "blindrelay_replay_live_routes",
            "Routes reserved in the replay registry.",
            relay.replay().live(now) as u64,
        ),
        (
            "blindrelay_replay_unwritten_answers",
            "Stored answers not yet written to the replay registry's file.",
            relay.replay().unwritten() as u64,
        ),
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
            relay.pipeline().gate().in_flight() as u64,
        ),
        (
            "blindrelay_connections_open",
            "Open connections of the relay listener.",
            relay.connections().held() as u64,
        ),
        (
            "blindrelay_admission_sources",
            "Sources the request gate's rate pools remember (a count, no addresses).",
            relay.pipeline().gate().sources() as u64,
        ),
        (
            "blindrelay_peers_routable",
            "Peers with a valid descriptor and an allowed endpoint.",
            relay.ctx().peers.routable(now).len() as u64,
        ),
        (
            "blindrelay_guard_identities",
            "Previous hops the guard remembers.",
            relay.pipeline().hops().len() as u64,
        ),
    ]
}
