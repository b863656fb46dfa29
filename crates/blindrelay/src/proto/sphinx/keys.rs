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
use hkdf::Hkdf;
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

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

    /// `X25519(blind, alpha)`: the next hop's alpha.
    pub fn blind_alpha(&self, alpha: &[u8; ALPHA_LEN]) -> [u8; ALPHA_LEN] {
        multiply(&self.blind, alpha)
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

/// `X25519(scalar, point)` (the scalar clamped, as X25519 does).
pub fn multiply(scalar: &[u8; 32], point: &[u8; 32]) -> [u8; 32] {
    StaticSecret::from(*scalar)
        .diffie_hellman(&PublicKey::from(*point))
        .to_bytes()
}

/// `X25519(scalar, point)`, or `None` when the result is all zeros (a small-order point, whose
/// product is the same for every scalar).
pub fn multiply_contributory(scalar: &StaticSecret, point: &[u8; 32]) -> Option<[u8; 32]> {
    let shared = scalar.diffie_hellman(&PublicKey::from(*point));
    shared.was_contributory().then(|| shared.to_bytes())
}
