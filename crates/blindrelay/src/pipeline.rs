//! The admission pipeline, in the design's order:
//!
//! 1. request gate: a process-wide admission window and at most 64 requests in flight;
//! 2. crypto admission: a free crypto slot (inbound requests get all but one), or backpressure;
//! 3. authenticate the previous hop's signature;
//! 4. previous-hop rate limit and quarantine ([`crate::hopguard`]);
//! 5. envelope metadata: size, age, future skew;
//! 6. self-loop;
//! 7. the frame must be for this node; its onion layer is opened (the next steps need what it
//!    says); route loop, TTL, next-hop descriptor, then the route replay reservation;
//! 8. forward the opaque inner layer, or store the terminal payload and sign the receipt.
//!
//! Steps 2–7 (and the terminal's step 8) are one synchronous function, [`Relay::decide`], run
//! off the async reactor while the crypto slot is held; forwarding (network) runs after the slot
//! is given back. Every refusal is one [`Reason`]: a stable string, an HTTP status, and exactly
//! one aggregate counter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard::admission::{Gate, Permit};
use serde_json::json;
use tracing::{debug, trace};

use crate::clock::Clock;
use crate::counters::Counters;
use crate::forward::{self, Forwarded};
use crate::health::{Bucket, Health};
use crate::hopguard::{HopGuard, Scored, Verdict};
use crate::node::Node;
use crate::peers::{PeerError, Peers};
use crate::proto::envelope::{AuthError, DecodeError, Envelope, MAX_BLOB};
use crate::proto::onion::{self, Layer};
use crate::proto::receipt::{self, Receipt};
use crate::proto::{NodeId, Prefix, RouteId};
use crate::replay::{Outcome, ReplayRegistry};
use crate::terminal::Inbox;

/// Requests in flight at most.
pub const MAX_IN_FLIGHT: usize = 64;
/// Oldest envelope timestamp accepted.
pub const MAX_AGE_SECS: u64 = 600;
/// Furthest-future envelope timestamp accepted.
pub const MAX_SKEW_SECS: u64 = 120;

/// Why a request was refused: one stable reason, one status, one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No capacity now (request gate or crypto slots).
    Backpressure,
    /// Not an envelope (bad magic, truncated).
    MalformedEnvelope,
    /// Over the size limit.
    EnvelopeTooLarge,
    /// The previous hop is not a valid Ed25519 key.
    InvalidPreviousHop,
    /// The signature does not verify.
    InvalidSignature,
    /// Over the previous hop's rate: a quarantine starts.
    RateLimited,
    /// The previous hop is quarantined.
    Quarantined,
    /// Older than [`MAX_AGE_SECS`].
    TimestampExpired,
    /// More than [`MAX_SKEW_SECS`] ahead.
    TimestampInFuture,
    /// The previous hop is this node.
    SelfLoop,
    /// The frame is addressed to another node.
    WrongHop,
    /// The onion layer does not open with this node's keys.
    OnionPeelFailed,
    /// The next hop is the previous hop or this node.
    RouteLoop,
    /// No hop left to forward with.
    TtlExhausted,
    /// No valid descriptor for the next hop.
    NoRoute,
    /// The next hop's endpoint is not allowed.
    InvalidEndpoint,
    /// The same request is being handled.
    RouteInFlight,
    /// Another request used this route id.
    ReplayConflict,
    /// The same request, but its stored response is too old to replay.
    ReplayResponseExpired,
    /// Every replay slot holds a live route.
    ReplayCapacity,
    /// The next hop or the terminal store failed.
    ForwardFailed,
}

