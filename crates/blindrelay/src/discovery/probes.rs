//! Reach probes of identities waiting, and retries of peers whose descriptors lapsed.
//!
//! A probe is a hello over the link pinned to the identity (this node's descriptor in, the
//! peer's back when newer than the one held): an answer proves the endpoint holds the
//! identity's key. Waiting identities are probed by class, the operator's and the peer
//! store's first, then those reached peers brought, then strangers' own (in at most half of the
//! probes in flight, so a stranger's junk never holds up the rest), round robin over the
//! sources within a class, so one source's thousand identities do not hold up another's one. A
//! failed probe of an identity the operator, the store or a peer brought is tried again after
//! [`RETRY_VOUCHED`], then four times that (a peer passes on only what it reached, so a hello
//! that timed out on a loaded machine is likelier than junk), a stranger's own after
//! [`RETRY_FIRST`]; after [`MAX_TRIES`] failures ([`STRANGER_TRIES`] for a stranger's own) the
//! identity is forgotten. While this node is *forming* (it reached fewer
//! than [`FORMING_PEERS`] peers, or fewer than nine in ten of those it holds: a start, when
//! every node around may be as busy as it), a failed probe of an identity the operator, the
//! store or a peer brought (not a stranger's own) is tried again sooner: after
//! [`FORMING_RETRY`], doubling, with jitter, at most [`RETRY_FIRST`], and forgotten after
//! [`FORMING_TRIES`] failures. A probe answered busy (`429`) is no failure: it is tried again
//! after [`BUSY_RETRY`], doubling, with jitter, at most the discovery interval; only
//! [`MAX_BUSY`] busy answers in a row count as one failure.
//!
//! A reached peer whose descriptor expired is set aside (at most [`LAPSED`], the ones reached
//! longest ago dropped first) and greeted again at its last endpoint at once, then backing off
//! from a quarter of the discovery interval to twice it, for as long as it is kept: when it answers, its
//! fresh descriptor is kept with what this node knew of it (first seen), and this node
//! reconciles with it, which brings back the half of the network behind it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use hashbrown::{HashMap, HashSet};
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::view::{Entry, Origin};
use super::{Config, Discovery, Failed, Msg, Now, Purpose, Signed, Source};
use crate::proto::NodeId;

/// Probes of one waiting identity at most...
pub const MAX_TRIES: u8 = 3;
/// ...and of a stranger's own (it just connected: its endpoint should answer at once).
pub const STRANGER_TRIES: u8 = 2;
/// Wait before the retry of a failed probe of a stranger's own (and the longest a forming node
/// waits).
pub const RETRY_FIRST: Duration = Duration::from_secs(10);
/// Wait before the first retry of a failed probe of an identity not a stranger's own (the
/// second waits four times as long).
pub const RETRY_VOUCHED: Duration = Duration::from_secs(2);

/// Reached peers below which a node is forming (or nine in ten of those it holds, if more).
pub const FORMING_PEERS: usize = 16;
/// While forming, wait before a failed probe's first retry (doubling for each next one).
pub const FORMING_RETRY: Duration = Duration::from_secs(1);
/// While forming, probes of one waiting identity at most.
pub const FORMING_TRIES: u8 = 5;
/// Wait before a busy probe's first retry (doubling for each busy answer in a row).
pub const BUSY_RETRY: Duration = Duration::from_secs(2);
/// Busy answers in a row that count as one failure.
pub const MAX_BUSY: u8 = 6;

/// Lapsed peers kept at most.
pub const LAPSED: usize = 256;
/// Lapsed peers greeted at once at most.
const LAPSED_IN_FLIGHT: usize = 4;

/// One class of waiting identities: their sources in turn, each with its queue.
#[derive(Debug, Default)]
struct Class {
    ring: VecDeque<Origin>,
    queues: HashMap<Origin, VecDeque<Arc<Signed>>>,
}

impl Class {
    fn push(&mut self, source: Origin, s: Arc<Signed>) {
        let q = self.queues.entry(source).or_insert_with(|| {
            self.ring.push_back(source);
            VecDeque::new()
        });
        q.push_back(s);
    }

