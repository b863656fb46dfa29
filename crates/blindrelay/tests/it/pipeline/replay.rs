//! The replay registry as the pipeline uses it, in process, on the paused clock: every
//! replay outcome, a forwarded duplicate, a full registry (shown, refused, drained as layers
//! expire), a reservation outliving its layer, and a route refused after a restart.

use std::net::IpAddr;
use std::time::Duration;

use blindrelay::proto::sphinx;
use blindrelay::send::wrap::expiry;

use crate::common::doc::Doc;
use crate::common::inproc::*;

#[tokio::test(start_paused = true)]
async fn every_replay_outcome() {
    // The registry is filled to its capacity below: a small one keeps the test fast (the default
    // capacity itself is filled in the registry's own test).
    const CAPACITY: usize = 512;
    let clock = clock();
    let n = node(&clock, |c| c.stores.replay_capacity = CAPACITY).await;
    let p = key();
    let now = clock.unix();
    let first = frame(&p, &[to(&n)], b"once", expiry(now));
    let r1 = submit(&n, first.encode()).await;
    assert_eq!(reason(&r1), "delivered");
    // The same request again: the stored response, receipt and all; nothing delivered twice.
    let before = n.ctx.counters.snapshot();
    let r2 = submit(&n, first.encode()).await;
    assert_eq!(r2, r1);
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[("received", 1), ("duplicate_route", 1)])
    );
    assert_eq!(n.relay.terminal().inbox().len(), 1);
    // The same layer in another frame (a re-wrap by another previous hop): its tag is taken.
    let other = first.rewrap(&key());
    let r = submit(&n, other.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (400, "replay_conflict"));
    // In flight.
    let busy = frame(&p, &[to(&n)], b"busy", expiry(now));
    n.relay
        .replay()
        .reserve(busy.tag, busy.request_digest(), now)
        .unwrap();
    let r = submit(&n, busy.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "route_in_flight"));
    // The stored response is too old to replay after 120 s; the route stays reserved.
    advance(Duration::from_secs(121)).await;
    let r = submit(&n, first.encode()).await;
    assert_eq!(
        (r.status, reason(&r).as_str()),
        (409, "replay_response_expired")
    );
    assert_eq!(n.relay.terminal().inbox().len(), 1);
    // Capacity: every slot live → 503, no live reservation evicted.
    let now = clock.unix();
    let live = n.relay.replay().live(now);
    for _ in live..CAPACITY {
        n.relay
            .replay()
            .reserve(rand::random(), [0; 32], now)
            .unwrap();
    }
    let r = deliver(&n, &p, now, b"full").await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "replay_capacity"));
    let r = submit(&n, first.encode()).await;
    assert_eq!(
        reason(&r),
        "replay_response_expired",
        "the old route was not evicted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_duplicate_is_not_forwarded_twice() {
    let clock = clock();
    let a = node(&clock, |_| {}).await;
    let b = node(&clock, |_| {}).await;
    introduce(&a, &b);
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&a), to(&b)], b"relayed", expiry(now));
    let r1 = submit(&a, f.encode()).await;
    assert_eq!(reason(&r1), "forwarded");
    let r2 = submit(&a, f.encode()).await;
    assert_eq!(r2, r1);
    // b took the layer once. (An attempt b refused before any work, say `source_limited` while
    // a's probe held a's share of the strangers' slots, is retried by a: received, not taken.)
    let sb = b.ctx.counters.snapshot();
    assert_eq!((sb.received - sb.rejected, sb.terminal), (1, 1), "{sb:?}");
    assert_eq!(a.ctx.counters.snapshot().forwarded, 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_replay_registry_says_so_and_drains_as_routes_end() {
    let clock = clock();
    let n = node(&clock, |c| {
        c.stores.replay_capacity = 8;
        c.stores.replay_share_percent = 25;
    })
    .await;
    let p = key();
    let probe = || frame_with(&p, &[to(&n)], b"", true, expiry(clock.unix())).encode();
    let src = |i: u8| n.pipeline.classify(IpAddr::from([10, 60, i, 1]));
    // One source: two routes (25 % of 8), then its own refusal.
    for _ in 0..2 {
        assert_eq!(
            reason(&submit_from(&n, &src(0), probe()).await),
            "delivered"
        );
    }
    let r = submit_from(&n, &src(0), probe()).await;
    assert_eq!(
        (r.status, reason(&r).as_str()),
        (429, "replay_share_exceeded")
    );
    assert_eq!(status_of(&n).runtime()["replay"]["full"], false);
    // Three more fill it; then everyone is refused as `replay_capacity`, and status says so.
    for i in 1..4 {
        for _ in 0..2 {
            assert_eq!(
                reason(&submit_from(&n, &src(i), probe()).await),
                "delivered"
            );
        }
    }
    let r = submit_from(&n, &src(9), probe()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "replay_capacity"));
    let s = status_of(&n);
    assert_eq!(s.runtime()["replay"]["full"], true);
    assert_eq!(s.quality()["status"], "attention");
    assert_eq!(s.counters()["replay_capacity"], 1);
    assert_eq!(s.counters()["replay_share_exceeded"], 1);
    // Tags end once their layers can no longer be accepted (expiry + 120 s, inclusive): room
    // again, and status no longer full.
    advance(Duration::from_secs(
        expiry(T0) + sphinx::EXPIRY_SKEW + 1 - clock.unix(),
    ))
    .await;
    let r = submit_from(&n, &src(9), probe()).await;
    assert_eq!(reason(&r), "delivered");
    assert_eq!(status_of(&n).runtime()["replay"]["full"], false);
}

