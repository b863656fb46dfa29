//! Round-trip latency at an ET-like load, and the spoofed-source `getstatus` flood.
//!
//! 64 clients (each its own 127.x address, its own qport) send 64-byte in-game datagrams
//! through the path to the echo server, 10 000 per second in all: every millisecond ten of
//! them, the clients in turn. Each datagram carries its number in the run (bytes 0..4, where
//! an in-game packet has its sequence number) and the run's tag (bytes 6..8): bytes etrelay's
//! translation never changes (it XORs a client's packet from byte 18 on, the server's from
//! byte 8 on); the round trip is measured from the send time kept under that number when it
//! comes back. One tokio thread sends and receives, the same for every path.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::join;
use crate::load::packet;

/// Clients of the ET-like load.
pub(crate) const CLIENTS: usize = 64;
/// Datagrams per second, all clients together.
pub(crate) const RATE: u64 = 10_000;
/// Flood datagrams per second.
pub(crate) const FLOOD_RATE: u64 = 20_000;
/// Spoofed sources of the flood, each on its own /24.
pub(crate) const FLOOD_SOURCES: usize = 1000;

/// Percentiles of one run, in microseconds, the share of datagrams that came back, and the
/// share of those that came back translated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rtt {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) returned: f64,
    pub(crate) xored: f64,
}

impl Rtt {
    /// The percentiles of round trips `v` (ns), `xored` of them translated.
    fn of(mut v: Vec<u64>, returned: f64, xored: usize) -> Rtt {
        let xored = xored as f64 / v.len().max(1) as f64;
        v.sort_unstable();
        let pct = |p: f64| nearest_rank(&v, p).map_or(f64::NAN, |ns| ns as f64 / 1000.0);
        Rtt {
            p50: pct(50.0),
            p99: pct(99.0),
            p999: pct(99.9),
            returned,
            xored,
        }
    }
}

/// The tag of the next run or ping-pong (bytes 6..8 of its datagrams): never 0x0101, the bytes
/// of other in-game datagrams ([`packet`]), so a late answer from another run never counts.
fn next_tag() -> [u8; 2] {
    static TAG: AtomicU16 = AtomicU16::new(0x8000);
    (TAG.fetch_add(1, Ordering::Relaxed) | 0x8000).to_le_bytes()
}

/// Datagram `n` of the run tagged `tag` (its bytes 0..4 and 6..8 set) in `p`.
fn stamp(p: &mut [u8], n: usize, tag: [u8; 2]) {
    p[0..4].copy_from_slice(&(n as u32).to_le_bytes());
    p[6..8].copy_from_slice(&tag);
}

/// The number of `d` if it is a datagram of the run tagged `tag`.
fn number(d: &[u8], tag: [u8; 2]) -> Option<usize> {
    (d.len() >= 18 && d[6..8] == tag).then(|| u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize)
}

/// Whether `d` came back translated: etrelay XORs the server's packet from byte 8 on, and the
/// client's from byte 18 on, so bytes 8..18 of an echo come back changed (they were sent as
/// [`packet`]'s, all 1).
fn is_xored(d: &[u8]) -> bool {
    d[8..18].iter().any(|&b| b != 1)
}

/// The nearest-rank `p`-th percentile (0 < `p` ≤ 100) of `sorted` (ascending): the smallest
/// value with at least `p` % of the values at or below it; `None` when there is none. (The
/// same definition as blindrelay's bench, `crates/blindrelay/examples/delivery/load.rs`.)
fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let n = sorted.len();
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    (n > 0).then(|| sorted[rank.clamp(1, n) - 1])
}

