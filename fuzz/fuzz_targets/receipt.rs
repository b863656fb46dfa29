//! Delivery receipts: the sealed bytes a sender opens, and the 152-byte receipt inside.
//!
//! Oracle: opening and verifying never panic; a receipt decodes only from exactly 152 bytes and
//! encodes back to them; a receipt sealed with the key opens to itself, and with one byte
//! changed does not open at all; a forged receipt never verifies.
#![no_main]

use blindrelay::proto::receipt::{open, seal};
use blindrelay::proto::{RECEIPT_LEN, Receipt, ReceiptError, commitment};
use ed25519_dalek::SigningKey;
use libfuzzer_sys::fuzz_target;

const RECEIPT_KEY: [u8; 32] = [0x61; 32];
const NOW: u64 = 1_764_450_000;

fuzz_target!(|data: &[u8]| {
    let [sel, flip_at, flip, rest @ ..] = data else {
        return;
    };
    match Receipt::from_bytes(rest) {
        Ok(r) => {
            assert_eq!(rest.len(), RECEIPT_LEN);
            assert_eq!(r.to_bytes().as_slice(), rest);
            // A receipt that verifies (the seeds hold a real one) no longer does with any byte
            // changed, even when the sender's expectations follow the change.
            if r.verify(&r.message_id, &r.commitment, &r.terminal_id, r.delivered_at)
                .is_ok()
            {
                let mut forged = r.to_bytes();
                forged[usize::from(*flip_at) % RECEIPT_LEN] ^= flip | 1;
                let f = Receipt::from_bytes(&forged).expect("152 bytes");
                let v = f.verify(&f.message_id, &f.commitment, &f.terminal_id, f.delivered_at);
                assert_eq!(
                    v,
                    Err(ReceiptError::BadSignature),
                    "a forged receipt verified"
                );
            }
            let sealed = seal(&r, &RECEIPT_KEY);
            assert_eq!(open(&sealed, &RECEIPT_KEY), Ok(r.clone()));
            let mut bad = sealed.clone();
            let i = usize::from(*flip_at) % bad.len();
            bad[i] ^= flip | 1;
            assert_eq!(open(&bad, &RECEIPT_KEY), Err(ReceiptError::Sealed));
        }
        Err(e) => assert!(e == ReceiptError::Malformed && rest.len() != RECEIPT_LEN),
    }
    // Raw bytes as sealed receipts.
    if let Ok(r) = open(rest, &RECEIPT_KEY) {
        let _ = r.verify(&r.message_id, &r.commitment, &r.terminal_id, NOW);
    }
    // A real receipt over the fuzzer's payload verifies; any other expectation does not.
    if sel & 1 == 1 {
        let key = SigningKey::from_bytes(&[0x22; 32]);
        let route = [*flip_at; 16];
        let c = commitment(rest);
        let r = Receipt::sign(route, c, &key, NOW);
        let id = key.verifying_key().to_bytes();
        assert_eq!(r.verify(&route, &c, &id, NOW), Ok(()));
        let opened = open(&seal(&r, &RECEIPT_KEY), &RECEIPT_KEY).expect("opens");
        assert_eq!(opened.verify(&route, &c, &id, NOW), Ok(()));
        let mut other = rest.to_vec();
        other.push(*flip);
        assert_eq!(
            r.verify(&route, &commitment(&other), &id, NOW),
            Err(ReceiptError::WrongPayload)
        );
    }
});
