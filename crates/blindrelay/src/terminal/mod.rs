//! The terminal hop: what this node does with a layer addressed to it as the last hop.
//!
//! 1. [`seal_receipt`], CPU work done while the pipeline holds its crypto slot: the receipt
//!    (the sender's message id from the layer's slot, the payload commitment, this node's id,
//!    the time) signed by this node and sealed to the sender with the receipt key from the
//!    layer's slot;
//! 2. [`Terminal::store`], disk work done with no crypto slot held: the payload committed to
//!    the [`Inbox`] (SQLite, `synchronous=FULL`), on a blocking thread. Only then is the sealed
//!    receipt released in the answer; a payload that is not stored gets no receipt.
//!
//! A message is stored once ([`Stored::Duplicate`]): a copy the sender sent again over another
//! route, with the same message id, stores nothing and is answered with the first copy's
//! receipt (its commitment and time, signed again and sealed with this copy's receipt key:
//! [`reseal_receipt`]), so the sender verifies the delivery whichever copy's answer reaches it.
//!
//! A synthetic probe (the probe flag of its terminal slot, [`crate::proto::sphinx::Slot`]; never
//! its payload) is answered the same way but not stored.
//!
//! The inbox drains: the operator deletes or takes items (`DELETE /v1/inbox/{id}`), and items
//! older than the retention period are deleted. One source (`crate::sources`) may hold at most
//! [`INBOX_SOURCE_SHARE_PERCENT`] of its items and bytes, so one party cannot fill it.

mod inbox;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ed25519_dalek::SigningKey;
pub use inbox::{
    BATCH_BYTES, BATCH_ITEMS, DEDUP_SECS, INBOX_MAX_BYTES, INBOX_MAX_ITEMS, Inbox, InboxError,
    InboxItem, MAX_DELIVERED, Once, Stored,
};

use crate::proto::MessageId;
use crate::proto::receipt::{self, Receipt};
use crate::sources::SourceKey;

/// The delivery receipt for `payload` at `now`, naming the sender's `message_id`, signed with
/// `key` and sealed with the sender's `receipt_key`, as the hex the answer carries.
pub fn seal_receipt(
    key: &SigningKey,
    message_id: &MessageId,
    receipt_key: &[u8; 32],
    payload: &[u8],
    now: u64,
) -> String {
    reseal_receipt(
        key,
        message_id,
        receipt_key,
        &receipt::commitment(payload),
        now,
    )
}

/// The receipt of a message delivered at `delivered_at` with `commitment` (the first copy's,
/// for a copy sent again), signed with `key` and sealed with this copy's `receipt_key`.
pub fn reseal_receipt(
    key: &SigningKey,
    message_id: &MessageId,
    receipt_key: &[u8; 32],
    commitment: &[u8; 32],
    delivered_at: u64,
) -> String {
    let r = Receipt::sign(*message_id, *commitment, key, delivered_at);
    hex::encode(receipt::seal(&r, receipt_key))
}

/// Of the inbox (items and bytes), what one source may hold by default (percent).
pub const INBOX_SOURCE_SHARE_PERCENT: u8 = 25;
/// Delivered items are deleted after this long by default (`--inbox-retention`).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Items deleted at most per retention round.
pub const RETENTION_BATCH: usize = 1000;

/// Why a payload was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undelivered {
    /// The inbox holds its most items or bytes.
    Full,
    /// The source holds its share of the inbox.
    ShareExceeded,
    /// The inbox could not be written.
    Failed,
}

/// Items and bytes held per source (memory only: items stored before a restart count against
/// the inbox's total and no source's share). No address is ever kept: keys are
/// [`SourceKey`]s, and nothing here is printed.
#[derive(Debug, Default)]
struct Shares {
    per: HashMap<SourceKey, (usize, u64)>,
    owner: HashMap<u64, (SourceKey, u64)>,
}

impl Shares {
    fn release(&mut self, id: u64) {
        if let Some((key, size)) = self.owner.remove(&id) {
            self.unreserve(key, size);
        }
    }

    fn unreserve(&mut self, key: SourceKey, size: u64) {
        if let Some((items, bytes)) = self.per.get_mut(&key) {
            *items = items.saturating_sub(1);
            *bytes = bytes.saturating_sub(size);
            if *items == 0 {
                self.per.remove(&key);
            }
        }
    }
}