/// One run of `secs` seconds through `target`; `socks` are the clients (bound once, so
/// etrelay's sessions live across runs).
pub(crate) fn run(socks: &[UdpSocket], target: SocketAddr, secs: f64) -> Rtt {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let socks: Vec<Arc<tokio::net::UdpSocket>> = socks
            .iter()
            .map(|s| {
                let s = s.try_clone().expect("clone a client socket");
                s.connect(target).expect("connect");
                s.set_nonblocking(true).expect("non-blocking");
                Arc::new(tokio::net::UdpSocket::from_std(s).expect("tokio socket"))
            })
            .collect();
        let base = Instant::now();
        let total = (RATE as f64 * secs) as usize;
        let tag = next_tag();
        // The send time of datagram `n` (ns since `base`, plus 1: 0 is "not sent").
        let sent_at: Arc<Vec<AtomicU64>> =
            Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
        let got = Arc::new(std::sync::Mutex::new((Vec::with_capacity(total), 0usize)));
        let stop = Arc::new(AtomicBool::new(false));
        let mut readers = Vec::new();
        for s in &socks {
            let (s, got, stop) = (Arc::clone(s), Arc::clone(&got), Arc::clone(&stop));
            let sent_at = Arc::clone(&sent_at);
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let r = tokio::time::timeout(Duration::from_millis(50), s.recv(&mut buf));
                    let Ok(Ok(n)) = r.await else { continue };
                    // The warm-up's answers, or another run's, are not this run's.
                    let Some(sent) = number(&buf[..n], tag)
                        .and_then(|k| sent_at.get(k))
                        .map(|t| t.swap(0, Ordering::Relaxed))
                        .filter(|&t| t != 0)
                    else {
                        continue;
                    };
                    let now = base.elapsed().as_nanos() as u64 + 1;
                    let mut g = got.lock().expect("lock");
                    g.0.push(now.saturating_sub(sent));
                    g.1 += usize::from(is_xored(&buf[..n]));
                }
            }));
        }
        let per_ms = (RATE / 1000) as usize;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut pkts: Vec<Vec<u8>> = (0..socks.len()).map(|i| packet(i, 64)).collect();
        let mut next = 0usize;
        let mut sent = 0usize;
        let deadline = base + Duration::from_secs_f64(secs);
        while Instant::now() < deadline && sent < total {
            tick.tick().await;
            for _ in 0..per_ms {
                let i = next % socks.len();
                next += 1;
                stamp(&mut pkts[i], sent, tag);
                sent_at[sent].store(base.elapsed().as_nanos() as u64 + 1, Ordering::Relaxed);
                if socks[i].try_send(&pkts[i]).is_ok() {
                    sent += 1;
                }
            }
        }
        // What is still in flight comes back within this.
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            let _ = r.await;
        }
        let (v, xored) = std::mem::take(&mut *got.lock().expect("lock"));
        let returned = v.len() as f64 / sent.max(1) as f64;
        Rtt::of(v, returned, xored)
    })
}

/// Round trips of one client alone, one datagram at a time, 0.5 ms apart: every datagram finds
/// the path idle (no burst, no other client). `n` counted after 100 of warm-up.
pub(crate) fn ping_pong(sock: &UdpSocket, target: SocketAddr, n: usize) -> Rtt {
    sock.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("read timeout");
    // A qport of its own (etrelay pins a qport to one session).
    let mut pkt = packet(CLIENTS, 64);
    let tag = next_tag();
    let mut buf = [0u8; 2048];
    let (mut v, mut xored) = (Vec::with_capacity(n), 0);
    let (mut sent, deadline) = (0usize, Instant::now() + Duration::from_secs(30));
    while v.len() < n && Instant::now() < deadline {
        stamp(&mut pkt, sent, tag);
        let t = Instant::now();
        if sock.send_to(&pkt, target).is_err() {
            continue;
        }
        sent += 1;
        // Only this datagram's answer counts (a late one from before is skipped).
        while let Ok(got) = sock.recv(&mut buf) {
            if number(&buf[..got], tag) == Some(sent - 1) {
                if sent > 100 {
                    v.push(t.elapsed().as_nanos() as u64);
                    xored += usize::from(is_xored(&buf[..got]));
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let returned = v.len() as f64 / sent.saturating_sub(100).max(1) as f64;
    Rtt::of(v, returned, xored)
}

/// Joins every client of `socks` (client `k` announcing qport `first_qport + k`, as its
/// datagrams carry) on `target` ([`join::join`]), then checks with one datagram each that its
/// session carries it there and back, translated when `xored` (etrelay's default: in 1 session
/// in 256 the key byte `(C ^ S) & 0xff` is 0, and the client joins again); at most 5 tries.
/// Each socket is left connected to `target`.
pub(crate) fn join(socks: &[UdpSocket], first_qport: u16, target: SocketAddr, xored: bool) {
    let mut missing: Vec<usize> = (0..socks.len()).collect();
    for _ in 0..5 {
        let clients: Vec<(&UdpSocket, u16)> = missing
            .iter()
            .map(|&k| (&socks[k], first_qport + k as u16))
            .collect();
        join::join(&clients, target);
        let tag = next_tag();
        for &k in &missing {
            let mut p = packet(usize::from(first_qport) + k, 64);
            stamp(&mut p, k, tag);
            let _ = socks[k].send(&p);
        }
        missing.retain(|&k| !came_back(&socks[k], k, tag, xored));
        if missing.is_empty() {
            return;
        }
    }
    eprintln!(
        "warning: {} of {} clients not through {target}{}",
        missing.len(),
        socks.len(),
        if xored { " translated" } else { "" }
    );
}

/// Whether datagram `k` of the check tagged `tag` comes back to `sock` within 300 ms
/// (translated, when `xored`).
fn came_back(sock: &UdpSocket, k: usize, tag: [u8; 2], xored: bool) -> bool {
    let mut buf = [0u8; 2048];
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("read timeout");
    let mut ok = false;
    while let Ok(n) = sock.recv(&mut buf) {
        if number(&buf[..n], tag) == Some(k) {
            ok = !xored || is_xored(&buf[..n]);
            break;
        }
    }
    sock.set_read_timeout(None).expect("read timeout");
    ok
}

/// The client sockets of the latency runs (127.78.x.y).
pub(crate) fn clients() -> Vec<UdpSocket> {
    crate::load::clients(78, CLIENTS)
}

/// A `getstatus` flood at [`FLOOD_RATE`] from [`FLOOD_SOURCES`] loopback sources (127.88.x.y,
/// every source on its own /24, so the per-source limiter and the per-/24 answer budget see
/// a spread-out attack), until `stop` or `secs` (a bound). Returns the thread and its count.
pub(crate) fn flood(
    target: SocketAddr,
    secs: f64,
    stop: Arc<AtomicBool>,
) -> (JoinHandle<()>, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&sent);
    let socks: Vec<UdpSocket> = (0..FLOOD_SOURCES)
        .map(|i| {
            let ip = std::net::Ipv4Addr::new(127, 88, (i % 250) as u8, (1 + i / 250) as u8);
            UdpSocket::bind((ip, 0)).expect("bind a flood source")
        })
        .collect();
    let t = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let per_ms = (FLOOD_RATE / 1000) as usize;
        let start = Instant::now();
        let mut n = 0usize;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_micros() as u64 * FLOOD_RATE / 1_000_000) as usize;
            if n >= due {
                std::thread::sleep(Duration::from_micros(500));
                continue;
            }
            for _ in 0..per_ms.min(due - n) {
                let _ = socks[n % socks.len()].send_to(b"\xff\xff\xff\xffgetstatus\n", target);
                n += 1;
            }
        }
        count.store(n as u64, Ordering::Relaxed);
    });
    (t, sent)
}

