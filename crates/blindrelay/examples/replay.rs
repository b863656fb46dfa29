//! Replay reservations per second of the registry alone (`ReplayRegistry::open_sqlite` on a file
//! in `TMPDIR`, `synchronous=FULL`), with 1, 8, 32 and 128 threads reserving distinct tags at
//! once, and how many reservations shared one group commit (one fsync). With one thread every
//! reservation is its own commit, as every reservation was before group commit (callers were
//! serialized then). One registry for every row, after a warm-up row (a new file's first
//! commits also grow the write-ahead log, which costs a metadata sync each). Each row is
//! bounded: 2 s and 200 000 reservations.
//!
//! Run with `scripts/bench-blindrelay replay` (and `TMPDIR=/dev/shm` for tmpfs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blindrelay::replay::{Outcome, ReplayRegistry};

const RUN: Duration = Duration::from_secs(2);
const MAX: u64 = 200_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    println!("state in {}", dir.path().display());
    println!();
    println!("| threads | reservations/s | group commits/s | reservations per commit |");
    println!("|---:|---:|---:|---:|");
    let now = 1_800_000_000;
    let path = dir.path().join("replay.db");
    let reg = ReplayRegistry::open_sqlite(&path, 10_000_000, 600, now).expect("opens");
    let next = AtomicU64::new(0);
    for (row, threads) in [32usize, 1, 8, 32, 128, 1].into_iter().enumerate() {
        let live_before = reg.live(now) as f64;
        let limit = next.load(Ordering::Relaxed) + MAX;
        let commits_before = reg.group_commits();
        let t0 = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    while t0.elapsed() < RUN {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= limit {
                            break;
                        }
                        let mut tag = [0u8; 16];
                        tag[..8].copy_from_slice(&n.to_be_bytes());
                        let outcome = reg.reserve(tag, [1; 32], now).expect("reserves");
                        assert_eq!(outcome, Outcome::New);
                    }
                });
            }
        });
        let took = t0.elapsed().as_secs_f64();
        let done = reg.live(now) as f64 - live_before;
        if row == 0 {
            continue; // the warm-up
        }
        let commits = (reg.group_commits() - commits_before) as f64;
        println!(
            "| {threads} | {:.0} | {:.0} | {:.1} |",
            done / took,
            commits / took,
            done / commits.max(1.0)
        );
    }
}
