//! UDP forwarding throughput: etrelay side by side with nginx's `stream` UDP proxy, on loopback.
//!
//! Run with `scripts/bench` (it builds in release mode and installs nginx when missing), or
//! `cargo run --release -p etrelay --example bench -- [SECONDS] [CLIENTS]`.
//!
//! For each path (direct to the sink, through nginx, through etrelay) the same load runs for the
//! same time: `CLIENTS` threads, each a socket on its own 127.x address, send 64-byte in-game
//! datagrams (no `FF FF FF FF` prefix, so they go through etrelay's sessions as a player's
//! would) as fast as they can; a sink thread counts what arrives. Everything runs on this
//! machine, so the load, the relay and the sink share the CPUs: the ratios matter, not the
//! absolute numbers. Every loop is bounded in time and every process started is killed by PID.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAYLOAD: usize = 64;

/// A process killed (and reaped) when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Counts datagrams arriving on `sock` until `stop`.
fn sink(
    sock: UdpSocket,
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if sock.recv(&mut buf).is_ok() {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// Offers load to `target` from `clients` sockets for `secs`; returns (sent/s, delivered/s).
fn run(target: SocketAddr, clients: u8, secs: f64, delivered: &AtomicU64) -> (f64, f64) {
    // Warm up: one datagram per client opens the sessions before counting.
    let socks: Vec<UdpSocket> = (0..clients)
        .map(|i| UdpSocket::bind((Ipv4Addr::new(127, 77, 1, 10 + i), 0)).expect("bind client"))
        .collect();
    // Each client its own qport (bytes 4..6), as real clients have: etrelay pins a qport to
    // one session.
    let packet = |i: u8| {
        let mut p = [1u8; PAYLOAD];
        p[4] = i;
        p
    };
    for (i, s) in socks.iter().enumerate() {
        let _ = s.send_to(&packet(i as u8), target);
    }
    std::thread::sleep(Duration::from_millis(300));
    let start_count = delivered.load(Ordering::Relaxed);
    let sent = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let sent = Arc::clone(&sent);
            std::thread::spawn(move || {
                let pkt = packet(i as u8);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    for _ in 0..256 {
                        if s.send_to(&pkt, target).is_ok() {
                            n += 1;
                        }
                    }
                }
                sent.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    // Let what is in flight arrive.
    std::thread::sleep(Duration::from_millis(200));
    let got = delivered.load(Ordering::Relaxed) - start_count;
    (
        sent.load(Ordering::Relaxed) as f64 / secs,
        got as f64 / secs,
    )
}

fn start_nginx(
    dir: &std::path::Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    delivered: &AtomicU64,
) -> Guard {
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
    let g = Guard(child);
    wait_forwarding(listen, delivered);
    g
}

fn start_etrelay(listen: SocketAddr, upstream: SocketAddr, delivered: &AtomicU64) -> Guard {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("etrelay")))
        .expect("etrelay next to the example");
    let mut child = Command::new(bin)
        .args([
            "--listen",
            &listen.to_string(),
            "--masters",
            "",
            "--heartbeat-interval",
            "1h",
            &upstream.to_string(),
        ])
        .env("RUST_LOG", "warn,etrelay=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etrelay (cargo build --release -p etrelay)");
    // Ready once it logs that it relays.
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
    let g = Guard(child);
    wait_forwarding(listen, delivered);
    g
}

/// Waits until datagrams sent to `listen` reach the sink (bounded to 10 s).
fn wait_forwarding(listen: SocketAddr, delivered: &AtomicU64) {
    let probe = UdpSocket::bind((Ipv4Addr::new(127, 77, 2, 1), 0)).expect("bind probe");
    let before = delivered.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && delivered.load(Ordering::Relaxed) == before {
        let _ = probe.send_to(b"probe", listen);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let clients: u8 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
        .clamp(1, 200);
    let dir = tempfile::tempdir().expect("temp dir");

    let sink_sock = UdpSocket::bind((Ipv4Addr::new(127, 77, 0, 2), 0)).expect("bind sink");
    let _ = socket2::SockRef::from(&sink_sock).set_recv_buffer_size(8 << 20);
    let sink_addr = sink_sock.local_addr().expect("sink address");
    let delivered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sink_thread = sink(sink_sock, Arc::clone(&delivered), Arc::clone(&stop));

    println!(
        "# {clients} clients, {PAYLOAD}-byte datagrams, {secs} s per path, one-way to a counting sink\n"
    );
    println!("| path | offered/s | delivered/s | delivered vs nginx |");
    println!("|---|---:|---:|---:|");
    let (o, d) = run(sink_addr, clients, secs, &delivered);
    println!("| direct | {o:.0} | {d:.0} | |");

    let nginx_addr: SocketAddr = (Ipv4Addr::new(127, 77, 0, 3), 27961).into();
    let nginx = start_nginx(dir.path(), nginx_addr, sink_addr, &delivered);
    let (on, dn) = run(nginx_addr, clients, secs, &delivered);
    drop(nginx);
    println!("| nginx 1 worker | {on:.0} | {dn:.0} | 1.00 |");

    let relay_addr: SocketAddr = (Ipv4Addr::new(127, 77, 0, 4), 27960).into();
    let relay = start_etrelay(relay_addr, sink_addr, &delivered);
    let (oe, de) = run(relay_addr, clients, secs, &delivered);
    drop(relay);
    println!("| etrelay | {oe:.0} | {de:.0} | {:.2} |", de / dn.max(1.0));

    stop.store(true, Ordering::Relaxed);
    let _ = sink_thread.join();
}
