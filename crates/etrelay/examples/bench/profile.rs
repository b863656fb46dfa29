//! Instructions per datagram under valgrind's callgrind (stable on a noisy shared machine,
//! where timings are not): `bench --callgrind [ETRELAY_BINARY]`.
//!
//! Fresh relays run under `valgrind --tool=callgrind`, each for one workload after the same
//! warm-up (8 clients open their sessions): 2 s and 6 s of quiet (what time itself costs:
//! timers, sweeps; and what start and warm-up cost); 4 000 in-game datagrams of 64 B sent one
//! at a time, each once the sink counted the one before (one wake-up of the relay each, as at
//! an ET server's load); the same in bursts of 32 (one `recvmmsg` each, as under a flood);
//! 4 000 round trips, each datagram sent back by the sink and the next sent once it came back
//! (both directions through a session: the relay loop, then the session's task); 4 000
//! `getstatus` from 1 000 sources at 1 000 per second. The relay ends on SIGTERM, so
//! callgrind writes its totals; (instructions − start − time's share) ÷ datagrams is the cost
//! of one datagram in user space, everything included: system call wrappers, the runtime, the
//! relay's own code (the kernel's share is not counted).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::load::{self, SinkCounts};

const DATAGRAMS: usize = 4_000;
const RATE: u64 = 1_000;

#[derive(Clone, Copy, PartialEq)]
enum Work {
    /// The warm-up, then this many seconds of quiet.
    Quiet(u64),
    /// In-game datagrams in bursts of this many, each burst sent once the sink counted the
    /// last one: every burst is one wake-up of the relay, whatever the machine's speed.
    Game(usize),
    /// `getstatus` from 1 000 sources, paced.
    GetStatus,
    /// In-game datagrams the sink sends back, each sent once the one before came back: both
    /// directions through a session, one wake-up of the relay each way.
    RoundTrip,
}

/// Runs the relay binary `bin` under callgrind for `work`; returns (instructions, datagrams
/// counted: delivered to the sink for in-game ones, sent for `getstatus`, seconds from the
/// end of the warm-up to SIGTERM).
fn one(bin: &Path, dir: &Path, work: Work, name: &str) -> (u64, u64, f64) {
    let counts = Arc::new(SinkCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sink_sock = UdpSocket::bind((Ipv4Addr::new(127, 79, 0, 2), 0)).expect("bind sink");
    let sink_addr = sink_sock.local_addr().expect("sink address");
    let sink = load::sink(sink_sock, Arc::clone(&counts), Arc::clone(&stop));
    let relay_addr: SocketAddr = (Ipv4Addr::new(127, 79, 0, 4), 27960).into();
    let out = dir.join(format!("callgrind.{name}.out"));
    let mut child = start_under_callgrind(bin, &out, relay_addr, sink_addr);
    let socks = load::clients(79, 8);
    load::warm_up(&socks, relay_addr, &counts);
    std::thread::sleep(Duration::from_millis(300));
    let before = counts.delivered.load(Ordering::Relaxed);
    let start = Instant::now();
    let (sent, returned) = match work {
        Work::Quiet(secs) => {
            std::thread::sleep(Duration::from_secs(secs));
            (0, 0)
        }
        Work::Game(burst) => (game(&socks, relay_addr, burst, &counts, before), 0),
        Work::RoundTrip => round_trips(&socks, relay_addr),
        Work::GetStatus => (getstatus(relay_addr), 0),
    };
    settle(&counts);
    let delivered = counts.delivered.load(Ordering::Relaxed) - before;
    let elapsed = start.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);
    let _ = sink.join();
    let counted = match work {
        Work::Game(_) => delivered,
        Work::RoundTrip => returned,
        _ => sent as u64,
    };
    (callgrind_total(&out), counted, elapsed)
}

/// Starts `bin` under callgrind (profile written to `out`) relaying `sink_addr` on
/// `relay_addr`, and waits (at most 60 s) for it to say it relays.
fn start_under_callgrind(
    bin: &Path,
    out: &Path,
    relay_addr: SocketAddr,
    sink_addr: SocketAddr,
) -> Child {
    let mut child = Command::new("valgrind")
        .args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin)
        .args([
            "--allow-loopback-upstream",
            "--listen",
            &relay_addr.to_string(),
        ])
        .args(["--masters", ""])
        .args(["--heartbeat-interval", "1h", &sink_addr.to_string()])
        .env("RUST_LOG", "warn,etrelay=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start valgrind (apt-get install valgrind)");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) if l.contains("relaying") => break,
            Some(_) => {}
            None => break,
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

