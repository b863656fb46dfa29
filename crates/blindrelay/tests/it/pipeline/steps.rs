//! The admission pipeline's steps in process, on the paused clock: each step's refusal with
//! its reason, status and exactly one counter, the order of the steps, no retry after a
//! definitive answer, and every error of both listeners as JSON. Nodes listen on fresh
//! 127.x.y.z addresses with ports from the OS (`common/inproc.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use blindrelay::proto::NodeId;
use blindrelay::proto::sphinx;
use blindrelay::send::wrap::expiry;

use crate::common::inproc::*;

#[tokio::test(start_paused = true)]
async fn each_step_refuses_with_its_reason_status_and_one_counter() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let strict = node(&clock, |c| c.discovery.allow_private_endpoints = false).await;
    let other = node(&clock, |_| {}).await;
    introduce(&strict, &other);
    let dead = node(&clock, |_| {}).await;
    introduce(&n, &dead);
    dead.stop.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let now = clock.unix();
    let p = key();
    let stranger: NodeId = rand::random();

    let fresh = expiry(now);
    let anonymous = Posted::anonymous(frame(&p, &[to(&n)], b"x", fresh).encode().bytes);
    // A v1 node with a current descriptor: known, but not routable (it does not speak v2).
    let old = key();
    let mut v1_peer = blindrelay::proto::Descriptor::sign(
        &old,
        x25519_pub(),
        format!("https://{}", other.addr),
        now,
        3600,
    );
    v1_peer.protocol = 0;
    v1_peer.signature = ed25519_dalek::Signer::sign(&old, &v1_peer.signing_bytes()).to_bytes();
    assert_eq!(v1_peer.verify(now), Ok(()));
    assert!(n.ctx.peers.insert(v1_peer));
    let v1_envelope = {
        let mut b = b"BRE1".to_vec();
        b.extend_from_slice(&[0; 162]);
        b
    };

    type Case<'a> = (&'a str, &'a Node, Posted, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "garbage",
            &n,
            Posted::by(&p, b"not an envelope".to_vec()),
            400,
            "malformed_envelope",
            "malformed_envelope",
        ),
        (
            "v1 envelope",
            &n,
            Posted::by(&p, v1_envelope),
            400,
            "v1_not_accepted",
            "v1_not_accepted",
        ),
        (
            "a link with no identity",
            &n,
            anonymous,
            400,
            "invalid_previous_hop",
            "invalid_previous_hop",
        ),
        (
            "expired",
            &n,
            frame(&p, &[to(&n)], b"x", now - sphinx::EXPIRY_SKEW - 1).encode(),
            400,
            "timestamp_expired",
            "timestamp_expired",
        ),
        (
            "future",
            &n,
            frame(
                &p,
                &[to(&n)],
                b"x",
                now + sphinx::MAX_LIFETIME + sphinx::EXPIRY_SKEW + 1,
            )
            .encode(),
            400,
            "timestamp_in_future",
            "timestamp_in_future",
        ),
        (
            "self loop",
            &n,
            frame(n.ctx.node.signing_key(), &[to(&n)], b"x", fresh).encode(),
            400,
            "self_loop",
            "self_loop",
        ),
        (
            // A layer for another node in a frame for this one: it does not open here.
            "layer for another node",
            &n,
            frame(&p, &[nobody(stranger)], b"x", fresh)
                .signed_for(&p, &n)
                .encode(),
            400,
            "onion_peel_failed",
            "onion_peel_failed",
        ),
        (
            "peel",
            &n,
            junk_frame(&p, &n).encode(),
            400,
            "onion_peel_failed",
            "onion_peel_failed",
        ),
        (
            "route loop",
            &n,
            frame(&p, &[to(&n), nobody(id(&p))], b"x", fresh).encode(),
            400,
            "route_loop",
            "route_loop",
        ),
        (
            "no route",
            &n,
            frame(&p, &[to(&n), nobody(stranger)], b"x", fresh).encode(),
            502,
            "no_route",
            "no_route",
        ),
        (
            "v1 peer",
            &n,
            frame(&p, &[to(&n), nobody(id(&old))], b"x", fresh).encode(),
            502,
            "no_route",
            "no_route",
        ),
        (
            "private endpoint",
            &strict,
            frame(&p, &[to(&strict), to(&other)], b"x", fresh).encode(),
            502,
            "invalid_endpoint",
            "invalid_endpoint",
        ),
    ];
    for (what, target, bytes, status, why, counter) in cases {
        let before = target.ctx.counters.snapshot();
        let r = submit(target, bytes).await;
        assert_eq!((r.status, reason(&r).as_str()), (status, why), "{what}");
        let after = target.ctx.counters.snapshot();
        assert_eq!(
            moved(&before, &after),
            // The test's sources are unknown addresses: a stranger's refusal besides.
            counted(&[
                ("received", 1),
                ("rejected", 1),
                (counter, 1),
                ("strangers_refused", 1)
            ]),
            "{what}"
        );
    }

    // A next hop that does not answer: three attempts, then forward_failed.
    let before = n.ctx.counters.snapshot();
    let r = submit(&n, frame(&p, &[to(&n), to(&dead)], b"y", fresh).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (502, "forward_failed"));
    let after = n.ctx.counters.snapshot();
    assert_eq!(
        moved(&before, &after),
        counted(&[
            ("received", 1),
            ("rejected", 1),
            ("forward_failed", 1),
            ("retry_attempted", 2),
            ("retry_exhausted", 1),
            ("strangers_refused", 1)
        ])
    );

    // Accepted as the terminal hop.
    let before = n.ctx.counters.snapshot();
    let r = deliver(&n, &p, now, b"fine").await;
    assert_eq!((r.status, reason(&r).as_str()), (200, "delivered"));
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[("received", 1), ("terminal", 1)])
    );

    // Over HTTP, a body over the cap is refused before it is parsed.
    let http = tls_http();
    let big = vec![0u8; blindrelay::proto::frame::MAX_FRAME + 1];
    let r = http
        .post(format!("https://{}/v2/relay", n.addr))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "envelope_too_large"
    );
}

