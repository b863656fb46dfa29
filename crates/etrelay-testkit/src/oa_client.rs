//! Runs Debian's `openarena` client (ioquake3, a real Quake 3 engine client) under a virtual X
//! server of its own, told to `+connect` to a server: a real player for the relay to carry.
//!
//! # What runs
//!
//! * **Xvfb**, started with `-displayfd 1`: it picks a free display itself and writes its number
//!   on its stdout (a pipe we read) once it accepts connections, so nothing guesses a display
//!   number or sleeps. `-nolisten tcp` (unix socket only), a 640x480x24 screen, and `-auth` with
//!   a cookie file written here (one MIT-MAGIC-COOKIE-1 entry for any display), so only the
//!   client started here can draw on it.
//! * **The client**, through the Debian wrapper `/usr/games/openarena`: a `/bin/sh` script that
//!   `exec`s `/usr/lib/ioquake3/ioquake3` with `+set com_basegame baseoa`, `fs_basepath
//!   /usr/lib/openarena`, `com_homepath .openarena`, protocol 71, `sv_master1
//!   dpmaster.deathmask.net` and `cl_motd 0`, then our arguments (`"$@"`): our `+set`s come later
//!   and win. Its environment is cleared, then: a fresh `HOME`, `DISPLAY` and `XAUTHORITY` of the
//!   Xvfb above, `LIBGL_ALWAYS_SOFTWARE=1` (Mesa's llvmpipe even where a GPU exists),
//!   `SDL_VIDEODRIVER=x11`, and `DBUS_SESSION_BUS_ADDRESS=disabled:` (else SDL's D-Bus
//!   autolaunch forks `dbus-launch`, which where installed starts a bus that outlives the
//!   test). Settings, and why:
//!   * `s_initsound 0`: no sound device (there is none under Xvfb);
//!   * `r_mode 0` (320x240), `r_fullscreen 0`: a small window, cheap to draw in software;
//!   * `cl_renderer opengl1`: no GLSL to compile in llvmpipe; measured here, it starts faster and
//!     draws at half the CPU of `opengl2` (the default);
//!   * `com_maxfps 30`: `cl_maxpackets` defaults to 30, so the client sends as many packets as a
//!     default client (30 a second) while drawing a third of the default 85 frames: about a
//!     quarter of one core in game here, against all of one at 85;
//!   * `net_enabled 1` (IPv4 only: no IPv6 or multicast socket), `net_ip`/`net_port`: its one
//!     socket is bound to a loopback address of its own (default
//!     [`unique_ip`](crate::addr::unique_ip()), port 27960); if that port is taken, ioquake3
//!     tries the next ones, so [`OaClient::source`] reads the address it bound from its output;
//!   * `cl_allowDownload 0`, `cl_motd 0`, `sv_master1..5 ""`: nothing to fetch, no motd request,
//!     no master. The client asks no authorize server either: it skips that for LAN
//!     addresses, 127/8 among them, and OpenArena is a standalone game. Checked once with
//!     `strace -f -e trace=network` (23 s, in game): one UDP socket, bound to `net_ip:net_port`;
//!     all 735 datagrams sent went to the server's address, all received came from it; besides
//!     that, netlink (the local addresses; SDL's device events), the X server's unix socket and
//!     glibc's try of nscd's socket (a user lookup); no other socket, no DNS;
//!   * `name`: the player's name ([`Options::new`] accepts letters, digits, `-` and `_`, so the
//!     server prints it unchanged).
//!
//! Both processes are launched like the server of [`openarena`](crate::openarena): through
//! `setpriv --pdeathsig KILL` when it is installed, from a thread that lives as long as the test
//! process, so neither outlives it.
//!
//! # Waits, all bounded
//!
//! The client's stdout and stderr go to one file, read as it grows; each line keeps the time it
//! was first seen. "In game" is the line the client prints when the server announces it,
//! `<name>^7 entered the game` ([`OaClient::wait_in_game`]); "connecting" is its `<addr> resolved
//! to <addr>` line, printed by `connect` just before the first `getchallenge` leaves.
//! [`check_flow`] shows packets flowing both ways, now: a `say` on the server console reaches the
//! client's console (a reliable server command: server to client), and the server's `status`
//! shows the client with a ping under 999 (the server computes it from the client's acks of its
//! last 32 snapshots, and says 999 when none came: client to server). This ioquake3's `status`
//! has no `lastmsg` column: see [`StatusRow`].
//!
//! # Stopping
//!
//! [`OaClient::stop`] or drop: `quit` on the client's console (it disconnects, so the server sees
//! it leave), then SIGTERM, then SIGKILL, each after a bounded wait; then the same SIGTERM and
//! SIGKILL for Xvfb; both reaped (SIGTERM alone is not enough: once, here, an ioquake3 hung in
//! its SIGTERM handler). Its files are removed, or kept (and named on stderr) when the thread is
//! panicking.
//!
//! Files: `xvfb.rs` (the X server, and how processes are stopped), `log.rs` (the client's output
//! read as it grows), `status.rs` (the server's `status`, read back).

