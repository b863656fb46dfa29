//! Telling the admin about a flood: the drops of the defences a flood meets, watched once per
//! tick of the relay loop, turned into at most one WARN a minute per kind and the "under a
//! flood since" of `GET /server` and `etrelay admin status`.
//!
//! A kind is under a flood from the tick its drops reach [`FLOOD_START`] within
//! [`FLOOD_WINDOW`] (the WARN then names the count), and stays so until [`QUIET`] passes
//! without one of its drops (an INFO line then says how many it dropped in all). While it
//! lasts, a WARN at most every [`WARN_EVERY`] names the drops since the last one. A few drops
//! (one browser refreshing too fast) are counted in the metrics and not logged. No I/O but the
//! log; the caller hands in `now` and the counters.

use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::metrics::{DropReason, ServerMetrics};
use crate::clock::Instant;

/// Drops within [`FLOOD_WINDOW`] that make a flood.
pub(super) const FLOOD_START: u64 = 20;
/// See [`FLOOD_START`].
pub(super) const FLOOD_WINDOW: Duration = Duration::from_secs(10);
/// A flood is over after this long without a drop of its kind.
pub(super) const QUIET: Duration = Duration::from_secs(60);
/// At most one WARN per kind per this interval.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(60);
/// `getchallenge` the relay answered that count as one event of [`Kind::Challenges`].
pub(super) const ANSWERS_PER_EVENT: u64 = 10;

/// The defences a flood meets, each watched on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The answer budget of queries (spoofed `getstatus`/`getinfo`).
    Reflection,
    /// The per-IP query limiter.
    Limiter,
    /// The `getchallenge` gate: per-source limit and fair queue.
    Joins,
    /// The half-open session caps: per server, prefix and IP.
    HalfOpen,
    /// Datagrams larger than `--max-packet` (junk aimed at the tunnel).
    Oversize,
    /// `getchallenge` the relay answered itself, or dropped over the answers' bound, and
    /// `connect` without the relay's challenge.
    Challenges,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Kind::Reflection,
        Kind::Limiter,
        Kind::Joins,
        Kind::HalfOpen,
        Kind::Oversize,
        Kind::Challenges,
    ];

    /// The kind's label (API and log).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Reflection => "reflection",
            Kind::Limiter => "limiter",
            Kind::Joins => "joins",
            Kind::HalfOpen => "half_open",
            Kind::Oversize => "oversize",
            Kind::Challenges => "challenges",
        }
    }

    /// What is flooded and what dropped it, for the log and the admin.
    pub fn words(self) -> &'static str {
        match self {
            Kind::Reflection => "query flood: the answer budget dropped",
            Kind::Limiter => "query flood: the per-IP limit dropped",
            Kind::Joins => "join flood: the getchallenge gate dropped",
            Kind::HalfOpen => "session flood: the half-open caps refused",
            Kind::Oversize => "oversize flood: datagrams over --max-packet dropped",
            Kind::Challenges => {
                "challenge flood (nothing of the game server's spent): getchallenge answered \
                 with the relay's challenge or over the answers' bound, connect without it"
            }
        }
    }

    fn reasons(self) -> &'static [DropReason] {
        match self {
            Kind::Reflection => &[DropReason::Reflection],
            Kind::Limiter => &[DropReason::Limiter],
            Kind::Joins => &[DropReason::JoinLimit, DropReason::JoinQueue],
            Kind::HalfOpen => &[
                DropReason::HalfOpenCap,
                DropReason::PrefixCap,
                DropReason::IpCap,
            ],
            Kind::Oversize => &[DropReason::Oversize],
            Kind::Challenges => &[DropReason::ChallengeLimit, DropReason::BadCookie],
        }
    }

    /// What this kind counted in `m` so far: its drops; for [`Kind::Challenges`] also the
    /// `getchallenge` the relay answered, [`ANSWERS_PER_EVENT`] to one event (a busy server
    /// sees a few a second; a flood, thousands).
    fn count(self, m: &ServerMetrics) -> u64 {
        let drops: u64 = self.reasons().iter().map(|r| m.drops(*r)).sum();
        match self {
            Kind::Challenges => drops + m.challenges_answered.get() / ANSWERS_PER_EVENT,
            _ => drops,
        }
    }
}

/// A flood going on now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood {
    /// What it meets.
    pub kind: Kind,
    /// When it began (its first drop).
    pub since: SystemTime,
    /// Drops of its kind since then.
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Watch {
    /// The kind's drop counters at the last tick.
    total: u64,
    /// Drops in the current window and when it began.
    window: u64,
    window_at: Option<Instant>,
    /// When the last drop was seen.
    last_drop: Option<Instant>,
    /// Set while a flood lasts.
    flood: Option<Ongoing>,
}

#[derive(Debug, Clone, Copy)]
struct Ongoing {
    since: SystemTime,
    dropped: u64,
    warned_at: Instant,
    /// Drops since the last WARN.
    unwarned: u64,
}

/// The watch over one server's drops.
#[derive(Debug, Default)]
pub(super) struct Pressure {
    watches: [Watch; Kind::ALL.len()],
}

