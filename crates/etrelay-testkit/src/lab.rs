//! The deployment etrelay is made for, built from network namespaces: a game server at home
//! behind a NAT router, a front host on the "Internet" with a WireGuard tunnel to the home
//! server, and the Internet itself (masters, players, browsers, attackers).
//!
//! ```text
//!  internet (198.18.0.254, .1.254; hosts 198.18.2.0/24, 198.18.3.0/24, 198.19.0.0/16 on lo)
//!      |  198.18.0.0/24                                  |  198.18.1.0/24
//!  front 198.18.0.1                            router 198.18.1.1 (nftables masquerade)
//!  wg 10.77.0.1 <======= WireGuard (UDP 51820) =======>    |  192.168.77.0/24
//!                                              home 192.168.77.2, wg 10.77.0.2
//! ```
//!
//! Nothing here leaves the machine: every address lives inside namespaces the lab makes
//! (198.18.0.0/15 is the benchmarking range, 10.77.0.0/24 and 192.168.77.0/24 are private).
//! The home namespace has no route to the Internet but through the router, which masquerades
//! it and forwards nothing the Internet starts; the WireGuard tunnel (wireguard-go, its UDP
//! leaving through that NAT) is the only way in. Dropping the lab stops wireguard-go, kills
//! whatever still runs in its namespaces and deletes them (their links go with them). One lab
//! per process at a time (names carry the pid).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{self, Netns, NsRuntime, PREFIX};

/// The front host's public address.
pub const FRONT_PUBLIC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The home router's public (WAN) address.
pub const ROUTER_WAN: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
/// The master's address on the Internet.
pub const MASTER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
/// The home server's LAN address, behind the router.
pub const HOME_LAN: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
/// The front host's tunnel address.
pub const FRONT_TUNNEL: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The home server's tunnel address.
pub const HOME_TUNNEL: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// The front host's WireGuard port.
pub const WG_PORT: u16 = 51820;
/// Players' addresses: 198.18.3.`n`.
pub fn player_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 3, n)
}
/// Attackers' addresses: 198.19.`hi`.`lo` (any of 198.19.0.0/16).
pub fn attacker_ip(hi: u8, lo: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, hi, lo)
}

/// The home router's nftables rules: masquerade what leaves for the Internet, forward only
/// what the home network started.
const ROUTER_NFT: &str = "table ip home {
    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname \"lan\" oifname \"wan\" accept
    }
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        oifname \"wan\" masquerade
    }
}
";

/// The four namespaces, the tunnel and the Internet's runtime; see the module docs.
#[derive(Debug)]
pub struct Lab {
    /// Tokio runtime inside `internet` (dropped first).
    pub internet_rt: NsRuntime,
    wg: Vec<(String, Child)>,
    /// The Internet: masters, players, browsers, attackers.
    pub internet: Netns,
    /// The front host: etrelay.
    pub front: Netns,
    /// The home router: NAT.
    pub router: Netns,
    /// The game server's host.
    pub home: Netns,
    /// The front's WireGuard interface (in `front`).
    pub front_wg: String,
    /// The home's WireGuard interface (in `home`).
    pub home_wg: String,
    dir: PathBuf,
    /// What [`netns::sweep_stale`] removed before the lab was built.
    pub swept: Vec<String>,
}

impl Lab {
    /// Builds the lab (see the module docs), with its files in `dir`, and waits (at most 10 s)
    /// for the first WireGuard handshake. Sweeps what killed runs left first.
    ///
    /// # Errors
    /// What failed, with the command's stderr.
    pub fn build(dir: &Path) -> io::Result<Lab> {
        let swept = netns::sweep_stale();
        let tag = format!("{PREFIX}-{}", std::process::id());
        let internet = Netns::create(&format!("{tag}-inet"))?;
        let front = Netns::create(&format!("{tag}-front"))?;
        let router = Netns::create(&format!("{tag}-router"))?;
        let home = Netns::create(&format!("{tag}-home"))?;
        wire(&internet, &front, &router, &home)?;
        let internet_rt = internet.runtime()?;
        let mut lab = Lab {
            internet_rt,
            wg: Vec::new(),
            internet,
            front,
            router,
            home,
            front_wg: format!("{tag}f"),
            home_wg: format!("{tag}h"),
            dir: dir.to_path_buf(),
            swept,
        };
        lab.tunnel()?;
        Ok(lab)
    }

