//! The adaptive Huffman model (`huffman`): vectors produced by the engine's own
//! `code/qcommon/huffman.c` (compiled in a harness outside this repository), round trips, and
//! bounded handling of garbage.

use etrelay_testkit::huffman::{
    MAX_DECOMPRESSED, compress, connect_packet, decompress, decompress_as_engine, server_view,
    try_compress,
};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `(input, Huff_Compress output, whether it fits)` from the C harness. Short inputs with
/// many distinct bytes hit the engine's limit (8 bits per input byte, length included) and
/// come out cut: the first one, a short userinfo, has its closing quote read back as a `0`.
const COMPRESSED: [(&str, &str, bool); 6] = [
    (
        "\"\\challenge\\-1234567\\qport\\27960\\protocol\\84\\name\\ETPlayer\\rate\\25000\\snaps\\20\"",
        "004f4474308e050cc726c314ec8ef967d01a46c1449801cbc37ab02dec191c1387c2de710a5c1cbac2390906671de9557b0b70d81a30b0bd29886a541c0a5a259ef24214e4730ad19bc23911badd8300",
        false,
    ),
    ("a", "00018600", true),
    ("aaaaaaaaaaaaaaaa", "001086ff7f", true),
    ("abracadabra", "000b868c701263636203", true),
    ("hello world", "000b164cb169ec8720dc2b4e00", false),
    ("xyz", "00031ebc00", false),
];

/// `(block, room after offset 12, Huff_Decompress output)` from the C harness.
const DECOMPRESSED: [(&str, usize, &str); 4] = [
    ("0005deadbeef", 16_372, "7b7bd57b7b"),
    // The block ends at once: one symbol read from past the end, then a stop.
    ("0003", 16_372, "000000"),
    ("00044474308e", 16_372, "225c6340"),
    // The announced 64 bytes capped at the room left (`maxsize` 20).
    ("0040123456789a", 8, "4858484858583c3c"),
];

#[test]
fn compress_matches_the_engine() {
    for (input, block, fits) in COMPRESSED {
        assert_eq!(compress(input.as_bytes()), unhex(block), "{input}");
        assert_eq!(try_compress(input.as_bytes()).is_some(), fits, "{input}");
    }
    assert_eq!(compress(b""), b"", "nothing after offset 12: left as it is");
}

#[test]
fn decompress_matches_the_engine() {
    for (input, block, _) in COMPRESSED.iter().filter(|c| c.2) {
        assert_eq!(decompress(&unhex(block)).unwrap(), input.as_bytes());
        assert_eq!(
            decompress_as_engine(&unhex(block), 16_372),
            input.as_bytes()
        );
    }
    // What the server reads from the cut userinfo: all but its last byte.
    let (input, block, _) = COMPRESSED[0];
    let read = decompress(&unhex(block)).unwrap();
    assert_eq!(read[..input.len() - 1], input.as_bytes()[..input.len() - 1]);
    assert_eq!(read.last(), Some(&b'0'));
    for (block, room, out) in DECOMPRESSED {
        assert_eq!(
            decompress_as_engine(&unhex(block), room),
            unhex(out),
            "{block}"
        );
    }
}

#[test]
fn garbage_is_refused_or_bounded() {
    // Announced over the bound, or running out of bits: refused by the strict reading.
    assert_eq!(decompress(&[0xFF, 0xFF, 1, 2, 3]), None);
    assert_eq!(decompress(&[0x40, 0x01]), None);
    assert_eq!(decompress(&unhex("0003")), None);
    assert_eq!(decompress(&[7]), None);
    assert_eq!(decompress(b""), Some(Vec::new()));
    // The engine's reading is capped at the room it has, and stops where the block ends.
    let big = decompress_as_engine(&[0xFF, 0xFF, 0xAA, 0x55], 32_756);
    assert_eq!(big.len(), 32_756);
    assert!(big[4..].iter().all(|&b| b == 0));
    let ok = compress(&vec![b'q'; MAX_DECOMPRESSED]);
    assert_eq!(decompress(&ok).unwrap().len(), MAX_DECOMPRESSED);
}

#[test]
fn connect_packets_as_client_and_server_see_them() {
    let text = br#""\challenge\12\qport\7\protocol\84\name\player\rate\25000\snaps\20\cl_maxpackets\30\cl_timenudge\0\cg_predictItems\1""#;
    let packet = connect_packet(text);
    assert!(packet.starts_with(b"\xff\xff\xff\xffconnect "));
    assert_eq!(&packet[12..], compress(text));
    let mut plain = b"\xff\xff\xff\xffconnect ".to_vec();
    plain.extend_from_slice(text);
    assert_eq!(server_view(&packet, 32_768), plain);
    // Another spelling is read as it is; too short a packet is left alone.
    let upper = b"\xff\xff\xff\xffCONNECT \"x\"".to_vec();
    assert_eq!(server_view(&upper, 32_768), upper);
    assert_eq!(
        server_view(b"\xff\xff\xff\xffconnect", 32_768),
        b"\xff\xff\xff\xffconnect"
    );
}

/// Text like a userinfo: what real clients compress.
fn userinfo_like() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop::sample::select(b"\\\"abcdefghijklmnopqrstuvwxyz0123456789_ .%".to_vec()),
        0..2000,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn text_round_trips(data in userinfo_like()) {
        let block = compress(&data);
        if data.len() >= 400 {
            prop_assert!(try_compress(&data).is_some(), "long text fits");
        }
        if try_compress(&data).is_some() {
            prop_assert_eq!(decompress(&block), Some(data.clone()));
            prop_assert_eq!(decompress_as_engine(&block, MAX_DECOMPRESSED), data);
        }
    }

    #[test]
    fn any_bytes_round_trip_when_they_fit(data in proptest::collection::vec(any::<u8>(), 0..1500)) {
        match try_compress(&data) {
            Some(block) => prop_assert_eq!(decompress(&block), Some(data)),
            None => prop_assert!(!data.is_empty()),
        }
    }

    #[test]
    fn garbage_never_panics_and_stays_bounded(block in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Some(out) = decompress(&block) {
            prop_assert!(out.len() <= MAX_DECOMPRESSED);
        }
        prop_assert!(decompress_as_engine(&block, 1000).len() <= 1000);
    }
}
