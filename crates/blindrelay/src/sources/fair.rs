//! A rate shared fairly between sources: a pool of `rate` requests per second (with a burst of
//! [`POOL_BURST`] seconds of it) that no source may take more than its share of.
//!
//! Each source has its own token bucket (GCRA: one instant per source) whose interval is
//! `n / (SHARE × rate)` and whose burst is `SHARE × pool burst / n`, where `n` is the number of
//! sources active in the last [`ACTIVE`]: with one source it may use [`SHARE`] of the pool, with
//! eight each gets an eighth of that, and together they never overdraw it. The rest
//! (`1 − SHARE`) stays for a source that arrives while the others use their shares. A request
//! passes when both its source's bucket and the pool have room; the share follows the load
//! (sources that stop sending drop out of `n` after [`ACTIVE`]), and buckets refill
//! continuously, so there is no window to wait out after a flood.
//!
//! At most [`MAX_SOURCES`] sources are remembered; sources idle for [`ACTIVE`] with full buckets
//! are forgotten first, and when none can be, a new source is refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::SourceKey;

/// Sources that sent within this long count as active.
pub const ACTIVE: Duration = Duration::from_secs(10);
/// Of the pool, what the active sources share; the rest is left for newcomers.
pub const SHARE: f64 = 0.9;
/// The pool's burst, in seconds of its rate.
pub const POOL_BURST: f64 = 5.0;
/// Sources remembered at most per pool.
pub const MAX_SOURCES: usize = 4096;
/// Shortest time between two sweeps of idle sources.
const SWEEP_GAP: Duration = Duration::from_millis(500);

/// Why a [`FairPool`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The source is over its share (or no room to remember a new source).
    Share,
    /// The pool is empty: every source is within its share, the total is spent.
    Pool,
}

#[derive(Debug)]
struct SourceState {
    /// When the source's bucket is full again.
    full_at: Instant,
    last_seen: Instant,
}

#[derive(Debug)]
struct State {
    /// When the pool's bucket is full again.
    full_at: Instant,
    sources: HashMap<SourceKey, SourceState>,
    last_sweep: Instant,
}

/// A rate shared fairly between sources (module docs).
#[derive(Debug)]
pub struct FairPool {
    /// Requests per second in all (0: refuses everything).
    rate: f64,
    state: Mutex<State>,
}

impl FairPool {
    /// A pool of `rate` requests per second, full at `now`.
    pub fn new(rate: f64, now: Instant) -> Self {
        FairPool {
            rate: rate.max(0.0),
            state: Mutex::new(State {
                full_at: now,
                sources: HashMap::new(),
                last_sweep: now,
            }),
        }
    }