impl Reason {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        use Reason::*;
        match self {
            Backpressure => "backpressure",
            MalformedEnvelope => "malformed_envelope",
            EnvelopeTooLarge => "envelope_too_large",
            InvalidPreviousHop => "invalid_previous_hop",
            InvalidSignature => "invalid_signature",
            RateLimited => "rate_limited",
            Quarantined => "quarantined",
            TimestampExpired => "timestamp_expired",
            TimestampInFuture => "timestamp_in_future",
            SelfLoop => "self_loop",
            WrongHop => "wrong_hop",
            OnionPeelFailed => "onion_peel_failed",
            RouteLoop => "route_loop",
            TtlExhausted => "ttl_exhausted",
            NoRoute => "no_route",
            InvalidEndpoint => "invalid_endpoint",
            RouteInFlight => "route_in_flight",
            ReplayConflict => "replay_conflict",
            ReplayResponseExpired => "replay_response_expired",
            ReplayCapacity => "replay_capacity",
            ForwardFailed => "forward_failed",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> u16 {
        use Reason::*;
        match self {
            Backpressure | RateLimited | Quarantined => 429,
            EnvelopeTooLarge => 413,
            MalformedEnvelope | InvalidPreviousHop | InvalidSignature | TimestampExpired
            | TimestampInFuture | SelfLoop | WrongHop | OnionPeelFailed | RouteLoop
            | TtlExhausted | ReplayConflict => 400,
            ReplayResponseExpired => 409,
            NoRoute | InvalidEndpoint | ForwardFailed => 502,
            RouteInFlight | ReplayCapacity => 503,
        }
    }

    /// The one aggregate counter it bumps (besides `received` and `rejected`).
    pub fn counter(self, c: &Counters) -> &guard::counters::Counter {
        use Reason::*;
        match self {
            Backpressure => &c.backpressure_dropped,
            MalformedEnvelope | EnvelopeTooLarge => &c.envelope_too_large,
            InvalidPreviousHop | InvalidSignature | OnionPeelFailed => &c.invalid_signature,
            RateLimited => &c.rate_limited,
            Quarantined => &c.quarantined,
            TimestampExpired | TimestampInFuture => &c.timestamp_rejected,
            SelfLoop | RouteLoop => &c.loop_detected,
            TtlExhausted => &c.ttl_exhausted,
            WrongHop | NoRoute => &c.no_route,
            InvalidEndpoint => &c.invalid_endpoint,
            RouteInFlight | ReplayConflict | ReplayResponseExpired | ReplayCapacity => {
                &c.replay_dropped
            }
            ForwardFailed => &c.forward_failed,
        }
    }

    /// A refusal by the abuse guard: the node is protecting itself (status `protecting`).
    pub fn is_protection(self) -> bool {
        use Reason::*;
        matches!(
            self,
            InvalidPreviousHop
                | InvalidSignature
                | OnionPeelFailed
                | RateLimited
                | Quarantined
                | TimestampExpired
                | TimestampInFuture
                | SelfLoop
                | RouteLoop
                | TtlExhausted
        )
    }

    /// Every reason, for the docs' table and tests.
    pub const ALL: [Reason; 21] = {
        use Reason::*;
        [
            Backpressure,
            MalformedEnvelope,
            EnvelopeTooLarge,
            InvalidPreviousHop,
            InvalidSignature,
            RateLimited,
            Quarantined,
            TimestampExpired,
            TimestampInFuture,
            SelfLoop,
            WrongHop,
            OnionPeelFailed,
            RouteLoop,
            TtlExhausted,
            NoRoute,
            InvalidEndpoint,
            RouteInFlight,
            ReplayConflict,
            ReplayResponseExpired,
            ReplayCapacity,
            ForwardFailed,
        ]
    };
}

/// An HTTP answer: status and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Vec<u8>,
}

impl Reply {
    fn error(r: Reason) -> Reply {
        Reply {
            status: r.status(),
            body: json!({"error": r.as_str()}).to_string().into_bytes(),
        }
    }

    fn success(outcome: &str, sealed_receipt: &str) -> Reply {
        Reply {
            status: 200,
            body: json!({"outcome": outcome, "receipt": sealed_receipt})
                .to_string()
                .into_bytes(),
        }
    }
}

