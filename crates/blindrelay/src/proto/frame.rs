//! What one hop posts to the next (`POST /v2/relay`): one v2 packet ([`super::sphinx`]), and
//! nothing around it. The previous hop is the link's client, authenticated by mutual TLS
//! (`crate::links`): the key its TLS 1.3 `CertificateVerify` was checked with.
//!
//! ```text
//! offset  size  field
//! 0       P     packet        a v2 packet (version 0x02 ‖ class ‖ …), exactly its class's length
//! ```
//!
//! Request digest ([`Frame::request_digest`]): SHA-256(`blindrelay/request/v3` ‖ previous_hop
//! ‖ version ‖ class ‖ alpha ‖ gamma), alpha and gamma being the packet's bytes 2..34 and
//! 546..562: the same previous hop sending the same packet again is a retry (answered from the
//! replay registry); the same packet from any other previous hop is a re-wrap (refused by its
//! replay tag).
//!
//! **Why no signature of its own.** Until links were mutual, each frame carried its previous
//! hop's id and an Ed25519 signature over alpha, gamma, that id and the receiver's: the only
//! proof of who sent it. The link now proves it once per connection, for every frame on it, so
//! the signature added nothing but two Ed25519 operations per hop (one to sign, one to check;
//! measured in BENCHMARKS.md). What it was for stays: the guard charges the link's peer, the
//! digest tells a retry from a re-wrap, and a frame cannot be sent to another hop in its
//! sender's name (the link to that hop is another handshake, by its sender's key).
//!
//! **Why alpha and gamma name the packet**: gamma is the layer's ChaCha20-Poly1305 tag under a
//! key derived from alpha (and the receiver's onion key), over the rest of the header and the
//! whole payload. A packet the receiver accepts is therefore fixed by its alpha and gamma, but
//! for a Poly1305 forgery (under 2⁻⁹² per try), and the digest hashes 50 bytes, not 2–192 KiB.
//!
//! Nothing in clear names the route: no route id, ttl, next hop or timestamp, and the link is TLS
//! pinned to the receiver's key. The frame's length is the class's packet length, the same at
//! every hop.

use std::fmt;

use sha2::{Digest, Sha256};

use super::sphinx::{self, FramingError, SizeClass};
use super::{NodeId, Prefix};

/// The largest frame (the largest class): a relay reads at most this many bytes of body.
pub const MAX_FRAME: usize = 197_170;

const REQUEST_DOMAIN: &[u8] = b"blindrelay/request/v3";

/// A decoded frame: its packet, kept as received (the hop peels it in place), and the link's
/// authenticated previous hop.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// The v2 packet, exactly its class's length.
    pub packet: Vec<u8>,
    /// Its class, read by [`sphinx::classify`].
    pub class: SizeClass,
    /// The node id the link's client authenticated with.
    pub previous_hop: NodeId,
}

/// The bytes of a packet the digest binds: version ‖ class ‖ alpha ‖ gamma (50 bytes).
const BOUND_LEN: usize = 2 + sphinx::ALPHA_LEN + sphinx::MAC_LEN;

/// The length of a frame of `class`.
pub fn frame_len(class: SizeClass) -> usize {
    class.packet_len()
}

impl Frame {
    /// Parses one frame from `previous_hop`'s link, checking only the framing: version, class
    /// and the exact length, before anything is copied.
    ///
    /// # Errors
    /// [`FramingError::V1Envelope`] for a v1 envelope; the others for any other framing fault.
    pub fn decode(bytes: &[u8], previous_hop: NodeId) -> Result<Frame, FramingError> {
        let class = sphinx::classify(bytes)?;
        Ok(Frame {
            packet: bytes.to_vec(),
            class,
            previous_hop,
        })
    }

    /// `packet` (a v2 packet) as `previous_hop` sends it.
    ///
    /// # Errors
    /// The packet's [`FramingError`] when it is not a v2 packet.
    pub fn new(packet: Vec<u8>, previous_hop: NodeId) -> Result<Frame, FramingError> {
        let class = sphinx::classify(&packet)?;
        Ok(Frame {
            packet,
            class,
            previous_hop,
        })
    }

    /// version ‖ class ‖ alpha ‖ gamma of the packet.
    fn bound(&self) -> [u8; BOUND_LEN] {
        let mut out = [0u8; BOUND_LEN];
        let (head, gamma) = out.split_at_mut(2 + sphinx::ALPHA_LEN);
        // The packet is a whole class's length (checked by `decode` and `new`): past gamma.
        head.copy_from_slice(&self.packet[..sphinx::BETA_AT]);
        gamma.copy_from_slice(&self.packet[sphinx::GAMMA_AT..sphinx::HEADER_LEN]);
        out
    }

    /// The wire form: the packet.
    pub fn encode(&self) -> Vec<u8> {
        self.packet.clone()
    }

