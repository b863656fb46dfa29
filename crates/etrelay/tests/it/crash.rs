//! Crash safety (issue 15): the daemon (a real process) killed with `kill -9` at seeded random
//! moments while it registers servers, hands them over to new keys, leaves, bans and unbans;
//! after each kill it is started again on the same state and checked: every state file opens,
//! every write answered 2xx before the kill is there (and every acknowledged removal is gone),
//! the one request in flight is either wholly done or not at all, no temporary file is left,
//! and the relay relays again (a packet round trip through a public port).
//!
//! The game servers are the testkit's scripted ET servers (`FakeEtServer`): a real OpenArena
//! server takes about a second to start and an rcon round trip to show each new proof, which
//! would make fifty rounds far too slow; the real server's registration and relaying are
//! covered by `admin.rs` and `openarena.rs`.
//!
//! The seed is printed (`crash seed: N`); `ETRELAY_CRASH_SEED=N` replays a run,
//! `ETRELAY_CRASH_ROUNDS` changes the number of kills (at least 50 by default).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::daemon::{Daemon, TOKEN, new_key, ports};
use common::{ask, client};
use etrelay::proof::fingerprint;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, udp, unique_ip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::json;

/// Kills by default.
const ROUNDS: u64 = 50;
/// Scripted game servers (each registered, handed over and left again and again).
const SERVERS: usize = 3;
/// Public ports: one more than servers, so registrations pick different ports.
const PORTS: u16 = 4;
/// Requests a round may send before its kill.
const OPS_PER_ROUND: usize = 12;
/// The kill comes this long (at most) after the round's first request.
const MAX_KILL_DELAY_MS: u64 = 120;

/// `0..n` (`0` when `n` is 0), from the seeded generator.
fn below(rng: &mut StdRng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// What the relay should hold for one game server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    port: u16,
    bans: BTreeSet<String>,
}

/// The servers by index into the scripted ones.
type Model = BTreeMap<usize, Entry>;

/// One request of the workload.
#[derive(Debug, Clone)]
enum Op {
    /// `PUT /server` of an unregistered server with its key.
    Register { server: usize, key: String },
    /// `PUT /server` of a registered server with a new key, on the same port.
    Takeover { server: usize, key: String },
    /// `DELETE /server`.
    Leave { server: usize },
    /// `PUT /bans/{ip}`.
    Ban { server: usize, ip: String },
    /// `DELETE /bans/{ip}`.
    Unban { server: usize, ip: String },
}

/// `op` applied to `model`, with the port the relay answered (registrations).
fn apply(model: &mut Model, op: &Op, port: Option<u16>) {
    match op {
        Op::Register { server, key } => {
            let port = port.expect("a registration answers its port");
            model.insert(
                *server,
                Entry {
                    key: key.clone(),
                    port,
                    bans: BTreeSet::new(),
                },
            );
        }
        Op::Takeover { server, key } => {
            let e = model.get_mut(server).expect("registered");
            e.key = key.clone();
        }
        Op::Leave { server } => {
            model.remove(server);
        }
        Op::Ban { server, ip } => {
            model
                .get_mut(server)
                .expect("registered")
                .bans
                .insert(ip.clone());
        }
        Op::Unban { server, ip } => {
            model.get_mut(server).expect("registered").bans.remove(ip);
        }
    }
}

/// A random request that makes sense on `model`.
fn pick(rng: &mut StdRng, model: &Model, n: &mut u32) -> Op {
    let server = below(rng, SERVERS as u64) as usize;
    let Some(e) = model.get(&server) else {
        return Op::Register {
            server,
            key: new_key(),
        };
    };
    match below(rng, 10) {
        0 => Op::Takeover {
            server,
            key: new_key(),
        },
        1 => Op::Leave { server },
        2..=4 if !e.bans.is_empty() => {
            let i = below(rng, e.bans.len() as u64) as usize;
            let ip = e.bans.iter().nth(i).expect("in range").clone();
            Op::Unban { server, ip }
        }
        _ => {
            *n += 1;
            Op::Ban {
                server,
                ip: format!("198.51.{}.{}", 100 + (*n / 250) % 100, *n % 250 + 1),
            }
        }
    }
}

