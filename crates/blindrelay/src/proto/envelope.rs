//! The envelope: the signed routing frame one hop sends to the next (`POST /v1/relay`).
//!
//! ```text
//! offset  size  field
//! 0       4     magic "BRE1"
//! 4       16    route_id      this hop's route id
//! 20      32    next_hop      the node this frame is for (must be the receiver)
//! 52      1     ttl           hops left after this one
//! 53      8     timestamp     Unix seconds, set by the signer (big-endian)
//! 61      32    previous_hop  the signer's node id
//! 93      4     blob length n (big-endian, <= MAX_BLOB)
//! 97      n     blob          the onion layer for next_hop
//! 97+n    64    signature     Ed25519 by previous_hop
//! ```
//!
//! Signed bytes: `blindrelay/envelope/v1` ‖ bytes 4..97+n. Request digest:
//! SHA-256(`blindrelay/request/v1` ‖ the whole encoded envelope, signature included).
//!
//! [`Envelope::decode`] only checks the framing; [`Envelope::verify`] checks the signature. Age,
//! ttl and next-hop policy belong to the relay.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::{NodeId, Prefix, RouteId};

/// The first 4 bytes of every envelope.
pub const MAGIC: [u8; 4] = *b"BRE1";
/// Largest blob an envelope may carry.
pub const MAX_BLOB: usize = 196_608;
/// Bytes before the blob: magic, route id, next hop, ttl, timestamp, previous hop, blob length.
pub const HEADER_LEN: usize = 97;
/// Length of the trailing Ed25519 signature.
pub const SIG_LEN: usize = 64;
/// Largest valid envelope (196 769 bytes): a relay reads at most this many bytes of body.
pub const MAX_ENVELOPE: usize = HEADER_LEN + MAX_BLOB + SIG_LEN;

const SIGN_DOMAIN: &[u8] = b"blindrelay/envelope/v1";
const REQUEST_DOMAIN: &[u8] = b"blindrelay/request/v1";
/// Bytes 4..97: the header without the magic, as signed.
const FIELDS_LEN: usize = HEADER_LEN - MAGIC.len();

/// One decoded envelope. Fields are public so tests and the relay can build frames; a frame is
/// only trustworthy after [`Envelope::verify`].
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    /// This hop's route id (the replay registry key).
    pub route_id: RouteId,
    /// The node this frame is for; the receiver rejects frames naming another node.
    pub next_hop: NodeId,
    /// Hops left after this one.
    pub ttl: u8,
    /// Unix seconds at which `previous_hop` signed the frame.
    pub timestamp: u64,
    /// The signer's node id (Ed25519 public key).
    pub previous_hop: NodeId,
    /// The onion layer for `next_hop`, opaque to everyone else.
    pub blob: Vec<u8>,
    /// Ed25519 signature by `previous_hop` over [`Envelope::signing_bytes`].
    pub signature: [u8; SIG_LEN],
}

/// Why bytes are not an envelope. Cheap to build and to count; never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a header plus a signature.
    #[error("envelope too short")]
    TooShort,
    /// Does not start with `BRE1`.
    #[error("bad envelope magic")]
    BadMagic,
    /// The length field exceeds [`MAX_BLOB`].
    #[error("envelope blob too large")]
    BlobTooLarge,
    /// The length field does not match the number of bytes received.
    #[error("envelope length mismatch")]
    LengthMismatch,
}

/// Why an envelope's signature is not accepted.
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

