//! Crash safety (issue 15): real nodes killed with `kill -9` at seeded random moments while
//! `blindrelay send` runs through them (replay reservations and terminal deliveries in flight)
//! and while they rotate their onion key at start; each kill is followed by a restart and a
//! check: the databases open and pass SQLite's integrity check, every delivery whose receipt
//! the sender verified (`send` exited 0) is in the terminal's inbox, no message is in the inbox
//! twice (no route ran twice), the onion key file is the old key or a whole rotation, and the
//! nodes deliver again.
//!
//! Only the CLI (`blindrelay send`) and the operator API (status, inbox) are used, so the test
//! does not depend on the wire format. The seed is printed (`crash seed: N`);
//! `BLINDRELAY_CRASH_SEED=N` replays a run, `BLINDRELAY_CRASH_ROUNDS` sets the send rounds.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Net, hex, random_bytes, run_cli};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Rounds with sends in flight at the kill.
const SEND_ROUNDS: u64 = 44;
/// Kills while a node starts with its onion key due for rotation, per rotating node.
const ROTATION_KILLS: u64 = 4;
/// Sends in flight per round.
const SENDS: usize = 3;
/// The kill comes this long (at most) after the sends start.
const MAX_KILL_DELAY_MS: u64 = 80;
/// A kill at start comes this long (at most) after the spawn.
const MAX_START_KILL_MS: u64 = 60;
/// Sends tried after a restart before the nodes must have delivered again.
const DELIVERY_ATTEMPTS: usize = 5;

/// `0..n` (`0` when `n` is 0), from the seeded generator.
fn below(rng: &mut StdRng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// `blindrelay send` from node 0 to node 2 over 2 hops (through node 1), as a task.
fn spawn_send(net: &Net, payload: &[u8], file: &Path) -> tokio::task::JoinHandle<bool> {
    std::fs::write(file, payload).unwrap();
    let args: Vec<String> = vec![
        "send".into(),
        "--state-dir".into(),
        net.node(0).state_dir.display().to_string(),
        "--operator".into(),
        net.node(0).operator.clone(),
        "--to".into(),
        net.node(2).id.clone(),
        "--hops".into(),
        "2".into(),
        file.display().to_string(),
    ];
    tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args, None).await.ok
    })
}

/// Node 2's inbox: every item's bytes by id (`seen` caches what was read before).
async fn inbox(net: &Net, seen: &mut BTreeMap<u64, Vec<u8>>) -> Vec<Vec<u8>> {
    let http = net.op_http(2);
    let ids = net.inbox_ids(2).await;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let std::collections::btree_map::Entry::Vacant(slot) = seen.entry(id) {
            let url = format!("{}/v1/inbox/{id}", net.node(2).operator);
            let r = http.get(&url).send().await.expect("inbox item");
            assert!(r.status().is_success(), "GET {url}: {}", r.status());
            slot.insert(r.bytes().await.expect("item body").to_vec());
        }
        out.push(seen[&id].clone());
    }
    out
}

/// Every SQLite store of every node opens and passes the integrity check.
fn stores_whole(net: &Net) {
    for node in net.nodes() {
        common::stores_whole(&node.state_dir);
    }
}

/// Sends one message until a send is acknowledged (at most [`DELIVERY_ATTEMPTS`]); returns the
/// payload and the attempts it took.
async fn delivers(net: &Net, tag: &str) -> (Vec<u8>, usize) {
    for attempt in 1..=DELIVERY_ATTEMPTS {
        let payload = format!("{tag} try {attempt} {}", hex(&random_bytes(8))).into_bytes();
        let (ok, out, err) = net.send(0, 2, 2, &payload).await;
        if ok {
            return (payload, attempt);
        }
        println!("{tag}: send {attempt} failed: {out} {err}");
    }
    panic!("{tag}: no delivery in {DELIVERY_ATTEMPTS} sends after the restart");
}

/// The onion key file of `dir`, parsed (it must be whole JSON).
fn onion_keys(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("onion-keys.json")).expect("onion-keys.json");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("onion-keys.json is broken: {e}"))
}

