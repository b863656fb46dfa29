//! How a client gets in, in the relay loop: its `getchallenge` answered with the relay's own
//! challenge ([`crate::server::challenges`]), its `connect` checked against it, kept on its
//! session and the server's own challenge asked for through the fair join gate
//! ([`crate::server::joins`]), the only step that spends anything of the server's. While the
//! server's protocol is not one the relay translates, both go to the server as before.
//! [`Joining`] owns that state; the relay loop's handler hands it a client's packets.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::debug;

use super::sessions::{Touched, open, open_or_push, push, send_now, session_only};
use crate::clock::Instant;
use crate::et::challenge::write_ask;
use crate::server::challenges::{Challenges, Checked};
use crate::server::handshake::Next;
use crate::server::joins::{Joins, Offer, Pace};
use crate::server::metrics::DropReason;
use crate::server::session::Session;
use crate::server::shared::Shared;

/// Getting in: the relay's challenges, the join gate and the pace of what reaches the server.
#[derive(Debug)]
pub(super) struct Joining {
    shared: Arc<Shared>,
    /// The relay's own challenges: `getchallenge` answered, `connect` checked.
    challenges: Challenges,
    /// Requests the game server limits per source IP: `getchallenge` and cache refreshes.
    pace: Pace,
    /// The per-source limit and fair queue of `getchallenge`.
    joins: Joins,
    /// Where a queued `getchallenge` or an ask for the server's challenge is written.
    join_buf: Vec<u8>,
    /// Where the relay's `challengeResponse` is written.
    answer_buf: Vec<u8>,
    /// The count of the server's facts last taken ([`Shared::facts_since`]).
    facts_seen: u64,
}

impl Joining {
    pub(super) fn new(shared: Arc<Shared>, now: Instant) -> Self {
        let cfg = &shared.config;
        Joining {
            challenges: Challenges::new(
                cfg.game,
                cfg.challenges.answers_per_second,
                cfg.challenges.server,
                now,
            ),
            pace: Pace::new(cfg.joins.upstream_burst, cfg.joins.upstream_interval, now),
            joins: Joins::new(&cfg.joins),
            join_buf: Vec::with_capacity(128),
            answer_buf: Vec::with_capacity(128),
            facts_seen: 0,
            shared,
        }
    }

    /// Whether `challenge` is the relay's own for `src` (a query that holds it proves its
    /// address).
    pub(super) fn is_ours(&self, src: SocketAddr, challenge: &[u8], now: Instant) -> bool {
        self.challenges.is_ours(src, challenge, now)
    }

    /// True while the relay gives the challenges (an address without a session opens none
    /// with an in-game packet).
    pub(super) fn relay_challenges(&self) -> bool {
        self.challenges.dialect().is_some()
    }

    /// The pace of requests to the server, which the query cache's refreshes share.
    pub(super) fn pace(&mut self) -> &mut Pace {
        &mut self.pace
    }

    /// When the next queued `getchallenge` is due, if one is.
    pub(super) fn next_due(&self, now: Instant) -> Option<Instant> {
        self.joins.next_due(now, &self.pace)
    }

    /// The periodic clean-up: forgotten sources and challenges, then what the server said.
    pub(super) fn tick(&mut self, now: Instant) {
        self.joins.sweep(now);
        self.challenges.sweep(now);
        self.take_facts();
    }

    /// Takes what the server said of itself since the last look.
    pub(super) fn take_facts(&mut self) {
        if let Some((facts, seen)) = self.shared.facts_since(self.facts_seen) {
            self.facts_seen = seen;
            let name = self.shared.public_addr.to_string();
            self.challenges.learn(&facts, &name);
            self.shared
                .metrics
                .relay_challenges
                .set(u64::from(self.challenges.dialect().is_some()));
        }
    }

    /// A `getchallenge`: answered with the relay's challenge, or (the server giving its own)
    /// through the join gate to the server.
    pub(super) fn getchallenge(
        &mut self,
        touched: &mut Touched,
        src: SocketAddr,
        data: &[u8],
        now: Instant,
        proven: bool,
    ) {
        if self.challenges.dialect().is_none() {
            self.join(touched, src, data, now, proven);
            return;
        }
        match self.challenges.answer(src, data, now, &mut self.answer_buf) {
            Ok(()) => {
                self.shared.metrics.challenges_answered.inc();
                send_now(&self.shared, &self.answer_buf, src, "the relay's challenge");
            }
            Err(reason) => {
                debug!(client = %src, reason = %reason.name(), "dropped");
                self.shared.metrics.drop(reason);
            }
        }
    }

