//! One shard of the simulated network: the nodes one thread runs, their event queue, and what
//! happens at each event (the machine's functions called as the daemon calls them).
//!
//! A message between nodes takes at least the link's latency, so within a window of that
//! length no event of one shard can cause an event in another before the window ends: each
//! shard runs its window alone, and what it sent to the other shard's nodes is handed over
//! between windows (conservative parallel simulation, the latency as lookahead).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use guard::admission::{Gate, Permit};
use hashbrown::{HashMap, HashSet};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::{Caller, Discovery, Failed, Msg, Now, Signed, verify};
use super::SimConfig;
use crate::pipeline::crypto::{Shares, StrangerSlot, Strangers};
use crate::proto::NodeId;
use crate::proto::descriptor::Descriptor;
use crate::sources::{Grouping, SourceKey};

/// One simulated node.
#[derive(Debug)]
pub struct Node {
    /// Its machine.
    pub disc: Discovery,
    pub(super) key: SigningKey,
    pub(super) onion: [u8; 32],
    pub(super) endpoint: String,
    /// Its endpoint's address.
    pub ip: IpAddr,
    /// Running: a dead node's port refuses.
    pub up: bool,
    /// Hung: it accepts and never answers.
    pub hung: bool,
    /// Busy: it answers every request `429` ([`Failed::Busy`]).
    pub busy: bool,
    /// If set, the only identities it keeps (a liar's network).
    pub only: Option<Arc<std::collections::HashSet<NodeId>>>,
    /// With a shared machine: its crypto slots, and the strangers' share of them, as the
    /// daemon's admission keeps them (`crate::pipeline::crypto`).
    pub(super) admission: Option<(Gate, Arc<Strangers>)>,
    /// The slots its requests hold, each until its time.
    pub(super) held: Vec<Held>,
}

/// A crypto slot a request holds until `until` (microseconds), and its hold on the strangers'
/// share if a stranger's: given back when dropped.
#[derive(Debug)]
pub(super) struct Held {
    until: u64,
    _slot: Permit,
    _stranger: Option<StrangerSlot>,
}

impl Node {
    /// Its id.
    pub fn id(&self) -> NodeId {
        self.key.verifying_key().to_bytes()
    }

    pub(super) fn current(&self) -> Option<&Descriptor> {
        self.disc.own.as_ref().map(|o| &o.d)
    }

    /// Its descriptor signed again at `now` when half its life is gone, dated `age` seconds
    /// back; the new one, to be remembered by the network.
    pub(super) fn reissue(&mut self, now: u64, lifetime: u64, age: u64) -> Option<Arc<Signed>> {
        let stale = self
            .current()
            .is_none_or(|d| now.saturating_sub(d.issued_at) >= lifetime / 2);
        if !stale {
            return None;
        }
        let at = now.saturating_sub(age);
        let d = Descriptor::sign(&self.key, self.onion, self.endpoint.clone(), at, lifetime);
        let s = Arc::new(Signed::trusted(d));
        self.disc.set_own(Arc::clone(&s));
        Some(s)
    }
}

/// What happens to a node at a time.
#[derive(Debug)]
pub(super) enum Event {
    Poll(usize),
    /// `sent`: when the exchange began (microseconds), to time it.
    Request {
        from: usize,
        to: usize,
        xid: u64,
        msg: Box<Msg>,
        sent: u64,
    },
    Reply {
        to: usize,
        xid: u64,
        reply: Result<Box<Msg>, Failed>,
        sent: u64,
    },
}

impl Event {
    /// The node it happens to.
    pub(super) fn node(&self) -> usize {
        match self {
            Event::Poll(i) | Event::Request { to: i, .. } | Event::Reply { to: i, .. } => *i,
        }
    }
}

/// What every shard reads and none changes during a window.
#[derive(Debug)]
pub(super) struct Shared {
    /// Each node's id and address, copied out of the nodes: a shard reads a caller's while
    /// another thread holds that caller's node.
    pub(super) ids: Vec<(NodeId, IpAddr)>,
    pub(super) index: HashMap<NodeId, usize>,
    pub(super) memo: HashMap<(NodeId, u64), Arc<Signed>>,
    /// If set, the nodes on one side of a split: nothing crosses it.
    pub(super) cut: Option<HashSet<usize>>,
    pub(super) cfg: SimConfig,
    pub(super) base: Instant,
    pub(super) unix0: u64,
}

impl Shared {
    pub(super) fn crosses(&self, a: usize, b: usize) -> bool {
        self.cut
            .as_ref()
            .is_some_and(|side| side.contains(&a) != side.contains(&b))
    }
}

