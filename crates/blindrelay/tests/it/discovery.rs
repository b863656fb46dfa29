//! Discovery on real processes, each node in a /16 of its own: a network whose nodes each know
//! one bootstrap peer forms and delivers; a newcomer is reachable from every old node with no
//! restart; a network restarted without any `--peer` forms again from its peer stores;
//! strangers introduce a bounded number of identities per /24 they connect from; identities
//! that answer nothing are never middles, never passed on, and forgotten. Every wait is
//! bounded.

use crate::common;

use std::net::Ipv4Addr;
use std::time::Duration;

use blindrelay::discovery::{Msg, STRANGER_BURST};
use blindrelay::proto::descriptor::Descriptor;
use common::{Doc, Net, http, http_from_as};
use ed25519_dalek::SigningKey;

/// Gossip every second: a round is a second.
const ROUND: &str = "1s";
/// Longest wait for gossip to spread (rounds of [`ROUND`]).
const SPREAD: Duration = Duration::from_secs(20);

fn args() -> [&'static str; 4] {
    ["--gossip-interval", ROUND, "--probe-interval", "0s"]
}

/// Eight nodes, node `i` started with only node `i - 1` as its `--peer` (a chain: node 0
/// knows nobody): every node comes to route to all seven others, sends cross the network,
/// and a ninth node started with one bootstrap peer is reachable from every old node without
/// any restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_bootstrap_peers_forms_a_network_and_takes_in_a_newcomer() {
    let mut net =
        Net::start_bootstrapped(8, &args(), |i| i.checked_sub(1).into_iter().collect()).await;
    for i in 0..8 {
        net.wait_routable_within(i, 7, SPREAD).await;
    }
    let (ok, _, err) = net.send(7, 0, 2, b"across the chain").await;
    assert!(ok, "{err}");
    let (ok, _, err) = net.send(0, 7, 3, b"and back").await;
    assert!(ok, "{err}");
    // A newcomer that knows node 3 only.
    let new = net.add_node(vec![3]).await;
    for i in 0..=new {
        net.wait_routable_within(i, 8, SPREAD).await;
    }
    for i in 0..new {
        let (ok, _, err) = net.send(i, new, 1, b"welcome").await;
        assert!(ok, "node {i} to the newcomer: {err}");
    }
    let s = net.status(0).await;
    let peers = &s.runtime()["peers"];
    assert_eq!(peers["gossip"], 8, "node 0 knew nobody: {peers}");
    assert!(peers["last_gossip_at"].as_u64().is_some(), "{peers}");
}

/// A network formed by gossip, all its nodes killed and started again with no `--peer` at all,
/// forms again from the peer stores they wrote (each waited for until it holds every other
/// node, so the kill loses nothing), and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_network_forms_again_without_its_bootstrap_peers() {
    let n = 4;
    let mut net =
        Net::start_bootstrapped(n, &args(), |i| i.checked_sub(1).into_iter().collect()).await;
    for i in 0..n {
        net.wait_routable_within(i, n - 1, SPREAD).await;
    }
    for i in 0..n {
        let file = net.node(i).state_dir.join("peers.json");
        let deadline = std::time::Instant::now() + SPREAD;
        loop {
            let held = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["peers"].as_array().map(Vec::len));
            if held == Some(n - 1) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {i}'s store: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    net.restart_all_without_bootstrap().await;
    for i in 0..n {
        net.wait_routable_within(i, n - 1, SPREAD).await;
    }
    let (ok, _, err) = net.send(3, 0, 2, b"after the restart").await;
    assert!(ok, "{err}");
    let s = net.status(1).await;
    assert_eq!(s.runtime()["peers"]["bootstrap"], 0, "{s}");
}

/// A fresh identity whose endpoint is in `block` (`127.250.<block>.<host>`, where nothing
/// answers), and its descriptor.
fn stranger(block: u8, host: u8, now: u64) -> (SigningKey, Descriptor) {
    let key = SigningKey::from_bytes(&rand::random());
    let onion = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<
        [u8; 32],
    >()))
    .to_bytes();
    let d = Descriptor::sign(
        &key,
        onion,
        format!("https://127.250.{block}.{host}:7001"),
        now,
        3600,
    );
    (key, d)
}

