//! The blindrelay envelope decoder (`POST /v1/relay` bodies).
//!
//! Oracle: a decoded envelope encodes back to exactly the bytes received, its digest is the
//! digest of those bytes, and checking its signature never panics; anything else is one of the
//! framing errors, found before anything is copied.
#![no_main]

use blindrelay::proto::{DecodeError, Envelope, HEADER_LEN, MAX_BLOB, SIG_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Envelope::decode(data) {
        Ok(env) => {
            assert_eq!(env.encode(), data);
            assert_eq!(data.len(), HEADER_LEN + env.blob.len() + SIG_LEN);
            assert!(env.blob.len() <= MAX_BLOB);
            assert_eq!(
                env.request_digest(),
                Envelope::decode(data).expect("again").request_digest()
            );
            let _ = env.verify();
            // Any change to a signed field or the signature changes the digest.
            let mut other = env.clone();
            other.ttl ^= 1;
            assert_ne!(other.request_digest(), env.request_digest());
        }
        Err(e) => match e {
            DecodeError::TooShort => assert!(data.len() < HEADER_LEN + SIG_LEN),
            DecodeError::BadMagic => assert!(!data.starts_with(b"BRE1")),
            DecodeError::BlobTooLarge | DecodeError::LengthMismatch => {
                assert!(data.len() >= HEADER_LEN + SIG_LEN)
            }
        },
    }
    // The same bytes framed correctly always decode.
    if data.len() <= MAX_BLOB {
        let mut framed = Vec::with_capacity(HEADER_LEN + data.len() + SIG_LEN);
        framed.extend_from_slice(b"BRE1");
        framed.extend_from_slice(&[0x11; 89]);
        framed.extend_from_slice(&(data.len() as u32).to_be_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(&[0x22; SIG_LEN]);
        let env = Envelope::decode(&framed).expect("well framed");
        assert_eq!(env.blob, data);
        assert_eq!(env.encode(), framed);
    }
});
