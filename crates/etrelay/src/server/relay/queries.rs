//! Status queries in the relay loop: `getinfo` and `getstatus` through the masters' lane, the
//! per-source limiter and the answer budgets, then answered from the query cache, whose
//! refreshes go to the game server on a socket of their own. [`Queries`] owns that state.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};
use tokio::net::UdpSocket;
use tracing::{debug, trace};

use super::sessions::{Touched, open_or_push, send_now};
use crate::clock::Instant;
use crate::config::MAX_PACKET;
use crate::et::classify::Query;
use crate::net::upstream_socket;
use crate::server::cache::{Outcome, QueryCache};
use crate::server::joins::Pace;
use crate::server::lanes::{MasterLane, Verdict};
use crate::server::metrics::DropReason;
use crate::server::reflection::AnswerBudget;
use crate::server::shared::Shared;
use crate::server::sweep::SWEEP_PARTS;

/// Datagrams read from the cache socket per turn.
const CACHE_READS: usize = 64;
/// Shortest gap between two full limiter sweeps forced by a full table.
const SWEEP_GAP: std::time::Duration = std::time::Duration::from_millis(200);

/// One query, as the relay loop read it.
#[derive(Debug)]
pub(super) struct Asked<'a> {
    /// Where it came from.
    pub(super) src: SocketAddr,
    /// The datagram.
    pub(super) data: &'a [u8],
    /// `getinfo` or `getstatus`.
    pub(super) query: Query,
    /// The challenge it holds, if any.
    pub(super) challenge: Option<&'a [u8]>,
    /// The challenge is the relay's own for `src`: no spoofed source.
    pub(super) ours: bool,
    /// When it was read.
    pub(super) now: Instant,
    /// `src` proved its address before ([`crate::server::proven`]).
    pub(super) proven: bool,
}

/// The query path's state: limiter, budgets, the masters' lane and the cache.
#[derive(Debug)]
pub(super) struct Queries {
    shared: Arc<Shared>,
    limiter: KeyedLimiter<IpAddr, TokenBucket>,
    /// How many queries are answered, per source prefix and in all.
    budget: AnswerBudget,
    /// The same for proven sources (`crate::server::proven`), apart from everyone else's.
    proven_budget: AnswerBudget,
    /// The masters' own lane.
    masters: MasterLane,
    /// `None` when the cache is off (`cache_max_age` 0).
    cache: Option<Cache>,
    /// Where cached answers and refreshes are written.
    scratch: Vec<u8>,
}

/// The query cache and the socket its refreshes go out on and their answers come back on.
#[derive(Debug)]
struct Cache {
    machine: QueryCache,
    socket: UdpSocket,
    recv_buf: Vec<u8>,
}

