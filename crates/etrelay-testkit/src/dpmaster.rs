//! Runs a real dpmaster (2.x), the master server most Quake 3 engine games heartbeat, on a
//! loopback address: `<ip>:27950`, `--allow-loopback` (it refuses loopback servers without
//! it), `-v 4` (every packet and decision on stdout), `-j <a fresh empty directory>` (run as
//! root it chroots there and drops to user `nobody`).
//!
//! dpmaster is not packaged in Debian: it is built from its public source outside this
//! repository, and the runner only takes the binary's path from `ETRELAY_DPMASTER`
//! ([`Dpmaster::from_env`]). Nothing of it lives here.
//!
//! Readiness is detected without sleeping: its `Listening on address` line (it prints it just
//! before binding, and flushes stdout only when it waits for packets), then a `getservers`
//! query answered, within ~10 s. Its output is read as it comes (a pipe never fills) and
//! counted per server from the lines it writes for each:
//!
//! * `> <server> ---> heartbeat (EnemyTerritory-1)`;
//! * `> <server> <--- getinfo with challenge "<c>"`: a check ([`Dpmaster::checks_for`]);
//! * `> <server> ---> infoResponse`, then, when it refuses it, a `> WARNING: …` line (`invalid
//!   challenge from <server> (<c>)`, `infoResponse with obsolete challenge …`, …)
//!   ([`Dpmaster::accepted_from`] counts the others); it takes an answer only from the
//!   heartbeat's IP and port, within 2 s, with its challenge.
//!
//! [`Dpmaster::listed`] asks it `getservers <protocol> empty full` (84 for ET, 71 for
//! OpenArena). On drop the process gets SIGTERM, then SIGKILL after a bounded wait, and is
//! reaped; it is launched through `setpriv --pdeathsig KILL` when `setpriv` is installed (as
//! [`crate::openarena`] does), so it dies with a test process that is killed.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::addr::unique_ip;
use crate::master::parse_getservers_response;
use crate::openarena::{command_for, fresh_dir, spawn_from_helper, tail};
use crate::udp::oob;

/// The environment variable that names the dpmaster binary.
pub const ENV: &str = "ETRELAY_DPMASTER";
/// The port dpmaster listens on.
pub const PORT: u16 = 27950;
/// Upper bound on the readiness wait.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Wait after SIGTERM, and again after SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// Wait for one `getservers` answer.
const QUERY_WAIT: Duration = Duration::from_millis(500);
/// dpmaster writes a refusal in the same flush as the infoResponse line: an infoResponse with
/// no line after it for this long was accepted.
const SETTLED: Duration = Duration::from_millis(100);
/// Lines of output kept (the rest is only counted).
const KEPT_LINES: usize = 2_000;

/// What dpmaster said about one server.
#[derive(Debug, Default, Clone, Copy)]
struct PerServer {
    heartbeats: usize,
    checks: usize,
    responses: usize,
    refused: usize,
}

/// A line that counts for a server.
#[derive(Debug, Clone, Copy)]
enum Count {
    Heartbeat,
    Check,
    Response,
}

/// dpmaster's output, counted as it comes.
#[derive(Debug, Default)]
struct Output {
    servers: HashMap<String, PerServer>,
    /// The last infoResponse whose verdict has not been written yet, and when it came.
    pending: Option<(String, Instant)>,
    tail: VecDeque<String>,
    listening: bool,
    closed: usize,
}

impl Output {
    fn feed(&mut self, line: &str) {
        let line = line.trim_end();
        if line.starts_with("> WARNING") {
            if let Some((server, _)) = self.pending.take() {
                self.servers.entry(server).or_default().refused += 1;
            }
        } else if let Some(rest) = line.strip_prefix("> ") {
            self.pending = None;
            self.listening |= rest.starts_with("Listening on address");
            if let Some((server, what)) = rest.split_once(' ') {
                let count = if what == "---> infoResponse" {
                    self.pending = Some((server.to_string(), Instant::now()));
                    Some(Count::Response)
                } else if what.starts_with("<--- getinfo with challenge") {
                    Some(Count::Check)
                } else if what.starts_with("---> heartbeat") {
                    Some(Count::Heartbeat)
                } else {
                    None
                };
                if let Some(count) = count {
                    let s = self.servers.entry(server.to_string()).or_default();
                    match count {
                        Count::Heartbeat => s.heartbeats += 1,
                        Count::Check => s.checks += 1,
                        Count::Response => s.responses += 1,
                    }
                }
            }
        } else if line.starts_with("* ") {
            self.pending = None;
        }
        if self.tail.len() == KEPT_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
    }

    fn of(&self, server: SocketAddr) -> PerServer {
        self.servers
            .get(&server.to_string())
            .copied()
            .unwrap_or_default()
    }
}

type Shared = Arc<(Mutex<Output>, Condvar)>;

