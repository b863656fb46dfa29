//! An ET client model joins the scripted ET 2.60b server in its engine handshake: a Huffman
//! `connect`, ET's checks and refusals, then a two-way netchan of XOR-encoded, fragmented,
//! patterned messages counted on both sides. Direct, no relay.

use std::net::SocketAddr;
use std::time::Duration;

use etrelay_testkit::fake_server::{CHALLENGE_REFUSAL, PROTOCOL_REFUSAL};
use etrelay_testkit::huffman::connect_packet;
use etrelay_testkit::player::{ConnectStyle, Dialect, JoinError, Player};
use etrelay_testkit::udp::{bind, exchange, oob};
use etrelay_testkit::{Dispatch, FakeEtConfig, FakeEtServer, unique_ip};

const S: Duration = Duration::from_secs(1);
const QUIET: Duration = Duration::from_millis(100);

async fn engine_player(server: SocketAddr, qport: u16) -> Player {
    Player::bind(unique_ip(), server, qport, Dialect::Et)
        .await
        .unwrap()
        .with_connect_style(ConnectStyle::Engine)
}

/// The refusal text as `JoinError::Refused` carries it.
fn refused(text: &str) -> JoinError {
    JoinError::Refused(text.strip_prefix("print\n").unwrap().trim().to_string())
}

#[tokio::test]
async fn a_huffman_join_then_200_messages_each_way_decode() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::engine()).unwrap();
    let mut p = engine_player(et.addr(), 4242).await;
    p.join(5 * S, S).await.expect("joins");
    assert_eq!(et.count(Dispatch::HuffmanConnect), 1);
    assert_eq!(et.count(Dispatch::Connect), 0);
    assert_eq!(et.clients(), vec![(p.local_addr().unwrap(), 4242)]);
    assert!(p.challenge().unwrap() > 0);

    let c = p.play(200, 5 * S).await.unwrap();
    let s = et.netchan_counts();
    assert_eq!(
        (c.messages_sent, c.decoded_ok, c.decoded_bad),
        (200, 200, 0),
        "{c:?}"
    );
    assert_eq!(
        (s.messages_received, s.decoded_ok, s.decoded_bad),
        (200, 200, 0),
        "{s:?}"
    );
    assert_eq!(s.messages_sent, 200);
    // Fragments both ways (some messages are 1 300 bytes or more), none dropped.
    assert!(
        c.datagrams_sent > 220 && s.datagrams_sent > 220,
        "{c:?} {s:?}"
    );
    assert_eq!(s.datagrams_received, c.datagrams_sent);
    assert_eq!(c.datagrams_received, s.datagrams_sent);
    let drops = |k: &etrelay_testkit::netchan::session::Counts| {
        k.dropped_checksum + k.dropped_order + k.dropped_fragment + k.dropped_short
    };
    assert_eq!((drops(&c), drops(&s)), (0, 0));
    assert_eq!(et.client_counts(4242), Some(s));

    // The server can also stream on its own.
    et.stream(5).await.unwrap();
    assert!(p.wait_messages(205, 5 * S).await);
    assert_eq!(p.netchan_counts().decoded_ok, 205);
}

#[tokio::test]
async fn a_plaintext_connect_is_read_as_plaintext_and_gets_a_netchan_too() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::engine()).unwrap();
    let to = et.addr();
    // Joining and playing from a spawned task (the futures are `Send`).
    let mut p = tokio::spawn(async move {
        let mut p = Player::bind(unique_ip(), to, 77, Dialect::Et)
            .await
            .unwrap();
        p.join(5 * S, S).await.expect("joins");
        p.play(1, 5 * S).await.unwrap();
        p
    })
    .await
    .unwrap();
    assert_eq!(et.count(Dispatch::Connect), 1);
    let c = p.play(19, 5 * S).await.unwrap();
    assert_eq!(c.decoded_ok, 20);
    assert_eq!(et.netchan_counts().decoded_ok, 20);
}

#[tokio::test]
async fn a_wrong_challenge_or_protocol_gets_the_print_refusal() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::engine()).unwrap();
    let mut wrong = engine_player(et.addr(), 1)
        .await
        .with_challenge_override(-5);
    assert_eq!(wrong.join(2 * S, S).await, Err(refused(CHALLENGE_REFUSAL)));
    // An ioquake3 client (protocol 71, plaintext connect) is refused for its protocol.
    let mut q3 = Player::bind(unique_ip(), et.addr(), 2, Dialect::openarena())
        .await
        .unwrap();
    assert_eq!(q3.join(2 * S, S).await, Err(refused(PROTOCOL_REFUSAL)));
    assert!(et.clients().is_empty());
    assert_eq!(et.netchan_counts(), Default::default());
}

#[tokio::test]
async fn challenges_are_per_ip_and_port() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::engine()).unwrap();
    let ip = unique_ip();
    let (asker, other) = (bind(ip).await.unwrap(), bind(ip).await.unwrap());
    let replies = exchange(&asker, et.addr(), &oob(b"getchallenge"), QUIET, S).await;
    let text = String::from_utf8_lossy(&replies[0].1[4..]).into_owned();
    let challenge = text.strip_prefix("challengeResponse ").unwrap();
    let connect = connect_packet(
        format!(
            "\"\\challenge\\{challenge}\\qport\\9\\protocol\\84\\name\\nobody at all\\rate\\25000\\snaps\\20\\cl_maxpackets\\30\\cl_timenudge\\0\""
        )
        .as_bytes(),
    );
    let from_other = exchange(&other, et.addr(), &connect, QUIET, S).await;
    assert_eq!(from_other.len(), 1);
    assert_eq!(from_other[0].1, oob(CHALLENGE_REFUSAL.as_bytes()));
    let from_asker = exchange(&asker, et.addr(), &connect, QUIET, S).await;
    assert_eq!(from_asker[0].1, oob(b"connectResponse"), "ET: no argument");
    assert_eq!(et.clients(), vec![(asker.local_addr().unwrap(), 9)]);
}

#[tokio::test]
async fn in_game_packets_of_strangers_are_recorded_only() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::engine()).unwrap();
    let mut p = engine_player(et.addr(), 31).await;
    p.join(5 * S, S).await.expect("joins");
    let stranger = bind(unique_ip()).await.unwrap();
    let replies = exchange(
        &stranger,
        et.addr(),
        b"\x01\x00\x00\x00\x1f\x00hi",
        QUIET,
        S,
    )
    .await;
    assert!(replies.is_empty());
    assert_eq!(et.count(Dispatch::NotConnectionless), 1);
    assert_eq!(et.game_packets_with_qport(31), 1);
    assert_eq!(et.netchan_counts().datagrams_received, 0);
    // The player's own stream is untouched.
    assert_eq!(p.play(3, 5 * S).await.unwrap().decoded_ok, 3);
}
