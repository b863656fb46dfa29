//! Known sources keep full service under spoofed floods, with the real binary on loopback: a
//! master (scripted from the protocol facts, dpmaster- and etmaster-style) gets every
//! challenge answered during 4 000 packets/s of spoofed `getstatus`/`getinfo` from 100 /24s
//! and from 10 000 /24s; a player who joined the real OpenArena server before joins again at
//! once (first try) during 2 000 packets/s of spoofed `getchallenge` from 100 /24s, after a
//! restart of the relay; the admin gets one WARN per kind and `GET /server` says since when.
//!
//! The spoofed sources are real 127.x.y.z addresses in 127.200.0.0–127.239.255.255; every
//! honest party is outside that range. Floods are bounded in packets and time. Each test prints
//! `FIGURE …` lines (BENCHMARKS.md quotes them).

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, new_key, ports};
use common::eventually;
use common::single::{SingleRelay, scrape};
use etrelay::proof::fingerprint;
use etrelay_testkit::flood::Flood;
use etrelay_testkit::player::{Dialect, Player, RETRANSMIT};
use etrelay_testkit::udp::oob;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, OpenArena, unique_ip};
use reqwest::Method;

const S: Duration = Duration::from_secs(1);
/// How long each query flood runs.
const FLOOD_FOR: Duration = Duration::from_secs(8);

/// `prefixes` /24s of spoofed sources, `hosts` addresses in each.
fn spoofed(prefixes: u32, hosts: u32) -> Vec<SocketAddr> {
    let mut out = Vec::with_capacity((prefixes * hosts) as usize);
    for h in 0..hosts {
        for p in 0..prefixes {
            let ip = Ipv4Addr::new(127, 200 + (p / 256) as u8, p as u8, 1 + h as u8);
            out.push(SocketAddr::from((ip, 0)));
        }
    }
    out
}

/// A fresh address outside the spoofed range (one of 127.200–239 moved down by 100).
fn honest_ip() -> Ipv4Addr {
    let [a, b, c, d] = unique_ip().octets();
    Ipv4Addr::new(a, if (200..240).contains(&b) { b - 100 } else { b }, c, d)
}

/// The relay binary in front of `upstream`, on an honest address, with `extra` flags.
async fn start_relay(upstream: SocketAddr, extra: &[&str]) -> SingleRelay {
    SingleRelay::start(upstream, honest_ip(), extra).await
}

/// The sum of the samples whose line starts with `prefix` and contains `has`.
fn sum(text: &str, prefix: &str, has: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && l.contains(has))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `getstatus` polls sent by one source during a flood.
const POLLS: u32 = 5;

/// Sends [`POLLS`] `getstatus` from `ip` to `to`, one a second (a browser refreshing a
/// server's line, faster than any does), each sent again once after half a second without an
/// answer, as qstat does (`-retry`, 500 ms apart); how many were answered within their second.
async fn polls(ip: Ipv4Addr, to: SocketAddr) -> u32 {
    let sock = tokio::net::UdpSocket::bind((ip, 0)).await.unwrap();
    let mut buf = vec![0; 4096];
    let mut answered = 0;
    let start = tokio::time::Instant::now();
    for i in 0..POLLS {
        let q = oob(format!("getstatus poll{i}").as_bytes());
        let mut got = false;
        for _try in 0..2 {
            sock.send_to(&q, to).await.unwrap();
            let wait = tokio::time::timeout(S / 2, async {
                loop {
                    let Ok((n, _)) = sock.recv_from(&mut buf).await else {
                        continue;
                    };
                    if buf[..n].starts_with(b"\xff\xff\xff\xffstatusResponse") {
                        return;
                    }
                }
            });
            if wait.await.is_ok() {
                got = true;
                break;
            }
        }
        answered += u32::from(got);
        tokio::time::sleep_until(start + S * (i + 1)).await;
    }
    answered
}

