//! Push: fresh descriptors flooded over a sparse graph of neighbours, each once.
//!
//! A descriptor this node passes on and did not before (a peer reached for the first time, a
//! newer descriptor of a reached peer, its own reissued) is pending, newest per identity,
//! until the next flush (`flush_every`). A flush sends one inventory (12 bytes an entry, at
//! most [`MAX_INV`] entries) to each neighbour, leaving out the one it came from and those
//! that announced it to this node meanwhile (they have it): the
//! `fanout` peers this node chose (reached and healthy, one replaced every interval, a
//! failed one at once) and up to [`IN_NEIGHBOURS`] that pushed to it lately, so the graph is
//! connected both ways. A neighbour answers with the entries it lacks (or holds older), asked
//! of one neighbour at a time; those descriptors follow in a second request.
//!
//! Inbound, only a peer this node reached may push, and each one is charged in bytes (a
//! bucket of [`PUSH_BURST`] refilled at [`PUSH_RATE`] a second): past it, its inventories are
//! answered with nothing and its descriptors dropped, counted as turned away.

use hashbrown::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::view::View;
use super::wire::{SHORT, Short, descriptor_len, short};
use super::{Config, Discovery, Msg, Now, Purpose, Signed};
use crate::proto::NodeId;
use crate::proto::descriptor::Descriptor;

/// Entries in one inventory at most.
pub const MAX_INV: usize = 4096;
/// Identities pending at most (the view's default capacity).
pub const MAX_PENDING: usize = super::view::CAPACITY;
/// Peers that pushed lately pushed to in turn, at most.
pub const IN_NEIGHBOURS: usize = 8;
/// An inbound peer's push budget: this many bytes at once...
pub const PUSH_BURST: u32 = 512 * 1024;
/// ...refilled at this many bytes a second.
pub const PUSH_RATE: u32 = 16 * 1024;
/// Bytes of descriptors in one push at most.
pub const MAX_PUSH: usize = 512 * 1024;

/// The push state.
#[derive(Debug, Default)]
pub struct Push {
    /// Newest `issued_at` per identity to announce, and the neighbours known to hold it
    /// already (the peer it came from, those that announced it since): left out.
    pending: HashMap<NodeId, (u64, Vec<Short>)>,
    out: Vec<NodeId>,
    inn: Vec<(NodeId, Instant)>,
    /// Per inbound peer: when its byte budget is full again.
    budgets: HashMap<NodeId, Instant>,
    /// Entries asked of a neighbour, until when.
    wanted: HashMap<Short, Instant>,
    next_flush: Option<Instant>,
    next_rotate: Option<Instant>,
}

impl Push {
    /// The heap it takes, estimated.
    pub fn heap_bytes(&self) -> usize {
        self.pending.capacity() * 65
            + self
                .pending
                .values()
                .map(|p| p.1.capacity() * 8)
                .sum::<usize>()
            + self.budgets.capacity() * 49
            + self.wanted.capacity() * 25
    }

    /// `s` is to be announced (newest per identity); `from` is the peer it came from.
    pub fn fresh(&mut self, s: &Arc<Signed>, from: Option<NodeId>) {
        let (id, at) = (s.d.node_id, s.d.issued_at);
        let skip = from.iter().map(short).collect();
        if let Some(p) = self.pending.get_mut(&id) {
            if p.0 < at {
                *p = (at, skip);
            }
        } else if self.pending.len() < MAX_PENDING {
            self.pending.insert(id, (at, skip));
        }
    }

    /// Charges `bytes` to `peer`'s budget; false when over it.
    pub fn charge(&mut self, peer: NodeId, bytes: usize, now: Now) -> bool {
        let per_byte = Duration::from_secs(1) / PUSH_RATE;
        let cost = per_byte.saturating_mul(u32::try_from(bytes).unwrap_or(u32::MAX));
        let tolerance = per_byte.saturating_mul(PUSH_BURST);
        let full_at = self.budgets.entry(peer).or_insert(now.at);
        let start = (*full_at).max(now.at);
        let after = start + cost;
        if after.saturating_duration_since(now.at) > tolerance {
            return false;
        }
        *full_at = after;
        true
    }

    /// A reached `peer`'s inventory: the entries this node lacks or holds older and has not
    /// asked anyone for yet; `None` when over its budget.
    pub fn on_inv(
        &mut self,
        view: &View,
        peer: NodeId,
        items: &[(Short, u64)],
        cfg: &Config,
        now: Now,
    ) -> Option<Vec<Short>> {
        if !self.charge(peer, items.len() * (SHORT + 4), now) {
            return None;
        }
        self.note_pusher(peer, now);
        let mut want = Vec::new();
        for (s, at) in items.iter().take(MAX_INV) {
            if *s == short(view.me()) {
                continue;
            }
            let mut held = false;
            for e in view.by_short(s).filter(|e| e.s.d.issued_at >= *at) {
                held = true;
                // Pending here: `peer` has it, and is left out of its announcement.
                if let Some(p) = self.pending.get_mut(e.id())
                    && p.0 <= *at
                    && p.1.len() < 2 * IN_NEIGHBOURS
                {
                    p.1.push(short(&peer));
                }
            }
            let asked = self.wanted.get(s).is_some_and(|until| *until > now.at);
            if !held && !asked {
                self.wanted.insert(*s, now.at + cfg.exchange_timeout);
                want.push(*s);
            }
        }
        Some(want)
    }

