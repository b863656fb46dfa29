//! The previous-hop guard (design step 4): the previous-hop rate limit, failure score and quarantine.
//!
//! Keyed by the previous hop's **authenticated** identity (the link's mutual TLS checked it before admission;
//! a frame that fails authentication is never charged to the identity it claims, so forged
//! frames cannot quarantine an honest node). Per identity:
//!
//! - a fixed window of [`RATE_WINDOW`]: request [`RATE_LIMIT`]` + 1` inside it starts a
//!   quarantine of [`QUARANTINE`];
//! - a failure score over [`FAILURE_WINDOW`]: [`FAILURE_THRESHOLD`] scored failures start the
//!   same quarantine. Only scored reasons count ([`Reason::is_scored`]); timeouts, lost acks,
//!   duplicate retries and replay conflicts never do;
//! - during a quarantine every request is refused as `quarantined`, and those refusals neither
//!   count in the window nor restart the quarantine.
//!
//! The buckets live in [`guard::limiter::KeyedLimiter`]: at most [`MAX_BUCKETS`], idle ones
//! forgotten, and a bucket is only ever dropped when it carries no memory — an active
//! quarantine is never evicted to make room. When the table is full of active buckets, a new
//! identity is refused (`rate_limited`) until one comes to rest.
//!
//! The table's lock stays inside [`HopGuard`]: every method does its work under the lock and
//! returns a value, so no caller ever holds it while taking another lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guard::limiter::{Full, KeyedLimiter, Limits, Rule};
use guard::window::FixedWindow;
use tracing::debug;

use crate::counters::Counters;
use crate::health::{Health, Standing};
use crate::proto::{NodeId, Prefix};
use crate::reason::{Blame, Reason};

pub use crate::outbound::{HopRate, RATE_LIMIT, RATE_WINDOW};
/// Scored failures that start a quarantine…
pub const FAILURE_THRESHOLD: u32 = 12;
/// …within this window.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(300);
/// Length of a quarantine.
pub const QUARANTINE: Duration = Duration::from_secs(300);
/// Most identities remembered.
pub const MAX_BUCKETS: usize = 4096;

/// One identity's state.
#[derive(Debug, Clone, Copy)]
struct HopState {
    /// Requests in the current [`RATE_WINDOW`].
    rate: FixedWindow,
    /// Scored failures in the current [`FAILURE_WINDOW`].
    failures: FixedWindow,
    /// Frames whose layer did not open, in the current [`FAILURE_WINDOW`] (never scored: the
    /// sender may have sealed them; past [`FAILURE_THRESHOLD`] the peer is [`HopGuard::suspect`]).
    peel_failures: FixedWindow,
    quarantine_until: Option<Instant>,
}

impl HopState {
    /// [`FAILURE_THRESHOLD`] of its frames failed the peel within the current
    /// [`FAILURE_WINDOW`] at `now`.
    fn share_cut(&self, now: Instant) -> bool {
        !self.peel_failures.has_ended(now, FAILURE_WINDOW)
            && self.peel_failures.count() >= FAILURE_THRESHOLD
    }

    /// Seconds of quarantine left at `now` (0: none).
    fn quarantine_remaining(&self, now: Instant) -> u64 {
        self.quarantine_until.map_or(0, |u| {
            u.saturating_duration_since(now).as_secs_f64().ceil() as u64
        })
    }
}

/// What the guard says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Go on.
    Allowed,
    /// Over the rate: a quarantine starts now.
    RateLimited,
    /// A quarantine is running.
    Quarantined,
    /// The table is full of active identities: this new one is refused.
    TableFull,
}

/// The rule over one identity's bucket.
#[derive(Debug, Clone, Copy)]
struct HopRule(HopRate);

impl Rule for HopRule {
    type State = HopState;
    type Verdict = Verdict;

    fn fresh(&self, now: Instant) -> HopState {
        HopState {
            rate: FixedWindow::new(now),
            failures: FixedWindow::new(now),
            peel_failures: FixedWindow::new(now),
            quarantine_until: None,
        }
    }

