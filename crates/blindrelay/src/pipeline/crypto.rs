//! Crypto admission (design step 2), the first stage of an admitted request: a free slot of the
//! shared crypto gate for the onion layer, taken at once or refused at once (`backpressure`), as the design says:
//! an inbound request never waits in a queue for CPU. Inbound requests may take every slot but
//! one, so the node's own route building and receipt checking always find one
//! ([`crate::context`]).
//!
//! **Strangers' share.** Requests from unknown sources ([`crate::sources`]: not a known peer's
//! address, not a recently verified previous hop) may hold at most all inbound slots but one
//! together ([`Strangers`]), and one unknown source (its /24 or /56) at most half of that,
//! rounded up. A stranger over either bound is refused at once with `source_limited`: the
//! node is not out of CPU, the strangers' share is. So junk that passes the framing and fails
//! the signature (it costs a signature check, ≈ 40 µs, to find out) cannot take the slot known
//! peers' traffic relies on, nor make the node report `attention` (which means "this node needs
//! more CPU"); with 4 slots, strangers share 2, one stranger holds 1.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use guard::admission::{Gate, Permit};

use crate::context::{Context, CryptoSlot};
use crate::reason::Reason;
use crate::sources::SourceKey;

/// The crypto slots unknown sources hold: in all, and per source (module docs).
#[derive(Debug)]
pub struct Strangers {
    all: Gate,
    per_source: usize,
    /// Slots held per unknown source; an entry only while it holds one, so at most `all`'s
    /// limit entries.
    held: Mutex<HashMap<SourceKey, usize>>,
}

/// A stranger's hold on its share, given back on drop.
#[derive(Debug)]
pub struct StrangerSlot {
    _all: Permit,
    key: SourceKey,
    strangers: Arc<Strangers>,
}

/// How `crypto_slots` slots are shared among inbound requests (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Slots inbound requests may hold together: all but one.
    pub inbound: usize,
    /// Of those, slots unknown sources may hold together: all inbound slots but one, at least
    /// one.
    pub strangers: usize,
    /// Slots one unknown source may hold: half the strangers' share, rounded up.
    pub per_stranger: usize,
}

impl Shares {
    /// The shares of `crypto_slots` slots.
    pub fn of(crypto_slots: usize) -> Shares {
        let strangers = crypto_slots.saturating_sub(2).max(1);
        Shares {
            inbound: crypto_slots.saturating_sub(1),
            strangers,
            per_stranger: strangers.div_ceil(2),
        }
    }
}

impl Strangers {
    /// The strangers' share of `crypto_slots` slots ([`Shares::of`]).
    pub fn new(crypto_slots: usize) -> Arc<Self> {
        let share = Shares::of(crypto_slots);
        Arc::new(Strangers {
            all: Gate::new(share.strangers),
            per_source: share.per_stranger,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Slots the strangers hold now.
    pub fn in_use(&self) -> usize {
        self.all.in_use()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<SourceKey, usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of the strangers' share for `key`, if neither the share nor `key`'s part of it
    /// is taken. Never waits.
    pub fn take(self: &Arc<Self>, key: SourceKey) -> Option<StrangerSlot> {
        let mut held = self.held();
        let n = held.get(&key).copied().unwrap_or(0);
        if n >= self.per_source {
            return None;
        }
        let permit = self.all.try_acquire()?;
        held.insert(key, n + 1);
        Some(StrangerSlot {
            _all: permit,
            key,
            strangers: Arc::clone(self),
        })
    }
}

impl Drop for StrangerSlot {
    fn drop(&mut self) {
        let mut held = self.strangers.held();
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// A crypto slot for an inbound request from `source`, and its hold on the strangers' share if
/// `source` is unknown; both given back when the crypto work ends. Never waits.
///
/// # Errors
/// `source_limited` when `source` is unknown and the strangers' share (or `source`'s part of
/// it) is taken; `backpressure` when every inbound slot is taken.
pub(super) fn admit(
    ctx: &Context,
    strangers: &Arc<Strangers>,
    source: SourceKey,
) -> Result<(CryptoSlot, Option<StrangerSlot>), Reason> {
    let share = if source.is_known() {
        None
    } else {
        Some(strangers.take(source).ok_or(Reason::SourceLimited)?)
    };
    let slot = ctx
        .crypto
        .try_slot(Shares::of(ctx.crypto.limit()).inbound)
        .ok_or(Reason::Backpressure)?;
    Ok((slot, share))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    fn net(i: u8) -> SourceKey {
        SourceKey::Net(IpAddr::V4(Ipv4Addr::new(10, 0, i, 0)))
    }

    #[test]
    fn strangers_share_all_inbound_slots_but_one_and_one_stranger_half_of_that() {
        let s = Strangers::new(4);
        let a = s.take(net(1)).expect("a first stranger");
        assert!(s.take(net(1)).is_none(), "one stranger holds one of two");
        let b = s.take(net(2)).expect("a second stranger");
        assert!(s.take(net(3)).is_none(), "the share is two");
        assert_eq!(s.in_use(), 2);
        drop(a);
        let c = s.take(net(1)).expect("given back on drop");
        drop((b, c));
        assert_eq!(s.in_use(), 0);
        assert!(
            s.held().is_empty(),
            "no entry left for a source holding nothing"
        );

        let s = Strangers::new(8);
        let held: Vec<_> = (0..3).map(|_| s.take(net(1)).unwrap()).collect();
        assert!(s.take(net(1)).is_none(), "half of six, rounded up");
        let more: Vec<_> = (0..3).map(|_| s.take(net(2)).unwrap()).collect();
        assert!(s.take(net(3)).is_none(), "six in all");
        drop((held, more));
        assert_eq!(Strangers::new(2).all.limit(), 1, "at least one");
    }
}
