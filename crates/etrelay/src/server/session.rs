//! A session: one client address, its upstream socket, its bounded queue towards the game
//! server, its counters and the time of its last packet.
//!
//! The relay loop owns the decision to open a session and queues the client's packets
//! ([`Session::push`]: a copy into a spare buffer, no allocation once warm); at the end of each
//! batch it read from the public socket it sends what the sessions got: through the io_uring
//! ring, all sessions' packets in one system call ([`Session::take_queued`] hands them over in
//! order, [`Session::requeue`] puts back the ones a full socket refused), or with one
//! `sendmmsg` per session ([`Session::send_queued`]). Only when the upstream socket's buffer
//! is full does the session's task ([`super::forward`]) take over, until the buffer has room
//! again: a blocked session gives the ring nothing ([`Session::is_blocked`]). Packets leave in
//! the order they came, except that a datagram a full socket refused in a ring's batch can
//! follow one of the same batch the socket took an instant later.
//!
//! Queued bytes are charged to the process-wide [`Budget`]; the queue keeps at most
//! [`KEEP_SPARE`] small spare buffers, so an idle session holds at most 12 KiB.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use guard::counters::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use super::handshake::{Handshake, Translator};
use crate::clock::wall_now;
use crate::net::{BATCH, ReadSocket};

/// Queue buffers larger than this are not kept for reuse (bounds a session's idle memory:
/// in-game packets stay under the engines' 1400-byte fragment size).
const KEEP_BUF: usize = 1500;
/// Spare buffers a session keeps for reuse: a burst of a client's packets in one batch needs
/// no allocation (at most 8 × [`KEEP_BUF`] = 12 KiB per session).
const KEEP_SPARE: usize = 8;
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
    /// Connected to the game server; `None` only in unit tests (every packet is queued).
    upstream: Option<ReadSocket>,
    /// Packets waiting for the game server: until the end of the relay loop's batch, or until
    /// its socket's buffer has room again.
    queue: Mutex<Queue>,
    /// Most packets `queue` holds.
    queue_limit: usize,
    /// Where queued bytes are charged.
    budget: Budget,
    /// Wakes the task when the queue gets a packet.
    wake: Notify,
    /// Ends the session (server stop, ban, recycling).
    cancel: CancellationToken,
    /// The challenge exchange under way (`super::handshake`).
    handshake: Mutex<Handshake>,
    /// The challenge translation in force, read by every in-game packet.
    pub(super) translator: Translator,
}

#[derive(Debug, Default)]
struct Queue {
    packets: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// The socket's buffer was full at the last send: the task sends what is queued.
    blocked: bool,
}

/// Why a packet was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The session's queue holds its limit.
    QueueFull,
    /// The process's queued-bytes budget is spent.
    OverBudget,
    /// An in-game packet that does not hold the client's challenge (a forged one).
    Forged,
}

