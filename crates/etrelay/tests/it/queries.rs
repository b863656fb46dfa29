//! The per-IP query limiter and the query cache.

use crate::common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use etrelay::server::DropReason;
use etrelay_testkit::{Dispatch, FakeEtConfig, FakeEtServer, udp, unique_ip};

const S: Duration = Duration::from_secs(1);

/// Sends `n` getinfo back to back from `c`; returns how many got an answer.
/// The relay's config with an answer budget wide enough to stay out of the way: these tests
/// are about the per-IP limiter and the cache (`tests/it/reflection.rs` is about the budget).
fn wide_config(upstream: std::net::SocketAddr) -> etrelay::config::ServerConfig {
    let mut c = config(upstream);
    c.reflection.per_prefix = 1_000;
    c.reflection.global = 100_000;
    c
}

async fn burst(c: &tokio::net::UdpSocket, to: std::net::SocketAddr, n: usize) -> usize {
    for i in 0..n {
        c.send_to(&udp::oob(format!("getinfo b{i}").as_bytes()), to)
            .await
            .unwrap();
    }
    let mut answered = 0;
    while udp::recv_timeout(c, Duration::from_millis(300))
        .await
        .is_some()
    {
        answered += 1;
    }
    answered
}

#[tokio::test(start_paused = true)]
async fn per_ip_burst_then_rate() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = wide_config(et.addr());
    cfg.query.interval = S;
    let relay = start(cfg).await;
    let a = client().await;
    let t0 = tokio::time::Instant::now();
    assert_eq!(burst(&a, relay.addr, 8).await, 5, "burst of 5");
    // Another IP has its own bucket; a second socket on the same IP shares it.
    let b = client().await;
    assert_eq!(burst(&b, relay.addr, 2).await, 2);
    let a2 = client_on(match a.local_addr().unwrap().ip() {
        std::net::IpAddr::V4(ip) => ip,
        _ => unreachable!(),
    })
    .await;
    let m = relay.handle.metrics();
    let limited = m.drops(DropReason::Limiter);
    assert_eq!(limited, 3);
    // The bucket refills at one per interval: 1.2 s after the burst, one more query passes.
    tokio::time::sleep_until(t0 + Duration::from_millis(1_200)).await;
    assert_eq!(burst(&a2, relay.addr, 3).await, 1);
    assert_eq!(m.drops(DropReason::Limiter), limited + 2);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_sources_keeps_memory_bounded_and_state_that_protects() {
    let _flood = common::one_flood_at_a_time().await;
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = wide_config(et.addr());
    // Slow refill: the flood's buckets stay drained for the whole test, the hardest case.
    cfg.query.interval = Duration::from_secs(60);
    let relay = start(cfg).await;
    let m = relay.handle.metrics();
    let slots = relay.handle.query_slots();
    assert_eq!(slots, 131_072, "twice the cap, allocated at start");

    // A source that used up its burst (a spoofed victim, say).
    let victim = client().await;
    assert_eq!(burst(&victim, relay.addr, 6).await, 5);

    // 100 000 fresh sources, each on its own 127.x.y.z address.
    let start = std::time::Instant::now();
    let mut sent = 0u32;
    for i in 0..100_000u32 {
        let ip = Ipv4Addr::new(127, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8);
        let Ok(s) = std::net::UdpSocket::bind((ip, 0)) else {
            continue;
        };
        if s.send_to(b"\xff\xff\xff\xffgetinfo f", relay.addr).is_ok() {
            sent += 1;
        }
        if i % 64 == 0 {
            tokio::task::yield_now().await; // let the relay read
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "flood took too long"
        );
    }
    assert!(sent > 99_000);
    // Most of the flood reached the relay (the kernel may drop a little of it).
    assert!(
        eventually(30 * S, || m.client_packets.get() >= 6 + 90_000).await,
        "only {} datagrams arrived",
        m.client_packets.get()
    );
    // The table is full, never more than the cap, and never grew.
    assert_eq!(relay.handle.query_sources(), 65_536);
    // The limiter's table kept its size (the relay loop re-reads it every 250 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.handle.query_slots(), slots);
    assert!(
        m.drops(DropReason::Limiter) >= 30_000,
        "sources past the cap are refused"
    );
    // The victim's drained bucket was not evicted to make room: still limited.
    assert_eq!(burst(&victim, relay.addr, 1).await, 0);
    assert!(relay.handle.query_sources() <= 65_536);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn each_asker_gets_its_own_challenge() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start(wide_config(et.addr())).await;
    let (a, b, c) = (client().await, client().await, client().await);
    let ra = ask(&a, relay.addr, &udp::oob(b"getinfo AAAA")).await;
    let rb = ask(&b, relay.addr, &udp::oob(b"getinfo ySpAIF`Vrh")).await;
    let rc = ask(&c, relay.addr, &udp::oob(b"getinfo\n")).await;
    assert_eq!(info_value(&ra[0].1, "challenge").as_deref(), Some("AAAA"));
    // A master's challenge comes back exactly as sent.
    assert_eq!(
        info_value(&rb[0].1, "challenge").as_deref(),
        Some("ySpAIF`Vrh")
    );
    // No challenge asked, none answered.
    assert_eq!(info_value(&rc[0].1, "challenge"), None);
    for r in [&ra, &rb, &rc] {
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, relay.addr);
        assert_eq!(info_value(&r[0].1, "hostname").as_deref(), Some("fake-et"));
        assert_eq!(info_value(&r[0].1, "protocol").as_deref(), Some("84"));
    }
    // getstatus: the player lines stay after the info string.
    et.set_players(vec![(3, 40, "Bob".into())]);
    let rs = ask(&a, relay.addr, &udp::oob(b"getstatus st1")).await;
    assert_eq!(info_value(&rs[0].1, "challenge").as_deref(), Some("st1"));
    assert!(rs[0].1.ends_with(b"\n3 40 \"Bob\"\n"));
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn many_askers_cost_the_server_one_query_per_kind() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = wide_config(et.addr());
    cfg.cache_max_age = Duration::from_millis(500);
    let relay = start(cfg).await;
    let askers = futures_join(20).await;
    for round in 0..2 {
        for (i, s) in askers.iter().enumerate() {
            s.send_to(
                &udp::oob(format!("getstatus r{round}a{i}").as_bytes()),
                relay.addr,
            )
            .await
            .unwrap();
        }
        for (i, s) in askers.iter().enumerate() {
            let (from, pkt) = udp::recv_timeout(s, 2 * S)
                .await
                .expect("every asker is answered");
            assert_eq!(from, relay.addr);
            assert_eq!(info_value(&pkt, "challenge"), Some(format!("r{round}a{i}")));
        }
        // Within max_age: all from one answer of the server.
        assert_eq!(et.count(Dispatch::GetStatus), round + 1, "round {round}");
        tokio::time::sleep(Duration::from_millis(550)).await;
    }
    let m = relay.handle.metrics();
    assert_eq!(m.cache_refreshes.get(), 2);
    assert_eq!(m.cache_refresh_answers.get(), 2);
    assert_eq!(m.cache_hits.get(), 40);
    relay.handle.stop().await;
}

