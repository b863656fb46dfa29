//! Faults around the relay (issue 15, item 3), on the real binary: masters that stop answering
//! or go away and come back, and the game server gone (flatline) and back (heartbeats again).
//! The control address not yet available at start is `control.rs`
//! (`the_control_address_is_bound_again_until_it_works`); the flatline and the heartbeats
//! after it on a paused clock are `heartbeat.rs` (`flatline_when_the_server_stops_answering`).

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::*;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, udp, unique_ip};

const S: Duration = Duration::from_secs(1);

/// Starts the binary relaying `upstream` with `masters`, heartbeats every 300 ms.
async fn relay(upstream: SocketAddr, masters: &str) -> (tokio::process::Child, Log, SocketAddr) {
    let args: Vec<String> = [
        "--allow-loopback-upstream",
        "--listen",
        &format!("{}:0", unique_ip()),
        "--masters",
        masters,
        "--heartbeat-interval",
        "300ms",
        "--probe-timeout",
        "300ms",
        &upstream.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    spawn_etrelay(&args, relaying_address, 10 * S).await
}

/// A client's `getchallenge` through the relay is answered.
async fn round_trip(relay: SocketAddr) -> bool {
    let c = client().await;
    ask(&c, relay, &udp::oob(b"getchallenge")).await.len() == 1
}

/// Waits (at most 5 s) until `ip:27950` can be bound again, so a master restarted there gets
/// the address the relay heartbeats.
async fn port_free(ip: Ipv4Addr) {
    let free = || std::net::UdpSocket::bind((ip, 27950)).is_ok();
    assert!(eventually(5 * S, free).await, "{ip}:27950 stays taken");
}

#[tokio::test]
async fn masters_that_stop_answering_or_go_away_change_nothing_and_list_it_again() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let (ip1, ip2) = (unique_ip(), unique_ip());
    let m1 = FakeMaster::start(ip1, MasterStyle::Classic).unwrap();
    let m2 = FakeMaster::start(ip2, MasterStyle::EtMaster).unwrap();
    let m1_addr = m1.addr();
    // A master that takes the heartbeats and never answers (no challenge, nothing).
    let mute = std::net::UdpSocket::bind((unique_ip(), 0)).unwrap();
    let masters = format!("{},{m1_addr},{}", mute.local_addr().unwrap(), m2.addr());
    let (mut child, log, addr) = relay(et.addr(), &masters).await;
    assert!(m1.wait_listed(addr, 10 * S).await, "{:?}", m1.rejections());
    assert!(m2.wait_listed(addr, 10 * S).await, "{:?}", m2.rejections());

    // m1 goes away: its address answers ICMP port unreachable from now on.
    drop(m1);
    port_free(ip1).await;
    let beats = m2.heartbeats().len();
    assert_eq!(
        m2.wait_heartbeats("EnemyTerritory-1", beats + 3, 10 * S)
            .await
            .len(),
        beats + 3,
        "the other master gets its heartbeats"
    );
    for _ in 0..3 {
        assert!(round_trip(addr).await, "relaying goes on");
    }
    assert!(child.try_wait().unwrap().is_none(), "the relay is running");

    // m1 back on the same address: listed again at the next round.
    let m1 = FakeMaster::start(ip1, MasterStyle::Classic).unwrap();
    assert_eq!(m1.addr(), m1_addr);
    assert!(m1.wait_listed(addr, 10 * S).await, "{:?}", m1.rejections());
    assert!(round_trip(addr).await);
    let text = log.lock().unwrap().join("\n");
    assert!(!text.contains("panicked"), "{text}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

#[tokio::test]
async fn the_server_gone_and_back_flatline_then_heartbeats_and_relaying_again() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let (mut child, log, addr) = relay(et.addr(), &master.addr().to_string()).await;
    assert!(master.wait_listed(addr, 10 * S).await);
    assert!(round_trip(addr).await);

    et.set_answering(false);
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 10 * S).await,
        vec![addr]
    );
    let beats = master
        .heartbeats()
        .iter()
        .filter(|(_, t)| t == "EnemyTerritory-1")
        .count();

    et.set_answering(true);
    assert_eq!(
        master
            .wait_heartbeats("EnemyTerritory-1", beats + 1, 10 * S)
            .await
            .len(),
        beats + 1,
        "heartbeats again once the server answers"
    );
    assert!(round_trip(addr).await, "relaying again");
    let flatlines = master
        .heartbeats()
        .iter()
        .filter(|(_, t)| t == "ETFlatline-1")
        .count();
    assert_eq!(flatlines, 1, "one flatline for the outage");
    let text = log.lock().unwrap().join("\n");
    assert!(text.contains("stopped answering"), "{text}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}
