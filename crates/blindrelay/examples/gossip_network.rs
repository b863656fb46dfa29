//! The network benchmark: `N` real `blindrelay run` processes (the binary named by
//! `BLINDRELAY_BIN`, default `target/release/blindrelay`) on loopback, node `i` at `127.(100 +
//! i).0.1` (a /16 of its own) and started with one bootstrap peer (a node started before it,
//! chosen at random), gossip every `--gossip` (2 s). Printed, in order:
//!
//! 1. convergence: the time until every node routes to every other;
//! 2. gossip bytes per node per minute at steady state (every node's `gossip_bytes_sent` and
//!    `gossip_bytes_received` over one minute);
//! 3. 200 sends over 3 hops between random pairs (8 at a time): how many were delivered, how
//!    many needed another route, and how many inbox items they left (one per message: nothing
//!    delivered twice);
//! 4. 5 new nodes, each knowing one old node: the gossip rounds until every old node routes to
//!    every new one, with no restart;
//! 5. every node killed (`kill -9`) once its peer store holds every other, and started again
//!    with no `--peer`: the time until the network has formed again;
//! 6. 5 000 identities announced to every node from one /24 (by this process, one
//!    announcement each, endpoints that answer nothing): how many each node kept, and of
//!    1 000 three-hop routes chosen from each node's peer store (`peers.json`, read back
//!    into the library's peer table, middles chosen by `send::path::choose` among the peers
//!    the node reached, as its sends choose them before health rules out more) how many
//!    include one of them, the worst node's share;
//! 7. 10 nodes killed at once, then after `--after` (60 s) 200 sends between live nodes: how
//!    many were delivered, rerouted, and stored (once each).
//!
//! Run with `scripts/bench-network` (release build) or
//! `cargo run --release -p blindrelay --example gossip_network -- [--nodes N] [--gossip S] [--after S]`.
//! Every address is on 127.0.0.0/8; every wait is bounded.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashSet;

use blindrelay::clock::Clock;
use blindrelay::discovery::Msg;
use blindrelay::peers::{Peers, cache};
use blindrelay::proto::descriptor::Descriptor;
use blindrelay::send::path;
use ed25519_dalek::SigningKey;
use rand::Rng;
use rand::seq::IndexedRandom;
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;

const RELAY_PORT: u16 = 7001;
const OPERATOR_PORT: u16 = 7070;
/// Longest wait for any condition.
const WAIT: Duration = Duration::from_secs(180);

struct Node {
    ip: Ipv4Addr,
    id: String,
    dir: PathBuf,
    child: Option<Child>,
}

struct Net {
    bin: PathBuf,
    root: tempfile::TempDir,
    nodes: Vec<Node>,
    gossip: String,
    http: reqwest::Client,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (n, gossip, after) = flags()?;
    blindrelay::links::install_provider();
    let bin = PathBuf::from(
        std::env::var("BLINDRELAY_BIN").unwrap_or_else(|_| "target/release/blindrelay".into()),
    );
    let mut net = Net {
        bin,
        root: tempfile::tempdir()?,
        nodes: Vec::new(),
        gossip: format!("{gossip}s"),
        http: reqwest::Client::builder().no_proxy().build()?,
    };
    println!("# blindrelay network: {n} nodes, each in its own /16, gossip every {gossip} s\n");
    let t = Instant::now();
    for i in 0..n {
        let boot = (i > 0).then(|| rand::rng().random_range(0..i));
        net.add(boot).await;
    }
    net.wait_all_route(n).await;
    println!(
        "| convergence (every node routes to the {} others) | {:.1} s |",
        n - 1,
        secs(t)
    );
    gossip_bytes(&net).await;
    let all: Vec<usize> = (0..n).collect();
    let sent = net.sends(200, &all).await;
    println!("| 200 sends over 3 hops | {} |", sent.row());
    newcomers(&mut net, n, gossip).await;
    restart(&mut net).await;
    sybil(&net).await;
    dead(&mut net, after).await;
    Ok(())
}

/// What a batch of sends did.
struct Sent {
    ok: usize,
    tried: usize,
    rerouted: usize,
    stored: u64,
}

