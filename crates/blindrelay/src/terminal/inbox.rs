//! The terminal's durable inbox: payloads delivered to this node, committed to SQLite before
//! the delivery receipt is released. Every call may block on the disk.
//!
//! Stores are group-committed (`crate::sqlite::group_commit`): the payloads waiting at the
//! moment one caller (the leader) starts a transaction go in it together (at most
//! [`BATCH_ITEMS`] items and [`BATCH_BYTES`] bytes), one fsync for all; the others wait for it.
//! A store returns its id only once its own transaction has committed; if a batch fails, every
//! member fails and stores nothing. A store alone commits at once.
//!
//! **Once per message**: a message carries its sender's message id (sealed in the terminal's
//! layer, the same on every route the sender tries). The id, the payload's commitment and the
//! delivery time go in the `delivered` table in the same transaction as the item; a second copy
//! of the message, over another route, finds its id there and stores nothing
//! ([`Stored::Duplicate`]: the terminal answers it with the first copy's receipt). An id is kept
//! [`DEDUP_SECS`] (the longest any copy of the message can still be accepted by a hop), and at
//! most [`MAX_DELIVERED`] ids are kept (the oldest go first), whether or not the item was taken
//! from the inbox since.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, params};

use crate::sqlite::group_commit::{Failed, GroupCommit, Limits};
use crate::sqlite::{self, SqliteContext, StoreError, sql_time};

/// Items an inbox holds at most.
pub const INBOX_MAX_ITEMS: usize = 10_000;
/// Payload bytes an inbox holds at most (256 MiB).
pub const INBOX_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// How long a delivered message's id is kept: a copy sent again over another route carries
/// layers that expire at most [`crate::forward::SEND_DEADLINE`] after the first copy's plus the
/// layer lifetime, and a hop accepts a layer until [`crate::proto::sphinx::EXPIRY_SKEW`] past
/// its expiry.
pub const DEDUP_SECS: u64 = crate::proto::sphinx::MAX_LIFETIME
    + crate::proto::sphinx::EXPIRY_SKEW
    + crate::forward::SEND_DEADLINE.as_secs();
/// Delivered message ids kept at most (about 1.5 MB on disk): more than the request gate's
/// default admission rate lets in within [`DEDUP_SECS`].
pub const MAX_DELIVERED: usize = 20_000;

/// Payloads one group commit holds at most.
pub const BATCH_ITEMS: usize = 256;
/// Payload bytes one group commit holds at most (a larger single payload still goes alone).
pub const BATCH_BYTES: usize = 4 << 20;

const TABLE: &str = "inbox_items";
/// The `application_id` of an inbox file ("BRIN").
const APPLICATION_ID: i32 = 0x4252_494e;

const LIMITS: Limits = Limits {
    writes: BATCH_ITEMS,
    bytes: BATCH_BYTES,
};

/// Why the inbox did not store or read.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The SQLite file.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The inbox holds its maximum number of items or bytes; nothing was stored.
    #[error("the inbox is full")]
    Full,
    /// The blocking task running the call did not finish (it panicked); nothing is known to be
    /// stored.
    #[error("the inbox call was interrupted")]
    Interrupted,
    /// The group commit this store was part of failed (or its thread panicked: no source);
    /// nothing of the batch is stored.
    #[error("inbox group commit failed")]
    GroupCommit(#[source] Option<Arc<StoreError>>),
}

/// One stored payload, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InboxItem {
    /// Assigned by [`Inbox::store`], increasing, never reused.
    pub id: u64,
    /// As given to [`Inbox::store`] (Unix seconds).
    pub received_at: u64,
    /// Payload length in bytes.
    pub size: usize,
}

/// What makes a stored payload a message stored once: its sender's id and its commitment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Once {
    /// The sender's message id (from the terminal slot).
    pub message_id: crate::proto::MessageId,
    /// The payload's commitment, which the receipt names.
    pub commitment: [u8; 32],
}

