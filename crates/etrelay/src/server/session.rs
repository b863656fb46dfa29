//! Sessions: one per client address, each with its own upstream socket.
//!
//! The relay loop owns the decision to open a session and pushes the client's packets into its
//! bounded queue ([`Session::push`]); the session's task sends them to the game server and sends
//! the server's answers back to the client **through the public socket**, so they come from the
//! public port. A session ends after `timeout` without a packet either way, when its server
//! stops, or at once when it is cut (a ban). It then removes itself from the table and gives its
//! slot of `MAX_SESSIONS` back.
//!
//! The queue recycles its buffers, so relaying does not allocate once a session is warm.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use guard::admission::Permit;
use guard::counters::Counter;
use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace};

use super::Shared;
use crate::clock::Instant;
use crate::et;

/// Queue buffers larger than this are not kept for reuse (bounds a session's idle memory:
/// in-game packets stay under the engines' 1400-byte fragment size).
const KEEP_BUF: usize = 1500;
/// Spare buffers a session keeps: one receive batch of the relay loop.
const KEEP_SPARE: usize = crate::net::BATCH;

/// One client's session.
#[derive(Debug)]
pub struct Session {
    /// Unique among the server's sessions, so a late cleanup never removes a successor.
    pub id: u64,
    /// The client's address on the public side.
    pub client: SocketAddr,
    /// The upstream socket's local address: how the game server sees this client.
    pub upstream_local: SocketAddr,
    /// When the session opened (wall clock, for the control API).
    pub opened: SystemTime,
    /// Milliseconds after the server's epoch of the last packet either way.
    last_active_ms: AtomicU64,
    /// Packets and bytes client → server.
    pub packets_up: Counter,
    /// See [`Session::packets_up`].
    pub bytes_up: Counter,
    /// Packets and bytes server → client.
    pub packets_down: Counter,
    /// See [`Session::packets_down`].
    pub bytes_down: Counter,
    /// Packets waiting for the game server.
    queue: Mutex<Queue>,
    /// Wakes the task when the queue gets a packet.
    wake: Notify,
    /// Ends the session (server stop, ban).
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct Queue {
    packets: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

/// The queue is full; the packet was not taken.
#[derive(Debug)]
pub struct QueueFull;

impl Session {
    /// Queues a client packet for the game server and wakes the task.
    ///
    /// # Errors
    /// [`QueueFull`] when `limit` packets are already waiting.
    pub fn push(&self, data: &[u8], limit: usize, now_ms: u64) -> Result<(), QueueFull> {
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.packets.len() >= limit {
                return Err(QueueFull);
            }
            let mut buf = q.spare.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(data);
            q.packets.push_back(buf);
        }
        self.touch(now_ms);
        self.wake.notify_one();
        Ok(())
    }

    /// Records activity at `now_ms`.
    #[inline]
    pub fn touch(&self, now_ms: u64) {
        self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// Milliseconds after the server's epoch of the last packet either way.
    pub fn last_active_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// True once the session has ended or is ending.
    pub fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Ends the session now (its task removes it from the table).
    pub fn cut(&self) {
        self.cancel.cancel();
    }

    fn pop(&self) -> Option<Vec<u8>> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .packets
            .pop_front()
    }

    fn recycle(&self, buf: Vec<u8>) {
        if buf.capacity() <= KEEP_BUF {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.spare.len() < KEEP_SPARE {
                q.spare.push(buf);
            }
        }
    }
}

/// Opens the upstream socket of a new session for `client` and starts its task.
///
/// Nothing here waits: a UDP bind and connect return at once, so the relay loop is never held.
///
/// # Errors
/// The socket could not be created, bound or connected.
pub(super) fn open(
    shared: &Arc<Shared>,
    client: SocketAddr,
    id: u64,
    now_ms: u64,
    permit: Permit,
) -> io::Result<Arc<Session>> {
    let upstream = shared.config.upstream;
    let socket = crate::net::upstream_socket(upstream)?;
    let session = Arc::new(Session {
        id,
        client,
        upstream_local: socket.local_addr()?,
        opened: SystemTime::now(),
        last_active_ms: AtomicU64::new(now_ms),
        packets_up: Counter::default(),
        bytes_up: Counter::default(),
        packets_down: Counter::default(),
        bytes_down: Counter::default(),
        queue: Mutex::new(Queue::default()),
        wake: Notify::new(),
        cancel: shared.cancel.child_token(),
    });
    let task = run(Arc::clone(shared), Arc::clone(&session), socket, permit);
    shared.tracker.spawn(task);
    Ok(session)
}

/// The session's task: queue → game server, game server → client, idle timeout.
async fn run(shared: Arc<Shared>, session: Arc<Session>, upstream: UdpSocket, permit: Permit) {
    let timeout = shared.config.session.timeout;
    let mut buf = vec![0u8; shared.config.session.max_packet.max(1)];
    let idle = tokio::time::sleep(timeout);
    tokio::pin!(idle);
    loop {
        // A socket that is always ready never makes a task yield by itself: take part in
        // tokio's cooperative budget so one busy session cannot starve the others.
        tokio::task::coop::consume_budget().await;
        tokio::select! {
            biased;
            () = session.cancel.cancelled() => break,
            () = session.wake.notified() => flush(&shared, &session, &upstream).await,
            r = upstream.recv(&mut buf) => match r {
                Ok(n) => reply(&shared, &session, &buf[..n]).await,
                // ICMP "port unreachable" from a game server that is down, surfacing on the
                // connected socket: nothing to relay, nothing to stop.
                Err(e) => trace!(error = %e, "upstream receive"),
            },
            () = &mut idle => {
                let last = session.last_active_ms();
                let deadline = shared.epoch + Duration::from_millis(last) + timeout;
                if deadline <= Instant::now() {
                    break;
                }
                idle.as_mut().reset(deadline);
            }
        }
    }
    session.cancel.cancel();
    let open = shared.remove_session(&session);
    drop(permit);
    debug!("session - {} ({open} active)", session.client);
}

/// Sends every queued packet to the game server.
async fn flush(shared: &Shared, session: &Session, upstream: &UdpSocket) {
    while let Some(pkt) = session.pop() {
        match upstream.send(&pkt).await {
            Ok(n) => {
                shared.metrics.upstream_packets.inc();
                shared.metrics.upstream_bytes.add(n as u64);
                session.packets_up.inc();
                session.bytes_up.add(n as u64);
            }
            Err(e) => {
                shared.metrics.drop(super::Drop::Upstream);
                trace!(error = %e, "upstream send");
            }
        }
        session.recycle(pkt);
    }
}

/// Sends one answer of the game server back to the client from the public socket.
async fn reply(shared: &Shared, session: &Session, data: &[u8]) {
    session.touch(shared.now_ms());
    shared.metrics.server_packets.inc();
    shared.metrics.server_bytes.add(data.len() as u64);
    session.packets_down.inc();
    session.bytes_down.add(data.len() as u64);
    if et::is_oob(data) {
        debug!(
            "{} <- ET {} ({} B)",
            session.client,
            et::command_word(data),
            data.len()
        );
    }
    shared.send_to_client(data, session.client).await;
}