    /// A `connect`. With the relay's challenge for `src`: kept on `src`'s session (opened if
    /// needed, its qport taken), and the server's own challenge asked for, or the kept one
    /// sent at once when the server gave one already. Without it: only to a session the
    /// server itself gave a challenge (before the relay answered in its stead), else dropped.
    pub(super) fn connect(
        &mut self,
        touched: &mut Touched,
        src: SocketAddr,
        data: &[u8],
        now: Instant,
        proven: bool,
    ) {
        let Some(dialect) = self.challenges.dialect() else {
            session_only(&self.shared, touched, src, data);
            return;
        };
        let shared = Arc::clone(&self.shared);
        let m = &shared.metrics;
        let c = match self.challenges.check(src, data, now) {
            Ok(Checked::Ours(c)) => c,
            Ok(Checked::Other) => {
                debug!(client = %src, "connect without the relay's challenge");
                m.drop(DropReason::BadCookie);
                return;
            }
            Err(e) => {
                debug!(client = %src, error = %e, "connect dropped");
                m.drop(DropReason::Malformed);
                return;
            }
        };
        m.connects_checked.inc();
        let Some(s) = self.checked_session(src, c.qport) else {
            return;
        };
        if !s.handshake().allow(now.into_std()) {
            m.drop(DropReason::ConnectLimit);
            return;
        }
        let now_ms = shared.now_ms();
        let next = s
            .handshake()
            .wait(data, c.challenge, c.protocol, dialect, now_ms);
        match next {
            Next::Wait => {}
            Next::Send(challenge) => {
                if self
                    .challenges
                    .rewrite(&c, challenge, &mut self.join_buf)
                    .is_ok()
                {
                    push(&self.shared, touched, &s, &self.join_buf, now_ms);
                } else {
                    m.drop(DropReason::Malformed);
                }
            }
            Next::Ask(number) => {
                debug!(client = %src, "client holds the relay's challenge: the server's asked for");
                self.ask_server(touched, src, &s, number, now, proven);
            }
        }
    }

    /// `src`'s session for a checked `connect` announcing `qport`: opened if needed, the qport
    /// taken (from an unproven holder, or the same player's former session); `None` when a
    /// cap refused it or a player in game holds the qport (counted).
    fn checked_session(&mut self, src: SocketAddr, qport: u16) -> Option<Arc<Session>> {
        let shared = &self.shared;
        let mut st = shared.lock();
        let s = match st.sessions.get(&src).cloned() {
            Some(s) => s,
            None => open(shared, &mut st, src, shared.now_ms())?,
        };
        let quiet = shared.config.caps.rebind_quiet.as_millis() as u64;
        match st.sessions.pin_connect(&s, qport, shared.now_ms(), quiet) {
            Ok(cut) => {
                if let Some(former) = cut {
                    former.cut();
                    shared.gauges(&st.sessions);
                }
                Some(s)
            }
            Err(reason) => {
                debug!(client = %src, "connect for a qport a player holds");
                shared.metrics.drop(reason);
                None
            }
        }
    }

    /// Asks the server for a challenge for `src`'s session `s`, through the join gate; `number`
    /// is ioquake3's client number of the ask.
    fn ask_server(
        &mut self,
        touched: &mut Touched,
        src: SocketAddr,
        s: &Arc<Session>,
        number: i32,
        now: Instant,
        proven: bool,
    ) {
        let Some(dialect) = self.challenges.dialect() else {
            return;
        };
        write_ask(dialect, self.challenges.facts(), number, &mut self.join_buf);
        let offer = self
            .joins
            .offer(src, &self.join_buf, now, &mut self.pace, proven);
        match self.gate_said(src, offer, proven) {
            Some(true) => {
                self.shared.metrics.challenges_asked.inc();
                let now_ms = self.shared.now_ms();
                push(&self.shared, touched, s, &self.join_buf, now_ms);
            }
            Some(false) => {}
            None => s.handshake().forget_ask(),
        }
    }

    /// Counts what the join gate said of `src`'s request (`proven`: one of a proven source),
    /// and the gate's queue: `Some(true)` when the request goes to the server now,
    /// `Some(false)` when it waits its turn, `None` when it was refused.
    fn gate_said(&self, src: SocketAddr, offer: Offer, proven: bool) -> Option<bool> {
        let m = &self.shared.metrics;
        m.joins_queued.set(self.joins.queued() as u64);
        let passes = match offer {
            Offer::Pass => true,
            Offer::Queued => false,
            Offer::Refused(reason) => {
                debug!(client = %src, reason = %reason.name(), "dropped");
                m.drop(reason);
                return None;
            }
        };
        if proven {
            m.proven_joins.inc();
        }
        Some(passes)
    }

    /// A `getchallenge` for the server (it gives its own challenges): through the join gate
    /// (a proven source, a master among them, first), then to the client's session (opened
    /// if needed). A queued one comes back through [`Joining::release_joins`].
    pub(super) fn join(
        &mut self,
        touched: &mut Touched,
        src: SocketAddr,
        data: &[u8],
        now: Instant,
        proven: bool,
    ) {
        let offer = self.joins.offer(src, data, now, &mut self.pace, proven);
        if self.gate_said(src, offer, proven) == Some(true) {
            let mut st = self.shared.lock();
            open_or_push(&self.shared, touched, &mut st, src, data, None);
        }
    }

    /// Sends on the queued `getchallenge` whose turn has come.
    pub(super) fn release_joins(&mut self, touched: &mut Touched, now: Instant) {
        while let Some(src) = self.joins.release(now, &mut self.pace, &mut self.join_buf) {
            if self.challenges.dialect().is_some() {
                self.shared.metrics.challenges_asked.inc();
            }
            let mut st = self.shared.lock();
            open_or_push(&self.shared, touched, &mut st, src, &self.join_buf, None);
        }
        self.shared
            .metrics
            .joins_queued
            .set(self.joins.queued() as u64);
    }
}
