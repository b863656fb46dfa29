//! Network namespaces for end-to-end tests: create, run commands and processes inside
//! (`ip netns exec`), bind sockets inside, delete, and sweep what a killed run left behind.
//!
//! Needs root, `ip` (iproute2), and for [`crate::lab`] also `nft`, `wg`, `wireguard-go` and
//! `/dev/net/tun`; [`support`] says which is missing. Every name starts with [`PREFIX`] and
//! carries the pid of the process that made it, so runs never collide and [`sweep_stale`] only
//! removes what belongs to a process that is gone.
//!
//! Sockets and threads: a thread that entered a namespace ([`Netns::enter`]) creates its
//! sockets there, and they stay there whichever thread uses them afterwards; threads and
//! processes it starts inherit the namespace. [`NsRuntime`] is a tokio runtime on such a thread,
//! so that the testkit's peers (masters, players, floods) run inside a namespace unchanged.

use std::ffi::OsStr;
use std::fs::File;
use std::future::Future;
use std::io;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every namespace, and every WireGuard interface, a test makes starts with this.
pub const PREFIX: &str = "etre2e";
/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Where wireguard-go keeps its control sockets.
const WG_SOCK_DIR: &str = "/var/run/wireguard";

/// Why namespaces cannot be made here, or `Ok` when they can.
///
/// # Errors
/// A sentence naming each missing piece.
pub fn support() -> Result<(), String> {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root (network namespaces, veth links and nftables need it)".to_string());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun (wireguard-go needs a TUN device)".to_string());
    }
    for (cmd, pkg) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("wg", "wireguard-tools"),
        ("wireguard-go", "wireguard-go"),
    ] {
        if !on_path(cmd) {
            missing.push(format!("`{cmd}` (Debian package {pkg})"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "network namespaces cannot be made here: missing {}. Run as root; scripts/test installs \
             the packages (apt-get install nftables wireguard-go wireguard-tools iproute2)",
            missing.join(", ")
        ))
    }
}

/// Whether `cmd` is on `PATH` (or in the sbin directories root's PATH has).
pub fn on_path(cmd: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(Into::into))
        .any(|dir| dir.join(cmd).is_file())
}

/// Runs `program args`, bounded to 20 s; an error unless it exits 0.
///
/// # Errors
/// It could not start, timed out, or failed (its stderr is in the message).
pub fn run(program: &str, args: &[&str]) -> io::Result<Output> {
    run_with_input(program, args, None)
}

/// As [`run`], writing `input` to its stdin.
///
/// # Errors
/// See [`run`].
pub fn run_with_input(program: &str, args: &[&str], input: Option<&str>) -> io::Result<Output> {
    use io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{program}: {e}")))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes())?;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out?,
        Err(_) => {
            kill(pid);
            return Err(io::Error::other(format!(
                "`{program} {}` did not finish within 20 s",
                args.join(" ")
            )));
        }
    };
    if out.status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// SIGKILL to `pid`.
pub fn kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A named network namespace; deleted on drop (after killing what still runs in it).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with its loopback up.
    ///
    /// # Errors
    /// `ip netns add` failed.
    pub fn create(name: &str) -> io::Result<Netns> {
        run("ip", &["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ip("link set lo up")?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> <args>` (arguments split on whitespace).
    ///
    /// # Errors
    /// See [`run`].
    pub fn ip(&self, args: &str) -> io::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args.split_whitespace());
        run("ip", &all).map(|_| ())
    }

    /// Runs `program args` inside the namespace, bounded; returns its stdout.
    ///
    /// # Errors
    /// See [`run`].
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<String> {
        self.exec_with_input(program, args, None)
    }

    /// As [`Netns::exec`], writing `input` to its stdin.
    ///
    /// # Errors
    /// See [`run`].
    pub fn exec_with_input(
        &self,
        program: &str,
        args: &[&str],
        input: Option<&str>,
    ) -> io::Result<String> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        let out = run_with_input("ip", &all, input)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A command that runs `program` inside the namespace (`ip netns exec <name> program`,
    /// which execs it: the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// As [`Netns::command`], for tokio.
    pub fn tokio_command(&self, program: impl AsRef<OsStr>) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `f` on a new thread that entered the namespace, and returns its result. Sockets
    /// `f` creates belong to the namespace.
    ///
    /// # Errors
    /// The namespace could not be entered.
    pub fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let file = self.open()?;
        std::thread::spawn(move || -> io::Result<T> {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the thread in the namespace panicked"))?
    }

    fn open(&self) -> io::Result<File> {
        File::open(format!("{NETNS_DIR}/{}", self.name))
    }

    /// A tokio runtime on a thread inside the namespace.
    ///
    /// # Errors
    /// The namespace could not be entered.
    pub fn runtime(&self) -> io::Result<NsRuntime> {
        NsRuntime::start(self.open()?, &self.name)
    }

    /// The pids of the processes in the namespace (`ip netns pids`).
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.name)
    }
}

