//! The HTTP/1 accept loop etrelay and blindrelay share (instead of `axum::serve`, which has
//! few knobs): an axum [`Router`] served with hyper's connection builder, within bounds no
//! client can stretch.
//!
//! - **Connection caps** ([`Admit`], [`Table`]): at most [`Limits::total`] connections open,
//!   at most [`Limits::per_source`] per source, and [`Limits::reserved`] of them only for
//!   sources the caller trusts. The source is what the caller makes of the peer's address
//!   ([`BySource`]): etrelay counts per address ([`Listener::per_ip`]), blindrelay per address
//!   block or known peer (its own table behind [`Admit`]). A connection over a cap is accepted and closed at once, before anything is read (accepting
//!   takes it out of the kernel's queue, where it would delay everyone behind it), and reported
//!   to [`Hooks::refused`].
//! - **Header deadline** ([`Config::header_timeout`]): a connection that has not sent a
//!   complete request head within it is closed. hyper starts this timer whenever it waits for
//!   a head, on a new connection and between two requests of a kept-alive one, so it is the
//!   idle timeout too. The [`Wrap`] step (a TLS handshake) must end within it as well.
//! - **Connection deadline** ([`Config::conn_deadline`]): no connection lives past it,
//!   whatever it does.
//! - **Wrap** ([`Wrap`]): an async step between accepting a TCP stream and speaking HTTP on it
//!   (blindrelay's TLS acceptor); [`Plain`] serves the stream as it is. The caps are taken
//!   before it starts. A connection the step agreed on a protocol of its own for (blindrelay's
//!   framed link) is served by [`Wrap::serve_own`] instead of HTTP, within the same caps and
//!   deadlines.
//! - **Bounded stop**: when cancelled, the listener closes, kept-alive connections close after
//!   the request in flight (hyper's graceful shutdown), [`Config::grace`] later every
//!   connection left is dropped.
//! - Accept errors (a full descriptor table) pause the loop [`Config::accept_backoff`] and go
//!   to [`Hooks::accept_failed`]; every connection's end goes to [`Hooks::closed`].
//!
//! Each request carries its peer's address as axum's [`ConnectInfo<SocketAddr>`] extension, and
//! what the wrap step learned of the connection ([`Wrap::Info`]).
//! Nothing here logs: what to count or log is the caller's ([`Hooks`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod table;

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

pub use self::table::{Key, Limits, Refusal, Slot, Table};

/// Smallest request head buffer hyper accepts (it panics below it).
pub const MIN_HEAD: usize = 8192;
/// hyper's own default for the largest buffered request head (8 KiB + 100 × 4 KiB).
pub const HYPER_MAX_HEAD: usize = 8192 + 4096 * 100;

/// A listener's timeouts and HTTP settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// A request head must arrive within this, on a new connection and between two requests of
    /// a kept-alive one (the idle timeout); the [`Wrap`] step must end within it too.
    pub header_timeout: Duration,
    /// No connection lives past this, whatever it does; `None`: no such deadline.
    pub conn_deadline: Option<Duration>,
    /// More than one request per connection.
    pub keep_alive: bool,
    /// Largest request head buffered, in bytes (at least [`MIN_HEAD`]); a longer one is
    /// answered 431 by hyper.
    pub max_head: usize,
    /// At stop: time the requests in flight get before their connections are dropped.
    pub grace: Duration,
    /// Pause after an accept error (a full descriptor table) before accepting again.
    pub accept_backoff: Duration,
}

/// How a connection ended.
#[derive(Debug)]
pub enum Closed {
    /// Served to its end: the client closed, or the last request was answered.
    Done,
    /// No complete request head within [`Config::header_timeout`] (a new or an idle
    /// connection).
    HeaderTimeout,
    /// The [`Wrap`] step did not end within [`Config::header_timeout`].
    WrapTimeout,
    /// The [`Wrap`] step failed (the peer went away or spoke something else).
    WrapFailed(io::Error),
    /// Closed at [`Config::conn_deadline`].
    Deadline,
    /// An HTTP error: a malformed request, a reset…
    Http(hyper::Error),
    /// Closed by the stop: during its [`Wrap`] step, or dropped after [`Config::grace`].
    Stopped,
    /// A protocol of the wrap step's own ([`Wrap::serve_own`]) ended on an error: a malformed
    /// frame, a reset…
    Own(io::Error),
}

impl Closed {
    /// True when the connection was closed for not sending in time (the header deadline, or a
    /// [`Wrap`] step that did not end in time).
    pub fn timed_out(&self) -> bool {
        matches!(self, Closed::HeaderTimeout | Closed::WrapTimeout)
    }
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Done => f.write_str("done"),
            Closed::HeaderTimeout => f.write_str("no request head in time"),
            Closed::WrapTimeout => f.write_str("handshake not over in time"),
            Closed::WrapFailed(e) => write!(f, "handshake failed: {e}"),
            Closed::Deadline => f.write_str("closed at its deadline"),
            Closed::Http(e) => write!(f, "{e}"),
            Closed::Stopped => f.write_str("closed at stop"),
            Closed::Own(e) => write!(f, "{e}"),
        }
    }
}

