//! Peer health without who-talks-to-whom.
//!
//! Per peer, aggregates only: how its frames fared as a previous hop (refusals in coarse reason
//! buckets), how forwards and probes to it fared as a next hop (successes, failures, consecutive
//! failures), and when it was last in contact — kept as times, shown only as coarse age
//! buckets. Never a pair of peers, a route, an endpoint, a payload or an address. The table is
//! capped at [`MAX_TRACKED`] peers (the least recently active one goes first) and the summary at
//! [`MAX_ROWS`] rows.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::pipeline::Reason;
use crate::proto::NodeId;

/// Peers tracked at most.
pub const MAX_TRACKED: usize = 4096;
/// Rows in the summary at most.
pub const MAX_ROWS: usize = 64;
/// Consecutive route failures that make a peer `failing`.
pub const FAILING_AFTER: u32 = 3;
/// How far back a failure or refusal makes a peer `degraded`.
pub const RECENT_SECS: u64 = 1800;

/// Coarse reason buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bucket {
    /// Over its rate.
    RateLimit,
    /// Refused while quarantined.
    Quarantine,
    /// Loops.
    Loop,
    /// No hops left.
    Ttl,
    /// Too old or too new.
    Timestamp,
    /// Replay conflicts and expired replays.
    Replay,
    /// Its layer did not open.
    Layer,
    /// A next-hop problem: unreachable.
    Transport,
    /// A next-hop problem: it refused.
    Refused,
    /// Anything else.
    Other,
}

const BUCKETS: [Bucket; 10] = [
    Bucket::RateLimit,
    Bucket::Quarantine,
    Bucket::Loop,
    Bucket::Ttl,
    Bucket::Timestamp,
    Bucket::Replay,
    Bucket::Layer,
    Bucket::Transport,
    Bucket::Refused,
    Bucket::Other,
];

impl Bucket {
    /// The bucket of a refusal of a previous hop's frame.
    pub fn of(r: Reason) -> Bucket {
        use Reason::*;
        match r {
            RateLimited => Bucket::RateLimit,
            Quarantined => Bucket::Quarantine,
            SelfLoop | RouteLoop => Bucket::Loop,
            TtlExhausted => Bucket::Ttl,
            TimestampExpired | TimestampInFuture => Bucket::Timestamp,
            ReplayConflict | ReplayResponseExpired | RouteInFlight => Bucket::Replay,
            OnionPeelFailed => Bucket::Layer,
            _ => Bucket::Other,
        }
    }

    fn index(self) -> usize {
        BUCKETS
            .iter()
            .position(|b| *b == self)
            .unwrap_or(BUCKETS.len() - 1)
    }
}

#[derive(Debug, Clone, Default)]
struct Stats {
    route_successes: u64,
    route_failures: u64,
    consecutive_failures: u32,
    last_contact: Option<u64>,
    last_route_success: Option<u64>,
    last_route_failure: Option<u64>,
    last_refusal: Option<u64>,
    reasons: [u64; BUCKETS.len()],
}

impl Stats {
    fn last_activity(&self) -> u64 {
        [
            self.last_contact,
            self.last_route_success,
            self.last_route_failure,
            self.last_refusal,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
    }
}

/// The per-peer table.
#[derive(Debug, Default)]
pub struct Health {
    map: Mutex<HashMap<NodeId, Stats>>,
}

/// What the summary shows of a peer's descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DescriptorState {
    /// Valid for more than 5 minutes.
    Valid,
    /// Expires within 5 minutes.
    Expiring,
    /// Expired.
    Expired,
    /// No descriptor (a previous hop only).
    None,
}

/// One row of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The first 4 bytes of its node id, in hex.
    pub node: String,
    /// `quarantined`, `failing`, `degraded`, `healthy` or `unknown`.
    pub health: &'static str,
    /// Its descriptor.
    pub descriptor: DescriptorState,
    /// Age of the last contact, coarse.
    pub last_contact: &'static str,
    /// Age of the last route success, coarse.
    pub last_route_success: &'static str,
    /// Forwards and probes to it that succeeded.
    pub route_successes: u64,
    /// …that failed.
    pub route_failures: u64,
    /// Quarantined by this node's guard now.
    pub quarantined: bool,
    /// Seconds of quarantine left.
    pub quarantine_remaining_secs: u64,
    /// Refusals of its frames and failures to it, by coarse bucket (zero buckets left out).
    pub reasons: HashMap<Bucket, u64>,
}

/// A coarse age: never an exact time.
pub fn age_bucket(then: Option<u64>, now: u64) -> &'static str {
    match then.map(|t| now.saturating_sub(t)) {
        None => "never",
        Some(a) if a < 60 => "<1m",
        Some(a) if a < 600 => "<10m",
        Some(a) if a < 3600 => "<1h",
        Some(a) if a < 86_400 => "<1d",
        Some(_) => "older",
    }
}