impl Sent {
    fn row(&self) -> String {
        format!(
            "{}/{} delivered ({:.1} %), {} over a second or third route, {} inbox items for {} \
             deliveries ({} delivered twice)",
            self.ok,
            self.tried,
            100.0 * self.ok as f64 / self.tried.max(1) as f64,
            self.rerouted,
            self.stored,
            self.ok,
            self.stored.saturating_sub(self.ok as u64)
        )
    }
}

/// Gossip bytes per node per minute, sent and received, over one minute at steady state.
async fn gossip_bytes(net: &Net) {
    let total = |name: &'static str| async move {
        let mut sum = 0;
        for i in 0..net.nodes.len() {
            sum += net.counter(i, name).await;
        }
        sum
    };
    let (s0, r0) = (
        total("gossip_bytes_sent").await,
        total("gossip_bytes_received").await,
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (s1, r1) = (
        total("gossip_bytes_sent").await,
        total("gossip_bytes_received").await,
    );
    let n = net.nodes.len() as u64;
    println!(
        "| gossip per node per minute, steady state | {} B sent, {} B received |",
        (s1 - s0) / n,
        (r1 - r0) / n
    );
}

fn flags() -> Result<(usize, u64, u64), Box<dyn std::error::Error>> {
    let (mut n, mut gossip, mut after) = (40usize, 2u64, 60u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or("a flag needs a value")?;
        match a.as_str() {
            "--nodes" => n = v.parse()?,
            "--gossip" => gossip = v.parse()?,
            "--after" => after = v.parse()?,
            _ => return Err(format!("unknown flag {a}").into()),
        }
    }
    assert!((15..=150).contains(&n), "--nodes: 15 to 150");
    Ok((n, gossip, after))
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// 5 new nodes, each knowing one old node: rounds until every old node routes to all of them.
async fn newcomers(net: &mut Net, n: usize, gossip: u64) {
    let mut new = Vec::new();
    for _ in 0..5 {
        new.push((net.init().await, rand::rng().random_range(0..n)));
    }
    let t = Instant::now();
    for (i, boot) in new {
        net.spawn(i, Some(boot));
    }
    net.wait_all_route(net.nodes.len()).await;
    let rounds = secs(t) / gossip as f64;
    println!("| 5 newcomers routable from every old node | {rounds:.1} gossip rounds |");
}

/// Every node killed once its store holds every other, started again with no `--peer`.
async fn restart(net: &mut Net) {
    let n = net.nodes.len();
    for i in 0..n {
        net.wait_store(i, n - 1).await;
    }
    for i in 0..n {
        net.kill(i).await;
    }
    let t = Instant::now();
    for i in 0..n {
        net.spawn(i, None);
    }
    net.wait_all_route(n).await;
    println!(
        "| restarted with no --peer, formed again | {:.1} s |",
        secs(t)
    );
}

/// 5 000 identities from one /24 announced to every node; the most any node kept, and the
/// worst node's share of 1 000 routes that include one.
async fn sybil(net: &Net) {
    let now = blindrelay::clock::wall_unix();
    let before: Vec<u64> = known(net).await;
    let t = Instant::now();
    let mut sybils = HashSet::new();
    for k in 0..5000u32 {
        let node = &net.nodes[k as usize % net.nodes.len()];
        let key = SigningKey::from_bytes(&rand::random());
        sybils.insert(key.verifying_key().to_bytes());
        let onion =
            x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<
                [u8; 32],
            >()));
        let endpoint = format!("https://127.250.1.{}:7001", k % 250 + 1);
        let descriptor = Descriptor::sign(&key, onion.to_bytes(), endpoint, now, 3600);
        let url = format!("https://{}:{RELAY_PORT}/v1/discovery", node.ip);
        let Ok(tls) = blindrelay::links::unpinned_config_as(&key) else {
            continue;
        };
        let Ok(client) = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .no_proxy()
            .local_address(Some(std::net::IpAddr::from([127, 250, 1, 1])))
            .build()
        else {
            continue;
        };
        let hello = Msg::Hello {
            own: Some(descriptor),
            have: 0,
        };
        let _ = client.post(url).body(hello.to_bytes()).send().await;
    }
    let after: Vec<u64> = known(net).await;
    let kept = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.saturating_sub(*b))
        .max();
    println!(
        "| 5 000 identities from one /24, announced in {:.1} s | at most {} kept by any node (bound {}) |",
        secs(t),
        kept.unwrap_or(0),
        blindrelay::discovery::STRANGER_BURST
    );
    // The reach probes' rounds, and the peer stores written after them.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut worst = 0;
    for i in 0..net.nodes.len() {
        worst = worst.max(net.routes_through(i, &sybils, 1000));
    }
    println!(
        "| of 1 000 routes chosen by an honest node, through one of them | at most {worst} ({:.1} %) |",
        worst as f64 / 10.0
    );
}

