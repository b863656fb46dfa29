//! A burst of bans: the state dir stays bounded and the log stays short.
//!
//! An admin (or whoever holds a server's key) may send every ban a server can hold as fast as
//! the control API answers. Before, 65 536 bans in 30 s grew the state dir to 163 MB (the
//! SQLite write-ahead log was never folded back while bans kept coming) and wrote one INFO line
//! per ban. Checked here:
//!
//! - through the store, as the registry drives it (each change on the blocking pool, then the
//!   registry's checkpoint trigger): every ban a server can hold, from several writers at once;
//!   the state dir's peak stays under the database plus [`MAX_WAL_BYTES`] plus the `-shm`, and
//!   every ban is there after a reopen;
//! - through the real daemon's API: a smaller burst, the state dir bounded the same way, at most
//!   [`BAN_LINES`] ban lines one by one and one summary per server and minute, whose counts add
//!   up; then a kill -9 in the middle of a burst (checkpoints running) loses no answered ban;
//! - one ban at a time on the real disk: the latency of a single ban (before/after figure).
//!
//! Figures are printed as `FIGURE …` lines. `ETRELAY_BURST_BANS` (store burst; default
//! [`MAX_BANS`] on a tmpfs, 4 096 on a disk), `ETRELAY_BURST_REASON` (the length of its
//! reasons, default 5 bytes) and `ETRELAY_API_BURST_BANS` (API burst, default 2 000) change the
//! sizes; `ETRELAY_BURST_DIR` puts the state dirs of the bursts there instead of a tmpfs. The
//! figures of `docs/etrelay.md` ("Bans") come from (state dir on the disk, 65 536 bans each):
//! `ETRELAY_BURST_DIR=/var/tmp/burst ETRELAY_BURST_BANS=65536 ETRELAY_API_BURST_BANS=65536
//! cargo test -p etrelay --test it -- ban_burst:: --nocapture --test-threads=1`.

use crate::common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, new_key, ports};
use etrelay::bans::store::{MAX_WAL_BYTES, Store, db_path};
use etrelay::bans::{Ban, MAX_BANS};
use etrelay::control::BAN_LINES;
use etrelay::proof::fingerprint;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, unique_ip};
use reqwest::Method;
use serde_json::json;

/// The public port of the server under test.
const PORT: u16 = 27960;
/// Writers at once in the store burst (control connections each carrying one ban).
const WRITERS: usize = 8;
/// Requests at once in the API burst (under the API's per-address cap of 8).
const CLIENTS: usize = 4;
/// What the `-shm` file and one change written past the journal's cap may add (a change writes
/// a few 4 KiB pages).
const SLACK: u64 = 64 * 1024;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok()
}

/// A directory for a burst, and whether it is on a tmpfs: `ETRELAY_BURST_DIR`, else a tmpfs
/// when there is one (an fsync costs nothing there, so the checkpoints' share of the time is at
/// its largest: the hard case for the bound, and 65 536 bans in seconds), else the default temp
/// dir.
fn burst_dir() -> (tempfile::TempDir, bool) {
    if let Ok(d) = std::env::var("ETRELAY_BURST_DIR") {
        std::fs::create_dir_all(&d).unwrap();
        return (tempfile::tempdir_in(d).unwrap(), false);
    }
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => (d, true),
        Err(_) => (tempfile::tempdir().unwrap(), false),
    }
}

/// Bytes of `bans-<port>.db` followed by `suffix` (`-wal`, `-shm`; "": the database).
fn file_bytes(dir: &Path, port: u16, suffix: &str) -> u64 {
    let mut p = db_path(dir, port).into_os_string();
    p.push(suffix);
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Bytes of `bans-<port>.db` with its `-wal` and `-shm` files.
fn store_bytes(dir: &Path, port: u16) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| file_bytes(dir, port, s))
        .sum()
}

/// The `i`-th address of a burst (10.0.0.0/8 and on).
fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i as u32))
}

/// The `i`-th ban of a burst; its reason is `ETRELAY_BURST_REASON` bytes long (default 5).
fn ban(i: usize) -> Ban {
    let reason = match env_usize("ETRELAY_BURST_REASON") {
        Some(n) => "r".repeat(n),
        None => "burst".into(),
    };
    Ban::new(address(i), reason, None, std::time::SystemTime::now()).unwrap()
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// p50, p99 and max of `times`, in ms.
fn spread(times: &mut [Duration]) -> (f64, f64, f64) {
    times.sort();
    let at = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)].as_secs_f64() * 1e3;
    (at(50), at(99), at(100))
}

