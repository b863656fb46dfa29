//! The proxy: sessions per client, answers from the public port, session cap, queue-full drops,
//! expiry, packet sizes. Real sockets on 127.0.0.x against the scripted ET server.

use crate::common;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use etrelay::config::MAX_QUEUED_BYTES;
use etrelay::server::{Budget, DropReason};
use etrelay_testkit::netns::{self, Netns};
use etrelay_testkit::player::game_packet;
use etrelay_testkit::{Dispatch, FakeEtConfig, FakeEtServer, udp, unique_ip};

const S: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn answers_leave_from_the_public_port_one_session_per_client() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start(config_server_challenges(et.addr())).await;
    let (a, b) = (client().await, client().await);

    // A connectionless exchange: the answer comes from the relay's public address.
    for c in [&a, &b] {
        let replies = ask(c, relay.addr, &udp::oob(b"getchallenge")).await;
        assert_eq!(replies.len(), 1, "one challengeResponse");
        assert_eq!(replies[0].0, relay.addr, "answer from the public port");
        assert!(
            replies[0]
                .1
                .starts_with(b"\xff\xff\xff\xffchallengeResponse ")
        );
    }

    // In-game packets pass untouched, each client through its own upstream socket.
    a.send_to(b"\x01\x00\x00\x00\x34\x12game-a", relay.addr)
        .await
        .unwrap();
    b.send_to(b"\x01\x00\x00\x00\x35\x12game-b", relay.addr)
        .await
        .unwrap();
    assert!(eventually(5 * S, || et.count(Dispatch::NotConnectionless) == 2).await);
    let got = et.received();
    let game: Vec<_> = got
        .iter()
        .filter(|r| r.dispatch == Dispatch::NotConnectionless)
        .collect();
    assert!(
        game.iter()
            .any(|r| r.packet == b"\x01\x00\x00\x00\x34\x12game-a")
    );
    assert!(
        game.iter()
            .any(|r| r.packet == b"\x01\x00\x00\x00\x35\x12game-b")
    );

    let sessions = relay.handle.sessions();
    assert_eq!(sessions.len(), 2);
    let ports: HashSet<_> = sessions.iter().map(|s| s.upstream_local.port()).collect();
    assert_eq!(ports.len(), 2, "one upstream socket per client");
    for s in &sessions {
        // The game server saw each client as its session's upstream socket.
        assert!(got.iter().any(|r| r.from.port() == s.upstream_local.port()));
        assert!(s.packets_up >= 2 && s.packets_down >= 1);
    }
    let clients: HashSet<_> = sessions.iter().map(|s| s.client).collect();
    assert!(
        clients.contains(&a.local_addr().unwrap()) && clients.contains(&b.local_addr().unwrap())
    );

    // The server talks back to a session on its own: it reaches the client from the public port.
    let sa = sessions
        .iter()
        .find(|s| s.client == a.local_addr().unwrap())
        .unwrap();
    et.send_from_own_socket(sa.upstream_local_for_server(), b"\x02\x00\x00\x00snapshot")
        .await
        .unwrap();
    let (from, data) = udp::recv_timeout(&a, 2 * S)
        .await
        .expect("server packet relayed");
    assert_eq!(from, relay.addr);
    assert_eq!(data, b"\x02\x00\x00\x00snapshot");
    relay.handle.stop().await;
}

