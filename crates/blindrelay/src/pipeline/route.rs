//! The route (design step 7 up to the reservation): the route loop and the next hop's descriptor. (A v2 packet has
//! a fixed number of layer slots, so a route cannot outlive its hops: the TTL is the onion's.)
//!
//! - [`next`]: what the opened layer's slot says: forward to a next hop that is neither this
//!   node nor the previous hop (else `route_loop`), or deliver here.
//! - [`endpoint`]: a next hop needs a current v2 descriptor with an allowed endpoint.
//!
//! The replay reservation that ends the design's step 7 is [`super::reserve`]: it writes to disk, so it runs
//! after the crypto slot is given back.

use crate::context::Context;
use crate::peers::PeerError;
use crate::proto::NodeId;
use crate::proto::sphinx::{HEADER_LEN, Slot};
use crate::reason::Reason;

/// What this hop does with a checked frame.
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
        /// The sender's id of the message.
        message_id: crate::proto::MessageId,
    },
}

/// What `slot` tells node `me` to do with the peeled `packet` that came from `from`.
///
/// # Errors
/// `route_loop` (the next hop is this node or the previous hop), or `onion_peel_failed` (a
/// terminal payload length past the packet).
pub fn next(slot: Slot, packet: Vec<u8>, from: &NodeId, me: &NodeId) -> Result<HopNext, Reason> {
    match slot {
        Slot::Forward { next_hop, .. } => {
            if next_hop == *from || next_hop == *me {
                return Err(Reason::RouteLoop);
            }
            Ok(HopNext::Forward { next_hop, packet })
        }
        Slot::Terminal {
            probe,
            payload_len,
            receipt_key,
            message_id,
            ..
        } => {
            let end = HEADER_LEN.saturating_add(payload_len as usize);
            let payload = packet.get(HEADER_LEN..end).ok_or(Reason::OnionPeelFailed)?;
            Ok(HopNext::Terminal {
                payload: payload.to_vec(),
                probe,
                receipt_key,
                message_id,
            })
        }
    }
}

/// The relay URL of `next_hop` at `now`.
///
/// # Errors
/// `no_route` (unknown, expired, or not speaking v2) or `invalid_endpoint`.
pub fn endpoint(ctx: &Context, next_hop: &NodeId, now: u64) -> Result<String, Reason> {
    ctx.peers.route(next_hop, now).map_err(|e| match e {
        PeerError::Unknown | PeerError::Expired | PeerError::OldProtocol => Reason::NoRoute,
        PeerError::Endpoint => Reason::InvalidEndpoint,
    })
}
