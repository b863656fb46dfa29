use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use proptest::prelude::*;

use super::group::{LIMITS, Write as Queued};
use super::*;

const T0: u64 = 1_764_450_000;

fn rid(n: u32) -> ReplayTag {
    let mut id = [0x5a; 16];
    id[..4].copy_from_slice(&n.to_be_bytes());
    id
}

fn dg(n: u8) -> Digest {
    [n; 32]
}

fn done(status: u16, body: &[u8], completed_at: u64) -> Outcome {
    Outcome::Duplicate(StoredResponse {
        status,
        body: body.to_vec(),
        completed_at,
    })
}

fn interrupted(completed_at: u64) -> Outcome {
    done(INTERRUPTED_STATUS, INTERRUPTED_BODY, completed_at)
}

/// A temporary directory on tmpfs when there is one (fast fsync), else the default one.
fn fast_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

/// Runs the same script on a memory registry and on a SQLite one.
fn on_both(capacity: usize, window: u64, script: impl Fn(&ReplayRegistry)) {
    let memory = ReplayRegistry::memory(capacity, window);
    assert_eq!(memory.kind(), ReplayStore::Memory);
    script(&memory);
    let dir = fast_dir();
    let sqlite =
        ReplayRegistry::open_sqlite(&dir.path().join("replay.db"), capacity, window, T0).unwrap();
    assert_eq!(sqlite.kind(), ReplayStore::Sqlite);
    script(&sqlite);
}

fn reserve(reg: &ReplayRegistry, route: u32, digest: u8, now: u64) -> Outcome {
    reg.reserve(rid(route), dg(digest), now).unwrap()
}

fn complete(reg: &ReplayRegistry, route: u32, digest: u8, status: u16, body: &[u8], now: u64) {
    reg.complete(rid(route), dg(digest), status, body, now)
        .unwrap();
}

/// `(tag, state, status, body)` of a row.
type Row = (Vec<u8>, i64, Option<i64>, Option<Vec<u8>>);

/// Rows in the file, read through a connection of its own.
fn rows(path: &Path) -> Vec<Row> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT route_id, state, status, body FROM replay_routes ORDER BY route_id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn every_outcome_of_the_table() {
    on_both(64, WINDOW_SECS, |reg| {
        let store = if reg.kind() == ReplayStore::Sqlite {
            "sqlite"
        } else {
            "memory"
        };
        assert_eq!(reserve(reg, 1, 1, T0), Outcome::New, "{store}");
        assert_eq!(reg.live(T0), 1, "{store}");
        // Same request while the first one runs.
        assert_eq!(reserve(reg, 1, 1, T0 + 1), Outcome::InFlight, "{store}");
        // Another request with the route id, in flight or completed.
        assert_eq!(reserve(reg, 1, 2, T0 + 1), Outcome::Conflict, "{store}");
        complete(reg, 1, 1, 200, b"{\"outcome\":\"delivered\"}", T0 + 10);
        assert_eq!(reserve(reg, 1, 2, T0 + 11), Outcome::Conflict, "{store}");
        // The same request again: the stored response while it is at most 120 s old.
        let ok = done(200, b"{\"outcome\":\"delivered\"}", T0 + 10);
        assert_eq!(reserve(reg, 1, 1, T0 + 10), ok, "{store}");
        assert_eq!(reserve(reg, 1, 1, T0 + 130), ok, "{store}");
        assert_eq!(reserve(reg, 1, 1, T0 + 131), Outcome::Expired, "{store}");
        // It stays reserved for the rest of its window, never runs again.
        assert_eq!(reserve(reg, 1, 1, T0 + 599), Outcome::Expired, "{store}");
        assert_eq!(reserve(reg, 1, 2, T0 + 599), Outcome::Conflict, "{store}");
        assert_eq!(reg.live(T0 + 599), 1, "{store}");
        // 600 s after its reservation the route id is free again, for any request.
        assert_eq!(reg.live(T0 + 600), 0, "{store}");
        assert_eq!(reserve(reg, 1, 2, T0 + 600), Outcome::New, "{store}");
        assert_eq!(reserve(reg, 1, 1, T0 + 600), Outcome::Conflict, "{store}");
        // Capacity is the last row of the table.
        let small = ReplayRegistry::memory(1, WINDOW_SECS);
        assert_eq!(reserve(&small, 1, 1, T0), Outcome::New);
        assert_eq!(reserve(&small, 2, 1, T0), Outcome::Capacity);
    });
}

