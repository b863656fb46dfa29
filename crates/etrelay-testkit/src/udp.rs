//! Small UDP helpers for tests: bind, build out-of-band packets, send and
//! collect replies with bounded waits.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout, timeout_at};

/// Largest datagram the helpers receive (any UDP payload fits).
const MAX_DATAGRAM: usize = 65_536;

/// Binds a UDP socket on `ip`, port 0 (an ephemeral port).
pub async fn bind(ip: Ipv4Addr) -> io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::from((ip, 0))).await
}

/// Prefixes `payload` with the connectionless marker `FF FF FF FF`.
pub fn oob(payload: &[u8]) -> Vec<u8> {
    let mut packet = Vec::with_capacity(payload.len() + 4);
    packet.extend_from_slice(&[0xFF; 4]);
    packet.extend_from_slice(payload);
    packet
}

/// Waits at most `wait` for one datagram on `sock`.
///
/// Returns `None` on timeout or on a receive error (for example an ICMP
/// "port unreachable" reported by the kernel).
pub async fn recv_timeout(sock: &UdpSocket, wait: Duration) -> Option<(SocketAddr, Vec<u8>)> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    match timeout(wait, sock.recv_from(&mut buf)).await {
        Ok(Ok((len, from))) => {
            buf.truncate(len);
            Some((from, buf))
        }
        _ => None,
    }
}

/// Sends `packet` once to `to`, then collects every datagram that arrives on
/// `sock`, until `quiet` passes with nothing new or `max_wait` has passed in
/// total since the send.
///
/// A send error yields no replies.
pub async fn exchange(
    sock: &UdpSocket,
    to: SocketAddr,
    packet: &[u8],
    quiet: Duration,
    max_wait: Duration,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let deadline = Instant::now() + max_wait;
    let mut replies = Vec::new();
    if sock.send_to(packet, to).await.is_err() {
        return replies;
    }
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // Each iteration either receives a datagram or ends the loop; the overall
    // deadline bounds it in time.
    loop {
        let quiet_end = (Instant::now() + quiet).min(deadline);
        match timeout_at(quiet_end, sock.recv_from(&mut buf)).await {
            Ok(Ok((len, from))) => replies.push((from, buf[..len].to_vec())),
            Ok(Err(_)) | Err(_) => break,
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    replies
}
