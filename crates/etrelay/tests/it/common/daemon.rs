//! The multi-server daemon as a real process: start, stop by PID (SIGTERM or kill -9), and an
//! HTTP client for its control API.
#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etrelay_testkit::unique_ip;
use tokio::process::Child;

pub const BIN: &str = env!("CARGO_BIN_EXE_etrelay");
pub const TOKEN: &str = "relay-token-0123456789abcdef-0123456789";

/// The address in `control API: listening addr=<addr> …`.
fn control_address(line: &str) -> Option<SocketAddr> {
    line.split("control API: listening addr=")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An `etrelay --ports …` process started, its control API maybe not up yet.
pub struct Launch {
    pub child: Child,
    pub ip: Ipv4Addr,
    pub ports: Vec<u16>,
    pub state_dir: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Launch {
    /// Waits, at most `limit`, for the control API to be up.
    pub async fn ready(self, limit: Duration) -> Daemon {
        let control =
            super::wait_for_line(&self.log, control_address, limit, "the control API").await;
        Daemon {
            child: self.child,
            control,
            ip: self.ip,
            ports: self.ports,
            state_dir: self.state_dir,
            log: self.log,
            http: http_client(),
        }
    }
}

/// An HTTP client for the control API (15 s per request). The workspace builds reqwest
/// without a default TLS provider, so ring is installed first.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

/// A running `etrelay --ports …` process.
pub struct Daemon {
    pub child: Child,
    pub control: SocketAddr,
    pub ip: Ipv4Addr,
    pub ports: Vec<u16>,
    pub state_dir: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
    pub http: reqwest::Client,
}

/// `n` ports from 27960: every test binds them on its own loopback address, so tests cannot
/// collide.
pub fn ports(n: u16) -> Vec<u16> {
    (27960..27960 + n).collect()
}

impl Daemon {
    /// Starts the daemon on a fresh address with `state_dir`, the control API on port 0.
    pub async fn start(state_dir: &Path, ports: &[u16], extra: &[&str]) -> Daemon {
        Self::start_on(unique_ip(), state_dir, ports, extra).await
    }

    /// Starts the daemon binding its public ports on `ip`.
    pub async fn start_on(ip: Ipv4Addr, state_dir: &Path, ports: &[u16], extra: &[&str]) -> Daemon {
        Self::spawn(ip, state_dir, ports, &format!("{ip}:0"), extra).await
    }

    pub async fn spawn(
        ip: Ipv4Addr,
        state_dir: &Path,
        ports: &[u16],
        control: &str,
        extra: &[&str],
    ) -> Daemon {
        Self::launch(ip, state_dir, ports, control, extra)
            .ready(Duration::from_secs(30))
            .await
    }

    /// Starts the process; [`Launch::ready`] then waits for its control API.
    pub fn launch(
        ip: Ipv4Addr,
        state_dir: &Path,
        ports: &[u16],
        control: &str,
        extra: &[&str],
    ) -> Launch {
        Self::launch_under(&[], &ip.to_string(), ip, state_dir, ports, control, extra)
    }

    /// As [`Daemon::launch`], binding the public ports on `bind` (`ip` is where tests reach
    /// them), the binary run under `prefix` (see [`super::spawn_logged_under`]).
    pub fn launch_under(
        prefix: &[&str],
        bind: &str,
        ip: Ipv4Addr,
        state_dir: &Path,
        ports: &[u16],
        control: &str,
        extra: &[&str],
    ) -> Launch {
        std::fs::create_dir_all(state_dir).unwrap();
        let token_file = state_dir.with_extension("token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let port_list = format!("{}-{}", ports[0], ports[ports.len() - 1]);
        let mut args: Vec<String> = vec![
            "--ports".into(),
            port_list,
            "--control".into(),
            control.into(),
            "--token-file".into(),
            token_file.display().to_string(),
            "--state-dir".into(),
            state_dir.display().to_string(),
            "--bind".into(),
            bind.to_string(),
            "--probe-timeout".into(),
            "200ms".into(),
            // The scripted game servers run on loopback addresses.
            "--allow-loopback-upstream".into(),
        ];
        if !extra.contains(&"--masters") {
            args.extend(["--masters".to_string(), String::new()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let prefix: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        let (child, log) = super::spawn_logged_under(&prefix, &args);
        Launch {
            child,
            log,
            ip,
            ports: ports.to_vec(),
            state_dir: state_dir.to_path_buf(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.control)
    }

    pub fn public(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// `PUT /server` with the relay token.
    pub async fn register(
        &self,
        key: &str,
        upstream: SocketAddr,
        port: Option<u16>,
    ) -> (u16, serde_json::Value) {
        let mut body = serde_json::json!({"key": key, "upstream": upstream.to_string()});
        if let Some(p) = port {
            body["port"] = p.into();
        }
        let r = self
            .http
            .put(self.url("/server"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// A request with a bearer `auth`; returns status and JSON body (Null when none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        auth: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.http.request(method, self.url(path)).bearer_auth(auth);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// The addresses `GET /bans` lists for the server of `key`, in its order.
    pub async fn banned(&self, key: &str) -> Vec<String> {
        let (status, bans) = self.call(reqwest::Method::GET, "/bans", key, None).await;
        assert_eq!(status, 200);
        bans["bans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["ip"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    }

    /// SIGTERM, and wait for a clean exit.
    pub async fn stop(mut self) {
        self.signal("-TERM");
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{}", self.log_text());
    }

    /// kill -9: no chance to write anything.
    pub async fn kill9(mut self) {
        self.signal("-KILL");
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// A key of 64 hex characters, different on every call.
pub fn new_key() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..4u32 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(i);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