/// Sends `op` (a registration or takeover first makes its game server show the key's proof);
/// the status and JSON answer, or `None` when no answer came (killed).
async fn send(
    http: &reqwest::Client,
    url: &str,
    model: &Model,
    servers: &[FakeEtServer],
    op: &Op,
) -> Option<(u16, serde_json::Value)> {
    let key_of = |s: &usize| model.get(s).map(|e| e.key.clone()).unwrap_or_default();
    let req = match op {
        Op::Register { server, key } | Op::Takeover { server, key } => {
            let et = &servers[*server];
            et.set_cvar("etrelay_proof", &fingerprint(key));
            http.put(format!("{url}/server"))
                .bearer_auth(TOKEN)
                .json(&json!({"key": key, "upstream": et.addr().to_string()}))
        }
        Op::Leave { server } => http
            .delete(format!("{url}/server"))
            .bearer_auth(key_of(server)),
        Op::Ban { server, ip } => http
            .put(format!("{url}/bans/{ip}"))
            .bearer_auth(key_of(server))
            .json(&json!({"reason": "crash test"})),
        Op::Unban { server, ip } => http
            .delete(format!("{url}/bans/{ip}"))
            .bearer_auth(key_of(server)),
    };
    let r = req.send().await.ok()?;
    let status = r.status().as_u16();
    let text = r.text().await.ok()?;
    Some((
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    ))
}

/// What a round's workload got done before the kill.
#[derive(Debug, Default)]
struct Done {
    /// Requests answered 2xx, in order, with the port a registration answered.
    acked: Vec<(Op, Option<u16>)>,
    /// The request sent when the relay died, if any (applied wholly or not at all).
    in_flight: Option<Op>,
}

/// What the relay holds for the servers of `models`' keys: for every key any of them names,
/// `GET /server` and `GET /bans`.
async fn observe(d: &Daemon, models: &[&Model]) -> Model {
    let mut keys: BTreeMap<String, usize> = BTreeMap::new();
    for m in models {
        for (s, e) in m.iter() {
            keys.insert(e.key.clone(), *s);
        }
    }
    let mut seen = Model::new();
    for (key, server) in keys {
        let (status, me) = d.call(Method::GET, "/server", &key, None).await;
        if status == 401 {
            continue;
        }
        assert_eq!(status, 200, "GET /server: {me}");
        assert_eq!(me["relaying"], true, "relayed after the restart: {me}");
        let port = me["port"].as_u64().expect("port") as u16;
        let (status, bans) = d.call(Method::GET, "/bans", &key, None).await;
        assert_eq!(status, 200, "GET /bans: {bans}");
        let bans = bans["bans"]
            .as_array()
            .expect("bans")
            .iter()
            .map(|b| b["ip"].as_str().expect("ip").to_string())
            .collect();
        let old = seen.insert(server, Entry { key, port, bans });
        assert!(old.is_none(), "two keys own server {server}");
    }
    seen
}

/// Every state file is whole: `servers.json` parses and every ban store passes SQLite's
/// integrity check; once the relay has started, no temporary file of a write the kill cut short
/// is left (the relay removes them at start).
fn state_files_whole(state: &Path, started: bool) {
    let text = std::fs::read_to_string(state.join("servers.json")).unwrap_or_default();
    if !text.is_empty() {
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "servers.json is broken: {text}"
        );
    }
    for entry in std::fs::read_dir(state).expect("state dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            !(started && name.contains(".tmp.")),
            "a temporary file is left: {name}"
        );
        if name.starts_with("bans-") && name.ends_with(".db") {
            let conn = rusqlite::Connection::open(&path).expect("ban store opens");
            let check: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .expect("integrity check");
            assert_eq!(check, "ok", "{name}");
        }
    }
}