/// A running dpmaster; see the module docs.
#[derive(Debug)]
pub struct Dpmaster {
    child: Option<Child>,
    addr: SocketAddr,
    dir: PathBuf,
    output: Shared,
    readers: Vec<JoinHandle<()>>,
    probe: Mutex<UdpSocket>,
}

impl Dpmaster {
    /// The binary `ETRELAY_DPMASTER` names, if set.
    pub fn from_env() -> Option<PathBuf> {
        std::env::var_os(ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    /// Starts the binary `ETRELAY_DPMASTER` names on `ip:27950`; see [`Dpmaster::start_with`].
    pub fn start(ip: Ipv4Addr) -> io::Result<Dpmaster> {
        let binary = Dpmaster::from_env().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{ENV} is not set: it names a dpmaster binary (not packaged in Debian; \
                     build it from its source outside the repository)"
                ),
            )
        })?;
        Dpmaster::start_with(binary, ip)
    }

    /// Starts `binary` on `ip:27950` and waits until it answers (at most ~10 s). Blocks the
    /// calling thread while waiting (well under a second normally).
    pub fn start_with(binary: PathBuf, ip: Ipv4Addr) -> io::Result<Dpmaster> {
        if !binary.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{ENV}={}: no such file", binary.display()),
            ));
        }
        let probe = UdpSocket::bind((unique_ip(), 0))?;
        let dir = fresh_dir()?;
        let mut command = command_for(&binary, None);
        command
            .arg("--allow-loopback")
            .args(["-l", &ip.to_string(), "-p", &PORT.to_string(), "-v", "4"])
            .arg("-j")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Run as root it chroots to the directory as user nobody.
        let spawned = fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
            .and_then(|()| spawn_from_helper(command));
        let mut child = spawned.inspect_err(|_| {
            let _ = fs::remove_dir(&dir);
        })?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut master = Dpmaster {
            child: Some(child),
            addr: SocketAddr::from((ip, PORT)),
            dir,
            output: Shared::default(),
            readers: Vec::new(),
            probe: Mutex::new(probe),
        };
        // From here on, an error stops the process (Drop).
        if let Some(out) = stdout {
            master
                .readers
                .push(read_lines(out, Arc::clone(&master.output))?);
        }
        if let Some(err) = stderr {
            master
                .readers
                .push(read_lines(err, Arc::clone(&master.output))?);
        }
        master.wait_ready()?;
        Ok(master)
    }

    /// Its `Listening on address` line, then a `getservers` answered.
    fn wait_ready(&self) -> io::Result<()> {
        let start = Instant::now();
        {
            let (lock, ready) = &*self.output;
            let out = lock.lock().unwrap_or_else(|e| e.into_inner());
            let (out, _) = ready
                .wait_timeout_while(out, READY_TIMEOUT, |o| !o.listening && o.closed < 2)
                .unwrap_or_else(|e| e.into_inner());
            if !out.listening {
                return Err(self.failed("did not say it listens", out));
            }
        }
        while start.elapsed() < READY_TIMEOUT {
            if self.query(84).is_ok() {
                return Ok(());
            }
            if self.output().closed == 2 {
                break;
            }
        }
        Err(self.failed("did not answer getservers", self.output()))
    }

    fn failed(&self, what: &str, out: MutexGuard<'_, Output>) -> io::Error {
        let lines: Vec<&str> = out.tail.iter().map(String::as_str).collect();
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "dpmaster on {} {what} within {READY_TIMEOUT:?}; output:\n{}",
                self.addr,
                tail(&lines.join("\n"), 40)
            ),
        )
    }

    fn output(&self) -> MutexGuard<'_, Output> {
        self.output.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its address, `<ip>:27950`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Heartbeats it got from `server` so far.
    pub fn heartbeats_from(&self, server: SocketAddr) -> usize {
        self.output().of(server).heartbeats
    }

    /// Checks (`getinfo` with a challenge) it sent `server` so far.
    pub fn checks_for(&self, server: SocketAddr) -> usize {
        self.output().of(server).checks
    }

    /// `infoResponse`s it got from `server` so far, accepted or not.
    pub fn responses_from(&self, server: SocketAddr) -> usize {
        self.output().of(server).responses
    }

    /// `infoResponse`s from `server` it accepted (not followed by a WARNING) so far.
    pub fn accepted_from(&self, server: SocketAddr) -> usize {
        let out = self.output();
        let s = out.of(server);
        let undecided = out
            .pending
            .as_ref()
            .is_some_and(|(p, at)| *p == server.to_string() && at.elapsed() < SETTLED);
        s.responses - s.refused - usize::from(undecided)
    }

    /// Datagrams the kernel dropped for its socket so far (its receive buffer full): the
    /// `drops` column of `/proc/net/udp`; `None` when the socket is not found there.
    pub fn socket_drops(&self) -> Option<u64> {
        match self.addr {
            SocketAddr::V4(addr) => udp_drops(addr),
            SocketAddr::V6(_) => None,
        }
    }

    /// The servers it lists for `protocol` (`getservers <protocol> empty full`); empty when it
    /// does not answer (twice 500 ms).
    pub fn listed(&self, protocol: u32) -> Vec<SocketAddr> {
        self.query(protocol)
            .or_else(|_| self.query(protocol))
            .unwrap_or_default()
    }

    fn query(&self, protocol: u32) -> io::Result<Vec<SocketAddr>> {
        let probe = self.probe.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = vec![0u8; 65_536];
        // What a late answer to an earlier query left.
        probe.set_nonblocking(true)?;
        while probe.recv_from(&mut buf).is_ok() {}
        probe.set_nonblocking(false)?;
        let query = oob(format!("getservers {protocol} empty full").as_bytes());
        probe.send_to(&query, self.addr)?;
        let deadline = Instant::now() + QUERY_WAIT;
        let mut servers = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no getservers answer",
                ));
            }
            probe.set_read_timeout(Some(left))?;
            let (n, from) = probe.recv_from(&mut buf)?;
            let packet = &buf[..n];
            if from != self.addr || !packet.starts_with(b"\xff\xff\xff\xffgetserversResponse") {
                continue;
            }
            servers.extend(parse_getservers_response(packet));
            if packet.ends_with(b"\\EOT\0\0\0") {
                return Ok(servers);
            }
        }
    }

    /// The last `n` lines it wrote.
    pub fn log_tail(&self, n: usize) -> String {
        let out = self.output();
        let skip = out.tail.len().saturating_sub(n);
        let lines: Vec<&str> = out.tail.iter().skip(skip).map(String::as_str).collect();
        lines.join("\n")
    }
}

