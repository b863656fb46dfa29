//! A simulated network for the discovery machine: many [`Discovery`] machines, the functions
//! the daemon drives, over in-memory links with latency, jitter and loss, on a virtual clock.
//! One event queue, one thread: a run is a function of its seed.
//!
//! What is simulated is only what is between the machines: a request reaches its node after
//! the link's latency (or is lost), a dead node's port refuses at once, a hung node never
//! answers (the asker's own timeout ends the exchange). Signatures are checked by the same
//! batch function as the daemon's, once per distinct descriptor (every node would reach the
//! same verdict: the check is a pure function of the descriptor and the time). A node's
//! `--peer` is modelled as the daemon's fetch of the peer's descriptor from its URL: it
//! succeeds when that node is up.
//!
//! Used by the discovery tests and by `examples/simulate.rs` (10 000 nodes).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Caller, Config, Discovery, Failed, Msg, Now, Signed, verify};
use crate::proto::NodeId;
use crate::proto::descriptor::Descriptor;

/// How the simulated network behaves.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// One way, before jitter.
    pub latency: Duration,
    /// Added to each message's latency, uniformly up to this.
    pub jitter: Duration,
    /// Share of messages lost (each way).
    pub loss: f64,
    /// Every node is polled at least this often.
    pub tick: Duration,
    /// The discovery interval (`--gossip-interval`).
    pub interval: Duration,
    /// Descriptor lifetime; reissued at half of it.
    pub lifetime: u64,
    /// The run's seed.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: Duration::from_millis(40),
            jitter: Duration::from_millis(20),
            loss: 0.0,
            tick: Duration::from_secs(1),
            interval: Duration::from_secs(60),
            lifetime: crate::proto::descriptor::DESCRIPTOR_TTL,
            seed: 1,
        }
    }
}

/// One simulated node.
#[derive(Debug)]
pub struct Node {
    /// Its machine.
    pub disc: Discovery,
    key: SigningKey,
    onion: [u8; 32],
    endpoint: String,
    /// Its endpoint's address.
    pub ip: IpAddr,
    /// Running: a dead node's port refuses.
    pub up: bool,
    /// Hung: it accepts and never answers.
    pub hung: bool,
    /// If set, the only identities it keeps (a liar's network).
    pub only: Option<Arc<HashSet<NodeId>>>,
}

impl Node {
    /// Its id.
    pub fn id(&self) -> NodeId {
        self.key.verifying_key().to_bytes()
    }
}

#[derive(Debug)]
enum Event {
    Poll(usize),
    Request {
        from: usize,
        to: usize,
        xid: u64,
        msg: Box<Msg>,
    },
    Reply {
        to: usize,
        xid: u64,
        reply: Result<Box<Msg>, Failed>,
    },
}

#[derive(Debug)]
struct Queued(u64, u64, Event);

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(o.0, o.1))
    }
}

/// The simulated network.
#[derive(Debug)]
pub struct Net {
    /// The nodes, by index.
    pub nodes: Vec<Node>,
    index: HashMap<NodeId, usize>,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    micros: u64,
    base: Instant,
    unix0: u64,
    cfg: SimConfig,
    rng: StdRng,
    memo: HashMap<(NodeId, u64), Arc<Signed>>,
    /// If set, the nodes on one side of a split: nothing crosses it.
    cut: Option<HashSet<usize>>,
    /// Events handled.
    pub events: u64,
}

