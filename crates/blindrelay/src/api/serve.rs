//! The accept loop both listeners run (instead of `axum::serve`, which has few knobs): hyper's
//! HTTP/1 connection builder with a header timeout, and a bounded table of open connections.
//!
//! - **Header timeout** ([`HEADER_TIMEOUT`], `--header-timeout`): a connection that has not sent
//!   a complete request head within it is closed. hyper starts this timer whenever it waits for
//!   a head, on a new connection and between two requests of a kept-alive one, so it is the idle
//!   timeout too.
//! - **Connections** ([`CONNECTIONS`], `--max-connections`): at most this many open, at most
//!   [`CONNECTIONS_PER_SOURCE`] per source, and [`CONNECTIONS_RESERVED`] of them only for known
//!   sources (`crate::sources`). A connection over a cap is closed at once, before anything is
//!   read (`connections_refused`).
//! - The body's deadline is the relay handler's (`api::relay_request`).
//! - **TLS** (the public listener, `crate::links`): the TLS 1.3 handshake must end within the
//!   header timeout too; a slow or half-open handshake is closed then and counted as a timed
//!   out connection. The connection caps above are taken before the handshake starts.
//!
//! Each request carries its peer's address ([`PeerAddr`]) for the handler to classify; nothing
//! here logs an address.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::pipeline::Pipeline;
use crate::sources::{CountLimits, CountTable};

/// A request head must arrive within this (also the idle timeout between requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Open connections at most, per listener.
pub const CONNECTIONS: usize = 1024;
/// Open connections one source may hold.
pub const CONNECTIONS_PER_SOURCE: usize = 32;
/// Open connections only known sources may take.
pub const CONNECTIONS_RESERVED: usize = 128;
/// Longest wait for open connections to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(2);

/// The peer address of the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub IpAddr);

/// A listener's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenConfig {
    /// See [`HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// Connections: total, per source, reserved for known sources.
    pub connections: CountLimits,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            header_timeout: HEADER_TIMEOUT,
            connections: CountLimits {
                total: CONNECTIONS,
                per_source: CONNECTIONS_PER_SOURCE,
                reserved: CONNECTIONS_RESERVED,
            },
        }
    }
}

/// The open connections of a listener.
#[derive(Debug, Clone)]
pub struct Connections {
    table: CountTable,
}

impl Connections {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.table.held()
    }
}

/// Serves `router` on `listener` until `cancel`, then lets open connections finish (at most
/// [`DRAIN`]). Connections are classified and counted by `pipeline`'s sources and counters.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    pipeline: Arc<Pipeline>,
    config: ListenConfig,
    connections: Connections,
    tls: Option<TlsAcceptor>,
    cancel: CancellationToken,
) {
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(_) => {
                // Out of descriptors or a transient error: let the table drain a moment.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let source = pipeline.classify(addr.ip());
        let Ok(held) = connections.table.acquire(source.key()) else {
            pipeline.ctx().counters.connections_refused.inc();
            drop(stream);
            continue;
        };
        let (router, pipeline, cancel) = (router.clone(), Arc::clone(&pipeline), cancel.clone());
        let tls = tls.clone();
        tracker.spawn(async move {
            let _ = stream.set_nodelay(true);
            let served = match tls {
                None => connection(stream, addr, router, config, cancel).await,
                Some(tls) => {
                    match tokio::time::timeout(config.header_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => connection(stream, addr, router, config, cancel).await,
                        // A failed handshake is not a timeout: the peer went away or spoke
                        // something else.
                        Ok(Err(_)) => true,
                        Err(_) => false,
                    }
                }
            };
            if !served {
                pipeline.ctx().counters.connections_timed_out.inc();
            }
            drop(held);
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(DRAIN, tracker.wait()).await;
}

/// One connection until it closes; false if it was closed for its header timeout.
async fn connection<S>(
    stream: S,
    addr: SocketAddr,
    router: Router,
    config: ListenConfig,
    cancel: CancellationToken,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = PeerAddr(addr.ip());
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(peer);
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.oneshot(req).await.unwrap_or_else(|e| match e {})) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    !matches!(result, Err(e) if e.is_timeout())
}

/// The connection table for `config`.
pub fn connections(config: &ListenConfig) -> Connections {
    Connections {
        table: CountTable::new(config.connections),
    }
}
