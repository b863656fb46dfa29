//! Whose requests backpressure falls on: the culprit of a `backpressure` episode, so the status
//! can tell "one source is pushing this node" (`protecting`, naming it) from "this node is short
//! of capacity" (`attention`).
//!
//! Every `backpressure` refusal is noted under the request's culprit ([`Culprit`]): the link's
//! authenticated previous hop when its address is a known peer's, or else the unknown source's
//! address block (throwaway identities from one block count once). Nothing is noted on the
//! path of an admitted request: an honest node pays for this only when it refuses.
//!
//! An **episode** runs from the first refusal until [`RECENT_SECS`] pass with none (the window
//! the status looks back over). Refusals are tallied for the episode and for the current and
//! previous [`BUCKET_SECS`] bucket. The culprit is judged on the recent buckets while they hold
//! at least [`MIN_REFUSALS`] refusals (what is happening now), else on the whole episode (what
//! happened, once it stopped): one culprit is *the* cause when it holds more than half of them
//! and at least [`MIN_REFUSALS`]. So a flood by one peer reads as that peer for as long as the
//! status remembers it, and an overload by many that follows it reads as an overload.
//!
//! Bounded: [`MAX_CULPRITS`] entries; refusals of culprits past it count in the totals only.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use crate::health::RECENT_SECS;
use crate::proto::NodeId;
use crate::sources::SourceKey;

/// Length of a tally bucket (seconds): "now" is the current and the previous bucket.
pub const BUCKET_SECS: u64 = 300;
/// Fewest refusals that make a cause (and that make the recent buckets the evidence): one
/// refusal, when it is the only one, is named for what it was rather than read as a shortage.
pub const MIN_REFUSALS: u64 = 1;
/// Culprits remembered in an episode.
pub const MAX_CULPRITS: usize = 64;

/// Whose request was refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Culprit {
    /// A known peer, by the identity its link authenticated.
    Peer(NodeId),
    /// A source with no known identity: an unknown address block, or a known address whose
    /// request carried no identity (a gossiped descriptor).
    Source(SourceKey),
}

/// Never prints an id or an address.
impl fmt::Debug for Culprit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Culprit::Peer(_) => f.write_str("Culprit::Peer"),
            Culprit::Source(k) => write!(f, "Culprit::Source({k:?})"),
        }
    }
}

/// Refusals in the episode and in the recent buckets.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    episode: u64,
    /// Indexed by bucket parity: `[epoch % 2]`.
    buckets: [u64; 2],
}

impl Tally {
    fn add(&mut self, epoch: u64) {
        self.episode += 1;
        self.buckets[(epoch % 2) as usize] += 1;
    }

    /// Starts bucket `epoch`: the one before the previous is forgotten.
    fn roll(&mut self, from: u64, to: u64) {
        if to >= from + 2 {
            self.buckets = [0; 2];
        } else if to == from + 1 {
            self.buckets[(to % 2) as usize] = 0;
        }
    }

    fn recent(&self) -> u64 {
        self.buckets[0] + self.buckets[1]
    }
}

#[derive(Debug, Default)]
struct Episode {
    last_at: u64,
    epoch: u64,
    total: Tally,
    by: HashMap<Culprit, Tally>,
}

/// The cause of recent backpressure ([`Pressure::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cause {
    /// Who.
    pub culprit: Culprit,
    /// Its refusals in the evidence judged.
    pub refused: u64,
    /// All refusals in it.
    pub of: u64,
    /// The evidence is the recent buckets (it is going on), not the whole episode.
    pub ongoing: bool,
}

/// The backpressure tally.
#[derive(Debug, Default)]
pub struct Pressure {
    episode: Mutex<Option<Episode>>,
}

impl Pressure {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Episode>> {
        self.episode.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `backpressure` refusal of `culprit`'s request at `now` (Unix seconds).
    pub fn note(&self, culprit: Culprit, now: u64) {
        let epoch = now / BUCKET_SECS;
        let mut guard = self.lock();
        let ep = match guard.as_mut() {
            Some(ep) if now.saturating_sub(ep.last_at) < RECENT_SECS => ep,
            _ => guard.insert(Episode {
                last_at: now,
                epoch,
                ..Episode::default()
            }),
        };
        if epoch != ep.epoch {
            let from = ep.epoch;
            ep.total.roll(from, epoch);
            ep.by.values_mut().for_each(|t| t.roll(from, epoch));
            ep.epoch = epoch;
        }
        ep.last_at = now;
        ep.total.add(epoch);
        let room = ep.by.len() < MAX_CULPRITS;
        if let Some(t) = ep.by.get_mut(&culprit) {
            t.add(epoch);
        } else if room {
            ep.by.entry(culprit).or_default().add(epoch);
        }
    }

