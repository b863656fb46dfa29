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
                    answered = probe(&shared) => answered,
                };
                let round = heartbeat.probed(answered);
                shared.metrics.probe_state.set(round.state as u64);
                shared.probe_status().record(round.state, wall_now());
                match round.change {
                    // The server's span names the upstream.
                    Change::Answers => info!("game server answers"),
                    Change::StoppedAnswering => warn!("game server stopped answering"),
                    Change::DoesNotAnswer => warn!("game server does not answer"),
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

/// Whether the game server answers: it does when it sent the relay anything (a session's
/// answer, a cache refresh's) within one probe timeout, so a server busy with players is never
/// asked more of its per-address budget (and never declared down because a flood spent it);
/// else it is asked `getinfo` ([`probe::ask`]), whose answer also tells the relay its protocol.
async fn probe(shared: &Shared) -> bool {
    let cfg = &shared.config;
    if shared.heard_within(cfg.probe_timeout) {
        return true;
    }
    match probe::ask(cfg.upstream, Query::Info, "hb", cfg.probe_timeout).await {
        Ok(Some(answer)) => {
            shared.heard();
            shared.learn_info(&answer);
            true
        }
        Ok(None) => false,
        Err(e) => {
            warn!(error = %e, "heartbeat: cannot open the probe socket");
            false
        }
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
        info!(masters = %names, "reload: masters unchanged");
    } else {
        info!(masters = %names, were = %addrs_text(&before), "reload: masters changed");
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

/// Resolves every master's name (each at most [`RESOLVE_TIMEOUT`]) to the addresses the
/// public socket reaches: its family's first, and on a dual-stack socket (`--listen [::]:…`)
/// the first of each family, IPv4 first (a master lists the server once per family it was
/// heartbeaten from). One with none is skipped with a warning. The addresses found are the
/// masters' lane's from now on.
async fn resolve_masters(shared: &Shared) -> Vec<(&str, SocketAddr)> {
    let mut out = Vec::with_capacity(shared.config.masters.len());
    for master in &shared.config.masters {
        let resolved =
            tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(master.as_str())).await;
        let found = match resolved {
            Ok(Ok(addrs)) => {
                let found = reachable(shared.public_addr, shared.dual_stack, addrs);
                if found.is_empty() {
                    warn!(%master, "master has no address of the public socket's family: skipped");
                }
                found
            }
            Ok(Err(e)) => {
                warn!(%master, error = %e, "master does not resolve: skipped");
                Vec::new()
            }
            Err(_) => {
                warn!(%master, "master did not resolve in time: skipped");
                Vec::new()
            }
        };
        if found.is_empty() {
            shared.metrics.heartbeat_errors.inc();
            continue;
        }
        out.extend(found.into_iter().map(|a| (master.as_str(), a)));
    }
    if !out.is_empty() || shared.config.masters.is_empty() {
        // A lookup that failed everywhere keeps the addresses known before.
        shared.set_masters(out.iter().map(|(_, a)| a.ip()).collect());
    }
    out
}

/// Of a master's addresses, those a public socket bound to `public` reaches: the first of its
/// family; on a dual-stack socket the first of each family, IPv4 first.
fn reachable(
    public: SocketAddr,
    dual_stack: bool,
    addrs: impl Iterator<Item = SocketAddr>,
) -> Vec<SocketAddr> {
    let (mut v4, mut v6) = (None, None);
    for a in addrs {
        let slot = if a.is_ipv4() { &mut v4 } else { &mut v6 };
        slot.get_or_insert(a);
    }
    match (public.is_ipv4(), dual_stack) {
        (true, _) => v4.into_iter().collect(),
        (false, false) => v6.into_iter().collect(),
        (false, true) => v4.into_iter().chain(v6).collect(),
    }
}

/// Sends a packet to every master from the public socket; a heartbeat opens each master's
/// window for its check (`super::lanes`).
async fn send_to_masters(shared: &Shared, send: ToMasters) {
    let text = String::from_utf8_lossy(&send.packet[4..]);
    let text = text.trim_end();
    let masters = resolve_masters(shared).await;
    if send.beat == Beat::Heartbeat && !masters.is_empty() {
        shared.heartbeat_sent();
    }
    for (master, addr) in masters {
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
            debug!(packet = %text, %master, %addr, "sent to a master");
        }
        Err(e) => {
            warn!(packet = %text, %master, %addr, error = %e, "send to a master failed");
            shared.metrics.heartbeat_errors.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dual_stack_socket_reaches_both_families() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let addrs = [
            a("[2001:db8::1]:27950"),
            a("192.0.2.1:27950"),
            a("192.0.2.2:27950"),
        ];
        let v4 = a("0.0.0.0:27960");
        let v6 = a("[::]:27960");
        assert_eq!(reachable(v4, false, addrs.into_iter()), [addrs[1]]);
        assert_eq!(reachable(v6, false, addrs.into_iter()), [addrs[0]]);
        assert_eq!(reachable(v6, true, addrs.into_iter()), [addrs[1], addrs[0]]);
        assert!(reachable(v4, false, [addrs[0]].into_iter()).is_empty());
    }
}