/// The medians of the rounds per path, the flood's effect, and the relays' CPU time per round
/// trip.
pub(crate) fn print_medians(
    plan: &crate::Plan,
    all: &[Vec<Rtt>; crate::PATHS],
    flood_sent: u64,
    cpu: &[crate::cpu::Sched; 4],
) {
    println!(
        "\nFlood: {} `getstatus` sent in all ({} per second while it ran, {} sources).\n",
        flood_sent, FLOOD_RATE, FLOOD_SOURCES
    );
    println!("Medians of the rounds:\n");
    println!("| path | p50 | p99 | p99.9 | p99 / nginx's |");
    println!("|---|---:|---:|---:|---:|");
    let med = |k: usize, f: fn(&Rtt) -> f64| crate::median(all[k].iter().map(f).collect());
    let nginx_p99 = med(1, |r| r.p99);
    for (k, name) in crate::latency_paths().iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.2} |",
            med(k, |r| r.p50),
            med(k, |r| r.p99),
            med(k, |r| r.p999),
            med(k, |r| r.p99) / nginx_p99
        );
    }
    println!(
        "\netrelay's p99 under the flood ÷ without: **{:.2}**",
        med(3, |r| r.p99) / med(2, |r| r.p99)
    );
    // Round trips sent per path over the rounds (the share that came back is ~100 %).
    let trips = (RATE as f64 * plan.lat_secs * plan.lat_rounds as f64).max(1.0);
    println!(
        "\nCPU time of the relay per round trip, unloaded runs (its processes' time on a CPU, \
         `/proc/PID/schedstat`): nginx {:.1} µs, etrelay {:.1} µs ({:.2}×), {} {:.1} µs, \
         --busy-polling {:.1} µs ({:.1}×).",
        cpu[0].ns as f64 / 1000.0 / trips,
        cpu[1].ns as f64 / 1000.0 / trips,
        cpu[1].ns as f64 / cpu[0].ns.max(1) as f64,
        crate::alt(true),
        cpu[2].ns as f64 / 1000.0 / trips,
        cpu[3].ns as f64 / 1000.0 / trips,
        cpu[3].ns as f64 / cpu[0].ns.max(1) as f64,
    );
    println!(
        "Times the relay was put on a CPU per round trip (its wake-ups and preemptions, the \
         same file): nginx {:.2}, etrelay {:.2}, {} {:.2}, --busy-polling {:.2}.",
        cpu[0].runs as f64 / trips,
        cpu[1].runs as f64 / trips,
        crate::alt(true),
        cpu[2].runs as f64 / trips,
        cpu[3].runs as f64 / trips,
    );
}
