//! What the node proves and reports, in process, on the paused clock: receipts verified by
//! the sender (a lying middle caught), probes kept apart from user traffic, status transitions
//! that recover by themselves, and status and metrics free of ids, routes, endpoints and
//! payloads.

use std::time::Duration;

use blindrelay::proto::NodeId;
use blindrelay::send::wrap::expiry;
use ed25519_dalek::SigningKey;
use tokio::net::TcpListener;

use crate::common::doc::Doc;
use crate::common::inproc::*;

#[tokio::test(start_paused = true)]
async fn the_sender_verifies_the_terminal_receipt() {
    let clock = clock();
    let a = node(&clock, |_| {}).await;
    let b = node(&clock, |_| {}).await;
    let c = node(&clock, |_| {}).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c), (&b, &a), (&c, &a), (&c, &b)] {
        introduce(x, y);
    }
    let d = blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, b"two hops".to_vec())
        .await
        .unwrap();
    assert_eq!(d.hops, 2);
    let s = a.ctx.counters.snapshot();
    assert_eq!(s.verified_client_onion_deliveries, 1);
    assert!(s.last_verified_client_onion_delivery_at.is_some());
    assert_eq!(b.ctx.counters.snapshot().forwarded, 1);
    assert_eq!(
        c.relay.terminal().inbox().get(1).unwrap().unwrap(),
        b"two hops"
    );

    // A middle that answers with a made-up receipt is caught by the sender.
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::OK,
                format!(
                    "{{\"outcome\":\"forwarded\",\"receipt\":\"{}\"}}",
                    "ab".repeat(192)
                ),
            )
        }),
    );
    let listener = TcpListener::bind((fresh_ip(), 0)).await.unwrap();
    let fake_addr = listener.local_addr().unwrap();
    let liar = SigningKey::from_bytes(&rand::random());
    serve_tls(listener, app, &liar);
    let desc = blindrelay::proto::descriptor::Descriptor::sign(
        &liar,
        x25519_pub(),
        format!("https://{fake_addr}"),
        clock.unix(),
        3600,
    );
    let clock2 = crate::common::inproc::clock();
    let solo = node(&clock2, |_| {}).await;
    assert!(solo.ctx.peers.insert(desc));
    let err = blindrelay::send::send(&solo.ctx, id(&liar), 1, b"x".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            blindrelay::send::SendError::Route { failure, .. }
                if matches!(failure.cause, blindrelay::send::Cause::Receipt(_))
        ),
        "{err:?}"
    );
    assert_eq!(
        solo.ctx
            .counters
            .snapshot()
            .verified_client_onion_deliveries,
        0
    );
}

#[tokio::test(start_paused = true)]
async fn probes_are_kept_apart_from_user_traffic() {
    let clock = clock();
    let (a, b, c) = three(&clock).await;
    blindrelay::probe::round(&a.ctx).await;
    let s = a.ctx.counters.snapshot();
    assert_eq!(
        (s.probe_attempted, s.probe_succeeded, s.probe_failed),
        (2, 2, 0)
    );
    assert_eq!(
        (
            s.two_hop_probe_attempted,
            s.two_hop_probe_succeeded,
            s.two_hop_probe_failed
        ),
        (1, 1, 0)
    );
    assert_eq!(
        (
            s.received,
            s.terminal,
            s.forwarded,
            s.verified_client_onion_deliveries
        ),
        (0, 0, 0, 0)
    );
    // The probed nodes answered as terminals without counting or storing user traffic.
    let (sb, sc) = (b.ctx.counters.snapshot(), c.ctx.counters.snapshot());
    assert_eq!(sb.probes_answered + sc.probes_answered, 3);
    assert_eq!(sb.terminal + sc.terminal, 0);
    assert!(b.relay.terminal().inbox().is_empty() && c.relay.terminal().inbox().is_empty());
    // The middle of the two-hop probe cannot tell it from a message: one forward, as designed.
    assert_eq!(sb.forwarded + sc.forwarded, 1);
    let q = status_of(&a).quality().clone();
    assert_eq!(q["status"], "ready");
    assert_eq!(q["proof_scope"], "message_delivery");
    assert_eq!(q["real_relay_ready"], false);
    assert_eq!(q["relay_acceptance"]["total"], 0);
    assert_eq!(q["synthetic_probes"]["total"], 2);
    // A verified client delivery makes the node really ready.
    blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, b"real".to_vec())
        .await
        .unwrap();
    let q = status_of(&a).quality().clone();
    assert_eq!(
        (q["proof_scope"].as_str(), q["real_relay_ready"].as_bool()),
        (Some("client_message_delivery"), Some(true))
    );
}

