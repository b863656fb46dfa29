//! etrelay next to nginx's `stream` UDP proxy on loopback: throughput, round-trip latency, and
//! latency under a spoofed-source `getstatus` flood.
//!
//! Run with `scripts/bench` (it builds in release mode and installs nginx when missing), or
//! `target/release/examples/bench [--quick] [--throughput | --latency]` (one of the two parts
//! only).
//!
//! On every path the clients first join as ET clients do (`getchallenge`, `challengeResponse`,
//! `CONNECT`, `connectResponse`: `join.rs`), and the sink and the echo server answer that as an
//! ET server does, whoever asks. So etrelay's default, which answers `getchallenge` with its own
//! challenge and opens no session for an address that never joined, relays the clients' packets
//! as a player's, translated (ET's XOR scheme: a client's packet XORed from byte 18 on, the
//! server's from byte 8 on, with a key byte of each session's two challenges); the warm-ups wait
//! until every client's packets through it come out translated (in 1 session in 256 the key
//! byte is 0, and the client joins again). The same handshake works through nginx, directly,
//! and through an etrelay that relays the game server's challenge (`--server-challenges`, or a
//! build from before the relay gave its own).
//!
//! - **Throughput**: one-way at saturation, 64 B and 1 400 B in-game datagrams (no
//!   `FF FF FF FF` prefix, so they go through etrelay's sessions as a player's would), 1, 32 and
//!   256 clients (each its own 127.x address and qport), one load thread sending with
//!   `sendmmsg`, a sink counting with `recvmmsg` (it sleeps in `poll` when it has nothing to
//!   read, as a receiver would, and does not spin on a CPU): direct to the sink, through nginx
//!   (one worker, `../shared/research/anchors.md` §1.2), through etrelay (defaults,
//!   `--masters ""`), and through etrelay with `--no-io-uring` (one `sendmmsg` per session
//!   socket instead of one `io_uring` call per batch: what the ring is worth). Before each cell
//!   every client joins and sends one warm-up datagram through the path.
//!   The paths take turns, round after round. After the table, each relay's user-space share
//!   of its CPU over the runs (`/proc/PID/stat`): what no change to its own code could save.
//! - **Latency**: round trip to an echo server at an ET-like load (64 clients, 10 000
//!   datagrams/s in all, 64 B), direct, nginx, etrelay (and etrelay `--no-io-uring`) in turn,
//!   round after round; the median of the rounds of each percentile. A datagram is matched to
//!   its send time by bytes 0..8, which the translation never changes. Last in each round,
//!   etrelay `--busy-polling`, started for its run and stopped after it: it keeps a CPU busy,
//!   which running beside the others would make the whole machine answer faster for them too.
//! - **Under attack**: the same etrelay latency while 1 000 loopback sources (127.88.x.y, each
//!   on its own /24) send 20 000 `getstatus` per second to it, started just before the run and
//!   stopped just after.
//! - **One client alone**: round trips of a single client, one datagram at a time 0.5 ms
//!   apart, direct, nginx, etrelay in turn: a datagram on an idle path, no burst to queue
//!   behind.
//! - **CPU per round trip**: the relay's processes' time on a CPU (`/proc/PID/schedstat`) over
//!   the unloaded latency runs, per round trip sent, and the times they were put on a CPU
//!   (their wake-ups).
//!
//! With `ETRELAY_BASELINE=<binary>` (an etrelay built from another commit), that binary takes
//! the place of `--no-io-uring` in every table, labelled `baseline`: an A/B of two builds side
//! by side in one run, next to nginx.
//!
//! `bench --callgrind [ETRELAY_BINARY]` counts the relay's instructions per datagram instead
//! (`profile.rs`).
//!
//! Everything runs on this machine: load, relays and sinks share the CPUs, so the ratios
//! measured side by side matter, not the absolute numbers. Every loop is bounded in time and
//! every process started is killed by PID.

mod cpu;
mod join;
mod latency;
mod load;
mod profile;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use latency::Rtt;
use load::SinkCounts;

/// A process ended (and reaped) when dropped: SIGTERM first, so nginx's master stops its
/// worker (a SIGKILLed master leaves the worker running, holding the port), then SIGKILL if it
/// is still there after 2 s.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long and how often.
struct Plan {
    secs: f64,
    rounds: usize,
    lat_secs: f64,
    lat_rounds: usize,
    /// Round trips per path and round of the one-client run.
    ping_pongs: usize,
}

