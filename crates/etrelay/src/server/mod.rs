//! One relayed server: the unit the single-server mode runs and the registry starts and stops.
//!
//! A [`ServerHandle`] owns the server's public socket, its relay loop, its sessions, its query
//! limiter and cache, its heartbeat task, its bans and its counters. The packet path:
//!
//! ```text
//! public socket → relay loop: size → classify → ban → filter → query limiter
//!   → query cache answer (from the public socket)        for getinfo/getstatus
//!   → session queue → upstream socket → game server       for everything else allowed
//! game server → session task → public socket → client
//! ```
//!
//! - `budget`: what the whole process may spend: session slots and queued bytes.
//! - `shared`: what the server's tasks share: settings, public socket, counters, the state
//!   lock over sessions and bans.
//! - `table`: the session table: half-open and established sessions, their caps, recycling,
//!   pinned qports (no I/O).
//! - `joins`: fair `getchallenge`: per-source limit, the pace towards the game server, the
//!   fair queue (no I/O).
//! - `relay`: the relay loop: its wake-ups, sends, ticks and the query cache's socket;
//!   `relay/packet`: the client-packet path above, up to the session queue.
//! - `sweep`: how much of each limiter's table a tick of the relay loop sweeps.
//! - `reflection`: the answer budget: queries answered per source prefix and in all.
//! - `lanes`: the masters' lane: the masters' queries apart from everyone else's.
//! - `proven`: the sources that proved their address, served first; kept in the state dir.
//! - `pressure`: the watch over the drops a flood causes: WARNs and "under a flood since".
//! - `session`: one client's session: its queue, counters and last activity (no I/O).
//! - `forward`: a session's task and upstream socket: queue → game server, answers → client.
//! - `cache`: the query cache, a state machine without I/O driven by the relay loop.
//! - `heartbeat`: probes, heartbeats and the flatline, a state machine without I/O.
//! - `heartbeat_task`: the task that drives it: probes, master name lookups, sends.
//! - `proven_task`: writes the proven sources once a minute when they changed, and at stop.
//! - `metrics`: the counters of the server.

mod budget;
mod cache;
mod carry;
mod carry_task;
mod challenges;
mod cookie;
mod forward;
mod handshake;
mod heartbeat;
mod heartbeat_task;
mod joins;
mod lanes;
mod metrics;
mod pressure;
mod proven;
mod proven_task;
mod reflection;
mod relay;
mod session;
mod shared;
mod sweep;
mod table;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info};

pub use self::budget::Budget;
pub use self::heartbeat::ProbeStatus;
pub use self::metrics::{DropReason, ProbeState, ServerMetrics};
pub use self::pressure::{Flood, Kind as FloodKind};
pub use self::proven::{MAX_PROVEN, PROVEN_FOR};
pub use self::session::SessionInfo;
use self::shared::Shared;
use crate::bans::{Ban, TableFull};
use crate::clock::{Instant, wall_now};
use crate::config::ServerConfig;

/// Receive and send buffer asked for the public socket.
const SOCKET_BUFFER: usize = 4 << 20;

/// A running relayed server.
#[derive(Debug)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    /// The relay loop, heartbeat and proven-sources tasks, taken by [`ServerHandle::stop`].
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

pub use self::carry::path as carry_path;

/// The file of `port`'s proven sources in the state directory `dir`.
pub fn proven_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("proven-{port}.json"))
}

impl ServerHandle {
    /// Starts relaying `config.upstream` on `public` (already bound). Sessions take their slot
    /// and queued bytes from `budget`, shared by every server of the process; the server stops when
    /// `parent` is cancelled or [`ServerHandle::stop`] is called.
    ///
    /// # Errors
    /// The public socket's address or options, or the cache's socket, could not be had.
    pub fn start(
        config: ServerConfig,
        public: UdpSocket,
        budget: Budget,
        parent: &CancellationToken,
    ) -> io::Result<ServerHandle> {
        let handle = ServerHandle::start_held(config, public, budget, parent)?;
        handle.release();
        Ok(handle)
    }