/// Never prints the id.
impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once").finish_non_exhaustive()
    }
}

/// What a store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored under this id.
    New(u64),
    /// A copy of a message stored before: nothing stored; when, and the commitment, of the first.
    Duplicate {
        /// When the first copy was stored (Unix seconds).
        delivered_at: u64,
        /// The first copy's commitment.
        commitment: [u8; 32],
    },
}

/// A store waiting for its group commit.
struct Pending {
    received_at: i64,
    size: i64,
    payload: Vec<u8>,
    once: Option<Once>,
}

/// The counts (a lock apart from the connection's and the group commit's, so stores can take
/// their room while a batch commits).
struct State {
    /// Items and payload bytes stored or waiting for their commit.
    items: usize,
    bytes: u64,
}

/// The terminal's inbox in its own SQLite file. `Send + Sync`; SQLite calls are serialized by
/// an internal mutex and block while SQLite works.
pub struct Inbox {
    path: PathBuf,
    max_items: usize,
    max_bytes: u64,
    /// The connection, and the stores waiting for their commit.
    writer: GroupCommit<Connection, Pending, Stored, StoreError>,
    state: Mutex<State>,
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("path", &self.path)
            .field("max_items", &self.max_items)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// Opens (or creates) the inbox at `path`, capped at [`INBOX_MAX_ITEMS`] items and
    /// [`INBOX_MAX_BYTES`] payload bytes.
    pub fn open(path: &Path) -> Result<Self, InboxError> {
        Self::open_with_limits(path, INBOX_MAX_ITEMS, INBOX_MAX_BYTES)
    }

