//! Per-hop keys: everything a hop derives from its shared secret `s = X25519(onion_secret, alpha)`.
//!
//! ```text
//! prk   = HKDF-SHA256-Extract(salt = "blindrelay/sphinx/v2", ikm = s)
//! rho   = Expand(prk, "rho", 32)            header keystream key (ChaCha20, nonce 0)
//! mu    = Expand(prk, "mu", 32)             payload key (ChaCha20-Poly1305, nonce 0)
//! blind = Expand(prk, "blind" ‖ alpha, 32)  blinding scalar (clamped by X25519)
//! tag   = Expand(prk, "replay", 16)         replay tag
//! report = Expand(prk, "report", 32)        failure report key (seal, and mask on the way back)
//! ```
//!
//! Every key is used for exactly one packet at one hop (alpha is fresh per packet and blinded
//! per hop), so the fixed zero nonces never repeat under one key except for a replay of the
//! very same layer, which the replay tag refuses.

use chacha20::ChaCha20;
use chacha20::cipher::{KeyIvInit, StreamCipher};
use curve25519_dalek::edwards::EdwardsPoint;
use curve25519_dalek::montgomery::MontgomeryPoint;
use curve25519_dalek::scalar::{Scalar, clamp_integer};
use curve25519_dalek::traits::IsIdentity;
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::{ALPHA_LEN, BETA_LEN, ReplayTag, SLOT_LEN, TAG_LEN};

/// The HKDF salt of v2.
pub const SALT: &[u8] = b"blindrelay/sphinx/v2";
/// Length of the header keystream: beta plus one slot (what a hop shifts in).
pub const STREAM_LEN: usize = BETA_LEN + SLOT_LEN;

/// The keys one hop derives for one layer.
pub struct HopKeys {
    /// Header keystream key.
    pub rho: [u8; 32],
    /// Payload AEAD key; its tag is the layer's MAC.
    pub mu: [u8; 32],
    /// The blinding scalar for the next hop's alpha.
    pub blind: [u8; 32],
    /// The replay tag.
    pub tag: ReplayTag,
    /// The failure report key ([`super::report`]).
    pub report: [u8; 32],
}

/// Never prints key material.
impl std::fmt::Debug for HopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HopKeys").finish_non_exhaustive()
    }
}

impl HopKeys {
    /// Derives a hop's keys from its shared secret and the alpha it received.
    pub fn derive(shared: &[u8; 32], alpha: &[u8; ALPHA_LEN]) -> HopKeys {
        let hk = Hkdf::<Sha256>::new(Some(SALT), shared);
        let mut keys = HopKeys {
            rho: [0; 32],
            mu: [0; 32],
            blind: [0; 32],
            tag: [0; TAG_LEN],
            report: [0; 32],
        };
        let expand = "invariant: HKDF-SHA256 expands up to 8160 bytes";
        hk.expand(b"rho", &mut keys.rho).expect(expand);
        hk.expand(b"mu", &mut keys.mu).expect(expand);
        hk.expand_multi_info(&[b"blind", alpha], &mut keys.blind)
            .expect(expand);
        hk.expand(b"replay", &mut keys.tag).expect(expand);
        hk.expand(b"report", &mut keys.report).expect(expand);
        keys
    }

    /// The header keystream, [`STREAM_LEN`] bytes.
    pub fn header_stream(&self) -> [u8; STREAM_LEN] {
        let mut stream = [0u8; STREAM_LEN];
        xor_stream(&self.rho, &mut stream);
        stream
    }

    /// `X25519(blind, alpha)`: the next hop's alpha, `alpha` being this hop's.
    pub fn blind_alpha(&self, alpha: &Cleared) -> [u8; ALPHA_LEN] {
        alpha.x25519(&self.blind)
    }
}

/// XORs the ChaCha20 keystream of `key` (nonce 0, counter 0) into `buf`.
pub fn xor_stream(key: &[u8; 32], buf: &mut [u8]) {
    xor_stream_at(key, &[0u8; 12], buf);
}

/// XORs the ChaCha20 keystream of `key` under `nonce` (counter 0) into `buf`.
pub fn xor_stream_at(key: &[u8; 32], nonce: &[u8; 12], buf: &mut [u8]) {
    let mut cipher = ChaCha20::new(key.into(), nonce.into());
    cipher.apply_keystream(buf);
}

/// A point given by its X25519 u-coordinate, held on the Edwards form with its cofactor cleared
/// (`[8]P`): the products X25519 would give, by variable-base Edwards multiplications (the
/// vector backend of curve25519-dalek where the CPU has one) instead of Montgomery ladders.
/// One conversion (≈ 9 µs) serves every product of the point; each product costs ≈ 29 µs
/// against ≈ 38 µs for a ladder (`target/release/examples/sphinx`).
///
/// Why the products are X25519's: X25519 clamps every scalar to a multiple of 8, so
/// `X25519(k, P) = u([clamp(k)]P) = u([clamp(k) / 8]·[8]P)`, and `[8]P` lies in the subgroup of
/// prime order ℓ, where a scalar counts modulo ℓ; `u(−Q) = u(Q)`, so either of the two points
/// with P's u-coordinate gives the same products. A u-coordinate with no point on the curve (one
/// of the twist, or `u = −1`) has no Edwards form: no honest sender or node ever makes one.
pub struct Cleared(EdwardsPoint);

