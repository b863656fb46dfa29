//! Discovery: how a node comes to hold the whole network's descriptors, and keeps holding it,
//! as an I/O-free state machine. Inputs and the time go in (a request, a reply, a failed
//! exchange, `now`); messages to send come out ([`Discovery::poll`]). The daemon drives it
//! over its TLS links (`crate::gossip`); the simulator (`examples/simulate`) drives the same
//! functions over in-memory links with latency, loss and a virtual clock.
//!
//! What it does:
//! - **Reconciliation** ([`sync`]): a node that starts, or comes back, reconciles its view with
//!   a few sources (the operator's `--peer`s and seeds, peers from its store, from distinct /16s)
//!   by range-based set reconciliation (Negentropy, the `negentropy` crate): fingerprints of
//!   ranges of `(issued_at, node id)` until the differences are found, then the descriptors it
//!   lacks fetched in chunks. Every `sync_every` it reconciles with one peer more (anti-entropy).
//!   Each session is bounded in rounds, bytes and time.
//! - **Push** ([`push`]): a descriptor this node can pass on and did not hold before (a peer
//!   reached for the first time, a newer descriptor of a reached one, its own reissued) is
//!   announced once, newest per identity, to its neighbours at the next flush: an inventory of
//!   12-byte entries; the neighbour answers with what it lacks, which follows. Inbound pushes
//!   are charged per peer in bytes.
//! - **Reach** ([`probes`]): an identity enters the view waiting; it is routable and passed on
//!   only once this node reached it at its endpoint (a hello over the link pinned to its id).
//!   Waiting identities are probed fairly by source (the operator's, then those peers brought,
//!   then strangers' own, round robin within each), a few at a time; one that fails three
//!   tries is forgotten. A reached peer whose descriptor lapsed is kept aside and tried again,
//!   backing off to twice the interval, so the halves of a split rejoin however long it lasted.
//! - **Eclipse** ([`eclipse`]): every identity remembers the first-hand source (its /16) it came
//!   through, and is *confirmed* once a peer under another root holds it too. A view where
//!   almost everything came through one root, or where most of it is confirmed by no second
//!   root after several sources were asked, is reported (status, log), and the periodic
//!   reconciliation then prefers the operator's sources and peers under other roots.
//!
//! The view and its bounds are [`view`]; the messages [`wire`]; signatures are checked in
//! batches outside the machine ([`verify`]), after [`Discovery::screen`] dropped what is not
//! worth a check.

pub mod eclipse;
mod entry;
pub mod items;
pub mod probes;
pub mod push;
mod serve;
pub mod sim;
mod stats;
pub mod sync;
pub mod verify;
pub mod view;
pub mod wire;

use hashbrown::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;

pub use self::eclipse::{Eclipse, EclipseState};
pub use self::stats::Stats;
use self::view::{Admitted, Refused, View};
pub use self::wire::Msg;
use crate::blocks::{Grouping, block_key32};
use crate::proto::NodeId;
use crate::proto::descriptor::{self, Descriptor};

/// A descriptor whose signature and window were checked once, with its endpoint's address.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed {
    /// The descriptor.
    pub d: Descriptor,
    /// Its endpoint's address.
    pub ip: Option<IpAddr>,
}

impl Signed {
    /// Wraps `d` without checking it: for descriptors checked by the caller ([`verify`]), or
    /// this node's own.
    pub fn trusted(d: Descriptor) -> Signed {
        let ip = descriptor::parse_endpoint(&d.endpoint).ok().map(|a| a.ip());
        Signed { d, ip }
    }

    /// Its place in a reconciliation: `issued_at`, then the node id.
    pub fn key(&self) -> (u64, NodeId) {
        (self.d.issued_at, self.d.node_id)
    }
}

/// Who introduced an identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The operator: a `--peer` or a seed, fetched from its own URL.
    Operator,
    /// The peer store, at start.
    Store,
    /// A peer this node reached: its reconciliation answer or its push.
    Peer(NodeId),
    /// A stranger's own descriptor, by the /24 (/48) it connected from.
    Stranger(u64),
}