/// A layer's tag stays reserved as long as the layer can be accepted
/// (through its expiry plus the skew, inclusive), also past the registry's 600 s window from the
/// reservation; one second later the layer itself is refused (paused clock).
#[tokio::test(start_paused = true)]
async fn a_reservation_outlives_its_layer() {
    use blindrelay::proto::sphinx::{EXPIRY_SKEW, MAX_LIFETIME};
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let t0 = clock.unix();
    // Expiring as far ahead as a hop accepts, and as a sender's own layer does.
    let ahead = frame(&p, &[to(&n)], b"ahead", t0 + MAX_LIFETIME + EXPIRY_SKEW);
    let today = frame(&p, &[to(&n)], b"today", t0 + MAX_LIFETIME);
    assert_eq!(reason(&submit(&n, ahead.encode()).await), "delivered");
    assert_eq!(reason(&submit(&n, today.encode()).await), "delivered");
    // The last second `today` is accepted: still reserved.
    advance(Duration::from_secs(MAX_LIFETIME + EXPIRY_SKEW)).await;
    assert_eq!(
        reason(&submit(&n, today.encode()).await),
        "replay_response_expired"
    );
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        reason(&submit(&n, today.encode()).await),
        "timestamp_expired"
    );
    // Past the registry's window from `ahead`'s reservation, its layer is still acceptable.
    advance(Duration::from_secs(EXPIRY_SKEW - 1)).await;
    assert_eq!(clock.unix(), t0 + MAX_LIFETIME + 2 * EXPIRY_SKEW);
    assert_eq!(
        reason(&submit(&n, ahead.encode()).await),
        "replay_response_expired"
    );
    // One second later it is not: refused by its expiry, never delivered again.
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        reason(&submit(&n, ahead.encode()).await),
        "timestamp_expired"
    );
    assert_eq!(n.relay.terminal().inbox().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_route_accepted_before_a_crash_is_refused_after_the_restart() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&n)], b"durable", expiry(now));
    let r1 = submit(&n, f.encode()).await;
    assert_eq!(reason(&r1), "delivered");
    // One more reserved but never completed (the process dies while handling it).
    let g = frame(&p, &[to(&n)], b"cut short", expiry(now));
    n.relay
        .replay()
        .reserve(g.tag, g.request_digest(), now)
        .unwrap();
    let dir = n.dir.clone();
    let mut n = n;
    n.stop.cancel();
    let tmp = n._tmp.take();
    drop(n);
    // A new process on the same state dir.
    let n = start_node(dir, &clock, |_| {}, false, tmp).await;
    assert_eq!(
        submit(&n, f.encode()).await,
        r1,
        "replayed, not delivered again"
    );
    assert_eq!(n.relay.terminal().inbox().len(), 1);
    let r = submit(&n, g.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "route_interrupted"));
    assert_eq!(n.relay.terminal().inbox().len(), 1);
    // The delivered layer re-wrapped by another previous hop, after the restart: refused by its
    // tag, never delivered again.
    let r = submit(&n, f.rewrap(&key()).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (400, "replay_conflict"));
    assert_eq!(n.relay.terminal().inbox().len(), 1);
}