    /// SHA-256(`blindrelay/request/v3` ‖ previous_hop ‖ version ‖ class ‖ alpha ‖ gamma): equal
    /// for the same previous hop sending the same packet again, different under any other
    /// previous hop.
    pub fn request_digest(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(REQUEST_DOMAIN);
        hasher.update(self.previous_hop);
        hasher.update(self.bound());
        hasher.finalize().into()
    }
}

/// The previous hop's prefix and the class only.
impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("class", &self.class)
            .field("previous_hop", &Prefix(&self.previous_hop))
            .finish_non_exhaustive()
    }
}

/// A v1 envelope as v1 nodes sent it (the old protocol document's test vector, 166 bytes).
#[cfg(test)]
pub(crate) const V1_ENVELOPE_HEX: &str = concat!(
    "4252453111111111111111111111111111111111a09aa5f47a6759802ff955f8dc2d2a14a5c99d23be97f864",
    "127ff9383455a4f00300000000692b5ed079b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e391",
    "0bad0496640000000568656c6c6f495bad6f99700d61808250749dbed2348ccac944fb8c57694ff6f0cbf420",
    "eb222914504a6fba2778310a6752ecc2a8d0a293d4483b8a64d7f75cc3ddf72bd40a",
);

#[cfg(test)]
mod tests {
    use x25519_dalek::{PublicKey, StaticSecret};

    use super::*;
    use crate::proto::sphinx::{Delivery, HopSpec, build};

    const FROM: NodeId = [3; 32];

    fn packet(class: SizeClass) -> Vec<u8> {
        let secret = StaticSecret::from([5; 32]);
        let hop = HopSpec {
            node_id: [7; 32],
            onion_key: PublicKey::from(&secret).to_bytes(),
            expires_at: 1_800_000_600,
        };
        let delivery = Delivery {
            payload: b"hello",
            probe: false,
            receipt_key: [9; 32],
            message_id: [1; 16],
        };
        build(&[hop], &delivery, class)
            .expect("a one-hop route builds")
            .packet
    }

    #[test]
    fn round_trip_every_class_and_fixed_length() {
        for class in SizeClass::ALL {
            let frame = Frame::new(packet(class), FROM).expect("a v2 packet frames");
            let bytes = frame.encode();
            assert_eq!(bytes.len(), frame_len(class));
            assert_eq!(Frame::decode(&bytes, FROM), Ok(frame));
        }
        assert_eq!(frame_len(SizeClass::Huge), MAX_FRAME);
    }

    #[test]
    fn framing_faults_and_v1_are_told_apart() {
        let v1 = hex::decode(V1_ENVELOPE_HEX).expect("hex");
        assert_eq!(Frame::decode(&v1, FROM), Err(FramingError::V1Envelope));
        assert_eq!(Frame::decode(&[], FROM), Err(FramingError::UnknownVersion));
        assert_eq!(
            Frame::decode(&[2, 0, 0], FROM),
            Err(FramingError::BadLength)
        );
        let good = packet(SizeClass::Small);
        assert_eq!(
            Frame::decode(&good[..good.len() - 1], FROM),
            Err(FramingError::BadLength)
        );
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(Frame::decode(&longer, FROM), Err(FramingError::BadLength));
        let mut class = good.clone();
        class[1] = 9;
        assert_eq!(Frame::decode(&class, FROM), Err(FramingError::UnknownClass));
        let mut version = good;
        version[0] = 3;
        assert_eq!(
            Frame::decode(&version, FROM),
            Err(FramingError::UnknownVersion)
        );
    }

    #[test]
    fn any_changed_byte_fails_the_peel() {
        let bytes = packet(SizeClass::Small);
        let secret = StaticSecret::from([5; 32]);
        assert!(sphinx::peel(&[&secret], &bytes).is_ok());
        for at in [2, 33, 34, 545, 546, 561, 562, bytes.len() - 1] {
            let mut tampered = bytes.clone();
            tampered[at] ^= 1;
            let frame = Frame::decode(&tampered, FROM).expect("still framed");
            assert!(
                sphinx::peel(&[&secret], &frame.packet).is_err(),
                "byte {at}"
            );
        }
    }

    #[test]
    fn rewrap_changes_the_digest_not_the_packet() {
        let p = packet(SizeClass::Small);
        let from = |k: u8| Frame::new(p.clone(), [k; 32]).expect("frames");
        let (a, again, b) = (from(3), from(3), from(4));
        assert_eq!(a.request_digest(), again.request_digest());
        assert_ne!(a.request_digest(), b.request_digest());
        assert_eq!(a.packet, b.packet);
    }

    #[test]
    fn debug_is_log_safe() {
        let frame = Frame::new(packet(SizeClass::Small), FROM).expect("frames");
        let text = format!("{frame:?}");
        assert!(!text.contains(&hex::encode(frame.previous_hop)));
        assert!(text.len() < 100);
    }
}
