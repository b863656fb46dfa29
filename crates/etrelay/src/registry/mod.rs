//! Which servers the relay holds: servers by public port, with the SHA-256 of their key.
//!
//! Reads (who owns this key, which servers) take the registry lock for a moment; the packet
//! path never takes it. Registrations, takeovers and leaves go through one task, the writer
//! (`writer`), one at a time: it writes `servers.json` first (atomically: temp file, fsync,
//! rename) and changes memory only once that succeeded, so a failed request changes nothing and
//! a kill -9 at any moment leaves the previous or the new state on disk. Bans and unbans do not
//! wait for the writer: each server has its own ban store ([`bans::store`]), one row per change,
//! written before the ban is applied; the changes of one server are applied one at a time,
//! those of different servers side by side. No lock is held across an `.await`.
//!
//! State files in `--state-dir`: `servers.json` (port, upstream, key hash, registration time)
//! and `bans-<port>.db` (that server's bans). At start (`restore`), stray temp files are
//! removed, and each server is restored on its own: a server whose ban store is damaged, whose
//! upstream is refused (a loop) or whose port cannot be bound stays registered but is not
//! relayed, with the reason in its status and in the log; the others are relayed. A port that
//! could not be bound is tried again every [`crate::config::BIND_RETRY`] by the writer, and at
//! once when the server registers again on it (`rebind`).
//!
//! One key owns one server: registering another upstream with a key that owns a server already
//! is refused ([`RegistryError::KeyInUse`]), so every key route names exactly one server.

mod rebind;
mod restore;
mod upstream;
mod writer;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use guard::statefile::StateFileError;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::bans::store::{Store, StoreError};
use crate::bans::{self, Ban};
use crate::clock::wall_now;
use crate::config::ServerConfig;
use crate::proof::{KeyHash, key_hash};
use crate::server::{Budget, ServerHandle};

pub use self::rebind::BindRetry;
pub use self::upstream::{OwnSockets, upstream_refusal};

/// What every registered server shares.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Public ports servers may have, in the order free ones are given out.
    pub ports: Vec<u16>,
    /// Address the public ports bind on.
    pub bind: IpAddr,
    /// Where `servers.json` and `bans-<port>.db` live.
    pub state_dir: PathBuf,
    /// Settings of every relayed server (its `upstream` is replaced by the registration's).
    pub template: ServerConfig,
    /// The control API's address: no upstream may be it.
    pub control: Option<SocketAddr>,
    /// Accept loopback upstreams (tests and demos on one host).
    pub allow_loopback: bool,
}

/// One registered server.
#[derive(Debug, Clone)]
pub struct Registered {
    /// Its public port.
    pub port: u16,
    /// The game server (canonical form).
    pub upstream: SocketAddr,
    /// SHA-256 of its key.
    pub key_hash: KeyHash,
    /// When it was registered (or last taken over).
    pub registered_at: SystemTime,
    /// The running server; `None` when it could not be started (see `error`).
    pub handle: Option<Arc<ServerHandle>>,
    /// Its ban store; `None` when it could not be opened (see `error`).
    pub store: Option<Arc<Store>>,
    /// Why it is not relayed, when it is not.
    pub error: Option<String>,
    /// Its public port could not be bound: tried again, when.
    pub bind: Option<BindRetry>,
}

/// Why a change was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Another server holds the port.
    #[error("port {0} is held by another server")]
    PortTaken(u16),
    /// The key owns another server already (on that port).
    #[error(
        "this key owns the server on port {0} already: one key per server (use another key file)"
    )]
    KeyInUse(u16),
    /// Every port is taken.
    #[error("no free port")]
    NoFreePort,
    /// Not one of `--ports`.
    #[error("port {0} is not one of the relay's ports")]
    PortNotAllowed(u16),
    /// The upstream would make a loop, or no game server can have it.
    #[error("{0}")]
    BadUpstream(String),
    /// The public port could not be bound.
    #[error("cannot bind port {port}: {source}")]
    Bind {
        /// The port.
        port: u16,
        /// The OS error.
        source: io::Error,
    },
    /// The state file could not be written.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The ban store could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The server is not registered (any more).
    #[error("no such server")]
    NoServer,
    /// The server is registered but not relayed.
    #[error("the server is not relayed: {0}")]
    NotRelaying(String),
    /// The address is not banned.
    #[error("not banned")]
    NotBanned,
    /// Too many bans.
    #[error("too many bans")]
    BansFull,
    /// The relay is stopping.
    #[error("the relay is stopping")]
    Closed,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServersFile {
    servers: Vec<ServerRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerRecord {
    port: u16,
    upstream: SocketAddr,
    key_sha256: String,
    registered_at: u64,
}

/// A change, for the writer task.
#[derive(Debug)]
enum Op {
    Register {
        key_hash: KeyHash,
        upstream: SocketAddr,
        port: Option<u16>,
        reply: oneshot::Sender<Result<(Registered, bool), RegistryError>>,
    },
    Leave {
        port: u16,
        reply: oneshot::Sender<Result<(), RegistryError>>,
    },
}

/// The registry: a cheap handle, clone it freely.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Inner>,
    ops: mpsc::Sender<Op>,
}

