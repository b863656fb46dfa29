//! Roots: which first-hand source each identity came through, and whether a second one
//! confirmed it (see `super::super::eclipse`).

use super::super::wire::short;
use super::{RootCounts, View};
use crate::proto::NodeId;

impl View {
    /// `id`'s root and confirmation as the peer store kept them (a restart keeps the eclipse
    /// verdict: what came through one source still counts as that source's).
    pub fn reroot(&mut self, id: &NodeId, root: u32, confirmed: bool) {
        let Some(e) = self.get_mut(id) else {
            return;
        };
        let (old, was) = (e.root, e.confirmed);
        e.root = root;
        e.confirmed = confirmed;
        if let Some(r) = self.roots.get_mut(&old) {
            r.entries = r.entries.saturating_sub(1);
            if !was {
                r.unconfirmed = r.unconfirmed.saturating_sub(1);
            }
            if r.entries == 0 {
                self.roots.remove(&old);
            }
        }
        let r = self.roots.entry(root).or_default();
        r.entries += 1;
        if !confirmed {
            r.unconfirmed += 1;
        }
    }

    /// The entries in `held` (node ids this node holds and a peer rooted at `by` holds too)
    /// are confirmed by a second source when their own root is another.
    pub fn confirm<'a>(&mut self, held: impl Iterator<Item = &'a NodeId>, by: u32) {
        for id in held {
            let h = self.hash(&short(id));
            let Some(e) = self.table.find_mut(h, |e| e.id() == id) else {
                continue;
            };
            if e.confirmed || e.root == by {
                continue;
            }
            e.confirmed = true;
            let root = e.root;
            if let Some(r) = self.roots.get_mut(&root) {
                r.unconfirmed = r.unconfirmed.saturating_sub(1);
            }
        }
    }

    /// The counts eclipse detection reads.
    pub fn roots(&self) -> RootCounts {
        let mut c = RootCounts {
            held: self.table.len(),
            ..RootCounts::default()
        };
        for (root, stat) in &self.roots {
            c.roots += 1;
            c.unconfirmed += stat.unconfirmed as usize;
            if stat.unconfirmed as usize > c.top_unconfirmed || c.top.is_none() {
                c.top_unconfirmed = stat.unconfirmed as usize;
                c.top = Some(*root);
            }
        }
        c
    }
}
