//! The route replay registry.
//!
//! Each entry is keyed by a layer's replay tag and holds the digest of the request that reserved
//! it, the reservation time and either "in flight" or the final response. An entry is *live*
//! through the last second its layer could be accepted (`reserve_through`: its expiry plus the
//! skew, at least the window); a live tag can never run a second time, whatever the
//! outcome of its first run (success and failure responses are both kept). When no slot is free
//! the registry refuses new routes ([`Outcome::Capacity`]) rather than evicting a live
//! reservation; entries whose window has ended are purged lazily on each call, so capacity frees
//! itself.
//!
//! Decisions are taken on an in-memory mirror (a `HashMap` plus an expiry-ordered set), so a
//! `reserve` costs one durable write and no read. The SQLite variant commits the reservation
//! (`synchronous=FULL`: on the disk) or the completion (written, on the disk with the next
//! reservation's fsync) before the call returns, in a group commit with the writes of the other
//! callers waiting at that moment ([`group`]); rows of purged entries are
//! deleted in the same transaction as the next batch. A SQLite file belongs to one
//! registry at a time: two registries (or processes) on the same file would not see each other's
//! decisions.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

pub use self::group::{ANSWER_FLUSH, MAX_BATCH_WRITES};
use self::group::{Answer, LIMITS, Write};

use super::{ReplayError, ReplayStore};
use crate::sources::SourceKey;
use crate::sqlite::group_commit::GroupCommit;
use crate::sqlite::{self, SqliteContext, StoreError, sql_time};

/// The registry's key: a layer's replay tag (its table's column is `route_id`, the name files
/// written before keep).
pub use crate::proto::sphinx::ReplayTag;
/// The request digest: SHA-256(`blindrelay/request/v3` ‖ previous hop ‖ version ‖ class ‖
/// alpha ‖ gamma), `crate::proto::frame::Frame::request_digest`.
pub type Digest = [u8; 32];

/// Live tags a registry holds at most (design: `BLIND_RELAY_ROUTE_REPLAY_CAPACITY`): the default
/// admission rate (1 200 per minute) times the longest a tag is kept, 840 s (a layer may expire
/// up to 600 + 120 s ahead and its tag is kept 120 s past its expiry), so a node admitting at
/// its default rate never fills it: 1 200 × 840 / 60 = 16 800. A node run with a higher
/// `--admission-per-minute` should raise `--replay-capacity` alike.
pub const CAPACITY: usize = 16_800;
/// A route stays reserved this long after its reservation (design:
/// `BLIND_RELAY_ROUTE_REPLAY_TTL_SECS`).
pub const WINDOW_SECS: u64 = 600;
/// A stored response is replayed only while it is at most this old: its delivery receipt is only
/// valid for 120 s (design: `BLIND_RELAY_DELIVERY_RECEIPT_MAX_AGE_SECS`).
pub const RESPONSE_MAX_AGE_SECS: u64 = 120;

/// The status stored for a route that was in flight when the process stopped.
pub const INTERRUPTED_STATUS: u16 = 503;
/// The body stored for a route that was in flight when the process stopped.
pub const INTERRUPTED_BODY: &[u8] = br#"{"error":"route_interrupted"}"#;

const TABLE: &str = "replay_routes";
const STATE_IN_FLIGHT: i64 = 0;
const STATE_COMPLETED: i64 = 1;

/// The final response of a route, replayed to duplicates while it is fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// Response body, exactly as first sent.
    pub body: Vec<u8>,
    /// When the route completed (Unix seconds).
    pub completed_at: u64,
}

/// What [`ReplayRegistry::reserve`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Reserved for this request: go on, then call [`ReplayRegistry::complete`].
    New,
    /// Same request, completed, response at most 120 s old: replay it (`duplicate_route`).
    Duplicate(StoredResponse),
    /// Same request, still being handled: 503 `route_in_flight`.
    InFlight,
    /// Another request (the digest differs) with this route id: 400 `replay_conflict`.
    Conflict,
    /// Same request, stored response older than 120 s: 409 `replay_response_expired`. The route
    /// stays reserved until its window ends.
    Expired,
    /// Every slot holds a live route: 503 `replay_capacity`.
    Capacity,
    /// The source holds its share of the live routes: 429 `replay_share_exceeded`.
    ShareExceeded,
}