#[tokio::test(start_paused = true)]
async fn status_moves_with_recent_events_and_recovers() {
    let clock = clock();
    let n = node(&clock, |c| c.context.crypto_slots = 4).await;
    let st = |n: &Node| {
        status_of(n).quality()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(st(&n), "idle");
    let p = key();
    let stranger: NodeId = rand::random();
    let now = clock.unix();
    let f = frame(&p, &[to(&n), nobody(stranger)], b"x", expiry(now));
    submit(&n, f.encode()).await;
    assert_eq!(st(&n), "observing");
    deliver(&n, &p, now, b"a").await;
    assert_eq!(st(&n), "ready");
    advance(Duration::from_secs(1800)).await;
    assert_eq!(st(&n), "stale");
    // A rate limit: protecting, while the relay keeps working (a known peer: a row of its own).
    let q = known_key(&n);
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    deliver(&n, &p, clock.unix(), b"b").await;
    assert_eq!(st(&n), "protecting");
    let health = status_of(&n).health().clone();
    let row = health["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["health"] == "quarantined")
        .unwrap()
        .clone();
    assert_eq!(row["node"], blindrelay::proto::Prefix(&id(&q)).to_string());
    assert_eq!(row["quarantine_remaining_secs"], 300);
    assert!(row["reasons"]["rate_limit"].as_u64().unwrap() >= 1);
    // The window passes; with fresh work the node is ready again by itself.
    advance(Duration::from_secs(1800)).await;
    deliver(&n, &p, clock.unix(), b"c").await;
    assert_eq!(st(&n), "ready");
    // Backpressure spread over sources (each delivery from another): attention, with what to
    // do (one source's is `protecting`, naming it: tests/it/hostile_peers.rs).
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    for payload in [b"d", b"e", b"f"] {
        deliver(&n, &p, clock.unix(), payload).await;
    }
    drop(busy);
    let q = status_of(&n).quality().clone();
    assert_eq!(q["status"], "attention");
    assert!(q["next_action"].as_str().unwrap().contains("CPU"));
    advance(Duration::from_secs(1800)).await;
    // Forward failures: degraded, and the next hop shows as failing after three.
    let dead = node(&clock, |_| {}).await;
    introduce(&n, &dead);
    dead.stop.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let f = frame(&p, &[to(&n), to(&dead)], b"x", expiry(clock.unix()));
        submit(&n, f.encode()).await;
    }
    let doc = status_of(&n);
    assert_eq!(
        doc.quality()["status"],
        "attention",
        "exhausted retries call for attention"
    );
    let failing = doc.health()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["health"] == "failing")
        .cloned();
    assert_eq!(
        failing.unwrap()["node"],
        blindrelay::proto::Prefix(dead.ctx.node.id()).to_string()
    );
}

#[tokio::test(start_paused = true)]
async fn status_and_metrics_name_no_peer_route_endpoint_or_payload() {
    let clock = clock();
    let (a, b, c) = three(&clock).await;
    let payload = b"PRIVATE-PAYLOAD-3f9a".to_vec();
    blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, payload.clone())
        .await
        .unwrap();
    blindrelay::probe::round(&a.ctx).await;
    let p = key();
    let f = frame(&p, &[to(&b), to(&c)], b"x", expiry(clock.unix()));
    let route = f.tag;
    submit(&b, f.encode()).await;
    let mut forbidden: Vec<String> = vec![String::from_utf8(payload.clone()).unwrap()];
    use sha2::Digest;
    forbidden.push(hex::encode(sha2::Sha256::digest(&payload)));
    forbidden.push(hex::encode(blindrelay::proto::receipt::commitment(
        &payload,
    )));
    forbidden.push(hex::encode(route));
    for n in [&a, &b, &c] {
        forbidden.push(hex::encode(n.ctx.node.id()));
        forbidden.push(n.addr.to_string());
        forbidden.push(n.addr.ip().to_string());
    }
    forbidden.push(hex::encode(id(&p)));
    for n in [&a, &b, &c] {
        let text = status_of(n).to_string() + &blindrelay::status::metrics::render(&n.relay);
        for f in &forbidden {
            assert!(
                !text.contains(f.as_str()),
                "{f} in the status of {}",
                blindrelay::proto::Prefix(n.ctx.node.id())
            );
        }
        assert!(
            status_of(n).health()["rows"].as_array().unwrap().len() <= blindrelay::health::MAX_ROWS
        );
    }
    // The metrics are labelled by fixed names only: the status, the eclipse verdict, a
    // discovery message kind.
    let metrics = blindrelay::status::metrics::render(&a.relay);
    assert_fixed_labels(&metrics);
    assert!(metrics.contains("blindrelay_verified_client_onion_deliveries_total 1"));
}