mod log;
mod status;
mod xvfb;

use std::fs::{self, File};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use status::{Ping, StatusRow, parse_status, server_status};

use crate::addr::unique_ip;
use crate::openarena::{OpenArena, command_for, fresh_dir, spawn_from_helper, tail};
use log::LogWatch;
use xvfb::{Xvfb, exits_within, terminate, write_xauthority};

/// How often a wait reads the client's output again.
const POLL: Duration = Duration::from_millis(10);
/// Wait after `quit` on the client's console (it took 80 to 150 ms here).
const QUIT_WAIT: Duration = Duration::from_secs(5);
/// `PATH` of the processes started here.
const PATH: &str = "/usr/bin:/bin";
/// Client lines that mean it left the game.
/// (`Server disconnected - <reason>` covers kicks; `ERROR:` is any `Com_Error`, e.g. a packet
/// it could not parse.)
const DROPPED: &[&str] = &[
    "Server disconnected",
    "Server connection timed out",
    "ERROR:",
];

/// A path from `dpkg -L <package>` ending in `suffix`, else `fallback`, if it is a file.
fn installed(package: &str, suffix: &str, fallback: &str) -> Option<PathBuf> {
    let out = Command::new("dpkg")
        .args(["-L", package])
        .stderr(Stdio::null())
        .output()
        .ok();
    out.and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.ends_with(suffix) && Path::new(l).is_file())
            .map(PathBuf::from)
    })
    .or_else(|| Some(PathBuf::from(fallback)).filter(|p| p.is_file()))
}

/// The Debian wrapper script `openarena`, if installed.
fn wrapper() -> Option<PathBuf> {
    static WRAPPER: OnceLock<Option<PathBuf>> = OnceLock::new();
    WRAPPER
        .get_or_init(|| installed("openarena", "/games/openarena", "/usr/games/openarena"))
        .clone()
}

/// `Xvfb`, if installed.
fn xvfb() -> Option<PathBuf> {
    static XVFB: OnceLock<Option<PathBuf>> = OnceLock::new();
    XVFB.get_or_init(|| installed("xvfb", "/bin/Xvfb", "/usr/bin/Xvfb"))
        .clone()
}

/// The Debian packages this runner needs that are not installed: `openarena` (the client)
/// and `xvfb`. Empty when [`OaClient::start`] can run.
pub fn missing_packages() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if wrapper().is_none() {
        missing.push("openarena");
    }
    if xvfb().is_none() {
        missing.push("xvfb");
    }
    missing
}

/// Panics, naming the packages, when the real client or the real server is not installed: a
/// test that needs them must not pass without them (`scripts/test` installs them).
pub fn require_installed() {
    let mut missing = missing_packages();
    if !crate::OpenArena::available() {
        missing.push("openarena-server");
    }
    assert!(
        missing.is_empty(),
        "Debian packages needed and not installed: {} (scripts/test installs them)",
        missing.join(", ")
    );
}

/// How to start a client: [`Options::new`], then the optional settings.
#[derive(Debug, Clone)]
pub struct Options {
    server: SocketAddr,
    name: String,
    ip: Ipv4Addr,
    port: u16,
    sets: Vec<(String, String)>,
}

impl Options {
    /// A client named `name` that connects to `server`, from a fresh loopback address, port
    /// 27960.
    ///
    /// # Panics
    ///
    /// If `name` is empty, longer than 15 characters, or has other characters than ASCII
    /// letters, digits, `-` and `_` (the server would change it, and the waits look for it).
    pub fn new(server: SocketAddr, name: &str) -> Options {
        assert!(
            (1..=15).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "player name {name:?}: 1 to 15 of [A-Za-z0-9_-]"
        );
        Options {
            server,
            name: name.to_string(),
            ip: unique_ip(),
            port: 27960,
            sets: Vec::new(),
        }
    }

