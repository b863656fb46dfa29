//! Answering requests: what a peer asks of this node, and what a stranger may introduce.

use std::sync::Arc;

use super::{
    Caller, Discovery, Msg, Now, STRANGER_BLOCKS, STRANGER_BURST, STRANGER_EVERY,
    STRANGER_GROUPING, Signed, Source, push, sync, wire,
};
use crate::blocks::block_key;
use crate::proto::NodeId;

impl Discovery {
    /// Answers a request: `msg` from `caller`, its descriptors that verified in `checked`.
    pub fn on_request(
        &mut self,
        caller: Caller,
        msg: &Msg,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) -> Msg {
        self.stats.count(msg, false);
        let reply = match msg {
            Msg::Sync { own, round } => {
                self.learn_own(&caller, checked, now);
                let round = if round.is_empty() {
                    Vec::new()
                } else {
                    sync::respond(&mut self.view, round)
                };
                Msg::SyncReply {
                    own: own.as_ref().and(self.own.as_ref().map(|o| o.d.clone())),
                    round,
                }
            }
            Msg::Hello { have, .. } => {
                self.learn_own(&caller, checked, now);
                let own = self.own.as_ref().filter(|o| o.d.issued_at > *have);
                let have = caller
                    .id
                    .and_then(|id| self.view.get(&id))
                    .map_or(0, |e| e.s.d.issued_at);
                Msg::Hello {
                    own: own.map(|o| o.d.clone()),
                    have,
                }
            }
            Msg::Get(ids) => Msg::Descriptors(sync::serve(&self.view, ids)),
            Msg::Inv(items) => match self.reached_caller(&caller) {
                Some(peer) => {
                    self.vouched(peer, items);
                    let want = self.push.on_inv(&self.view, peer, items, &self.cfg, now);
                    if want.is_none() {
                        self.stats.turned_away += 1;
                    }
                    Msg::Want(want.unwrap_or_default())
                }
                None => {
                    self.stats.turned_away += 1;
                    Msg::Want(Vec::new())
                }
            },
            Msg::Descriptors(ds) => {
                let bytes = ds.iter().map(wire::descriptor_len).sum();
                match self.reached_caller(&caller) {
                    Some(peer) if self.push.charge(peer, bytes, now) => {
                        for s in checked {
                            self.push.arrived(&s.d.node_id);
                            let _ = self.learn(s, Source::Peer(peer), now);
                        }
                    }
                    _ => self.stats.turned_away += 1,
                }
                Msg::Ack
            }
            Msg::SyncReply { .. } | Msg::Want(_) | Msg::Ack => Msg::Ack,
        };
        self.stats.count(&reply, true);
        reply
    }

    /// A peer this node reached, named by the caller's link.
    fn reached_caller(&self, caller: &Caller) -> Option<NodeId> {
        let id = caller.id?;
        self.view
            .get(&id)
            .filter(|e| e.reached().is_some())
            .map(|_| id)
    }

    /// The caller's own descriptor, if among `checked`: a held identity's refresh, or a
    /// stranger introduced within its block's budget.
    fn learn_own(&mut self, caller: &Caller, checked: Vec<Arc<Signed>>, now: Now) {
        let Some(id) = caller.id else {
            return;
        };
        let Some(s) = checked.into_iter().find(|s| s.d.node_id == id) else {
            return;
        };
        if self.view.get(&id).is_some() {
            let _ = self.learn(s, Source::Peer(id), now);
            return;
        }
        let block = block_key(caller.ip, STRANGER_GROUPING);
        if self.stranger_allowed(block, now) {
            let _ = self.learn(s, Source::Stranger(block), now);
        } else {
            self.stats.turned_away += 1;
        }
    }

    /// Charges one introduction to the strangers of `block` (a token bucket).
    fn stranger_allowed(&mut self, block: u64, now: Now) -> bool {
        if !self.strangers.contains_key(&block) && self.strangers.len() >= STRANGER_BLOCKS {
            return false;
        }
        let full_at = self.strangers.entry(block).or_insert(now.at);
        let start = (*full_at).max(now.at);
        if start.saturating_duration_since(now.at) > STRANGER_EVERY * (STRANGER_BURST - 1) {
            return false;
        }
        *full_at = start + STRANGER_EVERY;
        true
    }

    /// A reached `peer` passes on identities this node holds from strangers only, not reached
    /// yet: they are probed with what peers bring, ahead of the strangers' queue.
    fn vouched(&mut self, peer: NodeId, items: &[(wire::Short, u64)]) {
        for (s, _) in items.iter().take(push::MAX_INV) {
            let waiting: Vec<Arc<Signed>> = self
                .view
                .by_short(s)
                .filter(|e| e.reached().is_none())
                .filter(|e| self.view.origin(e).is_stranger())
                .map(|e| Arc::clone(&e.s))
                .collect();
            for w in waiting {
                self.probes.promote(&w, peer);
            }
        }
    }
}
