//! Delivery receipts: the terminal's signed statement that it stored a payload, sealed so only
//! the sender can read it.
//!
//! ```text
//! signed    = "blindrelay/receipt/v2" ‖ message_id(16) ‖ commitment(32) ‖ terminal_id(32)
//!             ‖ delivered_at(u64 BE)
//! receipt   = message_id ‖ commitment ‖ terminal_id ‖ delivered_at ‖ signature(64)  (152 bytes)
//! sealed    = nonce(24) ‖ XChaCha20-Poly1305(receipt_key, nonce, receipt,
//!                                            aad = "blindrelay/receipt-seal/v1")
//! commitment = SHA-256("blindrelay/payload/v1" ‖ payload)
//! ```
//!
//! `message_id` is the sender's id of the message, sealed in the terminal's layer: only the
//! sender and the terminal know it. It is the same on every route the sender tries for the
//! message, so the receipt of a copy that arrived first verifies for a copy sent again.
//!
//! Middle hops pass the sealed bytes back untouched. The sender opens them with the route's
//! receipt key and checks every field: only the sender ever sees a receipt, so errors say exactly
//! what failed.

use std::fmt;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::{MessageId, NodeId, Prefix};

/// Length of [`Receipt::to_bytes`].
pub const RECEIPT_LEN: usize = 16 + 32 + 32 + 8 + 64;
/// A receipt older than this many seconds is stale.
pub const RECEIPT_MAX_AGE: u64 = 120;
/// A receipt dated more than this many seconds ahead of the verifier's clock is rejected.
pub const RECEIPT_MAX_SKEW: u64 = 30;

const SIGN_DOMAIN: &[u8] = b"blindrelay/receipt/v2";
const PAYLOAD_DOMAIN: &[u8] = b"blindrelay/payload/v1";
const SEAL_AAD: &[u8] = b"blindrelay/receipt-seal/v1";
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;

/// SHA-256(`blindrelay/payload/v1` ‖ payload): what a receipt commits to.
pub fn commitment(payload: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(PAYLOAD_DOMAIN);
    hasher.update(payload);
    hasher.finalize().into()
}

/// A terminal's signed delivery receipt.
#[derive(Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The sender's id of the message.
    pub message_id: MessageId,
    /// [`commitment`] of the delivered payload.
    pub commitment: [u8; 32],
    /// The terminal's node id, which signed the receipt.
    pub terminal_id: NodeId,
    /// Unix seconds at which the payload was committed to the inbox.
    pub delivered_at: u64,
    /// Ed25519 signature by `terminal_id`.
    pub signature: [u8; 64],
}

/// Why a receipt is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// The sealed bytes do not open under the receipt key (short, tampered, or another key).
    #[error("receipt does not open")]
    Sealed,
    /// The opened receipt is not 152 bytes.
    #[error("receipt malformed")]
    Malformed,
    /// The receipt names another message.
    #[error("receipt for another message")]
    WrongMessage,
    /// The receipt commits to another payload.
    #[error("receipt for another payload")]
    WrongPayload,
    /// The receipt names another terminal.
    #[error("receipt from another terminal")]
    WrongTerminal,
    /// The signature does not verify under the terminal id.
    #[error("receipt signature invalid")]
    BadSignature,
    /// Delivered more than [`RECEIPT_MAX_AGE`] seconds ago.
    #[error("receipt stale")]
    Stale,
    /// Dated more than [`RECEIPT_MAX_SKEW`] seconds in the future.
    #[error("receipt from the future")]
    FromTheFuture,
}

impl Receipt {
    /// Signs a receipt as the terminal `key` for a payload delivered at `delivered_at`.
    pub fn sign(
        message_id: MessageId,
        commitment: [u8; 32],
        key: &SigningKey,
        delivered_at: u64,
    ) -> Receipt {
        let mut receipt = Receipt {
            message_id,
            commitment,
            terminal_id: key.verifying_key().to_bytes(),
            delivered_at,
            signature: [0; 64],
        };
        receipt.signature = key.sign(&receipt.signing_bytes()).to_bytes();
        receipt
    }