    /// The loopback address the client's socket is bound to (`net_ip`).
    pub fn ip(mut self, ip: Ipv4Addr) -> Options {
        self.ip = ip;
        self
    }

    /// The port it is bound to (`net_port`; ioquake3 tries the next ones if it is taken).
    pub fn port(mut self, port: u16) -> Options {
        self.port = port;
        self
    }

    /// One more `+set key value` (after the runner's own, so it wins).
    pub fn set(mut self, key: &str, value: &str) -> Options {
        self.sets.push((key.to_string(), value.to_string()));
        self
    }

    /// The client's command line (after the wrapper's own settings); see the module docs.
    fn args(&self) -> Vec<String> {
        let (ip, port) = (self.ip.to_string(), self.port.to_string());
        let mut sets: Vec<(&str, &str)> = vec![
            ("s_initsound", "0"),
            ("r_mode", "0"),
            ("r_fullscreen", "0"),
            ("cl_renderer", "opengl1"),
            ("com_maxfps", "30"),
            ("net_enabled", "1"),
            ("net_ip", &ip),
            ("net_port", &port),
            ("cl_allowDownload", "0"),
            ("cl_motd", "0"),
            ("name", &self.name),
        ];
        // The engine joins argv with spaces before parsing: `""` is an empty quoted token.
        for master in [
            "sv_master1",
            "sv_master2",
            "sv_master3",
            "sv_master4",
            "sv_master5",
        ] {
            sets.push((master, "\"\""));
        }
        sets.extend(self.sets.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut args = Vec::with_capacity(sets.len() * 3 + 2);
        for (key, value) in sets {
            args.extend(["+set", key, value].map(String::from));
        }
        args.extend(["+connect".to_string(), self.server.to_string()]);
        args
    }
}

/// Times from the client's start (its spawn) to its join, as its output showed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// To its `connect` (the first `getchallenge` leaves on the next frame); `None` if that
    /// line was not seen.
    pub connecting: Option<Duration>,
    /// To `<name>^7 entered the game`.
    pub in_game: Duration,
}

/// A running OpenArena client and its Xvfb; see the module docs.
#[derive(Debug)]
pub struct OaClient {
    // Declared before `xvfb`: dropped (stopped) first, by `Drop for OaClient`.
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    xvfb: Option<Xvfb>,
    options: Options,
    dir: PathBuf,
    watch: LogWatch,
    started: Instant,
}

impl OaClient {
    /// Whether the `openarena` client and Xvfb are installed (see [`missing_packages`]).
    pub fn available() -> bool {
        missing_packages().is_empty()
    }

    /// Starts a client named `name` that connects to `server` (see [`Options::new`]).
    ///
    /// # Errors
    ///
    /// As [`OaClient::start_with`].
    pub fn start(server: SocketAddr, name: &str) -> io::Result<OaClient> {
        OaClient::start_with(Options::new(server, name))
    }