#[test]
fn response_age_boundaries_are_120_and_121_seconds() {
    on_both(8, WINDOW_SECS, |reg| {
        assert_eq!(reserve(reg, 7, 7, T0), Outcome::New);
        complete(reg, 7, 7, 200, b"r", T0 + 100);
        assert_eq!(reserve(reg, 7, 7, T0 + 220), done(200, b"r", T0 + 100));
        assert_eq!(reserve(reg, 7, 7, T0 + 221), Outcome::Expired);
        // Expired is final for the window: later calls do not bring the response back.
        assert_eq!(reserve(reg, 7, 7, T0 + 221), Outcome::Expired);
        assert_eq!(reserve(reg, 7, 7, T0 + 600), Outcome::New);
    });
}

#[test]
fn failed_routes_stay_reserved_with_their_failure() {
    on_both(8, WINDOW_SECS, |reg| {
        let body = br#"{"error":"forward_failed"}"#;
        assert_eq!(reserve(reg, 3, 1, T0), Outcome::New);
        complete(reg, 3, 1, 502, body, T0 + 16);
        assert_eq!(reserve(reg, 3, 1, T0 + 17), done(502, body, T0 + 16));
        assert_eq!(reserve(reg, 3, 2, T0 + 17), Outcome::Conflict);
        assert_eq!(reserve(reg, 3, 1, T0 + 137), Outcome::Expired);
        assert_eq!(reg.live(T0 + 599), 1);
        assert_eq!(reserve(reg, 3, 1, T0 + 600), Outcome::New);
    });
}

#[test]
fn complete_needs_a_live_reservation_in_flight_for_the_same_request() {
    on_both(8, WINDOW_SECS, |reg| {
        let not_in_flight = |r: Result<(), ReplayError>| matches!(r, Err(ReplayError::NotInFlight));
        // Never reserved.
        assert!(not_in_flight(reg.complete(rid(1), dg(1), 200, b"x", T0)));
        assert_eq!(reserve(reg, 1, 1, T0), Outcome::New);
        // Another request's digest.
        assert!(not_in_flight(reg.complete(rid(1), dg(2), 200, b"x", T0)));
        complete(reg, 1, 1, 200, b"first", T0 + 1);
        // Twice: the first response is kept.
        assert!(not_in_flight(reg.complete(
            rid(1),
            dg(1),
            500,
            b"second",
            T0 + 2
        )));
        assert_eq!(reserve(reg, 1, 1, T0 + 2), done(200, b"first", T0 + 1));
        // After the window ended.
        assert_eq!(reserve(reg, 2, 1, T0 + 10), Outcome::New);
        assert!(not_in_flight(reg.complete(
            rid(2),
            dg(1),
            200,
            b"late",
            T0 + 610
        )));
        assert_eq!(reg.live(T0 + 610), 0);
    });
}

#[test]
fn times_beyond_sqlite_integers_are_refused_by_both_stores() {
    on_both(8, WINDOW_SECS, |reg| {
        assert!(matches!(
            reg.reserve(rid(1), dg(1), u64::MAX),
            Err(ReplayError::Store(StoreError::TimeOutOfRange(u64::MAX)))
        ));
        assert_eq!(reserve(reg, 1, 1, T0), Outcome::New);
        assert!(matches!(
            reg.complete(rid(1), dg(1), 200, b"", u64::MAX),
            Err(ReplayError::Store(StoreError::TimeOutOfRange(_)))
        ));
        assert_eq!(reserve(reg, 1, 1, T0), Outcome::InFlight);
    });
}

#[test]
fn a_clock_that_steps_back_neither_frees_nor_expires_anything() {
    on_both(8, WINDOW_SECS, |reg| {
        assert_eq!(reserve(reg, 1, 1, T0 + 100), Outcome::New);
        complete(reg, 1, 1, 200, b"ok", T0 + 100);
        // Earlier than the reservation and the completion: still reserved, still fresh.
        assert_eq!(reserve(reg, 1, 1, T0), done(200, b"ok", T0 + 100));
        assert_eq!(reserve(reg, 1, 2, T0), Outcome::Conflict);
        assert_eq!(reg.live(T0), 1);
    });
}

/// Fills `capacity` routes, reserved at `T0 + i / per_second`, and completes every other one.
fn fill(reg: &ReplayRegistry, capacity: u32, per_second: u32) {
    for i in 0..capacity {
        let now = T0 + u64::from(i / per_second);
        assert_eq!(reserve(reg, i, 1, now), Outcome::New, "route {i}");
        if i % 2 == 0 {
            complete(reg, i, 1, 200, b"ok", now);
        }
    }
}