/// A connection refused at accept.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    /// Its peer.
    pub peer: SocketAddr,
    /// Which cap.
    pub why: Refusal,
    /// Connections open at the time.
    pub open: usize,
    /// The table's limits.
    pub limits: Limits,
}

/// What a caller counts or logs; each method by default does nothing. Called on the accept
/// loop's task ([`Hooks::refused`], [`Hooks::accept_failed`]) or the connection's: never
/// block.
pub trait Hooks: Send + Sync + 'static {
    /// A connection over a cap, closed at once.
    fn refused(&self, _refused: &Refused) {}
    /// `accept` failed; the loop pauses [`Config::accept_backoff`].
    fn accept_failed(&self, _error: &io::Error) {}
    /// An admitted connection ended (its place in the table already given back).
    fn closed(&self, _peer: SocketAddr, _how: &Closed) {}
}

/// No hooks.
impl Hooks for () {}

/// The step between an accepted TCP stream and HTTP: a TLS handshake, say.
pub trait Wrap: Send + Sync + 'static {
    /// What HTTP is spoken over.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// What the step learned of the connection (the key a TLS client authenticated with, say):
    /// every request on it carries a copy as an extension.
    type Info: Clone + Send + Sync + 'static;
    /// Wraps `tcp`; bounded by [`Config::header_timeout`] and the stop by the loop.
    fn wrap(
        &self,
        tcp: TcpStream,
    ) -> impl Future<Output = io::Result<(Self::Stream, Self::Info)>> + Send;

    /// Serves a wrapped connection that speaks a protocol of the step's own instead of HTTP
    /// (what the wrap step agreed with the peer: a TLS application protocol, say), until it
    /// ends: how it closed. `Err(stream)` gives it back to be served as HTTP: the default, and
    /// what a connection that chose HTTP gets. [`Config::header_timeout`] is its idle timeout;
    /// from `stop` on it must end soon (the loop drops it [`Config::grace`] later anyway), and
    /// [`Config::conn_deadline`] bounds it as any connection.
    fn serve_own(
        &self,
        stream: Self::Stream,
        _peer: SocketAddr,
        _info: &Self::Info,
        _config: &Config,
        _stop: &CancellationToken,
    ) -> impl Future<Output = Result<Closed, Self::Stream>> + Send {
        std::future::ready(Err(stream))
    }
}

/// HTTP straight over TCP.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Wrap for Plain {
    type Stream = TcpStream;
    type Info = ();
    async fn wrap(&self, tcp: TcpStream) -> io::Result<(TcpStream, ())> {
        Ok((tcp, ()))
    }
}

/// `ip` with an IPv4-mapped IPv6 address written as IPv4 (one peer, one key, on a dual-stack
/// socket).
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Who may open a connection: takes a place for a peer, or says which cap refuses it.
pub trait Admit: Send + Sync + 'static {
    /// A connection's place, given back when dropped.
    type Slot: Send + 'static;
    /// A place for a connection from `peer`; never waits.
    ///
    /// # Errors
    /// [`Refusal`]: which cap refuses it.
    fn admit(&self, peer: SocketAddr) -> Result<Self::Slot, Refusal>;
    /// Connections open now.
    fn held(&self) -> usize;
    /// The caps.
    fn limits(&self) -> Limits;
}

/// A [`Table`] counting each connection under `source(peer)`.
pub struct BySource<K, F> {
    table: Table<K>,
    source: F,
}

impl<K, F> fmt::Debug for BySource<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BySource")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<K: Key, F: Fn(SocketAddr) -> K + Send + Sync + 'static> BySource<K, F> {
    /// Connections counted in `table` under `source(peer)`.
    pub fn new(table: Table<K>, source: F) -> Self {
        BySource { table, source }
    }
}

impl<K: Key, F: Fn(SocketAddr) -> K + Send + Sync + 'static> Admit for BySource<K, F> {
    type Slot = Slot<K>;
    fn admit(&self, peer: SocketAddr) -> Result<Slot<K>, Refusal> {
        self.table.acquire((self.source)(peer))
    }
    fn held(&self) -> usize {
        self.table.held()
    }
    fn limits(&self) -> Limits {
        self.table.limits()
    }
}

/// Per address ([`canonical_ip`]).
pub type PerIp = BySource<IpAddr, fn(SocketAddr) -> IpAddr>;

/// A configured listener: its [`Config`], who it admits ([`Admit`]: a connection table and
/// how a peer's address becomes a source), and its [`Hooks`]. [`Listener::serve`] runs it.
pub struct Listener<A> {
    config: Config,
    admit: A,
    hooks: Arc<dyn Hooks>,
}

impl<A: fmt::Debug> fmt::Debug for Listener<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("config", &self.config)
            .field("admit", &self.admit)
            .finish_non_exhaustive()
    }
}

