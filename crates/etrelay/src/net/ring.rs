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
//! because the buffers belong to the ring, and a slot is written again only once the send
//! that read it has completed. Each send is `MSG_DONTWAIT`, which makes the kernel run it
//! inside `io_uring_enter` and complete it there, with `EAGAIN` when the socket's buffer is
//! full, rather than wait for room; [`SendRing::submit`] never waits, and checks that every
//! send it submitted has completed when the call returns. If one has not, or the ring failed
//! in a way that may leave a send pending, the ring is never used again
//! ([`SendRing::broken`]), and its buffers are leaked rather than freed. A kernel without
//! `IORING_OP_SEND` (before 5.6) gets no ring at all.
#![allow(unsafe_code)]

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd};

use io_uring::{IoUring, Probe, opcode, types};
use rustix::net::SendFlags;

/// Interrupted or refused-for-now `io_uring_enter` calls of one submit before the ring is given
/// up.
const MAX_RETRIES: u32 = 64;

/// A ring of staged sends: what was staged since the last [`SendRing::submit`].
pub(crate) struct SendRing {
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
    pub(crate) fn new(slots: usize, slot_len: usize) -> io::Result<Self> {
        let slots = slots.clamp(1, 4096);
        let entries = u32::try_from(slots.next_power_of_two()).unwrap_or(4096);
        // Completions are posted as the sends run inside `io_uring_enter`; the kernel need not
        // interrupt the thread for them (5.19 and later; older kernels get a plain ring).
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Send::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's io_uring has no send",
            ));
        }
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
    pub(crate) fn is_full(&self) -> bool {
        self.staged == self.tags.len()
    }

    /// Datagrams staged since the last submit.
    pub(crate) fn staged(&self) -> usize {
        self.staged
    }

    /// True once the ring failed in a way that may have left a send pending: it stages
    /// nothing more, and the caller sends without it from then on.
    pub(crate) fn broken(&self) -> bool {
        self.broken
    }

    /// Stages `data` to be sent on `socket` (connected) at the next [`SendRing::submit`], with
    /// the caller's `tag`. False when it was not staged: the ring is full or broken, or `data`
    /// is longer than a slot. The caller keeps `socket` open until that submit (the relay
    /// loop holds each session until then): the kernel is given its descriptor's number.
    pub(crate) fn stage(&mut self, socket: &impl AsFd, data: &[u8], tag: u32) -> bool {
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
        // does not write again until this send completed: `staged` goes back to 0 (and the
        // slot can be written again) only in a `submit` that saw every staged send's
        // completion; otherwise the ring is marked broken and never stages again, and its
        // buffers are never freed (`ManuallyDrop`, leaked in `Drop` when broken). The file
        // descriptor is only a number to the kernel, read when the send runs; the caller
        // keeps the socket open until then. The queue has room: it holds as many entries as
        // there are slots.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return false;
        }
        self.tags[slot] = tag;
        self.lens[slot] = len;
        self.staged += 1;
        true
    }

    /// Sends everything staged with one system call (more only if the kernel took part of it
    /// or was interrupted), then calls `done` once for each staged datagram, in the order
    /// staged, with its tag, its bytes and its outcome: bytes sent, or the error
    /// (`WouldBlock` when the socket's buffer was full). If the ring failed, the datagrams it
    /// could not send are reported with the failure and the ring is [`SendRing::broken`]
    /// from then on: the caller sends without it.
    pub(crate) fn submit(&mut self, mut done: impl FnMut(u32, &[u8], io::Result<usize>)) {
        let staged = self.staged;
        if staged == 0 {
            return;
        }
        let mut failure = None;
        let mut retries = 0;
        // Hand every entry to the kernel; each send runs (and completes) inside the call.
        while !self.ring.submission().is_empty() {
            match self.ring.submit() {
                Ok(_) => {}
                // A signal, or the kernel short of memory for a moment: try again, a bounded
                // number of times.
                Err(e)
                    if retries < MAX_RETRIES
                        && matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                        ) => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            retries += 1;
            if retries > MAX_RETRIES {
                failure = Some(io::Error::other("io_uring kept refusing the batch"));
                break;
            }
        }
        self.results[..staged].fill(PENDING);
        let mut completed = 0;
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
        if completed < staged {
            // A send not completed may still read its slot: never write or free the buffers
            // again.
            self.broken = true;
        }
        self.staged = 0;
        for slot in 0..staged {
            let result = self.results[slot];
            let outcome = if result == PENDING {
                Err(match &failure {
                    Some(e) => io::Error::new(e.kind(), e.to_string()),
                    None => io::Error::other("io_uring: the send did not complete at once"),
                })
            } else {
                match usize::try_from(result) {
                    Ok(n) => Ok(n),
                    Err(_) => Err(io::Error::from_raw_os_error(result.saturating_neg())),
                }
            };
            let start = slot * self.slot_len;
            let data = &self.buffers[start..start + self.lens[slot] as usize];
            done(self.tags[slot], data, outcome);
        }
        if failure.is_some() {
            self.broken = true;
        }
    }
}

/// A result slot no completion has written: no send's result is this (results are bytes sent,
/// or `-errno` above `-4096`).
const PENDING: i32 = i32::MIN;

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
        ring.submit(|tag, data, r| seen.push((tag, data.len(), r.unwrap())));
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
        ring.submit(|_, _, _| panic!("nothing staged"));
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
        });
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
        ring.submit(|tag, _, r| seen = Some((tag, r.map_err(|e| e.raw_os_error()))));
        let (tag, r) = seen.unwrap();
        assert_eq!(tag, 7);
        assert!(r.is_err(), "{r:?}");
        assert!(!ring.broken());
    }
}