/// The blocks roots are counted in.
pub const ROOTS: Grouping = Grouping {
    v4_prefix: 16,
    v6_prefix: 32,
};

/// The time, twice: for timers, and as Unix seconds for descriptors.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic.
    pub at: Instant,
    /// Unix seconds.
    pub unix: u64,
}

/// Who sent a request: the node id its link proved (mutual TLS), and its address.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// The link's node id, if the caller presented one.
    pub id: Option<NodeId>,
    /// The address it connected from.
    pub ip: IpAddr,
}

/// How discovery paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The discovery interval: lapsed peers are greeted again at least every two of these,
    /// and one push neighbour is replaced every one.
    pub interval: Duration,
    /// One reconciliation with a peer this often (anti-entropy).
    pub sync_every: Duration,
    /// Pushes leave in batches this often.
    pub flush_every: Duration,
    /// Neighbours pushed to (and as many more that push to this node).
    pub fanout: usize,
    /// Sources reconciled with at start.
    pub start_syncs: usize,
    /// Reach probes in flight at most.
    pub probes_in_flight: usize,
    /// An exchange with no answer within this failed.
    pub exchange_timeout: Duration,
    /// Exchanges in flight at most: a request past it is not sent and comes back at once as
    /// [`Failed::Busy`] (the driver's slots: [`MAX_EXCHANGES`]).
    pub max_exchanges: usize,
    /// The view's bounds.
    pub limits: view::Limits,
}

impl Config {
    /// The pacing for a discovery interval (`--gossip-interval`): a reconciliation every
    /// [`SYNC_INTERVALS`] intervals, pushes every twelfth of one (at least 100 ms, at most
    /// 5 s).
    pub fn for_interval(interval: Duration) -> Config {
        Config {
            interval,
            sync_every: interval * SYNC_INTERVALS,
            flush_every: (interval / 12).clamp(Duration::from_millis(100), Duration::from_secs(5)),
            fanout: 3,
            start_syncs: 3,
            probes_in_flight: 16,
            exchange_timeout: Duration::from_secs(10),
            max_exchanges: MAX_EXCHANGES,
            limits: view::Limits::default(),
        }
    }
}

/// A request to send: `msg` to the node of `to` (at its endpoint, over the link pinned to its
/// id); its answer, or its failure, goes back in with `xid`.
#[derive(Debug, Clone)]
pub struct Out {
    /// The exchange.
    pub xid: u64,
    /// The node asked, and where.
    pub to: Arc<Signed>,
    /// The request.
    pub msg: Msg,
}

/// What the peer store kept of one identity beside its descriptor.
#[derive(Debug, Clone, Copy)]
pub struct Kept {
    /// When this node first kept it (Unix seconds).
    pub first_seen: u64,
    /// When this node last reached it.
    pub reached: Option<u64>,
    /// Its root (a block key, see `eclipse`) and whether a second root confirmed it; absent in
    /// stores written before, then rooted at its own endpoint.
    pub root: Option<(u32, bool)>,
}

/// An exchange that got no usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// No connection, a timeout, a refusal, bad bytes: counted against the peer.
    Down,
    /// The peer said it is busy (`429`), or this node had no room to send: asked again soon,
    /// backing off, and nothing counted against the peer ([`probes::BUSY_RETRY`]).
    Busy,
}

/// What an exchange in flight is for.
#[derive(Debug, Clone, Copy)]
enum Purpose {
    Probe(NodeId),
    Lapsed(NodeId),
    Sync(u64),
    Get(u64),
    Inv(NodeId),
    Push(NodeId),
}