/// One writer of the store burst: bans `i` for `i` in `first, first + WRITERS, …` below `n`,
/// each as `Registry::ban` does it (the write on the blocking pool, then the checkpoint
/// trigger); notes the state dir's size after each. Returns each ban's time.
async fn store_writer(
    store: Arc<Store>,
    dir: Arc<Path>,
    peak: Arc<AtomicU64>,
    peak_wal: Arc<AtomicU64>,
    first: usize,
    n: usize,
) -> Vec<Duration> {
    let mut times = Vec::new();
    let mut checkpoints = Vec::new();
    for i in (first..n).step_by(WRITERS) {
        let (s, b) = (Arc::clone(&store), ban(i));
        let t = Instant::now();
        tokio::task::spawn_blocking(move || s.put(&b))
            .await
            .unwrap()
            .unwrap();
        times.push(t.elapsed());
        peak.fetch_max(store_bytes(&dir, PORT), Ordering::Relaxed);
        peak_wal.fetch_max(file_bytes(&dir, PORT, "-wal"), Ordering::Relaxed);
        if store.needs_checkpoint() {
            let s = Arc::clone(&store);
            checkpoints.push(tokio::task::spawn_blocking(move || s.checkpoint()));
        }
    }
    for c in checkpoints {
        c.await.unwrap().unwrap();
    }
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_every_ban_keeps_the_state_dir_bounded() {
    let (tmp, tmpfs) = burst_dir();
    // On a disk each commit is an fsync: fewer bans keep the test short (still 15 checkpoints).
    let n = env_usize("ETRELAY_BURST_BANS").unwrap_or(if tmpfs { MAX_BANS } else { 4_096 });
    let dir: Arc<Path> = Arc::from(tmp.path());
    let (store, none) = Store::open(&dir, PORT, std::time::SystemTime::now()).unwrap();
    assert!(none.is_empty());
    let store = Arc::new(store);
    let (peak, peak_wal) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (s, d) = (Arc::clone(&store), Arc::clone(&dir));
        let (p, pw) = (Arc::clone(&peak), Arc::clone(&peak_wal));
        writers.spawn(store_writer(s, d, p, pw, w, n));
    }
    let mut times = Vec::new();
    while let Some(t) = writers.join_next().await {
        times.extend(t.unwrap());
    }
    let took = started.elapsed();
    let (after, db) = (store_bytes(&dir, PORT), file_bytes(&dir, PORT, ""));
    drop(store);
    let (_, bans) = Store::open(&dir, PORT, std::time::SystemTime::now()).unwrap();
    let reopened = store_bytes(&dir, PORT);
    let (peak, peak_wal) = (
        peak.load(Ordering::Relaxed),
        peak_wal.load(Ordering::Relaxed),
    );
    let (p50, p99, max) = spread(&mut times);
    println!(
        "FIGURE ban burst, store: {n} bans from {WRITERS} writers in {:.1} s: state dir peak \
         {:.2} MiB (journal {:.2} MiB), after the burst {:.2} MiB (database {:.2} MiB), after \
         a reopen {:.2} MiB; one ban p50 {p50:.3} ms, p99 {p99:.3} ms, max {max:.1} ms",
        took.as_secs_f64(),
        mib(peak),
        mib(peak_wal),
        mib(after),
        mib(db),
        mib(reopened)
    );
    assert_eq!(bans.len(), n, "every ban is there after a reopen");
    let bound = db + MAX_WAL_BYTES + SLACK;
    assert!(
        peak <= bound,
        "peak {peak} B over the database + the journal's cap ({bound} B)"
    );
}

/// One ban after another, on the real disk (each commit an fsync): the latency of a single
/// ban with nothing else going on.
#[tokio::test]
async fn one_ban_at_a_time_on_disk() {
    const BANS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), PORT, std::time::SystemTime::now()).unwrap();
    let mut times = Vec::new();
    for i in 0..BANS {
        let t = Instant::now();
        store.put(&ban(i)).unwrap();
        times.push(t.elapsed());
        if store.needs_checkpoint() {
            store.checkpoint().unwrap();
        }
    }
    let (p50, p99, max) = spread(&mut times);
    println!(
        "FIGURE ban burst, one ban at a time on disk: {BANS} bans, p50 {p50:.2} ms, p99 \
         {p99:.2} ms, max {max:.2} ms"
    );
}

