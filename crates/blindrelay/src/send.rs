//! The client side: this node builds an onion route to a terminal, sends it, and verifies the
//! terminal's receipt.
//!
//! Depends on the shared [`Context`] only, never on the inbound pipeline. Route building and
//! receipt checking take a crypto slot from the whole budget, including the one inbound
//! requests never get, so they proceed under an inbound burst.

pub mod path;
pub mod wrap;

use std::collections::HashSet;
use std::fmt;

use tracing::debug;

use crate::clock::Instant;
use crate::context::{self, Context};
use crate::forward::{self, Forwarded};
use crate::proto::descriptor::{Descriptor, PROTOCOL};
use crate::proto::receipt::{self, Receipt, ReceiptError};
use crate::proto::sphinx::{self, Failure, Report, report};
use crate::proto::{MessageId, NodeId, Prefix};
use crate::reason::Reason;

/// Hops of a send (the terminal included) unless told otherwise.
pub const DEFAULT_HOPS: usize = 3;
/// The largest payload a send carries: the largest size class's capacity.
pub const MAX_PAYLOAD: usize = 192 * 1024;
/// Routes a send tries at most, within [`forward::SEND_DEADLINE`]: enough that a send still
/// gets through when a third of the network died at once (each failed middle is avoided for
/// the rest of the send, and a dead peer refuses connections at once).
pub const MAX_ROUTES: usize = 8;
/// Routes a send tries at most when the terminal is what failed (another route seldom helps).
pub const TERMINAL_ROUTES: usize = 3;
/// Longest hex of a sealed receipt accepted from the entry hop (a sealed receipt is 192 bytes).
const MAX_RECEIPT_HEX: usize = 1024;

/// Why a send did not end in a verified delivery.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No valid descriptor for the terminal.
    #[error("the terminal is not a known peer with a valid descriptor")]
    UnknownTerminal,
    /// Not enough usable peers, in distinct address blocks, for the middle hops.
    #[error("not enough usable peers in distinct /16 blocks for {0} hops")]
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
    /// Every route tried failed; the last one as the sender learned it.
    #[error("{failure} ({routes} route{} tried)", if *routes == 1 { "" } else { "s" })]
    Route {
        /// Where the last route failed.
        failure: HopFailure,
        /// Routes tried.
        routes: usize,
    },
    /// Internal.
    #[error("internal error")]
    Internal,
}

/// Where a route failed, as its sender learned it: from the entry hop's answer, or from the
/// failure report a later hop sealed for it ([`crate::proto::sphinx::report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopFailure {
    /// The failed hop, 1-based (1: the entry hop; `hops`: the terminal); `None` when the
    /// failure was past the entry hop and its report did not open, or the receipt failed.
    pub position: Option<usize>,
    /// The route's hops.
    pub hops: usize,
    /// The failed hop's 8-hex prefix, when known.
    pub node: Option<String>,
    /// What happened there.
    pub cause: Cause,
}

/// What happened at the failed hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// It did not answer (the hop before it, or this node for the entry hop, gave up).
    Unreachable,
    /// It refused, with this status and reason.
    Refused {
        /// The HTTP status of the refusal.
        status: u16,
        /// The reason it named, if any.
        reason: Option<String>,
    },
    /// A hop past the entry failed and no report of it opened: a hop garbled it, or none
    /// came.
    Garbled,
    /// The route answered, but the receipt did not open or verify.
    Receipt(ReceiptError),
}

impl fmt::Display for HopFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.hops;
        let at = |f: &mut fmt::Formatter<'_>, p: usize| {
            write!(f, "hop {p} of {n}")?;
            if let Some(node) = &self.node {
                write!(f, " ({node})")?;
            }
            if p == n && n > 1 {
                write!(f, ", the terminal,")?;
            }
            Ok(())
        };
        match (&self.cause, self.position) {
            (Cause::Receipt(e), _) => write!(f, "the delivery receipt did not verify: {e}"),
            (Cause::Garbled, _) | (_, None) => write!(
                f,
                "a hop after the entry hop failed, and no failure report of it opened"
            ),
            (Cause::Unreachable, Some(p)) => {
                at(f, p)?;
                write!(f, " did not answer")
            }
            (Cause::Refused { status, reason }, Some(p)) => {
                at(f, p)?;
                match reason {
                    Some(r) => write!(f, " refused the message: {r}"),
                    None => write!(f, " refused the message: HTTP {status}"),
                }
            }
        }
    }
}