/// The state machine. See the module docs.
#[derive(Debug)]
pub struct Discovery {
    me: NodeId,
    own: Option<Arc<Signed>>,
    cfg: Config,
    view: View,
    rng: StdRng,
    inflight: HashMap<u64, (Purpose, Instant)>,
    next_xid: u64,
    outbox: Vec<Out>,
    sync: sync::Syncs,
    push: push::Push,
    probes: probes::Probes,
    /// Strangers' introductions, per /24 (/48): when each budget is full again.
    strangers: HashMap<u64, Instant>,
    next_upkeep: Option<Instant>,
    /// The earliest deadline in flight (no scan before it).
    next_timeout: Option<Instant>,
    stats: Stats,
}

/// Strangers' own descriptors kept per /24 (/48): a burst of this many...
pub const STRANGER_BURST: u32 = 8;
/// ...then one per this.
pub const STRANGER_EVERY: Duration = Duration::from_secs(10);
/// Blocks whose strangers' budgets are remembered at most.
pub const STRANGER_BLOCKS: usize = 4096;
/// The blocks strangers are counted in.
pub const STRANGER_GROUPING: Grouping = view::BLOCKS;
/// Intervals between two periodic reconciliations (pushes carry what is fresh; this catches
/// what they missed).
pub const SYNC_INTERVALS: u32 = 5;
/// Exchanges in flight at most, by default ([`Config::max_exchanges`]).
pub const MAX_EXCHANGES: usize = 64;
/// The discovery interval by default (`--gossip-interval`): pushes every twelfth of it, a
/// reconciliation every [`SYNC_INTERVALS`] ([`Config::for_interval`]).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

impl Discovery {
    /// A machine for node `me` with `cfg`, its random choices drawn from `seed`.
    pub fn new(me: NodeId, cfg: Config, seed: u64) -> Self {
        Discovery {
            me,
            own: None,
            view: View::new(me, cfg.limits),
            cfg,
            rng: StdRng::seed_from_u64(seed),
            inflight: HashMap::new(),
            next_xid: 1,
            outbox: Vec::new(),
            sync: sync::Syncs::default(),
            push: push::Push::default(),
            probes: probes::Probes::default(),
            strangers: HashMap::new(),
            next_upkeep: None,
            next_timeout: None,
            stats: Stats::default(),
        }
    }

    /// This node's id.
    pub fn me(&self) -> &NodeId {
        &self.me
    }

