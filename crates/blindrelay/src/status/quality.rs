//! Evidence quality: the `status` and `proof_scope` rules over the counters
//! (`docs/blindrelay-status.md`).
//!
//! The four kinds of evidence are kept apart: accepted opaque relay work, synthetic single-hop
//! probes, synthetic two-hop probes, and terminal-signed receipts of client deliveries this node
//! verified. `status` looks at **recent** events only (a window of [`RECENT_SECS`] seconds, the
//! one peer health uses), so a node that was attacked or overloaded returns to `ready` by itself
//! once the trouble stops.

use serde::{Deserialize, Serialize};

use crate::counters::Snapshot;
use crate::health::RECENT_SECS;

/// Evidence younger than this is fresh.
pub const FRESH: u64 = 1800;

named_enum! {
    /// A node's status, first match wins (see [`quality`]).
    pub enum Status {
        /// No relay or probe activity yet.
        Idle = "idle",
        /// Some evidence, readiness not established.
        Observing = "observing",
        /// Earlier success evidence is no longer fresh.
        Stale = "stale",
        /// Fresh evidence, no recent trouble.
        Ready = "ready",
        /// The abuse guard refused frames recently; the relay keeps working.
        Protecting = "protecting",
        /// Forwards or probes failed recently.
        Degraded = "degraded",
        /// Backpressure or exhausted retries recently: the operator should act.
        Attention = "attention",
    }
}

named_enum! {
    /// The strongest evidence ever observed, first match wins (see [`quality`]).
    pub enum ProofScope {
        /// A client delivery was verified.
        ClientMessageDelivery = "client_message_delivery",
        /// Relay work was accepted.
        RelayAcceptance = "relay_acceptance",
        /// A two-hop probe delivered and its receipt verified.
        MessageDelivery = "message_delivery",
        /// A two-hop probe was attempted.
        ControlPlane = "control_plane",
        /// A single-hop probe was attempted.
        SingleHopControlPlane = "single_hop_control_plane",
        /// A request was received.
        Attempted = "attempted",
        /// Nothing.
        None = "none",
    }
}

named_enum! {
    /// Whose requests most of the recent backpressure fell on ([`Cause`]).
    pub enum CauseSource {
        /// A known peer, by the identity its link authenticated.
        Peer = "peer",
        /// Unknown identities from one address block (never named: no address is shown).
        Strangers = "strangers",
        /// A known peer's address with no identity (gossip requests).
        KnownAddress = "known_address",
    }
}

named_enum! {
    /// Why that source is the cause.
    pub enum CauseReason {
        /// Its frames keep failing to open: its share of the crypto slots is cut to a
        /// stranger's.
        PeelFailures = "onion_peel_failed",
        /// This node's guard quarantined it.
        Quarantined = "quarantined",
        /// It sent most of the requests refused for backpressure.
        MostRequests = "most_requests",
    }
}

/// The one source more than half of the recent backpressure fell on
/// (`crate::pipeline::pressure`): the node is being pushed, not short of capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// Whose requests.
    pub source: CauseSource,
    /// The peer's 8-hex prefix (a peer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Why.
    pub reason: CauseReason,
    /// Its requests refused for backpressure…
    pub refused: u64,
    /// …of all refused for backpressure (recently, or in the whole episode once it stopped).
    pub of: u64,
}

impl Cause {
    /// Who, in words, with the peer's prefix.
    pub fn who(&self) -> String {
        match self.source {
            CauseSource::Peer => format!("peer {}", self.peer.as_deref().unwrap_or("?")),
            CauseSource::Strangers => "unknown identities from one address block".into(),
            CauseSource::KnownAddress => "a known peer's address (gossip)".into(),
        }
    }

    /// The status's reason and next action.
    fn explain(&self) -> (String, String) {
        let why = match self.reason {
            CauseReason::PeelFailures => ": its layers keep failing to open (onion_peel_failed)",
            CauseReason::Quarantined => ", quarantined now",
            CauseReason::MostRequests => "",
        };
        let reason = format!(
            "backpressure caused mostly by {}{why}: {} of {} requests refused for backpressure were its",
            self.who(),
            self.refused,
            self.of
        );
        let next = match (self.source, self.reason) {
            (CauseSource::Peer, CauseReason::PeelFailures) => {
                "nothing to do: its share of crypto slots is cut to a stranger's while its frames keep failing; if it lasts, ask its operator or drop its --peer"
            }
            (CauseSource::Peer, CauseReason::Quarantined) => {
                "nothing to do: it is refused while quarantined (peer_health); if it keeps coming back, ask its operator or drop its --peer"
            }
            (CauseSource::Peer, _) => {
                "if its traffic is honest, give the node more capacity; if not, ask its operator or drop its --peer"
            }
            _ => "nothing to do: strangers hold a bounded share (peer_health.strangers)",
        };
        (reason, next.to_owned())
    }
}

