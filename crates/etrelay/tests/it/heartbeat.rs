//! Heartbeats: masters of both kinds list the relay's public address, never the server's;
//! flatlines when the server stops answering and when the relay stops. On a paused clock:
//! rounds, probe timeouts and waits take no wall time.

use crate::common;

use std::time::Duration;

use common::*;
use etrelay::config::{Game, PROBE_ATTEMPTS};
use etrelay::server::ProbeState;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, unique_ip};

const S: Duration = Duration::from_secs(1);

/// The heartbeat task's probes (`getinfo hb…`) the server received so far, answered or not.
fn probes(et: &FakeEtServer) -> usize {
    et.received()
        .iter()
        .filter(|r| r.packet.starts_with(b"\xff\xff\xff\xffgetinfo hb"))
        .count()
}

async fn listed_through_relay(style: MasterStyle) {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), style).unwrap();
    let mut cfg = config(et.addr());
    cfg.masters = vec![master.addr().to_string()];
    let relay = start(cfg).await;
    assert!(
        master.wait_listed(relay.addr, 10 * S).await,
        "{style:?}: {:?}",
        master.rejections()
    );
    let hb = master.heartbeats();
    assert!(
        hb.iter()
            .all(|(from, tag)| *from == relay.addr && tag == "EnemyTerritory-1"),
        "{hb:?}"
    );
    assert!(!master.listed().contains(&et.addr()));
    assert_eq!(master.listed(), vec![relay.addr]);
    assert_eq!(relay.handle.probe().state, ProbeState::Up);
    assert_eq!(relay.handle.metrics().heartbeats.get(), 1);
    relay.handle.stop().await;
    // Stopping sends the flatline from the same public address.
    let flat = master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await;
    assert_eq!(flat, vec![relay.addr]);
}

#[tokio::test(start_paused = true)]
async fn classic_master_lists_the_relay() {
    listed_through_relay(MasterStyle::Classic).await;
}

#[tokio::test(start_paused = true)]
async fn etmaster_lists_the_relay() {
    listed_through_relay(MasterStyle::EtMaster).await;
}

#[tokio::test(start_paused = true)]
async fn flatline_when_the_server_stops_answering() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = config(et.addr());
    cfg.masters = vec![master.addr().to_string()];
    cfg.heartbeat_interval = Duration::from_millis(200);
    cfg.probe_timeout = Duration::from_millis(300);
    let relay = start(cfg).await;
    assert_eq!(
        master
            .wait_heartbeats("EnemyTerritory-1", 2, 5 * S)
            .await
            .len(),
        2
    );
    et.set_answering(false);
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![relay.addr]
    );
    assert!(eventually(5 * S, || relay.handle.probe().state == ProbeState::Down).await);
    let beats = master
        .heartbeats()
        .iter()
        .filter(|(_, t)| t == "EnemyTerritory-1")
        .count();
    // No heartbeat while down, and only one flatline for the whole outage: three more down
    // rounds end (each one PROBE_ATTEMPTS unanswered probes; the first probe of the round
    // after them shows the third one is over).
    let three_rounds = probes(&et) + 3 * PROBE_ATTEMPTS as usize + 1;
    assert!(eventually(30 * S, || probes(&et) >= three_rounds).await);
    assert_eq!(relay.handle.probe().state, ProbeState::Down);
    let hb = master.heartbeats();
    assert_eq!(
        hb.iter().filter(|(_, t)| t == "EnemyTerritory-1").count(),
        beats
    );
    assert_eq!(hb.iter().filter(|(_, t)| t == "ETFlatline-1").count(), 1);
    // Back up: heartbeats again.
    et.set_answering(true);
    assert_eq!(
        master
            .wait_heartbeats("EnemyTerritory-1", beats + 1, 5 * S)
            .await
            .len(),
        beats + 1
    );
    assert_eq!(relay.handle.probe().state, ProbeState::Up);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn q3_heartbeats_and_no_flatline() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = config(et.addr());
    cfg.masters = vec![master.addr().to_string()];
    cfg.game = Game::Q3;
    let relay = start(cfg).await;
    assert_eq!(
        master.wait_heartbeats("QuakeArena-1", 1, 5 * S).await,
        vec![relay.addr]
    );
    relay.handle.stop().await;
    assert!(
        master
            .wait_heartbeats("ETFlatline-1", 1, Duration::from_millis(300))
            .await
            .is_empty()
    );
    assert!(master.heartbeats().iter().all(|(_, t)| t == "QuakeArena-1"));
}

