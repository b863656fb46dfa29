//! The admission pipeline, one file per design step, run in this order by [`Pipeline`]:
//!
//! 1. [`gate`]: the request gate, a process-wide admission window and at most 64 requests in
//!    flight ([`Pipeline::admit`], before the body is read);
//! 2. [`crypto`]: a free crypto slot (inbound requests get all but one), or backpressure;
//! 3. [`authenticate`]: the envelope's framing and its previous hop's signature;
//! 4. [`hop_guard`]: the previous-hop rate limit and quarantine;
//! 5. [`metadata`]: the envelope's age and future skew;
//! 6. and 7. [`route`]: self-loop; the frame is for this node, its onion layer opens; route loop,
//!    TTL, the next hop's descriptor; then [`reserve`]: the route replay reservation;
//! 8. forward the inner layer ([`crate::forward`], with retries), or deliver at the terminal
//!    ([`crate::terminal`]); then [`reserve`] records the answer for duplicates.
//!
//! Steps 3–7 up to the reservation are CPU work (a signature check, an onion layer, and the
//! signing of what step 8 sends: the next envelope or the sealed receipt); they run on a
//! blocking thread while the crypto slot is held. The slot is given back before any disk work
//! (the reservation, the inbox, the replay record, each a SQLite commit on a blocking thread)
//! and before any network work (the forward).
//!
//! Every step returns a decision: go on, or a [`Reason`]. A scored reason is charged to the
//! authenticated previous hop, and every refusal after authentication is noted in its health.
//! [`Pipeline::process`] ends with an [`Answer`] or a [`Reason`]; the HTTP edge
//! (`api`) turns them into responses. Each request bumps `received` and exactly one
//! outcome counter.

pub mod authenticate;
pub mod crypto;
pub mod gate;
pub mod hop_guard;
pub mod metadata;
pub mod reserve;
pub mod route;

use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, trace};

use self::gate::{Admitted, RequestGate};
use self::hop_guard::HopGuard;
use self::reserve::Reserved;
use self::route::Routed;
use crate::context::{self, Context};
use crate::forward::{self, Forwarded};
use crate::health::Bucket;
use crate::proto::answer::{Accepted, ErrorBody, Outcome};
use crate::proto::envelope::Envelope;
use crate::proto::{NodeId, Prefix, RouteId, probe};
use crate::reason::Reason;
use crate::replay::{Digest, ReplayRegistry, StoredResponse};
use crate::terminal::{self, Terminal};

/// What an admitted request is answered with, unless it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// This node is the terminal: the payload is stored (a probe's is not), the receipt sealed.
    Delivered {
        /// Hex of the sealed receipt.
        receipt: String,
        /// Another node's probe: answered, not stored, not user traffic.
        probe: bool,
    },
    /// The next hop accepted: its receipt, passed back.
    Forwarded {
        /// Hex of the sealed receipt.
        receipt: String,
    },
    /// A duplicate of a completed request: its stored answer, as first sent.
    Replayed(StoredResponse),
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

/// What steps 3–7 found, up to the reservation.
struct Checked {
    /// The authenticated previous hop.
    prev: NodeId,
    /// This hop's route id and the request's digest: the reservation's key.
    route_id: RouteId,
    digest: Digest,
    /// The time the request was checked at.
    now: u64,
    /// What step 8 does, already signed.
    next: Next,
}

/// Step 8, prepared.
enum Next {
    /// Post `envelope` (signed by this node) to `endpoint`.
    Forward {
        endpoint: String,
        next_hop: NodeId,
        envelope: Vec<u8>,
    },
    /// Store `payload` (unless a probe), then release `receipt`.
    Terminal {
        payload: Vec<u8>,
        receipt: String,
        probe: bool,
    },
}

/// The inbound pipeline: its own state (gate, guard, replay registry, terminal) over the shared
/// context.
#[derive(Debug)]
pub struct Pipeline {
    ctx: Arc<Context>,
    gate: RequestGate,
    hops: HopGuard,
    replay: Arc<ReplayRegistry>,
    terminal: Terminal,
}

