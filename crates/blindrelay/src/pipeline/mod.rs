//! The relay request's pipeline, in the order it runs. Each stage is a module, declared below
//! in that order; this file only sequences them. The design's step numbers (its table is in
//! `docs/blindrelay.md`, "The pipeline") are given in brackets: the order differs from the
//! design's where a cheaper check can refuse before a dearer one.
//!
//! On the way in ([`ingress`], [`Pipeline::take_in`], for both transports):
//!
//! 1. [`gate`], cheap budget (design 1): a token of the source's own bucket, before the body is
//!    read; then the declared length and the body within its deadline;
//! 2. [`authenticate`] (design 3): the previous hop is the link's client, authenticated by mutual
//!    TLS; the body is one v2 frame (a v1 envelope is `v1_not_accepted`, any other fault
//!    `malformed_envelope`, blamed on the previous hop). Before admission: a frame that is not
//!    one costs the gate no token;
//! 3. [`gate`], admission (design 1): the source's fair share of a token of the admission rate
//!    and of an in-flight slot.
//!
//! Then, in the request's own task ([`Pipeline::process`]):
//!
//! 4. [`crypto`] (design 2): a crypto slot, taken at once or refused at once (`backpressure`, or
//!    `source_limited` for a stranger over its share);
//! 5. [`hop_guard`] (design 4): the previous hop's rate and quarantine;
//! 6. [`self_loop`] (design 6): the previous hop is not this node; it needs no key, so it runs
//!    before the layer is opened;
//! 7. [`peel`] (design 5): this node's layer opened (peeled in place, the same length out as in)
//!    and the expiry sealed in it checked;
//! 8. [`route`] (design 7): the route loop and the next hop's v2 descriptor;
//! 9. [`reserve`] (design 7): the layer's replay tag reserved through its expiry plus the skew;
//! 10. [`deliver`] (design 8): forward the peeled packet to the next hop over this node's link
//!     ([`crate::forward`], with retries), or deliver at the terminal ([`crate::terminal`]);
//!     then [`reserve`] records the answer for duplicates.
//!
//! Each stage is a function of its input and the time that returns its output or a [`Reason`].
//! Stages 5–8 and stage 10's preparation (the receipt sealed at a terminal) are CPU work
//! ([`check_frame`] and [`deliver::prepare`]); they run on a blocking thread while the crypto
//! slot is held. The slot is given back before any disk work (the reservation and the inbox,
//! each a SQLite commit) and before any network work (the forward). The disk work that follows
//! the checks runs on the same blocking thread once the slot is given back (each hop off the
//! reactor is a thread wake-up there and back); the replay record waits for no commit (it is
//! written with the registry's next one), so a forward's is taken on the reactor once the next
//! hop answered: one hop off the reactor per request.
//!
//! A refusal after authentication is blamed as [`Reason::blame`] says
//! ([`hop_guard::HopGuard::blame`]): only what the previous hop sent on its own link is charged
//! to it (the design's scored list, less what the sender sealed) or noted in its health.
//! [`Pipeline::process`] ends with an [`Answer`] or a [`Reason`]; the HTTP edge (`api`) turns
//! them into responses. Each request bumps `received` and exactly one outcome counter
//! ([`answer`]). [`pressure`] notes whose requests backpressure fell on.

pub mod answer;
pub mod authenticate;
pub mod crypto;
pub mod deliver;
pub mod gate;
pub mod hop_guard;
pub mod ingress;
pub mod peel;
pub mod pressure;
pub mod reserve;
pub mod route;
pub mod self_loop;

use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, debug_span, trace};
use x25519_dalek::StaticSecret;

pub use self::answer::{Answer, wire};
use self::deliver::Next;
use self::gate::{GateConfig, RequestGate};
use self::hop_guard::HopGuard;
use self::pressure::{Culprit, Pressure};
use self::reserve::Reserved;
pub use self::route::HopNext;
use crate::clock::Instant;
use crate::context::{self, Context};
use crate::forward::NextHopSlot;
use crate::outbound::Turn;
use crate::proto::frame::Frame;
use crate::proto::sphinx::{self, ReplayTag};
use crate::proto::{NodeId, Prefix};
use crate::reason::Reason;
use crate::replay::{Digest, ReplayRegistry};
use crate::sources::{Classifier, Grouping, Source, SourceKey};
use crate::terminal::Terminal;

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
    answer_by: Instant,
    /// When everything this hop does for it must be over: a forward still waiting for its next
    /// hop at `answer_by` goes on until then ([`forward::LATE_DEADLINE`]), so the answer stored
    /// is the next hop's, not a failure of this hop's impatience.
    deadline: Instant,
}