    /// Starts Xvfb (blocking at most 10 s for its display), then the client, and returns at
    /// once: [`OaClient::wait_in_game`] waits for the join.
    ///
    /// # Errors
    ///
    /// `NotFound` if a package is missing; Xvfb's failure to start (with its log); spawn and
    /// file errors.
    pub fn start_with(options: Options) -> io::Result<OaClient> {
        let (Some(wrapper), Some(xvfb)) = (wrapper(), xvfb()) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("not installed: {}", missing_packages().join(", ")),
            ));
        };
        let dir = fresh_dir()?;
        OaClient::launch(options, &wrapper, &xvfb, dir.clone()).inspect_err(|_| {
            // The error carries the logs' tails; nothing is left running.
            let _ = fs::remove_dir_all(&dir);
        })
    }

    /// [`OaClient::start_with`] in the fresh directory `dir`.
    fn launch(options: Options, wrapper: &Path, xvfb: &Path, dir: PathBuf) -> io::Result<OaClient> {
        let home = dir.join("home");
        fs::create_dir(&home)?;
        let auth = dir.join("xauthority");
        write_xauthority(&auth, &rand::random())?;
        let xvfb = Xvfb::start(xvfb, &auth, &dir.join("xvfb.log"), PATH)?;
        let log_path = dir.join("client.log");
        let log = File::create(&log_path)?;
        let mut command = command_for(wrapper, None);
        command
            .args(options.args())
            .env_clear()
            .env("PATH", PATH)
            .env("HOME", &home)
            .env("DISPLAY", format!(":{}", xvfb.display))
            .env("XAUTHORITY", &auth)
            .env("LIBGL_ALWAYS_SOFTWARE", "1")
            .env("SDL_VIDEODRIVER", "x11")
            .env("DBUS_SESSION_BUS_ADDRESS", "disabled:")
            .current_dir(&home)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log);
        let started = Instant::now();
        let mut child = spawn_from_helper(command)?;
        Ok(OaClient {
            stdin: child.stdin.take(),
            child: Some(child),
            xvfb: Some(xvfb),
            options,
            dir,
            watch: LogWatch::new(log_path),
            started,
        })
    }

    /// The player's name.
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// The loopback address its socket was asked to bind (`net_ip`).
    pub fn ip(&self) -> Ipv4Addr {
        self.options.ip
    }

    /// The address its socket is bound to, from its `Opening IP socket: <addr>` line (the last
    /// one: a taken port is followed by another try); `None` before that line.
    pub fn source(&mut self) -> Option<SocketAddr> {
        let _ = self.watch.poll();
        self.watch
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("Opening IP socket: ")?.trim().parse().ok())
    }

    /// The client's process id (the wrapper `exec`s the engine: this is `ioquake3`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The display of its Xvfb (`:<n>`).
    pub fn display(&self) -> u32 {
        self.xvfb.as_ref().map_or(0, |x| x.display)
    }

    /// User plus system CPU time the client used so far (`/proc/<pid>/stat`, in the kernel's
    /// 100 Hz ticks); `None` if it cannot be read.
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // Fields after the command name (which may hold spaces) start at field 3.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(Duration::from_millis(ticks * 10))
    }

    /// Writes one line to the client's console (e.g. `disconnect`, `quit`); it reads it on its
    /// next frame.
    ///
    /// # Errors
    ///
    /// When the console is closed or the write fails.
    pub fn console(&mut self, line: &str) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("console is closed"))?;
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()
    }

    /// Everything the client printed so far.
    pub fn log(&mut self) -> String {
        let _ = self.watch.poll();
        self.watch.lines().collect::<Vec<_>>().join("\n")
    }

    /// Waits, at most `limit`, until the client prints `<name>^7 entered the game`.
    ///
    /// # Errors
    ///
    /// `TimedOut`, the client's exit, or a line that says it left (see
    /// [`OaClient::check_in_game`]), with the tail of its output.
    pub async fn wait_in_game(&mut self, limit: Duration) -> io::Result<Joined> {
        let entered = format!("{}^7 entered the game", self.options.name);
        let at = self
            .wait_line(|l| l.contains(&entered), limit, "in game")
            .await?;
        let connecting = self.watch.first(|l| l.contains(" resolved to "));
        Ok(Joined {
            connecting: connecting.map(|(_, t)| t - self.started),
            in_game: at - self.started,
        })
    }

    /// Waits, at most `limit`, for a line of the client's output that contains `text`; the time
    /// from the call.
    ///
    /// # Errors
    ///
    /// As [`OaClient::wait_in_game`].
    pub async fn wait_output(&mut self, text: &str, limit: Duration) -> io::Result<Duration> {
        let asked = Instant::now();
        let at = self.wait_line(|l| l.contains(text), limit, text).await?;
        Ok(at.saturating_duration_since(asked))
    }

    /// Checks that the client is running, entered the game and printed nothing since that says
    /// it left (`Server disconnected`, `Server connection timed out`, `ERROR:`).
    ///
    /// # Errors
    ///
    /// What is wrong, with the tail of its output.
    pub fn check_in_game(&mut self) -> io::Result<()> {
        self.watch.poll()?;
        self.check_running("the in-game check")?;
        let entered = format!("{}^7 entered the game", self.options.name);
        let problem = match self.watch.first(|l| l.contains(&entered)) {
            None => Some("it never entered the game".to_string()),
            Some((i, _)) => self
                .watch
                .lines()
                .skip(i)
                .find(|l| DROPPED.iter().any(|d| l.contains(d)))
                .map(|l| format!("it left the game: {l:?}")),
        };
        match problem {
            Some(p) => Err(io::Error::other(format!("{p}; {}", self.output_tail()))),
            None => Ok(()),
        }
    }

    /// Stops the client and its Xvfb (see the module docs); the same as dropping it.
    pub fn stop(self) {}

    /// Polls the output until a line `matches` (its time), the client exits or prints a line
    /// of [`DROPPED`], or `limit` passes.
    async fn wait_line(
        &mut self,
        matches: impl Fn(&str) -> bool,
        limit: Duration,
        what: &str,
    ) -> io::Result<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            self.watch.poll()?;
            if let Some((_, at)) = self.watch.first(&matches) {
                return Ok(at);
            }
            self.check_running(what)?;
            if let Some((i, _)) = self.watch.first(|l| DROPPED.iter().any(|d| l.contains(d))) {
                let line = self.watch.lines().nth(i).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "{what}: the client left the game ({line:?}); {}",
                    self.output_tail()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: not within {limit:?}; {}", self.output_tail()),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// An error if the client has exited.
    fn check_running(&mut self, what: &str) -> io::Result<()> {
        let status = match self.child.as_mut() {
            Some(child) => child.try_wait()?,
            None => return Err(io::Error::other("the client was stopped")),
        };
        match status {
            Some(status) => Err(io::Error::other(format!(
                "the client exited ({status}) before {what}; {}",
                self.output_tail()
            ))),
            None => Ok(()),
        }
    }

    /// The last 40 lines of the client's output, and of Xvfb's log, for error messages.
    fn output_tail(&self) -> String {
        let xvfb = fs::read_to_string(self.dir.join("xvfb.log")).unwrap_or_default();
        format!(
            "client {} on {}, output:\n{}\nXvfb log:\n{}",
            self.options.name,
            self.options.ip,
            self.watch.tail(40),
            tail(&xvfb, 10)
        )
    }
}