/// An event's place in a queue: `(time, sequence, slot)`.
type Key = (u64, u64, u32);

/// Milliseconds the queue's ring covers; events further ahead wait in a heap.
const RING_MS: u64 = 4096;

/// A shard's event queue and its own random numbers: a ring of one-millisecond buckets (a
/// bucket sorted when its millisecond comes), events beyond the ring in a heap. Pushing and
/// taking cost the same whatever the number of events waiting.
#[derive(Debug)]
pub(super) struct Queue {
    ring: Vec<Vec<Key>>,
    /// The millisecond of the bucket at `cursor`; its bucket is sorted, latest first.
    base_ms: u64,
    cursor: usize,
    in_ring: usize,
    later: BinaryHeap<Reverse<Key>>,
    events_at: Vec<Option<Event>>,
    free: Vec<u32>,
    seq: u64,
    /// A window's events, taken out to be run node by node (kept for its room).
    batch: Vec<(u64, Event)>,
    pub(super) rng: StdRng,
}

impl Queue {
    pub(super) fn new(seed: u64, now: u64) -> Queue {
        Queue {
            ring: (0..RING_MS).map(|_| Vec::new()).collect(),
            base_ms: now / 1000,
            cursor: 0,
            in_ring: 0,
            later: BinaryHeap::new(),
            events_at: Vec::new(),
            free: Vec::new(),
            seq: 0,
            batch: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The time of the next event.
    pub(super) fn next_at(&mut self) -> Option<u64> {
        loop {
            if let Some(k) = self.ring[self.cursor].last() {
                return Some(k.0);
            }
            if self.in_ring == 0 {
                // Nothing within the ring: jump to the next event's millisecond.
                let Reverse(k) = self.later.peek()?;
                self.base_ms = self.base_ms.max(k.0 / 1000);
            } else {
                self.base_ms += 1;
                self.cursor = (self.cursor + 1) % RING_MS as usize;
            }
            while let Some(Reverse(k)) = self.later.peek().copied() {
                if k.0 / 1000 >= self.base_ms + RING_MS {
                    break;
                }
                self.later.pop();
                self.place(k);
            }
            let bucket = &mut self.ring[self.cursor];
            bucket.sort_unstable_by(|a, b| b.cmp(a));
        }
    }

    fn place(&mut self, k: Key) {
        let ms = (k.0 / 1000).max(self.base_ms);
        let ahead = ms - self.base_ms;
        if ahead >= RING_MS {
            self.later.push(Reverse(k));
            return;
        }
        let i = (self.cursor + ahead as usize) % RING_MS as usize;
        let bucket = &mut self.ring[i];
        if ahead == 0 {
            // The bucket being taken: kept sorted, latest first.
            let at = bucket.partition_point(|x| *x > k);
            bucket.insert(at, k);
        } else {
            bucket.push(k);
        }
        self.in_ring += 1;
    }

    pub(super) fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.events_at[slot as usize] = Some(event);
                slot
            }
            None => {
                self.events_at.push(Some(event));
                u32::try_from(self.events_at.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.place((at, self.seq, slot));
    }

    /// The next event if it is before `end`.
    pub(super) fn pop_before(&mut self, end: u64) -> Option<(u64, Event)> {
        self.next_at().filter(|t| *t < end)?;
        let (t, _, slot) = self.ring[self.cursor].pop()?;
        self.in_ring -= 1;
        self.free.push(slot);
        self.events_at[slot as usize].take().map(|e| (t, e))
    }

    /// Every event, in order.
    pub(super) fn drain(&mut self) -> Vec<(u64, Event)> {
        let mut out = Vec::new();
        while let Some((t, e)) = self.pop_before(u64::MAX) {
            out.push((t, e));
        }
        self.events_at.clear();
        self.free.clear();
        out
    }
}

/// One thread's part of a window: its nodes (`first..first + nodes.len()`), its queue.
pub(super) struct Shard<'a> {
    pub(super) nodes: &'a mut [Node],
    pub(super) first: usize,
    pub(super) queue: &'a mut Queue,
    pub(super) shared: &'a Shared,
    /// Events for other shards' nodes, in the order they were made.
    pub(super) outbox: Vec<(u64, Event)>,
    /// Descriptors signed in this window.
    pub(super) signed: Vec<Arc<Signed>>,
    pub(super) micros: u64,
    pub(super) events: u64,
    /// Exchanges answered or refused in this window, and the time they took, summed.
    pub(super) exchanges_timed: u64,
    pub(super) exchange_micros: u64,
    /// The shared machine's cores (when each is free next), if one is simulated.
    pub(super) cores: Option<&'a mut Vec<u64>>,
}

impl Shard<'_> {
    /// Runs every event before `end`. With `by_node`, node by node, each node's in time
    /// order: within a window no shorter than the link's least latency, an event creates none
    /// before the window's end and changes no other node, so the order across nodes is free,
    /// and a node's state is then loaded once per window rather than once per event (at
    /// 10 000 nodes, memory stalls are most of the time).
    pub(super) fn run(&mut self, end: u64, by_node: bool) {
        let mut batch = std::mem::take(&mut self.queue.batch);
        while let Some(e) = self.queue.pop_before(end) {
            batch.push(e);
        }
        if by_node {
            batch.sort_by_key(|(_, e)| e.node());
        }
        for (t, event) in batch.drain(..) {
            self.micros = t;
            self.handle(event);
        }
        self.queue.batch = batch;
    }

