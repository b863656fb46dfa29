//! Step 8: forward the peeled packet in a frame signed by this node ([`crate::forward`], with
//! retries), or deliver at the terminal ([`crate::terminal`]).
//!
//! [`prepare`] is CPU work (the next frame's signature, or the sealed receipt) and runs with
//! steps 3–7 on the crypto slot; [`store`] is a SQLite commit and runs on the same blocking
//! thread once the slot is given back; [`forward`] runs on the reactor with the next hop's slot
//! and turn held.

use crate::context::Context;
use crate::forward::{self, Forwarded};
use crate::health::Bucket;
use crate::outbound::Turn;
use crate::proto::NodeId;
use crate::proto::frame::Frame;
use crate::proto::sphinx::ReplayTag;
use crate::reason::Reason;
use crate::sources::Source;
use crate::terminal::{self, Terminal, Undelivered};

use super::answer::Answer;
use super::route::{self, HopNext};

/// Step 8, prepared.
#[derive(Debug)]
pub(super) enum Next {
    /// Post `frame` (signed by this node) to `endpoint`.
    Forward {
        endpoint: String,
        next_hop: NodeId,
        frame: Vec<u8>,
    },
    /// Store `payload` (unless a probe), then release `receipt`.
    Terminal {
        payload: Vec<u8>,
        receipt: String,
        probe: bool,
    },
}

/// Step 8's CPU work for the layer tagged `tag`: the next hop's endpoint (the end of step 7)
/// and the frame signed for it, or the terminal's sealed receipt.
///
/// # Errors
/// `no_route`, `invalid_endpoint`, or `forward_failed` (the frame cannot be signed).
pub(super) fn prepare(
    ctx: &Context,
    tag: &ReplayTag,
    next: HopNext,
    now: u64,
) -> Result<Next, Reason> {
    let node = &ctx.node;
    Ok(match next {
        HopNext::Forward { next_hop, packet } => {
            let endpoint = route::endpoint(ctx, &next_hop, now)?;
            let frame = Frame::sign(packet, node.signing_key(), &next_hop)
                .map_err(|_| Reason::ForwardFailed)?;
            Next::Forward {
                endpoint,
                next_hop,
                frame: frame.encode(),
            }
        }
        HopNext::Terminal {
            payload,
            probe,
            receipt_key,
        } => Next::Terminal {
            receipt: terminal::seal_receipt(node.signing_key(), tag, &receipt_key, &payload, now),
            probe,
            payload,
        },
    })
}

/// The next hop with retries, until `deadline`; its health.
pub(super) async fn forward(
    ctx: &Context,
    endpoint: &str,
    tag: &ReplayTag,
    frame: Vec<u8>,
    deadline: crate::clock::Instant,
    turn: Turn,
) -> Result<Answer, Reason> {
    let next_hop = &{ *turn.hop() };
    let outcome = forward::post(
        &ctx.http,
        endpoint,
        &frame,
        tag,
        &ctx.counters,
        deadline,
        turn,
    )
    .await;
    let now = ctx.clock.unix();
    match outcome {
        Forwarded::Accepted { receipt } => {
            ctx.health.record_route(next_hop, true, now);
            Ok(Answer::Forwarded { receipt })
        }
        Forwarded::Refused { status, reason } => {
            ctx.health.record_refused(next_hop, status, reason, now);
            Err(Reason::ForwardFailed)
        }
        Forwarded::Exhausted => {
            ctx.health
                .record_route_reason(next_hop, false, Bucket::Transport, now);
            ctx.counters.last_retry_exhausted_at.set(now);
            Err(Reason::ForwardFailed)
        }
    }
}

/// At the terminal: the payload committed (a probe's is not stored), then the receipt
/// released. Blocking (a SQLite commit).
///
/// # Errors
/// `inbox_full`, `inbox_share_exceeded` or `state_write_failed`.
pub(super) fn store(
    terminal: &Terminal,
    payload: &[u8],
    receipt: String,
    probe: bool,
    now: u64,
    source: &Source,
) -> Result<Answer, Reason> {
    if !probe {
        terminal
            .store(payload, now, source.key())
            .map_err(|e| match e {
                Undelivered::Full => Reason::InboxFull,
                Undelivered::ShareExceeded => Reason::InboxShareExceeded,
                Undelivered::Failed => Reason::StateWriteFailed,
            })?;
    }
    Ok(Answer::Delivered { receipt, probe })
}
