//! What the tasks of one server share: its settings, its public socket, its counters, the
//! state lock over its sessions and bans, the buffer the session tasks receive into, and the
//! rate-limited warning of refused sessions.
//!
//! The relay loop, the session tasks, the heartbeat task and the [`super::ServerHandle`] each
//! hold an `Arc<Shared>`. The state mutex is a `std` mutex, never held across an `.await`:
//! every critical section is a few map operations (opening a session adds a non-blocking bind
//! and connect; a ban adds cancelling the sessions it cuts).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{trace, warn};

use guard::throttle::Throttle;

use super::budget::Budget;
use super::heartbeat::ProbeStatus;
use super::metrics::{DropReason, ServerMetrics};
use super::pressure::{Flood, Pressure};
use super::proven::Proven;
use super::session::Session;
use super::table::Table;
use crate::bans::BanTable;
use crate::clock::{Instant, unix, wall_now};
use crate::config::ServerConfig;
use crate::net::{PairRecv, ReadSocket};

/// At most one warning of refused sessions (by the process's caps) or failed sockets per
/// server per this interval.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the state lock guards.
#[derive(Debug)]
pub(super) struct State {
    /// Open sessions.
    pub(super) sessions: Table,
    /// The server's bans.
    pub(super) bans: BanTable,
    /// The sources that proved their address.
    pub(super) proven: Proven,
}

/// Everything of one server that its tasks share.
#[derive(Debug)]
pub(super) struct Shared {
    /// The server's settings.
    pub(super) config: ServerConfig,
    /// The public socket: the relay loop receives on it; everyone sends from it.
    pub(super) public: ReadSocket,
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
    /// Session slots and queued bytes, shared by every server of the process.
    pub(super) budget: Budget,
    /// What the session tasks receive the game server's answers with (one at a time: no task
    /// waits while holding it).
    answers: Mutex<PairRecv>,
    /// Refusals since the last warning, and when it was written.
    warned: Mutex<Throttle>,
    /// The next session's id.
    next_session: AtomicU64,
    /// Stops the server: the relay loop, the heartbeat task, and every session (child tokens).
    pub(super) cancel: CancellationToken,
    /// The session tasks, waited for when the server stops.
    pub(super) tracker: TaskTracker,
    /// Asks the heartbeat task to resolve the masters' names again now (SIGHUP).
    pub(super) reload: Notify,
    /// Cancelled when the relay loop may start reading (its bans are in force).
    pub(super) go: CancellationToken,
    /// The addresses the masters' names resolved to last.
    masters: Mutex<Arc<[IpAddr]>>,
    /// The watch over the drops a flood causes.
    pressure: Mutex<Pressure>,
}

impl Shared {
    /// The state of a server starting now on `public`; `answers` receives the game server's
    /// answers on the sessions' sockets.
    pub(super) fn new(
        config: ServerConfig,
        public: ReadSocket,
        answers: PairRecv,
        public_addr: SocketAddr,
        budget: Budget,
        cancel: CancellationToken,
    ) -> Self {
        let proven = match &config.proven_file {
            Some(path) => Proven::load(path, unix(wall_now())),
            None => Proven::default(),
        };
        let metrics = ServerMetrics::default();
        metrics.proven_sources.set(proven.len() as u64);
        let state = State {
            sessions: Table::new(config.caps),
            bans: BanTable::default(),
            proven,
        };
        Shared {
            answers: Mutex::new(answers),
            warned: Mutex::new(Throttle::new(WARN_EVERY)),
            config,
            public,
            public_addr,
            metrics,
            state: Mutex::new(state),
            probe: Mutex::new(ProbeStatus::default()),
            epoch: Instant::now(),
            budget,
            next_session: AtomicU64::new(1),
            cancel,
            tracker: TaskTracker::new(),
            reload: Notify::new(),
            go: CancellationToken::new(),
            masters: Mutex::new(Arc::from([])),
            pressure: Mutex::new(Pressure::default()),
        }
    }

    /// Looks at the drops since the last call (the relay loop's tick) and tells the admin of
    /// a flood; see [`super::pressure`].
    pub(super) fn watch_pressure(&self, now: Instant) {
        let mut p = self.pressure.lock().unwrap_or_else(|p| p.into_inner());
        p.tick(
            &self.metrics,
            now,
            wall_now(),
            &self.public_addr.to_string(),
        );
        let since = p.floods().iter().map(|f| unix(f.since)).min().unwrap_or(0);
        self.metrics.flood_since.set(since);
    }

    /// The floods going on now.
    pub(super) fn floods(&self) -> Vec<Flood> {
        self.pressure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .floods()
    }

    /// Records the addresses the masters' names resolve to now.
    pub(super) fn set_masters(&self, mut addrs: Vec<IpAddr>) {
        for a in &mut addrs {
            *a = a.to_canonical();
        }
        addrs.sort_unstable();
        addrs.dedup();
        *self.masters.lock().unwrap_or_else(|p| p.into_inner()) = Arc::from(addrs);
    }

    /// The masters' addresses now.
    pub(super) fn masters(&self) -> Arc<[IpAddr]> {
        Arc::clone(&self.masters.lock().unwrap_or_else(|p| p.into_inner()))
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
        st.sessions.remove(session);
        self.gauges(&st.sessions);
        st.sessions.len()
    }

    /// Sets the session gauges from the table.
    pub(super) fn gauges(&self, t: &Table) {
        self.metrics.sessions_open.set(t.len() as u64);
        self.metrics.sessions_half_open.set(t.half_open() as u64);
        self.metrics
            .sessions_established
            .set(t.established() as u64);
    }

    /// Runs `f` on the session tasks' receiver of the game server's answers.
    pub(super) fn with_answers<T>(&self, f: impl FnOnce(&mut PairRecv) -> T) -> T {
        let mut rx = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rx)
    }

    /// Counts a session refused by a cap (`reason`) for `who`, and warns at most once per
    /// [`WARN_EVERY`], with the number of refusals since the last warning.
    pub(super) fn refused(&self, reason: DropReason, who: SocketAddr) {
        self.metrics.drop(reason);
        self.metrics.sessions_refused.inc();
        if matches!(
            reason,
            DropReason::HalfOpenCap | DropReason::PrefixCap | DropReason::IpCap
        ) {
            // A flood of these is told by the pressure watch, once a minute.
            trace!("session refused for {who} ({})", reason.name());
            return;
        }
        self.throttled(|n| {
            warn!(
                "{}: session refused for {who} ({}); {n} more not logged since the last warning",
                self.public_addr,
                reason.name(),
            );
        });
    }

    /// Runs `log` with the number of warnings suppressed since the last one written, at most
    /// once per [`WARN_EVERY`] for the whole server: a condition that fires per packet never
    /// floods the log.
    pub(super) fn throttled(&self, log: impl FnOnce(u64)) {
        let now = Instant::now().into_std();
        let written = self
            .warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .event(now);
        if let Some(suppressed) = written {
            log(suppressed);
        }
    }

    /// Sends a datagram to a client from the public socket without waiting; a full socket
    /// buffer drops it, as any congested UDP hop would.
    pub(super) fn try_send_to_client(&self, data: &[u8], to: SocketAddr) {
        match self.public.try_send_to(data, to) {
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
