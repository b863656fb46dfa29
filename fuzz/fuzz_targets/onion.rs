//! Onion peeling (v1 layers): one hop with a current and a previous onion secret.
//!
//! Inputs are either raw blobs, or a layer sealed to the hop from the fuzzer's fields and then
//! possibly changed at one byte. Oracle: peeling never panics; an untouched layer peels to
//! exactly what was sealed (with either secret); a changed one never peels; a forward layer
//! always carries an inner layer big enough to be one.
#![no_main]

use blindrelay::proto::{Layer, peel, seal_layer};
use libfuzzer_sys::fuzz_target;
use x25519_dalek::{PublicKey, StaticSecret};

const HOP_ID: [u8; 32] = [0x44; 32];
/// Smallest layer: ephemeral key, nonce, tag, terminal header.
const MIN_LAYER: usize = 32 + 24 + 16 + 33;

fn check_peeled(layer: &Layer) {
    if let Layer::Forward { inner, .. } = layer {
        assert!(
            inner.len() >= MIN_LAYER,
            "forward layer with a {}-byte inner",
            inner.len()
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let current = StaticSecret::from([0x51; 32]);
    let previous = StaticSecret::from([0x52; 32]);
    let secrets = [&current, &previous];
    let [sel, flip_at, flip, rest @ ..] = data else {
        if let Ok(layer) = peel(&HOP_ID, &secrets, data) {
            check_peeled(&layer);
        }
        return;
    };
    if sel & 1 == 0 {
        // A raw blob.
        if let Ok(layer) = peel(&HOP_ID, &secrets, rest) {
            check_peeled(&layer);
        }
        return;
    }
    // A layer sealed to the hop from the fuzzer's fields.
    let layer = if sel & 2 == 0 && rest.len() >= 48 {
        Layer::Forward {
            next_hop: rest[..32].try_into().expect("32 bytes"),
            next_route_id: rest[32..48].try_into().expect("16 bytes"),
            inner: rest[48..].to_vec(),
        }
    } else {
        let mut receipt_key = [0u8; 32];
        let n = rest.len().min(32);
        receipt_key[..n].copy_from_slice(&rest[..n]);
        Layer::Terminal {
            receipt_key,
            payload: rest[n..].to_vec(),
        }
    };
    let key = if sel & 4 == 0 { &current } else { &previous };
    let mut blob = seal_layer(&HOP_ID, PublicKey::from(key).as_bytes(), &layer);
    let changed = *flip != 0;
    if changed {
        let i = usize::from(*flip_at) % blob.len();
        blob[i] ^= flip;
    }
    let hop = if sel & 8 == 0 { HOP_ID } else { [0x45; 32] };
    match peel(&hop, &secrets, &blob) {
        Ok(peeled) => {
            assert!(!changed, "a changed layer peeled");
            assert_eq!(hop, HOP_ID, "a layer for another hop peeled");
            assert_eq!(peeled, layer);
            check_peeled(&peeled);
        }
        Err(_) => {
            let too_small =
                matches!(&layer, Layer::Forward { inner, .. } if inner.len() < MIN_LAYER);
            assert!(
                changed || hop != HOP_ID || too_small,
                "an untouched layer did not peel"
            );
        }
    }
});