impl HopFailure {
    /// The hops of `path` a new route for the same message should not use again: the failed
    /// hop and the one before it (either may be at fault: one lied or the link between them
    /// failed), every middle when the failure is not placed, never the terminal.
    fn suspects(&self, path: &[Hop]) -> Vec<NodeId> {
        let middles = &path[..path.len().saturating_sub(1)];
        match self.position {
            Some(p) => {
                let failed = p.saturating_sub(1);
                middles
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i == failed || *i + 1 == failed)
                    .map(|(_, h)| h.node_id)
                    .collect()
            }
            None => middles.iter().map(|h| h.node_id).collect(),
        }
    }

    /// The terminal is the hop that failed.
    fn at_terminal(&self) -> bool {
        self.position == Some(self.hops)
    }

    /// Whether another route could deliver: not when the terminal refused for its own stores,
    /// nor when there is no other route (one hop).
    fn worth_another_route(&self) -> bool {
        if self.hops < 2 {
            return false;
        }
        let at_terminal = self.position == Some(self.hops);
        match &self.cause {
            Cause::Refused {
                reason: Some(r), ..
            } if at_terminal => !matches!(
                Reason::from_wire(r),
                Some(
                    Reason::InboxFull
                        | Reason::InboxShareExceeded
                        | Reason::StateWriteFailed
                        | Reason::ReplayCapacity
                        | Reason::ReplayShareExceeded
                )
            ),
            _ => true,
        }
    }
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
    /// Routes tried: 1 unless a route failed and the message was sent again over another.
    #[serde(default = "one")]
    pub routes: usize,
}

fn one() -> usize {
    1
}

/// Sends `payload` to `to` over `hops` hops (the terminal included): over another route when
/// one fails, at most [`MAX_ROUTES`] routes within [`forward::SEND_DEADLINE`], the message id
/// the same on each so the terminal stores it once.
///
/// # Errors
/// [`SendError`]: for a route that failed, where ([`SendError::Route`]).
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
    let terminal = ctx
        .peers
        .descriptor(&to, ctx.clock.unix())
        .ok()
        .filter(|d| d.protocol == PROTOCOL)
        .ok_or(SendError::UnknownTerminal)?;
    let message: MessageId = rand::random();
    let deadline = ctx.clock.now() + forward::SEND_DEADLINE;
    let mut avoid = HashSet::new();
    let mut routes = 0;
    let failure = loop {
        let mut chosen = route(ctx, &terminal, hops, &avoid);
        // Just started: the --peers' descriptors from their own URLs (what makes them middles)
        // may still be on their way; wait for them, bounded, once.
        if routes == 0 && chosen.is_err() && !ctx.peers.is_fetched() {
            ctx.peers.fetched(crate::peers::READY_WAIT).await;
            chosen = route(ctx, &terminal, hops, &avoid);
        }
        let path = match chosen {
            Ok(path) => path,
            Err(e) if routes == 0 => return Err(e),
            Err(_) => break None,
        };
        routes += 1;
        match deliver_along(ctx, path.clone(), &payload, message, false, deadline).await {
            Ok(r) => {
                let now = ctx.clock.unix();
                ctx.counters.verified_client_onion_deliveries.inc();
                ctx.counters.last_verified_client_onion_delivery_at.set(now);
                debug!(terminal = %Prefix(&to), hops, routes, "delivery verified");
                return Ok(Delivered {
                    hops,
                    terminal: Prefix(&to).to_string(),
                    delivered_at: r.delivered_at,
                    routes,
                });
            }
            Err(SendError::Route { failure, .. }) => {
                debug!(hops, routes, %failure, "route failed");
                avoid.extend(failure.suspects(&path));
                let cap = if failure.at_terminal() {
                    TERMINAL_ROUTES
                } else {
                    MAX_ROUTES
                };
                let more =
                    failure.worth_another_route() && routes < cap && ctx.clock.now() < deadline;
                if !more {
                    break Some(failure);
                }
                ctx.counters.send_rerouted.inc();
            }
            Err(e) => return Err(e),
        }
    };
    match failure {
        Some(failure) => Err(SendError::Route { failure, routes }),
        // No other route left to try: the last failure was reported as it happened.
        None => Err(SendError::NotEnoughPeers(hops)),
    }
}