/// The log lines about ban changes: (one by one, summaries, bans and unbans the summaries
/// count).
fn ban_lines(log: &str) -> (usize, usize, u64) {
    let (mut single, mut summaries, mut counted) = (0, 0, 0);
    for line in log.lines() {
        if line.contains(" banned") || line.contains(" unbanned") {
            single += 1;
        } else if line.contains("not logged one by one") {
            summaries += 1;
            // "… not logged one by one port=P bans=B unbans=U secs=S": B and U.
            let field = |name: &str| {
                line.split(name)
                    .nth(1)
                    .and_then(|v| v.split(' ').next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            counted += field(" bans=") + field(" unbans=");
        }
    }
    (single, summaries, counted)
}

/// Sends `PUT /bans/{ip}` for `ips` from [`CLIENTS`] tasks at once; returns the addresses
/// answered 200 (it stops at the first failure: a killed relay) and the state dir's peak.
async fn api_burst(d: &Daemon, key: &str, ips: Vec<IpAddr>) -> (Vec<IpAddr>, u64) {
    let ips = Arc::new(ips);
    let next = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (http, url, key) = (d.http.clone(), d.url("/bans/"), key.to_string());
        let (ips, next, peak) = (Arc::clone(&ips), Arc::clone(&next), Arc::clone(&peak));
        let dir = d.state_dir.clone();
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let Some(ip) = ips.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return done;
                };
                let r = http
                    .put(format!("{url}{ip}"))
                    .bearer_auth(&key)
                    .json(&json!({"reason": "burst"}))
                    .send()
                    .await;
                if !r.is_ok_and(|r| r.status() == 200) {
                    return done;
                }
                done.push(*ip);
                peak.fetch_max(store_bytes(&dir, PORT), Ordering::Relaxed);
            }
        });
    }
    let mut done = Vec::new();
    while let Some(d) = tasks.join_next().await {
        done.extend(d.unwrap());
    }
    (done, peak.load(Ordering::Relaxed))
}

async fn listed(d: &Daemon, key: &str) -> std::collections::BTreeSet<IpAddr> {
    d.banned(key)
        .await
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_the_api_is_bounded_on_disk_and_in_the_log() {
    const UNBANS: usize = 10;
    let n = env_usize("ETRELAY_API_BURST_BANS").unwrap_or(2_000);
    let (tmp, _) = burst_dir();
    let state = tmp.path().join("state");
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &ports(1), &[]).await;
    let key = new_key();
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_cvar("etrelay_proof", &fingerprint(&key));
    assert_eq!(d.register(&key, et.addr(), Some(PORT)).await.0, 201);

    let started = Instant::now();
    let (done, peak) = api_burst(&d, &key, (0..n).map(address).collect()).await;
    assert_eq!(done.len(), n, "{}", d.log_text());
    for i in 0..UNBANS {
        let path = format!("/bans/{}", address(i));
        assert_eq!(d.call(Method::DELETE, &path, &key, None).await.0, 204);
    }
    let took = started.elapsed();
    let (after, db) = (store_bytes(&state, PORT), file_bytes(&state, PORT, ""));
    let log = Arc::clone(&d.log);
    d.stop().await;
    let log = stopped_log(&log).await;
    let (single, summaries, counted) = ban_lines(&log);
    println!(
        "FIGURE ban burst, API: {n} bans and {UNBANS} unbans in {:.1} s ({:.0} a second): \
         state dir peak {:.2} MiB, after the burst {:.2} MiB (database {:.2} MiB); log: \
         {single} lines one by one, {summaries} summaries counting {counted} changes",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        mib(peak),
        mib(after),
        mib(db)
    );
    assert!(peak <= db + MAX_WAL_BYTES + SLACK, "peak {peak} B");
    let minutes = took.as_secs() as usize / 60 + 1;
    assert!(single <= BAN_LINES * minutes, "{single} ban lines");
    assert!(summaries <= minutes, "{summaries} summaries");
    assert_eq!(
        single as u64 + counted,
        (n + UNBANS) as u64,
        "every change told"
    );

    // Started again: every ban there; then a kill -9 in the middle of a second burst, its
    // checkpoints running: every ban answered is there after a restart.
    let d = Daemon::start_on(ip, &state, &ports(1), &[]).await;
    let mut expected = listed(&d, &key).await;
    assert_eq!(expected.len(), n - UNBANS);
    // New addresses while the server has room for them, then the first burst's again.
    let room = MAX_BANS - expected.len();
    let second: Vec<IpAddr> = (n..n + room.min(4 * n))
        .chain((UNBANS..n).cycle())
        .take(4 * n)
        .map(address)
        .collect();
    let killer = {
        // Once a checkpoint wrote into the database (in WAL mode only checkpoints do).
        let db = db_path(&state, PORT);
        let modified = move || std::fs::metadata(&db).and_then(|m| m.modified()).ok();
        let before = modified();
        async move {
            while modified() == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let kill = async {
        let _ = tokio::time::timeout(Duration::from_secs(60), killer).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let pid = d.child.id().unwrap().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
    };
    let ((answered, _), ()) = tokio::join!(api_burst(&d, &key, second), kill);
    d.kill9().await;
    println!(
        "FIGURE ban burst, API: kill -9 after {} bans of a second burst",
        answered.len()
    );
    let d = Daemon::start_on(ip, &state, &ports(1), &[]).await;
    expected.extend(answered.iter().copied());
    let now = listed(&d, &key).await;
    assert!(
        expected.is_subset(&now) && now.len() <= expected.len() + CLIENTS,
        "{} answered, {} there",
        expected.len(),
        now.len()
    );
    d.stop().await;
}

/// The log of a daemon stopped with SIGTERM, once its last line (`stopped ms=…`) is read.
async fn stopped_log(log: &common::Log) -> String {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let text = log.lock().unwrap().join("\n");
        if text.contains("stopped ms=") || Instant::now() > end {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
