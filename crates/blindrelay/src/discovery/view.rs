//! The view: every descriptor this node holds, what it knows of each peer, and the bounds
//! that keep strangers from filling it. No I/O, no clock: the caller hands in `now`.
//!
//! - **Bounded**: at most [`Limits::capacity`] identities ([`CAPACITY`] by default: a whole
//!   network of that size; the bytes per identity are measured in `docs/blindrelay.md`). When
//!   full, a newcomer takes the place of, in this order: an expired descriptor; an identity
//!   this node never reached, from the source holding the most such (then the one that failed
//!   most); a reached peer that is failing now, the one reached longest ago. A peer this node
//!   reached and that answers is never evicted for a newcomer: long-known healthy peers stay.
//! - **Reached before passed on**: an identity is routable, and passed on to others, only once
//!   this node reached it at its endpoint ([`View::reached`]); until then it waits, counted
//!   against the source that introduced it, probed in turn (`super::probes`), and is the first
//!   to go.
//! - **Per source**: at most [`Limits::waiting_per_source`] identities never reached from one
//!   source at a time (more than a whole 10 000-node network, so an honest peer's full answer
//!   fits; a party with many identities still fills nothing that a newcomer cannot take back).
//! - **Per endpoint block**: at most [`Limits::per_block`] identities whose endpoints share a
//!   block (/24, /48). At the bound, a newcomer brought by the operator or by a peer this node
//!   reached takes the place of the block's identity never reached that failed most; never a
//!   reached one. So identities naming endpoints in someone else's block cannot keep that
//!   block's real nodes out for longer than their probes take to fail.
//! - **One way in**: a descriptor from any source (a reconciliation, a push, a stranger's own,
//!   the peer store at start, the operator's `--peer` and seeds) goes through [`View::admit`]
//!   with the same bounds; only the operator's own are exempt from the block bound.
//! - **Refreshing is no reset**: a newer descriptor of a held identity keeps what this node
//!   knows of it (first seen, reached, failures), so re-signing junk buys nothing.
//!
//! An entry is 32 bytes and points to the descriptor, shared with every other holder of the
//! same `Arc`; the table is keyed by the first 8 bytes of the node id (an inventory's short
//! form finds it without a second index), hashed with a per-process random seed (foldhash,
//! hashbrown's default).

use std::collections::BTreeMap;

use hashbrown::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};

mod evict;
mod roots;

use super::entry::secs;
pub use super::entry::{Entry, Origin};
use super::items::{Items, Snapshot};
use super::wire::{Short, short};
use super::{Signed, Source};
use crate::blocks::{Grouping, block_key32};
use crate::proto::NodeId;

/// The blocks whose identities are bounded.
pub const BLOCKS: Grouping = Grouping {
    v4_prefix: 24,
    v6_prefix: 48,
};

/// Identities held at most by default.
pub const CAPACITY: usize = 100_000;
/// Identities per endpoint block by default.
pub const PER_BLOCK: u16 = 16;
/// Identities never reached per source by default.
pub const WAITING_PER_SOURCE: u32 = 16_384;

/// The bounds of a view.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Identities held at most.
    pub capacity: usize,
    /// Identities per endpoint block at most (the operator's own not counted).
    pub per_block: u16,
    /// Identities never reached from one source at most.
    pub waiting_per_source: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            capacity: CAPACITY,
            per_block: PER_BLOCK,
            waiting_per_source: WAITING_PER_SOURCE,
        }
    }
}

/// Why a descriptor was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The view holds this identity's descriptor, as new or newer.
    Held,
    /// Its endpoint's block holds [`Limits::per_block`] identities.
    Block,
    /// Its source already has [`Limits::waiting_per_source`] identities waiting.
    Source,
    /// The view is full of peers this node reached and that answer.
    Full,
    /// This node's own identity.
    Own,
}

/// What [`View::admit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// A new identity, waiting to be reached; the identity evicted to make room, if any.
    New(Option<NodeId>),
    /// A newer descriptor of a held identity; true when this node reached it before (the
    /// newer one is passed on at once).
    Newer(bool),
}

/// Identities under one root.
#[derive(Debug, Clone, Copy, Default)]
struct RootStat {
    entries: u32,
    unconfirmed: u32,
}

/// Held and never-reached identities of one endpoint block.
#[derive(Debug, Clone, Copy, Default)]
struct BlockCount {
    held: u16,
    waiting: u16,
}

