//! The v2 outer frame: one v2 packet ([`super::sphinx`]) as one hop sends it to the next
//! (`POST /v2/relay`), with only the previous hop's id and its signature around it.
//!
//! ```text
//! offset  size  field
//! 0       P     packet        a v2 packet (version 0x02 ‖ class ‖ …), exactly its class's length
//! P       32    previous_hop  the signer's node id
//! P+32    64    signature     Ed25519 by previous_hop
//! ```
//!
//! Signed bytes ([`Frame::signing_bytes`], 133 bytes): `blindrelay/frame/v2` ‖ version ‖ class ‖
//! alpha ‖ gamma ‖ previous_hop ‖ receiver, where alpha and gamma are the packet's bytes 2..34
//! and 546..562 and `receiver` is the node id of the hop the frame is posted to (not carried:
//! the receiver puts its own). Request digest: SHA-256(`blindrelay/request/v2` ‖ previous_hop ‖
//! version ‖ class ‖ alpha ‖ gamma): the same previous hop sending the same packet again is a
//! retry (answered from the replay registry); the same packet under any other previous hop is a
//! re-wrap (refused by its replay tag).
//!
//! **Why signing alpha and gamma is as strong as signing the packet**: gamma is the layer's
//! ChaCha20-Poly1305 tag under a key derived from alpha (and the receiver's onion key), over
//! the rest of the header and the whole payload. A packet the receiver accepts is therefore fixed
//! by its alpha and gamma, but for a Poly1305 forgery (under 2⁻⁹² per try). A frame whose other
//! bytes were changed keeps a valid signature but fails the peel (`onion_peel_failed`, blamed on
//! nobody upstream), as a changed frame failed the signature before, also charged to nobody.
//! What the signature is for (naming the previous hop for the guard, and telling a retry from a
//! re-wrap) is unchanged, and neither side hashes the 2–192 KiB packet for it. Binding the
//! receiver means a frame signed for one hop cannot be replayed to another in its signer's name
//! (to spend the signer's rate there).
//!
//! Nothing in clear names the route: no route id, ttl, next hop or timestamp, and the link is TLS
//! pinned to the receiver's key. The frame's length is the class's packet length plus
//! [`FRAME_OVERHEAD`], the same at every hop.
//!
//! [`Frame::decode`] checks the framing only (and tells a v1 envelope apart); [`Frame::verify`]
//! checks the signature.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::sphinx::{self, FramingError, SizeClass};
use super::{NodeId, Prefix};

/// Bytes after the packet: the previous hop's id and its signature.
pub const FRAME_OVERHEAD: usize = 32 + 64;
/// The largest frame (the largest class): a relay reads at most this many bytes of body.
pub const MAX_FRAME: usize = 197_170 + FRAME_OVERHEAD;

const SIGN_DOMAIN: &[u8] = b"blindrelay/frame/v2";
const REQUEST_DOMAIN: &[u8] = b"blindrelay/request/v2";

/// Why a frame's signature is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// `previous_hop` is not a usable Ed25519 public key: not a valid point, or a small-order
    /// (weak) point that can never be a real node's identity.
    #[error("invalid_previous_hop")]
    InvalidPreviousHop,
    /// The signature does not verify (strictly) under `previous_hop`.
    #[error("invalid_signature")]
    InvalidSignature,
}

/// A decoded v2 frame. The packet is kept as received: the hop peels it in place.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// The v2 packet, exactly its class's length.
    pub packet: Vec<u8>,
    /// Its class, read by [`sphinx::classify`].
    pub class: SizeClass,
    /// The signer's node id.
    pub previous_hop: NodeId,
    /// Ed25519 by `previous_hop` over [`Frame::signing_bytes`].
    pub signature: [u8; 64],
}

/// The bytes of a packet the frame's signature and digest bind: version ‖ class ‖ alpha ‖ gamma
/// (50 bytes).
const BOUND_LEN: usize = 2 + sphinx::ALPHA_LEN + sphinx::MAC_LEN;

/// The length of a frame of `class`.
pub fn frame_len(class: SizeClass) -> usize {
    class.packet_len() + FRAME_OVERHEAD
}

