//! The game protocol, without I/O.
//!
//! - [`tokenizer`]: how the servers cut a connectionless packet into words, engine by engine.
//! - [`classify`]: what a packet from a client is, and whether it may pass.
//! - [`info`]: info strings in `infoResponse`/`statusResponse`, and the `challenge` rewrite.

pub mod challenge;
pub mod classify;
pub mod connect;
pub mod huffman;
pub mod info;
pub mod netchan;
pub mod tokenizer;

/// The 4-byte marker of a connectionless (out-of-band) packet.
pub const OOB: [u8; 4] = [0xff; 4];

/// True when `packet` is connectionless: at least 4 bytes, the first 4 being `FF FF FF FF`.
#[inline]
pub fn is_oob(packet: &[u8]) -> bool {
    packet.len() >= 4 && packet[..4] == OOB
}

/// The first word of a connectionless packet as sent (for logs): up to the first byte that is
/// not a printable ASCII letter, digit or `_`. Empty for other packets.
pub fn command_word(packet: &[u8]) -> &str {
    if !is_oob(packet) {
        return "";
    }
    let body = &packet[4..];
    let end = body
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-'))
        .unwrap_or(body.len())
        .min(32);
    // Only ASCII bytes are kept above, so this cannot fail.
    match std::str::from_utf8(&body[..end]) {
        Ok("") | Err(_) => "?",
        Ok(w) => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_words() {
        assert_eq!(
            command_word(b"\xff\xff\xff\xffgetChallenge 123"),
            "getChallenge"
        );
        assert_eq!(
            command_word(b"\xff\xff\xff\xffinfoResponse\n\\a\\b"),
            "infoResponse"
        );
        assert_eq!(command_word(b"\xff\xff\xff\xff"), "?");
        assert_eq!(command_word(b"\x01\x02\x03\x04abc"), "");
    }
}
