//! Sockets: batched datagram receive for the public socket, and the sockets connected to the
//! game server (sessions, the query cache, probes, proofs).
//!
//! One `recvmmsg` (through `quinn-udp`, which also turns on UDP GRO where the kernel has it)
//! takes up to [`BATCH`] datagrams per system call instead of one. Coalesced GRO buffers are
//! split back into datagrams by their stride. The buffers are allocated once. The control
//! messages `quinn-udp` asks for and the relay never reads are turned off again
//! ([`quiet_control_messages`]). [`send_batch`] sends up to [`BATCH`] datagrams on a connected
//! socket with one `sendmmsg`.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use quinn_udp::{RecvMeta, UdpSocketState};
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, sendmmsg};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::UdpSocket;

pub(crate) mod ring;

/// Datagrams (or GRO buffers) taken per system call.
pub const BATCH: usize = quinn_udp::BATCH_SIZE;
/// Room for one receive slot: the largest UDP datagram.
const SLOT: usize = 65_536;

/// A UDP socket registered with the runtime for reading only: the public socket, and each
/// session's socket connected to the game server.
///
/// Everyone sends on it without waiting (a full send buffer drops the datagram on the public
/// socket, as a congested UDP hop would; a session keeps it queued and retries), so nothing
/// waits for it to be writable. A socket registered for writing too (as tokio's `UdpSocket`
/// always is) is woken with `EPOLLOUT` each time a sent datagram leaves its buffer: one
/// spurious `epoll_wait` return per datagram sent.
#[derive(Debug)]
pub struct ReadSocket {
    fd: AsyncFd<std::net::UdpSocket>,
}

impl ReadSocket {
    /// Takes over `socket` (bound) for reading only.
    ///
    /// # Errors
    /// The socket cannot be taken from tokio's reactor or registered again.
    pub fn new(socket: UdpSocket) -> io::Result<Self> {
        Self::from_std(socket.into_std()?)
    }

    /// Registers `std` (bound) for reading only.
    ///
    /// # Errors
    /// The socket cannot be made non-blocking or registered.
    pub fn from_std(std: std::net::UdpSocket) -> io::Result<Self> {
        std.set_nonblocking(true)?;
        // Deprecated in favour of an `unsafe` constructor because an `AsRawFd` type could close
        // its descriptor while it is registered; `std::net::UdpSocket` owns its descriptor and
        // the `AsyncFd` owns the socket, so the registration is sound as it is.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(std, Interest::READABLE)?;
        Ok(ReadSocket { fd })
    }

    /// Waits until a datagram may be queued.
    ///
    /// # Errors
    /// The reactor is gone.
    pub async fn readable(&self) -> io::Result<()> {
        self.fd.readable().await.map(drop)
    }

    /// Sends `data` to `to` without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when the send buffer is full; other errors from the socket.
    pub fn try_send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.fd.get_ref().send_to(data, to)
    }

    /// Takes one datagram of the connected peer without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when none is queued (the readiness is cleared, so `readable()` waits
    /// again); other errors from the socket (an ICMP error reported on it).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.fd.try_io(Interest::READABLE, |s| s.recv(buf))
    }

    /// The socket itself (options, address, sends).
    pub fn get_ref(&self) -> &std::net::UdpSocket {
        self.fd.get_ref()
    }
}

/// Receive buffers and metadata for one socket.
#[derive(Debug)]
pub struct BatchRecv {
    state: UdpSocketState,
    bufs: Vec<u8>,
    metas: [RecvMeta; BATCH],
    filled: usize,
}

impl BatchRecv {
    /// Prepares `socket` (GRO, no control messages the relay does not read) and the buffers.
    ///
    /// # Errors
    /// The socket options could not be read or set.
    pub fn new(socket: &ReadSocket) -> io::Result<Self> {
        let state = UdpSocketState::new(socket.get_ref().into())?;
        quiet_control_messages(socket.get_ref())?;
        Ok(BatchRecv {
            state,
            bufs: vec![0; BATCH * SLOT],
            metas: [RecvMeta::default(); BATCH],
            filled: 0,
        })
    }

