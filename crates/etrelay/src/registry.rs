//! Which servers the relay holds: servers by public port, with the SHA-256 of their key.
//!
//! Reads (who owns this key, which servers) take the registry lock for a moment; the packet
//! path never takes it. Every change (register, take over, leave, ban, unban) goes through one
//! task, [`Registry`]'s writer, one at a time: it writes the new state file first (atomically:
//! temp file, fsync, rename) and changes memory only once that succeeded, so a failed request
//! changes nothing and a kill -9 at any moment leaves the previous or the new state on disk.
//! No lock is held across an `.await`: the writer owns the order, the lock only guards reads.
//!
//! State files in `--state-dir`: `servers.json` (port, upstream, key hash, registration time)
//! and `bans-<port>.json` (that server's bans).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use guard::statefile::{self, StateFileError};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::bans::{self, Ban};
use crate::clock::{from_unix, unix};
use crate::config::ServerConfig;
use crate::proof::{KeyHash, key_hash, parse_key_hash};
use crate::server::{Budget, ServerHandle};

/// What every registered server shares.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Public ports servers may have, in the order free ones are given out.
    pub ports: Vec<u16>,
    /// Address the public ports bind on.
    pub bind: IpAddr,
    /// Where `servers.json` and `bans-<port>.json` live.
    pub state_dir: PathBuf,
    /// Settings of every relayed server (its `upstream` is replaced by the registration's).
    pub template: ServerConfig,
}

/// One registered server.
#[derive(Debug, Clone)]
pub struct Registered {
    /// Its public port.
    pub port: u16,
    /// The game server.
    pub upstream: SocketAddr,
    /// SHA-256 of its key.
    pub key_hash: KeyHash,
    /// When it was registered (or last taken over).
    pub registered_at: SystemTime,
    /// The running server; `None` when its port could not be bound at start.
    pub handle: Option<Arc<ServerHandle>>,
}

/// Why a change was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Another server holds the port.
    #[error("port {0} is held by another server")]
    PortTaken(u16),
    /// Every port is taken.
    #[error("no free port")]
    NoFreePort,
    /// Not one of `--ports`.
    #[error("port {0} is not one of the relay's ports")]
    PortNotAllowed(u16),
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
    /// The server is not registered (any more).
    #[error("no such server")]
    NoServer,
    /// The server is registered but not relayed (its port could not be bound at start).
    #[error("the server's port is not relayed (it could not be bound at start)")]
    NotRelaying,
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
    Ban {
        port: u16,
        ban: Ban,
        reply: oneshot::Sender<Result<(), RegistryError>>,
    },
    Unban {
        port: u16,
        ip: IpAddr,
        reply: oneshot::Sender<Result<(), RegistryError>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
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
}

impl Registry {
    /// Loads `servers.json` and starts relaying every server in it again, with its bans.
    ///
    /// # Errors
    /// The state dir cannot be created or a state file cannot be read or parsed.
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
        });
        let file: ServersFile =
            statefile::load_json(&inner.servers_path())?.unwrap_or(ServersFile { servers: vec![] });
        for rec in file.servers {
            if !inner.config.ports.contains(&rec.port) {
                warn!(
                    "servers.json: port {} is not in --ports any more; still relayed until it leaves",
                    rec.port
                );
            }
            let Some(key_hash) = parse_key_hash(&rec.key_sha256) else {
                error!(
                    "servers.json: port {}: bad key_sha256, entry skipped",
                    rec.port
                );
                continue;
            };
            let bans = bans::load(&inner.bans_path(rec.port))?;
            let handle = match inner
                .start_server(rec.port, rec.upstream, bans.into_iter())
                .await
            {
                Ok(h) => Some(h),
                Err(e) => {
                    error!(
                        "server {} on port {}: {e}; registration kept, not relayed",
                        rec.upstream, rec.port
                    );
                    None
                }
            };
            inner.lock().insert(
                rec.port,
                Registered {
                    port: rec.port,
                    upstream: rec.upstream,
                    key_hash,
                    registered_at: from_unix(rec.registered_at),
                    handle,
                },
            );
        }
        let n = inner.lock().len();
        if n > 0 {
            info!("{n} registered server(s) restored");
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(run_writer(Arc::clone(&inner), rx));
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

    /// Bans an address on the server of `port` (saved, then applied).
    ///
    /// # Errors
    /// [`RegistryError`]; nothing changed.
    pub async fn ban(&self, port: u16, ban: Ban) -> Result<(), RegistryError> {
        self.call(|reply| Op::Ban { port, ban, reply }).await
    }

    /// Lifts a ban on the server of `port`.
    ///
    /// # Errors
    /// [`RegistryError::NotBanned`], or as [`Registry::ban`].
    pub async fn unban(&self, port: u16, ip: IpAddr) -> Result<(), RegistryError> {
        self.call(|reply| Op::Unban { port, ip, reply }).await
    }

    /// Stops every server (each sends its flatline) and the writer.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.ops.send(Op::Shutdown { reply: tx }).await.is_ok() {
            let _ = rx.await;
        }
    }

    async fn call<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, RegistryError>>) -> Op,
    ) -> Result<T, RegistryError> {
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(op(tx))
            .await
            .map_err(|_| RegistryError::Closed)?;
        rx.await.map_err(|_| RegistryError::Closed)?
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Registered>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn servers_path(&self) -> PathBuf {
        self.config.state_dir.join("servers.json")
    }

    fn bans_path(&self, port: u16) -> PathBuf {
        bans::path(&self.config.state_dir, port)
    }

    /// Binds the public port and starts relaying `upstream` there with `bans`.
    async fn start_server(
        &self,
        port: u16,
        upstream: SocketAddr,
        bans: impl Iterator<Item = Ban>,
    ) -> Result<Arc<ServerHandle>, RegistryError> {
        let public = UdpSocket::bind((self.config.bind, port))
            .await
            .map_err(|source| RegistryError::Bind { port, source })?;
        self.start_on(public, upstream, bans)
    }

    fn start_on(
        &self,
        public: UdpSocket,
        upstream: SocketAddr,
        bans: impl Iterator<Item = Ban>,
    ) -> Result<Arc<ServerHandle>, RegistryError> {
        let port = public.local_addr().map_or(0, |a| a.port());
        let mut config = self.config.template.clone();
        config.upstream = upstream;
        let handle = ServerHandle::start(config, public, self.budget.clone(), &self.cancel)
            .map_err(|source| RegistryError::Bind { port, source })?;
        let now = SystemTime::now();
        for ban in bans.filter(|b| !b.expired(now)) {
            if handle.ban(ban).is_err() {
                warn!("port {port}: too many bans, the rest not restored");
                break;
            }
        }
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
                    registered_at: unix(r.registered_at),
                })
                .collect(),
        }
    }
}

