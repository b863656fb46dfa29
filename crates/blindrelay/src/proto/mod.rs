//! The blindrelay wire formats, as pure functions and types: no I/O and no clock reads (callers
//! pass the time in as Unix seconds, `now: u64`).
//!
//! The normative description is `docs/blindrelay-protocol.md`; every layout below quotes it.
//!
//! # Layout
//! - [`frame`]: what a hop `POST`s to the next: one v2 packet, its previous hop being the
//!   link's authenticated client; its decoder (a v1 envelope is told apart only to be refused)
//!   and request digest.
//! - [`sphinx`]: the v2 onion: fixed-size Sphinx-style packets, built by the sender, peeled in
//!   place by each hop, with a replay tag per layer.
//! - [`receipt`]: the terminal's signed delivery receipt, sealed back to the sender.
//! - [`descriptor`]: a node's signed, expiring descriptor (JSON) and the endpoint address policy.
//! - [`answer`]: a hop's JSON answer to a relay request (accepted, or the refusal's reason).
//! - [`link`]: the framed link (`blindrelay/1`): frames and their answers, each with an id, on
//!   one TLS session in place of one HTTP request per frame.
//!
//! # Logging ids
//! Full node ids, route ids, message ids, keys and endpoints never go to logs. The only loggable form of a node
//! id is its [`Prefix`]; the `Debug` impls of the types here print prefixes and lengths only.

pub mod answer;
pub mod descriptor;
pub mod frame;
pub mod link;
pub mod receipt;
pub mod sphinx;
#[cfg(test)]
mod vectors;

use std::fmt;

pub use descriptor::{
    DESCRIPTOR_MAX_SKEW, DESCRIPTOR_TTL, Descriptor, DescriptorError, EndpointError,
    MAX_ENDPOINT_LEN, endpoint_ip_is_public, is_public, onion_key_is_usable, parse_endpoint,
};
pub use frame::Frame;
pub use receipt::{
    RECEIPT_LEN, RECEIPT_MAX_AGE, RECEIPT_MAX_SKEW, Receipt, ReceiptError, commitment,
};

/// A node's identity: its Ed25519 public key.
pub type NodeId = [u8; 32];

pub use self::sphinx::ReplayTag;

/// A message's 16-byte id, drawn by its sender and sealed in the terminal's layer: the same on
/// every route the sender tries, so the terminal stores the message once; receipts name it.
pub type MessageId = [u8; 16];

/// The loggable form of a node id: its first 4 bytes as 8 lowercase hex characters.
///
/// `Debug` prints the same as `Display`, so `?prefix` is safe too.
#[derive(Clone, Copy)]
pub struct Prefix<'a>(pub &'a NodeId);

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 8];
        hex::encode_to_slice(&self.0[..4], &mut out).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Parses exactly `2 * N` hex digits (either case) into `N` bytes; `None` for any other input.
pub fn from_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_prints_first_four_bytes() {
        let mut id = [0xffu8; 32];
        id[..4].copy_from_slice(&[0x01, 0xab, 0x00, 0x9f]);
        assert_eq!(Prefix(&id).to_string(), "01ab009f");
        assert_eq!(format!("{:?}", Prefix(&id)), "01ab009f");
    }

    #[test]
    fn hex_round_trip() {
        let bytes: [u8; 5] = [0x00, 0x01, 0x7f, 0x80, 0xff];
        assert_eq!(hex::encode(bytes), "00017f80ff");
        assert_eq!(from_hex::<5>("00017f80ff"), Some(bytes));
        assert_eq!(from_hex::<5>("00017F80FF"), Some(bytes));
        assert_eq!(from_hex::<5>("00017f80f"), None);
        assert_eq!(from_hex::<5>("00017f80fff0"), None);
        assert_eq!(from_hex::<5>("00017f80fg"), None);
        assert_eq!(from_hex::<1>("+1"), None);
        assert_eq!(from_hex::<0>(""), Some([]));
        assert_eq!(hex::encode([]), "");
    }
}
