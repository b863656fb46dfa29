//! Verified deliveries per second through real `blindrelay` node processes on loopback, next to
//! the CPU the v2 cryptography of one delivery costs, measured in the same run.
//!
//! Six nodes (`blindrelay run`, the release binary named by `BLINDRELAY_BIN`) on 127.(120 + k).0.1
//! (a /16 each), each
//! with the other five as pinned peers, TLS links, SQLite stores in a temporary directory. Node 0
//! sends (`POST /v1/send` on its operator API: it wraps, posts to the entry hop, and answers once
//! the terminal's receipt opened and verified); node 5 is the terminal; the middles are picked at
//! random among nodes 1–4. For 1, 3 and 5 hops and 1 KiB and 64 KiB payloads: one client for
//! the unloaded latency (p50, p99), then 32 concurrent clients (`--clients N`) for the
//! throughput (deliveries/s, p50, p99); `--hops 3` and `--sizes 1024` pick cases. Every case is
//! bounded in time (2 s alone, 3 s loaded) and count (10 000 sends). Flags after `--` go to every
//! node's `blindrelay run`: `-- --replay-store memory` shows what the durable replay state costs
//! (and `TMPDIR=/dev/shm`, state on tmpfs, what its fsyncs cost).
//!
//! The design's admission limits (20 requests/s per node, 2/s per previous hop, the cheap budget,
//! in-flight shares, the replay and inbox shares) are raised by their flags: they bound what an
//! attacker gets, and would otherwise be what this measures. The figures are the relay's own.
//!
//! The crypto bound: one delivery of *h* hops costs the sender's wrap (`send::wrap::wrap`), *h*
//! hops' `pipeline::check_frame` (signature, peel, expiry, slot) plus the next frame's signature
//! or the terminal's receipt seal, and the sender's receipt check; measured here on one thread.
//! With every core doing nothing else, `cores / that` deliveries/s is the most the machine could
//! do; the ratio says how much of a delivery's time is cryptography.
//!
//! With `--backpressure`: one 3-hop 1 KiB loaded run while 16 connections post frames that each
//! take a crypto slot of node 1 (they pass the framing and the signature and fail at the peel:
//! an onion key nobody holds), half from a known peer's address and half from a stranger's, and
//! the round trip of every answer is kept by the error it names (`backpressure`,
//! `source_limited`, `onion_peel_failed`). Then the same 16 connections to node 1 alone, for
//! 3 s with no deliveries: what saturates the CPU is node 1's own cryptography (and these
//! clients), as on a node that has a machine to itself; node 1's CPU use is printed with it.
//!
//! With `BLINDRELAY_BASELINE=<binary>` (a build of another commit), each round runs the cases
//! on six fresh nodes of the current binary, then on six of the baseline, for `--rounds N`
//! rounds (3 by default), and ends with a table of both builds' medians and the median of the
//! rounds' paired ratios (current ÷ baseline): an A/B in one command. `--rounds N` alone
//! repeats the current binary's runs.
//!
//! Run with `scripts/bench-blindrelay delivery`.

mod crypto;
mod load;
mod nodes;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::process::Child;

use crate::crypto::crypto_cost;
use crate::load::{Overload, overload, percentile, print_overload, run_case};
use crate::nodes::{Node, cpu_now, proc_cpu, spent, start, wait_ready};

const NODES: usize = 6;
/// Concurrent clients of the loaded run unless `--clients N` says otherwise.
const CONCURRENCY: usize = 32;
const ALONE: Duration = Duration::from_secs(2);
const LOADED: Duration = Duration::from_secs(3);
const MAX_SENDS: usize = 10_000;
/// Connections that overload one node's crypto admission in the `--backpressure` run.
const OVERLOAD_CONNS: usize = 16;
const RELAY_PORT: u16 = 7001;
const OPERATOR_PORT: u16 = 7070;

