use proptest::prelude::*;

use super::*;

fn round_trip(data: &[u8]) -> Vec<u8> {
    let mut c = Codec::default();
    let mut block = Vec::new();
    c.compress(data, &mut block);
    let mut back = Vec::new();
    c.decompress(&block, MAX_BLOCK, &mut back)
        .expect("own block");
    back
}

#[test]
fn known_blocks() {
    // Blocks the engine's own compressor (`Huff_Compress`) wrote for these inputs.
    let cases: [(&[u8], &str); 2] = [
        (
            b"\"\\challenge\\-1179385436\\qport\\4321\\protocol\\71\\name\\UnnamedPlayer\\rate\\25000\\snaps\\20\\cl_guid\\0123456789ABCDEF0123456789ABCDEF\"",
            "007f4474308e050cc726c314ec8ef967d01a4629d801e7c37c702cac03cb6ed89038060e8abde1c4b83097c074b452c3ebfac6540c046c6f34aa958b2b0e13810212c453552ea99b2f2018569fbe385bdad1feb30fdfe8633dae329678cf09f6ff3ecf4d5810fc235421cc225220fa46ecff39deb7836d532d17f3d9cc02",
        ),
        (
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            "005486ffffffffff67a4aaaaaaaaaaaaaaaaaa02",
        ),
    ];
    let mut c = Codec::default();
    for (data, block) in cases {
        let block = hex::decode(block).expect("hex");
        let mut out = Vec::new();
        c.compress(data, &mut out);
        assert_eq!(out, block);
        let mut back = Vec::new();
        c.decompress(&block, MAX_BLOCK, &mut back)
            .expect("engine's block");
        assert_eq!(back, data);
    }
    // Nothing to compress: the length field and one spare byte (the engine writes nothing).
    let mut out = Vec::new();
    c.compress(b"", &mut out);
    assert_eq!(out, [0x00, 0x00, 0x00]);
}

#[test]
fn bad_blocks_are_refused() {
    let mut c = Codec::default();
    let mut out = Vec::new();
    assert_eq!(
        c.decompress(&[0x00], 100, &mut out),
        Err(HuffmanError::Short)
    );
    assert_eq!(
        c.decompress(&[0x10, 0x00, 0xff], 100, &mut out),
        Err(HuffmanError::TooLong)
    );
    // Bits that end early end the text there.
    c.decompress(&[0x00, 0x40, 0x86], 100, &mut out).unwrap();
    assert_eq!(out, b"a");
}

proptest! {
    #[test]
    fn any_bytes_round_trip(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        prop_assert_eq!(round_trip(&data), data);
    }

    #[test]
    fn userinfo_like_text_round_trips(
        data in proptest::collection::vec(
            proptest::sample::select(&b"\\abcdefgnoprst0123456789_"[..]),
            0..1024,
        )
    ) {
        prop_assert_eq!(round_trip(&data), data);
    }

    #[test]
    fn garbage_never_panics(block in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut c = Codec::default();
        let mut out = Vec::new();
        let _ = c.decompress(&block, 4096, &mut out);
        prop_assert!(out.len() <= 4096);
    }
}
