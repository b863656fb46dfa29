//! A client's `connect`: reading its userinfo as the server would, and writing it again with
//! the game server's own challenge.
//!
//! A real client sends `FF FF FF FF connect ` and its userinfo in quotes, Huffman-compressed
//! from offset 12 ([`super::huffman`]); the engines also take the command in any other
//! spelling (`CONNECT`) as plain text. The server then reads the line (`MSG_ReadStringLine`),
//! tokenizes it ([`super::tokenizer`]) and takes `Cmd_Argv(1)` as the userinfo, where
//! `Info_ValueForKey` finds `challenge`, `qport` and `protocol` (first key of that name, any
//! case) and `atoi` reads them. [`Reader::read`] does the same, and refuses a packet that the
//! engines would read differently from one another.
//!
//! [`Reader::rewrite`] writes the connect the relay sends the game server: `connect "<userinfo>"`
//! compressed from offset 12 as a client does, the userinfo unchanged but for the value of its
//! `challenge`. The server reads exactly what the relay read, since it reads what the relay
//! wrote.

use std::io::Write;
use std::ops::Range;

use super::huffman::{Codec, HuffmanError};
use super::info::find_key;
use super::tokenizer::{ENGINES, MAX_LINE, first_tokens, line, token_eq};
use super::{OOB, is_oob};

/// The exact spelling the engines Huffman-decompress, and its length with the marker and the
/// byte after it (the offset compression starts at).
const CONNECT: &[u8] = b"connect";
const COMPRESSED_FROM: usize = 12;

/// Why a `connect` cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// Not a connectionless `connect` in any spelling the engines run.
    #[error("not a connect")]
    NotConnect,
    /// Its compressed part does not decompress.
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
    /// No userinfo, or one the engines would not all read the same.
    #[error("connect without a userinfo every engine reads the same")]
    Userinfo,
    /// The rewritten userinfo would be longer than a server reads.
    #[error("connect userinfo too long")]
    TooLong,
}

/// What the relay needs of a `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// `atoi` of its `challenge` (0 without one, as the server reads it).
    pub challenge: i32,
    /// Its `qport`, as the netchan carries it (16 bits).
    pub qport: u16,
    /// Its `protocol`.
    pub protocol: i64,
    /// The userinfo in [`Reader`]'s line.
    userinfo: Range<usize>,
    /// The challenge's value in [`Reader`]'s line, if it has the key.
    challenge_at: Option<Range<usize>>,
}

/// Reads and writes `connect` packets; keeps its buffers and its codec between packets.
#[derive(Debug, Default)]
pub struct Reader {
    codec: Codec,
    /// The command line as the server reads it.
    line: Vec<u8>,
    /// The decompressed part.
    plain: Vec<u8>,
}

/// `atoi`: optional whitespace and sign, then digits, as far as they go; a 64-bit reading cut
/// to 32 bits as glibc's `atoi` (through `strtol`) on a 64-bit build.
pub fn atoi(s: &[u8]) -> i64 {
    let s = &s[s.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut n: i64 = 0;
    for &d in digits.iter().take_while(|b| b.is_ascii_digit()) {
        n = n.saturating_mul(10).saturating_add(i64::from(d - b'0'));
    }
    if neg { n.saturating_neg() } else { n }
}

impl Reader {
    /// Reads the `connect` in `packet` (marker included).
    ///
    /// # Errors
    /// [`ConnectError`]: not a connect, a bad compressed part, or a userinfo the engines would
    /// not all read the same.
    pub fn read(&mut self, packet: &[u8]) -> Result<Connect, ConnectError> {
        if !is_oob(packet) {
            return Err(ConnectError::NotConnect);
        }
        let body = &packet[4..];
        self.plain.clear();
        if body.starts_with(CONNECT) && packet.len() >= COMPRESSED_FROM {
            // Bytes 4..12 as sent, then what the server decompresses.
            self.codec
                .decompress(&packet[COMPRESSED_FROM..], MAX_LINE * 2, &mut self.plain)?;
            self.line.clear();
            self.line.extend_from_slice(&packet[4..COMPRESSED_FROM]);
            self.line.extend_from_slice(&self.plain);
        } else {
            self.line.clear();
            self.line.extend_from_slice(body);
        }
        let cut = line(&self.line).len();
        self.line.truncate(cut);
        self.parse()
    }

    fn parse(&self) -> Result<Connect, ConnectError> {
        let mut agreed: Option<Range<usize>> = None;
        for engine in ENGINES {
            let [argv0, argv1] = first_tokens(engine, &self.line);
            let is_connect = argv0.is_some_and(|r| token_eq(engine, &self.line, &r, CONNECT));
            if !is_connect {
                return Err(ConnectError::NotConnect);
            }
            let argv1 = argv1.ok_or(ConnectError::Userinfo)?;
            match &agreed {
                Some(a) if *a != argv1 => return Err(ConnectError::Userinfo),
                _ => agreed = Some(argv1),
            }
        }
        let userinfo = agreed.ok_or(ConnectError::Userinfo)?;
        let info = &self.line[userinfo.clone()];
        let value = |key: &[u8]| find_key(info, key);
        let challenge_at = value(b"challenge");
        let read = |r: &Option<Range<usize>>| r.as_ref().map_or(0, |r| atoi(&info[r.clone()]));
        let shift = |r: Range<usize>| r.start + userinfo.start..r.end + userinfo.start;
        Ok(Connect {
            challenge: read(&challenge_at) as i32,
            qport: read(&value(b"qport")) as u16,
            protocol: read(&value(b"protocol")),
            challenge_at: challenge_at.map(shift),
            userinfo,
        })
    }

    /// The userinfo of the connect read last (`connect` is what [`Reader::read`] returned).
    pub fn userinfo(&self, connect: &Connect) -> &[u8] {
        &self.line[connect.userinfo.clone()]
    }

    /// Writes into `out` (replacing it) the `connect` for the game server: the userinfo of the
    /// connect read last with `challenge` as its challenge, compressed as a client does.
    ///
    /// # Errors
    /// [`ConnectError::TooLong`]: the line would be longer than the server reads.
    pub fn rewrite(
        &mut self,
        connect: &Connect,
        challenge: i32,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnectError> {
        let info = connect.userinfo.clone();
        self.plain.clear();
        self.plain.push(b'"');
        match &connect.challenge_at {
            Some(at) => {
                self.plain
                    .extend_from_slice(&self.line[info.start..at.start]);
                let _ = write!(self.plain, "{challenge}");
                self.plain.extend_from_slice(&self.line[at.end..info.end]);
            }
            None => {
                self.plain.extend_from_slice(&self.line[info]);
                let _ = write!(self.plain, "\\challenge\\{challenge}");
            }
        }
        self.plain.push(b'"');
        if self.plain.len() + (COMPRESSED_FROM - 4) > MAX_LINE {
            return Err(ConnectError::TooLong);
        }
        out.clear();
        out.extend_from_slice(&OOB);
        out.extend_from_slice(b"connect ");
        self.codec.compress(&self.plain, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
