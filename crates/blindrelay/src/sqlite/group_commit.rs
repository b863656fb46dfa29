//! Group commit, as both stores write (the replay registry and the terminal's inbox): every
//! write waits in one queue, and one caller at a time, the *leader*, commits all the writes
//! queued at that moment in one transaction (one fsync), at most [`Limits::writes`] writes and
//! [`Limits::bytes`] bytes per batch (a larger single write still goes alone). Callers that
//! queued meanwhile wait on a condition variable; when a batch ends, one of them leads the next.
//! A caller alone commits at once (nothing is waited for), so a quiet node pays one commit per
//! write, and a loaded one one per batch.
//!
//! A write's result is handed back only after the transaction holding it has committed (or
//! failed): nothing is acknowledged before its commit. If a batch fails, every member gets the
//! batch's error ([`Failed`]); if the leader's write function panics, every member gets
//! [`Failed::Panicked`] and the next caller leads again.
//!
//! The queue holds at most one write per blocked caller; callers are the runtime's blocking
//! threads (bounded by tokio's `max_blocking_threads`). The store's own state (the registry's
//! mirror, the inbox's counts) is under the store's own lock, never held while a caller waits
//! here.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// How much one group commit holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Writes.
    pub(crate) writes: usize,
    /// Bytes, as the caller sized each write (stored bodies, payloads).
    pub(crate) bytes: usize,
}

/// Why a write was not committed: every write of its batch failed with it.
#[derive(Debug)]
pub(crate) enum Failed<E> {
    /// The batch's error.
    Error(Arc<E>),
    /// The leader's write function panicked; the transaction was not committed.
    Panicked,
}

impl<E> Clone for Failed<E> {
    fn clone(&self) -> Self {
        match self {
            Failed::Error(e) => Failed::Error(Arc::clone(e)),
            Failed::Panicked => Failed::Panicked,
        }
    }
}

/// The writes waiting for a group commit, oldest first, each with its ticket and size.
#[derive(Debug)]
pub(crate) struct Queue<W> {
    limits: Limits,
    writes: VecDeque<(u64, usize, W)>,
}

impl<W> Queue<W> {
    /// An empty queue whose batches keep within `limits`.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            writes: VecDeque::new(),
        }
    }

    /// Queues `write` of `size` bytes under `ticket`.
    pub(crate) fn push(&mut self, ticket: u64, size: usize, write: W) {
        self.writes.push_back((ticket, size, write));
    }

    /// Writes waiting. (tests watch the queue).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.writes.len()
    }

    /// The oldest queued writes, within the limits (at least one, when any is queued).
    pub(crate) fn take_batch(&mut self) -> Vec<(u64, W)> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(&(_, size, _)) = self.writes.front() {
            if !batch.is_empty()
                && (batch.len() >= self.limits.writes
                    || bytes.saturating_add(size) > self.limits.bytes)
            {
                break;
            }
            bytes = bytes.saturating_add(size);
            if let Some((ticket, _, write)) = self.writes.pop_front() {
                batch.push((ticket, write));
            }
        }
        batch
    }
}

/// A write handed back to its caller with its outcome.
type Done<W, R, E> = (W, Result<R, Failed<E>>);

struct State<W, R, E> {
    queue: Queue<W>,
    next_ticket: u64,
    /// A leader is committing a batch.
    committing: bool,
    /// Outcomes of committed (or failed) writes, until their callers take them.
    results: HashMap<u64, Done<W, R, E>>,
    /// Group commits run.
    commits: u64,
}

/// A store's connection `C` and its group-commit queue of writes `W`, each committed to a
/// result `R` or failed with the batch's error `E`. `Send + Sync` when `C` and `W` are `Send`.
pub(crate) struct GroupCommit<C, W, R, E> {
    conn: Mutex<C>,
    state: Mutex<State<W, R, E>>,
    /// Signalled when a group commit ends.
    committed: Condvar,
}

impl<C, W, R, E> GroupCommit<C, W, R, E> {
    /// Group commits on `conn`, each within `limits`.
    pub(crate) fn new(conn: C, limits: Limits) -> Self {
        Self {
            conn: Mutex::new(conn),
            state: Mutex::new(State {
                queue: Queue::new(limits),
                next_ticket: 0,
                committing: false,
                results: HashMap::new(),
                commits: 0,
            }),
            committed: Condvar::new(),
        }
    }

    /// The connection, for the store's other calls (they wait for a batch being committed). A
    /// panic while holding it leaves no half-done write: each call is one statement or one
    /// transaction, rolled back if not committed.
    pub(crate) fn conn(&self) -> MutexGuard<'_, C> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Group commits run so far (one transaction each).
    pub(crate) fn commits(&self) -> u64 {
        self.state().commits
    }

