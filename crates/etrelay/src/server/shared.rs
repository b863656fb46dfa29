//! What the tasks of one server share: its settings, its public socket, its counters, the
//! state lock over its sessions and bans, the buffer the session tasks receive into, and the
//! rate-limited warning of refused sessions.
//!
//! The relay loop, the session tasks, the heartbeat task and the [`super::ServerHandle`] each
//! hold an `Arc<Shared>`. The state mutex is a `std` mutex, never held across an `.await`:
//! every critical section is a few map operations (opening a session adds a non-blocking bind
//! and connect; a ban adds cancelling the sessions it cuts).

use std::collections::HashMap;
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
use super::carry::{self, Carried};
use super::heartbeat::ProbeStatus;
use super::metrics::{DropReason, ServerMetrics};
use super::pressure::{Flood, Pressure};
use super::proven::Proven;
use super::session::Session;
use super::table::Table;
use crate::bans::BanTable;
use crate::clock::{Instant, unix, wall_now};
use crate::config::ServerConfig;
use crate::et::challenge::Facts;
use crate::et::connect::Reader;
use crate::et::info::{INFO_RESPONSE, STATUS_RESPONSE, find_key, info_string};
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
    /// Translated sessions of the relay's last run, waiting for their clients' next packet
    /// (`super::carry`).
    pub(super) carried: HashMap<SocketAddr, Carried>,
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
    /// True when the public socket is IPv6 and takes IPv4 too (`IPV6_V6ONLY` off).
    pub(super) dual_stack: bool,
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
    /// What the game server said of itself (protocol, game name), and a count of changes the
    /// relay loop watches.
    facts: Mutex<Facts>,
    facts_changes: AtomicU64,
    /// The session tasks' `connect` reader and writer, and its buffer (one handshake at a time).
    connects: Mutex<(Reader, Vec<u8>)>,
    /// Milliseconds after the epoch of the last datagram from the game server (any socket).
    heard_ms: AtomicU64,
    /// Milliseconds after the epoch (plus one) of the last heartbeat sent; 0 before any.
    beat_ms: AtomicU64,
}

impl Shared {
    /// The state of a server starting now on `public`; `answers` receives the game server's
    /// answers on the sessions' sockets.
    pub(super) fn new(
        config: ServerConfig,
        public: ReadSocket,
        answers: PairRecv,
        public_addr: SocketAddr,
        dual_stack: bool,
        budget: Budget,
        cancel: CancellationToken,
    ) -> Self {
        let proven = match &config.proven_file {
            Some(path) => Proven::load(path, unix(wall_now())),
            None => Proven::default(),
        };
        let metrics = ServerMetrics::default();
        metrics.proven_sources.set(proven.len() as u64);
        let carried = match &config.carry_file {
            Some(path) => carry::load(path, unix(wall_now())),
            None => HashMap::new(),
        };
        let state = State {
            sessions: Table::new(config.caps),
            bans: BanTable::default(),
            proven,
            carried,
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
            facts: Mutex::new(Facts::default()),
            facts_changes: AtomicU64::new(0),
            connects: Mutex::new((Reader::default(), Vec::with_capacity(2048))),
            heard_ms: AtomicU64::new(0),
            beat_ms: AtomicU64::new(0),
            dual_stack,
        }
    }

    /// A heartbeat goes to the masters now: their checks are expected.
    pub(super) fn heartbeat_sent(&self) {
        self.beat_ms.store(self.now_ms() + 1, Ordering::Release);
    }

    /// The last heartbeat (its time as an id) and how long ago it went; `None` before any.
    pub(super) fn since_beat(&self) -> Option<(u64, Duration)> {
        let at = self.beat_ms.load(Ordering::Acquire);
        (at > 0).then(|| {
            let ago = (self.now_ms() + 1).saturating_sub(at);
            (at, Duration::from_millis(ago))
        })
    }

    /// Learns what an answer of the game server (whole datagram) says of its protocols and
    /// game name: an `infoResponse`'s `protocol` and `gamename`, a `statusResponse`'s
    /// `com_protocol` (ioquake3's own protocol).
    pub(super) fn learn_info(&self, packet: &[u8]) {
        if let Some(info) = info_string(packet, STATUS_RESPONSE) {
            let modern = find_key(info, b"com_protocol")
                .map(|r| crate::et::connect::atoi(&info[r]))
                .filter(|p| *p > 0);
            if modern.is_some() {
                self.learn(|f| f.modern = modern);
            }
            return;
        }
        let Some(info) = info_string(packet, INFO_RESPONSE) else {
            return;
        };
        let protocol = find_key(info, b"protocol")
            .map(|r| crate::et::connect::atoi(&info[r]))
            .filter(|p| *p > 0);
        let gamename = find_key(info, b"gamename")
            .map(|r| info[r].to_vec())
            .filter(|g| !g.is_empty());
        self.learn(|f| {
            if protocol.is_some() {
                f.protocol = protocol;
            }
            if gamename.is_some() {
                f.gamename = gamename;
            }
        });
    }

    /// Changes what the relay knows of the game server.
    pub(super) fn learn(&self, change: impl FnOnce(&mut Facts)) {
        let mut f = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        let before = f.clone();
        change(&mut f);
        if *f != before {
            self.facts_changes.fetch_add(1, Ordering::Release);
        }
    }

    /// The facts, when they changed since `seen` (a count from the last call), with the new
    /// count.
    pub(super) fn facts_since(&self, seen: u64) -> Option<(Facts, u64)> {
        let now = self.facts_changes.load(Ordering::Acquire);
        (now != seen).then(|| {
            let f = self.facts.lock().unwrap_or_else(|p| p.into_inner()).clone();
            (f, now)
        })
    }

    /// What the relay knows of the game server now.
    pub(super) fn facts(&self) -> Facts {
        self.facts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `f` on the session tasks' `connect` reader and its buffer.
    pub(super) fn with_connects<T>(&self, f: impl FnOnce(&mut Reader, &mut Vec<u8>) -> T) -> T {
        let mut c = self.connects.lock().unwrap_or_else(|p| p.into_inner());
        let (reader, buf) = &mut *c;
        f(reader, buf)
    }

    /// The game server sent something now.
    #[inline]
    pub(super) fn heard(&self) {
        // Plus one: 0 means never.
        self.heard_ms
            .fetch_max(self.now_ms() + 1, Ordering::Relaxed);
    }

    /// Whether the game server sent anything within `within` of now (and at all).
    pub(super) fn heard_within(&self, within: Duration) -> bool {
        let at = self.heard_ms.load(Ordering::Relaxed);
        at > 0 && (self.now_ms() + 1).saturating_sub(at) <= within.as_millis() as u64
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
            trace!(client = %who, reason = %reason.name(), "session refused");
            return;
        }
        self.throttled(|n| {
            warn!(
                public = %self.public_addr,
                client = %who,
                reason = %reason.name(),
                not_logged = n,
                "session refused"
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
