//! The end of step 7 for a forward: the next hop named by the layer's slot needs a current v2
//! descriptor with an allowed endpoint. (Self-loop, the layer, its expiry and the route loop are
//! checked by [`super::v2::check`].)
//!
//! The replay reservation that ends step 7 is [`super::reserve`]: it writes to disk, so it runs
//! after the crypto slot is given back.

use crate::context::Context;
use crate::peers::PeerError;
use crate::proto::NodeId;
use crate::reason::Reason;

/// The relay URL of `next_hop` at `now`.
///
/// # Errors
/// `no_route` (unknown, expired, or not speaking v2) or `invalid_endpoint`.
pub(super) fn next_hop(ctx: &Context, next_hop: &NodeId, now: u64) -> Result<String, Reason> {
    ctx.peers.route(next_hop, now).map_err(|e| match e {
        PeerError::Unknown | PeerError::Expired | PeerError::OldProtocol => Reason::NoRoute,
        PeerError::Endpoint => Reason::InvalidEndpoint,
    })
}
