//! Peeling a v2 packet: one hop with a current and a previous onion secret.
//!
//! Inputs are either raw bytes (as a class-0 packet), or a packet built for a route through the
//! hop from the fuzzer's fields and then possibly changed at one byte. Oracle: peeling never
//! panics; an untouched packet peels with either secret to what was built (the next hop and a
//! packet of the same length, or the payload); a changed one never peels.
#![no_main]

use blindrelay::proto::sphinx::{
    Action, Delivery, HopSpec, SizeClass, VERSION, build_with, peel, peel_in_place,
};
use libfuzzer_sys::fuzz_target;
use x25519_dalek::{PublicKey, StaticSecret};

const EXPIRES: u64 = 1_764_450_600;

fuzz_target!(|data: &[u8]| {
    let current = StaticSecret::from([0x51; 32]);
    let previous = StaticSecret::from([0x52; 32]);
    let secrets = [&current, &previous];
    let [sel, flip_at_hi, flip_at_lo, flip, rest @ ..] = data else {
        let _ = peel(&secrets, data);
        return;
    };
    if sel & 1 == 0 {
        // Raw bytes behind a valid version and class.
        let mut packet = vec![0u8; SizeClass::Small.packet_len()];
        packet[0] = VERSION;
        let n = rest.len().min(packet.len() - 1);
        packet[1..1 + n].copy_from_slice(&rest[..n]);
        let _ = peel(&secrets, &packet);
        let _ = peel_in_place(&secrets, &mut packet);
        return;
    }
    // A route of 1..=3 hops whose first hop is this one (with either key).
    let key = if sel & 2 == 0 { &current } else { &previous };
    let hops = 1 + usize::from(sel >> 2) % 3;
    let mut specs = vec![HopSpec {
        node_id: [0x44; 32],
        onion_key: PublicKey::from(key).to_bytes(),
        expires_at: EXPIRES,
    }];
    for i in 1..hops {
        specs.push(HopSpec {
            node_id: [0x44 + i as u8; 32],
            onion_key: PublicKey::from(&StaticSecret::from([0x60 + i as u8; 32])).to_bytes(),
            expires_at: EXPIRES,
        });
    }
    let payload = &rest[..rest.len().min(SizeClass::Small.capacity())];
    let delivery = Delivery {
        payload,
        probe: sel & 0x20 != 0,
        receipt_key: [0x55; 32],
        message_id: [0x66; 16],
    };
    let Ok(built) = build_with(&specs, &delivery, SizeClass::Small, [0x66; 32]) else {
        return;
    };
    let mut packet = built.packet;
    let changed = *flip != 0;
    if changed {
        let at = usize::from(u16::from_be_bytes([*flip_at_hi, *flip_at_lo])) % packet.len();
        packet[at] ^= flip;
    }
    match peel(&secrets, &packet) {
        Ok(peeled) => {
            assert!(!changed, "a changed packet peeled");
            assert_eq!(peeled.replay_tag, built.replay_tags[0]);
            assert_eq!(peeled.expires_at, EXPIRES);
            match peeled.action {
                Action::Forward {
                    next_hop,
                    packet: next,
                } => {
                    assert!(hops > 1);
                    assert_eq!(next_hop, specs[1].node_id);
                    assert_eq!(next.len(), packet.len());
                }
                Action::Deliver {
                    payload: got,
                    probe,
                    ..
                } => {
                    assert_eq!(hops, 1);
                    assert_eq!(got, payload);
                    assert_eq!(probe, delivery.probe);
                }
            }
        }
        Err(_) => assert!(changed, "an untouched packet did not peel"),
    }
});