impl Queries {
    /// The query path of the server `shared` relays.
    ///
    /// # Errors
    /// The cache's socket.
    pub(super) fn new(shared: Arc<Shared>, now: Instant) -> io::Result<Self> {
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
                machine: QueryCache::new(cfg.cache_max_age, now),
                socket: upstream_socket(cfg.upstream)?,
                recv_buf: vec![0; crate::config::MAX_ANSWER],
            })
        };
        Ok(Queries {
            limiter,
            budget: AnswerBudget::new(&cfg.reflection),
            proven_budget: AnswerBudget::new(&cfg.reflection),
            masters: MasterLane::new(),
            cache,
            scratch: Vec::with_capacity(64 * 1024),
            shared,
        })
    }

    /// Whether `ip` is one of the masters'.
    pub(super) fn is_master(&self, ip: IpAddr) -> bool {
        self.masters.is_master(&ip)
    }

    /// Waits until the cache socket is readable; forever when there is no cache.
    pub(super) async fn readable(&self) -> io::Result<()> {
        match &self.cache {
            Some(c) => c.socket.readable().await,
            None => std::future::pending().await,
        }
    }

    /// The periodic clean-up: the limiter, the budgets, the masters' addresses, and a cache
    /// refresh the game server did not answer (its socket opened again).
    pub(super) fn tick(&mut self, now: Instant) {
        if !self.limiter.is_empty() {
            self.limiter.sweep_part(now.into_std(), SWEEP_PARTS);
        }
        self.budget.sweep(now);
        self.proven_budget.sweep(now);
        self.masters.refresh(self.shared.masters(), now.into_std());
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

    /// Answers that arrived on the cache socket (at most [`CACHE_READS`] per turn): a refresh's
    /// answer goes to each of its waiters, with their own challenge.
    pub(super) fn cache_answers(&mut self) {
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
    }

    /// A `getinfo`/`getstatus`: one holding the relay's challenge for its address (no
    /// spoofed source) and a master's through their own lanes; a proven source's through the
    /// per-source limiter (a table full of strangers does not refuse it) and its own answer
    /// budget; anyone else's through the limiter and the shared budget. Then answered from the
    /// cache (or, cache off, sent to the client's session).
    pub(super) fn query(&mut self, touched: &mut Touched, pace: &mut Pace, asked: Asked<'_>) {
        let Asked {
            src,
            data,
            query: q,
            challenge,
            ours,
            now,
            proven,
        } = asked;
        let m = &self.shared.metrics;
        let ip = src.ip();
        let mut window = false;
        if ours {
            m.proven_queries.inc();
        } else {
            match self
                .masters
                .check(&ip, now.into_std(), self.shared.since_beat())
            {
                Some(Verdict::Window) => {
                    window = true;
                    m.master_queries.inc();
                }
                Some(Verdict::Bucket) => m.master_queries.inc(),
                Some(Verdict::Refused) => {
                    m.drop(DropReason::MasterLimit);
                    debug!(client = %src, "master query over its lane");
                    return;
                }
                None => {
                    if !self.allowed(ip, now, proven) {
                        return;
                    }
                }
            }
        }
        if self.cache.is_none() {
            let mut st = self.shared.lock();
            open_or_push(&self.shared, touched, &mut st, src, data, None);
            return;
        }
        let sent = self.cached_query(pace, src, (q, challenge), now);
        if window && let Some(bytes) = sent {
            self.masters.charge(&ip, bytes);
        }
    }

    /// Whether a query of `ip` (a `proven` source or not) passes the per-source limiter and
    /// the answer budget at `now`; a refusal is counted.
    fn allowed(&mut self, ip: IpAddr, now: Instant, proven: bool) -> bool {
        let m = &self.shared.metrics;
        let limited = self.limiter.check(&ip, now.into_std());
        m.query_sources.set(self.limiter.len() as u64);
        if !matches!((limited, proven), (Ok(true), _) | (Err(_), true)) {
            m.drop(DropReason::Limiter);
            debug!(client = %ip, "query limited");
            return false;
        }
        let budget = if proven {
            &mut self.proven_budget
        } else {
            &mut self.budget
        };
        if !budget.allow(ip, now) {
            m.drop(DropReason::Reflection);
            debug!(client = %ip, "query over the answer budget");
            return false;
        }
        if proven {
            m.proven_queries.inc();
        }
        true
    }

    /// A query the budget allowed, with the cache on: answered from it, or a refresh sent to
    /// the game server (when the pace leaves room), or waiting for one under way. The bytes
    /// of the answer sent, or [`MAX_PACKET`] for one that waits; `None` when dropped.
    fn cached_query(
        &mut self,
        pace: &mut Pace,
        src: SocketAddr,
        (q, challenge): (Query, Option<&[u8]>),
        now: Instant,
    ) -> Option<usize> {
        let cache = self.cache.as_mut()?;
        let m = &self.shared.metrics;
        // The relay's own queries come before joins: the pace keeps tokens for them.
        let may_refresh = pace.available(now) > 0;
        match cache
            .machine
            .query_paced(q, challenge, src, now, &mut self.scratch, may_refresh)
        {
            Outcome::Answer => {
                m.cache_hits.inc();
                send_now(&self.shared, &self.scratch, src, "cache");
                Some(self.scratch.len())
            }
            Outcome::Refresh => match cache.socket.try_send(&self.scratch) {
                Ok(n) => {
                    pace.take(now, 0);
                    m.cache_refreshes.inc();
                    m.upstream_packets.inc();
                    m.upstream_bytes.add(n as u64);
                    Some(MAX_PACKET)
                }
                Err(e) => {
                    trace!(error = %e, "cache refresh send");
                    cache.machine.unsent(q);
                    m.drop(DropReason::CacheBusy);
                    None
                }
            },
            Outcome::Waiting => Some(MAX_PACKET),
            Outcome::Busy => {
                m.drop(DropReason::CacheBusy);
                None
            }
        }
    }
}
