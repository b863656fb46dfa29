//! The writer task: registrations, takeovers, moves and leaves, one at a time; each writes
//! `servers.json` (and a moving server's ban store) before memory changes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use guard::statefile;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::{Inner, Op, Registered, RegistryError, blocking, rebind};
use crate::bans::Ban;
use crate::bans::store::{self, Store};
use crate::clock::wall_now;
use crate::proof::KeyHash;

/// The writer: applies changes one at a time; a change that arrives once the relay is
/// stopping is refused.
pub(super) async fn run(inner: Arc<Inner>, mut rx: mpsc::Receiver<Op>) {
    loop {
        let due = rebind::next_due(&inner);
        let retry = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let op = tokio::select! {
            op = rx.recv() => match op {
                Some(op) => op,
                None => break,
            },
            () = retry => {
                rebind::retry_due(&inner).await;
                continue;
            }
        };
        let stopping = inner.stopping.is_cancelled();
        match op {
            Op::Register {
                key_hash,
                upstream,
                port,
                reply,
            } => {
                let r = if stopping {
                    Err(RegistryError::Closed)
                } else {
                    register(&inner, key_hash, upstream, port).await
                };
                let _ = reply.send(r);
            }
            Op::Leave { port, reply } => {
                let r = if stopping {
                    Err(RegistryError::Closed)
                } else {
                    leave(&inner, port).await
                };
                let _ = reply.send(r);
            }
        }
    }
}

/// Writes `servers.json` off the reactor.
async fn save_servers(inner: &Inner, map: &BTreeMap<u16, Registered>) -> Result<(), RegistryError> {
    let (path, file) = (inner.servers_path(), Inner::servers_file(map));
    blocking(move || Ok(statefile::save_json(&path, &file)?)).await
}

/// Removes the ban store, the proven sources and the carried sessions of `port`.
fn remove_store(inner: &Inner, port: u16) {
    if let Err(e) = store::remove(&inner.config.state_dir, port) {
        warn!(port, error = %e, "cannot remove the bans of a port");
    }
    let dir = &inner.config.state_dir;
    for file in [
        crate::server::proven_path(dir, port),
        crate::server::carry_path(dir, port),
    ] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %file.display(), error = %e, "cannot remove"),
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
    // One key, one server: its routes would otherwise reach only one of them.
    if let Some(other) = map
        .values()
        .find(|r| r.upstream != upstream && r.key_hash == key_hash)
    {
        return Err(RegistryError::KeyInUse(other.port));
    }
    let existing = map.values().find(|r| r.upstream == upstream).cloned();
    let target = pick_port(inner, &map, existing.as_ref(), upstream, port)?;
    let entry = Registered {
        port: target,
        upstream,
        key_hash,
        registered_at: wall_now(),
        handle: None,
        store: None,
        error: None,
        bind: None,
    };
    match existing {
        Some(e) if e.port == target => take_over(inner, map, e, entry).await,
        Some(e) => {
            let former = e.port;
            let entry = start(inner, map, Some(e), entry).await?;
            info!(%upstream, from = former, port = target, "server moved to another port (new key)");
            Ok((entry, false))
        }
        None => {
            let entry = start(inner, map, None, entry).await?;
            info!(%upstream, port = target, "server registered");
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

/// Taken over on the same port: the relay goes on, with the new key. A port that could not be
/// bound is tried again at once.
async fn take_over(
    inner: &Inner,
    mut map: BTreeMap<u16, Registered>,
    existing: Registered,
    new: Registered,
) -> Result<(Registered, bool), RegistryError> {
    let mut entry = Registered {
        key_hash: new.key_hash,
        registered_at: new.registered_at,
        ..existing
    };
    map.insert(entry.port, entry.clone());
    save_servers(inner, &map).await?;
    info!(
        upstream = %entry.upstream,
        port = entry.port,
        "server taken over by a new key"
    );
    if entry.bind.is_some() {
        match rebind::bind_and_start(inner, &mut entry).await {
            Ok(()) => info!(
                upstream = %entry.upstream,
                port = entry.port,
                "server's port bound at its registration, relayed"
            ),
            Err(e) => rebind::record_failure(&mut entry, &e),
        }
    }
    inner.lock().insert(entry.port, entry.clone());
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
    // Its bans go with it (from the running server, or from its store if it was not relayed).
    let bans: Vec<Ban> = match &existing {
        Some(Registered {
            handle: Some(h), ..
        }) => h.bans(),
        Some(Registered {
            store: Some(s),
            port,
            ..
        }) => {
            let (store, port) = (Arc::clone(s), *port);
            blocking(move || Ok(store.load(wall_now())?))
                .await
                .map_err(|e| {
                    error!(port, error = %e, "cannot read a port's bans to move them");
                    e
                })?
        }
        Some(e) => {
            warn!(
                port = e.port,
                "the port's ban store could not be opened; the server moves without bans"
            );
            Vec::new()
        }
        None => Vec::new(),
    };
    let dir = inner.config.state_dir.clone();
    let list = bans.clone();
    let new_store = blocking(move || Ok(Store::create_with(&dir, target, &list)?)).await?;
    if let Some(e) = &existing {
        map.remove(&e.port);
    }
    map.insert(target, entry.clone());
    if let Err(e) = save_servers(inner, &map).await {
        drop(new_store);
        remove_store(inner, target);
        return Err(e);
    }
    // Committed: start relaying.
    entry.store = Some(Arc::new(new_store));
    match inner.start_on(public, upstream, bans) {
        Ok(h) => entry.handle = Some(h),
        Err(e) => {
            error!(%upstream, port = target, error = %e, "server not started");
            entry.error = Some(e.to_string());
        }
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
            drop(e.store);
            remove_store(inner, e.port);
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
    drop(gone.store);
    remove_store(inner, port);
    info!(upstream = %gone.upstream, port, "server left");
    Ok(())
}
