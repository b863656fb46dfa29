//! The sender's side of the onion: wrapping a payload for a path into the first hop's frame.
//! [`super::deliver_along`] calls [`wrap`] and checks the receipt against
//! [`Wrapped::terminal_tag`].
//!
//! - The class is the smallest that holds the payload ([`SizeClass::smallest_for`]); a probe is
//!   always [`SizeClass::Small`], the class of most messages, with the terminal slot's probe flag:
//!   no hop but the terminal can tell it from a message of the same class.
//! - Every layer expires at the same [`expiry`]: `now` + [`sphinx::MAX_LIFETIME`] rounded down to
//!   the minute, so the expiry a hop reads tells the send time to within a minute only.

use super::Hop;
use super::SendError;
use crate::proto::MessageId;
use crate::proto::sphinx::{self, Delivery, HopSpec, ReplayTag, SizeClass};

/// The first hop's frame of a wrapped payload, and what the sender keeps to check the receipt.
#[derive(Clone)]
pub struct Wrapped {
    /// The frame to post to the first hop (over a link that names this node).
    pub frame: Vec<u8>,
    /// The class of the packet.
    pub class: SizeClass,
    /// The key the terminal seals its receipt with.
    pub receipt_key: [u8; 32],
    /// The message id sealed in the terminal's layer: the receipt names it.
    pub message_id: MessageId,
    /// The terminal's replay tag (the entry hop's retry delays are spread by it).
    pub terminal_tag: ReplayTag,
    /// Every hop's failure report key, first hop first (to open a report).
    pub report_keys: Vec<[u8; 32]>,
}

/// Lengths and class only.
impl std::fmt::Debug for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wrapped")
            .field("class", &self.class)
            .field("frame_len", &self.frame.len())
            .finish_non_exhaustive()
    }
}

/// Every layer's expiry for a packet built at `now`: `now + MAX_LIFETIME`, rounded down to the
/// minute (so between 540 and 600 s ahead).
pub fn expiry(now: u64) -> u64 {
    now.saturating_add(sphinx::MAX_LIFETIME) / 60 * 60
}

/// The class a payload of `len` bytes travels in: a probe's is [`SizeClass::Small`].
pub fn class_for(len: usize, probe: bool) -> Option<SizeClass> {
    let class = SizeClass::smallest_for(len)?;
    match (probe, class) {
        (true, SizeClass::Small) | (false, _) => Some(class),
        (true, _) => None,
    }
}

/// Wraps `payload` for `path` (the last hop is the terminal) at `now`.
///
/// # Errors
/// [`SendError::NoHops`] for an empty path, [`SendError::TooLarge`] for a payload no class holds
/// (or a probe over the small class) or a path longer than [`sphinx::MAX_HOPS`].
pub fn wrap(path: &[Hop], payload: &[u8], probe: bool, now: u64) -> Result<Wrapped, SendError> {
    wrap_expiring(path, payload, probe, expiry(now))
}

/// [`wrap`] with every layer expiring at `expires_at` (tests and tools: a sender uses [`wrap`]).
///
/// # Errors
/// As [`wrap`].
pub fn wrap_expiring(
    path: &[Hop],
    payload: &[u8],
    probe: bool,
    expires_at: u64,
) -> Result<Wrapped, SendError> {
    let message_id = rand::random();
    wrap_message(path, payload, probe, message_id, expires_at)
}

/// [`wrap_expiring`] of the message `message_id`: a message sent again over another route
/// keeps its id, so the terminal stores it once.
///
/// # Errors
/// As [`wrap`].
pub fn wrap_message(
    path: &[Hop],
    payload: &[u8],
    probe: bool,
    message_id: MessageId,
    expires_at: u64,
) -> Result<Wrapped, SendError> {
    if path.is_empty() {
        return Err(SendError::NoHops);
    }
    let largest = SizeClass::Huge.capacity();
    let class = class_for(payload.len(), probe).ok_or(SendError::TooLarge(largest))?;
    let specs: Vec<HopSpec> = path
        .iter()
        .map(|h| HopSpec {
            node_id: h.node_id,
            onion_key: h.onion_key,
            expires_at,
        })
        .collect();
    let receipt_key: [u8; 32] = rand::random();
    let delivery = Delivery {
        payload,
        probe,
        receipt_key,
        message_id,
    };
    let built =
        sphinx::build(&specs, &delivery, class).map_err(|_| SendError::TooLarge(largest))?;
    let terminal_tag = *built.replay_tags.last().ok_or(SendError::NoHops)?;
    Ok(Wrapped {
        frame: built.packet,
        class,
        receipt_key,
        message_id,
        terminal_tag,
        report_keys: built.report_keys,
    })
}

