//! Instructions per datagram under valgrind's callgrind (stable on a noisy shared machine,
//! where timings are not): `bench --callgrind [ETRELAY_BINARY]`.
//!
//! Fresh relays run under `valgrind --tool=callgrind`, each for one workload after the same
//! warm-up (8 clients join as ET clients and send a datagram through their sessions), in one
//! of two modes: etrelay's default, which answers `getchallenge` itself and translates every
//! in-game packet of a session (ET's XOR scheme: a client's from byte 18 on, the server's from
//! byte 8 on; the warm-up waits until every session is), and `--server-challenges`, where the
//! game server gives the challenges and nothing is translated. After the warm-up the counters
//! are zeroed (`callgrind_control -z`), so what start and warm-up cost is not counted. The
//! workloads: 2 s and 6 s of quiet (what time itself costs: timers, sweeps; and what the stop
//! costs); 4 000 in-game datagrams sent one at a time, each once the sink counted the one before
//! (one wake-up of the relay each, as at an ET server's load), of 64 B and of 1 400 B; the
//! same at 64 B in bursts of 32 (one `recvmmsg` each, as under a flood); 4 000 round trips,
//! each datagram sent back by the sink and the next sent once it came back (both directions
//! through a session: the relay loop, then the session's task); 4 000 `getstatus` from 1 000
//! sources at 1 000 per second; 4 000 `getchallenge` from 1 000 (spoofed) sources at 1 000 per
//! second, each answered by the relay itself (or, `--server-challenges`, through the join gate
//! to the server). The relay ends on SIGTERM, so callgrind writes its totals; (instructions −
//! the stop − time's share) ÷ datagrams is the cost of one datagram in user space, everything
//! included: system call wrappers, the runtime, the relay's own code (the kernel's share is not
//! counted).
//!
//! A binary from before the relay gave its own challenges (no `--server-challenges` in its
//! `--help`) runs the untranslated rows in its default mode, and none of the others.

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
/// Sources of the `getstatus` and `getchallenge` floods.
const SOURCES: usize = 1_000;

#[derive(Clone, Copy, PartialEq)]
enum Work {
    /// This many seconds of quiet.
    Quiet(u64),
    /// In-game datagrams of this size in bursts of this many, each burst sent once the sink
    /// counted the last one: every burst is one wake-up of the relay, whatever the machine's
    /// speed.
    Game { burst: usize, size: usize },
    /// `getstatus` from [`SOURCES`] sources, paced.
    GetStatus,
    /// `getchallenge` from [`SOURCES`] sources, paced.
    GetChallenge,
    /// In-game datagrams the sink sends back, each sent once the one before came back: both
    /// directions through a session, one wake-up of the relay each way.
    RoundTrip,
}

/// What one run under callgrind gave.
struct Counted {
    instructions: u64,
    /// Of them, in the relay loop's tick ([`tick`]).
    tick: u64,
    /// Delivered to the sink (in-game), came back (round trips), sent (floods).
    datagrams: u64,
    /// From the end of the warm-up to SIGTERM.
    secs: f64,
    /// Answers the flood's sources got back.
    answers: u64,
}