/// Extension: where the game server must send to reach a session (its upstream socket; the
/// relay binds the unspecified address, so use the loopback address the server sees).
trait ServerView {
    fn upstream_local_for_server(&self) -> std::net::SocketAddr;
}
impl ServerView for etrelay::server::SessionInfo {
    fn upstream_local_for_server(&self) -> std::net::SocketAddr {
        let mut a = self.upstream_local;
        if a.ip().is_unspecified() {
            a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        a
    }
}

#[tokio::test(start_paused = true)]
async fn no_session_past_the_cap() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start_on(
        config_server_challenges(et.addr()),
        public_socket().await,
        Budget::new(3, MAX_QUEUED_BYTES),
    );
    // Each client its own qport: a qport is pinned to one session.
    let mut clients = Vec::new();
    for q in 0..5u16 {
        let c = client().await;
        c.send_to(&game_packet(1, q, b"game"), relay.addr)
            .await
            .unwrap();
        clients.push(c);
    }
    let m = relay.handle.metrics();
    assert!(eventually(5 * S, || m.drops(DropReason::SessionCap) == 2).await);
    assert_eq!(relay.handle.session_count(), 3);
    assert!(eventually(5 * S, || et.count(Dispatch::NotConnectionless) == 3).await);
    // Known clients keep their sessions; a sixth client is still refused.
    clients[0]
        .send_to(&game_packet(2, 0, b"more"), relay.addr)
        .await
        .unwrap();
    assert!(eventually(5 * S, || et.count(Dispatch::NotConnectionless) == 4).await);
    let c = client().await;
    c.send_to(&game_packet(1, 9, b"game"), relay.addr)
        .await
        .unwrap();
    assert!(eventually(5 * S, || m.drops(DropReason::SessionCap) == 3).await);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_the_packet() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    // 200 packets wait on the public socket before the relay starts: each turn of the relay
    // loop reads up to 64 of them before the session's task runs, and the queue holds 8.
    let public = public_socket().await;
    let to = public.local_addr().unwrap();
    let c = client().await;
    for i in 0..200u32 {
        c.send_to(&game_packet(i, 7, b"x"), to).await.unwrap();
    }
    let mut cfg = config_server_challenges(et.addr());
    cfg.session.queue = 8;
    let relay = start_on(cfg, public, Budget::new(16, MAX_QUEUED_BYTES));
    let m = relay.handle.metrics();
    assert!(eventually(5 * S, || m.client_packets.get() == 200).await);
    let dropped = m.drops(DropReason::QueueFull);
    assert!(
        eventually(5 * S, || et.count(Dispatch::NotConnectionless) as u64
            + dropped
            == 200)
        .await
    );
    assert!(dropped >= 100, "only {dropped} dropped");
    // What the queue kept went out in order, the first 8 first.
    let kept: Vec<u32> = et
        .received()
        .iter()
        .filter(|r| r.dispatch == Dispatch::NotConnectionless)
        .map(|r| u32::from_le_bytes(r.packet[0..4].try_into().unwrap()))
        .collect();
    assert_eq!(kept[..8], (0..8).collect::<Vec<_>>());
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "{kept:?}");
    relay.handle.stop().await;
}

/// On one thread, as the daemon runs: a flood must not keep the relay loop from letting the
/// sessions (and everything else) run.
///
/// On the wall clock, unlike the other tests: the flood comes from another thread for a
/// stretch of real time, and the player's packets must be spread over that stretch. (A paused
/// clock only moves when the runtime is idle, which a flood never lets it be: the player would
/// send everything after the flood.)
#[tokio::test]
async fn a_flooding_client_does_not_starve_the_others() {
    let _flood = common::one_flood_at_a_time().await;
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start(config_server_challenges(et.addr())).await;
    let to = relay.addr;
    // One client sends as fast as it can for about a second, from its own thread.
    let flood_ip = unique_ip();
    let flood = std::thread::spawn(move || {
        let s = std::net::UdpSocket::bind((flood_ip, 0)).unwrap();
        let end = std::time::Instant::now() + Duration::from_millis(1200);
        let mut n = 0u64;
        while std::time::Instant::now() < end && n < 5_000_000 {
            let _ = s.send_to(&[1u8, 0, 0, 0, 0xEE, 0xEE], to);
            n += 1;
        }
    });
    // Meanwhile a player sends 50 packets, 10 ms apart.
    let player = client().await;
    let me = player.local_addr().unwrap();
    for i in 0..50u32 {
        player
            .send_to(&game_packet(i, 0x2222, b"p"), to)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    flood.join().unwrap();
    let upstream = relay
        .handle
        .sessions()
        .into_iter()
        .find(|s| s.client == me)
        .unwrap()
        .upstream_local
        .port();
    let got = || {
        et.received()
            .iter()
            .filter(|r| r.from.port() == upstream)
            .count()
    };
    assert!(
        eventually(5 * S, || got() >= 10).await,
        "the player got {} of 50 through",
        got()
    );
    // The sessions got their turns: what the relay read, its sessions sent on (a relay loop
    // that never yields fills each session's queue and drops nearly everything).
    let m = relay.handle.metrics();
    let (read, full) = (m.client_packets.get(), m.drops(DropReason::QueueFull));
    assert!(read > 1000, "the flood reached the relay ({read})");
    assert!(full * 10 < read, "{full} of {read} dropped on full queues");
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_expire_and_come_back_with_a_new_port() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = config_server_challenges(et.addr());
    cfg.session.timeout = Duration::from_millis(1000);
    cfg.caps.half_open_timeout = Duration::from_millis(1000);
    let relay = start(cfg).await;
    let c = client().await;
    c.send_to(&game_packet(1, 5, b"one"), relay.addr)
        .await
        .unwrap();
    assert!(eventually(5 * S, || relay.handle.session_count() == 1).await);
    let first = relay.handle.sessions()[0].upstream_local;
    // Kept alive while packets flow...
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        c.send_to(&game_packet(2, 5, b"more"), relay.addr)
            .await
            .unwrap();
    }
    assert_eq!(relay.handle.session_count(), 1);
    // ...and gone once idle for the timeout.
    assert!(eventually(5 * S, || relay.handle.session_count() == 0).await);
    assert_eq!(relay.handle.metrics().sessions_open.get(), 0);
    c.send_to(&game_packet(3, 5, b"two"), relay.addr)
        .await
        .unwrap();
    assert!(eventually(5 * S, || relay.handle.session_count() == 1).await);
    assert_ne!(relay.handle.sessions()[0].upstream_local, first);
    assert_eq!(relay.handle.metrics().sessions_opened.get(), 2);
    relay.handle.stop().await;
}