fn check_capacity(reg: &ReplayRegistry, capacity: u32, per_second: u32) {
    fill(reg, capacity, per_second);
    let filled = T0 + u64::from((capacity - 1) / per_second);
    assert_eq!(reg.live(filled), capacity as usize);
    // One more route is refused, and refusing it changes nothing.
    assert_eq!(reserve(reg, capacity, 1, filled), Outcome::Capacity);
    assert_eq!(reserve(reg, capacity + 1, 9, filled), Outcome::Capacity);
    assert_eq!(reg.live(filled), capacity as usize);
    // Nothing live was evicted, completed or not.
    let last_done = (capacity - 1) & !1;
    assert_eq!(
        reserve(reg, last_done, 1, filled),
        done(200, b"ok", T0 + u64::from(last_done / per_second))
    );
    assert_eq!(reserve(reg, 0, 1, T0 + 599), Outcome::Expired);
    assert_eq!(reserve(reg, 1, 1, T0 + 599), Outcome::InFlight);
    assert_eq!(reserve(reg, 1, 2, T0 + 599), Outcome::Conflict);
    assert_eq!(reserve(reg, capacity, 1, T0 + 599), Outcome::Capacity);
    // The oldest window ends: exactly its routes' slots free up.
    let oldest = per_second.min(capacity);
    for k in 0..oldest {
        assert_eq!(reserve(reg, capacity + k, 1, T0 + 600), Outcome::New);
    }
    assert_eq!(
        reserve(reg, capacity + oldest, 1, T0 + 600),
        Outcome::Capacity
    );
    assert_eq!(reg.live(T0 + 600), capacity as usize);
    // A route of the ended window is free again once there is room.
    assert_eq!(reserve(reg, 0, 1, T0 + 600), Outcome::Capacity);
    if capacity > per_second {
        let next = T0 + 601;
        assert_eq!(reserve(reg, 0, 1, next), Outcome::New);
    }
}

#[test]
fn capacity_refuses_new_routes_and_never_evicts_a_live_one() {
    on_both(64, WINDOW_SECS, |reg| check_capacity(reg, 64, 1));
}

#[test]
fn capacity_with_the_real_default_capacity() {
    on_both(CAPACITY, WINDOW_SECS, |reg| {
        check_capacity(reg, CAPACITY as u32, 32);
    });
}

#[test]
fn one_source_holds_at_most_its_share_until_its_routes_end() {
    let a = Some(SourceKey::Net(std::net::IpAddr::from([10, 0, 1, 0])));
    let b = Some(SourceKey::Net(std::net::IpAddr::from([10, 0, 2, 0])));
    let reg = ReplayRegistry::memory(8, 600).with_source_share(25);
    for n in 0..2 {
        assert_eq!(
            reg.reserve_from(rid(n), dg(1), T0, a).unwrap(),
            Outcome::New
        );
    }
    assert_eq!(
        reg.reserve_from(rid(2), dg(1), T0, a).unwrap(),
        Outcome::ShareExceeded
    );
    // A duplicate of its own route is still answered, not refused.
    assert_eq!(
        reg.reserve_from(rid(0), dg(1), T0, a).unwrap(),
        Outcome::InFlight
    );
    for n in 10..12 {
        assert_eq!(
            reg.reserve_from(rid(n), dg(1), T0, b).unwrap(),
            Outcome::New
        );
    }
    for n in 20..24 {
        assert_eq!(reg.reserve(rid(n), dg(1), T0 + 1).unwrap(), Outcome::New);
    }
    assert_eq!(
        reg.reserve(rid(30), dg(1), T0 + 1).unwrap(),
        Outcome::Capacity
    );
    // The window ends: the share comes back.
    assert_eq!(
        reg.reserve_from(rid(3), dg(1), T0 + 600, a).unwrap(),
        Outcome::New
    );
}

#[test]
fn capacity_zero_refuses_everything() {
    on_both(0, WINDOW_SECS, |reg| {
        assert_eq!(reserve(reg, 1, 1, T0), Outcome::Capacity);
        assert_eq!(reg.live(T0), 0);
    });
}

#[test]
fn registry_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ReplayRegistry>();
}

#[test]
fn concurrent_duplicates_get_exactly_one_new() {
    on_both(64, WINDOW_SECS, |reg| {
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| reserve(reg, 42, 1, T0)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outcomes.iter().filter(|o| **o == Outcome::New).count(), 1);
        assert_eq!(
            outcomes.iter().filter(|o| **o == Outcome::InFlight).count(),
            7
        );
    });
}

#[test]
fn the_connection_is_wal_synchronous_full_with_a_busy_timeout() {
    let dir = fast_dir();
    let reg =
        ReplayRegistry::open_sqlite(&dir.path().join("replay.db"), 8, WINDOW_SECS, T0).unwrap();
    let conn = reg.group.as_ref().unwrap().conn();
    let pragma = |name: &str| -> String {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| {
            r.get::<_, rusqlite::types::Value>(0)
        })
        .map(|v| match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t,
            other => format!("{other:?}"),
        })
        .unwrap()
    };
    assert_eq!(pragma("journal_mode"), "wal");
    assert_eq!(pragma("synchronous"), "2"); // FULL
    assert_eq!(pragma("busy_timeout"), "5000");
}

