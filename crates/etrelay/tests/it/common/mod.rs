//! Helpers shared by the integration tests: a relay started in-process on a fresh loopback
//! address, bounded waits for conditions, and packet helpers.
#![allow(dead_code, unreachable_pub)]

pub mod daemon;
pub mod single;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use etrelay::config::{MAX_QUEUED_BYTES, MAX_SESSIONS, ServerConfig};
use etrelay::server::{Budget, ServerHandle};
use etrelay_testkit::player::{Dialect, Player, RETRANSMIT};
use etrelay_testkit::{udp, unique_ip};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// The value of `field` (` public=`, `metrics: listening addr=`) in a log line, as an address.
pub fn address_field(line: &str, field: &str) -> Option<SocketAddr> {
    line.split(field).nth(1)?.split(' ').next()?.parse().ok()
}

/// The public address in the relay's `relaying upstream=… public=<addr> masters=…` line.
pub fn relaying_address(line: &str) -> Option<SocketAddr> {
    if !line.contains("relaying ") {
        return None;
    }
    address_field(line, " public=")
}

/// The address in the one-server relay's `metrics: listening addr=<addr>` line.
pub fn metrics_address(line: &str) -> Option<SocketAddr> {
    address_field(line, "metrics: listening addr=")
}

/// Held by every test that floods, or that measures what a flood leaves: the modules of the test
/// binary share one process and the machine's CPUs, so a flood in one module must not starve
/// what another measures. One such test at a time; the others run beside it.
static FLOODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other flooding test of this binary runs; hold the guard for the test's life.
pub async fn one_flood_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    FLOODS.lock().await
}

/// Lines a spawned process wrote to stderr so far.
pub type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Spawns the `etrelay` binary with `args`; its stderr lines are collected into the returned
/// log as they come.
pub fn spawn_logged(args: &[String]) -> (tokio::process::Child, Log) {
    spawn_logged_under(&[], args)
}

/// As [`spawn_logged`], the binary run under `prefix` (e.g. `prlimit --nofile=600:600 --`,
/// which execs it: the child's PID is the relay's).
pub fn spawn_logged_under(prefix: &[String], args: &[String]) -> (tokio::process::Child, Log) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let bin = env!("CARGO_BIN_EXE_etrelay").to_string();
    let mut cmd = match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = tokio::process::Command::new(program);
            c.args(rest).arg(bin);
            c
        }
        None => tokio::process::Command::new(bin),
    };
    let mut child = cmd
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("ETRELAY_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etrelay");
    let stderr = child.stderr.take().expect("stderr piped");
    let log = Log::default();
    let sink = std::sync::Arc::clone(&log);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    (child, log)
}

/// Waits, at most `limit`, for the first line of `log` in which `find` sees something, and
/// returns that; panics with `what` when it does not come.
pub async fn wait_for_line<T>(
    log: &Log,
    find: impl Fn(&str) -> Option<T>,
    limit: Duration,
    what: &str,
) -> T {
    let first = || log.lock().unwrap().iter().find_map(|l| find(l));
    assert!(
        eventually(limit, || first().is_some()).await,
        "timed out: {what}"
    );
    first().expect("found above")
}

/// Spawns the `etrelay` binary with `args` (stderr collected into the returned log) and waits,
/// at most `limit`, for the first stderr line in which `find` sees an address.
pub async fn spawn_etrelay(
    args: &[String],
    find: fn(&str) -> Option<SocketAddr>,
    limit: Duration,
) -> (tokio::process::Child, Log, SocketAddr) {
    let (child, log) = spawn_logged(args);
    let addr = wait_for_line(&log, find, limit, "etrelay start line").await;
    (child, log, addr)
}

/// A relay running in this process.
pub struct Relay {
    pub handle: ServerHandle,
    pub addr: SocketAddr,
    pub root: CancellationToken,
}

/// A config for `upstream` with no masters (nothing leaves the machine) and heartbeats rare
/// enough to stay out of the way.
pub fn config(upstream: SocketAddr) -> ServerConfig {
    let mut c = ServerConfig::new(upstream);
    c.masters = Vec::new();
    c.heartbeat_interval = Duration::from_secs(3600);
    c.probe_timeout = Duration::from_millis(300);
    c
}

/// [`config`] for a relay that lets the game server give the challenges (`--server-challenges`):
/// a plain proxy whose sessions open on any client packet, as the tests of the session
/// mechanics (queues, caps, expiry, the ring) use it with raw in-game packets.
pub fn config_server_challenges(upstream: SocketAddr) -> ServerConfig {
    let mut c = config(upstream);
    c.challenges.server = true;
    c
}

/// A client on a fresh loopback address that joined `server` as a real client does
/// (`getchallenge`, `connect` with the challenge it got): its session is open on the relay.
pub async fn joined(server: SocketAddr, qport: u16, dialect: Dialect) -> Player {
    let mut p = Player::bind(unique_ip(), server, qport, dialect)
        .await
        .expect("bind the player");
    p.join(Duration::from_secs(10), RETRANSMIT)
        .await
        .expect("the player joins");
    p
}

/// The IPv4 address of `p`.
pub fn ip_of(p: &Player) -> Ipv4Addr {
    match p.local_addr().expect("the player's address").ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => unreachable!("players bind IPv4 loopback addresses"),
    }
}

/// Binds a public socket on a fresh loopback address, port from the OS.
pub async fn public_socket() -> UdpSocket {
    UdpSocket::bind((unique_ip(), 0))
        .await
        .expect("bind public socket")
}

/// Starts a relay for `config` on an already bound `public` socket.
pub fn start_on(config: ServerConfig, public: UdpSocket, gate: Budget) -> Relay {
    let root = CancellationToken::new();
    let handle = ServerHandle::start(config, public, gate, &root).expect("start relay");
    let addr = handle.public_addr();
    Relay { handle, addr, root }
}

/// Starts a relay for `config` on a fresh loopback address.
pub async fn start(config: ServerConfig) -> Relay {
    start_on(
        config,
        public_socket().await,
        Budget::new(MAX_SESSIONS, MAX_QUEUED_BYTES),
    )
}

/// Waits until `cond` holds, checking every 10 ms, for at most `limit`.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `f` with a time limit; panics with `what` when it runs out.
pub async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A client socket on a fresh loopback address.
pub async fn client() -> UdpSocket {
    udp::bind(unique_ip()).await.expect("bind client")
}

/// A client socket on `ip`.
pub async fn client_on(ip: Ipv4Addr) -> UdpSocket {
    udp::bind(ip).await.expect("bind client")
}

/// Sends `packet` and returns the replies that arrive within a short quiet time.
pub async fn ask(sock: &UdpSocket, to: SocketAddr, packet: &[u8]) -> Vec<(SocketAddr, Vec<u8>)> {
    udp::exchange(
        sock,
        to,
        packet,
        Duration::from_millis(150),
        Duration::from_secs(2),
    )
    .await
}

/// The value of `key` in the info string of an infoResponse/statusResponse.
pub fn info_value(packet: &[u8], key: &str) -> Option<String> {
    let body = packet.get(4..)?;
    let nl = body.iter().position(|&b| b == b'\n')?;
    let info = &body[nl + 1..];
    let end = info.iter().position(|&b| b == b'\n').unwrap_or(info.len());
    let pairs = etrelay_testkit::info::parse(&info[..end]);
    etrelay_testkit::info::get(&pairs, key).map(str::to_owned)
}
