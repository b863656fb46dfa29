//! Shared helpers for the integration tests: a network of real `blindrelay` processes on fresh
//! loopback addresses, driven through the real CLI and the operator API.
//!
//! - Every node gets its own address `127.(200 + k).x.1`, in a /16 of its own among its
//!   network's nodes (no two hops of a route may share a /16), never `127.0.0.1`, and the fixed
//!   ports 7001 (relay) and 7070 (operator) on it, so tests never collide on ports; helpers
//!   (sinks, attackers) take `127.(50 + pid % 150).x.y`.
//! - Readiness is never guessed with a sleep: a node is up when it logs `node ready`, and the
//!   network is up when every node's `GET /v1/status` shows all other nodes routable (polled
//!   every 20 ms, at most 10 s).
//! - Every process is killed by PID (`kill -9`) and reaped when its guard is dropped, pass or
//!   fail; `kill_on_drop(true)` is a second line of defence.
#![allow(dead_code, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod crash;
pub mod doc;
pub mod inproc;
pub use doc::Doc;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_blindrelay");
/// The relay (public) port on every node's address.
pub const RELAY_PORT: u16 = 7001;
/// The operator port on every node's address.
pub const OPERATOR_PORT: u16 = 7070;
/// Longest wait for any readiness condition.
pub const WAIT: Duration = Duration::from_secs(10);
/// Poll interval for readiness conditions.
pub const POLL: Duration = Duration::from_millis(20);

static NEXT_IP: AtomicU32 = AtomicU32::new(0);

/// The next loopback address of this process's range, `127.(50 + pid % 150).x.y`: never the
/// same twice in one process.
fn next_ip() -> Ipv4Addr {
    let second = 50 + (std::process::id() % 150) as u8;
    let n = NEXT_IP.fetch_add(1, Ordering::Relaxed);
    Ipv4Addr::new(127, second, ((n / 254) % 256) as u8, (n % 254 + 1) as u8)
}

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// A fresh loopback address with both fixed ports free, in a /16 that none of `taken` is in:
/// `127.(200 + k).x.1` for 55 values of `k` (a network whose nodes must not share an address
/// block: gossip's per-block bound, path diversity).
pub fn fresh_ip_own_16(taken: &[Ipv4Addr]) -> Ipv4Addr {
    let pid = std::process::id();
    for _ in 0..55 * 256 {
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let ip = Ipv4Addr::new(127, 200 + (n % 55) as u8, ((pid + n / 55) % 256) as u8, 1);
        if taken.iter().any(|t| t.octets()[1] == ip.octets()[1]) {
            continue;
        }
        let free = [RELAY_PORT, OPERATOR_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok());
        if free {
            return ip;
        }
    }
    panic!("no free loopback /16 left");
}

/// Addresses [`fresh_ip`] and [`fresh_listener`] try before they give up.
const ADDRESSES: usize = 254 * 256;

/// A fresh loopback address for this process ([`next_ip`]), with both fixed ports free right
/// now (for a node process to bind).
pub fn fresh_ip() -> Ipv4Addr {
    for _ in 0..ADDRESSES {
        let ip = next_ip();
        let free = [RELAY_PORT, OPERATOR_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok());
        if free {
            return ip;
        }
    }
    panic!("no free loopback address left in this process's range");
}

/// A listener on `port` of a fresh address ([`next_ip`]), bound here and now: no gap between
/// finding the port free and taking it, in which another process could take it first.
pub async fn fresh_listener(port: u16) -> tokio::net::TcpListener {
    for _ in 0..ADDRESSES {
        match tokio::net::TcpListener::bind((next_ip(), port)).await {
            Ok(listener) => return listener,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => panic!("bind a fresh listener: {e}"),
        }
    }
    panic!("no free loopback address left in this process's range");
}

/// An HTTP client for the tests: no proxy, bounded time; on a node's links it presents an
/// identity of its own (a fresh key: the previous hop of every frame it posts).
pub fn http() -> reqwest::Client {
    client(
        None,
        &ed25519_dalek::SigningKey::from_bytes(&rand::random()),
    )
}

/// An HTTP client whose connections come from `ip`, with an identity of its own (a fresh key).
pub fn http_from(ip: Ipv4Addr) -> reqwest::Client {
    http_from_as(ip, &ed25519_dalek::SigningKey::from_bytes(&rand::random()))
}

/// An HTTP client whose connections come from `ip`, presenting `key`'s identity on a node's
/// links (the previous hop of every frame it posts).
pub fn http_from_as(ip: Ipv4Addr, key: &ed25519_dalek::SigningKey) -> reqwest::Client {
    client(Some(IpAddr::V4(ip)), key)
}

