//! Admission under load in process, on the paused clock: the request gate's totals per
//! source, crypto admission (refused at once, slots kept for known peers and for outbound
//! work), and the previous-hop guard: forged frames, rate limit → quarantine → expiry, fresh
//! identities, and what a previous hop could not have prevented leaving its health alone.

use std::net::IpAddr;
use std::time::Duration;

use blindrelay::proto::NodeId;
use blindrelay::send::wrap::expiry;
use ed25519_dalek::SigningKey;

use crate::common::doc::Doc;
use crate::common::inproc::*;

#[tokio::test(start_paused = true)]
async fn the_request_gate_shares_its_totals_per_source() {
    let clock = clock();
    let n = node(&clock, |c| c.gate.per_minute = 60_000).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let sender = key();
    let body = junk_frame(&sender, &n).encode();
    // 64 in flight: at most 16 per source, and the last 16 only for known peers.
    let mut held = Vec::new();
    for i in 0..5u8 {
        let s = n.pipeline.classify(IpAddr::from([10, i, 0, 1]));
        for _ in 0..20 {
            if let Ok(a) = admit(&n, &s, &body) {
                held.push(a);
            }
        }
    }
    assert_eq!(held.len(), 48);
    let c = n.ctx.counters.snapshot();
    // Sources 0 and 1 over their cap (4 each); then the unknown part is full (4 + 20 + 20).
    assert_eq!((c.source_limited, c.backpressure_dropped), (8, 44));
    // Junk costs the cheap checks only: refused before any slot is taken.
    let s = n.pipeline.classify(IpAddr::from([10, 9, 0, 1]));
    assert_eq!(
        admit(&n, &s, &Posted::by(&sender, b"junk".to_vec()))
            .unwrap_err()
            .as_str(),
        "malformed_envelope"
    );
    // A known peer (its descriptor's endpoint) still gets the reserved slots.
    let known = n.pipeline.classify(peer.addr.ip());
    for _ in 0..16 {
        held.push(admit(&n, &known, &body).expect("a reserved slot"));
    }
    // Over HTTP too: 429 at once.
    let r = tls_http_as(&sender)
        .post(format!("https://{}/v2/relay", n.addr))
        .body(body.bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    drop(held);

    // The rate: 60 per minute, half of it for known peers. A flooding source gets its share of
    // the other half, a second source too, and the known peer keeps its own.
    let n = node(&clock, |c| c.gate.per_minute = 60).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let flood = n.pipeline.classify(IpAddr::from([10, 1, 0, 1]));
    let got = (0..100)
        .filter(|_| admit(&n, &flood, &body).is_ok())
        .count();
    assert!((1..=3).contains(&got), "{got}");
    let known = n.pipeline.classify(peer.addr.ip());
    assert!(admit(&n, &known, &body).is_ok());
    // Recovery follows the load: seconds, not a 60 s window.
    advance(Duration::from_secs(4)).await;
    assert!(admit(&n, &flood, &body).is_ok());
}

/// Step 2 never waits: with every inbound crypto slot taken a request is refused at once
/// (`backpressure`); a stranger over the strangers' share is refused with `source_limited` (the
/// node is not out of CPU, so not `attention`) while a known peer's request still gets a slot.
#[tokio::test(start_paused = true)]
async fn crypto_admission_refuses_at_once_and_strangers_cannot_take_the_known_peers_slot() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let p = key();
    let known = n.pipeline.classify(peer.addr.ip());
    assert!(known.key().is_known());
    let stranger = |i: u8| n.pipeline.classify(IpAddr::from([10, 78, i, 1]));
    let strangers = n.pipeline.strangers();
    // Two strangers hold the strangers' share of the 4 slots (2: all inbound slots but one).
    let a = strangers.take(stranger(1).key()).expect("stranger 1");
    let b = strangers.take(stranger(2).key()).expect("stranger 2");
    let req = || frame(&p, &[to(&n)], b"x", expiry(clock.unix())).encode();
    let t = std::time::Instant::now();
    assert_eq!(
        reason(&submit_from(&n, &stranger(3), req()).await),
        "source_limited"
    );
    assert!(t.elapsed() < Duration::from_millis(25), "refused at once");
    assert_eq!(n.ctx.counters.snapshot().source_limited, 1);
    assert_ne!(status_of(&n).quality()["status"], "attention");
    assert_eq!(reason(&submit_from(&n, &known, req()).await), "delivered");
    drop((a, b));
    assert_eq!(
        reason(&submit_from(&n, &stranger(3), req()).await),
        "delivered"
    );
    // Every inbound slot taken: refused at once, not after a wait.
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    let t = std::time::Instant::now();
    assert_eq!(
        reason(&submit_from(&n, &known, req()).await),
        "backpressure"
    );
    assert!(t.elapsed() < Duration::from_millis(25), "refused at once");
    drop(busy);
    assert_eq!(reason(&submit_from(&n, &known, req()).await), "delivered");
}