impl Listener<PerIp> {
    /// Connections counted per address ([`canonical_ip`]), in a new table within `limits`.
    pub fn per_ip(config: Config, limits: Limits) -> Self {
        let source: fn(SocketAddr) -> IpAddr = |peer| canonical_ip(peer.ip());
        Listener::new(config, BySource::new(Table::new(limits), source))
    }
}

impl<K: Key, F: Fn(SocketAddr) -> K + Send + Sync + 'static> Listener<BySource<K, F>> {
    /// Connections counted in `table` under `source(peer)`.
    pub fn by_source(config: Config, table: Table<K>, source: F) -> Self {
        Listener::new(config, BySource::new(table, source))
    }
}

impl<A: Admit> Listener<A> {
    /// Connections admitted by `admit`.
    pub fn new(config: Config, admit: A) -> Self {
        Listener {
            config,
            admit,
            hooks: Arc::new(()),
        }
    }

    /// The same listener reporting to `hooks`.
    #[must_use]
    pub fn with_hooks(mut self, hooks: impl Hooks) -> Self {
        self.hooks = Arc::new(hooks);
        self
    }

    /// Serves `router` over plain TCP on `listener` until `cancel`, then stops within
    /// [`Config::grace`] (plus the time to drop the connections).
    pub async fn serve(self, listener: TcpListener, router: Router, cancel: CancellationToken) {
        self.serve_wrapped(listener, router, Plain, cancel).await;
    }

    /// As [`Listener::serve`], each accepted stream put through `wrap` first.
    pub async fn serve_wrapped<W: Wrap>(
        self,
        listener: TcpListener,
        router: Router,
        wrap: W,
        cancel: CancellationToken,
    ) {
        let Listener {
            config,
            admit,
            hooks,
        } = self;
        let wrap = Arc::new(wrap);
        let tracker = TaskTracker::new();
        let drop_all = CancellationToken::new();
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => break,
                r = listener.accept() => r,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    hooks.accept_failed(&e);
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(config.accept_backoff) => continue,
                    }
                }
            };
            let slot = match admit.admit(peer) {
                Ok(slot) => slot,
                Err(why) => {
                    drop(stream);
                    hooks.refused(&Refused {
                        peer,
                        why,
                        open: admit.held(),
                        limits: admit.limits(),
                    });
                    continue;
                }
            };
            let conn = connection(
                stream,
                peer,
                router.clone(),
                config,
                Arc::clone(&wrap),
                cancel.clone(),
            );
            let (hooks, drop_all) = (Arc::clone(&hooks), drop_all.clone());
            tracker.spawn(async move {
                let closed = tokio::select! {
                    c = conn => c,
                    () = drop_all.cancelled() => Closed::Stopped,
                };
                drop(slot);
                hooks.closed(peer, &closed);
            });
        }
        drop(listener);
        tracker.close();
        if tokio::time::timeout(config.grace, tracker.wait())
            .await
            .is_err()
        {
            drop_all.cancel();
            tracker.wait().await;
        }
    }
}

/// One admitted connection: wrapped, then served, within its deadlines; from `stop` on, its
/// request in flight is the last.
async fn connection<W: Wrap>(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    config: Config,
    wrap: Arc<W>,
    stop: CancellationToken,
) -> Closed {
    let _ = tcp.set_nodelay(true);
    let served = async {
        let stream = tokio::select! {
            r = tokio::time::timeout(config.header_timeout, wrap.wrap(tcp)) => match r {
                Ok(Ok(wrapped)) => wrapped,
                Ok(Err(e)) => return Closed::WrapFailed(e),
                Err(_) => return Closed::WrapTimeout,
            },
            () = stop.cancelled() => return Closed::Stopped,
        };
        let (stream, info) = stream;
        match wrap.serve_own(stream, peer, &info, &config, &stop).await {
            Ok(closed) => closed,
            Err(stream) => http1(stream, (peer, info), router, &config, &stop).await,
        }
    };
    match config.conn_deadline {
        Some(deadline) => tokio::time::timeout(deadline, served)
            .await
            .unwrap_or(Closed::Deadline),
        None => served.await,
    }
}

/// HTTP/1 on `stream` until it closes, `router` answering, each request with its peer's
/// address ([`ConnectInfo`]) and what the wrap step learned (`info`).
async fn http1<S, I>(
    stream: S,
    (peer, info): (SocketAddr, I),
    router: Router,
    config: &Config,
    stop: &CancellationToken,
) -> Closed
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: Clone + Send + Sync + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(info.clone());
        let router = router.clone();
        async move { router.oneshot(req).await }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(config.keep_alive)
        .max_buf_size(config.max_head.max(MIN_HEAD));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result: Result<(), hyper::Error> = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    match result {
        Ok(()) => Closed::Done,
        Err(e) if e.is_timeout() => Closed::HeaderTimeout,
        Err(e) => Closed::Http(e),
    }
}