#[tokio::test(start_paused = true)]
async fn a_master_that_cannot_be_reached_is_skipped() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = config(et.addr());
    // An IPv6 master cannot be reached from an IPv4 public socket: skipped with a warning, the
    // next one still gets its heartbeat. (No name lookup: nothing leaves the machine.)
    cfg.masters = vec!["[::1]:27950".into(), master.addr().to_string()];
    let relay = start(cfg).await;
    assert!(master.wait_listed(relay.addr, 10 * S).await);
    assert_eq!(relay.handle.metrics().heartbeats.get(), 1);
    // The skipped one is counted, for the alert on heartbeats that all fail.
    assert_eq!(relay.handle.metrics().heartbeat_errors.get(), 1);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn no_heartbeat_while_the_server_is_down() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_answering(false);
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = config(et.addr());
    cfg.masters = vec![master.addr().to_string()];
    cfg.probe_timeout = Duration::from_millis(300);
    let relay = start(cfg).await;
    assert!(eventually(5 * S, || relay.handle.probe().state == ProbeState::Down).await);
    assert!(master.heartbeats().is_empty());
    assert_eq!(
        relay.handle.metrics().flatlines.get(),
        0,
        "never answered: no flatline yet"
    );
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn rounds_start_one_interval_apart_even_when_probes_time_out() {
    // The server never answers: every round spends PROBE_ATTEMPTS × 3 s probing. Rounds still
    // start every 60 s (at 0, 60, …, 300 s), not 60 s after the previous one ended (0, 69,
    // 138, … would give 5 rounds by 330 s instead of 6).
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_answering(false);
    let mut cfg = config(et.addr());
    cfg.heartbeat_interval = 60 * S;
    cfg.probe_timeout = 3 * S;
    let relay = start(cfg).await;
    tokio::time::sleep(330 * S).await;
    let want = 6 * PROBE_ATTEMPTS as usize;
    assert!(
        eventually(5 * S, || probes(&et) >= want).await,
        "{} probes",
        probes(&et)
    );
    assert_eq!(probes(&et), want);
    relay.handle.stop().await;
}

/// A relay on a dual-stack socket (`[::]`, as `--listen [::]:27960` or `--bind ::` give it)
/// heartbeats a master that has only an IPv4 address (as an IPv4-mapped address), the master
/// lists it, and players join over both IPv4 and IPv6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_relay_heartbeats_ipv4_masters_and_takes_both_families() {
    use etrelay_testkit::player::{Dialect, Player, RETRANSMIT};
    use etrelay_testkit::udp::oob;
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = config(et.addr());
    cfg.masters = vec![master.addr().to_string()];
    let public = tokio::net::UdpSocket::bind("[::]:0").await.unwrap();
    let port = public.local_addr().unwrap().port();
    let relay = start_on(
        cfg,
        public,
        etrelay::server::Budget::new(
            etrelay::config::MAX_SESSIONS,
            etrelay::config::MAX_QUEUED_BYTES,
        ),
    );
    // The heartbeat leaves from the IPv4 side of the socket: the master sees (and lists) the
    // relay at 127.0.0.1.
    let seen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        master.wait_listed(seen, 10 * S).await,
        "{:?} {:?}",
        master.heartbeats(),
        master.rejections()
    );
    assert_eq!(relay.handle.metrics().heartbeat_errors.get(), 0);
    // An IPv4 player.
    let mut v4 = Player::bind(unique_ip(), seen, 41, Dialect::Et)
        .await
        .unwrap();
    v4.join(5 * S, RETRANSMIT)
        .await
        .expect("an IPv4 player joins");
    // An IPv6 player (the handshake by hand: the test kit's player is IPv4).
    let v6 = tokio::net::UdpSocket::bind("[::1]:0").await.unwrap();
    let to: std::net::SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let answer = ask(&v6, to, &oob(b"getchallenge")).await;
    let text = String::from_utf8_lossy(&answer[0].1[4..]).into_owned();
    let challenge = text
        .strip_prefix("challengeResponse ")
        .expect("a challenge");
    let connect = oob(format!(
        "CONNECT \"\\challenge\\{challenge}\\qport\\42\\protocol\\84\\name\\six\""
    )
    .as_bytes());
    let r = ask(&v6, to, &connect).await;
    assert!(
        r.iter()
            .any(|(_, p)| p.starts_with(b"\xff\xff\xff\xffconnectResponse")),
        "{r:?}"
    );
    assert_eq!(relay.handle.session_count(), 2);
    relay.handle.stop().await;
}
