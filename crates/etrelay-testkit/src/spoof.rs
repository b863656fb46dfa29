//! Datagrams with a forged source IP **and port**, on loopback only, through a raw socket
//! (`IPPROTO_RAW`, which implies `IP_HDRINCL`): the IPv4 and UDP headers are written here,
//! the UDP checksum left at 0 (none, allowed over IPv4), the IP checksum, total length and
//! packet id filled in by the kernel. Raw sockets need root (`CAP_NET_RAW`).
//!
//! [`crate::flood`] sends from real sockets bound to 127.x.y.z addresses, so it cannot take a
//! port another process holds. This can: a `getinfo` forged from a master's own IP *and* port
//! (27950) is answered by the relay to the master's socket itself, as in the real attack.
//!
//! [`SpoofFlood`] is a bounded flood of such datagrams on its own thread, like
//! [`crate::flood::Flood`] (rate, packet count, time, stop).

use std::io;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// `IPPROTO_RAW` (255): a raw socket whose datagrams carry their own IP header.
const IPPROTO_RAW: i32 = 255;
/// `IPPROTO_UDP`.
const IPPROTO_UDP: u8 = 17;
/// Bytes of the IPv4 header written (no options).
const IP_HEADER: usize = 20;
/// Bytes of the UDP header.
const UDP_HEADER: usize = 8;
/// Largest payload of one datagram.
pub const MAX_PAYLOAD: usize = u16::MAX as usize - IP_HEADER - UDP_HEADER;

/// The IPv4 + UDP datagram from `from` to `to` carrying `payload`: version 4, no options,
/// DF, TTL 64, IP checksum and id 0 (the kernel fills them in), UDP checksum 0 (none).
pub fn datagram(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = (UDP_HEADER + payload.len()) as u16;
    let total = (IP_HEADER + UDP_HEADER + payload.len()) as u16;
    let mut p = Vec::with_capacity(total as usize);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
    p.extend_from_slice(&from.ip().octets());
    p.extend_from_slice(&to.ip().octets());
    p.extend_from_slice(&from.port().to_be_bytes());
    p.extend_from_slice(&to.port().to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

/// A raw socket that sends UDP datagrams with any loopback source.
#[derive(Debug)]
pub struct Spoofer {
    socket: Socket,
}

impl Spoofer {
    /// Opens the raw socket; fails with [`io::ErrorKind::PermissionDenied`] (and a message
    /// saying so) when not root.
    pub fn new() -> io::Result<Spoofer> {
        match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW))) {
            Ok(socket) => Ok(Spoofer { socket }),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "spoofing a source address and port needs a raw socket, i.e. root \
                     (CAP_NET_RAW): {e}"
                ),
            )),
            Err(e) => Err(e),
        }
    }

    /// Sends `payload` to `to` as if from `from`; both must be loopback addresses.
    pub fn send(&self, from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> io::Result<()> {
        if !from.ip().is_loopback() || !to.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("spoofed datagrams stay on 127.0.0.0/8: {from} -> {to}"),
            ));
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("payload of {} bytes", payload.len()),
            ));
        }
        let packet = datagram(from, to, payload);
        let dest = SockAddr::from(SocketAddrV4::new(*to.ip(), 0));
        self.socket.send_to(&packet, &dest).map(|_| ())
    }
}

/// Whether spoofing works here (root): `Err` says why not.
pub fn available() -> io::Result<()> {
    Spoofer::new().map(|_| ())
}

/// A flood of spoofed datagrams on its own thread: round after round over its sources until
/// stopped, or until `max_packets` or `max_time`, whichever comes first.
#[derive(Debug)]
pub struct SpoofFlood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// Makes the `n`-th packet of a flood.
pub type Packets = Box<dyn Fn(u64) -> Vec<u8> + Send>;

