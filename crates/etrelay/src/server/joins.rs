//! Fair `getchallenge`: a limit per source IP, one pace for everything the game server limits
//! per source IP (the relay is one source to it), and a fair queue in between. No I/O: the
//! relay loop takes `now` from the clock and sends what [`Joins::release`] gives back.
//!
//! ioquake3 (and ET: Legacy with `sv_protect 1`) answer one source IP 10 `getchallenge`,
//! `getinfo` and `getstatus` at once, then one per second, all together. Behind the relay every
//! player is that one IP, so the relay keeps under the server's limit itself ([`Pace`], shared
//! with the query cache's refreshes), lets no source take more than its share (a token bucket
//! per source IP), and when the pace is spent queues each `getchallenge` in a bounded queue
//! served round robin over prefixes (/24, /64): a flood from a few prefixes delays an honest
//! player by about one turn per prefix, not by the flood's size. Everything is decided before
//! a session is opened: a refused or queued `getchallenge` costs no session.
//!
//! While the relay gives its own challenges (`super::challenges`), what passes this gate is the
//! relay's ask for the server's challenge on behalf of a client whose `connect` held the
//! relay's challenge: no spoofed source gets here. A source that proved its address before
//! (`super::proven`: a join the game server answered) is served first: unproven joins leave
//! [`PROVEN_RESERVE`] tokens of the pace to it, so a returning player's join goes at once, and
//! past that it waits in a short front queue. But never all of it: while both queues wait,
//! every other join released is the fair queue's, so new players get at least half of the
//! server's joins however many proven sources ask. All joins leave [`OWN_RESERVE`] tokens to
//! the relay's own queries (the query cache's refreshes), which the server limits alike. A
//! full per-source table does not refuse a proven source (its own bucket still does).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};

use super::metrics::DropReason;
use super::sweep::SWEEP_PARTS;
use super::table::{Prefix, prefix};
use crate::clock::Instant;
use crate::config::JoinLimits;

/// `getchallenge` packets queued at most, all sources together.
pub(super) const QUEUE_MAX: usize = 64;
/// Queued `getchallenge` per prefix at most.
pub(super) const QUEUE_PER_PREFIX: usize = 4;
/// A queued `getchallenge` older than this is dropped (the client sends it again after 3 s).
pub(super) const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Largest `getchallenge` queued (real ones are under 64 bytes).
const MAX_JOIN: usize = 128;
/// Source IPs the per-source limiter remembers.
const MAX_JOIN_SOURCES: usize = 65_536;
/// Idle time after which a source at rest is forgotten.
const FORGET: Duration = Duration::from_secs(60);
/// Shortest gap between two sweeps forced by a full limiter.
const SWEEP_GAP: Duration = Duration::from_millis(200);
/// Tokens of the pace unproven joins leave to proven sources (fewer when the pace's burst is
/// smaller: at least one token is theirs).
pub(super) const PROVEN_RESERVE: u32 = 2;
/// Proven `getchallenge` queued at most, before the fair queue.
pub(super) const FRONT_MAX: usize = 16;
/// Tokens of the pace every join leaves to the relay's own queries to the server.
pub(super) const OWN_RESERVE: u32 = 1;

/// A token bucket for requests to the game server, shared by joins and cache refreshes.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    burst: u32,
    interval: Duration,
    /// When the bucket is full again.
    full_at: Instant,
}

impl Pace {
    /// `burst` at once, then one per `interval`; full at `now`.
    pub(super) fn new(burst: u32, interval: Duration, now: Instant) -> Self {
        Pace {
            burst: burst.max(1),
            interval,
            full_at: now,
        }
    }

    /// Tokens available at `now`.
    pub(super) fn available(&self, now: Instant) -> u32 {
        let behind = self.full_at.saturating_duration_since(now).as_nanos();
        let step = self.interval.as_nanos().max(1);
        let used = behind.div_ceil(step);
        self.burst
            .saturating_sub(u32::try_from(used).unwrap_or(u32::MAX))
    }

    /// Takes a token if more than `keep` are available.
    pub(super) fn take(&mut self, now: Instant, keep: u32) -> bool {
        if self.available(now) <= keep {
            return false;
        }
        self.full_at = self.full_at.max(now) + self.interval;
        true
    }

