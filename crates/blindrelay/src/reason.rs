//! The reason vocabulary: why the pipeline refuses a relay request.
//!
//! One table (the `match`es below, the design's table in `docs/blindrelay.md`): each reason has
//! a stable wire string, one HTTP status, a counter of its own (besides `received` and
//! `rejected`), whether it is the abuse guard at work (status `protecting`), and whether it
//! scores against the authenticated previous hop. Every pipeline step returns one of these;
//! nothing else decides a refusal's status or counter.

use guard::counters::Counter;

use crate::counters::Counters;

/// Whose fault a refusal is ([`Reason::blame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The previous hop's own frame, on the design's scored list: scored and noted in its
    /// health.
    PreviousHop,
    /// The previous hop's own frame, not scored: noted in its health only.
    PreviousHopUnscored,
    /// What the original sender sealed: neither scored nor noted against the previous hop.
    Sender,
    /// Nobody: a duplicate in flight or an expired replay.
    Nobody,
    /// This node's own state (or a later hop's): never the previous hop's.
    ThisNode,
}

named_enum! {
    /// Why a request was refused: one stable reason (its wire string), one status, one counter.
    pub enum Reason {
        /// No capacity now (request gate or crypto slots).
        Backpressure = "backpressure",
        /// Not a v2 frame (unknown version or class, wrong length).
        MalformedEnvelope = "malformed_envelope",
        /// Over the size limit.
        EnvelopeTooLarge = "envelope_too_large",
        /// The link's client presented no node identity (no TLS client certificate): nothing on
        /// the link can be a frame of a previous hop.
        InvalidPreviousHop = "invalid_previous_hop",
        /// Over the previous hop's rate: a quarantine starts.
        RateLimited = "rate_limited",
        /// The previous hop is quarantined.
        Quarantined = "quarantined",
        /// The layer's sealed expiry is more than the skew (120 s) past.
        TimestampExpired = "timestamp_expired",
        /// The layer's sealed expiry is further ahead than its lifetime plus the skew (720 s).
        TimestampInFuture = "timestamp_in_future",
        /// The previous hop is this node.
        SelfLoop = "self_loop",
        /// The onion layer does not open with this node's keys.
        OnionPeelFailed = "onion_peel_failed",
        /// The next hop is the previous hop or this node.
        RouteLoop = "route_loop",
        /// No valid descriptor for the next hop.
        NoRoute = "no_route",
        /// The next hop's endpoint is not allowed.
        InvalidEndpoint = "invalid_endpoint",
        /// The same request is being handled.
        RouteInFlight = "route_in_flight",
        /// Another frame (another previous hop) already carried this layer: its replay tag is taken.
        ReplayConflict = "replay_conflict",
        /// The same request, but its stored response is too old to replay.
        ReplayResponseExpired = "replay_response_expired",
        /// Every replay slot holds a live route.
        ReplayCapacity = "replay_capacity",
        /// The next hop or the terminal store failed.
        ForwardFailed = "forward_failed",
        /// The source is over its share of the request gate (cheap budget, rate or in flight).
        SourceLimited = "source_limited",
        /// The body did not arrive within its deadline.
        RequestTimeout = "request_timeout",
        /// The next hop has its most requests in flight (it is slow or hung).
        NextHopBusy = "next_hop_busy",
        /// The inbox holds its most items or bytes.
        InboxFull = "inbox_full",
        /// The source holds its share of the inbox.
        InboxShareExceeded = "inbox_share_exceeded",
        /// The source holds its share of the replay registry's live routes.
        ReplayShareExceeded = "replay_share_exceeded",
        /// The next hop's outbound queue (requests waiting for their turn under its previous-hop
        /// rate) is full.
        NextHopQueueFull = "next_hop_queue_full",
        /// A version 1 envelope (`BRE1…`, or any body posted to `/v1/relay`): the node speaks v2
        /// only.
        V1NotAccepted = "v1_not_accepted",
        /// This node could not write its state (the replay reservation or the inbox: a full or
        /// read-only disk): nothing was reserved or stored, so the same frame may be sent again.
        StateWriteFailed = "state_write_failed",
    }
}

