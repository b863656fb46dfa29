//! The scripted ET 2.60b server answers like the real one (et-protocol.md §3).

use std::net::SocketAddr;
use std::time::Duration;

use etrelay_testkit::info;
use etrelay_testkit::udp::{bind, exchange, oob};
use etrelay_testkit::{Dispatch, FakeEtConfig, FakeEtServer, unique_ip};
use tokio::net::UdpSocket;

const QUIET: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_millis(500);

/// Sends one OOB payload and returns the replies' bytes (checking they come
/// from `to`).
async fn ask(sock: &UdpSocket, to: SocketAddr, payload: &[u8]) -> Vec<Vec<u8>> {
    exchange(sock, to, &oob(payload), QUIET, MAX_WAIT)
        .await
        .into_iter()
        .map(|(from, bytes)| {
            assert_eq!(from, to, "reply from an unexpected address");
            bytes
        })
        .collect()
}

fn config() -> FakeEtConfig {
    FakeEtConfig {
        players: vec![(12, 48, "Player One".into()), (-1, 999, "bot".into())],
        ..FakeEtConfig::default()
    }
}

#[tokio::test]
async fn getinfo_has_the_et260_keys() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();

    let replies = ask(&sock, server.addr(), b"getinfo xyz123").await;
    assert_eq!(replies.len(), 1);
    let reply = &replies[0];
    assert_ne!(reply.last(), Some(&0), "no trailing NUL");
    let pairs = info::info_response(reply).expect("infoResponse");
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "challenge",
            "protocol",
            "hostname",
            "serverload",
            "mapname",
            "clients",
            "sv_maxclients",
            "gametype",
            "pure",
            "sv_allowAnonymous",
            "friendlyFire",
            "maxlives",
            "needpass",
            "gamename",
            "g_antilag",
            "weaprestrict",
            "balancedteams"
        ]
    );
    assert_eq!(info::get(&pairs, "challenge"), Some("xyz123"));
    assert_eq!(info::get(&pairs, "protocol"), Some("84"));
    assert_eq!(info::get(&pairs, "hostname"), Some("fake-et"));
    assert_eq!(info::get(&pairs, "mapname"), Some("oasis"));
    assert_eq!(info::get(&pairs, "clients"), Some("2"));
    assert_eq!(info::get(&pairs, "sv_maxclients"), Some("20"));
    assert_eq!(info::get(&pairs, "gamename"), Some("et"));

    // Without a challenge there is no challenge key; case and quoting do
    // not matter.
    let replies = ask(&sock, server.addr(), b"GETINFO").await;
    let pairs = info::info_response(&replies[0]).unwrap();
    assert_eq!(info::get(&pairs, "challenge"), None);
    let replies = ask(&sock, server.addr(), b"/**/\"getInfo\" \"q\"").await;
    let pairs = info::info_response(&replies[0]).unwrap();
    assert_eq!(info::get(&pairs, "challenge"), Some("q"));

    server.set_cvar("sv_hostname", "renamed");
    let replies = ask(&sock, server.addr(), b"getinfo 1").await;
    let pairs = info::info_response(&replies[0]).unwrap();
    assert_eq!(info::get(&pairs, "hostname"), Some("renamed"));
    assert_eq!(server.count(Dispatch::GetInfo), 4);
    assert!(
        server
            .received()
            .iter()
            .all(|r| r.from == sock.local_addr().unwrap())
    );
}

#[tokio::test]
async fn getstatus_lists_serverinfo_and_players() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();

    let replies = ask(&sock, server.addr(), b"getstatus abc").await;
    assert_eq!(replies.len(), 1);
    assert!(replies[0].ends_with(b"\"bot\"\n"));
    let status = info::status_response(&replies[0]).expect("statusResponse");
    assert_eq!(info::get(&status.info, "challenge"), Some("abc"));
    assert_eq!(status.info.last().unwrap().0, "challenge", "ET appends");
    assert_eq!(info::get(&status.info, "sv_hostname"), Some("fake-et"));
    assert_eq!(info::get(&status.info, "mapname"), Some("oasis"));
    assert_eq!(
        status.players,
        vec![(12, 48, "Player One".into()), (-1, 999, "bot".into())]
    );

    server.set_players(vec![]);
    let replies = ask(&sock, server.addr(), b"getstatus").await;
    assert!(replies[0].ends_with(b"\n"));
    let status = info::status_response(&replies[0]).unwrap();
    assert_eq!(info::get(&status.info, "challenge"), None);
    assert!(status.players.is_empty());
}