/// The stranger `(key, descriptor)` says hello to `url` from `ip`, as itself (its link's
/// certificate is its key); the answer's status.
async fn announce(ip: Ipv4Addr, url: &str, (key, own): (SigningKey, Descriptor)) -> u16 {
    let hello = Msg::Hello {
        own: Some(own),
        have: 0,
    };
    let resp = http_from_as(ip, &key)
        .post(url)
        .body(hello.to_bytes())
        .send()
        .await
        .expect("post");
    resp.status().as_u16()
}

/// One party saying hello as 50 identities from one /24 gets a stranger's burst of them kept
/// (waiting to be reached), another /24 as much again; every hello is answered (its
/// descriptor checked, counted), and junk gets a JSON error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_introduce_a_bounded_number_per_block() {
    let net = Net::start_bootstrapped(2, &args(), |i| i.checked_sub(1).into_iter().collect()).await;
    net.wait_routable_within(0, 1, SPREAD).await;
    let now = blindrelay::clock::wall_unix();
    let url = format!("{}/v1/discovery", net.node(0).endpoint);
    for host in 1..=50 {
        let from = Ipv4Addr::new(127, 0, 9, host);
        assert_eq!(announce(from, &url, stranger(7, host, now)).await, 200);
    }
    let known = |s: &serde_json::Value| s.runtime()["peers"]["known"].as_u64();
    let burst = u64::from(STRANGER_BURST);
    let s = net.status(0).await;
    assert_eq!(known(&s), Some(1 + burst), "{s}");
    for block in 20..40 {
        let from = Ipv4Addr::new(127, 0, 10, 1);
        assert_eq!(announce(from, &url, stranger(block, 1, now)).await, 200);
    }
    let s = net.status(0).await;
    assert_eq!(known(&s), Some(1 + 2 * burst), "{s}");
    let peers = s.runtime()["peers"]["known"].clone();
    // Each hello's descriptor was checked on a crypto slot, and the slot's time counted; the
    // node's own exchanges with its peer were timed.
    assert!(
        common::counter(&s, "discovery_requests_checked") >= 70,
        "{s}"
    );
    assert!(common::counter(&s, "discovery_check_micros") > 0, "{s}");
    assert!(common::counter(&s, "gossip_exchange_micros") > 0, "{s}");
    // Junk is refused with a JSON error, counted, and changes nothing.
    assert_eq!(common::counter(&s, "discovery_requests_refused"), 0, "{s}");
    let resp = http()
        .post(&url)
        .body("not a discovery message")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.expect("JSON error");
    assert_eq!(body["error"], "malformed_envelope", "{body}");
    let s = net.status(0).await;
    assert_eq!(s.runtime()["peers"]["known"], peers);
    assert_eq!(common::counter(&s, "discovery_requests_refused"), 1, "{s}");
}

/// Identities whose endpoints answer nothing, introduced by strangers, are probed, never taken
/// as a middle of this node's routes, never passed on, and forgotten: its sends over three
/// hops all go through the first route they try, and the other nodes never learn them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_that_answer_nothing_are_never_middles_nor_passed_on() {
    let net = Net::start(4, &args()).await;
    let now = blindrelay::clock::wall_unix();
    let url = format!("{}/v1/discovery", net.node(0).endpoint);
    for block in 50..58 {
        let from = Ipv4Addr::new(127, 0, 11, block);
        assert_eq!(announce(from, &url, stranger(block, 1, now)).await, 200);
    }
    let s = net.status(0).await;
    assert_eq!(s.runtime()["peers"]["known"], 3 + 8, "{s}");
    assert_eq!(s.runtime()["peers"]["waiting"], 8, "{s}");
    for k in 0..12 {
        let (ok, out, err) = net.send(0, 1 + k % 3, 3, b"past the strangers").await;
        assert!(ok && !out.contains("(route "), "send {k}: {out} {err}");
    }
    let s = net.status(0).await;
    assert_eq!(common::counter(&s, "send_rerouted"), 0, "{s}");
    // Two probes each, ten seconds apart: forgotten.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let s = net.status(0).await;
        let forgotten = s.runtime()["peers"]["discovery"]["counters"]["forgotten"].as_u64();
        if forgotten == Some(8) {
            assert_eq!(s.runtime()["peers"]["known"], 3, "{s}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not forgotten: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 1..4 {
        let s = net.status(i).await;
        assert_eq!(s.runtime()["peers"]["known"], 3, "node {i}: {s}");
    }
}