impl Admitted {
    /// When the previous hop must have its answer: if the request is not over by then, it is
    /// answered `503 route_in_flight` (retryable) while it goes on to its deadline, and its
    /// final answer is stored for the retry.
    pub fn answer_by(&self) -> Instant {
        self.answer_by
    }
}

/// A frame that passed the checks from [`hop_guard`] to [`route`] ([`check_frame`]).
#[derive(Debug)]
pub struct HopChecked {
    /// The authenticated previous hop.
    pub prev: NodeId,
    /// The layer's replay tag: the reservation's key, whatever frame carries the layer.
    pub tag: ReplayTag,
    /// The layer's failure report key: seals what this hop reports of its next hop.
    pub report_key: [u8; 32],
    /// SHA-256 of previous hop and packet: a retry of the same frame has the same digest.
    pub digest: Digest,
    /// The layer's expiry (Unix seconds).
    pub expires_at: u64,
    /// Keep the tag reserved through this second: `expires_at` + [`sphinx::EXPIRY_SKEW`], after
    /// which the layer is refused anyway.
    pub keep_through: u64,
    /// What [`deliver`] does with it.
    pub next: HopNext,
}

/// The checks from [`hop_guard`] to [`route`] for `frame` (its previous hop authenticated by its link) at
/// node `me` holding `secrets` (current onion key first), at `now`: CPU work only. `prev` is
/// set to the previous hop, so a refusal can be blamed; `guard` ([`hop_guard`]) is asked about it
/// before any other work.
///
/// # Errors
/// The guard's refusal, `self_loop`, `onion_peel_failed`, `timestamp_expired`,
/// `timestamp_in_future` or `route_loop`.
pub fn check_frame(
    me: &NodeId,
    secrets: &[&StaticSecret],
    frame: Frame,
    now: u64,
    prev: &mut Option<NodeId>,
    guard: impl FnOnce(&NodeId) -> Result<(), Reason>,
) -> Result<HopChecked, Reason> {
    let from = frame.previous_hop;
    *prev = Some(from);
    guard(&from)?;
    self_loop::check(&from, me)?;
    let digest = frame.request_digest();
    let mut packet = frame.packet;
    let opened = peel::open(secrets, &mut packet, now)?;
    let next = route::next(opened.slot, packet, &from, me)?;
    Ok(HopChecked {
        prev: from,
        tag: opened.tag,
        report_key: opened.report_key,
        digest,
        expires_at: opened.expires_at,
        keep_through: opened.expires_at.saturating_add(sphinx::EXPIRY_SKEW),
        next,
    })
}

/// What the checks found, up to the reservation, with [`deliver`] prepared.
struct Checked {
    /// The authenticated previous hop.
    prev: NodeId,
    /// The layer's replay tag and the request's digest: the reservation's key.
    tag: ReplayTag,
    digest: Digest,
    /// The layer's failure report key.
    report_key: [u8; 32],
    /// The time the request was checked at.
    now: u64,
    /// The tag is kept reserved through this second (the layer's expiry plus the skew).
    keep_through: u64,
    /// What [`deliver`] does, prepared (a terminal's receipt sealed).
    next: Next,
}

/// Where a request stands when its blocking work is over.
enum Staged {
    /// Answered (a duplicate's stored answer, or the terminal's verdict, recorded).
    Done(Result<Answer, Reason>),
    /// Reserved: [`deliver`] forwards it, then the answer is recorded.
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
    /// Seals or masks the failure report if the next hop fails.
    report_key: [u8; 32],
    /// Held until the next hop answered.
    _next_hop_slot: NextHopSlot,
}

/// The node's stores: what the pipeline writes and the operator reads. One value, built once by
/// [`Relay::new`], which hands it to the pipeline it builds.
#[derive(Debug)]
pub struct Stores {
    /// The replay registry (its answers written by a task of its own).
    pub replay: Arc<ReplayRegistry>,
    /// The terminal: the inbox and its shares.
    pub terminal: Terminal,
}

/// The inbound pipeline: admits and processes relay requests. Its own state (gate, sources,
/// previous-hop guard, strangers' crypto share) over the shared context, the replay registry
/// and the terminal.
#[derive(Debug)]
pub struct Pipeline {
    ctx: Arc<Context>,
    gate: RequestGate,
    sources: Classifier,
    hops: HopGuard,
    strangers: Arc<crypto::Strangers>,
    pressure: Pressure,
    /// The node's stores, owned by [`crate::relay::Relay`].
    stores: Arc<Stores>,
}