/// `--clients N`, `--hops 1,3,5`, `--sizes 1024,65536`, `--backpressure`, and after `--` flags
/// for every node's `blindrelay run` (`-- --replay-store memory`: what the durable replay state
/// costs).
struct Args {
    clients: usize,
    backpressure: bool,
    rounds: Option<usize>,
    hops: Vec<usize>,
    sizes: Vec<usize>,
    node_flags: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        clients: CONCURRENCY,
        backpressure: false,
        rounds: None,
        hops: vec![1, 3, 5],
        sizes: vec![1024, 64 * 1024],
        node_flags: Vec::new(),
    };
    let list = |v: Option<String>| -> Vec<usize> {
        v.unwrap_or_default()
            .split(',')
            .map(|x| x.parse().expect("a number"))
            .collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--clients" => a.clients = list(it.next())[0].clamp(1, 512),
            "--hops" => a.hops = list(it.next()),
            "--sizes" => a.sizes = list(it.next()),
            "--backpressure" => a.backpressure = true,
            "--rounds" => a.rounds = Some(list(it.next())[0].clamp(1, 50)),
            "--" => a.node_flags = it.by_ref().collect(),
            other => panic!(
                "unknown flag {other} (--clients N, --hops 1,3,5, --sizes 1024,65536, --rounds N, --backpressure, -- node flags)"
            ),
        }
    }
    a
}

#[tokio::main]
async fn main() {
    let args = args();
    let bin = PathBuf::from(
        std::env::var("BLINDRELAY_BIN").unwrap_or_else(|_| "target/release/blindrelay".into()),
    );
    let mut codes = vec![("current", bin)];
    if let Some(b) = std::env::var_os("BLINDRELAY_BASELINE") {
        codes.push(("baseline", PathBuf::from(b)));
    }
    for (_, bin) in &codes {
        assert!(bin.exists(), "no blindrelay binary at {}", bin.display());
    }
    let rounds = args.rounds.unwrap_or(if codes.len() > 1 { 3 } else { 1 });
    blindrelay::links::install_provider();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut results = Vec::new();
    for round in 1..=rounds {
        for (code, (label, bin)) in codes.iter().enumerate() {
            if codes.len() > 1 || rounds > 1 {
                println!("\n### {label} ({}), round {round}\n", bin.display());
            }
            let backpressure = args.backpressure && round == 1 && code == 0;
            for (case, m) in network(bin, &args, cores, backpressure)
                .await
                .into_iter()
                .enumerate()
            {
                results.push((code, case, m));
            }
        }
    }
    if codes.len() > 1 {
        print_ab(&args, &results);
    }
}

