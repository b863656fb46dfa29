//! Start-up: the state directory as it was left, server by server.
//!
//! 1. Stray temp files (an interrupted atomic write: `.servers.json.tmp.<pid>`) are removed.
//! 2. `servers.json` is read; a file that does not parse stops the relay (nothing can be
//!    relayed without it). A record whose port or upstream repeats an earlier record's is
//!    refused (logged with its contents; the file as it was is kept as
//!    `servers.json.refused`), so no server silently shadows another.
//! 3. Each server is restored on its own: its upstream is checked (no loop), its ban store
//!    opened (a JSON ban file of an earlier version imported), its port bound. Whatever fails
//!    keeps that server registered but not relayed, with the reason in its status and an ERROR
//!    line; the other servers are relayed. A port that could not be bound is tried again every
//!    10 s ([`super::rebind`]). A key that owns an earlier record's server too is logged as an
//!    error: its routes reach the lowest port only, until that server is registered again.
//! 4. Ban stores of ports no server holds (left by an interrupted leave) are removed.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use guard::statefile;
use tracing::{error, info, warn};

use super::{
    Inner, Registered, RegistryError, ServerRecord, ServersFile, blocking, rebind, upstream,
};
use crate::bans::store::{self, Store};
use crate::clock::{from_unix, wall_now};
use crate::net::canonical;
use crate::proof::parse_key_hash;

pub(super) async fn restore(inner: &Arc<Inner>) -> Result<(), RegistryError> {
    let dir = inner.config.state_dir.clone();
    remove_temp_files(&dir);
    let path = inner.servers_path();
    let file: ServersFile = statefile::load_json(&path)?.unwrap_or(ServersFile { servers: vec![] });
    let mut seen = Seen::default();
    let mut refused = 0;
    for rec in file.servers {
        match entry_of(inner, &rec, &mut seen) {
            Some(entry) => restore_one(inner, entry).await,
            None => refused += 1,
        }
    }
    if refused > 0 {
        let keep = dir.join("servers.json.refused");
        match std::fs::copy(&path, &keep) {
            Ok(_) => warn!(path = %keep.display(), "servers.json as it was is kept"),
            Err(e) => warn!(error = %e, "cannot keep a copy of servers.json"),
        }
    }
    remove_stray_stores(inner, &dir);
    let n = inner.lock().len();
    if n > 0 {
        info!(servers = n, "registered servers restored");
    }
    Ok(())
}

/// The ports and upstreams of the records read so far.
#[derive(Default)]
struct Seen {
    ports: HashSet<u16>,
    upstreams: HashSet<SocketAddr>,
}

/// The registration `rec` describes, not started yet; `None` (logged) for a record refused: a
/// port or upstream an earlier record has, or a bad key hash.
fn entry_of(inner: &Inner, rec: &ServerRecord, seen: &mut Seen) -> Option<Registered> {
    let upstream = canonical(rec.upstream);
    if !seen.ports.insert(rec.port) || !seen.upstreams.insert(upstream) {
        error!(
            port = rec.port,
            upstream = %rec.upstream,
            key_sha256 = %rec.key_sha256,
            "servers.json: port or upstream given twice: the record is refused (register it \
             again)"
        );
        return None;
    }
    if !inner.config.ports.contains(&rec.port) {
        warn!(
            port = rec.port,
            "servers.json: port not in --ports any more; still relayed until it leaves"
        );
    }
    let Some(key_hash) = parse_key_hash(&rec.key_sha256) else {
        error!(
            port = rec.port,
            "servers.json: bad key_sha256, entry skipped"
        );
        return None;
    };
    if let Some(other) = inner.lock().values().find(|r| r.key_hash == key_hash) {
        error!(
            port = rec.port,
            key_of = other.port,
            "servers.json: a port has the key of another: its key routes reach the other only; \
             register it again with a key of its own"
        );
    }
    Some(Registered {
        port: rec.port,
        upstream,
        key_hash,
        registered_at: from_unix(rec.registered_at),
        handle: None,
        store: None,
        error: None,
        bind: None,
    })
}

/// Starts one restored server and keeps its registration whatever happens: a port that could
/// not be bound is tried again later, any other failure is kept as the reason it is not relayed.
async fn restore_one(inner: &Arc<Inner>, mut entry: Registered) {
    let (port, upstream) = (entry.port, entry.upstream);
    match start(inner, &mut entry).await {
        Ok(()) => {}
        Err(e @ RegistryError::Bind { .. }) => {
            error!(
                %upstream,
                port,
                error = %e,
                retry_secs = crate::config::BIND_RETRY.as_secs(),
                "registration kept, the port is tried again"
            );
            rebind::record_failure(&mut entry, &e);
        }
        Err(e) => {
            let why = match e {
                RegistryError::NotRelaying(why) => why,
                e => e.to_string(),
            };
            error!(%upstream, port, error = %why, "registration kept, not relayed");
            entry.error = Some(why);
        }
    }
    inner.lock().insert(port, entry);
}

/// Checks the upstream, opens the ban store, binds the port and starts the server.
async fn start(inner: &Arc<Inner>, entry: &mut Registered) -> Result<(), RegistryError> {
    if let Some(why) = upstream::refusal(entry.upstream, &inner.config) {
        return Err(RegistryError::BadUpstream(why));
    }
    let (dir, port) = (inner.config.state_dir.clone(), entry.port);
    let (store, _) = blocking(move || Ok(Store::open_checked(&dir, port, wall_now())?))
        .await
        .map_err(|e| RegistryError::NotRelaying(format!("ban store: {e}")))?;
    entry.store = Some(Arc::new(store));
    rebind::bind_and_start(inner, entry).await
}

/// Removes what an interrupted atomic write leaves: `.<name>.tmp.<pid>`.
fn remove_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.contains(".tmp.") {
            match std::fs::remove_file(e.path()) {
                Ok(()) => info!(path = %e.path().display(), "stray temp file removed"),
                Err(err) => warn!(path = %e.path().display(), error = %err, "cannot remove"),
            }
        }
    }
}

/// Removes the ban stores (and JSON ban files) of ports no server holds.
fn remove_stray_stores(inner: &Inner, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let held: HashSet<u16> = inner.lock().keys().copied().collect();
    let mut stray = HashSet::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let port = name
            .strip_prefix("bans-")
            .and_then(|r| r.split_once('.'))
            .and_then(|(p, _)| p.parse::<u16>().ok());
        if let Some(p) = port.filter(|p| !held.contains(p)) {
            stray.insert(p);
        }
    }
    for p in stray {
        let json = crate::bans::path(dir, p);
        let r = store::remove(dir, p).and_then(|()| match std::fs::remove_file(&json) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        });
        match r {
            Ok(()) => info!(port = p, "bans of a port no server holds removed"),
            Err(e) => warn!(port = p, error = %e, "cannot remove the bans of a port"),
        }
    }
}