impl Pipeline {
    /// A pipeline over `ctx`: `window_limit` requests per admission window, `max_in_flight` at
    /// once, reservations in `replay`, deliveries through `terminal`.
    pub fn new(
        ctx: Arc<Context>,
        window_limit: u32,
        max_in_flight: usize,
        replay: Arc<ReplayRegistry>,
        terminal: Terminal,
    ) -> Self {
        Pipeline {
            gate: RequestGate::new(window_limit, max_in_flight, ctx.clock.instant()),
            hops: HopGuard::default(),
            ctx,
            replay,
            terminal,
        }
    }

    /// The shared context.
    pub fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The previous-hop guard.
    pub fn hops(&self) -> &HopGuard {
        &self.hops
    }

    /// The replay registry.
    pub fn replay(&self) -> &ReplayRegistry {
        &self.replay
    }

    /// The terminal.
    pub fn terminal(&self) -> &Terminal {
        &self.terminal
    }

    /// Step 1. Never waits.
    ///
    /// # Errors
    /// `backpressure` (already counted).
    pub fn admit(&self) -> Result<Admitted, Reason> {
        self.gate
            .admit(self.ctx.clock.instant())
            .ok_or_else(|| self.refuse(Reason::Backpressure))
    }

    /// Counts a refusal found outside the steps (the body read at the edge) and returns it.
    pub fn refuse(&self, r: Reason) -> Reason {
        self.record(&Err(r));
        r
    }

    /// Steps 2–8 for an admitted request whose body is `body`; counted.
    ///
    /// # Errors
    /// The refusal.
    pub async fn process(
        self: &Arc<Self>,
        admitted: Admitted,
        body: Vec<u8>,
    ) -> Result<Answer, Reason> {
        let verdict = self.run(body).await;
        self.record(&verdict);
        drop(admitted);
        verdict
    }

    async fn run(self: &Arc<Self>, body: Vec<u8>) -> Result<Answer, Reason> {
        // Step 2, then 3–7 on a blocking thread while the slot is held.
        let slot = crypto::admit(&self.ctx)?;
        let (now, instant) = (self.ctx.clock.unix(), self.ctx.clock.instant());
        let me = Arc::clone(self);
        let (prev, checked) = context::on_crypto_slot(slot, move || {
            let mut prev = None;
            let checked = me.check(&body, now, instant, &mut prev);
            (prev, checked)
        })
        .await
        .ok_or(Reason::ForwardFailed)?;
        let c = checked.inspect_err(|r| self.refused(prev, *r, instant))?;
        // The end of step 7: the reservation, on disk, with no slot held.
        match reserve::reserve(&self.replay, c.route_id, c.digest, c.now).await {
            Ok(Reserved::New) => {}
            Ok(Reserved::Duplicate(stored)) => {
                self.ctx
                    .health
                    .record_contact(&c.prev, self.ctx.clock.unix());
                return Ok(Answer::Replayed(stored));
            }
            Err(r) => {
                self.refused(Some(c.prev), r, instant);
                return Err(r);
            }
        }
        self.ctx
            .health
            .record_contact(&c.prev, self.ctx.clock.unix());
        // Step 8, then the replay record.
        let (verdict, completed_at) = match c.next {
            Next::Forward {
                endpoint,
                next_hop,
                envelope,
            } => {
                trace!(next = %Prefix(&next_hop), "forwarding");
                let verdict = self
                    .forward(&endpoint, &next_hop, &c.route_id, envelope)
                    .await;
                (verdict, self.ctx.clock.unix())
            }
            Next::Terminal {
                payload,
                receipt,
                probe,
            } => (self.deliver(payload, receipt, probe, c.now).await, c.now),
        };
        reserve::complete(
            &self.replay,
            c.route_id,
            c.digest,
            wire(&verdict),
            completed_at,
        )
        .await;
        verdict
    }

