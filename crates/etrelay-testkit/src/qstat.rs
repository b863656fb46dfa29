//! Runs `quakestat` (Debian package `qstat`; there is no `qstat` command), a
//! real third-party server browser, against test peers.
//!
//! What it sends (`et-protocol.md` §6.3): `-q3s`, `-woets` and `-openarenas`
//! send `FF FF FF FF getinfo\n`; after an infoResponse, `-R` or `-P` add
//! `FF FF FF FF getstatus\n`. Its source address is chosen by the kernel
//! (127.0.0.1 for a 127.x.y.z destination).
//!
//! # `quakestat -json -R -P -<kind> <addr>` output
//!
//! Observed with qstat 2.17 against the OpenArena server: a JSON **array**
//! with one object per queried server. [`query_json`] returns that object.
//!
//! ```text
//! [ {
//!     "protocol": "q3s",                 // the kind asked for
//!     "address": "127.1.2.3:27960",
//!     "status": "online",                // "offline" / "timeout" otherwise
//!     "hostname": "127.1.2.3:27960",     // the address again, NOT sv_hostname
//!     "name": "etrelay-test",            // the server name (hostname key)
//!     "gametype": "",                    // -q3s: ""; -woets: the gamename
//!     "map": "oa_dm1",
//!     "numplayers": 0, "maxplayers": 8,
//!     "numspectators": 0, "maxspectators": 0,
//!     "ping": 0, "retries": 0,
//!     "rules": { "protocol": "71", "gamename": "Quake3Arena",
//!                "sv_hostname": "etrelay-test", ... },   // all values strings:
//!                                         // infoResponse keys merged with
//!                                         // the statusResponse serverinfo
//!     "players": [ { "name": "Sarge", "score": 0, "ping": 0 } ]
//! } ]
//! ```
//!
//! A server that does not answer gives only
//! `{"protocol", "address", "status": "offline" (or "timeout"), "hostname"}`.

use std::io;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// How long one `quakestat` run may take.
const QSTAT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `quakestat` is on `PATH`.
pub fn available() -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join("quakestat").is_file()))
        .unwrap_or(false)
}

/// Panics unless [`available`]: a test that needs `quakestat` fails without it, never passes
/// (such tests are `#[ignore]`d; `scripts/test` installs `qstat` and runs them).
pub fn require() {
    assert!(
        available(),
        "quakestat (Debian package qstat) is needed: run scripts/test, which installs it"
    );
}

/// Runs `quakestat <args>` with a 10 s timeout and returns its stdout.
///
/// The process is killed if the timeout passes (an `io::ErrorKind::TimedOut`
/// error) or if the future is dropped. A non-zero exit status is not an
/// error: quakestat reports unreachable servers in its output.
pub async fn quakestat(args: &[&str]) -> io::Result<String> {
    let child = Command::new("quakestat")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    match tokio::time::timeout(QSTAT_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => Ok(String::from_utf8_lossy(&output?.stdout).into_owned()),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("quakestat {args:?} did not finish within {QSTAT_TIMEOUT:?}"),
        )),
    }
}

/// Runs `quakestat -json -R -P -<kind> <addr>` (`kind` e.g. `q3s`, `woets`,
/// `openarenas`) and returns the JSON object of that server (see the module
/// docs for its shape).
pub async fn query_json(kind: &str, addr: SocketAddr) -> io::Result<serde_json::Value> {
    let flag = format!("-{kind}");
    let addr = addr.to_string();
    let out = quakestat(&["-json", "-R", "-P", &flag, &addr]).await?;
    let value: serde_json::Value = serde_json::from_str(&out).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("quakestat output is not JSON ({e}): {out}"),
        )
    })?;
    match value {
        serde_json::Value::Array(mut servers) if !servers.is_empty() => Ok(servers.swap_remove(0)),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected quakestat JSON: {other}"),
        )),
    }
}
