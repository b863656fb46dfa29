//! A Quake 3 engine client as a relay sees one: the connect handshake, then in-game packets.
//!
//! What a real client sends (`et-protocol.md` §3 and §4b):
//!
//! * `getchallenge` (ET) or `getchallenge <clientChallenge> <gamename>` (ioquake3), answered by
//!   `challengeResponse <challenge> …`; retransmitted every 3 s until answered;
//! * `connect "<userinfo>"` with `\challenge\<challenge>\qport\<qport>\protocol\<n>…`. Real
//!   clients Huffman-compress it from offset 12 and spell the command exactly `connect`
//!   (`NET_OutOfBandData`); the engines dispatch the command case-insensitively and decompress
//!   only that exact spelling. [`ConnectStyle`] picks which this client sends: plaintext
//!   `CONNECT` (the default, which every engine accepts the same way, checked on the OpenArena
//!   server), or the real client's compressed `connect` ([`crate::huffman`]);
//! * answered by `connectResponse` (ET) or `connectResponse <challenge>` (ioquake3), after which
//!   the server streams in-game packets to the client;
//! * in-game packets: a 4-byte little-endian sequence number, the 16-bit qport, the payload.
//!   [`Player::send_game`] sends such raw packets; after a join the client also has a netchan
//!   session ([`crate::netchan::session`], in `session`): [`Player::send_message`] sends
//!   patterned messages with the netchan's header (the qport; the checksum of a stock
//!   ioquake3) and the XOR encoding with the challenge (ET, and ioquake3's legacy netchan,
//!   which Debian's OpenArena speaks: see [`Dialect::netchan`]), and the receiving methods
//!   reassemble, check and decode the server's messages and count them.
//!
//! With [`ConnectStyle::Engine`] the client also checks what a real one checks (ioquake3's
//! `CL_ConnectionlessPacket`): its `getchallenge` carries a random client challenge that the
//! `challengeResponse` must echo, and `connectResponse <challenge>` must carry the challenge it
//! holds; answers that fail are ignored, as the real client ignores them. ET's client checks
//! neither.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout_at};

use crate::netchan;
use crate::netchan::session::{Role, Session};
use crate::udp::oob;

mod session;

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

    /// The netchan this client speaks in game unless told otherwise
    /// ([`Player::with_netchan`]): ET's, or for ioquake3 the legacy one (no checksum, XOR), as
    /// Debian's OpenArena client and server do: their wrappers set `com_protocol 71` and
    /// `com_legacyprotocol 71`, so a protocol 71 client is a "compat" client
    /// (`SV_DirectConnect`: `version == com_legacyprotocol`; `CL_CheckForResend`: the two
    /// equal). A stock ioquake3 (`com_legacyprotocol 68`) speaks [`netchan::Dialect::Ioq3`]
    /// (the checksum) with protocol 71 clients.
    pub fn netchan(&self) -> netchan::Dialect {
        match self {
            Dialect::Et => netchan::Dialect::Et,
            Dialect::Ioq3 { .. } => netchan::Dialect::Ioq3Legacy,
        }
    }
}

/// The userinfo keys a real client adds, in [`ConnectStyle::Engine`].
const ENGINE_USERINFO: &str = "\\cl_maxpackets\\30\\cl_timenudge\\0\\cg_predictItems\\1\\cl_anonymous\\0\\g_password\\none\\cl_punkbuster\\0\\cl_wwwDownload\\1\\cg_uinfo\\13 0 30\\color\\4\\handicap\\100\\model\\sarge\\headmodel\\sarge\\team_model\\sarge\\sex\\male";

