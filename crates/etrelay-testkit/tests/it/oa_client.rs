//! A real Quake 3 engine client (Debian's `openarena`, ioquake3, under Xvfb) joins a real
//! OpenArena server (`openarena-server`) directly, and stays in game with packets flowing both
//! ways.
//!
//! `#[ignore]`d (it needs the Debian packages); asked for (`--include-ignored`, as
//! `scripts/test` and the CI do) without them, it fails naming them.

use std::time::Duration;

use etrelay_testkit::oa_client::{self, OaClient, check_flow};
use etrelay_testkit::{OpenArena, unique_ip};

const S: Duration = Duration::from_secs(1);

#[ignore = "needs openarena, xvfb and openarena-server (apt): the real client and server"]
#[tokio::test]
async fn a_real_client_joins_openarena_and_stays_in_game() {
    oa_client::require_installed();
    let oa = OpenArena::start(unique_ip(), "secret").expect("start openarena-server");
    let mut client = OaClient::start(oa.addr(), "directplayer").expect("start the client");

    let joined = client.wait_in_game(30 * S).await.expect("in game");
    let source = client.source().expect("the client's bound address");
    assert_eq!(
        source.ip(),
        client.ip(),
        "bound to its own loopback address"
    );
    assert!(
        oa.log().contains("directplayer^7 entered the game"),
        "the server saw the join too:\n{}",
        oa.log()
    );
    let first = check_flow(&oa, &mut client, 10 * S).await.expect("flow");
    assert_eq!(first.row.address, client.ip().to_string(), "{first:?}");
    eprintln!(
        "direct: connecting after {:?}, in game after {:?} (display :{}, source {source}); \
         say delivered in {:?}, {:?}",
        joined.connecting,
        joined.in_game,
        client.display(),
        first.say_delivered,
        first.row
    );

    // 30 s in game, checked every 10 s.
    let cpu_before = client.cpu_time();
    for _ in 0..3 {
        tokio::time::sleep(10 * S).await;
        client.check_in_game().expect("still in game");
        let flow = check_flow(&oa, &mut client, 10 * S).await.expect("flow");
        eprintln!("direct: {:?}", flow.row);
    }
    if let (Some(a), Some(b)) = (cpu_before, client.cpu_time()) {
        eprintln!(
            "direct: client CPU in game {:.0} % of one core",
            (b - a).as_secs_f64() / 30.0 * 100.0
        );
    }
    let stopping = std::time::Instant::now();
    client.stop();
    eprintln!("direct: stopped in {:?}", stopping.elapsed());
    // It quit cleanly: the server saw it leave at once, not after its 200 s timeout.
    assert!(
        server_printed(&oa, "directplayer^7 disconnected", 5 * S).await,
        "{}",
        oa.log()
    );
}

/// Waits, at most `limit`, for `text` in the server's log.
async fn server_printed(oa: &OpenArena, text: &str, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while !oa.log().contains(text) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}
