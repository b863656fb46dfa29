//! The ET packet classifier against the literal tokenizer model (`etrelay_testkit::q3model`).
//!
//! Oracle: whatever the relay passes is, on every modelled server, exactly the allowed command
//! the relay thinks it is (never `rcon`, `disconnect`, `ipAuthorize` or `updateResponse`), with
//! the same challenge; whatever any server would run as `rcon` is dropped as rcon; and what every
//! server reads as the same `getchallenge` or `connect` passes.
#![no_main]

use etrelay::et::classify::{Command, Packet, Query, Reject, classify, valid_challenge};
use etrelay::et::tokenizer::Engine as RelayEngine;
use etrelay_testkit::q3model::{self, Dispatch, ENGINES, Engine};
use libfuzzer_sys::fuzz_target;

fn relay_engine(e: Engine) -> RelayEngine {
    match e {
        Engine::Et260 => RelayEngine::Et260,
        Engine::EtLegacy => RelayEngine::EtLegacy,
        Engine::Ioq3 => RelayEngine::Ioq3,
    }
}

fn check(packet: &[u8]) {
    let verdict = classify(packet);
    let models: Vec<Dispatch> = ENGINES
        .iter()
        .map(|&e| q3model::dispatch(e, packet))
        .collect();
    let expected = match &verdict {
        Packet::Game => Some(Dispatch::NotConnectionless),
        Packet::Query(Query::Info, _) => Some(Dispatch::GetInfo),
        Packet::Query(Query::Status, _) => Some(Dispatch::GetStatus),
        Packet::Pass(Command::GetChallenge) => Some(Dispatch::GetChallenge),
        Packet::Pass(Command::PunkBuster) => Some(Dispatch::PunkBuster),
        Packet::Pass(Command::Connect) | Packet::Drop(_) => None,
    };
    if let Some(want) = expected {
        for (e, got) in ENGINES.iter().zip(&models) {
            assert_eq!(
                *got, want,
                "{e:?} runs it as {got:?}, relay says {verdict:?}"
            );
        }
    }
    if verdict == Packet::Pass(Command::Connect) {
        for (e, got) in ENGINES.iter().zip(&models) {
            assert!(
                matches!(got, Dispatch::Connect | Dispatch::HuffmanConnect),
                "{e:?} runs a passed connect as {got:?}"
            );
        }
    }
    // The challenge the relay echoes is the one every server would echo.
    if let Packet::Query(_, challenge) = &verdict {
        for &e in &ENGINES {
            let argv = q3model::argv(e, packet);
            match challenge {
                None => assert!(argv.len() < 2, "{e:?} sees a challenge {argv:?}"),
                Some(r) => {
                    let re = relay_engine(e);
                    let mapped: Vec<u8> = packet[r.clone()].iter().map(|&b| re.map(b)).collect();
                    assert_eq!(argv.get(1), Some(&mapped), "{e:?} challenge");
                    assert!(valid_challenge(&packet[r.clone()]));
                }
            }
        }
    }
    if models.contains(&Dispatch::Rcon) {
        assert_eq!(verdict, Packet::Drop(Reject::Rcon), "rcon on {models:?}");
    }
    // Liveness: what every modelled server reads alike, with no high byte (on which the builds
    // the model leaves out, unsigned `char`, may differ), passes.
    let first = models[0];
    let agreed = models.iter().all(|&m| m == first);
    let high = packet
        .get(4..)
        .is_some_and(|b| b.iter().any(|&b| b >= 0x80));
    if agreed && !high {
        match first {
            Dispatch::GetChallenge => assert_eq!(verdict, Packet::Pass(Command::GetChallenge)),
            Dispatch::HuffmanConnect | Dispatch::Connect => {
                assert_eq!(verdict, Packet::Pass(Command::Connect))
            }
            Dispatch::PunkBuster => assert_eq!(verdict, Packet::Pass(Command::PunkBuster)),
            Dispatch::NotConnectionless => assert_eq!(verdict, Packet::Game),
            Dispatch::GetInfo | Dispatch::GetStatus => {
                let argv1: Vec<Option<Vec<u8>>> = ENGINES
                    .iter()
                    .map(|&e| q3model::argv(e, packet).get(1).cloned())
                    .collect();
                if argv1.iter().all(|a| *a == argv1[0]) {
                    assert!(
                        matches!(
                            verdict,
                            Packet::Query(..) | Packet::Drop(Reject::BadChallenge)
                        ),
                        "every server answers it, relay says {verdict:?}"
                    );
                }
            }
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // As sent, and with the connectionless marker in front (most inputs need it to go deep).
    check(data);
    let mut packet = Vec::with_capacity(data.len() + 4);
    packet.extend_from_slice(&etrelay::et::OOB);
    packet.extend_from_slice(data);
    check(&packet);
});
