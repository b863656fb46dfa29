//! The relay under attack (2), as a real process: a control API that cannot be held open,
//! bans that bite on a dual-stack socket, no loops, start-ups on damaged state, and ban
//! stores that scale. Figures are printed as `FIGURE …` lines (`scripts/bench-attack`).

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, TOKEN, new_key};
use common::*;
use etrelay::proof::{fingerprint, key_hash};
use etrelay_testkit::player::Dialect;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, udp, unique_ip};
use reqwest::Method;
use serde_json::json;
use tokio::io::AsyncWriteExt;

const S: Duration = Duration::from_secs(1);

fn proven_server(key: &str) -> FakeEtServer {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_cvar("etrelay_proof", &fingerprint(key));
    et
}

/// Raises this test process's soft descriptor limit to `want` (within the hard limit), with
/// util-linux's `prlimit` on our own PID.
fn raise_own_nofile(want: u64) {
    let pid = std::process::id().to_string();
    let ok = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={want}:")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "prlimit could not raise this process's RLIMIT_NOFILE to {want}"
    );
}

/// Opens `n` connections to `to` from `from`, in bounded waves; the slow ones send a request
/// head one byte at a time (one byte per 200 ms, for at most `hold`).
async fn attackers(
    from: Ipv4Addr,
    to: SocketAddr,
    n: usize,
    hold: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + 20 * S;
    for i in 0..n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "connecting took too long"
        );
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((from, 0))).unwrap();
        let Ok(Ok(mut stream)) = tokio::time::timeout(2 * S, sock.connect(to)).await else {
            continue;
        };
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                tokio::time::sleep(hold).await; // idle
                return;
            }
            let head = b"PUT /server HTTP/1.1\r\nHost: x\r\n";
            let end = tokio::time::Instant::now() + hold;
            for b in head.iter().cycle() {
                if tokio::time::Instant::now() >= end || stream.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    tasks
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_control_connections_hold_nothing() {
    const ATTACK: usize = 4_200;
    const NOFILE: u64 = 600;
    raise_own_nofile(ATTACK as u64 + 1_000);
    let dir = tempfile::tempdir().unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let m = master.addr().to_string();
    let ip = unique_ip();
    let nofile = format!("--nofile={NOFILE}:{NOFILE}");
    let d = Daemon::launch_under(
        &["prlimit", &nofile, "--"],
        &ip.to_string(),
        ip,
        &dir.path().join("state"),
        &[27960, 27961],
        &format!("{ip}:0"),
        &["--masters", &m],
    )
    .ready(30 * S)
    .await;
    assert!(d.logged("sessions capped at"), "{}", d.log_text());
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), None).await.0, 201);
    assert!(master.wait_listed(d.public(27960), 10 * S).await);

    let started = Instant::now();
    let held = attackers(unique_ip(), d.control, ATTACK, 15 * S).await;
    println!(
        "FIGURE control attack: {} of {ATTACK} connections opened in {} ms",
        held.len(),
        started.elapsed().as_millis()
    );
    assert!(
        held.len() >= ATTACK * 9 / 10,
        "only {} connected",
        held.len()
    );
    let pid = d.child.id().unwrap();
    let fds = open_fds(pid);
    println!("FIGURE control attack: the relay holds {fds} descriptors (limit {NOFILE})");
    assert!(fds as u64 <= NOFILE, "{fds} descriptors");

    // A legitimate admin on another address is answered within 1 s.
    let admin = reqwest::Client::builder()
        .local_address(IpAddr::V4(unique_ip()))
        .timeout(5 * S)
        .build()
        .unwrap();
    let t = Instant::now();
    let r = admin
        .get(d.url("/server"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let api = t.elapsed();
    assert_eq!(r.status(), 200);
    println!(
        "FIGURE control attack: a legitimate GET /server answered in {:.1} ms",
        api.as_secs_f64() * 1e3
    );
    assert!(api < S, "{api:?}");

    // New UDP sessions still open.
    let player = client().await;
    let t = Instant::now();
    player
        .send_to(&udp::oob(b"getchallenge"), d.public(27960))
        .await
        .unwrap();
    let mut buf = [0u8; 2048];
    let got = tokio::time::timeout(2 * S, player.recv_from(&mut buf)).await;
    assert!(got.is_ok_and(|r| r.is_ok()), "{}", d.log_text());
    println!(
        "FIGURE control attack: a new session answered in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    // The refusals are logged, rate-limited.
    let refusal_lines = d
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("refused"))
        .count();
    assert!((1..=3).contains(&refusal_lines), "{refusal_lines} lines");

    // SIGTERM: out within the stated bound, flatline sent, while the attack goes on.
    let mut child = d.child;
    let t = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(10 * S, child.wait())
        .await
        .expect("exits")
        .unwrap();
    let stop_ms = t.elapsed().as_millis();
    println!("FIGURE control attack: SIGTERM to exit in {stop_ms} ms");
    assert!(status.success());
    assert!(stop_ms < 3_000, "{stop_ms} ms");
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 2 * S).await,
        vec![SocketAddr::from((ip, 27960))]
    );
    for h in held {
        h.abort();
    }
}

