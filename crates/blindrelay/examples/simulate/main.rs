//! The discovery simulator: `N` nodes (10 000 by default), each a `blindrelay::discovery`
//! machine, the functions the daemon drives, over in-memory links (40–60 ms one way) on a
//! virtual clock (`blindrelay::discovery::sim`). Printed, in order:
//!
//! 1. convergence: every node started at once with one bootstrap peer (a node before it, at
//!    random): the virtual time until every node holds and reached every other;
//! 2. a newcomer with one bootstrap peer: the time, bytes and exchanges until it holds the
//!    whole network, and until it routes to every node (reached each);
//! 3. its descriptor: the time until 99 % (and 100 %) of the nodes hold it;
//! 4. steady state: bytes sent and received per node per second over `--steady` seconds (600
//!    by default; every node's first descriptor is dated back by up to half its life, so the
//!    reissues are spread over time as in a network whose nodes started apart);
//! 5. memory: the process's resident size over the nodes;
//! 6. Sybils: 500 identities in 250 /16s join; the share of three-hop routes honest nodes
//!    choose whose every middle is theirs, on each day of their first week;
//! 7. 30 % of the nodes killed at once: after `--after` seconds, the share of 1 000 sends over
//!    three hops delivered (route choice by `blindrelay::send::path::choose`, at most
//!    `blindrelay::send::MAX_ROUTES` routes, a failed hop avoided as the daemon avoids it);
//! 8. eclipse: a node whose only bootstrap peer serves only its own 20 Sybils; what it knows,
//!    what it says, then the time until a seed list (a third of it dead, as after step 7)
//!    brings it the honest network, and until it routes to every live honest node.
//!
//! `cargo run --release -p blindrelay --example simulate -- [--nodes N] [--interval S]
//! [--steady S] [--after S] [--seed K]` (`scripts/bench-simulate`). No network, no file: one
//! process. `--sybils 0` skips step 6. `--cpu-us U [--cores C] [--slot-us H]`: every node on
//! one machine of `C` cores (this one's by default), an exchange `U` µs of work, a crypto slot
//! held `H` µs beyond it (`discovery::sim::Cpu`), as in `scripts/bench-network`.

mod attacks;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use blindrelay::discovery::sim::{Cpu, Net, SimConfig};

const T0: u64 = 1_800_000_000;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Node `i`'s address: a /16 of its own (43 520 of them: first octets 11–99 and 101–181,
/// clear of the Sybils', the liar's and the victim's), as in the real-process benchmark.
fn ip(i: usize) -> IpAddr {
    let firsts: Vec<u8> = (11..=99).chain(101..=181).collect();
    let (a, b) = (firsts[(i / 256) % firsts.len()], (i % 256) as u8);
    IpAddr::from([a, b, 0, 1])
}

/// The machine's threads: the simulator's shards by default.
fn threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
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

fn by_kind(net: &Net) -> [u64; 8] {
    let mut out = [0; 8];
    for n in &net.nodes {
        for (o, b) in out.iter_mut().zip(n.disc.stats().bytes_by_kind) {
            *o += b;
        }
    }
    out
}

fn bytes(net: &Net) -> (u64, u64) {
    net.nodes.iter().fold((0, 0), |(s, r), n| {
        let st = n.disc.stats();
        (s + st.bytes_sent, r + st.bytes_received)
    })
}

