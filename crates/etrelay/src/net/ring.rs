//! Datagrams to many connected sockets in one system call, through `io_uring`: the relay loop's
//! sends to the game server.
//!
//! Each session has its own socket to the game server (how the server tells clients apart),
//! so with many clients a batch of datagrams goes out on many sockets, and `sendmmsg` batches
//! only on one. One `send` per datagram costs a system call each, and on a host where the game
//! server shares the relay's CPU, each return from one lets the server, just woken by that
//! datagram, preempt the relay: two context switches per datagram. A [`SendRing`] stages a
//! batch's datagrams (copied into its own buffers) and sends them all with one
//! `io_uring_enter`, then returns each one's result.
//!
//! This is the crate's only `unsafe` code: handing the kernel a pointer into the ring's buffers
//! is unsafe because the kernel reads them after the call that staged them. It is sound
//! because the buffers belong to the ring, a slot is written only while no send of it is
//! pending, and [`SendRing::submit`] returns only once every staged send has completed (each
//! is `MSG_DONTWAIT`: it completes at once, with `EAGAIN` when the socket's buffer is full,
//! rather than waiting for room). A ring that failed in a way that may leave sends pending is
//! never used again ([`SendRing::broken`]), and its buffers are leaked rather than freed.
#![allow(unsafe_code)]

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd};

use io_uring::{IoUring, opcode, types};
use rustix::net::SendFlags;

/// Interrupted or refused-for-now `io_uring_enter` calls of one submit before the ring is given
/// up.
const MAX_RETRIES: u32 = 64;

/// A ring of staged sends: what was staged since the last [`SendRing::submit`].
pub struct SendRing {
    ring: IoUring,
    /// `slots` buffers of `slot_len` bytes, one per staged datagram. Never freed while a send
    /// may be pending (see [`Drop`]).
    buffers: ManuallyDrop<Box<[u8]>>,
    slot_len: usize,
    /// Datagrams staged, not yet submitted.
    staged: usize,
    /// The caller's tag of each staged datagram.
    tags: Box<[u32]>,
    /// Each staged datagram's length.
    lens: Box<[u32]>,
    /// Each staged datagram's outcome, once submitted: bytes sent or `-errno`.
    results: Box<[i32]>,
    /// Sends may be pending in the kernel: the ring is not used again.
    broken: bool,
}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("slots", &self.tags.len())
            .field("slot_len", &self.slot_len)
            .field("staged", &self.staged)
            .field("broken", &self.broken)
            .finish()
    }
}

impl SendRing {
    /// A ring for up to `slots` datagrams of up to `slot_len` bytes per submission.
    ///
    /// # Errors
    /// `io_uring` is not available: an old kernel, `kernel.io_uring_disabled`, or a seccomp
    /// filter (container runtimes often block it). The caller then sends one socket at a time.
    pub fn new(slots: usize, slot_len: usize) -> io::Result<Self> {
        let slots = slots.clamp(1, 4096);
        let entries = u32::try_from(slots.next_power_of_two()).unwrap_or(4096);
        // Completions are posted as the sends run inside `io_uring_enter`; the kernel need not
        // interrupt the thread for them (5.19 and later; older kernels get a plain ring).
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))?;
        Ok(SendRing {
            ring,
            buffers: ManuallyDrop::new(vec![0; slots * slot_len].into_boxed_slice()),
            slot_len,
            staged: 0,
            tags: vec![0; slots].into_boxed_slice(),
            lens: vec![0; slots].into_boxed_slice(),
            results: vec![0; slots].into_boxed_slice(),
            broken: false,
        })
    }

    /// True when no more datagrams can be staged before a [`SendRing::submit`].
    pub fn is_full(&self) -> bool {
        self.staged == self.tags.len()
    }

    /// Datagrams staged since the last submit.
    pub fn staged(&self) -> usize {
        self.staged
    }

    /// True once the ring failed in a way that may have left a send pending: it stages
    /// nothing more, and the caller sends without it from then on.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Stages `data` to be sent on `socket` (connected) at the next [`SendRing::submit`], with
    /// the caller's `tag`. False when it was not staged: the ring is full or broken, or `data`
    /// is longer than a slot.
    pub fn stage(&mut self, socket: &impl AsFd, data: &[u8], tag: u32) -> bool {
        if self.broken || self.is_full() || data.len() > self.slot_len {
            return false;
        }
        let slot = self.staged;
        let start = slot * self.slot_len;
        let buf = &mut self.buffers[start..start + data.len()];
        buf.copy_from_slice(data);
        let len = u32::try_from(data.len()).expect("invariant: a slot is far below 4 GiB");
        let entry = opcode::Send::new(types::Fd(socket.as_fd().as_raw_fd()), buf.as_ptr(), len)
            // Never wait for room: a full socket buffer completes the send with `EAGAIN`.
            .flags(SendFlags::DONTWAIT.bits() as i32)
            .build()
            .user_data(slot as u64);
        // SAFETY: the entry points into `buffers[start..start + len]`, which the ring owns and
        // does not touch again until this send completed: `submit` waits for the completion of
        // every staged send before `staged` goes back to 0 and a slot can be written again,
        // and a ring that could not wait is marked broken and never stages again; its buffers
        // are never freed (`ManuallyDrop`, leaked in `Drop` when broken). The socket's file
        // descriptor is only a number to the kernel: a closed one fails the send with
        // `EBADF`. The queue has room: it holds as many entries as there are slots.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return false;
        }
        self.tags[slot] = tag;
        self.lens[slot] = len;
        self.staged += 1;
        true
    }

    /// Sends everything staged with one system call (more only if interrupted) and waits for
    /// each send to complete, then calls `done` with each datagram's tag, its bytes and its
    /// outcome (bytes sent, or the error: `WouldBlock` when the socket's buffer was full), in
    /// the order they were staged.
    ///
    /// # Errors
    /// The ring failed: nothing staged is reported, and it is marked [`SendRing::broken`]
    /// (the kernel may still hold staged sends). The caller sends the datagrams it staged
    /// another way.
    pub fn submit(
        &mut self,
        mut done: impl FnMut(u32, &[u8], io::Result<usize>),
    ) -> io::Result<()> {
        let staged = self.staged;
        if staged == 0 {
            return Ok(());
        }
        let mut completed = 0;
        let mut retries = 0;
        while completed < staged {
            match self.ring.submit_and_wait(staged - completed) {
                Ok(_) => {}
                // A signal, or the kernel short of memory for a moment: try again, a bounded
                // number of times.
                Err(e)
                    if retries < MAX_RETRIES
                        && matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                        ) =>
                {
                    retries += 1;
                }
                Err(e) => {
                    self.broken = true;
                    return Err(e);
                }
            }
            for cqe in self.ring.completion() {
                let Some(result) = usize::try_from(cqe.user_data())
                    .ok()
                    .and_then(|slot| self.results.get_mut(slot))
                else {
                    continue;
                };
                *result = cqe.result();
                completed += 1;
            }
        }
        self.staged = 0;
        for slot in 0..staged {
            let result = self.results[slot];
            let outcome = match usize::try_from(result) {
                Ok(n) => Ok(n),
                Err(_) => Err(io::Error::from_raw_os_error(result.saturating_neg())),
            };
            let start = slot * self.slot_len;
            let data = &self.buffers[start..start + self.lens[slot] as usize];
            done(self.tags[slot], data, outcome);
        }
        Ok(())
    }
}

