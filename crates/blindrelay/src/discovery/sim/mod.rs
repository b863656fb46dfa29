//! A simulated network for the discovery machine: many [`Discovery`] machines, the functions
//! the daemon drives, over in-memory links with latency, jitter and loss, on a virtual clock.
//! The nodes are split into [`SimConfig::shards`] shards, each run by a thread with its own
//! event queue, in windows of the link's least latency (`shard`); within a window each shard
//! runs its nodes one after the other, each node's events in time order. A run follows its
//! seed but for the order of hash-map iteration (hashers are seeded at random per process):
//! two runs differ in a few events in ten thousand.
//!
//! What is simulated is only what is between the machines: a request reaches its node after
//! the link's latency (or is lost), a dead node's port refuses at once, a hung node never
//! answers (the asker's own timeout ends the exchange). Signatures are checked by the same
//! batch function as the daemon's, once per distinct descriptor (every node would reach the
//! same verdict: the check is a pure function of the descriptor and the time). A node's
//! `--peer` is modelled as the daemon's fetch of the peer's descriptor from its URL: it
//! succeeds when that node is up. Each node has a machine of its own, whose work takes no
//! time, unless [`SimConfig::cpu`] puts every node on one machine of a few cores ([`Cpu`]):
//! the real-process benchmark's case (`scripts/bench-network`).
//!
//! Used by the discovery tests and by `examples/simulate` (10 000 nodes).

mod shard;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use hashbrown::HashMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Config, Discovery, Now, Signed};
use crate::pipeline::crypto::Strangers;
use crate::proto::NodeId;
use guard::admission::Gate;
pub use shard::Node;
use shard::{Event, Queue, Shard, Shared};

/// How the simulated network behaves.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// One way, before jitter.
    pub latency: Duration,
    /// Added to each message's latency, uniformly up to this.
    pub jitter: Duration,
    /// Share of messages lost (each way).
    pub loss: f64,
    /// Every node is polled at least this often (and after each request it answered and each
    /// answer it got, as the daemon's driver is woken).
    pub tick: Duration,
    /// The discovery interval (`--gossip-interval`).
    pub interval: Duration,
    /// Descriptor lifetime; reissued at half of it.
    pub lifetime: u64,
    /// The run's seed.
    pub seed: u64,
    /// A node's first descriptor dated back by up to half its life, at random, so that the
    /// network's reissues are spread over time as in a network whose nodes started apart.
    pub stagger: bool,
    /// Threads the nodes are split over (1: one queue; more need a latency above zero and
    /// no shared [`Cpu`]).
    pub shards: usize,
    /// If set, one machine all the nodes share (see [`Cpu`]); none: each node its own.
    pub cpu: Option<Cpu>,
}

/// One machine all the nodes run on, as in the real-process benchmark (every node a process
/// of one host): an exchange takes `per_exchange` of one of `cores` cores at the node asked,
/// in the order requests arrive, before its answer leaves. Once a request has its core (the
/// daemon has read its handshake and head), the node admits it as the daemon does
/// (`crate::pipeline::crypto`: the crypto slots of a host of `cores` cores, a share of them
/// for strangers, one per stranger's block) or answers `429` (the work done all the same);
/// an admitted request holds its slot through its work, and one with descriptors to check as
/// long again as it waited for its core, at most `slot_hold` (the daemon's wait for its crypto
/// thread on a loaded host). A dead node refuses at once, for nothing.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    /// The machine's cores.
    pub cores: usize,
    /// The work of one exchange, both ends and the links' handshakes included.
    pub per_exchange: Duration,
    /// How long an admitted request with descriptors to check holds its crypto slot beyond its
    /// work, at most.
    pub slot_hold: Duration,
}

