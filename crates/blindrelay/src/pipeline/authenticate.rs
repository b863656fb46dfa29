//! Step 3, authenticate: the body must be one well-framed envelope (its blob at most
//! [`MAX_BLOB`](crate::proto::envelope::MAX_BLOB), checked on the length field before anything
//! is copied: [`frame`], one of the cheap checks run before step 1 admits the request), signed
//! by its previous hop (`verify_strict`: [`verify`], on a crypto slot). A failure here is counted but never
//! charged to the identity the frame claims: forged frames cannot quarantine an honest node.

use crate::proto::envelope::{AuthError, DecodeError, Envelope};
use crate::reason::Reason;

/// The envelope framed in `body`: the cheap check, run before the request gate admits it.
///
/// # Errors
/// `envelope_too_large` or `malformed_envelope`.
pub(super) fn frame(body: &[u8]) -> Result<Envelope, Reason> {
    Envelope::decode(body).map_err(|e| match e {
        DecodeError::BlobTooLarge => Reason::EnvelopeTooLarge,
        DecodeError::TooShort | DecodeError::BadMagic | DecodeError::LengthMismatch => {
            Reason::MalformedEnvelope
        }
    })
}

/// The previous hop's signature of a framed envelope.
///
/// # Errors
/// `invalid_previous_hop` or `invalid_signature`.
pub(super) fn verify(env: &Envelope) -> Result<(), Reason> {
    env.verify().map_err(|e| match e {
        AuthError::InvalidPreviousHop => Reason::InvalidPreviousHop,
        AuthError::InvalidSignature => Reason::InvalidSignature,
    })
}

/// [`frame`] then [`verify`].
///
/// # Errors
/// Theirs.
#[cfg(test)]
fn authenticate(body: &[u8]) -> Result<Envelope, Reason> {
    let env = frame(body)?;
    verify(&env)?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::proto::envelope::{HEADER_LEN, MAX_BLOB};

    #[test]
    fn framing_then_signature() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let env = Envelope::sign([2; 16], [3; 32], 1, 1000, vec![4; 40], &key);
        assert_eq!(authenticate(&env.encode()), Ok(env.clone()));
        assert_eq!(
            authenticate(b"not an envelope"),
            Err(Reason::MalformedEnvelope)
        );
        let mut tampered = env.encode();
        tampered[HEADER_LEN] ^= 1;
        assert_eq!(authenticate(&tampered), Err(Reason::InvalidSignature));
        let mut huge = env.encode();
        huge[93..97].copy_from_slice(&(MAX_BLOB as u32 + 1).to_be_bytes());
        assert_eq!(authenticate(&huge), Err(Reason::EnvelopeTooLarge));
        let mut bad_point = env;
        bad_point.previous_hop = (2u8..=255)
            .map(|y| {
                let mut b = [0u8; 32];
                b[0] = y;
                b
            })
            .find(|b| ed25519_dalek::VerifyingKey::from_bytes(b).is_err())
            .expect("some small y is not on the curve");
        assert_eq!(
            authenticate(&bad_point.encode()),
            Err(Reason::InvalidPreviousHop)
        );
    }
}
