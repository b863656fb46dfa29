//! Delivery (design step 8): forward the peeled packet to the next hop over this node's link
//! ([`crate::forward`], with retries), or deliver at the terminal ([`crate::terminal`]).
//!
//! [`prepare`] is CPU work (the sealed receipt at a terminal) and runs with
//! the checks on the crypto slot; [`store`] is a SQLite commit and runs on the same blocking
//! thread once the slot is given back; [`forward`] runs on the reactor with the next hop's slot
//! and turn held.

use ed25519_dalek::SigningKey;

use crate::context::Context;
use crate::forward::{self, Forwarded};
use crate::health::Bucket;
use crate::outbound::Turn;
use crate::proto::NodeId;
use crate::proto::receipt;
use crate::proto::sphinx::ReplayTag;
use crate::proto::sphinx::report::{self, Failure};
use crate::reason::Reason;
use crate::sources::Source;
use crate::terminal::{self, Once, Stored, Terminal, Undelivered};

use super::answer::Answer;
use super::route::{self, HopNext};

/// The delivery, prepared.
#[derive(Debug)]
pub(super) enum Next {
    /// Post `frame` (the peeled packet) to `endpoint`.
    Forward {
        endpoint: String,
        next_hop: NodeId,
        frame: Vec<u8>,
    },
    /// The next hop cannot be reached from here (`no_route`, `invalid_endpoint`): refused with
    /// this hop's failure report.
    Unroutable(Reason),
    /// Store the payload (unless a probe) once per message, then release the receipt.
    Terminal(TerminalWork),
}

/// The delivery's CPU work: the next hop's endpoint (the end of the route) and the frame for it (the
/// peeled packet: the link to the next hop names this node), or the terminal's sealed receipt.
///
/// # Errors
/// None today; a `Reason` if preparing ever can fail.
pub(super) fn prepare(ctx: &Context, next: HopNext, now: u64) -> Result<Next, Reason> {
    let node = &ctx.node;
    Ok(match next {
        HopNext::Forward { next_hop, packet } => {
            let endpoint = match route::endpoint(ctx, &next_hop, now) {
                Ok(endpoint) => endpoint,
                Err(r) => return Ok(Next::Unroutable(r)),
            };
            Next::Forward {
                endpoint,
                next_hop,
                frame: packet,
            }
        }
        HopNext::Terminal {
            payload,
            probe,
            receipt_key,
            message_id,
        } => {
            let commitment = receipt::commitment(&payload);
            Next::Terminal(TerminalWork {
                receipt: terminal::reseal_receipt(
                    node.signing_key(),
                    &message_id,
                    &receipt_key,
                    &commitment,
                    now,
                ),
                probe,
                payload,
                once: Once {
                    message_id,
                    commitment,
                },
                receipt_key,
            })
        }
    })
}

/// The refusal of a request whose next hop this hop cannot reach or reach now, with this hop's
/// failure report sealed under the layer's `report_key`.
pub(super) fn refuse_for_next_hop(reason: Reason, report_key: &[u8; 32]) -> Answer {
    let failure = Failure::Refused {
        status: reason.status(),
        reason: Some(reason.as_str().to_string()),
    };
    Answer::Failed {
        reason,
        report: report::seal(report_key, &failure),
    }
}

/// The next hop with retries, until `deadline`; its health. A failure is answered with a
/// report: the next hop's, masked with this layer's `report_key`, or this hop's own.
pub(super) async fn forward(
    ctx: &Context,
    endpoint: &str,
    tag: &ReplayTag,
    frame: Vec<u8>,
    deadline: crate::clock::Instant,
    turn: Turn,
    report_key: &[u8; 32],
) -> Answer {
    let next_hop = &{ *turn.hop() };
    let outcome = forward::post(
        &ctx.outgoing.links,
        endpoint,
        &frame,
        tag,
        &ctx.counters,
        deadline,
        turn,
    )
    .await;
    let now = ctx.clock.unix();
    let report = match outcome {
        Forwarded::Accepted { receipt } => {
            ctx.health.record_route(next_hop, true, now);
            return Answer::Forwarded { receipt };
        }
        Forwarded::Refused {
            status,
            reason,
            report: passed,
        } => {
            ctx.health.record_refused(next_hop, status, reason, now);
            match passed {
                Some(mut r) => {
                    report::mask(report_key, &mut r);
                    r
                }
                None => report::seal(
                    report_key,
                    &Failure::Refused {
                        status,
                        reason: reason.map(|r| r.as_str().to_string()),
                    },
                ),
            }
        }
        Forwarded::Exhausted => {
            ctx.health
                .record_route_reason(next_hop, false, Bucket::Transport, now);
            ctx.counters.last_retry_exhausted_at.set(now);
            report::seal(report_key, &Failure::Unreachable)
        }
    };
    Answer::Failed {
        reason: Reason::ForwardFailed,
        report,
    }
}

/// At the terminal: the payload committed once per message (a probe's is not stored), then the
/// receipt released; a copy of a message stored before gets the first copy's receipt, sealed
/// again with this copy's receipt key by `key`. Blocking (a SQLite commit).
///
/// # Errors
/// `inbox_full`, `inbox_share_exceeded` or `state_write_failed`.
pub(super) fn store(
    terminal: &Terminal,
    key: &SigningKey,
    next: TerminalWork,
    now: u64,
    source: &Source,
) -> Result<Answer, Reason> {
    let TerminalWork {
        payload,
        receipt,
        probe,
        once,
        receipt_key,
    } = next;
    if probe {
        return Ok(Answer::Delivered {
            receipt,
            probe,
            copy: false,
        });
    }
    let stored = terminal
        .store(&payload, Some(once), now, source.key())
        .map_err(|e| match e {
            Undelivered::Full => Reason::InboxFull,
            Undelivered::ShareExceeded => Reason::InboxShareExceeded,
            Undelivered::Failed => Reason::StateWriteFailed,
        })?;
    Ok(match stored {
        Stored::New(_) => Answer::Delivered {
            receipt,
            probe,
            copy: false,
        },
        Stored::Duplicate {
            delivered_at,
            commitment,
        } => Answer::Delivered {
            receipt: terminal::reseal_receipt(
                key,
                &once.message_id,
                &receipt_key,
                &commitment,
                delivered_at,
            ),
            probe,
            copy: true,
        },
    })
}

/// What the terminal does with a layer: [`store`]'s work.
#[derive(Debug)]
pub(super) struct TerminalWork {
    /// The sender's payload.
    pub(super) payload: Vec<u8>,
    /// The receipt sealed for this copy (released once the payload is stored).
    pub(super) receipt: String,
    /// Another node's probe: answered, not stored.
    pub(super) probe: bool,
    /// The message id and commitment the inbox stores it once under.
    pub(super) once: Once,
    /// To seal the first copy's receipt again, for a copy sent again.
    pub(super) receipt_key: [u8; 32],
}