/// A batch holding a reservation is committed with an fsync (`synchronous=FULL`); a flush of
/// stored answers only is not (`NORMAL`): it reaches the disk with the next reservation's.
#[test]
fn only_a_batch_with_a_reservation_pays_an_fsync() {
    let dir = fast_dir();
    let reg =
        ReplayRegistry::open_sqlite(&dir.path().join("replay.db"), 8, WINDOW_SECS, T0).unwrap();
    let synchronous = |reg: &ReplayRegistry| -> i64 {
        let conn = reg.group.as_ref().unwrap().conn();
        conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    assert_eq!(synchronous(&reg), 2); // FULL
    complete(&reg, 1, 1, 200, b"ok", T0 + 1);
    reg.flush().unwrap();
    assert_eq!(synchronous(&reg), 1); // NORMAL
    assert_eq!(reserve(&reg, 2, 2, T0 + 2), Outcome::New);
    assert_eq!(synchronous(&reg), 2);
}

#[test]
fn reservations_are_committed_before_the_call_returns_answers_with_the_next_write() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    // Another connection sees it while the registry is still open.
    assert_eq!(rows(&path), vec![(rid(1).to_vec(), 0, None, None)]);
    // A stored answer is in the mirror at once, in the file with the next write.
    complete(&reg, 1, 1, 201, b"done", T0 + 1);
    assert_eq!(reserve(&reg, 1, 1, T0 + 1), done(201, b"done", T0 + 1));
    assert_eq!(reg.unwritten(), 1);
    assert_eq!(rows(&path), vec![(rid(1).to_vec(), 0, None, None)]);
    let commits = reg.group_commits();
    assert_eq!(reserve(&reg, 2, 2, T0 + 2), Outcome::New);
    assert_eq!(
        reg.group_commits(),
        commits + 1,
        "carried by the reservation's commit"
    );
    assert_eq!(reg.unwritten(), 0);
    assert_eq!(
        rows(&path),
        vec![
            (rid(1).to_vec(), 1, Some(201), Some(b"done".to_vec())),
            (rid(2).to_vec(), 0, None, None)
        ]
    );
    // With no reservation to carry it, a flush writes it.
    complete(&reg, 2, 2, 502, b"failed", T0 + 3);
    reg.flush().unwrap();
    assert_eq!(
        rows(&path)[1],
        (rid(2).to_vec(), 1, Some(502), Some(b"failed".to_vec()))
    );
    let commits = reg.group_commits();
    reg.flush().unwrap();
    assert_eq!(
        reg.group_commits(),
        commits,
        "nothing to write: no transaction"
    );
    // Outcomes other than New write nothing.
    assert_eq!(reserve(&reg, 1, 2, T0 + 4), Outcome::Conflict);
    assert_eq!(rows(&path).len(), 2);
}

#[test]
fn purged_rows_leave_the_file_with_the_next_write() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    for i in 0..4 {
        assert_eq!(reserve(&reg, i, 1, T0), Outcome::New);
    }
    // Purged from memory only.
    assert_eq!(reg.live(T0 + 600), 0);
    assert_eq!(rows(&path).len(), 4);
    // The next reservation deletes them in its own transaction (even the reused route id).
    assert_eq!(reserve(&reg, 2, 2, T0 + 600), Outcome::New);
    assert_eq!(rows(&path), vec![(rid(2).to_vec(), 0, None, None)]);
}

#[test]
fn a_reopened_registry_answers_as_before() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    complete(&reg, 1, 1, 200, b"ok", T0 + 1);
    assert_eq!(reserve(&reg, 2, 2, T0 + 2), Outcome::New);
    complete(&reg, 2, 2, 502, b"failed", T0 + 3);
    drop(reg);

    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 50).unwrap();
    assert_eq!(reg.live(T0 + 50), 2);
    assert_eq!(reserve(&reg, 1, 1, T0 + 50), done(200, b"ok", T0 + 1));
    assert_eq!(reserve(&reg, 1, 9, T0 + 50), Outcome::Conflict);
    assert_eq!(reserve(&reg, 2, 2, T0 + 50), done(502, b"failed", T0 + 3));
    assert_eq!(reserve(&reg, 3, 3, T0 + 50), Outcome::New);
    drop(reg);

    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 200).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0 + 200), Outcome::Expired);
    assert_eq!(reserve(&reg, 2, 2, T0 + 200), Outcome::Expired);
    assert_eq!(reserve(&reg, 2, 1, T0 + 200), Outcome::Conflict);
    // Route 3 was still in flight when its registry went away.
    assert_eq!(reserve(&reg, 3, 3, T0 + 200), interrupted(T0 + 200));
    drop(reg);

    // Routes 1 and 2 end their window before this open and leave the file.
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 603).unwrap();
    assert_eq!(reg.live(T0 + 603), 1);
    assert_eq!(rows(&path).len(), 1);
    assert_eq!(reserve(&reg, 1, 1, T0 + 603), Outcome::New);
    assert_eq!(reserve(&reg, 3, 3, T0 + 603), Outcome::Expired);
}