    /// Takes what is queued on `socket` (up to [`BATCH`] slots) without waiting.
    ///
    /// A short batch (fewer than [`BATCH`] slots filled) means the queue was empty when the
    /// kernel answered: the socket's readiness is cleared then and there ([`BatchRecv::drained`]),
    /// which saves the `recvmmsg` that would only have found the queue empty. That is race-free:
    /// tokio clears only the readiness it had seen before the call, so a datagram that arrived
    /// since makes the socket ready again.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is queued (readiness is cleared, so `readable()` waits again);
    /// other errors from the socket.
    pub fn try_recv(&mut self, socket: &ReadSocket) -> io::Result<usize> {
        let BatchRecv {
            state, bufs, metas, ..
        } = self;
        let mut chunks = bufs.chunks_mut(SLOT);
        let mut iovs: [IoSliceMut<'_>; BATCH] = std::array::from_fn(|_| {
            IoSliceMut::new(chunks.next().expect("invariant: bufs holds BATCH slots"))
        });
        let r = recv_clearing(socket, state, &mut iovs, metas);
        self.filled = *r.as_ref().unwrap_or(&0);
        r
    }

    /// True when the last [`BatchRecv::try_recv`] found the queue empty after what it took: the
    /// socket's readiness is cleared, `readable()` waits for the next datagram.
    pub fn drained(&self) -> bool {
        self.filled < BATCH
    }

    /// The datagrams of the last [`BatchRecv::try_recv`], GRO buffers split by stride.
    pub fn datagrams(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> {
        self.metas[..self.filled]
            .iter()
            .zip(self.bufs.chunks(SLOT))
            .flat_map(|(meta, slot)| {
                let data = &slot[..meta.len.min(SLOT)];
                let stride = if meta.stride == 0 {
                    data.len().max(1)
                } else {
                    meta.stride
                };
                data.chunks(stride).map(move |d| (meta.addr, d))
            })
    }
}

/// Receives the game server's answers on the sessions' sockets: two slots per `recvmmsg`.
///
/// An ET server sends a player one datagram per server frame, so a session's socket mostly
/// holds one answer when it wakes. A `recv` takes it, and a second one finds the queue empty
/// (which is what clears the readiness). One `recvmmsg` of two slots does both: when it fills
/// fewer than two, the queue was empty when the kernel answered, and the readiness is cleared
/// then and there, race-free as in [`BatchRecv::try_recv`]. One system call of the seven of a
/// relayed round trip saved, no allocation: the slots are the one buffer all sessions share.
#[derive(Debug)]
pub struct PairRecv {
    /// `quinn-udp`'s receive state. On Linux its `recv` reads no setting of it; it is built once
    /// from a socket of its own (never bound, closed at once), since building it sets options
    /// on the socket it is given, and a session's socket needs none of them.
    state: UdpSocketState,
    /// Two slots of `slot` bytes.
    bufs: Vec<u8>,
    slot: usize,
    metas: [RecvMeta; 2],
    filled: usize,
}

impl PairRecv {
    /// Two slots of `slot` bytes (a longer datagram is cut to `slot` bytes, as a `recv` cuts it).
    ///
    /// # Errors
    /// No UDP socket could be created to build the receive state.
    pub fn new(slot: usize) -> io::Result<Self> {
        let slot = slot.max(1);
        // Never bound: no port is opened, and no address (not even loopback) is needed.
        let own = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)
            .or_else(|_| socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None))?;
        Ok(PairRecv {
            state: UdpSocketState::new((&own).into())?,
            bufs: vec![0; 2 * slot],
            slot,
            metas: [RecvMeta::default(); 2],
            filled: 0,
        })
    }

    /// Takes up to two datagrams queued on `socket` (connected) without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when none is queued (the readiness is cleared, so `readable()` waits
    /// again); other errors from the socket (an ICMP error reported on it).
    pub fn try_recv(&mut self, socket: &ReadSocket) -> io::Result<usize> {
        let PairRecv {
            state,
            bufs,
            slot,
            metas,
            ..
        } = self;
        let (a, b) = bufs.split_at_mut(*slot);
        let mut iovs = [IoSliceMut::new(a), IoSliceMut::new(b)];
        let r = recv_clearing(socket, state, &mut iovs, metas);
        self.filled = *r.as_ref().unwrap_or(&0);
        r
    }

    /// True when the last [`PairRecv::try_recv`] found the queue empty after what it took.
    pub fn drained(&self) -> bool {
        self.filled < 2
    }

    /// The datagrams of the last [`PairRecv::try_recv`], to be read and rewritten in place.
    pub fn datagrams(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.metas[..self.filled]
            .iter()
            .zip(self.bufs.chunks_mut(self.slot))
            .map(|(meta, slot)| {
                let len = meta.len.min(slot.len());
                &mut slot[..len]
            })
    }
}

