//! The heartbeat task: probe the game server, then heartbeat the masters.
//!
//! Every `heartbeat_interval` (and once at start) the task probes the game server with
//! `getinfo` on its own socket, up to [`PROBE_ATTEMPTS`] times. When the server answers, it sends
//! the game's heartbeat to every master **from the public socket**: the master then challenges
//! the public address, the challenge is relayed like any client packet, and the master lists
//! the relay's address. When a server that had answered stops answering, the masters get a
//! flatline (ET only); so they do when the relay stops. Masters are resolved on every
//! heartbeat; one that does not resolve is skipped with a warning. States and transitions:
//! `docs/etrelay-heartbeat.md`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{debug, info, warn};

use super::metrics::ProbeState;
use super::shared::Shared;
use crate::et::classify::Query;
use crate::probe;

/// Longest wait for one master's name to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the last probe found, for the control API.
#[derive(Debug, Clone, Copy)]
pub struct ProbeStatus {
    /// State after the last probe.
    pub state: ProbeState,
    /// When the last probe ended.
    pub last_probe: Option<SystemTime>,
    /// When the server last answered a probe.
    pub last_answer: Option<SystemTime>,
}

impl Default for ProbeStatus {
    fn default() -> Self {
        ProbeStatus {
            state: ProbeState::Unknown,
            last_probe: None,
            last_answer: None,
        }
    }
}

/// Runs until the server stops, then sends the flatline.
pub(super) async fn run(shared: Arc<Shared>) {
    let cfg = &shared.config;
    let mut state = ProbeState::Unknown;
    loop {
        // A fresh socket each round (in `probe::ask`): one connected before the route to the
        // game server existed (a tunnel that came up later) would keep a source address the
        // server cannot answer.
        let answered = tokio::select! {
            () = shared.cancel.cancelled() => break,
            r = probe::ask(cfg.upstream, Query::Info, "hb", cfg.probe_timeout) => match r {
                Ok(answer) => answer.is_some(),
                Err(e) => {
                    warn!("heartbeat: cannot open the probe socket: {e}");
                    false
                }
            },
        };
        let next = if answered {
            ProbeState::Up
        } else {
            ProbeState::Down
        };
        record(&shared, next, answered);
        match (state, next) {
            (ProbeState::Up, ProbeState::Up) => {}
            (_, ProbeState::Up) => info!("game server {} answers", cfg.upstream),
            (ProbeState::Up, _) => {
                warn!("game server {} stopped answering", cfg.upstream);
                if let Some(flatline) = cfg.game.flatline() {
                    send_to_masters(&shared, flatline, true).await;
                }
            }
            (ProbeState::Unknown, _) => warn!("game server {} does not answer", cfg.upstream),
            _ => {}
        }
        state = next;
        if answered {
            send_to_masters(&shared, cfg.game.heartbeat(), false).await;
        }
        tokio::select! {
            () = shared.cancel.cancelled() => break,
            () = tokio::time::sleep(cfg.heartbeat_interval) => {}
        }
    }
    if let Some(flatline) = cfg.game.flatline() {
        send_to_masters(&shared, flatline, true).await;
    }
}

fn record(shared: &Shared, state: ProbeState, answered: bool) {
    shared.metrics.probe_state.set(state as u64);
    let mut p = shared.probe_status();
    let now = SystemTime::now();
    p.state = state;
    p.last_probe = Some(now);
    if answered {
        p.last_answer = Some(now);
    }
}

/// Sends `packet` to every master from the public socket.
async fn send_to_masters(shared: &Shared, packet: &[u8], flatline: bool) {
    let text = String::from_utf8_lossy(&packet[4..]);
    let text = text.trim_end();
    let want_v4 = shared.public_addr.is_ipv4();
    for master in &shared.config.masters {
        let resolved =
            tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(master.as_str())).await;
        let addr = match resolved {
            Ok(Ok(mut addrs)) => addrs.find(|a| a.is_ipv4() == want_v4),
            Ok(Err(e)) => {
                warn!("master {master} does not resolve ({e}): skipped");
                continue;
            }
            Err(_) => {
                warn!("master {master} did not resolve in time: skipped");
                continue;
            }
        };
        let Some(addr) = addr else {
            warn!("master {master} has no address of the public socket's family: skipped");
            continue;
        };
        send_one(shared, packet, master, addr, text, flatline).await;
    }
}

async fn send_one(
    shared: &Shared,
    packet: &[u8],
    master: &str,
    addr: SocketAddr,
    text: &str,
    flatline: bool,
) {
    match shared.public.send_to(packet, addr).await {
        Ok(_) => {
            if flatline {
                shared.metrics.flatlines.inc();
            } else {
                shared.metrics.heartbeats.inc();
            }
            debug!("{text} -> {master} ({addr})");
        }
        Err(e) => warn!("{text} to {master} ({addr}) failed: {e}"),
    }
}