    /// When the next token is available (`now` if one is).
    #[cfg(test)]
    pub(super) fn next_token(&self, now: Instant) -> Instant {
        self.next_above(now, 0)
    }

    /// When more than `keep` tokens are available (`now` if they are).
    pub(super) fn next_above(&self, now: Instant, keep: u32) -> Instant {
        let ahead = self
            .interval
            .saturating_mul(self.burst.saturating_sub(keep.saturating_add(1)));
        now.max(self.full_at.checked_sub(ahead).unwrap_or(now))
    }
}

/// What became of a `getchallenge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Offer {
    /// Send it now.
    Pass,
    /// Queued: [`Joins::release`] gives it back when its turn comes.
    Queued,
    /// Dropped for this reason.
    Refused(DropReason),
}

#[derive(Debug, Clone)]
struct Entry {
    src: SocketAddr,
    at: Instant,
    len: usize,
    data: [u8; MAX_JOIN],
}

/// The per-source limit and the fair queue of one server.
#[derive(Debug)]
pub(super) struct Joins {
    per_source: KeyedLimiter<IpAddr, TokenBucket>,
    queues: HashMap<Prefix, VecDeque<Entry>>,
    /// Prefixes with queued entries, in turn order.
    turns: VecDeque<Prefix>,
    /// Entries in `queues`.
    queued: usize,
    /// Proven sources' entries, served before `turns`.
    front: VecDeque<Entry>,
    /// Tokens of the pace unproven joins leave to proven ones.
    reserve: u32,
    /// Tokens of the pace every join leaves to the relay's own queries.
    own: u32,
    /// The last join released came from the front queue.
    front_last: bool,
}

impl Joins {
    /// The limits of `limits`.
    pub(super) fn new(limits: &JoinLimits) -> Self {
        Joins {
            per_source: KeyedLimiter::new(
                TokenBucket::new(limits.source_burst, limits.source_interval),
                Limits {
                    max_keys: MAX_JOIN_SOURCES,
                    forget: FORGET,
                    sweep_gap: SWEEP_GAP,
                },
            ),
            queues: HashMap::with_capacity(QUEUE_MAX),
            turns: VecDeque::with_capacity(QUEUE_MAX),
            queued: 0,
            front: VecDeque::with_capacity(FRONT_MAX),
            reserve: PROVEN_RESERVE.min(limits.upstream_burst.saturating_sub(2)),
            own: OWN_RESERVE.min(limits.upstream_burst.saturating_sub(1)),
            front_last: false,
        }
    }

    /// A `getchallenge` from `src` at `now`; `proven` when its IP proved its address.
    pub(super) fn offer(
        &mut self,
        src: SocketAddr,
        data: &[u8],
        now: Instant,
        pace: &mut Pace,
        proven: bool,
    ) -> Offer {
        match self
            .per_source
            .check(&src.ip().to_canonical(), now.into_std())
        {
            Ok(true) => {}
            // A table full of (spoofed) strangers does not refuse a proven source.
            Err(_) if proven => {}
            Ok(false) | Err(_) => return Offer::Refused(DropReason::JoinLimit),
        }
        self.expire(now);
        if proven {
            if self.front.is_empty() && pace.take(now, self.own) {
                return Offer::Pass;
            }
            return self.push_front(src, data, now);
        }
        if self.queued == 0 && self.front.is_empty() && pace.take(now, self.own + self.reserve) {
            return Offer::Pass;
        }
        if data.len() > MAX_JOIN {
            return Offer::Refused(DropReason::JoinQueue);
        }
        self.push(src, data, now)
    }

    fn push_front(&mut self, src: SocketAddr, data: &[u8], now: Instant) -> Offer {
        if data.len() > MAX_JOIN
            || self.front.len() >= FRONT_MAX
            || self.front.iter().any(|e| e.src == src)
        {
            return Offer::Refused(DropReason::JoinQueue);
        }
        self.front.push_back(entry(src, data, now));
        Offer::Queued
    }