    fn pop(&mut self) -> Option<Arc<Signed>> {
        while let Some(source) = self.ring.pop_front() {
            let Some(q) = self.queues.get_mut(&source) else {
                continue;
            };
            let next = q.pop_front();
            if q.is_empty() {
                self.queues.remove(&source);
            } else {
                self.ring.push_back(source);
            }
            if next.is_some() {
                return next;
            }
        }
        None
    }
}

/// A reached peer whose descriptor lapsed.
#[derive(Debug)]
struct Lapse {
    s: Arc<Signed>,
    first_seen: u64,
    reached: u64,
    tries: u32,
    due: Instant,
    asked: bool,
}

/// The probes' state.
#[derive(Debug, Default)]
pub struct Probes {
    classes: [Class; 3],
    retry: BinaryHeap<Reverse<(Instant, NodeId)>>,
    in_flight: usize,
    /// Probes of strangers' own in flight.
    strangers_in_flight: usize,
    /// Identities whose probe in flight is a stranger's.
    stranger_probes: HashSet<NodeId>,
    lapsed: HashMap<NodeId, Lapse>,
    lapsed_asked: usize,
    /// Strangers' identities moved ahead ([`Probes::promote`]), until probed.
    promoted: HashSet<NodeId>,
    /// Busy answers in a row, per identity whose retry is pending.
    busy: HashMap<NodeId, u8>,
}

impl Probes {
    /// The heap it takes, estimated.
    pub fn heap_bytes(&self) -> usize {
        let classes: usize = self
            .classes
            .iter()
            .map(|c| {
                c.ring.capacity() * 8
                    + c.queues.capacity() * 41
                    + c.queues.values().map(|q| q.capacity() * 8).sum::<usize>()
            })
            .sum();
        classes
            + self.retry.capacity() * 48
            + self.stranger_probes.capacity() * 33
            + self.promoted.capacity() * 33
            + self.lapsed.capacity() * 120
            + self.busy.capacity() * 33
    }

    /// `s`, introduced by `origin`, waits to be probed.
    pub fn waiting(&mut self, s: &Arc<Signed>, origin: Origin) {
        self.classes[origin.class()].push(origin, Arc::clone(s));
    }

    /// `s`, waiting as a stranger's own, is vouched for by the reached `peer`: probed with
    /// what peers bring (once).
    pub fn promote(&mut self, s: &Arc<Signed>, peer: NodeId) {
        if self.promoted.len() < LAPSED * 16 && self.promoted.insert(s.d.node_id) {
            self.classes[1].push(Origin::from(Source::Peer(peer)), Arc::clone(s));
        }
    }

    /// The entry `e`, reached once, lapsed at `now`: set aside and greeted again.
    pub fn lapse(&mut self, e: Entry, now: Now, _cfg: &Config) {
        let id = *e.id();
        if self.lapsed.len() >= LAPSED && !self.lapsed.contains_key(&id) {
            let oldest = self
                .lapsed
                .iter()
                .filter(|(_, l)| !l.asked)
                .min_by_key(|(_, l)| l.reached)
                .map(|(id, _)| *id);
            match oldest {
                Some(old) if self.lapsed[&old].reached < e.reached().unwrap_or(0) => {
                    self.lapsed.remove(&old);
                }
                _ => return,
            }
        }
        let lapse = Lapse {
            first_seen: e.first_seen(),
            reached: e.reached().unwrap_or(0),
            s: e.s,
            tries: 0,
            due: now.at,
            asked: false,
        };
        self.lapsed.insert(id, lapse);
    }

    /// `id` is held again: no longer lapsed. When this node first saw it, if it was.
    pub fn returned(&mut self, id: &NodeId) -> Option<u64> {
        let l = self.lapsed.remove(id)?;
        if l.asked {
            self.lapsed_asked -= 1;
        }
        Some(l.first_seen)
    }

    /// Gives back the room of a burst.
    pub fn sweep(&mut self) {
        super::shrink(&mut self.lapsed);
        super::shrink(&mut self.busy);
        let set = &mut self.promoted;
        if set.capacity() > 64 && set.len() * 4 <= set.capacity() {
            set.shrink_to_fit();
        }
    }