/// A relay in front of a scripted ET server, heartbeating a `style` master every second, listed
/// by it.
async fn listed_relay(style: MasterStyle) -> (FakeEtServer, FakeMaster, SingleRelay) {
    let et = FakeEtServer::start(honest_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(honest_ip(), style).unwrap();
    let masters = master.addr().to_string();
    let relay = start_relay(
        et.addr(),
        &["--masters", &masters, "--heartbeat-interval", "1s"],
    )
    .await;
    assert!(
        master.wait_listed(relay.public, 10 * S).await,
        "listed at the start"
    );
    (et, master, relay)
}

/// Runs `flood` for [`FLOOD_FOR`] while `master` checks the relay every second; returns the
/// challenges sent during it and how many were answered.
async fn master_under_flood(style: MasterStyle, sources: Vec<SocketAddr>, label: &str) {
    let (_et, master, relay) = listed_relay(style).await;
    // A player who joined before the flood; a browser the relay never saw.
    let player = honest_ip();
    Player::bind(player, relay.public, 700, Dialect::Et)
        .await
        .unwrap()
        .join(5 * S, RETRANSMIT)
        .await
        .expect("the player joins");
    let browser = honest_ip();
    let before = scrape(relay.metrics).await;
    let (c0, a0) = (master.challenges(), master.answered());
    let prefixes = {
        let mut p: Vec<[u8; 3]> = sources
            .iter()
            .map(|s| match s.ip() {
                std::net::IpAddr::V4(a) => [a.octets()[0], a.octets()[1], a.octets()[2]],
                std::net::IpAddr::V6(_) => [0; 3],
            })
            .collect();
        p.sort_unstable();
        p.dedup();
        p.len()
    };
    let rate = 4_000;
    let flood = Flood::start_varied(
        sources,
        relay.public,
        Box::new(|n| {
            if n % 2 == 0 {
                oob(b"getstatus x")
            } else {
                oob(b"getinfo x")
            }
        }),
        Some(rate),
        u64::from(rate) * FLOOD_FOR.as_secs(),
        FLOOD_FOR + 5 * S,
    );
    let t0 = Instant::now();
    assert!(eventually(5 * S, || flood.sent() >= u64::from(rate)).await);
    let (proven_polls, stranger_polls) =
        tokio::join!(polls(player, relay.public), polls(browser, relay.public));
    let mut flood_since = 0;
    while flood.sent() < u64::from(rate) * FLOOD_FOR.as_secs() && t0.elapsed() < FLOOD_FOR + 5 * S {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if flood_since == 0 && t0.elapsed() > 2 * S {
            flood_since = sum(&scrape(relay.metrics).await, "etrelay_flood_since", "");
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let sent = flood.stop();
    let challenges = master.challenges() - c0;
    // The last challenge's answer may still be on its way.
    let all = eventually(5 * S, || master.answered() - a0 >= challenges).await;
    let answered = master.answered() - a0;
    let text = scrape(relay.metrics).await;
    let delta = |name: &str, has: &str| sum(&text, name, has) - sum(&before, name, has);
    let (inb, out) = (
        delta("etrelay_client_bytes_total", ""),
        delta("etrelay_reply_bytes_total", ""),
    );
    let dropped = delta("etrelay_dropped_packets_total", "reason=\"reflection\"")
        + delta("etrelay_dropped_packets_total", "reason=\"limiter\"");
    println!(
        "FIGURE master under a query flood ({label}): {sent} spoofed getstatus/getinfo from \
         {prefixes} /24s in {secs:.1} s ({:.0}/s); master challenges {challenges}, answered {answered}; \
         master queries on their lane {}; flood drops {dropped}; bytes out/in {:.3}; getstatus \
         answered to a player who joined before {proven_polls}/{POLLS}, to a new browser \
         {stranger_polls}/{POLLS}",
        sent as f64 / secs,
        delta("etrelay_master_queries_total", ""),
        out as f64 / inb.max(1) as f64
    );
    assert!(challenges >= 4, "{challenges} challenges in {secs:.1} s");
    assert_eq!(
        proven_polls, POLLS,
        "the proven player's polls all answered"
    );
    assert!(all, "answered {answered} of {challenges} challenges");
    assert!(
        master.listed().contains(&relay.public),
        "the relay stays listed"
    );
    assert!(dropped > sent / 2, "the flood met the budget: {dropped}");
    assert!(out <= inb, "{out} B out for {inb} B in");
    assert!(flood_since > 0, "etrelay_flood_since set during the flood");
    let warns = relay.warns("query flood: the answer budget dropped");
    assert_eq!(warns.len(), 1, "one WARN in under a minute: {warns:?}");
    assert!(warns[0].chars().any(|c| c.is_ascii_digit()), "{}", warns[0]);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpmaster_style_master_gets_every_challenge_answered_under_a_flood_from_100_prefixes() {
    let _flood = common::one_flood_at_a_time().await;
    master_under_flood(MasterStyle::Classic, spoofed(100, 40), "dpmaster-style").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpmaster_style_master_gets_every_challenge_answered_under_a_flood_from_10_000_prefixes()
{
    let _flood = common::one_flood_at_a_time().await;
    master_under_flood(MasterStyle::Classic, spoofed(10_000, 1), "dpmaster-style").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etmaster_style_master_gets_every_challenge_answered_under_a_flood_from_100_prefixes() {
    let _flood = common::one_flood_at_a_time().await;
    master_under_flood(MasterStyle::EtMaster, spoofed(100, 40), "etmaster-style").await;
}

/// Joins `to` from `ip` as a real client would (each step sent again every 3 s), within
/// `within`.
async fn join(ip: Ipv4Addr, to: SocketAddr, qport: u16, within: Duration) -> Option<Duration> {
    let mut p = Player::bind(ip, to, qport, Dialect::openarena())
        .await
        .unwrap();
    p.join(within, RETRANSMIT).await.ok()
}

fn proven_file(dir: &Path) -> std::path::PathBuf {
    dir.join("proven-0.json")
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_player_joins_openarena_at_once_under_a_spoofed_getchallenge_flood() {
    let _flood = common::one_flood_at_a_time().await;
    OpenArena::require();
    let oa = OpenArena::start(honest_ip(), "secret").expect("start openarena-server");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().display().to_string();
    let args = ["--game", "q3", "--masters", "", "--state-dir", &state];
    let returning = honest_ip();

    // The player joins once; the relay restarts (SIGTERM: what it learnt is written).
    let relay = start_relay(oa.addr(), &args).await;
    assert!(
        join(returning, relay.public, 600, 10 * S).await.is_some(),
        "the first join"
    );
    relay.stop().await;
    let file = std::fs::read_to_string(proven_file(dir.path())).expect("proven sources kept");
    assert!(file.contains(&returning.to_string()), "{file}");

    let relay = start_relay(oa.addr(), &args).await;
    let text = scrape(relay.metrics).await;
    assert_eq!(sum(&text, "etrelay_proven_sources", ""), 1, "{text}");
    let rate = 2_000;
    let flood = Flood::start(
        spoofed(100, 40),
        relay.public,
        oob(b"getchallenge 1 Quake3Arena"),
        Some(rate),
        u64::from(rate) * 20,
        Duration::from_secs(20),
    );
    // The flood has spent the pace before anyone joins.
    assert!(eventually(5 * S, || flood.sent() >= u64::from(rate)).await);
    let again = join(returning, relay.public, 601, 10 * S).await;
    let newcomer = join(honest_ip(), relay.public, 602, 15 * S).await;
    let sent = flood.stop();
    let text = scrape(relay.metrics).await;
    let dropped = sum(&text, "etrelay_dropped_packets_total", "reason=\"join_");
    let shown = |d: Option<Duration>| d.map_or("no join in 15 s".into(), |d| format!("{d:.2?}"));
    println!(
        "FIGURE returning player under a getchallenge flood: {sent} spoofed getchallenge from \
         100 /24s at {rate}/s through the relay to OpenArena; returning player joined in {}; \
         a new player: {}; join drops {dropped}; proven joins {}",
        shown(again),
        shown(newcomer),
        sum(&text, "etrelay_proven_joins_total", "")
    );
    let again = again.expect("the returning player joins");
    assert!(again <= S, "first try within 1 s: {again:?}");
    // The flood costs the server nothing (the relay answers it), and the admin is told once.
    let warns = relay.warns("challenge flood");
    assert_eq!(warns.len(), 1, "one WARN in under a minute: {warns:?}");
    assert!(
        sum(&text, "etrelay_challenges_answered_total", "") >= u64::from(rate),
        "{text}"
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_server_says_since_when_a_query_flood_goes_on() {
    let _flood = common::one_flood_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("state"), &ports(1), &[]).await;
    let key = new_key();
    let et = FakeEtServer::start(honest_ip(), FakeEtConfig::default()).unwrap();
    et.set_cvar("etrelay_proof", &fingerprint(&key));
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(status, 201, "{body}");
    let (_, calm) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(calm["under_flood_since"], serde_json::Value::Null, "{calm}");
    assert_eq!(calm["floods"], serde_json::json!([]));
    let flood = Flood::start(
        spoofed(100, 10),
        d.public(27960),
        oob(b"getstatus"),
        Some(4_000),
        40_000,
        Duration::from_secs(10),
    );
    let t0 = Instant::now();
    let mut me = serde_json::Value::Null;
    while t0.elapsed() < 10 * S {
        tokio::time::sleep(Duration::from_millis(250)).await;
        me = d.call(Method::GET, "/server", &key, None).await.1;
        if me["under_flood_since"].is_u64() {
            break;
        }
    }
    flood.stop();
    assert!(
        me["under_flood_since"].as_u64().unwrap_or(0) > 1_700_000_000,
        "{me}"
    );
    let floods = me["floods"].as_array().cloned().unwrap_or_default();
    assert!(
        floods
            .iter()
            .any(|f| f["kind"] == "reflection" && f["dropped"].as_u64() >= Some(20)),
        "{me}"
    );
}

/// `getinfo` spoofed from the master's own address (other ports of its IP) at `rate` a second
/// while it checks the relay after each heartbeat (every second here): the master's checks,
/// which come right after the relay's heartbeats, fall in the windows the relay keeps for them;
/// what the spoofing makes the relay send that address stays within the lane's bound.
async fn master_spoofed(style: MasterStyle, rate: u32) {
    let (_et, master, relay) = listed_relay(style).await;
    let ip = match master.addr().ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => unreachable!(),
    };
    let sources: Vec<SocketAddr> = (0..200)
        .map(|i| SocketAddr::from((ip, 30_000 + i)))
        .collect();
    let before = scrape(relay.metrics).await;
    let (c0, a0) = (master.challenges(), master.answered());
    let flood_for = 10 * S;
    let flood = Flood::start(
        sources,
        relay.public,
        oob(b"getinfo spoofed"),
        Some(rate),
        u64::from(rate) * flood_for.as_secs(),
        flood_for + 5 * S,
    );
    let t0 = Instant::now();
    while flood.sent() < u64::from(rate) * flood_for.as_secs() && t0.elapsed() < flood_for + 5 * S {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let sent = flood.stop();
    let challenges = master.challenges() - c0;
    eventually(3 * S, || master.answered() - a0 >= challenges).await;
    let answered = master.answered() - a0;
    let text = scrape(relay.metrics).await;
    let out =
        sum(&text, "etrelay_reply_bytes_total", "") - sum(&before, "etrelay_reply_bytes_total", "");
    // Per second: a window (256 KiB) per heartbeat (one a second here), and the bucket (4 a
    // second) of answers of at most 1 400 bytes.
    let bound = (256.0 * 1024.0 + 4.0 * 1400.0) * secs + 16.0 * 1400.0;
    println!(
        "FIGURE {style:?} master spoofed: {sent} getinfo from its IP in {secs:.1} s ({:.0}/s); \
         master challenges {challenges}, answered {answered}; sent to the master's address \
         {:.0} B/s (bound with a heartbeat a second {:.0} B/s; with the default 5 min \
         interval, 256 KiB per 300 s plus 4 answers a second); lane answers {}, refused {}, \
         heartbeats {}",
        sent as f64 / secs,
        out as f64 / secs,
        bound / secs,
        sum(&text, "etrelay_master_queries_total", "")
            - sum(&before, "etrelay_master_queries_total", ""),
        sum(
            &text,
            "etrelay_dropped_packets_total",
            "reason=\"master_limit\""
        ) - sum(
            &before,
            "etrelay_dropped_packets_total",
            "reason=\"master_limit\""
        ),
        sum(&text, "etrelay_heartbeats_total", "") - sum(&before, "etrelay_heartbeats_total", ""),
    );
    assert!(challenges >= 5, "{challenges} challenges");
    assert!(
        answered * 10 >= challenges * 9,
        "{answered} of {challenges} checks answered"
    );
    assert!(
        master.listed().contains(&relay.public),
        "the relay stays listed"
    );
    assert!((out as f64) <= bound, "{out} B to the master's address");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpmaster_style_master_checks_the_relay_through_500_spoofed_getinfo_a_second_from_its_address()
 {
    let _flood = common::one_flood_at_a_time().await;
    master_spoofed(MasterStyle::Classic, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpmaster_style_master_checks_the_relay_through_5000_spoofed_getinfo_a_second_from_its_address()
 {
    let _flood = common::one_flood_at_a_time().await;
    master_spoofed(MasterStyle::Classic, 5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etmaster_style_master_checks_the_relay_through_5000_spoofed_getinfo_a_second_from_its_address()
 {
    let _flood = common::one_flood_at_a_time().await;
    master_spoofed(MasterStyle::EtMaster, 5_000).await;
}

/// A relay started during 20 000 spoofed `getchallenge` a second is listed by a master at its
/// first heartbeat: the flood reaches neither the server nor its budget, so the relay's own
/// query (its probe, the cache refresh of the master's check) is answered at once.
#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_during_a_getchallenge_flood_is_listed_at_its_first_heartbeat() {
    let _flood = common::one_flood_at_a_time().await;
    OpenArena::require();
    let oa = OpenArena::start(honest_ip(), "secret").expect("start openarena-server");
    let master = FakeMaster::start(honest_ip(), MasterStyle::Classic).unwrap();
    // The relay's address, known before it starts (the flood is aimed at it first).
    let public = std::net::UdpSocket::bind((honest_ip(), 0))
        .and_then(|s| s.local_addr())
        .unwrap();
    let rate = 20_000;
    let flood = Flood::start(
        spoofed(10_000, 1),
        public,
        oob(b"getchallenge 1 Quake3Arena"),
        Some(rate),
        u64::from(rate) * 30,
        30 * S,
    );
    assert!(eventually(5 * S, || flood.sent() >= u64::from(rate)).await);
    let masters = master.addr().to_string();
    let relay = SingleRelay::start_on(
        oa.addr(),
        public,
        &[
            "--game",
            "q3",
            "--masters",
            &masters,
            "--heartbeat-interval",
            "5m",
        ],
    )
    .await;
    let listed = master.wait_listed(relay.public, 5 * S).await;
    let sent = flood.stop();
    let text = scrape(relay.metrics).await;
    println!(
        "FIGURE relay started during {rate} spoofed getchallenge/s ({sent} sent): listed at its \
         first heartbeat: {listed}; cache refreshes {}, answered {}; heartbeats {}; server log \
         rate limits {}",
        sum(&text, "etrelay_cache_refreshes_total", ""),
        sum(&text, "etrelay_cache_refresh_answers_total", ""),
        sum(&text, "etrelay_heartbeats_total", ""),
        oa.log().matches("rate limit").count()
    );
    assert!(listed, "listed by the first heartbeat's check");
    assert_eq!(
        sum(&text, "etrelay_heartbeats_total", ""),
        1,
        "one heartbeat so far"
    );
    assert_eq!(
        sum(&text, "etrelay_cache_refresh_answers_total", ""),
        sum(&text, "etrelay_cache_refreshes_total", ""),
        "every refresh answered"
    );
    relay.stop().await;
}