#[derive(Debug, Clone)]
enum State {
    InFlight,
    Completed(StoredResponse),
}

#[derive(Debug, Clone)]
struct Entry {
    digest: Digest,
    reserved_at: u64,
    state: State,
    /// Whose share it counts in (memory only: entries loaded from SQLite count in none).
    source: Option<SourceKey>,
    /// Its reservation waits for its commit.
    pending: bool,
}

struct Inner {
    entries: HashMap<ReplayTag, Entry>,
    /// `(end of window, route id)` of every entry, soonest first.
    expiry: BTreeSet<(u64, ReplayTag)>,
    /// Purged from memory, still to delete from SQLite with the next write.
    pending_deletes: Vec<ReplayTag>,
    /// Responses in the mirror, still to write to SQLite with the next write (at most one per
    /// live entry).
    answers: Vec<Answer>,
    /// SQLite-backed (writes are queued for a group commit).
    sqlite: bool,
    /// Live routes per source.
    per_source: HashMap<SourceKey, usize>,
}

impl Inner {
    fn new(sqlite: bool) -> Self {
        Self {
            entries: HashMap::new(),
            expiry: BTreeSet::new(),
            pending_deletes: Vec::new(),
            answers: Vec::new(),
            sqlite,
            per_source: HashMap::new(),
        }
    }
}

/// The route replay registry: SQLite-backed ([`ReplayRegistry::open_sqlite`]) or in memory
/// ([`ReplayRegistry::memory`]), with the same rules. `Send + Sync`; calls are serialized by an
/// internal mutex and block while SQLite writes.
pub struct ReplayRegistry {
    capacity: usize,
    /// Live routes one source may hold.
    source_share: usize,
    window_secs: u64,
    persistent: bool,
    inner: Mutex<Inner>,
    /// The SQLite connection and its group commit; `None` for the memory store.
    group: Option<GroupCommit<Connection, Write, (), ReplayError>>,
}

impl fmt::Debug for ReplayRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayRegistry")
            .field("persistent", &self.persistent)
            .field("capacity", &self.capacity)
            .field("window_secs", &self.window_secs)
            .finish_non_exhaustive()
    }
}

impl ReplayRegistry {
    /// Opens (or creates) the registry in the SQLite file at `path`. Rows whose window has ended
    /// at `now` are deleted; rows still in flight (the process stopped while handling them) are
    /// completed with [`INTERRUPTED_STATUS`] and [`INTERRUPTED_BODY`] at `now`, so a duplicate
    /// never runs twice and always gets the same answer. Live rows are all kept, even beyond
    /// `capacity` (new routes are then refused until enough windows end).
    pub fn open_sqlite(
        path: &Path,
        capacity: usize,
        window_secs: u64,
        now: u64,
    ) -> Result<Self, ReplayError> {
        let now_sql = sql_time(now)?;
        let mut conn = sqlite::open_durable(path)?;
        create_table(&conn)?;
        let inner = load(&mut conn, window_secs, now, now_sql)?;
        Ok(Self {
            capacity,
            source_share: capacity,
            window_secs,
            persistent: true,
            inner: Mutex::new(inner),
            group: Some(GroupCommit::new(conn, LIMITS)),
        })
    }

    /// A registry in memory only: the same rules, forgotten at restart.
    pub fn memory(capacity: usize, window_secs: u64) -> Self {
        Self {
            capacity,
            source_share: capacity,
            window_secs,
            persistent: false,
            inner: Mutex::new(Inner::new(false)),
            group: None,
        }
    }

    /// The same registry where one source may hold at most `percent` of the capacity (at least
    /// one route).
    pub fn with_source_share(mut self, percent: u8) -> Self {
        self.source_share = (self.capacity * usize::from(percent.min(100)) / 100).max(1);
        self
    }

    /// The capacity, in live routes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Decides what to do with a request for `tag` whose digest is `digest`. On
    /// [`Outcome::New`] the reservation is committed (SQLite) before this returns; every other
    /// outcome changes nothing but purging ended windows. If the write fails the error is
    /// returned and nothing is reserved: answer the request with an error, do not handle it.
    pub fn reserve(
        &self,
        tag: ReplayTag,
        digest: Digest,
        now: u64,
    ) -> Result<Outcome, ReplayError> {
        self.reserve_from(tag, digest, now, None)
    }