impl Pipeline {
    /// A pipeline over `ctx`: the request gate's `gate` settings, sources grouped by
    /// `grouping`, reservations and deliveries in `stores` (built by [`crate::relay::Relay`]).
    pub(crate) fn new(
        ctx: Arc<Context>,
        gate: GateConfig,
        grouping: Grouping,
        stores: Arc<Stores>,
    ) -> Self {
        Pipeline {
            gate: RequestGate::new(gate, ctx.clock.instant()),
            sources: Classifier::new(grouping, Arc::clone(&ctx.peers)),
            hops: HopGuard::with_rate(hop_guard::MAX_BUCKETS, ctx.outgoing.pacer.rate()),
            strangers: crypto::Strangers::new(ctx.crypto.limit()),
            pressure: Pressure::default(),
            ctx,
            stores,
        }
    }

    /// The shared context.
    pub fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The previous-hop guard ([`hop_guard`]).
    pub fn hops(&self) -> &HopGuard {
        &self.hops
    }

    /// The crypto slots strangers hold ([`crypto`]).
    pub fn strangers(&self) -> &Arc<crypto::Strangers> {
        &self.strangers
    }

    /// Whose requests backpressure fell on.
    pub fn pressure(&self) -> &Pressure {
        &self.pressure
    }

    /// The request gate ([`gate`]).
    pub fn gate(&self) -> &RequestGate {
        &self.gate
    }

    /// Known and verified sources.
    pub fn sources(&self) -> &Classifier {
        &self.sources
    }

    /// The cheap budget and a crypto slot for other signature work than a relay
    /// request's (a gossiped descriptor), refused as a relay request would be but not counted
    /// as one. Never waits.
    ///
    /// # Errors
    /// `source_limited` or `backpressure`.
    pub fn admit_other(
        &self,
        source: &Source,
    ) -> Result<(context::CryptoSlot, Option<crypto::StrangerSlot>), Reason> {
        self.gate.cheap(source.key(), self.ctx.clock.instant())?;
        crypto::admit(&self.ctx, &self.strangers, source.key()).inspect_err(|r| {
            if *r == Reason::Backpressure {
                self.pressure
                    .note(Culprit::Source(source.key()), self.ctx.clock.unix());
            }
        })
    }

    /// Counts how a request from `source` on `link`'s link ended: its outcome
    /// ([`answer::record`]), a stranger's refusal (`strangers_refused`), and whose request a
    /// `backpressure` refusal fell on ([`Pressure`]).
    fn settle(&self, source: &Source, link: Option<NodeId>, verdict: &Result<Answer, Reason>) {
        let now = self.ctx.clock.unix();
        answer::record(&self.ctx.counters, verdict, now);
        let Some(r) = answer::refusal(verdict) else {
            return;
        };
        if !source.key().is_known() {
            self.ctx.counters.strangers_refused.inc();
        }
        if r == Reason::Backpressure {
            let culprit = match (source.key(), link) {
                (SourceKey::Known(_), Some(id)) => Culprit::Peer(id),
                (key, _) => Culprit::Source(key),
            };
            self.pressure.note(culprit, now);
        }
    }