    /// The one culprit of the backpressure of the last [`RECENT_SECS`] at `now`, if one holds
    /// more than half of it (module docs); `None` when there was none or it was spread.
    pub fn cause(&self, now: u64) -> Option<Cause> {
        let guard = self.lock();
        let ep = guard.as_ref()?;
        if now.saturating_sub(ep.last_at) >= RECENT_SECS {
            return None;
        }
        let mut total = ep.total;
        let mut by: Vec<(Culprit, Tally)> = ep.by.iter().map(|(c, t)| (*c, *t)).collect();
        let epoch = now / BUCKET_SECS;
        total.roll(ep.epoch, epoch);
        by.iter_mut().for_each(|(_, t)| t.roll(ep.epoch, epoch));
        let ongoing = total.recent() >= MIN_REFUSALS;
        let count = |t: &Tally| if ongoing { t.recent() } else { t.episode };
        let of = count(&total);
        let (culprit, refused) = by
            .iter()
            .map(|(c, t)| (*c, count(t)))
            .max_by_key(|(_, n)| *n)?;
        (refused >= MIN_REFUSALS && refused * 2 > of).then_some(Cause {
            culprit,
            refused,
            of,
            ongoing,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    const T: u64 = 1_800_000_000 / BUCKET_SECS * BUCKET_SECS;

    fn peer(n: u8) -> Culprit {
        Culprit::Peer([n; 32])
    }

    fn block(n: u8) -> Culprit {
        Culprit::Source(SourceKey::Net(IpAddr::V4(Ipv4Addr::new(10, n, 0, 0))))
    }

    #[test]
    fn one_peer_over_half_is_the_cause_for_as_long_as_the_status_remembers() {
        let p = Pressure::default();
        assert_eq!(p.cause(T), None, "no backpressure");
        for _ in 0..100 {
            p.note(peer(1), T);
        }
        for i in 0..10 {
            p.note(peer(i + 2), T);
        }
        let c = p.cause(T).expect("one cause");
        assert_eq!(
            (c.culprit, c.refused, c.of, c.ongoing),
            (peer(1), 100, 110, true)
        );
        // Long after, once the buckets are gone, the episode still names it…
        let later = T + 3 * BUCKET_SECS;
        let c = p.cause(later).expect("still the cause");
        assert_eq!((c.culprit, c.ongoing), (peer(1), false));
        // …until the status forgets the backpressure.
        assert_eq!(p.cause(T + RECENT_SECS), None);
    }

    #[test]
    fn spread_refusals_name_nobody_and_a_new_overload_outweighs_an_old_flood() {
        let p = Pressure::default();
        for i in 0..40 {
            p.note(block(i), T);
        }
        assert_eq!(p.cause(T), None, "forty blocks: an overload");
        let p = Pressure::default();
        p.note(peer(1), T);
        assert_eq!(p.cause(T).map(|c| c.culprit), Some(peer(1)), "one of one");
        p.note(peer(2), T);
        assert_eq!(p.cause(T), None, "one of two is not more than half");
        p.note(peer(1), T);
        assert_eq!(p.cause(T).map(|c| c.culprit), Some(peer(1)), "two of three");
        // A flood by one peer, then, three buckets later, refusals spread over many: what is
        // going on now is an overload.
        for _ in 0..100 {
            p.note(peer(1), T);
        }
        let now = T + 3 * BUCKET_SECS;
        for i in 0..20 {
            p.note(peer(i + 10), now);
        }
        assert_eq!(p.cause(now), None);
    }

    #[test]
    fn bounded_in_culprits() {
        let p = Pressure::default();
        for i in 0..=255u8 {
            p.note(peer(i), T);
        }
        let guard = p.lock();
        let ep = guard.as_ref().unwrap();
        assert_eq!(ep.by.len(), MAX_CULPRITS);
        assert_eq!(ep.total.episode, 256, "every refusal counted in the total");
    }
}