/// One `recvmmsg` on `socket` into `iovs`: the datagrams taken. Fewer than `iovs.len()` means
/// the queue was empty when the kernel answered, and the readiness is cleared then and there
/// (tokio clears only the readiness it had seen before the call, so a datagram that arrived
/// since makes the socket ready again).
///
/// # Errors
/// `WouldBlock` when nothing is queued (readiness cleared); other errors from the socket.
fn recv_clearing(
    socket: &ReadSocket,
    state: &UdpSocketState,
    iovs: &mut [IoSliceMut<'_>],
    metas: &mut [RecvMeta],
) -> io::Result<usize> {
    let mut got = 0;
    let r = socket.fd.try_io(Interest::READABLE, |s| {
        got = state.recv(s.into(), iovs, metas)?;
        if got < iovs.len() {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(got)
        }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        r => r,
    }
}

/// Turns off the control messages `quinn-udp` turns on for a QUIC endpoint and the relay never
/// reads: the destination address (`IP_PKTINFO`, `IPV6_RECVPKTINFO`), the ECN bits
/// (`IP_RECVTOS`, `IPV6_RECVTCLASS`) and the receive time (`SO_TIMESTAMPNS`).
///
/// The relay keys on the source address alone and answers from the address it listens on, so
/// each of these is only cost: the kernel builds and copies up to three of them per datagram
/// received, and a socket asking for receive times makes the kernel read the clock for every
/// packet the host receives, on any socket. UDP GRO stays on.
///
/// # Errors
/// An option could not be set.
pub(crate) fn quiet_control_messages(socket: &std::net::UdpSocket) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(socket, sockopt::ReceiveTimestampns, &false)?;
    if socket.local_addr()?.is_ipv4() {
        setsockopt(socket, sockopt::Ipv4PacketInfo, &false)?;
        setsockopt(socket, sockopt::IpRecvTos, &false)?;
    } else {
        setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &false)?;
        setsockopt(socket, sockopt::Ipv6RecvTClass, &false)?;
        // A dual-stack socket's IPv4 peers: `quinn-udp` asks for their TOS too.
        setsockopt(socket, sockopt::IpRecvTos, &false)?;
    }
    Ok(())
}