impl Frame {
    /// Parses one frame, checking only the framing: version, class and the exact length. Lengths
    /// are checked before anything is copied.
    ///
    /// # Errors
    /// [`FramingError::V1Envelope`] for a v1 envelope; the others for any other framing fault.
    pub fn decode(bytes: &[u8]) -> Result<Frame, FramingError> {
        if bytes.starts_with(&sphinx::V1_MAGIC) {
            return Err(FramingError::V1Envelope);
        }
        let Some(packet_len) = bytes.len().checked_sub(FRAME_OVERHEAD) else {
            return Err(match bytes.first() {
                Some(&sphinx::VERSION) => FramingError::BadLength,
                _ => FramingError::UnknownVersion,
            });
        };
        let (packet, tail) = bytes.split_at(packet_len);
        let class = sphinx::classify(packet)?;
        let (previous_hop, signature) = tail.split_at(32);
        Ok(Frame {
            packet: packet.to_vec(),
            class,
            previous_hop: previous_hop
                .try_into()
                .expect("invariant: split at 32 bytes"),
            signature: signature
                .try_into()
                .expect("invariant: the tail is 96 bytes"),
        })
    }

    /// Frames and signs `packet` (a v2 packet) as `key`'s node, for the hop `receiver`.
    ///
    /// # Errors
    /// The packet's [`FramingError`] when it is not a v2 packet.
    pub fn sign(
        packet: Vec<u8>,
        key: &SigningKey,
        receiver: &NodeId,
    ) -> Result<Frame, FramingError> {
        let class = sphinx::classify(&packet)?;
        let mut frame = Frame {
            packet,
            class,
            previous_hop: key.verifying_key().to_bytes(),
            signature: [0; 64],
        };
        frame.signature = key.sign(&frame.signing_bytes(receiver)).to_bytes();
        Ok(frame)
    }

    /// version ‖ class ‖ alpha ‖ gamma of the packet.
    fn bound(&self) -> [u8; BOUND_LEN] {
        let mut out = [0u8; BOUND_LEN];
        let (head, gamma) = out.split_at_mut(2 + sphinx::ALPHA_LEN);
        // The packet is a whole class's length (checked by `decode` and `sign`): past gamma.
        head.copy_from_slice(&self.packet[..sphinx::BETA_AT]);
        gamma.copy_from_slice(&self.packet[sphinx::GAMMA_AT..sphinx::HEADER_LEN]);
        out
    }

