//! A local demo on loopback that needs nothing installed: a scripted ET 2.60b-style game
//! server and an etmaster-style master on 127.0.0.x, the relay in front of the server with
//! `--debug` logging, a browser that queries the server through the relay, an attacker's rcon,
//! and a player who joins with the relay's own challenge and plays.
//!
//! Run with `cargo run -p etrelay --example demo`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use etrelay::config::{MAX_QUEUED_BYTES, MAX_SESSIONS, ServerConfig};
use etrelay::server::{Budget, DropReason, ServerHandle};
use etrelay_testkit::fake_server::Handshake;
use etrelay_testkit::player::{ConnectStyle, Dialect, Player, RETRANSMIT};
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, udp, unique_ip};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("info,etrelay=debug,etrelay_testkit=warn")
        .with_target(false)
        .without_time()
        .init();

    let (et, master) = peers()?;
    let relay = start_relay(&et, &master).await?;
    let addr = relay.public_addr();

    println!("\n# the relay heartbeats the master, which checks the relay's address\n");
    let listed = master.wait_listed(addr, Duration::from_secs(5)).await;
    println!(
        "\n# master lists {:?} (the relay: {listed}; the game server itself: {})\n",
        master.listed(),
        master.listed().contains(&et.addr())
    );

    let browser = udp::bind(Ipv4Addr::new(127, 0, 0, 1)).await?;
    browse(&browser, addr).await;
    try_rcon(&browser, &relay, &et).await?;
    play(addr, &relay).await?;

    relay.stop().await;
    let flat = master
        .wait_heartbeats("ETFlatline-1", 1, Duration::from_secs(2))
        .await;
    println!("\n# relay stopped; the master got a flatline from {flat:?}");
    Ok(())
}

/// The scripted game server, with two players, and the master.
fn peers() -> Result<(FakeEtServer, FakeMaster)> {
    let players = vec![
        (12, 48, "^1Sgt.^7Fury".to_string()),
        (7, 63, "medic".to_string()),
    ];
    let et = FakeEtServer::start(
        unique_ip(),
        FakeEtConfig {
            hostname: "demo-et".into(),
            players,
            handshake: Handshake::Engine,
            ..Default::default()
        },
    )?;
    let master = FakeMaster::start(unique_ip(), MasterStyle::EtMaster)?;
    println!(
        "\n# game server (scripted ET 2.60b) on {}, master (etmaster-style) on {}\n",
        et.addr(),
        master.addr()
    );
    Ok((et, master))
}

/// The relay in front of `et`, heartbeating `master`.
async fn start_relay(et: &FakeEtServer, master: &FakeMaster) -> Result<ServerHandle> {
    let mut config = ServerConfig::new(et.addr());
    config.masters = vec![master.addr().to_string()];
    let public = UdpSocket::bind((unique_ip(), 0)).await?;
    let root = CancellationToken::new();
    Ok(ServerHandle::start(
        config,
        public,
        Budget::new(MAX_SESSIONS, MAX_QUEUED_BYTES),
        &root,
    )?)
}

/// A server browser's `getinfo` and `getstatus` through the relay at `addr`, and the answers.
async fn browse(browser: &UdpSocket, addr: SocketAddr) {
    println!("# a server browser asks through the relay\n");
    for query in [&b"getinfo demo123"[..], b"getstatus demo456"] {
        let replies = udp::exchange(
            browser,
            addr,
            &udp::oob(query),
            Duration::from_millis(200),
            Duration::from_secs(2),
        )
        .await;
        for (from, pkt) in replies {
            let text = String::from_utf8_lossy(&pkt[4..]).replace('\n', "\\n");
            println!(
                "    {} -> answer from {from}: {text}\n",
                String::from_utf8_lossy(query)
            );
        }
    }
}

/// rcon in spellings the server would run, then a `getchallenge`: what the relay dropped and
/// what reached the game server.
async fn try_rcon(browser: &UdpSocket, relay: &ServerHandle, et: &FakeEtServer) -> Result<()> {
    let addr = relay.public_addr();
    println!("# an attacker tries rcon, in spellings the server would run\n");
    for rcon in [
        &b"rcon secret sets g_gravity 10"[..],
        b"/**/rcon secret quit",
        b"\"RCON\" secret quit",
    ] {
        browser.send_to(&udp::oob(rcon), addr).await?;
    }
    let replies = udp::exchange(
        browser,
        addr,
        &udp::oob(b"getchallenge"),
        Duration::from_millis(200),
        Duration::from_secs(2),
    )
    .await;
    println!(
        "\n# rcon dropped by the relay: {}, rcon seen by the game server: {}, getchallenge answered: {}\n",
        relay.metrics().drops(DropReason::Rcon),
        et.rcon_executed().len(),
        replies.len()
    );
    Ok(())
}

/// A player joins through the relay as a real ET client does (`getchallenge`, the relay's own
/// challenge, a Huffman-compressed `connect`), then plays: every in-game packet is rewritten for
/// the challenge of the side it goes to.
async fn play(addr: SocketAddr, relay: &ServerHandle) -> Result<()> {
    println!("# a player joins with the relay's challenge and plays\n");
    let mut p = Player::bind(Ipv4Addr::new(127, 0, 0, 1), addr, 4242, Dialect::Et)
        .await?
        .with_connect_style(ConnectStyle::Engine);
    let took = p
        .join(Duration::from_secs(5), RETRANSMIT)
        .await
        .map_err(|e| format!("the player did not join: {e:?}"))?;
    let c = p.play(20, Duration::from_secs(1)).await?;
    let m = relay.metrics();
    println!(
        "\n# joined in {took:.1?} with the relay's challenge {:?}; the game server gave its own \
         ({} asked); {} of {} messages from the server decoded, {} garbled\n",
        p.challenge(),
        m.challenges_asked.get(),
        c.decoded_ok,
        c.messages_received,
        c.decoded_bad
    );
    Ok(())
}
