//! Making room: which identity a newcomer takes the place of (see the parent's docs).

use super::{BLOCKS, Entry, View};
use crate::blocks::block_key32;
use crate::proto::NodeId;

impl View {
    /// The identity of block `b` never reached that failed most (then the newest): the one a
    /// newcomer of that block takes the place of. A scan, done only when the block is full and
    /// holds such an identity.
    pub(super) fn junk_in_block(&self, b: u32) -> Option<NodeId> {
        self.table
            .iter()
            .filter(|e| e.reached == 0 && !e.origin.is_operator())
            .filter(|e| e.s.ip.map(|i| block_key32(i, BLOCKS)) == Some(b))
            .max_by_key(|e| (e.failures, e.first_seen))
            .map(|e| *e.id())
    }

    /// The identity a newcomer takes the place of in a full view (see the module docs). The
    /// worst 1/64 of the view is chosen in one pass and taken in turn, each checked again.
    pub(super) fn victim(&mut self, now: u64) -> Option<NodeId> {
        while let Some(id) = self.victims.pop() {
            if self
                .get(&id)
                .is_some_and(|e| self.evictable(e, now).is_some())
            {
                return Some(id);
            }
        }
        let mut ranked: Vec<((u8, u32, u32, u32), NodeId)> = self
            .table
            .iter()
            .filter_map(|e| Some((self.evictable(e, now)?, *e.id())))
            .collect();
        let keep = (self.limits.capacity / 64).max(1);
        if ranked.len() > keep {
            ranked.select_nth_unstable_by(keep, |a, b| b.0.cmp(&a.0));
            ranked.truncate(keep);
        }
        ranked.sort_unstable_by_key(|r| r.0);
        self.victims = ranked.into_iter().map(|(_, id)| id).collect();
        self.victims.pop()
    }

    /// How evictable `e` is (greater: sooner), or `None` for a reached peer that answers or
    /// the operator's.
    fn evictable(&self, e: &Entry, now: u64) -> Option<(u8, u32, u32, u32)> {
        if e.origin.is_operator() {
            return None;
        }
        if !e.s.d.is_current(now) {
            return Some((3, 0, 0, 0));
        }
        if e.reached == 0 {
            let waiting = self.waiting_from(e.origin);
            return Some((2, waiting, u32::from(e.failures), e.first_seen));
        }
        (e.failures > 0).then_some((1, u32::from(e.failures), u32::MAX - e.reached, 0))
    }
}