    fn push(&mut self, src: SocketAddr, data: &[u8], now: Instant) -> Offer {
        let p = prefix(src.ip());
        let here = self.queues.get(&p);
        if here.is_some_and(|q| q.len() >= QUEUE_PER_PREFIX || q.iter().any(|e| e.src == src)) {
            return Offer::Refused(DropReason::JoinQueue);
        }
        if self.queued >= QUEUE_MAX && !self.evict_from_longest(here.map_or(0, VecDeque::len)) {
            return Offer::Refused(DropReason::JoinQueue);
        }
        let q = self.queues.entry(p).or_default();
        if q.is_empty() {
            self.turns.push_back(p);
        }
        q.push_back(entry(src, data, now));
        self.queued += 1;
        Offer::Queued
    }

    /// The queue is full: the newest entry of the prefix holding the most goes, if that prefix
    /// holds more than `mine` (the newcomer's prefix).
    fn evict_from_longest(&mut self, mine: usize) -> bool {
        let Some((p, n)) = self
            .queues
            .iter()
            .map(|(p, q)| (*p, q.len()))
            .max_by_key(|(_, n)| *n)
        else {
            return false;
        };
        if n <= mine + 1 {
            return false;
        }
        if let Some(q) = self.queues.get_mut(&p) {
            q.pop_back();
            self.queued -= 1;
        }
        true
    }

    /// The next queued `getchallenge` whose turn has come at `now` (the pace allowing), written
    /// into `out`; its source is returned.
    pub(super) fn release(
        &mut self,
        now: Instant,
        pace: &mut Pace,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        self.expire(now);
        // The front queue first, but every other turn the fair queue's while both wait.
        let fair_turn = self.front_last && self.queued > 0;
        let front = !self.front.is_empty() && !fair_turn;
        if front {
            if !pace.take(now, self.own) {
                return None;
            }
            let e = self.front.pop_front()?;
            self.front_last = true;
            return Some(e.write(out));
        }
        let keep = if self.front.is_empty() {
            self.own + self.reserve
        } else {
            self.own
        };
        if self.queued == 0 || !pace.take(now, keep) {
            return None;
        }
        self.front_last = false;
        let p = self.turns.pop_front()?;
        let q = self.queues.get_mut(&p)?;
        let e = q.pop_front()?;
        self.queued -= 1;
        if q.is_empty() {
            self.queues.remove(&p);
        } else {
            self.turns.push_back(p);
        }
        Some(e.write(out))
    }

    /// When [`Joins::release`] may next give something back; `None` with empty queues.
    pub(super) fn next_due(&self, now: Instant, pace: &Pace) -> Option<Instant> {
        if !self.front.is_empty() {
            return Some(pace.next_above(now, self.own));
        }
        (self.queued > 0).then(|| pace.next_above(now, self.own + self.reserve))
    }

    /// `getchallenge` queued now (both queues).
    pub(super) fn queued(&self) -> usize {
        self.queued + self.front.len()
    }

    /// Forgets sources at rest, in [`SWEEP_PARTS`] parts (the relay loop's
    /// tick).
    pub(super) fn sweep(&mut self, now: Instant) {
        if !self.per_source.is_empty() {
            self.per_source.sweep_part(now.into_std(), SWEEP_PARTS);
        }
    }

    /// Drops entries that waited [`QUEUE_WAIT`].
    fn expire(&mut self, now: Instant) {
        while self
            .front
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) >= QUEUE_WAIT)
        {
            self.front.pop_front();
        }
        if self.queued == 0 {
            return;
        }
        let mut dropped = 0;
        self.queues.retain(|_, q| {
            while q
                .front()
                .is_some_and(|e| now.saturating_duration_since(e.at) >= QUEUE_WAIT)
            {
                q.pop_front();
                dropped += 1;
            }
            !q.is_empty()
        });
        if dropped > 0 {
            self.queued -= dropped;
            let queues = &self.queues;
            self.turns.retain(|p| queues.contains_key(p));
        }
    }
}

/// A queue entry holding a copy of `data` (at most [`MAX_JOIN`] bytes: checked by the caller).
fn entry(src: SocketAddr, data: &[u8], now: Instant) -> Entry {
    let mut e = Entry {
        src,
        at: now,
        len: data.len(),
        data: [0; MAX_JOIN],
    };
    e.data[..data.len()].copy_from_slice(data);
    e
}

impl Entry {
    /// Writes the datagram into `out`; its source is returned.
    fn write(&self, out: &mut Vec<u8>) -> SocketAddr {
        out.clear();
        out.extend_from_slice(&self.data[..self.len]);
        self.src
    }
}

#[cfg(test)]
mod tests;
