//! The whole deployment, end to end, as a user lives it (issue 16): Debian's real OpenArena
//! server at home behind a NAT router (nftables masquerade), etrelay with several servers on a
//! front host, a WireGuard tunnel (wireguard-go) between the two, and an Internet with a
//! master, players, `quakestat` and an attacker. Every host is a network namespace this test
//! makes (`etrelay_testkit::lab`), with addresses that exist only inside them (198.18.0.0/15,
//! 10.77.0.0/24, 192.168.77.0/24); everything is removed when it ends, pass or fail.
//!
//! The one test that leaves loopback. It needs root, `/dev/net/tun`, `ip`, `nft`, `wg` and
//! `wireguard-go` (scripts/test installs them): `#[ignore]`d; asked for without them, it fails
//! saying what is missing.
//! `scripts/deploy-e2e` runs it alone and prints its story and figures.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{Log, spawn_logged_under};
use etrelay_testkit::lab::{self, FRONT_PUBLIC, FRONT_TUNNEL, HOME_TUNNEL, Lab, MASTER_IP};
use etrelay_testkit::netns::{self, Netns};
use etrelay_testkit::openarena::{self, OpenArena};
use etrelay_testkit::player::{Dialect, Player, RETRANSMIT, game_packet};
use etrelay_testkit::{FakeMaster, MasterStyle, flood::Flood, qstat, udp};

const BIN: &str = env!("CARGO_BIN_EXE_etrelay");
const TOKEN: &str = "front-relay-token-0123456789abcdef0123";
const RCON: &str = "home-rcon-secret";
const HOSTNAME: &str = "home-server";
const PORT: u16 = 27960;
const S: Duration = Duration::from_secs(1);

/// The relay's public address, where players and masters see the home server.
fn front() -> SocketAddr {
    SocketAddr::from((FRONT_PUBLIC, PORT))
}

/// The home server as the relay reaches it: its tunnel address.
fn upstream() -> SocketAddr {
    SocketAddr::from((HOME_TUNNEL, openarena::PORT))
}

/// The control API: the front's tunnel address only.
fn control() -> String {
    format!("http://{FRONT_TUNNEL}:8080")
}

/// OpenArena with `com_gamename et`: it then answers as an ET server would (`gamename et`), so
/// the relay runs with its default `--game et` (heartbeat `EnemyTerritory-1`, flatline
/// `ETFlatline-1`), and players ask for a challenge with gamename `et`.
fn dialect() -> Dialect {
    Dialect::Ioq3 {
        gamename: "et".to_string(),
    }
}

/// One line of the story, for `scripts/deploy-e2e` (shown with `--nocapture`).
fn say(line: impl AsRef<str>) {
    println!("[deploy] {}", line.as_ref());
}

/// Runs `etrelay admin <args>` inside `ns`, in the directory holding the test's files (so
/// they are named as in the README), and prints the transcript; returns success, stdout and
/// stderr.
async fn admin(w: &World, ns: &Netns, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        30 * S,
        ns.tokio_command(BIN)
            .arg("admin")
            .args(args)
            .current_dir(w.dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("etrelay admin within 30 s")
    .expect("run etrelay admin");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let host = ns.name().rsplit('-').next().unwrap_or_default();
    say(format!("{host}$ etrelay admin {}", args.join(" ")));
    if args.contains(&"--json") {
        say(format!(
            "    (the API's JSON, {} lines)",
            stdout.lines().count()
        ));
    } else {
        for line in stdout.lines().chain(stderr.lines()) {
            say(format!("    {line}"));
        }
    }
    (out.status.success(), stdout, stderr)
}

/// `quakestat -json -R -P -q3s <addr>` run inside `ns`.
async fn quakestat_in(ns: &Netns, addr: SocketAddr) -> serde_json::Value {
    let out = tokio::time::timeout(
        15 * S,
        ns.tokio_command("quakestat")
            .args(["-json", "-R", "-P", "-q3s", &addr.to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("quakestat within 15 s")
    .expect("run quakestat");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("quakestat JSON");
    v[0].clone()
}

/// The relay: `etrelay --ports …` inside the front namespace, its stderr collected.
struct Relay {
    child: tokio::process::Child,
    log: Log,
}

impl Relay {
    fn count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits, at most `limit`, until `needle` was logged more than `before` times.
    async fn wait_count(&self, needle: &str, before: usize, limit: Duration) -> bool {
        common::eventually(limit, || self.count(needle) > before).await
    }

    /// Whether the relay process still runs (not exited, not a zombie).
    fn alive(&self) -> bool {
        self.child.id().is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|r| !r.trim_start().starts_with('Z'))
            })
        })
    }

    fn text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// Everything the test runs, in the order it is torn down: the relay, the game server, the