#[tokio::test(start_paused = true)]
async fn crypto_admission_refuses_at_once_and_keeps_a_slot_for_outbound() {
    let clock = clock();
    let n = node(&clock, |c| c.context.crypto_slots = 4).await;
    let t = node(&clock, |_| {}).await;
    introduce(&n, &t);
    let now = clock.unix();
    // Three slots busy: inbound work (which gets total − 1 = 3) is refused at once…
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    let before = n.ctx.counters.snapshot();
    let r = submit(&n, frame(&key(), &[to(&n)], b"x", expiry(now)).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (429, "backpressure"));
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[
            ("received", 1),
            ("rejected", 1),
            ("backpressure_dropped", 1),
            // The test's sources are unknown addresses.
            ("strangers_refused", 1)
        ])
    );
    // …while building a route and checking its receipt still proceed on the last slot.
    let sent = blindrelay::send::send(&n.ctx, *t.ctx.node.id(), 1, b"outbound".to_vec()).await;
    assert!(sent.is_ok(), "{sent:?}");
    drop(busy);
    let r = submit(&n, frame(&key(), &[to(&n)], b"x", expiry(now)).encode()).await;
    assert_eq!(r.status, 200);
    assert_eq!(blindrelay::context::crypto_slots(1), 4);
    assert_eq!(blindrelay::context::crypto_slots(2), 4);
    assert_eq!(blindrelay::context::crypto_slots(12), 6);
    assert_eq!(blindrelay::context::crypto_slots(64), 8);
}

/// What a link's authenticated client alone wrote is scored against it: twelve bodies that are
/// not frames quarantine it. A link with no identity charges nobody, whatever it sends.
#[tokio::test(start_paused = true)]
async fn malformed_frames_are_scored_against_their_link_and_anonymous_ones_against_nobody() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let now = clock.unix();
    let sloppy = key();
    for i in 0..12 {
        let r = submit(&n, Posted::by(&sloppy, b"not a frame".to_vec())).await;
        assert_eq!(reason(&r), "malformed_envelope", "{i}");
    }
    assert_eq!(
        n.ctx.counters.snapshot().quarantine_started,
        1,
        "twelve scored failures"
    );
    let fine = frame(&sloppy, &[to(&n)], b"now fine", expiry(now));
    assert_eq!(reason(&submit(&n, fine.encode()).await), "quarantined");
    for _ in 0..13 {
        let f = frame(&key(), &[to(&n)], b"spam", expiry(now));
        let r = submit(&n, Posted::anonymous(f.encode().bytes)).await;
        assert_eq!(reason(&r), "invalid_previous_hop");
        let r = submit(&n, Posted::anonymous(b"junk".to_vec())).await;
        assert_eq!(reason(&r), "invalid_previous_hop");
    }
    let s = n.ctx.counters.snapshot();
    assert_eq!(
        (s.invalid_previous_hop, s.quarantine_started, s.rejected),
        (26, 1, 12 + 1 + 26)
    );
    assert_eq!(n.pipeline.hops().len(), 1, "nothing charged to anyone else");
    let honest = key();
    let r = deliver(&n, &honest, now, b"real").await;
    assert_eq!(reason(&r), "delivered");
}

