//! A table of entries with deadlines: bans, quarantines.
//!
//! An entry either expires at a given instant or never ([`Expiry::Never`]). Expired entries are
//! invisible to lookups at once and removed by [`ExpiringTable::purge`]; what an entry means
//! (a ban by IP set by an admin, a quarantine by node id set automatically) is up to the owner.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// When an entry stops applying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Never: permanent until removed.
    Never,
    /// At this instant.
    At(Instant),
}

impl Expiry {
    /// True when the entry no longer applies at `now`.
    pub fn passed(&self, now: Instant) -> bool {
        matches!(self, Expiry::At(t) if *t <= now)
    }
}

/// The table holds `max_len` live entries already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

/// A bounded map of entries with deadlines.
#[derive(Debug, Clone)]
pub struct ExpiringTable<K, V> {
    entries: HashMap<K, (V, Expiry)>,
    max_len: usize,
}

impl<K: Hash + Eq, V> ExpiringTable<K, V> {
    /// An empty table of at most `max_len` entries.
    pub fn new(max_len: usize) -> Self {
        ExpiringTable {
            entries: HashMap::new(),
            max_len,
        }
    }

    /// Inserts or replaces `key`. A new key is refused when the table is full of live entries
    /// (expired ones are purged first); replacing never fails.
    ///
    /// # Errors
    /// [`TableFull`] as above.
    pub fn insert(
        &mut self,
        key: K,
        value: V,
        expiry: Expiry,
        now: Instant,
    ) -> Result<(), TableFull> {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max_len {
            self.purge(now);
            if self.entries.len() >= self.max_len {
                return Err(TableFull);
            }
        }
        self.entries.insert(key, (value, expiry));
        Ok(())
    }

    /// The live entry for `key`.
    pub fn get(&self, key: &K, now: Instant) -> Option<(&V, Expiry)> {
        match self.entries.get(key) {
            Some((v, e)) if !e.passed(now) => Some((v, *e)),
            _ => None,
        }
    }

    /// True when `key` has a live entry.
    pub fn contains(&self, key: &K, now: Instant) -> bool {
        self.get(key, now).is_some()
    }

    /// Removes `key`; returns its value if it was live.
    pub fn remove(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.remove(key) {
            Some((v, e)) if !e.passed(now) => Some(v),
            _ => None,
        }
    }

    /// Removes the expired entries; returns how many.
    pub fn purge(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, (_, e)| !e.passed(now));
        before - self.entries.len()
    }

    /// The live entries.
    pub fn iter(&self, now: Instant) -> impl Iterator<Item = (&K, &V, Expiry)> {
        self.entries
            .iter()
            .filter(move |(_, (_, e))| !e.passed(now))
            .map(|(k, (v, e))| (k, v, *e))
    }

    /// Entries stored, live or not yet purged.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_expire_and_permanent_ones_stay() {
        let t0 = Instant::now();
        let mut t = ExpiringTable::new(8);
        t.insert("a", 1, Expiry::At(t0 + Duration::from_secs(5)), t0)
            .unwrap();
        t.insert("b", 2, Expiry::Never, t0).unwrap();
        assert!(t.contains(&"a", t0));
        let later = t0 + Duration::from_secs(5);
        assert!(!t.contains(&"a", later));
        assert!(t.contains(&"b", later + Duration::from_secs(1 << 30)));
        assert_eq!(t.purge(later), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn full_table_refuses_new_keys_but_replaces() {
        let t0 = Instant::now();
        let mut t = ExpiringTable::new(1);
        t.insert(1, "x", Expiry::Never, t0).unwrap();
        assert_eq!(t.insert(2, "y", Expiry::Never, t0), Err(TableFull));
        t.insert(1, "z", Expiry::Never, t0).unwrap();
        assert_eq!(t.get(&1, t0).map(|(v, _)| *v), Some("z"));
    }

    #[test]
    fn expired_entries_make_room() {
        let t0 = Instant::now();
        let mut t = ExpiringTable::new(1);
        t.insert(1, (), Expiry::At(t0 + Duration::from_secs(1)), t0)
            .unwrap();
        assert!(
            t.insert(2, (), Expiry::Never, t0 + Duration::from_secs(1))
                .is_ok()
        );
        assert_eq!(t.remove(&1, t0), None);
    }
}