fn main() {
    let n = arg("--nodes", 10_000) as usize;
    let interval = Duration::from_secs(arg("--interval", 60));
    let wall = Instant::now();
    let cfg = SimConfig {
        seed: arg("--seed", 1),
        interval,
        shards: arg("--shards", threads()) as usize,
        stagger: true,
        cpu: (arg("--cpu-us", 0) > 0).then(|| Cpu {
            cores: arg("--cores", threads()) as usize,
            per_exchange: Duration::from_micros(arg("--cpu-us", 0)),
            slot_hold: Duration::from_micros(arg("--slot-us", 0)),
        }),
        ..SimConfig::default()
    };
    let mut net = Net::new(cfg, Instant::now(), T0);
    net.grow(n, ip);
    let machine = cfg.cpu.map_or(String::new(), |c| {
        format!(
            "; one machine for all: {} cores, {} µs per exchange",
            c.cores,
            c.per_exchange.as_micros()
        )
    });
    println!(
        "simulate: {n} nodes, interval {interval:?}, {} shards{machine}",
        cfg.shards_used(n)
    );
    converge(&mut net, n, arg("--progress", 0) > 0, wall);
    if arg("--converge-only", 0) > 0 {
        return;
    }
    newcomer(&mut net, n);
    steady_state(&mut net, n, arg("--steady", 600));
    let (peak, now) = (rss_kib("VmHWM:"), rss_kib("VmRSS:"));
    println!(
        "5. resident now {} MiB ({} KiB per node), peak {} MiB; wall time so far {:.0} s",
        now / 1024,
        now / (n as u64 + 1),
        peak / 1024,
        wall.elapsed().as_secs_f64()
    );
    let mut heap = [0usize; 6];
    for node in &net.nodes {
        for (h, b) in heap.iter_mut().zip(node.disc.view().heap_bytes()) {
            *h += b;
        }
    }
    let held: usize = net.nodes.iter().map(|x| x.disc.view().len()).sum();
    let per: Vec<String> = ["table", "all", "passable", "expiry", "blocks", "roots"]
        .iter()
        .zip(heap)
        .map(|(name, b)| format!("{name} {:.0}", b as f64 / held.max(1) as f64))
        .collect();
    println!("   view bytes per identity held: {}", per.join(", "));
    let mut at = wall.elapsed();
    let mut lap = |name: &str| {
        let now = wall.elapsed();
        println!("   ({name}: {:.0} s wall)", (now - at).as_secs_f64());
        at = now;
    };
    if arg("--sybils", 1) > 0 {
        attacks::sybils(&mut net, n, interval);
        lap("Sybils");
    }
    attacks::deaths(&mut net, n, Duration::from_secs(arg("--after", 60)));
    lap("deaths");
    attacks::eclipse(&mut net, n, interval);
    lap("eclipse");
    println!("wall time {:.0} s", wall.elapsed().as_secs_f64());
}

/// Where the heap goes, in MiB over all nodes.
fn memory(net: &Net) -> String {
    let (mut view, mut rest) = ([0usize; 6], [0usize; 4]);
    for node in &net.nodes {
        for (h, b) in view.iter_mut().zip(node.disc.view().heap_bytes()) {
            *h += b;
        }
        for (h, b) in rest.iter_mut().zip(node.disc.heap_bytes()) {
            *h += b;
        }
    }
    let names = ["table", "all", "passable", "expiry", "blocks", "roots"];
    let more = ["sessions", "push", "probes", "in flight"];
    let parts: Vec<String> = names
        .iter()
        .zip(view)
        .chain(more.iter().zip(rest))
        .map(|(name, b)| format!("{name} {}", b >> 20))
        .collect();
    format!(
        "MiB: {}; resident {}",
        parts.join(", "),
        rss_kib("VmRSS:") >> 10
    )
}

/// 1. Every node started at once with one bootstrap peer: until all hold and reached all.
fn converge(net: &mut Net, n: usize, progress: bool, wall: Instant) {
    let mut last = 0;
    // When each node first held and reached every other (virtual seconds).
    let mut done: Vec<Option<u64>> = vec![None; n];
    let converged = net.run_until(Duration::from_secs(3600), |net| {
        let t = net.elapsed().as_secs();
        if progress && t >= last + 30 {
            last = t;
            let lens: Vec<usize> = (0..n).map(|i| net.nodes[i].disc.view().len()).collect();
            let waiting: usize = (0..n).map(|i| net.nodes[i].disc.view().waiting()).sum();
            let short = lens.iter().filter(|l| **l < n - 1).count();
            println!(
                "   {t} s: min view {}, {short} nodes short, {waiting} waiting; {}",
                lens.iter().min().unwrap_or(&0),
                memory(net)
            );
        }
        for (i, at) in done.iter_mut().enumerate().filter(|(_, at)| at.is_none()) {
            let v = net.nodes[i].disc.view();
            if v.len() >= n - 1 && v.waiting() == 0 {
                *at = Some(t);
            }
        }
        done.iter().all(Option::is_some)
    });
    let mut times: Vec<u64> = done.iter().flatten().copied().collect();
    times.sort_unstable();
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
    if let Some(m) = times.get(times.len() / 2) {
        println!("   the median node held and reached every other after {m} s");
    }
    let sum = |f: fn(&blindrelay::discovery::Stats) -> u64| {
        net.nodes.iter().map(|x| f(&x.disc.stats())).sum::<u64>() as f64 / n.max(1) as f64
    };
    println!(
        "   until then, per node: {:.0} exchanges ({:.0} failed, {:.0} busy, {:.0} of them no room \
         to leave), {:.1} reconciliations, {:.0} pushes",
        sum(|s| s.exchanges),
        sum(|s| s.exchanges_failed),
        sum(|s| s.exchanges_busy),
        sum(|s| s.exchanges_deferred),
        sum(|s| s.syncs),
        sum(|s| s.pushes)
    );
    let (timed, mean) = net.exchange_time();
    println!(
        "   until then, an exchange took {:.1} ms on average ({timed} answered or refused)",
        mean.as_secs_f64() * 1000.0
    );
}