    /// A descriptor of `id` arrived: no longer asked for.
    pub fn arrived(&mut self, id: &NodeId) {
        self.wanted.remove(&short(id));
    }

    /// Forgets budgets at rest, requests given up and old pushers.
    pub fn sweep(&mut self, now: Now) {
        self.budgets.retain(|_, full_at| *full_at > now.at);
        self.wanted.retain(|_, until| *until > now.at);
        let horizon = Duration::from_secs(300);
        self.inn
            .retain(|(_, at)| now.at.saturating_duration_since(*at) < horizon);
        super::shrink(&mut self.budgets);
        super::shrink(&mut self.wanted);
        super::shrink(&mut self.pending);
    }

    /// `id` failed as a neighbour: replaced at the next flush.
    pub fn drop_neighbour(&mut self, id: &NodeId) {
        self.out.retain(|n| n != id);
        self.inn.retain(|(n, _)| n != id);
    }

    fn note_pusher(&mut self, peer: NodeId, now: Now) {
        if let Some(p) = self.inn.iter_mut().find(|(n, _)| *n == peer) {
            p.1 = now.at;
            return;
        }
        if self.inn.len() >= IN_NEIGHBOURS {
            // The one heard from longest ago makes room.
            if let Some(i) = (0..self.inn.len()).min_by_key(|i| self.inn[*i].1) {
                self.inn.swap_remove(i);
            }
        }
        self.inn.push((peer, now.at));
    }
}

/// The descriptors of `shorts` this node passes on, at most [`MAX_PUSH`] bytes.
pub fn wanted(view: &View, shorts: &[Short]) -> Vec<Descriptor> {
    let mut bytes = 0;
    let mut out = Vec::new();
    for s in shorts.iter().take(MAX_INV) {
        for e in view.by_short(s).filter(|e| e.reached().is_some()) {
            bytes += descriptor_len(&e.s.d);
            if bytes > MAX_PUSH {
                return out;
            }
            out.push(e.s.d.clone());
        }
    }
    out
}

impl Discovery {
    /// At each `flush_every`: neighbours kept up, and what is pending announced to each.
    pub(super) fn flush(&mut self, now: Now) {
        if self.push.next_flush.is_some_and(|t| now.at < t) {
            return;
        }
        self.push.next_flush = Some(now.at + self.cfg.flush_every);
        self.keep_neighbours(now);
        if self.push.pending.is_empty() {
            return;
        }
        let take = self.push.pending.len().min(MAX_INV);
        let keys: Vec<NodeId> = self.push.pending.keys().take(take).copied().collect();
        let items: Vec<(NodeId, u64, Vec<Short>)> = keys
            .into_iter()
            .filter_map(|id| {
                self.push
                    .pending
                    .remove(&id)
                    .map(|(at, skip)| (id, at, skip))
            })
            .collect();
        let mut targets: Vec<NodeId> = self.push.out.clone();
        for (n, _) in &self.push.inn {
            if !targets.contains(n) {
                targets.push(*n);
            }
        }
        for t in targets {
            let t_short = short(&t);
            let list: Vec<(Short, u64)> = items
                .iter()
                .filter(|(id, _, skip)| !skip.contains(&t_short) && *id != t)
                .map(|(id, at, _)| (short(id), *at))
                .collect();
            if !list.is_empty() && self.request_to(&t, Msg::Inv(list), Purpose::Inv(t), now) {
                self.stats.pushes += 1;
            }
        }
    }

    /// Drops neighbours no longer healthy, replaces one every interval, fills up to
    /// `fanout` from reached peers at random.
    fn keep_neighbours(&mut self, now: Now) {
        let view = &self.view;
        self.push
            .out
            .retain(|n| view.get(n).is_some_and(|e| e.healthy()));
        if self.push.next_rotate.is_none_or(|t| now.at >= t) {
            self.push.next_rotate = Some(now.at + self.cfg.interval);
            if self.push.out.len() >= self.cfg.fanout && !self.push.out.is_empty() {
                self.push.out.remove(0);
            }
        }
        for _ in 0..self.cfg.fanout * 2 {
            if self.push.out.len() >= self.cfg.fanout {
                break;
            }
            let Some(s) = self.random_reached() else {
                break;
            };
            if !self.push.out.contains(&s.d.node_id) {
                self.push.out.push(s.d.node_id);
            }
        }
    }
}
