//! `getchallenge` and `challengeResponse`: what a client asks, what the relay answers in the
//! game server's stead, what it asks the server and what the server answers it
//! (`et-protocol.md` §3, `network-anchors.md`).
//!
//! - ioquake3 (protocol 71): `getchallenge <clientChallenge> <gamename>`, answered by
//!   `challengeResponse <challenge> <clientChallenge> <protocol>` (the client checks the echo of
//!   its own number), or by `print\nGame mismatch: This is a <gamename> server\n`.
//! - ET 2.60b and ET: Legacy (protocol 84; 82 and 83 are older ET): a bare `getchallenge`,
//!   answered by `challengeResponse <challenge>`, with ET: Legacy's `sv_onlyVisibleClients`
//!   after it when that is set.
//!
//! The challenge is printed with `%i` and read back with `atoi`. Nothing here allocates: the
//! answers are written into the caller's buffer.

use std::io::Write;

use super::OOB;
use super::connect::atoi;
use super::tokenizer::{Engine, line, token_eq, tokens};

/// The engines' name of the answer.
const RESPONSE: &[u8] = b"challengeResponse";

/// How the game server speaks the challenge exchange, from the protocol it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// ioquake3, protocol 71: the client's number echoed, the protocol given.
    Ioq3,
    /// ET 2.60b and ET: Legacy: the challenge alone.
    Et,
}

impl Dialect {
    /// The dialect of a server whose `infoResponse` reports `protocol`; `None` for a protocol
    /// the relay cannot translate (it then lets the server give its own challenges). An
    /// ioquake3 server reports its legacy protocol (68 by default, 71 for Debian's OpenArena).
    pub fn of_protocol(protocol: i64) -> Option<Dialect> {
        match protocol {
            68 | 71 => Some(Dialect::Ioq3),
            82..=84 => Some(Dialect::Et),
            _ => None,
        }
    }
}

/// A client's `getchallenge`, as the server reads its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// `atoi` of the first argument (ioquake3's client challenge; 0 without one).
    pub client_challenge: i32,
    /// The second argument (ioquake3's game name), if any.
    pub gamename: Option<&'a [u8]>,
}

/// The arguments of the `getchallenge` in `packet` (marker included; the classifier already
/// found the command).
pub fn read_ask(packet: &[u8]) -> Ask<'_> {
    let body = packet.get(4..).unwrap_or_default();
    let line = line(body);
    let [_, first, second] = tokens::<3>(Engine::Ioq3, line);
    Ask {
        client_challenge: first.map_or(0, |r| atoi(&line[r]) as i32),
        gamename: second.map(|r| &line[r]).filter(|g| !g.is_empty()),
    }
}

/// What the server told the relay about the challenge exchange, kept to answer as it would.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The protocol of its `infoResponse` (for ioquake3, the legacy protocol while legacy is
    /// on).
    pub protocol: Option<i64>,
    /// ioquake3's own protocol (`com_protocol`), as its `challengeResponse` gives it.
    pub modern: Option<i64>,
    /// Its `gamename` (ioquake3's `com_gamename`).
    pub gamename: Option<Vec<u8>>,
    /// ET: Legacy's `sv_onlyVisibleClients`, seen after the challenge in its answers.
    pub only_visible: Option<i32>,
}

/// Writes into `out` (replacing it) the relay's answer to `ask` with the relay's `challenge`,
/// in `dialect` as the server of `facts` would write it.
pub fn write_answer(
    dialect: Dialect,
    facts: &Facts,
    ask: &Ask<'_>,
    challenge: i32,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&OOB);
    match dialect {
        Dialect::Ioq3 => {
            if let (Some(theirs), Some(ours)) = (ask.gamename, facts.gamename.as_deref())
                && theirs != ours
            {
                out.extend_from_slice(b"print\nGame mismatch: This is a ");
                out.extend_from_slice(ours);
                out.extend_from_slice(b" server\n");
                return;
            }
            let protocol = facts.modern.or(facts.protocol).unwrap_or(71);
            let _ = write!(
                out,
                "challengeResponse {challenge} {} {protocol}",
                ask.client_challenge
            );
        }
        Dialect::Et => {
            let _ = write!(out, "challengeResponse {challenge}");
            if let Some(v) = facts.only_visible.filter(|v| *v != 0) {
                let _ = write!(out, " {v}");
            }
        }
    }
}

