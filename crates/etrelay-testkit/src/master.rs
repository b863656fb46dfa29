//! Scripted master servers: the party that decides whether a game server is
//! listed in the in-game browser (`et-protocol.md` §3 "Master side" and §5).
//!
//! Two styles:
//!
//! * [`MasterStyle::Classic`] behaves like dpmaster 2.2: a heartbeat
//!   `heartbeat <tag>` (exact, case-sensitive prefix) from a game server is
//!   answered with `getinfo <challenge>` to the heartbeat's source address;
//!   the server is listed only if a valid `infoResponse` with that challenge
//!   comes back **from the same ip:port within 2 s**.
//! * [`MasterStyle::EtMaster`] behaves like etmaster.net as seen in the
//!   etrelay design notes: the heartbeat is answered with
//!   `getChallenge <10 digits>`; a `challengeResponse <n>` from the same
//!   address is answered with `getInfo <10-char challenge>`, and the matching
//!   `infoResponse` must come back from the same address; the whole exchange
//!   must finish within 2 s of the heartbeat.
//!
//! Accepted heartbeat tags: `EnemyTerritory-1` (game `et`) and `QuakeArena-1`
//! (game `Quake3Arena`). `ETFlatline-1` and `WolfFlatline-1` are recorded and
//! otherwise ignored (the server stays listed). Any other tag is recorded and
//! rejected.
//!
//! infoResponse checks (both styles): `challenge` equal to the one sent,
//! `protocol` present and numeric, `sv_maxclients` present and non-zero,
//! `clients` present, `gametype` without spaces if present, `gamename` equal
//! to the heartbeat's game if present. A failed check is recorded in
//! [`FakeMaster::rejections`]; the challenge stays valid until its 2 s run out
//! (like dpmaster, a later correct answer still counts), and an expired
//! challenge is recorded as a rejection too.
//!
//! Both styles answer `getservers <protocol> [keywords...]` with
//! `getserversResponse` followed by one binary record per listed server whose
//! infoResponse `protocol` equals the requested one (`\` + 4 address bytes +
//! 2 port bytes, big-endian), then `\EOT\0\0\0`; at most 1400 bytes per
//! datagram, EOT only in the last one. Keywords (`empty`, `full`, ...) are
//! ignored: every matching listed server is sent. `getserversExt <game>
//! <protocol>` is answered the same way with `getserversExtResponse`
//! (IPv4 records only).
//!
//! Listing never expires during a test (dpmaster keeps an entry 15 min).

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use self::exchange::handle;
pub use self::list::parse_getservers_response;

mod exchange;
mod list;

/// How long a server has to complete the challenge (dpmaster
/// `TIMEOUT_CHALLENGE`).
const CHALLENGE_WINDOW: Duration = Duration::from_secs(2);
/// dpmaster's maximum `getservers` reply datagram.
const MAX_REPLY: usize = 1400;
/// The usual master port, tried first.
const MASTER_PORT: u16 = 27950;

/// Which master behaviour to script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MasterStyle {
    /// dpmaster-like: `heartbeat` -> `getinfo <challenge>` -> `infoResponse`.
    Classic,
    /// etmaster.net-like: `heartbeat` -> `getChallenge` ->
    /// `challengeResponse` -> `getInfo <challenge>` -> `infoResponse`.
    EtMaster,
}

/// Where a server is in the registration exchange.
#[derive(Debug, Clone)]
enum Stage {
    /// EtMaster: `getChallenge` sent, waiting for `challengeResponse`.
    AwaitChallengeResponse,
    /// `getinfo`/`getInfo` sent with this challenge.
    AwaitInfo { challenge: String },
}

#[derive(Debug, Clone)]
struct Pending {
    game: &'static str,
    deadline: Instant,
    stage: Stage,
}

#[derive(Debug, Clone)]
struct Listed {
    addr: SocketAddr,
    protocol: u32,
}

#[derive(Debug, Default)]
struct State {
    heartbeats: Vec<(SocketAddr, String)>,
    listed: Vec<Listed>,
    rejections: Vec<(SocketAddr, String)>,
    pending: HashMap<SocketAddr, Pending>,
    /// Challenges sent (`getinfo`, and etmaster-style `getChallenge` and `getInfo`).
    challenges: u64,
    /// Challenges answered in time and correctly.
    answered: u64,
}