    /// [`ReplayRegistry::reserve`] for a request from `source`: a new route counts in its share,
    /// and once it holds its share its new routes get [`Outcome::ShareExceeded`].
    pub fn reserve_from(
        &self,
        tag: ReplayTag,
        digest: Digest,
        now: u64,
        source: Option<SourceKey>,
    ) -> Result<Outcome, ReplayError> {
        let through = now.saturating_add(self.window_secs).saturating_sub(1);
        self.reserve_through(tag, digest, now, through, source)
    }

    /// [`ReplayRegistry::reserve_from`] for a request that stays acceptable through the second
    /// `last_fresh` (its envelope's timestamp plus the age limit): a new route stays reserved
    /// through the later of `last_fresh` and the end of its window from `now`, so a frame dated
    /// ahead cannot run again once the window from its receipt has ended.
    pub fn reserve_through(
        &self,
        tag: ReplayTag,
        digest: Digest,
        now: u64,
        last_fresh: u64,
        source: Option<SourceKey>,
    ) -> Result<Outcome, ReplayError> {
        // Live while t < reserved_at + window: through `last_fresh` when
        // reserved_at = last_fresh + 1 − window.
        let reserved_at = now.max(
            last_fresh
                .saturating_add(1)
                .saturating_sub(self.window_secs),
        );
        let now_sql = sql_time(reserved_at)?;
        let mut inner = self.lock();
        inner.purge(now);
        if let Some(entry) = inner.entries.get(&tag) {
            if entry.digest != digest {
                return Ok(Outcome::Conflict);
            }
            return Ok(match &entry.state {
                State::InFlight => Outcome::InFlight,
                State::Completed(response) => {
                    if now.saturating_sub(response.completed_at) <= RESPONSE_MAX_AGE_SECS {
                        Outcome::Duplicate(response.clone())
                    } else {
                        Outcome::Expired
                    }
                }
            });
        }
        if let Some(key) = source
            && inner.per_source.get(&key).copied().unwrap_or(0) >= self.source_share
        {
            return Ok(Outcome::ShareExceeded);
        }
        if inner.entries.len() >= self.capacity {
            return Ok(Outcome::Capacity);
        }
        // In the mirror at once (duplicates now get `InFlight`), reported only once committed.
        let sqlite = inner.sqlite;
        inner.insert(
            tag,
            Entry {
                digest,
                reserved_at,
                state: State::InFlight,
                source,
                pending: sqlite,
            },
            self.window_secs,
        );
        if sqlite {
            self.commit(
                inner,
                Write::Reserve {
                    tag,
                    digest,
                    reserved_at: now_sql,
                },
            )?;
        }
        Ok(Outcome::New)
    }

    /// Stores the final response of the route reserved by `reserve(tag, digest, ..)`, a
    /// success or a failure alike: the route stays reserved until its window ends either way.
    /// Never blocks: the response is in the mirror at once (duplicates get it from now on) and,
    /// SQLite-backed, queued to be written with the next batch ([`group`]: the next reservation's
    /// commit, or [`ReplayRegistry::flush`] within [`ANSWER_FLUSH`]). Fails with
    /// [`ReplayError::NotInFlight`] unless the route has a live reservation in flight for this
    /// digest, committed. A response lost before its write (a crash, a failing disk) leaves the
    /// route in flight on disk: after a restart it replays [`INTERRUPTED_BODY`], never runs again.
    pub fn complete(
        &self,
        tag: ReplayTag,
        digest: Digest,
        status: u16,
        body: &[u8],
        now: u64,
    ) -> Result<(), ReplayError> {
        let completed_at_sql = sql_time(now)?;
        let mut inner = self.lock();
        inner.purge(now);
        match inner.entries.get_mut(&tag) {
            Some(entry)
                if entry.digest == digest
                    && !entry.pending
                    && matches!(entry.state, State::InFlight) =>
            {
                entry.state = State::Completed(StoredResponse {
                    status,
                    body: body.to_vec(),
                    completed_at: now,
                });
            }
            _ => return Err(ReplayError::NotInFlight),
        }
        if inner.sqlite {
            inner.answers.push(Answer {
                tag,
                status,
                body: body.to_vec(),
                completed_at_sql,
            });
        }
        Ok(())
    }

