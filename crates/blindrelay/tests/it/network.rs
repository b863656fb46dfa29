//! Whole networks of real `blindrelay` processes on loopback: delivery over 1–4 hops with a
//! verified receipt, the counters of every node, a message that looks like a probe delivered,
//! refusals of the client, and what survives a `kill -9`.

use crate::common;

use std::time::Instant;

use common::{Doc, Net, POLL, WAIT, counter, random_bytes};
use serde_json::Value;

/// Counters a plain delivery may move; every other counter must stay 0.
const MOVING: [&str; 4] = [
    "received",
    "terminal",
    "forwarded",
    "verified_client_onion_deliveries",
];

/// Every node counted exactly one outcome per request, and nothing but deliveries happened:
/// no refusal, retry, probe or quarantine anywhere.
fn assert_clean(i: usize, s: &Value) {
    let c = s.counters().as_object().expect("counters");
    assert_eq!(
        counter(s, "received"),
        counter(s, "terminal")
            + counter(s, "forwarded")
            + counter(s, "rejected")
            + counter(s, "duplicate_route")
            + counter(s, "duplicate_message"),
        "node {i}: one outcome per request: {s}"
    );
    for (name, v) in c {
        // Gossip runs on its own (once at start, then every minute; an exchange that finds
        // its peer busy at start is refused, `discovery_requests_refused`, and asked again;
        // its bytes and times are counted), and links open when first needed
        // (`tls_handshakes`; a failed one is still a counter that moved).
        if MOVING.contains(&name.as_str())
            || name.starts_with("last_")
            || name.starts_with("gossip_")
            || name.starts_with("discovery_")
            || name == "tls_handshakes"
        {
            continue;
        }
        assert_eq!(v.as_u64(), Some(0), "node {i}: counter {name} moved: {s}");
    }
}