impl Drop for OaClient {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `quit` disconnects cleanly (the server sees the player leave); closing the
            // console pipe afterwards is harmless.
            let quit = self.console("quit").is_ok() && exits_within(&mut child, QUIT_WAIT);
            drop(self.stdin.take());
            if !quit {
                terminate(&mut child);
            }
        }
        drop(self.xvfb.take());
        if std::thread::panicking() {
            eprintln!(
                "openarena client {}: files kept in {}",
                self.options.name,
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// What [`check_flow`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// From the server console's `say` to the client printing it.
    pub say_delivered: Duration,
    /// The client's row in the server's `status`.
    pub row: StatusRow,
}

/// Shows that packets flow both ways between `client` and `server` now, each step within
/// `limit`: the server console says a fresh token, which the client prints (server to client);
/// then the server's `status` shows the client acking (client to server, [`StatusRow::acking`]).
///
/// # Errors
///
/// The step that failed, with the logs.
pub async fn check_flow(
    server: &OpenArena,
    client: &mut OaClient,
    limit: Duration,
) -> io::Result<Flow> {
    static N: AtomicU32 = AtomicU32::new(0);
    let token = format!("flowcheck-{}", N.fetch_add(1, Ordering::Relaxed));
    server.console(&format!("say {token}"))?;
    let say_delivered = client.wait_output(&token, limit).await?;
    let rows = server_status(server, limit).await?;
    let row = rows
        .iter()
        .find(|r| r.name == client.name())
        .cloned()
        .ok_or_else(|| io::Error::other(format!("{} not in status: {rows:?}", client.name())))?;
    if !row.acking() {
        return Err(io::Error::other(format!(
            "the server has no recent ack from {}: {row:?}",
            client.name()
        )));
    }
    Ok(Flow { say_delivered, row })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let server = SocketAddr::from(([127, 1, 0, 1], 27960));
        let args = Options::new(server, "a-b_C9").args();
        assert_eq!(args.last().unwrap(), "127.1.0.1:27960");
        assert!(args.windows(3).any(|w| w == ["+set", "name", "a-b_C9"]));
        assert!(std::panic::catch_unwind(|| Options::new(server, "two words")).is_err());
    }
}
