//! Several servers in one process: `etrelay --ports … --control … --token-file … --state-dir …`.
//!
//! No server is relayed until registered through the control API; registered servers are
//! relayed again after a restart. On SIGTERM/SIGINT every server sends its flatline first. On
//! SIGHUP ([`run`]'s `reloads`) the token file is read again and every server resolves its
//! masters' names again; nothing stops.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::Instant;
use crate::control::{self, ControlState, ListenLimits};
use crate::fdbudget::{self, NoRoomForSessions};
use crate::registry::{Registry, RegistryConfig, RegistryError};
use crate::secret::Secret;
use crate::server::Budget;

/// Longest wait for the control API to stop (its own grace, then every connection dropped).
const API_STOP: Duration = Duration::from_secs(2);
/// Longest wait for the servers to stop; their flatlines leave first (a master name that does
/// not resolve is given up on after 5 s).
pub const SERVERS_STOP: Duration = Duration::from_secs(6);

/// Most ports in one range of `--ports`.
pub const MAX_RANGE: usize = 4096;

/// What the multi-server daemon needs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Ports, bind address, state dir, and the settings of every server.
    pub registry: RegistryConfig,
    /// Where the control API listens.
    pub control: SocketAddr,
    /// The control API's connection cap and timeouts.
    pub listen: ListenLimits,
    /// The relay token (at least [`crate::proof::MIN_KEY`] characters).
    pub token: Secret,
    /// Where it was read from (`--token-file`), read again on SIGHUP; `None`: `ETRELAY_TOKEN`.
    pub token_file: Option<PathBuf>,
    /// Sessions open at once, all servers together.
    pub max_sessions: usize,
    /// Bytes queued towards the game servers, all servers together.
    pub max_queued_bytes: usize,
    /// Wait for each proof `getstatus`.
    pub proof_timeout: Duration,
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The descriptor limit leaves no room for sessions.
    #[error(transparent)]
    Descriptors(#[from] NoRoomForSessions),
    /// The state dir or a state file cannot be read.
    #[error("cannot open the state: {0}")]
    State(#[source] RegistryError),
}

/// Why the relay token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file cannot be read.
    #[error("cannot read the token file {}: {source}{access}", path.display())]
    File {
        /// `--token-file`.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
        /// When permission was denied: the file's owner and mode, the relay's user, and what
        /// to change (else empty).
        access: String,
    },
    /// A token shorter than [`crate::proof::MIN_KEY`].
    #[error(
        "the relay token must have at least {} characters",
        crate::proof::MIN_KEY
    )]
    Short,
}

/// The relay token in `path` (trimmed), as `--token-file` is read at start and on SIGHUP.
///
/// # Errors
/// The file cannot be read, or the token is too short.
pub fn read_token_file(path: &std::path::Path) -> Result<Secret, TokenError> {
    let token = std::fs::read_to_string(path)
        .map_err(|source| TokenError::File {
            path: path.to_path_buf(),
            access: if source.kind() == std::io::ErrorKind::PermissionDenied {
                use std::os::unix::fs::MetadataExt as _;
                let owner = std::fs::metadata(path)
                    .ok()
                    .map(|m| (m.uid(), m.gid(), m.mode()));
                let user = (
                    rustix::process::getuid().as_raw(),
                    rustix::process::getgid().as_raw(),
                );
                permission_hint(path, owner, user)
            } else {
                String::new()
            },
            source,
        })?
        .trim()
        .to_string();
    checked_token(token)
}

/// What an operator needs to know when the relay, running as `user` (uid, gid), may not read
/// the token file at `path` whose owner, group and mode are `owner` (`None`: not even its
/// metadata could be had, so a directory on the way is closed to the relay).
fn permission_hint(
    path: &std::path::Path,
    owner: Option<(u32, u32, u32)>,
    user: (u32, u32),
) -> String {
    let p = path.display();
    let (uid, gid) = user;
    match owner {
        Some((fuid, fgid, mode)) => format!(
            " (the file is uid {fuid}, gid {fgid}, mode {:04o}; etrelay runs as uid {uid}, \
             gid {gid}: let its group read the file, e.g. `chown root:etrelay {p}` and \
             `chmod 0640 {p}`)",
            mode & 0o7777
        ),
        None => format!(
            " (etrelay runs as uid {uid}, gid {gid} and cannot reach the file: every directory \
             above {p} must let it through, e.g. /etc/etrelay root:etrelay 0750)"
        ),
    }
}

/// `token` when it is long enough.
///
/// # Errors
/// [`TokenError::Short`].
pub fn checked_token(token: String) -> Result<Secret, TokenError> {
    if token.chars().count() < crate::proof::MIN_KEY {
        return Err(TokenError::Short);
    }
    Ok(Secret::new(token))
}

/// A bad `--ports` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortsError {
    /// A part is neither a port nor a range of ports.
    #[error("{0:?} is not a port or a range")]
    NotPort(String),
    /// A range that is empty or starts at port 0.
    #[error("{0:?} is not a valid range")]
    BadRange(String),
    /// A range of more than [`MAX_RANGE`] ports.
    #[error("{0:?}: at most {MAX_RANGE} ports")]
    TooLong(String),
    /// A port given twice.
    #[error("port {0} is given twice")]
    Twice(u16),
    /// No port at all.
    #[error("no port given")]
    Empty,
}

