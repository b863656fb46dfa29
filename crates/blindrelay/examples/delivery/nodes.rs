//! The six node processes: their flags, start-up, readiness, and what `/metrics` and `/proc`
//! say they spent.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::{NODES, OPERATOR_PORT, RELAY_PORT};

/// The flags that lift the design's admission limits out of the way.
pub(crate) const UNLIMITED: &[&str] = &[
    "--probe-interval",
    "0s",
    "--allow-private-endpoints",
    "--admission-per-minute",
    "6000000",
    "--previous-hop-limit",
    "1000000",
    "--cheap-per-second",
    "100000",
    "--max-in-flight",
    "256",
    "--in-flight-per-source",
    "256",
    "--per-next-hop",
    "64",
    "--next-hop-queue",
    "256",
    "--next-hop-queue-bytes",
    "268435456",
    "--outbound-queue",
    "1024",
    "--outbound-queue-bytes",
    "1073741824",
    "--replay-capacity",
    "1000000",
    "--replay-share",
    "100",
    "--inbox-max-items",
    "1000000",
    "--inbox-max-bytes",
    "17179869184",
    "--inbox-share",
    "100",
];

pub(crate) struct Node {
    pub(crate) ip: Ipv4Addr,
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    pub(crate) child: Option<Child>,
}

/// A loopback address whose relay and operator ports are free now, in a /16 of its own
/// (`127.(120 + k).0.1`: no two hops of a route may share a /16).
pub(crate) fn free_ip(k: &mut u8) -> Ipv4Addr {
    loop {
        assert!(*k < 100, "no free loopback /16 left");
        *k += 1;
        let ip = Ipv4Addr::new(127, 120 + *k, 0, 1);
        let free = [RELAY_PORT, OPERATOR_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok());
        if free {
            return ip;
        }
    }
}

pub(crate) async fn start(bin: &Path, root: &Path, node_flags: &[String]) -> Vec<Node> {
    let mut k = 0u8;
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let ip = free_ip(&mut k);
        let dir = root.join(format!("node{i}"));
        let out = Command::new(bin)
            .args(["init", "--state-dir"])
            .arg(&dir)
            .args(["--endpoint", &format!("https://{ip}:{RELAY_PORT}")])
            .output()
            .await
            .expect("blindrelay init");
        assert!(out.status.success(), "init failed");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        nodes.push(Node {
            ip,
            id,
            dir,
            child: None,
        });
    }
    for i in 0..NODES {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--state-dir".into(),
            nodes[i].dir.display().to_string(),
            "--listen".into(),
            format!("{}:{RELAY_PORT}", nodes[i].ip),
            "--operator".into(),
            format!("{}:{OPERATOR_PORT}", nodes[i].ip),
        ];
        for (j, other) in nodes.iter().enumerate() {
            if j != i {
                args.push("--peer".into());
                args.push(format!("{}@https://{}:{RELAY_PORT}", other.id, other.ip));
            }
        }
        args.extend(UNLIMITED.iter().map(|s| s.to_string()));
        args.extend(node_flags.iter().cloned());
        let child = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("blindrelay run");
        nodes[i].child = Some(child);
    }
    nodes
}

pub(crate) fn operator_client(node: &Node) -> reqwest::Client {
    let cookie = std::fs::read_to_string(node.dir.join("operator.cookie")).unwrap_or_default();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(v) = format!("Bearer {}", cookie.trim()).parse() {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Waits (at most 20 s, polling the status) until every node routes to the five others.
pub(crate) async fn wait_ready(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for node in nodes {
        let url = format!("http://{}:{OPERATOR_PORT}/v1/status", node.ip);
        loop {
            assert!(Instant::now() < deadline, "the nodes did not come up");
            let http = operator_client(node);
            let routable = match http.get(&url).send().await {
                Ok(r) => r.json::<serde_json::Value>().await.ok().and_then(|v| {
                    v["system_stats"]["discovery_status"]["peer_store"]["runtime"]["peers"]
                            ["routable"]
                            .as_u64()
                }),
                Err(_) => None,
            };
            if routable == Some(NODES as u64 - 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The counters every node's `GET /metrics` shows that say what a loaded run spent besides
/// deliveries, summed over the nodes: relay requests received, `backpressure` refusals, busy
/// retries (of `backpressure`, `source_limited`, `route_in_flight`), requests that waited for
/// their turn (`paced`).
pub(crate) const SPENT: [&str; 4] = [
    "blindrelay_received_total",
    "blindrelay_backpressure_dropped_total",
    "blindrelay_busy_retried_total",
    "blindrelay_paced_total",
];

pub(crate) async fn spent(nodes: &[Node]) -> [u64; 4] {
    let mut sum = [0u64; 4];
    for node in nodes {
        let url = format!("http://{}:{OPERATOR_PORT}/metrics", node.ip);
        let Ok(r) = operator_client(node).get(&url).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(name), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            if let Some(i) = SPENT.iter().position(|s| *s == name) {
                sum[i] += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

/// CPU time (user + system) and context switches of a process, all its threads, from
/// `/proc` (Linux; `None` elsewhere). `/proc`'s ticks are 1/100 s on Linux.
pub(crate) fn proc_cpu(pid: u32) -> Option<(Duration, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some((Duration::from_millis(ticks * 10), switches))
}

/// CPU time and context switches of every node process and of this harness (its clients).
pub(crate) fn cpu_now(nodes: &[Node]) -> (Duration, u64, Duration) {
    let (mut cpu, mut switches) = (Duration::ZERO, 0);
    for node in nodes {
        if let Some((c, s)) = node.child.as_ref().and_then(Child::id).and_then(proc_cpu) {
            cpu += c;
            switches += s;
        }
    }
    let me = proc_cpu(std::process::id()).map_or(Duration::ZERO, |(c, _)| c);
    (cpu, switches, me)
}
