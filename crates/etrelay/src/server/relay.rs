//! The relay loop of one server: everything that arrives on the public socket, and the query
//! cache's socket.
//!
//! Each wake-up drains the public socket in batches ([`BatchRecv`], one system call per batch)
//! and runs every datagram through the same straight line: size, ban, [`classify`], query
//! limiter, then the query cache or the client's session (for a new client, the session cap
//! first). Nothing in it waits: opening a session is a non-blocking bind and connect, a full
//! queue drops the packet, and cached answers and cache refreshes leave with a non-blocking
//! send. The loop drives the cache's state machine ([`QueryCache`]): it sends the refreshes the
//! cache asks for, hands what the game server sends back to it, and answers the waiters it
//! names. The per-packet path does not allocate.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};
use guard::throttle::Throttle;
use tokio::net::UdpSocket;
use tracing::{debug, trace, warn};

use super::cache::{Outcome, QueryCache};
use super::forward;
use super::metrics::Drop;
use super::reflection::AnswerBudget;
use super::shared::Shared;
use crate::clock::Instant;
use crate::et::classify::{Packet, Query, Reject, classify};
use crate::et::{self, command_word};
use crate::net::{BatchRecv, canonical, upstream_socket};

/// Batches read per wake-up before the loop yields, so the sessions can send what it queued
/// (a batch is up to [`crate::net::BATCH`] datagrams: 64 per turn, one full session queue).
const ROUNDS_PER_WAKE: usize = 2;
/// How often idle limiter entries and late cache refreshes are looked at.
const TICK: Duration = Duration::from_millis(250);
/// Datagrams read from the cache socket per turn.
const CACHE_READS: usize = 64;
/// At most one "cannot open a session" line per this period.
const WARN_PERIOD: Duration = Duration::from_secs(10);
/// Shortest gap between two full limiter sweeps forced by a full table.
const SWEEP_GAP: Duration = Duration::from_millis(200);

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
    /// How many queries are answered, per source prefix and in all.
    budget: AnswerBudget,
    /// "Cannot open a session" at most once per [`WARN_PERIOD`] (it fires per packet).
    open_failed: Throttle,
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
        let cache = if cfg.cache_max_age.is_zero() {
            None
        } else {
            Some(Cache {
                machine: QueryCache::new(cfg.cache_max_age, Instant::now()),
                socket: upstream_socket(cfg.upstream)?,
                recv_buf: vec![0; cfg.session.max_packet.max(1)],
            })
        };
        Ok(RelayLoop {
            batch: BatchRecv::new(&shared.public)?,
            handler: Handler {
                limiter,
                cache,
                scratch: Vec::with_capacity(64 * 1024),
                budget: AnswerBudget::new(&cfg.reflection),
                open_failed: Throttle::new(WARN_PERIOD),
                shared,
            },
        })
    }

    /// Runs until the server is stopped.
    pub(super) async fn run(mut self) {
        let shared = Arc::clone(&self.handler.shared);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Not biased: under a flood of client packets the cache socket and the tick still
            // get their turns.
            tokio::select! {
                () = shared.cancel.cancelled() => break,
                r = shared.public.readable() => {
                    if let Err(e) = r {
                        warn!("public socket: {e}");
                        break;
                    }
                    self.drain();
                    // Ready sockets do not make tokio tasks yield by themselves: under a flood
                    // this loop would never let the sessions run. Yield after every turn.
                    tokio::task::yield_now().await;
                }
                r = readable(self.handler.cache.as_ref()) => {
                    if r.is_ok() {
                        self.handler.cache_answers();
                    }
                }
                _ = tick.tick() => self.handler.tick(Instant::now()),
            }
        }
    }

    /// Reads what is queued on the public socket, a few batches at most.
    fn drain(&mut self) {
        for _ in 0..ROUNDS_PER_WAKE {
            match self.batch.try_recv(&self.handler.shared.public) {
                Ok(_) => {
                    let now = Instant::now();
                    for (src, data) in self.batch.datagrams() {
                        self.handler.client_packet(canonical(src), data, now);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // ICMP errors reported on the socket: nothing to do with the queue.
                    trace!(error = %e, "public receive");
                }
            }
        }
    }
}

