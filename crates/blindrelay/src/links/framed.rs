//! The client side of the framed link (`crate::proto::link`): one TLS session per next hop,
//! pinned to its node id as every link is, carrying every frame this node posts to it, each
//! with an id, their answers coming back in any order.
//!
//! - **Connecting**: the client offers `blindrelay/1` and `http/1.1` by ALPN. A next hop that
//!   chooses HTTP (a node of an earlier version, a tool) is remembered for [`HTTP_ONLY_FOR`]
//!   and reached over HTTP meanwhile ([`super::Links::client`]). Requests to a next hop whose
//!   link is being made wait for it (one handshake, not one per request), within their
//!   deadline and [`super::CONNECT_TIMEOUT`]; if it fails, they fail with it (`connect`).
//! - **Writing**: one task per link writes every frame queued in one go (frames queued while a
//!   write is under way leave with the next), then flushes.
//! - **Reading**: one task per link reads the answers and hands each to its request. A
//!   malformed answer, an unknown id, a reset or the end of the stream breaks the link: every
//!   request on it fails (`request`, which the forwarder retries as any transport error) and
//!   the next one makes a new link.
//! - **Bounds**: frames waiting for their write at most [`QUEUED`] per link (a sender waits
//!   for room within its deadline); requests in flight are bounded by the forwarder's slots per
//!   next hop; answers at most [`crate::proto::link::MAX_ANSWER`] bytes; links at most the
//!   links' client bound (past it the table starts again). A link idle for [`IDLE`] is not used
//!   again (a new one is made): shorter than a node's default idle timeout
//!   (`api::serve::HEADER_TIMEOUT`), so a frame is not written to a link its server is closing.
//!
//! Nothing here logs: errors are classified by kind, never printed (they could name an
//! address).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::clock::{self, Instant};
use crate::proto::NodeId;
use crate::proto::link::{ALPN, ANSWER_HEAD, AnswerHead, RequestHead};

/// How long a next hop that chose HTTP is reached over HTTP before the framed link is offered
/// again.
pub const HTTP_ONLY_FOR: Duration = Duration::from_secs(600);
/// A link unused this long is not used again.
pub const IDLE: Duration = Duration::from_secs(3);
/// Frames waiting for their write, per link.
pub const QUEUED: usize = 64;
/// The largest write buffer a link keeps between two writes.
const KEEP_BUFFER: usize = 256 * 1024;

/// What one request on a framed link got.
#[derive(Debug)]
pub enum Posted {
    /// An answer: status and body.
    Answer(u16, Vec<u8>),
    /// No answer: the failure's kind (`connect`, `timeout`, `request`).
    Failed(&'static str),
    /// The next hop does not speak the framed link: use HTTP.
    UseHttp,
}

/// A frame to write, and its id.
struct Outgoing {
    id: u32,
    frame: Vec<u8>,
}

type Waiters = Mutex<HashMap<u32, oneshot::Sender<(u16, Vec<u8>)>>>;

/// One link: the way to its writer, the requests waiting for answers.
struct Conn {
    frames: mpsc::Sender<Outgoing>,
    waiting: Arc<Waiters>,
    next_id: AtomicU32,
    /// Cancelled when the link broke or is dropped: both tasks end.
    over: CancellationToken,
    /// The address it was made to (a next hop whose endpoint changed gets a new link).
    endpoint: SocketAddr,
    last_used: Mutex<Instant>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.over.cancel();
    }
}

impl Conn {
    fn usable(&self, endpoint: SocketAddr, now: Instant) -> bool {
        !self.over.is_cancelled()
            && self.endpoint == endpoint
            && now.saturating_duration_since(*lock(&self.last_used)) < IDLE
    }
}

/// A next hop's place in the table.
#[derive(Default)]
struct Peer {
    /// Its link, made by one request at a time (the others wait for it).
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// It chose HTTP: until then, HTTP.
    http_until: Mutex<Option<Instant>>,
    /// When the last try to make its link failed: requests that waited for that try fail with
    /// it, instead of each trying again in turn.
    connect_failed: Mutex<Option<Instant>>,
}