#[tokio::test(start_paused = true)]
async fn large_answers_pass_whole_and_oversize_packets_are_dropped() {
    // About 40 KB of statusResponse: far over any 1400-byte MTU guess.
    let players = (0..1500)
        .map(|i| (i, 50, format!("player-number-{i:05}")))
        .collect();
    let et = FakeEtServer::start(
        unique_ip(),
        FakeEtConfig {
            players,
            ..Default::default()
        },
    )
    .unwrap();
    let relay = start(config_server_challenges(et.addr())).await;
    let c = client().await;
    let replies = ask(&c, relay.addr, &udp::oob(b"getstatus big")).await;
    assert_eq!(replies.len(), 1);
    let status = &replies[0].1;
    assert!(status.len() > 40_000, "got {} bytes", status.len());
    assert_eq!(info_value(status, "challenge").as_deref(), Some("big"));
    assert!(status.ends_with(b"\"player-number-01499\"\n"));

    let mut cfg = config_server_challenges(et.addr());
    cfg.session.max_packet = 100;
    let small = start(cfg).await;
    c.send_to(&[1u8; 101], small.addr).await.unwrap();
    c.send_to(&[1u8; 100], small.addr).await.unwrap();
    let m = small.handle.metrics();
    assert!(eventually(5 * S, || m.drops(DropReason::Oversize) == 1).await);
    assert!(eventually(5 * S, || et.count(Dispatch::NotConnectionless) == 1).await);
    small.handle.stop().await;
    relay.handle.stop().await;
}

/// A packet from a new port of a player's IP with the player's qport moves nothing without
/// proof (the XOR netchan of ET carries none: a spoofer who knows the player's IP and qport
/// would take its stream): the player keeps its place and its stream, as on the game server
/// itself; a player whose NAT really moved connects again (`tests/it/challenges.rs` has the
/// move a checksum proves). Another IP with that qport gets nothing through either.
#[tokio::test(start_paused = true)]
async fn a_new_port_without_proof_leaves_the_player_where_it_is() {
    use etrelay_testkit::player::{Dialect, Player};
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = config(et.addr());
    cfg.caps.rebind_quiet = Duration::from_millis(200);
    let relay = start(cfg).await;
    let ip = unique_ip();
    let mut player = Player::bind(ip, relay.addr, 77, Dialect::Et).await.unwrap();
    player.join(5 * S, S).await.expect("joins");
    player.send_game(b"a").await.unwrap();
    assert_eq!(player.recv_game(S / 2).await, 1);
    // Silent for longer than rebind_quiet, then from a new port of the same IP.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut spoofer = Player::bind(ip, relay.addr, 77, Dialect::Et).await.unwrap();
    spoofer.send_game(b"b").await.unwrap();
    let m = relay.handle.metrics();
    assert!(eventually(5 * S, || m.drops(DropReason::QportConflict) == 1).await);
    assert_eq!(
        spoofer.recv_game(S / 2).await,
        0,
        "nothing follows the new port"
    );
    assert_eq!(m.sessions_rebound.get(), 0);
    player.send_game(b"c").await.unwrap();
    assert_eq!(
        player.recv_game(S / 2).await,
        1,
        "the player keeps its stream"
    );
    // Another IP with the player's qport: dropped.
    let mut thief = Player::bind(unique_ip(), relay.addr, 77, Dialect::Et)
        .await
        .unwrap();
    thief.send_game(b"d").await.unwrap();
    assert!(eventually(5 * S, || m.drops(DropReason::QportConflict) == 2).await);
    assert_eq!(thief.recv_game(S / 2).await, 0);
    relay.handle.stop().await;
}

/// A session whose socket's send buffer is full keeps its packets queued and sends them as the
/// buffer drains (the socket is not registered for write readiness: the session's task tries
/// again after 1 ms, doubling while nothing goes out). In a namespace of its own, where the
/// loopback sends what goes to the game server's port at 8 Mbit/s (`tc`: an `htb` class and a
/// `u32` filter), so that the relay's datagrams wait in the queueing discipline and fill the
/// socket's buffer.
#[ignore = "needs root and iproute2: a network namespace whose lo is rate-limited (tc)"]
#[tokio::test]
async fn a_full_upstream_buffer_is_sent_as_it_drains() {
    // 8 000 B: longer than the ring's slots, so sent one socket at a time either way.
    full_upstream_buffer("full", 8_000, 100, 1, true).await;
}

