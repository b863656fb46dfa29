//! Measures the peer store (`peers.json`, `blindrelay::peers::cache`) at 10 000 and 100 000
//! nodes, in process, bounded (no network, no daemon):
//!
//! 1. `n` signed descriptors, each of its own identity, endpoint in its own /24 (391 /16s at
//!    100 000), so neither the view's per-block bound nor its per-source bound refuses one;
//! 2. a table holding all of them as reached, written as the node writes it
//!    (`cache::snapshot`, then `cache::save`): the time of each and the file's
//!    size;
//! 3. `cache::restore` of that file into a fresh table, [`RUNS`] times (median): the whole
//!    start-up path (read, parse, signatures checked in batches, every entry through the view's
//!    bounds), and apart the parse and the signature checks alone;
//! 4. the memory the restored table takes: the view's structures (`View::heap_bytes`), the
//!    descriptors themselves (`Signed`, its `Arc` and its endpoint string), and, measured in a
//!    child process of its own (a fresh heap), the resident set before and after a restore and
//!    its peak.
//!
//! Run with `scripts/bench-peer-store` (release build) or
//! `cargo run --release -p blindrelay --example peer_store [N...]` (default 10000 100000).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blindrelay::clock::Clock;
use blindrelay::discovery::{Kept, Signed, verify};
use blindrelay::peers::Peers;
use blindrelay::peers::cache::{self, PeerFile};
use blindrelay::proto::descriptor::{DESCRIPTOR_TTL, Descriptor};
use ed25519_dalek::SigningKey;

/// When the descriptors are signed (Unix seconds); the restores run a minute later.
const T0: u64 = 1_800_000_000;
/// Restores timed per size.
const RUNS: usize = 5;
const MIB: f64 = 1024.0 * 1024.0;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(Path::new(&args[1]), args[2].parse()?);
    }
    let sizes: Vec<usize> = if args.is_empty() {
        vec![10_000, 100_000]
    } else {
        args.iter().map(|a| a.parse()).collect::<Result<_, _>>()?
    };
    let dir = tempfile::tempdir()?;
    println!(
        "peer store: n descriptors, all reached; restore = read + parse + signatures (in \
         batches, on every CPU: {} here) + admit through the view's bounds; apart: parse, \
         verify (the signatures on one thread), admit; median of {RUNS}",
        std::thread::available_parallelism().map_or(1, |t| t.get())
    );
    println!(
        "| n | file MiB | snapshot ms | save ms | parse ms | verify ms | admit ms | restore ms | \
         kept | view MiB | descriptors MiB | RSS +MiB | peak RSS MiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut last = None;
    for n in sizes {
        let path = dir.path().join(format!("peers-{n}.json"));
        last = Some(measure(n, &path)?);
    }
    if let Some((n, heap)) = last {
        let names = ["table", "all", "passable", "expiry", "blocks", "roots"];
        let parts: Vec<String> = names
            .iter()
            .zip(heap)
            .map(|(name, b)| format!("{name} {:.2}", b as f64 / MIB))
            .collect();
        println!("view structures at {n} (MiB): {}", parts.join(", "));
    }
    Ok(())
}