impl Drop for SendRing {
    fn drop(&mut self) {
        if !self.broken {
            // SAFETY: not broken, so nothing staged was handed to the kernel without being
            // waited for: no send reads these buffers any more. Entries staged and never
            // submitted are dropped with the ring without being read.
            unsafe { ManuallyDrop::drop(&mut self.buffers) };
        }
        // A broken ring's buffers are leaked: a send the kernel still holds may read them.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn ring() -> Option<SendRing> {
        match SendRing::new(4, 64) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("io_uring not available here ({e}): skipped");
                None
            }
        }
    }

    fn connected_to(sink: &UdpSocket) -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(sink.local_addr().unwrap()).unwrap();
        s
    }

    #[test]
    fn staged_datagrams_reach_their_sockets_peers_in_one_submit() {
        let Some(mut ring) = ring() else { return };
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b) = (connected_to(&sink), connected_to(&sink));
        assert!(ring.stage(&a, b"one", 1));
        assert!(ring.stage(&b, b"two", 2));
        assert!(ring.stage(&a, b"three", 3));
        let mut seen = Vec::new();
        ring.submit(|tag, data, r| seen.push((tag, data.len(), r.unwrap())))
            .unwrap();
        assert_eq!(seen, [(1, 3, 3), (2, 3, 3), (3, 5, 5)]);
        let mut buf = [0; 16];
        let mut got = Vec::new();
        for _ in 0..3 {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            got.push((buf[..n].to_vec(), from));
        }
        let a_addr = a.local_addr().unwrap();
        let b_addr = b.local_addr().unwrap();
        assert_eq!(got[0], (b"one".to_vec(), a_addr));
        assert!(got.contains(&(b"two".to_vec(), b_addr)));
        assert!(got.contains(&(b"three".to_vec(), a_addr)));
        // Empty again: a second submit has nothing to report.
        ring.submit(|_, _, _| panic!("nothing staged")).unwrap();
    }

    #[test]
    fn a_full_ring_or_an_oversize_datagram_is_not_staged() {
        let Some(mut ring) = ring() else { return };
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = connected_to(&sink);
        assert!(!ring.stage(&a, &[0; 65], 9), "longer than a slot");
        for tag in 0..4 {
            assert!(ring.stage(&a, &[tag as u8; 8], tag));
        }
        assert!(ring.is_full());
        assert!(!ring.stage(&a, b"x", 4));
        let mut n = 0;
        ring.submit(|tag, data, r| {
            assert_eq!(data, [tag as u8; 8]);
            assert_eq!(r.unwrap(), 8);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 4);
        assert!(ring.stage(&a, b"x", 4), "room again after the submit");
    }

    #[test]
    fn a_send_the_kernel_refuses_reports_its_error() {
        let Some(mut ring) = ring() else { return };
        // Not connected: a send without an address fails.
        let unconnected = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(ring.stage(&unconnected, b"nowhere", 7));
        let mut seen = None;
        ring.submit(|tag, _, r| seen = Some((tag, r.map_err(|e| e.raw_os_error()))))
            .unwrap();
        let (tag, r) = seen.unwrap();
        assert_eq!(tag, 7);
        assert!(r.is_err(), "{r:?}");
        assert!(!ring.broken());
    }
}
