//! The "Test vectors" section of `docs/blindrelay-protocol.md`: recomputes every value from the
//! code and checks that the document still shows it, so neither can drift from the other.

use ed25519_dalek::SigningKey;

use super::{Receipt, commitment, from_hex};

const DOC: &str = include_str!("../../../../docs/blindrelay-protocol.md");

const PUBLIC_KEY: &str = "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664";
const NEXT_HOP: &str = "a09aa5f47a6759802ff955f8dc2d2a14a5c99d23be97f864127ff9383455a4f0";
const COMMITMENT: &str = "1338effea3040ac007b8837e3717764e5d82aafcf29f7430d73bf70f7d68be34";
const RECEIPT_SIGNING_BYTES: &str = concat!(
    "626c696e6472656c61792f726563656970742f7632111111111111111111111111111111111338effea3040a",
    "c007b8837e3717764e5d82aafcf29f7430d73bf70f7d68be34a09aa5f47a6759802ff955f8dc2d2a14a5c99d",
    "23be97f864127ff9383455a4f000000000692b5ed0",
);
const RECEIPT_SIGNATURE: &str = concat!(
    "3e98f57fba53f5e693634504b0a1ee8b311f484942afa55cb01fe4fd40e02ee5a03ce69e6d99fa57ac6ddbf3",
    "2d32754f42172bbff8f2d7837c044767ee8e1302",
);
const RECEIPT: &str = concat!(
    "111111111111111111111111111111111338effea3040ac007b8837e3717764e5d82aafcf29f7430d73bf70f",
    "7d68be34a09aa5f47a6759802ff955f8dc2d2a14a5c99d23be97f864127ff9383455a4f000000000692b5ed0",
    "3e98f57fba53f5e693634504b0a1ee8b311f484942afa55cb01fe4fd40e02ee5a03ce69e6d99fa57ac6ddbf3",
    "2d32754f42172bbff8f2d7837c044767ee8e1302",
);

const TIMESTAMP: u64 = 1_764_450_000;

/// The Ed25519 seed 0x01, 0x02, …, 0x20.
fn sender_key() -> SigningKey {
    let mut seed = [0u8; 32];
    for (b, v) in seed.iter_mut().zip(1u8..) {
        *b = v;
    }
    SigningKey::from_bytes(&seed)
}

/// The terminal of the receipt vector.
fn terminal_key() -> SigningKey {
    SigningKey::from_bytes(&[0x22; 32])
}

#[test]
fn receipt_vectors_match_code() {
    let c = commitment(b"hello");
    assert_eq!(hex::encode(c), COMMITMENT);
    assert_eq!(
        hex::encode(sender_key().verifying_key().as_bytes()),
        PUBLIC_KEY
    );
    assert_eq!(
        hex::encode(terminal_key().verifying_key().as_bytes()),
        NEXT_HOP
    );
    let receipt = Receipt::sign([0x11; 16], c, &terminal_key(), TIMESTAMP);
    assert_eq!(hex::encode(receipt.signing_bytes()), RECEIPT_SIGNING_BYTES);
    assert_eq!(receipt.signing_bytes().len(), 109);
    assert_eq!(hex::encode(receipt.signature), RECEIPT_SIGNATURE);
    assert_eq!(hex::encode(receipt.to_bytes()), RECEIPT);

    let bytes = from_hex::<152>(RECEIPT).expect("vector is hex");
    let parsed = Receipt::from_bytes(&bytes).expect("vector parses");
    assert_eq!(parsed, receipt);
    let terminal_id = terminal_key().verifying_key().to_bytes();
    assert_eq!(
        parsed.verify(&[0x11; 16], &c, &terminal_id, TIMESTAMP),
        Ok(())
    );
}

#[test]
fn doc_shows_the_vectors() {
    let section = DOC
        .split_once("## Test vectors")
        .map(|(_, section)| section)
        .expect("docs/blindrelay-protocol.md has a \"Test vectors\" section");
    for (name, value) in [
        ("public key", PUBLIC_KEY),
        ("next hop", NEXT_HOP),
        ("commitment", COMMITMENT),
        ("receipt signing bytes", RECEIPT_SIGNING_BYTES),
        ("receipt signature", RECEIPT_SIGNATURE),
        ("receipt", RECEIPT),
    ] {
        assert!(
            section.contains(value),
            "the doc's test vectors do not show the {name}: {value}"
        );
    }
    assert!(section.contains(&format!("{TIMESTAMP}")));
}