/// Counts for eclipse detection (see `super::eclipse`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RootCounts {
    /// Identities held.
    pub held: usize,
    /// Distinct roots (sources first-hand) among them.
    pub roots: usize,
    /// Identities confirmed by no second root.
    pub unconfirmed: usize,
    /// Of those, the most under one root.
    pub top_unconfirmed: usize,
    /// That root (a /16's block key).
    pub top: Option<u32>,
}

/// The view. See the module docs.
#[derive(Debug)]
pub struct View {
    limits: Limits,
    me: NodeId,
    hasher: DefaultHashBuilder,
    table: HashTable<Entry>,
    /// Every held descriptor: what this node reconciles as the initiator.
    all: Items,
    /// The descriptors of reached identities: what this node serves as the responder.
    passable: Items,
    /// Descriptors by expiry (the minute they expire in); replaced ones skipped when due.
    expiry: BTreeMap<u64, Vec<Arc<Signed>>>,
    blocks: HashMap<u32, BlockCount>,
    /// Identities never reached per source (only while some are).
    waiting_from: HashMap<Origin, u32>,
    /// Identities per root.
    roots: HashMap<u32, RootStat>,
    /// Identities a full view evicts next, worst last (checked again when taken).
    victims: Vec<NodeId>,
    waiting: usize,
}

impl View {
    /// An empty view of node `me` with `limits`.
    pub fn new(me: NodeId, limits: Limits) -> Self {
        View {
            limits,
            me,
            hasher: DefaultHashBuilder::default(),
            table: HashTable::new(),
            all: Items::default(),
            passable: Items::default(),
            expiry: BTreeMap::new(),
            blocks: HashMap::new(),
            waiting_from: HashMap::new(),
            roots: HashMap::new(),
            victims: Vec::new(),
            waiting: 0,
        }
    }

    fn hash(&self, s: &Short) -> u64 {
        self.hasher.hash_one(s)
    }

    /// The node whose view this is.
    pub fn me(&self) -> &NodeId {
        &self.me
    }

    /// Identities held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Identities held that this node never reached.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What the view knows of `id`.
    pub fn get(&self, id: &NodeId) -> Option<&Entry> {
        self.table.find(self.hash(&short(id)), |e| e.id() == id)
    }

    fn get_mut(&mut self, id: &NodeId) -> Option<&mut Entry> {
        let h = self.hash(&short(id));
        self.table.find_mut(h, |e| e.id() == id)
    }

    /// The entries whose node id starts with `s` (one, but for a forged collision).
    pub fn by_short(&self, s: &Short) -> impl Iterator<Item = &Entry> {
        let s = *s;
        self.table
            .iter_hash(self.hash(&s))
            .filter(move |e| e.id()[..s.len()] == s)
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.table.iter()
    }

    /// The source that introduced `e`.
    pub fn origin(&self, e: &Entry) -> Origin {
        e.origin
    }

    /// The root of `e`: the /16 of the first-hand source it came through (see
    /// `super::eclipse`).
    pub fn root(&self, e: &Entry) -> u32 {
        e.root
    }

    /// Identities never reached that `source` introduced.
    pub fn waiting_from(&self, source: Origin) -> u32 {
        self.waiting_from.get(&source).copied().unwrap_or(0)
    }

    /// Every held descriptor, sorted (the initiator's set).
    pub fn all(&mut self) -> Snapshot {
        self.all.snapshot()
    }

    /// The descriptors of reached identities, sorted (what this node passes on).
    pub fn passable(&mut self) -> Snapshot {
        self.passable.snapshot()
    }

    /// The reached identities as last merged (changes since not in it): to draw from at
    /// random without a merge each time.
    pub fn passable_as_merged(&self) -> Snapshot {
        self.passable.as_merged()
    }

