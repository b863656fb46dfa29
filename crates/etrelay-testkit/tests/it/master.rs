//! The scripted masters list a scripted ET server that heartbeats them
//! directly (et-protocol.md §5).

use std::time::Duration;

use etrelay_testkit::master::parse_getservers_response;
use etrelay_testkit::udp::{bind, exchange, oob};
use etrelay_testkit::{Dispatch, FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, unique_ip};

const WAIT: Duration = Duration::from_secs(3);

async fn getservers(master: &FakeMaster, query: &[u8]) -> Vec<std::net::SocketAddr> {
    let sock = bind(unique_ip()).await.unwrap();
    let replies = exchange(
        &sock,
        master.addr(),
        &oob(query),
        Duration::from_millis(100),
        Duration::from_millis(500),
    )
    .await;
    assert!(!replies.is_empty(), "no getserversResponse");
    assert!(replies.last().unwrap().1.ends_with(b"\\EOT\0\0\0"));
    replies
        .iter()
        .flat_map(|(_, p)| parse_getservers_response(p))
        .collect()
}

#[tokio::test]
async fn classic_lists_a_heartbeating_et_server() {
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let server = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();

    server
        .heartbeat(master.addr(), "EnemyTerritory-1")
        .await
        .unwrap();
    assert!(
        master.wait_listed(server.addr(), WAIT).await,
        "rejections: {:?}",
        master.rejections()
    );
    assert_eq!(
        master.wait_heartbeats("EnemyTerritory-1", 1, WAIT).await,
        vec![server.addr()]
    );
    // The challenge came as `getinfo <8-11 chars>` with no newline.
    let challenge = server
        .received()
        .into_iter()
        .find(|r| r.dispatch == Dispatch::GetInfo)
        .expect("the master's getinfo");
    assert_eq!(challenge.from, master.addr());
    let text = String::from_utf8_lossy(&challenge.packet[4..]).into_owned();
    let c = text.strip_prefix("getinfo ").unwrap();
    assert!((8..=11).contains(&c.len()), "{text:?}");

    assert_eq!(
        getservers(&master, b"getservers 84").await,
        vec![server.addr()]
    );
    assert_eq!(
        getservers(&master, b"getservers 84 empty full\n").await,
        vec![server.addr()]
    );
    assert!(
        getservers(&master, b"getservers 71 empty full")
            .await
            .is_empty()
    );
    assert!(master.rejections().is_empty(), "{:?}", master.rejections());

    // A flatline is recorded, ignored, and the server stays listed.
    server
        .heartbeat(master.addr(), "ETFlatline-1")
        .await
        .unwrap();
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, WAIT).await.len(),
        1
    );
    assert_eq!(master.listed(), vec![server.addr()]);
    assert_eq!(server.count(Dispatch::GetInfo), 1);
}

#[tokio::test]
async fn etmaster_lists_a_heartbeating_et_server() {
    let master = FakeMaster::start(unique_ip(), MasterStyle::EtMaster).unwrap();
    let server = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();

    server
        .heartbeat(master.addr(), "EnemyTerritory-1")
        .await
        .unwrap();
    assert!(
        master.wait_listed(server.addr(), WAIT).await,
        "rejections: {:?}",
        master.rejections()
    );
    let from_master: Vec<_> = server
        .received()
        .into_iter()
        .filter(|r| r.from == master.addr())
        .collect();
    assert_eq!(from_master.len(), 2);
    assert_eq!(from_master[0].dispatch, Dispatch::GetChallenge);
    assert_eq!(from_master[0].packet.len(), 27, "getChallenge + 10 digits");
    assert_eq!(from_master[1].dispatch, Dispatch::GetInfo);
    assert_eq!(from_master[1].packet.len(), 22, "getInfo + 10 chars");
    assert_eq!(
        getservers(&master, b"getservers 84").await,
        vec![server.addr()]
    );
}

#[tokio::test]
async fn classic_rejections() {
    rejections(MasterStyle::Classic).await;
}

#[tokio::test]
async fn etmaster_rejections() {
    rejections(MasterStyle::EtMaster).await;
}

async fn rejections(style: MasterStyle) {
    {
        let master = FakeMaster::start(unique_ip(), style).unwrap();

        // ET server heartbeating as Quake 3: game name mismatch.
        let server = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
        server
            .heartbeat(master.addr(), "QuakeArena-1")
            .await
            .unwrap();
        assert_eq!(
            master.wait_heartbeats("QuakeArena-1", 1, WAIT).await.len(),
            1
        );
        assert!(
            !master
                .wait_listed(server.addr(), Duration::from_millis(500))
                .await
        );
        assert!(
            master
                .rejections()
                .iter()
                .any(|(a, r)| *a == server.addr() && r.contains("game name")),
            "{style:?}: {:?}",
            master.rejections()
        );

        // Unknown tag, and a capitalised "Heartbeat" (not a heartbeat).
        server.heartbeat(master.addr(), "Bogus-1").await.unwrap();
        server
            .send_from_own_socket(master.addr(), &oob(b"Heartbeat EnemyTerritory-1\n"))
            .await
            .unwrap();
        assert_eq!(master.wait_heartbeats("Bogus-1", 1, WAIT).await.len(), 1);

        // A dead server: the 2 s window runs out.
        let dead = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
        dead.set_answering(false);
        dead.heartbeat(master.addr(), "EnemyTerritory-1")
            .await
            .unwrap();
        assert!(
            !master
                .wait_listed(dead.addr(), Duration::from_millis(2600))
                .await
        );
        assert!(
            master
                .rejections()
                .iter()
                .any(|(a, r)| *a == dead.addr() && r.contains("within")),
            "{style:?}: {:?}",
            master.rejections()
        );
        assert!(dead.count(Dispatch::GetInfo) + dead.count(Dispatch::GetChallenge) >= 1);

        // An infoResponse from an address that never heartbeated.
        let stranger = bind(unique_ip()).await.unwrap();
        stranger
            .send_to(
                &oob(b"infoResponse\n\\challenge\\x\\protocol\\84\\sv_maxclients\\8\\clients\\0"),
                master.addr(),
            )
            .await
            .unwrap();

        let tags: Vec<String> = master.heartbeats().into_iter().map(|(_, t)| t).collect();
        assert_eq!(tags, ["QuakeArena-1", "Bogus-1", "EnemyTerritory-1"]);
        assert!(master.listed().is_empty());
        let _ = getservers(&master, b"getservers 84").await; // after the stranger's packet
        assert!(
            master
                .rejections()
                .iter()
                .any(|(a, r)| *a == stranger.local_addr().unwrap() && r.contains("unknown server")),
            "{style:?}: {:?}",
            master.rejections()
        );
        assert!(
            master
                .rejections()
                .iter()
                .any(|(_, r)| r.contains("unknown heartbeat tag")),
            "{style:?}"
        );
    }
}
