//! What the view keeps of one identity: an [`Entry`] of 32 bytes pointing to the shared
//! descriptor, and the compact [`Origin`] of who introduced it.

use std::sync::Arc;

use super::wire::short;
use super::{Signed, Source};
use crate::proto::NodeId;

/// What the view knows of one identity (32 bytes).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its newest verified descriptor.
    pub s: Arc<Signed>,
    /// Its root: the /16 (/32) of the first-hand source it came through, as a block key.
    pub(super) root: u32,
    pub(super) first_seen: u32,
    /// When this node last reached it (0: never).
    pub(super) reached: u32,
    pub(super) origin: Origin,
    pub(super) failures: u8,
    pub(super) confirmed: bool,
}

/// A source as an entry keeps it, in 8 bytes: its kind in the top two bits, then 62 bits of
/// its key (a peer's id prefix, a stranger's block key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin(u64);

const KIND_SHIFT: u32 = 62;

impl Origin {
    /// The operator's `--peer`s and seeds.
    pub const OPERATOR: Origin = Origin(0);
    /// The peer store.
    pub const STORE: Origin = Origin(1 << KIND_SHIFT);

    fn new(kind: u64, key: u64) -> Origin {
        Origin((kind << KIND_SHIFT) | (key & ((1 << KIND_SHIFT) - 1)))
    }

    fn kind(self) -> u64 {
        self.0 >> KIND_SHIFT
    }

    /// The operator's.
    pub fn is_operator(self) -> bool {
        self.kind() == 0
    }

    /// A stranger's own.
    pub fn is_stranger(self) -> bool {
        self.kind() == 3
    }

    /// Brought by a reached peer, or the peer store (may take a block's junk's place).
    pub fn may_evict(self) -> bool {
        matches!(self.kind(), 1 | 2)
    }

    /// The probe class: the operator's and the store's, peers', strangers'.
    pub fn class(self) -> usize {
        match self.kind() {
            0 | 1 => 0,
            2 => 1,
            _ => 2,
        }
    }
}

impl From<Source> for Origin {
    fn from(s: Source) -> Origin {
        match s {
            Source::Operator => Origin::OPERATOR,
            Source::Store => Origin::STORE,
            Source::Peer(id) => Origin::new(2, u64::from_be_bytes(short(&id))),
            Source::Stranger(b) => Origin::new(3, b),
        }
    }
}

/// Unix seconds as an entry keeps them (to 2106).
pub(super) fn secs(t: u64) -> u32 {
    u32::try_from(t).unwrap_or(u32::MAX)
}

impl Entry {
    /// Its node id.
    pub fn id(&self) -> &NodeId {
        &self.s.d.node_id
    }

    /// When this node first kept it (Unix seconds; kept across restarts by the peer store).
    pub fn first_seen(&self) -> u64 {
        u64::from(self.first_seen)
    }

    /// When this node last reached it at its endpoint.
    pub fn reached(&self) -> Option<u64> {
        (self.reached > 0).then_some(u64::from(self.reached))
    }

    /// Contacts that failed since the last success.
    pub fn failures(&self) -> u8 {
        self.failures
    }

    /// Reached once and not failing now.
    pub fn healthy(&self) -> bool {
        self.reached > 0 && self.failures == 0
    }

    /// Vouched for by two independent sources (see `super::eclipse`).
    pub fn confirmed(&self) -> bool {
        self.confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_32_bytes_and_an_origin_keeps_its_kind() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        let peer = Origin::from(Source::Peer([0xff; 32]));
        let stranger = Origin::from(Source::Stranger(u64::MAX));
        assert_eq!(peer.class(), 1);
        assert!(peer.may_evict() && !peer.is_stranger() && !peer.is_operator());
        assert!(stranger.is_stranger() && !stranger.may_evict());
        assert_ne!(peer, stranger);
        assert!(Origin::OPERATOR.is_operator() && Origin::STORE.may_evict());
    }
}