#[test]
fn a_route_left_in_flight_replays_route_interrupted_never_new() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    drop(reg);

    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 30).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0 + 30), interrupted(T0 + 30));
    assert_eq!(reserve(&reg, 1, 2, T0 + 30), Outcome::Conflict);
    assert!(matches!(
        reg.complete(rid(1), dg(1), 200, b"too late", T0 + 31),
        Err(ReplayError::NotInFlight)
    ));
    drop(reg);

    // A second restart keeps the same answer: it was stored, not recomputed.
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 100).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0 + 150), interrupted(T0 + 30));
    assert_eq!(reserve(&reg, 1, 1, T0 + 151), Outcome::Expired);
}

#[test]
fn a_smaller_capacity_at_reopen_keeps_every_live_route() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    for i in 0..6 {
        assert_eq!(reserve(&reg, i, 1, T0 + u64::from(i)), Outcome::New);
    }
    drop(reg);
    let reg = ReplayRegistry::open_sqlite(&path, 4, WINDOW_SECS, T0 + 10).unwrap();
    assert_eq!(reg.live(T0 + 10), 6);
    assert_eq!(reserve(&reg, 5, 1, T0 + 10), interrupted(T0 + 10));
    assert_eq!(reserve(&reg, 100, 1, T0 + 10), Outcome::Capacity);
    // Three windows end: 3 live, room for one.
    assert_eq!(reserve(&reg, 100, 1, T0 + 602), Outcome::New);
    assert_eq!(reserve(&reg, 101, 1, T0 + 602), Outcome::Capacity);
}

#[test]
fn a_file_that_is_not_a_registry_is_refused() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    std::fs::write(&path, b"this is not a database, not even close to one.").unwrap();
    assert!(matches!(
        ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0),
        Err(ReplayError::Store(StoreError::Open(
            guard::sqlite::OpenError::Sqlite { .. }
        )))
    ));
}

#[test]
fn corrupt_rows_are_refused_at_open() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    drop(ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO replay_routes (route_id, digest, reserved_at, state, status, body,
         completed_at) VALUES (?1, ?2, ?3, 1, 70000, x'00', ?3)",
        params![&rid(1)[..], &dg(1)[..], T0 as i64],
    )
    .unwrap();
    drop(conn);
    let err = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::Store(StoreError::Corrupt {
                what: "status out of range",
                ..
            })
        ),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn the_database_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    for file in ["replay.db", "replay.db-wal"] {
        let mode = std::fs::metadata(dir.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
}

/// In-process stand-in for a crash: the registry is leaked, so its connection is never closed
/// (no checkpoint, the WAL stays as it is), and a second registry opens the same file meanwhile.
/// The real kill -9 is `kill_9_right_after_reserve_loses_nothing` below.
#[test]
fn a_registry_that_never_closed_its_connection_loses_nothing() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0), Outcome::New);
    assert_eq!(reserve(&reg, 2, 2, T0), Outcome::New);
    complete(&reg, 2, 2, 200, b"ok", T0 + 1);
    // Route 3's reservation carries route 2's answer; route 3's own answer is not written yet.
    assert_eq!(reserve(&reg, 3, 3, T0 + 1), Outcome::New);
    complete(&reg, 3, 3, 200, b"lost", T0 + 2);
    std::mem::forget(reg);
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 5).unwrap();
    assert_eq!(reserve(&reg, 1, 1, T0 + 5), interrupted(T0 + 5));
    assert_eq!(reserve(&reg, 2, 2, T0 + 5), done(200, b"ok", T0 + 1));
    // An answer not yet written is lost with the process: the route never runs again.
    assert_eq!(reserve(&reg, 3, 3, T0 + 5), interrupted(T0 + 5));
}

const KILL9_ENV: &str = "BLINDRELAY_REPLAY_KILL9_DB";
const KILL9_READY: &str = "KILL9-CHILD-READY";

