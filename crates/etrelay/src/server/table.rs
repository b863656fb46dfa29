//! The session table of one server: sessions by client address, what each source IP and prefix
//! holds, the half-open sessions in the order they are recycled, and the pinned qports.
//!
//! No I/O and no clock: the relay loop and the session tasks call it under the server's state
//! lock. The policy (docs/etrelay.md, "Sessions under attack"):
//!
//! - A new session is **half-open**. Half-open sessions have caps per source IP and per prefix
//!   (/24, /64), where a newcomer is refused, and a cap per server, where the oldest half-open
//!   session is recycled: first the oldest the game server never answered, then the oldest it
//!   answered.
//! - **Established** sessions (the game server showed a real client) are never recycled; caps
//!   per server and per IP refuse the promotion past them.
//! - A qport is pinned to one session: in-game packets with a qport another session holds never
//!   reach the game server (an established session takes a qport over from a half-open one).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::metrics::DropReason;
use super::session::{Phase, Session};
use crate::config::SessionCaps;

/// An IPv4 /24 or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Prefix {
    /// The first three bytes of an IPv4 address.
    V4([u8; 3]),
    /// The first eight bytes of an IPv6 address.
    V6([u8; 8]),
}

/// The prefix `ip` belongs to (an IPv4-mapped IPv6 address is its IPv4 address).
pub(super) fn prefix(ip: IpAddr) -> Prefix {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let o = a.octets();
            Prefix::V4([o[0], o[1], o[2]])
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            Prefix::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
        }
    }
}

/// Sessions one source IP holds.
#[derive(Debug, Default, Clone, Copy)]
struct PerIp {
    half_open: usize,
    established: usize,
}

/// The session table; see the module docs.
#[derive(Debug)]
pub(super) struct Table {
    caps: SessionCaps,
    sessions: HashMap<SocketAddr, Arc<Session>>,
    ips: HashMap<IpAddr, PerIp>,
    /// Half-open sessions per prefix.
    prefixes: HashMap<Prefix, usize>,
    half_open: usize,
    established: usize,
    /// Half-open sessions never answered, oldest first (stale entries skipped lazily).
    unanswered: VecDeque<(u64, SocketAddr)>,
    /// Half-open sessions the server answered, oldest answer first (stale entries skipped).
    answered: VecDeque<(u64, SocketAddr)>,
    /// Pinned qports and their session.
    qports: HashMap<u16, Arc<Session>>,
}

impl Table {
    /// An empty table with `caps`.
    pub(super) fn new(caps: SessionCaps) -> Self {
        Table {
            caps,
            sessions: HashMap::new(),
            ips: HashMap::new(),
            prefixes: HashMap::new(),
            half_open: 0,
            established: 0,
            unanswered: VecDeque::new(),
            answered: VecDeque::new(),
            qports: HashMap::new(),
        }
    }

    /// The open session of `client`.
    pub(super) fn get(&self, client: &SocketAddr) -> Option<&Arc<Session>> {
        self.sessions.get(client).filter(|s| !s.is_closed())
    }

    /// Sessions in the table.
    pub(super) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Half-open sessions in the table.
    pub(super) fn half_open(&self) -> usize {
        self.half_open
    }

    /// Established sessions in the table.
    pub(super) fn established(&self) -> usize {
        self.established
    }

