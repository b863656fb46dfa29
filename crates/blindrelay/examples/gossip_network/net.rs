//! The node processes: `blindrelay init` and `blindrelay run`, each node at its own /16 of
//! 127/8 with the fixed ports 7001 (relay) and 7070 (operator), its output in a log file of
//! its own; its `GET /v1/status` read with the cookie from its state dir. Every child is killed
//! (`SIGKILL`) and reaped when the [`Net`] is dropped, pass or fail.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use blindrelay::clock::{self, Instant};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::Result;

/// The relay (public) port on every node's address.
pub(crate) const RELAY_PORT: u16 = 7001;
/// The operator port on every node's address.
pub(crate) const OPERATOR_PORT: u16 = 7070;
/// Status requests (and inits) in flight at once.
const AT_ONCE: usize = 16;
/// Pause between two sweeps of statuses: of a few nodes...
const POLL: Duration = Duration::from_millis(100);
/// ...and of more than [`AT_ONCE`] (the nodes answer them on their own CPU).
const POLL_MANY: Duration = Duration::from_millis(250);
/// Nodes whose /16 is `127.(100 + slot)`; the rest go down from `127.99`.
const HIGH_SLOTS: usize = 155;

/// One node: its address, identity, state dir and `run` arguments.
#[derive(Debug)]
pub(crate) struct Node {
    /// Its loopback address, in a /16 of its own.
    pub(crate) ip: Ipv4Addr,
    /// Its node id, 64 hex.
    pub(crate) id: String,
    /// Its state dir.
    pub(crate) dir: PathBuf,
    /// Its `--peer`s (and any other argument of its `run`).
    pub(crate) args: Vec<String>,
    child: Option<Child>,
}

impl Node {
    /// `ID@https://IP:7001`, as `--peer` takes it.
    pub(crate) fn spec(&self) -> String {
        format!("{}@https://{}:{RELAY_PORT}", self.id, self.ip)
    }