/// Writes into `out` (replacing it) the `getchallenge` the relay sends the game server for a
/// client, with `client_challenge` as ioquake3's number.
pub fn write_ask(dialect: Dialect, facts: &Facts, client_challenge: i32, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&OOB);
    match dialect {
        Dialect::Ioq3 => {
            let _ = write!(out, "getchallenge {client_challenge} ");
            out.extend_from_slice(facts.gamename.as_deref().unwrap_or(b"Quake3Arena"));
        }
        Dialect::Et => out.extend_from_slice(b"getchallenge"),
    }
}

/// A server's `challengeResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The server's challenge.
    pub challenge: i32,
    /// `atoi` of the argument after it: ioquake3's echo of the client's number, ET: Legacy's
    /// `sv_onlyVisibleClients` (0 without one).
    pub second: i32,
    /// The third argument: ioquake3's own protocol (`com_protocol`).
    pub third: Option<i64>,
}

/// The `challengeResponse` in `packet` (marker included), if it is one.
pub fn read_offer(packet: &[u8]) -> Option<Offer> {
    let body = packet.strip_prefix(&OOB[..])?;
    let line = line(body);
    let [word, first, second, third] = tokens::<4>(Engine::Ioq3, line);
    if !token_eq(Engine::Ioq3, line, &word?, RESPONSE) {
        return None;
    }
    Some(Offer {
        challenge: atoi(&line[first?]) as i32,
        second: second.map_or(0, |r| atoi(&line[r]) as i32),
        third: third.map(|r| atoi(&line[r])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &[u8]) -> String {
        String::from_utf8_lossy(&p[4..]).into_owned()
    }

    #[test]
    fn answers_as_each_server_would() {
        let mut out = Vec::new();
        let ioq3 = Facts {
            protocol: Some(71),
            gamename: Some(b"Quake3Arena".to_vec()),
            ..Facts::default()
        };
        let ask = read_ask(b"\xff\xff\xff\xffgetchallenge 4242 Quake3Arena");
        assert_eq!(ask.client_challenge, 4242);
        write_answer(Dialect::Ioq3, &ioq3, &ask, 12345, &mut out);
        assert_eq!(text(&out), "challengeResponse 12345 4242 71");
        let other = read_ask(b"\xff\xff\xff\xffgetchallenge 1 baseq3");
        write_answer(Dialect::Ioq3, &ioq3, &other, 1, &mut out);
        assert_eq!(
            text(&out),
            "print\nGame mismatch: This is a Quake3Arena server\n"
        );
        let et = Facts {
            protocol: Some(84),
            only_visible: Some(1),
            ..Facts::default()
        };
        let bare = read_ask(b"\xff\xff\xff\xffgetchallenge");
        assert_eq!(
            bare,
            Ask {
                client_challenge: 0,
                gamename: None
            }
        );
        write_answer(Dialect::Et, &et, &bare, 99, &mut out);
        assert_eq!(text(&out), "challengeResponse 99 1");
        write_answer(Dialect::Et, &Facts::default(), &bare, 99, &mut out);
        assert_eq!(text(&out), "challengeResponse 99");
        write_ask(Dialect::Ioq3, &ioq3, 7, &mut out);
        assert_eq!(text(&out), "getchallenge 7 Quake3Arena");
        write_ask(Dialect::Et, &et, 7, &mut out);
        assert_eq!(text(&out), "getchallenge");
        assert_eq!(Dialect::of_protocol(71), Some(Dialect::Ioq3));
        assert_eq!(Dialect::of_protocol(84), Some(Dialect::Et));
        assert_eq!(Dialect::of_protocol(284), None);
        assert_eq!(Dialect::of_protocol(68), Some(Dialect::Ioq3));
        assert_eq!(Dialect::of_protocol(69), None);
    }

    #[test]
    fn offers_are_read() {
        let o = read_offer(b"\xff\xff\xff\xffchallengeResponse -5 4242 71").unwrap();
        assert_eq!(
            o,
            Offer {
                challenge: -5,
                second: 4242,
                third: Some(71)
            }
        );
        let o = read_offer(b"\xff\xff\xff\xffchallengeResponse 77").unwrap();
        assert_eq!(
            o,
            Offer {
                challenge: 77,
                second: 0,
                third: None
            }
        );
        assert_eq!(read_offer(b"\xff\xff\xff\xffchallengeResponse"), None);
        assert_eq!(read_offer(b"\xff\xff\xff\xffconnectResponse 5"), None);
        assert_eq!(read_offer(b"challengeResponse 5"), None);
    }
}
