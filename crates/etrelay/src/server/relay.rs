//! The relay loop of one server: everything that arrives on the public socket, and the query
//! cache's socket.
//!
//! Each wake-up drains the public socket in batches ([`BatchRecv`], one system call per batch)
//! and runs every datagram through the same straight line: size, [`classify`](crate::et::classify::classify)
//! (a read of the bytes that counts nothing), ban (with the proven lookup the class asks
//! for, in one turn of the state lock), then by
//! kind: a query goes through the limiter to the cache; a `getchallenge` through the fair join
//! gate ([`Joins`]); an in-game packet through the qport check; `connect` and `PB_` only to a
//! session that exists. A new session is admitted by the table's caps ([`super::table`]) before
//! anything is opened. Nothing in it waits: opening a session is a non-blocking bind and connect, a full
//! queue drops the packet, and cached answers and cache refreshes leave with a non-blocking
//! send. The loop drives the cache's state machine ([`QueryCache`]): it sends the refreshes the
//! cache asks for, hands what the game server sends back to it, and answers the waiters it
//! names. The per-packet path (`packet`) does not allocate.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};
use tokio::net::UdpSocket;
use tracing::{debug, info, trace, warn};

use super::cache::QueryCache;
use super::challenges::Challenges;
use super::forward;
use super::joins::{Joins, Pace};
use super::lanes::MasterLane;
use super::reflection::AnswerBudget;
use super::session::Session;
use super::shared::Shared;
use super::sweep::SWEEP_PARTS;
use crate::clock::Instant;
use crate::et::classify::Query;
use crate::et::{self, command_word};
use crate::net::ring::SendRing;
use crate::net::{BatchRecv, canonical, upstream_socket};

mod join;
mod packet;

/// Batches read per wake-up before the loop yields, so the sessions can send what it queued
/// (a batch is up to [`crate::net::BATCH`] datagrams: 64 per turn, one full session queue).
const ROUNDS_PER_WAKE: usize = 2;
/// How often late cache refreshes and queued joins are looked at.
const TICK: Duration = Duration::from_millis(250);
/// Datagrams read from the cache socket per turn.
const CACHE_READS: usize = 64;
/// Shortest gap between two full limiter sweeps forced by a full table.
const SWEEP_GAP: Duration = Duration::from_millis(200);
/// Sessions noted for sending before they are sent at once (a batch of GRO buffers can hold
/// more datagrams than [`crate::net::BATCH`]).
const TOUCHED: usize = 64;
/// Datagrams staged in the ring per system call.
const RING_SLOTS: usize = 64;
/// The longest datagram the ring takes; a longer one (never a player's in-game packet, which
/// is at most 1 400 bytes) is sent with `sendmmsg`.
const RING_SLOT_LEN: usize = 2048;

/// The relay loop: the receive buffers and the packet handler.
#[derive(Debug)]
pub(super) struct RelayLoop {
    batch: BatchRecv,
    handler: Handler,
}

/// The relay loop's own state: nothing here is shared.
#[derive(Debug)]
struct Handler {
    shared: Arc<Shared>,
    limiter: KeyedLimiter<IpAddr, TokenBucket>,
    /// `None` when the cache is off (`cache_max_age` 0).
    cache: Option<Cache>,
    /// Where cached answers and refreshes are written.
    scratch: Vec<u8>,
    /// Requests the game server limits per source IP: `getchallenge` and cache refreshes.
    pace: Pace,
    /// The per-source limit and fair queue of `getchallenge`.
    joins: Joins,
    /// Where a queued `getchallenge` is given back.
    join_buf: Vec<u8>,
    /// How many queries are answered, per source prefix and in all.
    budget: AnswerBudget,
    /// The same for proven sources (`super::proven`), apart from everyone else's.
    proven_budget: AnswerBudget,
    /// The masters' own lane.
    masters: MasterLane,
    /// The relay's own challenges: `getchallenge` answered, `connect` checked.
    challenges: Challenges,
    /// The count of the server's facts last taken ([`Shared::facts_since`]).
    facts_seen: u64,
    /// Sessions with packets to send at the end of the batch.
    touched: Touched,
    /// Sends to many sessions' sockets in one system call; `None` where `io_uring` is off or
    /// not available.
    ring: Option<SendRing>,
}

/// The query cache and the socket its refreshes go out on and their answers come back on.
#[derive(Debug)]
struct Cache {
    machine: QueryCache,
    socket: UdpSocket,
    recv_buf: Vec<u8>,
}

