//! One server in one process: `etrelay [OPTIONS] <UPSTREAM>`.
//!
//! The upstream is checked first, as the several-servers mode checks a registration's
//! ([`crate::registry::upstream_refusal`]): never a loopback address without
//! `--allow-loopback-upstream`, never the relay's own public address (a loop), never an
//! address no game server has. Then the public socket (and `--metrics`) are bound and the
//! server runs until `shutdown` completes; on the way out it sends its flatline (ET). Each
//! change of `reloads` (SIGHUP) has it resolve its masters' names again.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::fdbudget::{self, NoRoomForSessions};
use crate::registry::{OwnSockets, upstream_refusal};
use crate::server::{Budget, ServerHandle};

/// What the one-server mode needs.
#[derive(Debug, Clone)]
pub struct SingleConfig {
    /// The server, its upstream included.
    pub server: ServerConfig,
    /// The public socket's address.
    pub listen: SocketAddr,
    /// Sessions open at once.
    pub max_sessions: usize,
    /// Bytes queued towards the game server.
    pub max_queued_bytes: usize,
    /// Where to serve `GET /metrics`, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Accept a loopback upstream (`--allow-loopback-upstream`: tests and demos on one host).
    pub allow_loopback: bool,
}

/// Why the one-server mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum SingleError {
    /// The upstream cannot be relayed (loopback, the relay itself, no game server's address).
    #[error("{0}")]
    Upstream(String),
    /// The descriptor limit leaves no room for sessions.
    #[error(transparent)]
    Descriptors(#[from] NoRoomForSessions),
    /// The public socket cannot be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// `--listen`.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The `--metrics` listener cannot be bound.
    #[error("cannot bind --metrics {addr}: {source}")]
    Metrics {
        /// `--metrics`.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The server cannot start (its sockets' addresses or options).
    #[error("cannot start: {0}")]
    Start(#[source] io::Error),
}

/// Relays `config.server.upstream` on `config.listen` until `shutdown` completes, then stops
/// the server (flatline first).
///
/// # Errors
/// [`SingleError`]: an upstream refused, no room for sessions, a socket that cannot be bound.
pub async fn run(
    config: SingleConfig,
    shutdown: impl Future<Output = ()>,
    mut reloads: watch::Receiver<u64>,
) -> Result<(), SingleError> {
    let upstream = config.server.upstream;
    check_upstream(upstream, config.listen, config.allow_loopback)?;
    let max_sessions = fdbudget::fit_sessions(config.max_sessions, 1, 0)?;
    let public = UdpSocket::bind(config.listen)
        .await
        .map_err(|source| SingleError::Bind {
            addr: config.listen,
            source,
        })?;
    if config.listen.port() == 0 {
        // The port the kernel chose is the relay's own too.
        let bound = public.local_addr().map_err(SingleError::Start)?;
        check_upstream(upstream, bound, config.allow_loopback)?;
    }
    let metrics = match config.metrics {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| SingleError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let root = CancellationToken::new();
    let metrics_stop = CancellationToken::new();
    let budget = Budget::new(max_sessions, config.max_queued_bytes);
    let server = Arc::new(
        ServerHandle::start(config.server, public, budget.clone(), &root)
            .map_err(SingleError::Start)?,
    );
    let served = metrics.map(|l| {
        tokio::spawn(crate::metrics_http::serve(
            l,
            Arc::clone(&server),
            budget,
            metrics_stop.clone(),
        ))
    });
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            changed = reloads.changed() => match changed {
                Ok(()) => server.reload(),
                Err(_) => {
                    (&mut shutdown).await;
                    break;
                }
            },
        }
    }
    metrics_stop.cancel();
    if let Some(task) = served {
        let _ = task.await;
    }
    server.stop().await;
    Ok(())
}

/// Refuses an upstream the relay on `listen` cannot relay.
fn check_upstream(
    upstream: SocketAddr,
    listen: SocketAddr,
    allow_loopback: bool,
) -> Result<(), SingleError> {
    let own = OwnSockets {
        ports: &[listen.port()],
        bind: listen.ip(),
        control: None,
        allow_loopback,
    };
    match upstream_refusal(upstream, &own) {
        Some(why) => Err(SingleError::Upstream(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(upstream: &str, listen: &str, allow_loopback: bool) -> Result<(), SingleError> {
        check_upstream(
            upstream.parse().unwrap(),
            listen.parse().unwrap(),
            allow_loopback,
        )
    }

    #[test]
    fn the_upstream_is_checked_as_a_registration_is() {
        let e = check("127.0.0.1:27961", "0.0.0.0:27960", false).unwrap_err();
        assert!(e.to_string().contains("--allow-loopback-upstream"), "{e}");
        assert!(check("127.0.0.1:27961", "0.0.0.0:27960", true).is_ok());
        let own = check("127.0.0.9:27960", "127.0.0.9:27960", true).unwrap_err();
        assert!(own.to_string().contains("a loop"), "{own}");
        assert!(
            check("127.0.0.9:27960", "0.0.0.0:27960", true).is_err(),
            "every address of the host"
        );
        assert!(check("192.0.2.1:27960", "0.0.0.0:27960", false).is_ok());
        assert!(check("0.0.0.0:27960", "127.0.0.9:27961", true).is_err());
    }
}
