//! The route replay registry's operations against an in-memory model of its rules: reserve
//! (with a source's share and a frame dated ahead), complete, count, and, on SQLite, restart
//! (drop the registry and reopen the same file: a stop writes the stored answers and deletions
//! still waiting, so every answer given survives it; what kill -9 loses is the `kill_9` test's).
//!
//! Oracle: every outcome, every `complete` result and every live count equals the model's; no
//! route ever gets `New` twice within its window.
#![no_main]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use blindrelay::replay::{
    INTERRUPTED_BODY, INTERRUPTED_STATUS, Outcome, RESPONSE_MAX_AGE_SECS, ReplayError,
    ReplayRegistry, StoredResponse,
};
use blindrelay::sources::SourceKey;
use libfuzzer_sys::fuzz_target;

const CAPACITY: usize = 8;
const WINDOW: u64 = 600;
const START: u64 = 1_764_450_000;

#[derive(Clone)]
struct Entry {
    digest: [u8; 32],
    reserved_at: u64,
    response: Option<StoredResponse>,
    source: Option<SourceKey>,
}

struct Model {
    entries: HashMap<[u8; 16], Entry>,
    share: usize,
}

impl Model {
    fn purge(&mut self, now: u64) {
        let ended: Vec<[u8; 16]> = self
            .entries
            .iter()
            .filter(|(_, e)| e.reserved_at.saturating_add(WINDOW) <= now)
            .map(|(r, _)| *r)
            .collect();
        for r in ended {
            self.entries.remove(&r);
        }
    }

    fn reserve(
        &mut self,
        route: [u8; 16],
        digest: [u8; 32],
        now: u64,
        last_fresh: u64,
        source: Option<SourceKey>,
    ) -> Outcome {
        self.purge(now);
        if let Some(e) = self.entries.get(&route) {
            if e.digest != digest {
                return Outcome::Conflict;
            }
            return match &e.response {
                None => Outcome::InFlight,
                Some(r) if now.saturating_sub(r.completed_at) <= RESPONSE_MAX_AGE_SECS => {
                    Outcome::Duplicate(r.clone())
                }
                Some(_) => Outcome::Expired,
            };
        }
        if let Some(key) = source
            && self
                .entries
                .values()
                .filter(|e| e.source == Some(key))
                .count()
                >= self.share
        {
            return Outcome::ShareExceeded;
        }
        if self.entries.len() >= CAPACITY {
            return Outcome::Capacity;
        }
        let reserved_at = now.max(last_fresh.saturating_add(1).saturating_sub(WINDOW));
        self.entries.insert(
            route,
            Entry {
                digest,
                reserved_at,
                response: None,
                source,
            },
        );
        Outcome::New
    }

    fn complete(
        &mut self,
        route: [u8; 16],
        digest: [u8; 32],
        status: u16,
        body: &[u8],
        now: u64,
    ) -> bool {
        self.purge(now);
        match self.entries.get_mut(&route) {
            Some(e) if e.digest == digest && e.response.is_none() => {
                e.response = Some(StoredResponse {
                    status,
                    body: body.to_vec(),
                    completed_at: now,
                });
                true
            }
            _ => false,
        }
    }

    /// Dropping the registry and reopening the file: the rows of purged entries were deleted
    /// by the drop's write (a wall clock stepped back does not revive them), rows whose window
    /// has ended at `now` are deleted by the open, and what was in flight reads as interrupted.
    fn restart(&mut self, now: u64) {
        self.purge(now);
        for e in self.entries.values_mut() {
            e.source = None;
            if e.response.is_none() {
                e.response = Some(StoredResponse {
                    status: INTERRUPTED_STATUS,
                    body: INTERRUPTED_BODY.to_vec(),
                    completed_at: now,
                });
            }
        }
    }
}

fn db_path() -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!(
        "relayguard-fuzz-replay-{}.sqlite",
        std::process::id()
    ))
}

fn remove_db(path: &PathBuf) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

fuzz_target!(|data: &[u8]| {
    let [sel, ops @ ..] = data else { return };
    let sqlite = sel & 1 == 1;
    let percent = sel >> 1; // 0..=127, capped at 100 by the registry
    let share = (CAPACITY * usize::from(percent.min(100)) / 100).max(1);
    let path = db_path();
    let open = |now| {
        if sqlite {
            ReplayRegistry::open_sqlite(&path, CAPACITY, WINDOW, now).expect("opens")
        } else {
            ReplayRegistry::memory(CAPACITY, WINDOW)
        }
        .with_source_share(percent)
    };
    if sqlite {
        remove_db(&path);
    }
    let mut now = START;
    let mut latest = now;
    let mut reg = open(now);
    let mut model = Model {
        entries: HashMap::new(),
        share,
    };
    let mut news: HashMap<[u8; 16], u64> = HashMap::new();

    // Each operation: [op][route][digest][time step].
    for op in ops.chunks_exact(4).take(64) {
        let [kind, route, digest, step] = *op else {
            unreachable!()
        };
        now = match step {
            0..=199 => now + u64::from(step),
            200..=249 => now + u64::from(step - 199) * 60,
            // The wall clock may step back.
            _ => now.saturating_sub(u64::from(step - 249) * 30),
        };
        latest = latest.max(now);
        let route_id = [route % 12; 16];
        let digest_v = [digest % 3; 32];
        match kind % 4 {
            0 | 1 => {
                let source = match digest >> 4 {
                    0..=5 => None,
                    n => Some(SourceKey::Net(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n % 3)))),
                };
                let ahead = if kind & 0x10 != 0 {
                    u64::from(kind >> 5) * 200
                } else {
                    0
                };
                let last_fresh = (now + WINDOW - 1).max(now + ahead);
                let want = model.reserve(route_id, digest_v, now, last_fresh, source);
                let got = reg
                    .reserve_through(route_id, digest_v, now, last_fresh, source)
                    .expect("reserve");
                assert_eq!(got, want, "reserve at {now}");
                if got == Outcome::New {
                    // Windows end by the latest time the registry was given: a wall clock that
                    // steps back after a forward jump does not revive purged routes' windows.
                    if let Some(&at) = news.get(&route_id) {
                        assert!(latest >= at + WINDOW, "route ran twice inside its window");
                    }
                    news.insert(route_id, now);
                }
            }
            2 => {
                let status = 200 + u16::from(kind >> 2);
                let body = vec![kind; usize::from(step % 8)];
                let want = model.complete(route_id, digest_v, status, &body, now);
                match reg.complete(route_id, digest_v, status, &body, now) {
                    Ok(()) => assert!(want, "completed what the model has not in flight"),
                    Err(ReplayError::NotInFlight) => assert!(!want, "refused a completion"),
                    Err(e) => panic!("complete: {e}"),
                }
            }
            _ => {
                if sqlite && kind & 4 != 0 {
                    drop(reg);
                    reg = open(now);
                    model.restart(now);
                }
                model.purge(now);
                assert_eq!(reg.live(now), model.entries.len(), "live at {now}");
            }
        }
    }
    drop(reg);
    if sqlite {
        remove_db(&path);
    }
});
