//! The masters' lane: queries from the masters the relay heartbeats skip the per-source
//! limiter and the answer budget (which spoofed sources share). No I/O: the relay loop hands
//! in the addresses the heartbeat task resolved last, when it sent the last heartbeat, and
//! `now`.
//!
//! A master checks a server by sending `getinfo` with a challenge after each heartbeat
//! (dpmaster; an etmaster-style master asks `getchallenge` first and echoes the relay's
//! challenge, which the relay recognises on its own, `super::challenges`). Under a spoofed
//! flood that one packet would lose its chance against thousands in the shared budget; and the
//! relay cannot tell a master's datagram from one forged with its address. What an attacker
//! cannot see is when the relay sent its heartbeat: for [`WINDOW`] after each one (dpmaster
//! refuses a later answer anyway), each master's queries are answered up to [`WINDOW_BYTES`]
//! of answers, in order of arrival, so the check lands in it unless a spoofer sends more than
//! that from the master's address within one round trip. Outside the windows, each master
//! address has a small bucket of its own ([`MASTER_BURST`] at once, then one every
//! [`MASTER_INTERVAL`]). What spoofing a master's address can make the relay send that master
//! is thus bounded: [`WINDOW_BYTES`] per heartbeat, plus the bucket's answers.

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
/// How long after a heartbeat a master's queries are its check's.
pub(super) const WINDOW: Duration = Duration::from_secs(2);
/// Bytes of answers to one master address per heartbeat window at most.
pub(super) const WINDOW_BYTES: usize = 256 * 1024;

/// How a master's query may be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// In the window after a heartbeat: answer, and [`MasterLane::charge`] the bytes.
    Window,
    /// On the master's bucket.
    Bucket,
    /// Over both.
    Refused,
}

/// The masters' addresses and a token bucket for each.
#[derive(Debug)]
pub(super) struct MasterLane {
    masters: Arc<[IpAddr]>,
    rule: TokenBucket,
    /// Each master's bucket (when it is full again), in the order of `masters`.
    buckets: Vec<StdInstant>,
    /// Bytes answered to each master in the current window, in the order of `masters`.
    window_bytes: Vec<usize>,
    /// The heartbeat the window belongs to (see [`MasterLane::check`]).
    window_of: u64,
}

impl MasterLane {
    /// A lane for no master yet.
    pub(super) fn new() -> Self {
        MasterLane {
            masters: Arc::from([]),
            rule: TokenBucket::new(MASTER_BURST, MASTER_INTERVAL),
            buckets: Vec::with_capacity(MAX_MASTER_ADDRS),
            window_bytes: Vec::with_capacity(MAX_MASTER_ADDRS),
            window_of: 0,
        }
    }

    /// Takes the addresses resolved last (sorted, canonical); a master kept keeps its bucket
    /// and what its window spent.
    pub(super) fn refresh(&mut self, masters: Arc<[IpAddr]>, now: StdInstant) {
        if Arc::ptr_eq(&masters, &self.masters) {
            return;
        }
        let kept = masters.len().min(MAX_MASTER_ADDRS);
        let (buckets, window_bytes) = masters[..kept]
            .iter()
            .map(|ip| match self.position(ip) {
                Some(i) => (
                    self.buckets
                        .get(i)
                        .copied()
                        .unwrap_or_else(|| self.rule.fresh(now)),
                    self.window_bytes.get(i).copied().unwrap_or(0),
                ),
                None => (self.rule.fresh(now), 0),
            })
            .unzip();
        self.buckets = buckets;
        self.window_bytes = window_bytes;
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

    /// `None` when `ip` is no master's; else how it may be answered at `now`, `since_beat`
    /// after the heartbeat `beat` (an id of it: the relay loop passes the time it was sent;
    /// `None` before any heartbeat).
    pub(super) fn check(
        &mut self,
        ip: &IpAddr,
        now: StdInstant,
        beat: Option<(u64, Duration)>,
    ) -> Option<Verdict> {
        let i = self.position(ip)?;
        if let Some((id, since)) = beat {
            if id != self.window_of {
                self.window_of = id;
                self.window_bytes.iter_mut().for_each(|b| *b = 0);
            }
            if since < WINDOW && self.window_bytes.get(i).is_some_and(|b| *b < WINDOW_BYTES) {
                return Some(Verdict::Window);
            }
        }
        let bucket = self.buckets.get_mut(i)?;
        Some(if self.rule.check(bucket, now) {
            Verdict::Bucket
        } else {
            Verdict::Refused
        })
    }

    /// An answer of `bytes` went to `ip` in its window.
    pub(super) fn charge(&mut self, ip: &IpAddr, bytes: usize) {
        if let Some(b) = self.position(ip).and_then(|i| self.window_bytes.get_mut(i)) {
            *b = b.saturating_add(bytes);
        }
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
        assert_eq!(lane.check(&a, t0, None), None);
        lane.refresh(Arc::from([a]), t0);
        assert!(lane.is_master(&a) && !lane.is_master(&b));
        for _ in 0..MASTER_BURST {
            assert_eq!(lane.check(&a, t0, None), Some(Verdict::Bucket));
        }
        assert_eq!(
            lane.check(&a, t0, None),
            Some(Verdict::Refused),
            "a spoofed flood spends it"
        );
        assert_eq!(
            lane.check(&b, t0, None),
            None,
            "anyone else: the shared budget"
        );
        lane.refresh(Arc::from([a, b]), t0);
        assert_eq!(
            lane.check(&a, t0, None),
            Some(Verdict::Refused),
            "its bucket kept"
        );
        assert_eq!(lane.check(&b, t0, None), Some(Verdict::Bucket));
        assert_eq!(
            lane.check(&a, t0 + MASTER_INTERVAL, None),
            Some(Verdict::Bucket),
            "refilled"
        );
        lane.refresh(Arc::from([b]), t0);
        assert_eq!(lane.check(&a, t0, None), None, "no longer a master");
    }

    #[test]
    fn at_most_so_many_master_addresses() {
        let t0 = StdInstant::now();
        let many: Vec<IpAddr> = (0..=MAX_MASTER_ADDRS as u8)
            .map(|i| IpAddr::from([192, 0, 2, i]))
            .collect();
        let mut lane = MasterLane::new();
        lane.refresh(Arc::from(many.clone()), t0);
        assert_eq!(lane.check(&many[0], t0, None), Some(Verdict::Bucket));
        assert_eq!(lane.check(&many[MAX_MASTER_ADDRS], t0, None), None);
    }

    #[test]
    fn after_a_heartbeat_a_window_of_bytes_then_the_bucket() {
        let t0 = StdInstant::now();
        let m = IpAddr::from([192, 0, 2, 1]);
        let mut lane = MasterLane::new();
        lane.refresh(Arc::from([m]), t0);
        let beat = Some((7, Duration::from_millis(5)));
        // A spoofed flood in the window: answered until the window's bytes are spent.
        let mut answered = 0;
        while lane.check(&m, t0, beat) == Some(Verdict::Window) {
            lane.charge(&m, 1000);
            answered += 1;
        }
        assert_eq!(answered, WINDOW_BYTES.div_ceil(1000));
        // Then the bucket, as outside any window.
        assert_eq!(lane.check(&m, t0, beat), Some(Verdict::Bucket));
        // Late: the window is over.
        let late = Some((7, WINDOW));
        assert_eq!(lane.check(&m, t0, late), Some(Verdict::Bucket));
        // The next heartbeat opens a new window.
        assert_eq!(
            lane.check(&m, t0, Some((8, Duration::ZERO))),
            Some(Verdict::Window)
        );
    }
}