    /// Steps 3–7 (up to the reservation) and the signing of step 8's output: CPU work only.
    /// `prev` is set once the previous hop is authenticated.
    fn check(
        &self,
        body: &[u8],
        now: u64,
        instant: Instant,
        prev: &mut Option<NodeId>,
    ) -> Result<Checked, Reason> {
        let env = authenticate::authenticate(body)?;
        *prev = Some(env.previous_hop);
        self.hops
            .check(&env.previous_hop, instant, &self.ctx.counters)?;
        metadata::check(env.timestamp, now)?;
        let next = match route::route(&self.ctx, &env, now)? {
            Routed::Forward {
                endpoint,
                next_hop,
                next_route_id,
                inner,
            } => {
                let next = Envelope::sign(
                    next_route_id,
                    next_hop,
                    env.ttl - 1,
                    now,
                    inner,
                    self.ctx.node.signing_key(),
                );
                Next::Forward {
                    endpoint,
                    next_hop,
                    envelope: next.encode(),
                }
            }
            Routed::Terminal {
                receipt_key,
                payload,
            } => Next::Terminal {
                receipt: terminal::seal_receipt(
                    self.ctx.node.signing_key(),
                    &env.route_id,
                    &receipt_key,
                    &payload,
                    now,
                ),
                probe: probe::is_probe(&payload),
                payload,
            },
        };
        Ok(Checked {
            prev: env.previous_hop,
            route_id: env.route_id,
            digest: env.request_digest(),
            now,
            next,
        })
    }

    /// A refusal of an authenticated previous hop's frame: a scored reason is charged to it,
    /// and its health notes the refusal.
    fn refused(&self, prev: Option<NodeId>, r: Reason, instant: Instant) {
        let Some(prev) = prev else { return };
        if r.is_scored() {
            self.hops.charge(&prev, instant, &self.ctx.counters);
        }
        self.ctx
            .health
            .record_refusal(&prev, r, self.ctx.clock.unix());
    }

    /// Step 8 for a forward: the next hop with retries; its health.
    async fn forward(
        &self,
        endpoint: &str,
        next_hop: &NodeId,
        route_id: &RouteId,
        envelope: Vec<u8>,
    ) -> Result<Answer, Reason> {
        let ctx = &self.ctx;
        let outcome = forward::post(
            &ctx.http,
            endpoint,
            &envelope,
            route_id,
            next_hop,
            &ctx.counters,
        )
        .await;
        let now = ctx.clock.unix();
        match outcome {
            Forwarded::Accepted { receipt } => {
                ctx.health.record_route(next_hop, true, now);
                Ok(Answer::Forwarded { receipt })
            }
            Forwarded::Refused => {
                ctx.health
                    .record_route_reason(next_hop, false, Bucket::Refused, now);
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

    /// Step 8 at the terminal: the payload committed (a probe's is not stored), then the
    /// receipt released.
    async fn deliver(
        &self,
        payload: Vec<u8>,
        receipt: String,
        probe: bool,
        now: u64,
    ) -> Result<Answer, Reason> {
        if !probe && self.terminal.deliver(payload, now).await.is_err() {
            return Err(Reason::ForwardFailed);
        }
        Ok(Answer::Delivered { receipt, probe })
    }

    /// Counts one request's end: `received` and exactly one outcome. Another node's probe is
    /// not user traffic: it moves only `probes_answered`.
    fn record(&self, verdict: &Result<Answer, Reason>) {
        let c = &self.ctx.counters;
        if let Ok(Answer::Delivered { probe: true, .. }) = verdict {
            c.probes_answered.inc();
            return;
        }
        let now = self.ctx.clock.unix();
        c.received.inc();
        c.last_event_at.set(now);
        match verdict {
            Err(r) => {
                c.rejected.inc();
                r.counter(c).inc();
                match r {
                    Reason::Backpressure => c.last_backpressure_at.set(now),
                    Reason::ForwardFailed => c.last_forward_failed_at.set(now),
                    _ if r.is_protection() => c.last_protection_at.set(now),
                    _ => {}
                }
                debug!(reason = r.as_str(), "relay request refused");
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
                c.replay_dropped.inc();
                debug!("relay request answered from the replay registry");
            }
        }
    }
}
