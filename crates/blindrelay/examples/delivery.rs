//! Verified deliveries per second through real `blindrelay` node processes on loopback, next to
//! the CPU the v2 cryptography of one delivery costs, measured in the same run.
//!
//! Six nodes (`blindrelay run`, the release binary named by `BLINDRELAY_BIN`) on 127.0.0.x, each
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
//! Run with `scripts/bench-blindrelay delivery`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use blindrelay::pipeline::{self, HopNext};
use blindrelay::proto::frame::Frame;
use blindrelay::proto::receipt;
use blindrelay::send::Hop;
use ed25519_dalek::SigningKey;
use tokio::process::{Child, Command};
use x25519_dalek::{PublicKey, StaticSecret};

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

/// The flags that lift the design's admission limits out of the way.
const UNLIMITED: &[&str] = &[
    "--probe-interval",
    "0s",
    "--allow-private-endpoints",
    "--admission-per-minute",
    "6000000",
    "--previous-hop-limit",
    "1000000",
    "--cheap-per-second",
    "100000",
    "--max-in-flight",
    "256",
    "--in-flight-per-source",
    "256",
    "--per-next-hop",
    "64",
    "--next-hop-queue",
    "256",
    "--next-hop-queue-bytes",
    "268435456",
    "--outbound-queue",
    "1024",
    "--outbound-queue-bytes",
    "1073741824",
    "--replay-capacity",
    "1000000",
    "--replay-share",
    "100",
    "--inbox-max-items",
    "1000000",
    "--inbox-max-bytes",
    "17179869184",
    "--inbox-share",
    "100",
];

struct Node {
    ip: Ipv4Addr,
    id: String,
    dir: PathBuf,
    child: Option<Child>,
}

/// A loopback address whose relay and operator ports are free now.
fn free_ip(k: &mut u8) -> Ipv4Addr {
    loop {
        *k = k.wrapping_add(1).max(1);
        let ip = Ipv4Addr::new(127, 0, 88, *k);
        let free = [RELAY_PORT, OPERATOR_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok());
        if free {
            return ip;
        }
    }
}

async fn start(bin: &Path, root: &Path, node_flags: &[String]) -> Vec<Node> {
    let mut k = 0u8;
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let ip = free_ip(&mut k);
        let dir = root.join(format!("node{i}"));
        let out = Command::new(bin)
            .args(["init", "--state-dir"])
            .arg(&dir)
            .args(["--endpoint", &format!("https://{ip}:{RELAY_PORT}")])
            .output()
            .await
            .expect("blindrelay init");
        assert!(out.status.success(), "init failed");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        nodes.push(Node {
            ip,
            id,
            dir,
            child: None,
        });
    }
    for i in 0..NODES {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--state-dir".into(),
            nodes[i].dir.display().to_string(),
            "--listen".into(),
            format!("{}:{RELAY_PORT}", nodes[i].ip),
            "--operator".into(),
            format!("{}:{OPERATOR_PORT}", nodes[i].ip),
        ];
        for (j, other) in nodes.iter().enumerate() {
            if j != i {
                args.push("--peer".into());
                args.push(format!("{}@https://{}:{RELAY_PORT}", other.id, other.ip));
            }
        }
        args.extend(UNLIMITED.iter().map(|s| s.to_string()));
        args.extend(node_flags.iter().cloned());
        let child = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("blindrelay run");
        nodes[i].child = Some(child);
    }
    nodes
}