/// Sends `datagrams` (at most [`BATCH`] of them) on the connected, non-blocking `socket` with
/// one `sendmmsg`, without waiting; returns how many went out (the first ones).
///
/// # Errors
/// `WouldBlock` when the socket's send buffer is full; an error of the first datagram (an ICMP
/// error reported on the socket).
pub fn send_batch(socket: &std::net::UdpSocket, datagrams: &[IoSlice<'_>]) -> io::Result<usize> {
    let n = datagrams.len().min(BATCH);
    match n {
        0 => return Ok(0),
        // One datagram (an ET server's load: one per wake-up): a plain `send` costs fewer
        // instructions than setting up a `sendmmsg`.
        1 => return socket.send(&datagrams[0]).map(|_| 1),
        _ => {}
    }
    let mut controls: [SendAncillaryBuffer<'_, '_, '_>; BATCH] =
        std::array::from_fn(|_| SendAncillaryBuffer::default());
    let mut control = controls.iter_mut();
    let mut msgs: [MMsgHdr<'_>; BATCH] = std::array::from_fn(|i| {
        let data = std::slice::from_ref(&datagrams[i.min(n - 1)]);
        MMsgHdr::new(data, control.next().expect("invariant: BATCH controls"))
    });
    sendmmsg(socket, &mut msgs[..n], SendFlags::empty()).map_err(io::Error::from)
}

/// Opens a UDP socket connected to `upstream`, from an ephemeral port of the matching family.
///
/// Nothing here waits: a UDP bind and connect return at once.
///
/// # Errors
/// The socket could not be created, bound or connected.
pub fn upstream_socket(upstream: SocketAddr) -> io::Result<UdpSocket> {
    UdpSocket::from_std(connected(upstream)?)
}

/// [`upstream_socket`] registered for reading only ([`ReadSocket`]): a session's socket.
///
/// # Errors
/// The socket could not be created, bound, connected or registered.
pub fn session_socket(upstream: SocketAddr) -> io::Result<ReadSocket> {
    ReadSocket::from_std(connected(upstream)?)
}

/// A non-blocking UDP socket on an ephemeral port, connected to `upstream`.
fn connected(upstream: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let any: IpAddr = match upstream {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = std::net::UdpSocket::bind((any, 0))?;
    socket.connect(upstream)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The one form of an address the relay keys on: an IPv4-mapped IPv6 address
/// (`::ffff:192.0.2.5`, how a dual-stack socket shows an IPv4 peer) is the IPv4 address.
/// Bans, sessions, the query limiter and registrations all use this form.
#[inline]
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What `ip` is when no datagram can come from it, `None` when one can: the unspecified
/// address (`0.0.0.0`, `::`), a multicast address or the IPv4 broadcast address
/// (`255.255.255.255`), in [`canonical_ip`] form. A host never sends from them (RFC 1122,
/// 3.2.1.3; RFC 4291, 2.5.2 and 2.7), so a ban of one, or an upstream there, means nothing.
pub fn not_a_source(ip: IpAddr) -> Option<&'static str> {
    let ip = canonical_ip(ip);
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        Some("the broadcast address")
    } else {
        None
    }
}

/// [`canonical_ip`] of a socket address, port kept.
#[inline]
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => addr,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_are_their_ipv4_address() {
        let mapped: SocketAddr = "[::ffff:192.0.2.5]:27960".parse().unwrap();
        assert_eq!(canonical(mapped), "192.0.2.5:27960".parse().unwrap());
        let v6: SocketAddr = "[2001:db8::1]:27960".parse().unwrap();
        assert_eq!(canonical(v6), v6);
        let v4: SocketAddr = "192.0.2.5:1".parse().unwrap();
        assert_eq!(canonical(v4), v4);
        // IPv4-compatible (deprecated) addresses are not mapped ones.
        let compat: IpAddr = "::192.0.2.5".parse().unwrap();
        assert_eq!(canonical_ip(compat), compat);
    }

    /// The public socket asks the kernel for no control message the relay does not read (each
    /// would be built and copied for every datagram), and keeps UDP GRO.
    #[tokio::test]
    async fn the_public_socket_gets_no_control_messages_it_does_not_read() {
        use nix::sys::socket::{getsockopt, sockopt};
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(bound) = UdpSocket::bind(addr).await else {
                continue; // no IPv6 on this host
            };
            let public = ReadSocket::new(bound).unwrap();
            let mut batch = BatchRecv::new(&public).unwrap();
            let s = public.get_ref();
            assert!(
                !getsockopt(s, sockopt::ReceiveTimestampns).unwrap(),
                "{addr}"
            );
            assert!(!getsockopt(s, sockopt::IpRecvTos).unwrap(), "{addr}");
            if addr.starts_with('[') {
                assert!(!getsockopt(s, sockopt::Ipv6RecvPacketInfo).unwrap());
                assert!(!getsockopt(s, sockopt::Ipv6RecvTClass).unwrap());
            } else {
                assert!(!getsockopt(s, sockopt::Ipv4PacketInfo).unwrap());
            }
            // `quinn-udp` turned GRO on (every kernel since 5.0 has it); it stays on.
            assert!(getsockopt(s, sockopt::UdpGroSegment).unwrap(), "{addr}");
            // And a datagram still arrives with its source.
            let client = std::net::UdpSocket::bind(if addr.starts_with('[') {
                "[::1]:0"
            } else {
                "127.0.0.1:0"
            })
            .unwrap();
            client.send_to(b"hello", s.local_addr().unwrap()).unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(5), public.readable())
                .await
                .expect("woken by a datagram")
                .unwrap();
            assert_eq!(batch.try_recv(&public).unwrap(), 1);
            let (from, data) = batch.datagrams().next().unwrap();
            assert_eq!(from, client.local_addr().unwrap());
            assert_eq!(data, b"hello");
        }
    }

    /// The answers' receiver takes two datagrams per call; one alone clears the readiness
    /// (the next datagram still wakes the reader); a datagram longer than a slot is cut.
    #[tokio::test]
    async fn answers_come_two_per_call_and_one_alone_clears_readiness() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let session = session_socket(server.local_addr().unwrap()).unwrap();
        let to = session.get_ref().local_addr().unwrap();
        let ready = || async {
            tokio::time::timeout(std::time::Duration::from_secs(5), session.readable())
                .await
                .expect("woken by a datagram")
                .unwrap();
        };
        let mut rx = PairRecv::new(8).unwrap();
        for round in 0..3u8 {
            server.send_to(&[round], to).unwrap();
            ready().await;
            assert_eq!(rx.try_recv(&session).unwrap(), 1);
            assert!(rx.drained());
            assert_eq!(rx.datagrams().collect::<Vec<_>>(), [&[round][..]]);
        }
        for i in 0..3u8 {
            server.send_to(&[i; 3], to).unwrap();
        }
        ready().await;
        assert_eq!(rx.try_recv(&session).unwrap(), 2);
        assert!(!rx.drained(), "two taken: more may be queued");
        assert_eq!(
            rx.datagrams().collect::<Vec<_>>(),
            [&[0; 3][..], &[1; 3][..]]
        );
        assert_eq!(rx.try_recv(&session).unwrap(), 1);
        assert!(rx.drained());
        assert_eq!(
            rx.try_recv(&session).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        server.send_to(&[7; 20], to).unwrap();
        ready().await;
        assert_eq!(rx.try_recv(&session).unwrap(), 1);
        assert_eq!(rx.datagrams().next().unwrap(), &[7; 8][..]);
    }

    /// A short batch clears the readiness without a second `recvmmsg`, and the next datagram
    /// still wakes the reader; a full batch leaves it set.
    #[tokio::test]
    async fn a_short_batch_clears_readiness_and_the_next_datagram_still_wakes() {
        let public = ReadSocket::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()).unwrap();
        let ready = || async {
            tokio::time::timeout(std::time::Duration::from_secs(5), public.readable())
                .await
                .expect("woken by a datagram")
                .unwrap();
        };
        let to = public.get_ref().local_addr().unwrap();
        let mut batch = BatchRecv::new(&public).unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for round in 0..3u8 {
            client.send_to(&[round], to).unwrap();
            ready().await;
            assert_eq!(batch.try_recv(&public).unwrap(), 1);
            assert!(batch.drained());
            assert_eq!(batch.datagrams().next().unwrap().1, &[round]);
        }
        for i in 0..BATCH + 1 {
            client.send_to(&[i as u8], to).unwrap();
        }
        ready().await;
        assert_eq!(batch.try_recv(&public).unwrap(), BATCH);
        assert!(!batch.drained(), "a full batch: more may be queued");
        ready().await;
        assert_eq!(batch.try_recv(&public).unwrap(), 1);
        assert!(batch.drained());
        assert_eq!(
            batch.try_recv(&public).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }
}
