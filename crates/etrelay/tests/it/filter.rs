//! The filter against a second, deliberately literal model of the servers' tokenizer
//! (`etrelay_testkit::q3model`, written from the protocol notes, not from the classifier), and
//! through a running relay: rcon never reaches the server, whatever its spelling.

use crate::common;

use std::time::Duration;

use common::*;
use etrelay::et::classify::{Command, Packet, Query, Reject, classify};
use etrelay::server::DropReason;
use etrelay_testkit::q3model::{self, Dispatch, ENGINES};
use etrelay_testkit::{FakeEtConfig, FakeEtServer, udp, unique_ip};
use proptest::prelude::*;

/// Fragments that matter to a Quake 3 tokenizer, and some that do not.
fn fragment() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"rcon".to_vec()),
        Just(b"RCON".to_vec()),
        Just(b"rCoN".to_vec()),
        Just(b"getinfo".to_vec()),
        Just(b"getstatus".to_vec()),
        Just(b"GetChallenge".to_vec()),
        Just(b"connect".to_vec()),
        Just(b"PB_".to_vec()),
        Just(b"disconnect".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"\x07".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\x00".to_vec()),
        Just(b"\x80".to_vec()),
        Just(b"\xff".to_vec()),
        Just(b"\xc3\xa9".to_vec()),
        Just(b"/*".to_vec()),
        Just(b"*/".to_vec()),
        Just(b"//".to_vec()),
        Just(b"/".to_vec()),
        Just(b"*".to_vec()),
        Just(b":".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"%".to_vec()),
        Just(b";".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"secret".to_vec()),
        Just(b"abc123".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..4),
    ]
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(fragment(), 0..8).prop_map(|parts| {
        let mut p = vec![0xff; 4];
        for part in parts {
            p.extend_from_slice(&part);
        }
        p
    })
}

/// What every modelled engine would do with the packet, if they all agree.
fn agreed(packet: &[u8]) -> Option<Dispatch> {
    let first = q3model::dispatch(ENGINES[0], packet);
    ENGINES[1..]
        .iter()
        .all(|&e| q3model::dispatch(e, packet) == first)
        .then_some(first)
}

