//! Group commit (`crate::sqlite::group_commit`): every reservation of the registry waits in one
//! queue, and one caller at a time, the *leader*, commits all the reservations queued at that
//! moment in one transaction with one fsync (`synchronous=FULL`), at most [`MAX_BATCH_WRITES`]
//! writes per batch. Callers that queued meanwhile wait on a condition variable; when a batch
//! ends, one of them leads the next. A caller alone commits at once (nothing is waited for), so
//! a quiet node pays one commit per reservation, and a loaded one one fsync per batch.
//!
//! A call returns [`super::Outcome::New`] only after the transaction holding its reservation
//! has committed: a reservation is what keeps a layer from running twice, after a power loss
//! too. Its effect on the in-memory mirror is visible to the other callers before its commit
//! (a reservation waiting for its commit answers concurrent duplicates `route_in_flight`, and
//! counts in the capacity), and is undone if its batch fails: every member of a failed batch
//! gets [`ReplayError::GroupCommit`] and the reservations are forgotten, exactly as when a
//! single write failed.
//!
//! **Stored responses wait for no commit.** A route's final response only lets a duplicate be
//! answered with it (for 120 s) instead of `route_interrupted`; it keeps nothing from running
//! twice. So [`ReplayRegistry::complete`] puts it in the mirror and leaves it for the next
//! batch, written in the same transaction as that batch's reservations (one transaction and one
//! thread hand-off less per hop: BENCHMARKS.md, issue 31). When no reservation follows, the node
//! writes what is left each [`ANSWER_FLUSH`] ([`ReplayRegistry::flush`], a transaction with
//! `synchronous=NORMAL`: no fsync of its own), and at stop (the registry's drop). A response not
//! yet written when the process dies (kill -9, a power loss) is lost; its route reads as in
//! flight at the crash: it never runs again, and a duplicate gets `route_interrupted` instead of
//! the stored answer. Rows of purged entries are deleted in the next batch's transaction too;
//! both are kept for the one after if it fails.

use std::mem;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use super::{
    Digest, Inner, ReplayError, ReplayRegistry, ReplayTag, STATE_COMPLETED, STATE_IN_FLIGHT,
};
use crate::sqlite::group_commit::{Failed, Limits};
use crate::sqlite::{SqliteContext, StoreError};

/// Writes one group commit holds at most.
pub const MAX_BATCH_WRITES: usize = 256;
/// How often the node writes the stored responses no reservation carried
/// ([`ReplayRegistry::flush`]).
pub const ANSWER_FLUSH: Duration = Duration::from_millis(100);

/// The batch bound: writes only (a queued write is a reservation, of a fixed size; the stored
/// responses a batch carries are at most one per live route).
pub(super) const LIMITS: Limits = Limits {
    writes: MAX_BATCH_WRITES,
    bytes: usize::MAX,
};

/// One queued write.
#[derive(Debug)]
pub(super) enum Write {
    /// Insert a reservation, in flight.
    Reserve {
        tag: ReplayTag,
        digest: Digest,
        reserved_at: i64,
    },
    /// Nothing of its own: the stored responses and deletions waiting ([`ReplayRegistry::flush`]).
    Flush,
}

/// A stored response waiting for the next batch (module docs).
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) tag: ReplayTag,
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
    pub(super) completed_at_sql: i64,
}

impl ReplayRegistry {
    /// Queues `write` (its effect already applied to the mirror as pending) and returns once the
    /// transaction holding it has committed (`Ok`) or failed (the error, the mirror undone).
    pub(super) fn commit(
        &self,
        inner: MutexGuard<'_, Inner>,
        write: Write,
    ) -> Result<(), ReplayError> {
        drop(inner);
        let Some(group) = &self.group else {
            return Ok(()); // the memory store: nothing to write
        };
        let (write, result) = group.submit(write, 0, |conn, batch| self.write_group(conn, batch));
        self.lock().settle(write, result.is_ok(), self.window_secs);
        result.map_err(|failed| match failed {
            Failed::Error(e) => ReplayError::GroupCommit(e),
            Failed::Panicked => {
                let e = ReplayError::CommitPanicked;
                super::warn_write_failed("reserve a route or store its answer", &e);
                ReplayError::GroupCommit(Arc::new(e))
            }
        })
    }

    /// Writes the stored responses and deletions waiting, if any, in a transaction of their
    /// own (`synchronous=NORMAL`); blocking. The node calls it each [`ANSWER_FLUSH`]; the
    /// registry's drop calls it too. Nothing to do for the memory store.
    ///
    /// # Errors
    /// The batch's failure (what it carried is kept for the next one).
    pub fn flush(&self) -> Result<(), ReplayError> {
        let inner = self.lock();
        if self.group.is_none() || (inner.answers.is_empty() && inner.pending_deletes.is_empty()) {
            return Ok(());
        }
        self.commit(inner, Write::Flush)
    }

