//! What a client's packet is, and whether it may reach the game server.
//!
//! [`classify`] is a pure function of the datagram. It reads the packet the way every server
//! build in [`ENGINES`] would and lets a connectionless packet through only when **all** of them
//! would run the same allowed command: `getstatus`, `getinfo`, `getchallenge`, `connect`, or
//! PunkBuster's `PB_…`. Everything else is dropped, `rcon` in any spelling first of all. When
//! the builds disagree (a high byte that one build skips and another keeps) the packet is
//! dropped: a relay must never be the way rcon gets in.

use std::ops::Range;

use super::info::{INFO_RESPONSE, STATUS_RESPONSE};
use super::is_oob;
use super::tokenizer::{ENGINES, Engine, first_tokens, line, token_eq};

/// Longest `challenge` the relay answers: ET 2.60b drops longer ones (ET: Legacy and ioquake3
/// drop those over 128).
pub const MAX_CHALLENGE: usize = 64;

/// The two queries the relay limits and answers from its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Query {
    /// `getinfo [challenge]` → `infoResponse`.
    Info,
    /// `getstatus [challenge]` → `statusResponse`.
    Status,
}

impl Query {
    /// The query as the relay sends it, marker and trailing space included: the challenge
    /// follows.
    pub fn request(self) -> &'static [u8] {
        match self {
            Query::Info => b"\xff\xff\xff\xffgetinfo ",
            Query::Status => b"\xff\xff\xff\xffgetstatus ",
        }
    }

    /// The header of its answer, after the marker.
    pub fn answer_header(self) -> &'static [u8] {
        match self {
            Query::Info => INFO_RESPONSE,
            Query::Status => STATUS_RESPONSE,
        }
    }
}

/// Other connectionless commands that pass to the server untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `getchallenge`: the first step of a player's connection (and of etmaster.net's check).
    GetChallenge,
    /// `connect`, Huffman-compressed or plain.
    Connect,
    /// PunkBuster's `PB_…` packets.
    PunkBuster,
}

/// Why a packet is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Some server build would run it as `rcon`.
    Rcon,
    /// A command clients have no business sending, no command at all, or one the builds would
    /// read differently.
    NotAllowed,
    /// A query whose `challenge` no server would answer (too long, or a character an info
    /// string cannot hold).
    BadChallenge,
}

/// The verdict on one packet from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// No `FF FF FF FF` marker: in-game (netchan) traffic, always passed.
    Game,
    /// `getinfo`/`getstatus`, with the challenge as a range of the packet (`None`: none sent).
    Query(Query, Option<Range<usize>>),
    /// Another allowed command.
    Pass(Command),
    /// Dropped.
    Drop(Reject),
}

/// What a connectionless packet's first word is, on one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    Query(Query),
    Pass(Command),
    Rcon,
    Other,
}

const OFFSET: usize = 4;

/// Classifies one datagram from a client. See the module docs.
pub fn classify(packet: &[u8]) -> Packet {
    if !is_oob(packet) {
        return Packet::Game;
    }
    let body = &packet[OFFSET..];
    // The server Huffman-decompresses from offset 12 when bytes 4..11 are exactly `connect`
    // (case-sensitive). The first 12 bytes stay as they are, so the command it then reads
    // starts with `connect` and is either `connect` or a word no server knows.
    if body.starts_with(b"connect") {
        return Packet::Pass(Command::Connect);
    }
    let line = line(body);
    let mut agreed: Option<(Word, Option<Range<usize>>)> = None;
    let mut saw_rcon = false;
    for engine in ENGINES {
        let [argv0, argv1] = first_tokens(engine, line);
        let word = argv0.map_or(Word::Other, |r| word_of(engine, line, &r));
        saw_rcon |= word == Word::Rcon;
        match &agreed {
            None => agreed = Some((word, argv1)),
            Some((w, a1)) => {
                if *w != word || (matches!(word, Word::Query(_)) && *a1 != argv1) {
                    agreed = Some((Word::Other, None));
                }
            }
        }
    }
    if saw_rcon {
        return Packet::Drop(Reject::Rcon);
    }
    // PunkBuster is recognised by the server on the raw bytes, after every command word.
    let Some((word, argv1)) = agreed else {
        return Packet::Drop(Reject::NotAllowed);
    };
    match word {
        Word::Query(q) => match argv1 {
            None => Packet::Query(q, None),
            Some(r) if valid_challenge(&line[r.clone()]) => {
                Packet::Query(q, Some(r.start + OFFSET..r.end + OFFSET))
            }
            Some(_) => Packet::Drop(Reject::BadChallenge),
        },
        Word::Pass(c) => Packet::Pass(c),
        Word::Rcon => Packet::Drop(Reject::Rcon),
        Word::Other if body.starts_with(b"PB_") => Packet::Pass(Command::PunkBuster),
        Word::Other => Packet::Drop(Reject::NotAllowed),
    }
}

fn word_of(engine: Engine, line: &[u8], r: &Range<usize>) -> Word {
    let is = |w: &[u8]| token_eq(engine, line, r, w);
    if is(b"rcon") {
        Word::Rcon
    } else if is(b"getinfo") {
        Word::Query(Query::Info)
    } else if is(b"getstatus") {
        Word::Query(Query::Status)
    } else if is(b"getchallenge") {
        Word::Pass(Command::GetChallenge)
    } else if is(b"connect") {
        Word::Pass(Command::Connect)
    } else {
        Word::Other
    }
}

