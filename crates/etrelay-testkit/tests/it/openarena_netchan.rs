//! The ioquake3 client model against Debian's real OpenArena server (ioquake3, protocol 71):
//! the Huffman `connect` is read by the real engine, and the netchan headers are right both
//! ways. With `showpackets 1` the server logs `server recv <size> : s=<n>[ fragment=<start>,
//! <length>]` for each datagram that passed its header checks (the checksum first).
//!
//! * as Debian ships it (`com_legacyprotocol 71`), a protocol 71 client is a legacy client:
//!   no checksum, XOR (the player's default for ioquake3);
//! * with `com_legacyprotocol 68` (stock ioquake3) it speaks the checksummed netchan.
//!
//! The server does not understand the fakes' payload; what it does with it is not checked.
//!
//! `#[ignore]`d (they need `openarena-server`); asked for without it, they fail saying so.

use std::time::Duration;

use etrelay_testkit::netchan::{Dialect as Wire, Header, checksum};
use etrelay_testkit::openarena::Options;
use etrelay_testkit::player::{ConnectStyle, Dialect, Player};
use etrelay_testkit::{OpenArena, unique_ip};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// Waits (at most `within`, polling) until the server's log has a line ending with `tail`.
async fn logged(oa: &OpenArena, tail: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if oa.log().lines().any(|l| l.trim_end().ends_with(tail)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client-to-server datagram with `sequence`, `qport` and the given checksum.
fn datagram(sequence: u32, qport: u16, sum: u32) -> Vec<u8> {
    let mut d = Vec::new();
    Header {
        sequence,
        qport: Some(qport),
        checksum: Some(sum),
        fragment: None,
    }
    .write(&mut d);
    d.extend_from_slice(&[0u8; 16]);
    d
}

/// A running server with `showpackets 1` and `sets`, and a player joined to it with the
/// compressed `connect`, speaking `wire` in game.
async fn joined(sets: &[(&str, &str)], qport: u16, wire: Wire) -> (OpenArena, Player) {
    let mut options = Options::new(unique_ip(), "secret").set("showpackets", "1");
    for (k, v) in sets {
        options = options.set(k, v);
    }
    let oa = OpenArena::start_with(options).expect("start openarena-server");
    let mut p = Player::bind(unique_ip(), oa.addr(), qport, Dialect::openarena())
        .await
        .unwrap()
        .with_connect_style(ConnectStyle::Engine)
        .with_netchan(wire);
    p.join(5 * S, S)
        .await
        .expect("the real server reads the compressed connect, echoes both challenges");
    (oa, p)
}

/// Sends ten messages (the third is exactly 1 300 bytes: two fragments, the second empty) and
/// checks the server read their headers.
async fn ten_messages_read(oa: &OpenArena, p: &mut Player) {
    for _ in 0..10 {
        p.send_message().await.unwrap();
    }
    assert!(logged(oa, " : s=10", 5 * S).await, "{}", oa.log());
    assert!(
        logged(oa, " : s=3 fragment=0,1300", S).await,
        "{}",
        oa.log()
    );
    assert!(
        logged(oa, " : s=3 fragment=1300,0", S).await,
        "{}",
        oa.log()
    );
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn debian_openarena_speaks_the_legacy_netchan_under_protocol_71() {
    OpenArena::require();
    let (oa, mut p) = joined(&[], 3333, Wire::Ioq3Legacy).await;
    ten_messages_read(&oa, &mut p).await;
    // The server's stream: headers without checksum, fragments reassembled.
    assert!(p.wait_messages(3, 5 * S).await, "{:?}", p.netchan_counts());
    let c = p.netchan_counts();
    assert_eq!((c.dropped_short, c.dropped_checksum), (0, 0), "{c:?}");
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn stock_ioquake3_checks_the_netchan_checksum() {
    OpenArena::require();
    let qport = 4444;
    let (oa, mut p) = joined(&[("com_legacyprotocol", "68")], qport, Wire::Ioq3).await;
    let challenge = p.challenge().unwrap();
    ten_messages_read(&oa, &mut p).await;
    // A datagram with a wrong checksum is dropped before the log line; the right one is not.
    p.send_datagram(&datagram(50, qport, checksum(challenge, 50) ^ 1))
        .await
        .unwrap();
    p.send_datagram(&datagram(51, qport, checksum(challenge, 51)))
        .await
        .unwrap();
    assert!(logged(&oa, " : s=51", 5 * S).await);
    assert!(!oa.log().lines().any(|l| l.trim_end().ends_with(" : s=50")));
    // The server's stream passes this client's checksum check and reassembly.
    assert!(p.wait_messages(3, 5 * S).await, "{:?}", p.netchan_counts());
    let c = p.recv_messages(Duration::from_millis(300)).await;
    assert_eq!((c.dropped_short, c.dropped_checksum), (0, 0), "{c:?}");
}