#[tokio::test]
async fn bans_bite_on_a_dual_stack_socket() {
    // `--bind ::` takes every address: ports apart from the other tests' 27960….
    let ports = [31960, 31961];
    let dir = tempfile::tempdir().unwrap();
    let launch = Daemon::launch_under(
        &[],
        "::",
        Ipv4Addr::LOCALHOST,
        &dir.path().join("state"),
        &ports,
        &format!("{}:0", unique_ip()),
        &[],
    );
    let d = launch.ready(30 * S).await;
    let key = new_key();
    let et = proven_server(&key);
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(status, 201, "{body}");
    // The same server spelt as an IPv4-mapped address is the same server: a takeover, not a
    // second port.
    let mapped = format!("[::ffff:{}]:{}", et.addr().ip(), et.addr().port());
    let r = d
        .http
        .put(d.url("/server"))
        .bearer_auth(TOKEN)
        .json(&json!({"key": key, "upstream": mapped}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (body["port"].as_u64(), body["upstream"].as_str()),
        (Some(31960), Some(et.addr().to_string().as_str()))
    );

    for (i, spelling) in ["plain", "mapped"].iter().enumerate() {
        let public = SocketAddr::from((Ipv4Addr::LOCALHOST, ports[0]));
        // A client joins through the dual-stack socket: the relay's challenge to it, its
        // connect with it.
        let joined = joined(public, 4000 + i as u16, Dialect::Et).await;
        let me = joined.local_addr().unwrap();
        let player = client_on(ip_of(&joined)).await;
        let (_, sessions) = d.call(Method::GET, "/sessions", &key, None).await;
        assert!(
            sessions["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["client"] == me.to_string()),
            "the session list shows the IPv4 address: {sessions}"
        );
        let ip = if i == 0 {
            me.ip().to_string()
        } else {
            format!("::ffff:{}", me.ip())
        };
        let (status, ban) = d
            .call(Method::PUT, &format!("/bans/{ip}"), &key, None)
            .await;
        assert_eq!(status, 200, "{spelling}: {ban}");
        assert_eq!(ban["ip"], me.ip().to_string());
        // Cut at once, and nothing gets through any more.
        let (_, sessions) = d.call(Method::GET, "/sessions", &key, None).await;
        assert!(
            !sessions["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["client"] == me.to_string()),
            "{spelling}: {sessions}"
        );
        let before = et.received().len();
        assert!(
            ask(&player, public, &udp::oob(b"getchallenge"))
                .await
                .is_empty(),
            "{spelling}"
        );
        assert!(
            ask(&player, public, &udp::oob(b"getinfo x"))
                .await
                .is_empty(),
            "{spelling}"
        );
        assert_eq!(
            et.received().len(),
            before,
            "{spelling}: nothing reached the server"
        );
    }
    d.stop().await;
}

#[tokio::test]
async fn a_loop_is_refused_at_registration_and_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &[27960, 27961], &[]).await;
    let key = new_key();
    for upstream in [
        SocketAddr::from((ip, 27960)),
        SocketAddr::from((ip, 27961)),
        "0.0.0.0:27960".parse().unwrap(),
        "224.0.0.1:27960".parse().unwrap(),
    ] {
        let (status, body) = d.register(&key, upstream, None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (422, Some("bad_upstream")),
            "{upstream}: {body}"
        );
    }
    assert!(!state.join("servers.json").exists(), "nothing saved");
    d.stop().await;

    let et = proven_server(&key);
    // A loop written into servers.json: registered, not relayed, with the reason.
    write_servers(&state, &[(27960, SocketAddr::from((ip, 27961)), &key)]);
    let d = Daemon::start_on(ip, &state, &[27960, 27961], &[]).await;
    let (status, me) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(me["relaying"], false);
    assert!(me["error"].as_str().unwrap().contains("a loop"), "{me}");
    assert!(d.logged("not relayed"), "{}", d.log_text());
    drop(et);
    d.stop().await;
}

fn write_servers(state: &std::path::Path, servers: &[(u16, SocketAddr, &str)]) {
    std::fs::create_dir_all(state).unwrap();
    let list: Vec<_> = servers
        .iter()
        .map(|(port, upstream, key)| {
            json!({"port": port, "upstream": upstream.to_string(),
                   "key_sha256": hex::encode(key_hash(key)), "registered_at": 1})
        })
        .collect();
    std::fs::write(
        state.join("servers.json"),
        json!({ "servers": list }).to_string(),
    )
    .unwrap();
}

#[tokio::test]
async fn damaged_state_takes_down_only_what_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (ka, kb, kc) = (new_key(), new_key(), new_key());
    let (a, b, c) = (proven_server(&ka), proven_server(&kb), proven_server(&kc));
    // B's ban store is not a database; C repeats A's port; a temp file was left behind.
    write_servers(
        &state,
        &[
            (27960, a.addr(), &ka),
            (27961, b.addr(), &kb),
            (27960, c.addr(), &kc),
        ],
    );
    std::fs::write(
        state.join("bans-27961.db"),
        "this is not a database, it is text",
    )
    .unwrap();
    std::fs::write(state.join(".servers.json.tmp.4242"), "{").unwrap();
    std::fs::write(state.join("bans-27969.json"), "{\"bans\": []}").unwrap();
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &[27960, 27961], &[]).await;

    let (status, me) = d.call(Method::GET, "/server", &ka, None).await;
    assert_eq!((status, &me["relaying"]), (200, &json!(true)), "{me}");
    let player = client().await;
    assert_eq!(
        ask(&player, d.public(27960), &udp::oob(b"getchallenge"))
            .await
            .len(),
        1
    );

    let (status, me) = d.call(Method::GET, "/server", &kb, None).await;
    assert_eq!((status, &me["relaying"]), (200, &json!(false)), "{me}");
    assert!(
        me["error"].as_str().unwrap().contains("bans-27961.db"),
        "{me}"
    );
    let (status, body) = d.call(Method::GET, "/bans", &kb, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("not_relaying"))
    );
    assert!(
        d.logged("ERROR") && d.logged("bans-27961.db"),
        "{}",
        d.log_text()
    );

    let (status, _) = d.call(Method::GET, "/server", &kc, None).await;
    assert_eq!(status, 401, "the repeated port is refused");
    assert!(d.logged("given twice"), "{}", d.log_text());
    assert!(state.join("servers.json.refused").exists());

    assert!(
        !state.join(".servers.json.tmp.4242").exists(),
        "temp file cleaned"
    );
    assert!(
        !state.join("bans-27969.json").exists(),
        "stray ban file cleaned"
    );
    assert!(
        state.join("bans-27961.db").exists(),
        "the damaged store is left for the operator"
    );
    d.stop().await;
}