/// master, then the namespaces (with whatever still runs in them), then the files.
struct World {
    /// A runtime inside the front namespace, for `GET /metrics` as the operator there does.
    front_rt: netns::NsRuntime,
    relay: Relay,
    oa: OpenArena,
    master: FakeMaster,
    lab: Lab,
    dir: tempfile::TempDir,
}

/// What the run measured, printed at the end.
#[derive(Default)]
struct Figures {
    lab_up: Duration,
    listed: Duration,
    join: Duration,
    down_to_stopped: Duration,
    down_to_flatline: Duration,
    up_to_answers: Duration,
    up_to_heartbeat: Duration,
    up_to_join: Duration,
    flood_sent: u64,
    /// Client datagrams the relay counted during the flood (all sources).
    flood_received: u64,
    /// Drops during the flood, by reason, largest first.
    flood_drops: Vec<(String, u64)>,
    flood_time: Duration,
    /// (rounds answered, rounds, in-game packets received)
    honest_before: (usize, usize, usize),
    honest_during: (usize, usize, usize),
    honest_after: (usize, usize, usize),
    new_join_during: Duration,
}

/// `GET /metrics` with the relay token, from the front host (the control API is on its tunnel
/// address).
async fn metrics(w: &World) -> String {
    let url = format!("{}/metrics", control());
    w.front_rt
        .run(async move {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("HTTP client");
            let r = client
                .get(&url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("GET /metrics");
            assert_eq!(r.status().as_u16(), 200);
            r.text().await.expect("metrics body")
        })
        .await
}

/// `etrelay_dropped_packets_total` of port 27960, by reason.
fn drops(text: &str) -> Vec<(String, u64)> {
    let prefix = format!("etrelay_dropped_packets_total{{port=\"{PORT}\",reason=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (reason, n) = rest.split_once("\"} ")?;
            Some((reason.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// The sample of `family` for port 27960.
fn sample(text: &str, family: &str) -> u64 {
    let prefix = format!("{family}{{port=\"{PORT}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

/// A player on `ip` joins the front; returns it and how long it took.
async fn join(lab: &Lab, ip: Ipv4Addr, qport: u16, within: Duration) -> (Player, Duration) {
    let (p, took) = lab
        .internet_rt
        .run(async move {
            let mut p = Player::bind(ip, front(), qport, dialect())
                .await
                .expect("bind a player");
            let took = p.join(within, RETRANSMIT).await;
            (p, took)
        })
        .await;
    let took = took.unwrap_or_else(|e| panic!("player {ip} could not join: {e:?}"));
    (p, took)
}

/// Drops what already waits in the player's socket (what the server sent earlier).
async fn drain(lab: &Lab, mut p: Player) -> Player {
    lab.internet_rt
        .run(async move {
            p.recv_game(Duration::from_millis(200)).await;
            p
        })
        .await
}

/// Plays `rounds` rounds (one in-game packet, then up to 100 ms for the server's); returns the
/// player, the rounds answered and the packets received.
async fn play(lab: &Lab, mut p: Player, rounds: usize) -> (Player, usize, usize) {
    lab.internet_rt
        .run(async move {
            let (mut answered, mut got) = (0, 0);
            for _ in 0..rounds {
                p.send_game(b"move").await.expect("send");
                let n = p.recv_game(Duration::from_millis(100)).await;
                answered += usize::from(n > 0);
                got += n;
            }
            (p, answered, got)
        })
        .await
}

#[ignore = "needs root, /dev/net/tun; nftables, wireguard-go, wireguard-tools, iproute2, openarena-server, qstat (apt)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_server_behind_nat_is_listed_played_and_defended_at_the_front() {
    if let Err(why) = netns::support() {
        let ci = std::env::var_os("CI").is_some();
        panic!("{why}{}", if ci { " (CI: this test must run)" } else { "" });
    }
    OpenArena::require();
    qstat::require();
    let started = Instant::now();
    let mut fig = Figures::default();
    let tag = format!("{}-{}", netns::PREFIX, std::process::id());
    let world = build(&mut fig).await;

    let player = listed_and_played(&world, &mut fig).await;
    control_api(&world).await;
    rcon_ban_sessions(&world).await;
    let player = tunnel_down_and_up(&world, player, &mut fig).await;
    flood(&world, player, &mut fig).await;

    // The server leaves the relay (a flatline), then the relay stops; then everything goes.
    leave(&world).await;
    let World {
        front_rt,
        mut relay,
        oa,
        master,
        lab,
        dir,
    } = world;
    let pid = relay.child.id().expect("the relay runs");
    netns::run("kill", &["-TERM", &pid.to_string()]).expect("SIGTERM");
    let status = tokio::time::timeout(10 * S, relay.child.wait())
        .await
        .expect("the relay stops within 10 s")
        .expect("wait");
    assert!(status.success(), "{}", relay.text());
    assert!(
        master.listed().iter().all(|a| *a == front()),
        "only the front was ever listed: {:?}",
        master.listed()
    );
    drop((front_rt, relay, oa, master));
    drop(lab);
    drop(dir);
    let mut left = netns::existing(&tag);
    left.extend(netns::existing_wg_sockets(&tag));
    assert!(left.is_empty(), "left behind: {left:?}");
    say("teardown: every namespace, link and process of the run is gone");
    report(&fig, started.elapsed());
}

/// `leave`: the front's listing gets a flatline, the key is refused afterwards.
async fn leave(w: &World) {
    let flatlines = w
        .master
        .wait_heartbeats("ETFlatline-1", 99, Duration::ZERO)
        .await
        .len();
    let (ok, _, err) = admin_home(w, &["leave"]).await;
    assert!(ok, "{err}");
    let got = w
        .master
        .wait_heartbeats("ETFlatline-1", flatlines + 1, 5 * S)
        .await;
    assert_eq!(
        got.get(flatlines),
        Some(&front()),
        "the flatline of the leave"
    );
    let (ok, _, err) = admin_home(w, &["status"]).await;
    assert!(!ok && err.contains("does not know this key"), "{err}");
    assert!(
        challenge_from(w, lab::player_ip(10)).await.is_empty(),
        "nothing relayed"
    );
}

/// The lab, the game server at home, the master on the Internet, the relay on the front, and
/// the registration over the tunnel.
async fn build(fig: &mut Figures) -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    let lab = Lab::build(dir.path()).expect("build the namespaces");
    fig.lab_up = t.elapsed();
    if !lab.swept.is_empty() {
        say(format!("removed what a killed run left: {:?}", lab.swept));
    }
    say(format!(
        "lab up in {} ms: {:?}; WireGuard handshake done, the front sees home at {:?} (the router's NAT)",
        fig.lab_up.as_millis(),
        lab.names(),
        lab.home_endpoint().expect("wg show")
    ));
    assert_eq!(
        lab.home_endpoint().expect("wg show").map(|e| e.ip()),
        Some(lab::ROUTER_WAN.into()),
        "the tunnel comes through the router's masquerade"
    );
    let probe = lab
        .home
        .enter(|| std::net::UdpSocket::bind((lab::HOME_LAN, 0)))
        .expect("enter home")
        .expect("bind in home");
    let oa = OpenArena::start_with(
        openarena::Options::new(HOME_TUNNEL, RCON)
            .netns(lab.home.name())
            .hostname(HOSTNAME)
            .set("com_gamename", "et")
            .probe_from(probe),
    )
    .expect("start openarena-server at home");
    say(format!(
        "home: openarena-server on {} (tunnel address only)",
        oa.addr()
    ));
    let master = lab
        .internet_rt
        .run(async { FakeMaster::start(MASTER_IP, MasterStyle::Classic) })
        .await
        .expect("start the master");
    say(format!("internet: master on {}", master.addr()));
    let relay = start_relay(&lab, dir.path(), master.addr()).await;
    World {
        front_rt: lab.front.runtime().expect("a runtime in front"),
        relay,
        oa,
        master,
        lab,
        dir,
    }
}

async fn start_relay(lab: &Lab, dir: &std::path::Path, master: SocketAddr) -> Relay {
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).expect("token file");
    let state = dir.join("state");
    let prefix: Vec<String> = ["ip", "netns", "exec", lab.front.name()]
        .map(String::from)
        .to_vec();
    let args: Vec<String> = [
        "--ports",
        "27960-27961",
        "--control",
        &format!("{FRONT_TUNNEL}:8080"),
        "--token-file",
        &token.display().to_string(),
        "--state-dir",
        &state.display().to_string(),
        "--bind",
        &FRONT_PUBLIC.to_string(),
        "--masters",
        &master.to_string(),
        // Faster rounds than the 5 min default so the outage shows within seconds; the pace
        // keeps the relay (probes included) under ioquake3's 1 query/s per source address.
        "--heartbeat-interval",
        "3s",
        "--probe-timeout",
        "1s",
        "--upstream-burst",
        "4",
        "--upstream-interval",
        "2s",
    ]
    .map(String::from)
    .to_vec();
    let (child, log) = spawn_logged_under(&prefix, &args);
    let relay = Relay { child, log };
    let want = format!("control API: listening addr={FRONT_TUNNEL}:8080");
    assert!(
        relay.wait_count(&want, 0, 15 * S).await,
        "the relay did not start: {}",
        relay.text()
    );
    say(format!(
        "front: etrelay --ports 27960-27961 --bind {FRONT_PUBLIC} --control {FRONT_TUNNEL}:8080 --masters {master}"
    ));
    relay
}

/// Assertion 1, and the registration over the tunnel (part of 2). Returns the player.
async fn listed_and_played(w: &World, fig: &mut Figures) -> Player {
    // The problem: what the home server sends itself leaves from the router's address.
    let home_sock = w
        .lab
        .home
        .enter(|| std::net::UdpSocket::bind((lab::HOME_LAN, 0)))
        .expect("enter home")
        .expect("bind in home");
    home_sock
        .send_to(&udp::oob(b"heartbeat EnemyTerritory-1\n"), w.master.addr())
        .expect("send from home");
    assert!(
        common::eventually(5 * S, || w
            .master
            .heartbeats()
            .iter()
            .any(|(from, _)| from.ip() == lab::ROUTER_WAN))
        .await
    );
    let seen = w.master.heartbeats()[0].0;
    say(format!(
        "a heartbeat sent from home reaches the master from {seen}: the router's address, where nothing answers"
    ));

    // Registration with proof, over the tunnel.
    let files = w.dir.path();
    std::fs::write(files.join("token"), TOKEN).unwrap();
    std::fs::write(files.join("rcon.pw"), RCON).unwrap();
    let t = Instant::now();
    let (ok, out, err) = register(w, "token", "server.key").await;
    assert!(
        ok && out.contains("(new)"),
        "{out}{err}\n{}",
        w.relay.text()
    );

    // The master lists the front's address, never the router's.
    assert!(
        w.master.wait_listed(front(), 15 * S).await,
        "the master did not list the front: {:?} {:?}\n{}",
        w.master.heartbeats(),
        w.master.rejections(),
        w.relay.text()
    );
    fig.listed = t.elapsed();
    assert!(w.master.listed().iter().all(|a| *a == front()));
    assert!(
        w.master
            .heartbeats()
            .iter()
            .filter(|(_, tag)| tag == "EnemyTerritory-1")
            .all(|(from, _)| *from == front() || from.ip() == lab::ROUTER_WAN)
    );
    say(format!(
        "master lists {:?} ({} ms after register); the router's address never",
        w.master.listed(),
        fig.listed.as_millis()
    ));

    // A browser through the front sees the real server, as one at home does directly.
    let plain = w
        .lab
        .internet
        .tokio_command("quakestat")
        .args(["-q3s", &front().to_string()])
        .kill_on_drop(true)
        .output();
    let plain = tokio::time::timeout(15 * S, plain)
        .await
        .expect("quakestat within 15 s")
        .expect("run quakestat");
    say(format!("inet$ quakestat -q3s {}", front()));
    for line in String::from_utf8_lossy(&plain.stdout).lines() {
        say(format!("    {line}"));
    }
    let via_front = quakestat_in(&w.lab.internet, front()).await;
    let direct = quakestat_in(&w.lab.home, upstream()).await;
    assert_eq!(via_front["status"], "online", "{via_front}");
    for key in ["name", "map", "maxplayers"] {
        assert_eq!(
            via_front[key], direct[key],
            "{key}: {via_front} vs {direct}"
        );
    }
    assert_eq!(via_front["name"], HOSTNAME);
    say(format!(
        "internet: quakestat {} -> {} on {}, {}/{} players (same as at home)",
        front(),
        via_front["name"],
        via_front["map"],
        via_front["numplayers"],
        via_front["maxplayers"]
    ));

    // A player completes the handshake with the real server through the relay.
    let (p, took) = join(&w.lab, lab::player_ip(10), 1010, 10 * S).await;
    fig.join = took;
    let (p, answered, _) = play(&w.lab, p, 5).await;
    assert!(answered > 0, "no in-game packet from the server");
    say(format!(
        "internet: player {} joined in {} ms (challengeResponse, connectResponse) and gets in-game packets",
        p.local_addr().expect("address"),
        took.as_millis()
    ));
    p
}

async fn register(w: &World, token: &str, key: &str) -> (bool, String, String) {
    let (ctl, up) = (control(), upstream().to_string());
    #[rustfmt::skip]
    let args = [
        "register", "--control", &ctl, "--token-file", token, "--upstream", &up, "--rcon", &up,
        "--rcon-password-file", "rcon.pw", "--key-file", key,
    ];
    admin(w, &w.lab.home, &args).await
}

/// `--control <tunnel address> --key-file <key>`.
fn with_key(key: &str) -> [String; 4] {
    [
        "--control".into(),
        control(),
        "--key-file".into(),
        key.into(),
    ]
}

/// `etrelay admin <command> [extra…] --control … --key-file server.key` at home.
async fn admin_home(w: &World, command: &[&str]) -> (bool, String, String) {
    let k = with_key("server.key");
    let mut args: Vec<&str> = command.to_vec();
    args.extend(k.iter().map(String::as_str));
    admin(w, &w.lab.home, &args).await
}

/// Assertion 2: the control API only over the tunnel; wrong token or key refused.
async fn control_api(w: &World) {
    // From the Internet: the tunnel address has no route, the public address no listener.
    for url in [control(), format!("http://{FRONT_PUBLIC}:8080")] {
        let (ok, _, err) = admin(
            w,
            &w.lab.internet,
            &["status", "--control", &url, "--key-file", "server.key"],
        )
        .await;
        assert!(
            !ok && err.contains("cannot reach the control API"),
            "{url}: {err}"
        );
    }
    // Over the tunnel it answers.
    let (ok, out, err) = admin_home(w, &["status"]).await;
    assert!(
        ok && out.contains("probe") && out.contains("up"),
        "{out}{err}"
    );
    // A wrong relay token registers nothing; a wrong key reaches nothing.
    let files = w.dir.path();
    std::fs::write(
        files.join("bad-token"),
        "not-the-relay-token-0123456789abcdef",
    )
    .unwrap();
    let (ok, _, err) = register(w, "bad-token", "other.key").await;
    assert!(
        !ok && err.contains("the relay refused the relay token"),
        "{err}"
    );
    std::fs::write(files.join("wrong.key"), "ab".repeat(32)).unwrap();
    let k = with_key("wrong.key");
    let mut args = vec!["status"];
    args.extend(k.iter().map(String::as_str));
    let (ok, _, err) = admin(w, &w.lab.home, &args).await;
    assert!(
        !ok && err.contains("the relay does not know this key"),
        "{err}"
    );
}

/// rcon spellings of docs/etrelay-filter.md, each glued to the password the way the
/// ioquake3 server still runs it (see tests/it/openarena.rs).
const RCON_SPELLINGS: &[&[u8]] = &[
    b"rcon",
    b"RCON",
    b"rCoN",
    b"/**/rcon",
    b"\"rcon\"",
    b"\x07rcon",
    b"\trcon",
    b"\x80rcon",
    b"\xffrcon",
    b"/* x */ \"RcOn\"",
    b"/*/rcon",
];

/// Assertion 3: rcon never reaches the server from the Internet; a ban cuts a player off at
/// once; `sessions` shows the player's real address.
async fn rcon_ban_sessions(w: &World) {
    let packets: Vec<Vec<u8>> = RCON_SPELLINGS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p = s.to_vec();
            p.extend_from_slice(format!("\"{RCON}\" sets e2e_rcon{i} yes").as_bytes());
            udp::oob(&p)
        })
        .collect();
    let answered = w
        .lab
        .internet_rt
        .run(async move {
            let sock = udp::bind(lab::player_ip(66)).await.expect("bind");
            let mut answered = 0;
            for p in &packets {
                answered += udp::exchange(&sock, front(), p, Duration::from_millis(200), S)
                    .await
                    .len();
            }
            answered
        })
        .await;
    assert_eq!(answered, 0, "an rcon was answered through the relay");
    // At home, straight to the server, such a spelling runs (the control)...
    let home = w
        .lab
        .home
        .enter(|| std::net::UdpSocket::bind((lab::HOME_LAN, 0)))
        .expect("enter home")
        .expect("bind");
    home.set_read_timeout(Some(2 * S)).unwrap();
    home.send_to(
        &udp::oob(format!("/**/rcon\"{RCON}\" sets e2e_direct yes").as_bytes()),
        upstream(),
    )
    .unwrap();
    let mut buf = [0u8; 2048];
    assert!(home.recv_from(&mut buf).is_ok(), "no rcon answer at home");
    // ...and none of those sent through the relay did.
    let rules = direct_rules(w).await;
    for i in 0..RCON_SPELLINGS.len() {
        assert!(
            rules.get(format!("e2e_rcon{i}")).is_none(),
            "rcon {i} ran: {rules}"
        );
    }
    let rcon = drops(&metrics(w).await)
        .into_iter()
        .find(|(r, _)| r == "rcon")
        .map_or(0, |(_, n)| n);
    assert!(
        rcon >= RCON_SPELLINGS.len() as u64,
        "rcon drops counted: {rcon}"
    );
    say(format!(
        "internet: {} rcon spellings with the right password through the front: none answered, none ran (the same rcon sent at home runs); front: etrelay_dropped_packets_total{{reason=\"rcon\"}} {rcon}",
        RCON_SPELLINGS.len()
    ));

    // sessions, then a ban.
    let (victim, _) = join(&w.lab, lab::player_ip(20), 2020, 10 * S).await;
    let me = victim.local_addr().expect("address").to_string();
    let (victim, answered, _) = play(&w.lab, victim, 3).await;
    assert!(answered > 0);
    let (ok, table, err) = admin_home(w, &["sessions"]).await;
    assert!(ok && table.contains(&me), "{me} not in {table}{err}");
    let (ok, out, err) = admin_home(w, &["sessions", "--json"]).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("sessions JSON");
    let port = v["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["client"] == me.as_str())
        .map(|s| s["upstream_port"].to_string())
        .unwrap_or_else(|| panic!("{me} not in {out}"));
    assert!(table.lines().any(|l| l.contains(&me) && l.contains(&port)));
    #[rustfmt::skip]
    let ban = ["ban", "198.18.3.20", "--reason", "aimbot", "--duration", "7days"];
    let (ok, out, err) = admin_home(w, &ban).await;
    assert!(ok, "{out}{err}");
    // What the server sent before the ban may still be in the player's socket: drop it, then
    // every packet the player sends from now on goes unanswered.
    let victim = drain(&w.lab, victim).await;
    let (victim, answered, got) = play(&w.lab, victim, 5).await;
    assert_eq!(
        (answered, got),
        (0, 0),
        "the banned player still gets packets"
    );
    assert!(
        challenge_from(w, lab::player_ip(20)).await.is_empty(),
        "answered while banned"
    );
    say("internet: the banned player's next packets get nothing");
    let (ok, table, _) = admin_home(w, &["sessions"]).await;
    assert!(ok && !table.contains(&me), "{table}");
    let (ok, out, _) = admin_home(w, &["bans"]).await;
    assert!(
        ok && out.contains("198.18.3.20") && out.contains("aimbot"),
        "{out}"
    );
    let (ok, _, err) = admin_home(w, &["unban", "198.18.3.20"]).await;
    assert!(ok, "{err}");
    assert_eq!(
        challenge_from(w, lab::player_ip(20)).await.len(),
        1,
        "unbanned"
    );
    say("internet: unbanned, 198.18.3.20 gets its challenge again");
    let (ok, out, _) = admin_home(w, &["bans"]).await;
    assert!(ok && out.contains("no bans"), "{out}");
    drop(victim);
}

/// The answers to one `getchallenge` sent to the front from `ip`.
async fn challenge_from(w: &World, ip: Ipv4Addr) -> Vec<(SocketAddr, Vec<u8>)> {
    w.lab
        .internet_rt
        .run(async move {
            let sock = udp::bind(ip).await.expect("bind");
            let packet = udp::oob(b"getchallenge 1 et");
            udp::exchange(&sock, front(), &packet, S, 2 * S).await
        })
        .await
}

/// The server's rules once the direct rcon's cvar shows (it may take a server frame; at most
/// 5 queries).
async fn direct_rules(w: &World) -> serde_json::Value {
    for _ in 0..5 {
        let rules = quakestat_in(&w.lab.home, upstream()).await["rules"].clone();
        if rules["e2e_direct"] == "yes" {
            return rules;
        }
    }
    panic!("the rcon sent at home did not run");
}

/// Assertion 4: the home link goes down and comes back; the player reconnects.
async fn tunnel_down_and_up(w: &World, player: Player, fig: &mut Figures) -> Player {
    let stopped = w.relay.count("stopped answering");
    let answers = w.relay.count(" answers");
    let flatlines = w
        .master
        .wait_heartbeats("ETFlatline-1", 99, Duration::ZERO)
        .await
        .len();
    let t = Instant::now();
    w.lab.home_link_down().expect("link down");
    say("home router: link wan down (the home connection drops)");
    assert!(
        w.relay
            .wait_count("stopped answering", stopped, 30 * S)
            .await,
        "{}",
        w.relay.text()
    );
    fig.down_to_stopped = t.elapsed();
    let got = w
        .master
        .wait_heartbeats("ETFlatline-1", flatlines + 1, 10 * S)
        .await;
    assert!(got.len() > flatlines, "no flatline");
    assert_eq!(got[flatlines], front(), "the flatline comes from the front");
    fig.down_to_flatline = t.elapsed();
    let player = drain(&w.lab, player).await;
    let (mut player, answered, _) = play(&w.lab, player, 5).await;
    assert_eq!(answered, 0, "in-game packets while the home link is down");
    say(format!(
        "front: probes failed: 'stopped answering' after {} ms, ETFlatline-1 at the master after {} ms; the player gets nothing",
        fig.down_to_stopped.as_millis(),
        fig.down_to_flatline.as_millis()
    ));
    let heartbeats = w
        .master
        .wait_heartbeats("EnemyTerritory-1", 999, Duration::ZERO)
        .await
        .len();

    let t = Instant::now();
    w.lab.home_link_up().expect("link up");
    say("home router: link wan up");
    // The same player, from the same address and port, tries to connect again at once, as a
    // client does: getchallenge every 3 s until answered.
    let rejoin = w.lab.internet_rt.spawn(async move {
        let took = player.join(30 * S, RETRANSMIT).await;
        (player, took)
    });
    assert!(
        w.relay.wait_count(" answers", answers, 30 * S).await,
        "{}",
        w.relay.text()
    );
    fig.up_to_answers = t.elapsed();
    assert!(
        w.master
            .wait_heartbeats("EnemyTerritory-1", heartbeats + 1, 10 * S)
            .await
            .len()
            > heartbeats
    );
    fig.up_to_heartbeat = t.elapsed();
    let (player, took) = rejoin.await.expect("the player's task");
    let took = took.unwrap_or_else(|e| panic!("the player could not reconnect: {e:?}"));
    fig.up_to_join = took;
    let (player, answered, _) = play(&w.lab, player, 5).await;
    assert!(answered > 0, "no in-game packet after the reconnect");
    assert!(w.relay.alive(), "the relay runs");
    let (ok, out, err) = admin_home(w, &["status"]).await;
    assert!(ok && out.contains("up"), "{out}{err}");
    say(format!(
        "front: the server answers again {} ms after the link is back, heartbeat at {} ms, the player reconnected at {} ms; home now at {:?}; the relay never stopped",
        fig.up_to_answers.as_millis(),
        fig.up_to_heartbeat.as_millis(),
        fig.up_to_join.as_millis(),
        w.lab.home_endpoint().ok().flatten()
    ));
    player
}

/// How long the floods last at most (the honest player's 30 rounds take about as long).
const FLOOD_TIME: Duration = Duration::from_secs(4);

/// Assertion 5: floods from many Internet addresses; the honest player plays on, a new one
/// joins.
async fn flood(w: &World, honest: Player, fig: &mut Figures) {
    let (honest, answered, got) = play(&w.lab, honest, 20).await;
    fig.honest_before = (answered, 20, got);
    let before = metrics(w).await;
    let flatlines = w
        .master
        .wait_heartbeats("ETFlatline-1", 99, Duration::ZERO)
        .await
        .len();
    // Spoofed-style floods: 2040 addresses over 8 /24s (in-game junk with every qport,
    // connect without a challenge, getstatus), and getchallenge from one /24.
    let sources: Vec<SocketAddr> = (0..8u8)
        .flat_map(|hi| (1..=255u8).map(move |lo| SocketAddr::from((lab::attacker_ip(hi, lo), 0))))
        .collect();
    let askers: Vec<SocketAddr> = (1..=64u8)
        .map(|lo| SocketAddr::from((lab::attacker_ip(200, lo), 0)))
        .collect();
    let t = Instant::now();
    let floods = w
        .lab
        .internet_rt
        .run(async move {
            let mixed = Flood::start_varied(
                sources,
                front(),
                Box::new(|n| match n % 3 {
                    0 => game_packet(n as u32, n as u16, b"junk junk junk"),
                    1 => udp::oob(
                        format!(
                            "CONNECT \"\\challenge\\{n}\\qport\\{}\\protocol\\71\"",
                            n as u16
                        )
                        .as_bytes(),
                    ),
                    _ => udp::oob(b"getstatus x"),
                }),
                None,
                500_000,
                FLOOD_TIME,
            );
            let challenges = Flood::start(
                askers,
                front(),
                udp::oob(b"getchallenge 1 et"),
                Some(500),
                5_000,
                FLOOD_TIME,
            );
            (mixed, challenges)
        })
        .await;
    let newcomer = {
        let lab = &w.lab;
        async move {
            let (_, took) = join(lab, lab::player_ip(41), 4141, 25 * S).await;
            took
        }
    };
    let honest_play = play(&w.lab, honest, 30);
    let (took, (honest, answered, got)) = tokio::join!(newcomer, honest_play);
    fig.new_join_during = took;
    fig.honest_during = (answered, 30, got);
    let (mixed, challenges) = floods;
    fig.flood_time = t.elapsed().min(FLOOD_TIME);
    fig.flood_sent = mixed.stop() + challenges.stop();
    let (_, answered_after, got) = play(&w.lab, honest, 10).await;
    fig.honest_after = (answered_after, 10, got);
    assert!(
        fig.honest_during.0 * 10 >= fig.honest_during.1 * 9,
        "the honest player lost rounds during the flood: {:?}",
        fig.honest_during
    );
    assert!(answered_after > 0);
    // What the operator sees: the flood counted and dropped by reason, the game server still up
    // for the probe (no false flatline).
    let after = metrics(w).await;
    fig.flood_received = sample(&after, "etrelay_client_packets_total")
        - sample(&before, "etrelay_client_packets_total");
    let was: std::collections::HashMap<String, u64> = drops(&before).into_iter().collect();
    let mut by_reason: Vec<(String, u64)> = drops(&after)
        .into_iter()
        .map(|(r, n)| {
            let d = n - was.get(&r).copied().unwrap_or(0);
            (r, d)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    by_reason.sort_by_key(|b| std::cmp::Reverse(b.1));
    fig.flood_drops = by_reason;
    assert_eq!(
        sample(&after, "etrelay_probe_state"),
        1,
        "the probe saw the server up"
    );
    assert_eq!(
        w.master
            .wait_heartbeats("ETFlatline-1", 99, Duration::ZERO)
            .await
            .len(),
        flatlines,
        "no flatline during the flood"
    );
    assert!(w.relay.alive(), "the relay runs");
    say(format!(
        "internet: attacker sent {} packets from {} addresses; honest player answered {}/{} rounds during it; a new player joined in {} ms",
        fig.flood_sent,
        2040 + 64,
        fig.honest_during.0,
        fig.honest_during.1,
        took.as_millis()
    ));
}

/// "answered/rounds (packets)".
fn rounds((answered, rounds, got): (usize, usize, usize)) -> String {
    format!("{answered}/{rounds} rounds, {got} in-game packets")
}

fn report(fig: &Figures, total: Duration) {
    let ms = |d: Duration| d.as_millis();
    say("figures:");
    for (what, v) in [
        (
            "lab up (4 namespaces, NAT, WireGuard handshake)",
            format!("{} ms", ms(fig.lab_up)),
        ),
        (
            "register -> listed at the master",
            format!("{} ms", ms(fig.listed)),
        ),
        (
            "player join through the relay",
            format!("{} ms", ms(fig.join)),
        ),
        (
            "link down -> 'stopped answering'",
            format!("{} ms", ms(fig.down_to_stopped)),
        ),
        (
            "link down -> ETFlatline-1 at the master",
            format!("{} ms", ms(fig.down_to_flatline)),
        ),
        (
            "link up -> 'answers'",
            format!("{} ms", ms(fig.up_to_answers)),
        ),
        (
            "link up -> heartbeat at the master",
            format!("{} ms", ms(fig.up_to_heartbeat)),
        ),
        (
            "link up -> the player reconnected (retry every 3 s)",
            format!("{} ms", ms(fig.up_to_join)),
        ),
        (
            "flood packets sent",
            format!("{} in {} ms", fig.flood_sent, ms(fig.flood_time)),
        ),
        ("honest player before the flood", rounds(fig.honest_before)),
        ("honest player during the flood", rounds(fig.honest_during)),
        ("honest player after the flood", rounds(fig.honest_after)),
        (
            "flood: datagrams the relay received",
            fig.flood_received.to_string(),
        ),
        (
            "flood: dropped by reason",
            fig.flood_drops
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "new player join during the flood",
            format!("{} ms", ms(fig.new_join_during)),
        ),
        ("whole test", format!("{} ms", ms(total))),
    ] {
        say(format!("  {what:<50} {v}"));
    }
}
