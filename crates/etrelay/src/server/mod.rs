//! One relayed server: the unit the single-server mode runs and the registry starts and stops.
//!
//! A [`ServerHandle`] owns the server's public socket, its relay loop, its sessions, its query
//! limiter and cache, its heartbeat task, its bans and its counters. The packet path:
//!
//! ```text
//! public socket → relay loop: size → ban → classify (filter) → query limiter
//!   → query cache answer (from the public socket)        for getinfo/getstatus
//!   → session queue → upstream socket → game server       for everything else allowed
//! game server → session task → public socket → client
//! ```
//!
//! - [`relay`]: the relay loop.
//! - [`session`]: sessions and their tasks.
//! - [`cache`]: the query cache.
//! - [`heartbeat`]: probes and master heartbeats.
//! - [`metrics`]: the counters of the server.

pub mod cache;
pub mod heartbeat;
pub mod metrics;
pub mod relay;
pub mod session;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use guard::admission::Gate;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, trace};

use crate::bans::{Ban, BanTable, TableFull};
use crate::clock::Instant;
use crate::config::ServerConfig;
pub use heartbeat::ProbeStatus;
pub use metrics::{Drop, ProbeState, ServerMetrics};
use session::Session;

/// Receive and send buffer asked for the public socket.
const SOCKET_BUFFER: usize = 4 << 20;

/// What the relay loop and the sessions share. The mutex is never held across an `.await`.
#[derive(Debug)]
struct State {
    sessions: HashMap<SocketAddr, Arc<Session>>,
    bans: BanTable,
}

/// Everything of one server that its tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    config: ServerConfig,
    public: UdpSocket,
    public_addr: SocketAddr,
    metrics: ServerMetrics,
    state: Mutex<State>,
    probe: Mutex<ProbeStatus>,
    /// Base of the millisecond timestamps sessions keep.
    epoch: Instant,
    /// Slots of `MAX_SESSIONS`, shared by every server of the process.
    sessions_gate: Gate,
    next_session: AtomicU64,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes `session` from the table if it is still the one there; returns the open count.
    fn remove_session(&self, session: &Session) -> usize {
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
    async fn send_to_client(&self, data: &[u8], to: SocketAddr) {
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

/// Information on one open session, for the control API and tests.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The real client address.
    pub client: SocketAddr,
    /// The address the game server sees this client as.
    pub upstream_local: SocketAddr,
    /// When it opened.
    pub opened: SystemTime,
    /// When the last packet passed, either way.
    pub last_seen: SystemTime,
    /// Client → server packets.
    pub packets_up: u64,
    /// Client → server bytes.
    pub bytes_up: u64,
    /// Server → client packets.
    pub packets_down: u64,
    /// Server → client bytes.
    pub bytes_down: u64,
}

/// A running relayed server.
#[derive(Debug)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    /// The relay loop and heartbeat task, taken by [`ServerHandle::stop`].
    tasks: Mutex<Option<(JoinHandle<()>, JoinHandle<()>)>>,
}

impl ServerHandle {
    /// Starts relaying `config.upstream` on `public` (already bound). Sessions take their slot
    /// from `sessions_gate`, shared by every server of the process; the server stops when
    /// `parent` is cancelled or [`ServerHandle::stop`] is called.
    ///
    /// # Errors
    /// The public socket's address or options, or the cache's socket, could not be had.
    pub fn start(
        config: ServerConfig,
        public: UdpSocket,
        sessions_gate: Gate,
        parent: &CancellationToken,
    ) -> io::Result<ServerHandle> {
        let public_addr = public.local_addr()?;
        // Room for bursts (best effort: the kernel caps it at net.core.rmem_max/wmem_max).
        let sock = socket2::SockRef::from(&public);
        let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        let shared = Arc::new(Shared {
            public,
            public_addr,
            metrics: ServerMetrics::default(),
            state: Mutex::new(State {
                sessions: HashMap::new(),
                bans: BanTable::default(),
            }),
            probe: Mutex::new(ProbeStatus::default()),
            epoch: Instant::now(),
            sessions_gate,
            next_session: AtomicU64::new(1),
            cancel: parent.child_token(),
            tracker: TaskTracker::new(),
            config,
        });
        let relay_loop = relay::RelayLoop::new(Arc::clone(&shared))?;
        let relay = tokio::spawn(relay_loop.run());
        let heartbeat = tokio::spawn(heartbeat::run(Arc::clone(&shared)));
        info!(
            "relaying {} on {public_addr} (masters: {})",
            shared.config.upstream,
            if shared.config.masters.is_empty() {
                "none".to_string()
            } else {
                shared.config.masters.join(", ")
            }
        );
        Ok(ServerHandle {
            shared,
            tasks: Mutex::new(Some((relay, heartbeat))),
        })
    }