    /// This node's descriptor from now on (a newer one is pushed).
    pub fn set_own(&mut self, own: Arc<Signed>) {
        let newer = self
            .own
            .as_ref()
            .is_none_or(|o| o.d.issued_at < own.d.issued_at);
        if newer {
            self.push.fresh(&own, None);
            self.own = Some(own);
        }
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The view, to change what this node learned outside discovery (a route's outcome).
    pub fn view_mut(&mut self) -> &mut View {
        &mut self.view
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// What eclipse detection says now.
    pub fn eclipse(&self) -> Eclipse {
        eclipse::assess(&self.view, self.sync.roots_synced())
    }

    /// Reached peers whose descriptors lapsed, greeted now and then.
    pub fn lapsed(&self) -> usize {
        self.probes.lapsed()
    }

    /// When a reconciliation last completed (Unix seconds).
    pub fn last_sync(&self) -> Option<u64> {
        self.sync.last_ok()
    }

    /// A descriptor the operator's `--peer` or seed served from its own URL (so reached).
    pub fn operator(&mut self, s: Arc<Signed>, now: Now) {
        let id = s.d.node_id;
        let fresh = self.learn(Arc::clone(&s), Source::Operator, now).is_ok();
        self.view.make_operator(&id);
        self.reached(&id, now);
        // A source the operator just added (or that came back): reconciled with at once.
        if fresh && self.sync.started() {
            self.begin(s, now);
        }
    }

    /// An entry of the peer store: kept through the same bounds as any newcomer, with when
    /// it was first seen and last reached. True if kept.
    pub fn restore(&mut self, s: Arc<Signed>, kept: Kept, now: Now) -> bool {
        let id = s.d.node_id;
        let Kept {
            first_seen,
            reached,
            root,
        } = kept;
        if self.learn(s, Source::Store, now).is_err() {
            return false;
        }
        if let Some((root, confirmed)) = root {
            self.view.reroot(&id, root, confirmed);
        }
        self.view.remember(&id, first_seen, None);
        if let Some(at) = reached {
            self.view.remember(&id, first_seen, Some(at));
        }
        true
    }

    /// The heap its state beside the view takes, estimated: `[sessions, push, probes, in
    /// flight]` (the simulator's measure of where memory goes).
    pub fn heap_bytes(&self) -> [usize; 4] {
        [
            self.sync.heap_bytes(),
            self.push.heap_bytes(),
            self.probes.heap_bytes(),
            self.inflight.capacity() * 41 + self.outbox.capacity() * 64,
        ]
    }

    /// This node reached `id` at its endpoint (a route or a probe through it delivered).
    pub fn reached(&mut self, id: &NodeId, now: Now) {
        if self.view.reached(id, now.unix) {
            self.stats.reached += 1;
            if let Some(e) = self.view.get(id) {
                let s = Arc::clone(&e.s);
                self.push.fresh(&s, None);
            }
        }
    }

    /// Which of `ds` are worth a signature check: current, not this node's, and not held as
    /// new or newer.
    pub fn screen(&self, ds: &[Descriptor], now: Now) -> Vec<bool> {
        ds.iter()
            .map(|d| {
                d.node_id != self.me
                    && d.is_current(now.unix)
                    && self
                        .view
                        .get(&d.node_id)
                        .is_none_or(|e| e.s.d.issued_at < d.issued_at)
            })
            .collect()
    }

    /// The answer to the exchange `xid` (its descriptors that verified in `checked`), or its
    /// failure. An exchange already given up (timed out) is ignored.
    pub fn on_reply(
        &mut self,
        xid: u64,
        reply: Result<&Msg, Failed>,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) {
        let Some((purpose, _)) = self.inflight.remove(&xid) else {
            return;
        };
        match reply {
            Ok(msg) => self.stats.count(msg, false),
            Err(Failed::Down) => self.stats.exchanges_failed += 1,
            Err(Failed::Busy) => self.stats.exchanges_busy += 1,
        }
        match purpose {
            Purpose::Probe(id) => self.probed(id, reply, checked, now),
            Purpose::Lapsed(id) => self.lapsed_answered(id, reply, checked, now),
            Purpose::Sync(sid) => self.sync_answered(sid, reply, checked, now),
            Purpose::Get(sid) => self.get_answered(sid, reply, checked, now),
            Purpose::Inv(to) => match reply {
                Ok(Msg::Want(shorts)) => {
                    let ds = push::wanted(&self.view, shorts);
                    if !ds.is_empty() {
                        self.request_to(&to, Msg::Descriptors(ds), Purpose::Push(to), now);
                    }
                }
                Ok(_) | Err(Failed::Busy) => {}
                Err(Failed::Down) => self.neighbour_failed(&to),
            },
            Purpose::Push(to) => {
                if reply == Err(Failed::Down) {
                    self.neighbour_failed(&to);
                }
            }
        }
    }

    /// What to send now: timeouts handled, reconciliations started, pushes flushed, probes
    /// and lapsed peers tried. Requests past [`Config::max_exchanges`] in flight are not
    /// returned: each comes back at once as [`Failed::Busy`] (what it asks for then waits for
    /// a later poll).
    pub fn poll(&mut self, now: Now) -> Vec<Out> {
        self.timeouts(now);
        if self.next_upkeep.is_none_or(|t| now.at >= t) {
            self.next_upkeep = Some(now.at + Duration::from_secs(1));
            self.upkeep(now);
        }
        self.start_syncs(now);
        self.flush(now);
        self.start_probes(now);
        let mut outs = std::mem::take(&mut self.outbox);
        let running = self.inflight.len().saturating_sub(outs.len());
        let room = self.cfg.max_exchanges.saturating_sub(running);
        if outs.len() > room {
            for out in outs.split_off(room) {
                self.stats.exchanges_deferred += 1;
                self.on_reply(out.xid, Err(Failed::Busy), Vec::new(), now);
            }
        }
        outs
    }

    /// An exchange with no answer within this failed.
    pub fn exchange_timeout(&self) -> Duration {
        self.cfg.exchange_timeout
    }

    /// Exchanges in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    fn timeouts(&mut self, now: Now) {
        if self.next_timeout.is_some_and(|t| now.at < t) {
            return;
        }
        self.next_timeout = self.inflight.values().map(|(_, d)| *d).min();
        let late: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (_, deadline))| now.at >= *deadline)
            .map(|(xid, _)| *xid)
            .collect();
        for xid in late {
            self.on_reply(xid, Err(Failed::Down), Vec::new(), now);
        }
    }

