//! The masters' lane: queries from the masters the relay heartbeats skip the per-source
//! limiter and the answer budget (which spoofed sources share) and have a bucket of their own
//! per master address. No I/O: the relay loop hands in the addresses the heartbeat task
//! resolved last, and `now`.
//!
//! A master checks a server by sending `getinfo` with a challenge after each heartbeat; under
//! a spoofed flood that one packet would lose its chance against thousands in the shared
//! budget. Here it meets only other packets with the master's own source address: an attacker
//! who spoofs the master's address can spend its bucket ([`MASTER_BURST`] at once, then one
//! every [`MASTER_INTERVAL`]), and what that costs is answers sent to the master, at most about
//! 8 KB a second. The relay cannot tell a master's datagram from one forged with its address.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use guard::limiter::{Rule, TokenBucket};

use crate::clock::StdInstant;

/// Answers to one master address at once…
pub(super) const MASTER_BURST: u32 = 16;
/// …then one per this interval.
pub(super) const MASTER_INTERVAL: Duration = Duration::from_millis(250);
/// Master addresses with a lane at most (the rest share the budget with everyone).
pub(super) const MAX_MASTER_ADDRS: usize = 32;

/// The masters' addresses and a token bucket for each.
#[derive(Debug)]
pub(super) struct MasterLane {
    masters: Arc<[IpAddr]>,
    rule: TokenBucket,
    /// Each master's bucket (when it is full again), in the order of `masters`.
    buckets: Vec<StdInstant>,
}

impl MasterLane {
    /// A lane for no master yet.
    pub(super) fn new() -> Self {
        MasterLane {
            masters: Arc::from([]),
            rule: TokenBucket::new(MASTER_BURST, MASTER_INTERVAL),
            buckets: Vec::with_capacity(MAX_MASTER_ADDRS),
        }
    }

    /// Takes the addresses resolved last (sorted, canonical); a master kept keeps its bucket.
    pub(super) fn refresh(&mut self, masters: Arc<[IpAddr]>, now: StdInstant) {
        if Arc::ptr_eq(&masters, &self.masters) {
            return;
        }
        let kept = masters.len().min(MAX_MASTER_ADDRS);
        let buckets = masters[..kept]
            .iter()
            .map(|ip| {
                self.position(ip)
                    .and_then(|i| self.buckets.get(i).copied())
                    .unwrap_or_else(|| self.rule.fresh(now))
            })
            .collect();
        self.buckets = buckets;
        self.masters = masters;
    }

    fn position(&self, ip: &IpAddr) -> Option<usize> {
        self.masters[..self.buckets.len()]
            .iter()
            .position(|m| m == ip)
    }

    /// True when `ip` is a master's (an etmaster-style master's `getChallenge` takes the join
    /// gate's lane for proven sources).
    pub(super) fn is_master(&self, ip: &IpAddr) -> bool {
        self.position(ip).is_some()
    }

    /// `None` when `ip` is no master's; else whether its bucket allows an answer now.
    pub(super) fn check(&mut self, ip: &IpAddr, now: StdInstant) -> Option<bool> {
        let i = self.position(ip)?;
        let bucket = self.buckets.get_mut(i)?;
        Some(self.rule.check(bucket, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_has_its_own_bucket_and_keeps_it_across_a_refresh() {
        let t0 = StdInstant::now();
        let (a, b) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        let mut lane = MasterLane::new();
        assert_eq!(lane.check(&a, t0), None);
        lane.refresh(Arc::from([a]), t0);
        assert!(lane.is_master(&a) && !lane.is_master(&b));
        for _ in 0..MASTER_BURST {
            assert_eq!(lane.check(&a, t0), Some(true));
        }
        assert_eq!(lane.check(&a, t0), Some(false), "a spoofed flood spends it");
        assert_eq!(lane.check(&b, t0), None, "anyone else: the shared budget");
        lane.refresh(Arc::from([a, b]), t0);
        assert_eq!(lane.check(&a, t0), Some(false), "its bucket kept");
        assert_eq!(lane.check(&b, t0), Some(true));
        assert_eq!(lane.check(&a, t0 + MASTER_INTERVAL), Some(true), "refilled");
        lane.refresh(Arc::from([b]), t0);
        assert_eq!(lane.check(&a, t0), None, "no longer a master");
    }

    #[test]
    fn at_most_so_many_master_addresses() {
        let t0 = StdInstant::now();
        let many: Vec<IpAddr> = (0..=MAX_MASTER_ADDRS as u8)
            .map(|i| IpAddr::from([192, 0, 2, i]))
            .collect();
        let mut lane = MasterLane::new();
        lane.refresh(Arc::from(many.clone()), t0);
        assert_eq!(lane.check(&many[0], t0), Some(true));
        assert_eq!(lane.check(&many[MAX_MASTER_ADDRS], t0), None);
    }
}
