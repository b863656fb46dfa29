//! The relay loop of one server: everything that arrives on the public socket, and the query
//! cache's socket.
//!
//! Each wake-up drains the public socket in batches ([`BatchRecv`], one system call per batch)
//! and runs every datagram through the same straight line: size, [`classify`](crate::et::classify::classify)
//! (a read of the bytes that counts nothing), ban (with the proven lookup the class asks
//! for, in one turn of the state lock), then by
//! kind: a query goes through the limiter to the cache; a `getchallenge` through the fair join
//! gate ([`crate::server::joins`]); an in-game packet through the qport check; `connect` and `PB_` only to a
//! session that exists. A new session is admitted by the table's caps ([`super::table`]) before
//! anything is opened. Nothing in it waits: opening a session is a non-blocking bind and connect, a full
//! queue drops the packet, and cached answers and cache refreshes leave with a non-blocking
//! send. The loop drives the cache's state machine ([`crate::server::cache::QueryCache`]): it sends the refreshes the
//! cache asks for, hands what the game server sends back to it, and answers the waiters it
//! names. The per-packet path does not allocate. [`Handler`] takes each datagram through the
//! straight line and hands it, by kind, to the job that owns its state: [`queries`] (the limiter,
//! the budgets, the masters' lane, the cache), [`joining`] (the relay's challenges and the join
//! gate) or the sessions ([`sessions`]); none of them reaches back into this module.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, trace, warn};

use self::joining::Joining;
use self::queries::{Asked, Queries};
use self::sessions::{Touched, open, open_or_push, push_game, session_only};
use super::forward;
use super::metrics::DropReason;
use super::session::Phase;
use super::shared::Shared;
use crate::clock::Instant;
use crate::et::classify::{Command, Packet, Reject, classify};
use crate::et::command_word;
use crate::net::ring::SendRing;
use crate::net::{BatchRecv, canonical};

mod joining;
mod queries;
mod sessions;

/// Batches read per wake-up before the loop yields, so the sessions can send what it queued
/// (a batch is up to [`crate::net::BATCH`] datagrams: 64 per turn, one full session queue).
const ROUNDS_PER_WAKE: usize = 2;
/// How often late cache refreshes and queued joins are looked at.
const TICK: Duration = Duration::from_millis(250);
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

/// The relay loop's own state, nothing of it shared: the jobs a datagram is handed to, and the
/// sessions it queued packets on.
#[derive(Debug)]
struct Handler {
    shared: Arc<Shared>,
    /// Status queries: limiter, budgets, the masters' lane, the cache.
    queries: Queries,
    /// Getting in: the relay's challenges, the join gate, the pace toward the server.
    joining: Joining,
    /// Sessions with packets to send at the end of the batch.
    touched: Touched,
    /// Sends to many sessions' sockets in one system call; `None` where `io_uring` is off or
    /// not available.
    ring: Option<SendRing>,
}