impl Envelope {
    /// Parses one envelope, checking only the framing.
    ///
    /// Lengths are checked before anything is copied, so an oversized or truncated body costs
    /// nothing but the checks.
    ///
    /// # Errors
    /// [`DecodeError`] when `bytes` is not exactly one well-framed envelope.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
        if bytes.len() < MAGIC.len() {
            return Err(DecodeError::TooShort);
        }
        if bytes[..4] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        if bytes.len() < HEADER_LEN + SIG_LEN {
            return Err(DecodeError::TooShort);
        }
        let n = u32::from_be_bytes(array(&bytes[93..97])) as usize;
        if n > MAX_BLOB {
            return Err(DecodeError::BlobTooLarge);
        }
        if bytes.len() != HEADER_LEN + n + SIG_LEN {
            return Err(DecodeError::LengthMismatch);
        }
        let blob_end = HEADER_LEN + n;
        Ok(Envelope {
            route_id: array(&bytes[4..20]),
            next_hop: array(&bytes[20..52]),
            ttl: bytes[52],
            timestamp: u64::from_be_bytes(array(&bytes[53..61])),
            previous_hop: array(&bytes[61..93]),
            blob: bytes[HEADER_LEN..blob_end].to_vec(),
            signature: array(&bytes[blob_end..]),
        })
    }

    /// The wire form: `BRE1` ‖ header fields ‖ blob ‖ signature.
    ///
    /// A blob longer than [`MAX_BLOB`] still encodes, but [`Envelope::decode`] rejects the result.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.blob.len() + SIG_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.fields());
        out.extend_from_slice(&self.blob);
        out.extend_from_slice(&self.signature);
        out
    }

    /// What `previous_hop` signs: `blindrelay/envelope/v1` ‖ bytes 4..97+n of the encoding.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIGN_DOMAIN.len() + FIELDS_LEN + self.blob.len());
        out.extend_from_slice(SIGN_DOMAIN);
        out.extend_from_slice(&self.fields());
        out.extend_from_slice(&self.blob);
        out
    }

    /// Builds and signs an envelope; `previous_hop` is `key`'s public key.
    pub fn sign(
        route_id: RouteId,
        next_hop: NodeId,
        ttl: u8,
        timestamp: u64,
        blob: Vec<u8>,
        key: &SigningKey,
    ) -> Envelope {
        let mut envelope = Envelope {
            route_id,
            next_hop,
            ttl,
            timestamp,
            previous_hop: key.verifying_key().to_bytes(),
            blob,
            signature: [0; SIG_LEN],
        };
        envelope.signature = key.sign(&envelope.signing_bytes()).to_bytes();
        envelope
    }

    /// Checks the signature under `previous_hop` with `verify_strict`.
    ///
    /// # Errors
    /// [`AuthError::InvalidPreviousHop`] if `previous_hop` is not a valid, non-weak Ed25519 point;
    /// [`AuthError::InvalidSignature`] if the signature does not verify.
    pub fn verify(&self) -> Result<(), AuthError> {
        let key = VerifyingKey::from_bytes(&self.previous_hop)
            .map_err(|_| AuthError::InvalidPreviousHop)?;
        if key.is_weak() {
            return Err(AuthError::InvalidPreviousHop);
        }
        let signature = Signature::from_bytes(&self.signature);
        key.verify_strict(&self.signing_bytes(), &signature)
            .map_err(|_| AuthError::InvalidSignature)
    }

    /// SHA-256(`blindrelay/request/v1` ‖ [`Envelope::encode`]): equal for the same frame sent
    /// again, different for any other frame. Computed without building the encoding.
    pub fn request_digest(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(REQUEST_DOMAIN);
        hasher.update(MAGIC);
        hasher.update(self.fields());
        hasher.update(&self.blob);
        hasher.update(self.signature);
        hasher.finalize().into()
    }

    /// Bytes 4..97: route id ‖ next hop ‖ ttl ‖ timestamp ‖ previous hop ‖ blob length.
    fn fields(&self) -> [u8; FIELDS_LEN] {
        let mut f = [0u8; FIELDS_LEN];
        f[0..16].copy_from_slice(&self.route_id);
        f[16..48].copy_from_slice(&self.next_hop);
        f[48] = self.ttl;
        f[49..57].copy_from_slice(&self.timestamp.to_be_bytes());
        f[57..89].copy_from_slice(&self.previous_hop);
        // A blob over u32::MAX bytes cannot be sent anyway; saturate instead of wrapping so the
        // length field never silently describes a shorter blob.
        let n = u32::try_from(self.blob.len()).unwrap_or(u32::MAX);
        f[89..93].copy_from_slice(&n.to_be_bytes());
        f
    }
}

