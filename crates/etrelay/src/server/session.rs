//! A session: one client address, its bounded queue towards the game server, its counters and
//! the time of its last packet. No I/O here: the session's task ([`super::forward`]) owns its
//! upstream socket.
//!
//! The relay loop owns the decision to open a session and pushes the client's packets into its
//! queue ([`Session::push`]); the task pops them ([`Session::pop`]). A session is **half-open**
//! until the game server shows the client is real (a `connectResponse`, or in-game traffic to
//! it), then **established** ([`Phase`]). It ends after its idle timeout (short while
//! half-open) without a packet either way, when its server stops, when it is cut (a ban), or
//! when a newcomer recycles it (half-open only).
//!
//! Queued bytes are charged to the process-wide [`Budget`]; the queue keeps at most
//! [`KEEP_SPARE`] small spare buffers, so an idle session holds almost nothing.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use guard::counters::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;

/// Queue buffers larger than this are not kept for reuse (bounds a session's idle memory:
/// in-game packets stay under the engines' 1400-byte fragment size).
const KEEP_BUF: usize = 1500;
/// Spare buffers a session keeps for reuse.
const KEEP_SPARE: usize = 2;
/// No qport pinned yet.
const NO_QPORT: u32 = u32::MAX;

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Opened; the game server has sent it nothing yet.
    HalfOpen,
    /// The game server answered (a `challengeResponse`, say) but has not shown a real client.
    Answered,
    /// The game server sent a `connectResponse` or in-game packets: a real client.
    Established,
}

/// One client's session.
#[derive(Debug)]
pub(super) struct Session {
    /// Unique among the server's sessions, so a late cleanup never removes a successor.
    pub(super) id: u64,
    /// The client's address on the public side (moves when its NAT rebinds).
    client: Mutex<SocketAddr>,
    /// The upstream socket's local address: how the game server sees this client.
    pub(super) upstream_local: SocketAddr,
    /// When the session opened (wall clock, for the control API).
    opened: SystemTime,
    /// Milliseconds after the server's epoch of the last packet either way.
    last_active_ms: AtomicU64,
    /// Milliseconds after the server's epoch of the client's last packet.
    last_client_ms: AtomicU64,
    /// [`Phase`] as a number; changed under the server's state lock.
    phase: AtomicU8,
    /// The qport of its in-game packets once pinned, else `NO_QPORT`.
    qport: AtomicU32,
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
    /// Where queued bytes are charged.
    budget: Budget,
    /// Wakes the task when the queue gets a packet.
    wake: Notify,
    /// Ends the session (server stop, ban, recycling).
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct Queue {
    packets: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

/// Why a packet was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The session's queue holds its limit.
    QueueFull,
    /// The process's queued-bytes budget is spent.
    OverBudget,
}

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
    /// True once the game server has shown a real client behind it.
    pub established: bool,
}

impl Session {
    /// A half-open session `id` of `client`, seen by the game server as `upstream_local`,
    /// opened at `now_ms`, holding at most `queue_limit` packets charged to `budget`, ended by
    /// `cancel`.
    pub(super) fn new(
        id: u64,
        client: SocketAddr,
        upstream_local: SocketAddr,
        now_ms: u64,
        queue_limit: usize,
        budget: Budget,
        cancel: CancellationToken,
    ) -> Self {
        Session {
            id,
            client: Mutex::new(client),
            upstream_local,
            opened: SystemTime::now(),
            last_active_ms: AtomicU64::new(now_ms),
            last_client_ms: AtomicU64::new(now_ms),
            phase: AtomicU8::new(Phase::HalfOpen as u8),
            qport: AtomicU32::new(NO_QPORT),
            packets_up: Counter::default(),
            bytes_up: Counter::default(),
            packets_down: Counter::default(),
            bytes_down: Counter::default(),
            queue: Mutex::new(Queue::default()),
            queue_limit,
            budget,
            wake: Notify::new(),
            cancel,
        }
    }

