//! Version 2 of the onion format: a Sphinx-style packet whose length depends only on its size
//! class. **Not yet on the wire**: nothing in the node builds or peels it yet (issue 13, phase 1);
//! the normative description is the "v2 format" section of `docs/blindrelay-protocol.md`.
//!
//! ```text
//! offset  size         field
//! 0       1            version 0x02
//! 1       1            size class 0..=3 (payload capacity 2, 16, 64, 192 KiB)
//! 2       32           alpha: this hop's blinded X25519 group element
//! 34      8 × 64       beta: the encrypted routing slots (this hop's first)
//! 546     16           gamma: ChaCha20-Poly1305 tag over bytes 0..546 and the payload
//! 562     capacity     payload: encrypted under every remaining hop's layer
//! ```
//!
//! Each hop computes `s = X25519(onion_secret, alpha)` and derives from it (HKDF-SHA256) a
//! header stream key, a payload key, a blinding scalar and its **replay tag**. It checks gamma
//! (which also decrypts the payload by one layer), decrypts `beta ‖ 64 zero bytes` with the
//! header stream, reads its 64-byte slot from the front and shifts the rest up: the 64 bytes it
//! appends are its own keystream, which the sender predicted (the Sphinx *filler*), so the next
//! hop's MAC still verifies and every hop of every route sees a packet of the same length.
//! `alpha` is blinded for the next hop (`X25519(blind, alpha)`), so no byte is carried
//! unchanged from one hop to the next but the version and class bytes.
//!
//! # Layout
//! - [`keys`]: per-hop key derivation, the header keystream and blinding.
//! - [`slot`]: a routing slot (forward or terminal) as 64 bytes.
//! - [`build`](mod@build): wrapping a payload for a route (sender side), with the filler.
//! - [`peel`](mod@peel): peeling one layer (hop side), in place or into a new buffer.
//! - [`report`]: failure reports, sealed by the hop that saw its next hop fail, masked on the
//!   way back, opened by the sender.

pub mod build;
pub mod keys;
pub mod peel;
pub mod report;
pub mod slot;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;

use std::fmt;

use super::{NodeId, Prefix};

pub use build::{BuildError, Built, Delivery, HopSpec, build, build_with};
pub use peel::{Action, InPlace, PeelError, Peeled, peel, peel_in_place};
pub use report::{Failure, REPORT_LEN, Report};
pub use slot::Slot;

/// The first bytes of a version 1 envelope (no longer accepted): told apart only to refuse it
/// with its own reason.
pub const V1_MAGIC: [u8; 4] = *b"BRE1";
/// The version byte of every v2 packet.
pub const VERSION: u8 = 0x02;
/// The longest route the format can carry: the header holds this many slots.
pub const MAX_HOPS: usize = 8;
/// One routing slot.
pub const SLOT_LEN: usize = 64;
/// The encrypted routing slots: `MAX_HOPS × SLOT_LEN`.
pub const BETA_LEN: usize = MAX_HOPS * SLOT_LEN;
/// The ChaCha20-Poly1305 tag of each layer.
pub const MAC_LEN: usize = 16;
/// Length of alpha, the blinded X25519 group element.
pub const ALPHA_LEN: usize = 32;
/// Offset of alpha.
pub const ALPHA_AT: usize = 2;
/// Offset of beta.
pub const BETA_AT: usize = ALPHA_AT + ALPHA_LEN;
/// Offset of gamma; also the length of the MAC's associated data (bytes `0..GAMMA_AT`).
pub const GAMMA_AT: usize = BETA_AT + BETA_LEN;
/// Everything before the payload: version, class, alpha, beta, gamma (562 bytes).
pub const HEADER_LEN: usize = GAMMA_AT + MAC_LEN;
/// Length of a replay tag.
pub const TAG_LEN: usize = 16;
/// The longest a layer may stay valid after it is built: a hop refuses a layer whose expiry is
/// further ahead than this (so it keeps each replay tag at most this long plus the skew).
pub const MAX_LIFETIME: u64 = 600;
/// How far past its expiry a hop still accepts a layer (clock skew between sender and hop).
pub const EXPIRY_SKEW: u64 = 120;