/// An HTTP client that presents no identity on a node's links: it cannot post a frame.
pub fn http_anonymous() -> reqwest::Client {
    blindrelay::links::install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

fn client(from: Option<IpAddr>, key: &ed25519_dalek::SigningKey) -> reqwest::Client {
    blindrelay::links::install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config_as(key).expect("tls"))
        .no_proxy()
        .local_address(from)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

/// A counter from a `GET /v1/status` answer (panics if missing).
pub fn counter(status: &Value, name: &str) -> u64 {
    status.counters()[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {status}"))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Now, in Unix seconds (the nodes run on the system clock).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// A v2 frame for `path` (the last descriptor is the terminal) carrying `payload`, every layer
/// expiring at `expires_at` (a sender's own is `send::wrap::expiry(now)`); its previous hop is
/// whoever posts it.
pub fn craft(
    path: &[&blindrelay::proto::Descriptor],
    payload: &[u8],
    probe: bool,
    expires_at: u64,
) -> blindrelay::send::wrap::Wrapped {
    let hops: Vec<blindrelay::send::Hop> = path.iter().map(|d| blindrelay::send::hop(d)).collect();
    blindrelay::send::wrap::wrap_expiring(&hops, payload, probe, expires_at).expect("wraps")
}

/// Random bytes.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut v);
    v
}

/// What a process's output readers have seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    ready: bool,
    eof: bool,
}

/// A running process: killed with `kill -9 <pid>` and reaped when dropped.
#[derive(Debug)]
struct Proc {
    child: Child,
    pid: u32,
    seen: watch::Receiver<Seen>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Kills (unless it already exited) and reaps.
    fn kill9(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // A stopped process dies of SIGKILL too; CONT first keeps its readers moving.
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::process::Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.start_kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    /// Kills, reaps, and waits (bounded) until its output has been read to the end.
    async fn stop(mut self) {
        self.kill9();
        for r in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Reads `out` line by line into `log`; marks `node ready` and the end of the stream.
fn read_lines(
    out: impl AsyncRead + Unpin + Send + 'static,
    log: Arc<Mutex<Vec<String>>>,
    seen: Arc<watch::Sender<Seen>>,
    watch_ready: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(out);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                    let ready = watch_ready && line.contains("node ready");
                    log.lock().unwrap().push(line);
                    if ready {
                        seen.send_modify(|s| s.ready = true);
                    }
                }
            }
        }
        if watch_ready {
            seen.send_modify(|s| s.eof = true);
        }
    })
}

/// Runs the CLI with `args` and `RUST_LOG` (removed when `None`); at most 30 s.
pub async fn run_cli(args: &[&str], rust_log: Option<&str>) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match rust_log {
        Some(l) => cmd.env("RUST_LOG", l),
        None => cmd.env_remove("RUST_LOG"),
    };
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("CLI timed out")
        .expect("run CLI");
    CliOutput {
        ok: out.status.success(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Most bytes a [`Tap`] records.
const TAP_BYTES: usize = 16 << 20;

/// A recording TCP proxy on loopback: forwards each connection to `upstream` and keeps the
/// bytes of both directions (at most [`TAP_BYTES`]), and per connection the client's bytes in
/// runs (a run ends when the server sends), each run numbered from one process-wide sequence.
#[derive(Debug, Clone)]
pub struct Tap {
    /// Where it listens.
    pub addr: SocketAddr,
    bytes: Arc<Mutex<Vec<u8>>>,
    conns: Arc<Mutex<Vec<TapConn>>>,
}

/// One connection through a [`Tap`]: what the client sent, where each of its runs began and
/// the run's sequence number.
#[derive(Debug, Default)]
struct TapConn {
    client: Vec<u8>,
    runs: Vec<(usize, u32)>,
    in_client_run: bool,
    server: Vec<u8>,
    server_runs: Vec<(usize, u32)>,
    in_server_run: bool,
}

/// A TLS 1.3 close_notify alert's record on the wire: header, alert, content type, AEAD tag.
const CLOSE_NOTIFY_RECORD: usize = 5 + 2 + 1 + 16;

/// For every run of `bytes` numbered at `mark` or after, the bytes of its TLS application-data
/// records, headers included; the first application-data record (a client's TLS 1.3 Finished)
/// is left out when `skip_first_record`, and so is a close_notify alert's record.
fn record_lens(
    bytes: &[u8],
    runs: &[(usize, u32)],
    mark: u32,
    skip_first_record: bool,
) -> Vec<usize> {
    let mut lens = vec![0usize; runs.len()];
    let (mut at, mut first_seen) = (0usize, !skip_first_record);
    while at + 5 <= bytes.len() {
        let kind = bytes[at];
        let len = usize::from(u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]));
        if at + 5 + len > bytes.len() {
            break;
        }
        if kind == 0x17 {
            if first_seen {
                let run = runs.iter().rposition(|(start, _)| *start <= at);
                if let Some(run) = run
                    && 5 + len != CLOSE_NOTIFY_RECORD
                {
                    lens[run] += 5 + len;
                }
            } else {
                first_seen = true;
            }
        }
        at += 5 + len;
    }
    runs.iter()
        .zip(lens)
        .filter(|((_, seq), len)| *seq >= mark && *len > 0)
        .map(|(_, len)| len)
        .collect()
}

