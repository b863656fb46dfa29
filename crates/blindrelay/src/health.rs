//! Peer health without who-talks-to-whom.
//!
//! Per peer, aggregates only: how its frames fared as a previous hop (refusals in coarse reason
//! buckets), how forwards and probes to it fared as a next hop (successes, failures, consecutive
//! failures), and when it was last in contact — kept as times, shown only as coarse age
//! buckets. Never a pair of peers, a route, an endpoint, a payload or an address. The table is
//! capped at [`MAX_TRACKED`] peers and the summary at [`MAX_ROWS`] rows. When it is full, rows
//! go in this order (see [`Stats::keep`]): strangers first (the least recently active first),
//! then known peers that were quiet for [`RECENT_SECS`]; a quarantined peer's row and an active
//! known peer's row go only for a row at least as precious. So a flood of throwaway identities
//! (each one signs a frame, each one gets a row) churns among its own rows and never hides a
//! quarantine or an honest neighbour.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::proto::{NodeId, Prefix};
use crate::reason::Reason;

/// Peers tracked at most.
pub const MAX_TRACKED: usize = 4096;
/// Rows in the summary at most.
pub const MAX_ROWS: usize = 64;
/// Consecutive route failures that make a peer `failing`.
pub const FAILING_AFTER: u32 = 3;
/// How far back a failure or refusal makes a peer `degraded`; also how far back problems set
/// the node's `protecting`, `degraded` or `attention` (`crate::status::quality`).
pub const RECENT_SECS: u64 = 1800;
/// A descriptor expiring within this is `expiring`.
pub const EXPIRING_SECS: u64 = 300;
/// After its first failure a peer is probed again this long after its last failure, the wait
/// doubling with each further failure up to [`RECOVERY_MAX_SECS`].
pub const RECOVERY_FIRST_SECS: u64 = 5;
/// The longest wait between two recovery probes of a failing peer.
pub const RECOVERY_MAX_SECS: u64 = 300;

named_enum! {
    /// Coarse reason buckets.
    pub enum Bucket {
        /// Over its rate.
        RateLimit = "rate_limit",
        /// Refused while quarantined.
        Quarantine = "quarantine",
        /// Loops.
        Loop = "loop",
        /// Too old or too new.
        Timestamp = "timestamp",
        /// Replay conflicts and expired replays.
        Replay = "replay",
        /// Its layer did not open.
        Layer = "layer",
        /// A next-hop problem: unreachable.
        Transport = "transport",
        /// A next-hop problem: it refused.
        Refused = "refused",
        /// A next hop answered busy (`429`, `503`: backpressure, its share, a route in flight):
        /// its own state for a moment, not a failure of the route.
        Busy = "busy",
        /// A next hop answered that a hop past it failed (`forward_failed`): it did its part (it
        /// peeled, reserved and forwarded); which later hop failed nobody upstream can tell, so
        /// this is a contact, not a route failure of this peer.
        Beyond = "beyond",
        /// Anything else.
        Other = "other",
    }
}

impl Bucket {
    /// The bucket of a refusal of a previous hop's frame.
    pub fn of(r: Reason) -> Bucket {
        use Reason::*;
        match r {
            RateLimited => Bucket::RateLimit,
            Quarantined => Bucket::Quarantine,
            SelfLoop | RouteLoop => Bucket::Loop,
            TimestampExpired | TimestampInFuture => Bucket::Timestamp,
            ReplayConflict | ReplayResponseExpired | RouteInFlight => Bucket::Replay,
            OnionPeelFailed => Bucket::Layer,
            _ => Bucket::Other,
        }
    }
}

const BUCKETS: usize = Bucket::ALL.len();

named_enum! {
    /// A peer's health, worst first.
    pub enum HealthState {
        /// Quarantined by this node's guard now.
        Quarantined = "quarantined",
        /// [`FAILING_AFTER`] consecutive route failures.
        Failing = "failing",
        /// Its descriptor expired or expires soon, or a route failure or a refusal of its frames
        /// within [`RECENT_SECS`].
        Degraded = "degraded",
        /// Contact or a route success.
        Healthy = "healthy",
        /// No contact yet.
        Unknown = "unknown",
    }
}