    /// Keeps `s` (verified by the caller, current at `now`) as introduced by `origin`, rooted
    /// at `root`: a new identity within the bounds (evicting per the module docs when full), or
    /// a newer descriptor of a held one (what is known of it kept).
    ///
    /// # Errors
    /// [`Refused`].
    pub fn admit(
        &mut self,
        s: Arc<Signed>,
        origin: Source,
        root: u32,
        now: u64,
    ) -> Result<Admitted, Refused> {
        let origin = Origin::from(origin);
        let id = s.d.node_id;
        if id == self.me {
            return Err(Refused::Own);
        }
        if let Some(e) = self.get(&id) {
            if e.s.d.issued_at >= s.d.issued_at {
                return Err(Refused::Held);
            }
            let reached = e.reached > 0;
            self.replace(s);
            return Ok(Admitted::Newer(reached));
        }
        let operator = origin.is_operator();
        if !operator && self.waiting_from(origin) >= self.limits.waiting_per_source {
            return Err(Refused::Source);
        }
        let mut evicted = None;
        if let Some(b) = s.ip.map(|ip| block_key32(ip, BLOCKS))
            && !operator
        {
            let count = self.blocks.get(&b).copied().unwrap_or_default();
            if count.held >= self.limits.per_block {
                let junk = (origin.may_evict() && count.waiting > 0)
                    .then(|| self.junk_in_block(b))
                    .flatten()
                    .ok_or(Refused::Block)?;
                self.remove(&junk);
                evicted = Some(junk);
            }
        }
        if self.table.len() >= self.limits.capacity {
            let victim = self.victim(now).ok_or(Refused::Full)?;
            self.remove(&victim);
            evicted = evicted.or(Some(victim));
        }
        self.insert(Entry {
            s,
            first_seen: secs(now),
            reached: 0,
            origin,
            root,
            failures: 0,
            confirmed: false,
        });
        Ok(Admitted::New(evicted))
    }

    /// Sets what the peer store remembered of `id`: when this node first kept it and last
    /// reached it.
    pub fn remember(&mut self, id: &NodeId, first_seen: u64, reached: Option<u64>) {
        if let Some(e) = self.get_mut(id) {
            e.first_seen = e.first_seen.min(secs(first_seen));
        }
        if let Some(at) = reached {
            self.reached(id, at);
        }
    }
    /// `id` is the operator's from now on (a `--peer` or seed served it): no longer counted
    /// against its block or its source.
    pub fn make_operator(&mut self, id: &NodeId) {
        let Some(e) = self.get_mut(id) else {
            return;
        };
        if e.origin.is_operator() {
            return;
        }
        let (origin, waiting, b) = (
            e.origin,
            e.reached == 0,
            e.s.ip.map(|i| block_key32(i, BLOCKS)),
        );
        e.origin = Origin::OPERATOR;
        self.count_block(b, -1, waiting);
        if waiting {
            Self::count(&mut self.waiting_from, origin, false);
            Self::count(&mut self.waiting_from, Origin::OPERATOR, true);
        }
    }

    /// This node reached `id` at its endpoint at `now`: routable and passed on from now on,
    /// failures forgotten. True the first time.
    pub fn reached(&mut self, id: &NodeId, now: u64) -> bool {
        let Some(e) = self.get_mut(id) else {
            return false;
        };
        let first = e.reached == 0;
        e.reached = e.reached.max(secs(now)).max(1);
        e.failures = 0;
        if first {
            let (origin, s) = (e.origin, Arc::clone(&e.s));
            Self::count(&mut self.waiting_from, origin, false);
            self.waiting -= 1;
            if let Some(b) = s.ip.map(|ip| block_key32(ip, BLOCKS))
                && let Some(c) = self.blocks.get_mut(&b)
            {
                c.waiting = c.waiting.saturating_sub(1);
            }
            self.passable.add(&s);
        }
        first
    }

    /// A contact with `id` failed; its failures since the last success.
    pub fn failed(&mut self, id: &NodeId) -> u8 {
        self.get_mut(id).map_or(0, |e| {
            e.failures = e.failures.saturating_add(1);
            e.failures
        })
    }

    /// Drops `id` (an identity that failed every try, or one the operator removed).
    pub fn forget(&mut self, id: &NodeId) -> Option<Entry> {
        self.remove(id)
    }