    /// [`Inbox::open`] with other caps.
    pub fn open_with_limits(
        path: &Path,
        max_items: usize,
        max_bytes: u64,
    ) -> Result<Self, InboxError> {
        let conn = sqlite::open_durable(path)?;
        sqlite::claim(&conn, APPLICATION_ID, TABLE, "an inbox")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS inbox_items (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                received_at INTEGER NOT NULL,
                size INTEGER NOT NULL,
                payload BLOB NOT NULL,
                CHECK (size = length(payload))
            );
            CREATE TABLE IF NOT EXISTS delivered (
                message_id BLOB PRIMARY KEY,
                commitment BLOB NOT NULL,
                delivered_at INTEGER NOT NULL
            ) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS delivered_by_time ON delivered (delivered_at);",
        )
        .ctx("create the inbox_items table")?;
        sqlite::settle(&conn)?;
        let (items, bytes): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inbox_items",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .ctx("count inbox items")?;
        let corrupt = |what| StoreError::Corrupt { table: TABLE, what };
        let items = usize::try_from(items).map_err(|_| corrupt("item count"))?;
        let bytes = u64::try_from(bytes).map_err(|_| corrupt("total size"))?;
        tracing::info!(items, bytes, "inbox opened");
        Ok(Self {
            path: path.to_path_buf(),
            max_items,
            max_bytes,
            writer: GroupCommit::new(conn, LIMITS),
            state: Mutex::new(State { items, bytes }),
        })
    }

    /// Stores `payload` and returns its id once the row is committed to disk. Fails with
    /// [`InboxError::Full`], storing nothing, when the item or byte cap would be exceeded.
    pub fn store(&self, payload: &[u8], received_at: u64) -> Result<u64, InboxError> {
        match self.store_once(payload, received_at, None)? {
            Stored::New(id) => Ok(id),
            Stored::Duplicate { .. } => Err(InboxError::Store(StoreError::Corrupt {
                table: TABLE,
                what: "a duplicate without a message id",
            })),
        }
    }

    /// [`Inbox::store`] of a message stored once: a copy of a message whose id is already in
    /// the `delivered` table stores nothing and returns [`Stored::Duplicate`]. Returns once its
    /// transaction is committed to disk.
    pub fn store_once(
        &self,
        payload: &[u8],
        received_at: u64,
        once: Option<Once>,
    ) -> Result<Stored, InboxError> {
        let received_at = sql_time(received_at)?;
        let size = payload.len() as u64;
        let size_sql = i64::try_from(size).map_err(|_| InboxError::Full)?;
        {
            let mut state = self.state();
            if state.items >= self.max_items
                || state
                    .bytes
                    .checked_add(size)
                    .is_none_or(|total| total > self.max_bytes)
            {
                return Err(InboxError::Full);
            }
            // The room is taken now, and given back if the batch fails.
            state.items += 1;
            state.bytes += size;
        }
        let pending = Pending {
            received_at,
            size: size_sql,
            payload: payload.to_vec(),
            once,
        };
        let (_, result) = self.writer.submit(pending, payload.len(), |conn, batch| {
            write_batch(conn, batch)
        });
        if !matches!(result, Ok(Stored::New(_))) {
            let mut state = self.state();
            state.items = state.items.saturating_sub(1);
            state.bytes = state.bytes.saturating_sub(size);
        }
        result.map_err(|failed| {
            InboxError::GroupCommit(match failed {
                Failed::Error(e) => Some(e),
                Failed::Panicked => None,
            })
        })
    }

    /// Group commits run so far (one transaction and one fsync each).
    pub fn group_commits(&self) -> u64 {
        self.writer.commits()
    }

    /// Every item, oldest (first stored) first.
    pub fn list(&self) -> Result<Vec<InboxItem>, InboxError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT id, received_at, size FROM inbox_items ORDER BY id")
            .ctx("prepare listing the inbox")?;
        let mut rows = stmt.query([]).ctx("list the inbox")?;
        let mut items = Vec::new();
        let corrupt = |what| StoreError::Corrupt { table: TABLE, what };
        while let Some(row) = rows.next().ctx("list the inbox")? {
            let id: i64 = row.get(0).ctx("read id")?;
            let received_at: i64 = row.get(1).ctx("read received_at")?;
            let size: i64 = row.get(2).ctx("read size")?;
            items.push(InboxItem {
                id: u64::try_from(id).map_err(|_| corrupt("negative id"))?,
                received_at: u64::try_from(received_at)
                    .map_err(|_| corrupt("negative received_at"))?,
                size: usize::try_from(size).map_err(|_| corrupt("size out of range"))?,
            });
        }
        Ok(items)
    }

    /// The payload stored under `id`, if any.
    pub fn get(&self, id: u64) -> Result<Option<Vec<u8>>, InboxError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(None);
        };
        self.conn()
            .prepare_cached("SELECT payload FROM inbox_items WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row([id], |row| row.get(0)).optional())
            .ctx("read an inbox item")
            .map_err(InboxError::from)
    }

    /// Removes the item `id` (committed before it returns), freeing its room. Its size, or
    /// `None` if there was no such item.
    pub fn remove(&self, id: u64) -> Result<Option<u64>, InboxError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(None);
        };
        let conn = self.conn();
        let size: Option<i64> = conn
            .query_row(
                "DELETE FROM inbox_items WHERE id = ?1 RETURNING size",
                [id],
                |row| row.get(0),
            )
            .optional()
            .ctx("remove an inbox item")?;
        let Some(size) = size else {
            return Ok(None);
        };
        let size = u64::try_from(size).unwrap_or(0);
        let mut state = self.state();
        state.items = state.items.saturating_sub(1);
        state.bytes = state.bytes.saturating_sub(size);
        Ok(Some(size))
    }

    /// Removes every item received before `cutoff` (Unix seconds), at most `limit` of them in
    /// one transaction; returns `(id, size)` of each removed.
    pub fn expire(&self, cutoff: u64, limit: usize) -> Result<Vec<(u64, u64)>, InboxError> {
        let cutoff = sql_time(cutoff)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let conn = self.conn();
        let removed = {
            let mut stmt = conn
                .prepare_cached(
                    "DELETE FROM inbox_items WHERE id IN
                       (SELECT id FROM inbox_items WHERE received_at < ?1 ORDER BY id LIMIT ?2)
                     RETURNING id, size",
                )
                .ctx("prepare expiring inbox items")?;
            let rows = stmt
                .query_map(params![cutoff, limit], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
                })
                .ctx("expire inbox items")?;
            let mut out = Vec::new();
            for row in rows {
                let (id, size) = row.ctx("expire inbox items")?;
                out.push((
                    u64::try_from(id).unwrap_or(0),
                    u64::try_from(size).unwrap_or(0),
                ));
            }
            out
        };
        let mut state = self.state();
        for (_, size) in &removed {
            state.items = state.items.saturating_sub(1);
            state.bytes = state.bytes.saturating_sub(*size);
        }
        Ok(removed)
    }

    /// How many items the inbox holds (counted in memory: no disk read).
    pub fn len(&self) -> usize {
        self.state().items
    }

    /// Whether the inbox holds no item.
    pub fn is_empty(&self) -> bool {
        self.state().items == 0
    }

    /// Payload bytes the inbox holds.
    pub fn bytes(&self) -> u64 {
        self.state().bytes
    }

    /// The caps: items, payload bytes.
    pub fn limits(&self) -> (usize, u64) {
        (self.max_items, self.max_bytes)
    }

    /// The connection (`GroupCommit::conn`: it waits for a batch being committed).
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.writer.conn()
    }

    /// The counts are changed only under this lock, each change whole.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Inserts `batch` in one transaction and commits (`synchronous=FULL`): each row's id, or for