named_enum! {
    /// What the summary shows of a peer's descriptor.
    pub enum DescriptorState {
        /// Valid for more than [`EXPIRING_SECS`].
        Valid = "valid",
        /// Expires within [`EXPIRING_SECS`].
        Expiring = "expiring",
        /// Expired.
        Expired = "expired",
        /// No descriptor (a previous hop only).
        None = "none",
    }
}

named_enum! {
    /// A coarse age: never an exact time.
    #[derive(Default)]
    pub enum Age {
        /// Never happened.
        #[default]
        Never = "never",
        /// Under a minute ago.
        Minute = "<1m",
        /// Under ten minutes ago.
        TenMinutes = "<10m",
        /// Under an hour ago.
        Hour = "<1h",
        /// Under a day ago.
        Day = "<1d",
        /// A day ago or more.
        Older = "older",
    }
}

fn never() -> Age {
    Age::Never
}

impl Age {
    /// The age of `then` at `now`.
    pub fn of(then: Option<u64>, now: u64) -> Age {
        match then.map(|t| now.saturating_sub(t)) {
            None => Age::Never,
            Some(a) if a < 60 => Age::Minute,
            Some(a) if a < 600 => Age::TenMinutes,
            Some(a) if a < 3600 => Age::Hour,
            Some(a) if a < 86_400 => Age::Day,
            Some(_) => Age::Older,
        }
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
    /// This node's guard quarantined it until then.
    quarantined_until: Option<u64>,
    /// Its last failure was heard of in a route's report, not met directly: no recovery
    /// probe goes to it (it may be a send's terminal), it is usable again once the recovery
    /// wait is over.
    heard: bool,
    /// A known peer: it had a descriptor when its frame came, or a forward or probe to it
    /// succeeded. A throwaway identity can sign frames but is never known.
    known: bool,
    /// Indexed like [`Bucket::ALL`].
    reasons: [u64; BUCKETS],
}

impl Stats {
    /// How precious the row is when the table is full, lowest evicted first: 2 quarantined now,
    /// 1 a known peer active within [`RECENT_SECS`], 0 anything else.
    fn keep(&self, now: u64) -> u8 {
        if self.quarantined_until.is_some_and(|u| u > now) {
            2
        } else if self.known && now.saturating_sub(self.last_activity()) < RECENT_SECS {
            1
        } else {
            0
        }
    }

    /// It failed, and its last failure is at least [`RECOVERY_FIRST_SECS`] old, doubled per
    /// further failure up to [`RECOVERY_MAX_SECS`].
    fn wait_over(&self, now: u64) -> bool {
        let (Some(at), n) = (self.last_route_failure, self.consecutive_failures) else {
            return false;
        };
        let wait = RECOVERY_FIRST_SECS
            .saturating_mul(1 << n.saturating_sub(1).min(16))
            .min(RECOVERY_MAX_SECS);
        n > 0 && now >= at.saturating_add(wait)
    }

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

/// The per-peer table. The lock is held for one update or one copy, never across another lock.
#[derive(Default)]
pub struct Health {
    map: Mutex<HashMap<NodeId, Stats>>,
}

/// Counts only: the table is keyed by full node ids.
impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("tracked", &self.lock().len())
            .finish()
    }
}

/// What the peer table knows of a peer with a descriptor, for its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// Its descriptor's expiry (Unix seconds).
    pub expires_at: u64,
    /// Where its descriptor came from: `bootstrap`, `gossip` or `cache`.
    pub source: &'static str,
    /// When this node last gossiped with it or learned its descriptor by gossip.
    pub last_gossip: Option<u64>,
    /// This node reached it at its endpoint once.
    pub reached: bool,
}