impl Net {
    /// An empty network whose virtual clock starts at `base` (monotonic) and `unix0`.
    pub fn new(cfg: SimConfig, base: Instant, unix0: u64) -> Net {
        Net {
            nodes: Vec::new(),
            index: HashMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            micros: 0,
            base,
            unix0,
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            memo: HashMap::new(),
            cut: None,
            events: 0,
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Now {
        Now {
            at: self.base + Duration::from_micros(self.micros),
            unix: self.unix0 + self.micros / 1_000_000,
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_micros(self.micros)
    }

    /// The index of `id`.
    pub fn index_of(&self, id: &NodeId) -> Option<usize> {
        self.index.get(id).copied()
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
        let cfg = Config::for_interval(self.cfg.interval);
        let node = Node {
            disc: Discovery::new(id, cfg, self.rng.random()),
            key,
            onion,
            endpoint,
            ip,
            up: true,
            hung: false,
            only: None,
        };
        let i = self.nodes.len();
        self.nodes.push(node);
        self.index.insert(id, i);
        self.reissue(i);
        for p in peers {
            self.fetch(i, *p);
        }
        let jitter = self
            .rng
            .random_range(0..self.cfg.tick.as_micros().max(1) as u64);
        self.schedule(jitter, Event::Poll(i));
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
        if !self.nodes[p].up || self.nodes[p].hung || self.crosses(i, p) {
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
        self.memo.get(&(d.node_id, d.issued_at)).cloned()
    }

    /// Splits the network: nothing crosses between `side` and the other nodes until
    /// [`Net::heal`].
    pub fn split(&mut self, side: &[usize]) {
        self.cut = Some(side.iter().copied().collect());
    }

    /// Ends the split.
    pub fn heal(&mut self) {
        self.cut = None;
    }

    fn crosses(&self, a: usize, b: usize) -> bool {
        self.cut
            .as_ref()
            .is_some_and(|side| side.contains(&a) != side.contains(&b))
    }

    /// Kills node `i` (its port refuses from now on).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].up = false;
    }

    /// Starts node `i` again (its machine as it was: a process restarted with its state).
    pub fn revive(&mut self, i: usize) {
        self.nodes[i].up = true;
        self.reissue(i);
        self.schedule(0, Event::Poll(i));
    }

    /// Runs events until `until` (virtual time since the start) or until `done` says so
    /// (asked once per virtual second). True if `done` ended it.
    pub fn run_until(&mut self, until: Duration, mut done: impl FnMut(&Net) -> bool) -> bool {
        let end = until.as_micros() as u64;
        let mut next_check = self.micros;
        while let Some(Reverse(Queued(t, _, _))) = self.queue.peek() {
            let t = *t;
            if t > end {
                break;
            }
            self.micros = t;
            if self.micros >= next_check {
                next_check = self.micros + 1_000_000;
                if done(self) {
                    return true;
                }
            }
            let Some(Reverse(Queued(_, _, event))) = self.queue.pop() else {
                break;
            };
            self.handle(event);
        }
        self.micros = self.micros.max(end);
        done(self)
    }

    fn schedule(&mut self, after_us: u64, event: Event) {
        self.seq += 1;
        self.queue
            .push(Reverse(Queued(self.micros + after_us, self.seq, event)));
    }

    fn delay(&mut self) -> u64 {
        let jitter = self.cfg.jitter.as_micros() as u64;
        self.cfg.latency.as_micros() as u64
            + if jitter > 0 {
                self.rng.random_range(0..jitter)
            } else {
                0
            }
    }

    fn lost(&mut self) -> bool {
        self.cfg.loss > 0.0 && self.rng.random_bool(self.cfg.loss)
    }

    fn handle(&mut self, event: Event) {
        self.events += 1;
        match event {
            Event::Poll(i) => {
                if !self.nodes[i].up {
                    return;
                }
                self.reissue(i);
                self.drain(i);
                let tick = self.cfg.tick.as_micros() as u64;
                self.schedule(tick, Event::Poll(i));
            }
            Event::Request { from, to, xid, msg } => {
                let node = &self.nodes[to];
                if !node.up {
                    let d = self.delay();
                    self.schedule(
                        d,
                        Event::Reply {
                            to: from,
                            xid,
                            reply: Err(Failed),
                        },
                    );
                    return;
                }
                if node.hung {
                    return;
                }
                let checked = self.check(to, &msg);
                let now = self.now();
                let caller = Caller {
                    id: Some(self.nodes[from].id()),
                    ip: self.nodes[from].ip,
                };
                // Answering starts nothing: what it learned is probed at the node's next poll.
                let reply = self.nodes[to].disc.on_request(caller, &msg, checked, now);
                if !self.lost() {
                    let d = self.delay();
                    let reply = Ok(Box::new(reply));
                    self.schedule(
                        d,
                        Event::Reply {
                            to: from,
                            xid,
                            reply,
                        },
                    );
                }
            }
            Event::Reply { to, xid, reply } => {
                if !self.nodes[to].up {
                    return;
                }
                let checked = match &reply {
                    Ok(msg) => self.check(to, msg),
                    Err(_) => Vec::new(),
                };
                let now = self.now();
                let reply = reply.as_deref().map_err(|f| *f);
                self.nodes[to].disc.on_reply(xid, reply, checked, now);
                self.drain(to);
            }
        }
    }

    /// Node `i`'s requests out, each to its node after the link's latency.
    fn drain(&mut self, i: usize) {
        let now = self.now();
        for out in self.nodes[i].disc.poll(now) {
            let to = self
                .index_of(&out.to.d.node_id)
                .filter(|to| !self.crosses(i, *to));
            let Some(to) = to else {
                let d = self.delay();
                self.schedule(
                    d,
                    Event::Reply {
                        to: i,
                        xid: out.xid,
                        reply: Err(Failed),
                    },
                );
                continue;
            };
            if self.lost() {
                continue;
            }
            let d = self.delay();
            let msg = Box::new(out.msg);
            self.schedule(
                d,
                Event::Request {
                    from: i,
                    to,
                    xid: out.xid,
                    msg,
                },
            );
        }
    }

    /// The descriptors of `msg` that node `i` screens in and that verify (once per distinct
    /// descriptor in the whole run), shared.
    fn check(&mut self, i: usize, msg: &Msg) -> Vec<Arc<Signed>> {
        let now = self.now();
        let carried = verify::carried(msg);
        if carried.is_empty() {
            return Vec::new();
        }
        let worth = self.nodes[i].disc.screen(carried, now);
        let only = self.nodes[i].only.clone();
        let mut out = Vec::new();
        for (d, w) in carried.iter().zip(worth) {
            if !w || only.as_ref().is_some_and(|o| !o.contains(&d.node_id)) {
                continue;
            }
            match self.memo.get(&(d.node_id, d.issued_at)) {
                Some(s) if s.d == *d => out.push(Arc::clone(s)),
                _ => out.extend(verify::check(std::slice::from_ref(d), &[], now.unix)),
            }
        }
        out
    }

    /// Signs node `i`'s descriptor again when half its life is gone.
    fn reissue(&mut self, i: usize) {
        let now = self.now().unix;
        let stale = self.nodes[i]
            .current()
            .is_none_or(|d| now.saturating_sub(d.issued_at) >= self.cfg.lifetime / 2);
        if !stale {
            return;
        }
        let n = &self.nodes[i];
        let d = Descriptor::sign(&n.key, n.onion, n.endpoint.clone(), now, self.cfg.lifetime);
        let s = Arc::new(Signed::trusted(d));
        self.memo
            .insert((s.d.node_id, s.d.issued_at), Arc::clone(&s));
        self.nodes[i].disc.set_own(s);
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

    fn current(&self) -> Option<&Descriptor> {
        self.disc.own.as_ref().map(|o| &o.d)
    }
}