/// One row of the table for `n` descriptors, the store written at `path`; the view's
/// structures after the last restore.
fn measure(n: usize, path: &Path) -> Result<(usize, [usize; 6]), Box<dyn std::error::Error>> {
    let ds = descriptors(n);
    let (snapshot, save) = write_store(&ds, path)?;
    let size = std::fs::metadata(path)?.len();
    let now = T0 + 60;
    let parse = median(|| {
        let file: Option<PeerFile> = guard::statefile::load_json(path).expect("the store parses");
        assert_eq!(file.map(|f| f.peers.len()), Some(n));
    });
    let verify = median(|| assert_eq!(verify::check(&ds, &[], now).len(), n));
    let checked = verify::check(&ds, &[], now);
    drop(ds);
    let kept = Kept {
        first_seen: T0,
        reached: Some(T0),
        root: None,
    };
    let mut admitted = Vec::new();
    let admit = median(|| {
        let peers = Peers::new(vec![], false, Clock::starting_at(now), [0; 32]);
        let entries = checked.iter().map(|s| (Arc::clone(s), kept));
        assert_eq!(peers.restore_all(entries), n);
        admitted.push(peers);
    });
    drop((admitted, checked));
    // Every table kept until all are timed: dropping one is no part of a restore.
    let mut restored = Vec::new();
    let restore = median(|| {
        let peers = Peers::new(vec![], false, Clock::starting_at(now), [0; 32]);
        assert_eq!(cache::restore(&peers, path), n, "every descriptor kept");
        restored.push(peers);
    });
    let peers = restored.pop().expect("restored");
    drop(restored);
    let (kept, heap, descriptors) = {
        let disc = peers.lock();
        let view = disc.view();
        let descriptors: usize = view
            .iter()
            .map(|e| std::mem::size_of::<Signed>() + 16 + e.s.d.endpoint.capacity())
            .sum();
        (view.len(), view.heap_bytes(), descriptors)
    };
    let (before, after, peak) = child_rss(path, n)?;
    println!(
        "| {n} | {:.1} | {} | {} | {} | {} | {} | {} | {kept} | {:.1} | {:.1} | {:.1} | {:.1} |",
        size as f64 / MIB,
        ms(snapshot),
        ms(save),
        ms(parse),
        ms(verify),
        ms(admit),
        ms(restore),
        heap.iter().sum::<usize>() as f64 / MIB,
        descriptors as f64 / MIB,
        after.saturating_sub(before) as f64 / 1024.0,
        peak as f64 / 1024.0,
    );
    Ok((n, heap))
}

/// `n` descriptors signed at [`T0`], each of its own key, at `https://A.B.C.D:7001` with A.B.C
/// distinct (a /24 each).
fn descriptors(n: usize) -> Vec<Descriptor> {
    let onion = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([7; 32]));
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..n)
            .step_by(per)
            .map(|from| {
                s.spawn(move || {
                    (from..(from + per).min(n))
                        .map(|i| {
                            let mut seed = [0x5a; 32];
                            seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
                            let key = SigningKey::from_bytes(&seed);
                            let at = endpoint(i as u32);
                            Descriptor::sign(&key, onion.to_bytes(), at, T0, DESCRIPTOR_TTL)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().expect("signer"))
            .collect()
    })
}

/// A public address in a /24 of its own for `i` (up to 16 777 216).
fn endpoint(i: u32) -> String {
    format!(
        "https://{}.{}.{}.{}:7001",
        11 + i / 65_536,
        (i / 256) % 256,
        i % 256,
        1 + i % 250
    )
}

/// Holds `ds` as reached peers in a table and writes it to `path` as the node does: the time
/// of the snapshot (under the table's lock) and of the write.
fn write_store(
    ds: &[Descriptor],
    path: &Path,
) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let peers = Peers::new(vec![], false, Clock::starting_at(T0), [0; 32]);
    let kept = Kept {
        first_seen: T0,
        reached: Some(T0),
        root: None,
    };
    let entries = ds
        .iter()
        .map(|d| (Arc::new(Signed::trusted(d.clone())), kept));
    assert_eq!(peers.restore_all(entries), ds.len());
    let t = Instant::now();
    let file = cache::snapshot(&peers);
    let snapshot = t.elapsed();
    assert_eq!(file.peers.len(), ds.len());
    let t = Instant::now();
    cache::save(path, &file)?;
    Ok((snapshot, t.elapsed()))
}

/// The resident set (KiB) of a child process before and after it restores `path`, and its
/// peak.
fn child_rss(path: &Path, n: usize) -> Result<(u64, u64, u64), Box<dyn std::error::Error>> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(path)
        .arg(n.to_string())
        .output()?;
    if !out.status.success() {
        return Err(format!("the child failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8(out.stdout)?;
    let v: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    Ok((v[0], v[1], v[2]))
}

/// In the child: the resident set before and after a restore of `path` (which must keep `n`),
/// and the peak, in KiB, on one line.
fn child(path: &Path, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let peers = Peers::new(vec![], false, Clock::starting_at(T0 + 60), [0; 32]);
    let before = status_kib("VmRSS")?;
    assert_eq!(cache::restore(&peers, path), n);
    println!("{before} {} {}", status_kib("VmRSS")?, status_kib("VmHWM")?);
    drop(peers);
    Ok(())
}

/// A `/proc/self/status` field in KiB.
fn status_kib(field: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {field} in /proc/self/status"))?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// The median time of [`RUNS`] runs of `f`.
fn median(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}
