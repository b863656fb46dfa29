//! The frame decoder (`POST /v2/relay` bodies; the previous hop is the link's client).
//!
//! Oracle: a decoded frame encodes back to exactly the bytes received, its length is its class's
//! frame length, and its digest is the digest of those bytes from that previous hop (another
//! previous hop, another digest); a `BRE1` body is always `V1Envelope`; anything else is a
//! framing error found before anything is copied. Any packet bytes behind a valid version and
//! class, at the class's length, always decode.
#![no_main]

use blindrelay::proto::frame::{Frame, frame_len};
use blindrelay::proto::sphinx::{FramingError, SizeClass, V1_MAGIC, VERSION};
use libfuzzer_sys::fuzz_target;

const FROM: [u8; 32] = [0x33; 32];

fuzz_target!(|data: &[u8]| {
    match Frame::decode(data, FROM) {
        Ok(frame) => {
            assert_eq!(frame.encode(), data);
            assert_eq!(data.len(), frame_len(frame.class));
            let again = Frame::decode(data, FROM).expect("again");
            assert_eq!(frame.request_digest(), again.request_digest());
            let other = Frame::decode(data, [0x34; 32]).expect("from another");
            assert_ne!(frame.request_digest(), other.request_digest());
        }
        Err(FramingError::V1Envelope) => assert!(data.starts_with(&V1_MAGIC)),
        Err(_) => assert!(!data.starts_with(&V1_MAGIC)),
    }
    // The fuzzer's bytes as the packet of a class-0 frame: always decodes.
    let class = SizeClass::Small;
    let mut framed = vec![0u8; frame_len(class)];
    framed[0] = VERSION;
    framed[1] = class.to_byte();
    let n = data.len().min(framed.len() - 2);
    framed[2..2 + n].copy_from_slice(&data[..n]);
    let frame = Frame::decode(&framed, FROM).expect("well framed");
    assert_eq!(frame.encode(), framed);
    assert_eq!(frame.packet.len(), framed.len());
});
