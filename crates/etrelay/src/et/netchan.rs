//! What of an in-game (netchan) packet depends on the connection's challenge, and how the relay
//! translates it between the challenge the client holds (the relay's) and the game server's.
//!
//! After the handshake the client and the server each use the challenge they know: the client
//! the one the relay gave it, the server its own. Every packet carries a header (sequence number,
//! bit 31 set on a fragment; client → server the 2-byte qport; then, on a fragment, 2-byte start
//! and length), and the challenge shows up in one of two ways (`et-protocol.md`,
//! `network-anchors.md`):
//!
//! - **ioquake3 protocol 71** ([`Scheme::Checksum`]): after the sequence (and qport) each packet
//!   holds `challenge ^ (sequence * challenge)` (sequence without the fragment bit), checked by
//!   the receiver (`NETCHAN_GENCHECKSUM`, `Netchan_Process`). The relay checks it against the
//!   client's challenge and writes the server's, and the other way round.
//! - **ET 2.60b, ET: Legacy, ioquake3's legacy protocol 68** ([`Scheme::Xor`]): the message is
//!   XORed byte by byte with a one-byte key that starts as `challenge ^ …` and then changes with
//!   bytes that do not depend on the challenge (`SV_Netchan_Encode`/`Decode`,
//!   `CL_Netchan_Encode`/`Decode`). So the keys for two challenges differ at every byte by the
//!   same byte, `(client ^ server) & 0xff`, and the relay XORs each encoded byte with it. Client
//!   → server the encoding starts at byte 12 of the message, server → client at byte 4; on a
//!   fragment those are offsets into the whole message (its start is in the header).
//!
//! Pure functions over one datagram, in place, no allocation.

use super::challenge::Dialect;

/// Bit 31 of the sequence: the packet is a fragment.
const FRAGMENT_BIT: u32 = 1 << 31;
/// First encoded byte of a client's message (`CL_ENCODE_START`, `SV_DECODE_START`).
const CLIENT_ENCODE_START: usize = 12;
/// First encoded byte of a server's message (`SV_ENCODE_START`, `CL_DECODE_START`).
const SERVER_ENCODE_START: usize = 4;

/// How the challenge enters a connection's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// A checksum of challenge and sequence in every header (ioquake3 protocol 71).
    Checksum,
    /// The message XORed with a key built from the challenge (ET, ioquake3 protocol 68).
    Xor,
}

impl Scheme {
    /// The scheme of a client announcing `protocol` in its `connect` to a server of `dialect`
    /// whose `infoResponse` says `info_protocol`. ET has only the XOR. An ioquake3 server
    /// speaks its legacy protocol (`com_legacyprotocol`, 68 by default) with the XOR and its
    /// own (`com_protocol`, 71) with the checksum, and its `infoResponse` gives the legacy one
    /// while legacy is on (`SVC_Info`): a client announcing that one gets the XOR. Debian's
    /// OpenArena sets both to 71, so all its clients do.
    pub fn for_client(dialect: Dialect, info_protocol: Option<i64>, protocol: i64) -> Scheme {
        match dialect {
            Dialect::Et => Scheme::Xor,
            Dialect::Ioq3 if info_protocol == Some(protocol) => Scheme::Xor,
            Dialect::Ioq3 => Scheme::Checksum,
        }
    }
}

/// Why a packet was not translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Untranslatable {
    /// Too short for its header.
    #[error("in-game packet shorter than its header")]
    Short,
    /// Its checksum is not the one the client's challenge gives: not from the client.
    #[error("in-game packet with a checksum of another challenge")]
    Checksum,
}

/// A connection's two challenges: the one the client holds and the game server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// How the challenge enters the packets.
    pub scheme: Scheme,
    /// The challenge the client holds (the relay's).
    pub client: i32,
    /// The game server's challenge for this connection.
    pub server: i32,
}

/// `NETCHAN_GENCHECKSUM`: the header word of `sequence` under `challenge`.
pub fn checksum(challenge: i32, sequence: u32) -> u32 {
    let c = challenge as u32;
    c ^ sequence.wrapping_mul(c)
}

fn u32_at(p: &[u8], at: usize) -> Option<u32> {
    let b = p.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u16_at(p: &[u8], at: usize) -> Option<usize> {
    let b = p.get(at..at + 2)?;
    Some(usize::from(u16::from_le_bytes([b[0], b[1]])))
}

impl Translation {
    /// A client's packet on its way to the server: checked against the client's challenge
    /// ([`Scheme::Checksum`]) and rewritten for the server's.
    ///
    /// # Errors
    /// [`Untranslatable`]: too short, or a checksum the client's challenge does not give.
    pub fn to_server(&self, packet: &mut [u8]) -> Result<(), Untranslatable> {
        // Sequence, qport.
        self.translate(packet, 6, CLIENT_ENCODE_START, true)
    }

    /// A server's packet on its way to the client: rewritten for the client's challenge.
    ///
    /// # Errors
    /// [`Untranslatable::Short`]: too short for its header.
    pub fn to_client(&self, packet: &mut [u8]) -> Result<(), Untranslatable> {
        // Sequence only.
        self.translate(packet, 4, SERVER_ENCODE_START, false)
    }

    /// `header` is where the checksum (or, without one, the fragment fields or the message)
    /// starts; `encode_start` the message's first encoded byte; `check` whether the checksum is
    /// checked against `self.client` first.
    fn translate(
        &self,
        packet: &mut [u8],
        header: usize,
        encode_start: usize,
        check: bool,
    ) -> Result<(), Untranslatable> {
        let word = u32_at(packet, 0).ok_or(Untranslatable::Short)?;
        let sequence = word & !FRAGMENT_BIT;
        let fragment = word & FRAGMENT_BIT != 0;
        if packet.len() < header {
            return Err(Untranslatable::Short);
        }
        match self.scheme {
            Scheme::Checksum => {
                let got = u32_at(packet, header).ok_or(Untranslatable::Short)?;
                let (from, to) = if check {
                    (self.client, self.server)
                } else {
                    (self.server, self.client)
                };
                if check && got != checksum(from, sequence) {
                    return Err(Untranslatable::Checksum);
                }
                let new = got ^ checksum(from, sequence) ^ checksum(to, sequence);
                packet[header..header + 4].copy_from_slice(&new.to_le_bytes());
                Ok(())
            }
            Scheme::Xor => {
                let delta = ((self.client ^ self.server) & 0xff) as u8;
                let (data, offset) = if fragment {
                    let start = u16_at(packet, header).ok_or(Untranslatable::Short)?;
                    if packet.len() < header + 4 {
                        return Err(Untranslatable::Short);
                    }
                    (header + 4, start)
                } else {
                    (header, 0)
                };
                // Message byte `offset + i` is at `data + i`: XOR from message byte
                // `encode_start` on.
                let skip = encode_start.saturating_sub(offset);
                if delta != 0
                    && let Some(bytes) = packet.get_mut(data + skip..)
                {
                    for b in bytes {
                        *b ^= delta;
                    }
                }
                Ok(())
            }
        }
    }

    /// The client's sequence number of `packet` when its checksum shows it comes from the
    /// client (holds the client's challenge): the proof a new source port must give before the
    /// relay moves the session there. `None` without a checksum scheme or on a bad one.
    pub fn proven_sequence(&self, packet: &[u8]) -> Option<u32> {
        if self.scheme != Scheme::Checksum {
            return None;
        }
        let sequence = u32_at(packet, 0)? & !FRAGMENT_BIT;
        (u32_at(packet, 6)? == checksum(self.client, sequence)).then_some(sequence)
    }
}

#[cfg(test)]
mod tests;
