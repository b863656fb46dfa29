//! Failure reports: how the sender of a route learns which hop's next hop failed, while no hop
//! learns anything of the route.
//!
//! A hop whose next hop did not answer, or refused, seals a [`REPORT_LEN`]-byte report under the
//! `report` key of its layer ([`super::keys::HopKeys::report`]) and sends it back in its refusal;
//! every hop on the way back masks it with its own key's stream. The sender, who knows every
//! hop's key, unmasks layer by layer until one opens: the hop whose key opens it wrote it, and
//! the failed hop is the one after it.
//!
//! ```text
//! body   = kind(1) ‖ status u16 ‖ reason_len(1) ‖ reason (ASCII) ‖ zero bytes, 32 bytes
//!          kind 1: the next hop did not answer (status 0, no reason)
//!          kind 2: the next hop refused with `status` and `reason` (its JSON error code)
//! sealed = ChaCha20-Poly1305(report, nonce 0, body), 48 bytes, by the hop that saw the failure
//! masked = sealed XOR ChaCha20(report, nonce 1)[0..48], by each hop it passes on the way back
//! ```
//!
//! A report has one length at every hop and no byte of it is the same at two hops, so a link
//! observer or a hop cannot tell how far back the failure was. A hop can garble a report
//! passing through it (none then opens), or lie about its own next hop; the sender then knows
//! only that the failure was past the entry hop, or blames the pair (see `crate::send`).

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};

use super::keys::xor_stream_at;

/// Length of a report on the wire.
pub const REPORT_LEN: usize = BODY_LEN + 16;
/// Length of a report's body.
const BODY_LEN: usize = 32;
/// The longest reason a report carries.
pub const MAX_REASON: usize = BODY_LEN - 4;
const KIND_UNREACHABLE: u8 = 1;
const KIND_REFUSED: u8 = 2;
/// The nonce of the masking stream (the seal uses nonce 0).
const MASK_NONCE: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A report on the wire: sealed, then masked once per hop it passed.
pub type Report = [u8; REPORT_LEN];

/// What a hop reports of its next hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No answer within the hop's deadline, after its retries.
    Unreachable,
    /// A definitive refusal.
    Refused {
        /// The HTTP status of the refusal.
        status: u16,
        /// Its JSON error code, if any (at most [`MAX_REASON`] bytes of ASCII).
        reason: Option<String>,
    },
}

/// Seals `failure` under `key` (the reporting hop's report key).
pub fn seal(key: &[u8; 32], failure: &Failure) -> Report {
    let mut body = [0u8; BODY_LEN];
    match failure {
        Failure::Unreachable => body[0] = KIND_UNREACHABLE,
        Failure::Refused { status, reason } => {
            body[0] = KIND_REFUSED;
            body[1..3].copy_from_slice(&status.to_be_bytes());
            let reason = reason
                .as_deref()
                .filter(|r| r.len() <= MAX_REASON && r.is_ascii())
                .unwrap_or("");
            body[3] = reason.len() as u8;
            body[4..4 + reason.len()].copy_from_slice(reason.as_bytes());
        }
    }
    let tag = ChaCha20Poly1305::new(key.into())
        .encrypt_in_place_detached(&Nonce::default(), &[], &mut body)
        .expect("invariant: 32 bytes are within ChaCha20-Poly1305's limit");
    let mut out = [0u8; REPORT_LEN];
    out[..BODY_LEN].copy_from_slice(&body);
    out[BODY_LEN..].copy_from_slice(&tag);
    out
}

/// Masks a report passing back through the hop whose report key is `key`.
pub fn mask(key: &[u8; 32], report: &mut Report) {
    xor_stream_at(key, &MASK_NONCE, report);
}

/// The sender's reading of `report` with the route's report keys, first hop first: the index
/// of the hop that wrote it and what it says, or `None` when no key opens it (a hop garbled it).
pub fn open(keys: &[[u8; 32]], report: &Report) -> Option<(usize, Failure)> {
    let mut r = *report;
    for (i, key) in keys.iter().enumerate() {
        if let Some(failure) = try_open(key, &r) {
            return Some((i, failure));
        }
        mask(key, &mut r);
    }
    None
}

fn try_open(key: &[u8; 32], report: &Report) -> Option<Failure> {
    let mut body = [0u8; BODY_LEN];
    body.copy_from_slice(&report[..BODY_LEN]);
    ChaCha20Poly1305::new(key.into())
        .decrypt_in_place_detached(
            &Nonce::default(),
            &[],
            &mut body,
            Tag::from_slice(&report[BODY_LEN..]),
        )
        .ok()?;
    match body[0] {
        KIND_UNREACHABLE => Some(Failure::Unreachable),
        KIND_REFUSED => {
            let len = usize::from(body[3]).min(MAX_REASON);
            let reason = std::str::from_utf8(&body[4..4 + len]).ok()?;
            Some(Failure::Refused {
                status: u16::from_be_bytes([body[1], body[2]]),
                reason: (!reason.is_empty()).then(|| reason.to_string()),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u8) -> Vec<[u8; 32]> {
        (1..=n).map(|i| [i; 32]).collect()
    }

    #[test]
    fn the_sender_finds_which_hop_wrote_it_and_no_two_hops_see_the_same_bytes() {
        let keys = keys(5);
        let failure = Failure::Refused {
            status: 429,
            reason: Some("next_hop_busy".into()),
        };
        for origin in 0..keys.len() {
            let mut r = seal(&keys[origin], &failure);
            let mut seen = vec![r];
            for key in keys[..origin].iter().rev() {
                mask(key, &mut r);
                seen.push(r);
            }
            assert_eq!(open(&keys, &r), Some((origin, failure.clone())));
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), origin + 1, "every hop back sees other bytes");
        }
        let r = seal(&keys[2], &Failure::Unreachable);
        let mut masked = r;
        mask(&keys[1], &mut masked);
        mask(&keys[0], &mut masked);
        assert_eq!(open(&keys, &masked), Some((2, Failure::Unreachable)));
    }

    #[test]
    fn a_garbled_report_opens_for_nobody() {
        let keys = keys(3);
        let mut r = seal(&keys[2], &Failure::Unreachable);
        mask(&keys[1], &mut r);
        r[7] ^= 1;
        mask(&keys[0], &mut r);
        assert_eq!(open(&keys, &r), None);
        assert_eq!(open(&keys, &[0u8; REPORT_LEN]), None);
    }

    #[test]
    fn a_reason_too_long_or_not_ascii_is_left_out() {
        let key = [9u8; 32];
        for reason in ["x".repeat(MAX_REASON + 1), "é".into()] {
            let r = seal(
                &key,
                &Failure::Refused {
                    status: 400,
                    reason: Some(reason),
                },
            );
            assert_eq!(
                open(&[key], &r),
                Some((
                    0,
                    Failure::Refused {
                        status: 400,
                        reason: None
                    }
                ))
            );
        }
    }
}