impl SimConfig {
    /// The threads a run of `nodes` nodes takes: one for links of no latency (no lookahead)
    /// or one shared machine (its cores serve requests in the order they come).
    pub fn shards_used(&self, nodes: usize) -> usize {
        if self.latency.is_zero() || self.cpu.is_some() {
            1
        } else {
            self.shards.clamp(1, nodes.max(1))
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: Duration::from_millis(40),
            jitter: Duration::from_millis(20),
            loss: 0.0,
            tick: crate::gossip::TICK,
            interval: Duration::from_secs(60),
            lifetime: crate::proto::descriptor::DESCRIPTOR_TTL,
            seed: 1,
            shards: 1,
            stagger: false,
            cpu: None,
        }
    }
}

/// The simulated network.
#[derive(Debug)]
pub struct Net {
    /// The nodes, by index.
    pub nodes: Vec<Node>,
    shared: Shared,
    /// One queue per shard; shard `k` runs the nodes from `bounds[k]` to the next bound.
    queues: Vec<Queue>,
    bounds: Vec<usize>,
    /// Events scheduled between runs, handed to the shards when a run starts.
    pending: Vec<(u64, Event)>,
    micros: u64,
    rng: StdRng,
    /// Events handled.
    pub events: u64,
    /// With a shared [`Cpu`]: when each core is free next (microseconds).
    cores: Vec<u64>,
    /// Exchanges answered or refused, and the time they took, summed (microseconds).
    timed: (u64, u64),
}

impl Net {
    /// An empty network whose virtual clock starts at `base` (monotonic) and `unix0`.
    pub fn new(cfg: SimConfig, base: Instant, unix0: u64) -> Net {
        Net {
            nodes: Vec::new(),
            shared: Shared {
                ids: Vec::new(),
                index: HashMap::new(),
                memo: HashMap::new(),
                cut: None,
                cfg,
                base,
                unix0,
            },
            queues: Vec::new(),
            bounds: Vec::new(),
            pending: Vec::new(),
            micros: 0,
            rng: StdRng::seed_from_u64(cfg.seed),
            events: 0,
            cores: vec![0; cfg.cpu.map_or(0, |c| c.cores.max(1))],
            timed: (0, 0),
        }
    }

    /// With a shared [`Cpu`]: true when none of its cores has work queued beyond now.
    pub fn machine_idle(&self) -> bool {
        self.cores.iter().all(|free| *free <= self.micros)
    }

    /// Exchanges answered or refused so far (lost ones apart), and the mean time they took.
    pub fn exchange_time(&self) -> (u64, Duration) {
        let (n, micros) = self.timed;
        (n, Duration::from_micros(micros / n.max(1)))
    }

    /// The virtual time.
    pub fn now(&self) -> Now {
        Now {
            at: self.shared.base + Duration::from_micros(self.micros),
            unix: self.shared.unix0 + self.micros / 1_000_000,
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_micros(self.micros)
    }

    /// The index of `id`.
    pub fn index_of(&self, id: &NodeId) -> Option<usize> {
        self.shared.index.get(id).copied()
    }

    /// A node at `ip` (its endpoint `https://ip:7001`), started now with `peers` as its
    /// `--peer`s (fetched if up). Its index.
    pub fn add(&mut self, ip: IpAddr, peers: &[usize]) -> usize {
        let seed: [u8; 32] = self.rng.random();
        let key = SigningKey::from_bytes(&seed);
        let onion =
            x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(seed)).to_bytes();
        let endpoint = match ip {
            IpAddr::V4(v4) => format!("https://{v4}:7001"),
            IpAddr::V6(v6) => format!("https://[{v6}]:7001"),
        };
        let id = key.verifying_key().to_bytes();
        let cfg = Config::for_interval(self.shared.cfg.interval);
        let node = Node {
            disc: Discovery::new(id, cfg, self.rng.random()),
            key,
            onion,
            endpoint,
            ip,
            up: true,
            hung: false,
            busy: false,
            only: None,
            admission: self.shared.cfg.cpu.map(|c| {
                let slots = crate::context::crypto_slots(c.cores);
                (Gate::new(slots), Strangers::new(slots))
            }),
            held: Vec::new(),
        };
        let i = self.nodes.len();
        self.nodes.push(node);
        self.shared.index.insert(id, i);
        self.shared.ids.push((id, ip));
        self.reissue(i);
        for p in peers {
            self.fetch(i, *p);
        }
        let tick = self.shared.cfg.tick.as_micros().max(1) as u64;
        let jitter = self.rng.random_range(0..tick);
        self.pending.push((self.micros + jitter, Event::Poll(i)));
        i
    }