/// Every node's count of descriptors held.
async fn known(net: &Net) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..net.nodes.len() {
        out.push(net.peers(i).await["known"].as_u64().unwrap_or(0));
    }
    out
}

/// 10 nodes killed at once; after `after` seconds, 200 sends between live nodes.
async fn dead(net: &mut Net, after: u64) {
    let n = net.nodes.len();
    let mut all: Vec<usize> = (0..n).collect();
    let killed: Vec<usize> = all.choose_multiple(&mut rand::rng(), 10).copied().collect();
    for &i in &killed {
        net.kill(i).await;
    }
    all.retain(|i| !killed.contains(i));
    tokio::time::sleep(Duration::from_secs(after)).await;
    let sent = net.sends(200, &all).await;
    println!(
        "| 10 of {n} killed, 200 sends {after} s later | {} |",
        sent.row()
    );
}

impl Net {
    /// Inits and starts one more node, with `boot` as its one `--peer`.
    async fn add(&mut self, boot: Option<usize>) {
        let i = self.init().await;
        self.spawn(i, boot);
    }

    /// Inits one more node (not started); its index.
    async fn init(&mut self) -> usize {
        let i = self.nodes.len();
        let ip = Ipv4Addr::new(127, 100 + i as u8, 0, 1);
        let dir = self.root.path().join(format!("node{i}"));
        let out = Command::new(&self.bin)
            .args(["init", "--state-dir"])
            .arg(&dir)
            .args(["--endpoint", &format!("https://{ip}:{RELAY_PORT}")])
            .output()
            .await
            .expect("blindrelay init");
        assert!(
            out.status.success(),
            "init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        self.nodes.push(Node {
            ip,
            id,
            dir,
            child: None,
        });
        i
    }

    fn spawn(&mut self, i: usize, boot: Option<usize>) {
        let peer = boot.map(|b| {
            format!(
                "{}@https://{}:{RELAY_PORT}",
                self.nodes[b].id, self.nodes[b].ip
            )
        });
        let me = &self.nodes[i];
        let mut cmd = Command::new(&self.bin);
        cmd.args(["run", "--state-dir"])
            .arg(&me.dir)
            .args(["--listen", &format!("{}:{RELAY_PORT}", me.ip)])
            .args(["--operator", &format!("{}:{OPERATOR_PORT}", me.ip)])
            .args(["--gossip-interval", &self.gossip, "--probe-interval", "0s"])
            .args(["--allow-private-endpoints"])
            .args(peer.iter().flat_map(|p| ["--peer", p.as_str()]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        self.nodes[i].child = Some(cmd.spawn().expect("blindrelay run"));
    }

    async fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill().await;
        }
    }

    fn cookie(&self, i: usize) -> Option<String> {
        std::fs::read_to_string(self.nodes[i].dir.join("operator.cookie"))
            .ok()
            .map(|c| c.trim().to_string())
    }

    async fn status(&self, i: usize) -> Option<serde_json::Value> {
        let url = format!("http://{}:{OPERATOR_PORT}/v1/status", self.nodes[i].ip);
        let resp = self
            .http
            .get(url)
            .bearer_auth(self.cookie(i)?)
            .send()
            .await
            .ok()?;
        resp.json().await.ok()
    }

    /// Node `i`'s peer store, as its status says.
    async fn peers(&self, i: usize) -> serde_json::Value {
        let s = self.status(i).await.unwrap_or_default();
        s["system_stats"]["discovery_status"]["peer_store"]["runtime"]["peers"].clone()
    }

    async fn routable(&self, i: usize) -> u64 {
        self.peers(i).await["routable"].as_u64().unwrap_or(0)
    }

    /// Waits until every live node routes to at least `n − 1` peers.
    async fn wait_all_route(&self, n: usize) {
        let deadline = Instant::now() + WAIT;
        for i in 0..self.nodes.len() {
            while self.routable(i).await < (n - 1) as u64 {
                assert!(
                    Instant::now() < deadline,
                    "node {i} never routed to {} peers",
                    n - 1
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Waits until node `i`'s peer store file holds `want` descriptors.
    async fn wait_store(&self, i: usize, want: usize) {
        let deadline = Instant::now() + WAIT;
        let file = self.nodes[i].dir.join("peers.json");
        while held(&file) < want {
            assert!(
                Instant::now() < deadline,
                "node {i}'s store never held {want}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One counter of node `i` (0 if it does not answer).
    async fn counter(&self, i: usize, name: &str) -> u64 {
        let s = self.status(i).await.unwrap_or_default();
        s["system_stats"]["discovery_status"]["peer_store"]["runtime"]["blind_relay"][name]
            .as_u64()
            .unwrap_or(0)
    }

    /// Inbox items held by the nodes of `among`.
    async fn inbox_items(&self, among: &[usize]) -> u64 {
        let mut sum = 0;
        for &i in among {
            let s = self.status(i).await.unwrap_or_default();
            sum += s["system_stats"]["discovery_status"]["peer_store"]["runtime"]["inbox"]["items"]
                .as_u64()
                .unwrap_or(0);
        }
        sum
    }

    /// Of `count` three-hop routes node `i` would choose now (its peer store read back, middles
    /// among the peers it reached), how many go through one of `ids`.
    fn routes_through(&self, i: usize, ids: &HashSet<[u8; 32]>, count: usize) -> usize {
        let me = blindrelay::proto::from_hex::<32>(&self.nodes[i].id).unwrap_or_default();
        let peers = Peers::new(vec![], true, Clock::System, me);
        cache::restore(&peers, &cache::path(&self.nodes[i].dir));
        let now = Clock::System.unix();
        let candidates: Vec<_> = peers
            .candidates(now)
            .into_iter()
            .filter(|c| c.reached)
            .collect();
        let terminals: Vec<_> = candidates
            .iter()
            .filter(|c| !ids.contains(&c.d().node_id))
            .cloned()
            .collect();
        let rules = path::Rules {
            distinct_blocks: true,
        };
        let mut rng = rand::rng();
        let mut through = 0;
        for _ in 0..count {
            let Some(t) = terminals.choose(&mut rng) else {
                break;
            };
            let route = path::choose(
                &me,
                t.d(),
                t.ip(),
                candidates.clone(),
                3,
                rules,
                now,
                &mut rng,
            );
            if route.is_ok_and(|r| r.iter().any(|h| ids.contains(&h.node_id))) {
                through += 1;
            }
        }
        through
    }

    /// `count` sends over 3 hops between random pairs of `among`, 8 at a time.
    async fn sends(&self, count: usize, among: &[usize]) -> Sent {
        let stored_before = self.inbox_items(among).await;
        let gate = Arc::new(Semaphore::new(8));
        let mut tasks = Vec::new();
        for k in 0..count {
            let pair: Vec<usize> = among
                .choose_multiple(&mut rand::rng(), 2)
                .copied()
                .collect();
            let (from, to) = (pair[0], pair[1]);
            let url = format!(
                "http://{}:{OPERATOR_PORT}/v1/send?to={}&hops=3",
                self.nodes[from].ip, self.nodes[to].id
            );
            let (http, cookie, gate) = (self.http.clone(), self.cookie(from), Arc::clone(&gate));
            tasks.push(tokio::spawn(async move {
                let _turn = gate.acquire_owned().await.ok()?;
                let resp = http
                    .post(url)
                    .bearer_auth(cookie?)
                    .body(format!("message {k}"))
                    .send()
                    .await
                    .ok()?;
                if !resp.status().is_success() {
                    return None;
                }
                let sent: serde_json::Value = resp.json().await.ok()?;
                sent["routes"].as_u64()
            }));
        }
        let (mut ok, mut rerouted) = (0, 0);
        for t in tasks {
            if let Ok(Some(routes)) = t.await {
                ok += 1;
                rerouted += usize::from(routes > 1);
            }
        }
        let stored = self.inbox_items(among).await - stored_before;
        Sent {
            ok,
            tried: count,
            rerouted,
            stored,
        }
    }
}

/// Descriptors in a peer store file.
fn held(file: &Path) -> usize {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["peers"].as_array().map(Vec::len))
        .unwrap_or(0)
}
