//! The previous hop and the frame (design step 3), on the way in before admission.
//!
//! The previous hop is the link's client, authenticated by mutual TLS (`crate::links`): its
//! TLS 1.3 `CertificateVerify` was checked with the key of its certificate, once for the whole
//! link. A link whose client presented no certificate cannot post a frame
//! (`invalid_previous_hop`, blamed on nobody: there is nobody to blame).
//!
//! The frame's framing is the cheap check run before the gate admits a request ([`frame`]): the
//! body must be one v2 packet ([`crate::proto::frame`]) of a known class and exactly its
//! class's length, checked before anything is copied. A v1 envelope (`BRE1…`) is refused as
//! `v1_not_accepted`, never scored; any other framing fault (`malformed_envelope`) is the
//! authenticated previous hop's own doing and scored against it.

use crate::proto::NodeId;
use crate::proto::frame::Frame;
use crate::proto::sphinx::FramingError;
use crate::reason::Reason;

/// The frame in `body` from the link's client `link` (none: it presented no certificate): the
/// cheap check, run before the request gate admits it.
///
/// # Errors
/// `invalid_previous_hop`, `v1_not_accepted` or `malformed_envelope`.
pub(super) fn frame(body: &[u8], link: Option<NodeId>) -> Result<Frame, Reason> {
    let previous_hop = link.ok_or(Reason::InvalidPreviousHop)?;
    Frame::decode(body, previous_hop).map_err(|e| match e {
        FramingError::V1Envelope => Reason::V1NotAccepted,
        _ => Reason::MalformedEnvelope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::sphinx::SizeClass;

    #[test]
    fn framing_only() {
        let mut packet = vec![0u8; SizeClass::Small.packet_len()];
        packet[0] = crate::proto::sphinx::VERSION;
        let from = [1; 32];
        let framed = Frame::new(packet.clone(), from).unwrap();
        assert_eq!(frame(&packet, Some(from)), Ok(framed));
        assert_eq!(frame(&packet, None), Err(Reason::InvalidPreviousHop));
        assert_eq!(
            frame(b"not a frame", Some(from)),
            Err(Reason::MalformedEnvelope)
        );
        assert_eq!(
            frame(b"BRE1\x00\x00", Some(from)),
            Err(Reason::V1NotAccepted)
        );
        let mut long = packet;
        long.push(0);
        assert_eq!(frame(&long, Some(from)), Err(Reason::MalformedEnvelope));
    }
}