/// Checks node 2's inbox against what was acknowledged: all there, none twice.
async fn check_inbox(net: &Net, seen: &mut BTreeMap<u64, Vec<u8>>, acked: &[Vec<u8>], what: &str) {
    let items = inbox(net, seen).await;
    let mut counts: BTreeMap<&[u8], usize> = BTreeMap::new();
    for it in &items {
        *counts.entry(it.as_slice()).or_default() += 1;
    }
    if let Some((dup, n)) = counts.iter().find(|(_, n)| **n > 1) {
        panic!(
            "{what}: delivered {n} times: {}",
            String::from_utf8_lossy(dup)
        );
    }
    for a in acked {
        assert!(
            counts.contains_key(a.as_slice()),
            "{what}: an acknowledged delivery is lost: {}",
            String::from_utf8_lossy(a)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_kill_9_during_sends_deliveries_and_key_rotation() {
    let seed = env_u64("BLINDRELAY_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64
    });
    let rounds = env_u64("BLINDRELAY_CRASH_ROUNDS").unwrap_or(SEND_ROUNDS);
    println!("crash seed: {seed} (BLINDRELAY_CRASH_SEED={seed} replays this run)");
    // The same seed gives the same run.
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut net = Net::start(3, &[]).await;
    let files = tempfile::tempdir().unwrap();
    let mut seen = BTreeMap::new();
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let (mut kills, mut in_flight, mut retried) = (0u64, 0usize, 0usize);

    // Sends in flight; one node killed.
    for round in 0..rounds {
        let victim = below(&mut rng, 3) as usize;
        let delay = Duration::from_millis(below(&mut rng, MAX_KILL_DELAY_MS + 1));
        let mut sends = Vec::with_capacity(SENDS);
        for k in 0..SENDS {
            let payload = format!("round {round} send {k} {}", hex(&random_bytes(8))).into_bytes();
            let file = files.path().join(format!("r{round}-{k}"));
            sends.push((payload.clone(), spawn_send(&net, &payload, &file)));
        }
        tokio::time::sleep(delay).await;
        net.kill9(victim).await;
        kills += 1;
        net.restart(victim).await;
        for (payload, task) in sends {
            if task.await.expect("send task") {
                acked.push(payload);
            } else {
                in_flight += 1;
            }
        }
        let what = format!("round {round} (seed {seed}, node {victim} killed)");
        stores_whole(&net);
        check_inbox(&net, &mut seen, &acked, &what).await;
        let (payload, attempts) = delivers(&net, &what).await;
        retried += attempts - 1;
        acked.push(payload);
    }

    // Onion key rotation at start (the key made 25 h old while the node is down), killed at
    // random moments of the start: the file is the old key or a whole rotation, never half.
    for node in [2usize, 1] {
        net.kill9(node).await;
        let dir = net.node(node).state_dir.clone();
        let mut keys = onion_keys(&dir);
        let old = keys["current"]["secret"].as_str().unwrap().to_string();
        let created = keys["current"]["created_at"].as_u64().unwrap();
        keys["current"]["created_at"] = (created - 25 * 3600).into();
        std::fs::write(dir.join("onion-keys.json"), keys.to_string()).unwrap();
        for _ in 0..ROTATION_KILLS {
            net.start_detached(node, &[]);
            tokio::time::sleep(Duration::from_millis(below(
                &mut rng,
                MAX_START_KILL_MS + 1,
            )))
            .await;
            net.kill9(node).await;
            kills += 1;
            let now = onion_keys(&dir);
            let rotated = now["previous"]["secret"].as_str() == Some(old.as_str())
                && now["current"]["secret"].as_str() != Some(old.as_str());
            let unchanged = now["current"]["secret"].as_str() == Some(old.as_str());
            assert!(rotated || unchanged, "node {node}: onion keys {now}");
        }
        net.start_detached(node, &[]);
        net.wait_up(node).await;
        let now = onion_keys(&dir);
        assert_eq!(
            now["previous"]["secret"].as_str(),
            Some(old.as_str()),
            "node {node} rotated"
        );
        stores_whole(&net);
        let what = format!("after node {node}'s rotation (seed {seed})");
        check_inbox(&net, &mut seen, &acked, &what).await;
        let (payload, attempts) = delivers(&net, &what).await;
        retried += attempts - 1;
        acked.push(payload);
    }
    check_inbox(&net, &mut seen, &acked, "at the end").await;
    let unacked = inbox(&net, &mut seen).await.len() - acked.len();
    net.stop_all().await;
    println!(
        "FIGURE crash: {kills} kill -9 in {:.1} s; {} deliveries acknowledged, all in the inbox, \
         none twice; {in_flight} sends cut by a kill ({unacked} of them delivered all the same); \
         {retried} extra sends to deliver again",
        started.elapsed().as_secs_f64(),
        acked.len()
    );
    assert!(kills >= 50, "{kills} kills");
}