/// One kind of evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// How many, since start.
    pub total: u64,
    /// Last one (Unix seconds).
    pub last_at: Option<u64>,
    /// `last_at` within [`FRESH`].
    pub fresh: bool,
}

/// The quality summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quality {
    /// The status.
    pub status: Status,
    /// The strongest evidence ever observed.
    pub proof_scope: ProofScope,
    /// A fresh client delivery receipt, verified by this node.
    pub real_relay_ready: bool,
    /// Why `status` is what it is.
    pub reason: String,
    /// What the operator should do.
    pub next_action: String,
    /// The one source recent backpressure mostly fell on, if any: the status is then
    /// `protecting` (or worse for another reason), never `attention` for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// Accepted opaque relay work (terminal + forwarded).
    pub relay_acceptance: Evidence,
    /// Synthetic single-hop probes that succeeded.
    pub synthetic_probes: Evidence,
    /// Synthetic two-hop probes that succeeded.
    pub synthetic_two_hop_probes: Evidence,
    /// Client deliveries whose terminal receipt this node verified.
    pub client_delivery_receipts: Evidence,
}

/// The state of the node's stores now, which `status` reports as what it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stores {
    /// The inbox refused a delivery for lack of room, and no room was freed since.
    pub inbox_full: bool,
    /// Every replay slot holds a live route.
    pub replay_full: bool,
}

fn within(t: Option<u64>, now: u64, window: u64) -> bool {
    t.is_some_and(|t| now.saturating_sub(t) < window)
}

fn evidence(total: u64, last_at: Option<u64>, now: u64) -> Evidence {
    Evidence {
        total,
        last_at,
        fresh: total > 0 && within(last_at, now, FRESH),
    }
}

/// The quality of a node from its counters at `now`. First match wins:
///
/// 1. `idle`: no request received, no probe sent, no client delivery.
/// 2. `attention`: the inbox or the replay registry is full now (deliveries are refused), or a
///    backpressure refusal no one source caused (`cause` none) or an exhausted retry within
///    [`RECENT_SECS`].
/// 3. `degraded`: a forward failure, a next hop with its most requests in flight, or a failed
///    probe within [`RECENT_SECS`].
/// 4. `protecting`: an abuse-guard refusal (rate, quarantine, a source over its share, a slow
///    body, authentication, loop, TTL, timestamp), or backpressure mostly from one source
///    (`cause`, named in the reason), within [`RECENT_SECS`].
/// 5. `ready`: fresh evidence of any kind.
/// 6. `stale`: success evidence, none fresh.
/// 7. `observing`: activity without success evidence.
pub fn quality(s: &Snapshot, now: u64, stores: Stores, cause: Option<Cause>) -> Quality {
    let relay_acceptance = evidence(s.terminal + s.forwarded, s.last_accepted_at, now);
    let synthetic_probes = evidence(s.probe_succeeded, s.last_probe_succeeded_at, now);
    let synthetic_two_hop_probes = evidence(
        s.two_hop_probe_succeeded,
        s.last_two_hop_probe_succeeded_at,
        now,
    );
    let client_delivery_receipts = evidence(
        s.verified_client_onion_deliveries,
        s.last_verified_client_onion_delivery_at,
        now,
    );
    let any_fresh = relay_acceptance.fresh
        || synthetic_probes.fresh
        || synthetic_two_hop_probes.fresh
        || client_delivery_receipts.fresh;
    let any_success = relay_acceptance.total
        + synthetic_probes.total
        + synthetic_two_hop_probes.total
        + client_delivery_receipts.total
        > 0;
    let any_activity = s.received
        + s.probe_attempted
        + s.two_hop_probe_attempted
        + s.verified_client_onion_deliveries
        > 0;
    let caused = cause.is_some() && within(s.last_backpressure_at, now, RECENT_SECS);
    let cause = cause.filter(|_| caused);
    let (status, reason, next_action) = verdict(
        s,
        now,
        stores,
        caused,
        [any_fresh, any_success, any_activity],
    );
    let (reason, next_action) = match &cause {
        Some(c) if status == Status::Protecting => c.explain(),
        _ => (reason.to_owned(), next_action.to_owned()),
    };
    Quality {
        status,
        proof_scope: proof_scope(s),
        real_relay_ready: client_delivery_receipts.fresh,
        reason,
        next_action,
        cause,
        relay_acceptance,
        synthetic_probes,
        synthetic_two_hop_probes,
        client_delivery_receipts,
    }
}

