//! The admission pipeline, one file per design step, run in this order by [`Pipeline`]:
//!
//! 1. [`gate`]: the request gate. Its cheap budget is charged before the body is read
//!    ([`Pipeline::cheap`]); once the body is read (within its deadline, at the HTTP edge) and
//!    framed (the cheap checks: size, framing), the request can be judged and takes its fair
//!    share of the design's process-wide totals: a token of the admission rate and one of the
//!    64 in-flight slots ([`Pipeline::admit`]);
//! 2. [`crypto`]: a crypto slot (inbound requests get all but one, strangers a share of those),
//!    taken at once or refused at once: `backpressure`, or `source_limited` for a stranger
//!    over its share;
//! 3. [`authenticate`]: the v2 frame's framing (a v1 envelope is `v1_not_accepted`), then on the
//!    crypto slot its previous hop's signature ([`v2`]);
//! 4. [`hop_guard`]: the previous-hop rate limit and quarantine;
//! 5. to 7. [`v2`]: self-loop; the layer opens with this node's onion keys (peeled in place, the
//!    same length out as in); its sealed expiry; the next hop from its slot (route loop), then
//!    [`route`]: the next hop's v2 descriptor; then [`reserve`]: the layer's replay tag reserved
//!    through its expiry plus the skew;
//! 8. forward the peeled packet in a frame signed by this node ([`crate::forward`], with
//!    retries), or deliver at the terminal ([`crate::terminal`]); then [`reserve`] records the
//!    answer for duplicates.
//!
//! Steps 3–7 up to the reservation are CPU work (a signature check, a Sphinx layer, and the
//! signing of what step 8 sends: the next frame or the sealed receipt); they run on a
//! blocking thread while the crypto slot is held. The slot is given back before any disk work
//! (the reservation, the inbox, the replay record, each a SQLite commit) and before any
//! network work (the forward). The disk work that follows the checks runs on the same
//! blocking thread once the slot is given back: the reservation, and at the terminal the inbox
//! and the replay record, take no second hop off the reactor (each hop is a thread wake-up
//! there and back); a forward's replay record runs on a blocking thread of its own once the
//! next hop answered.
//!
//! Every step returns a decision: go on, or a [`Reason`]. A refusal after authentication is
//! blamed as [`Reason::blame`] says: only what the previous hop signed itself is charged to it
//! (the design's scored list, less what the sender sealed) or noted in its health.
//! [`Pipeline::process`] ends with an [`Answer`] or a [`Reason`]; the HTTP edge
//! (`api`) turns them into responses. Each request bumps `received` and exactly one
//! outcome counter.

pub mod authenticate;
pub mod crypto;
pub mod gate;
pub mod hop_guard;
pub mod reserve;
pub mod route;
pub mod v2;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, trace};

use self::gate::{GateConfig, RequestGate};
use self::hop_guard::HopGuard;
use self::reserve::Reserved;
use crate::api::serve::Connections;
use crate::context::{self, Context};
use crate::forward::{self, Forwarded, NextHopSlot};
use crate::health::Bucket;
use crate::outbound::Turn;
use crate::proto::answer::{Accepted, ErrorBody, Outcome};
use crate::proto::frame::Frame;
use crate::proto::sphinx::ReplayTag;
use crate::proto::{NodeId, Prefix};
use crate::reason::{Blame, Reason};
use crate::replay::{Digest, ReplayRegistry, StoredResponse};
use crate::sources::{Classifier, Grouping, Source};
use crate::terminal::{self, Terminal, Undelivered};

/// Of a request's deadline, what is kept back to record its answer and reply.
const FINISH_MARGIN: Duration = Duration::from_millis(250);

/// A request the gate admitted: framed, its in-flight slot held until it ends.
#[derive(Debug)]
pub struct Admitted {
    _slot: gate::Admitted,
    frame: Frame,
    source: Source,
    /// When the previous hop must have its answer ([`forward::HOP_DEADLINE`]: a hop does not
    /// know how many hops follow it).
    answer_by: tokio::time::Instant,
    /// When everything this hop does for it must be over: a forward still waiting for its next
    /// hop at `answer_by` goes on until then ([`forward::LATE_DEADLINE`]), so the answer stored
    /// is the next hop's, not a failure of this hop's impatience.
    deadline: tokio::time::Instant,
}

impl Admitted {
    /// When the previous hop must have its answer: if the request is not over by then, it is
    /// answered `503 route_in_flight` (retryable) while it goes on to its deadline, and its
    /// final answer is stored for the retry.
    pub fn answer_by(&self) -> tokio::time::Instant {
        self.answer_by
    }
}

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
    /// The layer's replay tag and the request's digest: the reservation's key.
    tag: ReplayTag,
    digest: Digest,
    /// The time the request was checked at.
    now: u64,
    /// The tag is kept reserved through this second (the layer's expiry plus the skew).
    keep_through: u64,
    /// What step 8 does, already signed.
    next: Next,
}

