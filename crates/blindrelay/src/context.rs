//! The node's shared context: what the inbound pipeline and the outbound side (client sends,
//! probes) both use. Outbound code depends on this, never on the pipeline, so it runs and is
//! tested without a replay registry, an inbox or a listener.
//!
//! The crypto gate is the design's crypto admission budget: signature checks, onion layers and
//! receipt signing take a slot. Inbound requests may use all but one slot and never wait for
//! one (the pipeline's crypto stage, [`Crypto::try_slot`]); outbound work (route building,
//! receipt checking: the node's own sends) may use them all, so it proceeds under an inbound
//! burst, and waits for a slot at most the crypto wait (`--crypto-wait`,
//! [`DEFAULT_CRYPTO_WAIT`]), woken as soon as a slot is given back; then it is refused. Disk
//! work never holds a slot.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use guard::admission::{Gate, Permit};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::counters::Counters;
use crate::forward::{self, NextHopSlots};
use crate::health::Health;
use crate::links::{LinkLimits, Links};
use crate::node::Node;
use crate::outbound::{HopRate, Pacer, QueueLimits};
use crate::peers::Peers;

/// Crypto slots for a host with `threads` CPU threads: half of them rounded up, at least 4, at
/// most 8.
pub fn crypto_slots(threads: usize) -> usize {
    threads.div_ceil(2).clamp(4, 8)
}

/// The async runtime's worker threads for a host with `threads` CPU threads: the half the
/// crypto slots leave (the slots take half of them rounded up), at least one. The workers read,
/// refuse and answer requests; the cryptography runs on the slots' blocking threads.
pub fn runtime_workers(threads: usize) -> usize {
    (threads / 2).max(1)
}

/// Runtime workers for this host.
pub fn default_runtime_workers() -> usize {
    runtime_workers(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How long the node's own send may wait for a crypto slot by default before it is refused.
pub const DEFAULT_CRYPTO_WAIT: Duration = Duration::from_millis(50);

/// Crypto slots for this host.
pub fn default_crypto_slots() -> usize {
    crypto_slots(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// What the node's inbound and outbound work share, process-wide: who it is, whom it knows,
/// time, what it counts, and two services: the crypto gate and the way out to other nodes.
#[derive(Debug)]
pub struct Context {
    /// Identity and keys.
    pub node: Arc<Node>,
    /// Known peers.
    pub peers: Arc<Peers>,
    /// Time.
    pub clock: Clock,
    /// Aggregate counters.
    pub counters: Counters,
    /// Per-peer health.
    pub health: Health,
    /// The crypto slots, shared by inbound and outbound work.
    pub crypto: Crypto,
    /// The way out: links to other nodes, their pacing and the rules of the routes built here.
    pub outgoing: Outgoing,
    /// The node's tasks, waited for at shutdown ([`Context::tasks`]).
    tasks: TaskTracker,
}

/// The crypto gate (module docs): slots taken at once by inbound work, waited for (a bounded
/// time) by outbound work.
#[derive(Debug)]
pub struct Crypto {
    gate: Gate,
    /// Woken whenever a slot is given back.
    freed: Arc<Notify>,
    /// See [`ContextConfig::crypto_on_reactor`].
    on_reactor: bool,
    /// How long the node's own work may wait for a slot.
    wait: Duration,
    clock: Clock,
}

/// What this node's requests to other nodes go through.
#[derive(Debug)]
pub struct Outgoing {
    /// The TLS links to other nodes (next hops, descriptor fetches, discovery).
    pub links: Links,
    /// Every request to a next hop waits its turn here, under the previous-hop rate this node
    /// enforces and assumes of its peers ([`Pacer::rate`]).
    pub pacer: Arc<Pacer>,
    /// Requests in flight per next hop.
    pub next_hops: NextHopSlots,
    /// No two hops of a route this node builds in one /16 (IPv4) or /32 (IPv6)
    /// (`crate::send::path`); off only with `--same-subnet-paths`.
    pub distinct_blocks: bool,
}

/// The settings of a [`Context`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextConfig {
    /// Crypto slots in all.
    pub crypto_slots: usize,
    /// How long the node's own send may wait for a crypto slot.
    pub crypto_wait: Duration,
    /// Requests in flight per next hop.
    pub per_next_hop: usize,
    /// The previous-hop rate, enforced and assumed of peers.
    pub hop_rate: HopRate,
    /// The outbound queue's bounds.
    pub queue: QueueLimits,
    /// The address outgoing connections are made from (the listen address, so peers know the
    /// node by its descriptor's endpoint), if any.
    pub bind: Option<IpAddr>,
    /// No two hops of a route in one address block ([`Context::distinct_blocks`]).
    pub distinct_blocks: bool,
    /// Measuring only (`--crypto-on-reactor`): the cryptography runs on the runtime's workers,
    /// not on blocking threads ([`on_crypto_slot_then`]).
    pub crypto_on_reactor: bool,
}

impl ContextConfig {
    /// The defaults for `crypto_slots` slots.
    pub fn new(crypto_slots: usize) -> Self {
        ContextConfig {
            crypto_slots,
            crypto_wait: DEFAULT_CRYPTO_WAIT,
            per_next_hop: forward::PER_NEXT_HOP,
            hop_rate: HopRate::default(),
            queue: QueueLimits::default(),
            bind: None,
            distinct_blocks: true,
            crypto_on_reactor: false,
        }
    }
}

/// A crypto slot: given back on drop, which wakes the requests waiting for one.
#[derive(Debug)]
pub struct CryptoSlot {
    permit: Option<Permit>,
    freed: Arc<Notify>,
    /// Its work runs where it was asked for ([`ContextConfig::crypto_on_reactor`]).
    on_reactor: bool,
}

impl Drop for CryptoSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.freed.notify_waiters();
    }
}

impl Context {
    /// A context with `crypto_slots` slots in all and the other defaults.
    pub fn new(node: Arc<Node>, peers: Arc<Peers>, clock: Clock, crypto_slots: usize) -> Self {
        Self::with_config(node, peers, clock, ContextConfig::new(crypto_slots))
    }

    /// A context with `config`.
    pub fn with_config(
        node: Arc<Node>,
        peers: Arc<Peers>,
        clock: Clock,
        config: ContextConfig,
    ) -> Self {
        let links = Links::new(
            config.bind,
            peers.identity_counter(),
            LinkLimits {
                idle_per_peer: config.per_next_hop,
                clients: crate::links::MAX_CLIENTS,
            },
            Some(node.signing_key()),
        );
        Context {
            node,
            peers,
            clock,
            counters: Counters::default(),
            health: Health::default(),
            crypto: Crypto {
                gate: Gate::new(config.crypto_slots),
                freed: Arc::new(Notify::new()),
                on_reactor: config.crypto_on_reactor,
                wait: config.crypto_wait,
                clock,
            },
            outgoing: Outgoing {
                links,
                pacer: Pacer::new(config.hop_rate, config.queue),
                next_hops: NextHopSlots::new(config.per_next_hop),
                distinct_blocks: config.distinct_blocks,
            },
            tasks: TaskTracker::new(),
        }
    }

    /// The node's tasks: its background tasks and the requests it runs to their end; shutdown
    /// waits for them all (each bounded by its deadline or the node's cancellation).
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }
}

