//! A non-blocking counting gate: at most `limit` permits out at once.
//!
//! Acquiring never waits: a caller that finds the gate full gets `None` and refuses the work
//! (a new session, a request) at once. Permits are RAII guards that give their slot back on
//! drop, so a task that ends for any reason (return, panic, abort) frees its slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A shared gate; cloning it gives another handle to the same slots.
#[derive(Debug, Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Most permits out at once.
    limit: usize,
    /// Permits out now.
    in_use: AtomicUsize,
}

/// One slot of a [`Gate`], given back when dropped.
#[derive(Debug)]
pub struct Permit {
    inner: Arc<Inner>,
}

impl Gate {
    /// A gate with `limit` slots.
    pub fn new(limit: usize) -> Self {
        Gate {
            inner: Arc::new(Inner {
                limit,
                in_use: AtomicUsize::new(0),
            }),
        }
    }

    /// Takes a slot if one is free; never waits.
    pub fn try_acquire(&self) -> Option<Permit> {
        let taken = self
            .inner
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.inner.limit).then_some(n + 1)
            });
        taken.ok().map(|_| Permit {
            inner: Arc::clone(&self.inner),
        })
    }

    /// Takes a slot only while fewer than `below` (and fewer than the limit) are in use: a
    /// caller that must always leave room for another kind of work asks with `limit − 1`.
    pub fn try_acquire_below(&self, below: usize) -> Option<Permit> {
        let cap = below.min(self.inner.limit);
        let taken = self
            .inner
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            });
        taken.ok().map(|_| Permit {
            inner: Arc::clone(&self.inner),
        })
    }

    /// Slots in use now.
    pub fn in_use(&self) -> usize {
        self.inner.in_use.load(Ordering::Acquire)
    }

    /// The number of slots.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.in_use.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_gate_refuses_and_drop_frees() {
        let gate = Gate::new(2);
        let a = gate.try_acquire().expect("first slot");
        let _b = gate.try_acquire().expect("second slot");
        assert!(gate.try_acquire().is_none());
        assert_eq!(gate.in_use(), 2);
        drop(a);
        assert_eq!(gate.in_use(), 1);
        assert!(gate.try_acquire().is_some());
    }

    #[test]
    fn clones_share_slots() {
        let gate = Gate::new(1);
        let other = gate.clone();
        let _p = gate.try_acquire().expect("slot");
        assert!(other.try_acquire().is_none());
    }

    #[test]
    fn a_reserved_slot_stays_free_for_the_other_kind() {
        let gate = Gate::new(4);
        let inbound: Vec<_> = (0..5).filter_map(|_| gate.try_acquire_below(3)).collect();
        assert_eq!(inbound.len(), 3);
        let outbound = gate.try_acquire().expect("the reserved slot");
        assert!(gate.try_acquire().is_none());
        drop(outbound);
        assert!(
            gate.try_acquire_below(3).is_none(),
            "inbound still capped at 3"
        );
    }

    #[test]
    fn zero_limit_refuses_everything() {
        assert!(Gate::new(0).try_acquire().is_none());
    }
}