/// Six fresh nodes of `bin`: every case of `args` measured and printed, the nodes stopped.
async fn network(bin: &Path, args: &Args, cores: usize, backpressure: bool) -> Vec<Measured> {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = start(bin, root.path(), &args.node_flags).await;
    wait_ready(&nodes).await;
    println!(
        "{NODES} node processes on loopback, {cores} CPU threads; state in {}",
        root.path().display()
    );
    println!();
    println!(
        "| payload | hops | alone: p50 / p99 ms | {} clients: deliveries/s | p50 / p99 ms | failed | crypto per delivery (sender + hops) | crypto bound ({cores} threads) | measured ÷ bound |",
        args.clients
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let terminal = nodes[NODES - 1].id.clone();
    let mut spent_rows = Vec::new();
    let mut measured = Vec::new();
    for &size in &args.sizes {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        for &hops in &args.hops {
            let case = Case {
                terminal: &terminal,
                hops,
                payload: &payload,
                clients: args.clients,
            };
            let (row, spent_row, m) = measure(&nodes, &case, cores).await;
            println!("{row}");
            spent_rows.push(spent_row);
            measured.push(m);
        }
    }
    print_spent(&spent_rows);
    if backpressure {
        backpressure_run(&nodes, &terminal, args.clients, cores).await;
    }
    for node in &mut nodes {
        if let Some(mut child) = node.child.take() {
            let _ = child.kill().await;
        }
    }
    measured
}

/// One case's figures from one loaded run.
#[derive(Clone, Copy)]
struct Measured {
    per_s: f64,
    node_cpu_us: f64,
    crypto_us: f64,
    switches: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// With `BLINDRELAY_BASELINE`: per case, the medians of each build over the rounds and the
/// median of the rounds' paired ratios (current ÷ baseline, the two run one after the other).
fn print_ab(args: &Args, results: &[(usize, usize, Measured)]) {
    println!("\n### current ÷ baseline: medians of the rounds\n");
    println!(
        "| payload | hops | code | deliveries/s | node CPU per delivery | crypto per delivery | node CPU ÷ crypto | node context switches per delivery |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let cases: Vec<(usize, usize)> = args
        .sizes
        .iter()
        .flat_map(|&s| args.hops.iter().map(move |&h| (s, h)))
        .collect();
    for (case, (size, hops)) in cases.iter().enumerate() {
        let of = |code: usize| -> Vec<Measured> {
            results
                .iter()
                .filter(|(c, k, _)| *c == code && *k == case)
                .map(|(_, _, m)| *m)
                .collect()
        };
        for (code, label) in [(0, "current"), (1, "baseline")] {
            let ms = of(code);
            let med = FIGURES.map(|f| median(ms.iter().map(f).collect()));
            let [d, cpu, crypto, ratio, cs] = med;
            println!(
                "| {} KiB | {hops} | {label} | {d:.0} | {cpu:.0} µs | {crypto:.0} µs | {ratio:.2} | {cs:.1} |",
                size / 1024
            );
        }
        let (cur, base) = (of(0), of(1));
        let paired =
            FIGURES.map(|f| median(cur.iter().zip(&base).map(|(a, b)| f(a) / f(b)).collect()));
        let [d, cpu, crypto, ratio, cs] = paired;
        println!(
            "| {} KiB | {hops} | **current ÷ baseline** | **{d:.2}** | **{cpu:.2}** | {crypto:.2} | {ratio:.2} | {cs:.2} |",
            size / 1024
        );
    }
}

/// The figures of the A/B table, in its columns' order.
const FIGURES: [fn(&Measured) -> f64; 5] = [
    |m| m.per_s,
    |m| m.node_cpu_us,
    |m| m.crypto_us,
    |m| m.node_cpu_us / m.crypto_us,
    |m| m.switches,
];

/// One case of the table: deliveries to `terminal` over `hops` hops carrying `payload`.
struct Case<'a> {
    terminal: &'a str,
    hops: usize,
    payload: &'a [u8],
    clients: usize,
}

/// Runs `case` alone and loaded: its row of the main table and its row of the spent table.
async fn measure(nodes: &[Node], case: &Case<'_>, cores: usize) -> (String, String, Measured) {
    let (hops, payload, size) = (case.hops, case.payload, case.payload.len());
    let (mut alone, failed_alone, _) =
        run_case(&nodes[0], case.terminal, hops, payload, 1, ALONE).await;
    alone.sort_unstable();
    let before = spent(nodes).await;
    let (cpu0, switches0, me0) = cpu_now(nodes);
    let (mut loaded, failed, took) = run_case(
        &nodes[0],
        case.terminal,
        hops,
        payload,
        case.clients,
        LOADED,
    )
    .await;
    let (cpu1, switches1, me1) = cpu_now(nodes);
    let after = spent(nodes).await;
    let d: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let delivered = loaded.len().max(1) as f64;
    let per = |x: f64| x / delivered;
    let node_cpu_us = per((cpu1 - cpu0).as_secs_f64() * 1e6);
    let switches = per((switches1 - switches0) as f64);
    let spent_row = format!(
        "| {} KiB | {hops} | {} | {} | {} | {} | {} | {:.0} µs | {:.0} µs | {:.1} |",
        size / 1024,
        loaded.len(),
        d[0],
        d[1],
        d[2],
        d[3],
        node_cpu_us,
        per((me1 - me0).as_secs_f64() * 1e6),
        switches,
    );
    loaded.sort_unstable();
    let per_s = loaded.len() as f64 / took.as_secs_f64();
    let (sender, on_hops) = crypto_cost(hops, payload, 50);
    let crypto = sender + on_hops;
    let bound = cores as f64 / crypto.as_secs_f64();
    let row = format!(
        "| {} KiB | {hops} | {:.2} / {:.2} | {per_s:.0} | {:.1} / {:.1} | {} | {:.0} µs ({:.0} + {:.0}) | {bound:.0}/s | {:.1} % |",
        size / 1024,
        percentile(&alone, 50),
        percentile(&alone, 99),
        percentile(&loaded, 50),
        percentile(&loaded, 99),
        failed + failed_alone,
        crypto.as_secs_f64() * 1e6,
        sender.as_secs_f64() * 1e6,
        on_hops.as_secs_f64() * 1e6,
        100.0 * per_s / bound,
    );
    let m = Measured {
        per_s,
        node_cpu_us,
        crypto_us: crypto.as_secs_f64() * 1e6,
        switches,
    };
    (row, spent_row, m)
}

/// The spent table: what the loaded runs cost besides deliveries.
fn print_spent(rows: &[String]) {
    println!();
    println!(
        "During the loaded runs, summed over the nodes (`GET /metrics`, `/proc`): relay requests received, `backpressure` refusals, busy retries, requests paced; CPU time of the six node processes and of this harness's clients, and the nodes' context switches, per delivery."
    );
    println!();
    println!(
        "| payload | hops | deliveries | relay requests | backpressure | busy retries | paced | node CPU per delivery | client CPU per delivery | node context switches per delivery |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for row in rows {
        println!("{row}");
    }
}

/// `--backpressure`: one 3-hop 1 KiB loaded run while node 1's crypto slots are overloaded,
/// then the same overload of node 1 alone.
async fn backpressure_run(nodes: &[Node], terminal: &str, clients: usize, cores: usize) {
    let payload: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
    let until = Instant::now() + LOADED;
    // Half the connections from a known peer's address (node 2, pinned at node 1), half
    // from a stranger's (an address no node has).
    let stranger = Ipv4Addr::new(127, 0, 99, 1);
    let (sent, known, strange) = tokio::join!(
        run_case(&nodes[0], terminal, 3, &payload, clients, LOADED),
        overload(&nodes[1], nodes[2].ip, OVERLOAD_CONNS / 2, until),
        overload(&nodes[1], stranger, OVERLOAD_CONNS / 2, until),
    );
    let (delivered, failed, took) = sent;
    println!();
    println!(
        "Overload: {} clients sending 3-hop 1 KiB deliveries, and {OVERLOAD_CONNS} connections posting frames that take a crypto slot each to node 1 (half from a known peer's address, half from a stranger's), for {} s.",
        clients,
        LOADED.as_secs()
    );
    println!();
    print_overload(&known, &strange);
    println!(
        "\nDuring it: {:.0} deliveries/s, {failed} failed; {} prober requests failed in transport.",
        delivered.len() as f64 / took.as_secs_f64(),
        known.errors + strange.errors
    );
    overload_alone(nodes, stranger, cores).await;
}

/// The same overload of node 1 alone: the other nodes and the delivery clients idle, so what
/// saturates the CPU is node 1's own cryptography (and these clients).
async fn overload_alone(nodes: &[Node], stranger: Ipv4Addr, cores: usize) {
    let node1 = nodes[1].child.as_ref().and_then(Child::id);
    let before = (node1.and_then(proc_cpu), Instant::now());
    let until = Instant::now() + LOADED;
    let (known, strange): (Overload, Overload) = tokio::join!(
        overload(&nodes[1], nodes[2].ip, OVERLOAD_CONNS / 2, until),
        overload(&nodes[1], stranger, OVERLOAD_CONNS / 2, until),
    );
    let busy = match (before, node1.and_then(proc_cpu)) {
        ((Some((c0, _)), t0), Some((c1, _))) => {
            100.0 * (c1 - c0).as_secs_f64() / t0.elapsed().as_secs_f64()
        }
        _ => f64::NAN,
    };
    println!();
    println!(
        "The same {OVERLOAD_CONNS} connections to node 1 alone, no deliveries, for {} s: node 1 used {busy:.0} % of one CPU thread ({cores} in all).",
        LOADED.as_secs()
    );
    println!();
    print_overload(&known, &strange);
    println!(
        "\n{} prober requests failed in transport.",
        known.errors + strange.errors
    );
}