    fn check(&self, s: &mut HopState, now: Instant) -> Verdict {
        if s.quarantine_until.is_some_and(|u| now < u) {
            return Verdict::Quarantined;
        }
        s.quarantine_until = None;
        if s.rate.hit(now, self.0.window) > self.0.limit {
            s.quarantine_until = Some(now + QUARANTINE);
            s.rate.clear();
            return Verdict::RateLimited;
        }
        Verdict::Allowed
    }

    fn at_rest(&self, s: &HopState, now: Instant) -> bool {
        s.quarantine_until.is_none_or(|u| u <= now)
            && s.rate.has_ended(now, self.0.window)
            && (s.failures.count() == 0 || s.failures.has_ended(now, FAILURE_WINDOW))
            && (s.peel_failures.count() == 0 || s.peel_failures.has_ended(now, FAILURE_WINDOW))
    }
}

/// The previous-hop guard.
pub struct HopGuard {
    /// Never held by a caller: each method takes it for its own work.
    buckets: Mutex<KeyedLimiter<NodeId, HopRule>>,
}

impl Default for HopGuard {
    fn default() -> Self {
        Self::new(MAX_BUCKETS)
    }
}

/// Counts only: the table is keyed by full node ids.
impl fmt::Debug for HopGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HopGuard")
            .field("identities", &self.len())
            .finish()
    }
}

impl HopGuard {
    /// A guard remembering at most `max_buckets` identities, at the design's rate.
    pub fn new(max_buckets: usize) -> Self {
        Self::with_rate(max_buckets, HopRate::default())
    }

    /// A guard remembering at most `max_buckets` identities, at `rate`.
    pub fn with_rate(max_buckets: usize, rate: HopRate) -> Self {
        HopGuard {
            buckets: Mutex::new(KeyedLimiter::new(
                HopRule(rate),
                Limits {
                    max_keys: max_buckets,
                    forget: rate.window,
                    sweep_gap: Duration::from_secs(1),
                },
            )),
        }
    }

    fn lock(&self) -> MutexGuard<'_, KeyedLimiter<NodeId, HopRule>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The guard for an authenticated previous hop; a quarantine it starts is counted.
    ///
    /// # Errors
    /// `rate_limited` (over the rate, or a new identity while the table is full of active
    /// ones) or `quarantined`.
    pub(super) fn check(
        &self,
        hop: &NodeId,
        now: Instant,
        counters: &Counters,
    ) -> Result<(), Reason> {
        match self.admit(hop, now) {
            Verdict::Allowed => Ok(()),
            Verdict::RateLimited => {
                counters.quarantine_started.inc();
                debug!(peer = %Prefix(hop), "previous hop quarantined (rate)");
                Err(Reason::RateLimited)
            }
            Verdict::Quarantined => Err(Reason::Quarantined),
            Verdict::TableFull => Err(Reason::RateLimited),
        }
    }

    /// Charges a scored failure to `hop`; a quarantine it starts is counted.
    pub(super) fn charge(&self, hop: &NodeId, now: Instant, counters: &Counters) {
        if self.score(hop, now) {
            counters.quarantine_started.inc();
            debug!(peer = %Prefix(hop), "previous hop quarantined (failures)");
        }
    }

    /// A refusal `r` of the authenticated previous hop `prev`'s frame, blamed as
    /// [`Reason::blame`] says: a reason the previous hop could have checked itself and on the
    /// design's list is charged to it; its health notes only refusals of what it signed itself.
    /// What the sender sealed, duplicates and this node's own state leave it untouched (its
    /// contact is still noted). `now` is Unix seconds, `instant` the same moment on the
    /// guard's clock.
    pub(super) fn blame(
        &self,
        prev: &NodeId,
        r: Reason,
        (now, instant): (u64, Instant),
        counters: &Counters,
        health: &Health,
    ) {
        if r.is_charged() {
            self.charge(prev, instant, counters);
        }
        if r == Reason::OnionPeelFailed {
            self.note_peel_failure(prev, instant);
        }
        match r.blame() {
            Blame::PreviousHop | Blame::PreviousHopUnscored => {
                health.record_refusal(prev, r, now);
                // Its row is kept while the quarantine lasts, whatever fills the table.
                let left = self.quarantine_left(prev, instant);
                if left > 0 {
                    health.record_quarantine(prev, now + left, now);
                }
            }
            Blame::Sender | Blame::Nobody | Blame::ThisNode => health.record_contact(prev, now),
        }
    }