    /// The stages from [`crypto`] to [`deliver`] for an admitted request; counted. Its in-flight slot is held until the end.
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
        let link = Some(frame.previous_hop);
        // What an operator's debug log shows of a request's life: no id, address or payload.
        let span = debug_span!("relay", known = source.key().is_known(), class = ?frame.class);
        async {
            let verdict = self.run(frame, &source, deadline).await;
            self.settle(&source, link, &verdict);
            verdict
        }
        .instrument(span)
        .await
    }

    async fn run(
        self: &Arc<Self>,
        frame: Frame,
        source: &Source,
        deadline: Instant,
    ) -> Result<Answer, Reason> {
        // The crypto slot, then the checks on a blocking thread while it (and a stranger's share) is held;
        // then, the slot given back, the reservation on the same thread (and at the terminal,
        // the delivery and the replay record): one hop off the reactor for all of it.
        // A known peer whose frames keep failing the peel takes a stranger's share.
        let key = match source.key() {
            SourceKey::Known(ip)
                if self
                    .hops
                    .suspect(&frame.previous_hop, self.ctx.clock.instant()) =>
            {
                SourceKey::Net(ip)
            }
            key => key,
        };
        let (slot, share) = crypto::admit(&self.ctx, &self.strangers, key)?;
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
        // The forward (the next hop's slot held to the end), then the replay record.
        trace!(next = %Prefix(f.turn.hop()), "forwarding");
        let until = deadline.checked_sub(FINISH_MARGIN).unwrap_or(deadline);
        let verdict = Ok(deliver::forward(
            &self.ctx,
            &f.endpoint,
            &f.tag,
            f.frame,
            until,
            f.turn,
            &f.report_key,
        )
        .await);
        let completed_at = self.ctx.clock.unix();
        reserve::complete(
            &self.stores.replay,
            f.tag,
            f.digest,
            wire(&verdict),
            completed_at,
        );
        verdict
    }

    /// The checks (up to the reservation) and [`deliver`]'s preparation: CPU work only. `prev` is set
    /// once the previous hop is authenticated.
    fn check(
        &self,
        frame: Frame,
        now: u64,
        instant: std::time::Instant,
        prev: &mut Option<NodeId>,
    ) -> Result<Checked, Reason> {
        let secrets = self.ctx.node.onion_secrets(now);
        let refs: Vec<_> = secrets.iter().collect();
        let guard = |p: &NodeId| self.hops.check(p, instant, &self.ctx.counters);
        let c = check_frame(self.ctx.node.id(), &refs, frame, now, prev, guard)?;
        Ok(Checked {
            next: deliver::prepare(&self.ctx, c.next, now)?,
            prev: c.prev,
            tag: c.tag,
            digest: c.digest,
            report_key: c.report_key,
            now,
            keep_through: c.keep_through,
        })
    }

    /// What follows the checks on their blocking thread, with no crypto slot held (blocking:
    /// SQLite commits): the refusal of what they refused; the next hop's slot and place;
    /// [`reserve`], on disk; then at the terminal [`deliver`] (the payload committed, the
    /// receipt released) and the replay record. A forward is staged for the reactor.
    fn reserve_and_deliver(
        &self,
        prev: Option<NodeId>,
        checked: Result<Checked, Reason>,
        source: &Source,
        instant: std::time::Instant,
    ) -> Result<Staged, Reason> {
        let c = checked.inspect_err(|r| self.refused(prev, *r, instant))?;
        if let Next::Unroutable(r) = c.next {
            self.refused(Some(c.prev), r, instant);
            return Ok(Staged::Done(Ok(deliver::refuse_for_next_hop(
                r,
                &c.report_key,
            ))));
        }
        let (next_hop_slot, turn) = match self.next_hop(&c.next) {
            Ok(held) => held,
            Err(r) => {
                return Ok(Staged::Done(Ok(deliver::refuse_for_next_hop(
                    r,
                    &c.report_key,
                ))));
            }
        };
        let reserved = reserve::reserve(
            &self.stores.replay,
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
        self.note_contact(&c.prev, source);
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
                    report_key: c.report_key,
                    _next_hop_slot: slot,
                }));
            }
            (Next::Forward { .. } | Next::Unroutable(_), _, _) => Err(Reason::ForwardFailed),
            (Next::Terminal(work), _, _) => deliver::store(
                &self.stores.terminal,
                self.ctx.node.signing_key(),
                work,
                c.now,
                source,
            ),
        };
        reserve::complete(&self.stores.replay, c.tag, c.digest, wire(&verdict), c.now);
        Ok(Staged::Done(verdict))
    }

    /// An authenticated previous hop whose layer was reserved: a known peer's address is known
    /// from now on (a peer whose connections do not come from its descriptor's endpoint), and
    /// its health row is kept before strangers' ones.
    fn note_contact(&self, prev: &NodeId, source: &Source) {
        let now = self.ctx.clock.unix();
        if self.ctx.peers.descriptor(prev, now).is_ok() {
            self.ctx.health.record_known_contact(prev, now);
            self.sources.verified(source, self.ctx.clock.instant());
        } else {
            self.ctx.health.record_contact(prev, now);
        }
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
            .outgoing
            .next_hops
            .acquire(next_hop)
            .ok_or(Reason::NextHopBusy)?;
        let turn = self
            .ctx
            .outgoing
            .pacer
            .join(next_hop, frame.len())
            .map_err(|_| Reason::NextHopQueueFull)?;
        Ok((Some(slot), Some(turn)))
    }

    /// A refusal of what the authenticated previous hop `prev` sent (none: not authenticated,
    /// nobody to blame), blamed by [`hop_guard`].
    fn refused(&self, prev: Option<NodeId>, r: Reason, instant: std::time::Instant) {
        let Some(prev) = prev else { return };
        let ctx = &self.ctx;
        let now = ctx.clock.unix();
        self.hops
            .blame(&prev, r, (now, instant), &ctx.counters, &ctx.health);
    }
}

#[cfg(test)]
mod tests;