impl RelayLoop {
    /// Prepares the loop.
    ///
    /// # Errors
    /// The public socket's options or the cache's socket.
    pub(super) fn new(shared: Arc<Shared>) -> io::Result<Self> {
        let cfg = &shared.config;
        let limiter = KeyedLimiter::new(
            TokenBucket::new(cfg.query.burst, cfg.query.interval),
            Limits {
                max_keys: cfg.query.max_sources,
                forget: cfg.query.forget,
                sweep_gap: SWEEP_GAP,
            },
        );
        shared.metrics.query_slots.set(limiter.slots() as u64);
        let ring = send_ring(cfg.session.io_uring);
        shared
            .metrics
            .upstream_io_uring
            .set(u64::from(ring.is_some()));
        let cache = if cfg.cache_max_age.is_zero() {
            None
        } else {
            Some(Cache {
                machine: QueryCache::new(cfg.cache_max_age, Instant::now()),
                socket: upstream_socket(cfg.upstream)?,
                recv_buf: vec![0; crate::config::MAX_ANSWER],
            })
        };
        Ok(RelayLoop {
            batch: BatchRecv::new(&shared.public)?,
            handler: Handler {
                limiter,
                cache,
                scratch: Vec::with_capacity(64 * 1024),
                pace: Pace::new(
                    cfg.joins.upstream_burst,
                    cfg.joins.upstream_interval,
                    Instant::now(),
                ),
                joins: Joins::new(&cfg.joins),
                join_buf: Vec::with_capacity(128),
                budget: AnswerBudget::new(&cfg.reflection),
                proven_budget: AnswerBudget::new(&cfg.reflection),
                masters: MasterLane::new(),
                challenges: Challenges::new(
                    cfg.game,
                    cfg.challenges.answers_per_second,
                    cfg.challenges.server,
                    Instant::now(),
                ),
                facts_seen: 0,
                touched: Touched {
                    sessions: Vec::with_capacity(TOUCHED),
                    packets: 0,
                },
                ring,
                shared,
            },
        })
    }

    /// Runs until the server is stopped.
    pub(super) async fn run(mut self) {
        let shared = Arc::clone(&self.handler.shared);
        // Held until the server's bans are in force (the kernel queues what arrives meanwhile).
        tokio::select! {
            () = shared.go.cancelled() => {}
            () = shared.cancel.cancelled() => return,
        }
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Made once, not at every turn (a new one registers with the token again).
        let cancelled = shared.cancel.cancelled();
        tokio::pin!(cancelled);
        loop {
            let due = self
                .handler
                .joins
                .next_due(Instant::now(), &self.handler.pace);
            // Not biased: under a flood of client packets the cache socket and the tick still
            // get their turns.
            tokio::select! {
                () = &mut cancelled => break,
                r = shared.public.readable() => {
                    if let Err(e) = r {
                        warn!(error = %e, "public socket failed: relay loop ended");
                        break;
                    }
                    // Ready sockets do not make tokio tasks yield by themselves: under a flood
                    // this loop would never let the sessions run. Yield after every full turn
                    // (after a short one the socket waits for its next datagram anyway).
                    if self.drain() {
                        tokio::task::yield_now().await;
                    }
                }
                r = readable(self.handler.cache.as_ref()) => {
                    if r.is_ok() {
                        self.handler.cache_answers();
                    }
                }
                _ = tick.tick() => self.handler.tick(Instant::now()),
                () = until(due) => self.handler.release_joins(Instant::now()),
            }
            self.handler.send_touched();
        }
    }

    /// Reads what is queued on the public socket, a few batches at most. True when it stopped
    /// with datagrams possibly still queued (every round took a full batch).
    fn drain(&mut self) -> bool {
        for _ in 0..ROUNDS_PER_WAKE {
            match self.batch.try_recv(&self.handler.shared.public) {
                Ok(_) => {
                    let now = Instant::now();
                    let mut last = None;
                    // Without the ring, a run of one client's datagrams goes out in one
                    // `sendmmsg`; it goes as soon as the run ends, not at the end of the batch,
                    // so the first client of a burst does not wait for the others' to be
                    // classified. With it, the whole batch goes out in one system call.
                    let per_run = self.handler.ring.is_none();
                    for (src, data) in self.batch.datagrams() {
                        if (per_run && last.is_some_and(|l| l != src))
                            || self.handler.touched.is_full()
                        {
                            self.handler.send_touched();
                        }
                        last = Some(src);
                        self.handler.client_packet(canonical(src), data, now);
                    }
                    self.handler.release_joins(now);
                    self.handler.send_touched();
                    if self.batch.drained() {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    // ICMP errors reported on the socket: nothing to do with the queue.
                    trace!(error = %e, "public receive");
                }
            }
        }
        true
    }
}

impl Handler {
    /// Sends what the noted sessions queued: all of it with one system call through the ring
    /// if there is one; else (and what the ring did not take) one `sendmmsg` per session and
    /// batch. A lone datagram (an ET server's pace) goes with a plain `send`, which costs
    /// less than a round of the ring. A session whose socket buffer is full is left to its
    /// task, woken to send it (see [`super::forward`]).
    fn send_touched(&mut self) {
        let packets = std::mem::take(&mut self.touched.packets);
        if let Some(ring) = self.ring.as_mut().filter(|_| packets > 1) {
            forward::flush_through(ring, &self.shared, &self.touched.sessions);
            if ring.broken() {
                self.ring = None;
                self.shared.metrics.upstream_io_uring.set(0);
            }
        }
        for s in self.touched.sessions.drain(..) {
            let Some(upstream) = s.upstream() else {
                continue;
            };
            if forward::flush(&self.shared, &s, upstream).blocked {
                s.wake();
            }
        }
    }

