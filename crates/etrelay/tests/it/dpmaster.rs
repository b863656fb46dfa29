//! The relay binary in front of a **real dpmaster** (2.x), on loopback only: the figures
//! `tests/it/known_sources.rs` measures with a scripted master, again with the real one.
//!
//! dpmaster is not packaged in Debian: it is built from its public source outside this
//! repository and named by `ETRELAY_DPMASTER` (`etrelay_testkit::dpmaster`). The tests are
//! ignored by default and run by `scripts/bench-masters`; run without `ETRELAY_DPMASTER`, or
//! not as root (the spoofed datagrams need a raw socket), each fails saying what it needs.
//!
//! * `getinfo` spoofed from dpmaster's own IP **and port** (27950, through a raw socket: the
//!   relay's answers really go to dpmaster's socket, as in the real attack) at 500/s and at
//!   5 000/s, the relay heartbeating every 2 s: dpmaster's checks of the relay and how many it
//!   accepted, whether the relay stays listed, and what the relay sent (its answers to the
//!   flood go to dpmaster) against the documented bound;
//! * a relay started during 20 000 spoofed `getchallenge`/s from 10 000 /24s in front of the
//!   real OpenArena server, listed by dpmaster at its first heartbeat;
//! * a relay listening on `[::]` (dual-stack), listed by dpmaster (on an IPv4 address) at
//!   its first heartbeat, at the relay's IPv4 side.
//!
//! The spoofed `getchallenge` sources are real 127.x.y.z addresses in
//! 127.200.0.0–127.239.255.255; every honest party is outside that range. Every flood is
//! bounded in packets and time. Each test prints `FIGURE …` lines.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use common::single::{SingleRelay, scrape};
use common::{eventually, metrics_address, relaying_address, spawn_etrelay, wait_for_line};
use etrelay_testkit::dpmaster::Dpmaster;
use etrelay_testkit::flood::Flood;
use etrelay_testkit::spoof::{self, SpoofFlood};
use etrelay_testkit::udp::oob;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, OpenArena, unique_ip};

const S: Duration = Duration::from_secs(1);
/// How long each spoofed `getinfo` flood runs.
const FLOOD_FOR: Duration = Duration::from_secs(20);
/// The relay's answers to one master per heartbeat window at most (`server/lanes.rs`).
const WINDOW_BYTES: f64 = 256.0 * 1024.0;
/// Outside the windows: 16 answers at once, then 4 a second, of at most 1 400 bytes.
const BUCKET_BURST: f64 = 16.0 * 1400.0;
const BUCKET_RATE: f64 = 4.0 * 1400.0;
/// The heartbeat interval of the spoofing tests.
const HEARTBEAT_EVERY: f64 = 2.0;

/// Fails unless `ETRELAY_DPMASTER` names a binary and this process is root.
fn required() {
    assert!(
        Dpmaster::from_env().is_some(),
        "ETRELAY_DPMASTER=<dpmaster binary> is needed (dpmaster is not packaged in Debian: build \
         it from its source outside the repository); run scripts/bench-masters"
    );
    if let Err(e) = spoof::available() {
        panic!("root is needed: {e}");
    }
}

/// dpmaster on a fresh honest address.
fn dpmaster() -> Dpmaster {
    tokio::task::block_in_place(|| Dpmaster::start(honest_ip())).expect("start dpmaster")
}

/// A fresh address outside the spoofed range (one of 127.200–239 moved down by 100).
fn honest_ip() -> Ipv4Addr {
    let [a, b, c, d] = unique_ip().octets();
    Ipv4Addr::new(a, if (200..240).contains(&b) { b - 100 } else { b }, c, d)
}

/// `prefixes` /24s of spoofed sources, one address in each.
fn spoofed(prefixes: u32) -> Vec<SocketAddr> {
    (0..prefixes)
        .map(|p| {
            let ip = Ipv4Addr::new(127, 200 + (p / 256) as u8, p as u8, 1);
            SocketAddr::from((ip, 0))
        })
        .collect()
}

fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => panic!("{a}: an IPv4 address was expected"),
    }
}

/// The sum of the samples whose line starts with `prefix` and contains `has`.
fn sum(text: &str, prefix: &str, has: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && l.contains(has))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Whether dpmaster lists `server` for `protocol` now.
fn is_listed(dpm: &Dpmaster, protocol: u32, server: SocketAddr) -> bool {
    tokio::task::block_in_place(|| dpm.listed(protocol)).contains(&server)
}

/// Waits until dpmaster lists `server` for `protocol`, at most until `deadline`; how long
/// after `since` it did.
async fn listed_within(
    dpm: &Dpmaster,
    protocol: u32,
    server: SocketAddr,
    since: Instant,
    deadline: Instant,
) -> Option<Duration> {
    loop {
        if is_listed(dpm, protocol, server) {
            return Some(since.elapsed());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What dpmaster and the relay's metrics said before a flood.
struct Before {
    metrics: String,
    checks: usize,
    accepted: usize,
    responses: usize,
    drops: u64,
}

impl Before {
    async fn take(dpm: &Dpmaster, relay: &SingleRelay) -> Before {
        Before {
            metrics: scrape(relay.metrics).await,
            checks: dpm.checks_for(relay.public),
            accepted: dpm.accepted_from(relay.public),
            responses: dpm.responses_from(relay.public),
            drops: dpm.socket_drops().unwrap_or(0),
        }
    }
}

/// `getinfo <random>` spoofed from dpmaster's own IP and port at `rate` a second for
/// [`FLOOD_FOR`], the relay heartbeating it every 2 s.
async fn spoofed_from_dpmaster(rate: u32) {
    required();
    let dpm = dpmaster();
    let et = FakeEtServer::start(honest_ip(), FakeEtConfig::default()).unwrap();
    let masters = dpm.addr().to_string();
    let relay = SingleRelay::start(
        et.addr(),
        honest_ip(),
        &["--masters", &masters, "--heartbeat-interval", "2s"],
    )
    .await;
    let start = Instant::now();
    assert!(
        listed_within(&dpm, 84, relay.public, start, start + 10 * S)
            .await
            .is_some(),
        "listed at the start"
    );
    let before = Before::take(&dpm, &relay).await;
    let flood = SpoofFlood::start(
        vec![v4(dpm.addr())],
        v4(relay.public),
        Box::new(|_| oob(format!("getinfo {:08x}", rand::random::<u32>()).as_bytes())),
        Some(rate),
        u64::from(rate) * FLOOD_FOR.as_secs(),
        FLOOD_FOR + 5 * S,
    )
    .expect("a raw socket (root)");
    let t0 = Instant::now();
    // Whether the relay is listed, asked every second during the flood.
    let (mut asked, mut listed) = (0, 0);
    while !flood.finished() {
        tokio::time::sleep(S).await;
        asked += 1;
        listed += u32::from(is_listed(&dpm, 84, relay.public));
    }
    let secs = t0.elapsed().as_secs_f64();
    let sent = flood.stop();
    let checks = dpm.checks_for(relay.public) - before.checks;
    // The last check's answer may still be on its way.
    eventually(3 * S, || {
        dpm.accepted_from(relay.public) - before.accepted >= checks
    })
    .await;
    let accepted = dpm.accepted_from(relay.public) - before.accepted;
    let responses = dpm.responses_from(relay.public) - before.responses;
    let drops = dpm.socket_drops().unwrap_or(0) - before.drops;
    let listed_after = is_listed(&dpm, 84, relay.public);
    let text = scrape(relay.metrics).await;
    let delta = |name: &str, has: &str| sum(&text, name, has) - sum(&before.metrics, name, has);
    let out = delta("etrelay_reply_bytes_total", "");
    let heartbeats = delta("etrelay_heartbeats_total", "");
    // A window per heartbeat (and the one open when the flood began), and the bucket.
    let bound = WINDOW_BYTES * (heartbeats + 1) as f64 + BUCKET_RATE * secs + BUCKET_BURST;
    let documented = WINDOW_BYTES / HEARTBEAT_EVERY + BUCKET_RATE;
    println!(
        "FIGURE real dpmaster, getinfo spoofed from its own IP and port ({}): {sent} in {secs:.1} \
         s ({:.0}/s); dpmaster's checks of the relay {checks}, accepted {accepted} ({:.0} %); \
         infoResponses dpmaster got from the relay {responses}, refused {}, dropped by its \
         full socket buffer {drops}; listed (getservers 84) at {listed}/{asked} polls during \
         the flood, after it: {listed_after}; the relay sent {:.0} B/s (bound at {heartbeats} \
         heartbeats {:.0} B/s; documented with a heartbeat every 2 s {documented:.0} B/s); \
         lane answers {}, refused {}",
        dpm.addr(),
        sent as f64 / secs,
        100.0 * accepted as f64 / checks.max(1) as f64,
        responses - accepted,
        out as f64 / secs,
        bound / secs,
        delta("etrelay_master_queries_total", ""),
        delta("etrelay_dropped_packets_total", "reason=\"master_limit\""),
    );
    assert!(checks >= 5, "{checks} checks in {secs:.1} s");
    assert!(
        accepted * 10 >= checks * 9,
        "{accepted} of {checks} checks accepted"
    );
    assert!(listed_after, "the relay stays listed");
    assert!(
        (out as f64) <= bound,
        "{out} B sent, bound {bound:.0} B in {secs:.1} s"
    );
    relay.stop().await;
}

#[ignore = "needs a real dpmaster: ETRELAY_DPMASTER=<binary> (not packaged in Debian); run by scripts/bench-masters"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_dpmaster_checks_the_relay_through_500_getinfo_a_second_spoofed_from_its_own_address()
 {
    spoofed_from_dpmaster(500).await;
}

#[ignore = "needs a real dpmaster: ETRELAY_DPMASTER=<binary> (not packaged in Debian); run by scripts/bench-masters"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_dpmaster_checks_the_relay_through_5000_getinfo_a_second_spoofed_from_its_own_address()
 {
    spoofed_from_dpmaster(5_000).await;
}

/// A relay started during 20 000 spoofed `getchallenge` a second from 10 000 /24s in front of
/// the real OpenArena server is listed by dpmaster at its first heartbeat.
#[ignore = "needs a real dpmaster: ETRELAY_DPMASTER=<binary> (not packaged in Debian); run by scripts/bench-masters"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_during_a_getchallenge_flood_is_listed_by_a_real_dpmaster_at_its_first_heartbeat()
 {
    required();
    OpenArena::require();
    let oa = OpenArena::start(honest_ip(), "secret").expect("start openarena-server");
    let dpm = dpmaster();
    // The relay's address, known before it starts (the flood is aimed at it first).
    let public = std::net::UdpSocket::bind((honest_ip(), 0))
        .and_then(|s| s.local_addr())
        .unwrap();
    let rate = 20_000;
    let flood = Flood::start(
        spoofed(10_000),
        public,
        oob(b"getchallenge 1 Quake3Arena"),
        Some(rate),
        u64::from(rate) * 30,
        30 * S,
    );
    assert!(eventually(5 * S, || flood.sent() >= u64::from(rate)).await);
    let (sent0, t0) = (flood.sent(), Instant::now());
    let masters = dpm.addr().to_string();
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
    let listed = listed_within(&dpm, 71, relay.public, t0, t0 + 5 * S).await;
    let (sent, secs) = (flood.sent() - sent0, t0.elapsed().as_secs_f64());
    let total = flood.stop();
    let text = scrape(relay.metrics).await;
    let shown = listed.map_or("not in 5 s".into(), |d| format!("in {d:.2?}"));
    println!(
        "FIGURE real dpmaster, relay started during spoofed getchallenge from 10 000 /24s \
         ({:.0}/s while it started, {total} in all) in front of OpenArena: listed (getservers \
         71) {shown} after its start; heartbeats {} (dpmaster got {}), dpmaster's checks {}, \
         accepted {}; cache refreshes {}, answered {}; challenges the relay answered {}; \
         server log rate limits {}",
        sent as f64 / secs,
        sum(&text, "etrelay_heartbeats_total", ""),
        dpm.heartbeats_from(relay.public),
        dpm.checks_for(relay.public),
        dpm.accepted_from(relay.public),
        sum(&text, "etrelay_cache_refreshes_total", ""),
        sum(&text, "etrelay_cache_refresh_answers_total", ""),
        sum(&text, "etrelay_challenges_answered_total", ""),
        oa.log().matches("rate limit").count()
    );
    let listed = listed.expect("listed by dpmaster");
    assert!(listed <= 3 * S, "listed {listed:?} after the start");
    assert_eq!(
        dpm.heartbeats_from(relay.public),
        1,
        "at the first heartbeat"
    );
    relay.stop().await;
}

/// A relay listening on `[::]` (both families), dpmaster on an IPv4 address: the relay's
/// heartbeat leaves from its IPv4 side (127.0.0.1, the kernel's source for 127.0.0.0/8), and
/// dpmaster lists it there at its first heartbeat.
#[ignore = "needs a real dpmaster: ETRELAY_DPMASTER=<binary> (not packaged in Debian); run by scripts/bench-masters"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_relay_is_listed_by_a_real_dpmaster_on_ipv4_at_its_first_heartbeat() {
    required();
    let dpm = dpmaster();
    let et = FakeEtServer::start(honest_ip(), FakeEtConfig::default()).unwrap();
    // A port free on both families (a dual-stack socket holds it on both).
    let port = std::net::UdpSocket::bind("[::]:0")
        .and_then(|s| s.local_addr())
        .unwrap()
        .port();
    let args: Vec<String> = [
        et.addr().to_string(),
        "--allow-loopback-upstream".into(),
        "--listen".into(),
        format!("[::]:{port}"),
        "--metrics".into(),
        format!("{}:0", honest_ip()),
        "--masters".into(),
        dpm.addr().to_string(),
        "--heartbeat-interval".into(),
        "5m".into(),
    ]
    .into();
    let t0 = Instant::now();
    let (child, log, public) = spawn_etrelay(&args, relaying_address, 10 * S).await;
    let metrics = wait_for_line(&log, metrics_address, 10 * S, "metrics").await;
    let relay = SingleRelay {
        child,
        log,
        public,
        metrics,
    };
    let v4_side = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let listed = listed_within(&dpm, 84, v4_side, t0, t0 + 5 * S).await;
    let text = scrape(relay.metrics).await;
    let shown = listed.map_or("not in 5 s".into(), |d| format!("in {d:.2?}"));
    println!(
        "FIGURE real dpmaster on {}, relay on {public}: listed at {v4_side} (getservers 84) \
         {shown} after its start; heartbeats {} (dpmaster got {}), dpmaster's checks {}, \
         accepted {}; dpmaster's list {:?}",
        dpm.addr(),
        sum(&text, "etrelay_heartbeats_total", ""),
        dpm.heartbeats_from(v4_side),
        dpm.checks_for(v4_side),
        dpm.accepted_from(v4_side),
        tokio::task::block_in_place(|| dpm.listed(84)),
    );
    let listed = listed.expect("listed by dpmaster at the relay's IPv4 side");
    assert!(listed <= 3 * S, "listed {listed:?} after the start");
    assert_eq!(dpm.heartbeats_from(v4_side), 1, "at the first heartbeat");
    relay.stop().await;
}
