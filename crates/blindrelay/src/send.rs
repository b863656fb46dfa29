//! The client side: this node builds an onion route to a terminal, sends it, and verifies the
//! terminal's receipt.
//!
//! Route building and receipt checking take a crypto slot from the whole budget, including the
//! one inbound requests never get, so they proceed under an inbound burst.

use std::sync::Arc;

use rand::seq::SliceRandom;
use tracing::debug;

use crate::forward::{self, Forwarded};
use crate::pipeline::Relay;
use crate::proto::envelope::Envelope;
use crate::proto::onion::{self, Hop};
use crate::proto::receipt::{self, Receipt, ReceiptError};
use crate::proto::{NodeId, Prefix};

/// Why a send did not end in a verified delivery.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No valid descriptor for the terminal.
    #[error("the terminal is not a known peer with a valid descriptor")]
    UnknownTerminal,
    /// Not enough routable peers for the middle hops.
    #[error("not enough known peers for {0} hops")]
    NotEnoughPeers(usize),
    /// `hops` of 0.
    #[error("hops must be at least 1")]
    NoHops,
    /// Payload too large for the route.
    #[error("payload over {0} bytes for this many hops")]
    TooLarge(usize),
    /// No crypto slot free.
    #[error("backpressure: no crypto slot free")]
    Backpressure,
    /// The entry hop refused.
    #[error("the route refused the message")]
    Refused,
    /// The entry hop did not answer.
    #[error("the entry hop did not answer")]
    Unreachable,
    /// The receipt did not open or verify.
    #[error("the delivery receipt did not verify: {0}")]
    Receipt(#[from] ReceiptError),
    /// Internal.
    #[error("internal error")]
    Internal,
}

/// A verified delivery.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Delivered {
    /// Hops used.
    pub hops: usize,
    /// The terminal's 8-hex prefix.
    pub terminal: String,
    /// When the terminal stored it (Unix seconds).
    pub delivered_at: u64,
}

/// Sends `payload` to `to` over `hops` hops (the terminal included).
///
/// # Errors
/// [`SendError`].
pub async fn send(
    relay: &Arc<Relay>,
    to: NodeId,
    hops: usize,
    payload: Vec<u8>,
) -> Result<Delivered, SendError> {
    if hops == 0 {
        return Err(SendError::NoHops);
    }
    if payload.len() > onion::max_payload(hops) {
        return Err(SendError::TooLarge(onion::max_payload(hops)));
    }
    let now = relay.clock.unix();
    let terminal = relay
        .peers
        .descriptor(&to, now)
        .map_err(|_| SendError::UnknownTerminal)?;
    let mut middles: Vec<_> = relay
        .peers
        .routable(now)
        .into_iter()
        .filter(|d| d.node_id != to && d.node_id != *relay.node.id())
        .collect();
    if middles.len() < hops - 1 {
        return Err(SendError::NotEnoughPeers(hops));
    }
    middles.shuffle(&mut rand::rng());
    let mut path: Vec<Hop> = middles[..hops - 1]
        .iter()
        .map(|d| Hop {
            node_id: d.node_id,
            onion_key: d.onion_key,
        })
        .collect();
    path.push(Hop {
        node_id: terminal.node_id,
        onion_key: terminal.onion_key,
    });
    let r = deliver_along(relay, path, payload).await?;
    let now = relay.clock.unix();
    relay.counters.verified_client_onion_deliveries.inc();
    relay
        .counters
        .last_verified_client_onion_delivery_at
        .set(now);
    debug!(terminal = %Prefix(&to), hops, "delivery verified");
    Ok(Delivered {
        hops,
        terminal: Prefix(&to).to_string(),
        delivered_at: r.delivered_at,
    })
}

/// Builds an onion route along `path` (the last hop is the terminal), sends it from this node,
/// and returns the terminal's receipt once it opened and verified. Used by client sends and by
/// probes; records the entry hop's route health.
///
/// # Errors
/// [`SendError`].
pub(crate) async fn deliver_along(
    relay: &Arc<Relay>,
    path: Vec<Hop>,
    payload: Vec<u8>,
) -> Result<Receipt, SendError> {
    let (Some(first), Some(last)) = (path.first(), path.last()) else {
        return Err(SendError::NoHops);
    };
    let (entry, terminal, hops) = (first.node_id, last.node_id, path.len());
    let now = relay.clock.unix();
    let url = relay
        .peers
        .route(&entry, now)
        .map_err(|_| SendError::NotEnoughPeers(hops))?;
    let slot = relay
        .crypto()
        .try_acquire()
        .ok_or(SendError::Backpressure)?;
    let me = Arc::clone(relay);
    let (route, commitment, envelope) = tokio::task::spawn_blocking(move || {
        let route = onion::build(&path, &payload)
            .map_err(|_| SendError::TooLarge(onion::max_payload(hops)))?;
        let env = Envelope::sign(
            route.first_route_id,
            entry,
            (hops - 1) as u8,
            now,
            route.blob.clone(),
            me.node.signing_key(),
        );
        drop(slot);
        Ok::<_, SendError>((route, receipt::commitment(&payload), env.encode()))
    })
    .await
    .map_err(|_| SendError::Internal)??;
    let answer = forward::post(
        relay.http(),
        &url,
        &envelope,
        &route.first_route_id,
        &entry,
        &relay.counters,
    )
    .await;
    relay.health().record_route(
        &entry,
        matches!(answer, Forwarded::Accepted { .. }),
        relay.clock.unix(),
    );
    let sealed = match answer {
        Forwarded::Accepted { receipt } => from_hex_vec(&receipt).ok_or(SendError::Refused)?,
        Forwarded::Refused => return Err(SendError::Refused),
        Forwarded::Exhausted => return Err(SendError::Unreachable),
    };
    let r = receipt::open(&sealed, &route.receipt_key)?;
    r.verify(
        &route.terminal_route_id,
        &commitment,
        &terminal,
        relay.clock.unix(),
    )?;
    Ok(r)
}

/// The sealed receipt from its hex form; `None` for anything longer than a sealed receipt could
/// be, or not hex.
fn from_hex_vec(s: &str) -> Option<Vec<u8>> {
    if s.len() > 1024 {
        return None;
    }
    hex::decode(s).ok()
}
