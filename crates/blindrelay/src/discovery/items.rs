//! A set of descriptors as reconciliation sees them: one item per descriptor, its `issued_at`
//! and its node id, sorted, with the fingerprints of any range
//! ([`negentropy::NegentropyStorageBase`]). An item is the pointer to the shared descriptor
//! (8 bytes), not a copy of it.
//!
//! Changes are kept aside and merged in one pass when the items are next read
//! ([`Items::snapshot`]): a burst of thousands of new descriptors costs one sort of the burst
//! and one merge, not a shift of the whole list per descriptor. A reconciliation works on a
//! snapshot: an `Arc` of the sorted list, copied only when it changes while a snapshot is held.

use std::sync::Arc;

use negentropy::{Bound, Id, Item, NegentropyStorageBase};

use super::Signed;

/// The sorted items, and the changes not merged yet.
#[derive(Debug, Default, Clone)]
pub struct Items {
    sorted: Arc<Vec<Arc<Signed>>>,
    added: Vec<Arc<Signed>>,
    removed: Vec<Arc<Signed>>,
}

/// Changes kept aside at most before they are merged: this many, or one for every
/// [`PENDING_SHARE`] items held, whichever is more.
const PENDING: usize = 512;
/// A burst into a large set (a full peer store read back at start, a first reconciliation
/// with a 100 000-node network) costs a few dozen merges, not one per [`PENDING`] changes
/// (at 100 000, 0.8 s of merges).
const PENDING_SHARE: usize = 16;

fn order(a: &Arc<Signed>, b: &Arc<Signed>) -> std::cmp::Ordering {
    a.key().cmp(&b.key())
}

impl Items {
    /// `s` added.
    pub fn add(&mut self, s: &Arc<Signed>) {
        self.added.push(Arc::clone(s));
        self.settle_when_many();
    }

    /// `s` removed.
    pub fn remove(&mut self, s: &Arc<Signed>) {
        if let Some(i) = self.added.iter().rposition(|k| Arc::ptr_eq(k, s)) {
            self.added.swap_remove(i);
        } else {
            self.removed.push(Arc::clone(s));
        }
        self.settle_when_many();
    }

    /// Merges once [`PENDING`] changes wait (or a [`PENDING_SHARE`]th of the items): a
    /// removal's search of the changes, and the room they take, stay bounded whatever the time
    /// between reads.
    fn settle_when_many(&mut self) {
        let most = PENDING.max(self.sorted.len() / PENDING_SHARE);
        if self.added.len() + self.removed.len() >= most {
            self.settle();
        }
    }

    /// Merges the changes kept aside.
    fn settle(&mut self) {
        if self.added.is_empty() && self.removed.is_empty() {
            return;
        }
        self.added.sort_unstable_by(order);
        self.removed.sort_unstable_by(order);
        let mut out = Vec::with_capacity(self.sorted.len() + self.added.len());
        let mut a = self.added.drain(..).peekable();
        let mut r = self.removed.iter().peekable();
        for k in self.sorted.iter() {
            while let Some(n) = a.next_if(|n| n.key() < k.key()) {
                out.push(n);
            }
            while r.next_if(|x| x.key() < k.key()).is_some() {}
            if r.next_if(|x| x.key() == k.key()).is_none() {
                out.push(Arc::clone(k));
            }
        }
        out.extend(a);
        out.dedup_by(|x, y| x.key() == y.key());
        out.shrink_to_fit();
        self.sorted = Arc::new(out);
        self.removed.clear();
        self.added.shrink_to(PENDING);
        self.removed.shrink_to(PENDING);
    }

    /// The heap its lists take (the descriptors they point to apart).
    pub fn heap_bytes(&self) -> usize {
        (self.sorted.capacity() + self.added.capacity() + self.removed.capacity())
            * std::mem::size_of::<Arc<Signed>>()
    }

    /// Items held (changes merged).
    pub fn len(&mut self) -> usize {
        self.settle();
        self.sorted.len()
    }

    /// True when none.
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// The sorted items as last merged, the changes since left aside.
    pub fn as_merged(&self) -> Snapshot {
        Snapshot(Arc::clone(&self.sorted))
    }

    /// An immutable view of the sorted items for one reconciliation (changes merged first).
    pub fn snapshot(&mut self) -> Snapshot {
        self.settle();
        Snapshot(Arc::clone(&self.sorted))
    }
}

/// The sorted items at one moment: what a reconciliation works on.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(Arc<Vec<Arc<Signed>>>);

impl Snapshot {
    /// The descriptors, sorted.
    pub fn all(&self) -> &[Arc<Signed>] {
        &self.0
    }
}

fn item(s: &Signed) -> Item {
    let (at, id) = s.key();
    Item::with_timestamp_and_id(at, Id::from_byte_array(id))
}

impl NegentropyStorageBase for Snapshot {
    fn size(&self) -> Result<usize, negentropy::Error> {
        Ok(self.0.len())
    }

    fn get_item(&self, i: usize) -> Result<Option<Item>, negentropy::Error> {
        Ok(self.0.get(i).map(|s| item(s)))
    }

    fn iterate(
        &self,
        begin: usize,
        end: usize,
        cb: &mut dyn FnMut(Item, usize) -> Result<bool, negentropy::Error>,
    ) -> Result<(), negentropy::Error> {
        let slice = self.0.get(begin..end).ok_or(negentropy::Error::BadRange)?;
        for (i, s) in slice.iter().enumerate() {
            if !cb(item(s), begin + i)? {
                break;
            }
        }
        Ok(())
    }

    fn find_lower_bound(&self, first: usize, last: usize, value: &Bound) -> usize {
        let last = last.min(self.0.len());
        let first = first.min(last);
        first + self.0[first..last].partition_point(|s| item(s) < value.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: u64, seed: u8) -> Arc<Signed> {
        let d = crate::proto::descriptor::for_test([seed; 32], "https://192.0.2.1:7001", at);
        Arc::new(Signed::trusted(d))
    }

    fn keys(snap: &Snapshot) -> Vec<u64> {
        snap.all().iter().map(|s| s.d.issued_at).collect()
    }

    #[test]
    fn changes_merge_in_order_and_a_snapshot_stays_as_it_was() {
        let mut items = Items::default();
        let (a, b, c, d) = (s(5, 1), s(1, 9), s(3, 2), s(2, 0));
        for x in [&a, &b, &c] {
            items.add(x);
        }
        let snap = items.snapshot();
        assert_eq!(keys(&snap), [1, 3, 5]);
        items.add(&d);
        items.remove(&c);
        assert_eq!(items.len(), 3);
        assert_eq!(keys(&items.snapshot()), [1, 2, 5]);
        assert_eq!(
            keys(&snap),
            [1, 3, 5],
            "the snapshot taken before is unchanged"
        );
        let lb = Bound::with_timestamp(2);
        assert_eq!(items.snapshot().find_lower_bound(0, 3, &lb), 1);
        // Added then removed before a merge: never there.
        items.add(&c);
        items.remove(&c);
        assert_eq!(keys(&items.snapshot()), [1, 2, 5]);
    }
}