/// The terminal's store: the inbox and each source's share of it.
#[derive(Debug, Clone)]
pub struct Terminal {
    inbox: Arc<Inbox>,
    share_percent: u8,
    shares: Arc<Mutex<Shares>>,
}

impl Terminal {
    /// A terminal storing into `inbox`; one source may hold `share_percent` of it.
    pub fn new(inbox: Arc<Inbox>, share_percent: u8) -> Self {
        Terminal {
            inbox,
            share_percent: share_percent.clamp(1, 100),
            shares: Arc::new(Mutex::new(Shares::default())),
        }
    }

    /// The inbox.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    fn shares(&self) -> MutexGuard<'_, Shares> {
        self.shares.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits `payload` from `source` to the inbox on a blocking thread; returns once it is on
    /// disk.
    ///
    /// # Errors
    /// [`Undelivered`]: nothing is stored.
    pub async fn deliver(
        &self,
        payload: Vec<u8>,
        now: u64,
        source: SourceKey,
    ) -> Result<u64, Undelivered> {
        let terminal = self.clone();
        let stored =
            tokio::task::spawn_blocking(move || terminal.store(&payload, None, now, source))
                .await
                .unwrap_or(Err(Undelivered::Failed))?;
        match stored {
            Stored::New(id) => Ok(id),
            Stored::Duplicate { .. } => Err(Undelivered::Failed),
        }
    }

    /// Commits `payload` from `source` to the inbox, once per message when `once` names it, and
    /// returns once it is on disk (blocking: call off the reactor). A copy of a message stored
    /// before takes no room and no share.
    ///
    /// # Errors
    /// [`Undelivered`]: nothing is stored.
    pub fn store(
        &self,
        payload: &[u8],
        once: Option<Once>,
        now: u64,
        source: SourceKey,
    ) -> Result<Stored, Undelivered> {
        let size = payload.len() as u64;
        let (max_items, max_bytes) = self.inbox.limits();
        let pct = u64::from(self.share_percent);
        let (share_items, share_bytes) = (
            (max_items as u64 * pct / 100).max(1) as usize,
            max_bytes * pct / 100,
        );
        {
            // Taken before the write, given back if it fails: concurrent deliveries from one
            // source cannot pass the share together.
            let mut shares = self.shares();
            let (items, bytes) = shares.per.entry(source).or_insert((0, 0));
            if *items >= share_items || *bytes + size > share_bytes {
                if *items == 0 {
                    shares.per.remove(&source);
                }
                return Err(Undelivered::ShareExceeded);
            }
            *items += 1;
            *bytes += size;
        }
        let stored = catch_unwind(AssertUnwindSafe(|| {
            self.inbox.store_once(payload, now, once)
        }))
        .unwrap_or(Err(InboxError::Interrupted));
        let mut shares = self.shares();
        match stored {
            Ok(Stored::New(id)) => {
                shares.owner.insert(id, (source, size));
                Ok(Stored::New(id))
            }
            Ok(duplicate) => {
                shares.unreserve(source, size);
                Ok(duplicate)
            }
            Err(e) => {
                shares.unreserve(source, size);
                Err(match e {
                    InboxError::Full => Undelivered::Full,
                    _ => Undelivered::Failed,
                })
            }
        }
    }

    /// Deletes item `id` (blocking: call off the reactor); its size, `None` if there was none.
    ///
    /// # Errors
    /// The inbox could not be written.
    pub fn remove(&self, id: u64) -> Result<Option<u64>, InboxError> {
        let removed = self.inbox.remove(id)?;
        if removed.is_some() {
            self.shares().release(id);
        }
        Ok(removed)
    }

    /// Deletes the items received before `cutoff` (blocking), a batch at a time; how many.
    ///
    /// # Errors
    /// The inbox could not be written.
    pub fn expire(&self, cutoff: u64) -> Result<usize, InboxError> {
        let mut total = 0;
        loop {
            let removed = self.inbox.expire(cutoff, RETENTION_BATCH)?;
            let mut shares = self.shares();
            for (id, _) in &removed {
                shares.release(*id);
            }
            total += removed.len();
            if removed.len() < RETENTION_BATCH {
                return Ok(total);
            }
        }
    }