/// One row of the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The first 4 bytes of its node id, in hex.
    pub node: String,
    /// Its health.
    pub health: HealthState,
    /// Its descriptor.
    pub descriptor: DescriptorState,
    /// Where its descriptor came from (`bootstrap`: a `--peer` URL, `gossip`, `cache`: the
    /// peer store, not refreshed since the start); absent for a previous hop with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Age of the last gossip with it or about it (its descriptor learned by gossip), coarse.
    #[serde(default = "never")]
    pub last_gossip: Age,
    /// This node's own routes may take it as a middle now: reached once at its endpoint, not
    /// failing, not quarantined (`crate::send::path`).
    #[serde(default)]
    pub in_routes: bool,
    /// Age of the last contact, coarse.
    pub last_contact: Age,
    /// Age of the last route success, coarse.
    pub last_route_success: Age,
    /// Forwards and probes to it that succeeded.
    pub route_successes: u64,
    /// …that failed.
    pub route_failures: u64,
    /// Quarantined by this node's guard now.
    pub quarantined: bool,
    /// Seconds of quarantine left.
    pub quarantine_remaining_secs: u64,
    /// Its frames keep failing to open (12 in 300 s): its requests take a stranger's share of
    /// the crypto slots while it lasts (never a quarantine: a sender could have sealed them).
    #[serde(default)]
    pub share_cut: bool,
    /// Refusals of its frames and failures to it, by coarse bucket (zero buckets left out).
    pub reasons: BTreeMap<Bucket, u64>,
}

/// Every previous hop that is not a known peer (no descriptor here, never a success to it), as
/// one row: throwaway identities are counted, never listed one by one.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StrangersRow {
    /// Identities tracked.
    pub identities: usize,
    /// Of which quarantined now.
    pub quarantined: usize,
    /// Of which with their share of crypto slots cut ([`Row::share_cut`]).
    pub share_cut: usize,
    /// Refusals of their frames, all of them.
    pub refusals: u64,
    /// …by coarse bucket (zero buckets left out).
    pub reasons: BTreeMap<Bucket, u64>,
    /// Age of the last contact of any of them, coarse.
    #[serde(default = "never")]
    pub last_contact: Age,
}

/// What this node's guard holds against a peer now ([`Health::summary`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Seconds of quarantine left (0: none).
    pub quarantine_secs: u64,
    /// Its requests take a stranger's share of the crypto slots.
    pub share_cut: bool,
}