    /// The client's address now.
    pub(super) fn client(&self) -> SocketAddr {
        *self.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the session to a new client address (a NAT that rebound); under the state lock.
    pub(super) fn set_client(&self, to: SocketAddr) {
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }

    /// Where the session stands.
    pub(super) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::HalfOpen,
            1 => Phase::Answered,
            _ => Phase::Established,
        }
    }

    /// Sets the phase; under the state lock (the table counts by phase).
    pub(super) fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    /// The pinned qport.
    pub(super) fn qport(&self) -> Option<u16> {
        u16::try_from(self.qport.load(Ordering::Acquire)).ok()
    }

    /// Pins the qport; under the state lock.
    pub(super) fn pin_qport(&self, q: Option<u16>) {
        self.qport
            .store(q.map_or(NO_QPORT, u32::from), Ordering::Release);
    }

    /// Queues a client packet for the game server at `now_ms` and wakes the task.
    ///
    /// # Errors
    /// [`Refused`] when the queue holds its limit or the process's byte budget is spent.
    pub(super) fn push(&self, data: &[u8], now_ms: u64) -> Result<(), Refused> {
        {
            let mut q = self.lock_queue();
            if q.packets.len() >= self.queue_limit {
                return Err(Refused::QueueFull);
            }
            let mut buf = match q.spare.pop() {
                Some(b) if b.capacity() >= data.len() => b,
                _ => Vec::with_capacity(data.len()),
            };
            if self.budget.reserve(buf.capacity()).is_err() {
                q.spare.push(buf);
                return Err(Refused::OverBudget);
            }
            buf.clear();
            buf.extend_from_slice(data);
            q.packets.push_back(buf);
        }
        self.touch(now_ms);
        self.last_client_ms.fetch_max(now_ms, Ordering::Relaxed);
        self.wake.notify_one();
        Ok(())
    }

    /// The oldest queued packet; give its buffer back with [`Session::recycle`].
    pub(super) fn pop(&self) -> Option<Vec<u8>> {
        let buf = self.lock_queue().packets.pop_front()?;
        self.budget.release(buf.capacity());
        Some(buf)
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

    /// Milliseconds after the server's epoch of the client's last packet.
    pub(super) fn last_client_ms(&self) -> u64 {
        self.last_client_ms.load(Ordering::Relaxed)
    }

    /// True once the session has ended or is ending.
    pub(super) fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves once the session ends (server stop, ban, recycling).
    pub(super) async fn closed(&self) {
        self.cancel.cancelled().await;
    }

    /// Ends the session now (its task removes it from the table if still there).
    pub(super) fn cut(&self) {
        self.cancel.cancel();
    }

    /// The session as the control API shows it, at `now_ms` (and now on the wall clock).
    pub(super) fn info(&self, now_ms: u64) -> SessionInfo {
        let idle = Duration::from_millis(now_ms.saturating_sub(self.last_active_ms()));
        SessionInfo {
            client: self.client(),
            upstream_local: self.upstream_local,
            opened: self.opened,
            last_seen: SystemTime::now() - idle,
            packets_up: self.packets_up.get(),
            bytes_up: self.bytes_up.get(),
            packets_down: self.packets_down.get(),
            bytes_down: self.bytes_down.get(),
            established: self.phase() == Phase::Established,
        }
    }

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Session {
    /// Bytes still queued go back to the budget.
    fn drop(&mut self) {
        let q = self.queue.get_mut().unwrap_or_else(|p| p.into_inner());
        let held: usize = q.packets.iter().map(Vec::capacity).sum();
        self.budget.release(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(limit: usize) -> Session {
        let a = SocketAddr::from(([192, 0, 2, 1], 1));
        Session::new(
            1,
            a,
            a,
            10,
            limit,
            Budget::new(1, 1 << 20),
            CancellationToken::new(),
        )
    }

    #[test]
    fn the_queue_is_bounded_and_keeps_the_order() {
        let s = session(2);
        s.push(b"one", 20).unwrap();
        s.push(b"two", 30).unwrap();
        assert_eq!(s.push(b"three", 40), Err(Refused::QueueFull));
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

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn queued_bytes_are_charged_and_given_back() {
        let a = SocketAddr::from(([192, 0, 2, 1], 1));
        let budget = Budget::new(1, 100);
        let s = Session::new(1, a, a, 0, 8, budget.clone(), CancellationToken::new());
        s.push(&[0; 60], 1).unwrap();
        assert_eq!(s.push(&[0; 60], 2), Err(Refused::OverBudget));
        assert!(budget.queued_bytes() >= 60);
        let p = s.pop().unwrap();
        assert_eq!(budget.queued_bytes(), 0);
        s.recycle(p);
        s.push(&[0; 10], 3).unwrap();
        drop(s);
        assert_eq!(
            budget.queued_bytes(),
            0,
            "a session gone gives its bytes back"
        );
    }

    #[test]
    fn phase_and_qport() {
        let a = SocketAddr::from(([192, 0, 2, 1], 1));
        let s = Session::new(1, a, a, 0, 8, Budget::new(1, 100), CancellationToken::new());
        assert_eq!(s.phase(), Phase::HalfOpen);
        assert_eq!(s.qport(), None);
        s.pin_qport(Some(0));
        assert_eq!(s.qport(), Some(0));
        s.set_phase(Phase::Established);
        assert!(s.info(0).established);
    }
}
