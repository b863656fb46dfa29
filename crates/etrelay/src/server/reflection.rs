//! The reflection budget: how many `getinfo`/`getstatus` one server answers, per source prefix
//! and in all, so that spoofed sources cannot turn the relay into a reflector.
//!
//! A query is a few bytes; its answer (from the cache or the game server) is tens to a hundred
//! times larger, and UDP sources can be spoofed. ET: Legacy's `SV_CheckDRDoS` answers at most 3
//! queries per /24 and 48 in all in any 2 s. This budget is at least as strict, and applies to
//! every query before it is answered, whether the cache answers it, a refresh does, or (cache
//! off) the game server through a session:
//!
//! - **per prefix** (the source's /24 for IPv4, /64 for IPv6; one prefix is one key, so a /64
//!   of spoofed addresses is one source): a token bucket of `per_prefix` answers refilled one
//!   per `window`. Any `window` holds at most `per_prefix` answers to one prefix (the next one
//!   is allowed one `window` after the first of them); long-run, one answer per `window`.
//! - **in all**: at most `global` answers in any `window` (a sliding log of the last `global`
//!   answer times, allocated once).
//!
//! The prefix table is bounded ([`ReflectionLimits::max_prefixes`]) with guard's limiter
//! policy: at the cap, a new prefix is refused until one at rest can be dropped (fail closed:
//! no answer is the safe answer). The global budget is checked first without being spent, so a
//! flood that exhausts it does not also drain the prefixes of honest askers.
//!
//! Worst case, whatever the number of spoofed sources: `global` answers per `window`, each at
//! most the game server's largest answer. No I/O here; every call takes `now`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};

use super::sweep::SWEEP_PARTS;
use crate::clock::Instant;
use crate::config::ReflectionLimits;

/// Shortest gap between two full sweeps of the prefix table forced by a full table.
const SWEEP_GAP: Duration = Duration::from_millis(200);

/// The answer budget of one server.
#[derive(Debug)]
pub(super) struct AnswerBudget {
    v4_prefix: u8,
    v6_prefix: u8,
    window: Duration,
    prefixes: KeyedLimiter<IpAddr, TokenBucket>,
    /// The times of the last `global` answers (a ring once full).
    recent: Vec<Instant>,
    /// The oldest entry of `recent` once it is full.
    oldest: usize,
    global: usize,
}

impl AnswerBudget {
    /// A budget with `limits`.
    pub(super) fn new(limits: &ReflectionLimits) -> Self {
        AnswerBudget {
            v4_prefix: limits.v4_prefix.min(32),
            v6_prefix: limits.v6_prefix.min(128),
            window: limits.window,
            prefixes: KeyedLimiter::new(
                TokenBucket::new(limits.per_prefix, limits.window),
                Limits {
                    max_keys: limits.max_prefixes,
                    forget: limits.window,
                    sweep_gap: SWEEP_GAP,
                },
            ),
            recent: Vec::with_capacity(limits.global as usize),
            oldest: 0,
            global: limits.global as usize,
        }
    }

