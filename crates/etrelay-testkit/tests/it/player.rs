//! The test client's handshake against the real ioquake3 server of Debian's
//! `openarena-server`: it joins and then receives the server's in-game stream.
//!
//! `#[ignore]`d (it needs `openarena-server`); asked for without it, it fails saying so.

use std::time::Duration;

use etrelay_testkit::player::{Dialect, Player};
use etrelay_testkit::{OpenArena, unique_ip};

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn a_player_joins_the_real_server_and_gets_its_stream() {
    OpenArena::require();
    let oa = OpenArena::start(unique_ip(), "secret").expect("start openarena-server");
    let mut a = Player::bind(unique_ip(), oa.addr(), 1111, Dialect::openarena())
        .await
        .unwrap();
    let mut b = Player::bind(unique_ip(), oa.addr(), 2222, Dialect::openarena())
        .await
        .unwrap();
    let took = a
        .join(Duration::from_secs(5), Duration::from_secs(1))
        .await
        .expect("player a joins");
    assert!(took < Duration::from_secs(2), "{took:?}");
    b.join(Duration::from_secs(5), Duration::from_secs(1))
        .await
        .expect("player b joins");
    a.send_game(b"hello").await.unwrap();
    assert!(
        a.recv_game(Duration::from_millis(500)).await > 0,
        "the server streams in-game packets to a connected client"
    );
    assert!(b.recv_game(Duration::from_millis(500)).await > 0);
}
