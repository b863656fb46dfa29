//! Step 3: authenticate the signed previous hop and the frame.
//!
//! Its framing is the cheap check run before step 1 admits a request ([`frame`]): the body must
//! be one v2 frame ([`crate::proto::frame`]) of a known class and exactly its class's length,
//! checked before anything is copied. A v1 envelope (`BRE1…`) is refused as
//! `v1_not_accepted`, never scored.
//!
//! The previous hop's signature ([`previous_hop`]) is checked on a crypto slot; a failure there
//! is counted but never charged to the identity the frame claims: forged frames cannot
//! quarantine an honest node.

use crate::proto::frame::Frame;
use crate::proto::sphinx::FramingError;
use crate::proto::{AuthError, NodeId};
use crate::reason::Reason;

/// The frame in `body`: the cheap check, run before the request gate admits it.
///
/// # Errors
/// `v1_not_accepted` or `malformed_envelope`.
pub(super) fn frame(body: &[u8]) -> Result<Frame, Reason> {
    Frame::decode(body).map_err(|e| match e {
        FramingError::V1Envelope => Reason::V1NotAccepted,
        _ => Reason::MalformedEnvelope,
    })
}

/// The previous hop of `frame`, authenticated: its signature verifies, and the frame is
/// addressed to this node `me`.
///
/// # Errors
/// `invalid_previous_hop` or `invalid_signature`.
pub fn previous_hop(frame: &Frame, me: &NodeId) -> Result<NodeId, Reason> {
    frame.verify(me).map_err(|e| match e {
        AuthError::InvalidPreviousHop => Reason::InvalidPreviousHop,
        AuthError::InvalidSignature => Reason::InvalidSignature,
    })?;
    Ok(frame.previous_hop)
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::proto::sphinx::SizeClass;

    #[test]
    fn framing_only() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let mut packet = vec![0u8; SizeClass::Small.packet_len()];
        packet[0] = crate::proto::sphinx::VERSION;
        let framed = Frame::sign(packet, &key, &[2; 32]).unwrap();
        assert_eq!(frame(&framed.encode()), Ok(framed.clone()));
        assert_eq!(frame(b"not a frame"), Err(Reason::MalformedEnvelope));
        assert_eq!(frame(b"BRE1\x00\x00"), Err(Reason::V1NotAccepted));
        let mut long = framed.encode();
        long.push(0);
        assert_eq!(frame(&long), Err(Reason::MalformedEnvelope));
    }
}