    /// Whether a leader is committing a batch now. (tests watch the queue).
    #[cfg(test)]
    pub(crate) fn committing(&self) -> bool {
        self.state().committing
    }

    /// Writes waiting for the next batch. (tests watch the queue).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Queues `write` (`size` bytes, for the batch limit) and returns it with its result once
    /// the transaction holding it has committed or failed. The leader calls `write_batch` on
    /// the connection with the batch's writes, oldest first; it commits them all in one
    /// transaction and returns one result per write, or fails them all.
    pub(crate) fn submit(
        &self,
        write: W,
        size: usize,
        mut write_batch: impl FnMut(&mut C, &[W]) -> Result<Vec<R>, E>,
    ) -> Done<W, R, E> {
        let mut state = self.state();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push(ticket, size, write);
        loop {
            if let Some(done) = state.results.remove(&ticket) {
                return done;
            }
            state = if state.committing {
                self.committed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner)
            } else {
                self.lead(state, &mut write_batch)
            };
        }
    }

    /// Commits the writes queued now without the state's lock, then hands each its result (or
    /// the batch's failure) and wakes every waiting caller.
    fn lead<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<W, R, E>>,
        write_batch: &mut impl FnMut(&mut C, &[W]) -> Result<Vec<R>, E>,
    ) -> MutexGuard<'a, State<W, R, E>> {
        state.committing = true;
        let (tickets, writes): (Vec<u64>, Vec<W>) = state.queue.take_batch().into_iter().unzip();
        drop(state);
        let result = catch_unwind(AssertUnwindSafe(|| write_batch(&mut self.conn(), &writes)));
        let mut results: Vec<Result<R, Failed<E>>> = match result {
            Ok(Ok(done)) => done.into_iter().map(Ok).collect(),
            Ok(Err(e)) => {
                let e = Failed::Error(Arc::new(e));
                tickets.iter().map(|_| Err(e.clone())).collect()
            }
            Err(_) => tickets.iter().map(|_| Err(Failed::Panicked)).collect(),
        };
        // One result per write (a `write_batch` that returned fewer fails the rest).
        debug_assert_eq!(results.len(), tickets.len());
        results.resize_with(tickets.len(), || Err(Failed::Panicked));
        let mut state = self.state();
        state.committing = false;
        state.commits += 1;
        for ((ticket, write), result) in tickets.into_iter().zip(writes).zip(results) {
            state.results.insert(ticket, (write, result));
        }
        self.committed.notify_all();
        state
    }

    /// The queue's state is changed only under this lock, each change whole.
    fn state(&self) -> MutexGuard<'_, State<W, R, E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        writes: 4,
        bytes: 100,
    };

    #[test]
    fn a_caller_alone_commits_at_once() {
        let g: GroupCommit<Vec<u32>, u32, usize, ()> = GroupCommit::new(Vec::new(), LIMITS);
        for n in 0..3 {
            let (w, r) = g.submit(n, 1, |log, batch| {
                log.extend_from_slice(batch);
                Ok((0..batch.len()).map(|_| log.len()).collect())
            });
            assert_eq!((w, r.ok()), (n, Some(n as usize + 1)));
        }
        assert_eq!(g.commits(), 3);
        assert_eq!(*g.conn(), vec![0, 1, 2]);
        assert!(!g.committing() && g.queued() == 0);
    }

    #[test]
    fn a_failed_or_panicking_batch_fails_its_write_and_the_next_one_leads() {
        let g: GroupCommit<(), u32, (), &str> = GroupCommit::new((), LIMITS);
        let (_, r) = g.submit(1, 1, |_, _| Err("disk full"));
        assert!(matches!(r, Err(Failed::Error(e)) if *e == "disk full"));
        let (_, r) = g.submit(2, 1, |_, _| panic!("boom"));
        assert!(matches!(r, Err(Failed::Panicked)));
        let (_, r) = g.submit(3, 1, |_, b| Ok(vec![(); b.len()]));
        assert!(r.is_ok());
        assert_eq!(g.commits(), 3);
    }

    #[test]
    fn a_batch_keeps_within_its_limits() {
        let mut q = Queue::new(LIMITS);
        for n in 0..6 {
            q.push(n, 0, n);
        }
        assert_eq!(q.take_batch().len(), 4);
        assert_eq!(q.take_batch().len(), 2);
        assert!(q.take_batch().is_empty());
        for (n, size) in [(0, 50), (1, 50), (2, 1), (3, 200)] {
            q.push(n, size, n);
        }
        assert_eq!(q.take_batch().len(), 2);
        assert_eq!(q.take_batch().len(), 1);
        assert_eq!(q.take_batch().len(), 1);
    }
}