    /// Starts wireguard-go on both ends and configures them; waits for the handshake.
    fn tunnel(&mut self) -> io::Result<()> {
        let key = |name: &str| -> io::Result<(PathBuf, String)> {
            let private = netns::run("wg", &["genkey"])?;
            let path = self.dir.join(format!("{name}.wgkey"));
            write_private(&path, &private.stdout)?;
            let public = netns::run_with_input(
                "wg",
                &["pubkey"],
                Some(String::from_utf8_lossy(&private.stdout).as_ref()),
            )?;
            Ok((
                path,
                String::from_utf8_lossy(&public.stdout).trim().to_string(),
            ))
        };
        let (front_key, front_pub) = key("front")?;
        let (home_key, home_pub) = key("home")?;
        let (fwg, hwg) = (self.front_wg.clone(), self.home_wg.clone());
        let front_child = wireguard_go(&self.front, &fwg)?;
        self.wg.push((fwg.clone(), front_child));
        let home_child = wireguard_go(&self.home, &hwg)?;
        self.wg.push((hwg.clone(), home_child));
        wait_uapi(&self.front, &fwg)?;
        wait_uapi(&self.home, &hwg)?;
        let port = WG_PORT.to_string();
        let fk = front_key.display().to_string();
        let hk = home_key.display().to_string();
        let front_allowed = format!("{HOME_TUNNEL}/32");
        self.front.exec(
            "wg",
            &[
                "set",
                &fwg,
                "private-key",
                &fk,
                "listen-port",
                &port,
                "peer",
                &home_pub,
                "allowed-ips",
                &front_allowed,
            ],
        )?;
        self.front
            .ip(&format!("addr add {FRONT_TUNNEL}/24 dev {fwg}"))?;
        self.front.ip(&format!("link set {fwg} up"))?;
        let endpoint = format!("{FRONT_PUBLIC}:{WG_PORT}");
        let home_allowed = format!("{FRONT_TUNNEL}/32");
        self.home
            .ip(&format!("addr add {HOME_TUNNEL}/24 dev {hwg}"))?;
        self.home.ip(&format!("link set {hwg} up"))?;
        // The home end keeps the NAT mapping open and tells the front where it is now.
        self.home.exec(
            "wg",
            &[
                "set",
                &hwg,
                "private-key",
                &hk,
                "peer",
                &front_pub,
                "endpoint",
                &endpoint,
                "allowed-ips",
                &home_allowed,
                "persistent-keepalive",
                "1",
            ],
        )?;
        self.wait_handshake(Duration::from_secs(10))
    }

    /// Waits, at most `limit`, until the front's peer has a handshake (`wg show … latest-
    /// handshakes` not 0).
    ///
    /// # Errors
    /// None within `limit`.
    pub fn wait_handshake(&self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.front_handshake()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no WireGuard handshake within {limit:?}"),
        ))
    }

    /// The front's latest handshake with the home peer, as seconds since the epoch (`None`:
    /// never).
    ///
    /// # Errors
    /// `wg show` failed.
    pub fn front_handshake(&self) -> io::Result<Option<u64>> {
        let out = self
            .front
            .exec("wg", &["show", &self.front_wg, "latest-handshakes"])?;
        Ok(out
            .split_whitespace()
            .nth(1)
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0))
    }

    /// The home peer's endpoint as the front sees it (`wg show … endpoints`): the router's
    /// public address and the port its NAT gave the tunnel.
    ///
    /// # Errors
    /// `wg show` failed.
    pub fn home_endpoint(&self) -> io::Result<Option<SocketAddr>> {
        let out = self
            .front
            .exec("wg", &["show", &self.front_wg, "endpoints"])?;
        Ok(out.split_whitespace().nth(1).and_then(|e| e.parse().ok()))
    }

    /// Takes the home router's Internet link down (the home connection drops).
    ///
    /// # Errors
    /// `ip` failed.
    pub fn home_link_down(&self) -> io::Result<()> {
        self.router.ip("link set wan down")
    }

    /// Brings the home router's Internet link back, with its default route.
    ///
    /// # Errors
    /// `ip` failed.
    pub fn home_link_up(&self) -> io::Result<()> {
        self.router.ip("link set wan up")?;
        self.router
            .ip("route replace default via 198.18.1.254 dev wan")
    }

    /// Every namespace name of the lab.
    pub fn names(&self) -> [&str; 4] {
        [
            self.internet.name(),
            self.front.name(),
            self.router.name(),
            self.home.name(),
        ]
    }
}

