//! Real peers: Debian's `openarena-server` (ioquake3, a real Quake 3 engine server) behind the
//! relay, queried by `quakestat` (Debian's `qstat`). `scripts/test` installs both.

use crate::common;

use std::time::Duration;

use common::*;
use etrelay::config::{Game, ServerConfig};
use etrelay::server::DropReason;
use etrelay_testkit::{FakeMaster, MasterStyle, OpenArena, qstat, udp, unique_ip};

const S: Duration = Duration::from_secs(1);
const RCON_PASSWORD: &str = "secret";

fn openarena() -> OpenArena {
    OpenArena::require();
    qstat::require();
    OpenArena::start(unique_ip(), RCON_PASSWORD).expect("start OpenArena")
}

fn q3(oa: &OpenArena) -> ServerConfig {
    let mut c = config(oa.addr());
    c.game = Game::Q3;
    c
}

/// The serverinfo of the real server, asked directly from a fresh address.
async fn serverinfo(oa: &OpenArena) -> Vec<u8> {
    let c = client().await;
    let r = ask(&c, oa.addr(), &udp::oob(b"getstatus check")).await;
    assert_eq!(r.len(), 1, "OpenArena answers getstatus");
    r[0].1.clone()
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn quakestat_reads_openarena_through_the_relay() {
    let oa = openarena();
    let relay = start(q3(&oa)).await;
    let v = qstat::query_json("q3s", relay.addr).await.unwrap();
    assert_eq!(v["status"], "online", "{v}");
    assert_eq!(v["address"], relay.addr.to_string());
    assert_eq!(v["name"], "etrelay-test");
    assert_eq!(v["map"], "oa_dm1");
    assert_eq!(v["rules"]["gamename"], "Quake3Arena");
    assert_eq!(
        v["rules"]["sv_hostname"], "etrelay-test",
        "getstatus answered too: {v}"
    );
    let text = qstat::quakestat(&["-q3s", &relay.addr.to_string()])
        .await
        .unwrap();
    assert!(
        text.contains("etrelay-test") && text.contains("oa_dm1"),
        "{text}"
    );
    relay.handle.stop().await;
}

/// rcon spellings the real ioquake3 server runs when sent to it directly. The server finds the
/// command text by skipping 4 raw bytes and one word of the line, so the password is glued to
/// the spelling in quotes: `<spelling>"secret" sets k v` runs `sets k v` for each of them.
const RUNS_ON_IOQ3: &[&str] = &[
    "rcon",
    "RCON",
    "rCoN",
    "/**/rcon",
    "\"rcon\"",
    "\x07rcon",
    "\trcon",
    "\x01\x02rcon",
];

fn rcon_command(spelling: &str, cmd: &str) -> Vec<u8> {
    udp::oob(format!("{spelling}\"{RCON_PASSWORD}\" {cmd}").as_bytes())
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn rcon_in_any_spelling_never_reaches_openarena() {
    let oa = openarena();
    // Control: sent directly (each from its own address, so the server's per-IP limiter stays
    // out of it), every spelling is run by the real server.
    for (i, spelling) in RUNS_ON_IOQ3.iter().enumerate() {
        let c = client().await;
        let r = ask(
            &c,
            oa.addr(),
            &rcon_command(spelling, &format!("sets direct{i} yes")),
        )
        .await;
        assert!(!r.is_empty(), "{spelling:?}: no rcon reply");
    }
    let info = serverinfo(&oa).await;
    for (i, spelling) in RUNS_ON_IOQ3.iter().enumerate() {
        assert_eq!(
            info_value(&info, &format!("direct{i}")).as_deref(),
            Some("yes"),
            "{spelling:?}"
        );
    }

    // Through the relay: none of them, nor any other spelling, gets there.
    let relay = start(q3(&oa)).await;
    let mut sent = 0;
    for (i, spelling) in RUNS_ON_IOQ3.iter().enumerate() {
        let c = client().await;
        let cmd = rcon_command(spelling, &format!("sets relay{i} yes"));
        assert!(
            ask(&c, relay.addr, &cmd).await.is_empty(),
            "{spelling:?} answered"
        );
        sent += 1;
    }
    for (i, spelling) in [b"\x80rcon".as_slice(), b"\xffrcon", b"rcon\t"]
        .iter()
        .enumerate()
    {
        let c = client().await;
        let mut cmd = spelling.to_vec();
        cmd.extend_from_slice(format!(" {RCON_PASSWORD} sets relayhigh{i} yes").as_bytes());
        assert!(ask(&c, relay.addr, &udp::oob(&cmd)).await.is_empty());
        sent += 1;
    }
    assert_eq!(relay.handle.metrics().drops(DropReason::Rcon), sent);
    let info = serverinfo(&oa).await;
    let keys: Vec<String> = (0..RUNS_ON_IOQ3.len())
        .map(|i| format!("relay{i}"))
        .chain((0..3).map(|i| format!("relayhigh{i}")))
        .collect();
    for k in &keys {
        assert_eq!(
            info_value(&info, k),
            None,
            "an rcon got through: {}",
            String::from_utf8_lossy(&info)
        );
    }
    // The server still runs rcon sent to it directly: the relay is what stopped them.
    let c = client().await;
    assert!(
        !ask(&c, oa.addr(), &rcon_command("rcon", "sets after yes"))
            .await
            .is_empty()
    );
    assert_eq!(
        info_value(&serverinfo(&oa).await, "after").as_deref(),
        Some("yes")
    );
    relay.handle.stop().await;
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn twenty_browsers_at_once_all_get_answers() {
    let oa = openarena();
    // The 20 addresses below share one /24: counted by /32, each has its own answer budget
    // (20 browsers of one /24 at once would be over the default budget of 3 per /24).
    let mut config = q3(&oa);
    config.reflection.v4_prefix = 32;
    let relay = start(config).await;
    // 20 real browsers, each from its own address, all at once.
    let ips: Vec<String> = etrelay_testkit::unique_ips(20)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let outputs = within(
        30 * S,
        "20 quakestat runs",
        browsers(&ips, &relay.addr.to_string()),
    )
    .await;
    let mut online = 0;
    for out in &outputs {
        let out = out.as_ref().expect("quakestat ran");
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        if v[0]["status"] == "online" && v[0]["rules"]["sv_hostname"] == "etrelay-test" {
            online += 1;
        }
    }
    assert_eq!(online, 20, "{outputs:?}");
    let m = relay.handle.metrics();
    // 40 queries cost the real server a handful; it answered every one of them: its own
    // limiter (burst 10, then 1/s for the relay's single source IP) never tripped.
    assert!(m.cache_refreshes.get() <= 4, "{}", m.cache_refreshes.get());
    assert_eq!(m.cache_refreshes.get(), m.cache_refresh_answers.get());
    assert!(m.cache_hits.get() >= 40);
    relay.handle.stop().await;

    // Without the cache, the same 20 browsers reach the server from one IP, and its limiter
    // leaves some of them without an answer: the reason the cache exists.
    let mut cfg = q3(&oa);
    cfg.cache_max_age = Duration::ZERO;
    let bare = start(cfg).await;
    let outputs = within(
        30 * S,
        "20 quakestat runs",
        browsers(&ips, &bare.addr.to_string()),
    )
    .await;
    let answered = outputs
        .iter()
        .filter(|o| {
            let v: serde_json::Value = serde_json::from_str(o.as_ref().unwrap()).unwrap();
            v[0]["status"] == "online" && v[0]["rules"]["sv_hostname"] == "etrelay-test"
        })
        .count();
    assert!(answered < 20, "without the cache all 20 were answered");
    bare.handle.stop().await;
}

/// Runs `quakestat` once per source address, all at once; outputs in order.
async fn browsers(ips: &[String], target: &str) -> Vec<std::io::Result<String>> {
    let tasks: Vec<_> = ips
        .iter()
        .map(|ip| {
            let (ip, target) = (ip.clone(), target.to_string());
            tokio::spawn(async move {
                qstat::quakestat(&["-json", "-R", "-P", "-srcip", &ip, "-q3s", &target]).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("quakestat task"));
    }
    out
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn a_master_lists_the_relay_in_front_of_openarena() {
    let oa = openarena();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let mut cfg = q3(&oa);
    cfg.masters = vec![master.addr().to_string()];
    let relay = start(cfg).await;
    assert!(
        master.wait_listed(relay.addr, 10 * S).await,
        "{:?}",
        master.rejections()
    );
    assert_eq!(master.listed(), vec![relay.addr]);
    assert!(
        master
            .heartbeats()
            .iter()
            .all(|(from, tag)| *from == relay.addr && tag == "QuakeArena-1")
    );
    relay.handle.stop().await;
}

/// The classifier reads queries as the real server does: whatever it lets through as `getinfo`
/// the server answers, with the same challenge.
#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn what_the_classifier_passes_the_real_server_answers() {
    use etrelay::et::classify::{Packet, Query, Reject, classify};
    let oa = openarena();
    let corpus: &[&[u8]] = &[
        b"getinfo a1",
        b"GETINFO a2",
        b"  getinfo a3",
        b"\"getinfo\" a4",
        b"/* c */getinfo a5",
        b"/*/getinfo a6",
        b"/*/ getinfo */a7",
        b"\tgetinfo\ta8",
        b"\x01getinfo a9",
        b"getinfo \"b c\"",
        b"getinfo d%e",
        b"getinfo http://x",
        b"getinfo/*c*/z",
        b"//getinfo n1",
        b"get\"info\" n2",
        b"/*getinfo n3",
        b"getinfo\n n4",
    ];
    let mut passed = 0;
    for body in corpus {
        let packet = udp::oob(body);
        let c = client().await;
        let replies = ask(&c, oa.addr(), &packet).await;
        match classify(&packet) {
            Packet::Query(Query::Info, challenge) => {
                passed += 1;
                assert_eq!(
                    replies.len(),
                    1,
                    "{:?} passes but the server does not answer",
                    String::from_utf8_lossy(body)
                );
                let want = challenge.map(|r| String::from_utf8_lossy(&packet[r]).replace('%', "."));
                assert_eq!(
                    info_value(&replies[0].1, "challenge"),
                    want,
                    "{:?}",
                    String::from_utf8_lossy(body)
                );
            }
            // Dropped where the server answers: only when the builds disagree, or for a
            // challenge ET 2.60b (the strictest) would not answer.
            other => assert!(
                replies.is_empty()
                    || matches!(
                        other,
                        Packet::Drop(Reject::NotAllowed | Reject::BadChallenge)
                    ),
                "{:?}: {other:?}",
                String::from_utf8_lossy(body)
            ),
        }
        // Keep clear of the server's global query bucket (10, then one per 100 ms).
        tokio::time::sleep(std::time::Duration::from_millis(110)).await;
    }
    assert!(passed >= 12, "only {passed} passed");
}
