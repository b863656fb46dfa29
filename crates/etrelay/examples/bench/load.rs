//! The load side of the benchmark: client sockets, the `sendmmsg` load generator, the
//! `recvmmsg` counting sink and the echo server. Plain threads; every loop ends at a deadline
//! or when its stop flag is set.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quinn_udp::{RecvMeta, UdpSocketState};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, sendmmsg};

use crate::join;

/// Datagrams per `recvmmsg` (and most per `sendmmsg`).
pub(crate) const BATCH: usize = quinn_udp::BATCH_SIZE;
/// Room for one receive slot (a GRO buffer can hold many datagrams).
const SLOT: usize = 65_536;
/// First byte of a warm-up datagram (an in-game packet starts with its sequence number; no
/// `FF FF FF FF` prefix).
pub(crate) const WARM: u8 = 0xFE;

/// The address of client `i`: eight clients per /24 (etrelay caps half-open sessions per /24
/// and per IP, as it should), all on 127/8.
pub(crate) fn client_ip(base: u8, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, base, (10 + i / 8) as u8, (1 + i % 8) as u8)
}

/// `n` client sockets bound on distinct loopback addresses.
pub(crate) fn clients(base: u8, n: usize) -> Vec<UdpSocket> {
    (0..n)
        .map(|i| UdpSocket::bind((client_ip(base, i), 0)).expect("bind a client socket"))
        .collect()
}

/// An in-game datagram of `size` bytes from client `i` (its own qport in bytes 4..6, as real
/// clients have: etrelay pins a qport to one session).
pub(crate) fn packet(i: usize, size: usize) -> Vec<u8> {
    let mut p = vec![1u8; size.max(16)];
    p[4..6].copy_from_slice(&(i as u16).to_le_bytes());
    p
}

/// Byte 2 of an in-game datagram the sink sends back to its sender (callgrind's round trips).
pub(crate) const ECHO: u8 = 0xEC;

/// How long [`Receiver::recv`] waits for a datagram before it returns (the caller looks at its
/// stop flag in between).
const WAIT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 50_000_000,
};

/// A recvmmsg receiver: buffers allocated once.
pub(crate) struct Receiver {
    state: UdpSocketState,
    bufs: Vec<u8>,
    metas: [RecvMeta; BATCH],
}

impl Receiver {
    pub(crate) fn new(sock: &UdpSocket) -> Self {
        Receiver {
            state: UdpSocketState::new(sock.into()).expect("socket state"),
            bufs: vec![0; BATCH * SLOT],
            metas: [RecvMeta::default(); BATCH],
        }
    }