/// Writes a state file off the reactor (`write` runs on tokio's blocking pool).
async fn save(
    write: impl FnOnce() -> Result<(), StateFileError> + Send + 'static,
) -> Result<(), RegistryError> {
    tokio::task::spawn_blocking(write).await.map_err(|e| {
        RegistryError::State(StateFileError::Io {
            path: PathBuf::new(),
            source: io::Error::other(e.to_string()),
        })
    })??;
    Ok(())
}

/// Writes `servers.json` off the reactor.
async fn save_servers(inner: &Inner, map: &BTreeMap<u16, Registered>) -> Result<(), RegistryError> {
    let (path, file) = (inner.servers_path(), Inner::servers_file(map));
    save(move || statefile::save_json(&path, &file)).await
}

/// Writes `bans-<port>.json` off the reactor.
async fn save_bans(inner: &Inner, port: u16, list: Vec<Ban>) -> Result<(), RegistryError> {
    let path = inner.bans_path(port);
    save(move || bans::save(&path, &list)).await
}

fn remove_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        warn!("cannot remove {}: {e}", path.display());
    }
}

/// The writer: applies changes one at a time.
async fn run_writer(inner: Arc<Inner>, mut rx: mpsc::Receiver<Op>) {
    while let Some(op) = rx.recv().await {
        match op {
            Op::Register {
                key_hash,
                upstream,
                port,
                reply,
            } => {
                let _ = reply.send(register(&inner, key_hash, upstream, port).await);
            }
            Op::Leave { port, reply } => {
                let _ = reply.send(leave(&inner, port).await);
            }
            Op::Ban { port, ban, reply } => {
                let _ = reply.send(ban_op(&inner, port, ban).await);
            }
            Op::Unban { port, ip, reply } => {
                let _ = reply.send(unban_op(&inner, port, ip).await);
            }
            Op::Shutdown { reply } => {
                let handles: Vec<_> = inner
                    .lock()
                    .values()
                    .filter_map(|r| r.handle.clone())
                    .collect();
                for h in handles {
                    h.stop().await;
                }
                let _ = reply.send(());
                return;
            }
        }
    }
}

async fn register(
    inner: &Inner,
    key_hash: KeyHash,
    upstream: SocketAddr,
    port: Option<u16>,
) -> Result<(Registered, bool), RegistryError> {
    let map = inner.lock().clone();
    let existing = map.values().find(|r| r.upstream == upstream).cloned();
    let target = pick_port(inner, &map, existing.as_ref(), upstream, port)?;
    let entry = Registered {
        port: target,
        upstream,
        key_hash,
        registered_at: SystemTime::now(),
        handle: None,
    };
    match existing {
        Some(e) if e.port == target => take_over(inner, map, e, entry).await,
        Some(e) => {
            let former = e.port;
            let entry = start(inner, map, Some(e), entry).await?;
            info!("server {upstream} moved from port {former} to {target} (new key)");
            Ok((entry, false))
        }
        None => {
            let entry = start(inner, map, None, entry).await?;
            info!("server {upstream} registered on port {target}");
            Ok((entry, true))
        }
    }
}

