//! Floods for attack tests: one packet from each of many source addresses, bounded in count
//! and time, on loopback only.
//!
//! Each packet leaves from a fresh socket bound to its source address and port, so the relay
//! sees exactly the sources an attacker would show it: many IPs (spoofed, or a botnet), or one
//! real IP cycling its ports. Nothing is spoofed at the IP layer: every source is a real
//! 127.x.y.z address of this machine.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Sends `packet` to `to` once from each of `sources`. Returns how many were sent; a source
/// that cannot be bound (in use) is skipped.
pub fn once(sources: &[SocketAddr], to: SocketAddr, packet: &[u8]) -> usize {
    sources
        .iter()
        .filter(|src| send_from(**src, to, packet).is_ok())
        .count()
}

fn send_from(src: SocketAddr, to: SocketAddr, packet: &[u8]) -> io::Result<()> {
    UdpSocket::bind(src)?.send_to(packet, to).map(|_| ())
}

/// `n` sources on distinct addresses (see [`crate::unique_ips`]), port 0 (any).
pub fn many_ips(n: usize) -> Vec<SocketAddr> {
    crate::unique_ips(n)
        .into_iter()
        .map(|ip| SocketAddr::from((ip, 0)))
        .collect()
}

/// `n` sources on one address: ports 20000, 20001, … (one real IP cycling its ports).
pub fn many_ports(ip: Ipv4Addr, n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::from((ip, 20_000 + (i % 40_000) as u16)))
        .collect()
}

/// A flood running on its own thread: round after round over its sources until stopped, or
/// until `max_packets` or `max_time`, whichever comes first.
#[derive(Debug)]
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    /// Starts flooding `to` with `packet` from `sources`, at most `rate` packets per second
    /// (`None`: as fast as the loop goes).
    pub fn start(
        sources: Vec<SocketAddr>,
        to: SocketAddr,
        packet: Vec<u8>,
        rate: Option<u32>,
        max_packets: u64,
        max_time: Duration,
    ) -> Flood {
        Flood::start_varied(
            sources,
            to,
            Box::new(move |_| packet.clone()),
            rate,
            max_packets,
            max_time,
        )
    }

    /// [`Flood::start`] with the `n`-th packet made by `packet(n)` (another qport each time,
    /// say).
    pub fn start_varied(
        sources: Vec<SocketAddr>,
        to: SocketAddr,
        packet: Box<dyn Fn(u64) -> Vec<u8> + Send>,
        rate: Option<u32>,
        max_packets: u64,
        max_time: Duration,
    ) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut n: u64 = 0;
                'rounds: while !sources.is_empty() {
                    for src in &sources {
                        if stop.load(Ordering::Relaxed)
                            || n >= max_packets
                            || start.elapsed() >= max_time
                        {
                            break 'rounds;
                        }
                        if send_from(*src, to, &packet(n)).is_ok() {
                            n += 1;
                            sent.store(n, Ordering::Relaxed);
                        }
                        if let Some(rate) = rate.filter(|r| *r > 0) {
                            let due = start + Duration::from_secs_f64(n as f64 / f64::from(rate));
                            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                        }
                    }
                }
            })
        };
        Flood {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    /// Packets sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops the flood; returns the packets sent.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.sent()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_reaches_its_target_from_every_source() {
        let sink = UdpSocket::bind((crate::unique_ip(), 0)).unwrap();
        sink.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to = sink.local_addr().unwrap();
        let ip = crate::unique_ip();
        assert_eq!(once(&many_ports(ip, 10), to, b"x"), 10);
        let mut ports = std::collections::HashSet::new();
        let mut buf = [0u8; 8];
        for _ in 0..10 {
            let (_, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!(from.ip(), ip);
            ports.insert(from.port());
        }
        assert_eq!(ports.len(), 10);
        let flood = Flood::start(
            many_ips(3),
            to,
            b"y".to_vec(),
            None,
            7,
            Duration::from_secs(5),
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(flood.stop(), 7, "bounded by the packet count");
    }
}