    /// The prefix `ip` is counted under.
    pub(super) fn prefix(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(a) => {
                let bits = u32::from(a);
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.v4_prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(bits & mask))
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.v6_prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(bits & mask))
            }
        }
    }

    /// True when a query from `ip` (canonical form) may be answered at `now`; the answer is
    /// then counted.
    pub(super) fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        if !self.global_has_room(now) {
            return false;
        }
        let key = self.prefix(ip);
        if !matches!(self.prefixes.check(&key, now.into_std()), Ok(true)) {
            return false;
        }
        self.global_take(now);
        true
    }

    /// Forgets the prefixes at rest, in [`SWEEP_PARTS`] parts (the relay loop's
    /// tick).
    pub(super) fn sweep(&mut self, now: Instant) {
        if !self.prefixes.is_empty() {
            self.prefixes.sweep_part(now.into_std(), SWEEP_PARTS);
        }
    }

    fn global_has_room(&self, now: Instant) -> bool {
        self.recent.len() < self.global
            || self
                .recent
                .get(self.oldest)
                .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
    }

    fn global_take(&mut self, now: Instant) {
        if self.recent.len() < self.global {
            self.recent.push(now);
        } else if let Some(slot) = self.recent.get_mut(self.oldest) {
            *slot = now;
            self.oldest = (self.oldest + 1) % self.global;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(2);

    fn budget() -> AnswerBudget {
        AnswerBudget::new(&ReflectionLimits::default())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Answers in each half-open window [t, t + W) of `times`, at most.
    fn max_in_any_window(times: &[Instant]) -> usize {
        times
            .iter()
            .map(|t| times.iter().filter(|u| **u >= *t && **u < *t + W).count())
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn three_per_slash_24_in_any_two_seconds() {
        let t0 = Instant::now();
        let mut b = budget();
        let mut answered = Vec::new();
        // One query every 50 ms for 10 s, from addresses all over one /24.
        for i in 0..200u32 {
            let now = t0 + Duration::from_millis(50 * u64::from(i));
            if b.allow(ip(&format!("198.51.100.{}", i % 250 + 1)), now) {
                answered.push(now);
            }
        }
        assert!(max_in_any_window(&answered) <= 3, "{answered:?}");
        assert_eq!(answered.len(), 3 + 4, "a burst of 3, then one per 2 s");
        // Another /24 has its own budget.
        assert!(b.allow(ip("198.51.101.1"), t0));
    }

    #[test]
    fn a_slash_64_is_one_source() {
        let t0 = Instant::now();
        let mut b = budget();
        let n = (0..100u32)
            .filter(|i| b.allow(ip(&format!("2001:db8:0:1::{:x}", i + 1)), t0))
            .count();
        assert_eq!(n, 3);
        assert!(b.allow(ip("2001:db8:0:2::1"), t0));
    }

    #[test]
    fn forty_eight_in_all_in_any_two_seconds_whatever_the_sources() {
        let t0 = Instant::now();
        let mut b = budget();
        let mut answered = Vec::new();
        // 30 000 spoofed sources, each in its own /24, over 6 s.
        for i in 0..30_000u32 {
            let now = t0 + Duration::from_micros(200 * u64::from(i));
            let src = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + (i << 8)));
            if b.allow(src, now) {
                answered.push(now);
            }
        }
        assert!(max_in_any_window(&answered) <= 48);
        assert_eq!(answered.len(), 48 * 3, "6 s: three windows' worth");
    }

    #[test]
    fn a_flood_over_the_global_budget_does_not_drain_honest_prefixes() {
        let t0 = Instant::now();
        let mut b = budget();
        for i in 0..48u32 {
            assert!(b.allow(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + (i << 8))), t0));
        }
        let honest = ip("192.0.2.7");
        for _ in 0..10 {
            assert!(!b.allow(honest, t0 + Duration::from_millis(100)));
        }
        // Once the window has passed, the honest prefix still has its whole burst.
        let later = t0 + W;
        assert!((0..3).all(|_| b.allow(honest, later)));
        assert!(!b.allow(honest, later));
    }

    #[test]
    fn the_prefix_table_is_bounded_and_fails_closed() {
        let t0 = Instant::now();
        let mut b = AnswerBudget::new(&ReflectionLimits {
            max_prefixes: 4,
            global: 1_000,
            ..ReflectionLimits::default()
        });
        for i in 0..4u32 {
            assert!(b.allow(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + (i << 8))), t0));
        }
        assert!(
            !b.allow(ip("192.0.2.1"), t0),
            "full of prefixes that still carry state"
        );
        b.sweep(t0 + W * 3);
        assert!(b.allow(ip("192.0.2.1"), t0 + W * 3));
    }

    #[test]
    fn prefix_lengths() {
        let b = AnswerBudget::new(&ReflectionLimits {
            v4_prefix: 32,
            v6_prefix: 0,
            ..ReflectionLimits::default()
        });
        assert_eq!(b.prefix(ip("198.51.100.7")), ip("198.51.100.7"));
        assert_eq!(b.prefix(ip("2001:db8::1")), ip("::"));
        assert_eq!(
            budget().prefix(ip("2001:db8:1:2:3::1")),
            ip("2001:db8:1:2::")
        );
    }
}
