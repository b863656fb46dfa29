//! The CPU one delivery's v2 cryptography costs, on one thread.

use std::time::{Duration, Instant};

use blindrelay::pipeline::{self, HopNext};
use blindrelay::proto::frame::Frame;
use blindrelay::proto::receipt;
use blindrelay::send::Hop;
use ed25519_dalek::SigningKey;
use x25519_dalek::{PublicKey, StaticSecret};

/// One thread's CPU for the cryptography of one delivery over `hops` hops with `payload`:
/// (sender's wrap and receipt check, all hops' check and signing), the minimum of `rounds`.
pub(crate) fn crypto_cost(hops: usize, payload: &[u8], rounds: usize) -> (Duration, Duration) {
    let keys: Vec<(SigningKey, StaticSecret)> = (0..hops)
        .map(|i| {
            (
                SigningKey::from_bytes(&[i as u8 + 1; 32]),
                StaticSecret::from([i as u8 + 101; 32]),
            )
        })
        .collect();
    let path: Vec<Hop> = keys
        .iter()
        .map(|(s, o)| Hop {
            node_id: s.verifying_key().to_bytes(),
            onion_key: PublicKey::from(o).to_bytes(),
        })
        .collect();
    let me = SigningKey::from_bytes(&[77; 32]).verifying_key().to_bytes();
    let now = 1_800_000_000;
    let (mut best_sender, mut best_hops) = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds {
        let t = Instant::now();
        let wrapped = blindrelay::send::wrap::wrap(&path, payload, false, now).expect("wraps");
        let mut sender = t.elapsed();
        let mut frame = Frame::decode(&wrapped.frame, me).expect("a frame");
        let mut on_hops = Duration::ZERO;
        let mut sealed = String::new();
        for (sign, onion) in &keys {
            let id = sign.verifying_key().to_bytes();
            let t = Instant::now();
            let c = pipeline::check_frame(&id, &[onion], frame.clone(), now, &mut None, |_| Ok(()))
                .expect("accepted");
            match c.next {
                HopNext::Forward { packet, .. } => {
                    let from = sign.verifying_key().to_bytes();
                    frame = Frame::new(packet, from).expect("frames");
                }
                HopNext::Terminal {
                    payload,
                    receipt_key,
                    message_id,
                    ..
                } => {
                    sealed = blindrelay::terminal::seal_receipt(
                        sign,
                        &message_id,
                        &receipt_key,
                        &payload,
                        now,
                    );
                }
            }
            on_hops += t.elapsed();
        }
        let t = Instant::now();
        let bytes = hex::decode(&sealed).expect("hex");
        let r = receipt::open(&bytes, &wrapped.receipt_key).expect("opens");
        let terminal = path[hops - 1].node_id;
        r.verify(
            &wrapped.message_id,
            &receipt::commitment(payload),
            &terminal,
            now,
        )
        .expect("verifies");
        sender += t.elapsed();
        best_sender = best_sender.min(sender);
        best_hops = best_hops.min(on_hops);
    }
    (best_sender, best_hops)
}