/// A hop's replay tag for one layer: derived from the hop's shared secret, so the same layer has
/// the same tag however it is carried, and no one but the sender and the hop can compute it.
pub type ReplayTag = [u8; TAG_LEN];

/// The payload capacity of a packet; the packet is [`HEADER_LEN`] bytes longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SizeClass {
    /// 2 KiB of payload (a 2 610-byte packet).
    Small,
    /// 16 KiB (16 946 bytes).
    Medium,
    /// 64 KiB (66 098 bytes).
    Large,
    /// 192 KiB (197 170 bytes).
    Huge,
}

impl SizeClass {
    /// Every class, smallest first.
    pub const ALL: [SizeClass; 4] = [
        SizeClass::Small,
        SizeClass::Medium,
        SizeClass::Large,
        SizeClass::Huge,
    ];

    /// The class's byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            SizeClass::Small => 0,
            SizeClass::Medium => 1,
            SizeClass::Large => 2,
            SizeClass::Huge => 3,
        }
    }

    /// The class for a wire byte, `None` for an unknown one.
    pub fn from_byte(byte: u8) -> Option<SizeClass> {
        SizeClass::ALL.get(usize::from(byte)).copied()
    }

    /// The largest terminal payload the class carries.
    pub fn capacity(self) -> usize {
        match self {
            SizeClass::Small => 2 * 1024,
            SizeClass::Medium => 16 * 1024,
            SizeClass::Large => 64 * 1024,
            SizeClass::Huge => 192 * 1024,
        }
    }

    /// The length of every packet of the class, at every hop.
    pub fn packet_len(self) -> usize {
        HEADER_LEN + self.capacity()
    }

    /// The smallest class whose capacity holds `payload_len` bytes; `None` when none does.
    pub fn smallest_for(payload_len: usize) -> Option<SizeClass> {
        SizeClass::ALL
            .into_iter()
            .find(|class| payload_len <= class.capacity())
    }
}

/// What a hop reads from the packet before any cryptography: the framing errors, each distinct
/// (they say nothing secret). Everything after them is one opaque [`PeelError::PeelFailed`].
///
/// Returned by [`classify`]; [`peel`] wraps it in [`PeelError::Framing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// A v1 envelope (`BRE1…`): v1 is not accepted by the v2 parser.
    #[error("v1_not_accepted")]
    V1Envelope,
    /// Empty, or an unknown version byte.
    #[error("unknown_version")]
    UnknownVersion,
    /// An unknown size class byte.
    #[error("unknown_size_class")]
    UnknownClass,
    /// The length is not the class's packet length.
    #[error("bad_packet_length")]
    BadLength,
}

/// Checks the framing of a v2 packet and returns its class.
///
/// # Errors
/// [`FramingError`] when `packet` is a v1 envelope, has another version or class, or the wrong
/// length for its class.
pub fn classify(packet: &[u8]) -> Result<SizeClass, FramingError> {
    if packet.starts_with(&V1_MAGIC) {
        return Err(FramingError::V1Envelope);
    }
    match packet.first() {
        Some(&VERSION) => {}
        _ => return Err(FramingError::UnknownVersion),
    }
    let class = packet
        .get(1)
        .and_then(|&byte| SizeClass::from_byte(byte))
        .ok_or(FramingError::UnknownClass)?;
    if packet.len() != class.packet_len() {
        return Err(FramingError::BadLength);
    }
    Ok(class)
}

/// Whether a layer that expires at `expires_at` may be accepted at `now` (Unix seconds): not more
/// than [`EXPIRY_SKEW`] past its expiry, and not more than [`MAX_LIFETIME`] +
/// [`EXPIRY_SKEW`] ahead. A hop keeps the layer's replay tag until `expires_at + EXPIRY_SKEW`.
pub fn expiry_acceptable(expires_at: u64, now: u64) -> bool {
    now <= expires_at.saturating_add(EXPIRY_SKEW)
        && expires_at <= now.saturating_add(MAX_LIFETIME + EXPIRY_SKEW)
}

/// A node id in a log line: its prefix only.
struct Short<'a>(&'a NodeId);

impl fmt::Debug for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Prefix(self.0), f)
    }
}
