//! The terminal hop: what this node does with a layer addressed to it as the last hop.
//!
//! 1. [`seal_receipt`], CPU work done while the pipeline holds its crypto slot: the receipt
//!    (this hop's route id, the payload commitment, this node's id, the time) signed by this
//!    node and sealed to the sender with the route's receipt key;
//! 2. [`Terminal::deliver`], disk work done with no crypto slot held: the payload committed to
//!    the [`Inbox`] (SQLite, `synchronous=FULL`), on a blocking thread. Only then is the sealed
//!    receipt released in the answer; a payload that is not stored gets no receipt.
//!
//! A synthetic probe (its payload starts with [`crate::proto::probe::PROBE_MAGIC`]) is
//! answered the same way but not stored.

mod inbox;

use std::sync::Arc;

use ed25519_dalek::SigningKey;
pub use inbox::{INBOX_MAX_BYTES, INBOX_MAX_ITEMS, Inbox, InboxError, InboxItem};

use crate::proto::RouteId;
use crate::proto::receipt::{self, Receipt};

/// The delivery receipt for `payload` at `now`, signed with `key` and sealed with the sender's
/// `receipt_key`, as the hex the answer carries.
pub fn seal_receipt(
    key: &SigningKey,
    route_id: &RouteId,
    receipt_key: &[u8; 32],
    payload: &[u8],
    now: u64,
) -> String {
    let r = Receipt::sign(*route_id, receipt::commitment(payload), key, now);
    hex::encode(receipt::seal(&r, receipt_key))
}

/// The terminal's store.
#[derive(Debug, Clone)]
pub struct Terminal {
    inbox: Arc<Inbox>,
}

impl Terminal {
    /// A terminal storing into `inbox`.
    pub fn new(inbox: Arc<Inbox>) -> Self {
        Terminal { inbox }
    }

    /// The inbox.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Commits `payload` to the inbox on a blocking thread; returns once it is on disk.
    ///
    /// # Errors
    /// The inbox is full or cannot be written (or the blocking task died): nothing is stored.
    pub async fn deliver(&self, payload: Vec<u8>, now: u64) -> Result<u64, InboxError> {
        let inbox = Arc::clone(&self.inbox);
        tokio::task::spawn_blocking(move || inbox.store(&payload, now))
            .await
            .unwrap_or(Err(InboxError::Interrupted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sealed_receipt_opens_and_verifies_for_the_sender_only() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let (route, rk, now) = ([4u8; 16], [5u8; 32], 1_800_000_000);
        let sealed = hex::decode(seal_receipt(&key, &route, &rk, b"payload", now)).unwrap();
        let r = receipt::open(&sealed, &rk).unwrap();
        let terminal = key.verifying_key().to_bytes();
        r.verify(&route, &receipt::commitment(b"payload"), &terminal, now)
            .unwrap();
        assert!(receipt::open(&sealed, &[6; 32]).is_err());
    }
}