impl Reason {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        use Reason::*;
        match self {
            Backpressure | RateLimited | Quarantined | SourceLimited | InboxShareExceeded
            | ReplayShareExceeded => 429,
            RequestTimeout => 408,
            InboxFull => 507,
            EnvelopeTooLarge => 413,
            MalformedEnvelope | InvalidPreviousHop | TimestampExpired | TimestampInFuture
            | SelfLoop | OnionPeelFailed | RouteLoop | ReplayConflict | V1NotAccepted => 400,
            ReplayResponseExpired => 409,
            NoRoute | InvalidEndpoint | ForwardFailed => 502,
            RouteInFlight | ReplayCapacity | NextHopBusy | NextHopQueueFull | StateWriteFailed => {
                503
            }
        }
    }

    /// Its one counter (besides `received` and `rejected`), named as the reason is, but for
    /// `backpressure`, whose counter has the design's name `backpressure_dropped`. No two
    /// reasons share a counter.
    pub fn counter(self, c: &Counters) -> &Counter {
        use Reason::*;
        match self {
            Backpressure => &c.backpressure_dropped,
            MalformedEnvelope => &c.malformed_envelope,
            EnvelopeTooLarge => &c.envelope_too_large,
            InvalidPreviousHop => &c.invalid_previous_hop,
            OnionPeelFailed => &c.onion_peel_failed,
            RateLimited => &c.rate_limited,
            Quarantined => &c.quarantined,
            TimestampExpired => &c.timestamp_expired,
            TimestampInFuture => &c.timestamp_in_future,
            SelfLoop => &c.self_loop,
            RouteLoop => &c.route_loop,
            NoRoute => &c.no_route,
            InvalidEndpoint => &c.invalid_endpoint,
            RouteInFlight => &c.route_in_flight,
            ReplayConflict => &c.replay_conflict,
            ReplayResponseExpired => &c.replay_response_expired,
            ReplayCapacity => &c.replay_capacity,
            ForwardFailed => &c.forward_failed,
            SourceLimited => &c.source_limited,
            RequestTimeout => &c.request_timeout,
            NextHopBusy => &c.next_hop_busy,
            InboxFull => &c.inbox_full,
            InboxShareExceeded => &c.inbox_share_exceeded,
            ReplayShareExceeded => &c.replay_share_exceeded,
            NextHopQueueFull => &c.next_hop_queue_full,
            V1NotAccepted => &c.v1_not_accepted,
            StateWriteFailed => &c.state_write_failed,
        }
    }

    /// A refusal by the abuse guard: the node is protecting itself (status `protecting`).
    pub fn is_protection(self) -> bool {
        use Reason::*;
        matches!(
            self,
            InvalidPreviousHop
                | OnionPeelFailed
                | RateLimited
                | Quarantined
                | TimestampExpired
                | TimestampInFuture
                | SelfLoop
                | RouteLoop
                | SourceLimited
                | RequestTimeout
                | InboxShareExceeded
                | ReplayShareExceeded
        )
    }

    /// A refusal a sender may retry within its deadline: nothing was reserved and the condition
    /// lasts milliseconds (a busy node, a source over its share for a moment), or the same
    /// request is still being handled (`route_in_flight`: the design says the sender may retry;
    /// its answer is stored and replayed), or the node could not write its state
    /// (`state_write_failed`: nothing was reserved or stored; a disk that fills for a moment,
    /// e.g. during a checkpoint, frees again).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Reason::Backpressure
                | Reason::SourceLimited
                | Reason::RouteInFlight
                | Reason::StateWriteFailed
        )
    }

    /// Whose fault a refusal is, once the previous hop is authenticated (`docs/blindrelay.md`,
    /// "Who is blamed"). A previous hop answers for what it alone produced: the bytes on its
    /// mutually authenticated link (a frame that is not one, a body over any class's length).
    /// What the original sender sealed in a layer (a loop, a layer that does not open, its
    /// expiry) only the hop that opens the layer can see: that hop refuses before forwarding,
    /// and nobody upstream is scored for it; a layer that does not open is noted in the
    /// previous hop's health all the same (many of them shrink its crypto share).
    pub fn blame(self) -> Blame {
        use Reason::*;
        match self {
            // What the link's authenticated client alone produced, on the scored list.
            MalformedEnvelope | EnvelopeTooLarge | SelfLoop => Blame::PreviousHop,
            // Its own frame, not scored (the design's list does not name them): a layer it
            // already carried once under the same replay tag (a re-wrap), its rate; and a
            // layer that does not open, which the sender may have sealed: noted, never scored.
            ReplayConflict | RateLimited | Quarantined | OnionPeelFailed => {
                Blame::PreviousHopUnscored
            }
            // Sealed by the original sender inside a layer no previous hop can read (v2 carries
            // the expiry inside the layer, so a stale or future layer is the sender's too).
            RouteLoop | NoRoute | InvalidEndpoint | TimestampExpired | TimestampInFuture => {
                Blame::Sender
            }
            // Replays in flight, expired responses, a v1 envelope (an older node, not a bad
            // one), and a link with no identity (nobody to blame) have no effect.
            RouteInFlight | ReplayResponseExpired | V1NotAccepted | InvalidPreviousHop => {
                Blame::Nobody
            }
            // This node's own state, or a later hop's.
            Backpressure | ReplayCapacity | ForwardFailed | SourceLimited | RequestTimeout
            | NextHopBusy | InboxFull | InboxShareExceeded | ReplayShareExceeded
            | NextHopQueueFull | StateWriteFailed => Blame::ThisNode,
        }
    }

    /// Charged to the authenticated previous hop's failure score: on the design's list
    /// ([`Reason::is_scored`]) and something the previous hop could have checked itself
    /// ([`Reason::blame`]).
    pub fn is_charged(self) -> bool {
        self.is_scored() && self.blame() == Blame::PreviousHop
    }

    /// Looks a reason up by its wire string.
    pub fn from_wire(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// A failure that counts towards the previous hop's quarantine: the design's list, and the
    /// framing faults of a mutually authenticated link (which took the place of the design's
    /// signature failures: the link's client alone wrote those bytes). A link with no identity
    /// (`invalid_previous_hop`) has nobody to charge; loops and expiries the sender sealed are
    /// on the design's list but not charged ([`Reason::blame`]). Timeouts, lost answers,
    /// duplicates and replay conflicts never score.
    pub fn is_scored(self) -> bool {
        use Reason::*;
        matches!(
            self,
            InvalidPreviousHop | SelfLoop | RouteLoop | MalformedEnvelope | EnvelopeTooLarge
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The design's table, row by row: reason, status, counter, scored.
    #[test]
    fn the_table_of_the_docs() {
        let table: [(&str, u16, &str, bool); 27] = [
            ("backpressure", 429, "backpressure_dropped", false),
            ("malformed_envelope", 400, "malformed_envelope", true),
            ("envelope_too_large", 413, "envelope_too_large", true),
            ("invalid_previous_hop", 400, "invalid_previous_hop", true),
            ("rate_limited", 429, "rate_limited", false),
            ("quarantined", 429, "quarantined", false),
            ("timestamp_expired", 400, "timestamp_expired", false),
            ("timestamp_in_future", 400, "timestamp_in_future", false),
            ("self_loop", 400, "self_loop", true),
            ("onion_peel_failed", 400, "onion_peel_failed", false),
            ("route_loop", 400, "route_loop", true),
            ("no_route", 502, "no_route", false),
            ("invalid_endpoint", 502, "invalid_endpoint", false),
            ("route_in_flight", 503, "route_in_flight", false),
            ("replay_conflict", 400, "replay_conflict", false),
            (
                "replay_response_expired",
                409,
                "replay_response_expired",
                false,
            ),
            ("replay_capacity", 503, "replay_capacity", false),
            ("forward_failed", 502, "forward_failed", false),
            ("source_limited", 429, "source_limited", false),
            ("request_timeout", 408, "request_timeout", false),
            ("next_hop_busy", 503, "next_hop_busy", false),
            ("inbox_full", 507, "inbox_full", false),
            ("inbox_share_exceeded", 429, "inbox_share_exceeded", false),
            ("replay_share_exceeded", 429, "replay_share_exceeded", false),
            ("next_hop_queue_full", 503, "next_hop_queue_full", false),
            ("v1_not_accepted", 400, "v1_not_accepted", false),
            ("state_write_failed", 503, "state_write_failed", false),
        ];
        let charged = ["malformed_envelope", "envelope_too_large", "self_loop"];
        for r in Reason::ALL {
            assert_eq!(r.is_charged(), charged.contains(&r.as_str()), "{r:?}");
        }
        for (r, (name, status, counter, scored)) in Reason::ALL.into_iter().zip(table) {
            assert_eq!(
                (r.as_str(), r.status(), r.is_scored()),
                (name, status, scored)
            );
            let c = Counters::default();
            r.counter(&c).inc();
            let moved: Vec<_> = c.named().into_iter().filter(|(_, v)| *v > 0).collect();
            assert_eq!(moved, vec![(counter, 1)], "{name}");
        }
    }
}