/// Not secret (a public point), but nothing to read either.
impl std::fmt::Debug for Cleared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleared").finish_non_exhaustive()
    }
}

impl Cleared {
    /// The point of u-coordinate `u`, or `None` when there is none on the curve.
    pub fn new(u: &[u8; 32]) -> Option<Cleared> {
        MontgomeryPoint(*u)
            .to_edwards(0)
            .map(|p| Cleared(p.mul_by_cofactor()))
    }

    /// A small-order point: every product is all zeros, for every scalar.
    pub fn is_small_order(&self) -> bool {
        self.0.is_identity()
    }

    /// `X25519(scalar, u)`: `scalar` clamped, as X25519 does.
    pub fn x25519(&self, scalar: &[u8; 32]) -> [u8; 32] {
        let eighth = Zeroizing::new(eighth_of_clamped(scalar));
        self.times(&eighth)
    }

    /// `u([8s]P)`: the product by a scalar taken modulo ℓ, times the cofactor (what the
    /// sender's blinded secrets are: an X25519 scalar divided by 8, times the blinding
    /// scalars).
    pub fn times(&self, s: &Scalar) -> [u8; 32] {
        (self.0 * s).to_montgomery().to_bytes()
    }
}

/// `clamp(k) / 8` modulo ℓ: clamping clears the three low bits, so the division is exact.
pub fn eighth_of_clamped(k: &[u8; 32]) -> Scalar {
    let clamped = Zeroizing::new(clamp_integer(*k));
    let mut shifted = Zeroizing::new([0u8; 32]);
    for i in 0..32 {
        let high = clamped.get(i + 1).map_or(0, |b| b << 5);
        shifted[i] = (clamped[i] >> 3) | high;
    }
    Scalar::from_bytes_mod_order(*shifted)
}

#[cfg(test)]
mod tests {
    use curve25519_dalek::constants::{EIGHT_TORSION, X25519_BASEPOINT};
    use proptest::prelude::*;
    use x25519_dalek::{PublicKey, StaticSecret};

    use super::*;

    /// X25519 as x25519-dalek computes it: the Montgomery ladder.
    fn ladder(k: [u8; 32], u: [u8; 32]) -> [u8; 32] {
        StaticSecret::from(k)
            .diffie_hellman(&PublicKey::from(u))
            .to_bytes()
    }

    #[test]
    fn small_order_points_are_told_and_give_all_zeros() {
        for t in EIGHT_TORSION {
            let u = t.to_montgomery().to_bytes();
            // u = −1 (no Edwards form) is not among them; u = 0 and u = 1 are.
            let p = Cleared::new(&u).expect("a curve point");
            assert!(p.is_small_order());
            assert_eq!(p.x25519(&[0x42; 32]), [0; 32]);
            assert_eq!(ladder([0x42; 32], u), [0; 32]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// On points of the prime-order subgroup, on points with a small-order component
        /// (which clamping clears), and on any 32 bytes that name a curve point (the top bit
        /// ignored, non-canonical encodings included), the product is X25519's.
        #[test]
        fn products_are_x25519s(
            k in any::<[u8; 32]>(),
            s in any::<[u8; 32]>(),
            torsion in 0usize..8,
            raw in any::<[u8; 32]>(),
        ) {
            let prime = (X25519_BASEPOINT * Scalar::from_bytes_mod_order(s)).to_bytes();
            let mixed = (Cleared::new(&prime).expect("a curve point").0.mul_by_cofactor()
                + EIGHT_TORSION[torsion])
                .to_montgomery()
                .to_bytes();
            for u in [prime, mixed] {
                let p = Cleared::new(&u).expect("a curve point");
                prop_assert_eq!(p.x25519(&k), ladder(k, u));
            }
            // A point of the twist (no `Cleared`): the ladder gives a value no honest peer
            // shares.
            if let Some(p) = Cleared::new(&raw) {
                prop_assert_eq!(p.x25519(&k), ladder(k, raw));
            }
        }

        /// The sender's form: `times(clamp(x)/8 · b)` is `[b]·X25519(x, K)` by the ladder.
        #[test]
        fn a_product_by_blinds_is_the_ladders(x in any::<[u8; 32]>(), b in any::<[u8; 32]>(),
            s in any::<[u8; 32]>(), torsion in 0usize..8) {
            let prime = X25519_BASEPOINT * Scalar::from_bytes_mod_order(s);
            let k = (Cleared::new(&prime.to_bytes()).expect("a curve point").0
                + EIGHT_TORSION[torsion])
                .to_montgomery()
                .to_bytes();
            let b = Scalar::from_bytes_mod_order(b);
            let two_ladders = (MontgomeryPoint(ladder(x, k)) * b).to_bytes();
            let p = Cleared::new(&k).expect("a curve point");
            prop_assert_eq!(p.times(&(eighth_of_clamped(&x) * b)), two_ladders);
        }
    }
}