/// The `drops` column of `/proc/net/udp` for the socket bound to `addr`.
fn udp_drops(addr: SocketAddrV4) -> Option<u64> {
    // The address as the kernel prints it: the 32-bit word in host order, and the port.
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(addr.ip().octets()),
        addr.port()
    );
    let table = fs::read_to_string("/proc/net/udp").ok()?;
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(local.as_str()))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Reads `from` line by line into `output` on a thread of its own, until its end.
fn read_lines(from: impl Read + Send + 'static, output: Shared) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("etrelay-testkit-dpmaster".into())
        .spawn(move || {
            let mut reader = BufReader::new(from);
            let mut line = Vec::new();
            loop {
                line.clear();
                let done = !matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0);
                let (lock, changed) = &*output;
                let mut out = lock.lock().unwrap_or_else(|e| e.into_inner());
                if done {
                    out.closed += 1;
                } else {
                    out.feed(&String::from_utf8_lossy(&line));
                }
                changed.notify_all();
                if done {
                    return;
                }
            }
        })
}

/// Whether `child` exits within `limit` (reaped if so).
fn exits_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// SIGTERM, a bounded wait, then SIGKILL and another; reaped when it exits.
fn stop(child: &mut Child) {
    for signal in [Signal::TERM, Signal::KILL] {
        if exits_within(child, Duration::ZERO) {
            return;
        }
        // Not reaped yet, so the pid still names our child.
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = kill_process(pid, signal);
        }
        if exits_within(child, STOP_WAIT) {
            return;
        }
    }
}

impl Drop for Dpmaster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!(
                "dpmaster {}: its last lines:\n{}",
                self.addr,
                self.log_tail(40)
            );
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_lines_are_counted_per_server() {
        let mut out = Output::default();
        let text = "\
> Listening on address 127.77.0.1 (127.77.0.1:27950)

* 2026-12-05 20:27:09 UTC
> 127.77.0.2:57794 ---> heartbeat (EnemyTerritory-1)
> 127.77.0.2:57794 <--- getinfo with challenge \"(<rc=a-'\"
> New packet received from 127.77.0.2:57794: \"\\xFF\\xFF\\xFF\\xFFinfoResponse\" (87 bytes)
> 127.77.0.2:57794 ---> infoResponse

* 2026-12-05 20:27:09 UTC
> New packet received from 127.77.0.2:57794: \"...\" (84 bytes)
> 127.77.0.2:57794 ---> infoResponse
> WARNING: invalid challenge from 127.77.0.2:57794 (wrong)
> 127.9.9.9:27960 ---> infoResponse
";
        for line in text.lines() {
            out.feed(line);
        }
        assert!(out.listening);
        let s = out.of("127.77.0.2:57794".parse().unwrap());
        assert_eq!(
            (s.heartbeats, s.checks, s.responses, s.refused),
            (1, 1, 2, 1)
        );
        assert_eq!(
            out.pending.as_ref().map(|p| p.0.as_str()),
            Some("127.9.9.9:27960")
        );
    }

    #[test]
    fn a_sockets_drops_are_read_from_the_kernels_table() {
        let sock = UdpSocket::bind((unique_ip(), 0)).unwrap();
        let SocketAddr::V4(addr) = sock.local_addr().unwrap() else {
            unreachable!()
        };
        assert_eq!(udp_drops(addr), Some(0));
        drop(sock);
        assert_eq!(udp_drops(addr), None);
    }
}
