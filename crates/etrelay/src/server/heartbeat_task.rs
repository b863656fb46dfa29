//! The heartbeat task: drives the [`Heartbeat`] machine of one server with real I/O.
//!
//! When the machine asks for a probe, the task asks the game server `getinfo hb…` on a fresh
//! socket of its own ([`probe::ask`]: a socket connected before the route to the game server
//! existed, a tunnel that came up later, would keep a source address the server cannot answer).
//! What the machine says goes to the masters is sent **from the public socket**: the master
//! then challenges the public address, the challenge is relayed like any client packet, and
//! the master lists the relay's address. Masters are resolved on every send; one that does not
//! resolve is skipped with a warning. When the server stops, a probe or a wait is cut short and
//! the machine's last word (the flatline) is sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::heartbeat::{Beat, Change, Heartbeat, Next, ToMasters};
use super::shared::Shared;
use crate::clock::{Instant, wall_now};
use crate::et::classify::Query;
use crate::probe;

/// Longest wait for one master's name to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs until the server stops, then sends the flatline.
pub(super) async fn run(shared: Arc<Shared>) {
    let cfg = &shared.config;
    let mut heartbeat = Heartbeat::new(cfg.game, cfg.heartbeat_interval);
    loop {
        match heartbeat.poll(Instant::now()) {
            Next::WaitUntil(at) => tokio::select! {
                () = shared.cancel.cancelled() => break,
                () = tokio::time::sleep_until(at) => {}
                () = shared.reload.notified() => reload(&shared).await,
            },
            Next::Probe => {
                let answered = tokio::select! {
                    () = shared.cancel.cancelled() => break,
                    r = probe::ask(cfg.upstream, Query::Info, "hb", cfg.probe_timeout) => {
                        r.unwrap_or_else(|e| {
                            warn!("heartbeat: cannot open the probe socket: {e}");
                            None
                        })
                        .is_some()
                    }
                };
                let round = heartbeat.probed(answered);
                shared.metrics.probe_state.set(round.state as u64);
                shared.probe_status().record(round.state, wall_now());
                match round.change {
                    Change::Answers => info!("game server {} answers", cfg.upstream),
                    Change::StoppedAnswering => {
                        warn!("game server {} stopped answering", cfg.upstream);
                    }
                    Change::DoesNotAnswer => {
                        warn!("game server {} does not answer", cfg.upstream);
                    }
                    Change::None => {}
                }
                if let Some(send) = round.send {
                    send_to_masters(&shared, send).await;
                }
            }
        }
    }
    if let Some(send) = heartbeat.stop() {
        send_to_masters(&shared, send).await;
    }
}

/// SIGHUP: the masters' names resolved again now, and what changed logged.
async fn reload(shared: &Shared) {
    let before = shared.masters();
    let resolved = resolve_masters(shared).await;
    let names: Vec<String> = resolved
        .iter()
        .map(|(name, addr)| format!("{name} = {addr}"))
        .collect();
    let names = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    if shared.masters() == before {
        info!("reload: masters unchanged ({names})");
    } else {
        info!("reload: masters now {names} (were {})", addrs_text(&before));
    }
}

fn addrs_text(addrs: &[std::net::IpAddr]) -> String {
    if addrs.is_empty() {
        return "none".into();
    }
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves every master's name (each at most [`RESOLVE_TIMEOUT`]) to an address of the public
/// socket's family; one that does not is skipped with a warning. The addresses found are the
/// masters' answer budget's from now on.
async fn resolve_masters(shared: &Shared) -> Vec<(&str, SocketAddr)> {
    let want_v4 = shared.public_addr.is_ipv4();
    let mut out = Vec::with_capacity(shared.config.masters.len());
    for master in &shared.config.masters {
        let resolved =
            tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(master.as_str())).await;
        let addr = match resolved {
            Ok(Ok(mut addrs)) => {
                let found = addrs.find(|a| a.is_ipv4() == want_v4);
                if found.is_none() {
                    warn!("master {master} has no address of the public socket's family: skipped");
                }
                found
            }
            Ok(Err(e)) => {
                warn!("master {master} does not resolve ({e}): skipped");
                None
            }
            Err(_) => {
                warn!("master {master} did not resolve in time: skipped");
                None
            }
        };
        let Some(addr) = addr else {
            shared.metrics.heartbeat_errors.inc();
            continue;
        };
        out.push((master.as_str(), addr));
    }
    if !out.is_empty() || shared.config.masters.is_empty() {
        // A lookup that failed everywhere keeps the addresses known before.
        shared.set_masters(out.iter().map(|(_, a)| a.ip()).collect());
    }
    out
}

/// Sends a packet to every master from the public socket.
async fn send_to_masters(shared: &Shared, send: ToMasters) {
    let text = String::from_utf8_lossy(&send.packet[4..]);
    let text = text.trim_end();
    for (master, addr) in resolve_masters(shared).await {
        send_one(shared, send, master, addr, text).await;
    }
}

async fn send_one(shared: &Shared, send: ToMasters, master: &str, addr: SocketAddr, text: &str) {
    // Without waiting, as every send from the public socket: a full send buffer loses this
    // beat, and the next interval sends another.
    match shared.public.try_send_to(send.packet, addr) {
        Ok(_) => {
            match send.beat {
                Beat::Heartbeat => shared.metrics.heartbeats.inc(),
                Beat::Flatline => shared.metrics.flatlines.inc(),
            }
            debug!("{text} -> {master} ({addr})");
        }
        Err(e) => {
            warn!("{text} to {master} ({addr}) failed: {e}");
            shared.metrics.heartbeat_errors.inc();
        }
    }
}