/// A challenge every server would echo (ET 2.60b's `SV_VerifyChallenge` is the strictest):
/// 1 to [`MAX_CHALLENGE`] printable ASCII bytes other than `\`, `/`, `;` and `"`. (`%` is fine:
/// the server reads it as `.` before the check, and so does the relay when it echoes it.)
pub fn valid_challenge(c: &[u8]) -> bool {
    !c.is_empty()
        && c.len() <= MAX_CHALLENGE
        && c.iter()
            .all(|&b| (0x20..0x7f).contains(&b) && !matches!(b, b'\\' | b'/' | b';' | b'"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oob(body: &[u8]) -> Vec<u8> {
        let mut p = vec![0xff; 4];
        p.extend_from_slice(body);
        p
    }

    #[test]
    fn table() {
        use Command::*;
        use Packet::{Game, Pass};
        use Query::{Info, Status};
        let d = Packet::Drop;
        let q = Packet::Query;
        let cases: Vec<(&[u8], Packet)> = vec![
            // Allowed commands, as clients, browsers and masters send them.
            (b"getinfo xyz", q(Info, Some(12..15))),
            (b"getinfo\n", q(Info, None)),
            (b"getinfo", q(Info, None)),
            (b"getstatus", q(Status, None)),
            (b"getstatus abc", q(Status, Some(14..17))),
            (b"GetStatus a2", q(Status, Some(14..16))),
            (b"getInfo 1234567890", q(Info, Some(12..22))),
            (b"  getinfo a3", q(Info, Some(14..16))),
            (b"\"getinfo\" a4", q(Info, Some(14..16))),
            (b"/* c */getinfo a5", q(Info, Some(19..21))),
            (b"getinfo \"a b\"", q(Info, Some(13..16))),
            (b"getinfo ySpAIF`Vrh", q(Info, Some(12..22))),
            (b"getchallenge", Pass(GetChallenge)),
            (b"getChallenge 1234567890", Pass(GetChallenge)),
            (b"getchallenge 12345 Quake3Arena", Pass(GetChallenge)),
            (b"connect \x12\x34\xf0binary", Pass(Connect)),
            (b"CONNECT \"\\name\\x\"", Pass(Connect)),
            (b"PB_SV_Ping", Pass(PunkBuster)),
            // rcon in every spelling some build would run.
            (b"rcon secret status", d(Reject::Rcon)),
            (b"RCON secret sets x 1", d(Reject::Rcon)),
            (b"rCoN secret", d(Reject::Rcon)),
            (b"/**/rcon secret", d(Reject::Rcon)),
            (b"\"rcon\" secret", d(Reject::Rcon)),
            (b"\x07rcon secret", d(Reject::Rcon)),
            (b"\trcon\tsecret", d(Reject::Rcon)),
            (b"\x80rcon secret", d(Reject::Rcon)),
            (b"\xffrcon secret", d(Reject::Rcon)),
            (b"/* x */ \"RcOn\" secret", d(Reject::Rcon)),
            (b"/*/rcon secret", d(Reject::Rcon)),
            (b"/*/ rcon */getinfo", d(Reject::Rcon)),
            (b"rcon", d(Reject::Rcon)),
            (b"rcon\nsecond line", d(Reject::Rcon)),
            // Other commands and nothing at all.
            (b"disconnect", d(Reject::NotAllowed)),
            (b"ipAuthorize 1 accept", d(Reject::NotAllowed)),
            (b"updateResponse", d(Reject::NotAllowed)),
            (b"heartbeat EnemyTerritory-1", d(Reject::NotAllowed)),
            (b"getservers 84", d(Reject::NotAllowed)),
            (b"rcon2 x", d(Reject::NotAllowed)),
            (b"rco n", d(Reject::NotAllowed)),
            (b"//rcon secret", d(Reject::NotAllowed)),
            (b"", d(Reject::NotAllowed)),
            (b"   ", d(Reject::NotAllowed)),
            (b"pb_lowercase", d(Reject::NotAllowed)),
            (b"get\"info\" q", d(Reject::NotAllowed)),
            (b"getinfo%s", d(Reject::NotAllowed)),
            // Builds disagree: dropped.
            (b"\x80getinfo", d(Reject::NotAllowed)),
            (b"getinfo \x80abc", d(Reject::NotAllowed)),
            // Challenges no server would echo.
            (b"getinfo a;b", d(Reject::BadChallenge)),
            (b"getinfo a\\b", d(Reject::BadChallenge)),
            (b"getinfo \"a\x01\"", d(Reject::BadChallenge)),
            (b"getinfo a/b", d(Reject::BadChallenge)),
            (b"getinfo http://x", d(Reject::NotAllowed)),
        ];
        for (body, want) in cases {
            assert_eq!(
                classify(&oob(body)),
                want,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(classify(b"\x01\x00\x00\x00\x12\x00\x34"), Game);
        assert_eq!(classify(b"\xff\xff\xff"), Game);
    }

    #[test]
    fn long_challenges() {
        let mut p = oob(b"getstatus ");
        p.extend(std::iter::repeat_n(b'a', MAX_CHALLENGE));
        assert!(matches!(
            classify(&p),
            Packet::Query(Query::Status, Some(_))
        ));
        p.push(b'a');
        assert_eq!(classify(&p), Packet::Drop(Reject::BadChallenge));
    }
}