/// Steps 2 and 3, watched together: a newcomer with one bootstrap peer, its sync (until it
/// holds every node, then until it routes to every one), and its descriptor's spread. On one
/// shared machine, it joins once the machine is idle (the last pushes of the start done), as
/// in `scripts/bench-network`, whose newcomers join a network formed a minute before.
fn newcomer(net: &mut Net, n: usize) {
    let t = net.elapsed();
    net.run_until(t + Duration::from_secs(60), Net::machine_idle);
    let t = net.elapsed();
    let boot = net.random_below(n);
    let newcomer = net.add(ip(n), &[boot]);
    let id = net.nodes[newcomer].id();
    // When each first held: (time, the newcomer's counters then).
    let (mut held, mut routes) = (None, None);
    let (mut t99, mut t100) = (None, None);
    net.run_until(t + Duration::from_secs(900), |net| {
        let at = net.elapsed() - t;
        let d = &net.nodes[newcomer].disc;
        let v = d.view();
        if held.is_none() && v.len() >= n {
            held = Some((at, d.stats()));
        }
        if routes.is_none() && v.len() >= n && v.waiting() == 0 {
            routes = Some((at, d.stats()));
        }
        let holders = (0..n)
            .filter(|i| net.nodes[*i].disc.view().get(&id).is_some())
            .count();
        if t99.is_none() && holders * 100 >= n * 99 {
            t99 = Some(at);
        }
        if t100.is_none() && holders == n {
            t100 = Some(at);
        }
        held.is_some() && routes.is_some() && t100.is_some()
    });
    let line = |what: &str, done: &str, x: Option<(Duration, blindrelay::discovery::Stats)>| {
        x.map_or(format!("{what} NOT within 900 s"), |(at, st)| {
            format!(
                "{what} after {:.1} s ({done}), {} KiB received, {} KiB sent, {} exchanges ({} \
                 busy)",
                at.as_secs_f64(),
                st.bytes_received / 1024,
                st.bytes_sent / 1024,
                st.exchanges,
                st.exchanges_busy
            )
        })
    };
    println!(
        "2. newcomer: {}",
        line(&format!("holds all {n}"), "synced", held)
    );
    println!("   {}", line("routes to every one", "reached", routes));
    let secs = |x: Option<Duration>| {
        x.map_or("NOT within 900 s".to_string(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "3. its descriptor: 99 % of nodes after {}, 100 % after {}",
        secs(t99),
        secs(t100)
    );
}

/// 4. Bytes per node per second over `secs` (reissues spread over time: see the docs above).
fn steady_state(net: &mut Net, n: usize, secs: u64) {
    let (s0, r0) = bytes(net);
    let k0 = by_kind(net);
    let t = net.elapsed();
    net.run_until(t + Duration::from_secs(secs), |_| false);
    let (s1, r1) = bytes(net);
    let per = |b: u64| b as f64 / (n + 1) as f64 / secs as f64;
    println!(
        "4. steady state over {secs} s: {:.0} B/s sent, {:.0} B/s received per node",
        per(s1 - s0),
        per(r1 - r0)
    );
    let kinds: Vec<String> = blindrelay::discovery::Msg::KINDS
        .iter()
        .zip(by_kind(net).iter().zip(k0))
        .map(|(name, (b, b0))| format!("{name} {:.0}", per(b - b0) / 2.0))
        .collect();
    println!("   by message, B/s per node each way: {}", kinds.join(", "));
}
