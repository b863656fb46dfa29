//! A Quake 3 engine client as a relay sees one: the connect handshake, then in-game packets.
//!
//! What a real client sends (`et-protocol.md` §3 and §4b):
//!
//! * `getchallenge` (ET) or `getchallenge <clientChallenge> <gamename>` (ioquake3), answered by
//!   `challengeResponse <challenge> …`; retransmitted every 3 s until answered;
//! * `connect "<userinfo>"` with `\challenge\<challenge>\qport\<qport>\protocol\<n>…`. Real
//!   clients Huffman-compress it and spell the command exactly `connect`; the engines dispatch
//!   the command case-insensitively and decompress only that exact spelling, so this client
//!   sends it as plaintext `CONNECT`, which every engine accepts the same way (checked on the
//!   OpenArena server);
//! * answered by `connectResponse` (ET) or `connectResponse <challenge>` (ioquake3), after which
//!   the server streams in-game packets to the client;
//! * in-game packets: a 4-byte little-endian sequence number, the 16-bit qport, the payload.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout_at};

use crate::udp::oob;

/// How often a real client retransmits its connect steps (`RETRANSMIT_TIMEOUT`).
pub const RETRANSMIT: Duration = Duration::from_secs(3);

/// Which engine's handshake to speak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// ET 2.60b / ET: Legacy: bare `getchallenge`, protocol 84.
    Et,
    /// ioquake3 (OpenArena): `getchallenge <n> <gamename>`, protocol 71, a `cl_guid`.
    Ioq3 {
        /// `com_gamename` of the server (`Quake3Arena` for Debian's OpenArena).
        gamename: String,
    },
}

impl Dialect {
    /// Debian's OpenArena server.
    pub fn openarena() -> Dialect {
        Dialect::Ioq3 {
            gamename: "Quake3Arena".to_string(),
        }
    }

    fn protocol(&self) -> u32 {
        match self {
            Dialect::Et => 84,
            Dialect::Ioq3 { .. } => 71,
        }
    }
}

/// Why a join failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// No `challengeResponse` before the deadline.
    NoChallenge,
    /// No `connectResponse` before the deadline.
    NoConnectResponse,
    /// The server refused the connect with this `print` text.
    Refused(String),
    /// A socket error.
    Io(String),
}

/// One client with its own UDP socket.
#[derive(Debug)]
pub struct Player {
    sock: UdpSocket,
    server: SocketAddr,
    qport: u16,
    dialect: Dialect,
    seq: u32,
    buf: Vec<u8>,
}

impl Player {
    /// A client on `ip` (an ephemeral port) talking to `server` with `qport`.
    pub async fn bind(
        ip: Ipv4Addr,
        server: SocketAddr,
        qport: u16,
        dialect: Dialect,
    ) -> io::Result<Player> {
        Ok(Player {
            sock: UdpSocket::bind(SocketAddr::from((ip, 0))).await?,
            server,
            qport,
            dialect,
            seq: 0,
            buf: vec![0; 65_536],
        })
    }

    /// The client's own address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The qport the client announces and puts in its in-game packets.
    pub fn qport(&self) -> u16 {
        self.qport
    }

    /// Runs the handshake, retransmitting each step every `retransmit` as a real client does,
    /// until `within` has passed. Returns how long it took.
    ///
    /// # Errors
    /// See [`JoinError`].
    pub async fn join(
        &mut self,
        within: Duration,
        retransmit: Duration,
    ) -> Result<Duration, JoinError> {
        let start = Instant::now();
        let deadline = start + within;
        let getchallenge = match &self.dialect {
            Dialect::Et => oob(b"getchallenge"),
            Dialect::Ioq3 { gamename } => oob(format!("getchallenge 4242 {gamename}").as_bytes()),
        };
        let challenge = self
            .step(&getchallenge, b"challengeResponse", deadline, retransmit)
            .await?
            .ok_or(JoinError::NoChallenge)?;
        let challenge = String::from_utf8_lossy(&challenge)
            .split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .to_string();
        let mut userinfo = format!(
            "\\challenge\\{challenge}\\qport\\{}\\protocol\\{}\\name\\player{}\\rate\\25000\\snaps\\20",
            self.qport,
            self.dialect.protocol(),
            self.qport
        );
        if matches!(self.dialect, Dialect::Ioq3 { .. }) {
            userinfo.push_str(&format!("\\cl_guid\\{:032X}", u128::from(self.qport)));
        }
        let connect = oob(format!("CONNECT \"{userinfo}\"").as_bytes());
        self.step(&connect, b"connectResponse", deadline, retransmit)
            .await?
            .ok_or(JoinError::NoConnectResponse)?;
        Ok(start.elapsed())
    }

    /// Sends `packet` every `retransmit` until an OOB answer starting with `want` arrives
    /// (returned without the marker) or `deadline` passes (`None`). A `print` answer is a
    /// refusal.
    async fn step(
        &mut self,
        packet: &[u8],
        want: &[u8],
        deadline: Instant,
        retransmit: Duration,
    ) -> Result<Option<Vec<u8>>, JoinError> {
        while Instant::now() < deadline {
            self.sock
                .send_to(packet, self.server)
                .await
                .map_err(|e| JoinError::Io(e.to_string()))?;
            let resend = (Instant::now() + retransmit).min(deadline);
            while let Ok(r) = timeout_at(resend, self.sock.recv_from(&mut self.buf)).await {
                let Ok((n, _)) = r else { continue };
                let data = &self.buf[..n];
                let Some(text) = data.strip_prefix(&[0xFF; 4]) else {
                    continue;
                };
                if text.starts_with(want) {
                    return Ok(Some(text.to_vec()));
                }
                if let Some(msg) = text.strip_prefix(b"print\n") {
                    return Err(JoinError::Refused(
                        String::from_utf8_lossy(msg).trim().to_string(),
                    ));
                }
            }
        }
        Ok(None)
    }

    /// Sends one in-game packet: the next sequence number, the qport, `payload`.
    ///
    /// # Errors
    /// The send failed.
    pub async fn send_game(&mut self, payload: &[u8]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let packet = game_packet(self.seq, self.qport, payload);
        self.sock.send_to(&packet, self.server).await.map(|_| ())
    }

    /// Counts the in-game (not connectionless) packets that arrive within `wait`.
    pub async fn recv_game(&mut self, wait: Duration) -> usize {
        let deadline = Instant::now() + wait;
        let mut n = 0;
        while let Ok(r) = timeout_at(deadline, self.sock.recv_from(&mut self.buf)).await {
            if let Ok((len, _)) = r
                && !self.buf[..len].starts_with(&[0xFF; 4])
            {
                n += 1;
            }
        }
        n
    }
}

/// An in-game packet as a client sends it: sequence number (little-endian), qport
/// (little-endian), payload.
pub fn game_packet(seq: u32, qport: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(6 + payload.len());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&qport.to_le_bytes());
    p.extend_from_slice(payload);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn game_packets_carry_sequence_then_qport() {
        assert_eq!(
            game_packet(0x0102_0304, 0xBEEF, b"x"),
            [0x04, 0x03, 0x02, 0x01, 0xEF, 0xBE, b'x']
        );
    }
}