impl Pressure {
    /// Reads `m`'s drop counters at `now` (`now_sys` on the wall clock) and logs what
    /// started, goes on or ended; `server` names the server in the log.
    pub(super) fn tick(
        &mut self,
        m: &ServerMetrics,
        now: Instant,
        now_sys: SystemTime,
        server: &str,
    ) {
        for (w, kind) in self.watches.iter_mut().zip(Kind::ALL) {
            let total = kind.count(m);
            let new = total.saturating_sub(std::mem::replace(&mut w.total, total));
            w.step(kind, new, now, now_sys, server);
        }
    }

    /// The floods going on now.
    pub(super) fn floods(&self) -> Vec<Flood> {
        self.watches
            .iter()
            .zip(Kind::ALL)
            .filter_map(|(w, kind)| {
                w.flood.map(|f| Flood {
                    kind,
                    since: f.since,
                    dropped: f.dropped,
                })
            })
            .collect()
    }
}

impl Watch {
    fn step(&mut self, kind: Kind, new: u64, now: Instant, now_sys: SystemTime, server: &str) {
        if new > 0 {
            self.last_drop = Some(now);
        }
        if let Some(f) = self.flood.as_mut() {
            f.dropped += new;
            f.unwarned += new;
            let quiet = self
                .last_drop
                .is_none_or(|t| now.saturating_duration_since(t) >= QUIET);
            if quiet {
                let lasted = now_sys
                    .duration_since(f.since)
                    .unwrap_or_default()
                    .as_secs();
                info!(
                    public = %server,
                    kind = %kind.name(),
                    lasted_secs = lasted,
                    dropped = f.dropped,
                    "flood over"
                );
                self.flood = None;
            } else if f.unwarned > 0 && now.saturating_duration_since(f.warned_at) >= WARN_EVERY {
                warn!(
                    public = %server,
                    kind = %kind.name(),
                    what = %kind.words(),
                    count = f.unwarned,
                    secs = now.saturating_duration_since(f.warned_at).as_secs(),
                    since_start = f.dropped,
                    "flood goes on"
                );
                f.warned_at = now;
                f.unwarned = 0;
            }
            return;
        }
        let stale = self
            .window_at
            .is_none_or(|t| now.saturating_duration_since(t) >= FLOOD_WINDOW);
        if stale {
            self.window = 0;
            self.window_at = (new > 0).then_some(now);
        }
        self.window += new;
        if self.window >= FLOOD_START {
            warn!(
                public = %server,
                kind = %kind.name(),
                what = %kind.words(),
                count = self.window,
                secs = self
                    .window_at
                    .map_or(0, |t| now.saturating_duration_since(t).as_secs())
                    .max(1),
                "flood: masters and proven players keep their own lanes"
            );
            self.flood = Some(Ongoing {
                since: now_sys,
                dropped: self.window,
                warned_at: now,
                unwarned: 0,
            });
            self.window = 0;
            self.window_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(250);

    #[test]
    fn a_few_drops_are_no_flood_a_burst_is_and_it_ends_when_quiet() {
        let m = ServerMetrics::default();
        let mut p = Pressure::default();
        let (t0, s0) = (
            Instant::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        );
        for _ in 0..5 {
            m.drop(DropReason::Limiter);
        }
        p.tick(&m, t0, s0, "test");
        assert!(p.floods().is_empty(), "five drops are a busy browser");
        for _ in 0..30 {
            m.drop(DropReason::Reflection);
        }
        p.tick(&m, t0 + TICK, s0, "test");
        let f = p.floods();
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].kind, f[0].dropped, f[0].since),
            (Kind::Reflection, 30, s0)
        );
        m.drop(DropReason::Reflection);
        p.tick(&m, t0 + 2 * TICK, s0, "test");
        assert_eq!(p.floods()[0].dropped, 31);
        // A minute without a drop of its kind ends it.
        p.tick(&m, t0 + 2 * TICK + QUIET, s0 + QUIET, "test");
        assert!(p.floods().is_empty());
    }

    #[test]
    fn each_kind_is_watched_on_its_own() {
        let m = ServerMetrics::default();
        let mut p = Pressure::default();
        let (t0, s0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        for _ in 0..10 {
            m.drop(DropReason::JoinQueue);
            m.drop(DropReason::JoinLimit);
            m.drop(DropReason::PrefixCap);
        }
        p.tick(&m, t0, s0, "test");
        let kinds: Vec<Kind> = p.floods().iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [Kind::Joins]);
        for _ in 0..10 {
            m.drop(DropReason::HalfOpenCap);
        }
        p.tick(&m, t0 + TICK, s0, "test");
        assert_eq!(p.floods().len(), 2, "20 half-open refusals in 10 s");
    }

    #[test]
    fn drops_spread_wider_than_the_window_are_no_flood() {
        let m = ServerMetrics::default();
        let mut p = Pressure::default();
        let t0 = Instant::now();
        for i in 0..10u32 {
            for _ in 0..(FLOOD_START / 2 - 1) {
                m.drop(DropReason::Limiter);
            }
            p.tick(&m, t0 + FLOOD_WINDOW * i, SystemTime::UNIX_EPOCH, "test");
        }
        assert!(p.floods().is_empty());
    }
}