#[tokio::test(start_paused = true)]
async fn rate_limit_quarantine_expiry_and_window_reset() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let cheap = |n: &Node, _: u64| junk_frame(&p, n).encode(); // refused later, at the peel
    for _ in 0..120 {
        assert_eq!(
            reason(&submit(&n, cheap(&n, clock.unix())).await),
            "onion_peel_failed"
        );
    }
    assert_eq!(
        reason(&submit(&n, cheap(&n, clock.unix())).await),
        "rate_limited"
    );
    assert_eq!(n.ctx.counters.snapshot().quarantine_started, 1);
    for step in [1, 100, 198] {
        advance(Duration::from_secs(step)).await;
        assert_eq!(
            reason(&submit(&n, cheap(&n, clock.unix())).await),
            "quarantined",
            "+{step}"
        );
    }
    assert_eq!(
        n.ctx.counters.snapshot().quarantine_started,
        1,
        "refusals do not restart it"
    );
    advance(Duration::from_secs(1)).await; // 300 s after it started
    assert_eq!(
        reason(&submit(&n, cheap(&n, clock.unix())).await),
        "onion_peel_failed",
        "re-admitted"
    );

    // The window resets after 60 s.
    let w = key();
    let f = |_: u64| junk_frame(&w, &n).encode();
    for _ in 0..120 {
        submit(&n, f(clock.unix())).await;
    }
    advance(Duration::from_secs(60)).await;
    for _ in 0..120 {
        assert_eq!(
            reason(&submit(&n, f(clock.unix())).await),
            "onion_peel_failed"
        );
    }
    assert_eq!(reason(&submit(&n, f(clock.unix())).await), "rate_limited");

    // Route loops are on the design's scored list, but sealed by the sender: they never score
    // against the previous hop (the failure score itself is tested in `hop_guard`).
    let l = key();
    let now = clock.unix();
    for i in 0..12 {
        let f = frame(&l, &[to(&n), nobody(id(&l))], b"x", expiry(now));
        let r = submit(&n, f.encode()).await;
        assert_eq!(reason(&r), "route_loop", "{i}");
    }
    assert_eq!(
        reason(&submit(&n, f(now)).await),
        "quarantined",
        "w is still quarantined"
    );
    // A route loop is sealed by the original sender, which `l` (as a previous hop) cannot
    // read: twelve of them are refused but never charged to `l`.
    let r = deliver(&n, &l, now, b"x").await;
    assert_eq!(reason(&r), "delivered");
}

#[tokio::test(start_paused = true)]
async fn five_thousand_fresh_identities_cannot_flush_an_active_quarantine() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let q = key();
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    let mut refused = 0;
    for _ in 0..5000 {
        let r = submit(&n, junk_frame(&key(), &n).encode()).await;
        if reason(&r) == "rate_limited" {
            refused += 1;
        }
    }
    assert!(n.pipeline.hops().len() <= blindrelay::pipeline::hop_guard::MAX_BUCKETS);
    assert!(
        refused > 5000 - blindrelay::pipeline::hop_guard::MAX_BUCKETS as i32,
        "{refused}"
    );
    assert_eq!(reason(&junk(&n, &q).await), "quarantined");
}

