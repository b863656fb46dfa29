//! Runs Debian's `openarena-server` (ioquake3 `ioq3ded`) as a real Quake 3
//! engine peer on a loopback address (`et-protocol.md` §6.2), or, with
//! [`Options`], inside a network namespace on an address of its own, with more
//! `+set`s (the deployment test runs it at "home" with `com_gamename et`).
//!
//! The server is started with heartbeats off (`dedicated 1`, `sv_master1..5`
//! empty), bound to `<ip>:27960`, with a fresh `HOME`, its console on a pipe
//! ([`OpenArena::console`]) and its output in a log file ([`OpenArena::log`]).
//!
//! Readiness is detected without sleeping: `getinfo` is sent from a socket on
//! its own [`unique_ip`](crate::addr::unique_ip()) (so it does not use the
//! per-IP rate-limit bucket of the code under test), with a short receive
//! timeout per attempt, for at most ~15 s.
//!
//! On drop the process gets SIGTERM, then SIGKILL if it is still alive after
//! a bounded wait, and is reaped. As a safety net against a test process that
//! is itself killed (so no `Drop` runs), the server is launched through
//! `setpriv --pdeathsig KILL` when `setpriv` is installed, from a helper
//! thread that lives as long as the test process.
//!
//! Things to know about this peer (ioquake3, see §4 and §6.4): it always
//! rate-limits getinfo/getstatus/getchallenge/rcon per source IP (burst 10,
//! then 1/s) and globally (burst 10, then one per 100 ms); it speaks protocol
//! 71 with gamename `Quake3Arena`; high bytes become `.` before tokenizing.

use std::fs::{self, File};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::addr::unique_ip;

/// The game port the server binds on its address.
pub const PORT: u16 = 27960;
/// Upper bound on the readiness wait.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Upper bound on the wait after SIGTERM (and again after SIGKILL).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the Debian wrapper script is, if installed.
fn wrapper() -> Option<PathBuf> {
    static WRAPPER: OnceLock<Option<PathBuf>> = OnceLock::new();
    WRAPPER
        .get_or_init(|| {
            let from_dpkg = Command::new("dpkg")
                .args(["-L", "openarena-server"])
                .stderr(Stdio::null())
                .output()
                .ok()
                .and_then(|out| {
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .find(|l| l.ends_with("/games/openarena-server"))
                        .map(PathBuf::from)
                });
            from_dpkg
                .or_else(|| Some(PathBuf::from("/usr/games/openarena-server")))
                .filter(|p| p.is_file())
        })
        .clone()
}