/// Runs until `shutdown` completes, then stops every server (flatlines first). Each change of
/// `reloads` (SIGHUP) re-reads the token file and the masters' names.
///
/// # Errors
/// No room for sessions in the descriptor limit; the state dir or a state file cannot be read.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl Future<Output = ()>,
    mut reloads: watch::Receiver<u64>,
) -> Result<(), DaemonError> {
    let root = CancellationToken::new();
    let max_sessions = fdbudget::fit_sessions(
        config.max_sessions,
        config.registry.ports.len(),
        config.listen.max_conns,
    )?;
    let registry = Registry::open(
        config.registry.clone(),
        Budget::new(max_sessions, config.max_queued_bytes),
        &root,
    )
    .await
    .map_err(DaemonError::State)?;
    info!(
        ports = %ports_text(registry.ports()),
        bind = %config.registry.bind,
        state_dir = %config.registry.state_dir.display(),
        "several servers: started"
    );
    let state = ControlState::new(
        registry.clone(),
        config.token.expose(),
        config.proof_timeout,
    );
    let api_cancel = root.child_token();
    let api = tokio::spawn(control::serve(
        config.control,
        state.clone(),
        config.listen,
        api_cancel.clone(),
    ));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            changed = reloads.changed() => {
                if changed.is_err() {
                    // Nobody can send a reload any more: wait for the end alone.
                    (&mut shutdown).await;
                    break;
                }
                reload_token(config.token_file.as_deref(), &state);
                registry.reload();
            }
        }
    }
    let started = Instant::now();
    // The API and the servers stop side by side: the flatlines leave at once, whatever the
    // API's clients are doing.
    api_cancel.cancel();
    let servers = registry.shutdown(SERVERS_STOP);
    let (_, stopped) = tokio::join!(tokio::time::timeout(API_STOP, api), servers);
    if !stopped {
        warn!(
            after_secs = SERVERS_STOP.as_secs(),
            "servers still stopping: left behind"
        );
    }
    root.cancel();
    info!(ms = started.elapsed().as_millis(), "stopped");
    Ok(())
}

/// SIGHUP: the token file read again; a file that cannot be read or holds a short token keeps
/// the old token, with a warning.
fn reload_token(path: Option<&std::path::Path>, state: &ControlState) {
    let Some(path) = path else {
        info!("reload: the token comes from ETRELAY_TOKEN, not re-read");
        return;
    };
    match read_token_file(path) {
        Ok(token) if state.set_token(token.expose()) => {
            info!(path = %path.display(), "reload: new relay token");
        }
        Ok(_) => info!(path = %path.display(), "reload: relay token unchanged"),
        Err(e) => warn!(error = %e, "reload: the relay token in use is kept"),
    }
}

/// `27960-27962,27975` for a list of ports.
pub fn ports_text(ports: &[u16]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ports.len() {
        let start = ports[i];
        let mut end = start;
        while i + 1 < ports.len() && ports[i + 1] == end.wrapping_add(1) {
            i += 1;
            end = ports[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Parses `27960-27969,27975`: ranges and single ports, in order, no repeats, no port 0.
///
/// # Errors
/// [`PortsError`] naming the bad part.
pub fn parse_ports(s: &str) -> Result<Vec<u16>, PortsError> {
    let mut out: Vec<u16> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: u16 = a
            .trim()
            .parse()
            .map_err(|_| PortsError::NotPort(part.to_string()))?;
        let b: u16 = b
            .trim()
            .parse()
            .map_err(|_| PortsError::NotPort(part.to_string()))?;
        if a == 0 || b < a {
            return Err(PortsError::BadRange(part.to_string()));
        }
        if usize::from(b - a) >= MAX_RANGE {
            return Err(PortsError::TooLong(part.to_string()));
        }
        for p in a..=b {
            if out.contains(&p) {
                return Err(PortsError::Twice(p));
            }
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(PortsError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token file the relay's user may not read: the error names the path, the file's owner
    /// and mode, the user the relay runs as, and the change that lets it read.
    #[test]
    fn an_unreadable_token_file_says_why_and_what_to_change() {
        let path = std::path::Path::new("/etc/etrelay/token");
        let hint = permission_hint(path, Some((0, 0, 0o100600)), (998, 997));
        assert_eq!(
            hint,
            " (the file is uid 0, gid 0, mode 0600; etrelay runs as uid 998, gid 997: let its \
             group read the file, e.g. `chown root:etrelay /etc/etrelay/token` and `chmod 0640 \
             /etc/etrelay/token`)"
        );
        let closed = permission_hint(path, None, (998, 997));
        assert!(
            closed.contains("every directory above /etc/etrelay/token"),
            "{closed}"
        );
        let e = TokenError::File {
            path: path.into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            access: hint,
        };
        assert!(
            e.to_string().starts_with("cannot read the token file /etc/etrelay/token: permission denied (the file is uid 0"),
            "{e}"
        );
    }

    #[test]
    fn port_lists() {
        assert_eq!(
            parse_ports("27960-27962,27975").unwrap(),
            vec![27960, 27961, 27962, 27975]
        );
        assert_eq!(parse_ports("27960").unwrap(), vec![27960]);
        assert!(parse_ports("").is_err());
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("27962-27960").is_err());
        assert!(parse_ports("27960,27960").is_err());
        assert!(parse_ports("x").is_err());
        assert_eq!(
            ports_text(&[27960, 27961, 27962, 27975]),
            "27960-27962,27975"
        );
    }
}