/// The child half of `kill_9_right_after_reserve_loses_nothing`: does nothing unless the parent
/// started this test binary with `KILL9_ENV` set; then writes, says so, and waits to be killed.
#[test]
fn kill_9_child() {
    let Some(path) = std::env::var_os(KILL9_ENV) else {
        return;
    };
    let reg = ReplayRegistry::open_sqlite(Path::new(&path), 8, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 2, 2, T0), Outcome::New);
    complete(&reg, 2, 2, 200, b"ok", T0 + 1);
    // A reservation never completed.
    assert_eq!(reserve(&reg, 1, 1, T0 + 2), Outcome::New);
    // An answer written by a flush, alone in its batch, without an fsync of its own
    // (`synchronous=NORMAL`), which a process kill does not lose.
    assert_eq!(reserve(&reg, 3, 3, T0 + 2), Outcome::New);
    complete(&reg, 3, 3, 200, b"last", T0 + 3);
    reg.flush().unwrap();
    // An answer stored after the last write: in memory only, lost with the process.
    assert_eq!(reserve(&reg, 4, 4, T0 + 3), Outcome::New);
    complete(&reg, 4, 4, 200, b"unwritten", T0 + 3);
    let mut out = std::io::stdout();
    writeln!(out, "{KILL9_READY}").unwrap();
    out.flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real kill -9: this test binary runs `kill_9_child` in a child process, which reserves and
/// completes routes in a registry and then waits; as soon as it says it is done, it gets SIGKILL
/// (`Child::kill`), with no chance to close anything. The reopened file has every write; an
/// answer stored after the last write reads as interrupted.
#[cfg(unix)]
#[test]
fn kill_9_right_after_reserve_loses_nothing() {
    use std::os::unix::process::ExitStatusExt;

    let dir = fast_dir();
    let path: PathBuf = dir.path().join("replay.db");
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "replay::registry::tests::kill_9_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILL9_ENV, &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().unwrap();
    let mut ready = false;
    for line in BufReader::new(stdout).lines() {
        if line.unwrap().contains(KILL9_READY) {
            ready = true;
            break;
        }
    }
    assert!(ready, "the child stopped before it was ready");
    child.0.kill().unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(9));
    drop(child);

    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0 + 10).unwrap();
    assert_eq!(reg.live(T0 + 10), 4);
    assert_eq!(reserve(&reg, 1, 1, T0 + 10), interrupted(T0 + 10));
    assert_eq!(reserve(&reg, 1, 2, T0 + 10), Outcome::Conflict);
    assert_eq!(reserve(&reg, 2, 2, T0 + 10), done(200, b"ok", T0 + 1));
    assert_eq!(reserve(&reg, 3, 3, T0 + 10), done(200, b"last", T0 + 3));
    assert_eq!(reserve(&reg, 4, 4, T0 + 10), interrupted(T0 + 10));
}

// ---- group commit ---------------------------------------------------------------------------

/// The registry's group commit.
type Group = GroupCommit<Connection, Queued, (), ReplayError>;

/// Polls `cond` on the registry's group commit until it holds (bounded: 10 s).
fn wait_until(reg: &ReplayRegistry, what: &str, cond: impl Fn(&Group) -> bool) {
    let start = crate::clock::now();
    while !cond(reg.group.as_ref().unwrap()) {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::yield_now();
    }
}

/// Another connection holding the write lock of `path` until dropped (or committed).
fn hold_write_lock(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    conn
}

#[test]
fn a_reservation_is_not_reported_before_its_commit() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 8, WINDOW_SECS, T0).unwrap();
    let holder = hold_write_lock(&path);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        scope.spawn(|| {
            let tx = tx;
            tx.send(reserve(&reg, 1, 1, T0)).unwrap();
        });
        // The caller leads a batch: it holds the connection, waiting for the file's lock.
        wait_until(&reg, "a batch in progress", |g| {
            g.committing() && g.queued() == 0
        });
        assert!(rx.try_recv().is_err(), "reported before its commit");
        assert!(rows(&path).is_empty());
        // Meanwhile a duplicate is refused as in flight and a completion is refused.
        assert_eq!(reserve(&reg, 1, 1, T0), Outcome::InFlight);
        assert!(matches!(
            reg.complete(rid(1), dg(1), 200, b"x", T0),
            Err(ReplayError::NotInFlight)
        ));
        holder.execute_batch("COMMIT").unwrap();
        assert_eq!(rx.recv().unwrap(), Outcome::New);
        assert_eq!(rows(&path), vec![(rid(1).to_vec(), 0, None, None)]);
    });
}