/// Every sample of `metrics` is unlabelled or labelled by one of the fixed names.
fn assert_fixed_labels(metrics: &str) {
    let fixed = [
        "blindrelay_status{status=\"",
        "blindrelay_discovery_eclipse{state=\"",
        "blindrelay_discovery_message_bytes_total{kind=\"",
    ];
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains('{') || fixed.iter().any(|f| line.starts_with(f)),
            "{line}"
        );
    }
}

/// The value of the sample `series` (a name, with its labels if any) in `metrics`.
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series}"))
}

/// Discovery's metrics: what the view holds, the eclipse verdict as the status document gives
/// it, its counters and message bytes by kind; no id, prefix or endpoint among them.
#[tokio::test(start_paused = true)]
async fn discovery_metrics_count_the_view_and_name_no_peer() {
    use blindrelay::discovery::{Signed, Source};
    let clock = clock();
    let a = node(&clock, |_| {}).await;
    let now = clock.unix();
    let keys: Vec<SigningKey> = (0..11).map(|_| key()).collect();
    // Ten identities of the operator's (reached) in one /16 (one root), and a stranger's own
    // (waiting) under another root: nearly all through one source.
    let ds: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let url = format!("https://127.250.{}.7:7001", 10 + i);
            blindrelay::proto::descriptor::Descriptor::sign(k, x25519_pub(), url, now, 3600)
        })
        .collect();
    for d in &ds[..10] {
        assert!(a.ctx.peers.insert(d.clone()));
    }
    for d in &ds[10..] {
        let s = std::sync::Arc::new(Signed::trusted(d.clone()));
        let root = 7;
        let admitted = a
            .ctx
            .peers
            .lock()
            .view_mut()
            .admit(s, Source::Stranger(1), root, now);
        assert!(admitted.is_ok());
    }
    let metrics = blindrelay::status::metrics::render(&a.relay);
    assert_fixed_labels(&metrics);
    assert_eq!(sample(&metrics, "blindrelay_peers_known"), 11);
    assert_eq!(sample(&metrics, "blindrelay_peers_waiting"), 1);
    assert_eq!(sample(&metrics, "blindrelay_peers_lapsed"), 0);
    assert_eq!(sample(&metrics, "blindrelay_discovery_roots"), 2);
    assert_eq!(
        sample(&metrics, "blindrelay_discovery_top_root_percent"),
        91
    );
    assert_eq!(
        sample(&metrics, "blindrelay_discovery_unconfirmed_percent"),
        100
    );
    assert_eq!(sample(&metrics, "blindrelay_discovery_learned_total"), 10);
    assert_eq!(sample(&metrics, "blindrelay_discovery_reached_total"), 10);
    let doc = status_of(&a);
    let disc =
        &doc["system_stats"]["discovery_status"]["peer_store"]["runtime"]["peers"]["discovery"];
    let verdict = disc["eclipse"].as_str().unwrap();
    assert_eq!(verdict, "one_source");
    for state in ["ok", "one_source", "unconfirmed"] {
        let series = format!("blindrelay_discovery_eclipse{{state=\"{state}\"}}");
        assert_eq!(
            sample(&metrics, &series),
            u64::from(state == verdict),
            "{state}"
        );
    }
    assert_eq!(disc["roots"], 2);
    for (name, v) in disc["counters"].as_object().unwrap() {
        let series = format!("blindrelay_discovery_{name}_total");
        assert_eq!(sample(&metrics, &series), v.as_u64().unwrap(), "{name}");
        assert!(metrics.contains(&format!("# TYPE {series} counter")));
    }
    for kind in blindrelay::discovery::Msg::KINDS {
        let series = format!("blindrelay_discovery_message_bytes_total{{kind=\"{kind}\"}}");
        sample(&metrics, &series);
    }
    for gauge in ["blindrelay_peers_known", "blindrelay_discovery_eclipse"] {
        assert!(metrics.contains(&format!("# TYPE {gauge} gauge")));
    }
    let mut forbidden = vec![a.addr.ip().to_string(), "127.250.".to_string()];
    for id in std::iter::once(*a.ctx.node.id()).chain(ds.iter().map(|d| d.node_id)) {
        forbidden.push(hex::encode(id));
        forbidden.push(blindrelay::proto::Prefix(&id).to_string());
    }
    for f in &forbidden {
        assert!(!metrics.contains(f.as_str()), "{f} in the metrics");
    }
}