/// Runs the relay binary `bin` (with `args`) under callgrind for `work`.
fn one(bin: &Path, args: &[&str], dir: &Path, work: Work, name: &str) -> Counted {
    let counts = Arc::new(SinkCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sink_sock = UdpSocket::bind((Ipv4Addr::new(127, 79, 0, 2), 0)).expect("bind sink");
    let sink_addr = sink_sock.local_addr().expect("sink address");
    let sink = load::sink(sink_sock, Arc::clone(&counts), Arc::clone(&stop));
    let relay_addr: SocketAddr = (Ipv4Addr::new(127, 79, 0, 4), 27960).into();
    let out = dir.join(format!("callgrind.{name}.out"));
    let mut child = start_under_callgrind(bin, args, &out, relay_addr, sink_addr);
    let socks = load::clients(79, 8);
    // Translated sessions unless the relay gives no challenges of its own.
    let translated = translates(bin) && !args.contains(&"--server-challenges");
    if !load::warm_up(&socks, relay_addr, &counts, translated) {
        eprintln!("warning: {name}: not every client got through in the warm-up");
    }
    std::thread::sleep(Duration::from_millis(300));
    zero(&child);
    let before = counts.delivered.load(Ordering::Relaxed);
    let start = Instant::now();
    let (sent, returned, answers) = match work {
        Work::Quiet(secs) => {
            std::thread::sleep(Duration::from_secs(secs));
            (0, 0, 0)
        }
        Work::Game { burst, size } => {
            let sent = game(&socks, relay_addr, (burst, size), &counts, before);
            (sent, 0, 0)
        }
        Work::RoundTrip => {
            let (sent, returned) = round_trips(&socks, relay_addr);
            (sent, returned, 0)
        }
        Work::GetStatus => flood(relay_addr, b"\xff\xff\xff\xffgetstatus\n"),
        Work::GetChallenge => flood(relay_addr, b"\xff\xff\xff\xffgetchallenge"),
    };
    settle(&counts);
    let delivered = counts.delivered.load(Ordering::Relaxed) - before;
    let secs = start.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);
    let _ = sink.join();
    let datagrams = match work {
        Work::Game { .. } => delivered,
        Work::RoundTrip => returned,
        _ => sent as u64,
    };
    Counted {
        instructions: callgrind_total(&out),
        tick: tick(&out),
        datagrams,
        secs,
        answers,
    }
}