/// The peer health summary: a row per known peer, strangers in one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Known peers (a descriptor here, or a success to it); the counts below are of them.
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
    /// Peers this node's own routes may take as middles now ([`Row::in_routes`]).
    #[serde(default)]
    pub in_routes: usize,
    /// Worst first, at most [`MAX_ROWS`]: known peers only.
    pub rows: Vec<Row>,
    /// Every other previous hop, as one row.
    #[serde(default)]
    pub strangers: StrangersRow,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Stats>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Updates `peer`'s stats at `now`. A new peer while the table is full takes the place of
    /// the least precious row ([`Stats::keep`], then the least recently active), unless every
    /// row is more precious than the new one: then the new one is not tracked.
    fn with(&self, peer: &NodeId, now: u64, f: impl FnOnce(&mut Stats)) {
        let mut map = self.lock();
        if let Some(s) = map.get_mut(peer) {
            f(s);
            return;
        }
        let mut fresh = Stats::default();
        f(&mut fresh);
        if map.len() >= MAX_TRACKED {
            let victim = map
                .iter()
                .map(|(k, s)| ((s.keep(now), s.last_activity()), *k))
                .min();
            match victim {
                Some(((keep, _), k)) if keep <= fresh.keep(now) => {
                    map.remove(&k);
                }
                _ => return,
            }
        }
        map.insert(*peer, fresh);
    }

    /// An authenticated frame from `peer` as previous hop.
    pub fn record_contact(&self, peer: &NodeId, now: u64) {
        self.with(peer, now, |s| s.last_contact = Some(now));
    }

    /// An authenticated frame from `peer`, a known peer (it has a descriptor here).
    pub fn record_known_contact(&self, peer: &NodeId, now: u64) {
        self.with(peer, now, |s| {
            s.last_contact = Some(now);
            s.known = true;
        });
    }

    /// This node's guard quarantined `peer` until `until` (its row is kept while it lasts).
    pub fn record_quarantine(&self, peer: &NodeId, until: u64, now: u64) {
        self.with(peer, now, |s| {
            s.quarantined_until = Some(s.quarantined_until.map_or(until, |u| u.max(until)));
        });
    }

    /// A refusal of `peer`'s frame (after authentication).
    pub fn record_refusal(&self, peer: &NodeId, why: Reason, now: u64) {
        self.with(peer, now, |s| {
            s.last_contact = Some(now);
            s.last_refusal = Some(now);
            s.reasons[Bucket::of(why) as usize] += 1;
        });
    }

    /// A forward or probe to `peer` as next hop that got an answer (`ok`) or none (a failure
    /// counted as `transport`).
    pub fn record_route(&self, peer: &NodeId, ok: bool, now: u64) {
        self.record_route_reason(peer, ok, Bucket::Transport, now);
    }

    /// A next hop's refusal of a forward or send, by its HTTP status and the reason it names: a
    /// `429` or `503` is the next hop busy (backpressure, its share, a route still in flight,
    /// its disk: its own state, see `reason::Blame::ThisNode`/`Nobody` from its side), noted in
    /// the `busy` bucket as a contact, not a route failure; `forward_failed` is a failure past
    /// the next hop (a hop's own store failure is `state_write_failed`), noted in `beyond` as a
    /// contact; any other refusal is a route failure (`refused`).
    pub fn record_refused(&self, peer: &NodeId, status: u16, reason: Option<Reason>, now: u64) {
        let contact = match (status, reason) {
            (429 | 503, _) => Bucket::Busy,
            (_, Some(Reason::ForwardFailed)) => Bucket::Beyond,
            _ => return self.record_route_reason(peer, false, Bucket::Refused, now),
        };
        self.with(peer, now, |s| {
            s.last_contact = Some(now);
            s.reasons[contact as usize] += 1;
        });
    }

    /// As [`Health::record_route`], with the bucket of a failure.
    pub fn record_route_reason(&self, peer: &NodeId, ok: bool, why: Bucket, now: u64) {
        self.with(peer, now, |s| {
            s.heard = false;
            if ok {
                s.known = true;
                s.route_successes += 1;
                s.consecutive_failures = 0;
                s.last_route_success = Some(now);
                s.last_contact = Some(now);
            } else {
                s.route_failures += 1;
                s.consecutive_failures += 1;
                s.last_route_failure = Some(now);
                s.reasons[why as usize] += 1;
            }
        });
    }

    /// Whether this node's own sends may route through `peer` at `now`: not quarantined by
    /// this node's guard, and not failing (a route attempt failed and none succeeded since: a
    /// recovery probe tells when it is back, `crate::probe`). A peer with no row is usable.
    pub fn usable(&self, peer: &NodeId, now: u64) -> bool {
        self.lock().get(peer).is_none_or(|s| {
            let recovered = s.consecutive_failures == 0 || (s.heard && s.wait_over(now));
            recovered && s.quarantined_until.is_none_or(|u| u <= now)
        })
    }

    /// The failure just recorded for `peer` was heard of in a route's report (the peer was
    /// not contacted by this node): see [`Stats::heard`].
    pub fn heard_of(&self, peer: &NodeId, now: u64) {
        self.with(peer, now, |s| s.heard = s.consecutive_failures > 0);
    }

    /// Whether a recovery probe of `peer` is due at `now`: it failed, and its last failure is
    /// at least [`RECOVERY_FIRST_SECS`] old, doubled per further failure up to
    /// [`RECOVERY_MAX_SECS`]. A peer with no failure needs none.
    pub fn recovery_due(&self, peer: &NodeId, now: u64) -> bool {
        self.lock()
            .get(peer)
            .is_some_and(|s| !s.heard && s.wait_over(now))
    }

    /// The summary: a row per known peer (tracked with a success, or with a descriptor),
    /// worst first, at most [`MAX_ROWS`] rows, and every other tracked identity in one
    /// [`StrangersRow`]. `descriptors` tells what the peer table knows of each peer with one;
    /// `standing` what the guard holds against it. The table is copied first: no other lock is
    /// taken while this one is held.
    pub fn summary(
        &self,
        now: u64,
        descriptors: &HashMap<NodeId, Known>,
        standing: impl Fn(&NodeId) -> Standing,
    ) -> Summary {
        let map = self.lock().clone();
        let mut ids: Vec<NodeId> = map.keys().chain(descriptors.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut rows = Vec::new();
        let mut strangers = StrangersRow::default();
        let mut last_stranger = None;
        for id in &ids {
            let s = map.get(id).cloned().unwrap_or_default();
            let k = descriptors.get(id).copied();
            let row = row(id, &s, k, standing(id), now);
            if s.known || k.is_some() {
                rows.push(row);
                continue;
            }
            strangers.identities += 1;
            strangers.quarantined += usize::from(row.quarantined);
            strangers.share_cut += usize::from(row.share_cut);
            for (b, n) in row.reasons {
                strangers.refusals += n;
                *strangers.reasons.entry(b).or_default() += n;
            }
            last_stranger = last_stranger.max(s.last_contact);
        }
        strangers.last_contact = Age::of(last_stranger, now);
        rows.sort_by(|a, b| {
            a.health
                .cmp(&b.health)
                .then(b.route_failures.cmp(&a.route_failures))
                .then(a.node.cmp(&b.node))
        });
        let count = |h: HealthState| rows.iter().filter(|r| r.health == h).count();
        Summary {
            total_peers: rows.len(),
            quarantined: count(HealthState::Quarantined),
            failing: count(HealthState::Failing),
            degraded: count(HealthState::Degraded),
            healthy: count(HealthState::Healthy),
            unknown: count(HealthState::Unknown),
            in_routes: rows.iter().filter(|r| r.in_routes).count(),
            rows: rows.into_iter().take(MAX_ROWS).collect(),
            strangers,
        }
    }

    /// Peers tracked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One peer's row: its health, first match wins (quarantined, failing, degraded, healthy,
/// unknown).
fn row(id: &NodeId, s: &Stats, known: Option<Known>, standing: Standing, now: u64) -> Row {
    let quarantine = standing.quarantine_secs;
    let descriptor = match known.map(|k| k.expires_at) {
        None => DescriptorState::None,
        Some(exp) if exp <= now => DescriptorState::Expired,
        Some(exp) if exp <= now + EXPIRING_SECS => DescriptorState::Expiring,
        Some(_) => DescriptorState::Valid,
    };
    let recent = |t: Option<u64>| t.is_some_and(|t| now.saturating_sub(t) < RECENT_SECS);
    let health = if quarantine > 0 {
        HealthState::Quarantined
    } else if s.consecutive_failures >= FAILING_AFTER {
        HealthState::Failing
    } else if matches!(
        descriptor,
        DescriptorState::Expired | DescriptorState::Expiring
    ) || recent(s.last_route_failure)
        || recent(s.last_refusal)
    {
        HealthState::Degraded
    } else if s.last_contact.is_some() || s.route_successes > 0 {
        HealthState::Healthy
    } else {
        HealthState::Unknown
    };
    Row {
        node: Prefix(id).to_string(),
        health,
        descriptor,
        source: known.map(|k| k.source.to_string()),
        last_gossip: Age::of(known.and_then(|k| k.last_gossip), now),
        in_routes: known.is_some_and(|k| k.reached)
            && matches!(
                descriptor,
                DescriptorState::Valid | DescriptorState::Expiring
            )
            && (s.consecutive_failures == 0 || (s.heard && s.wait_over(now)))
            && quarantine == 0,
        last_contact: Age::of(s.last_contact, now),
        last_route_success: Age::of(s.last_route_success, now),
        route_successes: s.route_successes,
        route_failures: s.route_failures,
        quarantined: quarantine > 0,
        quarantine_remaining_secs: quarantine,
        share_cut: standing.share_cut,
        reasons: Bucket::ALL
            .iter()
            .zip(s.reasons)
            .filter(|(_, n)| *n > 0)
            .map(|(b, n)| (*b, n))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quarantined(secs: u64) -> Standing {
        Standing {
            quarantine_secs: secs,
            share_cut: false,
        }
    }

    /// `ids` as peers with a descriptor from gossip, valid long.
    fn known(ids: &[NodeId]) -> HashMap<NodeId, Known> {
        let k = Known {
            expires_at: u64::MAX,
            source: "gossip",
            last_gossip: None,
            reached: true,
        };
        ids.iter().map(|id| (*id, k)).collect()
    }

    #[test]
    fn bounded_and_sorted_worst_first() {
        let h = Health::default();
        let now = 10_000;
        for i in 0..100u8 {
            let mut id = [0u8; 32];
            id[0] = i;
            h.record_known_contact(&id, now);
            h.record_route(&id, i % 2 == 0, now);
        }
        let mut failing = [0u8; 32];
        failing[0] = 1;
        for _ in 0..3 {
            h.record_route(&failing, false, now);
        }
        let s = h.summary(now, &HashMap::new(), |id| {
            quarantined(if id[0] == 7 { 42 } else { 0 })
        });
        assert_eq!(s.total_peers, 100);
        assert_eq!(s.rows.len(), MAX_ROWS);
        assert_eq!(s.rows[0].health.as_str(), "quarantined");
        assert_eq!(s.rows[0].quarantine_remaining_secs, 42);
        assert_eq!(s.rows[1].health.as_str(), "failing");
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

    /// Item 6 of issue 12: a flood of throwaway identities fills the table while one peer is
    /// quarantined and one known peer is active: both rows stay, the summary counts the
    /// quarantine, and the flood churns among its own rows.
    #[test]
    fn a_sybil_flood_never_evicts_a_quarantine_or_an_active_known_peer() {
        let h = Health::default();
        let now = 10_000;
        let (bad, neighbour) = ([0xaa; 32], [0xbb; 32]);
        h.record_known_contact(&bad, now);
        h.record_refusal(&bad, Reason::RateLimited, now);
        h.record_quarantine(&bad, now + 300, now);
        h.record_known_contact(&neighbour, now);
        for i in 0..(MAX_TRACKED as u32 + 256) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_be_bytes());
            // Later throwaways are more recent than the quarantine and the neighbour.
            h.record_contact(&id, now + 1 + u64::from(i) / 64);
        }
        assert_eq!(h.len(), MAX_TRACKED);
        let later = now + 100;
        let left = |id: &NodeId| quarantined(if *id == bad { 200 } else { 0 });
        let s = h.summary(later, &HashMap::new(), left);
        assert_eq!(s.quarantined, 1, "{:?}", &s.rows[..2]);
        // The throwaways are one row, counted, never one row each.
        assert_eq!(s.total_peers, 2);
        assert_eq!(s.rows.len(), 2);
        assert_eq!(s.strangers.identities, MAX_TRACKED - 2);
        assert_eq!(s.strangers.last_contact, Age::Minute);
        assert_eq!(s.rows[0].node, "aaaaaaaa");
        assert!(
            s.rows
                .iter()
                .any(|r| r.node == "bbbbbbbb" && r.health.as_str() == "healthy")
        );
        // The newest throwaway got a row: the flood churned among its own.
        let mut newest = [0u8; 32];
        newest[..4].copy_from_slice(&(MAX_TRACKED as u32 + 255).to_be_bytes());
        assert!(h.lock().contains_key(&newest));
        // Once the quarantine is over and the neighbour quiet for long, they may go.
        let much_later = now + RECENT_SECS + 400;
        h.record_contact(&[0xcc; 32], much_later);
        h.record_contact(&[0xcd; 32], much_later);
        assert!(!h.lock().contains_key(&bad));
        assert!(!h.lock().contains_key(&neighbour));
    }

    #[test]
    fn a_busy_answer_is_busy_not_a_route_failure() {
        let h = Health::default();
        let id = [3u8; 32];
        h.record_refused(&id, 429, None, 100);
        h.record_refused(&id, 503, Some(Reason::StateWriteFailed), 100);
        let peers = known(&[id]);
        let s = h.summary(100, &peers, |_| Standing::default());
        let r = &s.rows[0];
        assert_eq!((r.health, r.route_failures), (HealthState::Healthy, 0));
        assert_eq!(r.reasons, BTreeMap::from([(Bucket::Busy, 2)]));
        // A later hop's failure, passed on: not this peer's.
        h.record_refused(&id, 502, Some(Reason::ForwardFailed), 100);
        let s = h.summary(100, &peers, |_| Standing::default());
        let r = &s.rows[0];
        assert_eq!((r.health, r.route_failures), (HealthState::Healthy, 0));
        assert_eq!(r.reasons.get(&Bucket::Beyond), Some(&1));
        h.record_refused(&id, 502, Some(Reason::NoRoute), 100);
        let s = h.summary(100, &peers, |_| Standing::default());
        assert_eq!(s.rows[0].route_failures, 1);
        assert_eq!(s.rows[0].reasons.get(&Bucket::Refused), Some(&1));
    }

    #[test]
    fn a_failed_peer_is_avoided_until_it_answers_again_and_probed_ever_less_often() {
        let h = Health::default();
        let id = [5u8; 32];
        assert!(h.usable(&id, 100), "no row: usable");
        assert!(!h.recovery_due(&id, 100));
        h.record_route(&id, false, 100);
        assert!(!h.usable(&id, 100));
        assert!(!h.recovery_due(&id, 104));
        assert!(h.recovery_due(&id, 105));
        h.record_route(&id, false, 105);
        assert!(!h.recovery_due(&id, 114));
        assert!(h.recovery_due(&id, 115));
        for t in 0..20 {
            h.record_route(&id, false, 200 + t);
        }
        assert!(!h.recovery_due(&id, 219 + RECOVERY_MAX_SECS - 1));
        assert!(h.recovery_due(&id, 219 + RECOVERY_MAX_SECS));
        // A busy answer is not a failure; a success brings it back.
        h.record_refused(&id, 429, None, 600);
        assert!(!h.usable(&id, 600));
        h.record_route(&id, true, 601);
        assert!(h.usable(&id, 601));
        assert!(!h.recovery_due(&id, 10_000));
        // Quarantined by this node: not used while it lasts.
        h.record_quarantine(&id, 700, 601);
        assert!(!h.usable(&id, 699));
        assert!(h.usable(&id, 700));
    }

    #[test]
    fn strangers_are_one_row_and_a_known_peer_with_its_share_cut_says_so() {
        let h = Health::default();
        let (peer, now) = ([1u8; 32], 500);
        for i in 0..50u8 {
            let id = [i + 100; 32];
            h.record_refusal(&id, Reason::OnionPeelFailed, now);
            h.record_refusal(&id, Reason::RateLimited, now);
        }
        for _ in 0..12 {
            h.record_refusal(&peer, Reason::OnionPeelFailed, now);
        }
        let standing = |id: &NodeId| Standing {
            quarantine_secs: if id[0] == 100 { 300 } else { 0 },
            share_cut: id[0] == 1 || id[0] == 101,
        };
        let s = h.summary(now, &known(&[peer]), standing);
        assert_eq!((s.total_peers, s.rows.len(), s.degraded), (1, 1, 1));
        let row = &s.rows[0];
        assert!(row.share_cut, "{row:?}");
        assert_eq!(row.reasons.get(&Bucket::Layer), Some(&12));
        let st = &s.strangers;
        assert_eq!(
            (st.identities, st.quarantined, st.share_cut, st.refusals),
            (50, 1, 1, 100)
        );
        assert_eq!(st.reasons.get(&Bucket::Layer), Some(&50));
        assert_eq!(st.reasons.get(&Bucket::RateLimit), Some(&50));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["strangers"]["identities"], 50);
        assert_eq!(json["rows"][0]["share_cut"], true);
    }

    #[test]
    fn ages_are_coarse() {
        assert_eq!(Age::of(None, 100).as_str(), "never");
        assert_eq!(Age::of(Some(90), 100).as_str(), "<1m");
        assert_eq!(Age::of(Some(0), 3000).as_str(), "<1h");
        assert_eq!(Age::of(Some(0), 100_000).as_str(), "older");
    }

    #[test]
    fn rows_round_trip_through_json_with_the_documented_names() {
        let h = Health::default();
        let id = [9u8; 32];
        h.record_refusal(&id, Reason::RouteLoop, 100);
        h.record_route(&id, false, 100);
        let k = Known {
            expires_at: 200,
            source: "gossip",
            last_gossip: Some(90),
            reached: true,
        };
        let s = h.summary(100, &HashMap::from([(id, k)]), |_| Standing::default());
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["rows"][0]["health"], "degraded");
        assert_eq!(json["rows"][0]["descriptor"], "expiring");
        assert_eq!(json["rows"][0]["last_contact"], "<1m");
        assert_eq!(json["rows"][0]["last_route_success"], "never");
        assert_eq!(json["rows"][0]["reasons"]["loop"], 1);
        assert_eq!(json["rows"][0]["reasons"]["transport"], 1);
        assert_eq!(json["rows"][0]["source"], "gossip");
        assert_eq!(json["rows"][0]["last_gossip"], "<1m");
        assert_eq!(
            json["rows"][0]["in_routes"], false,
            "it failed, and expires soon"
        );
        assert_eq!(serde_json::from_value::<Summary>(json).unwrap(), s);
        assert!(serde_json::from_str::<HealthState>("\"sick\"").is_err());
        assert!(!format!("{h:?}").contains(&hex::encode(id)));
    }
}
