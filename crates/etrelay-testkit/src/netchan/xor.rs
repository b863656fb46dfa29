//! The XOR "encoding" of in-game messages in ET 2.60b, ET: Legacy and ioquake3's legacy
//! protocol 68 (ioquake3's protocol 71 has none; it has the header checksum instead).
//!
//! Facts from ET 2.60b `src/server/sv_net_chan.c` and `src/client/cl_net_chan.c` (ET: Legacy
//! keeps them; constants in `src/qcommon/qcommon.h`):
//!
//! * server to client (`SV_Netchan_Encode`, before `Netchan_Transmit`): the message bytes from
//!   offset 4 (`SV_ENCODE_START`, past `reliableAcknowledge`) are XOR-ed with a one-byte key
//!   that starts as `challenge ^ outgoingSequence` (the sequence the message is about to get)
//!   and is evolved before each byte `i` by `key ^= c << (i & 1)`, `c` walking the **last
//!   client command** the server received (`lastClientCommandString`), starting again at its
//!   NUL; a byte over 127 or a `%` counts as `.`. The client undoes it (`CL_Netchan_Decode`)
//!   with the sequence from the datagram and its own command numbered by the message's
//!   `reliableAcknowledge` (`clc.reliableCommands[ack & (MAX_RELIABLE_COMMANDS - 1)]`);
//! * client to server (`CL_Netchan_Encode`): the bytes from offset 12 (`CL_ENCODE_START`, past
//!   `serverId`, `messageAcknowledge`, `reliableAcknowledge`) with a key starting as
//!   `challenge ^ serverId ^ messageAcknowledge`, evolved by the **server command the client
//!   acknowledges** (`clc.serverCommands[reliableAcknowledge & …]`); the server undoes it
//!   (`SV_Netchan_Decode`) with its own command of that number. A message of 12 bytes or less
//!   is left alone;
//! * the decoders run on the received datagram from `readcount + 4` (client) and
//!   `readcount + 12` (server), `readcount` being where the message starts: 4 or 6 after a
//!   plain header, 4 after reassembly. Headers have an even length, so the parity of `i` (which
//!   picks the shift) is the same counted in the datagram or in the message: the functions
//!   here work on the message and serve both to encode and to decode (XOR is its own inverse).
//!
//! Simplification of the fakes: in the engines the leading longs are written with the bitwise
//! message Huffman, so the XOR-ed bytes from offset 4 / 12 start somewhere inside the
//! Huffman-coded data. The fakes write those longs as plain little-endian `u32`s (4 and 12
//! bytes, so the XOR starts right after them). What matters for a relay is the same: which
//! bytes are XOR-ed, from which offset, with which key schedule, and that the key starts from
//! the challenge. (A consequence a relay can use: two challenges give keystreams that differ
//! by the constant byte `(c1 ^ c2) & 0xFF`.)

/// `SV_ENCODE_START`: where a server message's XOR starts (past `reliableAcknowledge`).
pub const SERVER_MESSAGE_START: usize = 4;
/// `CL_ENCODE_START`: where a client message's XOR starts (past the three longs).
pub const CLIENT_MESSAGE_START: usize = 12;

/// XORs `message[start..]` with the key schedule seeded by `key` and evolved by `command` (no
/// NUL needed: its end, or a NUL in it, starts it again).
pub fn xor_from(message: &mut [u8], start: usize, key: u8, command: &[u8]) {
    let mut key = key;
    let mut index = 0;
    for (i, byte) in message.iter_mut().enumerate().skip(start) {
        if command.get(index).copied().unwrap_or(0) == 0 {
            index = 0;
        }
        let mut c = command.get(index).copied().unwrap_or(0);
        if c > 127 || c == b'%' {
            c = b'.';
        }
        key ^= c << (i & 1);
        *byte ^= key;
        index += 1;
    }
}

/// The first key of a server message: `challenge ^ sequence`, as a byte.
pub fn server_key(challenge: i32, sequence: u32) -> u8 {
    ((challenge as u32) ^ sequence) as u8
}

/// The first key of a client message: `challenge ^ serverId ^ messageAcknowledge`, as a byte.
pub fn client_key(challenge: i32, server_id: u32, message_acknowledge: u32) -> u8 {
    ((challenge as u32) ^ server_id ^ message_acknowledge) as u8
}

/// Encodes or decodes a server message (`SV_Netchan_Encode` / `CL_Netchan_Decode`): `sequence`
/// is the message's netchan sequence, `client_command` the client command numbered by its
/// `reliableAcknowledge` (for the server: the last one it received).
pub fn xor_server_message(
    message: &mut [u8],
    challenge: i32,
    sequence: u32,
    client_command: &[u8],
) {
    xor_from(
        message,
        SERVER_MESSAGE_START,
        server_key(challenge, sequence),
        client_command,
    );
}

/// The three leading longs of a client message, as the fakes write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLongs {
    /// `serverId`: the server's map instance as the client knows it.
    pub server_id: u32,
    /// `messageAcknowledge`: the last server sequence the client received.
    pub message_acknowledge: u32,
    /// `reliableAcknowledge`: the last server command the client received.
    pub reliable_acknowledge: u32,
}

impl ClientLongs {
    /// Reads them from the start of a client message (`None` if it is shorter than 12 bytes).
    pub fn read(message: &[u8]) -> Option<ClientLongs> {
        let long = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(message.get(i..i + 4)?.try_into().ok()?))
        };
        Some(ClientLongs {
            server_id: long(0)?,
            message_acknowledge: long(4)?,
            reliable_acknowledge: long(8)?,
        })
    }

    /// Appends them, little-endian.
    pub fn write(&self, out: &mut Vec<u8>) {
        for long in [
            self.server_id,
            self.message_acknowledge,
            self.reliable_acknowledge,
        ] {
            out.extend_from_slice(&long.to_le_bytes());
        }
    }
}

/// The `reliableAcknowledge` leading a server message, as the fakes write it.
pub fn server_message_ack(message: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(message.get(..4)?.try_into().ok()?))
}

/// Encodes or decodes a client message (`CL_Netchan_Encode` / `SV_Netchan_Decode`):
/// `server_command` is the server command numbered by its `reliableAcknowledge`. The key reads
/// the message's own leading longs; a message of 12 bytes or less is left alone.
pub fn xor_client_message(message: &mut [u8], challenge: i32, server_command: &[u8]) {
    let Some(longs) = ClientLongs::read(message) else {
        return;
    };
    let key = client_key(challenge, longs.server_id, longs.message_acknowledge);
    xor_from(message, CLIENT_MESSAGE_START, key, server_command);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_walks_the_command_and_wraps_at_its_end() {
        // Key 0x10, command "ab": i=0 (even) ^= 'a', i=1 (odd) ^= 'b' << 1, i=2 ^= 'a', ...
        let mut m = [0u8; 4];
        xor_from(&mut m, 0, 0x10, b"ab");
        let k0 = 0x10 ^ b'a';
        let k1 = k0 ^ (b'b' << 1);
        let k2 = k1 ^ b'a';
        let k3 = k2 ^ (b'b' << 1);
        assert_eq!(m, [k0, k1, k2, k3]);
        // '%' and high bytes count as '.'; an empty command leaves the key alone.
        let (mut a, mut b) = ([0u8; 3], [0u8; 3]);
        xor_from(&mut a, 0, 7, b"%\xe9x");
        xor_from(&mut b, 0, 7, b"..x");
        assert_eq!(a, b);
        let mut c = [0u8; 3];
        xor_from(&mut c, 1, 0x42, b"");
        assert_eq!(c, [0, 0x42, 0x42]);
    }
}