fn operator_client(node: &Node) -> reqwest::Client {
    let cookie = std::fs::read_to_string(node.dir.join("operator.cookie")).unwrap_or_default();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(v) = format!("Bearer {}", cookie.trim()).parse() {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Waits (at most 20 s, polling the status) until every node routes to the five others.
async fn wait_ready(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for node in nodes {
        let url = format!("http://{}:{OPERATOR_PORT}/v1/status", node.ip);
        loop {
            assert!(Instant::now() < deadline, "the nodes did not come up");
            let http = operator_client(node);
            let routable = match http.get(&url).send().await {
                Ok(r) => r.json::<serde_json::Value>().await.ok().and_then(|v| {
                    v["system_stats"]["discovery_status"]["peer_store"]["runtime"]["peers"]
                            ["routable"]
                            .as_u64()
                }),
                Err(_) => None,
            };
            if routable == Some(NODES as u64 - 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Sends with `clients` concurrent loops for `len`, at most `MAX_SENDS`: successes' latencies
/// and the failures.
async fn run_case(
    sender: &Node,
    to: &str,
    hops: usize,
    payload: &[u8],
    clients: usize,
    len: Duration,
) -> (Vec<Duration>, usize, Duration) {
    let http = operator_client(sender);
    let url = format!(
        "http://{}:{OPERATOR_PORT}/v1/send?to={to}&hops={hops}",
        sender.ip
    );
    let started = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let until = t0 + len;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, url, body, started) = (
            http.clone(),
            url.clone(),
            payload.to_vec(),
            Arc::clone(&started),
        );
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (Vec::new(), 0usize);
            while Instant::now() < until && started.fetch_add(1, Ordering::Relaxed) < MAX_SENDS {
                let t = Instant::now();
                match http.post(&url).body(body.clone()).send().await {
                    Ok(r) if r.status().is_success() => ok.push(t.elapsed()),
                    Ok(r) => {
                        if failed == 0 && std::env::var_os("DELIVERY_DEBUG").is_some() {
                            let status = r.status();
                            eprintln!("failed: {status} {}", r.text().await.unwrap_or_default());
                        }
                        failed += 1;
                    }
                    Err(e) => {
                        if failed == 0 && std::env::var_os("DELIVERY_DEBUG").is_some() {
                            eprintln!("failed: {e}");
                        }
                        failed += 1;
                    }
                }
            }
            (ok, failed)
        }));
    }
    let (mut all, mut failed) = (Vec::new(), 0);
    for t in tasks {
        let (ok, f) = t.await.expect("client task");
        all.extend(ok);
        failed += f;
    }
    (all, failed, t0.elapsed())
}

/// The counters every node's `GET /metrics` shows that say what a loaded run spent besides
/// deliveries, summed over the nodes: relay requests received, `backpressure` refusals, busy
/// retries (of `backpressure`, `source_limited`, `route_in_flight`), requests that waited for
/// their turn (`paced`).
const SPENT: [&str; 4] = [
    "blindrelay_received_total",
    "blindrelay_backpressure_dropped_total",
    "blindrelay_busy_retried_total",
    "blindrelay_paced_total",
];

async fn spent(nodes: &[Node]) -> [u64; 4] {
    let mut sum = [0u64; 4];
    for node in nodes {
        let url = format!("http://{}:{OPERATOR_PORT}/metrics", node.ip);
        let Ok(r) = operator_client(node).get(&url).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(name), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            if let Some(i) = SPENT.iter().position(|s| *s == name) {
                sum[i] += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

/// CPU time (user + system) and context switches of a process, all its threads, from
/// `/proc` (Linux; `None` elsewhere). `/proc`'s ticks are 1/100 s on Linux.
fn proc_cpu(pid: u32) -> Option<(Duration, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some((Duration::from_millis(ticks * 10), switches))
}

/// CPU time and context switches of every node process and of this harness (its clients).
fn cpu_now(nodes: &[Node]) -> (Duration, u64, Duration) {
    let (mut cpu, mut switches) = (Duration::ZERO, 0);
    for node in nodes {
        if let Some((c, s)) = node.child.as_ref().and_then(Child::id).and_then(proc_cpu) {
            cpu += c;
            switches += s;
        }
    }
    let me = proc_cpu(std::process::id()).map_or(Duration::ZERO, |(c, _)| c);
    (cpu, switches, me)
}

/// The overload's answers as a Markdown table: by source, by the error named, their round trips.
fn print_overload(known: &Overload, strange: &Overload) {
    println!("| from | answer | count | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|---:|");
    for (from, probed) in [("known peer", known), ("stranger", strange)] {
        for (error, v) in &probed.answers {
            println!(
                "| {from} | `{error}` | {} | {:.2} | {:.2} | {:.2} |",
                v.len(),
                percentile(v, 50),
                percentile(v, 99),
                v.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
            );
        }
    }
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1000.0
}

/// Answers to requests that overload one node's crypto admission, by the error they got
/// (`backpressure`, `source_limited`, `onion_peel_failed`, …): how fast each came.
#[derive(Default)]
struct Overload {
    answers: std::collections::BTreeMap<String, Vec<Duration>>,
    errors: usize,
}

/// `conns` loops post from `from`, until `until`, a frame to `target` that passes the framing
/// and the signature and fails at the peel (an onion key nobody holds): each costs the node a
/// crypto slot, so together they keep the slots taken. Every answer's round trip is kept, by
/// the error it names.
async fn overload(target: &Node, from: Ipv4Addr, conns: usize, until: Instant) -> Overload {
    let id: [u8; 32] = hex::decode(&target.id)
        .ok()
        .and_then(|v| v.try_into().ok())
        .expect("a node id");
    let prober = SigningKey::from_bytes(&[201; 32]);
    let bogus = PublicKey::from(&StaticSecret::from([202; 32])).to_bytes();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let path = [Hop {
        node_id: id,
        onion_key: bogus,
    }];
    let frame = blindrelay::send::wrap::wrap(&path, &[0; 1024], false, now, &prober)
        .expect("wraps")
        .frame;
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .no_proxy()
        .local_address(Some(from.into()))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let url = format!("https://{}:{RELAY_PORT}/v2/relay", target.ip);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (http, url, frame) = (http.clone(), url.clone(), frame.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Overload::default();
            let mut n = 0;
            while Instant::now() < until && n < MAX_SENDS {
                n += 1;
                let t = Instant::now();
                match http.post(&url).body(frame.clone()).send().await {
                    Ok(r) => {
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        let took = t.elapsed();
                        let error = body["error"].as_str().unwrap_or("(no error)").to_owned();
                        out.answers.entry(error).or_default().push(took);
                    }
                    Err(_) => out.errors += 1,
                }
            }
            out
        }));
    }
    let mut all = Overload::default();
    for t in tasks {
        let o = t.await.expect("prober task");
        for (error, took) in o.answers {
            all.answers.entry(error).or_default().extend(took);
        }
        all.errors += o.errors;
    }
    for v in all.answers.values_mut() {
        v.sort_unstable();
    }
    all
}

/// One thread's CPU for the cryptography of one delivery over `hops` hops with `payload`:
/// (sender's wrap and receipt check, all hops' check and signing), the minimum of `rounds`.
fn crypto_cost(hops: usize, payload: &[u8], rounds: usize) -> (Duration, Duration) {
    let keys: Vec<(SigningKey, StaticSecret)> = (0..hops)
        .map(|i| {
            (
                SigningKey::from_bytes(&[i as u8 + 1; 32]),
                StaticSecret::from([i as u8 + 101; 32]),
            )
        })
        .collect();
    let path: Vec<Hop> = keys
        .iter()
        .map(|(s, o)| Hop {
            node_id: s.verifying_key().to_bytes(),
            onion_key: PublicKey::from(o).to_bytes(),
        })
        .collect();
    let me = SigningKey::from_bytes(&[77; 32]);
    let now = 1_800_000_000;
    let (mut best_sender, mut best_hops) = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds {
        let t = Instant::now();
        let wrapped = blindrelay::send::wrap::wrap(&path, payload, false, now, &me).expect("wraps");
        let mut sender = t.elapsed();
        let mut frame = Frame::decode(&wrapped.frame).expect("a frame");
        let mut on_hops = Duration::ZERO;
        let mut sealed = String::new();
        for (sign, onion) in &keys {
            let id = sign.verifying_key().to_bytes();
            let t = Instant::now();
            let c = pipeline::check_frame(&id, &[onion], frame.clone(), now, &mut None, |_| Ok(()))
                .expect("accepted");
            match c.next {
                HopNext::Forward { next_hop, packet } => {
                    frame = Frame::sign(packet, sign, &next_hop).expect("frames");
                }
                HopNext::Terminal {
                    payload,
                    receipt_key,
                    ..
                } => {
                    sealed = blindrelay::terminal::seal_receipt(
                        sign,
                        &c.tag,
                        &receipt_key,
                        &payload,
                        now,
                    );
                }
            }
            on_hops += t.elapsed();
        }
        let t = Instant::now();
        let bytes = hex::decode(&sealed).expect("hex");
        let r = receipt::open(&bytes, &wrapped.receipt_key).expect("opens");
        let terminal = path[hops - 1].node_id;
        r.verify(
            &wrapped.terminal_tag,
            &receipt::commitment(payload),
            &terminal,
            now,
        )
        .expect("verifies");
        sender += t.elapsed();
        best_sender = best_sender.min(sender);
        best_hops = best_hops.min(on_hops);
    }
    (best_sender, best_hops)
}

/// `--clients N`, `--hops 1,3,5`, `--sizes 1024,65536`, `--backpressure`, and after `--` flags
/// for every node's `blindrelay run` (`-- --replay-store memory`: what the durable replay state
/// costs).
struct Args {
    clients: usize,
    backpressure: bool,
    hops: Vec<usize>,
    sizes: Vec<usize>,
    node_flags: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        clients: CONCURRENCY,
        backpressure: false,
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
            "--" => a.node_flags = it.by_ref().collect(),
            other => panic!(
                "unknown flag {other} (--clients N, --hops 1,3,5, --sizes 1024,65536, --backpressure, -- node flags)"
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
    assert!(bin.exists(), "no blindrelay binary at {}", bin.display());
    blindrelay::links::install_provider();
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = start(&bin, root.path(), &args.node_flags).await;
    wait_ready(&nodes).await;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
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
    for &size in &args.sizes {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        for &hops in &args.hops {
            let (mut alone, failed_alone, _) =
                run_case(&nodes[0], &terminal, hops, &payload, 1, ALONE).await;
            alone.sort_unstable();
            let before = spent(&nodes).await;
            let (cpu0, switches0, me0) = cpu_now(&nodes);
            let (mut loaded, failed, took) =
                run_case(&nodes[0], &terminal, hops, &payload, args.clients, LOADED).await;
            let (cpu1, switches1, me1) = cpu_now(&nodes);
            let after = spent(&nodes).await;
            let d: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
            let per = |x: f64| x / loaded.len().max(1) as f64;
            spent_rows.push(format!(
                "| {} KiB | {hops} | {} | {} | {} | {} | {} | {:.0} µs | {:.0} µs | {:.1} |",
                size / 1024,
                loaded.len(),
                d[0],
                d[1],
                d[2],
                d[3],
                per((cpu1 - cpu0).as_secs_f64() * 1e6),
                per((me1 - me0).as_secs_f64() * 1e6),
                per((switches1 - switches0) as f64),
            ));
            loaded.sort_unstable();
            let per_s = loaded.len() as f64 / took.as_secs_f64();
            let (sender, on_hops) = crypto_cost(hops, &payload, 50);
            let crypto = sender + on_hops;
            let bound = cores as f64 / crypto.as_secs_f64();
            println!(
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
        }
    }
    println!();
    println!(
        "During the loaded runs, summed over the nodes (`GET /metrics`, `/proc`): relay requests received, `backpressure` refusals, busy retries, requests paced; CPU time of the six node processes and of this harness's clients, and the nodes' context switches, per delivery."
    );
    println!();
    println!(
        "| payload | hops | deliveries | relay requests | backpressure | busy retries | paced | node CPU per delivery | client CPU per delivery | node context switches per delivery |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for row in &spent_rows {
        println!("{row}");
    }
    if args.backpressure {
        let payload: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        let until = Instant::now() + LOADED;
        // Half the connections from a known peer's address (node 2, pinned at node 1), half
        // from a stranger's (an address no node has).
        let stranger = Ipv4Addr::new(127, 0, 99, 1);
        let (sent, known, strange) = tokio::join!(
            run_case(&nodes[0], &terminal, 3, &payload, args.clients, LOADED),
            overload(&nodes[1], nodes[2].ip, OVERLOAD_CONNS / 2, until),
            overload(&nodes[1], stranger, OVERLOAD_CONNS / 2, until),
        );
        let (delivered, failed, took) = sent;
        println!();
        println!(
            "Overload: {} clients sending 3-hop 1 KiB deliveries, and {OVERLOAD_CONNS} connections posting frames that take a crypto slot each to node 1 (half from a known peer's address, half from a stranger's), for {} s.",
            args.clients,
            LOADED.as_secs()
        );
        println!();
        print_overload(&known, &strange);
        println!(
            "\nDuring it: {:.0} deliveries/s, {failed} failed; {} prober requests failed in transport.",
            delivered.len() as f64 / took.as_secs_f64(),
            known.errors + strange.errors
        );
        // The same overload of node 1 alone: the other nodes and the delivery clients idle,
        // so what saturates the CPU is node 1's own cryptography (and these clients).
        let node1 = nodes[1].child.as_ref().and_then(Child::id);
        let before = (node1.and_then(proc_cpu), Instant::now());
        let until = Instant::now() + LOADED;
        let (known, strange) = tokio::join!(
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
    for node in &mut nodes {
        if let Some(mut child) = node.child.take() {
            let _ = child.kill().await;
        }
    }
}
