//! A hash map whose memory is allocated once and never grows.
//!
//! Open addressing with linear probing over a power-of-two array of at least twice the key cap,
//! so a probe always meets an empty slot soon; deletion shifts the following entries back
//! (no tombstones), so the table never needs rehashing. Keys are hashed with the standard
//! library's randomly keyed SipHash: keys come from the network, and a fixed hash would let a
//! sender pick colliding keys.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};

/// A map of at most `max_len` entries in a fixed array.
#[derive(Debug)]
pub(crate) struct FixedMap<K, V> {
    slots: Vec<Option<(K, V)>>,
    mask: usize,
    len: usize,
    max_len: usize,
    hasher: RandomState,
}

impl<K: Hash + Eq, V> FixedMap<K, V> {
    /// A map for at most `max_len` entries; allocates all of its memory now.
    pub(crate) fn new(max_len: usize) -> Self {
        let n = max_len.max(1).saturating_mul(2).next_power_of_two();
        let mut slots = Vec::with_capacity(n);
        slots.resize_with(n, || None);
        FixedMap {
            slots,
            mask: n - 1,
            len: 0,
            max_len,
            hasher: RandomState::new(),
        }
    }

    fn home(&self, key: &K) -> usize {
        (self.hasher.hash_one(key) as usize) & self.mask
    }

    /// `Ok(index)` of `key`, or `Err(index)` of the empty slot where it would go.
    fn find(&self, key: &K) -> Result<usize, usize> {
        let mut i = self.home(key);
        // At most half the slots are used, so this meets an empty slot.
        loop {
            match &self.slots[i] {
                None => return Err(i),
                Some((k, _)) if k == key => return Ok(i),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let i = self.find(key).ok()?;
        self.slots[i].as_ref().map(|(_, v)| v)
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        self.slots[i].as_mut().map(|(_, v)| v)
    }

    /// Inserts a new key. Returns the value back when the map is full.
    ///
    /// The caller has checked that `key` is absent.
    pub(crate) fn insert_new(&mut self, key: K, value: V) -> Result<(), V> {
        if self.len >= self.max_len {
            return Err(value);
        }
        match self.find(&key) {
            Ok(i) => self.slots[i] = Some((key, value)),
            Err(i) => {
                self.slots[i] = Some((key, value));
                self.len += 1;
            }
        }
        Ok(())
    }

    /// Keeps the entries for which `keep` is true.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&K, &V) -> bool) {
        self.retain_slots(0, self.slots.len(), keep);
    }

    /// Looks at `count` slots from `start` (wrapping) and keeps, of the entries there, those for
    /// which `keep` is true; returns the slot after the last one looked at. A removal shifts the
    /// entries of its probe run back, so an entry may move past the window's end and be looked
    /// at by the next window instead: a sweep in windows forgets nothing it should keep, and
    /// what it should drop is dropped within one more round.
    pub(crate) fn retain_slots(
        &mut self,
        start: usize,
        count: usize,
        mut keep: impl FnMut(&K, &V) -> bool,
    ) -> usize {
        let mut i = start & self.mask;
        let mut left = count.min(self.slots.len());
        while left > 0 {
            let drop = matches!(&self.slots[i], Some((k, v)) if !keep(k, v));
            if drop {
                // The shift may move a later entry into `i`: look at `i` again.
                self.remove_at(i);
            } else {
                i = (i + 1) & self.mask;
                left -= 1;
            }
        }
        i
    }

    /// Empties slot `hole` and shifts back the entries of its probe run.
    fn remove_at(&mut self, mut hole: usize) {
        self.slots[hole] = None;
        self.len -= 1;
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let home = match &self.slots[j] {
                None => return,
                Some((k, _)) => self.home(k),
            };
            // The entry at `j` may stay only if its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated: constant for the map's life.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().flatten().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Behaves as a std HashMap capped at `max_len`, and never reallocates.
        #[test]
        fn same_as_a_hashmap(ops in proptest::collection::vec((0u8..4, 0u16..40), 0..600)) {
            let mut m = FixedMap::new(16);
            let mut model = HashMap::new();
            let slots = m.slots();
            let ptr = m.slots.as_ptr();
            for (op, k) in ops {
                match op {
                    0 => {
                        if model.contains_key(&k) {
                            continue;
                        }
                        let r = m.insert_new(k, u32::from(k) * 7);
                        if model.len() < 16 {
                            prop_assert!(r.is_ok());
                            model.insert(k, u32::from(k) * 7);
                        } else {
                            prop_assert!(r.is_err());
                        }
                    }
                    1 => {
                        m.retain(|key, _| key % 3 != k % 3);
                        model.retain(|key, _| key % 3 != k % 3);
                    }
                    3 => {
                        // A window: nothing kept is lost; what is gone was to be dropped.
                        let start = usize::from(k) * 5;
                        let next = m.retain_slots(start, usize::from(k % 11), |key, _| key % 4 != k % 4);
                        prop_assert_eq!(next, (start + usize::from(k % 11)) & m.mask);
                        for key in model.keys() {
                            if key % 4 != k % 4 {
                                prop_assert!(m.get(key).is_some());
                            }
                        }
                        model.retain(|key, _| m.get(key).is_some());
                    }
                    _ => {
                        prop_assert_eq!(m.get(&k), model.get(&k));
                        if let Some(v) = m.get_mut(&k) {
                            *v += 1;
                            *model.get_mut(&k).unwrap() += 1;
                        }
                    }
                }
                prop_assert_eq!(m.len(), model.len());
                prop_assert_eq!(m.iter().count(), model.len());
                for (key, v) in &model {
                    prop_assert_eq!(m.get(key), Some(v));
                }
                prop_assert_eq!(m.slots(), slots);
                prop_assert_eq!(m.slots.as_ptr(), ptr);
            }
        }
    }

    /// Windows that cover every slot once drop what a full retain drops.
    #[test]
    fn windows_over_every_slot_are_a_full_retain() {
        let mut m = FixedMap::new(64);
        for k in 0..64u32 {
            m.insert_new(k, ()).unwrap();
        }
        let mut at = 7;
        for _ in 0..m.slots() / 16 {
            at = m.retain_slots(at, 16, |k, _| k % 2 == 0);
        }
        assert_eq!(at, 7);
        // A removal may move an entry to be dropped behind the window: one more round.
        for _ in 0..m.slots() / 16 {
            at = m.retain_slots(at, 16, |k, _| k % 2 == 0);
        }
        let mut left: Vec<u32> = m.iter().map(|(k, _)| *k).collect();
        left.sort_unstable();
        assert_eq!(left, (0..64).filter(|k| k % 2 == 0).collect::<Vec<_>>());
    }

    #[test]
    fn sized_for_half_load() {
        let m: FixedMap<u32, ()> = FixedMap::new(65_536);
        assert_eq!(m.slots(), 131_072);
    }
}