impl Health {
    fn with(&self, peer: &NodeId, now: u64, f: impl FnOnce(&mut Stats)) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(peer) && map.len() >= MAX_TRACKED {
            let oldest = map
                .iter()
                .min_by_key(|(_, s)| s.last_activity())
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                map.remove(&k);
            }
        }
        let s = map.entry(*peer).or_default();
        f(s);
        let _ = now;
    }

    /// An authenticated frame from `peer` as previous hop.
    pub fn record_contact(&self, peer: &NodeId, now: u64) {
        self.with(peer, now, |s| s.last_contact = Some(now));
    }

    /// A refusal of `peer`'s frame (after authentication).
    pub fn record_refusal(&self, peer: &NodeId, why: Reason, now: u64) {
        self.with(peer, now, |s| {
            s.last_contact = Some(now);
            s.last_refusal = Some(now);
            s.reasons[Bucket::of(why).index()] += 1;
        });
    }

    /// A forward or probe to `peer` as next hop.
    pub fn record_route(&self, peer: &NodeId, ok: bool, now: u64) {
        self.record_route_reason(peer, ok, Bucket::Transport, now);
    }

    /// As [`Health::record_route`], with the bucket of a failure.
    pub fn record_route_reason(&self, peer: &NodeId, ok: bool, why: Bucket, now: u64) {
        self.with(peer, now, |s| {
            if ok {
                s.route_successes += 1;
                s.consecutive_failures = 0;
                s.last_route_success = Some(now);
                s.last_contact = Some(now);
            } else {
                s.route_failures += 1;
                s.consecutive_failures += 1;
                s.last_route_failure = Some(now);
                s.reasons[why.index()] += 1;
            }
        });
    }

    /// Peers tracked.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The summary: tracked peers and peers with a descriptor, worst first, at most
    /// [`MAX_ROWS`] rows. `descriptor` gives a peer's descriptor expiry; `quarantine` its
    /// remaining quarantine seconds.
    pub fn summary(
        &self,
        now: u64,
        descriptors: &HashMap<NodeId, u64>,
        quarantine: impl Fn(&NodeId) -> u64,
    ) -> Summary {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut ids: Vec<NodeId> = map.keys().chain(descriptors.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut rows: Vec<(u8, Row)> = ids
            .iter()
            .map(|id| {
                let s = map.get(id).cloned().unwrap_or_default();
                let q = quarantine(id);
                let descriptor = match descriptors.get(id) {
                    None => DescriptorState::None,
                    Some(&exp) if exp <= now => DescriptorState::Expired,
                    Some(&exp) if exp <= now + 300 => DescriptorState::Expiring,
                    Some(_) => DescriptorState::Valid,
                };
                let recent =
                    |t: Option<u64>| t.is_some_and(|t| now.saturating_sub(t) < RECENT_SECS);
                let (rank, health) = if q > 0 {
                    (0, "quarantined")
                } else if s.consecutive_failures >= FAILING_AFTER {
                    (1, "failing")
                } else if matches!(
                    descriptor,
                    DescriptorState::Expired | DescriptorState::Expiring
                ) || recent(s.last_route_failure)
                    || recent(s.last_refusal)
                {
                    (2, "degraded")
                } else if s.last_contact.is_some() || s.route_successes > 0 {
                    (3, "healthy")
                } else {
                    (4, "unknown")
                };
                let reasons = BUCKETS
                    .iter()
                    .zip(s.reasons)
                    .filter(|(_, n)| *n > 0)
                    .map(|(b, n)| (*b, n))
                    .collect();
                let row = Row {
                    node: crate::proto::Prefix(id).to_string(),
                    health,
                    descriptor,
                    last_contact: age_bucket(s.last_contact, now),
                    last_route_success: age_bucket(s.last_route_success, now),
                    route_successes: s.route_successes,
                    route_failures: s.route_failures,
                    quarantined: q > 0,
                    quarantine_remaining_secs: q,
                    reasons,
                };
                (rank, row)
            })
            .collect();
        rows.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.1.route_failures.cmp(&a.1.route_failures))
                .then(a.1.node.cmp(&b.1.node))
        });
        let count = |h: &str| rows.iter().filter(|(_, r)| r.health == h).count();
        Summary {
            total_peers: rows.len(),
            quarantined: count("quarantined"),
            failing: count("failing"),
            degraded: count("degraded"),
            healthy: count("healthy"),
            unknown: count("unknown"),
            rows: rows.into_iter().take(MAX_ROWS).map(|(_, r)| r).collect(),
        }
    }
}

/// The peer health summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Peers known (tracked or with a descriptor).
    pub total_peers: usize,
    /// Of which quarantined.
    pub quarantined: usize,
    /// Failing.
    pub failing: usize,
    /// Degraded.
    pub degraded: usize,
    /// Healthy.
    pub healthy: usize,
    /// No contact yet.
    pub unknown: usize,
    /// Worst first, at most [`MAX_ROWS`].
    pub rows: Vec<Row>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_sorted_worst_first() {
        let h = Health::default();
        let now = 10_000;
        for i in 0..100u8 {
            let mut id = [0u8; 32];
            id[0] = i;
            h.record_route(&id, i % 2 == 0, now);
        }
        let mut failing = [0u8; 32];
        failing[0] = 1;
        for _ in 0..3 {
            h.record_route(&failing, false, now);
        }
        let s = h.summary(now, &HashMap::new(), |id| if id[0] == 7 { 42 } else { 0 });
        assert_eq!(s.total_peers, 100);
        assert_eq!(s.rows.len(), MAX_ROWS);
        assert_eq!(s.rows[0].health, "quarantined");
        assert_eq!(s.rows[0].quarantine_remaining_secs, 42);
        assert_eq!(s.rows[1].health, "failing");
        assert_eq!(s.rows[1].node, "01000000");
        assert_eq!(
            s.quarantined + s.failing + s.degraded + s.healthy + s.unknown,
            100
        );
    }

    #[test]
    fn the_table_is_capped() {
        let h = Health::default();
        for i in 0..(MAX_TRACKED as u32 + 100) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_be_bytes());
            h.record_contact(&id, u64::from(i));
        }
        assert_eq!(h.len(), MAX_TRACKED);
    }

    #[test]
    fn ages_are_coarse() {
        assert_eq!(age_bucket(None, 100), "never");
        assert_eq!(age_bucket(Some(90), 100), "<1m");
        assert_eq!(age_bucket(Some(0), 3000), "<1h");
        assert_eq!(age_bucket(Some(0), 100_000), "older");
    }
}