fn pids_in(name: &str) -> Vec<u32> {
    run("ip", &["netns", "pids", name])
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills every process in namespace `name` (bounded: 5 s), then deletes it.
fn remove(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = pids_in(name);
        if pids.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in pids {
            kill(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = run("ip", &["netns", "del", name]);
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove(&self.name);
    }
}

/// The names of the namespaces made with `tag` (see [`PREFIX`]) that exist now.
pub fn existing(tag: &str) -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(tag))
                .collect()
        })
        .unwrap_or_default()
}

/// wireguard-go's control socket for interface `ifname`.
pub fn wg_socket(ifname: &str) -> std::path::PathBuf {
    std::path::Path::new(WG_SOCK_DIR).join(format!("{ifname}.sock"))
}

/// The wireguard-go control sockets of interfaces whose name starts with `tag`.
pub fn existing_wg_sockets(tag: &str) -> Vec<String> {
    std::fs::read_dir(WG_SOCK_DIR)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(tag))
                .collect()
        })
        .unwrap_or_default()
}

/// The pid encoded in a name `<PREFIX>-<pid>…` (`-inet`, `f`, … may follow).
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?.strip_prefix('-')?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Removes the namespaces (and what runs in them) and the wireguard-go control sockets left by
/// runs whose process is gone (a test killed before its guards ran). Returns what it removed.
pub fn sweep_stale() -> Vec<String> {
    let gone = |name: &str| {
        owner(name).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let mut removed = Vec::new();
    for name in existing(PREFIX) {
        if gone(&name) {
            remove(&name);
            removed.push(name);
        }
    }
    if let Ok(dir) = std::fs::read_dir(WG_SOCK_DIR) {
        for e in dir.filter_map(|e| e.ok()) {
            let file = e.file_name().to_string_lossy().into_owned();
            if let Some(name) = file.strip_suffix(".sock")
                && gone(name)
            {
                let _ = std::fs::remove_file(e.path());
                removed.push(file);
            }
        }
    }
    removed
}

/// A tokio runtime (current thread) whose thread is inside a namespace: what runs on it binds
/// its sockets there. Stopped on drop.
#[derive(Debug)]
pub struct NsRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsRuntime {
    fn start(ns: File, name: &str) -> io::Result<NsRuntime> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || {
                let entered = rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(io::Error::from)
                .and_then(|()| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                });
                match entered {
                    Ok(rt) => {
                        let _ = ready_tx.send(Ok(rt.handle().clone()));
                        rt.block_on(async {
                            let _ = stopped.await;
                        });
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })?;
        let handle = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| io::Error::other("the namespace's runtime did not start"))??;
        Ok(NsRuntime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `fut` inside the namespace and waits for its result.
    ///
    /// # Panics
    /// If `fut` panics.
    pub async fn run<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> T {
        self.handle
            .spawn(fut)
            .await
            .expect("a task in the namespace")
    }

    /// Spawns `fut` inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.handle.spawn(fut)
    }
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        assert_eq!(owner("etre2e-1234-inet"), Some(1234));
        assert_eq!(owner("etre2e-1234"), Some(1234));
        assert_eq!(owner("etre2e-1234f"), Some(1234));
        assert_eq!(owner("other-1234-inet"), None);
        assert_eq!(owner("etre2e-x-inet"), None);
    }
}