/// The port a registration of `upstream` gets: the one asked for, else the one it has, else
/// the first free one.
fn pick_port(
    inner: &Inner,
    map: &BTreeMap<u16, Registered>,
    existing: Option<&Registered>,
    upstream: SocketAddr,
    port: Option<u16>,
) -> Result<u16, RegistryError> {
    match port {
        Some(p) if !inner.config.ports.contains(&p) => Err(RegistryError::PortNotAllowed(p)),
        Some(p) if map.get(&p).is_some_and(|r| r.upstream != upstream) => {
            Err(RegistryError::PortTaken(p))
        }
        Some(p) => Ok(p),
        None => match existing {
            Some(e) => Ok(e.port),
            None => inner
                .config
                .ports
                .iter()
                .find(|p| !map.contains_key(p))
                .copied()
                .ok_or(RegistryError::NoFreePort),
        },
    }
}

/// Taken over on the same port: the relay goes on, with the new key.
async fn take_over(
    inner: &Inner,
    mut map: BTreeMap<u16, Registered>,
    existing: Registered,
    new: Registered,
) -> Result<(Registered, bool), RegistryError> {
    let entry = Registered {
        key_hash: new.key_hash,
        registered_at: new.registered_at,
        ..existing
    };
    map.insert(entry.port, entry.clone());
    save_servers(inner, &map).await?;
    inner.lock().insert(entry.port, entry.clone());
    info!(
        "server {} on port {} taken over by a new key",
        entry.upstream, entry.port
    );
    Ok((entry, false))
}

/// A new server, or one moving to another port (`existing`): binds its port first, so a port in
/// use changes nothing; saves its bans, then `servers.json`; then starts relaying it and stops
/// the former server.
async fn start(
    inner: &Inner,
    mut map: BTreeMap<u16, Registered>,
    existing: Option<Registered>,
    mut entry: Registered,
) -> Result<Registered, RegistryError> {
    let (target, upstream) = (entry.port, entry.upstream);
    let public = UdpSocket::bind((inner.config.bind, target))
        .await
        .map_err(|source| RegistryError::Bind {
            port: target,
            source,
        })?;
    // Its bans go with it (from the running server, or from its file if it was not relayed).
    let bans: Vec<Ban> = match &existing {
        Some(Registered {
            handle: Some(h), ..
        }) => h.bans(),
        Some(e) => bans::load(&inner.bans_path(e.port))?,
        None => Vec::new(),
    };
    save_bans(inner, target, bans.clone()).await?;
    if let Some(e) = &existing {
        map.remove(&e.port);
    }
    map.insert(target, entry.clone());
    save_servers(inner, &map).await?;
    // Committed: start relaying.
    match inner.start_on(public, upstream, bans.into_iter()) {
        Ok(h) => entry.handle = Some(h),
        Err(e) => error!("server {upstream} on port {target}: {e}"),
    }
    {
        let mut servers = inner.lock();
        if let Some(e) = &existing {
            servers.remove(&e.port);
        }
        servers.insert(target, entry.clone());
    }
    if let Some(e) = existing {
        if let Some(h) = &e.handle {
            h.stop().await;
        }
        if e.port != target {
            remove_file(&inner.bans_path(e.port));
        }
    }
    Ok(entry)
}

async fn leave(inner: &Inner, port: u16) -> Result<(), RegistryError> {
    let mut next = inner.lock().clone();
    let gone = next.remove(&port).ok_or(RegistryError::NoServer)?;
    save_servers(inner, &next).await?;
    inner.lock().remove(&port);
    if let Some(h) = &gone.handle {
        h.stop().await;
    }
    remove_file(&inner.bans_path(port));
    info!("server {} left port {port}", gone.upstream);
    Ok(())
}

fn handle_of(inner: &Inner, port: u16) -> Result<Arc<ServerHandle>, RegistryError> {
    let servers = inner.lock();
    let r = servers.get(&port).ok_or(RegistryError::NoServer)?;
    r.handle.clone().ok_or(RegistryError::NotRelaying)
}

async fn ban_op(inner: &Inner, port: u16, ban: Ban) -> Result<(), RegistryError> {
    let handle = handle_of(inner, port)?;
    let list = bans::with(handle.bans(), ban.clone()).map_err(|_| RegistryError::BansFull)?;
    save_bans(inner, port, list).await?;
    handle.ban(ban).map_err(|_| RegistryError::BansFull)
}

async fn unban_op(inner: &Inner, port: u16, ip: IpAddr) -> Result<(), RegistryError> {
    let handle = handle_of(inner, port)?;
    let rest = bans::without(&handle.bans(), ip).ok_or(RegistryError::NotBanned)?;
    save_bans(inner, port, rest).await?;
    handle.unban(ip);
    Ok(())
}