    fn admit(&self, hop: &NodeId, now: Instant) -> Verdict {
        match self.lock().check(hop, now) {
            Ok(v) => v,
            Err(Full) => Verdict::TableFull,
        }
    }

    /// Scores a failure against `hop`; true when it started a quarantine.
    fn score(&self, hop: &NodeId, now: Instant) -> bool {
        self.lock()
            .upsert(hop, now, |_, s| {
                if s.failures.hit(now, FAILURE_WINDOW) >= FAILURE_THRESHOLD {
                    s.failures.clear();
                    s.quarantine_until = Some(now + QUARANTINE);
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false)
    }

    /// Notes a frame of `hop` whose layer did not open.
    fn note_peel_failure(&self, hop: &NodeId, now: Instant) {
        let started = self
            .lock()
            .upsert(hop, now, |_, s| {
                s.peel_failures.hit(now, FAILURE_WINDOW) == FAILURE_THRESHOLD
            })
            .unwrap_or(false);
        if started {
            debug!(peer = %Prefix(hop), "previous hop's frames keep failing the peel: a stranger's crypto share");
        }
    }

    /// True when [`FAILURE_THRESHOLD`] of `hop`'s frames failed the peel within the current
    /// [`FAILURE_WINDOW`]: its requests take a stranger's share of the crypto slots
    /// (`pipeline::crypto`) until the window ends. Never a quarantine: a sender can seal a layer
    /// that fails at a later hop and make an honest forwarder look like this.
    pub fn suspect(&self, hop: &NodeId, now: Instant) -> bool {
        self.lock().get(hop).is_some_and(|s| s.share_cut(now))
    }

    /// Forgets identities at rest and idle.
    pub fn sweep(&self, now: Instant) {
        self.lock().sweep(now);
    }

    /// Identities remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none is remembered.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Whether `hop` has a bucket (it was charged something).
    pub fn remembers(&self, hop: &NodeId) -> bool {
        self.lock().get(hop).is_some()
    }

    /// Seconds of `hop`'s quarantine left at `now` (0: none).
    pub fn quarantine_left(&self, hop: &NodeId, now: Instant) -> u64 {
        self.lock()
            .get(hop)
            .map_or(0, |s| s.quarantine_remaining(now))
    }

    /// Every identity quarantined at `now`, with its seconds left: a copy, so the caller can
    /// look other things up without this lock.
    pub fn quarantines(&self, now: Instant) -> HashMap<NodeId, u64> {
        self.standings(now)
            .into_iter()
            .filter(|(_, s)| s.quarantine_secs > 0)
            .map(|(id, s)| (id, s.quarantine_secs))
            .collect()
    }

    /// Every identity quarantined or [`HopGuard::suspect`] at `now`, and what the guard holds
    /// against it: a copy, so the caller can look other things up without this lock.
    pub fn standings(&self, now: Instant) -> HashMap<NodeId, Standing> {
        self.lock()
            .iter()
            .map(|(id, s)| {
                let standing = Standing {
                    quarantine_secs: s.quarantine_remaining(now),
                    share_cut: s.share_cut(now),
                };
                (*id, standing)
            })
            .filter(|(_, s)| *s != Standing::default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> NodeId {
        let mut a = [0u8; 32];
        a[..4].copy_from_slice(&n.to_be_bytes());
        a
    }

    #[test]
    fn rate_limit_starts_a_quarantine_that_expires() {
        let t0 = crate::clock::Clock::System.instant();
        let g = HopGuard::default();
        for _ in 0..RATE_LIMIT {
            assert_eq!(g.admit(&id(1), t0), Verdict::Allowed);
        }
        assert_eq!(g.admit(&id(1), t0), Verdict::RateLimited);
        // Refusals during the quarantine do not restart it.
        for s in [1, 100, 299] {
            assert_eq!(
                g.admit(&id(1), t0 + Duration::from_secs(s)),
                Verdict::Quarantined
            );
        }
        assert!(g.remembers(&id(1)));
        assert_eq!(
            g.quarantines(t0 + Duration::from_secs(299)),
            HashMap::from([(id(1), 1)])
        );
        assert_eq!(g.admit(&id(1), t0 + QUARANTINE), Verdict::Allowed);
        // Others were never affected.
        assert_eq!(g.admit(&id(2), t0), Verdict::Allowed);
    }

    #[test]
    fn the_step_refuses_with_reasons_and_counts_quarantines() {
        let t0 = crate::clock::Clock::System.instant();
        let (g, c) = (HopGuard::default(), Counters::default());
        for _ in 0..RATE_LIMIT {
            assert_eq!(g.check(&id(1), t0, &c), Ok(()));
        }
        assert_eq!(g.check(&id(1), t0, &c), Err(Reason::RateLimited));
        assert_eq!(g.check(&id(1), t0, &c), Err(Reason::Quarantined));
        assert_eq!(c.quarantine_started.get(), 1);
        // Charged only after the guard saw it (the pipeline's order).
        assert_eq!(g.check(&id(2), t0, &c), Ok(()));
        for _ in 0..FAILURE_THRESHOLD {
            g.charge(&id(2), t0, &c);
        }
        assert_eq!(c.quarantine_started.get(), 2);
        assert_eq!(g.check(&id(2), t0, &c), Err(Reason::Quarantined));
        let full = HopGuard::new(1);
        assert_eq!(full.check(&id(1), t0, &c), Ok(()));
        assert_eq!(
            full.check(&id(2), t0, &c),
            Err(Reason::RateLimited),
            "a new identity while the table is full of active ones"
        );
        assert_eq!(c.quarantine_started.get(), 2);
    }

    #[test]
    fn the_window_resets() {
        let t0 = crate::clock::Clock::System.instant();
        let g = HopGuard::default();
        for _ in 0..RATE_LIMIT {
            g.admit(&id(1), t0);
        }
        assert_eq!(
            g.admit(&id(1), t0 + Duration::from_secs(60)),
            Verdict::Allowed
        );
        for _ in 1..RATE_LIMIT {
            assert_eq!(
                g.admit(&id(1), t0 + Duration::from_secs(61)),
                Verdict::Allowed
            );
        }
        assert_eq!(
            g.admit(&id(1), t0 + Duration::from_secs(61)),
            Verdict::RateLimited
        );
    }

    #[test]
    fn twelve_scored_failures_quarantine() {
        let t0 = crate::clock::Clock::System.instant();
        let g = HopGuard::default();
        assert_eq!(g.admit(&id(1), t0), Verdict::Allowed);
        for _ in 0..11 {
            assert!(!g.score(&id(1), t0));
        }
        assert!(g.score(&id(1), t0));
        assert_eq!(g.admit(&id(1), t0), Verdict::Quarantined);
        // Failures spread over more than the window do not add up.
        let g = HopGuard::default();
        g.admit(&id(1), t0);
        for i in 0..11 {
            assert!(!g.score(&id(1), t0 + Duration::from_secs(i)));
        }
        assert!(!g.score(&id(1), t0 + FAILURE_WINDOW));
    }

    #[test]
    fn idle_buckets_are_evicted_but_never_an_active_quarantine() {
        let t0 = crate::clock::Clock::System.instant();
        let g = HopGuard::new(16);
        // One quarantined identity…
        for _ in 0..=RATE_LIMIT {
            g.admit(&id(0), t0);
        }
        // …then 5 000 fresh ones, a minute apart in batches, try to flush it.
        let mut refused = 0;
        for i in 1..=5000u32 {
            let now = t0 + Duration::from_secs(u64::from(i / 100) * 61 % 290);
            if g.admit(&id(i), now) == Verdict::TableFull {
                refused += 1;
            }
            assert!(g.len() <= 16);
        }
        assert!(refused > 0);
        assert_eq!(
            g.admit(&id(0), t0 + Duration::from_secs(295)),
            Verdict::Quarantined
        );
        // Idle buckets at rest make room.
        g.sweep(t0 + Duration::from_secs(400));
        assert_eq!(
            g.admit(&id(9999), t0 + Duration::from_secs(400)),
            Verdict::Allowed
        );
    }
}