    /// Answers that arrived on the cache socket (at most [`CACHE_READS`] per turn): a refresh's
    /// answer goes to each of its waiters, with their own challenge.
    fn cache_answers(&mut self) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        let shared = &self.shared;
        let m = &shared.metrics;
        let now = Instant::now();
        for _ in 0..CACHE_READS {
            let n = match cache.socket.try_recv(&mut cache.recv_buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    trace!(error = %e, "cache receive");
                    continue;
                }
            };
            m.server_packets.inc();
            m.server_bytes.add(n as u64);
            shared.heard();
            shared.learn_info(&cache.recv_buf[..n]);
            let Some(mut waiters) = cache.machine.on_answer(&cache.recv_buf[..n], now) else {
                continue;
            };
            m.cache_refresh_answers.inc();
            debug!(
                answer = %match waiters.query() {
                    Query::Info => "infoResponse",
                    Query::Status => "statusResponse",
                },
                bytes = n,
                "cache refreshed"
            );
            while let Some(to) = waiters.next(&mut self.scratch) {
                m.cache_hits.inc();
                send_now(shared, &self.scratch, to, "cache");
            }
        }
        self.take_facts();
    }

    fn tick(&mut self, now: Instant) {
        if !self.limiter.is_empty() {
            self.limiter.sweep_part(now.into_std(), SWEEP_PARTS);
        }
        self.joins.sweep(now);
        self.challenges.sweep(now);
        self.take_facts();
        self.budget.sweep(now);
        self.proven_budget.sweep(now);
        self.masters.refresh(self.shared.masters(), now.into_std());
        self.shared.watch_pressure(now);
        self.release_joins(now);
        self.shared
            .metrics
            .query_sources
            .set(self.limiter.len() as u64);
        if let Some(cache) = self.cache.as_mut()
            && let Some(dropped) = cache.machine.expire(now)
        {
            if dropped > 0 {
                debug!(
                    dropped,
                    "cache: the game server did not answer; queries dropped"
                );
            }
            // A socket connected before the route to the game server existed (a tunnel that
            // came up later) keeps a source address the server cannot answer: open it again.
            match upstream_socket(self.shared.config.upstream) {
                Ok(s) => cache.socket = s,
                Err(e) => debug!(error = %e, "cache: cannot reopen its socket"),
            }
        }
    }
}

/// The sessions that got packets since the last [`Handler::send_touched`], each once in a row
/// (a session noted again after another is sent twice; the second send finds little or
/// nothing), and how many packets they got. Bounded: past [`TOUCHED`] entries the caller sends
/// at once.
#[derive(Debug, Default)]
struct Touched {
    sessions: Vec<Arc<Session>>,
    packets: usize,
}

impl Touched {
    fn note(&mut self, s: &Arc<Session>) {
        self.packets += 1;
        if !self.sessions.last().is_some_and(|l| Arc::ptr_eq(l, s)) {
            self.sessions.push(Arc::clone(s));
        }
    }

    fn is_full(&self) -> bool {
        self.sessions.len() >= TOUCHED
    }
}

/// The ring for sends to the game server when `wanted` and the kernel allows it.
fn send_ring(wanted: bool) -> Option<SendRing> {
    if !wanted {
        return None;
    }
    match SendRing::new(RING_SLOTS, RING_SLOT_LEN) {
        Ok(ring) => Some(ring),
        Err(e) => {
            info!(error = %e, "io_uring not available: sending one socket at a time");
            None
        }
    }
}

/// Resolves at `due`; never without one.
async fn until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Sends an answer of the relay's own (`from`: where it comes from, for the debug log) from the
/// public socket without waiting; a full socket buffer drops it, as any congested UDP hop would.
fn send_now(shared: &Shared, pkt: &[u8], to: SocketAddr, from: &str) {
    match shared.public.try_send_to(pkt, to) {
        Ok(n) => {
            shared.metrics.reply_packets.inc();
            shared.metrics.reply_bytes.add(n as u64);
            if et::is_oob(pkt) {
                debug!(
                    client = %to,
                    command = %command_word(pkt),
                    bytes = pkt.len(),
                    from = %from,
                    "to client"
                );
            }
        }
        Err(e) => {
            shared.metrics.reply_errors.inc();
            trace!(error = %e, "cached answer");
        }
    }
}

/// Waits until the cache socket is readable; forever when there is no cache.
async fn readable(cache: Option<&Cache>) -> io::Result<()> {
    match cache {
        Some(c) => c.socket.readable().await,
        None => std::future::pending().await,
    }
}