#[tokio::test]
async fn bad_challenges_get_no_reply() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();
    let long = format!("getinfo {}", "a".repeat(65));
    let ok64 = format!("getinfo {}", "a".repeat(64));
    let bad: [&[u8]; 9] = [
        b"getinfo a/b",
        b"getinfo a;b",
        b"getstatus a;b",
        b"getinfo a%b", // '%' became '.' on read: a.b is fine, see below
        b"getinfo \"a\\b\"",
        b"getinfo \"a\x01b\"",
        b"getstatus \"a\x7fb\"",
        b"getinfo \"caf\xe9\"",
        long.as_bytes(),
    ];
    for payload in bad {
        let replies = ask(&sock, server.addr(), payload).await;
        if payload == b"getinfo a%b" {
            let pairs = info::info_response(&replies[0]).unwrap();
            assert_eq!(info::get(&pairs, "challenge"), Some("a.b"));
        } else {
            assert!(
                replies.is_empty(),
                "{:?} was answered",
                String::from_utf8_lossy(payload)
            );
        }
    }
    assert_eq!(ask(&sock, server.addr(), ok64.as_bytes()).await.len(), 1);
    assert_eq!(
        server.count(Dispatch::GetInfo) + server.count(Dispatch::GetStatus),
        10
    );
}

#[tokio::test]
async fn challenge_and_connect() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();

    let replies = ask(&sock, server.addr(), b"getchallenge").await;
    let text = String::from_utf8_lossy(&replies[0][4..]).into_owned();
    let n: i64 = text
        .strip_prefix("challengeResponse ")
        .expect("challengeResponse")
        .parse()
        .unwrap();
    assert!(n > 0);

    let replies = ask(&sock, server.addr(), b"connect \x00\x40\x12\x34").await;
    assert_eq!(replies, vec![oob(b"connectResponse")]);
    assert_eq!(server.count(Dispatch::HuffmanConnect), 1);
    // A plaintext connect needs the challenge given to this address.
    let replies = ask(&sock, server.addr(), b"CONNECT \"\\name\\x\"").await;
    assert_eq!(
        replies,
        vec![oob(b"print\nNo or bad challenge for address.\n")]
    );
    let other = bind(unique_ip()).await.unwrap();
    let with = format!("CONNECT \"\\challenge\\{n}\\qport\\9\\name\\x\"");
    assert_eq!(
        ask(&other, server.addr(), with.as_bytes()).await,
        vec![oob(b"print\nNo or bad challenge for address.\n")],
        "another address's challenge"
    );
    let replies = ask(&sock, server.addr(), with.as_bytes()).await;
    assert_eq!(replies, vec![oob(b"connectResponse")]);
    assert_eq!(server.count(Dispatch::Connect), 3);
    assert_eq!(server.clients(), vec![(sock.local_addr().unwrap(), 9)]);

    // A connected client's in-game packet (qport 9) is answered, from another port of its IP
    // too: the client is re-pointed there ("fixing up a translated port").
    let replies = exchange(
        &sock,
        server.addr(),
        b"\x05\x00\x00\x00\x09\x00hi",
        QUIET,
        MAX_WAIT,
    )
    .await;
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].1, b"\x05\x00\x00\x00snap");
    let moved = bind(sock.local_addr().unwrap().ip().to_string().parse().unwrap())
        .await
        .unwrap();
    let replies = exchange(
        &moved,
        server.addr(),
        b"\x06\x00\x00\x00\x09\x00hi",
        QUIET,
        MAX_WAIT,
    )
    .await;
    assert_eq!(replies.len(), 1);
    assert_eq!(server.fixups(), 1);
    assert_eq!(server.game_packets_with_qport(9), 2);

    // Not answered: disconnect, PunkBuster, unknown, in-game packets of no client.
    for payload in [&b"disconnect"[..], b"PB_SV x", b"hello"] {
        assert!(ask(&sock, server.addr(), payload).await.is_empty());
    }
    let replies = exchange(
        &sock,
        server.addr(),
        b"\x01\x00\x00\x00abc",
        QUIET,
        MAX_WAIT,
    )
    .await;
    assert!(replies.is_empty());
    assert_eq!(server.count(Dispatch::NotConnectionless), 3);
    assert_eq!(server.count(Dispatch::PunkBuster), 1);
}