#[cfg(test)]
mod tests {
    use x25519_dalek::{PublicKey, StaticSecret};

    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::pipeline::{HopNext, check_frame as check};
    use crate::proto::NodeId;
    use crate::proto::frame::Frame;
    use crate::proto::frame::frame_len;

    const NOW: u64 = 1_800_000_017;

    fn node(n: u8) -> (SigningKey, StaticSecret) {
        (
            SigningKey::from_bytes(&[n; 32]),
            StaticSecret::from([n; 32]),
        )
    }

    fn hop((sign, onion): &(SigningKey, StaticSecret)) -> Hop {
        Hop {
            node_id: sign.verifying_key().to_bytes(),
            onion_key: PublicKey::from(onion).to_bytes(),
        }
    }

    #[test]
    fn expiry_is_within_the_window_and_on_a_minute() {
        for now in [NOW, NOW + 43, 1_800_000_000] {
            let e = expiry(now);
            assert_eq!(e % 60, 0);
            assert!(e > now + sphinx::MAX_LIFETIME - 60 && e <= now + sphinx::MAX_LIFETIME);
            assert!(sphinx::expiry_acceptable(e, now));
        }
    }

    #[test]
    fn the_smallest_class_that_fits_and_probes_in_the_small_one() {
        assert_eq!(class_for(0, false), Some(SizeClass::Small));
        assert_eq!(class_for(2048, false), Some(SizeClass::Small));
        assert_eq!(class_for(2049, false), Some(SizeClass::Medium));
        assert_eq!(class_for(196_608, false), Some(SizeClass::Huge));
        assert_eq!(class_for(196_609, false), None);
        assert_eq!(class_for(35, true), Some(SizeClass::Small));
        assert_eq!(class_for(2049, true), None);
    }

    #[test]
    fn a_wrapped_payload_reaches_the_terminal_whose_tag_the_sender_kept() {
        let me = SigningKey::from_bytes(&[1; 32]).verifying_key().to_bytes();
        let nodes: Vec<_> = (20..23).map(node).collect();
        let path: Vec<Hop> = nodes.iter().map(hop).collect();
        for probe in [false, true] {
            let w = wrap(&path, b"hello", probe, NOW).expect("wraps");
            assert_eq!(w.frame.len(), frame_len(SizeClass::Small));
            let mut frame = Frame::decode(&w.frame, me).expect("a frame");
            for (i, (sign, onion)) in nodes.iter().enumerate() {
                let id: NodeId = sign.verifying_key().to_bytes();
                let c =
                    check(&id, &[onion], frame.clone(), NOW, &mut None, |_| Ok(())).expect("ok");
                assert_eq!(c.expires_at, expiry(NOW));
                match c.next {
                    HopNext::Forward { packet, .. } => {
                        let from = sign.verifying_key().to_bytes();
                        frame = Frame::new(packet, from).expect("frames");
                    }
                    HopNext::Terminal {
                        payload,
                        probe: flagged,
                        receipt_key,
                        message_id,
                    } => {
                        assert_eq!(i, 2);
                        assert_eq!(payload, b"hello");
                        assert_eq!(flagged, probe);
                        assert_eq!(receipt_key, w.receipt_key);
                        assert_eq!(message_id, w.message_id);
                        assert_eq!(c.tag, w.terminal_tag);
                        assert_eq!(c.report_key, w.report_keys[i]);
                    }
                }
            }
        }
    }

    #[test]
    fn refusals_before_the_wire() {
        let path = vec![hop(&node(20))];
        assert!(matches!(
            wrap(&[], b"x", false, NOW),
            Err(SendError::NoHops)
        ));
        assert!(matches!(
            wrap(&path, &vec![0; 196_609], false, NOW),
            Err(SendError::TooLarge(_))
        ));
        assert!(matches!(
            wrap(&path, &vec![0; 4000], true, NOW),
            Err(SendError::TooLarge(_))
        ));
        let long: Vec<Hop> = (30..39).map(|n| hop(&node(n))).collect();
        assert!(matches!(
            wrap(&long, b"x", false, NOW),
            Err(SendError::TooLarge(_))
        ));
    }
}
