//! Both listeners run the shared [`listener`] accept loop (hyper's HTTP/1 connection builder
//! with a header timeout, a bounded table of open connections, a bounded stop), configured here.
//!
//! - **Header timeout** ([`HEADER_TIMEOUT`], `--header-timeout`): a connection that has not sent
//!   a complete request head within it is closed. hyper starts this timer whenever it waits for
//!   a head, on a new connection and between two requests of a kept-alive one, so it is the idle
//!   timeout too (`connections_timed_out`).
//! - **Connections** ([`CONNECTIONS`], `--max-connections`): at most this many open, at most
//!   [`CONNECTIONS_PER_SOURCE`] per source, and [`CONNECTIONS_RESERVED`] of them only for known
//!   sources (`crate::sources`: a source is an address block or a known peer, counted in a
//!   [`Connections`] table). A connection over a cap is closed at once, before anything is
//!   read (`connections_refused`).
//! - The body's deadline is the relay handler's (`api::relay_request`).
//! - **TLS** (the public listener, `crate::links`): the TLS 1.3 handshake must end within the
//!   header timeout too; a slow or half-open handshake is closed then and counted as a timed
//!   out connection. The connection caps above are taken before the handshake starts. A link
//!   whose client chose the framed link (`blindrelay/1`, `crate::proto::link`) is served by
//!   `api::link` instead of HTTP, within the same caps, the header timeout as its idle timeout.
//! - **Stop**: kept-alive connections close after their request in flight; [`DRAIN`] later
//!   every connection left is dropped.
//!
//! Each request carries its peer's address (axum's `ConnectInfo<SocketAddr>`) for the handler
//! to classify; nothing here logs an address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use listener::{Admit, Closed, Config, Hooks, Limits, Listener, Refusal, Refused, Wrap};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::links::LinkPeer;
use crate::pipeline::Pipeline;
use crate::sources::{CountLimits, CountTable, Held};

/// A request head must arrive within this (also the idle timeout between requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Open connections at most, per listener.
pub const CONNECTIONS: usize = 1024;
/// Open connections one source may hold.
pub const CONNECTIONS_PER_SOURCE: usize = 32;
/// Open connections only known sources may take.
pub const CONNECTIONS_RESERVED: usize = 128;
/// Longest wait for open connections to finish at shutdown, before they are dropped.
const DRAIN: Duration = Duration::from_secs(2);
/// Pause after an accept error (out of descriptors): lets the table drain a moment.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

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

/// The open connections of a listener, counted per source ([`CountTable::held`]: open now).
pub type Connections = CountTable;

/// Serves `router` on `listener` until `cancel`, then lets open connections finish (at most
/// [`DRAIN`]). Connections are classified by `pipeline`'s sources, counted in `connections`
/// and in its counters; with `tls`, each is a TLS connection.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    pipeline: Arc<Pipeline>,
    config: ListenConfig,
    connections: Connections,
    tls: Option<TlsAcceptor>,
    cancel: CancellationToken,
) {
    let shared = Config {
        header_timeout: config.header_timeout,
        conn_deadline: None,
        keep_alive: true,
        max_head: listener::HYPER_MAX_HEAD,
        grace: DRAIN,
        accept_backoff: ACCEPT_BACKOFF,
    };
    let counting = Counting(Arc::clone(&pipeline));
    let handshakes = Arc::clone(&pipeline);
    let admit = Sources {
        pipeline,
        table: connections,
    };
    let served = Listener::new(shared, admit).with_hooks(counting);
    match tls {
        None => served.serve(listener, router, cancel).await,
        Some(tls) => {
            served
                .serve_wrapped(listener, router, Tls(tls, handshakes), cancel)
                .await;
        }
    }
}

/// The connection table for `config`.
pub fn connections(config: &ListenConfig) -> Connections {
    CountTable::new(config.connections)
}

/// A connection counted in the table under its source (`Pipeline::classify`).
#[derive(Debug)]
struct Sources {
    pipeline: Arc<Pipeline>,
    table: CountTable,
}

impl Admit for Sources {
    type Slot = Held;

    fn admit(&self, peer: SocketAddr) -> Result<Held, Refusal> {
        let source = self.pipeline.classify(peer.ip());
        self.table.acquire(source.key())
    }

    fn held(&self) -> usize {
        self.table.held()
    }

    fn limits(&self) -> Limits {
        self.table.limits()
    }
}

/// `connections_refused` and `connections_timed_out` (the header timeout, or a handshake not
/// over within it; a failed handshake is not a timeout: the peer went away or spoke something
/// else).
#[derive(Debug)]
struct Counting(Arc<Pipeline>);

impl Hooks for Counting {
    fn refused(&self, _refused: &Refused) {
        self.0.ctx().counters.connections_refused.inc();
    }

    fn closed(&self, _peer: SocketAddr, how: &Closed) {
        if how.timed_out() {
            self.0.ctx().counters.connections_timed_out.inc();
        }
    }
}

/// The links' TLS 1.3 handshake (`crate::links`); every request on the link carries the node
/// id its client authenticated with ([`LinkPeer`]). Handshakes are counted (`tls_handshakes`,
/// `tls_handshake_failed`).
struct Tls(TlsAcceptor, Arc<Pipeline>);

impl Wrap for Tls {
    type Stream = TlsStream<TcpStream>;
    type Info = LinkPeer;

    async fn wrap(&self, tcp: TcpStream) -> std::io::Result<(TlsStream<TcpStream>, LinkPeer)> {
        let counters = &self.1.ctx().counters;
        let stream = self
            .0
            .accept(tcp)
            .await
            .inspect_err(|_| counters.tls_handshake_failed.inc())?;
        counters.tls_handshakes.inc();
        let peer = LinkPeer::of(stream.get_ref().1);
        Ok((stream, peer))
    }

    /// A link whose client chose the framed link (`blindrelay/1`) is served by
    /// `api::link`; any other is HTTP.
    async fn serve_own(
        &self,
        stream: TlsStream<TcpStream>,
        peer: SocketAddr,
        info: &LinkPeer,
        config: &Config,
        stop: &CancellationToken,
    ) -> Result<Closed, TlsStream<TcpStream>> {
        if stream.get_ref().1.alpn_protocol() != Some(crate::proto::link::ALPN) {
            return Err(stream);
        }
        let pipeline = Arc::clone(&self.1);
        Ok(super::link::serve(pipeline, stream, peer, info.0, config.header_timeout, stop).await)
    }
}
