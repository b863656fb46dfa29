//! Sockets: batched datagram receive for the public socket, and the sockets connected to the
//! game server (sessions, the query cache, probes, proofs).
//!
//! One `recvmmsg` (through `quinn-udp`, which also turns on UDP GRO where the kernel has it)
//! takes up to [`BATCH`] datagrams per system call instead of one. Coalesced GRO buffers are
//! split back into datagrams by their stride. The buffers are allocated once. [`send_batch`]
//! sends up to [`BATCH`] datagrams on a connected socket with one `sendmmsg`.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use quinn_udp::{RecvMeta, UdpSocketState};
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, sendmmsg};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Datagrams (or GRO buffers) taken per system call.
pub const BATCH: usize = quinn_udp::BATCH_SIZE;
/// Room for one receive slot: the largest UDP datagram.
const SLOT: usize = 65_536;

/// Receive buffers and metadata for one socket.
#[derive(Debug)]
pub struct BatchRecv {
    state: UdpSocketState,
    bufs: Vec<u8>,
    metas: [RecvMeta; BATCH],
    filled: usize,
}

impl BatchRecv {
    /// Prepares `socket` (GRO, packet info) and the buffers.
    ///
    /// # Errors
    /// The socket options could not be read or set.
    pub fn new(socket: &UdpSocket) -> io::Result<Self> {
        Ok(BatchRecv {
            state: UdpSocketState::new(socket.into())?,
            bufs: vec![0; BATCH * SLOT],
            metas: [RecvMeta::default(); BATCH],
            filled: 0,
        })
    }

    /// Takes what is queued on `socket` (up to [`BATCH`] slots) without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is queued (readiness is cleared, so `readable()` waits again);
    /// other errors from the socket.
    pub fn try_recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        let BatchRecv {
            state, bufs, metas, ..
        } = self;
        let mut chunks = bufs.chunks_mut(SLOT);
        let mut iovs: [IoSliceMut<'_>; BATCH] = std::array::from_fn(|_| {
            IoSliceMut::new(chunks.next().expect("invariant: bufs holds BATCH slots"))
        });
        let n = socket.try_io(Interest::READABLE, || {
            state.recv(socket.into(), &mut iovs, metas)
        })?;
        self.filled = n;
        Ok(n)
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

/// Sends `datagrams` (at most [`BATCH`] of them) on the connected `socket` with one
/// `sendmmsg`, without waiting; returns how many went out (the first ones).
///
/// # Errors
/// `WouldBlock` when the socket's send buffer is full (write readiness is cleared, so
/// `writable()` waits); an error of the first datagram (an ICMP error reported on the socket).
pub fn send_batch(socket: &UdpSocket, datagrams: &[IoSlice<'_>]) -> io::Result<usize> {
    let n = datagrams.len().min(BATCH);
    match n {
        0 => return Ok(0),
        // One datagram (an ET server's load: one per wake-up): a plain `send` costs fewer
        // instructions than setting up a `sendmmsg`.
        1 => return socket.try_send(&datagrams[0]).map(|_| 1),
        _ => {}
    }
    let mut controls: [SendAncillaryBuffer<'_, '_, '_>; BATCH] =
        std::array::from_fn(|_| SendAncillaryBuffer::default());
    let mut control = controls.iter_mut();
    let mut msgs: [MMsgHdr<'_>; BATCH] = std::array::from_fn(|i| {
        let data = std::slice::from_ref(&datagrams[i.min(n - 1)]);
        MMsgHdr::new(data, control.next().expect("invariant: BATCH controls"))
    });
    socket.try_io(Interest::WRITABLE, || {
        sendmmsg(socket, &mut msgs[..n], SendFlags::empty()).map_err(io::Error::from)
    })
}

/// Opens a UDP socket connected to `upstream`, from an ephemeral port of the matching family.
///
/// Nothing here waits: a UDP bind and connect return at once.
///
/// # Errors
/// The socket could not be created, bound or connected.
pub fn upstream_socket(upstream: SocketAddr) -> io::Result<UdpSocket> {
    let any: IpAddr = match upstream {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = std::net::UdpSocket::bind((any, 0))?;
    socket.connect(upstream)?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
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
}
