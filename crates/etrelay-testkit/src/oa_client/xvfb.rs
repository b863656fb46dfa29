//! The client's X server: an Xvfb that picks its own display and says which once it is ready
//! (`-displayfd`), behind a cookie; and how the runner's processes are stopped (SIGTERM, then
//! SIGKILL, each with a bounded wait, then reaped).

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::openarena::{command_for, spawn_from_helper, tail};

/// Upper bound on the wait for Xvfb's display number.
const DISPLAY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a stopping process is checked.
const POLL: Duration = Duration::from_millis(10);
/// Wait after SIGTERM.
const TERM_WAIT: Duration = Duration::from_secs(3);
/// Wait after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Writes an Xauthority file with one MIT-MAGIC-COOKIE-1 entry for any address and display
/// (family FamilyWild, empty address and number), each field a big-endian u16 length and bytes.
/// The X server loads every cookie of its `-auth` file whatever the display; libXau matches an
/// empty number to any display.
pub(super) fn write_xauthority(path: &Path, cookie: &[u8; 16]) -> io::Result<()> {
    let mut entry = vec![0xff, 0xff, 0, 0, 0, 0];
    for field in [b"MIT-MAGIC-COOKIE-1".as_slice(), cookie.as_slice()] {
        entry.extend_from_slice(&(field.len() as u16).to_be_bytes());
        entry.extend_from_slice(field);
    }
    fs::write(path, entry)
}

/// Whether `child` exits within `limit` (reaped if so).
pub(super) fn exits_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(POLL),
        }
    }
}

/// Sends `signal` to `child` unless it has exited, then waits at most `limit` for it.
fn signal_and_wait(child: &mut Child, signal: Signal, limit: Duration) -> bool {
    if exits_within(child, Duration::ZERO) {
        return true;
    }
    // Not reaped yet, so the pid still names our child.
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = kill_process(pid, signal);
    }
    exits_within(child, limit)
}

/// SIGTERM, at most 3 s for the exit, then SIGKILL and at most 5 s; reaped when it exits.
pub(super) fn terminate(child: &mut Child) {
    let _ = signal_and_wait(child, Signal::TERM, TERM_WAIT)
        || signal_and_wait(child, Signal::KILL, KILL_WAIT);
}

/// A running Xvfb on a display it chose; terminated on drop.
#[derive(Debug)]
pub(super) struct Xvfb {
    child: Child,
    /// The display number (`DISPLAY=:<n>`).
    pub(super) display: u32,
}

impl Xvfb {
    /// Starts `program` (Xvfb) with cookie file `auth`, its stderr in `log`, and `PATH` `path`;
    /// returns once its display number is written (at most 10 s).
    pub(super) fn start(program: &Path, auth: &Path, log: &Path, path: &str) -> io::Result<Xvfb> {
        let mut command = command_for(program, None);
        command
            .args(["-displayfd", "1", "-nolisten", "tcp"])
            .args(["-screen", "0", "640x480x24"])
            .arg("-auth")
            .arg(auth)
            .env_clear()
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(log)?);
        let mut child = spawn_from_helper(command)?;
        let stdout = child.stdout.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = tx.send(reader.read_line(&mut line).map(|_| line));
            // Xvfb closes the fd once written; read to the end anyway, so that no later write
            // could meet a closed pipe.
            let _ = io::copy(&mut reader, &mut io::sink());
        });
        let line = rx.recv_timeout(DISPLAY_TIMEOUT);
        // Built first, so that an error below stops it.
        let mut xvfb = Xvfb { child, display: 0 };
        match line.ok().and_then(Result::ok).map(|l| l.trim().parse()) {
            Some(Ok(display)) => {
                xvfb.display = display;
                Ok(xvfb)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "Xvfb gave no display number within {DISPLAY_TIMEOUT:?}; its log:\n{}",
                    tail(&fs::read_to_string(log).unwrap_or_default(), 20)
                ),
            )),
        }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xauthority_entry_layout() {
        let dir = crate::openarena::fresh_dir().unwrap();
        let path = dir.join("a");
        write_xauthority(&path, &[7; 16]).unwrap();
        let bytes = fs::read(&path).unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(&bytes[..8], &[0xff, 0xff, 0, 0, 0, 0, 0, 18]);
        assert_eq!(&bytes[8..26], b"MIT-MAGIC-COOKIE-1");
        assert_eq!(&bytes[26..28], &[0, 16]);
        assert_eq!(&bytes[28..], &[7; 16]);
    }
}