/// What steps 2–7 decided.
#[derive(Debug)]
pub enum Decision {
    /// Answer now.
    Reply(Reply, Record),
    /// Forward `envelope` (already signed by this node) to `endpoint`, then complete the
    /// reservation of (`route_id`, `digest`).
    Forward {
        /// The next hop's endpoint.
        endpoint: String,
        /// The next hop.
        next_hop: NodeId,
        /// The envelope for it.
        envelope: Vec<u8>,
        /// This hop's route id.
        route_id: RouteId,
        /// This request's digest.
        digest: [u8; 32],
    },
}

/// How a request is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// Refused.
    Rejected(Reason),
    /// Stored as the terminal hop.
    Terminal,
    /// A duplicate answered with the stored response.
    Duplicate,
    /// Another node's probe, answered as its terminal: not user traffic.
    Probe,
}

/// Settings of the relay.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Requests admitted per window, process-wide.
    pub window_limit: u32,
    /// The window.
    pub window: Duration,
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// Crypto slots in all.
    pub crypto_slots: usize,
    /// Next hops may have private endpoints (loopback tests).
    pub allow_private_endpoints: bool,
    /// Time between probe rounds (zero: no periodic probes).
    pub probe_interval: Duration,
}

impl RelayConfig {
    /// The design's defaults.
    pub fn new(allow_private_endpoints: bool) -> Self {
        RelayConfig {
            window_limit: 1200,
            window: Duration::from_secs(60),
            max_in_flight: MAX_IN_FLIGHT,
            crypto_slots: crypto_slots(std::thread::available_parallelism().map_or(1, |n| n.get())),
            allow_private_endpoints,
            probe_interval: Duration::from_secs(300),
        }
    }
}

/// Crypto slots for a host with `threads` CPU threads: half of them rounded up, at least 4,
/// at most 8.
pub fn crypto_slots(threads: usize) -> usize {
    threads.div_ceil(2).clamp(4, 8)
}

/// A fixed window counter.
#[derive(Debug)]
struct Window {
    start: std::time::Instant,
    count: u32,
}

/// The node's relay: everything the pipeline shares, process-wide.
#[derive(Debug)]
pub struct Relay {
    /// Identity and keys.
    pub node: Arc<Node>,
    /// Known peers.
    pub peers: Arc<Peers>,
    /// Time.
    pub clock: Clock,
    /// Aggregate counters.
    pub counters: Counters,
    /// Settings.
    pub config: RelayConfig,
    window: Mutex<Window>,
    in_flight: Gate,
    crypto: Gate,
    hops: Mutex<HopGuard>,
    health: Health,
    replay: Arc<ReplayRegistry>,
    inbox: Arc<Inbox>,
    http: reqwest::Client,
}