/// The status, why, and what to do, first match wins (the order of [`quality`]'s list).
// structure: table
fn verdict(
    s: &Snapshot,
    now: u64,
    stores: Stores,
    caused: bool,
    [any_fresh, any_success, any_activity]: [bool; 3],
) -> (Status, &'static str, &'static str) {
    let recent = |t| within(t, now, RECENT_SECS);
    if !any_activity {
        (
            Status::Idle,
            "no relay or probe activity yet",
            "add peers with --peer, or wait for relay traffic and probes",
        )
    } else if stores.inbox_full {
        (
            Status::Attention,
            "the inbox is full: deliveries to this node are refused (inbox_full)",
            "delete or take delivered messages (blindrelay inbox --take, --delete ID), or shorten --inbox-retention",
        )
    } else if stores.replay_full {
        (
            Status::Attention,
            "the replay registry is full of live routes: new routes are refused (replay_capacity)",
            "wait for routes to end (600 s after their reservation), or raise --replay-capacity",
        )
    } else if recent(s.last_backpressure_at) && !caused {
        (
            Status::Attention,
            "backpressure: the node's request rate, in-flight slots or crypto slots were spent",
            "give the node more CPU, or take less relay traffic",
        )
    } else if recent(s.last_retry_exhausted_at) {
        (
            Status::Attention,
            "forwards failed after every retry",
            "check that the next hops are reachable (see peer_health)",
        )
    } else if recent(s.last_forward_failed_at)
        || recent(s.last_next_hop_busy_at)
        || recent(s.last_probe_failed_at)
        || recent(s.last_two_hop_probe_failed_at)
    {
        (
            Status::Degraded,
            "forwards or probes failed recently",
            "look at the failing peers in peer_health",
        )
    } else if recent(s.last_protection_at) || caused {
        (
            Status::Protecting,
            "the abuse guard refused frames recently, the relay keeps working",
            "nothing to do unless it lasts: quarantined peers are in peer_health",
        )
    } else if any_fresh {
        (
            Status::Ready,
            "fresh evidence of working relay",
            "nothing to do",
        )
    } else if any_success {
        (
            Status::Stale,
            "earlier success evidence is no longer fresh",
            "send a message or let the probes run",
        )
    } else {
        (
            Status::Observing,
            "activity without success evidence yet",
            "wait for a delivery or a successful probe",
        )
    }
}