    fn node(&mut self, i: usize) -> &mut Node {
        &mut self.nodes[i - self.first]
    }

    fn now(&self) -> Now {
        Now {
            at: self.shared.base + Duration::from_micros(self.micros),
            unix: self.shared.unix0 + self.micros / 1_000_000,
        }
    }

    fn schedule(&mut self, after_us: u64, event: Event) {
        let at = self.micros + after_us;
        let i = event.node();
        if (self.first..self.first + self.nodes.len()).contains(&i) {
            self.queue.push(at, event);
        } else {
            self.outbox.push((at, event));
        }
    }

    fn delay(&mut self) -> u64 {
        let cfg = &self.shared.cfg;
        let jitter = cfg.jitter.as_micros() as u64;
        cfg.latency.as_micros() as u64
            + if jitter > 0 {
                self.queue.rng.random_range(0..jitter)
            } else {
                0
            }
    }

    /// With a shared machine: the time from now until an exchange asked now is done (waiting
    /// for the core free first, then its work); none without.
    fn work(&mut self) -> u64 {
        let (Some(cpu), Some(cores)) = (self.shared.cfg.cpu, self.cores.as_deref_mut()) else {
            return 0;
        };
        let Some(core) = cores.iter_mut().min() else {
            return 0;
        };
        let start = (*core).max(self.micros);
        *core = start + cpu.per_exchange.as_micros() as u64;
        *core - self.micros
    }

    fn lost(&mut self) -> bool {
        let loss = self.shared.cfg.loss;
        loss > 0.0 && self.queue.rng.random_bool(loss)
    }