#[test]
fn writes_waiting_together_share_one_commit_and_a_failed_batch_fails_each_member() {
    let dir = fast_dir();
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 64, WINDOW_SECS, T0).unwrap();
    assert_eq!(reserve(&reg, 100, 1, T0), Outcome::New);
    let commits_before = reg.group_commits();
    let holder = hold_write_lock(&path);
    let results: Vec<(u32, Result<Outcome, String>)> = std::thread::scope(|scope| {
        // The leader: waits for the file's lock with its own write only.
        let leader = scope.spawn(|| (1, reg.reserve(rid(1), dg(1), T0)));
        wait_until(&reg, "the leader committing", |g| g.committing());
        // An answer stored now waits for the next batch, without waiting itself…
        complete(&reg, 100, 1, 200, b"ok", T0);
        // …and three followers queue behind the leader: that next batch.
        let mut handles = vec![leader];
        for n in [2u32, 3, 4] {
            let reg = &reg;
            handles.push(scope.spawn(move || (n, reg.reserve(rid(n), dg(1), T0))));
        }
        wait_until(&reg, "three writes queued", |g| g.queued() == 3);
        // A row the registry does not know makes route 3's insert fail: its whole batch fails.
        holder
            .execute(
                "INSERT INTO replay_routes (route_id, digest, reserved_at, state)
                 VALUES (?1, ?2, ?3, 0)",
                params![&rid(3)[..], &dg(9)[..], T0 as i64],
            )
            .unwrap();
        holder.execute_batch("COMMIT").unwrap();
        handles
            .into_iter()
            .map(|h| {
                let (n, r) = h.join().unwrap();
                (n, r.map_err(|e| e.to_string()))
            })
            .collect()
    });
    let mut results = results;
    results.sort_by_key(|(n, _)| *n);
    assert_eq!(results[0], (1, Ok(Outcome::New)));
    for (n, r) in &results[1..] {
        let err = r
            .as_ref()
            .expect_err("a member of the failed batch succeeded");
        assert!(err.starts_with("group commit failed"), "{n}: {err}");
    }
    // Two transactions: the leader's alone, then the three others together.
    assert_eq!(reg.group_commits() - commits_before, 2);
    // Nothing of the failed batch is in the file or the mirror: the routes can be reserved
    // again. The answer it carried is kept for the next batch (and answered from the mirror).
    let in_file: Vec<Vec<u8>> = rows(&path).into_iter().map(|r| r.0).collect();
    assert!(!in_file.contains(&rid(2).to_vec()) && !in_file.contains(&rid(4).to_vec()));
    assert_eq!(reg.unwritten(), 1);
    assert_eq!(reserve(&reg, 100, 1, T0), done(200, b"ok", T0));
    assert_eq!(reserve(&reg, 2, 1, T0), Outcome::New);
    assert_eq!(reserve(&reg, 4, 1, T0), Outcome::New);
    assert_eq!(reg.unwritten(), 0);
    let hundred = rows(&path).into_iter().find(|r| r.0 == rid(100).to_vec());
    assert_eq!(
        hundred,
        Some((rid(100).to_vec(), 1, Some(200), Some(b"ok".to_vec())))
    );
}

#[test]
fn a_batch_holds_at_most_its_bounds() {
    let mut queue = crate::sqlite::group_commit::Queue::new(LIMITS);
    for n in 0..(MAX_BATCH_WRITES as u32 + 3) {
        let write = Queued::Reserve {
            tag: rid(n),
            digest: dg(1),
            reserved_at: 0,
        };
        queue.push(u64::from(n), 0, write);
    }
    assert_eq!(queue.take_batch().len(), MAX_BATCH_WRITES);
    assert_eq!(queue.take_batch().len(), 3);
    assert!(queue.take_batch().is_empty());
}

// ---- property test: memory, sqlite and a plain model agree -------------------------------

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        route: u8,
        digest: u8,
    },
    Complete {
        route: u8,
        digest: u8,
        status: u16,
    },
    /// Completes the route that last got `New`, with its digest.
    CompleteLast {
        status: u16,
    },
    Advance(u64),
    Restart,
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![Just(200u16), Just(502u16)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..10, 0u8..2).prop_map(|(route, digest)| Op::Reserve { route, digest }),
        2 => (0u8..10, 0u8..2, status())
            .prop_map(|(route, digest, status)| Op::Complete { route, digest, status }),
        3 => status().prop_map(|status| Op::CompleteLast { status }),
        3 => prop_oneof![0u64..5, 0u64..130, 100u64..700].prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

/// The rules written as plainly as possible: a list of every reservation ever made.
#[derive(Default)]
struct Model {
    /// `(route, digest, reserved_at, response)`
    routes: Vec<(ReplayTag, Digest, u64, Option<StoredResponse>)>,
}