    /// Once a second: expired descriptors set aside (reached ones as lapsed), budgets swept.
    fn upkeep(&mut self, now: Now) {
        for e in self.view.take_expired(now.unix) {
            if e.reached().is_some() {
                self.probes.lapse(e, now, &self.cfg);
            }
        }
        self.strangers.retain(|_, full_at| *full_at > now.at);
        shrink(&mut self.strangers);
        shrink(&mut self.inflight);
        self.push.sweep(now);
        self.probes.sweep();
    }

    /// Sends `msg` to the held identity `to`.
    fn request_to(&mut self, to: &NodeId, msg: Msg, purpose: Purpose, now: Now) -> bool {
        let Some(s) = self.view.get(to).map(|e| Arc::clone(&e.s)) else {
            return false;
        };
        self.request(s, msg, purpose, now);
        true
    }

    fn request(&mut self, to: Arc<Signed>, msg: Msg, purpose: Purpose, now: Now) {
        let xid = self.next_xid;
        self.next_xid += 1;
        self.stats.exchanges += 1;
        self.stats.count(&msg, true);
        let deadline = now.at + self.cfg.exchange_timeout;
        self.inflight.insert(xid, (purpose, deadline));
        self.next_timeout = Some(self.next_timeout.map_or(deadline, |t| t.min(deadline)));
        self.outbox.push(Out { xid, to, msg });
    }

    /// Keeps `s` from `origin` through the view's bounds; a new identity waits to be probed, a
    /// newer descriptor of a reached one is pushed.
    fn learn(&mut self, s: Arc<Signed>, origin: Source, now: Now) -> Result<Admitted, Refused> {
        let root = match origin {
            Source::Peer(p) => self.view.get(&p).map(|e| self.view.root(e)),
            _ => None,
        }
        .or_else(|| s.ip.map(|ip| block_key32(ip, ROOTS)))
        .unwrap_or(0);
        let from = match origin {
            Source::Peer(p) => Some(p),
            _ => None,
        };
        let admitted = self.view.admit(Arc::clone(&s), origin, root, now.unix);
        match admitted {
            Ok(Admitted::New(_)) => {
                self.stats.learned += 1;
                if let Some(first_seen) = self.probes.returned(&s.d.node_id) {
                    self.view.remember(&s.d.node_id, first_seen, None);
                }
                self.probes.waiting(&s, origin.into());
            }
            Ok(Admitted::Newer(reached)) => {
                self.stats.learned += 1;
                if reached {
                    self.push.fresh(&s, from);
                }
            }
            Err(Refused::Held | Refused::Own) => {}
            Err(_) => self.stats.refused += 1,
        }
        admitted
    }

    fn neighbour_failed(&mut self, id: &NodeId) {
        self.view.failed(id);
        self.push.drop_neighbour(id);
    }
}

/// Gives back a map's room when it holds a quarter of it or less: the bursts of a start (a
/// whole network pending, asked for, probed) leave nothing behind in 10 000 machines.
pub(crate) fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 <= map.capacity() {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests;