/// The strongest evidence ever observed, first match wins.
fn proof_scope(s: &Snapshot) -> ProofScope {
    if s.verified_client_onion_deliveries > 0 {
        ProofScope::ClientMessageDelivery
    } else if s.terminal + s.forwarded > 0 {
        ProofScope::RelayAcceptance
    } else if s.two_hop_probe_succeeded > 0 {
        ProofScope::MessageDelivery
    } else if s.two_hop_probe_attempted > 0 {
        ProofScope::ControlPlane
    } else if s.probe_attempted > 0 {
        ProofScope::SingleHopControlPlane
    } else if s.received > 0 {
        ProofScope::Attempted
    } else {
        ProofScope::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000;

    #[test]
    fn transitions_follow_the_rules() {
        let mut s = Snapshot::default();
        assert_eq!(
            quality(&s, T, Stores::default(), None).status.as_str(),
            "idle"
        );
        assert_eq!(
            quality(&s, T, Stores::default(), None).proof_scope.as_str(),
            "none"
        );
        // A request refused for no route: activity, no success.
        s.received = 1;
        s.rejected = 1;
        s.no_route = 1;
        assert_eq!(
            quality(&s, T, Stores::default(), None).status.as_str(),
            "observing"
        );
        assert_eq!(
            quality(&s, T, Stores::default(), None).proof_scope.as_str(),
            "attempted"
        );
        // Accepted work: ready, then stale once it is older than FRESH.
        s.received += 1;
        s.forwarded = 1;
        s.last_accepted_at = Some(T);
        assert_eq!(
            quality(&s, T, Stores::default(), None).status.as_str(),
            "ready"
        );
        assert_eq!(
            quality(&s, T, Stores::default(), None).proof_scope.as_str(),
            "relay_acceptance"
        );
        assert_eq!(
            quality(&s, T + FRESH, Stores::default(), None)
                .status
                .as_str(),
            "stale"
        );
        // A rate limit: protecting, back to ready once RECENT_SECS has passed and evidence is
        // fresh.
        s.rate_limited = 1;
        s.last_protection_at = Some(T + 10);
        s.last_accepted_at = Some(T + 20);
        assert_eq!(
            quality(&s, T + 30, Stores::default(), None).status.as_str(),
            "protecting"
        );
        s.last_accepted_at = Some(T + 10 + RECENT_SECS);
        assert_eq!(
            quality(&s, T + 10 + RECENT_SECS, Stores::default(), None)
                .status
                .as_str(),
            "ready"
        );
        // Forward failures: degraded; backpressure: attention (it wins).
        s.last_forward_failed_at = Some(T + 5000);
        assert_eq!(
            quality(&s, T + 5000, Stores::default(), None)
                .status
                .as_str(),
            "degraded"
        );
        s.last_backpressure_at = Some(T + 5000);
        let q = quality(&s, T + 5000, Stores::default(), None);
        assert_eq!(q.status.as_str(), "attention");
        assert!(q.next_action.contains("CPU"));
        // The same backpressure mostly from one peer: protecting, naming it, not "more CPU".
        let cause = Cause {
            source: CauseSource::Peer,
            peer: Some("1a2b3c4d".into()),
            reason: CauseReason::PeelFailures,
            refused: 97,
            of: 104,
        };
        s.last_forward_failed_at = None;
        let q = quality(&s, T + 5000, Stores::default(), Some(cause.clone()));
        assert_eq!(q.status.as_str(), "protecting");
        assert!(
            q.reason.contains("peer 1a2b3c4d") && q.reason.contains("onion_peel_failed"),
            "{}",
            q.reason
        );
        assert!(q.reason.contains("97 of 104"), "{}", q.reason);
        assert!(!q.next_action.contains("CPU"), "{}", q.next_action);
        assert_eq!(q.cause.as_ref(), Some(&cause));
        // A forward failure outranks it (degraded); a full store still wins (attention).
        s.last_forward_failed_at = Some(T + 5000);
        let q = quality(&s, T + 5000, Stores::default(), Some(cause.clone()));
        assert_eq!(q.status.as_str(), "degraded");
        let json = serde_json::to_value(&q).unwrap();
        assert_eq!(json["cause"]["peer"], "1a2b3c4d");
        assert_eq!(json["cause"]["reason"], "onion_peel_failed");
        // Once the backpressure is old, the cause is not shown.
        let q = quality(&s, T + 5000 + RECENT_SECS, Stores::default(), Some(cause));
        assert_eq!(q.cause, None);
        // A full store is attention while it is full, whatever else happened.
        let full = Stores {
            inbox_full: true,
            replay_full: false,
        };
        assert!(
            quality(&s, T + 5000, full, None)
                .reason
                .contains("inbox is full")
        );
        let full = Stores {
            inbox_full: false,
            replay_full: true,
        };
        let q = quality(&s, T + 5000 + RECENT_SECS, full, None);
        assert_eq!(q.status.as_str(), "attention");
        assert!(q.reason.contains("replay registry is full"));
        // Both problems age out.
        assert_eq!(
            quality(&s, T + 5000 + RECENT_SECS, Stores::default(), None)
                .status
                .as_str(),
            "stale"
        );
    }

    #[test]
    fn proof_scope_and_real_readiness() {
        let mut s = Snapshot {
            probe_attempted: 1,
            ..Default::default()
        };
        assert_eq!(
            quality(&s, T, Stores::default(), None).proof_scope.as_str(),
            "single_hop_control_plane"
        );
        s.two_hop_probe_attempted = 1;
        assert_eq!(
            quality(&s, T, Stores::default(), None).proof_scope.as_str(),
            "control_plane"
        );
        s.two_hop_probe_succeeded = 1;
        s.last_two_hop_probe_succeeded_at = Some(T);
        let q = quality(&s, T, Stores::default(), None);
        assert_eq!(
            (
                q.proof_scope.as_str(),
                q.status.as_str(),
                q.real_relay_ready
            ),
            ("message_delivery", "ready", false)
        );
        s.verified_client_onion_deliveries = 1;
        s.last_verified_client_onion_delivery_at = Some(T);
        let q = quality(&s, T, Stores::default(), None);
        assert_eq!(
            (q.proof_scope.as_str(), q.real_relay_ready),
            ("client_message_delivery", true)
        );
        assert!(!quality(&s, T + FRESH, Stores::default(), None).real_relay_ready);
        // Probe evidence is never counted as relay acceptance.
        assert_eq!(q.relay_acceptance.total, 0);
    }
}