    /// The wire form: packet ‖ previous_hop ‖ signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.packet.len() + FRAME_OVERHEAD);
        out.extend_from_slice(&self.packet);
        out.extend_from_slice(&self.previous_hop);
        out.extend_from_slice(&self.signature);
        out
    }

    /// What `previous_hop` signs for `receiver`: `blindrelay/frame/v2` ‖ version ‖ class ‖
    /// alpha ‖ gamma ‖ previous_hop ‖ receiver (133 bytes).
    pub fn signing_bytes(&self, receiver: &NodeId) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIGN_DOMAIN.len() + BOUND_LEN + 64);
        out.extend_from_slice(SIGN_DOMAIN);
        out.extend_from_slice(&self.bound());
        out.extend_from_slice(&self.previous_hop);
        out.extend_from_slice(receiver);
        out
    }

    /// Checks the signature under `previous_hop` with `verify_strict`, as received by the node
    /// `receiver` (this node).
    ///
    /// # Errors
    /// [`AuthError::InvalidPreviousHop`] for a key that is not a usable Ed25519 point (or a weak
    /// one), [`AuthError::InvalidSignature`] otherwise (a frame signed for another receiver
    /// too).
    pub fn verify(&self, receiver: &NodeId) -> Result<(), AuthError> {
        let key = VerifyingKey::from_bytes(&self.previous_hop)
            .map_err(|_| AuthError::InvalidPreviousHop)?;
        if key.is_weak() {
            return Err(AuthError::InvalidPreviousHop);
        }
        let signature = Signature::from_bytes(&self.signature);
        key.verify_strict(&self.signing_bytes(receiver), &signature)
            .map_err(|_| AuthError::InvalidSignature)
    }

    /// SHA-256(`blindrelay/request/v2` ‖ previous_hop ‖ version ‖ class ‖ alpha ‖ gamma): equal
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

    /// The node the test frames are posted to.
    const RECEIVER: NodeId = [7; 32];

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
        let key = SigningKey::from_bytes(&[3; 32]);
        for class in SizeClass::ALL {
            let frame = Frame::sign(packet(class), &key, &RECEIVER).expect("a v2 packet frames");
            let bytes = frame.encode();
            assert_eq!(bytes.len(), frame_len(class));
            let decoded = Frame::decode(&bytes).expect("decodes");
            assert_eq!(decoded, frame);
            assert_eq!(decoded.verify(&RECEIVER), Ok(()));
            assert!(
                decoded.verify(&[8; 32]).is_err(),
                "signed for another receiver"
            );
        }
        assert_eq!(frame_len(SizeClass::Huge), MAX_FRAME);
    }

    #[test]
    fn framing_faults_and_v1_are_told_apart() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let v1 = hex::decode(V1_ENVELOPE_HEX).expect("hex");
        assert_eq!(Frame::decode(&v1), Err(FramingError::V1Envelope));
        assert_eq!(Frame::decode(&[]), Err(FramingError::UnknownVersion));
        assert_eq!(Frame::decode(&[2, 0, 0]), Err(FramingError::BadLength));
        let good = Frame::sign(packet(SizeClass::Small), &key, &RECEIVER)
            .expect("frames")
            .encode();
        assert_eq!(
            Frame::decode(&good[..good.len() - 1]),
            Err(FramingError::BadLength)
        );
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(Frame::decode(&longer), Err(FramingError::BadLength));
        let mut class = good.clone();
        class[1] = 9;
        assert_eq!(Frame::decode(&class), Err(FramingError::UnknownClass));
        let mut version = good;
        version[0] = 3;
        assert_eq!(Frame::decode(&version), Err(FramingError::UnknownVersion));
    }

    #[test]
    fn signature_covers_alpha_gamma_and_previous_hop_and_the_mac_the_rest() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let bytes = Frame::sign(packet(SizeClass::Small), &key, &RECEIVER)
            .expect("frames")
            .encode();
        // Alpha, gamma, the previous hop and the signature: the signature fails.
        for at in [2, 33, 546, 561, bytes.len() - 70, bytes.len() - 1] {
            let mut tampered = bytes.clone();
            tampered[at] ^= 1;
            let frame = Frame::decode(&tampered).expect("still framed");
            assert!(frame.verify(&RECEIVER).is_err(), "byte {at}");
        }
        // Beta and the payload: the signature holds, the layer's MAC fails at the peel.
        let secret = StaticSecret::from([5; 32]);
        for at in [34, 545, 562, bytes.len() - FRAME_OVERHEAD - 1] {
            let mut tampered = bytes.clone();
            tampered[at] ^= 1;
            let frame = Frame::decode(&tampered).expect("still framed");
            assert_eq!(frame.verify(&RECEIVER), Ok(()), "byte {at}");
            assert!(
                sphinx::peel(&[&secret], &frame.packet).is_err(),
                "byte {at}"
            );
        }
    }

    #[test]
    fn rewrap_changes_the_digest_not_the_packet() {
        let p = packet(SizeClass::Small);
        let sign = |p: &[u8], k: u8| {
            Frame::sign(p.to_vec(), &SigningKey::from_bytes(&[k; 32]), &RECEIVER).expect("frames")
        };
        let (a, again, b) = (sign(&p, 3), sign(&p, 3), sign(&p, 4));
        assert_eq!(a.request_digest(), again.request_digest());
        assert_ne!(a.request_digest(), b.request_digest());
        assert_eq!(a.packet, b.packet);
    }

    #[test]
    fn debug_is_log_safe() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let frame = Frame::sign(packet(SizeClass::Small), &key, &RECEIVER).expect("frames");
        let text = format!("{frame:?}");
        assert!(!text.contains(&hex::encode(frame.previous_hop)));
        assert!(text.len() < 100);
    }
}
