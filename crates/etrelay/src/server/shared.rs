//! What the tasks of one server share: its settings, its public socket, its counters, and the
//! state lock over its sessions and bans.
//!
//! The relay loop, the session tasks, the heartbeat task and the [`super::ServerHandle`] each
//! hold an `Arc<Shared>`. The state mutex is a `std` mutex, never held across an `.await`:
//! every critical section is a few map operations (opening a session adds a non-blocking bind
//! and connect; a ban adds cancelling the sessions it cuts).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use guard::admission::Gate;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::trace;

use super::heartbeat::ProbeStatus;
use super::metrics::ServerMetrics;
use super::session::Session;
use crate::bans::BanTable;
use crate::clock::Instant;
use crate::config::ServerConfig;

/// What the state lock guards.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Open sessions by client address.
    pub(super) sessions: HashMap<SocketAddr, Arc<Session>>,
    /// The server's bans.
    pub(super) bans: BanTable,
}

/// Everything of one server that its tasks share.
#[derive(Debug)]
pub(super) struct Shared {
    /// The server's settings.
    pub(super) config: ServerConfig,
    /// The public socket: the relay loop receives on it; everyone sends from it.
    pub(super) public: UdpSocket,
    /// Its address.
    pub(super) public_addr: SocketAddr,
    /// The server's counters.
    pub(super) metrics: ServerMetrics,
    /// Sessions and bans.
    state: Mutex<State>,
    /// What the last probe found.
    probe: Mutex<ProbeStatus>,
    /// Base of the millisecond timestamps sessions keep.
    epoch: Instant,
    /// Slots of `MAX_SESSIONS`, shared by every server of the process.
    pub(super) sessions_gate: Gate,
    /// The next session's id.
    next_session: AtomicU64,
    /// Stops the server: the relay loop, the heartbeat task, and every session (child tokens).
    pub(super) cancel: CancellationToken,
    /// The session tasks, waited for when the server stops.
    pub(super) tracker: TaskTracker,
}

impl Shared {
    /// The state of a server starting now on `public`.
    pub(super) fn new(
        config: ServerConfig,
        public: UdpSocket,
        public_addr: SocketAddr,
        sessions_gate: Gate,
        cancel: CancellationToken,
    ) -> Self {
        Shared {
            config,
            public,
            public_addr,
            metrics: ServerMetrics::default(),
            state: Mutex::new(State::default()),
            probe: Mutex::new(ProbeStatus::default()),
            epoch: Instant::now(),
            sessions_gate,
            next_session: AtomicU64::new(1),
            cancel,
            tracker: TaskTracker::new(),
        }
    }

    /// Milliseconds since the server started: the sessions' activity timestamps.
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The instant `ms` milliseconds after the server started.
    pub(super) fn instant_of(&self, ms: u64) -> Instant {
        self.epoch + std::time::Duration::from_millis(ms)
    }

    /// A new session id, unique among the server's sessions.
    pub(super) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes the state lock.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the probe status lock.
    pub(super) fn probe_status(&self) -> MutexGuard<'_, ProbeStatus> {
        self.probe.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes `session` from the table if it is still the one there; returns the open count.
    pub(super) fn remove_session(&self, session: &Session) -> usize {
        let mut st = self.lock();
        if st
            .sessions
            .get(&session.client)
            .is_some_and(|s| s.id == session.id)
        {
            st.sessions.remove(&session.client);
        }
        let n = st.sessions.len();
        self.metrics.sessions_open.set(n as u64);
        n
    }

    /// Sends a datagram to a client from the public socket.
    pub(super) async fn send_to_client(&self, data: &[u8], to: SocketAddr) {
        match self.public.send_to(data, to).await {
            Ok(n) => {
                self.metrics.reply_packets.inc();
                self.metrics.reply_bytes.add(n as u64);
            }
            Err(e) => {
                self.metrics.reply_errors.inc();
                trace!(error = %e, "reply to client");
            }
        }
    }
}