/// Links, addresses, routes, forwarding and the router's NAT.
fn wire(internet: &Netns, front: &Netns, router: &Netns, home: &Netns) -> io::Result<()> {
    let (i, r) = (internet.name(), router.name());
    front.ip(&format!("link add wan type veth peer name front netns {i}"))?;
    router.ip(&format!(
        "link add wan type veth peer name router netns {i}"
    ))?;
    home.ip(&format!("link add lan type veth peer name lan netns {r}"))?;
    for (ns, dev, addr) in [
        (internet, "front", "198.18.0.254/24"),
        (internet, "router", "198.18.1.254/24"),
        (front, "wan", "198.18.0.1/24"),
        (router, "wan", "198.18.1.1/24"),
        (router, "lan", "192.168.77.1/24"),
        (home, "lan", "192.168.77.2/24"),
    ] {
        ns.ip(&format!("addr add {addr} dev {dev}"))?;
        ns.ip(&format!("link set {dev} up"))?;
    }
    // The Internet's hosts: any address of these ranges can be bound inside `internet`.
    for range in ["198.18.2.0/24", "198.18.3.0/24", "198.19.0.0/16"] {
        internet.ip(&format!("route add local {range} dev lo"))?;
    }
    front.ip("route add default via 198.18.0.254 dev wan")?;
    router.ip("route add default via 198.18.1.254 dev wan")?;
    home.ip("route add default via 192.168.77.1 dev lan")?;
    for ns in [internet, router] {
        ns.exec("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])?;
    }
    router.exec_with_input("nft", &["-f", "-"], Some(ROUTER_NFT))?;
    Ok(())
}

/// Writes `bytes` to a new file only the owner reads.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// `wireguard-go -f <ifname>` inside `ns` (in the foreground, so it is our child), killed if
/// the test process dies (`setpriv --pdeathsig`, when installed).
fn wireguard_go(ns: &Netns, ifname: &str) -> io::Result<Child> {
    let mut c = if Path::new("/usr/bin/setpriv").is_file() {
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        c.args([
            "--pdeathsig",
            "KILL",
            "--",
            "ip",
            "netns",
            "exec",
            ns.name(),
        ]);
        c
    } else {
        std::process::Command::new("ip")
    };
    if !Path::new("/usr/bin/setpriv").is_file() {
        c.args(["netns", "exec", ns.name()]);
    }
    c.args(["wireguard-go", "-f", ifname])
        .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Waits, at most 10 s, until wireguard-go answers `wg show <ifname>`.
fn wait_uapi(ns: &Netns, ifname: &str) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ns.exec("wg", &["show", ifname]) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("wireguard-go {ifname} did not come up within 10 s: {e}"),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (ifname, child) in &mut self.wg {
            // SIGTERM lets wireguard-go remove its interface and control socket; bounded.
            let _ = netns::run("kill", &["-TERM", &child.id().to_string()]);
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(child.try_wait(), Ok(None)) {
                netns::kill(child.id());
            }
            let _ = child.wait();
            let _ = std::fs::remove_file(netns::wg_socket(ifname));
        }
        // The namespaces drop next (fields in order): what still runs in them is killed.
    }
}
