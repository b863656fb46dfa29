//! Outbound pacing: every relay request this node sends to a next hop (a forward, a client
//! send, a probe, each retry) waits for its turn so that the next hop's previous-hop guard never
//! sees this node over its rate, and waits in a bounded queue.
//!
//! **The rate.** A node admits at most `limit` requests per fixed `window` from one previous
//! hop ([`HopRate`]: the design's [`RATE_LIMIT`] per [`RATE_WINDOW`],
//! `--previous-hop-limit`/`--previous-hop-window`); the request after that starts a quarantine.
//! The pacer assumes every peer runs the same rate as this node (the design's default, or the
//! value both flags set): it paces to the rate it enforces.
//!
//! **The rule.** The next hop counts a request at some moment between the moment this node
//! sends it and the moment its answer comes back; its windows start wherever its own clock says.
//! So a request may go at `t` only while fewer than `limit` earlier requests to that next hop
//! are on the wire or were answered after `t − window`. Then any window of the next hop's
//! holds at most `limit` of this node's requests, whatever the latency and wherever its window
//! starts: of the requests it counts in one window, take the last one sent, at `t`; every other
//! one was counted after the window's start, which is after `t − window`, so it was on the wire
//! or answered after `t − window` when the last one went. A request that got no answer (a
//! timeout, a transport error) may still be counted by the next hop a little later: it is
//! recorded as answered [`UNANSWERED_GRACE`] after it was given up. A burst of up to `limit`
//! goes at once; after that requests go as the earlier ones leave the window.
//!
//! **The queue.** A request waiting for its turn holds a place in its next hop's queue: at most
//! [`QueueLimits::per_hop_entries`] requests and [`QueueLimits::per_hop_bytes`] bytes per next
//! hop, and [`QueueLimits::total_entries`] / [`QueueLimits::total_bytes`] over all next hops.
//! Places are taken before anything is reserved or sent; a request that finds the queue full
//! is refused at once (`next_hop_queue_full`). Turns are given in the order places were taken.
//! Between attempts a request holds no place (its retry delay blocks nobody); when it retries
//! it takes its old place back without a bound check (it was admitted already), so a queue may
//! hold up to the requests being retried to its next hop more than its bound, for a moment. A request
//! waits at most until its deadline. The table of next hops holds at most [`MAX_LANES`]; a next
//! hop with nothing queued, nothing on the wire and nothing answered within the window is
//! forgotten.
//!
//! Time is the tokio clock ([`tokio::time::Instant`]): the rule is tested on a paused clock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{self, Instant};
use tokio::sync::Notify;

use crate::proto::NodeId;

/// Requests one previous hop may send per window (the design's default)…
pub const RATE_LIMIT: u32 = 120;
/// …of this length.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// A request given up without an answer counts as answered this long after.
pub const UNANSWERED_GRACE: Duration = Duration::from_secs(5);
/// Requests waiting for their turn to one next hop, by default.
pub const QUEUE_ENTRIES: usize = 8;
/// Bytes of requests waiting for their turn to one next hop, by default (ten 192 KiB frames fit in
/// 2 MiB).
pub const QUEUE_BYTES: usize = 2 << 20;
/// Requests waiting for their turn over all next hops, by default (half of the request gate's
/// in-flight slots: a forward waiting here holds one).
pub const QUEUE_TOTAL_ENTRIES: usize = 32;
/// Bytes of requests waiting for their turn over all next hops, by default.
pub const QUEUE_TOTAL_BYTES: usize = 8 << 20;
/// Next hops remembered at most.
pub const MAX_LANES: usize = 4096;

/// The previous-hop rate: `limit` requests per fixed `window`. This node enforces it on its
/// previous hops (`pipeline::hop_guard`) and assumes it of its next hops (the pacer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopRate {
    /// Requests one previous hop may send per window.
    pub limit: u32,
    /// The window's length.
    pub window: Duration,
}

impl Default for HopRate {
    fn default() -> Self {
        HopRate {
            limit: RATE_LIMIT,
            window: RATE_WINDOW,
        }
    }
}

/// The queue's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Requests waiting per next hop.
    pub per_hop_entries: usize,
    /// Bytes waiting per next hop.
    pub per_hop_bytes: usize,
    /// Requests waiting in all.
    pub total_entries: usize,
    /// Bytes waiting in all.
    pub total_bytes: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            per_hop_entries: QUEUE_ENTRIES,
            per_hop_bytes: QUEUE_BYTES,
            total_entries: QUEUE_TOTAL_ENTRIES,
            total_bytes: QUEUE_TOTAL_BYTES,
        }
    }
}

/// The queue is full: refused before anything was reserved or sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// One next hop's state.
#[derive(Debug, Default)]
struct Lane {
    /// Waiting requests: place number → bytes.
    waiting: BTreeMap<u64, usize>,
    waiting_bytes: usize,
    /// Requests on the wire.
    on_wire: u32,
    /// When requests were answered, in order (the tokio clock never goes back).
    answered: VecDeque<Instant>,
    /// When requests given up without an answer were given up, plus the grace: in order too
    /// (the grace is one constant).
    unanswered: VecDeque<Instant>,
}

