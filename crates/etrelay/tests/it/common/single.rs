//! The `etrelay` binary relaying one server, with `--metrics`, its log collected; and scraping
//! its metrics.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Log, metrics_address, relaying_address, spawn_etrelay, wait_for_line};

const S: Duration = Duration::from_secs(1);

/// The relay binary in front of one upstream.
pub struct SingleRelay {
    pub child: tokio::process::Child,
    pub log: Log,
    pub public: SocketAddr,
    pub metrics: SocketAddr,
}

impl SingleRelay {
    /// Starts it in front of `upstream` on `ip` (public port and metrics, ports chosen by the
    /// kernel) with `extra` flags (`--masters` among them: no default leaves the machine).
    pub async fn start(upstream: SocketAddr, ip: Ipv4Addr, extra: &[&str]) -> SingleRelay {
        SingleRelay::start_on(upstream, SocketAddr::from((ip, 0)), extra).await
    }

    /// [`SingleRelay::start`] with its public socket on `public` (a relay started again where
    /// it was).
    pub async fn start_on(upstream: SocketAddr, public: SocketAddr, extra: &[&str]) -> SingleRelay {
        let ip = public.ip();
        let mut args: Vec<String> = vec![
            upstream.to_string(),
            "--allow-loopback-upstream".into(),
            "--listen".into(),
            public.to_string(),
            "--metrics".into(),
            format!("{ip}:0"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        assert!(args.iter().any(|a| a == "--masters"), "--masters is given");
        let (child, log, public) = spawn_etrelay(&args, relaying_address, 10 * S).await;
        let metrics = wait_for_line(&log, metrics_address, 10 * S, "metrics").await;
        SingleRelay {
            child,
            log,
            public,
            metrics,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGTERM, as `systemctl stop` sends, and waits for the exit (at most 10 s).
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let _ = tokio::time::timeout(10 * S, self.child.wait()).await;
    }

    /// The WARN lines containing `what`.
    pub fn warns(&self, what: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("WARN") && l.contains(what))
            .cloned()
            .collect()
    }
}

/// The sum of the `etrelay_dropped_packets_total` samples of `reason` in a scrape.
pub fn drops(text: &str, reason: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with("etrelay_dropped_packets_total")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `GET /metrics` (empty on failure, within 5 s).
pub async fn scrape(addr: SocketAddr) -> String {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(5 * S, fetch)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}