impl Crypto {
    /// Slots in all.
    pub fn limit(&self) -> usize {
        self.gate.limit()
    }

    /// A slot's permit outside the gate's accounting of who waits: for tests that hold slots.
    pub fn try_acquire(&self) -> Option<Permit> {
        self.gate.try_acquire()
    }

    /// A slot if fewer than `below` are in use now; never waits.
    pub fn try_slot(&self, below: usize) -> Option<CryptoSlot> {
        self.gate.try_acquire_below(below).map(|permit| CryptoSlot {
            permit: Some(permit),
            freed: Arc::clone(&self.freed),
            on_reactor: self.on_reactor,
        })
    }

    /// A slot of all of them for this node's own work, waiting at most the crypto wait
    /// (`--crypto-wait`) for one.
    pub async fn slot(&self) -> Option<CryptoSlot> {
        self.slot_below(self.limit(), self.wait).await
    }

    /// A slot while fewer than `below` are in use, waiting at most `wait` for one.
    pub async fn slot_below(&self, below: usize, wait: Duration) -> Option<CryptoSlot> {
        let deadline = self.clock.now() + wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.try_slot(below) {
                return Some(slot);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }
}

/// How much lower than the process's own priority (nice value) a thread runs once it has done
/// crypto work.
pub const CRYPTO_NICE: i32 = 5;

std::thread_local! {
    static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Lowers the calling thread's priority by [`CRYPTO_NICE`], once per thread (on Linux the nice
/// value is per thread). Best effort: a failure leaves the priority as it was.
fn lower_this_threads_priority() {
    if LOWERED.with(|done| done.replace(true)) {
        return;
    }
    if let Ok(nice) = rustix::process::getpriority_process(None) {
        let _ = rustix::process::setpriority_process(None, (nice + CRYPTO_NICE).min(19));
    }
}

/// Runs CPU-heavy crypto `work` on a blocking thread (off the async reactor) while holding
/// `slot`, which is given back as soon as the work is done. `None` if the work panicked.
///
/// The blocking thread runs at a lower priority than the runtime's workers
/// ([`CRYPTO_NICE`]): when the CPUs are saturated, the workers that read requests, refuse them
/// (`backpressure` at once) and answer go first, and the cryptography takes the CPU they leave.
pub async fn on_crypto_slot<T: Send + 'static>(
    slot: CryptoSlot,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    on_crypto_slot_then(slot, work, |out| out).await
}

/// Runs crypto `work` on a blocking thread while holding `slot`, gives the slot back, then runs
/// `then` on the same thread with the work's output: disk work that follows the crypto work
/// (a SQLite commit) takes no second hop off the reactor and holds no slot. `None` if either
/// panicked. The thread runs below the workers' priority, as in [`on_crypto_slot`].
///
/// With `--crypto-on-reactor` (measuring only: what taking the work off the reactor costs)
/// both run on the worker that asked, in place: the slots then never run out, as a worker runs
/// one piece of work at a time, and a saturated node queues requests instead of refusing them
/// at once, which is not the design's admission.
pub async fn on_crypto_slot_then<A, T: Send + 'static>(
    slot: CryptoSlot,
    work: impl FnOnce() -> A + Send + 'static,
    then: impl FnOnce(A) -> T + Send + 'static,
) -> Option<T> {
    if slot.on_reactor {
        let out = work();
        drop(slot);
        return Some(then(out));
    }
    tokio::task::spawn_blocking(move || {
        lower_this_threads_priority();
        let out = work();
        drop(slot);
        then(out)
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_slots_follow_the_design() {
        assert_eq!(crypto_slots(1), 4);
        assert_eq!(crypto_slots(2), 4);
        assert_eq!(crypto_slots(12), 6);
        assert_eq!(crypto_slots(64), 8);
    }

    #[test]
    fn the_workers_take_the_other_half() {
        assert_eq!(runtime_workers(1), 1);
        assert_eq!(runtime_workers(2), 1);
        assert_eq!(runtime_workers(3), 1);
        assert_eq!(runtime_workers(12), 6);
        assert_eq!(runtime_workers(64), 32);
    }

    fn context(slots: usize) -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::starting_at(1_800_000_000);
        crate::node::init(dir.path(), "https://127.0.0.1:7001", 1_800_000_000).unwrap();
        let node = Arc::new(Node::load(dir.path()).unwrap());
        let peers = Arc::new(Peers::new(vec![], true, clock, *node.id()));
        let ctx = Context::new(node, peers, clock, slots);
        (dir, ctx)
    }

    #[tokio::test]
    async fn the_slot_is_held_only_while_the_work_runs() {
        let (_dir, ctx) = context(1);
        let slot = ctx.crypto.slot_below(1, Duration::ZERO).await.unwrap();
        let g = ctx.crypto.gate.clone();
        let seen = on_crypto_slot(slot, move || g.in_use()).await;
        assert_eq!(seen, Some(1));
        assert_eq!(ctx.crypto.gate.in_use(), 0);
        let slot = ctx.crypto.slot_below(1, Duration::ZERO).await.unwrap();
        assert_eq!(on_crypto_slot(slot, || panic!("boom")).await, None::<()>);
        assert_eq!(ctx.crypto.gate.in_use(), 0, "given back after a panic too");
        let slot = ctx.crypto.slot_below(1, Duration::ZERO).await.unwrap();
        let (g, h) = (ctx.crypto.gate.clone(), ctx.crypto.gate.clone());
        let seen = on_crypto_slot_then(slot, move || g.in_use(), move |a| (a, h.in_use())).await;
        assert_eq!(
            seen,
            Some((1, 0)),
            "held for the work, given back before `then`"
        );
    }

    #[tokio::test]
    async fn crypto_then_disk_work_runs_below_the_workers_priority() {
        let (_dir, ctx) = context(1);
        let mine = rustix::process::getpriority_process(None).unwrap();
        let slot = ctx.crypto.try_slot(1).unwrap();
        let seen = on_crypto_slot_then(
            slot,
            || rustix::process::getpriority_process(None).unwrap(),
            |p| p,
        )
        .await;
        assert_eq!(seen, Some((mine + CRYPTO_NICE).min(19)));
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), mine);
    }

    #[tokio::test]
    async fn on_the_reactor_the_work_runs_in_place_and_gives_its_slot_back() {
        let (_dir, mut ctx) = context(1);
        ctx.crypto.on_reactor = true;
        let here = std::thread::current().id();
        let slot = ctx.crypto.try_slot(1).unwrap();
        let g = ctx.crypto.gate.clone();
        let seen = on_crypto_slot_then(
            slot,
            move || (std::thread::current().id(), g.in_use()),
            |a| a,
        )
        .await;
        assert_eq!(seen, Some((here, 1)));
        assert_eq!(ctx.crypto.gate.in_use(), 0);
    }

    #[tokio::test]
    async fn crypto_runs_below_the_workers_priority() {
        let (_dir, ctx) = context(1);
        let mine = rustix::process::getpriority_process(None).unwrap();
        let slot = ctx.crypto.try_slot(1).unwrap();
        let seen = on_crypto_slot(slot, || rustix::process::getpriority_process(None).unwrap())
            .await
            .unwrap();
        assert_eq!(seen, (mine + CRYPTO_NICE).min(19));
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), mine);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_a_little_for_a_slot_then_gives_up() {
        let (_dir, ctx) = context(2);
        let ctx = Arc::new(ctx);
        let held = ctx.crypto.slot_below(1, Duration::ZERO).await.unwrap();
        // No slot within the wait: refused, exactly at the end of the wait.
        let t = ctx.clock.now();
        assert!(
            ctx.crypto
                .slot_below(1, Duration::from_millis(30))
                .await
                .is_none()
        );
        assert_eq!(t.elapsed(), Duration::from_millis(30));
        // A slot given back during the wait is taken at once.
        let c = Arc::clone(&ctx);
        let waiter =
            tokio::spawn(async move { c.crypto.slot_below(1, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(got.is_some());
    }
}
