//! The discovery simulator: `N` nodes (10 000 by default), each a `blindrelay::discovery`
//! machine, the functions the daemon drives, over in-memory links (40–60 ms one way) on a
//! virtual clock (`blindrelay::discovery::sim`). Printed, in order:
//!
//! 1. convergence: every node started at once with one bootstrap peer (a node before it, at
//!    random): the virtual time until every node holds and reached every other;
//! 2. a newcomer with one bootstrap peer: the time and bytes until it holds the whole network;
//! 3. its descriptor: the time until 99 % (and 100 %) of the nodes hold it;
//! 4. steady state: bytes sent and received per node per second over `--steady` seconds;
//! 5. memory: the process's peak resident size over the nodes (bytes per node).
//!
//! `cargo run --release -p blindrelay --example simulate -- [--nodes N] [--steady S]`
//! (`scripts/bench-simulate`). No network, no file: one process, one thread.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use blindrelay::discovery::sim::{Net, SimConfig};

const T0: u64 = 1_800_000_000;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Node `i`'s address: its own /16 of 10/8 and 100.64/10 (30 000 /16s).
fn ip(i: usize) -> IpAddr {
    let (a, b) = (i / 256, i % 256);
    IpAddr::from([10 + (a / 256) as u8, (a % 256) as u8, b as u8, 1])
}

fn holds_all(net: &Net, n: usize) -> bool {
    (0..n).all(|i| {
        let v = net.nodes[i].disc.view();
        v.len() >= n - 1 && v.waiting() == 0
    })
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn bytes(net: &Net) -> (u64, u64) {
    net.nodes.iter().fold((0, 0), |(s, r), n| {
        let st = n.disc.stats();
        (s + st.bytes_sent, r + st.bytes_received)
    })
}

fn main() {
    let n = arg("--nodes", 10_000) as usize;
    let steady = arg("--steady", 1800);
    let wall = Instant::now();
    let cfg = SimConfig {
        seed: arg("--seed", 1),
        ..SimConfig::default()
    };
    let mut net = Net::new(cfg, Instant::now(), T0);
    net.grow(n, ip);
    println!("simulate: {n} nodes, interval {:?}", cfg.interval);
    converge(&mut net, n, arg("--progress", 0) > 0, wall);
    newcomer(&mut net, n);
    steady_state(&mut net, n, steady);
    let (peak, now) = (rss_kib("VmHWM:"), rss_kib("VmRSS:"));
    println!(
        "5. resident now {} MiB ({} KiB per node), peak {} MiB; wall time {:.0} s",
        now / 1024,
        now / (n as u64 + 1),
        peak / 1024,
        wall.elapsed().as_secs_f64()
    );
}

/// 1. Every node started at once with one bootstrap peer: until all hold and reached all.
fn converge(net: &mut Net, n: usize, progress: bool, wall: Instant) {
    let mut last = 0;
    let converged = net.run_until(Duration::from_secs(3600), |net| {
        let t = net.elapsed().as_secs();
        if progress && t >= last + 30 {
            last = t;
            let lens: Vec<usize> = (0..n).map(|i| net.nodes[i].disc.view().len()).collect();
            let waiting: usize = (0..n).map(|i| net.nodes[i].disc.view().waiting()).sum();
            let short = lens.iter().filter(|l| **l < n - 1).count();
            println!(
                "   {t} s: min view {}, {short} nodes short, {waiting} waiting",
                lens.iter().min().unwrap_or(&0)
            );
        }
        holds_all(net, n)
    });
    println!(
        "1. convergence from one bootstrap peer each: {} after {:.0} s virtual ({:.0} s wall, {} events)",
        if converged {
            "converged"
        } else {
            "NOT converged"
        },
        net.elapsed().as_secs_f64(),
        wall.elapsed().as_secs_f64(),
        net.events
    );
}

/// 2. and 3. A newcomer with one bootstrap peer: its sync, then its descriptor's spread.
fn newcomer(net: &mut Net, n: usize) {
    let t = net.elapsed();
    let boot = net.random_below(n);
    let newcomer = net.add(ip(n), &[boot]);
    let synced = net.run_until(t + Duration::from_secs(600), |net| {
        net.nodes[newcomer].disc.view().len() >= n
    });
    let st = net.nodes[newcomer].disc.stats();
    println!(
        "2. newcomer: holds all {n} after {:.1} s ({}), {} KiB received, {} KiB sent, {} exchanges",
        (net.elapsed() - t).as_secs_f64(),
        if synced { "synced" } else { "NOT synced" },
        st.bytes_received / 1024,
        st.bytes_sent / 1024,
        st.exchanges
    );
    let id = net.nodes[newcomer].id();
    let holders = |net: &Net| {
        (0..n)
            .filter(|i| net.nodes[*i].disc.view().get(&id).is_some())
            .count()
    };
    let r99 = net.run_until(t + Duration::from_secs(900), |net| {
        holders(net) * 100 >= n * 99
    });
    let t99 = net.elapsed() - t;
    let r100 = net.run_until(t + Duration::from_secs(900), |net| holders(net) == n);
    println!(
        "3. its descriptor: 99 % of nodes after {:.1} s{}, 100 % after {:.1} s{}",
        t99.as_secs_f64(),
        if r99 { "" } else { " (NOT reached)" },
        (net.elapsed() - t).as_secs_f64(),
        if r100 { "" } else { " (NOT reached)" }
    );
}

/// 4. Bytes per node per second over `secs` (a reissue period covers every node's refresh).
fn steady_state(net: &mut Net, n: usize, secs: u64) {
    let (s0, r0) = bytes(net);
    let t = net.elapsed();
    net.run_until(t + Duration::from_secs(secs), |_| false);
    let (s1, r1) = bytes(net);
    let per = |b: u64| b as f64 / (n + 1) as f64 / secs as f64;
    println!(
        "4. steady state over {secs} s: {:.0} B/s sent, {:.0} B/s received per node",
        per(s1 - s0),
        per(r1 - r0)
    );
}