/// The sequence runs are numbered from (see [`tap_mark`]).
static TAP_SEQ: AtomicU32 = AtomicU32::new(1);

/// The sequence number the next client run will have, at least: runs after this mark are
/// [`Tap::requests_since`] it.
pub fn tap_mark() -> u32 {
    TAP_SEQ.load(Ordering::SeqCst)
}

impl Tap {
    /// A tap on `ip` (in the node's own /16) in front of `upstream`.
    async fn start(ip: Ipv4Addr, upstream: SocketAddr) -> Tap {
        let listener = tokio::net::TcpListener::bind((ip, RELAY_PORT))
            .await
            .expect("bind a tap");
        let addr = listener.local_addr().expect("addr");
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let conns: Arc<Mutex<Vec<TapConn>>> = Arc::new(Mutex::new(Vec::new()));
        let (seen, all) = (Arc::clone(&bytes), Arc::clone(&conns));
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                let all = Arc::clone(&all);
                tokio::spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let conn = {
                        let mut all = all.lock().unwrap();
                        all.push(TapConn::default());
                        all.len() - 1
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let to_server = (Arc::clone(&all), conn, true);
                    let a = tokio::spawn(pump(dr, uw, Arc::clone(&seen), to_server));
                    let b = tokio::spawn(pump(ur, dw, seen, (all, conn, false)));
                    let _ = tokio::join!(a, b);
                });
            }
        });
        Tap { addr, bytes, conns }
    }

    /// The client's requests after the TLS handshake, as a link observer sees them: for every
    /// client run numbered after `mark`, the bytes of its TLS application-data records, record
    /// headers included (the client's handshake records and its first encrypted record, the
    /// TLS 1.3 Finished, are left out).
    pub fn requests_since(&self, mark: u32) -> Vec<usize> {
        let conns = self.conns.lock().unwrap();
        conns
            .iter()
            .flat_map(|c| record_lens(&c.client, &c.runs, mark, true))
            .collect()
    }

    /// The server's answers as a link observer sees them: for every server run numbered after
    /// `mark`, the bytes of its TLS application-data records, record headers included (the
    /// server's handshake flight, its first run, is left out, and so is a close_notify alert).
    pub fn answers_since(&self, mark: u32) -> Vec<usize> {
        let conns = self.conns.lock().unwrap();
        conns
            .iter()
            .flat_map(|c| {
                let runs = c.server_runs.get(1..).unwrap_or_default();
                let start = runs.first().map_or(c.server.len(), |(at, _)| *at);
                let runs: Vec<_> = runs.iter().map(|(at, seq)| (at - start, *seq)).collect();
                record_lens(&c.server[start..], &runs, mark, false)
            })
            .collect()
    }

    /// Everything seen so far, both directions.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    seen: Arc<Mutex<Vec<u8>>>,
    (conns, conn, to_server): (Arc<Mutex<Vec<TapConn>>>, usize, bool),
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut s = seen.lock().unwrap();
            if s.len() + n <= TAP_BYTES {
                s.extend_from_slice(&buf[..n]);
            }
        }
        {
            let mut all = conns.lock().unwrap();
            let c = &mut all[conn];
            if !to_server {
                c.in_client_run = false;
                if c.server.len() + n <= TAP_BYTES {
                    if !c.in_server_run {
                        c.in_server_run = true;
                        let seq = TAP_SEQ.fetch_add(1, Ordering::SeqCst);
                        c.server_runs.push((c.server.len(), seq));
                    }
                    c.server.extend_from_slice(&buf[..n]);
                }
            } else if c.client.len() + n <= TAP_BYTES {
                c.in_server_run = false;
                if !c.in_client_run {
                    c.in_client_run = true;
                    let seq = TAP_SEQ.fetch_add(1, Ordering::SeqCst);
                    c.runs.push((c.client.len(), seq));
                }
                c.client.extend_from_slice(&buf[..n]);
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// One node of a [`Net`].
#[derive(Debug, Clone)]
pub struct Node {
    /// Full node id, 64 hex.
    pub id: String,
    /// Its loopback address.
    pub ip: Ipv4Addr,
    /// `https://IP:7001`.
    pub endpoint: String,
    /// `http://IP:7070`.
    pub operator: String,
    /// The state dir.
    pub state_dir: PathBuf,
    /// Everything the node wrote to stderr (and stdout), across restarts.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// The 8-hex prefix of the id.
    pub fn prefix(&self) -> &str {
        &self.id[..8]
    }

    /// A copy of the log lines.
    pub fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Log lines containing `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// The output of a CLI run.
#[derive(Debug, Clone)]
pub struct CliOutput {
    /// Exit status 0.
    pub ok: bool,
    /// Raw standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: String,
}

impl CliOutput {
    /// Standard output as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// A network of `blindrelay run` processes, each with every other node as `--peer` (or, for a
/// network started with [`Net::start_bootstrapped`], only its bootstrap peers).
#[derive(Debug)]
pub struct Net {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    /// Each node's `--peer`s, when not every other node.
    bootstrap: Option<Vec<Vec<usize>>>,
    procs: Vec<Option<Proc>>,
    extra: Vec<String>,
    rust_log: Option<String>,
    http: reqwest::Client,
    files: AtomicU32,
}

/// `blindrelay init` of a node at `ip` whose descriptor names `endpoint`, its state in
/// `state_dir`.
async fn init_node(state_dir: &Path, ip: Ipv4Addr, endpoint: String) -> Node {
    let out = Command::new(BIN)
        .args(["init", "--state-dir"])
        .arg(state_dir)
        .args(["--endpoint", &endpoint])
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run blindrelay init");
    assert!(
        out.status.success(),
        "init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 64, "init printed {id:?}");
    Node {
        id,
        ip,
        endpoint,
        operator: format!("http://{ip}:{OPERATOR_PORT}"),
        state_dir: state_dir.to_owned(),
        log: Arc::new(Mutex::new(Vec::new())),
    }
}

impl Net {
    /// Inits and runs `n` nodes with `extra_args` added to every `run`, logging at the default
    /// level; returns once every node is ready and routes to all others.
    pub async fn start(n: usize, extra_args: &[&str]) -> Net {
        Net::start_with(n, extra_args, None).await
    }

    /// [`Net::start`] with `RUST_LOG` set for every node and every CLI run.
    pub async fn start_with(n: usize, extra_args: &[&str], rust_log: Option<&str>) -> Net {
        Net::start_inner(n, extra_args, rust_log, &mut None).await
    }

    /// [`Net::start`] with a recording TCP proxy in front of every node's relay port: each
    /// node's endpoint (in its descriptor and in the others' `--peer`) is its proxy's address,
    /// so every link message and descriptor fetch passes a [`Tap`].
    pub async fn start_tapped(n: usize, extra_args: &[&str]) -> (Net, Vec<Tap>) {
        let mut taps = Some(Vec::new());
        let net = Net::start_inner(n, extra_args, None, &mut taps).await;
        (net, taps.unwrap_or_default())
    }

    async fn start_inner(
        n: usize,
        extra_args: &[&str],
        rust_log: Option<&str>,
        taps: &mut Option<Vec<Tap>>,
    ) -> Net {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut nodes: Vec<Node> = Vec::with_capacity(n);
        for i in 0..n {
            let taken: Vec<Ipv4Addr> = nodes.iter().map(|n| n.ip).collect();
            let ip = fresh_ip_own_16(&taken);
            let endpoint = match taps {
                Some(taps) => {
                    let [a, b, c, _] = ip.octets();
                    let at = Ipv4Addr::new(a, b, c, 2);
                    let tap = Tap::start(at, SocketAddr::from((ip, RELAY_PORT))).await;
                    let endpoint = format!("https://{}", tap.addr);
                    taps.push(tap);
                    endpoint
                }
                None => format!("https://{ip}:{RELAY_PORT}"),
            };
            nodes.push(init_node(&dir.path().join(format!("node{i}")), ip, endpoint).await);
        }
        let mut net = Net {
            dir,
            nodes,
            bootstrap: None,
            procs: (0..n).map(|_| None).collect(),
            extra: extra_args.iter().map(|s| s.to_string()).collect(),
            rust_log: rust_log.map(str::to_string),
            http: http(),
            files: AtomicU32::new(0),
        };
        for i in 0..n {
            net.spawn(i);
        }
        for i in 0..n {
            net.wait_ready(i).await;
        }
        for i in 0..n {
            net.wait_routable(i, n - 1).await;
        }
        net
    }

    /// Inits and runs `n` nodes, each in a /16 of its own ([`fresh_ip_own_16`]) and with only
    /// `bootstrap(i)` as its `--peer`s, `extra_args` added to every `run`; returns once every
    /// node is ready (the rest is gossip's work: see [`Net::wait_routable_within`]).
    pub async fn start_bootstrapped(
        n: usize,
        extra_args: &[&str],
        bootstrap: impl Fn(usize) -> Vec<usize>,
    ) -> Net {
        let mut net = Net {
            dir: tempfile::tempdir().expect("tempdir"),
            nodes: Vec::with_capacity(n),
            bootstrap: Some(Vec::new()),
            procs: Vec::new(),
            extra: extra_args.iter().map(|s| s.to_string()).collect(),
            rust_log: None,
            http: http(),
            files: AtomicU32::new(0),
        };
        for i in 0..n {
            net.add_node(bootstrap(i)).await;
        }
        net
    }

    /// Inits and runs one more node in a /16 of its own with `bootstrap` as its `--peer`s;
    /// returns its index once it is ready. The others are not restarted.
    pub async fn add_node(&mut self, bootstrap: Vec<usize>) -> usize {
        let i = self.nodes.len();
        let taken: Vec<Ipv4Addr> = self.nodes.iter().map(|n| n.ip).collect();
        let ip = fresh_ip_own_16(&taken);
        let dir = self.dir.path().join(format!("node{i}"));
        let node = init_node(&dir, ip, format!("https://{ip}:{RELAY_PORT}")).await;
        self.nodes.push(node);
        self.procs.push(None);
        self.bootstrap.get_or_insert_with(Vec::new).push(bootstrap);
        self.spawn(i);
        self.wait_ready(i).await;
        i
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Every node.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The temporary directory holding every state dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn run_args(&self, i: usize) -> Vec<String> {
        let me = &self.nodes[i];
        let mut args = vec![
            "run".to_string(),
            "--state-dir".into(),
            me.state_dir.display().to_string(),
            "--listen".into(),
            format!("{}:{RELAY_PORT}", me.ip),
            "--operator".into(),
            format!("{}:{OPERATOR_PORT}", me.ip),
            "--allow-private-endpoints".into(),
        ];
        for (j, other) in self.nodes.iter().enumerate() {
            let peer = match &self.bootstrap {
                Some(b) => b.get(i).is_some_and(|b| b.contains(&j)),
                None => j != i,
            };
            if peer {
                args.push("--peer".into());
                args.push(format!("{}@{}", other.id, other.endpoint));
            }
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    fn env(&self, cmd: &mut Command) {
        match &self.rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
    }

    fn spawn(&mut self, i: usize) {
        self.spawn_with(i, &[]);
    }

    fn spawn_with(&mut self, i: usize, extra: &[&str]) {
        assert!(self.procs[i].is_none(), "node {i} is running already");
        let mut cmd = Command::new(BIN);
        cmd.args(self.run_args(i))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        self.env(&mut cmd);
        let mut child = cmd.spawn().expect("spawn blindrelay run");
        let pid = child.id().expect("pid");
        let (tx, rx) = watch::channel(Seen::default());
        let tx = Arc::new(tx);
        let log = Arc::clone(&self.nodes[i].log);
        let readers = vec![
            read_lines(
                child.stderr.take().unwrap(),
                Arc::clone(&log),
                Arc::clone(&tx),
                true,
            ),
            read_lines(child.stdout.take().unwrap(), log, tx, false),
        ];
        self.procs[i] = Some(Proc {
            child,
            pid,
            seen: rx,
            readers,
        });
    }

    async fn wait_ready(&mut self, i: usize) {
        let mut rx = self.procs[i].as_ref().expect("running").seen.clone();
        let got = tokio::time::timeout(WAIT, rx.wait_for(|s| s.ready || s.eof)).await;
        let seen = match got {
            Ok(Ok(s)) => *s,
            _ => Seen::default(),
        };
        if !seen.ready {
            panic!(
                "node {i} not ready within {WAIT:?} (exited: {}); log:\n{}",
                seen.eof,
                self.nodes[i].lines().join("\n")
            );
        }
    }

    /// Waits until node `i` has written every stored answer to its replay file (its status's
    /// `unwritten_answers` is 0; at most [`WAIT`]): what a kill -9 must not lose.
    pub async fn wait_answers_written(&self, i: usize) {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.status(i).await;
            if s.runtime()["replay"]["unwritten_answers"].as_u64() == Some(0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {i}: answers unwritten: {s}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until node `i`'s status shows `want` routable peers.
    pub async fn wait_routable(&self, i: usize, want: usize) {
        self.wait_routable_within(i, want, WAIT).await;
    }

    /// Waits until node `i` routes to `want` peers, at most `within`; panics with its last
    /// status and log otherwise.
    pub async fn wait_routable_within(&self, i: usize, want: usize, within: Duration) {
        let deadline = Instant::now() + within;
        let url = format!("{}/v1/status", self.nodes[i].operator);
        let mut last = Value::Null;
        let http = self.op_http(i);
        while Instant::now() < deadline {
            if let Ok(resp) = http.get(&url).send().await
                && let Ok(v) = resp.json::<Value>().await
            {
                if v.runtime()["peers"]["routable"].as_u64() == Some(want as u64) {
                    return;
                }
                last = v;
            }
            tokio::time::sleep(POLL).await;
        }
        panic!(
            "node {i} has not {want} routable peers within {within:?}; last status {last}; log:\n{}",
            self.nodes[i].lines().join("\n")
        );
    }

    /// Runs the CLI with `args` (the network's `RUST_LOG`, if any). A command naming a node's
    /// `--operator` reads that node's cookie from its state dir (`--state-dir` added) unless
    /// the args say where the cookie is.
    pub async fn cli(&self, args: &[&str]) -> CliOutput {
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let named = args
            .windows(2)
            .find(|w| w[0] == "--operator")
            .and_then(|w| self.nodes.iter().find(|n| n.operator == w[1]));
        let told = args
            .iter()
            .any(|a| a == "--state-dir" || a == "--cookie-file");
        if let (Some(node), false) = (named, told) {
            args.insert(1, node.state_dir.display().to_string());
            args.insert(1, "--state-dir".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args, self.rust_log.as_deref()).await
    }

    /// Node `i`'s operator cookie, as an `Authorization` header value.
    pub fn bearer(&self, i: usize) -> String {
        let cookie = std::fs::read_to_string(self.nodes[i].state_dir.join("operator.cookie"))
            .expect("operator cookie");
        format!("Bearer {}", cookie.trim())
    }

    /// An HTTP client for node `i`'s operator API: its cookie on every request.
    pub fn op_http(&self, i: usize) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            self.bearer(i).parse().expect("header"),
        );
        blindrelay::links::install_provider();
        reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .timeout(Duration::from_secs(20))
            .build()
            .expect("http client")
    }

    /// `blindrelay send` from node `from` to node `to`: (exit 0, stdout, stderr).
    pub async fn send(
        &self,
        from: usize,
        to: usize,
        hops: usize,
        payload: &[u8],
    ) -> (bool, String, String) {
        let to = self.nodes[to].id.clone();
        self.send_to(from, &to, hops, payload).await
    }

    /// `blindrelay send` from node `from` to any `to` string.
    pub async fn send_to(
        &self,
        from: usize,
        to: &str,
        hops: usize,
        payload: &[u8],
    ) -> (bool, String, String) {
        let k = self.files.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.path().join(format!("payload-{k}.bin"));
        std::fs::write(&file, payload).unwrap();
        let file = file.display().to_string();
        let hops = hops.to_string();
        let out = self
            .cli(&[
                "send",
                "--operator",
                &self.nodes[from].operator,
                "--to",
                to,
                "--hops",
                &hops,
                &file,
            ])
            .await;
        (out.ok, out.out(), out.stderr)
    }

    /// `GET /v1/status` of node `i`.
    pub async fn status(&self, i: usize) -> Value {
        self.get_json(i, "/v1/status").await
    }

    /// `GET /v1/inbox` of node `i` (the listing).
    pub async fn inbox(&self, i: usize) -> Value {
        self.get_json(i, "/v1/inbox").await
    }

    /// The ids in node `i`'s inbox listing.
    pub async fn inbox_ids(&self, i: usize) -> Vec<u64> {
        self.inbox(i).await["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|it| it["id"].as_u64().expect("id"))
            .collect()
    }

    /// `blindrelay inbox --read ID` on node `i`: the raw bytes.
    pub async fn inbox_read(&self, i: usize, id: u64) -> Vec<u8> {
        let id = id.to_string();
        let out = self
            .cli(&[
                "inbox",
                "--operator",
                &self.nodes[i].operator,
                "--read",
                &id,
            ])
            .await;
        assert!(out.ok, "inbox --read {id} failed: {}", out.stderr);
        out.stdout
    }

    /// A GET on node `i`'s operator API, as JSON.
    pub async fn get_json(&self, i: usize, path: &str) -> Value {
        let url = format!("{}{path}", self.nodes[i].operator);
        let resp = self
            .op_http(i)
            .get(&url)
            .send()
            .await
            .expect("operator API");
        resp.json().await.expect("JSON")
    }

    /// The PID of node `i` (running).
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].as_ref().expect("running").pid
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to node `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid(i).to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{signal} node {i}");
    }

    /// Node `i`'s peak resident set (VmHWM), in KiB.
    pub fn peak_rss_kib(&self, i: usize) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid(i))).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills node `i` with `kill -9` and reaps it.
    pub async fn kill9(&mut self, i: usize) {
        if let Some(p) = self.procs[i].take() {
            p.stop().await;
        }
    }

    /// Starts node `i` again with the same state dir and arguments; returns once it is ready
    /// and routes to every other node.
    pub async fn restart(&mut self, i: usize) {
        self.kill9(i).await;
        self.spawn(i);
        self.wait_ready(i).await;
        self.wait_routable(i, self.nodes.len() - 1).await;
    }

    /// Starts node `i` again (killed before) with the same state dir and arguments; returns
    /// once it is ready, whatever it can route to.
    pub async fn revive(&mut self, i: usize) {
        self.kill9(i).await;
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// Kills node `i` and starts, at its address, another node with a new identity (a new
    /// state dir, `blindrelay init` again); returns once it is ready.
    pub async fn swap_identity(&mut self, i: usize) {
        self.kill9(i).await;
        let (ip, endpoint) = (self.nodes[i].ip, self.nodes[i].endpoint.clone());
        let dir = self.dir.path().join(format!("node{i}-swapped"));
        self.nodes[i] = init_node(&dir, ip, endpoint).await;
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// [`Net::restart`] with `extra` arguments added to the node's `run` for this start.
    pub async fn restart_with(&mut self, i: usize, extra: &[&str]) {
        self.kill9(i).await;
        self.spawn_with(i, extra);
        self.wait_ready(i).await;
        self.wait_routable(i, self.nodes.len() - 1).await;
    }

    /// Runs node `i`'s `run` command (stopped first) and waits for it to exit (at most 30 s):
    /// for a start that must fail.
    pub async fn run_to_exit(&mut self, i: usize) -> CliOutput {
        self.run_to_exit_with(i, &[]).await
    }

    /// [`Net::run_to_exit`] with `extra` arguments added to the node's `run`.
    pub async fn run_to_exit_with(&mut self, i: usize, extra: &[&str]) -> CliOutput {
        self.kill9(i).await;
        let mut args = self.run_args(i);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args, self.rust_log.as_deref()).await
    }

    /// [`Net::revive`] with `extra` arguments added to the node's `run` for this start: returns
    /// once it is ready, whatever it can route to.
    pub async fn revive_with(&mut self, i: usize, extra: &[&str]) {
        self.kill9(i).await;
        self.spawn_with(i, extra);
        self.wait_ready(i).await;
    }

    /// Polls node `i`'s `GET /v1/status` (every 100 ms, at most `within`) until `pred` holds of
    /// it; returns that status, or panics naming `what` with the last status and the log.
    pub async fn wait_status(
        &self,
        i: usize,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status(i).await;
            if pred(&s) {
                return s;
            }
            if Instant::now() >= deadline {
                panic!(
                    "node {i}: not {what} within {within:?}; last status {s}; log:\n{}",
                    self.nodes[i].lines().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (at most `within`) until node `i`'s peer store (`peers.json`) holds exactly
    /// `want` peers; returns the file as JSON.
    pub async fn wait_store_holds(&self, i: usize, want: usize, within: Duration) -> Value {
        let file = self.nodes[i].state_dir.join("peers.json");
        let deadline = Instant::now() + within;
        loop {
            let v = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            let held = v.as_ref().and_then(|v| v["peers"].as_array().map(Vec::len));
            if let (Some(v), Some(n)) = (v, held)
                && n == want
            {
                return v;
            }
            assert!(Instant::now() < deadline, "node {i}'s store holds {held:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills every node, then starts them all again with no `--peer` at all (their peer
    /// stores only); returns once every node is ready.
    pub async fn restart_all_without_bootstrap(&mut self) {
        self.stop_all().await;
        self.bootstrap = Some(vec![Vec::new(); self.nodes.len()]);
        for i in 0..self.nodes.len() {
            self.spawn(i);
        }
        for i in 0..self.nodes.len() {
            self.wait_ready(i).await;
        }
    }

    /// Kills every node and waits until their output has been read to the end.
    pub async fn stop_all(&mut self) {
        for i in 0..self.procs.len() {
            self.kill9(i).await;
        }
    }
}

/// The peer health rows of a `GET /v1/status` answer.
pub fn peer_rows(status: &Value) -> &Vec<Value> {
    static EMPTY: Vec<Value> = Vec::new();
    status.health()["rows"].as_array().unwrap_or(&EMPTY)
}

/// Posts a relay request `body` to `endpoint` from `client`: the status and the reason or outcome.
pub async fn post(client: &reqwest::Client, endpoint: &str, body: Vec<u8>) -> (u16, String) {
    match client
        .post(format!("{endpoint}/v2/relay"))
        .body(body)
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            let what = v["error"].as_str().or(v["outcome"].as_str()).unwrap_or("?");
            (status, what.to_string())
        }
        Err(_) => (0, "no answer".into()),
    }
}

/// [`post`] as a sender or forwarder does it: a `429` of `backpressure` or `source_limited`
/// (crypto admission refuses at once when its slots are taken) is retried after a short pause,
/// at most 200 times.
pub async fn post_retrying(
    client: &reqwest::Client,
    endpoint: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let mut answer = post(client, endpoint, body.clone()).await;
    for _ in 0..200 {
        if !is_busy(&answer) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        answer = post(client, endpoint, body.clone()).await;
    }
    answer
}

/// A short `429` a sender retries.
pub fn is_busy((status, what): &(u16, String)) -> bool {
    *status == 429 && (what == "backpressure" || what == "source_limited")
}

/// A loopback receiver of the status reports a node pushes (`--report-url`): no real peer
/// receives them, so the test serves one. Keeps at most 1 000 bodies.
#[derive(Debug, Clone)]
pub struct ReportSink {
    /// The URL to give `--report-url`.
    pub url: String,
    /// Its address.
    pub ip: Ipv4Addr,
    bodies: watch::Sender<Vec<Value>>,
}

impl ReportSink {
    /// Listens on a fresh loopback address, port from the OS; answers every POST with 204.
    pub async fn start() -> ReportSink {
        let ip = fresh_ip();
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, _) = watch::channel(Vec::new());
        let sink = ReportSink {
            url: format!("http://{addr}/report"),
            ip,
            bodies: tx,
        };
        let store = sink.bodies.clone();
        let app = axum::Router::new().route(
            "/report",
            axum::routing::post(move |body: axum::body::Bytes| {
                let store = store.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    store.send_modify(|b| {
                        if b.len() < 1000 {
                            b.push(v);
                        }
                    });
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        sink
    }

    /// Every body received so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.bodies.borrow().clone()
    }

    /// Waits (at most [`WAIT`]) until a body satisfies `pred`; returns it.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let mut rx = self.bodies.subscribe();
        let got = tokio::time::timeout(WAIT, rx.wait_for(|b| b.iter().any(&pred))).await;
        match got {
            Ok(Ok(b)) => b.iter().find(|v| pred(v)).cloned().expect("found"),
            _ => panic!("no report {what} within {WAIT:?}: {:?}", self.bodies()),
        }
    }
}

/// Reads an HTTP request head and the body it declares, bounded in bytes (1 MiB) and time (5 s);
/// the request's first line.
pub async fn read_request<S: AsyncRead + Unpin>(conn: &mut S) -> String {
    use tokio::io::AsyncReadExt;
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            let n = conn.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            req.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&req).to_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if req.len() >= end + 4 + len || req.len() > 1 << 20 {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    String::from_utf8_lossy(&req)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Asserts that the replay and inbox databases in `dir` open and pass SQLite's integrity check.
pub fn stores_whole(dir: &Path) {
    for name in ["replay.db", "inbox.db"] {
        let path = dir.join(name);
        let conn = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap_or_else(|e| panic!("{} does not open: {e}", path.display()));
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(check, "ok", "{}", path.display());
    }
}
