//! How a request ends: an [`Answer`] or a refusal ([`Reason`]), its wire form (as sent and as
//! the replay registry keeps it), and how it is counted ([`record`]: `received` and exactly one
//! outcome).

use tracing::debug;

use crate::counters::Counters;
use crate::proto::answer::{Accepted, ErrorBody, Outcome};
use crate::proto::sphinx::Report;
use crate::reason::Reason;
use crate::replay::StoredResponse;

/// What an admitted request is answered with, unless it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// This node is the terminal: the payload is stored (a probe's is not), the receipt sealed.
    Delivered {
        /// Hex of the sealed receipt.
        receipt: String,
        /// Another node's probe: answered, not stored, not user traffic.
        probe: bool,
        /// A copy of a message stored before (sent again over another route): not stored
        /// again, answered with the first copy's receipt.
        copy: bool,
    },
    /// The next hop accepted: its receipt, passed back.
    Forwarded {
        /// Hex of the sealed receipt.
        receipt: String,
    },
    /// A duplicate of a completed request: its stored answer, as first sent.
    Replayed(StoredResponse),
    /// Refused because this hop could not pass the packet on (`forward_failed`, or a reason
    /// about its next hop), with the failure report for the sender
    /// ([`crate::proto::sphinx::report`]). Counted as the refusal it is.
    Failed {
        /// The refusal.
        reason: Reason,
        /// This hop's report, or the next hop's masked by this hop.
        report: Report,
    },
}

impl Answer {
    /// The HTTP status and JSON body (`docs/blindrelay-protocol.md`).
    pub fn wire(&self) -> (u16, Vec<u8>) {
        let accepted = |outcome, receipt: &str| Accepted {
            outcome,
            receipt: receipt.to_owned(),
        };
        match self {
            Answer::Delivered { receipt, .. } => {
                (200, accepted(Outcome::Delivered, receipt).to_json())
            }
            Answer::Forwarded { receipt } => (200, accepted(Outcome::Forwarded, receipt).to_json()),
            Answer::Replayed(stored) => (stored.status, stored.body.clone()),
            Answer::Failed { reason, report } => {
                let report = hex::encode(report);
                let body = ErrorBody {
                    report: Some(report.as_str().into()),
                    ..ErrorBody::code(reason.as_str())
                };
                (reason.status(), body.to_json())
            }
        }
    }
}

/// The HTTP status and JSON body of an answer or a refusal, as sent and as the replay registry
/// keeps it.
pub fn wire(verdict: &Result<Answer, Reason>) -> (u16, Vec<u8>) {
    match verdict {
        Ok(answer) => answer.wire(),
        Err(r) => (r.status(), ErrorBody::code(r.as_str()).to_json()),
    }
}

/// The reason a request was refused for, if it was: an error, or an answer that failed (a
/// forward's failure passed back).
pub(super) fn refusal(verdict: &Result<Answer, Reason>) -> Option<Reason> {
    match verdict {
        Err(r) | Ok(Answer::Failed { reason: r, .. }) => Some(*r),
        Ok(_) => None,
    }
}

/// Counts one request's end at `now`: `received` and exactly one outcome. Another node's probe
/// is not user traffic: it moves only `probes_answered`.
pub(super) fn record(c: &Counters, verdict: &Result<Answer, Reason>, now: u64) {
    if let Ok(Answer::Delivered { probe: true, .. }) = verdict {
        c.probes_answered.inc();
        return;
    }
    c.received.inc();
    c.last_event_at.set(now);
    if let Some(r) = refusal(verdict) {
        record_refusal(c, r, now);
        return;
    }
    match verdict {
        Ok(Answer::Delivered { copy: true, .. }) => {
            c.duplicate_message.inc();
            c.last_accepted_at.set(now);
            debug!("relay request: a copy of a message delivered here before");
        }
        Ok(Answer::Delivered { .. }) => {
            c.terminal.inc();
            c.last_accepted_at.set(now);
            debug!("relay request delivered here");
        }
        Ok(Answer::Forwarded { .. }) => {
            c.forwarded.inc();
            c.last_accepted_at.set(now);
            debug!("relay request forwarded");
        }
        Ok(Answer::Replayed(_)) => {
            c.duplicate_route.inc();
            debug!("duplicate_route: relay request answered from the replay registry");
        }
        Err(_) | Ok(Answer::Failed { .. }) => {}
    }
}

/// Counts a refusal `r` at `now` (after `received`).
fn record_refusal(c: &Counters, r: Reason, now: u64) {
    c.rejected.inc();
    r.counter(c).inc();
    match r {
        Reason::Backpressure => c.last_backpressure_at.set(now),
        Reason::ForwardFailed => c.last_forward_failed_at.set(now),
        Reason::InboxFull => c.last_inbox_full_at.set(now),
        Reason::ReplayCapacity => c.last_replay_full_at.set(now),
        Reason::NextHopBusy => c.last_next_hop_busy_at.set(now),
        _ if r.is_protection() => c.last_protection_at.set(now),
        _ => {}
    }
    debug!(reason = r.as_str(), "relay request refused");
}