    /// What the terminal signs: the domain and every field but the signature.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIGN_DOMAIN.len() + RECEIPT_LEN - 64);
        out.extend_from_slice(SIGN_DOMAIN);
        out.extend_from_slice(&self.to_bytes()[..RECEIPT_LEN - 64]);
        out
    }

    /// `message_id ‖ commitment ‖ terminal_id ‖ delivered_at ‖ signature`, 152 bytes.
    pub fn to_bytes(&self) -> [u8; RECEIPT_LEN] {
        let mut out = [0u8; RECEIPT_LEN];
        out[0..16].copy_from_slice(&self.message_id);
        out[16..48].copy_from_slice(&self.commitment);
        out[48..80].copy_from_slice(&self.terminal_id);
        out[80..88].copy_from_slice(&self.delivered_at.to_be_bytes());
        out[88..].copy_from_slice(&self.signature);
        out
    }

    /// Parses [`Receipt::to_bytes`].
    ///
    /// # Errors
    /// [`ReceiptError::Malformed`] unless `bytes` is exactly 152 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Receipt, ReceiptError> {
        let bytes: &[u8; RECEIPT_LEN] = bytes.try_into().map_err(|_| ReceiptError::Malformed)?;
        let mut receipt = Receipt {
            message_id: [0; 16],
            commitment: [0; 32],
            terminal_id: [0; 32],
            delivered_at: 0,
            signature: [0; 64],
        };
        receipt.message_id.copy_from_slice(&bytes[0..16]);
        receipt.commitment.copy_from_slice(&bytes[16..48]);
        receipt.terminal_id.copy_from_slice(&bytes[48..80]);
        let mut at = [0u8; 8];
        at.copy_from_slice(&bytes[80..88]);
        receipt.delivered_at = u64::from_be_bytes(at);
        receipt.signature.copy_from_slice(&bytes[88..]);
        Ok(receipt)
    }

    /// Checks the receipt against what the sender expects, then the signature, then freshness:
    /// `now − RECEIPT_MAX_AGE ≤ delivered_at ≤ now + RECEIPT_MAX_SKEW`.
    ///
    /// # Errors
    /// The first [`ReceiptError`] that applies, in that order.
    pub fn verify(
        &self,
        message_id: &MessageId,
        commitment: &[u8; 32],
        terminal_id: &NodeId,
        now: u64,
    ) -> Result<(), ReceiptError> {
        if &self.message_id != message_id {
            return Err(ReceiptError::WrongMessage);
        }
        if &self.commitment != commitment {
            return Err(ReceiptError::WrongPayload);
        }
        if &self.terminal_id != terminal_id {
            return Err(ReceiptError::WrongTerminal);
        }
        let key = VerifyingKey::from_bytes(terminal_id).map_err(|_| ReceiptError::BadSignature)?;
        if key.is_weak() {
            return Err(ReceiptError::BadSignature);
        }
        key.verify_strict(
            &self.signing_bytes(),
            &Signature::from_bytes(&self.signature),
        )
        .map_err(|_| ReceiptError::BadSignature)?;
        if self.delivered_at < now.saturating_sub(RECEIPT_MAX_AGE) {
            return Err(ReceiptError::Stale);
        }
        if self.delivered_at > now.saturating_add(RECEIPT_MAX_SKEW) {
            return Err(ReceiptError::FromTheFuture);
        }
        Ok(())
    }
}

/// Prints the terminal's prefix and the time only.
impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("terminal_id", &Prefix(&self.terminal_id))
            .field("delivered_at", &self.delivered_at)
            .finish_non_exhaustive()
    }
}

/// Seals `receipt` to the sender: `nonce(24) ‖ XChaCha20-Poly1305(receipt_key, …)`, 192 bytes.
pub fn seal(receipt: &Receipt, receipt_key: &[u8; 32]) -> Vec<u8> {
    seal_with(rand::random(), receipt, receipt_key)
}

fn seal_with(nonce: [u8; NONCE_LEN], receipt: &Receipt, receipt_key: &[u8; 32]) -> Vec<u8> {
    let sealed = XChaCha20Poly1305::new(receipt_key.into())
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: &receipt.to_bytes(),
                aad: SEAL_AAD,
            },
        )
        .expect("invariant: XChaCha20-Poly1305 encrypts a 152-byte message");
    let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    out
}