async fn futures_join(n: usize) -> Vec<tokio::net::UdpSocket> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(client().await);
    }
    v
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_leaves_askers_unanswered() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_answering(false);
    let relay = start(wide_config(et.addr())).await;
    let c = client().await;
    assert!(
        ask(&c, relay.addr, &udp::oob(b"getinfo x"))
            .await
            .is_empty()
    );
    // Once it answers again, so does the relay.
    et.set_answering(true);
    let m = relay.handle.metrics();
    assert!(
        eventually(5 * S, || {
            // Wait for the first refresh to be given up (1 s), then ask again.
            m.cache_refreshes.get() >= 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let r = ask(&c, relay.addr, &udp::oob(b"getinfo y")).await;
    assert_eq!(r.len(), 1);
    assert_eq!(info_value(&r[0].1, "challenge").as_deref(), Some("y"));
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_the_cache_queries_go_through_sessions() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = wide_config(et.addr());
    cfg.cache_max_age = Duration::ZERO;
    let relay = start(cfg).await;
    let c = client().await;
    let r = ask(&c, relay.addr, &udp::oob(b"getinfo direct")).await;
    assert_eq!(r.len(), 1);
    assert_eq!(info_value(&r[0].1, "challenge").as_deref(), Some("direct"));
    assert_eq!(relay.handle.session_count(), 1);
    assert_eq!(relay.handle.metrics().cache_hits.get(), 0);
    relay.handle.stop().await;
}