    /// `n` nodes more, node `i` at `ip(i)` and started with one bootstrap peer among the nodes
    /// before it, at random.
    pub fn grow(&mut self, n: usize, ip: impl Fn(usize) -> IpAddr) {
        for i in 0..n {
            let before = self.nodes.len();
            let peers = if before == 0 {
                vec![]
            } else {
                vec![self.rng.random_range(0..before)]
            };
            self.add(ip(i), &peers);
        }
    }

    /// A random number below `n` from the run's generator.
    pub fn random_below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n.max(1))
    }

    /// Node `i` fetches node `p`'s descriptor as a `--peer` (if `p` is up).
    pub fn fetch(&mut self, i: usize, p: usize) {
        if !self.nodes[p].up || self.nodes[p].hung || self.shared.crosses(i, p) {
            return;
        }
        let now = self.now();
        if let Some(own) = self.own(p) {
            self.nodes[i].disc.operator(own, now);
        }
    }

    /// Node `i`'s current descriptor.
    pub fn own(&self, i: usize) -> Option<Arc<Signed>> {
        let d = self.nodes[i].current()?;
        self.shared.memo.get(&(d.node_id, d.issued_at)).cloned()
    }

    /// Splits the network: nothing crosses between `side` and the other nodes until
    /// [`Net::heal`].
    pub fn split(&mut self, side: &[usize]) {
        self.shared.cut = Some(side.iter().copied().collect());
    }

    /// Ends the split.
    pub fn heal(&mut self) {
        self.shared.cut = None;
    }

    /// Kills node `i` (its port refuses from now on).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].up = false;
    }

    /// Starts node `i` again (its machine as it was: a process restarted with its state).
    pub fn revive(&mut self, i: usize) {
        self.nodes[i].up = true;
        self.reissue(i);
        self.pending.push((self.micros, Event::Poll(i)));
    }

    /// Runs events until `until` (virtual time since the start) or until `done` says so
    /// (asked once per virtual second). True if `done` ended it.
    pub fn run_until(&mut self, until: Duration, done: impl FnMut(&Net) -> bool) -> bool {
        self.run_until_every(until, Duration::from_secs(1), done)
    }

    /// [`Net::run_until`], `done` asked every `step` of virtual time.
    pub fn run_until_every(
        &mut self,
        until: Duration,
        step: Duration,
        mut done: impl FnMut(&Net) -> bool,
    ) -> bool {
        let end = until.as_micros() as u64;
        let step = (step.as_micros() as u64).max(1);
        self.distribute();
        let lookahead = self.shared.cfg.latency.as_micros() as u64;
        // Windows of the least latency: the shards run them apart, each node by node (but
        // for a shared machine, whose cores serve requests in the order they come).
        let by_node = lookahead > 0 && self.shared.cfg.cpu.is_none();
        let mut next_check = self.micros;
        while let Some(t) = self.queues.iter_mut().filter_map(Queue::next_at).min() {
            if t > end {
                break;
            }
            self.micros = self.micros.max(t);
            if self.micros >= next_check {
                next_check = self.micros + step;
                if done(self) {
                    return true;
                }
            }
            let mut window_end = (end + 1).min(next_check);
            if by_node {
                window_end = window_end.min(t + lookahead);
            }
            self.window(window_end, by_node);
        }
        self.micros = self.micros.max(end);
        done(self)
    }

    /// Every event before `end`, each shard on its own thread; then what crossed between
    /// shards handed over.
    fn window(&mut self, end: u64, by_node: bool) {
        let Net {
            nodes,
            shared,
            queues,
            bounds,
            micros,
            cores,
            ..
        } = self;
        let mut cores = Some(cores);
        let mut shards = Vec::with_capacity(queues.len());
        let mut rest: &mut [Node] = nodes;
        for (k, queue) in queues.iter_mut().enumerate() {
            let upto = bounds.get(k + 1).copied().unwrap_or(usize::MAX);
            let (mine, after) = rest.split_at_mut(upto.saturating_sub(bounds[k]).min(rest.len()));
            rest = after;
            shards.push(Shard {
                nodes: mine,
                first: bounds[k],
                queue,
                shared,
                outbox: Vec::new(),
                signed: Vec::new(),
                micros: *micros,
                events: 0,
                exchanges_timed: 0,
                exchange_micros: 0,
                // One shard with a shared machine (`distribute`).
                cores: cores.take(),
            });
        }
        if let Some((first, others)) = shards.split_first_mut() {
            std::thread::scope(|scope| {
                for shard in others {
                    scope.spawn(move || shard.run(end, by_node));
                }
                first.run(end, by_node);
            });
        }
        let mut crossed = Vec::new();
        let mut signed = Vec::new();
        for shard in shards {
            self.events += shard.events;
            self.timed.0 += shard.exchanges_timed;
            self.timed.1 += shard.exchange_micros;
            crossed.extend(shard.outbox);
            signed.extend(shard.signed);
        }
        for s in signed {
            self.shared.memo.insert((s.d.node_id, s.d.issued_at), s);
        }
        for (at, event) in crossed {
            let k = self.shard_of(event.node());
            self.queues[k].push(at, event);
        }
    }

    fn shard_of(&self, i: usize) -> usize {
        self.bounds.partition_point(|b| *b <= i).saturating_sub(1)
    }

    /// Splits the nodes as they are now into the shards, and hands every event scheduled to
    /// the queue of its node's shard.
    fn distribute(&mut self) {
        let mut events: Vec<(u64, Event)> = std::mem::take(&mut self.pending);
        for q in &mut self.queues {
            events.extend(q.drain());
        }
        events.sort_by_key(|(t, _)| *t);
        let k = self.shared.cfg.shards_used(self.nodes.len());
        let n = self.nodes.len();
        self.bounds = (0..k).map(|j| j * n / k).collect();
        let now = self.micros;
        self.queues = (0..k).map(|_| Queue::new(self.rng.random(), now)).collect();
        for (at, event) in events {
            let j = self.shard_of(event.node());
            self.queues[j].push(at, event);
        }
    }

    /// Signs node `i`'s descriptor again when half its life is gone.
    fn reissue(&mut self, i: usize) {
        let (now, lifetime) = (self.now().unix, self.shared.cfg.lifetime);
        let fresh = self.nodes[i].current().is_none();
        let age = if fresh && self.shared.cfg.stagger {
            self.rng.random_range(0..(lifetime / 2).max(1))
        } else {
            0
        };
        if let Some(s) = self.nodes[i].reissue(now, lifetime, age) {
            self.shared.memo.insert((s.d.node_id, s.d.issued_at), s);
        }
    }
}

impl Node {
    /// A line on its probes (diagnosis).
    pub fn probe_state(&self) -> String {
        let d = &self.disc;
        let waiting: Vec<(usize, u8)> = d
            .view()
            .iter()
            .filter(|e| e.reached().is_none())
            .map(|e| (d.view().origin(e).class(), e.failures()))
            .collect();
        format!(
            "waiting {waiting:?} in flight {} probes {:?}",
            d.probes.in_flight(),
            d.probes.queued()
        )
    }
}
