use super::*;

const USERINFO: &[u8] =
    b"\\challenge\\-1179385436\\qport\\4321\\protocol\\71\\name\\UnnamedPlayer\\rate\\25000";

/// A `connect` as a real client sends it: the userinfo in quotes, compressed from offset 12.
fn compressed(userinfo: &[u8]) -> Vec<u8> {
    let mut p = b"\xff\xff\xff\xffconnect ".to_vec();
    let mut quoted = b"\"".to_vec();
    quoted.extend_from_slice(userinfo);
    quoted.push(b'"');
    Codec::default().compress(&quoted, &mut p);
    p
}

#[test]
fn a_compressed_connect_is_read_as_the_server_reads_it() {
    let mut r = Reader::default();
    let c = r.read(&compressed(USERINFO)).unwrap();
    assert_eq!(
        (c.challenge, c.qport, c.protocol),
        (-1_179_385_436, 4321, 71)
    );
    assert_eq!(r.userinfo(&c), USERINFO);
}

#[test]
fn plain_spellings_keys_in_any_case_and_atoi() {
    let mut r = Reader::default();
    let c = r
        .read(b"\xff\xff\xff\xffCONNECT \"\\QPort\\70000\\Challenge\\ 12x\\protocol\\84\\challenge\\9\"")
        .unwrap();
    // The first `challenge` key counts, read with atoi; a qport is 16 bits.
    assert_eq!(
        (c.challenge, c.qport, c.protocol),
        (12, 70_000u32 as u16, 84)
    );
    assert_eq!(atoi(b"  -42abc"), -42);
    assert_eq!(atoi(b""), 0);
    assert_eq!(atoi(b"99999999999999999999999"), i64::MAX);
}

#[test]
fn what_is_not_a_readable_connect_is_refused() {
    let mut r = Reader::default();
    assert_eq!(
        r.read(b"\xff\xff\xff\xffgetinfo x"),
        Err(ConnectError::NotConnect)
    );
    assert_eq!(r.read(b"connect \"\\a\\b\""), Err(ConnectError::NotConnect));
    assert_eq!(
        r.read(b"\xff\xff\xff\xffCONNECT"),
        Err(ConnectError::Userinfo)
    );
    // Engines disagree on where the userinfo ends (a high byte).
    assert_eq!(
        r.read(b"\xff\xff\xff\xffCONNECT \\qport\\1\x80\\challenge\\2"),
        Err(ConnectError::Userinfo)
    );
    // Bytes 4..11 exactly `connect`: compressed, and garbage does not decompress.
    assert!(matches!(
        r.read(b"\xff\xff\xff\xffconnect \x10\x00\x01"),
        Err(ConnectError::Huffman(_))
    ));
    // `connectX…`: the engines see another command.
    let mut p = compressed(USERINFO);
    p[11] = b'X';
    assert_eq!(r.read(&p), Err(ConnectError::NotConnect));
}

#[test]
fn the_rewrite_changes_the_challenge_only() {
    let mut r = Reader::default();
    let c = r.read(&compressed(USERINFO)).unwrap();
    let mut out = Vec::new();
    r.rewrite(&c, 77, &mut out).unwrap();
    let want =
        compressed(b"\\challenge\\77\\qport\\4321\\protocol\\71\\name\\UnnamedPlayer\\rate\\25000");
    assert_eq!(out, want);
    let back = r.read(&out).unwrap();
    assert_eq!((back.challenge, back.qport, back.protocol), (77, 4321, 71));
    // Without a challenge key, one is added.
    let c = r.read(b"\xff\xff\xff\xffCONNECT \\qport\\5").unwrap();
    r.rewrite(&c, -3, &mut out).unwrap();
    assert_eq!(r.read(&out).unwrap().challenge, -3);
}

#[test]
fn a_rewrite_longer_than_a_server_reads_is_refused() {
    let mut info = b"\\challenge\\1\\qport\\5\\name\\".to_vec();
    info.resize(1010, b'x');
    let mut r = Reader::default();
    let c = r.read(&compressed(&info)).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        r.rewrite(&c, 1_234_567_890, &mut out),
        Err(ConnectError::TooLong)
    );
}