    /// Probes in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Identities queued per class, and retries pending.
    pub fn queued(&self) -> ([usize; 3], usize) {
        let per = |c: &Class| c.queues.values().map(VecDeque::len).sum();
        (
            [
                per(&self.classes[0]),
                per(&self.classes[1]),
                per(&self.classes[2]),
            ],
            self.retry.len(),
        )
    }

    /// Lapsed peers kept.
    pub fn lapsed(&self) -> usize {
        self.lapsed.len()
    }
}

impl Discovery {
    /// Probes started up to the bound: failed ones due again put back in turn, then the
    /// classes in order; lapsed peers due greeted.
    pub(super) fn start_probes(&mut self, now: Now) {
        while let Some(Reverse((due, id))) = self.probes.retry.peek().copied() {
            if due > now.at {
                break;
            }
            self.probes.retry.pop();
            if let Some(e) = self.view.get(&id).filter(|e| e.reached().is_none()) {
                let (s, origin) = (Arc::clone(&e.s), self.view.origin(e));
                self.probes.waiting(&s, origin);
            } else {
                self.probes.busy.remove(&id);
            }
        }
        while self.probes.in_flight < self.cfg.probes_in_flight {
            let Some(s) = self.next_waiting(now) else {
                break;
            };
            self.probes.in_flight += 1;
            let msg = self.hello(&s);
            self.request(s.clone(), msg, Purpose::Probe(s.d.node_id), now);
        }
        self.greet_lapsed(now);
    }

    /// The next identity to probe: still held, not reached, current.
    fn next_waiting(&mut self, now: Now) -> Option<Arc<Signed>> {
        for c in 0..self.probes.classes.len() {
            if c == 2 && self.probes.strangers_in_flight * 2 >= self.cfg.probes_in_flight {
                continue;
            }
            while let Some(queued) = self.probes.classes[c].pop() {
                // The identity's current descriptor (a newer one may have come since).
                let current = self
                    .view
                    .get(&queued.d.node_id)
                    .filter(|e| e.reached().is_none() && e.s.d.is_current(now.unix))
                    .map(|e| Arc::clone(&e.s));
                if let Some(s) = current {
                    if c == 2 && self.probes.stranger_probes.insert(s.d.node_id) {
                        self.probes.strangers_in_flight += 1;
                    }
                    return Some(s);
                }
            }
        }
        None
    }

    /// A hello to the holder of `to`: this node's descriptor, and which of its own this node
    /// holds (it answers with a newer one only).
    fn hello(&self, to: &Signed) -> Msg {
        Msg::Hello {
            own: self.own.as_ref().map(|o| o.d.clone()),
            have: to.d.issued_at,
        }
    }

    fn greet_lapsed(&mut self, now: Now) {
        if self.probes.lapsed_asked >= LAPSED_IN_FLIGHT || self.probes.lapsed.is_empty() {
            return;
        }
        let due: Vec<NodeId> = self
            .probes
            .lapsed
            .iter()
            .filter(|(_, l)| !l.asked && l.due <= now.at)
            .map(|(id, _)| *id)
            .take(LAPSED_IN_FLIGHT - self.probes.lapsed_asked)
            .collect();
        for id in due {
            if self.view.get(&id).is_some() {
                self.probes.returned(&id);
                continue;
            }
            let Some(l) = self.probes.lapsed.get_mut(&id) else {
                continue;
            };
            l.asked = true;
            let s = Arc::clone(&l.s);
            self.probes.lapsed_asked += 1;
            let msg = self.hello(&s);
            self.request(s, msg, Purpose::Lapsed(id), now);
        }
    }