    /// The pool's rate, requests per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes one request for `key` at `now` if its share and the pool allow.
    ///
    /// # Errors
    /// [`Refusal`]; nothing is charged.
    pub fn take(&self, key: SourceKey, now: Instant) -> Result<(), Refusal> {
        if self.rate <= 0.0 {
            return Err(Refusal::Pool);
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(s.last_sweep) >= SWEEP_GAP {
            s.last_sweep = now;
            s.sources.retain(|_, st| {
                now.saturating_duration_since(st.last_seen) < ACTIVE || st.full_at > now
            });
        }
        let known = s.sources.contains_key(&key);
        if !known && s.sources.len() >= MAX_SOURCES {
            return Err(Refusal::Share);
        }
        let active = s.sources.len() + usize::from(!known);
        let per_source = Duration::from_secs_f64(active as f64 / (SHARE * self.rate));
        let per_pool = Duration::from_secs_f64(1.0 / self.rate);
        let source_full_at = s.sources.get(&key).map_or(now, |st| st.full_at.max(now));
        // The active sources' bursts together fit in SHARE of the pool's.
        let source_burst = (SHARE * self.burst() / active as f64).max(1.0);
        if source_full_at.saturating_duration_since(now) > per_source.mul_f64(source_burst - 1.0) {
            if let Some(st) = s.sources.get_mut(&key) {
                st.last_seen = now;
            }
            return Err(Refusal::Share);
        }
        let pool_full_at = s.full_at.max(now);
        if pool_full_at.saturating_duration_since(now) > per_pool.mul_f64(self.burst() - 1.0) {
            // Still an active source: it keeps its place in the share.
            s.sources
                .entry(key)
                .and_modify(|st| st.last_seen = now)
                .or_insert(SourceState {
                    full_at: now,
                    last_seen: now,
                });
            return Err(Refusal::Pool);
        }
        s.full_at = pool_full_at + per_pool;
        s.sources.insert(
            key,
            SourceState {
                full_at: source_full_at + per_source,
                last_seen: now,
            },
        );
        Ok(())
    }

    /// The pool's burst in requests (at least one).
    fn burst(&self) -> f64 {
        (self.rate * POOL_BURST).max(1.0)
    }

    /// Sources remembered now.
    pub fn sources(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sources
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn net(i: u8) -> SourceKey {
        SourceKey::Net(IpAddr::from([10, 0, i, 0]))
    }

    /// Requests each source gets through in `secs` seconds when all of `sources` send `per_sec`
    /// requests per second each.
    fn run(pool: &FairPool, t0: Instant, sources: &[(SourceKey, u32)], secs: u32) -> Vec<u32> {
        let mut got = vec![0; sources.len()];
        for ms in (0..secs * 1000).step_by(10) {
            let now = t0 + Duration::from_millis(u64::from(ms));
            for (i, (key, per_sec)) in sources.iter().enumerate() {
                let every = 1000 / per_sec;
                if ms % every == 0 && pool.take(*key, now).is_ok() {
                    got[i] += 1;
                }
            }
        }
        got
    }

    #[test]
    fn one_flooding_source_cannot_starve_a_polite_one() {
        let t0 = crate::clock::Clock::System.instant();
        let pool = FairPool::new(10.0, t0);
        // A source asking 100/s and one asking 1/s, for 20 s.
        let got = run(&pool, t0, &[(net(1), 100), (net(2), 1)], 20);
        assert_eq!(got[1], 20, "the polite source gets every request: {got:?}");
        // The flood gets at most the pool (burst included), never more.
        assert!(got[0] <= 10 * 20 + 50, "{got:?}");
        assert!(
            got[0] >= 10 * 20 / 2,
            "the flood still gets its share: {got:?}"
        );
    }

    #[test]
    fn eight_flooding_sources_share_and_a_newcomer_still_gets_in() {
        let t0 = crate::clock::Clock::System.instant();
        let pool = FairPool::new(10.0, t0);
        let mut sources: Vec<_> = (1..=8).map(|i| (net(i), 100)).collect();
        sources.push((net(99), 1));
        let got = run(&pool, t0, &sources, 30);
        let polite = got[8];
        assert!(polite >= 27, "{got:?}");
        let total: u32 = got.iter().sum();
        assert!(total <= 10 * 30 + 50, "the ceiling holds: {got:?}");
        let (min, max) = (
            got[..8].iter().min().copied().unwrap_or(0),
            got[..8].iter().max().copied().unwrap_or(0),
        );
        assert!(max - min <= max / 4 + 5, "the floods share evenly: {got:?}");
    }

    #[test]
    fn recovery_follows_the_load() {
        let t0 = crate::clock::Clock::System.instant();
        let pool = FairPool::new(10.0, t0);
        // A flood from many sources drains the pool…
        for i in 1..=20 {
            while pool.take(net(i), t0).is_ok() {}
        }
        assert_eq!(pool.take(net(50), t0), Err(Refusal::Pool));
        // …which refills at its rate: a second later another source gets in.
        assert!(pool.take(net(2), t0 + Duration::from_secs(1)).is_ok());
        assert_eq!(FairPool::new(0.0, t0).take(net(1), t0), Err(Refusal::Pool));
    }
}
