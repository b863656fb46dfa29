//! How a client gets in, in the relay loop: its `getchallenge` answered with the relay's own
//! challenge ([`super::super::challenges`]), its `connect` checked against it, kept on its
//! session and the server's own challenge asked for through the fair join gate
//! ([`super::super::joins`]), the only step that spends anything of the server's. While the
//! server's protocol is not one the relay translates, both go to the server as before.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::debug;

use super::packet::{open, push};
use super::{Handler, send_now};
use crate::clock::Instant;
use crate::et::challenge::write_ask;
use crate::server::challenges::Checked;
use crate::server::handshake::Next;
use crate::server::joins::Offer;
use crate::server::metrics::DropReason;
use crate::server::session::Session;

impl Handler {
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
        src: SocketAddr,
        data: &[u8],
        now: Instant,
        proven: bool,
    ) {
        if self.challenges.dialect().is_none() {
            self.join(src, data, now, proven);
            return;
        }
        match self.challenges.answer(src, data, now, &mut self.scratch) {
            Ok(()) => {
                self.shared.metrics.challenges_answered.inc();
                send_now(&self.shared, &self.scratch, src, "the relay's challenge");
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
    pub(super) fn connect(&mut self, src: SocketAddr, data: &[u8], now: Instant, proven: bool) {
        let Some(dialect) = self.challenges.dialect() else {
            self.session_only(src, data);
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
                    push(&self.shared, &mut self.touched, &s, &self.join_buf, now_ms);
                } else {
                    m.drop(DropReason::Malformed);
                }
            }
            Next::Ask(number) => {
                debug!(client = %src, "client holds the relay's challenge: the server's asked for");
                self.ask_server(src, &s, number, now, proven);
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
        let m = &self.shared.metrics;
        match offer {
            Offer::Pass => {
                m.challenges_asked.inc();
                if proven {
                    m.proven_joins.inc();
                }
                let now_ms = self.shared.now_ms();
                push(&self.shared, &mut self.touched, s, &self.join_buf, now_ms);
            }
            Offer::Queued => {
                if proven {
                    m.proven_joins.inc();
                }
            }
            Offer::Refused(reason) => {
                debug!(client = %src, reason = %reason.name(), "dropped");
                m.drop(reason);
                s.handshake().forget_ask();
            }
        }
        m.joins_queued.set(self.joins.queued() as u64);
    }
}
