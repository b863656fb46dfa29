//! The node's aggregate counters: the design's groups, nothing per peer, route or address.
//!
//! Each request bumps `received` and exactly one outcome: `terminal`, `forwarded`, a completed
//! duplicate (`duplicate_route`, answered with the stored response), a copy of a message stored
//! before (`duplicate_message`), or `rejected` plus the
//! counter of its reason (`reason::Reason::counter`). Probes have their own counters and never move
//! these. The event times (`last_…_at`) are Unix seconds.
//!
//! Declared once with [`guard::counter_set!`]: the struct, its [`Snapshot`] (the status
//! document's counters) and its Prometheus families (`blindrelay_<name>_total`, and
//! `blindrelay_<name>_timestamp_seconds` for the times), with these doc comments as help.

use guard::counters::{CounterSet, Kind};

guard::counter_set! {
    /// The counters.
    pub struct Counters {
        prefix: "blindrelay_",
        /// A copy of the counters at one moment, for JSON and tests.
        snapshot: Snapshot,
        counters: {
            /// Relay requests received.
            received: Counter,
            /// Accepted as the terminal hop (payload stored, receipt signed).
            terminal: Counter,
            /// Accepted and forwarded to the next hop.
            forwarded: Counter,
            /// Refused.
            rejected: Counter,
            /// Refused `invalid_previous_hop`: the link's client presented no node identity.
            invalid_previous_hop: Counter,
            /// Refused `malformed_envelope`: not a v2 frame (unknown version or class, wrong
            /// length).
            malformed_envelope: Counter,
            /// Refused `envelope_too_large`: over the largest frame.
            envelope_too_large: Counter,
            /// Refused `onion_peel_failed`: the layer does not open with this node's keys.
            onion_peel_failed: Counter,
            /// Refused `no_route`: no valid descriptor for the next hop.
            no_route: Counter,
            /// Refused `invalid_endpoint`: the next hop's endpoint is not allowed.
            invalid_endpoint: Counter,
            /// Refused `self_loop`: the previous hop is this node.
            self_loop: Counter,
            /// Refused `route_loop`: the next hop is the previous hop or this node.
            route_loop: Counter,
            /// Refused `route_in_flight`: the same request is being handled.
            route_in_flight: Counter,
            /// Refused `replay_conflict`: another frame already carried this layer.
            replay_conflict: Counter,
            /// Refused `replay_response_expired`: the same request, its stored answer too old to
            /// replay.
            replay_response_expired: Counter,
            /// A completed route's duplicate, answered with its stored response (receipt
            /// included): nothing forwarded or stored twice (the design's `duplicate_route`).
            duplicate_route: Counter,
            /// At the terminal: a copy of a message stored here before, sent again by its
            /// sender over another route (the same message id): not stored again, answered with
            /// the first copy's receipt.
            duplicate_message: Counter,
            /// Refused: every replay slot holds a live route.
            replay_capacity: Counter,
            /// Refused: the source holds its share of the replay registry's live routes.
            replay_share_exceeded: Counter,
            /// Refused: this node could not write its state (the replay reservation or the
            /// inbox; a full or read-only disk). Nothing reserved or stored; never scored.
            state_write_failed: Counter,
            /// Refused: the inbox holds its most items or bytes.
            inbox_full: Counter,
            /// Refused: the source holds its share of the inbox.
            inbox_share_exceeded: Counter,
            /// Refused: the source is over its share of the request gate.
            source_limited: Counter,
            /// Refused: the body did not arrive within its deadline (the connection is closed).
            request_timeout: Counter,
            /// Refused: the next hop has its most requests in flight.
            next_hop_busy: Counter,
            /// Refused (a forward, a send or a probe): the queue of requests waiting for their
            /// turn under the next hop's previous-hop rate is full.
            next_hop_queue_full: Counter,
            /// Requests to a next hop that waited for their turn under its previous-hop rate.
            paced: Counter,
            /// Refused `timestamp_expired`: the layer's expiry is more than the skew past.
            timestamp_expired: Counter,
            /// Refused `timestamp_in_future`: the layer's expiry is too far ahead.
            timestamp_in_future: Counter,
            /// Refused: a version 1 envelope (or a body posted to `/v1/relay`); never scored.
            v1_not_accepted: Counter,
            /// Over the previous hop's rate.
            rate_limited: Counter,
            /// The previous hop is quarantined.
            quarantined: Counter,
            /// Quarantines started.
            quarantine_started: Counter,
            /// Refused for lack of capacity: the node's request rate or in-flight total is spent,
            /// or every inbound crypto slot is taken.
            backpressure_dropped: Counter,
            /// Connections closed at once: their source holds its connection cap, or the node
            /// holds its most connections.
            connections_refused: Counter,
            /// Connections closed because no complete request head arrived in time (new or idle
            /// between requests).
            connections_timed_out: Counter,
            /// Requests refused (for any reason) whose source is not a known peer (an
            /// unknown address block); counted besides their reason.
            strangers_refused: Counter,
            /// Inbound TLS handshakes completed on the relay listener.
            tls_handshakes: Counter,
            /// Inbound TLS handshakes that failed (not TLS 1.3, a certificate that is not an
            /// identity, the peer went away); a handshake not over within the header timeout is
            /// `connections_timed_out`.
            tls_handshake_failed: Counter,
            /// Relay requests retried after a busy answer (`429` of a moment, `503
            /// route_in_flight`) within their deadline.
            busy_retried: Counter,
            /// Relay requests answered `503 route_in_flight` at their deadline while their
            /// forward went on (its final answer is stored for the retry; counted apart from
            /// the request's one outcome).
            answered_in_flight: Counter,
            /// Inbox items deleted or taken by the operator.
            inbox_removed: Counter,
            /// Inbox items deleted at the end of the retention period.
            inbox_expired: Counter,
            /// The next hop or the terminal store failed.
            forward_failed: Counter,
            /// Retries made: attempts after one that got no answer (a busy answer's retries are
            /// `busy_retried`).
            retry_attempted: Counter,
            /// Forwards that succeeded after a retry.
            retry_succeeded: Counter,
            /// Forwards that got no answer after retrying (at least one retry made, then the
            /// attempts or the deadline spent). Never more than `retry_attempted`.
            retry_exhausted: Counter,
            /// Forwards that got no answer and had no time for a retry: the one attempt (or the
            /// wait for its turn) used the whole deadline. With `retry_exhausted`, every forward
            /// that got no answer counts in exactly one of the two.
            deadline_exhausted: Counter,
            /// Single-hop probes sent.
            probe_attempted: Counter,
            /// Single-hop probes answered.
            probe_succeeded: Counter,
            /// Single-hop probes failed.
            probe_failed: Counter,
            /// Two-hop probes sent.
            two_hop_probe_attempted: Counter,
            /// Two-hop probes delivered with a verified receipt.
            two_hop_probe_succeeded: Counter,
            /// Two-hop probes failed.
            two_hop_probe_failed: Counter,
            /// This node's sends tried again over another route after a route failed (the
            /// message id kept, so the terminal stores the message once).
            send_rerouted: Counter,
            /// Client messages whose terminal receipt this node opened and verified, fresh.
            verified_client_onion_deliveries: Counter,
            /// Probes of other nodes this node answered as their terminal (not user traffic: they move
            /// none of the request counters above).
            probes_answered: Counter,
            /// Gossip bytes this node sent: its announcements' bodies, and its answers to others'.
            gossip_bytes_sent: Counter,
            /// Gossip bytes this node received: its peers' answers, and others' announcements.
            gossip_bytes_received: Counter,
            /// Discovery requests (`POST /v1/discovery`) refused: the source over its cheap budget
            /// or crypto share, no crypto slot, a body too large or too slow, or not a message.
            discovery_requests_refused: Counter,
            /// Discovery requests whose descriptors were checked on their crypto slot.
            discovery_requests_checked: Counter,
            /// Microseconds those requests held their slot (read, checked), summed (the
            /// simulator's machine takes the mean from the network benchmark).
            discovery_check_micros: Counter,
            /// Microseconds this node's discovery exchanges took (posted until answered or
            /// failed), summed.
            gossip_exchange_micros: Counter,
            /// Status reports pushed to `--report-url` (answered 2xx).
            report_sent: Counter,
            /// Status reports that failed (timeout, no connection, not 2xx); not retried
            /// before the next interval.
            report_failed: Counter,
            /// Last request accepted (terminal or forwarded).
            last_accepted_at: Stamp,
            /// Last request of any outcome.
            last_event_at: Stamp,
            /// Last client delivery whose receipt this node opened and verified.
            last_verified_client_onion_delivery_at: Stamp,
            /// Last single-hop probe.
            last_probe_at: Stamp,
            /// Last two-hop probe.
            last_two_hop_probe_at: Stamp,
            /// Last refusal by the abuse guard (rate, quarantine, loop, timestamp, authentication).
            last_protection_at: Stamp,
            /// Last backpressure refusal.
            last_backpressure_at: Stamp,
            /// Last refusal because the inbox was full.
            last_inbox_full_at: Stamp,
            /// Last time inbox room was freed (delete, take, retention).
            last_inbox_freed_at: Stamp,
            /// Last refusal because the replay registry was full.
            last_replay_full_at: Stamp,
            /// Last refusal because a next hop had its most requests in flight.
            last_next_hop_busy_at: Stamp,
            /// Last forward that failed after all its retries.
            last_retry_exhausted_at: Stamp,
            /// Last forward failure of any kind.
            last_forward_failed_at: Stamp,
            /// Last single-hop probe that succeeded.
            last_probe_succeeded_at: Stamp,
            /// Last single-hop probe that failed.
            last_probe_failed_at: Stamp,
            /// Last two-hop probe that succeeded.
            last_two_hop_probe_succeeded_at: Stamp,
            /// Last two-hop probe that failed.
            last_two_hop_probe_failed_at: Stamp,
        },
    }
}

impl Counters {
    /// `(name, value)` of every request and event count (not the times), in declaration
    /// order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        Self::FAMILIES
            .iter()
            .zip(self.samples())
            .filter(|(f, _)| f.kind == Kind::Counter)
            .map(|(f, v)| (f.field, v))
            .collect()
    }
}