/// Waits until node `i`'s log has `n` lines containing `needle`.
async fn wait_log(net: &Net, i: usize, needle: &str, n: usize) {
    let deadline = Instant::now() + WAIT;
    while net.node(i).count(needle) < n {
        assert!(
            Instant::now() < deadline,
            "node {i}: {n} × {needle:?} not logged; log:\n{}",
            net.node(i).lines().join("\n")
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_deliver_over_two_hops_and_one_hop() {
    let mut net = Net::start_with(3, &[], Some("blindrelay=trace")).await;
    let two = format!("two hops {}", common::hex(&random_bytes(8))).into_bytes();
    let one = random_bytes(300);

    let (ok, out, err) = net.send(0, 2, 2, &two).await;
    assert!(ok, "2-hop send failed: {out} {err}");
    assert!(out.contains("receipt verified"), "{out}");
    assert!(out.contains(net.node(2).prefix()), "{out}");
    assert!(out.contains("over 2 hops"), "{out}");

    let (ok, out, err) = net.send(0, 2, 1, &one).await;
    assert!(ok, "1-hop send failed: {out} {err}");
    assert!(out.contains("receipt verified"), "{out}");
    assert!(out.contains("over 1 hop,"), "{out}");

    // Node 2's inbox holds both payloads, byte for byte, in order.
    let ids = net.inbox_ids(2).await;
    assert_eq!(ids.len(), 2, "{}", net.inbox(2).await);
    assert_eq!(net.inbox_read(2, ids[0]).await, two);
    assert_eq!(net.inbox_read(2, ids[1]).await, one);
    let listing = net.inbox(2).await;
    assert_eq!(listing["items"][0]["size"].as_u64(), Some(two.len() as u64));
    assert_eq!(listing["items"][1]["size"].as_u64(), Some(one.len() as u64));
    assert!(net.inbox_ids(0).await.is_empty());
    assert!(net.inbox_ids(1).await.is_empty());

    let mut s = Vec::new();
    for i in 0..3 {
        s.push(net.status(i).await);
    }
    for (i, st) in s.iter().enumerate() {
        assert_clean(i, st);
        assert_eq!(st["node"].as_str(), Some(net.node(i).prefix()));
    }
    // The sender relays nothing; it verified both receipts.
    assert_eq!(counter(&s[0], "received"), 0);
    assert_eq!(counter(&s[0], "verified_client_onion_deliveries"), 2);
    assert!(s[0].counters()["last_verified_client_onion_delivery_at"].is_u64());
    // The only middle forwarded the 2-hop message once.
    assert_eq!(counter(&s[1], "forwarded"), 1);
    assert_eq!(counter(&s[1], "terminal"), 0);
    assert_eq!(counter(&s[1], "verified_client_onion_deliveries"), 0);
    // The terminal stored both.
    assert_eq!(counter(&s[2], "terminal"), 2);
    assert_eq!(counter(&s[2], "received"), 2);
    assert_eq!(counter(&s[2], "forwarded"), 0);
    assert_eq!(counter(&s[2], "verified_client_onion_deliveries"), 0);
    assert_eq!(s[2].runtime()["inbox"]["items"].as_u64(), Some(2));

    // Only the sender verifies the receipt; the middle never sees itself as the terminal.
    wait_log(&net, 1, "relay request forwarded", 1).await;
    wait_log(&net, 2, "relay request delivered here", 2).await;
    wait_log(&net, 0, "delivery verified", 2).await;
    net.stop_all().await;
    for l in net.node(1).lines() {
        assert!(!l.contains("delivered"), "middle logged {l:?}");
        assert!(!l.contains("verified"), "middle logged {l:?}");
    }
    for l in net.node(2).lines() {
        assert!(!l.contains("delivery verified"), "terminal logged {l:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_deliver_over_four_hops_with_every_other_node_a_middle() {
    let net = Net::start(5, &[]).await;
    let text = b"four hops".to_vec();
    let (ok, out, err) = net.send(0, 4, 4, &text).await;
    assert!(ok, "4-hop send failed: {out} {err}");
    assert!(
        out.contains("receipt verified") && out.contains("over 4 hops"),
        "{out}"
    );

    for i in 1..=3 {
        let s = net.status(i).await;
        assert_clean(i, &s);
        assert_eq!(counter(&s, "forwarded"), 1, "middle {i}: {s}");
        assert_eq!(counter(&s, "terminal"), 0, "middle {i}: {s}");
    }
    let s4 = net.status(4).await;
    assert_clean(4, &s4);
    assert_eq!(counter(&s4, "terminal"), 1);
    assert_eq!(counter(&s4, "forwarded"), 0);

    // 64 KiB of random bytes over the same 4 hops arrive intact.
    let big = random_bytes(64 * 1024);
    let (ok, out, err) = net.send(0, 4, 4, &big).await;
    assert!(ok, "64 KiB send failed: {out} {err}");
    assert!(out.contains("receipt verified"), "{out}");
    let ids = net.inbox_ids(4).await;
    assert_eq!(ids.len(), 2);
    assert_eq!(net.inbox_read(4, ids[0]).await, text);
    let got = net.inbox_read(4, ids[1]).await;
    assert!(
        got == big,
        "64 KiB payload changed ({} bytes back)",
        got.len()
    );

    for i in 0..5 {
        let s = net.status(i).await;
        assert_clean(i, &s);
        if (1..=3).contains(&i) {
            assert_eq!(counter(&s, "forwarded"), 2, "middle {i}: {s}");
        }
    }
    let s0 = net.status(0).await;
    assert_eq!(counter(&s0, "received"), 0);
    assert_eq!(counter(&s0, "verified_client_onion_deliveries"), 2);
    assert_eq!(counter(&net.status(4).await, "terminal"), 2);
}

/// A message whose payload starts with the old probe marker is stored and delivered
/// like any other (one hop and two); probes are still answered without being stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_looks_like_a_probe_is_delivered() {
    let net = Net::start(3, &["--probe-interval", "0s"]).await;
    let one = b"blindrelay/probe/v1 but a message, one hop".to_vec();
    let two = b"blindrelay/probe/v1".to_vec();
    let (ok, _, err) = net.send(0, 2, 1, &one).await;
    assert!(ok, "{err}");
    let (ok, _, err) = net.send(0, 2, 2, &two).await;
    assert!(ok, "{err}");
    let ids = net.inbox_ids(2).await;
    assert_eq!(ids.len(), 2, "both messages stored");
    let mut got = Vec::new();
    for id in ids {
        got.push(net.inbox_read(2, id).await);
    }
    got.sort();
    let mut want = vec![one, two];
    want.sort();
    assert_eq!(got, want);
    let s = net.status(2).await;
    assert_eq!(counter(&s, "terminal"), 2, "{s}");
    assert_eq!(counter(&s, "probes_answered"), 0, "{s}");
    // A real probe round: answered, counted apart, nothing stored.
    let r = net
        .op_http(0)
        .post(format!("{}/v1/probe", net.node(0).operator))
        .send()
        .await
        .expect("probe");
    assert!(r.status().is_success(), "{}", r.status());
    let s0 = net.status(0).await;
    assert_eq!(counter(&s0, "probe_succeeded"), 2, "{s0}");
    assert_eq!(counter(&s0, "two_hop_probe_succeeded"), 1, "{s0}");
    let s = net.status(2).await;
    assert!(counter(&s, "probes_answered") >= 1, "{s}");
    assert_eq!(counter(&s, "terminal"), 2, "{s}");
    assert_eq!(net.inbox_ids(2).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_refuses_unknown_terminals_and_too_many_hops() {
    let net = Net::start(3, &[]).await;
    let payload = b"must not arrive".to_vec();

    // A well-formed id no node has.
    let stranger = common::hex(&random_bytes(32));
    let (ok, out, err) = net.send_to(0, &stranger, 1, &payload).await;
    assert!(!ok, "send to an unknown node succeeded: {out}");
    assert!(
        err.contains("not delivered") && err.contains("not a known peer"),
        "unclear message: {err:?}"
    );

    // More hops than there are peers for: 3 hops need 2 middles, node 0 knows only node 1.
    let (ok, out, err) = net.send(0, 2, 3, &payload).await;
    assert!(!ok, "3-hop send over 2 peers succeeded: {out}");
    assert!(
        err.contains("not delivered")
            && err.contains("not enough usable peers")
            && err.contains("for 3 hops"),
        "unclear message: {err:?}"
    );

    // Not a node id at all, and zero hops.
    let (ok, _, err) = net.send_to(0, "not-hex", 1, &payload).await;
    assert!(!ok);
    assert!(
        err.contains("must be a node id"),
        "unclear message: {err:?}"
    );
    let (ok, _, err) = net.send(0, 2, 0, &payload).await;
    assert!(!ok);
    assert!(err.contains("at least 1"), "unclear message: {err:?}");

    // Sending to itself: the terminal is not a peer of its own.
    let me = net.node(0).id.clone();
    let (ok, _, err) = net.send_to(0, &me, 1, &payload).await;
    assert!(!ok);
    assert!(err.contains("not a known peer"), "unclear message: {err:?}");

    // Nothing was delivered, nothing was even relayed.
    for i in 0..3 {
        assert!(net.inbox_ids(i).await.is_empty(), "node {i} inbox");
        let s = net.status(i).await;
        assert_clean(i, &s);
        assert_eq!(counter(&s, "received"), 0, "node {i}: {s}");
        assert_eq!(counter(&s, "verified_client_onion_deliveries"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reservations_and_the_inbox_survive_kill_9() {
    let mut net = Net::start(2, &[]).await;
    let first = b"before the crash".to_vec();
    let (ok, out, err) = net.send(0, 1, 1, &first).await;
    assert!(ok, "send failed: {out} {err}");
    let before = net.status(1).await;
    assert_eq!(before.runtime()["replay"]["store"], "sqlite");
    assert!(
        before.runtime()["replay"]["live_routes"].as_u64().unwrap() >= 1,
        "{before}"
    );

    net.kill9(1).await;
    // While it is down, a send to it fails after the bounded retries, and says why.
    let (ok, out, err) = net.send(0, 1, 1, b"into the void").await;
    assert!(!ok, "send to a dead node succeeded: {out}");
    assert!(
        err.contains("hop 1 of 1") && err.contains("did not answer"),
        "unclear message: {err:?}"
    );
    let s0 = net.status(0).await;
    assert_eq!(counter(&s0, "retry_attempted"), 2, "{s0}");
    assert_eq!(counter(&s0, "retry_exhausted"), 1, "{s0}");
    assert_eq!(counter(&s0, "verified_client_onion_deliveries"), 1, "{s0}");

    net.restart(1).await;

    let after = net.status(1).await;
    assert_eq!(after.runtime()["replay"]["store"], "sqlite");
    assert!(
        after.runtime()["replay"]["live_routes"].as_u64().unwrap() >= 1,
        "the reservation did not survive kill -9: {after}"
    );
    assert_eq!(after["node"].as_str(), Some(net.node(1).prefix()));
    // Counters are in memory: a fresh process starts from 0.
    assert_eq!(counter(&after, "received"), 0);
    let ids = net.inbox_ids(1).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(net.inbox_read(1, ids[0]).await, first);

    // Same keys after the restart: the peer's descriptor still routes, and it delivers again.
    let second = b"after the crash".to_vec();
    let (ok, out, err) = net.send(0, 1, 1, &second).await;
    assert!(ok, "send after restart failed: {out} {err}");
    let ids = net.inbox_ids(1).await;
    assert_eq!(ids.len(), 2);
    assert_eq!(net.inbox_read(1, ids[1]).await, second);
    let s = net.status(1).await;
    assert_clean(1, &s);
    assert_eq!(counter(&s, "terminal"), 1);
    assert!(
        s.runtime()["replay"]["live_routes"].as_u64().unwrap() >= 2,
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_reservations_are_lost_on_restart_but_the_inbox_is_not() {
    let mut net = Net::start(2, &["--replay-store", "memory"]).await;
    let payload = b"memory store".to_vec();
    let (ok, out, err) = net.send(0, 1, 1, &payload).await;
    assert!(ok, "send failed: {out} {err}");
    let before = net.status(1).await;
    assert_eq!(before.runtime()["replay"]["store"], "memory");
    assert!(
        before.runtime()["replay"]["live_routes"].as_u64().unwrap() >= 1,
        "{before}"
    );

    net.kill9(1).await;
    net.restart(1).await;

    let after = net.status(1).await;
    assert_eq!(after.runtime()["replay"]["store"], "memory");
    assert_eq!(
        after.runtime()["replay"]["live_routes"].as_u64(),
        Some(0),
        "{after}"
    );
    let ids = net.inbox_ids(1).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(net.inbox_read(1, ids[0]).await, payload);
}
