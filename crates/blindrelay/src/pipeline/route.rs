//! Steps 6 and 7, route: the previous hop must not be this node (6, a frame it signed came
//! back); the frame must be addressed to this node; its onion layer is opened with the current
//! onion key, then the previous one (the next checks need what the layer says); for a forward,
//! the next hop must be neither the previous hop nor this node, TTL must be left, and the next
//! hop needs a current descriptor with an allowed endpoint.
//!
//! The route replay reservation that ends step 7 is [`super::reserve`]: it writes to disk, so
//! it runs after the crypto slot is given back.

use crate::context::Context;
use crate::peers::PeerError;
use crate::proto::envelope::Envelope;
use crate::proto::onion::{self, Layer};
use crate::proto::{NodeId, RouteId};
use crate::reason::Reason;

/// Where an authenticated frame goes.
pub(super) enum Routed {
    /// On to `next_hop`, at `endpoint`, with `inner` in an envelope carrying `next_route_id`.
    Forward {
        /// The next hop's relay URL.
        endpoint: String,
        /// The next hop.
        next_hop: NodeId,
        /// Its route id, chosen by the sender.
        next_route_id: RouteId,
        /// Its layer, opaque here.
        inner: Vec<u8>,
    },
    /// Here: this node is the terminal.
    Terminal {
        /// The sender's key for sealing the receipt.
        receipt_key: [u8; 32],
        /// The payload.
        payload: Vec<u8>,
        /// The sender's layer says this is a synthetic probe (its kind byte, authenticated):
        /// answered, not stored.
        probe: bool,
    },
}

/// Steps 6 and 7 for `env`, authenticated, at `now`.
///
/// # Errors
/// `self_loop`, `wrong_hop`, `onion_peel_failed`, `route_loop`, `ttl_exhausted`, `no_route` or
/// `invalid_endpoint`.
pub(super) fn route(ctx: &Context, env: &Envelope, now: u64) -> Result<Routed, Reason> {
    let me = *ctx.node.id();
    let prev = env.previous_hop;
    // Step 6.
    if prev == me {
        return Err(Reason::SelfLoop);
    }
    // Step 7.
    if env.next_hop != me {
        return Err(Reason::WrongHop);
    }
    let secrets = ctx.node.onion_secrets(now);
    let refs: Vec<_> = secrets.iter().collect();
    let layer = onion::peel(&me, &refs, &env.blob).map_err(|_| Reason::OnionPeelFailed)?;
    match layer {
        Layer::Forward {
            next_hop,
            next_route_id,
            inner,
        } => {
            if next_hop == prev || next_hop == me {
                return Err(Reason::RouteLoop);
            }
            if env.ttl == 0 {
                return Err(Reason::TtlExhausted);
            }
            let endpoint = ctx.peers.route(&next_hop, now).map_err(|e| match e {
                PeerError::Unknown | PeerError::Expired => Reason::NoRoute,
                PeerError::Endpoint => Reason::InvalidEndpoint,
            })?;
            Ok(Routed::Forward {
                endpoint,
                next_hop,
                next_route_id,
                inner,
            })
        }
        Layer::Terminal {
            receipt_key,
            payload,
        } => Ok(Routed::Terminal {
            receipt_key,
            payload,
            probe: false,
        }),
        Layer::Probe {
            receipt_key,
            payload,
        } => Ok(Routed::Terminal {
            receipt_key,
            payload,
            probe: true,
        }),
    }
}