/// What [`Session::send_queued`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flushed {
    /// Packets and bytes sent.
    pub(super) packets: u64,
    /// See [`Flushed::packets`].
    pub(super) bytes: u64,
    /// Packets dropped on a socket error.
    pub(super) errors: u64,
    /// The socket's buffer was full: packets are still queued.
    pub(super) blocked: bool,
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
            opened: wall_now(),
            last_active_ms: AtomicU64::new(now_ms),
            last_client_ms: AtomicU64::new(now_ms),
            phase: AtomicU8::new(Phase::HalfOpen as u8),
            qport: AtomicU32::new(NO_QPORT),
            packets_up: Counter::default(),
            bytes_up: Counter::default(),
            packets_down: Counter::default(),
            bytes_down: Counter::default(),
            upstream: None,
            queue: Mutex::new(Queue::default()),
            queue_limit,
            budget,
            wake: Notify::new(),
            cancel,
            handshake: Mutex::new(Handshake::default()),
            translator: Translator::default(),
        }
    }

    /// The challenge exchange, locked.
    pub(super) fn handshake(&self) -> MutexGuard<'_, Handshake> {
        self.handshake.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session with its socket connected to the game server.
    pub(super) fn with_upstream(mut self, socket: ReadSocket) -> Self {
        self.upstream = Some(socket);
        self
    }

    /// The socket connected to the game server.
    pub(super) fn upstream(&self) -> Option<&ReadSocket> {
        self.upstream.as_ref()
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

    /// Queues a client packet for the game server at `now_ms`; the relay loop sends it at the
    /// end of its batch ([`Session::send_queued`]).
    ///
    /// # Errors
    /// [`Refused`] when the queue holds its limit or the process's byte budget is spent.
    pub(super) fn push(&self, data: &[u8], now_ms: u64) -> Result<(), Refused> {
        self.enqueue(&mut self.lock_queue(), data)?;
        self.touch(now_ms);
        self.last_client_ms.fetch_max(now_ms, Ordering::Relaxed);
        Ok(())
    }

    /// Queues a client's in-game packet, rewritten for the server's challenge when a
    /// translation is in force (`super::handshake`), at `now_ms`.
    ///
    /// # Errors
    /// As [`Session::push`], and [`Refused::Forged`] for a packet that does not hold the
    /// client's challenge (nothing queued).
    pub(super) fn push_game(&self, data: &[u8], now_ms: u64) -> Result<(), Refused> {
        let mut q = self.lock_queue();
        self.enqueue(&mut q, data)?;
        let buf = q
            .packets
            .back_mut()
            .expect("invariant: enqueue just pushed it");
        if self.translator.to_server(buf).is_err() {
            let buf = q.packets.pop_back().expect("invariant: just pushed");
            self.recycle(&mut q, buf);
            return Err(Refused::Forged);
        }
        drop(q);
        self.touch(now_ms);
        self.last_client_ms.fetch_max(now_ms, Ordering::Relaxed);
        Ok(())
    }

    /// Wakes the task to send what is queued (the socket's buffer was full).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Copies `data` into the queue, in a spare buffer when there is one.
    fn enqueue(&self, q: &mut Queue, data: &[u8]) -> Result<(), Refused> {
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
        Ok(())
    }

    /// Sends the queued packets with `send` (one non-blocking `sendmmsg` of up to
    /// [`crate::net::BATCH`] datagrams on the upstream socket, returning how many went out), in
    /// order, until the queue is empty or the socket's buffer is full (`WouldBlock`). A
    /// datagram the socket refuses with another error is dropped and counted.
    pub(super) fn send_queued(
        &self,
        mut send: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> Flushed {
        let mut done = Flushed::default();
        let mut q = self.lock_queue();
        while !q.packets.is_empty() {
            let sent = {
                let mut slices = [IoSlice::new(&[]); BATCH];
                let mut n = 0;
                for (slot, pkt) in slices.iter_mut().zip(&q.packets) {
                    *slot = IoSlice::new(pkt);
                    n += 1;
                }
                send(&slices[..n])
            };
            let (gone, ok) = match sent {
                Ok(0) => break,
                Ok(n) => (n, true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    done.blocked = true;
                    break;
                }
                Err(_) => (1, false),
            };
            for _ in 0..gone {
                let buf = q
                    .packets
                    .pop_front()
                    .expect("invariant: sent from the queue");
                if ok {
                    done.packets += 1;
                    done.bytes += buf.len() as u64;
                } else {
                    done.errors += 1;
                }
                self.recycle(&mut q, buf);
            }
        }
        q.blocked = done.blocked;
        done
    }

    /// True while the socket's buffer was full at the last send and packets wait for room.
    pub(super) fn is_blocked(&self) -> bool {
        self.lock_queue().blocked
    }

    /// Gives a sent packet's buffer back to the budget, and keeps it for the next packet if
    /// it is small and few are kept.
    fn recycle(&self, q: &mut Queue, buf: Vec<u8>) {
        self.budget.release(buf.capacity());
        if buf.capacity() <= KEEP_BUF && q.spare.len() < KEEP_SPARE {
            q.spare.push(buf);
        }
    }

    /// Takes queued packets from the front, in order, while `stage` accepts them (it copies
    /// each: into [`crate::net::ring::SendRing`]'s buffers), giving their buffers back; how
    /// many it took.
    pub(super) fn take_queued(&self, mut stage: impl FnMut(&[u8]) -> bool) -> usize {
        let mut q = self.lock_queue();
        let mut taken = 0;
        if q.blocked {
            // Its socket was full: the task sends it, in order, as the buffer drains.
            return taken;
        }
        while let Some(pkt) = q.packets.front() {
            if !stage(pkt) {
                break;
            }
            let buf = q
                .packets
                .pop_front()
                .expect("invariant: the front was just read");
            self.recycle(&mut q, buf);
            taken += 1;
        }
        taken
    }

    /// Puts `data` back in the queue at `at` (0: the front), for the task to send once the
    /// socket's buffer has room: a datagram [`Session::take_queued`] took and the socket
    /// refused as full. Refused like a new packet when the queue or the budget is full.
    pub(super) fn requeue(&self, at: usize, data: &[u8]) -> Result<(), Refused> {
        let mut q = self.lock_queue();
        q.blocked = true;
        self.enqueue(&mut q, data)?;
        let buf = q
            .packets
            .pop_back()
            .expect("invariant: enqueue just pushed it");
        let at = at.min(q.packets.len());
        q.packets.insert(at, buf);
        Ok(())
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
            last_seen: wall_now() - idle,
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

    /// Sends what is queued into `out`, at most `room` packets before the socket is "full".
    fn send(s: &Session, out: &mut Vec<Vec<u8>>, room: usize) -> Flushed {
        s.send_queued(|batch| {
            let n = batch.len().min(room - out.len().min(room));
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            out.extend(batch[..n].iter().map(|d| d.to_vec()));
            Ok(n)
        })
    }

    #[test]
    fn taken_packets_put_back_keep_their_place_and_their_budget() {
        let s = session(4);
        for p in [&b"a"[..], b"b", b"c"] {
            s.push(p, 20).unwrap();
        }
        let held = s.budget.queued_bytes();
        // The ring takes two, then finds both sockets full.
        let mut taken = Vec::new();
        let n = s.take_queued(|p| {
            if taken.len() == 2 {
                return false;
            }
            taken.push(p.to_vec());
            true
        });
        assert_eq!(n, 2);
        assert!(
            s.budget.queued_bytes() < held,
            "a taken packet's bytes are given back"
        );
        s.requeue(0, &taken[0]).unwrap();
        s.requeue(1, &taken[1]).unwrap();
        assert_eq!(s.budget.queued_bytes(), held);
        // Blocked: the ring takes nothing more until the task's send drains the queue.
        assert!(s.is_blocked());
        assert_eq!(s.take_queued(|_| true), 0);
        let mut out = Vec::new();
        send(&s, &mut out, 10);
        assert_eq!(out, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert!(!s.is_blocked());
        // Put back into a full queue: refused, like a new packet.
        for p in [&b"d"[..], b"e", b"f", b"g"] {
            s.push(p, 30).unwrap();
        }
        assert_eq!(s.requeue(0, b"x"), Err(Refused::QueueFull));
    }

    #[test]
    fn the_queue_is_bounded_and_keeps_the_order() {
        let s = session(2);
        s.push(b"one", 20).unwrap();
        s.push(b"two", 30).unwrap();
        assert_eq!(s.push(b"three", 40), Err(Refused::QueueFull));
        assert_eq!(s.last_active_ms(), 30, "a refused packet is no activity");
        let mut out = Vec::new();
        let f = send(&s, &mut out, 1);
        assert_eq!((f.packets, f.bytes, f.blocked), (1, 3, true));
        assert_eq!(out, [b"one".to_vec()]);
        s.push(b"four", 50).unwrap();
        let f = send(&s, &mut out, 10);
        assert_eq!((f.packets, f.blocked), (2, false));
        assert_eq!(out, [b"one".to_vec(), b"two".to_vec(), b"four".to_vec()]);
        assert_eq!(send(&s, &mut out, 10), Flushed::default());
    }

    #[test]
    fn a_send_error_drops_one_packet_and_goes_on() {
        let s = session(4);
        s.push(b"one", 1).unwrap();
        s.push(b"two", 2).unwrap();
        let mut first = true;
        let f = s.send_queued(|batch| {
            if std::mem::take(&mut first) {
                Err(io::ErrorKind::ConnectionRefused.into())
            } else {
                Ok(batch.len())
            }
        });
        assert_eq!((f.packets, f.bytes, f.errors, f.blocked), (1, 3, 1, false));
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
        let f = s.send_queued(|batch| Ok(batch.len()));
        assert_eq!(f.packets, 1);
        assert_eq!(budget.queued_bytes(), 0);
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
