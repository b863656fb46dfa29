//! Round-trip latency at an ET-like load, and the spoofed-source `getstatus` flood.
//!
//! 64 clients (each its own 127.x address, its own qport) send 64-byte in-game datagrams
//! through the path to the echo server, 10 000 per second in all: every millisecond ten of
//! them, the clients in turn. Each datagram carries its send time; the round trip is measured
//! when it comes back. One tokio thread sends and receives, the same for every path.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::load::packet;

/// Clients of the ET-like load.
pub(crate) const CLIENTS: usize = 64;
/// Datagrams per second, all clients together.
pub(crate) const RATE: u64 = 10_000;
/// Flood datagrams per second.
pub(crate) const FLOOD_RATE: u64 = 20_000;
/// Spoofed sources of the flood, each on its own /24.
pub(crate) const FLOOD_SOURCES: usize = 1000;

/// Percentiles of one run, in microseconds, and the share of datagrams that came back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rtt {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) returned: f64,
}

impl Rtt {
    /// The percentiles of round trips `v` (ns).
    fn of(mut v: Vec<u64>, returned: f64) -> Rtt {
        v.sort_unstable();
        let pct = |p: f64| nearest_rank(&v, p).map_or(f64::NAN, |ns| ns as f64 / 1000.0);
        Rtt {
            p50: pct(50.0),
            p99: pct(99.0),
            p999: pct(99.9),
            returned,
        }
    }
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
        let rtts = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
        let stop = Arc::new(AtomicBool::new(false));
        let mut readers = Vec::new();
        for s in &socks {
            let (s, rtts, stop) = (Arc::clone(s), Arc::clone(&rtts), Arc::clone(&stop));
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let r = tokio::time::timeout(Duration::from_millis(50), s.recv(&mut buf));
                    let Ok(Ok(n)) = r.await else { continue };
                    if n < 16 || buf[0] != 1 {
                        continue; // the warm-up's answers, or stale ones
                    }
                    let sent = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
                    let now = base.elapsed().as_nanos() as u64;
                    let mut v = rtts.lock().expect("lock");
                    if v.len() < total {
                        v.push(now.saturating_sub(sent));
                    }
                }
            }));
        }
        // Drop what a previous run left in the sockets' buffers.
        tokio::time::sleep(Duration::from_millis(20)).await;
        rtts.lock().expect("lock").clear();
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
                let t = base.elapsed().as_nanos() as u64;
                pkts[i][8..16].copy_from_slice(&t.to_le_bytes());
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
        let v = std::mem::take(&mut *rtts.lock().expect("lock"));
        let returned = v.len() as f64 / sent.max(1) as f64;
        Rtt::of(v, returned)
    })
}

/// Round trips of one client alone, one datagram at a time, 0.5 ms apart: every datagram finds
/// the path idle (no burst, no other client). `n` counted after 100 of warm-up.
pub(crate) fn ping_pong(sock: &UdpSocket, target: SocketAddr, n: usize) -> Rtt {
    sock.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("read timeout");
    // A qport of its own (etrelay pins a qport to one session).
    let mut pkt = packet(CLIENTS, 64);
    let mut buf = [0u8; 2048];
    let mut v = Vec::with_capacity(n);
    let (mut sent, deadline) = (0usize, Instant::now() + Duration::from_secs(30));
    while v.len() < n && Instant::now() < deadline {
        pkt[8..16].copy_from_slice(&(sent as u64).to_le_bytes());
        let t = Instant::now();
        if sock.send_to(&pkt, target).is_err() {
            continue;
        }
        sent += 1;
        // Only this datagram's answer counts (a late one from before is skipped).
        while let Ok(got) = sock.recv(&mut buf) {
            if got >= 16 && buf[8..16] == pkt[8..16] {
                if sent > 100 {
                    v.push(t.elapsed().as_nanos() as u64);
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let returned = v.len() as f64 / sent.saturating_sub(100).max(1) as f64;
    Rtt::of(v, returned)
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