    /// Group commits run so far (one SQLite transaction and one fsync each; 0 for the memory
    /// store): with [`ReplayRegistry::live`], how many writes shared a commit.
    pub fn group_commits(&self) -> u64 {
        self.group.as_ref().map_or(0, GroupCommit::commits)
    }

    /// How many routes are live (reserved, in flight or completed) at `now`.
    pub fn live(&self, now: u64) -> usize {
        let mut inner = self.lock();
        inner.purge(now);
        inner.entries.len()
    }

    /// Where reservations are kept: SQLite survives a restart, memory does not.
    pub fn kind(&self) -> ReplayStore {
        if self.persistent {
            ReplayStore::Sqlite
        } else {
            ReplayStore::Memory
        }
    }

    /// The mirror's changes are each a single insert, update or removal (a failed group commit
    /// undoes its members' one by one), so a panic elsewhere cannot leave it half-written.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a restart of the memory store would keep: the same conversion `open_sqlite` applies
    /// to the file (test support, to compare both stores across a restart).
    #[cfg(test)]
    fn simulate_restart(&self, now: u64) {
        let mut inner = self.lock();
        inner.purge(now);
        for entry in inner.entries.values_mut() {
            if matches!(entry.state, State::InFlight) {
                entry.state = State::Completed(StoredResponse {
                    status: INTERRUPTED_STATUS,
                    body: INTERRUPTED_BODY.to_vec(),
                    completed_at: now,
                });
            }
        }
    }
}

impl Inner {
    fn insert(&mut self, tag: ReplayTag, entry: Entry, window_secs: u64) {
        if let Some(key) = entry.source {
            *self.per_source.entry(key).or_insert(0) += 1;
        }
        self.expiry
            .insert((entry.reserved_at.saturating_add(window_secs), tag));
        self.entries.insert(tag, entry);
    }

    /// Drops the entries whose window has ended at `now`.
    fn purge(&mut self, now: u64) {
        while let Some(&(ends_at, tag)) = self.expiry.first() {
            if ends_at > now {
                break;
            }
            self.expiry.pop_first();
            self.drop_entry(tag);
            if self.sqlite {
                self.pending_deletes.push(tag);
            }
        }
    }

    /// Forgets a reservation whose commit failed (it is not in the file).
    fn forget(&mut self, tag: ReplayTag, window_secs: u64) {
        if let Some(entry) = self.entries.get(&tag) {
            let ends_at = entry.reserved_at.saturating_add(window_secs);
            self.expiry.remove(&(ends_at, tag));
            self.drop_entry(tag);
        }
    }

    fn drop_entry(&mut self, tag: ReplayTag) {
        if let Some(Entry {
            source: Some(key), ..
        }) = self.entries.remove(&tag)
            && let Some(n) = self.per_source.get_mut(&key)
        {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&key);
            }
        }
    }
}

/// The `application_id` of a replay registry file ("BRRP").
const APPLICATION_ID: i32 = 0x4252_5250;

/// Claims the file, creates the registry's table (if new) and settles the file
/// (`sqlite::settle`).
fn create_table(conn: &Connection) -> Result<(), StoreError> {
    sqlite::claim(conn, APPLICATION_ID, "replay_routes", "a replay registry")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS replay_routes (
            route_id BLOB PRIMARY KEY NOT NULL CHECK (length(route_id) = 16),
            digest BLOB NOT NULL CHECK (length(digest) = 32),
            reserved_at INTEGER NOT NULL,
            state INTEGER NOT NULL CHECK (state IN (0, 1)),
            status INTEGER,
            body BLOB,
            completed_at INTEGER,
            CHECK ((state = 0 AND status IS NULL AND body IS NULL AND completed_at IS NULL)
                OR (state = 1 AND status IS NOT NULL AND body IS NOT NULL
                    AND completed_at IS NOT NULL))
        );",
    )
    .ctx("create the replay_routes table")?;
    sqlite::settle(conn)
}