/// `setpriv`, if installed (used for `--pdeathsig KILL`).
fn setpriv() -> Option<PathBuf> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            ["/usr/bin/setpriv", "/bin/setpriv"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .clone()
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from a helper thread that never exits, so that
/// `PR_SET_PDEATHSIG` (which fires when the *thread* that forked the child
/// ends) only fires when the whole test process ends.
pub(crate) fn spawn_from_helper(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("etrelay-testkit-spawner".into())
            .spawn(move || {
                // Ends only if every sender is gone, which never happens
                // since the sender lives in a static.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the helper thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| io::Error::other("spawner thread did not answer"))?
}

/// A fresh private directory under the system temp dir.
pub(crate) fn fresh_dir() -> io::Result<PathBuf> {
    static N: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "etrelay-testkit-oa-{}-{n}-{nanos:x}",
            std::process::id()
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("could not create a fresh temp dir"))
}

/// Sends SIGTERM or SIGKILL with the `kill` command.
fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// How to start a server: [`Options::new`], then the optional settings.
#[derive(Debug)]
pub struct Options {
    ip: Ipv4Addr,
    rcon_password: String,
    hostname: String,
    netns: Option<String>,
    sets: Vec<(String, String)>,
    probe: Option<UdpSocket>,
}

impl Options {
    /// A server on `ip:27960` with `rconpassword` `rcon_password`, named `etrelay-test`.
    pub fn new(ip: Ipv4Addr, rcon_password: &str) -> Options {
        Options {
            ip,
            rcon_password: rcon_password.to_string(),
            hostname: "etrelay-test".to_string(),
            netns: None,
            sets: Vec::new(),
            probe: None,
        }
    }

    /// `sv_hostname`.
    pub fn hostname(mut self, name: &str) -> Options {
        self.hostname = name.to_string();
        self
    }

    /// Runs the server inside network namespace `name` (`ip netns exec`).
    pub fn netns(mut self, name: &str) -> Options {
        self.netns = Some(name.to_string());
        self
    }

    /// One more `+set key value` on the command line (before the map loads).
    pub fn set(mut self, key: &str, value: &str) -> Options {
        self.sets.push((key.to_string(), value.to_string()));
        self
    }

    /// The socket the readiness `getinfo` leaves from (default: a fresh loopback address);
    /// needed when the server runs in a namespace.
    pub fn probe_from(mut self, socket: UdpSocket) -> Options {
        self.probe = Some(socket);
        self
    }
}

/// A running OpenArena dedicated server; see the module docs.
#[derive(Debug)]
pub struct OpenArena {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    stdin: Mutex<Option<ChildStdin>>,
    dir: PathBuf,
    log_path: PathBuf,
}

/// The command that runs `wrapper`: under `setpriv --pdeathsig KILL` where it is installed
/// (the server dies with the test), inside network namespace `netns` if given.
pub(crate) fn command_for(wrapper: &Path, netns: Option<&str>) -> Command {
    let mut prefix: Vec<String> = Vec::new();
    if let Some(setpriv) = setpriv() {
        prefix.push(setpriv.display().to_string());
        prefix.extend(["--pdeathsig", "KILL", "--"].map(String::from));
    }
    if let Some(ns) = netns {
        prefix.extend(["ip", "netns", "exec", ns].map(String::from));
    }
    match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(wrapper);
            c
        }
        None => Command::new(wrapper),
    }
}

/// The server's command line: dedicated on `ip:27960`, no masters, the rcon password and
/// host name, the extra settings, map `oa_dm1`.
fn server_args(options: &Options) -> Vec<String> {
    let mut args: Vec<String> = [
        "+set",
        "dedicated",
        "1",
        "+set",
        "net_enabled",
        "1",
        "+set",
        "net_ip",
        &options.ip.to_string(),
        "+set",
        "net_port",
        &PORT.to_string(),
    ]
    .map(String::from)
    .to_vec();
    // The engine joins its argv with spaces before parsing, so an empty
    // argument would vanish; a literal `""` is an empty quoted token.
    for key in [
        "sv_master1",
        "sv_master2",
        "sv_master3",
        "sv_master4",
        "sv_master5",
    ] {
        args.extend(["+set", key, "\"\""].map(String::from));
    }
    args.extend(
        [
            "+set",
            "rconpassword",
            &options.rcon_password,
            "+set",
            "sv_hostname",
            &options.hostname,
            "+set",
            "ttycon",
            "0",
        ]
        .map(String::from),
    );
    for (key, value) in &options.sets {
        args.extend(["+set", key.as_str(), value.as_str()].map(String::from));
    }
    args.extend(["+map", "oa_dm1"].map(String::from));
    args
}

impl OpenArena {
    /// Whether Debian's `openarena-server` wrapper script is installed
    /// (`dpkg -L openarena-server`, normally `/usr/games/openarena-server`).
    pub fn available() -> bool {
        wrapper().is_some()
    }

    /// Panics unless [`OpenArena::available`]: a test that needs the real server fails without
    /// it, never passes (such tests are `#[ignore]`d; `scripts/test` installs the package and
    /// runs them).
    pub fn require() {
        assert!(
            OpenArena::available(),
            "openarena-server (Debian package) is needed: run scripts/test, which installs it"
        );
    }

    /// Starts a server on `ip:27960` with `rconpassword` `rcon_password` and
    /// `sv_hostname etrelay-test` on map `oa_dm1`, and waits (at most ~15 s)
    /// until it answers `getinfo`.
    ///
    /// Blocks the calling thread while waiting (normally well under a second).
    pub fn start(ip: Ipv4Addr, rcon_password: &str) -> io::Result<OpenArena> {
        OpenArena::start_with(Options::new(ip, rcon_password))
    }