    fn handle(&mut self, event: Event) {
        self.events += 1;
        match event {
            Event::Poll(i) => {
                if !self.node(i).up {
                    return;
                }
                let (now, lifetime) = (self.now().unix, self.shared.cfg.lifetime);
                if let Some(s) = self.node(i).reissue(now, lifetime, 0) {
                    self.signed.push(s);
                }
                self.drain(i);
                let tick = self.shared.cfg.tick.as_micros() as u64;
                self.schedule(tick, Event::Poll(i));
            }
            Event::Request {
                from,
                to,
                xid,
                msg,
                sent,
            } => self.request(from, to, xid, &msg, sent),
            Event::Reply {
                to,
                xid,
                reply,
                sent,
            } => {
                if !self.node(to).up {
                    return;
                }
                self.exchange_micros += self.micros.saturating_sub(sent);
                self.exchanges_timed += 1;
                let checked = match &reply {
                    Ok(msg) => self.check(to, msg).unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
                let now = self.now();
                let reply = reply.as_deref().map_err(|f| *f);
                self.node(to).disc.on_reply(xid, reply, checked, now);
                self.drain(to);
            }
        }
    }

    /// With a shared machine, the crypto slot node `to` takes at `at` (when it gets a core
    /// for the request: its handshake read, it asks for a slot) for a request from `from`, by
    /// the daemon's admission (`crate::pipeline::crypto::admit`): a stranger's (a caller whose
    /// address `to` holds no identity at) within the strangers' share, then one of the slots
    /// inbound requests may take. `None` when refused (the node answers `429`).
    fn admit(&mut self, from: usize, to: usize, at: u64) -> Option<(Permit, Option<StrangerSlot>)> {
        let (id, ip) = self.shared.ids[from];
        let node = self.node(to);
        node.held.retain(|h| h.until > at);
        let (slots, strangers) = node.admission.as_ref()?;
        let stranger = if node.disc.view().get(&id).is_none() {
            let key = SourceKey::Net(crate::sources::block(ip, Grouping::default()));
            Some(strangers.take(key)?)
        } else {
            None
        };
        let slot = slots.try_acquire_below(Shares::of(slots.limit()).inbound)?;
        Some((slot, stranger))
    }

    fn request(&mut self, from: usize, to: usize, xid: u64, msg: &Msg, sent: u64) {
        let (up, hung, busy) = (self.node(to).up, self.node(to).hung, self.node(to).busy);
        if hung && up && !busy {
            return;
        }
        // With a shared machine: the time until the node's work on it is done, and the slot
        // it took once it got a core (refused: the work was done all the same).
        let (work, slot) = match self.shared.cfg.cpu {
            Some(cpu) if up && !busy => {
                let work = self.work();
                let start = self.micros + work - cpu.per_exchange.as_micros() as u64;
                (work, Some(self.admit(from, to, start)))
            }
            _ => (0, None),
        };
        if !up || busy || matches!(slot, Some(None)) {
            let d = self.delay() + work;
            let reply = Err(if up { Failed::Busy } else { Failed::Down });
            self.schedule(
                d,
                Event::Reply {
                    to: from,
                    xid,
                    reply,
                    sent,
                },
            );
            return;
        }
        let checked = self.check(to, msg);
        if let (Some(Some((slot, stranger))), Some(cpu)) = (slot, self.shared.cfg.cpu) {
            // A request with descriptors to check waits for its crypto thread as long as it
            // waited for a core, at most `slot_hold` (not at all on an idle machine); one
            // without gives its slot back once read.
            let per = cpu.per_exchange.as_micros() as u64;
            let waited = work.saturating_sub(per);
            let hold = if checked.is_some() {
                waited.min(cpu.slot_hold.as_micros() as u64)
            } else {
                0
            };
            let until = self.micros + work + hold;
            self.node(to).held.push(Held {
                until,
                _slot: slot,
                _stranger: stranger,
            });
        }
        let checked = checked.unwrap_or_default();
        let now = self.now();
        let (id, ip) = self.shared.ids[from];
        let caller = Caller { id: Some(id), ip };
        let reply = self.node(to).disc.on_request(caller, msg, checked, now);
        if !self.lost() {
            let d = self.delay() + work;
            let reply = Ok(Box::new(reply));
            self.schedule(
                d,
                Event::Reply {
                    to: from,
                    xid,
                    reply,
                    sent,
                },
            );
        }
        // The daemon's driver is woken by every request served (`api::discovery`).
        self.drain(to);
    }

    /// Node `i`'s requests out, each to its node after the link's latency.
    fn drain(&mut self, i: usize) {
        let now = self.now();
        for out in self.node(i).disc.poll(now) {
            let to = self
                .shared
                .index
                .get(&out.to.d.node_id)
                .copied()
                .filter(|to| !self.shared.crosses(i, *to));
            let d = self.delay();
            let Some(to) = to else {
                let reply = Err(Failed::Down);
                self.schedule(
                    d,
                    Event::Reply {
                        to: i,
                        xid: out.xid,
                        reply,
                        sent: self.micros,
                    },
                );
                continue;
            };
            if self.lost() {
                continue;
            }
            let (xid, msg) = (out.xid, Box::new(out.msg));
            self.schedule(
                d,
                Event::Request {
                    from: i,
                    to,
                    xid,
                    msg,
                    sent: self.micros,
                },
            );
        }
    }

    /// The descriptors of `msg` that node `i` screens in and that verify (once per distinct
    /// descriptor in the whole run), shared.
    /// `None` when nothing was worth a check (as the daemon's `gossip::check`).
    fn check(&mut self, i: usize, msg: &Msg) -> Option<Vec<Arc<Signed>>> {
        let now = self.now();
        let carried = verify::carried(msg);
        if carried.is_empty() {
            return None;
        }
        let node = &self.nodes[i - self.first];
        let worth = node.disc.screen(carried, now);
        if !worth.iter().any(|w| *w) {
            return None;
        }
        let only = node.only.as_ref();
        let mut out = Vec::new();
        for (d, w) in carried.iter().zip(worth) {
            if !w || only.is_some_and(|o| !o.contains(&d.node_id)) {
                continue;
            }
            match self.shared.memo.get(&(d.node_id, d.issued_at)) {
                Some(s) if s.d == *d => out.push(Arc::clone(s)),
                _ => out.extend(verify::check(std::slice::from_ref(d), &[], now.unix)),
            }
        }
        Some(out)
    }
}
