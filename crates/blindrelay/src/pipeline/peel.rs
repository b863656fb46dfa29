//! The layer peeled and its expiry checked (design step 5: the envelope's metadata). Its size
//! is checked with the framing (on the way in, before: a v2 frame has exactly its class's length); its age and future skew are sealed by
//! the sender inside this node's layer, so the layer is opened here with this node's onion keys
//! (peeled in place, the same length out as in) and its expiry checked.
//!
//! A layer past its expiry is `timestamp_expired`, one dated too far ahead
//! `timestamp_in_future`: the sender sealed both inside the layer, so neither is blamed on the
//! previous hop, which cannot read the expiry. A layer that does not open is
//! `onion_peel_failed`.

use x25519_dalek::StaticSecret;

use crate::proto::sphinx::{self, ReplayTag, Slot};
use crate::reason::Reason;

/// This node's layer, opened and fresh.
#[derive(Debug)]
pub struct Opened {
    /// The layer's replay tag.
    pub tag: ReplayTag,
    /// The layer's failure report key.
    pub report_key: [u8; 32],
    /// The layer's expiry (Unix seconds).
    pub expires_at: u64,
    /// What the layer tells this node to do.
    pub slot: Slot,
}

/// Opens this node's layer of `packet` in place with `secrets` (current onion key first) and
/// checks its expiry at `now`.
///
/// # Errors
/// `onion_peel_failed`, `timestamp_expired` or `timestamp_in_future`.
pub fn open(secrets: &[&StaticSecret], packet: &mut [u8], now: u64) -> Result<Opened, Reason> {
    let peeled = sphinx::peel_in_place(secrets, packet).map_err(|_| Reason::OnionPeelFailed)?;
    let expires_at = match peeled.slot {
        Slot::Forward { expires_at, .. } | Slot::Terminal { expires_at, .. } => expires_at,
    };
    if !sphinx::expiry_acceptable(expires_at, now) {
        return Err(if expires_at < now {
            Reason::TimestampExpired
        } else {
            Reason::TimestampInFuture
        });
    }
    Ok(Opened {
        tag: peeled.replay_tag,
        report_key: peeled.report_key,
        expires_at,
        slot: peeled.slot,
    })
}