/// How the client spells and checks its join (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ConnectStyle {
    /// Plaintext `CONNECT "<userinfo>"`, no checks of the answers' arguments (the default).
    #[default]
    Plaintext,
    /// A real client's: `connect` Huffman-compressed from offset 12, the ioquake3 client
    /// challenge echo and the `connectResponse` challenge checked.
    Engine,
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
    style: ConnectStyle,
    /// The challenge of the last successful join.
    challenge: Option<i32>,
    /// The netchan session set up by the last successful join.
    session: Option<Session>,
    /// A challenge to connect with instead of the server's (to test refusals).
    challenge_override: Option<i32>,
    /// The in-game netchan.
    netchan: netchan::Dialect,
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
            seq: 0,
            buf: vec![0; 65_536],
            style: ConnectStyle::Plaintext,
            challenge: None,
            session: None,
            challenge_override: None,
            netchan: dialect.netchan(),
            dialect,
        })
    }

    /// The same client, speaking `netchan` in game (for ioquake3: [`netchan::Dialect::Ioq3`]
    /// with a stock server, the legacy one, the default, with Debian's OpenArena).
    pub fn with_netchan(mut self, netchan: netchan::Dialect) -> Player {
        self.netchan = netchan;
        self
    }

    /// The same client, joining in `style` from now on.
    pub fn with_connect_style(mut self, style: ConnectStyle) -> Player {
        self.style = style;
        self
    }

    /// The same client, connecting with `challenge` whatever the server gave it (a client
    /// with a wrong challenge, to test refusals).
    pub fn with_challenge_override(mut self, challenge: i32) -> Player {
        self.challenge_override = Some(challenge);
        self
    }

    /// The challenge of the last successful join.
    pub fn challenge(&self) -> Option<i32> {
        self.challenge
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
    /// until `within` has passed. Returns how long it took. On success the client holds the
    /// challenge and a fresh netchan session.
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
        let engine = self.style == ConnectStyle::Engine;
        // ioquake3's client challenge: fixed in the plaintext style, random in the engine's.
        let mine: i32 = if engine {
            rand::random_range(1..=i32::MAX)
        } else {
            4242
        };
        let getchallenge = match &self.dialect {
            Dialect::Et => oob(b"getchallenge"),
            Dialect::Ioq3 { gamename } => oob(format!("getchallenge {mine} {gamename}").as_bytes()),
        };
        let echo_needed = engine && matches!(self.dialect, Dialect::Ioq3 { .. });
        let accept = |args: &[String]| -> bool {
            !echo_needed || args.get(2).is_some_and(|a| atoi(a) == mine)
        };
        let answer = self
            .step(
                &getchallenge,
                "challengeResponse",
                &accept,
                deadline,
                retransmit,
            )
            .await?
            .ok_or(JoinError::NoChallenge)?;
        let text = answer.get(1).cloned().unwrap_or_else(|| "0".to_string());
        let challenge = self.challenge_override.unwrap_or_else(|| atoi(&text));
        let shown = match engine || self.challenge_override.is_some() {
            true => challenge.to_string(),
            false => text,
        };
        let connect = self.connect_packet(&shown);
        let check = engine && matches!(self.dialect, Dialect::Ioq3 { .. });
        let accept = |args: &[String]| -> bool {
            !check || args.get(1).is_some_and(|a| atoi(a) == challenge)
        };
        self.step(&connect, "connectResponse", &accept, deadline, retransmit)
            .await?
            .ok_or(JoinError::NoConnectResponse)?;
        self.challenge = Some(challenge);
        self.session = Some(Session::new(
            Role::Client,
            self.netchan,
            self.qport,
            challenge,
        ));
        Ok(start.elapsed())
    }

    /// The `connect` datagram for `challenge`, in the client's style.
    fn connect_packet(&self, challenge: &str) -> Vec<u8> {
        let mut userinfo = format!(
            "\\challenge\\{challenge}\\qport\\{}\\protocol\\{}\\name\\player{}\\rate\\25000\\snaps\\20",
            self.qport,
            self.dialect.protocol(),
            self.qport
        );
        if matches!(self.dialect, Dialect::Ioq3 { .. }) {
            userinfo.push_str(&format!("\\cl_guid\\{:032X}", u128::from(self.qport)));
        }
        match self.style {
            ConnectStyle::Plaintext => oob(format!("CONNECT \"{userinfo}\"").as_bytes()),
            ConnectStyle::Engine => {
                // A real client's userinfo is long enough to fit the engine's Huffman limit (a
                // short one comes out cut): the usual keys.
                userinfo.push_str(ENGINE_USERINFO);
                crate::huffman::connect_packet(format!("\"{userinfo}\"").as_bytes())
            }
        }
    }

    /// Sends `packet` every `retransmit` until an OOB answer starting with `want` whose words
    /// pass `accept` arrives (returned as its words) or `deadline` passes (`None`). A `print`
    /// answer is a refusal.
    async fn step(
        &mut self,
        packet: &[u8],
        want: &str,
        accept: &(dyn Fn(&[String]) -> bool + Sync),
        deadline: Instant,
        retransmit: Duration,
    ) -> Result<Option<Vec<String>>, JoinError> {
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
                let words: Vec<String> = String::from_utf8_lossy(text)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                if text.starts_with(want.as_bytes()) && accept(&words) {
                    return Ok(Some(words));
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

    /// Sends one in-game packet: the next sequence number, the qport, `payload` (a sequence of
    /// its own, not the netchan session's).
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

/// `atoi`: the leading integer of `text` (0 when there is none).
fn atoi(text: &str) -> i32 {
    let t = text.trim_start();
    let end = t
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(t.len(), |(i, _)| i);
    t[..end].parse::<i64>().map_or(0, |n| n as i32)
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

    #[tokio::test]
    async fn the_engine_connect_fits_the_huffman_limit() {
        let server = SocketAddr::from(([127, 0, 0, 1], 27960));
        for dialect in [Dialect::Et, Dialect::openarena()] {
            for qport in [0, 7, 27960, u16::MAX] {
                let p = Player::bind(Ipv4Addr::LOCALHOST, server, qport, dialect.clone())
                    .await
                    .unwrap()
                    .with_connect_style(ConnectStyle::Engine);
                for challenge in ["1", "-2147483648", "2147483647"] {
                    let text = packet_text(&p.connect_packet(challenge));
                    let head = format!("\"\\challenge\\{challenge}\\qport\\{qport}\\");
                    assert!(text.starts_with(head.as_bytes()));
                    assert!(text.ends_with(b"\\sex\\male\""), "read back whole");
                    assert!(crate::huffman::try_compress(&text).is_some());
                }
            }
        }
    }

    /// The text a compressed connect carries.
    fn packet_text(packet: &[u8]) -> Vec<u8> {
        crate::huffman::decompress(&packet[12..]).unwrap()
    }

    #[test]
    fn game_packets_carry_sequence_then_qport() {
        assert_eq!(
            game_packet(0x0102_0304, 0xBEEF, b"x"),
            [0x04, 0x03, 0x02, 0x01, 0xEF, 0xBE, b'x']
        );
    }
}