/// [`Work::Game`]: [`DATAGRAMS`] in-game datagrams in bursts of `burst`, each burst once the
/// sink counted the one before (at most 1 s each); returns how many were sent.
fn game(
    socks: &[UdpSocket],
    relay_addr: SocketAddr,
    burst: usize,
    counts: &SinkCounts,
    before: u64,
) -> usize {
    let pkts: Vec<Vec<u8>> = (0..socks.len()).map(|i| load::packet(i, 64)).collect();
    let start = Instant::now();
    let mut sent = 0;
    while sent < DATAGRAMS && start.elapsed() < Duration::from_secs(60) {
        for _ in 0..burst {
            let _ = socks[sent % 8].send_to(&pkts[sent % 8], relay_addr);
            sent += 1;
        }
        let wait = Instant::now() + Duration::from_secs(1);
        while counts.delivered.load(Ordering::Relaxed) - before < sent as u64
            && Instant::now() < wait
        {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    sent
}

/// [`Work::RoundTrip`]: [`DATAGRAMS`] datagrams the sink sends back, one at a time; returns
/// (sent, came back).
fn round_trips(socks: &[UdpSocket], relay_addr: SocketAddr) -> (usize, u64) {
    let mut buf = [0u8; 2048];
    for s in socks {
        s.set_read_timeout(Some(Duration::from_secs(1)))
            .expect("read timeout");
    }
    let mut pkts: Vec<Vec<u8>> = (0..socks.len()).map(|i| load::packet(i, 64)).collect();
    for p in &mut pkts {
        p[2] = load::ECHO;
    }
    let start = Instant::now();
    let (mut sent, mut returned) = (0, 0u64);
    while sent < DATAGRAMS && start.elapsed() < Duration::from_secs(60) {
        let s = &socks[sent % 8];
        let _ = s.send_to(&pkts[sent % 8], relay_addr);
        sent += 1;
        if s.recv(&mut buf).is_ok() {
            returned += 1;
        }
    }
    (sent, returned)
}

/// [`Work::GetStatus`]: [`DATAGRAMS`] `getstatus` from 1 000 sources at [`RATE`] per second;
/// returns how many were sent.
fn getstatus(relay_addr: SocketAddr) -> usize {
    let flood: Vec<UdpSocket> = (0..1000)
        .map(|i| {
            let ip = Ipv4Addr::new(127, 89, (i % 250) as u8, (1 + i / 250) as u8);
            UdpSocket::bind((ip, 0)).expect("bind a source")
        })
        .collect();
    let start = Instant::now();
    let mut sent = 0;
    while sent < DATAGRAMS && start.elapsed() < Duration::from_secs(60) {
        let due = (start.elapsed().as_micros() as u64 * RATE / 1_000_000) as usize;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        let probe = b"\xff\xff\xff\xffgetstatus\n";
        if flood[sent % flood.len()].send_to(probe, relay_addr).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Waits until the sink stops counting (at most 10 s).
fn settle(counts: &SinkCounts) {
    let mut last = u64::MAX;
    let settle = Instant::now() + Duration::from_secs(10);
    while Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(300));
        let now = counts.delivered.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
}

/// The instructions callgrind counted in all, from its profile `out`.
fn callgrind_total(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out).expect("callgrind output");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind totals")
}

pub(crate) fn main(bin: Option<PathBuf>) {
    let bin = bin.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.join("etrelay")))
            .expect("etrelay next to the example")
    });
    let tmp = tempfile::tempdir().expect("temp dir");
    // CALLGRIND_KEEP=<dir> keeps the profiles (callgrind_annotate <dir>/callgrind.game1.out).
    let keep = std::env::var_os("CALLGRIND_KEEP").map(PathBuf::from);
    let dir = keep.as_deref().unwrap_or(tmp.path());
    // Two quiet runs give the cost of time itself (timers, sweeps) and of start + warm-up.
    let (q2, _, e2) = one(&bin, dir, Work::Quiet(2), "quiet2");
    let (q6, _, e6) = one(&bin, dir, Work::Quiet(6), "quiet6");
    let per_sec = q6.saturating_sub(q2) as f64 / (e6 - e2);
    let fixed = q2 as f64 - per_sec * e2;
    println!("callgrind, {}:\n", bin.display());
    println!("Quiet relay (8 sessions open): {per_sec:.0} instructions per second.\n");
    println!("| workload | instructions | datagrams | seconds | instructions per datagram |");
    println!("|---|---:|---:|---:|---:|");
    for (work, name, what) in [
        (Work::Game(1), "game1", "in-game 64 B, one per wake-up"),
        (Work::Game(32), "game32", "in-game 64 B, bursts of 32"),
        (
            Work::RoundTrip,
            "roundtrip",
            "in-game 64 B there and back, one at a time (per round trip)",
        ),
        (
            Work::GetStatus,
            "getstatus",
            "getstatus from 1 000 sources (limited, dropped)",
        ),
    ] {
        let (total, n, secs) = one(&bin, dir, work, name);
        let per = (total as f64 - fixed - per_sec * secs) / n.max(1) as f64;
        println!("| {what} | {total} | {n} | {secs:.1} | {per:.0} |");
    }
}
