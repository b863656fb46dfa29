//! The client side: this node builds an onion route to a terminal, sends it, and verifies the
//! terminal's receipt.
//!
//! Depends on the shared [`Context`] only, never on the inbound pipeline. Route building and
//! receipt checking take a crypto slot from the whole budget, including the one inbound
//! requests never get, so they proceed under an inbound burst.

pub mod wrap;

use std::sync::Arc;

use rand::Rng;
use rand::seq::SliceRandom;
use tracing::debug;

use crate::context::{self, Context};
use crate::forward::{self, Forwarded};
use crate::proto::descriptor::{Descriptor, PROTOCOL};
use crate::proto::receipt::{self, Receipt, ReceiptError};
use crate::proto::sphinx;
use crate::proto::{NodeId, Prefix};

/// Hops of a send (the terminal included) unless told otherwise.
pub const DEFAULT_HOPS: usize = 3;
/// The largest payload a send carries: the largest size class's capacity.
pub const MAX_PAYLOAD: usize = 192 * 1024;
/// Longest hex of a sealed receipt accepted from the entry hop (a sealed receipt is 192 bytes).
const MAX_RECEIPT_HEX: usize = 1024;

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
    /// Payload over the largest size class.
    #[error("payload over {0} bytes")]
    TooLarge(usize),
    /// More hops than the format carries.
    #[error("at most {0} hops")]
    TooManyHops(usize),
    /// No crypto slot free.
    #[error("backpressure: no crypto slot free")]
    Backpressure,
    /// The queue of requests waiting for their turn to the entry hop is full.
    #[error("too many messages wait for their turn to the entry hop: try again later")]
    QueueFull,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    ctx: &Context,
    to: NodeId,
    hops: usize,
    payload: Vec<u8>,
) -> Result<Delivered, SendError> {
    if hops == 0 {
        return Err(SendError::NoHops);
    }
    if hops > sphinx::MAX_HOPS {
        return Err(SendError::TooManyHops(sphinx::MAX_HOPS));
    }
    if wrap::class_for(payload.len(), false).is_none() {
        return Err(SendError::TooLarge(MAX_PAYLOAD));
    }
    // A node just started may not hold its peers' descriptors yet: wait for them, bounded.
    if !ctx.peers.holds(&to) {
        ctx.peers.fetched(crate::peers::READY_WAIT).await;
    }
    let now = ctx.clock.unix();
    let terminal = ctx
        .peers
        .descriptor(&to, now)
        .ok()
        .filter(|d| d.protocol == PROTOCOL)
        .ok_or(SendError::UnknownTerminal)?;
    let path = choose_path(
        ctx.node.id(),
        &terminal,
        ctx.peers.routable(now),
        hops,
        &mut rand::rng(),
    )?;
    let r = deliver_along(ctx, path, payload, false).await?;
    let now = ctx.clock.unix();
    ctx.counters.verified_client_onion_deliveries.inc();
    ctx.counters.last_verified_client_onion_delivery_at.set(now);
    debug!(terminal = %Prefix(&to), hops, "delivery verified");
    Ok(Delivered {
        hops,
        terminal: Prefix(&to).to_string(),
        delivered_at: r.delivered_at,
    })
}

/// A path of `hops` hops to `terminal`: `hops − 1` middles picked at random among `routable`
/// (neither this node `me` nor the terminal), then the terminal.
///
/// # Errors
/// [`SendError::NotEnoughPeers`].
fn choose_path(
    me: &NodeId,
    terminal: &Descriptor,
    routable: Vec<Descriptor>,
    hops: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Hop>, SendError> {
    let middles_needed = hops.saturating_sub(1);
    let mut middles: Vec<_> = routable
        .into_iter()
        .filter(|d| d.node_id != terminal.node_id && d.node_id != *me)
        .collect();
    if middles.len() < middles_needed {
        return Err(SendError::NotEnoughPeers(hops));
    }
    middles.shuffle(rng);
    Ok(middles[..middles_needed]
        .iter()
        .chain(std::iter::once(terminal))
        .map(hop)
        .collect())
}

/// One hop of a path, as taken from its verified descriptor.
#[derive(Clone, PartialEq, Eq)]
pub struct Hop {
    /// The hop's node id.
    pub node_id: NodeId,
    /// The hop's current X25519 onion public key.
    pub onion_key: [u8; 32],
}

impl std::fmt::Debug for Hop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hop")
            .field("node_id", &Prefix(&self.node_id))
            .finish_non_exhaustive()
    }
}

/// A descriptor as a hop of a path.
pub fn hop(d: &Descriptor) -> Hop {
    Hop {
        node_id: d.node_id,
        onion_key: d.onion_key,
    }
}