/// The relay answers a fresh client's `getchallenge` on every registered port.
async fn relays(d: &Daemon, model: &Model) {
    let c = client().await;
    for e in model.values() {
        let got = ask(&c, d.public(e.port), &udp::oob(b"getchallenge")).await;
        assert_eq!(got.len(), 1, "no round trip through port {}", e.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_kill_9_during_registrations_takeovers_bans_and_unbans() {
    let seed = env_u64("ETRELAY_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64
    });
    let rounds = env_u64("ETRELAY_CRASH_ROUNDS").unwrap_or(ROUNDS);
    println!("crash seed: {seed} (ETRELAY_CRASH_SEED={seed} replays this run)");
    // The same seed gives the same run.
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ip = unique_ip();
    let servers: Arc<Vec<FakeEtServer>> = Arc::new(
        (0..SERVERS)
            .map(|_| FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap())
            .collect(),
    );
    let mut model = Model::new();
    let mut n = 0u32;
    let (mut acked_total, mut in_flight_applied, mut in_flight_lost) = (0usize, 0usize, 0usize);
    let started = std::time::Instant::now();
    let mut d = Daemon::start_on(ip, &state, &ports(PORTS), &[]).await;
    for round in 0..rounds {
        // The workload, one request at a time, and a kill at a random moment into it.
        let mut plan_model = model.clone();
        let mut plan = Vec::new();
        for _ in 0..OPS_PER_ROUND {
            let op = pick(&mut rng, &plan_model, &mut n);
            // Planned on the assumption that every request succeeds; ports are filled in as
            // the relay answers.
            let port = match &op {
                Op::Register { .. } => Some(0),
                _ => None,
            };
            apply(&mut plan_model, &op, port);
            plan.push(op);
        }
        let delay = Duration::from_millis(below(&mut rng, MAX_KILL_DELAY_MS + 1));
        let done = Arc::new(Mutex::new(Done::default()));
        let writer = {
            let (http, url) = (d.http.clone(), d.url(""));
            let (done, servers, mut live) =
                (Arc::clone(&done), Arc::clone(&servers), model.clone());
            tokio::spawn(async move {
                for op in plan {
                    done.lock().unwrap().in_flight = Some(op.clone());
                    let Some((status, body)) = send(&http, &url, &live, &servers, &op).await else {
                        return;
                    };
                    assert!(
                        (200..300).contains(&status),
                        "{op:?} answered {status}: {body}"
                    );
                    let port = body["port"].as_u64().map(|p| p as u16);
                    apply(&mut live, &op, port);
                    let mut d = done.lock().unwrap();
                    d.in_flight = None;
                    d.acked.push((op, port));
                }
            })
        };
        tokio::time::sleep(delay).await;
        d.kill9().await;
        writer.await.expect("workload task");
        let done = std::mem::take(&mut *done.lock().unwrap());
        for (op, port) in &done.acked {
            apply(&mut model, op, *port);
        }
        acked_total += done.acked.len();

        // Started again: whole files, every acknowledged write, the request in flight wholly
        // or not at all.
        state_files_whole(&state, false);
        d = Daemon::start_on(ip, &state, &ports(PORTS), &[]).await;
        state_files_whole(&state, true);
        let seen = match &done.in_flight {
            None => {
                let seen = observe(&d, &[&model]).await;
                assert_eq!(
                    seen, model,
                    "round {round} (seed {seed}): acknowledged state"
                );
                seen
            }
            Some(op) => {
                // The state with the request done: a registration's port is whatever the
                // relay picked (0 until seen).
                let mut after = model.clone();
                let guess = matches!(op, Op::Register { .. }).then_some(0);
                apply(&mut after, op, guess);
                let seen = observe(&d, &[&model, &after]).await;
                if let Op::Register { server, .. } = op
                    && let (Some(s), Some(a)) = (seen.get(server), after.get_mut(server))
                {
                    a.port = s.port;
                }
                assert!(
                    seen == model || seen == after,
                    "round {round} (seed {seed}): {op:?} in flight; acknowledged {model:?}, \
                     with it {after:?}, found {seen:?}"
                );
                if seen == after && after != model {
                    in_flight_applied += 1;
                } else {
                    in_flight_lost += 1;
                }
                seen
            }
        };
        model = seen;
        relays(&d, &model).await;
    }
    d.stop().await;
    println!(
        "FIGURE crash: {rounds} kill -9 in {:.1} s; {acked_total} requests acknowledged, all \
         kept; in flight at the kill: {in_flight_applied} done wholly, {in_flight_lost} not at all",
        started.elapsed().as_secs_f64()
    );
}
