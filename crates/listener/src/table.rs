//! Open connections counted per source: a total, a cap per source, and a share of the total
//! reserved for sources the caller trusts ([`Key::reserved`]).

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a connection is counted under: an address, an address block, a known peer…
pub trait Key: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static {
    /// True when this source may take the share of [`Limits::reserved`] others may not.
    fn reserved(&self) -> bool {
        false
    }
}

/// Per address: no source is trusted more than another.
impl Key for IpAddr {}

/// The limits of a [`Table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at most in all.
    pub total: usize,
    /// Connections one source may hold.
    pub per_source: usize,
    /// Of `total`, held back for [`Key::reserved`] sources: the others may hold
    /// `total − reserved`.
    pub reserved: usize,
}

/// Why a [`Table`] refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The source holds its cap.
    Source,
    /// The table (or, for a source without the reserved share, its open part) is full.
    Total,
}

/// Open connections per source. Entries exist only while something is held, so the table
/// never holds more than `total` keys. Cloning gives another handle to the same table; a
/// [`Slot`] gives its place back on drop.
#[derive(Clone)]
pub struct Table<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    limits: Limits,
    state: Mutex<Counts<K>>,
}

struct Counts<K> {
    total: usize,
    per: HashMap<K, usize>,
}

/// Counts only: a key may be an address.
impl<K> fmt::Debug for Table<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = lock(&self.inner.state);
        f.debug_struct("Table")
            .field("limits", &self.inner.limits)
            .field("held", &s.total)
            .field("sources", &s.per.len())
            .finish()
    }
}

/// One open connection's place in a [`Table`], given back on drop.
pub struct Slot<K: Key> {
    inner: Arc<Inner<K>>,
    key: K,
}

impl<K: Key> fmt::Debug for Slot<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").field("key", &self.key).finish()
    }
}

impl<K: Key> Table<K> {
    /// An empty table within `limits`.
    pub fn new(limits: Limits) -> Self {
        Table {
            inner: Arc::new(Inner {
                limits,
                state: Mutex::new(Counts {
                    total: 0,
                    per: HashMap::new(),
                }),
            }),
        }
    }

    /// Takes a place for `key`; never waits.
    ///
    /// # Errors
    /// [`Refusal`]: the total (or its open part) is full, or `key` holds its cap.
    pub fn acquire(&self, key: K) -> Result<Slot<K>, Refusal> {
        let l = self.inner.limits;
        let mut s = lock(&self.inner.state);
        let cap = if key.reserved() {
            l.total
        } else {
            l.total.saturating_sub(l.reserved)
        };
        if s.total >= cap {
            return Err(Refusal::Total);
        }
        let held = s.per.get(&key).copied().unwrap_or(0);
        if held >= l.per_source {
            return Err(Refusal::Source);
        }
        s.per.insert(key.clone(), held + 1);
        s.total += 1;
        Ok(Slot {
            inner: Arc::clone(&self.inner),
            key,
        })
    }
}

impl<K> Table<K> {
    /// Places held now (connections open).
    pub fn held(&self) -> usize {
        lock(&self.inner.state).total
    }

    /// Sources holding a connection now.
    pub fn sources(&self) -> usize {
        lock(&self.inner.state).per.len()
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }
}

impl<K: Key> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut s = lock(&self.inner.state);
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.per.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.per.remove(&self.key);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    enum K {
        Known(u8),
        Net(u8),
    }

    impl Key for K {
        fn reserved(&self) -> bool {
            matches!(self, K::Known(_))
        }
    }

    #[test]
    fn caps_per_source_and_in_all_and_reserves_for_trusted_sources() {
        let t = Table::new(Limits {
            total: 4,
            per_source: 2,
            reserved: 1,
        });
        let a1 = t.acquire(K::Net(0)).unwrap();
        let _a2 = t.acquire(K::Net(0)).unwrap();
        assert_eq!(t.acquire(K::Net(0)).unwrap_err(), Refusal::Source);
        let _b1 = t.acquire(K::Net(1)).unwrap();
        assert_eq!(
            t.acquire(K::Net(1)).unwrap_err(),
            Refusal::Total,
            "the last place is reserved"
        );
        let _k1 = t.acquire(K::Known(2)).unwrap();
        assert_eq!(t.acquire(K::Known(2)).unwrap_err(), Refusal::Total);
        drop(a1);
        assert_eq!((t.held(), t.sources()), (3, 3));
        assert!(t.acquire(K::Known(2)).is_ok());
        assert_eq!(
            (t.held(), t.sources()),
            (3, 3),
            "the slot was dropped at once"
        );
    }

    #[test]
    fn a_source_leaves_with_its_last_connection() {
        let t = Table::new(Limits {
            total: 8,
            per_source: 8,
            reserved: 0,
        });
        let ip: IpAddr = [127, 0, 0, 1].into();
        let slots: Vec<_> = (0..8).map(|_| t.acquire(ip).unwrap()).collect();
        assert_eq!(t.acquire(ip).unwrap_err(), Refusal::Total);
        assert_eq!((t.held(), t.sources()), (8, 1));
        drop(slots);
        assert_eq!((t.held(), t.sources()), (0, 0));
        assert!(format!("{t:?}").contains("held: 0"));
    }
}