impl Handler {
    /// One datagram from a client.
    fn client_packet(&mut self, src: SocketAddr, data: &[u8], now: Instant) {
        let m = &self.shared.metrics;
        m.client_packets.inc();
        m.client_bytes.add(data.len() as u64);
        if data.len() > self.shared.config.session.max_packet {
            m.drop(Drop::Oversize);
            return;
        }
        if self.banned(src.ip(), now) {
            m.drop(Drop::Ban);
            return;
        }
        let packet = classify(data);
        if !matches!(packet, Packet::Game) {
            debug!("{src} -> ET {} ({} B)", command_word(data), data.len());
        }
        match packet {
            Packet::Game | Packet::Pass(_) => self.enqueue(src, data),
            Packet::Query(q, challenge) => {
                match self.limiter.check(&src.ip(), now.into_std()) {
                    Ok(true) => {}
                    Ok(false) | Err(_) => {
                        m.query_sources.set(self.limiter.len() as u64);
                        m.drop(Drop::Limiter);
                        debug!("{src} query limited");
                        return;
                    }
                }
                m.query_sources.set(self.limiter.len() as u64);
                if !self.budget.allow(src.ip(), now.into_std()) {
                    m.drop(Drop::Limiter);
                    debug!("{src} query over the answer budget");
                    return;
                }
                let Some(cache) = self.cache.as_mut() else {
                    self.enqueue(src, data);
                    return;
                };
                let challenge = challenge.map(|r| &data[r]);
                match cache
                    .machine
                    .query(q, challenge, src, now, &mut self.scratch)
                {
                    Outcome::Answer => {
                        m.cache_hits.inc();
                        send_now(&self.shared, &self.scratch, src);
                    }
                    Outcome::Refresh => match cache.socket.try_send(&self.scratch) {
                        Ok(n) => {
                            m.cache_refreshes.inc();
                            m.upstream_packets.inc();
                            m.upstream_bytes.add(n as u64);
                        }
                        Err(e) => {
                            trace!(error = %e, "cache refresh send");
                            cache.machine.unsent(q);
                            m.drop(Drop::CacheBusy);
                        }
                    },
                    Outcome::Waiting => {}
                    Outcome::Busy => m.drop(Drop::CacheBusy),
                }
            }
            Packet::Drop(reason) => {
                let reason = match reason {
                    Reject::Rcon => Drop::Rcon,
                    Reject::NotAllowed => Drop::Filter,
                    Reject::BadChallenge => Drop::BadChallenge,
                };
                debug!("{src} dropped ({})", reason.name());
                m.drop(reason);
            }
        }
    }

    fn banned(&self, ip: IpAddr, now: Instant) -> bool {
        self.shared.lock().bans.is_banned(ip, now)
    }

    /// Queues a packet on the client's session, opening one if needed.
    fn enqueue(&mut self, src: SocketAddr, data: &[u8]) {
        let shared = &self.shared;
        let now_ms = shared.now_ms();
        let mut st = shared.lock();
        if let Some(s) = st.sessions.get(&src)
            && !s.is_closed()
        {
            if s.push(data, now_ms).is_err() {
                shared.metrics.drop(Drop::QueueFull);
            }
            return;
        }
        // A new source: the session cap first, before any work. (Idle sessions end on their
        // own deadline, in their task: nothing to sweep here.)
        let Some(permit) = shared.sessions_gate.try_acquire() else {
            shared.metrics.drop(Drop::SessionCap);
            debug!("{src}: no session (MAX_SESSIONS reached)");
            return;
        };
        match forward::open(shared, src, now_ms, permit) {
            Ok(s) => {
                if s.push(data, now_ms).is_err() {
                    shared.metrics.drop(Drop::QueueFull);
                }
                st.sessions.insert(src, s);
                let n = st.sessions.len();
                shared.metrics.sessions_opened.inc();
                shared.metrics.sessions_open.set(n as u64);
                debug!("session + {src} ({n} active)");
            }
            Err(e) => {
                shared.metrics.drop(Drop::Upstream);
                if let Some(n) = self.open_failed.event(Instant::now().into_std()) {
                    warn!("cannot open a session for {src}: {e} ({n} more failures not logged)");
                }
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
            let Some(mut waiters) = cache.machine.on_answer(&cache.recv_buf[..n], now) else {
                continue;
            };
            m.cache_refresh_answers.inc();
            debug!(
                "cache: {} refreshed ({n} B)",
                match waiters.query() {
                    Query::Info => "infoResponse",
                    Query::Status => "statusResponse",
                }
            );
            while let Some(to) = waiters.next(&mut self.scratch) {
                m.cache_hits.inc();
                send_now(shared, &self.scratch, to);
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        self.limiter.sweep(now.into_std());
        self.budget.sweep(now.into_std());
        self.shared
            .metrics
            .query_sources
            .set(self.limiter.len() as u64);
        if let Some(cache) = self.cache.as_mut()
            && let Some(dropped) = cache.machine.expire(now)
        {
            if dropped > 0 {
                debug!("cache: the game server did not answer; {dropped} queries dropped");
            }
            // A socket connected before the route to the game server existed (a tunnel that
            // came up later) keeps a source address the server cannot answer: open it again.
            match upstream_socket(self.shared.config.upstream) {
                Ok(s) => cache.socket = s,
                Err(e) => debug!("cache: cannot reopen its socket: {e}"),
            }
        }
    }
}

/// Sends an answer from the public socket without waiting; a full socket buffer drops it, as
/// any congested UDP hop would.
fn send_now(shared: &Shared, pkt: &[u8], to: SocketAddr) {
    match shared.public.try_send_to(pkt, to) {
        Ok(n) => {
            shared.metrics.reply_packets.inc();
            shared.metrics.reply_bytes.add(n as u64);
            if et::is_oob(pkt) {
                debug!("{to} <- ET {} ({} B, cache)", command_word(pkt), pkt.len());
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