impl Model {
    fn live_index(&self, tag: &ReplayTag, now: u64, window: u64) -> Option<usize> {
        self.routes
            .iter()
            .position(|(r, _, at, _)| r == tag && now < at + window)
    }

    fn live(&self, now: u64, window: u64) -> usize {
        self.routes
            .iter()
            .filter(|(_, _, at, _)| now < at + window)
            .count()
    }

    fn reserve(&mut self, r: ReplayTag, d: Digest, now: u64, cap: usize, window: u64) -> Outcome {
        if let Some(i) = self.live_index(&r, now, window) {
            let (_, digest, _, response) = &self.routes[i];
            return if *digest != d {
                Outcome::Conflict
            } else {
                match response {
                    None => Outcome::InFlight,
                    Some(resp) if now - resp.completed_at <= RESPONSE_MAX_AGE_SECS => {
                        Outcome::Duplicate(resp.clone())
                    }
                    Some(_) => Outcome::Expired,
                }
            };
        }
        if self.live(now, window) >= cap {
            return Outcome::Capacity;
        }
        self.routes.push((r, d, now, None));
        Outcome::New
    }

    fn complete(
        &mut self,
        r: ReplayTag,
        d: Digest,
        status: u16,
        body: &[u8],
        now: u64,
        window: u64,
    ) -> bool {
        match self.live_index(&r, now, window) {
            Some(i) if self.routes[i].1 == d && self.routes[i].3.is_none() => {
                self.routes[i].3 = Some(StoredResponse {
                    status,
                    body: body.to_vec(),
                    completed_at: now,
                });
                true
            }
            _ => false,
        }
    }

    fn restart(&mut self, now: u64, window: u64) {
        for (_, _, at, response) in &mut self.routes {
            if now < *at + window && response.is_none() {
                *response = Some(StoredResponse {
                    status: INTERRUPTED_STATUS,
                    body: INTERRUPTED_BODY.to_vec(),
                    completed_at: now,
                });
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        // Failing seeds go next to this file: tests.proptest-regressions.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_sqlite_and_the_model_agree(
        ops in proptest::collection::vec(op(), 1..80),
        capacity in prop_oneof![1 => Just(0usize), 8 => 1usize..9],
        window in prop_oneof![Just(WINDOW_SECS), Just(200u64)],
    ) {
        let dir = fast_dir();
        let path = dir.path().join("replay.db");
        let memory = ReplayRegistry::memory(capacity, window);
        let mut sqlite = ReplayRegistry::open_sqlite(&path, capacity, window, T0).unwrap();
        let mut model = Model::default();
        let mut now = T0;
        let mut last_new = (0u8, 0u8);
        for op in ops {
            let op = match op {
                Op::CompleteLast { status } => {
                    Op::Complete { route: last_new.0, digest: last_new.1, status }
                }
                op => op,
            };
            match op {
                Op::Reserve { route, digest } => {
                    let (r, d) = (rid(route.into()), dg(digest));
                    let m = memory.reserve(r, d, now).unwrap();
                    let s = sqlite.reserve(r, d, now).unwrap();
                    prop_assert_eq!(&m, &s);
                    if m == Outcome::New {
                        last_new = (route, digest);
                    }
                    prop_assert_eq!(m, model.reserve(r, d, now, capacity, window));
                }
                Op::Complete { route, digest, status } => {
                    let (r, d) = (rid(route.into()), dg(digest));
                    let body = format!("{status}@{now}").into_bytes();
                    let m = memory.complete(r, d, status, &body, now).map_err(|e| e.to_string());
                    let s = sqlite.complete(r, d, status, &body, now).map_err(|e| e.to_string());
                    prop_assert_eq!(&m, &s);
                    prop_assert_eq!(m.is_ok(), model.complete(r, d, status, &body, now, window));
                }
                Op::CompleteLast { .. } => unreachable!("replaced above"),
                Op::Advance(secs) => now += secs,
                Op::Restart => {
                    drop(sqlite);
                    sqlite = ReplayRegistry::open_sqlite(&path, capacity, window, now).unwrap();
                    memory.simulate_restart(now);
                    model.restart(now, window);
                }
            }
            let live = memory.live(now);
            prop_assert!(live <= capacity);
            prop_assert_eq!(live, sqlite.live(now));
            prop_assert_eq!(live, model.live(now, window));
        }
        // The file holds at most the live rows plus the purged ones not yet deleted, and a
        // reopen loads exactly the live ones.
        drop(sqlite);
        let reopened = ReplayRegistry::open_sqlite(&path, capacity, window, now).unwrap();
        prop_assert_eq!(reopened.live(now), model.live(now, window));
        prop_assert_eq!(rows(&path).len(), model.live(now, window));
    }
}