/// What the previous hop could not have prevented leaves its health alone.
/// Replays in flight and expired responses have no effect on it at all; this node's own
/// refusals (no route, a disallowed endpoint, a full replay registry) note the contact only,
/// never `degraded`, never a score. A replay conflict (its own reuse of a route id) does mark
/// it, to show the rows tell the difference; so does a layer that does not open (the sender may
/// have sealed it: marked, never scored, and past twelve a stranger's crypto share).
#[tokio::test(start_paused = true)]
async fn refusals_the_previous_hop_could_not_prevent_leave_its_health_alone() {
    let clock = clock();
    let n = node(&clock, |c| c.stores.replay_capacity = 64).await;
    let strict = node(&clock, |c| c.discovery.allow_private_endpoints = false).await;
    let other = node(&clock, |_| {}).await;
    introduce(&strict, &other);
    let row = |at: &Node, k: &SigningKey| {
        let prefix = hex::encode(&id(k)[..4]);
        let s = status_of(at);
        s.health()["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == prefix.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no row for {prefix}: {s}"))
    };
    let untouched = |r: &serde_json::Value, what: &str| {
        assert_eq!(r["health"], "healthy", "{what}: {r}");
        assert_eq!(r["reasons"], serde_json::json!({}), "{what}: {r}");
    };
    let now = clock.unix();
    let stranger: NodeId = rand::random();

    // Replays in flight and expired: no effect (only the first delivery's contact).
    let (in_flight, expired) = (known_key(&n), known_key(&n));
    let busy = frame(&in_flight, &[to(&n)], b"b", expiry(now));
    deliver(&n, &in_flight, now, b"contact").await;
    n.relay
        .replay()
        .reserve(busy.tag, busy.request_digest(), now)
        .unwrap();
    let first = frame(&expired, &[to(&n)], b"e", expiry(now));
    assert_eq!(reason(&submit(&n, first.encode()).await), "delivered");
    for _ in 0..13 {
        assert_eq!(reason(&submit(&n, busy.encode()).await), "route_in_flight");
    }
    advance(Duration::from_secs(121)).await;
    let now = clock.unix();
    for _ in 0..13 {
        assert_eq!(
            reason(&submit(&n, first.encode()).await),
            "replay_response_expired"
        );
    }
    untouched(&row(&n, &in_flight), "route_in_flight");
    untouched(&row(&n, &expired), "replay_response_expired");

    // This node's own refusals: thirteen each, no score, no mark.
    let (no_route, wrong_hop, endpoint, full) = (
        known_key(&n),
        known_key(&n),
        known_key(&strict),
        known_key(&n),
    );
    for _ in 0..13 {
        let f = frame(&no_route, &[to(&n), nobody(stranger)], b"x", expiry(now));
        assert_eq!(reason(&submit(&n, f.encode()).await), "no_route");
        // v1's `wrong_hop`: a layer for another node (in a frame for this one).
        let f =
            frame(&wrong_hop, &[nobody(stranger)], b"x", expiry(now)).signed_for(&wrong_hop, &n);
        assert_eq!(reason(&submit(&n, f.encode()).await), "onion_peel_failed");
        let f = frame(&endpoint, &[to(&strict), to(&other)], b"x", expiry(now));
        assert_eq!(
            reason(&submit(&strict, f.encode()).await),
            "invalid_endpoint"
        );
    }
    untouched(&row(&n, &no_route), "no_route");
    let r = row(&n, &wrong_hop);
    assert_eq!(r["health"], "degraded", "a layer that does not open: {r}");
    assert_eq!(r["reasons"]["layer"], 13, "{r}");
    assert!(n.pipeline.hops().suspect(&id(&wrong_hop), clock.instant()));
    untouched(&row(&strict, &endpoint), "invalid_endpoint");
    let live = n.relay.replay().live(now);
    for _ in live..64 {
        n.relay
            .replay()
            .reserve(rand::random(), [0; 32], now)
            .unwrap();
    }
    for _ in 0..13 {
        assert_eq!(
            reason(&deliver(&n, &full, now, b"full").await),
            "replay_capacity"
        );
    }
    untouched(&row(&n, &full), "replay_capacity");
    for (at, k) in [
        (&n, &no_route),
        (&n, &wrong_hop),
        (&strict, &endpoint),
        (&n, &full),
    ] {
        assert_eq!(row(at, k)["quarantined"], false);
    }
    assert_eq!(n.ctx.counters.quarantine_started.get(), 0);
    assert_eq!(strict.ctx.counters.quarantine_started.get(), 0);

    // A re-wrap of a layer another previous hop already carried is the re-wrapper's fault:
    // marked (health only).
    let rewrapper = known_key(&n);
    let conflict = first.rewrap(&rewrapper);
    assert_eq!(
        reason(&submit(&n, conflict.encode()).await),
        "replay_conflict"
    );
    let r = row(&n, &rewrapper);
    assert_eq!(r["health"], "degraded", "{r}");
    assert_eq!(r["reasons"]["replay"], 1, "{r}");
}