impl Lane {
    /// Forgets answers older than the window: from the front of each list, so the cost is the
    /// entries forgotten.
    fn prune(&mut self, now: Instant, window: Duration) {
        for list in [&mut self.answered, &mut self.unanswered] {
            while list
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= window)
            {
                list.pop_front();
            }
        }
    }

    /// Requests that still count at `now` (pruned first).
    fn counted(&self) -> usize {
        self.on_wire as usize + self.answered.len() + self.unanswered.len()
    }

    /// When the earliest counted answer leaves the window.
    fn next_free(&self, window: Duration) -> Option<Instant> {
        let a = self.answered.front();
        let u = self.unanswered.front();
        a.into_iter().chain(u).min().map(|t| *t + window)
    }

    fn idle(&self) -> bool {
        self.waiting.is_empty()
            && self.on_wire == 0
            && self.answered.is_empty()
            && self.unanswered.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    lanes: HashMap<NodeId, Lane>,
    waiting: usize,
    waiting_bytes: usize,
    next_place: u64,
}

/// The pacer and its queues, process-wide.
pub struct Pacer {
    rate: HopRate,
    limits: QueueLimits,
    state: Mutex<State>,
    changed: Notify,
}

/// Counts only: the table is keyed by full node ids.
impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("Pacer")
            .field("rate", &self.rate)
            .field("limits", &self.limits)
            .field("next_hops", &s.lanes.len())
            .field("waiting", &s.waiting)
            .finish()
    }
}

/// What the queue holds now (counts only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    /// Requests waiting for their turn.
    pub waiting: usize,
    /// Their bytes.
    pub waiting_bytes: usize,
    /// Next hops remembered.
    pub next_hops: usize,
}

impl Pacer {
    /// A pacer for next hops running `rate`, with queues bounded by `limits`.
    pub fn new(rate: HopRate, limits: QueueLimits) -> Arc<Self> {
        Arc::new(Pacer {
            rate,
            limits,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
        })
    }

