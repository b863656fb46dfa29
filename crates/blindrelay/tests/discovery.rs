//! Discovery by gossip, on real processes, each node in a /16 of its own: a network whose nodes
//! each know one bootstrap peer forms by gossip and delivers; a newcomer is reachable from
//! every old node with no restart; a network restarted without any `--peer` forms again from
//! its peer stores; and identities one party announces are kept only up to the
//! per-block bound and its introductions' burst. Every wait is bounded.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use blindrelay::gossip::{Announce, MAX_NEW_PER_ANSWER, PER_BLOCK};
use blindrelay::proto::descriptor::Descriptor;
use common::{Doc, Net, http, http_from};
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

/// A descriptor of a fresh identity whose endpoint is in `block` (`127.250.<block>.<host>`).
fn stranger(block: u8, host: u8, now: u64) -> Descriptor {
    let key = SigningKey::from_bytes(&rand::random());
    let onion = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<
        [u8; 32],
    >()))
    .to_bytes();
    Descriptor::sign(
        &key,
        onion,
        format!("https://127.250.{block}.{host}:7001"),
        now,
        3600,
    )
}

/// Announces `descriptor` to `url` from `client`; the answer's status.
async fn announce(client: &reqwest::Client, url: &str, descriptor: Descriptor) -> u16 {
    let resp = client
        .post(url)
        .json(&Announce {
            descriptor,
            news: vec![],
        })
        .send()
        .await
        .expect("post");
    resp.status().as_u16()
}

/// One party announcing 50 identities whose endpoints are in one /24 gets at most the
/// per-block bound of them kept; another, naming a block per identity, gets at most its
/// introductions' burst kept; every announcement is answered, and junk gets a JSON error and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_announced_by_one_party_are_bounded() {
    let net = Net::start_bootstrapped(2, &args(), |i| i.checked_sub(1).into_iter().collect()).await;
    net.wait_routable_within(0, 1, SPREAD).await;
    let now = blindrelay::clock::wall_unix();
    let url = format!("{}/v1/gossip", net.node(0).endpoint);
    let one_block = http_from(Ipv4Addr::new(127, 0, 9, 1));
    for host in 1..=50 {
        assert_eq!(
            announce(&one_block, &url, stranger(7, host, now)).await,
            200
        );
    }
    let gossiped = |s: &serde_json::Value| s.runtime()["peers"]["gossip"].as_u64();
    // Node 1 (it gossiped itself to node 0, which knew nobody), then PER_BLOCK of block 7.
    let s = net.status(0).await;
    assert_eq!(gossiped(&s), Some(1 + PER_BLOCK as u64), "{s}");
    let many_blocks = http_from(Ipv4Addr::new(127, 0, 10, 1));
    for block in 20..40 {
        assert_eq!(
            announce(&many_blocks, &url, stranger(block, 1, now)).await,
            200
        );
    }
    let s = net.status(0).await;
    assert_eq!(
        gossiped(&s),
        Some(1 + (PER_BLOCK + MAX_NEW_PER_ANSWER) as u64),
        "{s}"
    );
    let peers = s.runtime()["peers"].clone();
    // Junk is refused with a JSON error, and changes nothing.
    let resp = http()
        .post(&url)
        .body("not a descriptor")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.expect("JSON error");
    assert_eq!(body["error"], "malformed_envelope", "{body}");
    assert_eq!(net.status(0).await.runtime()["peers"], peers);
}

/// Identities announced to a node whose endpoints answer nothing are probed, never taken as a
/// middle of its routes and never passed on: its sends over three hops all go through the
/// first route they try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_that_answer_nothing_are_never_middles_nor_passed_on() {
    let net = Net::start(4, &args()).await;
    let now = blindrelay::clock::wall_unix();
    let url = format!("{}/v1/gossip", net.node(0).endpoint);
    let party = http_from(Ipv4Addr::new(127, 0, 11, 1));
    for block in 50..58 {
        assert_eq!(announce(&party, &url, stranger(block, 1, now)).await, 200);
    }
    let s = net.status(0).await;
    assert_eq!(s.runtime()["peers"]["known"], 3 + 8, "{s}");
    // The reach probes try them within a few rounds.
    let deadline = std::time::Instant::now() + SPREAD;
    while common::counter(&net.status(0).await, "probe_failed") < 8 {
        assert!(std::time::Instant::now() < deadline, "not probed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for k in 0..12 {
        let (ok, out, err) = net.send(0, 1 + k % 3, 3, b"past the strangers").await;
        assert!(ok && !out.contains("(route "), "send {k}: {out} {err}");
    }
    let s = net.status(0).await;
    assert_eq!(common::counter(&s, "send_rerouted"), 0, "{s}");
    let out_of_routes = common::peer_rows(&s)
        .iter()
        .filter(|r| r["in_routes"] == false)
        .count();
    assert_eq!(out_of_routes, 8, "{s}");
    // Gossip every second: the others heard from node 0 many times, and learned none of them.
    for i in 1..4 {
        let s = net.status(i).await;
        assert_eq!(s.runtime()["peers"]["known"], 3, "node {i}: {s}");
    }
}