    /// The entries whose descriptors expired by `now`, taken out of the view.
    pub fn take_expired(&mut self, now: u64) -> Vec<Entry> {
        let mut gone = Vec::new();
        while let Some(first) = self.expiry.first_entry() {
            if *first.key() > now / 60 {
                break;
            }
            for s in first.remove() {
                let current = self
                    .get(&s.d.node_id)
                    .is_some_and(|e| Arc::ptr_eq(&e.s, &s));
                if !current {
                    continue;
                }
                if s.d.is_current(now) {
                    // Due later in its minute: back in the list.
                    self.expiry.entry(now / 60 + 1).or_default().push(s);
                } else if let Some(e) = self.remove(&s.d.node_id) {
                    gone.push(e);
                }
            }
        }
        gone
    }
    /// The heap this view takes by structure (table, the two sorted lists, the expiry index,
    /// blocks, roots), estimated from capacities; the descriptors themselves, shared, apart.
    pub fn heap_bytes(&self) -> [usize; 6] {
        use std::mem::size_of;
        let map = |cap: usize, each: usize| cap * (each + 1);
        let expiry: usize = self
            .expiry
            .values()
            .map(|v| v.capacity() * size_of::<Arc<Signed>>() + 48)
            .sum();
        [
            map(self.table.capacity(), size_of::<Entry>()),
            self.all.heap_bytes(),
            self.passable.heap_bytes(),
            expiry,
            map(self.blocks.capacity(), 4 + size_of::<BlockCount>()),
            map(self.roots.capacity(), 4 + size_of::<RootStat>()),
        ]
    }
    fn replace(&mut self, s: Arc<Signed>) {
        let id = s.d.node_id;
        let h = self.hash(&short(&id));
        let Some(e) = self.table.find_mut(h, |e| e.id() == &id) else {
            return;
        };
        let old = std::mem::replace(&mut e.s, Arc::clone(&s));
        let (reached, counted) = (e.reached > 0, !e.origin.is_operator());
        self.all.remove(&old);
        self.all.add(&s);
        if reached {
            self.passable.remove(&old);
            self.passable.add(&s);
        }
        self.schedule_expiry(&s);
        let (old_b, new_b) = (
            old.ip.map(|i| block_key32(i, BLOCKS)),
            s.ip.map(|i| block_key32(i, BLOCKS)),
        );
        if counted && old_b != new_b {
            self.count_block(old_b, -1, !reached);
            self.count_block(new_b, 1, !reached);
        }
    }

    fn schedule_expiry(&mut self, s: &Arc<Signed>) {
        self.expiry
            .entry(s.d.expires_at / 60)
            .or_default()
            .push(Arc::clone(s));
    }

    fn count_block(&mut self, b: Option<u32>, by: i32, waiting: bool) {
        let Some(b) = b else {
            return;
        };
        let c = self.blocks.entry(b).or_default();
        let step = |n: u16| {
            if by > 0 {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        c.held = step(c.held);
        if waiting {
            c.waiting = step(c.waiting);
        }
        if c.held == 0 {
            self.blocks.remove(&b);
        }
    }

    /// One more (`up`) or one less in `map`'s count for `key`, kept only while not zero.
    fn count<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K, up: bool) {
        if up {
            *map.entry(key).or_default() += 1;
        } else if let Some(n) = map.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&key);
            }
        }
    }

    fn insert(&mut self, e: Entry) {
        if !e.origin.is_operator() {
            self.count_block(e.s.ip.map(|i| block_key32(i, BLOCKS)), 1, true);
        }
        Self::count(&mut self.waiting_from, e.origin, true);
        let r = self.roots.entry(e.root).or_default();
        r.entries += 1;
        r.unconfirmed += 1;
        self.waiting += 1;
        self.all.add(&e.s);
        self.schedule_expiry(&e.s);
        let h = self.hash(&short(e.id()));
        let hasher = &self.hasher;
        self.table
            .insert_unique(h, e, |x| hasher.hash_one(short(x.id())));
    }

    fn remove(&mut self, id: &NodeId) -> Option<Entry> {
        let h = self.hash(&short(id));
        let (e, _) = self.table.find_entry(h, |e| e.id() == id).ok()?.remove();
        let waiting = e.reached == 0;
        if !e.origin.is_operator() {
            self.count_block(e.s.ip.map(|i| block_key32(i, BLOCKS)), -1, waiting);
        }
        if waiting {
            Self::count(&mut self.waiting_from, e.origin, false);
            self.waiting -= 1;
        } else {
            self.passable.remove(&e.s);
        }
        if let Some(r) = self.roots.get_mut(&e.root) {
            r.entries = r.entries.saturating_sub(1);
            if !e.confirmed {
                r.unconfirmed = r.unconfirmed.saturating_sub(1);
            }
            if r.entries == 0 {
                self.roots.remove(&e.root);
            }
        }
        self.all.remove(&e.s);
        Some(e)
    }
}