    /// The rate assumed of next hops.
    pub fn rate(&self) -> HopRate {
        self.rate
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the queue holds now.
    pub fn snapshot(&self) -> QueueSnapshot {
        let s = self.lock();
        QueueSnapshot {
            waiting: s.waiting,
            waiting_bytes: s.waiting_bytes,
            next_hops: s.lanes.len(),
        }
    }

    /// A place in `hop`'s queue for a request of `bytes`.
    ///
    /// # Errors
    /// [`QueueFull`]: the next hop's queue or the whole queue is at its bound (entries or
    /// bytes), or the table of next hops is full of busy ones.
    pub fn join(self: &Arc<Self>, hop: &NodeId, bytes: usize) -> Result<Turn, QueueFull> {
        let now = clock::now();
        let mut s = self.lock();
        let l = &self.limits;
        if s.waiting + 1 > l.total_entries || s.waiting_bytes + bytes > l.total_bytes {
            return Err(QueueFull);
        }
        if !s.lanes.contains_key(hop) && s.lanes.len() >= MAX_LANES {
            let window = self.rate.window;
            s.lanes.retain(|_, lane| {
                lane.prune(now, window);
                !lane.idle()
            });
            if s.lanes.len() >= MAX_LANES {
                return Err(QueueFull);
            }
        }
        let place = s.next_place;
        let lane = s.lanes.entry(*hop).or_default();
        if lane.waiting.len() + 1 > l.per_hop_entries
            || lane.waiting_bytes + bytes > l.per_hop_bytes
        {
            if lane.idle() {
                s.lanes.remove(hop);
            }
            return Err(QueueFull);
        }
        lane.waiting.insert(place, bytes);
        lane.waiting_bytes += bytes;
        s.waiting += 1;
        s.waiting_bytes += bytes;
        s.next_place += 1;
        drop(s);
        // With nothing ahead of it and room under the rate, it goes at once: the first `limit`
        // requests of a burst never wait, whatever the scheduling.
        let phase = if self.try_go(hop, place, now).is_ok() {
            Phase::OnWire
        } else {
            Phase::Waiting
        };
        Ok(Turn {
            pacer: Arc::clone(self),
            hop: *hop,
            place,
            bytes,
            phase,
        })
    }

    /// Whether `place` may go to `hop` at `now`; if not, when to look again (`None`: when
    /// something changes).
    fn try_go(&self, hop: &NodeId, place: u64, now: Instant) -> Result<(), Option<Instant>> {
        let mut s = self.lock();
        let window = self.rate.window;
        let limit = self.rate.limit as usize;
        let Some(lane) = s.lanes.get_mut(hop) else {
            return Err(None);
        };
        lane.prune(now, window);
        if lane.waiting.keys().next() != Some(&place) {
            return Err(None);
        }
        if lane.counted() >= limit {
            // The earliest answer leaves the window first; with none, an answer must come.
            return Err(lane.next_free(window));
        }
        let bytes = lane.waiting.remove(&place).unwrap_or(0);
        lane.waiting_bytes -= bytes;
        lane.on_wire += 1;
        s.waiting -= 1;
        s.waiting_bytes -= bytes;
        Ok(())
    }

    /// A request leaves the wire, `answered` or not (then it counts [`UNANSWERED_GRACE`]
    /// longer).
    fn off_wire(&self, hop: &NodeId, answered: bool) {
        let now = clock::now();
        let mut s = self.lock();
        if let Some(lane) = s.lanes.get_mut(hop) {
            lane.on_wire = lane.on_wire.saturating_sub(1);
            if answered {
                lane.answered.push_back(now);
            } else {
                lane.unanswered.push_back(now + UNANSWERED_GRACE);
            }
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// A request about to be retried takes its place back (no bound checked: it was admitted).
    fn rejoin(&self, hop: &NodeId, place: u64, bytes: usize) {
        let mut s = self.lock();
        let lane = s.lanes.entry(*hop).or_default();
        lane.waiting.insert(place, bytes);
        lane.waiting_bytes += bytes;
        s.waiting += 1;
        s.waiting_bytes += bytes;
    }

    /// `place` leaves the queue without going.
    fn leave(&self, hop: &NodeId, place: u64) {
        let mut s = self.lock();
        let (gone, idle) = match s.lanes.get_mut(hop) {
            Some(lane) => match lane.waiting.remove(&place) {
                Some(bytes) => {
                    lane.waiting_bytes -= bytes;
                    (Some(bytes), lane.idle())
                }
                None => (None, false),
            },
            None => (None, false),
        };
        if idle {
            s.lanes.remove(hop);
        }
        if let Some(bytes) = gone {
            s.waiting -= 1;
            s.waiting_bytes -= bytes;
        }
        drop(s);
        self.changed.notify_waiters();
    }
}

/// A request's place in its next hop's queue, then its turn on the wire. Dropped: its place is
/// given up; dropped on the wire: counted as unanswered.
#[derive(Debug)]
pub struct Turn {
    pacer: Arc<Pacer>,
    hop: NodeId,
    place: u64,
    bytes: usize,
    phase: Phase,
}

/// Where a [`Turn`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// In the queue, waiting for its turn.
    Waiting,
    /// On the wire.
    OnWire,
    /// Between attempts (a retry's delay): holds no place, blocks nobody.
    Between,
}

impl Turn {
    /// The next hop.
    pub fn hop(&self) -> &NodeId {
        &self.hop
    }

    /// True unless the request is on the wire.
    pub fn is_waiting(&self) -> bool {
        self.phase != Phase::OnWire
    }

    /// Back in the queue after an attempt (its old place: it was there first).
    fn ready(&mut self) {
        if self.phase == Phase::Between {
            self.pacer.rejoin(&self.hop, self.place, self.bytes);
            self.phase = Phase::Waiting;
        }
    }

    /// Takes this request's turn if it may go now; true when on the wire.
    pub fn try_now(&mut self) -> bool {
        self.ready();
        if self.phase == Phase::Waiting
            && self
                .pacer
                .try_go(&self.hop, self.place, clock::now())
                .is_ok()
        {
            self.phase = Phase::OnWire;
        }
        self.phase == Phase::OnWire
    }

    /// Waits for this request's turn, at most until `deadline`; true once it may go (it is on
    /// the wire until [`Turn::answered`]).
    pub async fn go(&mut self, deadline: Instant) -> bool {
        self.ready();
        if self.phase == Phase::OnWire {
            return true;
        }
        loop {
            let changed = self.pacer.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = clock::now();
            match self.pacer.try_go(&self.hop, self.place, now) {
                Ok(()) => {
                    self.phase = Phase::OnWire;
                    return true;
                }
                Err(_) if now >= deadline => return false,
                Err(wake) => {
                    let until = wake.map_or(deadline, |w| w.min(deadline));
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
            }
        }
    }

    /// The attempt on the wire ended: with an answer (`answered`) or without one (counted a
    /// little longer, [`UNANSWERED_GRACE`]). Until the request tries again it holds no place,
    /// so a retry's delay blocks nobody; then it takes its old place back.
    pub fn answered(&mut self, answered: bool) {
        if self.phase != Phase::OnWire {
            return;
        }
        self.phase = Phase::Between;
        self.pacer.off_wire(&self.hop, answered);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        match self.phase {
            Phase::OnWire => self.pacer.off_wire(&self.hop, false),
            Phase::Waiting => self.pacer.leave(&self.hop, self.place),
            Phase::Between => {}
        }
    }
}

#[cfg(test)]
mod tests;