/// a message already delivered its first copy's record. Message ids older than [`DEDUP_SECS`]
/// and past [`MAX_DELIVERED`] are forgotten first, in the same transaction.
fn write_batch(conn: &mut Connection, batch: &[Pending]) -> Result<Vec<Stored>, StoreError> {
    let tx = conn.transaction().ctx("begin an inbox group commit")?;
    if batch.iter().any(|p| p.once.is_some()) {
        let newest = batch.iter().map(|p| p.received_at).max().unwrap_or(0);
        forget_delivered(&tx, newest)?;
    }
    let mut out = Vec::with_capacity(batch.len());
    {
        let mut item = tx
            .prepare_cached(
                "INSERT INTO inbox_items (received_at, size, payload) VALUES (?1, ?2, ?3)",
            )
            .ctx("prepare storing inbox items")?;
        let mut first = tx
            .prepare_cached(
                "INSERT INTO delivered (message_id, commitment, delivered_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .ctx("prepare recording delivered messages")?;
        let mut earlier = tx
            .prepare_cached("SELECT commitment, delivered_at FROM delivered WHERE message_id = ?1")
            .ctx("prepare reading delivered messages")?;
        for p in batch {
            if let Some(once) = &p.once {
                let fresh = first
                    .execute(params![once.message_id, once.commitment, p.received_at])
                    .ctx("record a delivered message")?;
                if fresh == 0 {
                    out.push(earlier_copy(&mut earlier, &once.message_id)?);
                    continue;
                }
            }
            item.execute(params![p.received_at, p.size, p.payload])
                .ctx("store an inbox item")?;
            let id = u64::try_from(tx.last_insert_rowid()).map_err(|_| StoreError::Corrupt {
                table: TABLE,
                what: "negative id",
            })?;
            out.push(Stored::New(id));
        }
    }
    tx.commit().ctx("commit an inbox group commit")?;
    Ok(out)
}

/// The record of the first copy of `message_id`.
fn earlier_copy(
    stmt: &mut rusqlite::CachedStatement<'_>,
    message_id: &crate::proto::MessageId,
) -> Result<Stored, StoreError> {
    let (commitment, delivered_at): (Vec<u8>, i64) = stmt
        .query_row([message_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .ctx("read a delivered message")?;
    let corrupt = |what| StoreError::Corrupt {
        table: "delivered",
        what,
    };
    Ok(Stored::Duplicate {
        delivered_at: u64::try_from(delivered_at).map_err(|_| corrupt("negative time"))?,
        commitment: commitment
            .try_into()
            .map_err(|_| corrupt("commitment not 32 bytes"))?,
    })
}

/// Forgets the message ids delivered more than [`DEDUP_SECS`] before `now`, then the oldest
/// past [`MAX_DELIVERED`] − 1 (room for one more).
fn forget_delivered(tx: &rusqlite::Transaction<'_>, now: i64) -> Result<(), StoreError> {
    let cutoff = now.saturating_sub(DEDUP_SECS as i64);
    tx.prepare_cached("DELETE FROM delivered WHERE delivered_at < ?1")
        .and_then(|mut s| s.execute([cutoff]))
        .ctx("forget old delivered messages")?;
    tx.prepare_cached(
        "DELETE FROM delivered WHERE message_id IN (SELECT message_id FROM delivered
           ORDER BY delivered_at DESC LIMIT -1 OFFSET ?1)",
    )
    .and_then(|mut s| s.execute([MAX_DELIVERED as i64 - 1]))
    .ctx("forget delivered messages past the bound")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn store_list_get_survive_reopen() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(&path).unwrap();
        assert!(inbox.is_empty());
        let a = inbox.store(b"first payload", 1_000).unwrap();
        let b = inbox.store(b"", 1_001).unwrap();
        let c = inbox.store(&[0xff; 4096], 999).unwrap();
        assert!(a < b && b < c);
        assert_eq!(inbox.len(), 3);
        assert_eq!(inbox.bytes(), 13 + 4096);
        drop(inbox);

        let inbox = Inbox::open(&path).unwrap();
        assert_eq!(inbox.len(), 3);
        assert_eq!(inbox.bytes(), 13 + 4096);
        assert_eq!(
            inbox.list().unwrap(),
            vec![
                InboxItem {
                    id: a,
                    received_at: 1_000,
                    size: 13
                },
                InboxItem {
                    id: b,
                    received_at: 1_001,
                    size: 0
                },
                InboxItem {
                    id: c,
                    received_at: 999,
                    size: 4096
                },
            ]
        );
        assert_eq!(
            inbox.get(a).unwrap().as_deref(),
            Some(&b"first payload"[..])
        );
        assert_eq!(inbox.get(b).unwrap(), Some(Vec::new()));
        assert_eq!(inbox.get(c).unwrap(), Some(vec![0xff; 4096]));
        assert_eq!(inbox.get(c + 1).unwrap(), None);
        assert_eq!(inbox.get(u64::MAX).unwrap(), None);
        let d = inbox.store(b"after reopen", 1_002).unwrap();
        assert!(d > c);
        assert_eq!(
            serde_json::to_string(&inbox.list().unwrap()[3]).unwrap(),
            format!(r#"{{"id":{d},"received_at":1002,"size":12}}"#)
        );
    }

    #[test]
    fn a_stored_item_is_committed_before_store_returns() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(&path).unwrap();
        let id = inbox.store(b"durable", 5).unwrap();
        // Another connection, while the inbox is still open, sees the row.
        let other = Connection::open(&path).unwrap();
        let payload: Vec<u8> = other
            .query_row(
                "SELECT payload FROM inbox_items WHERE id = ?1",
                [id as i64],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(payload, b"durable");
    }

    #[test]
    fn a_full_inbox_stores_nothing_until_room_is_freed() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open_with_limits(&path, 3, 1_000).unwrap();
        let first = inbox.store(b"1", 1).unwrap();
        inbox.store(b"2", 2).unwrap();
        inbox.store(b"3", 3).unwrap();
        assert!(matches!(inbox.store(b"4", 4), Err(InboxError::Full)));
        assert_eq!(inbox.len(), 3);
        assert_eq!(inbox.list().unwrap().len(), 3);
        drop(inbox);

        // Still full after a reopen: the counts come from the file.
        let inbox = Inbox::open_with_limits(&path, 3, 1_000).unwrap();
        assert!(matches!(inbox.store(b"4", 4), Err(InboxError::Full)));
        assert_eq!(inbox.remove(first).unwrap(), Some(1));
        assert_eq!(inbox.remove(first).unwrap(), None);
        let fourth = inbox.store(b"4", 4).unwrap();
        assert!(fourth > first);
        assert_eq!(
            inbox
                .list()
                .unwrap()
                .iter()
                .map(|i| i.received_at)
                .collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
    }

    #[test]
    fn retention_removes_the_old_items_only() {
        let dir = dir();
        let inbox = Inbox::open(&dir.path().join("inbox.db")).unwrap();
        let a = inbox.store(b"old", 100).unwrap();
        let b = inbox.store(b"older", 50).unwrap();
        let c = inbox.store(b"new", 200).unwrap();
        assert_eq!(inbox.expire(150, 1).unwrap(), vec![(a, 3)]);
        assert_eq!(inbox.expire(150, 10).unwrap(), vec![(b, 5)]);
        assert_eq!(inbox.expire(150, 10).unwrap(), vec![]);
        assert_eq!((inbox.len(), inbox.bytes()), (1, 3));
        assert_eq!(inbox.list().unwrap()[0].id, c);
    }

    #[test]
    fn the_byte_cap_counts_payload_bytes() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open_with_limits(&path, 100, 10).unwrap();
        inbox.store(&[1; 6], 1).unwrap();
        assert!(matches!(inbox.store(&[2; 5], 2), Err(InboxError::Full)));
        inbox.store(&[3; 4], 3).unwrap();
        assert_eq!(inbox.bytes(), 10);
        assert!(matches!(inbox.store(&[4; 1], 4), Err(InboxError::Full)));
        // An empty payload still fits the byte cap.
        inbox.store(&[], 5).unwrap();
        assert!(matches!(inbox.store(&[0; 11], 6), Err(InboxError::Full)));
        drop(inbox);
        let inbox = Inbox::open_with_limits(&path, 100, 10).unwrap();
        assert_eq!(inbox.bytes(), 10);
        assert_eq!(inbox.len(), 3);
        assert!(matches!(inbox.store(&[4; 1], 4), Err(InboxError::Full)));
    }

    #[test]
    fn the_default_caps_are_the_documented_ones() {
        let dir = dir();
        let inbox = Inbox::open(&dir.path().join("inbox.db")).unwrap();
        assert_eq!(inbox.max_items, 10_000);
        assert_eq!(inbox.max_bytes, 256 * 1024 * 1024);
        // A payload larger than the whole byte cap is refused outright.
        let huge = vec![0u8; (INBOX_MAX_BYTES + 1) as usize];
        assert!(matches!(inbox.store(&huge, 1), Err(InboxError::Full)));
        assert_eq!(inbox.len(), 0);
    }

    #[test]
    fn times_beyond_sqlite_integers_are_refused() {
        let dir = dir();
        let inbox = Inbox::open(&dir.path().join("inbox.db")).unwrap();
        assert!(matches!(
            inbox.store(b"x", u64::MAX),
            Err(InboxError::Store(StoreError::TimeOutOfRange(u64::MAX)))
        ));
        assert!(inbox.is_empty());
    }

    #[test]
    fn the_connection_is_wal_synchronous_full() {
        let dir = dir();
        let inbox = Inbox::open(&dir.path().join("inbox.db")).unwrap();
        let conn = inbox.conn();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!((mode.as_str(), sync), ("wal", 2));
    }

    /// Polls `cond` on the inbox's group commit until it holds (bounded: 10 s).
    fn wait_until(
        inbox: &Inbox,
        what: &str,
        cond: impl Fn(&GroupCommit<Connection, Pending, Stored, StoreError>) -> bool,
    ) {
        let start = crate::clock::now();
        while !cond(&inbox.writer) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never: {what}"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn stores_waiting_together_share_one_commit_and_report_only_after_it() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(&path).unwrap();
        let before = inbox.group_commits();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let ids: Vec<u64> = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            let first = {
                let tx = tx.clone();
                let inbox = &inbox;
                scope.spawn(move || {
                    let id = inbox.store(b"first", 1).unwrap();
                    tx.send(()).unwrap();
                    id
                })
            };
            wait_until(&inbox, "the first store committing", |w| {
                w.committing() && w.queued() == 0
            });
            let others: Vec<_> = (0..3u8)
                .map(|i| {
                    let inbox = &inbox;
                    scope.spawn(move || inbox.store(&[i; 10], 2).unwrap())
                })
                .collect();
            wait_until(&inbox, "three stores queued", |w| w.queued() == 3);
            assert!(rx.try_recv().is_err(), "reported before its commit");
            assert_eq!(inbox.len(), 4); // the room is taken while they wait
            holder.execute_batch("COMMIT").unwrap();
            let mut ids = vec![first.join().unwrap()];
            ids.extend(others.into_iter().map(|h| h.join().unwrap()));
            ids
        });
        assert_eq!(inbox.group_commits() - before, 2);
        assert_eq!(inbox.list().unwrap().len(), 4);
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
    }

    #[test]
    fn a_failed_batch_fails_each_member_and_gives_its_room_back() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(&path).unwrap();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let results: Vec<Result<u64, InboxError>> = std::thread::scope(|scope| {
            let first = scope.spawn(|| inbox.store(b"first", 1));
            wait_until(&inbox, "the first store committing", |w| w.committing());
            let others: Vec<_> = (0..3u8)
                .map(|i| {
                    let inbox = &inbox;
                    scope.spawn(move || inbox.store(&[i; 10], 2))
                })
                .collect();
            wait_until(&inbox, "three stores queued", |w| w.queued() == 3);
            // The table's CHECK refuses a row whose size is not its payload's length: make
            // every later insert fail by dropping the table under the inbox.
            holder
                .execute_batch("DROP TABLE inbox_items; COMMIT")
                .unwrap();
            let mut all = vec![first.join().unwrap()];
            all.extend(others.into_iter().map(|h| h.join().unwrap()));
            all
        });
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(InboxError::GroupCommit(Some(_)))))
        );
        assert_eq!(inbox.len(), 0);
        assert_eq!(inbox.bytes(), 0);
    }

    #[test]
    fn delivered_message_ids_are_bounded() {
        let dir = dir();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(&path).unwrap();
        {
            let mut conn = inbox.conn();
            let tx = conn.transaction().unwrap();
            for i in 0..MAX_DELIVERED as u64 + 10 {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&i.to_be_bytes());
                tx.execute(
                    "INSERT INTO delivered VALUES (?1, ?2, ?3)",
                    params![id, [0u8; 32], 1_000 + (i / 100) as i64],
                )
                .unwrap();
            }
            tx.commit().unwrap();
        }
        let once = Once {
            message_id: [0xff; 16],
            commitment: [1; 32],
        };
        let now = 1_000 + 300;
        assert!(matches!(
            inbox.store_once(b"m", now, Some(once)).unwrap(),
            Stored::New(_)
        ));
        let (rows, newest): (i64, i64) = inbox
            .conn()
            .query_row(
                "SELECT COUNT(*), MAX(delivered_at) FROM delivered",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(rows, MAX_DELIVERED as i64, "the oldest went");
        assert_eq!(newest, now as i64, "the new one is kept");
    }

    #[test]
    fn inbox_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Inbox>();
    }
}