/// A scripted master server on a UDP socket; see the module docs.
///
/// Dropping it aborts its task.
#[derive(Debug)]
pub struct FakeMaster {
    addr: SocketAddr,
    style: MasterStyle,
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<u64>>,
    task: Option<JoinHandle<()>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeMaster {
    /// Binds `ip:27950` (or `ip:0` if that port is taken) and spawns the
    /// master task on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(ip: Ipv4Addr, style: MasterStyle) -> io::Result<FakeMaster> {
        let std_socket = std::net::UdpSocket::bind(SocketAddr::from((ip, MASTER_PORT)))
            .or_else(|_| std::net::UdpSocket::bind(SocketAddr::from((ip, 0))))?;
        std_socket.set_nonblocking(true)?;
        let socket = UdpSocket::from_std(std_socket)?;
        let addr = socket.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (changes, _) = watch::channel(0u64);
        let changes = Arc::new(changes);
        let task = tokio::spawn(run(socket, style, Arc::clone(&state), Arc::clone(&changes)));
        Ok(FakeMaster {
            addr,
            style,
            state,
            changes,
            task: Some(task),
        })
    }

    /// The master's address (where heartbeats go).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The style this master was started with.
    pub fn style(&self) -> MasterStyle {
        self.style
    }

    /// Every well-formed heartbeat received, as `(source, tag)`, in order
    /// (flatlines and unknown tags included).
    pub fn heartbeats(&self) -> Vec<(SocketAddr, String)> {
        lock(&self.state).heartbeats.clone()
    }

    /// The servers currently listed (what `getservers` would return, all
    /// protocols).
    pub fn listed(&self) -> Vec<SocketAddr> {
        lock(&self.state).listed.iter().map(|l| l.addr).collect()
    }

    /// Challenges sent so far: one `getinfo` per heartbeat (Classic); a `getChallenge` per
    /// heartbeat and a `getInfo` per `challengeResponse` (EtMaster).
    pub fn challenges(&self) -> u64 {
        lock(&self.state).challenges
    }

    /// Challenges answered correctly within the window so far.
    pub fn answered(&self) -> u64 {
        lock(&self.state).answered
    }

    /// Every rejection so far, as `(source, reason)`.
    pub fn rejections(&self) -> Vec<(SocketAddr, String)> {
        lock(&self.state).rejections.clone()
    }

    /// Waits until `server` is listed, at most `timeout`. Event-driven: wakes
    /// on every state change of the master.
    pub async fn wait_listed(&self, server: SocketAddr, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        loop {
            if self.listed().contains(&server) {
                return true;
            }
            match timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the task is gone.
                _ => return self.listed().contains(&server),
            }
        }
    }

    /// Waits until `n` heartbeats with tag `tag` have been received, at most
    /// `timeout`; returns the sources of the first `n` of them (fewer on
    /// timeout). Event-driven like [`FakeMaster::wait_listed`].
    pub async fn wait_heartbeats(&self, tag: &str, n: usize, timeout: Duration) -> Vec<SocketAddr> {
        let deadline = Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        let matching = || -> Vec<SocketAddr> {
            lock(&self.state)
                .heartbeats
                .iter()
                .filter(|(_, t)| t == tag)
                .map(|(a, _)| *a)
                .take(n)
                .collect()
        };
        loop {
            let found = matching();
            if found.len() >= n {
                return found;
            }
            match timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return matching(),
            }
        }
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The master's loop: datagrams, and the expiry of pending challenges.
async fn run(
    socket: UdpSocket,
    style: MasterStyle,
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<u64>>,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let next_expiry = lock(&state).pending.values().map(|p| p.deadline).min();
        let outgoing = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok((len, from)) => handle(&mut lock(&state), style, from, &buf[..len]),
                Err(_) => Vec::new(),
            },
            _ = sleep_until(next_expiry.unwrap_or_else(Instant::now)), if next_expiry.is_some() => {
                expire(&mut lock(&state));
                Vec::new()
            }
        };
        changes.send_modify(|v| *v = v.wrapping_add(1));
        for (to, packet) in outgoing {
            let _ = socket.send_to(&packet, to).await;
        }
    }
}

/// Drops the challenges whose window has passed, recording a rejection.
fn expire(st: &mut State) {
    let now = Instant::now();
    let expired: Vec<SocketAddr> = st
        .pending
        .iter()
        .filter(|(_, p)| p.deadline <= now)
        .map(|(a, _)| *a)
        .collect();
    for addr in expired {
        if let Some(p) = st.pending.remove(&addr) {
            let what = match p.stage {
                Stage::AwaitChallengeResponse => "no challengeResponse",
                Stage::AwaitInfo { .. } => "no valid infoResponse",
            };
            st.rejections.push((
                addr,
                format!("{what} within {CHALLENGE_WINDOW:?} of the heartbeat"),
            ));
        }
    }
}
