//! Group commit (`crate::sqlite::group_commit`): every SQLite write of the registry (a
//! reservation, a stored response) waits in one queue, and one caller at a time, the *leader*,
//! commits all the writes queued at that moment in one transaction with one fsync
//! (`synchronous=FULL`), at most [`MAX_BATCH_WRITES`] writes and [`MAX_BATCH_BYTES`] bytes of
//! stored bodies per batch.
//!
//! Only a reservation needs its own fsync: it is what keeps a layer from running twice, after
//! a power loss too. A batch of stored responses only is committed with `synchronous=NORMAL`:
//! written to the WAL before the call returns, so a process that is killed loses nothing, and
//! on the disk with the next reservation's commit (the fsync of the WAL covers every frame
//! before it). A power loss before that can lose such a response; its route then reads as in
//! flight at the crash: it never runs again, and a duplicate gets `route_interrupted` instead
//! of the stored answer (which is replayed for 120 s only). Measured with `scripts/bench-blindrelay
//! delivery` (BENCHMARKS.md): 3 of the 7 fsyncs of a 3-hop delivery.
//! Callers that queued meanwhile wait on a condition variable; when a batch ends, one of them
//! leads the next. A caller alone commits at once (nothing is waited for), so a quiet node pays
//! one commit per write as before, and a loaded one pays one fsync per batch.
//!
//! A call returns [`super::Outcome::New`] (or `Ok` for a completion) only after the
//! transaction holding its own write has committed. A write's
//! effect on the in-memory mirror is visible to the other callers before its commit (a
//! reservation waiting for its commit answers concurrent duplicates `route_in_flight`, and
//! counts in the capacity), and is undone if its batch fails: every member of a failed batch
//! gets [`ReplayError::GroupCommit`], the reservations are forgotten and the completions left
//! in flight, exactly as when a single write failed. Rows of purged entries are deleted in the
//! next batch's transaction (and kept for the one after if it fails).

use std::mem;
use std::sync::{Arc, MutexGuard};

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use super::{
    Digest, Inner, ReplayError, ReplayRegistry, RouteId, STATE_COMPLETED, STATE_IN_FLIGHT, State,
    StoredResponse, TABLE,
};
use crate::sqlite::group_commit::{Failed, Limits};
use crate::sqlite::{SqliteContext, StoreError};

/// Writes one group commit holds at most.
pub const MAX_BATCH_WRITES: usize = 256;
/// Bytes of stored response bodies one group commit holds at most (a larger single write still
/// goes alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Both bounds.
pub(super) const LIMITS: Limits = Limits {
    writes: MAX_BATCH_WRITES,
    bytes: MAX_BATCH_BYTES,
};

/// One queued write.
#[derive(Debug)]
pub(super) enum Write {
    /// Insert a reservation, in flight.
    Reserve {
        route_id: RouteId,
        digest: Digest,
        reserved_at: i64,
    },
    /// Store the final response of a reservation in flight.
    Complete {
        route_id: RouteId,
        status: u16,
        body: Vec<u8>,
        completed_at: u64,
        completed_at_sql: i64,
    },
}

impl Write {
    /// Its size for the batch bound: the stored body's.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Write::Reserve { .. } => 0,
            Write::Complete { body, .. } => body.len(),
        }
    }
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
        let size = write.bytes();
        let (write, result) =
            group.submit(write, size, |conn, batch| self.write_group(conn, batch));
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

    /// The leader's write: the rows purged so far deleted, then `batch`, in one transaction.
    fn write_group(&self, conn: &mut Connection, batch: &[Write]) -> Result<Vec<()>, ReplayError> {
        let mut deletes = Deletes {
            registry: self,
            routes: mem::take(&mut self.lock().pending_deletes),
            done: false,
        };
        match write_batch(conn, &deletes.routes, batch) {
            Ok(()) => {
                deletes.done = true;
                Ok(vec![(); batch.len()])
            }
            Err(e) => {
                super::warn_write_failed("reserve a route or store its answer", &e);
                Err(e)
            }
        }
    }
}

/// Rows a batch deletes: given back to the next batch unless its transaction committed (also
/// when the write panicked).
struct Deletes<'a> {
    registry: &'a ReplayRegistry,
    routes: Vec<RouteId>,
    done: bool,
}

impl Drop for Deletes<'_> {
    fn drop(&mut self) {
        if !self.done {
            let routes = mem::take(&mut self.routes);
            self.registry.lock().pending_deletes.extend(routes);
        }
    }
}

impl Inner {
    /// Applies a committed write to the mirror, or undoes a failed one.
    fn settle(&mut self, write: Write, committed: bool, window_secs: u64) {
        match write {
            Write::Reserve {
                route_id, digest, ..
            } => {
                let ours = self
                    .entries
                    .get(&route_id)
                    .is_some_and(|e| e.pending && e.digest == digest);
                if !ours {
                    return;
                }
                if committed {
                    if let Some(entry) = self.entries.get_mut(&route_id) {
                        entry.pending = false;
                    }
                } else {
                    self.forget(route_id, window_secs);
                }
            }
            Write::Complete {
                route_id,
                status,
                body,
                completed_at,
                ..
            } => {
                if let Some(entry) = self.entries.get_mut(&route_id) {
                    entry.pending = false;
                    if committed {
                        entry.state = State::Completed(StoredResponse {
                            status,
                            body,
                            completed_at,
                        });
                    }
                }
            }
        }
    }
}

/// Deletes the purged rows and applies `batch` in one immediate transaction, then commits.
fn write_batch(
    conn: &mut Connection,
    deletes: &[RouteId],
    batch: &[Write],
) -> Result<(), ReplayError> {
    // A stored answer needs no fsync of its own (module doc): a batch of answers only is
    // written with `synchronous=NORMAL`, and reaches the disk with the next reservation's.
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
        for route_id in deletes {
            stmt.execute([&route_id[..]])
                .ctx("delete an expired route")?;
        }
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
            route_id,
            digest,
            reserved_at,
        } => {
            tx.prepare_cached(
                "INSERT INTO replay_routes (route_id, digest, reserved_at, state)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    &route_id[..],
                    &digest[..],
                    reserved_at,
                    STATE_IN_FLIGHT
                ])
            })
            .ctx("insert a route reservation")?;
        }
        Write::Complete {
            route_id,
            status,
            body,
            completed_at_sql,
            ..
        } => {
            let changed = tx
                .prepare_cached(
                    "UPDATE replay_routes
                     SET state = ?1, status = ?2, body = ?3, completed_at = ?4
                     WHERE route_id = ?5 AND state = ?6",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        STATE_COMPLETED,
                        status,
                        body,
                        completed_at_sql,
                        &route_id[..],
                        STATE_IN_FLIGHT
                    ])
                })
                .ctx("store a route's response")?;
            if changed != 1 {
                // The file disagrees with the mirror: someone else writes to it.
                return Err(StoreError::Corrupt {
                    table: TABLE,
                    what: "the reservation to complete is missing",
                });
            }
        }
    }
    Ok(())
}