#[tokio::test]
async fn sixty_five_thousand_bans_and_each_ban_stays_quick() {
    use etrelay::bans::store::Store;
    use etrelay::bans::{Ban, MAX_BANS};
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let key = new_key();
    let et = proven_server(&key);
    write_servers(&state, &[(27960, et.addr(), &key)]);
    let now = std::time::SystemTime::now();
    let bans: Vec<Ban> = (0..MAX_BANS as u32 - 1)
        .map(|i| {
            Ban::new(
                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                "filled".into(),
                None,
                now,
            )
            .unwrap()
        })
        .collect();
    drop(Store::create_with(&state, 27960, &bans).unwrap());
    let d = Daemon::start_on(unique_ip(), &state, &[27960], &[]).await;
    let (status, list) = d.call(Method::GET, "/bans", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(list["bans"].as_array().unwrap().len(), MAX_BANS - 1);

    // Replacing bans at full size: each timed end to end (HTTP, fsync, table).
    let mut times = Vec::new();
    for i in 0..40u32 {
        let t = Instant::now();
        let (status, _) = d
            .call(
                Method::PUT,
                &format!("/bans/10.0.0.{}", i + 1),
                &key,
                Some(json!({"reason": "again"})),
            )
            .await;
        times.push(t.elapsed());
        assert_eq!(status, 200);
    }
    let t = Instant::now();
    let (status, _) = d.call(Method::PUT, "/bans/192.0.2.200", &key, None).await;
    times.push(t.elapsed());
    assert_eq!(status, 200, "the 65 536th ban");
    let (status, body) = d.call(Method::PUT, "/bans/192.0.2.201", &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("too_many_bans"))
    );
    times.sort();
    let (p50, p90, max) = (
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        times[times.len() - 1],
    );
    println!(
        "FIGURE bans: at {MAX_BANS} bans, one ban end to end: p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        p50.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    assert!(p90 <= Duration::from_millis(10), "p90 {p90:?}");
    d.stop().await;
}

/// A restart with 12 000 bans (reasons of a typical length): the peak memory of the start-up
/// stays near the steady state, and near a start without bans.
#[tokio::test]
async fn a_start_with_12_000_bans_peaks_near_its_steady_memory() {
    use etrelay::bans::Ban;
    use etrelay::bans::store::Store;
    use etrelay_testkit::procstat::{peak_rss_kib, rss_kib};
    const BANS: u32 = 12_000;
    let mut figures = Vec::new();
    for n in [0, BANS] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let key = new_key();
        let et = proven_server(&key);
        write_servers(&state, &[(27960, et.addr(), &key)]);
        let now = std::time::SystemTime::now();
        let bans: Vec<Ban> = (0..n)
            .map(|i| {
                let reason = format!("aimbot reported by three players, round {i}");
                Ban::new(
                    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                    reason,
                    None,
                    now,
                )
                .unwrap()
            })
            .collect();
        drop(Store::create_with(&state, 27960, &bans).unwrap());
        drop(bans);
        let d = Daemon::start_on(unique_ip(), &state, &[27960], &[]).await;
        // Ready: the server relays with its bans in force.
        let (status, me) = d.call(Method::GET, "/server", &key, None).await;
        assert_eq!((status, &me["relaying"]), (200, &json!(true)), "{me}");
        let pid = d.child.id().expect("running");
        let (peak, steady) = (peak_rss_kib(pid).unwrap_or(0), rss_kib(pid).unwrap_or(0));
        figures.push((n, peak, steady));
        d.stop().await;
    }
    let [(_, peak0, steady0), (_, peak, steady)] = figures[..] else {
        unreachable!()
    };
    println!(
        "FIGURE bans at start: without bans peak {peak0} KiB, steady {steady0} KiB; with {BANS} \
         bans peak {peak} KiB, steady {steady} KiB ({:.2}x its steady state)",
        peak as f64 / steady.max(1) as f64
    );
    assert!(
        peak <= steady + 8 * 1024,
        "peak {peak} KiB against {steady} KiB steady"
    );
}
