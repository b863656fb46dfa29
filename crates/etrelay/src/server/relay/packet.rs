//! The client-packet path of the relay loop: one datagram from a client through size,
//! [`classify`] (nothing counted yet), ban and, by kind, the query limiter and cache, the join gate, the qport check, to
//! its session (opened here when the table's caps admit it).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tracing::{debug, trace, warn};

use super::{Handler, Touched, send_now};
use crate::clock::Instant;
use crate::config::MAX_PACKET;
use crate::et::classify::{Command, Packet, Query, Reject, classify};
use crate::et::command_word;
use crate::server::cache::Outcome;
use crate::server::forward;
use crate::server::joins::Offer;
use crate::server::lanes::Verdict;
use crate::server::metrics::DropReason;
use crate::server::session::{Phase, Refused, Session};
use crate::server::shared::{Shared, State};

impl Handler {
    /// One datagram from a client.
    pub(super) fn client_packet(&mut self, src: SocketAddr, data: &[u8], now: Instant) {
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
            Packet::Pass(Command::GetChallenge) => self.getchallenge(src, data, now, proven),
            Packet::Pass(Command::Connect) => self.connect(src, data, now, proven),
            Packet::Pass(Command::PunkBuster) => self.session_only(src, data),
            Packet::Query(q, challenge) => {
                let challenge = challenge.map(|r| &data[r]);
                self.query(src, data, (q, challenge), now, proven);
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

    /// A `getinfo`/`getstatus`: one holding the relay's challenge for its address (no
    /// spoofed source) and a master's through their own lanes; a proven source's through the
    /// per-source limiter (a table full of strangers does not refuse it) and its own answer
    /// budget; anyone else's through the limiter and the shared budget. Then answered from the
    /// cache (or, cache off, sent to the client's session).
    fn query(
        &mut self,
        src: SocketAddr,
        data: &[u8],
        (q, challenge): (Query, Option<&[u8]>),
        now: Instant,
        proven: bool,
    ) {
        let m = &self.shared.metrics;
        let ip = src.ip();
        let mut window = false;
        if challenge.is_some_and(|c| self.challenges.is_ours(src, c, now)) {
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
            open_or_push(&self.shared, &mut self.touched, &mut st, src, data, None);
            return;
        }
        let sent = self.cached_query(src, q, challenge, now);
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
        src: SocketAddr,
        q: Query,
        challenge: Option<&[u8]>,
        now: Instant,
    ) -> Option<usize> {
        let cache = self.cache.as_mut()?;
        let m = &self.shared.metrics;
        // The relay's own queries come before joins: the pace keeps tokens for them.
        let may_refresh = self.pace.available(now) > 0;
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
                    self.pace.take(now, 0);
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

    /// `None` when `ip` is banned; else whether it proved its address (looked up only for a
    /// packet with a `lane`), in one turn of the state lock.
    fn standing(&self, ip: IpAddr, lane: bool, now: Instant) -> Option<bool> {
        let st = self.shared.lock();
        if st.bans.is_banned(ip, now) {
            return None;
        }
        Some(lane && st.proven.contains(&ip))
    }

    /// A `getchallenge` for the server (it gives its own challenges): through the join gate
    /// (a proven source first), then to the client's session (opened if needed). A queued one
    /// comes back through [`Handler::release_joins`].
    pub(super) fn join(&mut self, src: SocketAddr, data: &[u8], now: Instant, proven: bool) {
        // An etmaster-style master asks for a challenge before `getInfo`.
        let proven = proven || self.masters.is_master(&src.ip());
        match self.joins.offer(src, data, now, &mut self.pace, proven) {
            Offer::Pass => {
                if proven {
                    self.shared.metrics.proven_joins.inc();
                }
                let mut st = self.shared.lock();
                open_or_push(&self.shared, &mut self.touched, &mut st, src, data, None);
            }
            Offer::Queued => {
                if proven {
                    self.shared.metrics.proven_joins.inc();
                }
            }
            Offer::Refused(reason) => {
                debug!(client = %src, reason = %reason.name(), "dropped");
                self.shared.metrics.drop(reason);
            }
        }
        self.shared
            .metrics
            .joins_queued
            .set(self.joins.queued() as u64);
    }

    /// Sends on the queued `getchallenge` whose turn has come.
    pub(super) fn release_joins(&mut self, now: Instant) {
        while let Some(src) = self.joins.release(now, &mut self.pace, &mut self.join_buf) {
            if self.challenges.dialect().is_some() {
                self.shared.metrics.challenges_asked.inc();
            }
            let mut st = self.shared.lock();
            open_or_push(
                &self.shared,
                &mut self.touched,
                &mut st,
                src,
                &self.join_buf,
                None,
            );
        }
        self.shared
            .metrics
            .joins_queued
            .set(self.joins.queued() as u64);
    }

    /// `connect` and `PB_`: only for a session that exists. A `connect` can only be accepted
    /// with a challenge the game server gave that session's upstream port, so a source without
    /// a session has nothing to connect with.
    pub(super) fn session_only(&mut self, src: SocketAddr, data: &[u8]) {
        let shared = &self.shared;
        let st = shared.lock();
        match st.sessions.get(&src) {
            Some(s) => push(shared, &mut self.touched, s, data, shared.now_ms()),
            None => {
                debug!(client = %src, reason = %DropReason::NoSession.name(), "dropped");
                shared.metrics.drop(DropReason::NoSession);
            }
        }
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
            } else if self.challenges.dialect().is_some() {
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
}

/// Queues `data` on `src`'s session, opening a half-open one if the table's caps admit it (at
/// the server's half-open cap the oldest half-open session is recycled); `qport` is pinned on a
/// new session.
pub(super) fn open_or_push(
    shared: &Arc<Shared>,
    touched: &mut Touched,
    st: &mut State,
    src: SocketAddr,
    data: &[u8],
    qport: Option<u16>,
) {
    let now_ms = shared.now_ms();
    if let Some(s) = st.sessions.get(&src) {
        push(shared, touched, s, data, now_ms);
        return;
    }
    if let Some(s) = open(shared, st, src, now_ms) {
        if let Some(q) = qport {
            // A new session takes a free qport (the caller checked it is free).
            let _ = st.sessions.check_qport(&s, q);
        }
        push(shared, touched, &s, data, now_ms);
    }
}

/// Opens a half-open session for `src` if the table's caps admit it (at the server's
/// half-open cap the oldest half-open session is recycled); refusals are counted.
pub(super) fn open(
    shared: &Arc<Shared>,
    st: &mut State,
    src: SocketAddr,
    now_ms: u64,
) -> Option<Arc<Session>> {
    match st.sessions.admit(src.ip()) {
        Ok(None) => {}
        Ok(Some(victim)) => {
            victim.cut();
            shared.metrics.sessions_recycled.inc();
        }
        Err(reason) => {
            shared.refused(reason, src);
            return None;
        }
    }
    let Some(permit) = shared.budget.sessions.try_acquire() else {
        shared.refused(DropReason::SessionCap, src);
        return None;
    };
    match forward::open(shared, src, now_ms, permit) {
        Ok(s) => {
            st.sessions.insert(Arc::clone(&s));
            shared.metrics.sessions_opened.inc();
            shared.gauges(&st.sessions);
            debug!(client = %src, active = st.sessions.len(), "session opened");
            Some(s)
        }
        Err(e) => {
            shared.metrics.drop(DropReason::Upstream);
            shared.throttled(|n| {
                warn!(client = %src, error = %e, not_logged = n, "cannot open a session");
            });
            None
        }
    }
}

/// Queues `data` on session `s` and notes the session in `touched` (sent at the end of the
/// batch, [`Handler::send_touched`]), counting a refusal.
pub(super) fn push(
    shared: &Shared,
    touched: &mut Touched,
    s: &Arc<Session>,
    data: &[u8],
    now_ms: u64,
) {
    counted(shared, touched, s, s.push(data, now_ms));
}

/// [`push`] for an in-game packet: rewritten for the server's challenge when translated.
fn push_game(shared: &Shared, touched: &mut Touched, s: &Arc<Session>, data: &[u8], now_ms: u64) {
    counted(shared, touched, s, s.push_game(data, now_ms));
}

fn counted(shared: &Shared, touched: &mut Touched, s: &Arc<Session>, r: Result<(), Refused>) {
    match r {
        Ok(()) => touched.note(s),
        Err(Refused::QueueFull) => shared.metrics.drop(DropReason::QueueFull),
        Err(Refused::OverBudget) => shared.metrics.drop(DropReason::QueuedBytes),
        Err(Refused::Forged) => shared.metrics.drop(DropReason::Forged),
    }
}