    /// Sources holding a share of the inbox now (a count).
    pub fn sources(&self) -> usize {
        self.shares().per.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> SourceKey {
        SourceKey::Net(std::net::IpAddr::from([10, 0, i, 0]))
    }

    #[tokio::test]
    async fn one_source_cannot_fill_the_inbox_and_room_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open_with_limits(&dir.path().join("inbox.db"), 8, 1000).unwrap();
        let t = Terminal::new(Arc::new(inbox), 25);
        let a = t.deliver(b"a1".to_vec(), 1, key(1)).await.unwrap();
        t.deliver(b"a2".to_vec(), 1, key(1)).await.unwrap();
        assert_eq!(
            t.deliver(b"a3".to_vec(), 1, key(1)).await,
            Err(Undelivered::ShareExceeded)
        );
        for i in 2..=4 {
            for _ in 0..2 {
                t.deliver(b"x".to_vec(), 1, key(i)).await.unwrap();
            }
        }
        assert_eq!(
            t.deliver(b"y".to_vec(), 1, key(5)).await,
            Err(Undelivered::Full)
        );
        assert_eq!(t.remove(a).unwrap(), Some(2));
        assert!(t.deliver(b"a3".to_vec(), 2, key(1)).await.is_ok());
        assert_eq!(t.expire(2).unwrap(), 7);
        assert_eq!((t.inbox().len(), t.sources()), (1, 1));
    }

    #[test]
    fn a_message_is_stored_once_and_its_copies_take_no_room() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open_with_limits(&path, 8, 1000).unwrap();
        let t = Terminal::new(Arc::new(inbox), 25);
        let once = |id: u8| Once {
            message_id: [id; 16],
            commitment: receipt::commitment(&[id]),
        };
        let first = t.store(b"m", Some(once(1)), 10, key(1)).unwrap();
        assert!(matches!(first, Stored::New(_)));
        // The same message over another route, from another source, later: stored once.
        for (at, source) in [(11, 2), (12, 1), (13, 3)] {
            assert_eq!(
                t.store(b"m", Some(once(1)), at, key(source)).unwrap(),
                Stored::Duplicate {
                    delivered_at: 10,
                    commitment: once(1).commitment
                }
            );
        }
        assert_eq!((t.inbox().len(), t.sources()), (1, 1));
        // Another message of the same source, and the same message after a reopen.
        assert!(matches!(
            t.store(b"n", Some(once(2)), 14, key(1)).unwrap(),
            Stored::New(_)
        ));
        drop(t);
        let t = Terminal::new(Arc::new(Inbox::open(&path).unwrap()), 25);
        assert!(matches!(
            t.store(b"m", Some(once(1)), 20, key(1)).unwrap(),
            Stored::Duplicate {
                delivered_at: 10,
                ..
            }
        ));
        // Taken from the inbox, still known while a copy could still come.
        let id = t.inbox().list().unwrap()[0].id;
        t.remove(id).unwrap();
        assert!(matches!(
            t.store(b"m", Some(once(1)), 30, key(1)).unwrap(),
            Stored::Duplicate { .. }
        ));
        // Forgotten once no copy can be accepted any more.
        assert!(matches!(
            t.store(b"m", Some(once(1)), 10 + DEDUP_SECS, key(1))
                .unwrap(),
            Stored::Duplicate { .. }
        ));
        assert!(matches!(
            t.store(b"m", Some(once(1)), 11 + DEDUP_SECS, key(1))
                .unwrap(),
            Stored::New(_)
        ));
    }

    #[test]
    fn the_sealed_receipt_opens_and_verifies_for_the_sender_only() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let (message, rk, now) = ([4u8; 16], [5u8; 32], 1_800_000_000);
        let sealed = hex::decode(seal_receipt(&key, &message, &rk, b"payload", now)).unwrap();
        let r = receipt::open(&sealed, &rk).unwrap();
        let terminal = key.verifying_key().to_bytes();
        r.verify(&message, &receipt::commitment(b"payload"), &terminal, now)
            .unwrap();
        assert!(receipt::open(&sealed, &[6; 32]).is_err());
    }
}