#[tokio::test]
async fn rcon_sets_with_the_500ms_gap() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();
    // The gap is global and measured from the last accepted rcon packet.
    let gap = || tokio::time::sleep(Duration::from_millis(550));

    let replies = ask(&sock, server.addr(), b"rcon wrong sets a 1").await;
    assert_eq!(replies, vec![oob(b"print\nBad rconpassword.\n")]);
    gap().await;

    let replies = ask(
        &sock,
        server.addr(),
        b"rcon secret sets relaytest hello world",
    )
    .await;
    assert_eq!(replies, vec![oob(b"print\n")]);
    assert_eq!(server.cvar("relaytest").as_deref(), Some("hello world"));
    // Inside the gap: dropped silently, not executed.
    let replies = ask(&sock, server.addr(), b"rcon secret sets dropped 1").await;
    assert!(replies.is_empty());
    assert_eq!(server.cvar("dropped"), None);
    gap().await;

    // Shows in getstatus; an empty value removes it.
    let replies = ask(&sock, server.addr(), b"getstatus").await;
    let status = info::status_response(&replies[0]).unwrap();
    assert_eq!(info::get(&status.info, "relaytest"), Some("hello world"));
    assert_eq!(
        ask(&sock, server.addr(), b"RCON secret sets relaytest \"\"")
            .await
            .len(),
        1
    );
    assert_eq!(server.cvar("relaytest"), None);
    gap().await;

    // The command text is re-read from the raw line: skip 4 chars, a word.
    let replies = ask(&sock, server.addr(), b"/**/rcon secret sets x 1").await;
    assert_eq!(replies, vec![oob(b"print\n")]);
    assert_eq!(server.cvar("x"), None);
    gap().await;

    let replies = ask(&sock, server.addr(), b"rcon secret status").await;
    let text = String::from_utf8_lossy(&replies[0]).into_owned();
    assert!(
        text.starts_with("\u{fffd}\u{fffd}\u{fffd}\u{fffd}print\nmap: oasis\n"),
        "{text}"
    );
    assert!(text.contains("Player One"));

    assert_eq!(
        server.rcon_executed(),
        [
            "sets relaytest hello world",
            "sets relaytest \"\"",
            "secret sets x 1",
            "status"
        ]
    );
    assert_eq!(server.count(Dispatch::Rcon), 6);
}

#[tokio::test]
async fn not_answering_still_records() {
    let server = FakeEtServer::start(unique_ip(), config()).unwrap();
    let sock = bind(unique_ip()).await.unwrap();
    server.set_answering(false);
    assert!(ask(&sock, server.addr(), b"getinfo x").await.is_empty());
    assert_eq!(server.count(Dispatch::GetInfo), 1);
    server.set_answering(true);
    assert_eq!(ask(&sock, server.addr(), b"getinfo x").await.len(), 1);

    // Sending from the server's own socket.
    server
        .send_from_own_socket(sock.local_addr().unwrap(), b"hello")
        .await
        .unwrap();
    let (from, bytes) = etrelay_testkit::udp::recv_timeout(&sock, MAX_WAIT)
        .await
        .unwrap();
    assert_eq!((from, bytes.as_slice()), (server.addr(), &b"hello"[..]));
    server.stop().await;
}
