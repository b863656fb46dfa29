//! Which upstreams a relay may relay: never the relay itself (a loop), never an address no
//! game server has.
//!
//! Refused, at registration and when `servers.json` is loaded, and by the one-server mode at
//! start-up ([`crate::single`]):
//! - the unspecified address, a multicast address, the IPv4 broadcast address, port 0;
//! - a loopback address, unless `--allow-loopback-upstream` (tests and demos on one host);
//! - one of the relay's own ports (`--ports` or `--listen`, the control API's) on one of its
//!   own addresses: the bind address, or any address of the host when the bind address is
//!   unspecified. A host's own address is one a socket can be bound to.
//!
//! Addresses are compared in their canonical form ([`crate::net::canonical`]).

use std::net::{IpAddr, SocketAddr};

use super::RegistryConfig;
use crate::net::{canonical_ip, not_a_source};

/// The relay's own sockets an upstream is checked against, and whether it may be on loopback.
#[derive(Debug, Clone, Copy)]
pub struct OwnSockets<'a> {
    /// The public UDP ports.
    pub ports: &'a [u16],
    /// The address they are bound on.
    pub bind: IpAddr,
    /// The control API's address, if there is one.
    pub control: Option<SocketAddr>,
    /// Accept a loopback upstream (`--allow-loopback-upstream`).
    pub allow_loopback: bool,
}

/// Why `upstream` cannot be relayed by the several-servers relay `config` describes; `None`
/// when it can.
pub(super) fn refusal(upstream: SocketAddr, config: &RegistryConfig) -> Option<String> {
    upstream_refusal(
        upstream,
        &OwnSockets {
            ports: &config.ports,
            bind: config.bind,
            control: config.control,
            allow_loopback: config.allow_loopback,
        },
    )
}

/// Why `upstream` cannot be relayed by a relay with the sockets `own`; `None` when it can.
pub fn upstream_refusal(upstream: SocketAddr, own: &OwnSockets<'_>) -> Option<String> {
    let ip = canonical_ip(upstream.ip());
    let port = upstream.port();
    let what = if port == 0 {
        "port 0"
    } else if let Some(what) = not_a_source(ip) {
        what
    } else if ip.is_loopback() && !own.allow_loopback {
        "a loopback address (the relay's own host; --allow-loopback-upstream allows it for tests)"
    } else if own.ports.contains(&port) && is_own(ip, own.bind) {
        "one of the relay's own public ports: a loop"
    } else if own
        .control
        .is_some_and(|c| c.port() == port && is_own(ip, c.ip()))
    {
        "the relay's control API: a loop"
    } else {
        return None;
    };
    Some(format!("upstream {upstream} is {what}"))
}

/// True when `ip` reaches a socket bound on `bind`.
fn is_own(ip: IpAddr, bind: IpAddr) -> bool {
    let bind = canonical_ip(bind);
    if bind.is_unspecified() {
        // 0.0.0.0 takes IPv4 only; `::` takes both (dual-stack, the Linux default).
        (bind.is_ipv6() || ip.is_ipv4()) && is_local(ip)
    } else {
        ip == bind
    }
}

/// True when `ip` is an address of this host (a socket can be bound to it).
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::ServerConfig;

    fn config(bind: &str, allow_loopback: bool) -> RegistryConfig {
        RegistryConfig {
            ports: vec![27960, 27961],
            bind: bind.parse().unwrap(),
            state_dir: PathBuf::new(),
            template: ServerConfig::new("127.0.0.1:1".parse().unwrap()),
            control: Some("127.0.0.1:8080".parse().unwrap()),
            allow_loopback,
        }
    }

    fn refused(upstream: &str, c: &RegistryConfig) -> bool {
        refusal(upstream.parse().unwrap(), c).is_some()
    }

    #[test]
    fn no_loops_and_no_addresses_a_server_cannot_have() {
        let c = config("127.0.0.9", true);
        assert!(refused("127.0.0.9:27960", &c), "own public port");
        assert!(
            refused("[::ffff:127.0.0.9]:27961", &c),
            "mapped spelling of it"
        );
        assert!(refused("127.0.0.1:8080", &c), "the control API");
        assert!(!refused("127.0.0.10:27960", &c), "another loopback address");
        assert!(!refused("127.0.0.9:27962", &c), "not one of the ports");
        for bad in [
            "0.0.0.0:27960",
            "[::]:27960",
            "224.0.0.1:27960",
            "[ff02::1]:27960",
            "255.255.255.255:27960",
            "192.0.2.1:0",
        ] {
            assert!(refused(bad, &c), "{bad}");
        }
        let strict = config("127.0.0.9", false);
        assert!(refused("127.0.0.10:27960", &strict));
        assert!(refused("[::1]:27960", &strict));
        assert!(!refused("192.0.2.1:27960", &strict));
        // Bound on every address: any address of the host on a relay port is a loop.
        let any = config("0.0.0.0", true);
        assert!(refused("127.0.0.77:27960", &any));
        assert!(
            !refused("192.0.2.1:27960", &any),
            "not an address of this host"
        );
        let dual = config("::", true);
        assert!(refused("127.0.0.77:27961", &dual));
    }
}