impl RelayLoop {
    /// Prepares the loop.
    ///
    /// # Errors
    /// The public socket's options or the cache's socket.
    pub(super) fn new(shared: Arc<Shared>) -> io::Result<Self> {
        let ring = send_ring(shared.config.session.io_uring);
        shared
            .metrics
            .upstream_io_uring
            .set(u64::from(ring.is_some()));
        let now = Instant::now();
        Ok(RelayLoop {
            batch: BatchRecv::new(&shared.public)?,
            handler: Handler {
                queries: Queries::new(Arc::clone(&shared), now)?,
                joining: Joining::new(Arc::clone(&shared), now),
                touched: Touched::new(),
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
            let due = self.handler.joining.next_due(Instant::now());
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
                r = self.handler.queries.readable() => {
                    if r.is_ok() {
                        self.handler.queries.cache_answers();
                        self.handler.joining.take_facts();
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
    /// One datagram from a client.
    fn client_packet(&mut self, src: SocketAddr, data: &[u8], now: Instant) {
        let m = &self.shared.metrics;
        m.client_packets.inc();
        m.client_bytes.add(data.len() as u64);
        if data.len() > self.shared.config.session.max_packet {
            m.drop(DropReason::Oversize);
            return;
        }
        let packet = classify(data);
        // Only a query, a `getchallenge` and a `connect` have a lane for proven sources.
        let lane = matches!(
            packet,
            Packet::Query(..) | Packet::Pass(Command::GetChallenge | Command::Connect)
        );
        let Some(proven) = self.standing(src.ip(), lane, now) else {
            m.drop(DropReason::Ban);
            return;
        };
        if !matches!(packet, Packet::Game) {
            debug!(
                client = %src,
                command = %command_word(data),
                bytes = data.len(),
                "from client"
            );
        }
        match packet {
            Packet::Game => self.game(src, data),
            Packet::Pass(Command::GetChallenge) => {
                // An etmaster-style master asks for a challenge before `getInfo`.
                let first = proven || self.queries.is_master(src.ip());
                self.joining
                    .getchallenge(&mut self.touched, src, data, now, first);
            }
            Packet::Pass(Command::Connect) => {
                self.joining
                    .connect(&mut self.touched, src, data, now, proven);
            }
            Packet::Pass(Command::PunkBuster) => {
                session_only(&self.shared, &mut self.touched, src, data);
            }
            Packet::Query(query, challenge) => {
                let challenge = challenge.map(|r| &data[r]);
                let ours = challenge.is_some_and(|c| self.joining.is_ours(src, c, now));
                let asked = Asked {
                    src,
                    data,
                    query,
                    challenge,
                    ours,
                    now,
                    proven,
                };
                self.queries
                    .query(&mut self.touched, self.joining.pace(), asked);
            }
            Packet::Drop(reason) => {
                let reason = match reason {
                    Reject::Rcon => DropReason::Rcon,
                    Reject::NotAllowed => DropReason::Filter,
                    Reject::BadChallenge => DropReason::BadChallenge,
                };
                debug!(client = %src, reason = %reason.name(), "dropped");
                m.drop(reason);
            }
        }
    }

    /// `None` when `ip` is banned; else whether it proved its address (looked up only for a
    /// packet with a `lane`), in one turn of the state lock.
    fn standing(&self, ip: IpAddr, lane: bool, now: Instant) -> Option<bool> {
        let st = self.shared.lock();
        if st.bans.is_banned(ip, now) {
            return None;
        }
        Some(lane && st.proven.contains(&ip))
    }

    /// An in-game packet: its qport must be its session's own (pinned on the first one), and
    /// no other session's; rewritten for the server's challenge when translated. From an
    /// unknown address, a qport an established session of the same IP holds moves that session
    /// there only when the packet proves it is the session's client (ioquake3's checksum of
    /// the client's challenge, and a sequence past the last one): a spoofer with the player's
    /// IP and qport moves nothing, and a player keeps its place as on the server itself. Any
    /// other pinned qport is dropped. While the relay gives the challenges, an address
    /// without a session opens none (a client starts with `getchallenge`); else an unpinned
    /// qport opens a half-open session.
    fn game(&mut self, src: SocketAddr, data: &[u8]) {
        let shared = &self.shared;
        let Some(qport) = data.get(4..6).map(|q| u16::from_le_bytes([q[0], q[1]])) else {
            shared.metrics.drop(DropReason::Malformed);
            return;
        };
        let now_ms = shared.now_ms();
        let mut st = shared.lock();
        if let Some(s) = st.sessions.get(&src).cloned() {
            match st.sessions.check_qport(&s, qport) {
                Ok(()) => push_game(shared, &mut self.touched, &s, data, now_ms),
                Err(reason) => shared.metrics.drop(reason),
            }
            return;
        }
        let Some(holder) = st.sessions.qport_holder(qport).cloned() else {
            if let Some(carried) = st.carried.remove(&src).filter(|c| c.qport == qport) {
                // A player of the relay's last run: its session again, translated as it was.
                if let Some(s) = open(shared, &mut st, src, now_ms) {
                    let _ = st.sessions.check_qport(&s, qport);
                    s.translator.set(carried.translation());
                    shared.metrics.sessions_carried.inc();
                    push_game(shared, &mut self.touched, &s, data, now_ms);
                }
            } else if self.joining.relay_challenges() {
                shared.metrics.drop(DropReason::NoSession);
            } else {
                open_or_push(shared, &mut self.touched, &mut st, src, data, Some(qport));
            }
            return;
        };
        if holder.client().ip() == src.ip()
            && holder.phase() == Phase::Established
            && holder.translator.proves_client(data)
        {
            let from = holder.client();
            st.sessions.rebind(&holder, src);
            shared.metrics.sessions_rebound.inc();
            debug!(client = %from, to = %src, qport, "session moved");
            push_game(shared, &mut self.touched, &holder, data, now_ms);
        } else {
            shared.metrics.drop(DropReason::QportConflict);
        }
    }

    /// Sends what the noted sessions queued: all of it with one system call through the ring
    /// if there is one; else (and what the ring did not take) one `sendmmsg` per session and
    /// batch. A lone datagram (an ET server's pace) goes with a plain `send`, which costs
    /// less than a round of the ring. A session whose socket buffer is full is left to its
    /// task, woken to send it (see [`super::forward`]).
    fn send_touched(&mut self) {
        let packets = self.touched.take_packets();
        if let Some(ring) = self.ring.as_mut().filter(|_| packets > 1) {
            forward::flush_through(ring, &self.shared, self.touched.sessions());
            if ring.broken() {
                self.ring = None;
                self.shared.metrics.upstream_io_uring.set(0);
            }
        }
        for s in self.touched.drain() {
            let Some(upstream) = s.upstream() else {
                continue;
            };
            if forward::flush(&self.shared, &s, upstream).blocked {
                s.wake();
            }
        }
    }

    /// The periodic clean-up of every job, the pressure watch, and the joins whose turn came.
    fn tick(&mut self, now: Instant) {
        self.queries.tick(now);
        self.joining.tick(now);
        self.shared.watch_pressure(now);
        self.release_joins(now);
    }

    /// Sends on the queued `getchallenge` whose turn has come.
    fn release_joins(&mut self, now: Instant) {
        self.joining.release_joins(&mut self.touched, now);
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