/// Stops the bench unless every one of `addrs` can be bound: the relays listen on fixed ports,
/// and a second run of this bench at the same time would measure the first one's relays.
fn ports_free(addrs: &[SocketAddr]) {
    for addr in addrs {
        if let Err(e) = UdpSocket::bind(addr) {
            panic!("{addr} is taken ({e}): is another run of this bench going on?");
        }
    }
}

fn start_nginx(dir: &Path, listen: SocketAddr, upstream: SocketAddr) -> Guard {
    std::fs::create_dir_all(dir).expect("nginx dir");
    let conf = format!(
        "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n\
         daemon off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         stream {{ server {{ listen {listen} udp; proxy_pass {upstream}; proxy_timeout 30s; }} }}\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).expect("write nginx.conf");
    let child = Command::new("nginx")
        .args(["-p", &dir.display().to_string(), "-c", "nginx.conf"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx (apt-get install nginx libnginx-mod-stream)");
    Guard(child)
}

/// `ETRELAY_BASELINE`, if set: the binary run in place of `--no-io-uring`.
fn baseline() -> Option<PathBuf> {
    std::env::var_os("ETRELAY_BASELINE").map(PathBuf::from)
}

/// The fourth relay's name in the tables: `--no-io-uring`, or the baseline binary.
fn alt(long: bool) -> &'static str {
    match (baseline().is_some(), long) {
        (true, _) => "baseline",
        (false, true) => "etrelay --no-io-uring",
        (false, false) => "no io_uring",
    }
}

/// The fourth relay: etrelay `--no-io-uring`, or the baseline binary with its defaults.
fn start_alt(listen: SocketAddr, upstream: SocketAddr) -> Guard {
    match baseline() {
        Some(bin) => start_binary(bin, listen, upstream, &[]),
        None => start_etrelay(listen, upstream, &["--no-io-uring"]),
    }
}

fn start_etrelay(listen: SocketAddr, upstream: SocketAddr, extra: &[&str]) -> Guard {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("etrelay")))
        .expect("etrelay next to the example");
    start_binary(bin, listen, upstream, extra)
}

fn start_binary(bin: PathBuf, listen: SocketAddr, upstream: SocketAddr, extra: &[&str]) -> Guard {
    let mut child = Command::new(bin)
        .args([
            "--allow-loopback-upstream",
            "--listen",
            &listen.to_string(),
            "--masters",
            "",
            "--heartbeat-interval",
            "1h",
            &upstream.to_string(),
        ])
        .args(extra)
        .env("RUST_LOG", "warn,etrelay=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etrelay (cargo build --release -p etrelay)");
    // Ready once it logs that it relays (bounded: the log ends if it exits).
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) if l.contains("relaying") => break,
            Some(_) => {}
            None => break,
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Guard(child)
}