/// Ids and the blob are not printed: only prefixes and lengths, so `?envelope` is log-safe.
impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("next_hop", &Prefix(&self.next_hop))
            .field("ttl", &self.ttl)
            .field("timestamp", &self.timestamp)
            .field("previous_hop", &Prefix(&self.previous_hop))
            .field("blob_len", &self.blob.len())
            .finish_non_exhaustive()
    }
}

/// Copies a slice whose length the caller has already fixed into an array.
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    bytes
        .try_into()
        .expect("invariant: callers pass slices of exactly N bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(byte: u8) -> SigningKey {
        SigningKey::from_bytes(&[byte; 32])
    }

    fn sample(blob: &[u8]) -> Envelope {
        Envelope::sign(
            [0x11; 16],
            key(0x22).verifying_key().to_bytes(),
            3,
            1_764_450_000,
            blob.to_vec(),
            &key(0x33),
        )
    }

    #[test]
    fn encode_decode_round_trip() {
        for blob in [&b""[..], b"hello", &[0xab; 1000]] {
            let env = sample(blob);
            let bytes = env.encode();
            assert_eq!(bytes.len(), HEADER_LEN + blob.len() + SIG_LEN);
            assert_eq!(&bytes[..4], b"BRE1");
            assert_eq!(Envelope::decode(&bytes), Ok(env.clone()));
            assert_eq!(
                &env.signing_bytes()[SIGN_DOMAIN.len()..],
                &bytes[4..bytes.len() - SIG_LEN]
            );
        }
    }

    #[test]
    fn max_blob_round_trips_and_one_more_is_rejected() {
        let env = sample(&vec![7; MAX_BLOB]);
        let bytes = env.encode();
        assert_eq!(bytes.len(), MAX_ENVELOPE);
        assert_eq!(MAX_ENVELOPE, 196_769);
        assert_eq!(Envelope::decode(&bytes), Ok(env));

        let too_big = sample(&vec![7; MAX_BLOB + 1]).encode();
        assert_eq!(Envelope::decode(&too_big), Err(DecodeError::BlobTooLarge));
    }

    #[test]
    fn decode_rejects_bad_frames() {
        let bytes = sample(b"hello").encode();
        assert_eq!(Envelope::decode(&[]), Err(DecodeError::TooShort));
        assert_eq!(Envelope::decode(b"BRE"), Err(DecodeError::TooShort));
        assert_eq!(
            Envelope::decode(&bytes[..HEADER_LEN + SIG_LEN - 1]),
            Err(DecodeError::TooShort)
        );
        let big = sample(&[0xab; 100]).encode();
        for cut in [1, 5, SIG_LEN, 100] {
            assert_eq!(
                Envelope::decode(&big[..big.len() - cut]),
                Err(DecodeError::LengthMismatch),
                "truncated by {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Envelope::decode(&longer), Err(DecodeError::LengthMismatch));
        let mut magic = bytes.clone();
        magic[3] = b'2';
        assert_eq!(Envelope::decode(&magic), Err(DecodeError::BadMagic));
        let mut huge = bytes.clone();
        huge[93..97].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(Envelope::decode(&huge), Err(DecodeError::BlobTooLarge));
    }

    #[test]
    fn signature_verifies() {
        let env = sample(b"hello");
        assert_eq!(env.verify(), Ok(()));
        assert_eq!(env.previous_hop, key(0x33).verifying_key().to_bytes());
        let decoded = Envelope::decode(&env.encode()).expect("decodes");
        assert_eq!(decoded.verify(), Ok(()));
    }

    #[test]
    fn changed_field_fails_verification() {
        let env = sample(b"hello");
        let mut e = env.clone();
        e.ttl = 2;
        assert_eq!(e.verify(), Err(AuthError::InvalidSignature));
        let mut e = env.clone();
        e.timestamp += 1;
        assert_eq!(e.verify(), Err(AuthError::InvalidSignature));
        let mut e = env.clone();
        e.blob.push(0);
        assert_eq!(e.verify(), Err(AuthError::InvalidSignature));
        // Signed by someone else but claiming another previous hop.
        let mut e = env.clone();
        e.previous_hop = key(0x44).verifying_key().to_bytes();
        assert_eq!(e.verify(), Err(AuthError::InvalidSignature));
    }

    #[test]
    fn invalid_previous_hop_point() {
        let mut env = sample(b"hello");
        // y = 2 is not the y coordinate of any point on edwards25519.
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2;
        assert!(VerifyingKey::from_bytes(&not_a_point).is_err());
        env.previous_hop = not_a_point;
        assert_eq!(env.verify(), Err(AuthError::InvalidPreviousHop));
        // The identity point (y = 1) decodes but has small order: never a real identity.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        env.previous_hop = identity;
        assert_eq!(env.verify(), Err(AuthError::InvalidPreviousHop));
    }

    #[test]
    fn non_canonical_signature_is_rejected() {
        // s + L (the group order) verifies under lax checks but never under verify_strict.
        let mut env = sample(b"hello");
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut carry = 0u16;
        for (s, l) in env.signature[32..].iter_mut().zip(L) {
            let sum = u16::from(*s) + u16::from(l) + carry;
            *s = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(env.verify(), Err(AuthError::InvalidSignature));
    }

    #[test]
    fn request_digest_matches_definition() {
        let env = sample(b"hello");
        let mut hasher = Sha256::new();
        hasher.update(b"blindrelay/request/v1");
        hasher.update(env.encode());
        let expected: [u8; 32] = hasher.finalize().into();
        assert_eq!(env.request_digest(), expected);
        // Same frame again, same digest.
        assert_eq!(sample(b"hello").request_digest(), expected);
    }

    #[test]
    fn debug_does_not_print_ids_or_blob() {
        let env = sample(b"hello");
        let text = format!("{env:?}");
        assert!(!text.contains(&hex::encode(env.next_hop)));
        assert!(!text.contains(&hex::encode(env.previous_hop)));
        assert!(!text.contains("route_id"));
        assert!(text.contains(&hex::encode(&env.next_hop[..4])));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Envelope::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_framed_garbage(
            body in proptest::collection::vec(any::<u8>(), HEADER_LEN..HEADER_LEN + 300),
            n in 0u32..400,
        ) {
            let mut bytes = body;
            bytes[..4].copy_from_slice(&MAGIC);
            bytes[93..97].copy_from_slice(&n.to_be_bytes());
            if let Ok(env) = Envelope::decode(&bytes) {
                prop_assert_eq!(env.blob.len(), n as usize);
                prop_assert_eq!(env.encode(), bytes);
            }
        }

        #[test]
        fn round_trip_any(
            route_id in any::<[u8; 16]>(),
            next_hop in any::<[u8; 32]>(),
            ttl in any::<u8>(),
            timestamp in any::<u64>(),
            blob in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let env = Envelope::sign(route_id, next_hop, ttl, timestamp, blob, &key(9));
            prop_assert_eq!(Envelope::decode(&env.encode()), Ok(env.clone()));
            prop_assert_eq!(env.verify(), Ok(()));
        }

        /// Flipping any bit of any signed byte (everything but magic and signature, of the wire
        /// form) or of the signature makes the frame fail to decode or fail to verify.
        #[test]
        fn any_flipped_byte_fails(index in 4usize..HEADER_LEN + 5 + SIG_LEN, bit in 0u8..8) {
            let mut bytes = sample(b"hello").encode();
            bytes[index] ^= 1 << bit;
            match Envelope::decode(&bytes) {
                Err(_) => prop_assert!((93..97).contains(&index), "only the length breaks framing"),
                Ok(env) => prop_assert!(env.verify().is_err()),
            }
        }

        /// Any single changed byte of the wire form gives another request digest.
        #[test]
        fn request_digest_changes_with_any_byte(index in 0usize..HEADER_LEN + 5 + SIG_LEN, bit in 0u8..8) {
            let env = sample(b"hello");
            let mut bytes = env.encode();
            bytes[index] ^= 1 << bit;
            if let Ok(changed) = Envelope::decode(&bytes) {
                prop_assert_ne!(changed.request_digest(), env.request_digest());
            }
        }
    }
}