#[derive(Debug)]
struct Inner {
    config: RegistryConfig,
    /// The registry lock: servers by public port. Never held across an `.await`.
    servers: Mutex<BTreeMap<u16, Registered>>,
    budget: Budget,
    cancel: CancellationToken,
    /// Set when the relay stops: the writer starts nothing more.
    stopping: CancellationToken,
}

impl Registry {
    /// Cleans stray temp files, loads `servers.json` and starts relaying every server in it
    /// again, with its bans; a server that cannot be relayed is kept, with its reason.
    ///
    /// # Errors
    /// The state dir cannot be created, or `servers.json` cannot be read or parsed.
    pub async fn open(
        config: RegistryConfig,
        budget: Budget,
        cancel: &CancellationToken,
    ) -> Result<Registry, RegistryError> {
        std::fs::create_dir_all(&config.state_dir).map_err(|source| {
            RegistryError::State(StateFileError::Io {
                path: config.state_dir.clone(),
                source,
            })
        })?;
        let inner = Arc::new(Inner {
            config,
            servers: Mutex::new(BTreeMap::new()),
            budget,
            cancel: cancel.child_token(),
            stopping: CancellationToken::new(),
        });
        restore::restore(&inner).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(writer::run(Arc::clone(&inner), rx));
        Ok(Registry { inner, ops: tx })
    }

    /// The server whose key is `key`.
    pub fn by_key(&self, key: &str) -> Option<Registered> {
        let h = key_hash(key);
        self.inner
            .lock()
            .values()
            .find(|r| bool::from(r.key_hash.ct_eq(&h)))
            .cloned()
    }

    /// Every registered server, by port.
    pub fn all(&self) -> Vec<Registered> {
        self.inner.lock().values().cloned().collect()
    }

    /// The ports servers may have.
    pub fn ports(&self) -> &[u16] {
        &self.inner.config.ports
    }

    /// Checks `upstream` may be relayed (no loop, an address a game server can have).
    ///
    /// # Errors
    /// [`RegistryError::BadUpstream`] saying why not.
    pub fn check_upstream(&self, upstream: SocketAddr) -> Result<(), RegistryError> {
        match upstream::refusal(upstream, &self.inner.config) {
            Some(why) => Err(RegistryError::BadUpstream(why)),
            None => Ok(()),
        }
    }

    /// Registers `upstream` for the key whose hash is `key_hash` (the proof was checked by the
    /// caller). Returns the entry and whether it is new (`false`: taken over).
    ///
    /// # Errors
    /// [`RegistryError`]; nothing changed.
    pub async fn register(
        &self,
        key_hash: KeyHash,
        upstream: SocketAddr,
        port: Option<u16>,
    ) -> Result<(Registered, bool), RegistryError> {
        let upstream = crate::net::canonical(upstream);
        self.check_upstream(upstream)?;
        self.call(|reply| Op::Register {
            key_hash,
            upstream,
            port,
            reply,
        })
        .await
    }

    /// Forgets the server on `port`: flatline, port freed, sessions and bans dropped.
    ///
    /// # Errors
    /// [`RegistryError`]; nothing changed.
    pub async fn leave(&self, port: u16) -> Result<(), RegistryError> {
        self.call(|reply| Op::Leave { port, reply }).await
    }

    /// The running server of `port` and its ban store.
    fn relayed(&self, port: u16) -> Result<(Arc<ServerHandle>, Arc<Store>), RegistryError> {
        let servers = self.inner.lock();
        let r = servers.get(&port).ok_or(RegistryError::NoServer)?;
        match (&r.handle, &r.store) {
            (Some(h), Some(s)) => Ok((Arc::clone(h), Arc::clone(s))),
            _ => Err(RegistryError::NotRelaying(
                r.error.clone().unwrap_or_else(|| "not started".into()),
            )),
        }
    }

    /// Bans an address on the server of `port`: saved (durable), then applied.
    ///
    /// # Errors
    /// [`RegistryError`]; nothing changed.
    pub async fn ban(&self, port: u16, ban: Ban) -> Result<(), RegistryError> {
        let (handle, store) = self.relayed(port)?;
        let writer = Arc::clone(&store);
        let r = blocking(move || {
            // The store's connection lock orders this server's changes: save, then apply.
            writer.put(&ban)?;
            if handle.ban(ban.clone()).is_err() {
                // A new address and the table is full: undo the row just written.
                writer.delete(ban.ip)?;
                return Err(RegistryError::BansFull);
            }
            Ok(())
        })
        .await;
        checkpoint_later(store);
        r
    }

