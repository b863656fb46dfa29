//! Counters equal the outcomes of a scripted mixed run against a 3-node network of real
//! processes: every counter of every node is checked, not only the ones expected to move.

use crate::common;

use std::collections::BTreeMap;

use blindrelay::proto::descriptor::Descriptor;
use common::{Doc, Net, http};
use serde_json::Value;

fn nonzero(status: &Value) -> BTreeMap<String, u64> {
    status
        .counters()
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !k.starts_with("last_"))
        // Links, not requests: how many a run opens is not scripted (checked below).
        .filter(|(k, _)| !k.starts_with("tls_"))
        .filter_map(|(k, v)| v.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n)))
        .collect()
}

fn expect(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// Posts `body` as the test's outside peer: one identity for every request, so the same frame
/// again is a retry.
async fn post(endpoint: &str, body: Vec<u8>) -> (u16, Value) {
    static PEER: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let r = PEER
        .get_or_init(http)
        .post(format!("{endpoint}/v2/relay"))
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_equal_the_outcomes_of_a_scripted_run() {
    // No probes and no gossip: their counters are not the subject.
    let net = Net::start(3, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let (n1, n2) = (net.node(1).clone(), net.node(2).clone());

    // Two client messages 0 → 1 → 2, verified by node 0.
    for msg in [&b"one"[..], b"two"] {
        let (ok, out, err) = net.send(0, 2, 2, msg).await;
        assert!(ok, "{out} {err}");
    }
    // A send to nobody: refused by node 0 itself, nothing on the wire.
    let (ok, _, _) = net.send_to(0, &"ab".repeat(32), 1, b"lost").await;
    assert!(!ok);

    // Frames crafted by an outside peer.
    let d2: Descriptor = serde_json::from_value(net.get_json(2, "/v1/descriptor").await).unwrap();
    let d1: Descriptor = serde_json::from_value(net.get_json(1, "/v1/descriptor").await).unwrap();
    let now = common::unix_now();
    let expires = blindrelay::send::wrap::expiry(now);
    let direct = common::craft(&[&d2], b"direct", false, expires).frame;
    // Delivered to node 2, then the same frame again: answered from the replay registry.
    assert_eq!(post(&n2.endpoint, direct.clone()).await.0, 200);
    assert_eq!(post(&n2.endpoint, direct).await.0, 200);
    // Garbage, a stale layer and a frame for another node (node 0's layer), to node 1.
    assert_eq!(post(&n1.endpoint, b"garbage".to_vec()).await.0, 400);
    let stale = common::craft(&[&d1], b"x", false, now - 3600).frame;
    assert_eq!(
        post(&n1.endpoint, stale).await.1["error"],
        "timestamp_expired"
    );
    let d0: Descriptor = serde_json::from_value(net.get_json(0, "/v1/descriptor").await).unwrap();
    let misdirected = common::craft(&[&d0], b"x", false, expires).frame;
    assert_eq!(
        post(&n1.endpoint, misdirected).await.1["error"],
        "onion_peel_failed"
    );

    let (s0, s1, s2) = (
        net.status(0).await,
        net.status(1).await,
        net.status(2).await,
    );
    assert_eq!(
        nonzero(&s0),
        expect(&[("verified_client_onion_deliveries", 2)]),
        "node 0"
    );
    assert_eq!(
        nonzero(&s1),
        expect(&[
            ("received", 5),
            ("forwarded", 2),
            ("rejected", 3),
            ("malformed_envelope", 1),
            ("timestamp_expired", 1),
            ("onion_peel_failed", 1),
            // The test's outside peer is no known peer of node 1.
            ("strangers_refused", 3),
        ]),
        "node 1"
    );
    assert_eq!(
        nonzero(&s2),
        expect(&[("received", 4), ("terminal", 3), ("duplicate_route", 1)]),
        "node 2"
    );
    // Exactly one outcome per request, on every node.
    for s in [&s0, &s1, &s2] {
        let c = |k: &str| s.counters()[k].as_u64().unwrap();
        assert_eq!(
            c("received"),
            c("terminal")
                + c("forwarded")
                + c("rejected")
                + c("duplicate_route")
                + c("duplicate_message")
        );
    }
    // Every node took links: its handshakes were counted, none failed.
    for s in [&s0, &s1, &s2] {
        assert!(s.counters()["tls_handshakes"].as_u64().unwrap() >= 1);
        assert_eq!(s.counters()["tls_handshake_failed"], 0);
    }
    assert_eq!(s0.quality()["proof_scope"], "client_message_delivery");
    assert_eq!(s0.quality()["real_relay_ready"], true);
    assert_eq!(
        s1.quality()["status"],
        "protecting",
        "a stale frame is the guard at work"
    );
    assert_eq!(s2.quality()["status"], "ready");
    assert_eq!(net.inbox_ids(2).await.len(), 3);
}