#[tokio::test(start_paused = true)]
async fn the_steps_run_in_the_design_order() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let now = clock.unix();
    let stale = now - 10_000;
    // A quarantined previous hop with a stale layer gets `quarantined` (4 before 5).
    let q = key();
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    let r = submit(&n, frame(&q, &[to(&n)], b"x", stale).encode()).await;
    assert_eq!(reason(&r), "quarantined");
    // A stale layer on a link with no identity: the previous hop first (3 before 5).
    let f = frame(&key(), &[to(&n)], b"x", stale);
    assert_eq!(
        reason(&submit(&n, Posted::anonymous(f.encode().bytes)).await),
        "invalid_previous_hop"
    );
    // A stale self-loop: the loop first (6 before 5: the expiry is sealed in the layer, read
    // only once the layer is peeled; the self-loop needs no cryptography).
    let me = n.ctx.node.signing_key();
    assert_eq!(
        reason(&submit(&n, frame(me, &[to(&n)], b"x", stale).encode()).await),
        "self_loop"
    );
    // A self-loop with a layer for another node: the loop first (6 before 7).
    let other: NodeId = rand::random();
    let f = frame(me, &[nobody(other)], b"x", expiry(now)).signed_for(me, &n);
    assert_eq!(reason(&submit(&n, f.encode()).await), "self_loop");
    // A stale route loop: the layer's expiry first (5 before 7).
    let p = key();
    let f = frame(&p, &[to(&n), nobody(id(&p))], b"x", stale);
    assert_eq!(reason(&submit(&n, f.encode()).await), "timestamp_expired");
    // A route loop to an unknown next hop: the loop first, then the route (7's own order).
    let f = frame(&p, &[to(&n), nobody(id(&p))], b"x", expiry(now));
    assert_eq!(reason(&submit(&n, f.encode()).await), "route_loop");
}

#[tokio::test(start_paused = true)]
async fn a_definitive_answer_is_not_retried() {
    use std::sync::atomic::AtomicUsize;
    let clock = clock();
    let a = node(&clock, |_| {}).await;
    // A next hop that answers 400 to everything, counting what it gets.
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async {
                (
                    axum::http::StatusCode::BAD_REQUEST,
                    "{\"error\":\"onion_peel_failed\"}",
                )
            }
        }),
    );
    let fake = fake_next_hop(&a, app).await;
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&a), fake], b"x", expiry(now));
    let r = submit(&a, f.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (502, "forward_failed"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(a.ctx.counters.snapshot().retry_attempted, 0);
}

#[tokio::test(start_paused = true)]
async fn every_error_of_both_listeners_is_json() {
    let clock = clock();
    let n = node(&clock, |_| {}).await;
    let cookie = std::fs::read_to_string(n.dir.join("operator.cookie")).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {cookie}").parse().unwrap(),
    );
    blindrelay::links::install_provider();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .default_headers(headers)
        .build()
        .unwrap();
    let stranger = tls_http();
    let (op, public) = (n.operator, n.addr);
    let to = hex::encode([1u8; 32]);
    let big = vec![0u8; blindrelay::proto::frame::MAX_FRAME + 1];
    let cases = [
        (
            "hops not a number",
            http.post(format!("http://{op}/v1/send?to={to}&hops=many")),
            400,
            "bad_query",
        ),
        (
            "no query string",
            http.post(format!("http://{op}/v1/send")),
            400,
            "bad_query",
        ),
        (
            "inbox id not a number",
            http.get(format!("http://{op}/v1/inbox/abc")),
            400,
            "bad_path",
        ),
        (
            "not a node id",
            http.post(format!("http://{op}/v1/send?to=zz&hops=1")),
            400,
            "bad_node_id",
        ),
        (
            "body over the limit",
            http.post(format!("http://{op}/v1/send?to={to}&hops=1"))
                .body(big),
            413,
            "body_too_large",
        ),
        (
            "no such item",
            http.get(format!("http://{op}/v1/inbox/7")),
            404,
            "not_found",
        ),
        (
            "unknown path",
            http.get(format!("http://{op}/v1/nothing")),
            404,
            "not_found",
        ),
        (
            "wrong method",
            http.get(format!("http://{op}/v1/send")),
            405,
            "method_not_allowed",
        ),
        (
            "public unknown path",
            http.get(format!("https://{public}/v1/nothing")),
            404,
            "not_found",
        ),
        (
            "public wrong method",
            http.get(format!("https://{public}/v2/relay")),
            405,
            "method_not_allowed",
        ),
        (
            "operator without the cookie",
            stranger.get(format!("http://{op}/v1/inbox")),
            401,
            "unauthorized",
        ),
        (
            "operator with a wrong cookie",
            stranger
                .get(format!("http://{op}/v1/status"))
                .bearer_auth("ab".repeat(32)),
            401,
            "unauthorized",
        ),
    ];
    for (what, req, status, code) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{what}");
        assert_eq!(r.headers()["content-type"], "application/json", "{what}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], code, "{what}");
        assert!(v["message"].is_string(), "{what}: {v}");
    }
}