    /// The public address clients reach this server on.
    pub fn public_addr(&self) -> SocketAddr {
        self.shared.public_addr
    }

    /// The server's configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// The server's counters.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.shared.metrics
    }

    /// What the last probe found.
    pub fn probe(&self) -> ProbeStatus {
        *self.shared.probe.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let st = self.shared.lock();
        st.sessions
            .values()
            .filter(|s| !s.is_closed())
            .map(|s| SessionInfo {
                client: s.client,
                upstream_local: s.upstream_local,
                opened: s.opened,
                last_seen: SystemTime::now()
                    - self
                        .shared
                        .epoch
                        .elapsed()
                        .saturating_sub(Duration::from_millis(s.last_active_ms())),
                packets_up: s.packets_up.get(),
                bytes_up: s.bytes_up.get(),
                packets_down: s.packets_down.get(),
                bytes_down: s.bytes_down.get(),
            })
            .collect()
    }

    /// Stops the server: the relay loop and sessions end, the masters get a flatline (ET), and
    /// this returns once every task of the server has finished.
    pub async fn stop(&self) {
        self.shared.cancel.cancel();
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((relay, heartbeat)) = tasks {
            let _ = relay.await;
            let _ = heartbeat.await;
        }
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        info!(
            "stopped relaying {} on {}",
            self.shared.config.upstream, self.shared.public_addr
        );
    }

    /// Bans an address: its sessions are cut at once and its packets dropped from now on.
    /// Replaces an existing ban of the same address.
    ///
    /// # Errors
    /// [`TableFull`] when [`crate::bans::MAX_BANS`] live bans are held already.
    pub fn ban(&self, ban: Ban) -> Result<(), TableFull> {
        let (now_sys, now) = (SystemTime::now(), Instant::now());
        let mut st = self.shared.lock();
        let ip = ban.ip;
        st.bans.insert(ban, now_sys, now)?;
        st.sessions.retain(|client, s| {
            let cut = client.ip() == ip;
            if cut {
                s.cut();
            }
            !cut
        });
        self.shared
            .metrics
            .sessions_open
            .set(st.sessions.len() as u64);
        Ok(())
    }

    /// Lifts the ban of `ip`; false when it was not banned.
    pub fn unban(&self, ip: IpAddr) -> bool {
        self.shared.lock().bans.remove(ip, Instant::now())
    }

    /// The bans in force, oldest first.
    pub fn bans(&self) -> Vec<Ban> {
        self.shared.lock().bans.list(Instant::now())
    }

    /// Sessions open now.
    pub fn session_count(&self) -> usize {
        self.shared
            .lock()
            .sessions
            .values()
            .filter(|s| !s.is_closed())
            .count()
    }

    /// Query limiter sources remembered now.
    pub fn query_sources(&self) -> u64 {
        self.shared.metrics.query_sources.get()
    }

    /// Slots of the query limiter's table, as last seen by the relay loop (fixed at start).
    pub fn query_slots(&self) -> u64 {
        self.shared.metrics.query_slots.get()
    }
}
