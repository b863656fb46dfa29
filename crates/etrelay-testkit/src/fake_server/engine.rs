//! The fake's [`Handshake::Engine`](super::Handshake::Engine) behaviour: ET 2.60b's
//! `SV_DirectConnect` checks and an in-game netchan with each connected client.
//!
//! Facts (ET 2.60b `src/server/sv_main.c`, `src/server/sv_client.c`, `src/server/sv_net_chan.c`):
//!
//! * a datagram whose bytes 4..11 are exactly `connect` is Huffman-decompressed from offset 12
//!   ([`crate::huffman::server_view`], with ET's 32 768-byte message buffer) before it is read
//!   as text; other spellings (`CONNECT`, `Connect`) are read as plaintext;
//! * the userinfo's `protocol` (`atoi`) must be 84, else
//!   `print\n[err_prot]ERROR: Protocol Mismatch Between Client and Server.The server you are
//!   attempting to join is running an incompatible version of the game.` (no newline: the C
//!   string is spliced);
//! * its `challenge` (`atoi`) must be one given to that exact address (IP and port), else
//!   `print\n[err_dialog]No or bad challenge for address.\n`;
//! * the client is then (re)connected with its `qport` and challenge, replacing a client of the
//!   same IP with the same qport or port (the engine's "reconnect"), and gets `connectResponse`
//!   with no argument; `sv_reconnectlimit` is not modelled;
//! * in-game: each datagram of a connected client goes through its netchan
//!   ([`crate::netchan::session`]: reassembly, sequence checks, XOR decode with its challenge);
//!   every message the netchan accepts is counted (decoded or garbled) and answered with one
//!   server message, XOR-encoded with the client's challenge and the last client command, and
//!   fragmented when 1 300 bytes or more. The stream is clocked by the client (a real server
//!   sends snapshots on its own clock), which keeps tests deterministic.

use std::net::SocketAddr;

use super::{State, reply};
use crate::huffman;
use crate::netchan::Dialect;
use crate::netchan::session::{Counts, Outcome, Role, Session};
use crate::q3model::{self, Engine};

/// The clients the fake keeps at most.
pub(super) const MAX_CLIENTS: usize = 64;

/// ET 2.60b's answer to a connect with another protocol.
pub const PROTOCOL_REFUSAL: &str = "print\n[err_prot]ERROR: Protocol Mismatch Between Client and Server.The server you are attempting to join is running an incompatible version of the game.";
/// ET 2.60b's answer to a connect whose challenge was not given to its address.
pub const CHALLENGE_REFUSAL: &str = "print\n[err_dialog]No or bad challenge for address.\n";

/// A connected client.
#[derive(Debug, Clone)]
pub(super) struct Client {
    /// Its address as last seen (re-pointed by "fixing up a translated port").
    pub(super) addr: SocketAddr,
    /// Its qport (`atoi` of the userinfo's, as a 16-bit value).
    pub(super) qport: u16,
    /// Its netchan ([`super::Handshake::Engine`] only).
    pub(super) session: Option<Session>,
}

/// `atoi`: optional blanks, an optional sign, digits; 0 when there are none (wrapping as the
/// 32-bit C code does).
pub(super) fn atoi(text: &str) -> i32 {
    let t = text.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0i32, |n, d| {
            n.wrapping_mul(10).wrapping_add(i32::from(d - b'0'))
        });
    if negative { n.wrapping_neg() } else { n }
}

/// A `connect`, plaintext or compressed, as ET 2.60b reads and checks it.
pub(super) fn connect(st: &mut State, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let text = huffman::server_view(packet, Dialect::Et.max_msglen());
    let args = q3model::argv(Engine::Et260, &text);
    if !args.first()?.eq_ignore_ascii_case(b"connect") {
        return None;
    }
    let userinfo = crate::info::parse(args.get(1).map(Vec::as_slice).unwrap_or(b""));
    let key = |k: &str| atoi(crate::info::get(&userinfo, k).unwrap_or(""));
    if key("protocol") != 84 {
        return reply(PROTOCOL_REFUSAL);
    }
    let (challenge, qport) = (key("challenge"), key("qport"));
    let given = st
        .challenges
        .iter()
        .any(|(a, c)| *a == from && *c == challenge);
    if !given {
        return reply(CHALLENGE_REFUSAL);
    }
    let qport = qport as u16;
    retire(st, |c| {
        c.addr.ip() == from.ip() && (c.qport == qport || c.addr.port() == from.port())
    });
    if st.clients.len() < MAX_CLIENTS {
        st.clients.push(Client {
            addr: from,
            qport,
            session: Some(Session::new(Role::Server, Dialect::Et, qport, challenge)),
        });
    }
    reply("connectResponse")
}

/// Removes the clients matching `which`, keeping their counts.
pub(super) fn retire(st: &mut State, which: impl Fn(&Client) -> bool) {
    let (gone, kept): (Vec<Client>, Vec<Client>) = st.clients.drain(..).partition(|c| which(c));
    st.clients = kept;
    for c in gone {
        if let Some(s) = c.session {
            st.retired.add(&s.counts());
        }
    }
}

/// An in-game datagram of a connected client: its netchan, then one server message for each
/// message accepted.
pub(super) fn in_game(session: &mut Session, packet: &[u8]) -> Vec<Vec<u8>> {
    match session.receive(packet) {
        Outcome::Decoded(_) | Outcome::Garbled => session.next_datagrams(),
        Outcome::Fragment | Outcome::Dropped(_) => Vec::new(),
    }
}

/// `messages` more server messages to each connected client: `(address, datagram)` pairs.
pub(super) fn stream(st: &mut State, messages: usize) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut out = Vec::new();
    for client in &mut st.clients {
        let Some(session) = client.session.as_mut() else {
            continue;
        };
        for _ in 0..messages {
            out.extend(
                session
                    .next_datagrams()
                    .into_iter()
                    .map(|d| (client.addr, d)),
            );
        }
    }
    out
}

/// The counts of every client, past and present.
pub(super) fn total_counts(st: &State) -> Counts {
    let mut total = st.retired;
    for s in st.clients.iter().filter_map(|c| c.session.as_ref()) {
        total.add(&s.counts());
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoi_like_c() {
        assert_eq!(atoi("84"), 84);
        assert_eq!(atoi("  -12abc"), -12);
        assert_eq!(atoi("+7"), 7);
        assert_eq!(atoi(""), 0);
        assert_eq!(atoi("x1"), 0);
        assert_eq!(atoi("4294967297"), 1);
    }
}