/// Deletes the rows whose window has ended at `now`, completes the rows still in flight as
/// interrupted, and loads the rest into a mirror, in one transaction.
fn load(
    conn: &mut Connection,
    window_secs: u64,
    now: u64,
    now_sql: i64,
) -> Result<Inner, ReplayError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("begin loading the replay registry")?;
    // Live while now < reserved_at + window, i.e. expired when reserved_at <= now - window.
    let expired = match now.checked_sub(window_secs) {
        Some(cutoff) => tx
            .execute(
                "DELETE FROM replay_routes WHERE reserved_at <= ?1",
                [sql_time(cutoff)?],
            )
            .ctx("delete expired routes")?,
        None => 0,
    };
    let interrupted = tx
        .execute(
            "UPDATE replay_routes SET state = ?1, status = ?2, body = ?3, completed_at = ?4
             WHERE state = ?5",
            params![
                STATE_COMPLETED,
                INTERRUPTED_STATUS,
                INTERRUPTED_BODY,
                now_sql,
                STATE_IN_FLIGHT
            ],
        )
        .ctx("complete interrupted routes")?;
    let inner = load_rows(&tx, window_secs)?;
    tx.commit().ctx("commit loading the replay registry")?;
    tracing::info!(
        live = inner.entries.len(),
        expired,
        interrupted,
        "replay registry loaded"
    );
    Ok(inner)
}

/// Every row of the table, as a mirror.
fn load_rows(tx: &Transaction<'_>, window_secs: u64) -> Result<Inner, StoreError> {
    let mut inner = Inner::new(true);
    let mut stmt = tx
        .prepare(
            "SELECT route_id, digest, reserved_at, state, status, body, completed_at
             FROM replay_routes",
        )
        .ctx("prepare loading routes")?;
    let mut rows = stmt.query([]).ctx("load routes")?;
    while let Some(row) = rows.next().ctx("load routes")? {
        let (tag, entry) = entry_from_row(row)?;
        inner.insert(tag, entry, window_secs);
    }
    Ok(inner)
}

fn entry_from_row(row: &rusqlite::Row<'_>) -> Result<(ReplayTag, Entry), StoreError> {
    let corrupt = |what| StoreError::Corrupt { table: TABLE, what };
    let tag: Vec<u8> = row.get(0).ctx("read route_id")?;
    let tag = ReplayTag::try_from(tag.as_slice()).map_err(|_| corrupt("route_id length"))?;
    let digest: Vec<u8> = row.get(1).ctx("read digest")?;
    let digest = Digest::try_from(digest.as_slice()).map_err(|_| corrupt("digest length"))?;
    let reserved_at: i64 = row.get(2).ctx("read reserved_at")?;
    let reserved_at = u64::try_from(reserved_at).map_err(|_| corrupt("negative reserved_at"))?;
    let state: i64 = row.get(3).ctx("read state")?;
    let state = match state {
        STATE_IN_FLIGHT => State::InFlight,
        STATE_COMPLETED => {
            let status: Option<i64> = row.get(4).ctx("read status")?;
            let body: Option<Vec<u8>> = row.get(5).ctx("read body")?;
            let completed_at: Option<i64> = row.get(6).ctx("read completed_at")?;
            let (Some(status), Some(body), Some(completed_at)) = (status, body, completed_at)
            else {
                return Err(corrupt("completed without a response"));
            };
            State::Completed(StoredResponse {
                status: u16::try_from(status).map_err(|_| corrupt("status out of range"))?,
                body,
                completed_at: u64::try_from(completed_at)
                    .map_err(|_| corrupt("negative completed_at"))?,
            })
        }
        _ => return Err(corrupt("unknown state")),
    };
    Ok((
        tag,
        Entry {
            digest,
            reserved_at,
            state,
            source: None,
            pending: false,
        },
    ))
}

/// Least time between two warnings of a failed replay write.
const WRITE_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Logs a failed write of the registry (rate-limited: a full disk under traffic fails every
/// request).
fn warn_write_failed(what: &str, e: &ReplayError) {
    static LAST: Mutex<Option<tokio::time::Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    let now = tokio::time::Instant::now();
    if last.is_none_or(|t| now.duration_since(t) >= WRITE_WARNING_EVERY) {
        *last = Some(now);
        tracing::warn!(
            "replay registry: cannot {what}: {e}; new routes are refused (state_write_failed) \
             until replay.db can be written again (disk full or read-only?)"
        );
    }
}

mod group;
#[cfg(test)]
mod tests;