    /// Stored responses waiting for their write.
    pub fn unwritten(&self) -> usize {
        self.lock().answers.len()
    }

    /// The leader's write: the rows purged so far deleted, the stored responses waiting
    /// written, then `batch`, in one transaction.
    fn write_group(&self, conn: &mut Connection, batch: &[Write]) -> Result<Vec<()>, ReplayError> {
        let mut carried = {
            let mut inner = self.lock();
            Carried {
                registry: self,
                routes: mem::take(&mut inner.pending_deletes),
                answers: mem::take(&mut inner.answers),
                done: false,
            }
        };
        match write_batch(conn, &carried.routes, &carried.answers, batch) {
            Ok(()) => {
                carried.done = true;
                Ok(vec![(); batch.len()])
            }
            Err(e) => {
                super::warn_write_failed("reserve a route or store its answer", &e);
                Err(e)
            }
        }
    }
}

impl Drop for ReplayRegistry {
    /// Writes the stored responses still waiting (best effort: a failure was logged).
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// What a batch carries besides its own writes (rows to delete, stored responses): given back
/// to the next batch unless its transaction committed (also when the write panicked).
struct Carried<'a> {
    registry: &'a ReplayRegistry,
    routes: Vec<ReplayTag>,
    answers: Vec<Answer>,
    done: bool,
}

impl Drop for Carried<'_> {
    fn drop(&mut self) {
        if !self.done {
            let routes = mem::take(&mut self.routes);
            let answers = mem::take(&mut self.answers);
            let mut inner = self.registry.lock();
            inner.pending_deletes.extend(routes);
            // Oldest first, before any stored since.
            let newer = mem::replace(&mut inner.answers, answers);
            inner.answers.extend(newer);
        }
    }
}

impl Inner {
    /// Applies a committed write to the mirror, or undoes a failed one.
    fn settle(&mut self, write: Write, committed: bool, window_secs: u64) {
        let Write::Reserve { tag, digest, .. } = write else {
            return;
        };
        let ours = self
            .entries
            .get(&tag)
            .is_some_and(|e| e.pending && e.digest == digest);
        if !ours {
            return;
        }
        if committed {
            if let Some(entry) = self.entries.get_mut(&tag) {
                entry.pending = false;
            }
        } else {
            self.forget(tag, window_secs);
        }
    }
}

/// Deletes the purged rows and applies `batch` in one immediate transaction, then commits.
fn write_batch(
    conn: &mut Connection,
    deletes: &[ReplayTag],
    answers: &[Answer],
    batch: &[Write],
) -> Result<(), ReplayError> {
    // A stored answer needs no fsync of its own (module doc): a batch without a reservation
    // is written with `synchronous=NORMAL`, and reaches the disk with the next reservation's.
    // (Prepared once and cached: not parsed again at every batch.)
    let reserves = batch.iter().any(|w| matches!(w, Write::Reserve { .. }));
    let level = if reserves {
        "PRAGMA synchronous = FULL"
    } else {
        "PRAGMA synchronous = NORMAL"
    };
    conn.prepare_cached(level)
        .and_then(|mut stmt| stmt.execute([]))
        .ctx("set synchronous for a group commit")?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("begin a group commit")?;
    if !deletes.is_empty() {
        let mut stmt = tx
            .prepare_cached("DELETE FROM replay_routes WHERE route_id = ?1")
            .ctx("prepare deleting expired routes")?;
        for tag in deletes {
            stmt.execute([&tag[..]]).ctx("delete an expired route")?;
        }
    }
    for answer in answers {
        write_answer(&tx, answer)?;
    }
    for write in batch {
        write_one(&tx, write)?;
    }
    tx.commit().ctx("commit a group commit")?;
    Ok(())
}

/// One write of a batch, in its transaction.
fn write_one(tx: &Transaction<'_>, write: &Write) -> Result<(), StoreError> {
    match write {
        Write::Reserve {
            tag,
            digest,
            reserved_at,
        } => {
            tx.prepare_cached(
                "INSERT INTO replay_routes (route_id, digest, reserved_at, state)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![&tag[..], &digest[..], reserved_at, STATE_IN_FLIGHT])
            })
            .ctx("insert a route reservation")?;
        }
        Write::Flush => {}
    }
    Ok(())
}

/// A stored response, in its batch's transaction, after the batch's deletions and before its
/// reservations: a route whose row left already (its window ended, or its id is reserved again
/// in this batch) has nothing to update, and its response is dropped with it.
fn write_answer(tx: &Transaction<'_>, answer: &Answer) -> Result<(), StoreError> {
    tx.prepare_cached(
        "UPDATE replay_routes
         SET state = ?1, status = ?2, body = ?3, completed_at = ?4
         WHERE route_id = ?5 AND state = ?6",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            STATE_COMPLETED,
            answer.status,
            answer.body,
            answer.completed_at_sql,
            &answer.tag[..],
            STATE_IN_FLIGHT
        ])
    })
    .ctx("store a route's response")?;
    Ok(())
}