    /// True while its process runs.
    pub(crate) fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// The nodes of the benchmark.
#[derive(Debug)]
pub(crate) struct Net {
    bin: PathBuf,
    gossip: String,
    http: reqwest::Client,
    /// The nodes, in the order they were made.
    pub(crate) nodes: Vec<Node>,
    // Last: removed once every child is gone.
    root: tempfile::TempDir,
}

/// A node's address for `slot`: `127.(100 + slot).x.1`, or `127.(99 - k).x.1` past the first
/// [`HIGH_SLOTS`], with the first `x` whose two ports are free (test runs use other addresses
/// of the same /16s).
fn address(slot: usize) -> Result<Ipv4Addr> {
    let second = if slot < HIGH_SLOTS {
        100 + slot
    } else {
        99usize
            .checked_sub(slot - HIGH_SLOTS)
            .ok_or("out of /16s")?
    };
    let second = u8::try_from(second)?;
    for third in 0..=255 {
        let ip = Ipv4Addr::new(127, second, third, 1);
        let free = [RELAY_PORT, OPERATOR_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok());
        if free {
            return Ok(ip);
        }
    }
    Err(format!("no free address in 127.{second}.0.0/16").into())
}

/// `blindrelay init` at `ip`, state in `dir`: the node id.
async fn init_one(bin: PathBuf, dir: PathBuf, ip: Ipv4Addr) -> Result<String> {
    let out = Command::new(bin)
        .args(["init", "--state-dir"])
        .arg(&dir)
        .args(["--endpoint", &format!("https://{ip}:{RELAY_PORT}")])
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await??;
    if !out.status.success() {
        return Err(format!("init: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The status of the node at `ip` whose state dir is `dir`, if it answers.
async fn fetch_status(http: &reqwest::Client, ip: Ipv4Addr, dir: &Path) -> Option<Value> {
    let cookie = std::fs::read_to_string(dir.join("operator.cookie")).ok()?;
    let url = format!("http://{ip}:{OPERATOR_PORT}/v1/status");
    let resp = http.get(url).bearer_auth(cookie.trim()).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.json().await.ok()
}

impl Net {
    /// No node yet; `bin` is the `blindrelay` binary, `gossip` the `--gossip-interval`.
    pub(crate) fn new(bin: PathBuf, gossip: Duration) -> Result<Net> {
        Ok(Net {
            bin,
            gossip: format!("{}ms", gossip.as_millis()),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()?,
            nodes: Vec::new(),
            root: tempfile::Builder::new()
                .prefix("gossip-network-")
                .disable_cleanup(std::env::var_os("GOSSIP_NETWORK_KEEP").is_some())
                .tempdir()?,
        })
    }

    /// The directory every state dir and log is in.
    pub(crate) fn root(&self) -> &Path {
        self.root.path()
    }

    /// The operator API's client.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The `blindrelay` binary.
    pub(crate) fn bin(&self) -> &Path {
        &self.bin
    }

    /// Inits `count` more nodes (not started), [`AT_ONCE`] at a time; their indices.
    pub(crate) async fn init(&mut self, count: usize) -> Result<std::ops::Range<usize>> {
        let first = self.nodes.len();
        let gate = Arc::new(Semaphore::new(AT_ONCE));
        let mut tasks = JoinSet::new();
        let mut made = Vec::new();
        for i in first..first + count {
            let ip = address(i)?;
            let dir = self.root().join(format!("node{i}"));
            made.push((ip, dir.clone()));
            let (bin, gate) = (self.bin.clone(), Arc::clone(&gate));
            tasks.spawn(async move {
                let _turn = gate.acquire_owned().await?;
                Ok::<_, crate::Error>((i, init_one(bin, dir, ip).await?))
            });
        }
        let mut ids = HashMap::new();
        while let Some(r) = tasks.join_next().await {
            let (i, id) = r??;
            ids.insert(i, id);
        }
        for (k, (ip, dir)) in made.into_iter().enumerate() {
            let id = ids.remove(&(first + k)).ok_or("an init went missing")?;
            let args = Vec::new();
            let child = None;
            self.nodes.push(Node {
                ip,
                id,
                dir,
                args,
                child,
            });
        }
        Ok(first..first + count)
    }

    /// Node `i`'s log file.
    fn log_path(&self, i: usize) -> PathBuf {
        self.root().join(format!("node{i}.log"))
    }

    /// The last `lines` lines of node `i`'s log.
    pub(crate) fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Starts node `i` (`blindrelay run`) with its arguments and `extra`.
    pub(crate) fn spawn(&mut self, i: usize, extra: &[String]) -> Result<()> {
        if self.nodes[i].running() {
            return Err(format!("node {i} runs already").into());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))?;
        let me = &self.nodes[i];
        let mut cmd = Command::new(&self.bin);
        cmd.args(["run", "--state-dir"])
            .arg(&me.dir)
            .args(["--listen", &format!("{}:{RELAY_PORT}", me.ip)])
            .args(["--operator", &format!("{}:{OPERATOR_PORT}", me.ip)])
            .args(["--gossip-interval", &self.gossip])
            .arg("--allow-private-endpoints")
            .args(&me.args)
            .args(extra)
            .args(
                std::env::var("GOSSIP_NETWORK_NODE_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        self.nodes[i].child = Some(cmd.spawn()?);
        Ok(())
    }

    /// Kills every node of `which` at once (`SIGKILL`), then reaps them (at most 10 s).
    pub(crate) async fn kill(&mut self, which: &[usize]) {
        let mut children = Vec::new();
        for &i in which {
            if let Some(mut c) = self.nodes[i].child.take() {
                let _ = c.start_kill();
                children.push(c);
            }
        }
        for mut c in children {
            let _ = tokio::time::timeout(Duration::from_secs(10), c.wait()).await;
        }
    }

    /// CPU seconds (user and system) the running nodes used so far, from `/proc/PID/stat`
    /// (clock ticks of 1/100 s).
    pub(crate) fn cpu_secs(&self) -> f64 {
        let ticks: u64 = self
            .nodes
            .iter()
            .filter_map(|n| n.child.as_ref()?.id())
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
            .filter_map(|stat| {
                // Fields after the command's closing parenthesis: utime and stime are the 12th
                // and 13th.
                let rest = &stat[stat.rfind(')')? + 1..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
            .sum();
        ticks as f64 / 100.0
    }

    /// Indices of the running nodes.
    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].running())
            .collect()
    }

    /// Node `i`'s status, if it answers.
    pub(crate) async fn status(&self, i: usize) -> Option<Value> {
        let n = &self.nodes[i];
        fetch_status(&self.http, n.ip, &n.dir).await
    }

    /// The statuses of `among`, in its order, [`AT_ONCE`] requests at a time (`None`: no
    /// answer).
    pub(crate) async fn sweep(&self, among: &[usize]) -> Vec<Option<Value>> {
        let gate = Arc::new(Semaphore::new(AT_ONCE));
        let mut tasks = JoinSet::new();
        for (k, &i) in among.iter().enumerate() {
            let (http, ip, dir) = (
                self.http.clone(),
                self.nodes[i].ip,
                self.nodes[i].dir.clone(),
            );
            let gate = Arc::clone(&gate);
            tasks.spawn(async move {
                let _turn = gate.acquire_owned().await.ok();
                (k, fetch_status(&http, ip, &dir).await)
            });
        }
        let mut out = vec![None; among.len()];
        while let Some(r) = tasks.join_next().await {
            if let Ok((k, s)) = r {
                out[k] = s;
            }
        }
        out
    }

    /// Polls the statuses of `among` (sweeps [`POLL`] or [`POLL_MANY`] apart) until `done` holds of each, at
    /// most until `deadline`: for each node, the time since `t0` it was first seen done and
    /// that status (`None`: not within the deadline).
    pub(crate) async fn until(
        &self,
        among: &[usize],
        t0: Instant,
        deadline: Instant,
        done: impl Fn(&Value) -> bool,
    ) -> Vec<Option<(Duration, Value)>> {
        let mut seen: Vec<Option<(Duration, Value)>> = vec![None; among.len()];
        loop {
            let left: Vec<usize> = (0..among.len()).filter(|k| seen[*k].is_none()).collect();
            if left.is_empty() || clock::now() >= deadline {
                return seen;
            }
            let ask: Vec<usize> = left.iter().map(|k| among[*k]).collect();
            let ask_len = ask.len();
            for (s, k) in self.sweep(&ask).await.into_iter().zip(left) {
                if let Some(s) = s.filter(&done) {
                    seen[k] = Some((clock::elapsed(t0), s));
                }
            }
            let many = ask_len > AT_ONCE;
            tokio::time::sleep(if many { POLL_MANY } else { POLL }).await;
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let mut children: Vec<Child> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.child.take())
            .collect();
        for c in &mut children {
            let _ = c.start_kill();
        }
        let deadline = std::time::Duration::from_secs(10);
        let started = clock::now();
        for c in &mut children {
            while matches!(c.try_wait(), Ok(None)) && clock::elapsed(started) < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// `runtime.peers` of a status.
pub(crate) fn peers(s: &Value) -> &Value {
    &s["system_stats"]["discovery_status"]["peer_store"]["runtime"]["peers"]
}

/// A number of `runtime.peers` (`routable`, `known`, …), 0 when absent.
pub(crate) fn peers_n(s: &Value, name: &str) -> u64 {
    peers(s)[name].as_u64().unwrap_or(0)
}

/// A counter of `runtime.blind_relay` (`gossip_bytes_sent`, …), 0 when absent.
pub(crate) fn counter(s: &Value, name: &str) -> u64 {
    s["system_stats"]["discovery_status"]["peer_store"]["runtime"]["blind_relay"][name]
        .as_u64()
        .unwrap_or(0)
}

/// A counter of `runtime.peers.discovery.counters` (`bytes_sent`, `exchanges`, …).
pub(crate) fn disc(s: &Value, name: &str) -> u64 {
    peers(s)["discovery"]["counters"][name]
        .as_u64()
        .unwrap_or(0)
}