    /// A probe's answer: the identity reached (its own descriptor, if newer, kept), or one
    /// failure more.
    pub(super) fn probed(
        &mut self,
        id: NodeId,
        reply: Result<&Msg, Failed>,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) {
        self.probes.in_flight = self.probes.in_flight.saturating_sub(1);
        self.probes.promoted.remove(&id);
        if self.probes.stranger_probes.remove(&id) {
            self.probes.strangers_in_flight -= 1;
        }
        if let Ok(Msg::Hello { .. }) = reply {
            self.probes.busy.remove(&id);
            for s in checked.into_iter().filter(|s| s.d.node_id == id) {
                let _ = self.learn(s, Source::Peer(id), now);
            }
            self.reached(&id, now);
            return;
        }
        if matches!(reply, Err(Failed::Busy)) && self.view.get(&id).is_some() {
            let busy = self.probes.busy.entry(id).or_insert(0);
            *busy += 1;
            let n = *busy;
            if n < MAX_BUSY {
                let wait = BUSY_RETRY
                    .saturating_mul(1 << (n - 1))
                    .min(self.cfg.interval);
                let wait = self.jittered(wait);
                self.probes.retry.push(Reverse((now.at + wait, id)));
                return;
            }
        }
        self.probes.busy.remove(&id);
        let stranger = self
            .view
            .get(&id)
            .is_some_and(|e| self.view.origin(e).is_stranger());
        // A stranger's own is never tried sooner: junk must not cost more probes.
        let forming = !stranger && self.forming();
        let failures = self.view.failed(&id);
        let tries = match (stranger, forming) {
            (true, _) => STRANGER_TRIES,
            (false, true) => FORMING_TRIES,
            (false, false) => MAX_TRIES,
        };
        if failures >= tries {
            if self.view.forget(&id).is_some() {
                self.stats.forgotten += 1;
            }
            return;
        }
        let exp = u32::from(failures.saturating_sub(1));
        let wait = if forming {
            let wait = FORMING_RETRY.saturating_mul(2u32.saturating_pow(exp));
            self.jittered(wait.min(RETRY_FIRST))
        } else if !stranger {
            self.jittered(RETRY_VOUCHED.saturating_mul(4u32.saturating_pow(exp)))
        } else {
            RETRY_FIRST * 4u32.pow(exp)
        };
        self.probes.retry.push(Reverse((now.at + wait, id)));
    }

    /// True while this node reached fewer than [`FORMING_PEERS`] peers, or fewer than nine in
    /// ten of those it holds.
    pub fn forming(&self) -> bool {
        let held = self.view.len();
        held - self.view.waiting().min(held) < FORMING_PEERS.max(held * 9 / 10)
    }

    /// `wait`, from half to one and a half times it, at random.
    pub(super) fn jittered(&mut self, wait: Duration) -> Duration {
        wait.mul_f64(self.rng.random_range(0.5..1.5))
    }

    /// A lapsed peer's answer: its fresh descriptor kept with what this node knew of it, and a
    /// reconciliation with it; or a longer wait.
    pub(super) fn lapsed_answered(
        &mut self,
        id: NodeId,
        reply: Result<&Msg, Failed>,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) {
        let fresh = match reply {
            Ok(Msg::Hello { .. }) => checked.into_iter().find(|s| s.d.node_id == id),
            _ => None,
        };
        let Some(s) = fresh else {
            let cfg = self.cfg;
            // Busy: it is up; greeted again soon, its backoff unchanged.
            let busy = matches!(reply, Err(Failed::Busy));
            let soon = self.jittered(BUSY_RETRY.min(cfg.interval));
            if let Some(l) = self.probes.lapsed.get_mut(&id) {
                l.asked = false;
                if !busy {
                    l.tries = l.tries.saturating_add(1);
                }
                let wait = (cfg.interval / 4).saturating_mul(1 << l.tries.min(8));
                l.due = now.at
                    + if busy {
                        soon
                    } else {
                        wait.min(cfg.interval * 2)
                    };
                self.probes.lapsed_asked -= 1;
            }
            return;
        };
        let first_seen = self.probes.returned(&id);
        if self.learn(Arc::clone(&s), Source::Peer(id), now).is_err() {
            return;
        }
        if let Some(first_seen) = first_seen {
            self.view.remember(&id, first_seen, None);
        }
        self.reached(&id, now);
        self.stats.revived += 1;
        self.begin(s, now);
    }
}