    /// Every session.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.sessions.values()
    }

    /// May `src` open a half-open session? At the per-server cap the oldest half-open session
    /// is taken out of the table and returned, for the caller to cut.
    ///
    /// # Errors
    /// The [`DropReason`] of a refusal: per IP or per prefix cap reached.
    pub(super) fn admit(&mut self, src: IpAddr) -> Result<Option<Arc<Session>>, DropReason> {
        if self.ips.get(&src).map_or(0, |c| c.half_open) >= self.caps.half_open_per_ip {
            return Err(DropReason::IpCap);
        }
        if self.prefixes.get(&prefix(src)).copied().unwrap_or(0) >= self.caps.half_open_per_prefix {
            return Err(DropReason::PrefixCap);
        }
        if self.half_open < self.caps.half_open_per_server {
            return Ok(None);
        }
        let victim = self.oldest_half_open().ok_or(DropReason::HalfOpenCap)?;
        self.remove(&victim);
        Ok(Some(victim))
    }

    fn oldest_half_open(&mut self) -> Option<Arc<Session>> {
        for (queue, phase) in [
            (&mut self.unanswered, Phase::HalfOpen),
            (&mut self.answered, Phase::Answered),
        ] {
            while let Some((id, addr)) = queue.pop_front() {
                if let Some(s) = self.sessions.get(&addr)
                    && s.id == id
                    && s.phase() == phase
                {
                    return Some(Arc::clone(s));
                }
            }
        }
        None
    }

    /// Adds a new (half-open) session; [`Table::admit`] said yes.
    pub(super) fn insert(&mut self, s: Arc<Session>) {
        let client = s.client();
        self.ips.entry(client.ip()).or_default().half_open += 1;
        *self.prefixes.entry(prefix(client.ip())).or_default() += 1;
        self.half_open += 1;
        self.unanswered.push_back((s.id, client));
        self.compact();
        if let Some(old) = self.sessions.insert(client, s) {
            // A closed session not yet removed by its task: forget it now.
            self.forget(&old);
        }
    }

    /// The game server answered the half-open session `s`.
    pub(super) fn answered(&mut self, s: &Session) {
        if s.phase() == Phase::HalfOpen && self.holds(s) {
            s.set_phase(Phase::Answered);
            self.answered.push_back((s.id, s.client()));
            self.compact();
        }
    }

    /// The game server showed a real client behind `s`: it becomes established.
    ///
    /// # Errors
    /// The established caps (per server, per IP) are reached: the caller cuts the session.
    pub(super) fn promote(&mut self, s: &Session) -> Result<(), DropReason> {
        if s.phase() == Phase::Established || !self.holds(s) {
            return Ok(());
        }
        let ip = s.client().ip();
        let per_ip = self.ips.get(&ip).map_or(0, |c| c.established);
        if self.established >= self.caps.established_per_server {
            return Err(DropReason::SessionCap);
        }
        if per_ip >= self.caps.established_per_ip {
            return Err(DropReason::IpCap);
        }
        self.count_half_open(ip, -1);
        s.set_phase(Phase::Established);
        self.ips.entry(ip).or_default().established += 1;
        self.established += 1;
        Ok(())
    }

    /// Takes `s` out of the table if it is still there; false when it was not.
    pub(super) fn remove(&mut self, s: &Session) -> bool {
        if !self.holds(s) {
            return false;
        }
        if let Some(gone) = self.sessions.remove(&s.client()) {
            self.forget(&gone);
        }
        true
    }

    /// Takes every session of `ip` out of the table (a ban) and returns them.
    pub(super) fn remove_ip(&mut self, ip: IpAddr) -> Vec<Arc<Session>> {
        let cut: Vec<Arc<Session>> = self
            .sessions
            .values()
            .filter(|s| s.client().ip() == ip)
            .cloned()
            .collect();
        for s in &cut {
            self.remove(s);
        }
        cut
    }

    /// May session `s` send an in-game packet with `qport`? Pins it on its first one.
    ///
    /// # Errors
    /// [`DropReason::QportConflict`]: `s` pinned another qport, or another session holds `qport`.
    pub(super) fn check_qport(&mut self, s: &Arc<Session>, qport: u16) -> Result<(), DropReason> {
        if let Some(mine) = s.qport() {
            return if mine == qport && self.owns(s, qport) {
                Ok(())
            } else {
                Err(DropReason::QportConflict)
            };
        }
        match self.qports.entry(qport) {
            Entry::Occupied(mut o) => {
                let holder = o.get();
                let takeover =
                    holder.phase() != Phase::Established && s.phase() == Phase::Established;
                if !takeover {
                    return Err(DropReason::QportConflict);
                }
                o.insert(Arc::clone(s));
            }
            Entry::Vacant(v) => {
                v.insert(Arc::clone(s));
            }
        }
        s.pin_qport(Some(qport));
        Ok(())
    }

    /// Session `s` sent a checked `connect` (its address proven by the relay's challenge)
    /// announcing `qport`: it takes that qport, leaving the one it held. Another session
    /// holding it keeps it if established (a player in game), unless it is of the same IP and
    /// its client silent for `quiet_ms` at `now_ms` (the same player back from a new port); a
    /// holder not established (unproven) gives it up. A holder that gives it up leaves the
    /// table and is returned for the caller to cut.
    ///
    /// # Errors
    /// [`DropReason::QportConflict`]: a player in game holds `qport`.
    pub(super) fn pin_connect(
        &mut self,
        s: &Arc<Session>,
        qport: u16,
        now_ms: u64,
        quiet_ms: u64,
    ) -> Result<Option<Arc<Session>>, DropReason> {
        let mut cut = None;
        if let Some(holder) = self.qports.get(&qport).filter(|h| h.id != s.id).cloned() {
            let same_player = holder.client().ip() == s.client().ip()
                && now_ms.saturating_sub(holder.last_client_ms()) >= quiet_ms;
            if holder.phase() == Phase::Established && !same_player {
                return Err(DropReason::QportConflict);
            }
            self.remove(&holder);
            self.qports.remove(&qport);
            cut = Some(holder);
        }
        if let Some(mine) = s.qport()
            && mine != qport
            && self.owns(s, mine)
        {
            self.qports.remove(&mine);
        }
        self.qports.insert(qport, Arc::clone(s));
        s.pin_qport(Some(qport));
        Ok(cut)
    }

    /// The session holding `qport`.
    pub(super) fn qport_holder(&self, qport: u16) -> Option<&Arc<Session>> {
        self.qports.get(&qport)
    }

    /// Moves the established session `s` to `to` (its NAT rebound to a new port).
    pub(super) fn rebind(&mut self, s: &Arc<Session>, to: SocketAddr) {
        let from = s.client();
        if from.ip() != to.ip() || !self.holds(s) || self.sessions.contains_key(&to) {
            return;
        }
        self.sessions.remove(&from);
        s.set_client(to);
        self.sessions.insert(to, Arc::clone(s));
    }

    fn owns(&self, s: &Session, qport: u16) -> bool {
        self.qports.get(&qport).is_some_and(|h| h.id == s.id)
    }

    fn holds(&self, s: &Session) -> bool {
        self.sessions.get(&s.client()).is_some_and(|t| t.id == s.id)
    }

    /// Counts of a session leaving the table.
    fn forget(&mut self, s: &Session) {
        let ip = s.client().ip();
        if s.phase() == Phase::Established {
            self.established -= 1;
            if let Some(c) = self.ips.get_mut(&ip) {
                c.established -= 1;
            }
        } else {
            self.count_half_open(ip, -1);
        }
        if self
            .ips
            .get(&ip)
            .is_some_and(|c| c.half_open + c.established == 0)
        {
            self.ips.remove(&ip);
        }
        if let Some(q) = s.qport()
            && self.owns(s, q)
        {
            self.qports.remove(&q);
        }
    }

    fn count_half_open(&mut self, ip: IpAddr, by: isize) {
        self.half_open = self.half_open.saturating_add_signed(by);
        if let Some(c) = self.ips.get_mut(&ip) {
            c.half_open = c.half_open.saturating_add_signed(by);
        }
        let p = prefix(ip);
        if let Some(n) = self.prefixes.get_mut(&p) {
            *n = n.saturating_add_signed(by);
            if *n == 0 {
                self.prefixes.remove(&p);
            }
        }
    }

    /// Drops stale entries from the recycling queues once they hold many more than the cap
    /// (amortized: each entry is looked at a bounded number of times).
    fn compact(&mut self) {
        let bound = 2 * self.caps.half_open_per_server + 64;
        let sessions = &self.sessions;
        for (queue, phase) in [
            (&mut self.unanswered, Phase::HalfOpen),
            (&mut self.answered, Phase::Answered),
        ] {
            if queue.len() > bound {
                queue.retain(|(id, addr)| {
                    sessions
                        .get(addr)
                        .is_some_and(|s| s.id == *id && s.phase() == phase)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