/// A route of `hops` hops to `terminal` now, of reached peers the send does not `avoid`
/// ([`path`]): peers this node's health lets it use, or, when too few of them are left for a
/// route, the failed ones too (a small network must not refuse a send over one peer's failure
/// of a moment; the send still goes around what failed for it).
fn route(
    ctx: &Context,
    terminal: &Descriptor,
    hops: usize,
    avoid: &HashSet<NodeId>,
) -> Result<Vec<Hop>, SendError> {
    let now = ctx.clock.unix();
    let (usable, failed): (Vec<_>, Vec<_>) = ctx
        .peers
        .candidates(now)
        .into_iter()
        .filter(|c| c.reached && !avoid.contains(&c.d().node_id))
        .partition(|c| ctx.health.usable(&c.d().node_id, now));
    let terminal_ip = crate::proto::parse_endpoint(&terminal.endpoint)
        .ok()
        .map(|a| a.ip());
    let rules = path::Rules {
        distinct_blocks: ctx.outgoing.distinct_blocks,
    };
    let me = ctx.node.id();
    let mut rng = rand::rng();
    let (n_usable, n_failed) = (usable.len(), failed.len());
    let chosen = match path::choose(
        me,
        terminal,
        terminal_ip,
        usable.clone(),
        hops,
        rules,
        now,
        &mut rng,
    ) {
        Err(SendError::NotEnoughPeers(_)) if !failed.is_empty() => {
            let all = usable.into_iter().chain(failed).collect();
            path::choose(me, terminal, terminal_ip, all, hops, rules, now, &mut rng)
        }
        chosen => chosen,
    };
    if chosen.is_err() {
        debug!(
            hops,
            usable = n_usable,
            failed = n_failed,
            avoided = avoid.len(),
            "no route"
        );
    }
    chosen
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

/// Builds an onion route along `path` (the last hop is the terminal) for the message `message`,
/// sends it from this node, and returns the terminal's receipt once it opened and verified,
/// within `deadline` (at most [`forward::SENDER_DEADLINE`] from now). Used by client sends and
/// by probes; records what it learned of each hop's health.
///
/// # Errors
/// [`SendError`]; a failure of the route is [`SendError::Route`] (one route).
pub(crate) async fn deliver_along(
    ctx: &Context,
    path: Vec<Hop>,
    payload: &[u8],
    message: MessageId,
    probe: bool,
    deadline: Instant,
) -> Result<Receipt, SendError> {
    let Some(first) = path.first() else {
        return Err(SendError::NoHops);
    };
    let entry = first.node_id;
    let now = ctx.clock.unix();
    let url = ctx
        .peers
        .route(&entry, now)
        .map_err(|_| SendError::NotEnoughPeers(path.len()))?;
    // The sender waits longer than the entry hop's late deadline: its final answer comes first.
    let deadline = deadline.min(ctx.clock.now() + forward::SENDER_DEADLINE);
    let slot = ctx.crypto.slot().await.ok_or(SendError::Backpressure)?;
    let (hops, owned) = (path.clone(), payload.to_vec());
    let (wrapped, commitment) = context::on_crypto_slot(slot, move || {
        let expires_at = wrap::expiry(now);
        let wrapped = wrap::wrap_message(&hops, &owned, probe, message, expires_at)?;
        Ok::<_, SendError>((wrapped, receipt::commitment(&owned)))
    })
    .await
    .ok_or(SendError::Internal)??;
    let turn = ctx
        .outgoing
        .pacer
        .join(&entry, wrapped.frame.len())
        .map_err(|_| {
            ctx.counters.next_hop_queue_full.inc();
            SendError::QueueFull
        })?;
    let answer = forward::post(
        &ctx.outgoing.links,
        &url,
        &wrapped.frame,
        &wrapped.terminal_tag,
        &ctx.counters,
        deadline,
        turn,
    )
    .await;
    let route_failed = |failure| SendError::Route { failure, routes: 1 };
    let sealed = outcome(ctx, &path, &wrapped.report_keys, answer).map_err(route_failed)?;
    let failed = |e| {
        route_failed(HopFailure {
            position: None,
            hops: path.len(),
            node: None,
            cause: Cause::Receipt(e),
        })
    };
    let r = receipt::open(&sealed, &wrapped.receipt_key).map_err(failed)?;
    let last = &path[path.len() - 1].node_id;
    r.verify(&message, &commitment, last, ctx.clock.unix())
        .map_err(failed)?;
    let now = ctx.clock.unix();
    for h in &path[1..] {
        ctx.health.record_route(&h.node_id, true, now);
    }
    // A delivery is not passed on to discovery as a reach (a probe's is, `crate::probe`):
    // announcing a terminal reached for the first time would tell the neighbours whom this
    // node just sent to.
    Ok(r)
}

/// What the entry hop's `answer` says of the route `path` (whose hops' report keys are
/// `report_keys`): the sealed receipt, or where it failed. Each hop's health learns its part:
/// the entry hop's answer, and the failed hop named by a report.
fn outcome(
    ctx: &Context,
    path: &[Hop],
    report_keys: &[[u8; 32]],
    answer: Forwarded,
) -> Result<Vec<u8>, HopFailure> {
    let now = ctx.clock.unix();
    let (hops, entry) = (path.len(), &path[0].node_id);
    let at = |i: usize, cause| HopFailure {
        position: Some(i + 1),
        hops,
        node: path.get(i).map(|h| Prefix(&h.node_id).to_string()),
        cause,
    };
    match answer {
        Forwarded::Accepted { receipt } => {
            ctx.health.record_route(entry, true, now);
            from_hex_vec(&receipt).ok_or(HopFailure {
                position: None,
                hops,
                node: None,
                cause: Cause::Receipt(ReceiptError::Malformed),
            })
        }
        Forwarded::Exhausted => {
            ctx.health.record_route(entry, false, now);
            Err(at(0, Cause::Unreachable))
        }
        Forwarded::Refused {
            status,
            reason: Some(Reason::ForwardFailed),
            report: None,
        } => {
            // A later hop failed, says the entry hop, with no report: not placed.
            ctx.health
                .record_refused(entry, status, Some(Reason::ForwardFailed), now);
            Err(HopFailure {
                position: None,
                hops,
                node: None,
                cause: Cause::Garbled,
            })
        }
        Forwarded::Refused {
            status,
            reason,
            report: None,
        } => {
            ctx.health.record_refused(entry, status, reason, now);
            Err(at(
                0,
                Cause::Refused {
                    status,
                    reason: reason.map(|r| r.as_str().to_string()),
                },
            ))
        }
        Forwarded::Refused {
            status,
            reason,
            report: Some(r),
        } => {
            // The entry hop did its part; the report says which hop past it failed.
            ctx.health.record_refused(entry, status, reason, now);
            Err(reported(ctx, path, report_keys, &r))
        }
    }
}

/// Where a failure `report` of the route `path` places the failure, noted in the failed hop's
/// health.
fn reported(ctx: &Context, path: &[Hop], report_keys: &[[u8; 32]], r: &Report) -> HopFailure {
    let (now, hops) = (ctx.clock.unix(), path.len());
    let Some((writer, failure)) = report::open(report_keys, r) else {
        return HopFailure {
            position: None,
            hops,
            node: None,
            cause: Cause::Garbled,
        };
    };
    let failed = (writer + 1).min(hops - 1);
    let node = &path[failed].node_id;
    let cause = match failure {
        Failure::Unreachable => {
            ctx.health.record_route(node, false, now);
            Cause::Unreachable
        }
        Failure::Refused { status, reason } => {
            let known = reason.as_deref().and_then(Reason::from_wire);
            ctx.health.record_refused(node, status, known, now);
            Cause::Refused { status, reason }
        }
    };
    // Heard of, not met: nothing this node does next contacts that hop (it may be the
    // terminal) because of it.
    ctx.health.heard_of(node, now);
    HopFailure {
        position: Some(failed + 1),
        hops,
        node: Some(Prefix(node).to_string()),
        cause,
    }
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
    use std::sync::Arc;

    use super::*;
    use crate::clock::Clock;
    use crate::node::{self, Node};
    use crate::peers::Peers;

    const T0: u64 = 1_800_000_000;

    fn descriptor(seed: u8) -> Descriptor {
        crate::proto::descriptor::for_test([seed; 32], format!("https://127.{seed}.0.1:7001"), T0)
    }

    /// A context over a fresh node: no SQLite, no listener, no HTTP.
    fn context(dir: &tempfile::TempDir, crypto_slots: usize) -> Arc<Context> {
        let clock = Clock::starting_at(T0);
        node::init(dir.path(), "https://127.0.0.1:7001", T0).unwrap();
        let node = Arc::new(Node::load(dir.path()).unwrap());
        let peers = Arc::new(Peers::new(vec![], true, clock, *node.id()));
        Arc::new(Context::new(node, peers, clock, crypto_slots))
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

    fn failure(position: Option<usize>, cause: Cause) -> HopFailure {
        HopFailure {
            position,
            hops: 4,
            node: Some("0a0b0c0d".into()),
            cause,
        }
    }

    #[test]
    fn a_failure_names_the_hop_and_who_to_avoid() {
        let path: Vec<Hop> = (1..=4).map(|i| hop(&descriptor(i))).collect();
        let position = |id: NodeId| path.iter().position(|h| h.node_id == id).unwrap() + 1;
        let ids = |v: Vec<NodeId>| v.into_iter().map(position).collect::<Vec<_>>();
        let unreachable = |p| failure(Some(p), Cause::Unreachable);
        assert_eq!(ids(unreachable(1).suspects(&path)), [1]);
        assert_eq!(ids(unreachable(3).suspects(&path)), [2, 3]);
        assert_eq!(
            ids(unreachable(4).suspects(&path)),
            [3],
            "the terminal is never avoided"
        );
        assert_eq!(
            ids(failure(None, Cause::Garbled).suspects(&path)),
            [1, 2, 3]
        );
        assert_eq!(
            unreachable(3).to_string(),
            "hop 3 of 4 (0a0b0c0d) did not answer"
        );
        let full = failure(
            Some(4),
            Cause::Refused {
                status: 507,
                reason: Some("inbox_full".into()),
            },
        );
        assert_eq!(
            full.to_string(),
            "hop 4 of 4 (0a0b0c0d), the terminal, refused the message: inbox_full"
        );
        assert!(!full.worth_another_route(), "the terminal's own store");
        assert!(unreachable(4).worth_another_route());
        let quarantined = failure(
            Some(4),
            Cause::Refused {
                status: 429,
                reason: Some("quarantined".into()),
            },
        );
        assert!(quarantined.worth_another_route(), "another hop before it");
        assert_eq!(
            failure(None, Cause::Garbled).to_string(),
            "a hop after the entry hop failed, and no failure report of it opened"
        );
        let e = SendError::Route {
            failure: unreachable(2),
            routes: 3,
        };
        assert_eq!(
            e.to_string(),
            "hop 2 of 4 (0a0b0c0d) did not answer (3 routes tried)"
        );
    }
}
