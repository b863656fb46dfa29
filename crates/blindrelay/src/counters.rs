//! The node's aggregate counters: the design's groups, nothing per peer, route or address.
//!
//! Each request bumps `received` and exactly one outcome: `terminal`, `forwarded`, a duplicate
//! (`replay_dropped`, answered with the stored response), or `rejected` plus the counter of its
//! reason (`reason::Reason::counter`). Probes have their own counters and never move
//! these.

use std::sync::atomic::{AtomicU64, Ordering};

use guard::counters::Counter;
use serde::Serialize;

/// A Unix-seconds timestamp, 0 = never.
#[derive(Debug, Default)]
pub struct Stamp(AtomicU64);

impl Stamp {
    /// Records `now`.
    pub fn set(&self, now: u64) {
        self.0.fetch_max(now, Ordering::Relaxed);
    }

    /// The time, `None` if never.
    pub fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// The counters.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: Counter,)*
            /// Last request accepted (terminal or forwarded).
            pub last_accepted_at: Stamp,
            /// Last request of any outcome.
            pub last_event_at: Stamp,
            /// Last client delivery whose receipt this node opened and verified.
            pub last_verified_client_onion_delivery_at: Stamp,
            /// Last single-hop probe.
            pub last_probe_at: Stamp,
            /// Last two-hop probe.
            pub last_two_hop_probe_at: Stamp,
            /// Last refusal by the abuse guard (rate, quarantine, loop, timestamp, authentication).
            pub last_protection_at: Stamp,
            /// Last backpressure refusal.
            pub last_backpressure_at: Stamp,
            /// Last forward that failed after all its retries.
            pub last_retry_exhausted_at: Stamp,
            /// Last forward failure of any kind.
            pub last_forward_failed_at: Stamp,
            /// Last single-hop probe that succeeded.
            pub last_probe_succeeded_at: Stamp,
            /// Last single-hop probe that failed.
            pub last_probe_failed_at: Stamp,
            /// Last two-hop probe that succeeded.
            pub last_two_hop_probe_succeeded_at: Stamp,
            /// Last two-hop probe that failed.
            pub last_two_hop_probe_failed_at: Stamp,
        }

        /// A copy of the counters at one moment, for JSON and tests.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// See [`Counters::last_accepted_at`].
            pub last_accepted_at: Option<u64>,
            /// See [`Counters::last_event_at`].
            pub last_event_at: Option<u64>,
            /// See [`Counters::last_verified_client_onion_delivery_at`].
            pub last_verified_client_onion_delivery_at: Option<u64>,
            /// See [`Counters::last_probe_at`].
            pub last_probe_at: Option<u64>,
            /// See [`Counters::last_two_hop_probe_at`].
            pub last_two_hop_probe_at: Option<u64>,
            /// See [`Counters::last_protection_at`].
            pub last_protection_at: Option<u64>,
            /// See [`Counters::last_backpressure_at`].
            pub last_backpressure_at: Option<u64>,
            /// See [`Counters::last_retry_exhausted_at`].
            pub last_retry_exhausted_at: Option<u64>,
            /// See [`Counters::last_forward_failed_at`].
            pub last_forward_failed_at: Option<u64>,
            /// See [`Counters::last_probe_succeeded_at`].
            pub last_probe_succeeded_at: Option<u64>,
            /// See [`Counters::last_probe_failed_at`].
            pub last_probe_failed_at: Option<u64>,
            /// See [`Counters::last_two_hop_probe_succeeded_at`].
            pub last_two_hop_probe_succeeded_at: Option<u64>,
            /// See [`Counters::last_two_hop_probe_failed_at`].
            pub last_two_hop_probe_failed_at: Option<u64>,
        }

        impl Counters {
            /// The counters now.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $($name: self.$name.get(),)*
                    last_accepted_at: self.last_accepted_at.get(),
                    last_event_at: self.last_event_at.get(),
                    last_verified_client_onion_delivery_at: self.last_verified_client_onion_delivery_at.get(),
                    last_probe_at: self.last_probe_at.get(),
                    last_two_hop_probe_at: self.last_two_hop_probe_at.get(),
                    last_protection_at: self.last_protection_at.get(),
                    last_backpressure_at: self.last_backpressure_at.get(),
                    last_retry_exhausted_at: self.last_retry_exhausted_at.get(),
                    last_forward_failed_at: self.last_forward_failed_at.get(),
                    last_probe_succeeded_at: self.last_probe_succeeded_at.get(),
                    last_probe_failed_at: self.last_probe_failed_at.get(),
                    last_two_hop_probe_succeeded_at: self.last_two_hop_probe_succeeded_at.get(),
                    last_two_hop_probe_failed_at: self.last_two_hop_probe_failed_at.get(),
                }
            }

            /// `(name, value)` of every counter, in declaration order.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.get()),)*]
            }
        }
    };
}

counters! {
    /// Relay requests received.
    received,
    /// Accepted as the terminal hop (payload stored, receipt signed).
    terminal,
    /// Accepted and forwarded to the next hop.
    forwarded,
    /// Refused.
    rejected,
    /// Previous hop or onion layer failed authentication.
    invalid_signature,
    /// Envelope over the size limit or not an envelope.
    envelope_too_large,
    /// No hops left.
    ttl_exhausted,
    /// Not for this node, or no valid descriptor for the next hop.
    no_route,
    /// The next hop's endpoint is not allowed.
    invalid_endpoint,
    /// Self-loop or route loop.
    loop_detected,
    /// Replay registry outcomes other than new (duplicates included).
    replay_dropped,
    /// Too old or from the future.
    timestamp_rejected,
    /// Over the previous hop's rate.
    rate_limited,
    /// The previous hop is quarantined.
    quarantined,
    /// Quarantines started.
    quarantine_started,
    /// Refused at once for lack of capacity (request gate or crypto slots).
    backpressure_dropped,
    /// The next hop or the terminal store failed.
    forward_failed,
    /// Retries made.
    retry_attempted,
    /// Forwards that succeeded after a retry.
    retry_succeeded,
    /// Forwards that failed after retrying.
    retry_exhausted,
    /// Single-hop probes sent.
    probe_attempted,
    /// Single-hop probes answered.
    probe_succeeded,
    /// Single-hop probes failed.
    probe_failed,
    /// Two-hop probes sent.
    two_hop_probe_attempted,
    /// Two-hop probes delivered with a verified receipt.
    two_hop_probe_succeeded,
    /// Two-hop probes failed.
    two_hop_probe_failed,
    /// Client messages whose terminal receipt this node opened and verified, fresh.
    verified_client_onion_deliveries,
    /// Probes of other nodes this node answered as their terminal (not user traffic: they move
    /// none of the request counters above).
    probes_answered,
}