impl SpoofFlood {
    /// Starts flooding `to` with `packet(n)` forged from `sources` (loopback), at most `rate`
    /// packets per second (`None`: as fast as the loop goes). Fails when the raw socket cannot
    /// be opened (not root) or an address is not loopback.
    pub fn start(
        sources: Vec<SocketAddrV4>,
        to: SocketAddrV4,
        packet: Packets,
        rate: Option<u32>,
        max_packets: u64,
        max_time: Duration,
    ) -> io::Result<SpoofFlood> {
        let spoofer = Spoofer::new()?;
        if let Some(bad) = sources
            .iter()
            .map(SocketAddrV4::ip)
            .chain([to.ip()])
            .find(|ip| !ip.is_loopback())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("spoofed datagrams stay on 127.0.0.0/8, not {bad}"),
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            std::thread::Builder::new()
                .name("etrelay-testkit-spoof".into())
                .spawn(move || {
                    let bounds = Bounds {
                        stop: &stop,
                        max_packets,
                        max_time,
                        rate,
                    };
                    run(&spoofer, &sources, to, &packet, &bounds, &sent);
                })?
        };
        Ok(SpoofFlood {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Packets sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Whether the flood has ended (bound reached or stopped).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
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

impl Drop for SpoofFlood {
    fn drop(&mut self) {
        self.halt();
    }
}

/// What ends a flood, and its pace.
struct Bounds<'a> {
    stop: &'a AtomicBool,
    max_packets: u64,
    max_time: Duration,
    rate: Option<u32>,
}

/// The flood's loop.
fn run(
    spoofer: &Spoofer,
    sources: &[SocketAddrV4],
    to: SocketAddrV4,
    packet: &Packets,
    bounds: &Bounds<'_>,
    sent: &AtomicU64,
) {
    let start = Instant::now();
    let mut n: u64 = 0;
    let mut attempts: u64 = 0;
    'rounds: while !sources.is_empty() {
        for src in sources {
            if bounds.stop.load(Ordering::Relaxed)
                || n >= bounds.max_packets
                || start.elapsed() >= bounds.max_time
            {
                break 'rounds;
            }
            attempts += 1;
            if spoofer.send(*src, to, &packet(n)).is_ok() {
                n += 1;
                sent.store(n, Ordering::Relaxed);
            }
            if let Some(rate) = bounds.rate.filter(|r| *r > 0) {
                // Paced on attempts: a send the kernel refuses (ENOBUFS) does not speed up
                // the next ones.
                let due = start + Duration::from_secs_f64(attempts as f64 / f64::from(rate));
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

    #[test]
    fn the_headers_are_the_ones_the_kernel_expects() {
        let from = SocketAddrV4::new(Ipv4Addr::new(127, 1, 2, 3), 27950);
        let to = SocketAddrV4::new(Ipv4Addr::new(127, 4, 5, 6), 27960);
        let p = datagram(from, to, b"\xff\xff\xff\xffgetinfo x");
        assert_eq!(p.len(), 20 + 8 + 13);
        assert_eq!(&p[..4], &[0x45, 0, 0, 41]);
        assert_eq!(p[9], 17, "UDP");
        assert_eq!(&p[12..16], &[127, 1, 2, 3]);
        assert_eq!(&p[16..20], &[127, 4, 5, 6]);
        assert_eq!(&p[20..28], &[0x6d, 0x2e, 0x6d, 0x38, 0, 21, 0, 0]);
        assert_eq!(&p[28..], b"\xff\xff\xff\xffgetinfo x");
    }

    #[test]
    fn a_forged_datagram_arrives_from_the_forged_address_and_port_or_root_is_named() {
        let spoofer = match Spoofer::new() {
            Ok(s) => s,
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
                assert!(e.to_string().contains("root"), "{e}");
                return;
            }
        };
        let sink = UdpSocket::bind((crate::unique_ip(), 0)).unwrap();
        sink.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let SocketAddr::V4(to) = sink.local_addr().unwrap() else {
            unreachable!()
        };
        // A port some other socket holds: the forged datagram still leaves "from" it.
        let held = UdpSocket::bind((crate::unique_ip(), 0)).unwrap();
        let SocketAddr::V4(from) = held.local_addr().unwrap() else {
            unreachable!()
        };
        spoofer.send(from, to, b"forged").unwrap();
        let mut buf = [0u8; 64];
        let (n, got) = sink.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], got), (&b"forged"[..], SocketAddr::V4(from)));
        let outside = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 1);
        assert!(spoofer.send(outside, to, b"x").is_err(), "loopback only");

        let flood = SpoofFlood::start(
            vec![from],
            to,
            Box::new(|n| n.to_string().into_bytes()),
            None,
            5,
            Duration::from_secs(5),
        )
        .unwrap();
        for i in 0..5 {
            let (n, got) = sink.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], got), (i.to_string().as_bytes(), from.into()));
        }
        assert_eq!(flood.stop(), 5, "bounded by the packet count");
    }
}
