//! A session: one client address, its bounded queue towards the game server, its counters and
//! the time of its last packet. No I/O here: the session's task ([`super::forward`]) owns its
//! upstream socket.
//!
//! The relay loop owns the decision to open a session and pushes the client's packets into its
//! queue ([`Session::push`]); the task pops them ([`Session::pop`]). A session ends after
//! `timeout` without a packet either way, when its server stops, or at once when it is cut (a
//! ban).
//!
//! The queue recycles its buffers, so relaying does not allocate once a session is warm.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use guard::counters::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Queue buffers larger than this are not kept for reuse (bounds a session's idle memory:
/// in-game packets stay under the engines' 1400-byte fragment size).
const KEEP_BUF: usize = 1500;
/// Spare buffers a session keeps: one receive batch of the relay loop.
const KEEP_SPARE: usize = crate::net::BATCH;

/// One client's session.
#[derive(Debug)]
pub(super) struct Session {
    /// Unique among the server's sessions, so a late cleanup never removes a successor.
    pub(super) id: u64,
    /// The client's address on the public side.
    pub(super) client: SocketAddr,
    /// The upstream socket's local address: how the game server sees this client.
    pub(super) upstream_local: SocketAddr,
    /// When the session opened (wall clock, for the control API).
    opened: SystemTime,
    /// Milliseconds after the server's epoch of the last packet either way.
    last_active_ms: AtomicU64,
    /// Packets and bytes client → server.
    pub(super) packets_up: Counter,
    /// See [`Session::packets_up`].
    pub(super) bytes_up: Counter,
    /// Packets and bytes server → client.
    pub(super) packets_down: Counter,
    /// See [`Session::packets_down`].
    pub(super) bytes_down: Counter,
    /// Packets waiting for the game server.
    queue: Mutex<Queue>,
    /// Most packets `queue` holds.
    queue_limit: usize,
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
pub(super) struct QueueFull;

/// Information on one open session, for the control API and tests.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The real client address.
    pub client: SocketAddr,
    /// The address the game server sees this client as.
    pub upstream_local: SocketAddr,
    /// When it opened.
    pub opened: SystemTime,
    /// When the last packet passed, either way.
    pub last_seen: SystemTime,
    /// Client → server packets.
    pub packets_up: u64,
    /// Client → server bytes.
    pub bytes_up: u64,
    /// Server → client packets.
    pub packets_down: u64,
    /// Server → client bytes.
    pub bytes_down: u64,
}

impl Session {
    /// A session `id` of `client`, seen by the game server as `upstream_local`, opened at
    /// `now_ms`, holding at most `queue_limit` packets, ended by `cancel`.
    pub(super) fn new(
        id: u64,
        client: SocketAddr,
        upstream_local: SocketAddr,
        now_ms: u64,
        queue_limit: usize,
        cancel: CancellationToken,
    ) -> Self {
        Session {
            id,
            client,
            upstream_local,
            opened: SystemTime::now(),
            last_active_ms: AtomicU64::new(now_ms),
            packets_up: Counter::default(),
            bytes_up: Counter::default(),
            packets_down: Counter::default(),
            bytes_down: Counter::default(),
            queue: Mutex::new(Queue::default()),
            queue_limit,
            wake: Notify::new(),
            cancel,
        }
    }

    /// Queues a client packet for the game server at `now_ms` and wakes the task.
    ///
    /// # Errors
    /// [`QueueFull`] when the queue holds its limit already.
    pub(super) fn push(&self, data: &[u8], now_ms: u64) -> Result<(), QueueFull> {
        {
            let mut q = self.lock_queue();
            if q.packets.len() >= self.queue_limit {
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

    /// The oldest queued packet; give its buffer back with [`Session::recycle`].
    pub(super) fn pop(&self) -> Option<Vec<u8>> {
        self.lock_queue().packets.pop_front()
    }

    /// Keeps a sent packet's buffer for a later [`Session::push`] (within bounds).
    pub(super) fn recycle(&self, buf: Vec<u8>) {
        if buf.capacity() <= KEEP_BUF {
            let mut q = self.lock_queue();
            if q.spare.len() < KEEP_SPARE {
                q.spare.push(buf);
            }
        }
    }

    /// Resolves when a packet was queued since the last call.
    pub(super) async fn queued(&self) {
        self.wake.notified().await;
    }

    /// Records activity at `now_ms`.
    #[inline]
    pub(super) fn touch(&self, now_ms: u64) {
        self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// Milliseconds after the server's epoch of the last packet either way.
    pub(super) fn last_active_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// True once the session has ended or is ending.
    pub(super) fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves once the session ends (server stop, ban).
    pub(super) async fn closed(&self) {
        self.cancel.cancelled().await;
    }

    /// Ends the session now (its task removes it from the table).
    pub(super) fn cut(&self) {
        self.cancel.cancel();
    }

    /// The session as the control API shows it, at `now_ms` (and now on the wall clock).
    pub(super) fn info(&self, now_ms: u64) -> SessionInfo {
        let idle = Duration::from_millis(now_ms.saturating_sub(self.last_active_ms()));
        SessionInfo {
            client: self.client,
            upstream_local: self.upstream_local,
            opened: self.opened,
            last_seen: SystemTime::now() - idle,
            packets_up: self.packets_up.get(),
            bytes_up: self.bytes_up.get(),
            packets_down: self.packets_down.get(),
            bytes_down: self.bytes_down.get(),
        }
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(limit: usize) -> Session {
        let a = SocketAddr::from(([192, 0, 2, 1], 1));
        Session::new(1, a, a, 10, limit, CancellationToken::new())
    }

    #[test]
    fn the_queue_is_bounded_and_keeps_the_order() {
        let s = session(2);
        s.push(b"one", 20).unwrap();
        s.push(b"two", 30).unwrap();
        assert!(s.push(b"three", 40).is_err());
        assert_eq!(s.last_active_ms(), 30, "a refused packet is no activity");
        let one = s.pop().unwrap();
        assert_eq!(one, b"one");
        s.recycle(one);
        s.push(b"four", 50).unwrap();
        assert_eq!(s.pop().unwrap(), b"two");
        assert_eq!(s.pop().unwrap(), b"four");
        assert!(s.pop().is_none());
    }

    #[test]
    fn activity_only_moves_forward_and_a_cut_closes() {
        let s = session(1);
        s.touch(100);
        s.touch(50);
        assert_eq!(s.last_active_ms(), 100);
        assert_eq!(s.info(1_100).packets_up, 0);
        assert!(!s.is_closed());
        s.cut();
        assert!(s.is_closed());
    }
}