/// Opens a sealed receipt. The result still has to be [`Receipt::verify`]ed.
///
/// # Errors
/// [`ReceiptError::Sealed`] if it does not open under `receipt_key`;
/// [`ReceiptError::Malformed`] if what it holds is not a receipt.
pub fn open(sealed: &[u8], receipt_key: &[u8; 32]) -> Result<Receipt, ReceiptError> {
    if sealed.len() < NONCE_LEN + TAG_LEN {
        return Err(ReceiptError::Sealed);
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    let plaintext = XChaCha20Poly1305::new(receipt_key.into())
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: SEAL_AAD,
            },
        )
        .map_err(|_| ReceiptError::Sealed)?;
    Receipt::from_bytes(&plaintext)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_450_000;

    fn terminal() -> SigningKey {
        SigningKey::from_bytes(&[0x22; 32])
    }

    fn sample() -> Receipt {
        Receipt::sign([0x11; 16], commitment(b"hello"), &terminal(), NOW)
    }

    fn check(r: &Receipt, now: u64) -> Result<(), ReceiptError> {
        r.verify(
            &[0x11; 16],
            &commitment(b"hello"),
            &terminal().verifying_key().to_bytes(),
            now,
        )
    }

    #[test]
    fn commitment_is_domain_separated() {
        let mut hasher = Sha256::new();
        hasher.update(b"blindrelay/payload/v1hello");
        let expected: [u8; 32] = hasher.finalize().into();
        assert_eq!(commitment(b"hello"), expected);
        assert_ne!(commitment(b"hello"), commitment(b"hellp"));
    }

    #[test]
    fn sign_seal_open_verify() {
        let r = sample();
        assert_eq!(r.terminal_id, terminal().verifying_key().to_bytes());
        let key = [0x77; 32];
        let sealed = seal(&r, &key);
        assert_eq!(sealed.len(), 24 + RECEIPT_LEN + 16);
        let opened = open(&sealed, &key).expect("opens");
        assert_eq!(opened, r);
        assert_eq!(check(&opened, NOW), Ok(()));
        assert_ne!(seal(&r, &key), sealed, "fresh nonce");
    }

    #[test]
    fn bytes_round_trip() {
        let r = sample();
        let bytes = r.to_bytes();
        assert_eq!(Receipt::from_bytes(&bytes), Ok(r.clone()));
        assert_eq!(
            Receipt::from_bytes(&bytes[1..]),
            Err(ReceiptError::Malformed)
        );
        assert_eq!(
            Receipt::from_bytes(&[&bytes[..], &[0]].concat()),
            Err(ReceiptError::Malformed)
        );
        assert_eq!(
            &r.signing_bytes()[..],
            &[&b"blindrelay/receipt/v2"[..], &bytes[..88]].concat()[..]
        );
    }

    #[test]
    fn wrong_key_and_tampering_fail_to_open() {
        let r = sample();
        let key = [0x77; 32];
        let sealed = seal(&r, &key);
        assert_eq!(open(&sealed, &[0x78; 32]), Err(ReceiptError::Sealed));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert_eq!(open(&bad, &key), Err(ReceiptError::Sealed), "byte {i}");
        }
        assert_eq!(
            open(&sealed[..sealed.len() - 1], &key),
            Err(ReceiptError::Sealed)
        );
        assert_eq!(open(&sealed[..39], &key), Err(ReceiptError::Sealed));
        assert_eq!(open(&[], &key), Err(ReceiptError::Sealed));
    }

    #[test]
    fn sealed_non_receipt_is_malformed() {
        let key = [0x77; 32];
        let sealed = XChaCha20Poly1305::new((&key).into())
            .encrypt(
                XNonce::from_slice(&[0; 24]),
                Payload {
                    msg: &[0u8; 151],
                    aad: SEAL_AAD,
                },
            )
            .expect("encrypts");
        let sealed = [&[0u8; 24][..], &sealed].concat();
        assert_eq!(open(&sealed, &key), Err(ReceiptError::Malformed));
    }

    #[test]
    fn wrong_fields_fail() {
        let r = sample();
        let tid = terminal().verifying_key().to_bytes();
        let c = commitment(b"hello");
        assert_eq!(
            r.verify(&[0x12; 16], &c, &tid, NOW),
            Err(ReceiptError::WrongMessage)
        );
        assert_eq!(
            r.verify(&[0x11; 16], &commitment(b"hellO"), &tid, NOW),
            Err(ReceiptError::WrongPayload)
        );
        let other = SigningKey::from_bytes(&[0x23; 32])
            .verifying_key()
            .to_bytes();
        assert_eq!(
            r.verify(&[0x11; 16], &c, &other, NOW),
            Err(ReceiptError::WrongTerminal)
        );
        // A receipt whose fields were changed after signing.
        let mut forged = r.clone();
        forged.delivered_at += 1;
        assert_eq!(check(&forged, NOW), Err(ReceiptError::BadSignature));
        let mut forged = r.clone();
        forged.signature[0] ^= 1;
        assert_eq!(check(&forged, NOW), Err(ReceiptError::BadSignature));
        // Signed by another key but claiming the expected terminal.
        let mut forged = Receipt::sign([0x11; 16], c, &SigningKey::from_bytes(&[0x23; 32]), NOW);
        forged.terminal_id = tid;
        assert_eq!(check(&forged, NOW), Err(ReceiptError::BadSignature));
    }

    #[test]
    fn freshness_window() {
        let r = sample();
        assert_eq!(check(&r, NOW + 120), Ok(()));
        assert_eq!(check(&r, NOW + 121), Err(ReceiptError::Stale));
        assert_eq!(check(&r, NOW - 30), Ok(()));
        assert_eq!(check(&r, NOW - 31), Err(ReceiptError::FromTheFuture));
        // Extremes do not overflow.
        let early = Receipt::sign([0x11; 16], commitment(b"hello"), &terminal(), 0);
        assert_eq!(check(&early, 0), Ok(()));
        assert_eq!(check(&early, 121), Err(ReceiptError::Stale));
        let late = Receipt::sign([0x11; 16], commitment(b"hello"), &terminal(), u64::MAX);
        assert_eq!(check(&late, u64::MAX), Ok(()));
        assert_eq!(
            check(&late, u64::MAX - 31),
            Err(ReceiptError::FromTheFuture)
        );
    }

    #[test]
    fn seal_layout() {
        let r = sample();
        let key = [0x77; 32];
        let sealed = seal_with([0x24; 24], &r, &key);
        assert_eq!(sealed[..24], [0x24; 24]);
        assert_eq!(open(&sealed, &key), Ok(r));
    }
}
