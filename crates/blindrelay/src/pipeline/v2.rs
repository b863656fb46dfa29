//! Steps 3–7 for a v2 frame ([`crate::proto::frame`]), as one CPU-only function run on a crypto
//! slot: the previous hop's signature (3), the previous-hop guard (4, passed in), the self-loop
//! (6), the layer peeled in place, its expiry (5), the next hop from the slot and the route loop
//! (7), and the replay tag and request digest the reservation is keyed by.
//! [`super::Pipeline`] then looks the next hop up ([`super::route`]) and reserves with
//! [`crate::replay::ReplayRegistry::reserve_through`] keyed by [`HopChecked::tag`] through
//! [`HopChecked::keep_through`].
//!
//! A layer past its expiry is `timestamp_expired`, one dated too far ahead
//! `timestamp_in_future`: the sender sealed both inside the layer, so neither is blamed on the
//! previous hop, which cannot read the expiry.

use x25519_dalek::StaticSecret;

use crate::proto::frame::Frame;
use crate::proto::sphinx::{self, HEADER_LEN, ReplayTag, Slot};
use crate::proto::{AuthError, NodeId};
use crate::reason::Reason;
use crate::replay::Digest;

/// What this hop does with a checked v2 frame.
#[derive(Debug)]
pub enum HopNext {
    /// Frame `packet` (the peeled packet, same length) and post it to `next_hop`.
    Forward {
        /// The next hop, from this hop's slot.
        next_hop: NodeId,
        /// The next hop's packet.
        packet: Vec<u8>,
    },
    /// Deliver `payload` (unless a probe) and seal the receipt with `receipt_key`.
    Terminal {
        /// The sender's payload.
        payload: Vec<u8>,
        /// A synthetic probe: answered, not stored.
        probe: bool,
        /// The sender's receipt key.
        receipt_key: [u8; 32],
    },
}

/// A v2 frame that passed steps 3–7 up to the reservation.
#[derive(Debug)]
pub struct HopChecked {
    /// The authenticated previous hop.
    pub prev: NodeId,
    /// The layer's replay tag: the reservation's key, whatever frame carries the layer.
    pub tag: ReplayTag,
    /// SHA-256 of previous hop and packet: a retry of the same frame has the same digest.
    pub digest: Digest,
    /// The layer's expiry (Unix seconds).
    pub expires_at: u64,
    /// Keep the tag reserved through this second: `expires_at` + [`sphinx::EXPIRY_SKEW`], after
    /// which the layer is refused anyway.
    pub keep_through: u64,
    /// Step 8.
    pub next: HopNext,
}

/// Steps 3–7 for `frame` at node `me` holding `secrets` (current onion key first), at `now`.
/// `prev` is set once the previous hop is authenticated, so a refusal after it can be blamed;
/// `guard` (step 4) is asked about it before any other work.
///
/// # Errors
/// `invalid_previous_hop`, `invalid_signature`, the guard's refusal, `self_loop`,
/// `onion_peel_failed`, `timestamp_expired`, `timestamp_in_future` or `route_loop`.
pub fn check(
    me: &NodeId,
    secrets: &[&StaticSecret],
    frame: Frame,
    now: u64,
    prev: &mut Option<NodeId>,
    guard: impl FnOnce(&NodeId) -> Result<(), Reason>,
) -> Result<HopChecked, Reason> {
    frame.verify(me).map_err(|e| match e {
        AuthError::InvalidPreviousHop => Reason::InvalidPreviousHop,
        AuthError::InvalidSignature => Reason::InvalidSignature,
    })?;
    *prev = Some(frame.previous_hop);
    guard(&frame.previous_hop)?;
    if frame.previous_hop == *me {
        return Err(Reason::SelfLoop);
    }
    let digest = frame.request_digest();
    let from = frame.previous_hop;
    let mut packet = frame.packet;
    let peeled =
        sphinx::peel_in_place(secrets, &mut packet).map_err(|_| Reason::OnionPeelFailed)?;
    let expires_at = match peeled.slot {
        Slot::Forward { expires_at, .. } | Slot::Terminal { expires_at, .. } => expires_at,
    };
    if !sphinx::expiry_acceptable(expires_at, now) {
        return Err(if expires_at < now {
            Reason::TimestampExpired
        } else {
            Reason::TimestampInFuture
        });
    }
    let next = match peeled.slot {
        Slot::Forward { next_hop, .. } => {
            if next_hop == from || next_hop == *me {
                return Err(Reason::RouteLoop);
            }
            HopNext::Forward { next_hop, packet }
        }
        Slot::Terminal {
            probe,
            payload_len,
            receipt_key,
            ..
        } => {
            let end = HEADER_LEN.saturating_add(payload_len as usize);
            let payload = packet.get(HEADER_LEN..end).ok_or(Reason::OnionPeelFailed)?;
            HopNext::Terminal {
                payload: payload.to_vec(),
                probe,
                receipt_key,
            }
        }
    };
    Ok(HopChecked {
        prev: from,
        tag: peeled.replay_tag,
        digest,
        expires_at,
        keep_through: expires_at.saturating_add(sphinx::EXPIRY_SKEW),
        next,
    })
}

#[cfg(test)]
mod tests;