/// A request admitted by step 1.
#[derive(Debug)]
pub struct Admitted(#[allow(dead_code)] Permit);

impl Relay {
    /// A relay.
    pub fn new(
        node: Arc<Node>,
        peers: Arc<Peers>,
        clock: Clock,
        config: RelayConfig,
        replay: Arc<ReplayRegistry>,
        inbox: Arc<Inbox>,
    ) -> Self {
        Relay {
            window: Mutex::new(Window {
                start: clock.instant(),
                count: 0,
            }),
            in_flight: Gate::new(config.max_in_flight),
            crypto: Gate::new(config.crypto_slots),
            hops: Mutex::new(HopGuard::default()),
            health: Health::default(),
            counters: Counters::default(),
            http: forward::client(),
            node,
            peers,
            clock,
            config,
            replay,
            inbox,
        }
    }

    /// The crypto gate, for outbound work (route building) that may use every slot.
    pub fn crypto(&self) -> &Gate {
        &self.crypto
    }

    /// The HTTP client for next hops.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The previous-hop guard (status and tests).
    pub fn hops(&self) -> std::sync::MutexGuard<'_, HopGuard> {
        self.hops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Peer health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The replay registry.
    pub fn replay(&self) -> &ReplayRegistry {
        &self.replay
    }

    /// The inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Step 1: the admission window and the in-flight limit. Never waits.
    ///
    /// # Errors
    /// The backpressure reply (already counted).
    pub fn admit(&self) -> Result<Admitted, Reply> {
        let now = self.clock.instant();
        let in_window = {
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            if now.saturating_duration_since(w.start) >= self.config.window {
                w.start = now;
                w.count = 0;
            }
            if w.count < self.config.window_limit {
                w.count += 1;
                true
            } else {
                false
            }
        };
        match self.in_flight.try_acquire().filter(|_| in_window) {
            Some(p) => Ok(Admitted(p)),
            None => Err(self.refuse(Reason::Backpressure)),
        }
    }

    /// Counts and builds a refusal.
    pub fn refuse(&self, r: Reason) -> Reply {
        self.record(Record::Rejected(r));
        Reply::error(r)
    }

    /// Counts one request's outcome.
    pub fn record(&self, rec: Record) {
        let c = &self.counters;
        if rec == Record::Probe {
            // Not user traffic: none of the request counters move.
            c.probes_answered.inc();
            return;
        }
        let now = self.clock.unix();
        c.received.inc();
        c.last_event_at.set(now);
        match rec {
            Record::Rejected(r) => {
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
            Record::Terminal => {
                c.terminal.inc();
                c.last_accepted_at.set(now);
                debug!("relay request delivered here");
            }
            Record::Duplicate => {
                c.replay_dropped.inc();
                debug!("relay request answered from the replay registry");
            }
            Record::Probe => {}
        }
    }

    fn record_forwarded(&self) {
        let c = &self.counters;
        let now = self.clock.unix();
        c.received.inc();
        c.forwarded.inc();
        c.last_event_at.set(now);
        c.last_accepted_at.set(now);
        debug!("relay request forwarded");
    }

    /// Steps 2–8 for an admitted request whose body is `body`.
    pub async fn process(self: &Arc<Self>, admitted: Admitted, body: Vec<u8>) -> Reply {
        // Step 2: a crypto slot; one is always left for outbound work.
        let Some(slot) = self
            .crypto
            .try_acquire_below(self.config.crypto_slots.saturating_sub(1))
        else {
            return self.refuse(Reason::Backpressure);
        };
        let me = Arc::clone(self);
        let decided = tokio::task::spawn_blocking(move || {
            let d = me.decide(&body);
            drop(slot);
            d
        })
        .await;
        let decision = match decided {
            Ok(d) => d,
            Err(_) => return self.refuse(Reason::ForwardFailed),
        };
        let reply = match decision {
            Decision::Reply(reply, rec) => {
                self.record(rec);
                reply
            }
            Decision::Forward {
                endpoint,
                next_hop,
                envelope,
                route_id,
                digest,
            } => {
                let reply = self
                    .forward(&endpoint, &next_hop, &route_id, envelope)
                    .await;
                let (status, body) = (reply.status, reply.body.clone());
                let me = Arc::clone(self);
                let now = self.clock.unix();
                let stored = tokio::task::spawn_blocking(move || {
                    me.replay.complete(route_id, digest, status, &body, now)
                })
                .await;
                if !matches!(stored, Ok(Ok(()))) {
                    debug!("replay registry: completion not stored");
                }
                reply
            }
        };
        drop(admitted);
        reply
    }

    /// Step 8 for a forward: the next hop with retries; the answer for the previous hop.
    async fn forward(
        &self,
        endpoint: &str,
        next_hop: &NodeId,
        route_id: &RouteId,
        envelope: Vec<u8>,
    ) -> Reply {
        let outcome = forward::post(
            &self.http,
            endpoint,
            &envelope,
            route_id,
            next_hop,
            &self.counters,
        )
        .await;
        let now = self.clock.unix();
        match &outcome {
            Forwarded::Accepted { .. } => self.health.record_route(next_hop, true, now),
            Forwarded::Refused => {
                self.health
                    .record_route_reason(next_hop, false, Bucket::Refused, now)
            }
            Forwarded::Exhausted => {
                self.health
                    .record_route_reason(next_hop, false, Bucket::Transport, now)
            }
        }
        match outcome {
            Forwarded::Accepted { receipt } => {
                self.record_forwarded();
                Reply::success("forwarded", &receipt)
            }
            Forwarded::Refused => self.refuse(Reason::ForwardFailed),
            Forwarded::Exhausted => {
                self.counters.last_retry_exhausted_at.set(self.clock.unix());
                self.refuse(Reason::ForwardFailed)
            }
        }
    }

    /// Steps 3–7, and step 8 for the terminal hop: synchronous, run with a crypto slot held.
    /// The outcome is also recorded in the authenticated previous hop's health.
    pub fn decide(&self, body: &[u8]) -> Decision {
        let mut prev = None;
        let decision = self.steps(body, &mut prev);
        if let Some(prev) = prev {
            let now = self.clock.unix();
            match &decision {
                Decision::Reply(_, Record::Rejected(r)) if *r != Reason::ForwardFailed => {
                    self.health.record_refusal(&prev, *r, now);
                }
                _ => self.health.record_contact(&prev, now),
            }
        }
        decision
    }

    /// The steps; `authenticated` is set once the previous hop's signature verified.
    fn steps(&self, body: &[u8], authenticated: &mut Option<NodeId>) -> Decision {
        let reject = |r| Decision::Reply(Reply::error(r), Record::Rejected(r));
        let now = self.clock.unix();
        let instant = self.clock.instant();
        let env = match Envelope::decode(body) {
            Ok(e) => e,
            Err(DecodeError::BlobTooLarge) => return reject(Reason::EnvelopeTooLarge),
            Err(_) => return reject(Reason::MalformedEnvelope),
        };
        // Step 3. A failure is never charged to the claimed identity.
        match env.verify() {
            Ok(()) => {}
            Err(AuthError::InvalidPreviousHop) => return reject(Reason::InvalidPreviousHop),
            Err(AuthError::InvalidSignature) => return reject(Reason::InvalidSignature),
        }
        let prev = env.previous_hop;
        *authenticated = Some(prev);
        // Step 4.
        match self.hops().admit(&prev, instant) {
            Verdict::Allowed => {}
            Verdict::RateLimited => {
                self.counters.quarantine_started.inc();
                debug!(peer = %Prefix(&prev), "previous hop quarantined (rate)");
                return reject(Reason::RateLimited);
            }
            Verdict::Quarantined => return reject(Reason::Quarantined),
            Verdict::TableFull => return reject(Reason::RateLimited),
        }
        // Step 5.
        if env.blob.len() > MAX_BLOB {
            return reject(Reason::EnvelopeTooLarge);
        }
        if now.saturating_sub(env.timestamp) > MAX_AGE_SECS {
            return reject(Reason::TimestampExpired);
        }
        if env.timestamp.saturating_sub(now) > MAX_SKEW_SECS {
            return reject(Reason::TimestampInFuture);
        }
        let me = *self.node.id();
        // Step 6.
        if prev == me {
            return self.scored(&prev, Scored::SelfLoop, Reason::SelfLoop, instant);
        }
        // Step 7.
        if env.next_hop != me {
            return reject(Reason::WrongHop);
        }
        let secrets = self.node.onion_secrets(now);
        let refs: Vec<_> = secrets.iter().collect();
        let layer = match onion::peel(&me, &refs, &env.blob) {
            Ok(l) => l,
            Err(_) => return reject(Reason::OnionPeelFailed),
        };
        let digest = env.request_digest();
        match layer {
            Layer::Forward {
                next_hop,
                next_route_id,
                inner,
            } => {
                if next_hop == prev || next_hop == me {
                    return self.scored(&prev, Scored::RouteLoop, Reason::RouteLoop, instant);
                }
                if env.ttl == 0 {
                    return self.scored(&prev, Scored::TtlExhausted, Reason::TtlExhausted, instant);
                }
                let endpoint = match self.peers.route(&next_hop, now) {
                    Ok(d) => d,
                    Err(PeerError::Unknown | PeerError::Expired) => return reject(Reason::NoRoute),
                    Err(PeerError::Endpoint) => return reject(Reason::InvalidEndpoint),
                };
                if let Some(d) = self.reserve(&env.route_id, digest, now) {
                    return d;
                }
                let next = Envelope::sign(
                    next_route_id,
                    next_hop,
                    env.ttl - 1,
                    now,
                    inner,
                    self.node.signing_key(),
                );
                trace!(next = %Prefix(&next_hop), "forwarding");
                Decision::Forward {
                    endpoint,
                    next_hop,
                    envelope: next.encode(),
                    route_id: env.route_id,
                    digest,
                }
            }
            Layer::Terminal {
                receipt_key,
                payload,
            } => {
                if let Some(d) = self.reserve(&env.route_id, digest, now) {
                    return d;
                }
                // Another node's probe is answered like a delivery (middle hops cannot tell it
                // from a message) but stores nothing and is not user traffic.
                let probe = crate::probe::is_probe(&payload);
                let reply = self.deliver(&env.route_id, &receipt_key, &payload, !probe, now);
                if self
                    .replay
                    .complete(env.route_id, digest, reply.status, &reply.body, now)
                    .is_err()
                {
                    debug!("replay registry: completion not stored");
                }
                let rec = match (probe, reply.status) {
                    (true, _) => Record::Probe,
                    (false, 200) => Record::Terminal,
                    (false, _) => Record::Rejected(Reason::ForwardFailed),
                };
                Decision::Reply(reply, rec)
            }
        }
    }

    /// Scores a failure against the previous hop and refuses.
    fn scored(&self, prev: &NodeId, why: Scored, r: Reason, now: std::time::Instant) -> Decision {
        if self.hops().score(prev, why, now) {
            self.counters.quarantine_started.inc();
            debug!(peer = %Prefix(prev), "previous hop quarantined (failures)");
        }
        Decision::Reply(Reply::error(r), Record::Rejected(r))
    }

    /// The replay reservation: `None` to go on, or the answer.
    fn reserve(&self, route_id: &RouteId, digest: [u8; 32], now: u64) -> Option<Decision> {
        let out = match self.replay.reserve(*route_id, digest, now) {
            Ok(o) => o,
            Err(_) => {
                debug!("replay registry unavailable");
                return Some(Decision::Reply(
                    Reply::error(Reason::ReplayCapacity),
                    Record::Rejected(Reason::ReplayCapacity),
                ));
            }
        };
        let r = match out {
            Outcome::New => return None,
            Outcome::Duplicate(stored) => {
                return Some(Decision::Reply(
                    Reply {
                        status: stored.status,
                        body: stored.body,
                    },
                    Record::Duplicate,
                ));
            }
            Outcome::InFlight => Reason::RouteInFlight,
            Outcome::Conflict => Reason::ReplayConflict,
            Outcome::Expired => Reason::ReplayResponseExpired,
            Outcome::Capacity => Reason::ReplayCapacity,
        };
        Some(Decision::Reply(Reply::error(r), Record::Rejected(r)))
    }

    /// Step 8 for the terminal hop: store the payload durably, then sign and seal the receipt.
    /// (`store` is false for a probe: answered, not kept.)
    fn deliver(
        &self,
        route_id: &RouteId,
        receipt_key: &[u8; 32],
        payload: &[u8],
        store: bool,
        now: u64,
    ) -> Reply {
        if store && self.inbox.store(payload, now).is_err() {
            return Reply::error(Reason::ForwardFailed);
        }
        let r = Receipt::sign(
            *route_id,
            receipt::commitment(payload),
            self.node.signing_key(),
            now,
        );
        Reply::success("delivered", &hex::encode(receipt::seal(&r, receipt_key)))
    }
}