/// Builds an onion route along `path` (the last hop is the terminal), sends it from this node,
/// and returns the terminal's receipt once it opened and verified. Used by client sends and by
/// probes; records the entry hop's route health.
///
/// # Errors
/// [`SendError`].
pub(crate) async fn deliver_along(
    ctx: &Context,
    path: Vec<Hop>,
    payload: Vec<u8>,
    probe: bool,
) -> Result<Receipt, SendError> {
    let (Some(first), Some(last)) = (path.first(), path.last()) else {
        return Err(SendError::NoHops);
    };
    let (entry, terminal, hops) = (first.node_id, last.node_id, path.len());
    let now = ctx.clock.unix();
    let url = ctx
        .peers
        .route(&entry, now)
        .map_err(|_| SendError::NotEnoughPeers(hops))?;
    // The sender waits longer than the entry hop's late deadline: its final answer comes first.
    let deadline = ctx.clock.now() + forward::SENDER_DEADLINE;
    let slot = ctx
        .crypto_slot(ctx.crypto.limit(), ctx.crypto_wait)
        .await
        .ok_or(SendError::Backpressure)?;
    let node = Arc::clone(&ctx.node);
    let (wrapped, commitment) = context::on_crypto_slot(slot, move || {
        let wrapped = wrap::wrap(&path, &payload, probe, now, node.signing_key())?;
        Ok::<_, SendError>((wrapped, receipt::commitment(&payload)))
    })
    .await
    .ok_or(SendError::Internal)??;
    let turn = ctx.pacer.join(&entry, wrapped.frame.len()).map_err(|_| {
        ctx.counters.next_hop_queue_full.inc();
        SendError::QueueFull
    })?;
    let answer = forward::post(
        &ctx.http,
        &url,
        &wrapped.frame,
        &wrapped.terminal_tag,
        &ctx.counters,
        deadline,
        turn,
    )
    .await;
    // The entry hop's health: an answer of a busy peer is what it is, not a transport failure.
    let now = ctx.clock.unix();
    match &answer {
        Forwarded::Accepted { .. } => ctx.health.record_route(&entry, true, now),
        Forwarded::Refused { status, reason } => {
            ctx.health.record_refused(&entry, *status, *reason, now);
        }
        Forwarded::Exhausted => ctx.health.record_route(&entry, false, now),
    }
    let sealed = match answer {
        Forwarded::Accepted { receipt } => from_hex_vec(&receipt).ok_or(SendError::Refused)?,
        Forwarded::Refused { .. } => return Err(SendError::Refused),
        Forwarded::Exhausted => return Err(SendError::Unreachable),
    };
    let r = receipt::open(&sealed, &wrapped.receipt_key)?;
    r.verify(
        &wrapped.terminal_tag,
        &commitment,
        &terminal,
        ctx.clock.unix(),
    )?;
    Ok(r)
}

/// The sealed receipt from its hex form; `None` for anything longer than a sealed receipt could
/// be, or not hex.
fn from_hex_vec(s: &str) -> Option<Vec<u8>> {
    if s.len() > MAX_RECEIPT_HEX {
        return None;
    }
    hex::decode(s).ok()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::clock::Clock;
    use crate::node::{self, Node};
    use crate::peers::Peers;

    const T0: u64 = 1_800_000_000;

    fn descriptor(seed: u8) -> Descriptor {
        crate::proto::descriptor::for_test([seed; 32], format!("https://127.0.0.{seed}:7001"), T0)
    }

    /// A context over a fresh node: no SQLite, no listener, no HTTP.
    fn context(dir: &tempfile::TempDir, crypto_slots: usize) -> Arc<Context> {
        let clock = Clock::starting_at(T0);
        node::init(dir.path(), "https://127.0.0.1:7001", T0).unwrap();
        let node = Arc::new(Node::load(dir.path()).unwrap());
        let peers = Arc::new(Peers::new(vec![], true, clock, *node.id()));
        Arc::new(Context::new(node, peers, clock, crypto_slots))
    }

    #[test]
    fn a_path_is_random_middles_then_the_terminal() {
        let me = descriptor(1).node_id;
        let terminal = descriptor(2);
        let routable: Vec<_> = (1..=6).map(descriptor).collect();
        let mut rng = StdRng::seed_from_u64(7);
        for hops in 1..=5 {
            let path = choose_path(&me, &terminal, routable.clone(), hops, &mut rng).unwrap();
            assert_eq!(path.len(), hops);
            assert_eq!(path.last(), Some(&hop(&terminal)));
            let middles = &path[..hops - 1];
            assert!(
                middles
                    .iter()
                    .all(|h| h.node_id != me && h.node_id != terminal.node_id)
            );
            let mut ids: Vec<_> = middles.iter().map(|h| h.node_id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), hops - 1, "no middle twice");
        }
        // Four candidates (3, 4, 5, 6): a sixth hop would need five middles.
        assert!(matches!(
            choose_path(&me, &terminal, routable, 6, &mut rng),
            Err(SendError::NotEnoughPeers(6))
        ));
    }

    #[tokio::test]
    async fn refusals_before_the_wire() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(&dir, 4);
        let stranger = descriptor(9);
        assert_eq!(MAX_PAYLOAD, sphinx::SizeClass::Huge.capacity());
        assert!(matches!(
            send(&ctx, stranger.node_id, sphinx::MAX_HOPS + 1, b"x".to_vec()).await,
            Err(SendError::TooManyHops(_))
        ));
        assert!(matches!(
            send(&ctx, stranger.node_id, 0, b"x".to_vec()).await,
            Err(SendError::NoHops)
        ));
        assert!(matches!(
            send(&ctx, stranger.node_id, 1, vec![0; MAX_PAYLOAD + 1]).await,
            Err(SendError::TooLarge(_))
        ));
        assert!(matches!(
            send(&ctx, stranger.node_id, 1, b"x".to_vec()).await,
            Err(SendError::UnknownTerminal)
        ));
        assert!(ctx.peers.insert(stranger.clone()));
        assert!(matches!(
            send(&ctx, stranger.node_id, 2, b"x".to_vec()).await,
            Err(SendError::NotEnoughPeers(2))
        ));
        // Every crypto slot busy: refused at once, nothing sent.
        let busy: Vec<_> = (0..4).map(|_| ctx.crypto.try_acquire().unwrap()).collect();
        assert!(matches!(
            send(&ctx, stranger.node_id, 1, b"x".to_vec()).await,
            Err(SendError::Backpressure)
        ));
        drop(busy);
        let s = ctx.counters.snapshot();
        assert_eq!(
            (s.verified_client_onion_deliveries, s.retry_attempted),
            (0, 0)
        );
    }
}
