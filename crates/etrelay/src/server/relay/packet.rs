//! The client-packet path of the relay loop: one datagram from a client through size, ban,
//! [`classify`] and, by kind, the query limiter and cache, the join gate, the qport check, to
//! its session (opened here when the table's caps admit it).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tracing::{debug, trace, warn};

use super::{Handler, REFRESH_RESERVE, Touched, send_now};
use crate::clock::Instant;
use crate::et::classify::{Command, Packet, Query, Reject, classify};
use crate::et::command_word;
use crate::server::cache::Outcome;
use crate::server::forward;
use crate::server::joins::Offer;
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
        // Only a query and a `getchallenge` have a lane for proven sources.
        let lane = matches!(
            packet,
            Packet::Query(..) | Packet::Pass(Command::GetChallenge)
        );
        let Some(proven) = self.standing(src.ip(), lane, now) else {
            m.drop(DropReason::Ban);
            return;
        };
        if !matches!(packet, Packet::Game) {
            debug!("{src} -> ET {} ({} B)", command_word(data), data.len());
        }
        match packet {
            Packet::Game => self.game(src, data),
            Packet::Pass(Command::GetChallenge) => self.join(src, data, now, proven),
            Packet::Pass(Command::Connect | Command::PunkBuster) => self.session_only(src, data),
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
                debug!("{src} dropped ({})", reason.name());
                m.drop(reason);
            }
        }
    }

    /// A `getinfo`/`getstatus`: a master's through its own lane; a proven source's through the
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
        match self.masters.check(&ip, now.into_std()) {
            Some(true) => m.master_queries.inc(),
            Some(false) => {
                m.drop(DropReason::MasterLimit);
                debug!("{src} master query over its lane");
                return;
            }
            None => {
                let limited = self.limiter.check(&ip, now.into_std());
                m.query_sources.set(self.limiter.len() as u64);
                if !matches!((limited, proven), (Ok(true), _) | (Err(_), true)) {
                    m.drop(DropReason::Limiter);
                    debug!("{src} query limited");
                    return;
                }
                let budget = if proven {
                    &mut self.proven_budget
                } else {
                    &mut self.budget
                };
                if !budget.allow(ip, now) {
                    m.drop(DropReason::Reflection);
                    debug!("{src} query over the answer budget");
                    return;
                }
                if proven {
                    m.proven_queries.inc();
                }
            }
        }
        if self.cache.is_none() {
            let mut st = self.shared.lock();
            open_or_push(&self.shared, &mut self.touched, &mut st, src, data, None);
            return;
        }
        self.cached_query(src, q, challenge, now);
    }

    /// A query the budget allowed, with the cache on: answered from it, or a refresh sent to
    /// the game server (when the pace leaves room), or waiting for one under way.
    fn cached_query(&mut self, src: SocketAddr, q: Query, challenge: Option<&[u8]>, now: Instant) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        let m = &self.shared.metrics;
        let may_refresh = self.pace.available(now) > REFRESH_RESERVE;
        match cache
            .machine
            .query_paced(q, challenge, src, now, &mut self.scratch, may_refresh)
        {
            Outcome::Answer => {
                m.cache_hits.inc();
                send_now(&self.shared, &self.scratch, src);
            }
            Outcome::Refresh => match cache.socket.try_send(&self.scratch) {
                Ok(n) => {
                    self.pace.take(now, REFRESH_RESERVE);
                    m.cache_refreshes.inc();
                    m.upstream_packets.inc();
                    m.upstream_bytes.add(n as u64);
                }
                Err(e) => {
                    trace!(error = %e, "cache refresh send");
                    cache.machine.unsent(q);
                    m.drop(DropReason::CacheBusy);
                }
            },
            Outcome::Waiting => {}
            Outcome::Busy => m.drop(DropReason::CacheBusy),
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

    /// A `getchallenge`: through the join gate (a proven source first), then to the client's
    /// session (opened if needed). A queued one comes back through [`Handler::release_joins`].
    fn join(&mut self, src: SocketAddr, data: &[u8], now: Instant, proven: bool) {
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
                debug!("{src} dropped ({})", reason.name());
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
    fn session_only(&mut self, src: SocketAddr, data: &[u8]) {
        let shared = &self.shared;
        let st = shared.lock();
        match st.sessions.get(&src) {
            Some(s) => push(shared, &mut self.touched, s, data, shared.now_ms()),
            None => {
                debug!("{src} dropped (no_session)");
                shared.metrics.drop(DropReason::NoSession);
            }
        }
    }

    /// An in-game packet: its qport must be its session's own (pinned on the first one), and
    /// no other session's. From an unknown address, a qport that an established session of the
    /// same IP holds, silent for `rebind_quiet`, moves that session there (a NAT that
    /// rebound); any other pinned qport is dropped; an unpinned one opens a half-open session.
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
                Ok(()) => push(shared, &mut self.touched, &s, data, now_ms),
                Err(reason) => shared.metrics.drop(reason),
            }
            return;
        }
        let Some(holder) = st.sessions.qport_holder(qport).cloned() else {
            open_or_push(shared, &mut self.touched, &mut st, src, data, Some(qport));
            return;
        };
        let quiet = now_ms.saturating_sub(holder.last_client_ms());
        if holder.client().ip() == src.ip()
            && holder.phase() == Phase::Established
            && quiet >= shared.config.caps.rebind_quiet.as_millis() as u64
        {
            let from = holder.client();
            st.sessions.rebind(&holder, src);
            shared.metrics.sessions_rebound.inc();
            debug!("session {from} moved to {src} (qport {qport})");
            push(shared, &mut self.touched, &holder, data, now_ms);
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
    match st.sessions.admit(src.ip()) {
        Ok(None) => {}
        Ok(Some(victim)) => {
            victim.cut();
            shared.metrics.sessions_recycled.inc();
        }
        Err(reason) => {
            shared.refused(reason, src);
            return;
        }
    }
    let Some(permit) = shared.budget.sessions.try_acquire() else {
        shared.refused(DropReason::SessionCap, src);
        return;
    };
    match forward::open(shared, src, now_ms, permit) {
        Ok(s) => {
            st.sessions.insert(Arc::clone(&s));
            if let Some(q) = qport {
                // A new session takes a free qport (the caller checked it is free).
                let _ = st.sessions.check_qport(&s, q);
            }
            push(shared, touched, &s, data, now_ms);
            shared.metrics.sessions_opened.inc();
            shared.gauges(&st.sessions);
            debug!("session + {src} ({} active)", st.sessions.len());
        }
        Err(e) => {
            shared.metrics.drop(DropReason::Upstream);
            shared.throttled(|n| {
                warn!("cannot open a session for {src}: {e} ({n} more warnings not logged)");
            });
        }
    }
}

/// Queues `data` on session `s` and notes the session in `touched` (sent at the end of the
/// batch, [`Handler::send_touched`]), counting a refusal.
fn push(shared: &Shared, touched: &mut Touched, s: &Arc<Session>, data: &[u8], now_ms: u64) {
    match s.push(data, now_ms) {
        Ok(()) => touched.note(s),
        Err(Refused::QueueFull) => shared.metrics.drop(DropReason::QueueFull),
        Err(Refused::OverBudget) => shared.metrics.drop(DropReason::QueuedBytes),
    }
}