/// One throughput cell: delivered datagrams per second, after a warm-up in which every client
/// joins and sends a datagram through (translated by etrelay, when `xored`).
fn throughput(
    socks: &[UdpSocket],
    (target, xored): (SocketAddr, bool),
    size: usize,
    secs: f64,
    counts: &SinkCounts,
) -> f64 {
    if !load::warm_up(socks, target, counts, xored) {
        let n = counts.xored_count(socks.len());
        eprintln!("warning: not every client got through {target} in the warm-up ({n} translated)");
    }
    std::thread::sleep(Duration::from_millis(50));
    let before = counts.delivered.load(Ordering::Relaxed);
    load::saturate(socks, target, size, secs);
    // What is in flight arrives within this.
    std::thread::sleep(Duration::from_millis(100));
    (counts.delivered.load(Ordering::Relaxed) - before) as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} CPUs ({cpu}), kernel {}, load average at start {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn throughput_table(plan: &Plan, dir: &Path) {
    let counts = Arc::new(SinkCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sink_sock = UdpSocket::bind((Ipv4Addr::new(127, 77, 0, 2), 0)).expect("bind sink");
    let _ = socket2::SockRef::from(&sink_sock).set_recv_buffer_size(8 << 20);
    let sink_addr = sink_sock.local_addr().expect("sink address");
    let sink = load::sink(sink_sock, Arc::clone(&counts), Arc::clone(&stop));
    let nginx_addr: SocketAddr = (Ipv4Addr::new(127, 77, 0, 3), 27961).into();
    let relay_addr: SocketAddr = (Ipv4Addr::new(127, 77, 0, 4), 27960).into();
    let plain_addr: SocketAddr = (Ipv4Addr::new(127, 77, 0, 5), 27960).into();
    ports_free(&[nginx_addr, relay_addr, plain_addr]);
    let nginx = start_nginx(&dir.join("nginx-t"), nginx_addr, sink_addr);
    let relay = start_etrelay(relay_addr, sink_addr, &[]);
    let plain = start_alt(plain_addr, sink_addr);
    // Bound once: etrelay's sessions (keyed by the client's address) live across runs.
    let socks = load::clients(77, 256);
    // Where each path sends, and whether etrelay translates its clients' packets there (the
    // warm-up waits for it): its default does, and so does `--no-io-uring`; a baseline binary
    // may be from before the relay gave its own challenges.
    let paths = [
        (sink_addr, false),
        (nginx_addr, false),
        (relay_addr, true),
        (plain_addr, baseline().is_none()),
    ];

    println!("\n### Throughput: one-way at saturation, delivered datagrams/s\n");
    println!(
        "| size | clients | round | direct | nginx 1 worker | etrelay | {} | etrelay / nginx | {} / nginx |",
        alt(true),
        alt(false)
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut summary = Vec::new();
    let relays = [("nginx", nginx.0.id()), ("etrelay", relay.0.id())];
    let ticks_before = relays.map(|(_, pid)| cpu::user_and_kernel_ticks(pid));
    for size in [64, 1400] {
        for clients in [1, 32, 256] {
            let mut ratios = Vec::new();
            let mut plain_ratios = Vec::new();
            let mut cells = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for round in 1..=plan.rounds {
                let mut got = [0.0; 4];
                for (k, path) in paths.iter().enumerate() {
                    got[k] = throughput(&socks[..clients], *path, size, plan.secs, &counts);
                    cells[k].push(got[k]);
                }
                let r = got[2] / got[1].max(1.0);
                let p = got[3] / got[1].max(1.0);
                ratios.push(r);
                plain_ratios.push(p);
                println!(
                    "| {size} | {clients} | {round} | {:.0} | {:.0} | {:.0} | {:.0} | {r:.2} | {p:.2} |",
                    got[0], got[1], got[2], got[3]
                );
            }
            let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            summary.push((
                size,
                clients,
                cells.map(median),
                median(ratios),
                min,
                median(plain_ratios),
            ));
        }
    }
    print_medians(summary);
    cpu::print_user_share(&relays, &ticks_before);
    drop(plain);
    drop(relay);
    drop(nginx);
    stop.store(true, Ordering::Relaxed);
    let _ = sink.join();
}

/// The medians of the throughput rounds: one row per size and client count.
fn print_medians(summary: Vec<(usize, usize, [f64; 4], f64, f64, f64)>) {
    println!("\nMedians of the rounds:\n");
    println!(
        "| size | clients | direct | nginx 1 worker | etrelay | etrelay / nginx (median) | lowest round | {} / nginx (median) |",
        alt(false)
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (size, clients, m, r, min, p) in summary {
        println!(
            "| {size} | {clients} | {:.0} | {:.0} | {:.0} | **{r:.2}** | {min:.2} | {p:.2} |",
            m[0], m[1], m[2]
        );
    }
}

/// The paths of the latency runs, in the order they run each round.
fn latency_paths() -> [&'static str; PATHS] {
    [
        "direct",
        "nginx 1 worker",
        "etrelay",
        "etrelay, getstatus flood",
        alt(true),
        "etrelay --busy-polling",
    ]
}

/// Paths of the latency runs.
const PATHS: usize = 6;
/// The path of [`latency_paths`] whose relay runs only during its own runs: it keeps a CPU
/// busy, which would make the machine answer faster for every other path too.
const BUSY: usize = 5;

/// Where the latency runs send: the echo server itself, and the relays in front of it.
#[derive(Clone, Copy)]
struct LatencyTargets {
    echo: SocketAddr,
    nginx: SocketAddr,
    relay: SocketAddr,
    plain: SocketAddr,
    busy: SocketAddr,
}

impl LatencyTargets {
    /// The address path `k` of [`latency_paths`] sends to.
    fn of(&self, k: usize) -> SocketAddr {
        [
            self.echo, self.nginx, self.relay, self.relay, self.plain, self.busy,
        ][k]
    }
}

fn latency_table(plan: &Plan, dir: &Path) {
    let stop = Arc::new(AtomicBool::new(false));
    let echo_sock = UdpSocket::bind((Ipv4Addr::new(127, 78, 0, 2), 0)).expect("bind echo");
    let _ = socket2::SockRef::from(&echo_sock).set_recv_buffer_size(8 << 20);
    let echo_addr = echo_sock.local_addr().expect("echo address");
    let echo = load::echo(echo_sock, Arc::clone(&stop));
    let t = LatencyTargets {
        echo: echo_addr,
        nginx: (Ipv4Addr::new(127, 78, 0, 3), 27961).into(),
        relay: (Ipv4Addr::new(127, 78, 0, 4), 27960).into(),
        plain: (Ipv4Addr::new(127, 78, 0, 5), 27960).into(),
        busy: (Ipv4Addr::new(127, 78, 0, 6), 27960).into(),
    };
    ports_free(&[t.nginx, t.relay, t.plain, t.busy]);
    let nginx = start_nginx(&dir.join("nginx-l"), t.nginx, echo_addr);
    let relay = start_etrelay(t.relay, echo_addr, &[]);
    let plain = start_alt(t.plain, echo_addr);
    let socks = latency::clients();
    // The clients join on every path, and their sessions settle before the first counted run.
    // Whether etrelay translates there (a baseline binary may be from before it did).
    let translated = [false, false, true, baseline().is_none()];
    for (addr, xored) in [t.echo, t.nginx, t.relay, t.plain]
        .into_iter()
        .zip(translated)
    {
        latency::join(&socks, 0, addr, xored);
        let _ = latency::run(&socks, addr, 0.3);
    }
    let pids = [nginx.0.id(), relay.0.id(), plain.0.id()];
    let (all, flood_sent, cpu) = latency_rounds(plan, &socks, t, pids);
    latency::print_medians(plan, &all, flood_sent, &cpu);
    one_client_alone(plan, t);
    drop(plain);
    drop(relay);
    drop(nginx);
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
}

/// The rounds of the latency runs over every path, each run's line printed: the round trips of
/// each path, the `getstatus` sent by the floods, and what the relays' processes (`pids`:
/// nginx, etrelay, etrelay --no-io-uring; then etrelay --busy-polling, started for each of
/// its runs and stopped after it) spent on a CPU during their unloaded runs.
fn latency_rounds(
    plan: &Plan,
    socks: &[UdpSocket],
    t: LatencyTargets,
    pids: [u32; 3],
) -> ([Vec<Rtt>; PATHS], u64, [cpu::Sched; 4]) {
    println!(
        "\n### Round trip at the ET-like load ({} clients, {} datagrams/s in all, 64 B), µs\n",
        latency::CLIENTS,
        latency::RATE
    );
    println!("| round | path | p50 | p99 | p99.9 | came back | translated |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut all: [Vec<Rtt>; PATHS] = Default::default();
    let mut flood_sent = 0;
    let mut cpu = [cpu::Sched::default(); 4];
    // The path's index in `pids` and `cpu`, for the unloaded relays.
    let relay_of = |k: usize| match k {
        1 | 2 => Some(k - 1),
        4 => Some(2),
        _ => None,
    };
    for round in 1..=plan.lat_rounds {
        for (k, name) in latency_paths().iter().enumerate() {
            if k == BUSY {
                let (r, spent) = busy_polling_run(plan, socks, t);
                cpu[3] = cpu[3].add(spent);
                print_run(round, name, &r);
                all[k].push(r);
                continue;
            }
            let before = relay_of(k).map(|i| cpu::sched(pids[i]));
            let r = if k == 3 {
                let (r, sent) = flooded_run(socks, t.relay, plan.lat_secs);
                flood_sent += sent;
                r
            } else {
                latency::run(socks, t.of(k), plan.lat_secs)
            };
            if let (Some(before), Some(i)) = (before, relay_of(k)) {
                cpu[i] = cpu[i].add(cpu::sched(pids[i]).since(before));
            }
            print_run(round, name, &r);
            all[k].push(r);
        }
    }
    (all, flood_sent, cpu)
}

/// One latency run's line.
fn print_run(round: usize, name: &str, r: &Rtt) {
    println!(
        "| {round} | {name} | {:.0} | {:.0} | {:.0} | {:.1} % | {:.0} % |",
        r.p50,
        r.p99,
        r.p999,
        r.returned * 100.0,
        r.xored * 100.0
    );
}

/// A latency run through etrelay `--busy-polling`, started for it (the clients join, then a
/// short run first) and stopped after it; the round trips, and what its process spent on a CPU
/// during the run.
fn busy_polling_run(plan: &Plan, socks: &[UdpSocket], t: LatencyTargets) -> (Rtt, cpu::Sched) {
    let relay = start_etrelay(t.busy, t.echo, &["--busy-polling"]);
    latency::join(socks, 0, t.busy, true);
    let _ = latency::run(socks, t.busy, 0.3);
    let before = cpu::sched(relay.0.id());
    let r = latency::run(socks, t.busy, plan.lat_secs);
    (r, cpu::sched(relay.0.id()).since(before))
}

/// A latency run through the relay at `relay` while a `getstatus` flood runs against it; the
/// round trips and the `getstatus` the flood sent.
fn flooded_run(socks: &[UdpSocket], relay: SocketAddr, secs: f64) -> (Rtt, u64) {
    let fstop = Arc::new(AtomicBool::new(false));
    let (t, sent) = latency::flood(relay, secs + 1.0, Arc::clone(&fstop));
    std::thread::sleep(Duration::from_millis(100));
    let r = latency::run(socks, relay, secs);
    fstop.store(true, Ordering::Relaxed);
    let _ = t.join();
    (r, sent.load(Ordering::Relaxed))
}

/// One client alone: what a datagram costs on an idle path, no burst to queue behind. Its own
/// socket and qport, joined again before each of its runs (which connects it to the path).
fn one_client_alone(plan: &Plan, t: LatencyTargets) {
    let alone = load::clients(76, 1);
    let mut one: [Vec<Rtt>; 3] = Default::default();
    for _ in 0..plan.lat_rounds {
        for (k, to) in [t.echo, t.nginx, t.relay].into_iter().enumerate() {
            latency::join(&alone, latency::CLIENTS as u16, to, k == 2);
            one[k].push(latency::ping_pong(&alone[0], to, plan.ping_pongs));
        }
    }
    println!(
        "\nOne client alone, one datagram at a time 0.5 ms apart ({} each, {} rounds), µs:\n",
        plan.ping_pongs, plan.lat_rounds
    );
    println!("| path | p50 | p99 | p99 / nginx's |");
    println!("|---|---:|---:|---:|");
    let med1 = |k: usize, f: fn(&Rtt) -> f64| median(one[k].iter().map(f).collect());
    for (k, name) in ["direct", "nginx 1 worker", "etrelay"].iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} |",
            med1(k, |r| r.p50),
            med1(k, |r| r.p99),
            med1(k, |r| r.p99) / med1(1, |r| r.p99)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--callgrind") {
        profile::main(args.get(2).map(Into::into));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let plan = if quick {
        Plan {
            secs: 0.3,
            rounds: 1,
            lat_secs: 0.5,
            lat_rounds: 1,
            ping_pongs: 200,
        }
    } else {
        Plan {
            secs: 2.0,
            rounds: 3,
            lat_secs: 3.0,
            lat_rounds: 7,
            ping_pongs: 2_000,
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "## etrelay vs nginx (`scripts/bench{}`)\n",
        if quick { " --quick" } else { "" }
    );
    println!("Machine: {}.", machine());
    println!(
        "Throughput: {} s per cell, {} rounds; latency: {} s per run, {} rounds.",
        plan.secs, plan.rounds, plan.lat_secs, plan.lat_rounds
    );
    let only = |what: &str| args.iter().any(|a| a == what);
    if !only("--latency") {
        throughput_table(&plan, dir.path());
    }
    if !only("--throughput") {
        latency_table(&plan, dir.path());
    }
}