/// The framed links of a node's client side ([`super::Links::framed`]).
pub(super) struct Framed {
    bind: Option<IpAddr>,
    max_peers: usize,
    peers: Mutex<HashMap<NodeId, Arc<Peer>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Framed {
    /// Links made from `bind` when given, to at most `max_peers` next hops at once.
    pub(super) fn new(bind: Option<IpAddr>, max_peers: usize) -> Self {
        Framed {
            bind,
            max_peers: max_peers.max(1),
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn peer(&self, id: &NodeId) -> Arc<Peer> {
        let mut peers = lock(&self.peers);
        if let Some(p) = peers.get(id) {
            return Arc::clone(p);
        }
        if peers.len() >= self.max_peers {
            peers.clear();
        }
        Arc::clone(peers.entry(*id).or_default())
    }

    /// Posts `frame` to `next_hop` at `endpoint` over its framed link (made with `tls`, the
    /// link's pinned client configuration, when there is none), answered by `deadline`.
    pub(super) async fn post(
        &self,
        next_hop: &NodeId,
        endpoint: SocketAddr,
        tls: impl FnOnce() -> Arc<rustls::ClientConfig>,
        frame: &[u8],
        deadline: Instant,
    ) -> Posted {
        let peer = self.peer(next_hop);
        let arrived = clock::now();
        if lock(&peer.http_until).is_some_and(|until| arrived < until) {
            return Posted::UseHttp;
        }
        let conn = {
            let Ok(mut slot) = tokio::time::timeout_at(deadline, peer.conn.lock()).await else {
                return Posted::Failed("timeout");
            };
            if lock(&peer.connect_failed).is_some_and(|at| at >= arrived) {
                return Posted::Failed("connect");
            }
            let now = clock::now();
            match slot.as_ref().filter(|c| c.usable(endpoint, now)) {
                Some(c) => Arc::clone(c),
                None => {
                    *slot = None;
                    let made = tokio::time::timeout_at(
                        deadline.min(now + super::CONNECT_TIMEOUT),
                        connect(self.bind, endpoint, tls()),
                    )
                    .await;
                    match made {
                        Ok(Ok(Some(c))) => Arc::clone(slot.insert(Arc::new(c))),
                        Ok(Ok(None)) => {
                            *lock(&peer.http_until) = Some(now + HTTP_ONLY_FOR);
                            return Posted::UseHttp;
                        }
                        Ok(Err(_)) | Err(_) => {
                            *lock(&peer.connect_failed) = Some(clock::now());
                            return Posted::Failed("connect");
                        }
                    }
                }
            }
        };
        conn.post(frame, deadline).await
    }
}

impl Conn {
    async fn post(&self, frame: &[u8], deadline: Instant) -> Posted {
        *lock(&self.last_used) = clock::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(id, tx);
        let out = Outgoing {
            id,
            frame: frame.to_vec(),
        };
        let answered = async {
            self.frames.send(out).await.map_err(|_| "request")?;
            // The link may break before the answer (its reader then fails every request
            // waiting, and this one may have joined just after).
            tokio::select! {
                got = rx => got.map_err(|_| "request"),
                () = self.over.cancelled() => Err("request"),
            }
        };
        let got = match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok((status, body))) => return Posted::Answer(status, body),
            Ok(Err(kind)) => Posted::Failed(kind),
            Err(_) => Posted::Failed("timeout"),
        };
        lock(&self.waiting).remove(&id);
        got
    }
}

/// Makes a link to `endpoint` with `tls` (from `bind` when given): `None` when the server
/// chose HTTP.
async fn connect(
    bind: Option<IpAddr>,
    endpoint: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> io::Result<Option<Conn>> {
    let socket = match endpoint {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(ip) = bind.filter(|ip| ip.is_ipv4() == endpoint.is_ipv4()) {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let tcp: TcpStream = socket.connect(endpoint).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::IpAddress(endpoint.ip().into());
    let stream = TlsConnector::from(tls).connect(name, tcp).await?;
    if stream.get_ref().1.alpn_protocol() != Some(ALPN) {
        return Ok(None);
    }
    let (rd, wr) = tokio::io::split(stream);
    let (frames, queued) = mpsc::channel(QUEUED);
    let waiting = Arc::new(Waiters::default());
    let over = CancellationToken::new();
    tokio::spawn(write_frames(wr, queued, over.clone()));
    tokio::spawn(read_answers(rd, Arc::clone(&waiting), over.clone()));
    Ok(Some(Conn {
        frames,
        waiting,
        next_id: AtomicU32::new(0),
        over,
        endpoint,
        last_used: Mutex::new(clock::now()),
    }))
}

/// Writes the frames of `queued`, every one ready in one go, until the link is over.
async fn write_frames(
    mut wr: WriteHalf<TlsStream<TcpStream>>,
    mut queued: mpsc::Receiver<Outgoing>,
    over: CancellationToken,
) {
    // However the task ends (dropped with its runtime too), the link is over.
    let _over = over.clone().drop_guard();
    let mut buf = Vec::new();
    loop {
        let first = tokio::select! {
            f = queued.recv() => f,
            () = over.cancelled() => None,
        };
        let Some(first) = first else { break };
        buf.clear();
        for out in std::iter::once(first).chain(std::iter::from_fn(|| queued.try_recv().ok())) {
            buf.extend_from_slice(&RequestHead::encode(out.id, out.frame.len()));
            buf.extend_from_slice(&out.frame);
        }
        let write = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        let written = tokio::select! {
            w = write => w.is_ok(),
            () = over.cancelled() => false,
        };
        if !written {
            break;
        }
        // A burst of the largest frames leaves no buffer of their size behind.
        if buf.capacity() > KEEP_BUFFER {
            buf = Vec::new();
        }
    }
    over.cancel();
    let _ = wr.shutdown().await;
}

/// Reads answers and hands each to its request until the link breaks or is over; then every
/// request still waiting fails.
async fn read_answers(
    mut rd: ReadHalf<TlsStream<TcpStream>>,
    waiting: Arc<Waiters>,
    over: CancellationToken,
) {
    let _over = over.clone().drop_guard();
    tokio::select! {
        _ = hand_answers(&mut rd, &waiting) => {}
        () = over.cancelled() => {}
    }
    over.cancel();
    lock(&waiting).clear();
}

/// Reads answers from `rd` and hands each to the request `waiting` for it, until an error.
async fn hand_answers(
    rd: &mut ReadHalf<TlsStream<TcpStream>>,
    waiting: &Waiters,
) -> io::Result<()> {
    let mut head = [0u8; ANSWER_HEAD];
    loop {
        rd.read_exact(&mut head).await?;
        let head =
            AnswerHead::decode(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut body = vec![0u8; head.len];
        rd.read_exact(&mut body).await?;
        // An answer no request waits for (given up at its deadline) is dropped.
        if let Some(tx) = lock(waiting).remove(&head.id) {
            let _ = tx.send((head.status, body));
        }
    }
}

/// The endpoint of a relay URL (`{endpoint}/v2/relay`), if it is one a framed link can reach.
pub(crate) fn endpoint_of(url: &str) -> Option<SocketAddr> {
    crate::proto::parse_endpoint(url.strip_suffix("/v2/relay")?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_urls_name_their_endpoint() {
        assert_eq!(
            endpoint_of("https://127.0.0.9:7001/v2/relay"),
            Some("127.0.0.9:7001".parse().unwrap())
        );
        assert_eq!(
            endpoint_of("https://[::1]:7001/v2/relay"),
            Some("[::1]:7001".parse().unwrap())
        );
        assert_eq!(endpoint_of("https://127.0.0.9:7001/v1/relay"), None);
        assert_eq!(endpoint_of("http://127.0.0.9:7001/v2/relay"), None);
    }
}