    /// Waits up to [`WAIT`] for a datagram, then one `recvmmsg`; calls `each` with every
    /// datagram (GRO buffers split) and its source.
    ///
    /// `UdpSocketState` makes the socket non-blocking, and a blocking `recvmmsg` would wait
    /// for a whole batch: without the `poll`, a sink or echo server with nothing to read spins
    /// on a CPU the relays under test need.
    pub(crate) fn recv(&mut self, sock: &UdpSocket, mut each: impl FnMut(SocketAddr, &[u8])) {
        let mut ready = [PollFd::new(sock, PollFlags::IN)];
        if !matches!(poll(&mut ready, Some(&WAIT)), Ok(n) if n > 0) {
            return;
        }
        let mut chunks = self.bufs.chunks_mut(SLOT);
        let mut iovs: [IoSliceMut<'_>; BATCH] =
            std::array::from_fn(|_| IoSliceMut::new(chunks.next().expect("BATCH slots")));
        let Ok(n) = self.state.recv(sock.into(), &mut iovs, &mut self.metas) else {
            return;
        };
        for (meta, iov) in self.metas[..n].iter().zip(iovs.iter()) {
            let data = &iov[..meta.len];
            let stride = if meta.stride == 0 {
                data.len().max(1)
            } else {
                meta.stride
            };
            for d in data.chunks(stride) {
                each(meta.addr, d);
            }
        }
    }
}

/// What the counting sink saw.
#[derive(Default)]
pub(crate) struct SinkCounts {
    pub(crate) delivered: AtomicU64,
    /// Bit `i` set: the warm-up datagram of client `i` arrived.
    warm: [AtomicU64; 4],
    /// Bit `i` set: it arrived translated (its bytes from 18 on XORed by etrelay).
    xored: [AtomicU64; 4],
}

impl SinkCounts {
    fn clear_warm(&self) {
        for w in self.warm.iter().chain(&self.xored) {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Whether client `i`'s warm-up datagram arrived (and, when `xored`, translated).
    fn is_warm(&self, i: usize, xored: bool) -> bool {
        let bits = if xored { &self.xored } else { &self.warm };
        bits[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    /// The clients whose warm-up datagram arrived translated, of the first `n`.
    pub(crate) fn xored_count(&self, n: usize) -> usize {
        (0..n).filter(|&i| self.is_warm(i, true)).count()
    }
}

/// The counting sink: counts every datagram, answers the handshake as an ET server
/// ([`join::server_answer`]), and answers every warm-up datagram with one in-game datagram (as
/// a game server answers a player).
pub(crate) fn sink(
    sock: UdpSocket,
    counts: Arc<SinkCounts>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rx = Receiver::new(&sock);
        let answer = packet(0, 64);
        while !stop.load(Ordering::Relaxed) {
            rx.recv(&sock, |from, d| {
                counts.delivered.fetch_add(1, Ordering::Relaxed);
                if d[0] == WARM && d.len() > 18 {
                    let i = usize::from(u16::from_le_bytes([d[8], d[9]])) & 255;
                    counts.warm[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
                    // Sent as 1: anything else is etrelay's translation.
                    if d[18] != 1 {
                        counts.xored[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
                    }
                    let _ = sock.send_to(&answer, from);
                } else if d.get(2) == Some(&ECHO) {
                    let _ = sock.send_to(d, from);
                } else if let Some(a) = join::server_answer(d) {
                    let _ = sock.send_to(&a, from);
                }
            });
        }
    })
}

/// The echo server of the latency runs: answers the handshake as an ET server
/// ([`join::server_answer`]); a `getstatus` (from etrelay's query cache) gets a
/// `statusResponse` the size of an idle ET server's; any other datagram goes back to its
/// source.
pub(crate) fn echo(sock: UdpSocket, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rx = Receiver::new(&sock);
        let mut status = b"\xff\xff\xff\xffstatusResponse\n\\sv_hostname\\bench".to_vec();
        status.resize(831, b'x');
        while !stop.load(Ordering::Relaxed) {
            rx.recv(&sock, |from, d| {
                let answer = join::server_answer(d);
                let out = if let Some(a) = &answer {
                    &a[..]
                } else if d.starts_with(b"\xff\xff\xff\xffgetstatus") {
                    &status[..]
                } else {
                    d
                };
                let _ = sock.send_to(out, from);
            });
        }
    })
}

/// Warms every client up on `target`: it joins as a real client ([`join::join`], announcing
/// its index as qport), then sends its warm-up datagram, until the sink saw the datagram of
/// every client (translated by etrelay, when `xored`), at most 30 s. A client whose datagram
/// has not arrived 300 ms after it was sent (its session gone, or not translated: 1 in 256
/// sessions has a key byte 0) joins again.
pub(crate) fn warm_up(
    socks: &[UdpSocket],
    target: SocketAddr,
    counts: &SinkCounts,
    xored: bool,
) -> bool {
    counts.clear_warm();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let missing: Vec<(&UdpSocket, u16)> = (0..socks.len())
            .filter(|&i| !counts.is_warm(i, xored))
            .map(|i| (&socks[i], i as u16))
            .collect();
        if missing.is_empty() {
            return true;
        }
        join::join(&missing, target);
        for &(s, i) in &missing {
            let mut p = packet(usize::from(i), 64);
            p[0] = WARM;
            p[8..10].copy_from_slice(&i.to_le_bytes());
            let _ = s.send(&p);
        }
        let wait = Instant::now() + Duration::from_millis(300);
        while Instant::now() < wait && (0..socks.len()).any(|i| !counts.is_warm(i, xored)) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    false
}

/// Offers load to `target` as fast as one thread can with `sendmmsg`: the clients in turn, each
/// a batch of identical datagrams of `size` bytes (32 for one client, 8 for 32, 1 for 256).
/// Returns the datagrams sent.
pub(crate) fn saturate(socks: &[UdpSocket], target: SocketAddr, size: usize, secs: f64) -> u64 {
    for s in socks {
        s.connect(target).expect("connect a client socket");
    }
    let per_turn = (256 / socks.len()).clamp(1, BATCH);
    let pkts: Vec<Vec<u8>> = (0..socks.len()).map(|i| packet(i, size)).collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = pkts.iter().map(|p| [IoSlice::new(p)]).collect();
    let mut controls: Vec<Vec<SendAncillaryBuffer<'_, '_, '_>>> = (0..socks.len())
        .map(|_| {
            (0..per_turn)
                .map(|_| SendAncillaryBuffer::default())
                .collect()
        })
        .collect();
    let mut msgs: Vec<Vec<MMsgHdr<'_>>> = iovs
        .iter()
        .zip(controls.iter_mut())
        .map(|(iov, cs)| cs.iter_mut().map(|c| MMsgHdr::new(iov, c)).collect())
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    while Instant::now() < deadline {
        for _ in 0..16 {
            for (s, m) in socks.iter().zip(msgs.iter_mut()) {
                match sendmmsg(s, m, SendFlags::empty()) {
                    Ok(n) => sent += n as u64,
                    Err(e) if io::Error::from(e).kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => {}
                }
            }
        }
    }
    sent
}