    /// Starts a server as `options` say; see [`OpenArena::start`].
    pub fn start_with(options: Options) -> io::Result<OpenArena> {
        let wrapper = wrapper().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "openarena-server is not installed")
        })?;
        let dir = fresh_dir()?;
        let home = dir.join("home");
        fs::create_dir(&home)?;
        let log_path = dir.join("server.log");
        let log = File::create(&log_path)?;

        let mut command = command_for(&wrapper, options.netns.as_deref());
        let ip = options.ip;
        let args = server_args(&options);
        command
            .args(&args)
            .env("HOME", &home)
            .current_dir(&home)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut child = spawn_from_helper(command)?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let mut server = OpenArena {
            child: Some(child),
            pid,
            addr: SocketAddr::from((ip, PORT)),
            stdin: Mutex::new(stdin),
            dir,
            log_path,
        };
        let probe = match options.probe {
            Some(probe) => probe,
            None => UdpSocket::bind(SocketAddr::from((unique_ip(), 0)))?,
        };
        server.wait_ready(probe)?; // on error, Drop stops the process
        Ok(server)
    }

    /// Polls `getinfo` from a dedicated source address until the server
    /// answers; bounded by [`READY_TIMEOUT`].
    fn wait_ready(&mut self, probe: UdpSocket) -> io::Result<()> {
        let start = Instant::now();
        let mut buf = vec![0u8; 65_536];
        // Per-attempt receive timeout: short at first (the server is usually
        // up within ~0.3 s), then longer so that few probes pile up in the
        // socket while the map loads (each would use a rate-limit token).
        let mut wait = Duration::from_millis(50);
        for attempt in 0u32..200 {
            if start.elapsed() >= READY_TIMEOUT {
                break;
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                return Err(io::Error::other(format!(
                    "openarena-server exited during startup ({status}); log:\n{}",
                    tail(&self.log(), 40)
                )));
            }
            let challenge = format!("ready{attempt}");
            probe.send_to(
                &crate::udp::oob(format!("getinfo {challenge}").as_bytes()),
                self.addr,
            )?;
            let attempt_end = Instant::now() + wait;
            // Drain what arrives within this attempt's window.
            while Instant::now() < attempt_end {
                let left = attempt_end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                probe.set_read_timeout(Some(left))?;
                match probe.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        if from == self.addr
                            && buf[..len].starts_with(b"\xff\xff\xff\xffinfoResponse\n")
                        {
                            return Ok(());
                        }
                    }
                    Err(_) => break,
                }
            }
            wait = (wait * 2).min(Duration::from_millis(500));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "openarena-server on {} did not answer getinfo within {READY_TIMEOUT:?}; log:\n{}",
                self.addr,
                tail(&self.log(), 40)
            ),
        ))
    }

    /// The server's address, `<ip>:27960`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id (the wrapper script `exec`s the engine, so
    /// this is `ioq3ded` itself).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Writes one console command (a newline is added), e.g.
    /// `sets relaytest hello` or `addbot sarge 1`. The server reads its
    /// console once per frame, so the effect is not immediate.
    pub fn console(&self, line: &str) -> io::Result<()> {
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let stdin = stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("console is closed"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()
    }

    /// Everything the server printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Path of the log file (kept after drop only if the thread is
    /// panicking, i.e. when a test failed).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for OpenArena {
    fn drop(&mut self) {
        // Close the console pipe first.
        drop(self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(mut child) = self.child.take() {
            let pid = self.pid;
            if !matches!(child.try_wait(), Ok(Some(_))) {
                if !send_signal(pid, "TERM") {
                    let _ = child.kill();
                }
                // Wait for the exit on a helper thread, bounded in time.
                let (tx, rx) = mpsc::channel();
                let waiter = std::thread::spawn(move || {
                    let _ = tx.send(child.wait());
                });
                if rx.recv_timeout(STOP_TIMEOUT).is_err() {
                    // Still not reaped (the waiter has not returned), so the
                    // pid still names our child.
                    send_signal(pid, "KILL");
                    let _ = rx.recv_timeout(STOP_TIMEOUT);
                }
                drop(waiter);
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "openarena-server {} (pid {}): files kept in {}",
                self.addr,
                self.pid,
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
