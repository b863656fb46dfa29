//! A split of the network longer than a descriptor's life heals by discovery alone, on real
//! processes, each node in a /16 of its own: the halves forget each other's nodes when their
//! descriptors lapse, keep greeting them, and route across again within a few discovery
//! intervals of the split's end. Every wait is bounded.

use crate::common;

use std::time::{Duration, Instant};

use common::{Doc, Net};
use serde_json::Value;

/// A number of `runtime.peers` (`routable`, `lapsed`, …).
fn peers_n(s: &Value, name: &str) -> u64 {
    s.runtime()["peers"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no peers.{name} in {s}"))
}

/// Descriptors valid for a minute (signed again every 30 s), gossip every second, no probe
/// rounds, and the `--peer` URLs fetched at start only (nothing but discovery heals).
const ARGS: [&str; 8] = [
    "--descriptor-lifetime",
    "60s",
    "--gossip-interval",
    "1s",
    "--probe-interval",
    "0s",
    "--peer-refresh",
    "10m",
];
/// How long the halves are apart at least: longer than a descriptor's life.
const SPLIT: Duration = Duration::from_secs(75);

/// Six nodes, each with the one before as its `--peer` (the halves {0,1,2} and {3,4,5} meet
/// only at 2 and 3, and by discovery). Once every node routes to the five others, nodes 3, 4
/// and 5 are stopped (SIGSTOP) for at least 75 s: nodes 0 to 2 stop routing to them when their
/// descriptors expire and keep them as lapsed. Continued (SIGCONT), every node routes to the
/// five others again within 30 s, and sends of three hops cross the halves both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_longer_than_a_descriptors_life_heals() {
    let started = Instant::now();
    let net = Net::start_bootstrapped(6, &ARGS, |i| i.checked_sub(1).into_iter().collect()).await;
    for i in 0..6 {
        net.wait_routable_within(i, 5, Duration::from_secs(20))
            .await;
    }
    let stop = Instant::now();
    for i in 3..6 {
        net.signal(i, "STOP");
    }
    // Their last descriptors expire within a lifetime; each is taken out of the view (and kept
    // as lapsed) when upkeep reaches the minute it expired in: at most a minute after.
    for i in 0..3 {
        net.wait_routable_within(i, 2, Duration::from_secs(65))
            .await;
    }
    eprintln!("the stopped half unroutable after {:?}", stop.elapsed());
    for i in 0..3 {
        let within = Duration::from_secs(130).saturating_sub(stop.elapsed());
        net.wait_status(i, within, "lapsed", |s| peers_n(s, "lapsed") >= 1)
            .await;
    }
    eprintln!("lapsed after {:?}", stop.elapsed());
    if let Some(rest) = SPLIT.checked_sub(stop.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    for i in 0..3 {
        let s = net.status(i).await;
        assert_eq!(peers_n(&s, "routable"), 2, "node {i}: {s}");
    }
    let split = stop.elapsed();
    for i in 3..6 {
        net.signal(i, "CONT");
    }
    let healing = Instant::now();
    for i in 0..6 {
        let within = Duration::from_secs(30).saturating_sub(healing.elapsed());
        net.wait_routable_within(i, 5, within).await;
    }
    eprintln!("split {split:?}, healed after {:?}", healing.elapsed());
    for (from, to) in [(0, 5), (5, 0), (1, 4)] {
        let (ok, _, err) = net.send(from, to, 3, b"across the old split").await;
        assert!(ok, "{from} to {to}: {err}");
    }
    for i in 0..6 {
        let s = net.status(i).await;
        eprintln!(
            "node {i}: lapsed {}, revived {}",
            peers_n(&s, "lapsed"),
            s.runtime()["peers"]["discovery"]["counters"]["revived"]
        );
    }
    eprintln!("total {:?}", started.elapsed());
}