/// Step 8, prepared.
enum Next {
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

/// Where a request stands when its blocking work is over.
enum Staged {
    /// Answered (a duplicate's stored answer, or the terminal's verdict, recorded).
    Done(Result<Answer, Reason>),
    /// Reserved: step 8 forwards it, then records the answer.
    Forward(Forwarding),
}

/// A reserved layer on its way to the next hop.
struct Forwarding {
    /// Under which the answer is recorded.
    tag: ReplayTag,
    /// See [`Forwarding::tag`].
    digest: Digest,
    /// The next hop's address, and what goes there.
    endpoint: String,
    /// See [`Forwarding::endpoint`].
    frame: Vec<u8>,
    /// Its turn under the next hop's previous-hop rate.
    turn: Turn,
    /// Held until the next hop answered.
    _next_hop_slot: NextHopSlot,
}

/// The inbound pipeline: its own state (gate, sources, guard, replay registry, terminal) over
/// the shared context.
#[derive(Debug)]
pub struct Pipeline {
    ctx: Arc<Context>,
    gate: RequestGate,
    sources: Classifier,
    connections: Connections,
    hops: HopGuard,
    strangers: Arc<crypto::Strangers>,
    replay: Arc<ReplayRegistry>,
    terminal: Terminal,
}

impl Pipeline {
    /// A pipeline over `ctx`: the request gate's `gate` settings, sources grouped by
    /// `grouping`, the relay listener's `connections`, reservations in `replay`, deliveries through `terminal`.
    pub fn new(
        ctx: Arc<Context>,
        gate: GateConfig,
        grouping: Grouping,
        connections: Connections,
        replay: Arc<ReplayRegistry>,
        terminal: Terminal,
    ) -> Self {
        Pipeline {
            gate: RequestGate::new(gate, ctx.clock.instant()),
            sources: Classifier::new(grouping, Arc::clone(&ctx.peers)),
            connections,
            hops: HopGuard::with_rate(hop_guard::MAX_BUCKETS, ctx.hop_rate),
            strangers: crypto::Strangers::new(ctx.crypto.limit()),
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

    /// The crypto slots strangers hold (step 2).
    pub fn strangers(&self) -> &Arc<crypto::Strangers> {
        &self.strangers
    }

    /// The replay registry.
    pub fn replay(&self) -> &ReplayRegistry {
        &self.replay
    }

    /// The terminal.
    pub fn terminal(&self) -> &Terminal {
        &self.terminal
    }

    /// The request gate.
    pub fn gate(&self) -> &RequestGate {
        &self.gate
    }

    /// The relay listener's open connections.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Known and verified sources.
    pub fn sources(&self) -> &Classifier {
        &self.sources
    }

    /// The source of a request from `ip`, now.
    pub fn classify(&self, ip: IpAddr) -> Source {
        self.sources.classify(ip, self.ctx.clock.instant())
    }

    /// Step 1's cheap budget, before the body is read. Never waits.
    ///
    /// # Errors
    /// `source_limited` (already counted).
    pub fn cheap(&self, source: &Source) -> Result<(), Reason> {
        self.gate
            .cheap(source.key(), self.ctx.clock.instant())
            .map_err(|r| self.refuse(r))
    }

    /// The cheap checks (size, framing) of the body read, then step 1's admission. Never
    /// waits.
    ///
    /// # Errors
    /// `v1_not_accepted`, `malformed_envelope`, `source_limited` or `backpressure` (already
    /// counted).
    pub fn admit(&self, source: &Source, body: &[u8]) -> Result<Admitted, Reason> {
        let frame = authenticate::frame(body).map_err(|r| self.refuse(r))?;
        let slot = self
            .gate
            .admit(source.key(), self.ctx.clock.instant())
            .map_err(|r| self.refuse(r))?;
        Ok(Admitted {
            _slot: slot,
            answer_by: tokio::time::Instant::now() + forward::HOP_DEADLINE,
            deadline: tokio::time::Instant::now() + forward::LATE_DEADLINE,
            frame,
            source: *source,
        })
    }

    /// Counts a refusal found outside the steps (the body read at the edge) and returns it.
    pub fn refuse(&self, r: Reason) -> Reason {
        self.record(&Err(r));
        r
    }

    /// Steps 2–8 for an admitted request; counted. Its in-flight slot is held until the end.
    ///
    /// # Errors
    /// The refusal.
    pub async fn process(self: &Arc<Self>, admitted: Admitted) -> Result<Answer, Reason> {
        let Admitted {
            _slot,
            frame,
            source,
            deadline,
            ..
        } = admitted;
        let verdict = self.run(frame, &source, deadline).await;
        self.record(&verdict);
        verdict
    }

    async fn run(
        self: &Arc<Self>,
        frame: Frame,
        source: &Source,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, Reason> {
        // Step 2, then 3–7 on a blocking thread while the slot (and a stranger's share) is held;
        // then, the slot given back, the reservation on the same thread (and at the terminal,
        // step 8 and the replay record): one hop off the reactor for all of it.
        let (slot, share) = crypto::admit(&self.ctx, &self.strangers, source.key())?;
        let (now, instant) = (self.ctx.clock.unix(), self.ctx.clock.instant());
        let (me, then) = (Arc::clone(self), Arc::clone(self));
        let source = *source;
        let staged = context::on_crypto_slot_then(
            slot,
            move || {
                let mut prev = None;
                let checked = me.check(frame, now, instant, &mut prev);
                drop(share);
                (prev, checked)
            },
            move |(prev, checked)| then.reserve_and_deliver(prev, checked, &source, instant),
        )
        .await
        .ok_or(Reason::ForwardFailed)??;
        let f = match staged {
            Staged::Done(verdict) => return verdict,
            Staged::Forward(f) => f,
        };
        // Step 8 (the next hop's slot held to the end), then the replay record.
        trace!(next = %Prefix(f.turn.hop()), "forwarding");
        let until = deadline.checked_sub(FINISH_MARGIN).unwrap_or(deadline);
        let verdict = self
            .forward(&f.endpoint, &f.tag, f.frame, until, f.turn)
            .await;
        let completed_at = self.ctx.clock.unix();
        reserve::complete(&self.replay, f.tag, f.digest, wire(&verdict), completed_at).await;
        verdict
    }

    /// What follows steps 3–7 on their blocking thread, with no crypto slot held (blocking:
    /// SQLite commits): the refusal of what they refused; the next hop's slot and place; the
    /// end of step 7, the reservation, on disk; then at the terminal step 8 (the payload
    /// committed, the receipt released) and the replay record. A forward is staged for the
    /// reactor.
    fn reserve_and_deliver(
        &self,
        prev: Option<NodeId>,
        checked: Result<Checked, Reason>,
        source: &Source,
        instant: Instant,
    ) -> Result<Staged, Reason> {
        let c = checked.inspect_err(|r| self.refused(prev, *r, instant))?;
        let (next_hop_slot, turn) = self.next_hop(&c.next)?;
        let reserved = reserve::reserve(
            &self.replay,
            c.tag,
            c.digest,
            c.now,
            c.keep_through,
            source.key(),
        );
        match reserved {
            Ok(Reserved::New) => {}
            Ok(Reserved::Duplicate(stored)) => {
                self.ctx
                    .health
                    .record_contact(&c.prev, self.ctx.clock.unix());
                return Ok(Staged::Done(Ok(Answer::Replayed(stored))));
            }
            Err(r) => {
                self.refused(Some(c.prev), r, instant);
                return Err(r);
            }
        }
        let now = self.ctx.clock.unix();
        // A known peer, authenticated: its address is known from now on (a peer whose
        // connections do not come from its descriptor's endpoint), and its health row is kept
        // before strangers' ones.
        if self.ctx.peers.descriptor(&c.prev, now).is_ok() {
            self.ctx.health.record_known_contact(&c.prev, now);
            self.sources.verified(source, self.ctx.clock.instant());
        } else {
            self.ctx.health.record_contact(&c.prev, now);
        }
        let verdict = match (c.next, turn, next_hop_slot) {
            (
                Next::Forward {
                    endpoint, frame, ..
                },
                Some(turn),
                Some(slot),
            ) => {
                return Ok(Staged::Forward(Forwarding {
                    tag: c.tag,
                    digest: c.digest,
                    endpoint,
                    frame,
                    turn,
                    _next_hop_slot: slot,
                }));
            }
            (Next::Forward { .. }, _, _) => Err(Reason::ForwardFailed),
            (
                Next::Terminal {
                    payload,
                    receipt,
                    probe,
                },
                _,
                _,
            ) => self.deliver(&payload, receipt, probe, c.now, source),
        };
        reserve::complete_now(&self.replay, c.tag, c.digest, wire(&verdict), c.now);
        Ok(Staged::Done(verdict))
    }

    /// A forward's slot to its next hop and its place in the next hop's queue: a next hop with
    /// its most requests in flight, or a full queue of requests waiting for their turn to it,
    /// is refused before anything is reserved.
    fn next_hop(&self, next: &Next) -> Result<(Option<NextHopSlot>, Option<Turn>), Reason> {
        let Next::Forward {
            next_hop, frame, ..
        } = next
        else {
            return Ok((None, None));
        };
        let slot = self
            .ctx
            .next_hops
            .acquire(next_hop)
            .ok_or(Reason::NextHopBusy)?;
        let turn = self
            .ctx
            .pacer
            .join(next_hop, frame.len())
            .map_err(|_| Reason::NextHopQueueFull)?;
        Ok((Some(slot), Some(turn)))
    }

    /// Steps 3–7 (up to the reservation) and the signing of step 8's output: CPU work only.
    /// `prev` is set once the previous hop is authenticated.
    fn check(
        &self,
        frame: Frame,
        now: u64,
        instant: Instant,
        prev: &mut Option<NodeId>,
    ) -> Result<Checked, Reason> {
        let node = &self.ctx.node;
        let secrets = node.onion_secrets(now);
        let refs: Vec<_> = secrets.iter().collect();
        let guard = |p: &NodeId| self.hops.check(p, instant, &self.ctx.counters);
        let c = v2::check(node.id(), &refs, frame, now, prev, guard)?;
        let next = match c.next {
            v2::HopNext::Forward { next_hop, packet } => {
                let endpoint = route::next_hop(&self.ctx, &next_hop, now)?;
                let frame = Frame::sign(packet, node.signing_key(), &next_hop)
                    .map_err(|_| Reason::ForwardFailed)?;
                Next::Forward {
                    endpoint,
                    next_hop,
                    frame: frame.encode(),
                }
            }
            v2::HopNext::Terminal {
                payload,
                probe,
                receipt_key,
            } => Next::Terminal {
                receipt: terminal::seal_receipt(
                    node.signing_key(),
                    &c.tag,
                    &receipt_key,
                    &payload,
                    now,
                ),
                probe,
                payload,
            },
        };
        Ok(Checked {
            prev: c.prev,
            tag: c.tag,
            digest: c.digest,
            now,
            keep_through: c.keep_through,
            next,
        })
    }

    /// A refusal of an authenticated previous hop's frame, blamed as [`Reason::blame`] says:
    /// a reason the previous hop could have checked itself and on the design's list is charged
    /// to it; its health notes only refusals of what it signed itself. What the sender sealed,
    /// duplicates and this node's own state leave it untouched (its contact is still noted).
    fn refused(&self, prev: Option<NodeId>, r: Reason, instant: Instant) {
        let Some(prev) = prev else { return };
        let now = self.ctx.clock.unix();
        if r.is_charged() {
            self.hops.charge(&prev, instant, &self.ctx.counters);
        }
        match r.blame() {
            Blame::PreviousHop | Blame::PreviousHopUnscored => {
                self.ctx.health.record_refusal(&prev, r, now);
                // Its row is kept while the quarantine lasts, whatever fills the table.
                let left = self.hops.quarantine_left(&prev, instant);
                if left > 0 {
                    self.ctx.health.record_quarantine(&prev, now + left, now);
                }
            }
            Blame::Sender | Blame::Nobody | Blame::ThisNode => {
                self.ctx.health.record_contact(&prev, now);
            }
        }
    }

    /// Step 8 for a forward: the next hop with retries; its health.
    async fn forward(
        &self,
        endpoint: &str,
        tag: &ReplayTag,
        frame: Vec<u8>,
        deadline: tokio::time::Instant,
        turn: Turn,
    ) -> Result<Answer, Reason> {
        let ctx = &self.ctx;
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

    /// Step 8 at the terminal: the payload committed (a probe's is not stored), then the
    /// receipt released. Blocking (a SQLite commit).
    fn deliver(
        &self,
        payload: &[u8],
        receipt: String,
        probe: bool,
        now: u64,
        source: &Source,
    ) -> Result<Answer, Reason> {
        if !probe {
            self.terminal
                .store(payload, now, source.key())
                .map_err(|e| match e {
                    Undelivered::Full => Reason::InboxFull,
                    Undelivered::ShareExceeded => Reason::InboxShareExceeded,
                    Undelivered::Failed => Reason::StateWriteFailed,
                })?;
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
                    Reason::InboxFull => c.last_inbox_full_at.set(now),
                    Reason::ReplayCapacity => c.last_replay_full_at.set(now),
                    Reason::NextHopBusy => c.last_next_hop_busy_at.set(now),
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
                c.duplicate_route.inc();
                debug!("duplicate_route: relay request answered from the replay registry");
            }
        }
    }
}