/// Zeroes the counters of the callgrind run `child` (`callgrind_control -z`): what start and
/// warm-up cost (and how long the warm-up took, which varies with its retries) stays out of the
/// totals.
fn zero(child: &Child) {
    let ok = Command::new("callgrind_control")
        .args(["-z", &child.id().to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "callgrind_control -z failed");
}

/// Whether `bin` gives its own challenges (it has `--server-challenges` to turn them off).
fn translates(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--server-challenges"))
}

/// Starts `bin` under callgrind (profile written to `out`) relaying `sink_addr` on
/// `relay_addr`, with `args`, and waits (at most 60 s) for it to say it relays.
fn start_under_callgrind(
    bin: &Path,
    args: &[&str],
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
        .args(args)
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

/// [`Work::Game`]: [`DATAGRAMS`] in-game datagrams of `size` bytes in bursts of `burst`, each
/// burst once the sink counted the one before (at most 1 s each); returns how many were sent.
fn game(
    socks: &[UdpSocket],
    relay_addr: SocketAddr,
    (burst, size): (usize, usize),
    counts: &SinkCounts,
    before: u64,
) -> usize {
    let pkts: Vec<Vec<u8>> = (0..socks.len()).map(|i| load::packet(i, size)).collect();
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

/// [`Work::GetStatus`], [`Work::GetChallenge`]: [`DATAGRAMS`] of `probe` from [`SOURCES`]
/// sources (127.89.x.y, each on its own /24) at [`RATE`] per second; returns (sent, 0, answers
/// the sources got back).
fn flood(relay_addr: SocketAddr, probe: &[u8]) -> (usize, u64, u64) {
    let flood: Vec<UdpSocket> = (0..SOURCES)
        .map(|i| {
            let ip = Ipv4Addr::new(127, 89, (i % 250) as u8, (1 + i / 250) as u8);
            let s = UdpSocket::bind((ip, 0)).expect("bind a source");
            s.set_nonblocking(true).expect("non-blocking");
            s
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
        if flood[sent % flood.len()].send_to(probe, relay_addr).is_ok() {
            sent += 1;
        }
    }
    // The last answers arrive within this (the relay is slow under valgrind).
    std::thread::sleep(Duration::from_secs(1));
    let mut buf = [0u8; 2048];
    let mut answers = 0;
    for s in &flood {
        while s.recv(&mut buf).is_ok() {
            answers += 1;
        }
    }
    (sent, 0, answers)
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

/// The instructions of the profile `out` spent in the relay loop's tick (`Handler::tick`,
/// inclusive, from `callgrind_annotate --inclusive=yes`): what the relay does every 250 ms
/// whatever the traffic, mostly the limiters' sweeps. A keyed limiter holding any address scans
/// a quarter of its table's slots (131 072 for 65 536 keys) each tick, about 1.7 M instructions a
/// second per table; the warm-up's joins leave addresses in the join gate's table (forgotten
/// after 60 s) and, by default, in the relay's challenge table (10 s). Time's cost, which at
/// valgrind's pace would be charged to the few datagrams that pass in a second, and which comes
/// in steps of a tick: left out of the cost per datagram, and shown on its own.
fn tick(out: &Path) -> u64 {
    let Ok(o) = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--auto=no", "--threshold=100"])
        .arg(out)
        .output()
    else {
        return 0;
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("relay.rs:etrelay::server::relay::Handler::tick ["))
        .filter_map(|l| l.split_whitespace().next()?.replace(',', "").parse().ok())
        .max()
        .unwrap_or(0)
}

/// A row of the table: the workload, whether in the default (translating) mode, its file name
/// and its description.
type Row = (Work, bool, &'static str, &'static str);

/// The rows, in the order they run.
#[rustfmt::skip]
const ROWS: [Row; 11] = [
    (Work::Game { burst: 1, size: 64 }, false, "game1", "in-game 64 B, one per wake-up"),
    (Work::Game { burst: 32, size: 64 }, false, "game32", "in-game 64 B, bursts of 32"),
    (Work::Game { burst: 1, size: 1400 }, false, "game1400", "in-game 1 400 B, one per wake-up"),
    (Work::RoundTrip, false, "roundtrip", "in-game 64 B there and back (per round trip)"),
    (Work::Game { burst: 1, size: 64 }, true, "xgame1", "in-game 64 B, one per wake-up"),
    (Work::Game { burst: 32, size: 64 }, true, "xgame32", "in-game 64 B, bursts of 32"),
    (Work::Game { burst: 1, size: 1400 }, true, "xgame1400", "in-game 1 400 B, one per wake-up"),
    (Work::RoundTrip, true, "xroundtrip", "in-game 64 B there and back (per round trip)"),
    (Work::GetStatus, true, "getstatus", "getstatus, 1 000 sources (limited, dropped)"),
    (Work::GetChallenge, true, "getchallenge", "getchallenge, 1 000 sources: the relay answers"),
    (Work::GetChallenge, false, "sgetchallenge", "getchallenge, 1 000 sources: to the server"),
];

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
    let new = translates(&bin);
    // `--server-challenges`, or an older binary's default.
    let plain: &[&str] = if new { &["--server-challenges"] } else { &[] };
    // Per mode, two quiet runs give the cost of time itself (timers, and the limiters' sweeps
    // while their tables hold the warm-up's addresses) and of the stop.
    let default = Quiet::of(&bin, &[], dir, "");
    let server = if new {
        Quiet::of(&bin, plain, dir, "s")
    } else {
        default
    };
    println!("callgrind, {}:\n", bin.display());
    println!(
        "Quiet relay (8 sessions open), instructions per second in the tick, per second \
         besides, and for the stop: {:.0}, {:.0}, {:.0} (default); {:.0}, {:.0}, {:.0} ({}). \
         Per datagram: the run's instructions less its tick's, the stop and the other time's \
         share (the second of those), ÷ datagrams.\n",
        default.tick,
        default.per_sec,
        default.stop,
        server.tick,
        server.per_sec,
        server.stop,
        if new {
            "`--server-challenges`"
        } else {
            "its default"
        }
    );
    println!(
        "| workload | relay | datagrams | seconds | instructions | of them the tick's | per datagram |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut per = Vec::new();
    for (work, translated, name, what) in ROWS {
        if translated && !new {
            continue;
        }
        let (args, quiet, mode) = match (translated, new) {
            (true, _) => (&[][..], default, "default"),
            (false, true) => (plain, server, "--server-challenges"),
            (false, false) => (plain, server, "its default"),
        };
        let c = one(&bin, args, dir, work, name);
        let p = quiet.per_datagram(&c);
        println!(
            "| {what} | {mode} | {} | {:.1} | {} | {} | {p:.0} |",
            c.datagrams, c.secs, c.instructions, c.tick
        );
        per.push(Cost {
            name,
            per_datagram: p,
            tick_beyond: quiet.tick_beyond(&c),
            answers: c.answers,
        });
    }
    print_costs(&per);
}

/// What a quiet relay costs in one mode: instructions per second, and for its stop.
#[derive(Clone, Copy)]
struct Quiet {
    /// Instructions per second, the tick's left out.
    per_sec: f64,
    stop: f64,
    /// The tick's instructions per second.
    tick: f64,
}

impl Quiet {
    /// Two quiet runs of `bin` with `args` (2 s and 6 s), their profiles named with `prefix`.
    fn of(bin: &Path, args: &[&str], dir: &Path, prefix: &str) -> Quiet {
        let q2 = one(bin, args, dir, Work::Quiet(2), &format!("{prefix}quiet2"));
        let q6 = one(bin, args, dir, Work::Quiet(6), &format!("{prefix}quiet6"));
        let (i2, i6) = (q2.instructions - q2.tick, q6.instructions - q6.tick);
        let per_sec = i6.saturating_sub(i2) as f64 / (q6.secs - q2.secs);
        Quiet {
            per_sec,
            stop: i2 as f64 - per_sec * q2.secs,
            tick: q6.tick as f64 / q6.secs,
        }
    }

    /// The tick's instructions in run `c` beyond a quiet relay's, per datagram: the sweeps of
    /// the tables a flood fills.
    fn tick_beyond(&self, c: &Counted) -> f64 {
        (c.tick as f64 - self.tick * c.secs) / c.datagrams.max(1) as f64
    }

    /// The instructions of one datagram of run `c`: its total less the tick's, the stop and
    /// the rest of time's share.
    fn per_datagram(&self, c: &Counted) -> f64 {
        let rest = (c.instructions - c.tick) as f64;
        (rest - self.stop - self.per_sec * c.secs) / c.datagrams.max(1) as f64
    }
}

/// What one row cost, per datagram.
struct Cost {
    name: &'static str,
    per_datagram: f64,
    /// The tick's beyond a quiet relay's ([`Quiet::tick_beyond`]).
    tick_beyond: f64,
    answers: u64,
}

/// What the relay's challenges cost: per translated in-game datagram (translated − untranslated
/// at the same workload) and per `getchallenge` answered; and the sweeps each flood adds.
fn print_costs(per: &[Cost]) {
    let of = |n: &str| per.iter().find(|r| r.name == n);
    println!();
    for (plain, xored, what) in [
        (
            "game1",
            "xgame1",
            "an in-game 64 B datagram, one per wake-up",
        ),
        (
            "game32",
            "xgame32",
            "an in-game 64 B datagram, bursts of 32",
        ),
        (
            "game1400",
            "xgame1400",
            "an in-game 1 400 B datagram, one per wake-up",
        ),
        (
            "roundtrip",
            "xroundtrip",
            "a round trip (each way translated)",
        ),
    ] {
        if let (Some(p), Some(x)) = (of(plain), of(xored)) {
            println!(
                "Translation, {what}: {:+.0} instructions ({:.0} against {:.0}).",
                x.per_datagram - p.per_datagram,
                x.per_datagram,
                p.per_datagram
            );
        }
    }
    if let (Some(c), Some(s)) = (of("getchallenge"), of("sgetchallenge")) {
        println!(
            "A getchallenge the relay answers itself: {:.0} instructions, {} answers to \
             {DATAGRAMS} (to the server, --server-challenges: {:.0}, {} answers).",
            c.per_datagram, c.answers, s.per_datagram, s.answers
        );
    }
    for r in per.iter().filter(|r| r.name.contains("get")) {
        println!(
            "{}: the tick's beyond a quiet relay's (the sweeps of the tables the flood fills): \
             {:.0} instructions per datagram.",
            r.name, r.tick_beyond
        );
    }
}