    /// [`ServerHandle::start`], the relay loop held until [`ServerHandle::release`]: bans can
    /// be put in force one by one as they are read, before the first packet is looked at.
    ///
    /// # Errors
    /// As [`ServerHandle::start`].
    pub fn start_held(
        config: ServerConfig,
        public: UdpSocket,
        budget: Budget,
        parent: &CancellationToken,
    ) -> io::Result<ServerHandle> {
        let public_addr = public.local_addr()?;
        // Room for bursts (best effort: the kernel caps it at net.core.rmem_max/wmem_max).
        let sock = socket2::SockRef::from(&public);
        let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        let dual_stack = public_addr.is_ipv6() && sock.only_v6().is_ok_and(|only| !only);
        let public = crate::net::ReadSocket::new(public)?;
        let answers = crate::net::PairRecv::new(crate::config::MAX_ANSWER)?;
        let shared = Arc::new(Shared::new(
            config,
            public,
            answers,
            public_addr,
            dual_stack,
            budget,
            parent.child_token(),
        ));
        let relay_loop = relay::RelayLoop::new(Arc::clone(&shared))?;
        // Every line a server's tasks log (and its sessions', whose spans are children of
        // this one) names the server: one span, entered at each poll, nothing per packet.
        let span = tracing::info_span!(
            "server",
            public = %public_addr,
            upstream = %shared.config.upstream
        );
        let relay = tokio::spawn(relay_loop.run().instrument(span.clone()));
        let heartbeat =
            tokio::spawn(heartbeat_task::run(Arc::clone(&shared)).instrument(span.clone()));
        let proven = tokio::spawn(proven_task::run(Arc::clone(&shared)).instrument(span.clone()));
        let mut tasks = vec![relay, heartbeat, proven];
        if let Some(path) = shared.config.carry_file.clone() {
            let carry = carry_task::run(Arc::clone(&shared), path).instrument(span);
            tasks.push(tokio::spawn(carry));
        }
        info!(
            upstream = %shared.config.upstream,
            public = %public_addr,
            masters = %if shared.config.masters.is_empty() {
                "none".to_string()
            } else {
                shared.config.masters.join(",")
            },
            "relaying"
        );
        Ok(ServerHandle {
            shared,
            tasks: Mutex::new(tasks),
        })
    }

    /// Lets the relay loop of a server started with [`ServerHandle::start_held`] run.
    pub fn release(&self) {
        self.shared.go.cancel();
    }

    /// Resolves the masters' names again now and logs what changed (SIGHUP); relaying goes on.
    pub fn reload(&self) {
        self.shared.reload.notify_one();
    }

    /// The public address clients reach this server on.
    pub fn public_addr(&self) -> SocketAddr {
        self.shared.public_addr
    }

    /// The server's counters.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.shared.metrics
    }

    /// What the last probe found.
    pub fn probe(&self) -> ProbeStatus {
        *self.shared.probe_status()
    }

    /// The open sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let now_ms = self.shared.now_ms();
        let st = self.shared.lock();
        st.sessions
            .iter()
            .filter(|s| !s.is_closed())
            .map(|s| s.info(now_ms))
            .collect()
    }

    /// Stops the server: the relay loop and sessions end, the masters get a flatline (ET), and
    /// this returns once every task of the server has finished.
    pub async fn stop(&self) {
        if let Some(path) = &self.shared.config.carry_file {
            carry_task::at_stop(&self.shared, path).await;
        }
        self.shared.cancel.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        info!(
            upstream = %self.shared.config.upstream,
            public = %self.shared.public_addr,
            "stopped relaying"
        );
    }

    /// Bans an address: its sessions are cut at once and its packets dropped from now on.
    /// Replaces an existing ban of the same address.
    ///
    /// # Errors
    /// [`TableFull`] when [`crate::bans::MAX_BANS`] live bans are held already.
    pub fn ban(&self, ban: Ban) -> Result<(), TableFull> {
        let (now_sys, now) = (wall_now(), Instant::now());
        let mut st = self.shared.lock();
        let ip = ban.ip;
        st.bans.insert(ban, now_sys, now)?;
        for s in st.sessions.remove_ip(ip) {
            s.cut();
        }
        self.shared.gauges(&st.sessions);
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
            .iter()
            .filter(|s| !s.is_closed())
            .count()
    }

    /// The floods going on now (see `pressure`).
    pub fn floods(&self) -> Vec<Flood> {
        self.shared.floods()
    }

    /// Sources that proved their address, remembered now.
    pub fn proven_count(&self) -> usize {
        self.shared.lock().proven.len()
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
