//! The Prometheus text (`GET /metrics`): the counters, the status, a few gauges, and
//! discovery's (what the view holds, the eclipse verdict, its counters). Counts only: no
//! label names a peer, a route or an address; the only labels are fixed names (`status`,
//! `state`, `kind`).

use guard::counters::{Kind, PromText};

use super::quality::{Quality, Status, Stores, quality};
use super::{discovery_counters, percent, stores};
use crate::discovery::{Eclipse, EclipseState, Msg};
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
    discovery(&mut out, relay);
    out.finish()
}

/// Discovery's families: what the view holds (gauges), the eclipse verdict
/// (`blindrelay_discovery_eclipse{state}`, 1 for the current one, as `blindrelay_status`), its
/// counters (`blindrelay_discovery_<name>_total`, the status document's
/// `peers.discovery.counters`) and its message bytes by kind. Read under one lock.
fn discovery(out: &mut PromText, relay: &Relay) {
    let (held, waiting, lapsed, e, st) = {
        let disc = relay.ctx().peers.lock();
        let view = disc.view();
        (
            view.len(),
            view.waiting(),
            disc.lapsed(),
            disc.eclipse(),
            disc.stats(),
        )
    };
    for (name, help, v) in discovery_gauges(held, waiting, lapsed, &e) {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], v);
    }
    let name = "blindrelay_discovery_eclipse";
    out.family(
        name,
        Kind::Gauge,
        "1 for discovery's current eclipse verdict (ok, one_source, unconfirmed).",
    );
    for state in EclipseState::ALL {
        out.sample(
            name,
            &[("state", state.as_str())],
            u64::from(e.state == state),
        );
    }
    for (counter, help, v) in discovery_counters(&st) {
        let name = format!("blindrelay_discovery_{counter}_total");
        out.family(&name, Kind::Counter, help);
        out.sample(&name, &[], v);
    }
    let name = "blindrelay_discovery_message_bytes_total";
    out.family(
        name,
        Kind::Counter,
        "Discovery message bytes both ways, by message kind.",
    );
    for (kind, v) in Msg::KINDS.iter().zip(st.bytes_by_kind) {
        out.sample(name, &[("kind", kind)], v);
    }
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
            "Peers route choice may take: reached at their endpoint, a current v2 descriptor, an allowed endpoint.",
            relay.ctx().peers.routable(now).len() as u64,
        ),
        (
            "blindrelay_guard_identities",
            "Previous hops the guard remembers.",
            relay.pipeline().hops().len() as u64,
        ),
    ]
}

/// Discovery's gauges: name, help, value.
fn discovery_gauges(
    held: usize,
    waiting: usize,
    lapsed: usize,
    e: &Eclipse,
) -> [(&'static str, &'static str, u64); 7] {
    [
        (
            "blindrelay_peers_known",
            "Identities held (descriptors, reached or not, current or not).",
            held as u64,
        ),
        (
            "blindrelay_peers_waiting",
            "Identities held and not reached yet (probed in turn; never routed through nor passed on).",
            waiting as u64,
        ),
        (
            "blindrelay_peers_lapsed",
            "Reached peers whose descriptors lapsed, still greeted now and then.",
            lapsed as u64,
        ),
        (
            "blindrelay_discovery_roots",
            "Distinct roots (first-hand sources, by /16) of the identities held.",
            e.roots as u64,
        ),
        (
            "blindrelay_discovery_roots_synced",
            "Distinct roots this node reconciled with.",
            e.roots_synced as u64,
        ),
        (
            "blindrelay_discovery_top_root_percent",
            "Percent of the identities held unconfirmed under the largest root.",
            u64::from(percent(e.top_share)),
        ),
        (
            "blindrelay_discovery_unconfirmed_percent",
            "Percent of the identities held that no second root vouched for.",
            u64::from(percent(e.unconfirmed_share)),
        ),
    ]
}