fn check(packet: &[u8]) -> Result<(), TestCaseError> {
    let verdict = classify(packet);
    let models: Vec<Dispatch> = ENGINES
        .iter()
        .map(|&e| q3model::dispatch(e, packet))
        .collect();
    // Safety: whatever passes is, on every engine, exactly the command the relay thinks it is.
    let expected = match &verdict {
        Packet::Game => Some(Dispatch::NotConnectionless),
        Packet::Query(Query::Info, _) => Some(Dispatch::GetInfo),
        Packet::Query(Query::Status, _) => Some(Dispatch::GetStatus),
        Packet::Pass(Command::GetChallenge) => Some(Dispatch::GetChallenge),
        Packet::Pass(Command::PunkBuster) => Some(Dispatch::PunkBuster),
        Packet::Pass(Command::Connect) => None,
        Packet::Drop(_) => None,
    };
    if let Some(want) = expected {
        for (e, got) in ENGINES.iter().zip(&models) {
            prop_assert_eq!(*got, want, "{:?} on {:?}", e, packet);
        }
    }
    if verdict == Packet::Pass(Command::Connect) {
        for got in &models {
            prop_assert!(
                matches!(got, Dispatch::Connect | Dispatch::HuffmanConnect),
                "{:?}",
                packet
            );
        }
    }
    // rcon on any engine is dropped as rcon.
    if models.contains(&Dispatch::Rcon) {
        prop_assert_eq!(&verdict, &Packet::Drop(Reject::Rcon), "{:?}", packet);
    }
    // Liveness: what every engine reads as the same allowed command passes.
    match agreed(packet) {
        Some(Dispatch::GetChallenge) => {
            prop_assert_eq!(&verdict, &Packet::Pass(Command::GetChallenge))
        }
        Some(Dispatch::HuffmanConnect | Dispatch::Connect) => {
            prop_assert_eq!(&verdict, &Packet::Pass(Command::Connect))
        }
        Some(Dispatch::GetInfo) => prop_assert!(matches!(
            verdict,
            Packet::Query(Query::Info, _) | Packet::Drop(Reject::BadChallenge | Reject::NotAllowed)
        )),
        Some(Dispatch::GetStatus) => prop_assert!(matches!(
            verdict,
            Packet::Query(Query::Status, _)
                | Packet::Drop(Reject::BadChallenge | Reject::NotAllowed)
        )),
        _ => {}
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

    #[test]
    fn classifier_agrees_with_the_literal_model(packet in payload()) {
        check(&packet)?;
    }

    #[test]
    fn classifier_agrees_on_arbitrary_bytes(mut body in proptest::collection::vec(any::<u8>(), 0..40)) {
        let mut p = vec![0xff; 4];
        p.append(&mut body);
        check(&p)?;
    }
}

/// Queries the classifier passes carry exactly the challenge the models read.
#[test]
fn challenges_match_the_model() {
    let cases: &[&[u8]] = &[
        b"getinfo abc",
        b"getstatus \"a b\"",
        b"/* x */getInfo ySpAIF`Vrh",
        b"getinfo x%y",
        b"getstatus\tq\n",
    ];
    for body in cases {
        let p = udp::oob(body);
        let Packet::Query(_, Some(r)) = classify(&p) else {
            panic!("{body:?}")
        };
        for e in ENGINES {
            let argv = q3model::argv(e, &p);
            let mapped: Vec<u8> = p[r.clone()]
                .iter()
                .map(|&b| if b == b'%' { b'.' } else { b })
                .collect();
            assert_eq!(argv[1], mapped, "{e:?} {body:?}");
        }
    }
}

/// Every spelling of rcon some server would run, with the right password.
const RCON_SPELLINGS: &[&[u8]] = &[
    b"rcon secret sets k 1",
    b"RCON secret sets k 1",
    b"rCoN secret sets k 1",
    b"/**/rcon secret sets k 1",
    b"/* x */ rcon secret sets k 1",
    b"\"rcon\" secret sets k 1",
    b"\"RCON\" secret sets k 1",
    b"\x07rcon secret sets k 1",
    b"\trcon secret sets k 1",
    b"\x01\x02 rcon secret sets k 1",
    b"\x80rcon secret sets k 1",
    b"\xffrcon secret sets k 1",
    b"\xc3\xa9rcon secret sets k 1",
    b"rcon\tsecret\tsets k 1",
    b"rcon/* */secret sets k 1",
    b"rcon secret sets k 1\n",
    b"rcon secret sets k 1\x00junk",
];

#[tokio::test]
async fn rcon_never_reaches_the_server() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start(config(et.addr())).await;
    let c = client().await;
    for spelling in RCON_SPELLINGS {
        // Each spelling really is rcon to at least one engine.
        let p = udp::oob(spelling);
        assert!(
            ENGINES
                .iter()
                .any(|&e| q3model::dispatch(e, &p) == Dispatch::Rcon),
            "{spelling:?} is not rcon to any engine"
        );
        c.send_to(&p, relay.addr).await.unwrap();
    }
    // A packet that does pass, sent last from the same client, shows the relay got this far.
    let replies = ask(&c, relay.addr, &udp::oob(b"getchallenge")).await;
    assert_eq!(replies.len(), 1);
    let m = relay.handle.metrics();
    assert_eq!(m.drops(DropReason::Rcon), RCON_SPELLINGS.len() as u64);
    assert_eq!(et.count(Dispatch::Rcon), 0);
    assert!(et.rcon_executed().is_empty());
    assert!(et.received().iter().all(|r| r.dispatch != Dispatch::Rcon));
    // The fake server itself would have run it: sent directly, rcon works.
    let direct = client().await;
    let replies = ask(&direct, et.addr(), &udp::oob(b"RCON secret sets direct 1")).await;
    assert_eq!(replies.len(), 1);
    assert_eq!(et.cvar("direct").as_deref(), Some("1"));
    relay.handle.stop().await;
}

#[tokio::test]
async fn other_commands_are_dropped_and_counted() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let relay = start(config(et.addr())).await;
    let c = client().await;
    let junk: &[&[u8]] = &[
        b"disconnect",
        b"ipAuthorize 1 accept",
        b"heartbeat EnemyTerritory-1",
        b"",
        b"//getinfo",
    ];
    for j in junk {
        c.send_to(&udp::oob(j), relay.addr).await.unwrap();
    }
    let m = relay.handle.metrics();
    assert!(
        eventually(Duration::from_secs(5), || m.drops(DropReason::Filter)
            == junk.len() as u64)
        .await
    );
    assert_eq!(
        relay.handle.session_count(),
        0,
        "dropped packets open no session"
    );
    relay.handle.stop().await;
}