    /// Lifts a ban on the server of `port`.
    ///
    /// # Errors
    /// [`RegistryError::NotBanned`], or as [`Registry::ban`].
    pub async fn unban(&self, port: u16, ip: IpAddr) -> Result<(), RegistryError> {
        let (handle, store) = self.relayed(port)?;
        let ip = bans::normalize(ip);
        let writer = Arc::clone(&store);
        let r = blocking(move || {
            writer.delete(ip)?;
            if handle.unban(ip) {
                Ok(())
            } else {
                Err(RegistryError::NotBanned)
            }
        })
        .await;
        checkpoint_later(store);
        r
    }

    /// Asks every running server to resolve its masters' names again (SIGHUP).
    pub fn reload(&self) {
        for h in self.handles() {
            h.reload();
        }
    }

    /// The running servers now.
    fn handles(&self) -> Vec<Arc<ServerHandle>> {
        self.inner
            .lock()
            .values()
            .filter_map(|r| r.handle.clone())
            .collect()
    }

    /// Stops every server side by side (each sends its flatline); no new server starts from
    /// then on. False when they were not all stopped within `limit`.
    pub async fn shutdown(&self, limit: Duration) -> bool {
        self.inner.stopping.cancel();
        let stop_all = async {
            // A registration the writer was in the middle of may add a server once: look twice.
            for _ in 0..2 {
                let mut set = tokio::task::JoinSet::new();
                for h in self.handles() {
                    set.spawn(async move { h.stop().await });
                }
                while set.join_next().await.is_some() {}
            }
        };
        tokio::time::timeout(limit, stop_all).await.is_ok()
    }

    async fn call<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, RegistryError>>) -> Op,
    ) -> Result<T, RegistryError> {
        if self.inner.stopping.is_cancelled() {
            return Err(RegistryError::Closed);
        }
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(op(tx))
            .await
            .map_err(|_| RegistryError::Closed)?;
        rx.await.map_err(|_| RegistryError::Closed)?
    }
}

/// Folds the ban store's journal back in the background when it is due; nobody waits for it.
fn checkpoint_later(store: Arc<Store>) {
    if store.needs_checkpoint() {
        tokio::task::spawn_blocking(move || {
            if let Err(e) = store.checkpoint() {
                tracing::warn!(error = %e, "ban store checkpoint failed");
            }
        });
    }
}

/// Runs blocking disk work off the reactor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, RegistryError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        RegistryError::State(StateFileError::Io {
            path: PathBuf::new(),
            source: io::Error::other(e.to_string()),
        })
    })?
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Registered>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn servers_path(&self) -> PathBuf {
        self.config.state_dir.join("servers.json")
    }

    /// Starts relaying `upstream` on `public` (bound already) with `bans`.
    fn start_on(
        &self,
        public: tokio::net::UdpSocket,
        upstream: SocketAddr,
        bans: Vec<Ban>,
    ) -> Result<Arc<ServerHandle>, RegistryError> {
        if self.stopping.is_cancelled() {
            return Err(RegistryError::Closed);
        }
        let port = public.local_addr().map_or(0, |a| a.port());
        let handle = self.start_held_on(public, upstream)?;
        let mut restore = Restore::new(port, wall_now());
        for ban in bans {
            restore.ban(&handle, ban);
        }
        handle.release();
        Ok(handle)
    }

    /// Starts relaying `upstream` on `public` (bound already), its relay loop held until
    /// [`ServerHandle::release`] (its bans put in force first).
    fn start_held_on(
        &self,
        public: tokio::net::UdpSocket,
        upstream: SocketAddr,
    ) -> Result<Arc<ServerHandle>, RegistryError> {
        if self.stopping.is_cancelled() {
            return Err(RegistryError::Closed);
        }
        let port = public.local_addr().map_or(0, |a| a.port());
        let mut config = self.config.template.clone();
        config.upstream = upstream;
        config.proven_file = Some(crate::server::proven_path(&self.config.state_dir, port));
        config.carry_file = Some(crate::server::carry_path(&self.config.state_dir, port));
        let handle = ServerHandle::start_held(config, public, self.budget.clone(), &self.cancel)
            .map_err(|source| RegistryError::Bind { port, source })?;
        Ok(Arc::new(handle))
    }

    fn servers_file(map: &BTreeMap<u16, Registered>) -> ServersFile {
        ServersFile {
            servers: map
                .values()
                .map(|r| ServerRecord {
                    port: r.port,
                    upstream: r.upstream,
                    key_sha256: hex::encode(r.key_hash),
                    registered_at: crate::clock::unix(r.registered_at),
                })
                .collect(),
        }
    }
}

/// Bans put in force on a starting server one by one, the expired ones skipped; past the
/// table's cap the rest are left out, said once.
pub(crate) struct Restore {
    port: u16,
    now: std::time::SystemTime,
    full: bool,
}

impl Restore {
    pub(crate) fn new(port: u16, now: std::time::SystemTime) -> Self {
        Restore {
            port,
            now,
            full: false,
        }
    }

    pub(crate) fn ban(&mut self, handle: &ServerHandle, ban: Ban) {
        if self.full || ban.expired(self.now) {
            return;
        }
        if handle.ban(ban).is_err() {
            tracing::warn!(port = self.port, "too many bans, the rest not restored");
            self.full = true;
        }
    }
}
