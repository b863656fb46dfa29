//! The relay loop's way to the sessions: a packet queued on its client's session (opened here,
//! half-open, when the table's caps admit it), the sessions noted for sending at the end of the
//! batch ([`Touched`]), and the relay's own answers sent from the public socket.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::{debug, trace, warn};

use crate::et::{self, command_word};
use crate::server::forward;
use crate::server::metrics::DropReason;
use crate::server::session::{Refused, Session};
use crate::server::shared::{Shared, State};

/// Sessions noted for sending before they are sent at once (a batch of GRO buffers can hold
/// more datagrams than [`crate::net::BATCH`]).
const TOUCHED: usize = 64;

/// The sessions that got packets since they were last sent, each once in a row
/// (a session noted again after another is sent twice; the second send finds little or
/// nothing), and how many packets they got. Bounded: past [`TOUCHED`] entries the caller sends
/// at once.
#[derive(Debug, Default)]
pub(super) struct Touched {
    sessions: Vec<Arc<Session>>,
    packets: usize,
}

impl Touched {
    pub(super) fn new() -> Self {
        Touched {
            sessions: Vec::with_capacity(TOUCHED),
            packets: 0,
        }
    }

    pub(super) fn note(&mut self, s: &Arc<Session>) {
        self.packets += 1;
        if !self.sessions.last().is_some_and(|l| Arc::ptr_eq(l, s)) {
            self.sessions.push(Arc::clone(s));
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.sessions.len() >= TOUCHED
    }

    /// How many packets were noted since the last take; none from then on.
    pub(super) fn take_packets(&mut self) -> usize {
        std::mem::take(&mut self.packets)
    }

    /// The sessions noted.
    pub(super) fn sessions(&self) -> &[Arc<Session>] {
        &self.sessions
    }

    /// The sessions noted, taken out.
    pub(super) fn drain(&mut self) -> std::vec::Drain<'_, Arc<Session>> {
        self.sessions.drain(..)
    }
}

/// `connect` and `PB_`: only for a session that exists. A `connect` can only be accepted with
/// a challenge the game server gave that session's upstream port, so a source without a
/// session has nothing to connect with.
pub(super) fn session_only(shared: &Shared, touched: &mut Touched, src: SocketAddr, data: &[u8]) {
    let st = shared.lock();
    match st.sessions.get(&src) {
        Some(s) => push(shared, touched, s, data, shared.now_ms()),
        None => {
            debug!(client = %src, reason = %DropReason::NoSession.name(), "dropped");
            shared.metrics.drop(DropReason::NoSession);
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
/// batch, the sending of the batch), counting a refusal.
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
pub(super) fn push_game(
    shared: &Shared,
    touched: &mut Touched,
    s: &Arc<Session>,
    data: &[u8],
    now_ms: u64,
) {
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

/// Sends an answer of the relay's own (`from`: where it comes from, for the debug log) from the
/// public socket without waiting; a full socket buffer drops it, as any congested UDP hop would.
pub(super) fn send_now(shared: &Shared, pkt: &[u8], to: SocketAddr, from: &str) {
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