#[ignore = "needs root and iproute2: a network namespace whose lo is rate-limited (tc)"]
#[tokio::test]
async fn a_full_upstream_buffer_is_sent_as_it_drains_through_the_ring() {
    // 1 400 B from two clients in turn: what the io_uring ring takes (it sends when a batch
    // holds two sessions' packets or more); the datagrams it sent into a full buffer go back
    // to their session's queue.
    full_upstream_buffer("ring", 1_400, 300, 2, true).await;
}

#[ignore = "needs root and iproute2: a network namespace whose lo is rate-limited (tc)"]
#[tokio::test]
async fn a_full_upstream_buffer_is_sent_as_it_drains_without_io_uring() {
    full_upstream_buffer("plain", 1_400, 300, 2, false).await;
}

/// `n` datagrams of `size` bytes from `clients` clients in turn towards a game server behind
/// an 8 Mbit/s link (inside a namespace of its own, named after `tag`): the sessions' socket
/// buffers fill, and what did not fit is sent as they drain; every datagram arrives or is
/// counted as dropped on a full queue.
async fn full_upstream_buffer(tag: &str, size: usize, n: u64, clients: u16, io_uring: bool) {
    if let Err(why) = netns::support() {
        let ci = std::env::var_os("CI").is_some();
        panic!("{why}{}", if ci { " (CI: this test must run)" } else { "" });
    }
    let ns = Netns::create(&format!("{}-{}-{tag}", netns::PREFIX, std::process::id()))
        .expect("a namespace");
    let rt = ns.runtime().expect("a runtime in the namespace");
    let et_ip = Ipv4Addr::new(127, 0, 0, 2);
    let et = rt
        .run(async move { FakeEtServer::start(et_ip, FakeEtConfig::default()).unwrap() })
        .await;
    let port = et.addr().port().to_string();
    let filter = format!(
        "filter add dev lo protocol ip parent 1:0 prio 1 u32 match ip dport {port} 0xffff flowid 1:10"
    );
    for tc in [
        "qdisc add dev lo root handle 1: htb default 20",
        "class add dev lo parent 1: classid 1:10 htb rate 8mbit burst 16k quantum 60000",
        "class add dev lo parent 1: classid 1:20 htb rate 10gbit quantum 60000",
        &filter,
    ] {
        ns.exec("tc", &tc.split_whitespace().collect::<Vec<_>>())
            .expect("tc");
    }
    let et_addr = et.addr();
    let got = std::sync::Arc::new(et);
    let counted = std::sync::Arc::clone(&got);
    let (received, dropped, sent_by_loop) = rt
        .run(async move {
            let mut cfg = config_server_challenges(et_addr);
            cfg.session.io_uring = io_uring;
            // Datagrams larger than a client's, to fill the buffers fast.
            cfg.session.max_packet = 65_535;
            let relay = start(cfg).await;
            let m = relay.handle.metrics();
            let ring = m.upstream_io_uring.get() == 1;
            if io_uring && !ring && std::env::var_os("CI").is_none() {
                eprintln!("io_uring not available here: the ring's path is not tested");
            } else {
                assert_eq!(
                    ring, io_uring,
                    "the relay sends through the ring when asked"
                );
            }
            let mut cs = Vec::new();
            for _ in 0..clients {
                cs.push(client().await);
            }
            for i in 0..n as u32 {
                // Each client its own qport.
                let k = (i % u32::from(clients)) as u16;
                cs[usize::from(k)]
                    .send_to(&game_packet(i, 7 + k, &vec![b'x'; size]), relay.addr)
                    .await
                    .unwrap();
            }
            assert!(eventually(10 * S, || m.client_packets.get() == n).await);
            // What the relay loop could hand to the socket before its buffer was full.
            let sent_by_loop = m.upstream_packets.get();
            let got = || counted.count(Dispatch::NotConnectionless) as u64;
            let dropped = || m.drops(DropReason::QueueFull);
            assert!(
                eventually(20 * S, || got() + dropped() == n).await,
                "{} arrived, {} dropped of {n}",
                got(),
                dropped()
            );
            let out = (got(), dropped(), sent_by_loop);
            relay.handle.stop().await;
            out
        })
        .await;
    drop(rt);
    drop(got);
    drop(ns);
    eprintln!(
        "{n} sent: {sent_by_loop} taken by the socket at once, {received} arrived, {dropped} dropped"
    );
    assert!(
        sent_by_loop < n - dropped,
        "the buffer never filled: the loop sent {sent_by_loop}"
    );
    assert_eq!(received, n - dropped);
    assert!(
        received > sent_by_loop,
        "{received} arrived, {sent_by_loop} before the buffer filled"
    );
}
