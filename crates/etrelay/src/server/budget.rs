//! What the whole process may spend, shared by every server it relays: session slots (one
//! socket each, so the file descriptors) and bytes queued towards the game servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use guard::admission::Gate;

/// The process-wide budget; cloning it gives another handle to the same one.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Sessions open at once, all servers together (`--max-sessions`).
    pub sessions: Gate,
    bytes: Arc<Bytes>,
}

#[derive(Debug)]
struct Bytes {
    limit: usize,
    used: AtomicUsize,
}

/// The byte budget is spent: the packet is not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OverBudget;

impl Budget {
    /// `max_sessions` session slots and `max_queued_bytes` bytes of queues.
    pub fn new(max_sessions: usize, max_queued_bytes: usize) -> Self {
        Budget {
            sessions: Gate::new(max_sessions),
            bytes: Arc::new(Bytes {
                limit: max_queued_bytes,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// Takes `n` bytes if they fit; never waits.
    pub(super) fn reserve(&self, n: usize) -> Result<(), OverBudget> {
        let limit = self.bytes.limit;
        self.bytes
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= limit)
            })
            .map(|_| ())
            .map_err(|_| OverBudget)
    }

    /// Gives back `n` bytes taken with [`Budget::reserve`].
    pub(super) fn release(&self, n: usize) {
        self.bytes.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes queued now, all servers together.
    pub fn queued_bytes(&self) -> usize {
        self.bytes.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_bounded_and_given_back() {
        let b = Budget::new(1, 100);
        assert!(b.reserve(60).is_ok());
        assert_eq!(b.clone().reserve(41), Err(OverBudget));
        assert!(b.reserve(40).is_ok());
        b.release(100);
        assert_eq!(b.queued_bytes(), 0);
    }
}
