//! Deadlines and retries in process, on tokio's paused clock (no real sleep: the clock moves
//! only when nothing can run, to the next timer): a next hop slow within the hop's deadline is
//! waited for and its answer stored; a next hop slower than the deadline gets the previous hop
//! `route_in_flight` at the deadline while the forward goes on, and the retry gets the stored
//! answer; `503 route_in_flight` and a `429` of a moment are retried, a lasting `429` is final.
//! The slow next hops are in-process fakes that answer after a pause on the same clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use blindrelay::clock::Instant;
use blindrelay::forward::HOP_DEADLINE;
use blindrelay::send::wrap::expiry;

use crate::common::inproc::*;

const ACCEPTED: &str = r#"{"outcome":"forwarded","receipt":"abcd"}"#;

/// A next hop known to `n` that answers every relay request with `ACCEPTED` after `pause` on
/// tokio's clock; how many requests it got.
async fn slow_next_hop(n: &Node, pause: Duration) -> (To, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(pause).await;
                ACCEPTED
            }
        }),
    );
    (fake_next_hop(n, app).await, hits)
}

/// A next hop that is slow but answers within the hop's deadline is waited for: the answer
/// stored is the forward, not `502 forward_failed`, and a duplicate gets it.
#[tokio::test(start_paused = true)]
async fn a_slow_next_hop_within_the_deadline_is_not_stored_as_a_failure() {
    let clock = clock();
    let b = node(&clock, |_| {}).await;
    let (c, hits) = slow_next_hop(&b, Duration::from_millis(2500)).await;
    let f = frame(&key(), &[to(&b), c], b"slow but fine", expiry(clock.unix()));
    let t = Instant::now();
    let r = submit(&b, f.encode()).await;
    let took = t.elapsed();
    assert_eq!((r.status, reason(&r).as_str()), (200, "forwarded"));
    assert!(
        took >= Duration::from_millis(2500) && took < HOP_DEADLINE,
        "{took:?}"
    );
    let again = submit(&b, f.encode()).await;
    assert_eq!(again, r, "the duplicate gets the stored answer");
    let s = b.ctx.counters.snapshot();
    assert_eq!(s.forward_failed, 0);
    assert_eq!(s.duplicate_route, 1);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "forwarded once");
}

/// A next hop slower than the hop's deadline does not make the hop store a failure: at its
/// deadline the hop answers `503 route_in_flight` (over its listener, as a previous hop sees
/// it) and goes on; once the slow hop answered, the retry gets the forward.
#[tokio::test(start_paused = true)]
async fn a_hop_slower_than_its_deadline_is_waited_for_not_stored_as_a_failure() {
    let clock = clock();
    let b = node(&clock, |_| {}).await;
    let (c, hits) = slow_next_hop(&b, Duration::from_secs(7)).await;
    let sender = key();
    let f = frame(
        &sender,
        &[to(&b), c],
        b"through a slow hop",
        expiry(clock.unix()),
    );
    let (http, url) = (tls_http_as(&sender), format!("https://{}/v2/relay", b.addr));
    let post = |Posted { bytes: body, .. }: Posted| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.post(url).body(body).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let t = Instant::now();
    let (status, body) = post(f.encode()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("route_in_flight"), "{body}");
    assert!(t.elapsed() >= HOP_DEADLINE, "{:?}", t.elapsed());
    // The forward goes on; past the slow hop's answer, the retry gets it once the hop has
    // recorded it (a previous hop retries `route_in_flight` the same way; bounded).
    tokio::time::advance(Duration::from_secs(2)).await;
    let (mut status, mut body) = post(f.encode()).await;
    for _ in 0..100 {
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        (status, body) = post(f.encode()).await;
    }
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""outcome":"forwarded""#), "{body}");
    let s = b.ctx.counters.snapshot();
    assert_eq!(s.forward_failed, 0);
    assert!(s.answered_in_flight >= 1);
    assert_eq!(s.forwarded, 1);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "forwarded once");
}
