use proptest::prelude::*;

use super::*;

/// The engines' XOR encoding of `msg` from `start`, key from `challenge ^ salt`, changed by
/// `string` as `SV_Netchan_Encode` changes it (`key ^= string[i] << (i & 1)`).
fn xor_encode(msg: &mut [u8], start: usize, challenge: i32, salt: u32, string: &[u8]) {
    let mut key = (challenge as u32 ^ salt) as u8;
    let mut index = 0;
    for (i, b) in msg.iter_mut().enumerate().skip(start) {
        if index >= string.len() {
            index = 0;
        }
        key ^= ((u32::from(string[index])) << (i & 1)) as u8;
        index += 1;
        *b ^= key;
    }
}

/// A netchan packet: sequence (with the fragment bit), the qport for a client, the checksum
/// (protocol 71), the fragment fields, `data`.
fn packet(
    seq: u32,
    qport: Option<u16>,
    sum: Option<u32>,
    frag: Option<(u16, u16)>,
    data: &[u8],
) -> Vec<u8> {
    let mut p = Vec::new();
    let word = if frag.is_some() {
        seq | FRAGMENT_BIT
    } else {
        seq
    };
    p.extend_from_slice(&word.to_le_bytes());
    if let Some(q) = qport {
        p.extend_from_slice(&q.to_le_bytes());
    }
    if let Some(s) = sum {
        p.extend_from_slice(&s.to_le_bytes());
    }
    if let Some((start, len)) = frag {
        p.extend_from_slice(&start.to_le_bytes());
        p.extend_from_slice(&len.to_le_bytes());
    }
    p.extend_from_slice(data);
    p
}

#[test]
fn checksums_are_rewritten_and_checked() {
    let t = Translation {
        scheme: Scheme::Checksum,
        client: 12345,
        server: -987_654,
    };
    let mut p = packet(77, Some(4321), Some(checksum(12345, 77)), None, b"usercmd");
    t.to_server(&mut p).unwrap();
    assert_eq!(
        p,
        packet(
            77,
            Some(4321),
            Some(checksum(-987_654, 77)),
            None,
            b"usercmd"
        )
    );
    // A fragment: the checksum uses the sequence without the fragment bit.
    let mut f = packet(
        78,
        Some(4321),
        Some(checksum(12345, 78)),
        Some((1300, 5)),
        b"tail!",
    );
    t.to_server(&mut f).unwrap();
    assert_eq!(
        f,
        packet(
            78,
            Some(4321),
            Some(checksum(-987_654, 78)),
            Some((1300, 5)),
            b"tail!"
        )
    );
    // Forged: another challenge's checksum.
    let mut bad = packet(79, Some(4321), Some(checksum(1, 79)), None, b"x");
    assert_eq!(t.to_server(&mut bad), Err(Untranslatable::Checksum));
    assert_eq!(
        t.proven_sequence(&packet(80, Some(1), Some(checksum(12345, 80)), None, b"")),
        Some(80)
    );
    assert_eq!(t.proven_sequence(&bad), None);
    // Server → client.
    let mut down = packet(5, None, Some(checksum(-987_654, 5)), None, b"snapshot");
    t.to_client(&mut down).unwrap();
    assert_eq!(
        down,
        packet(5, None, Some(checksum(12345, 5)), None, b"snapshot")
    );
    assert_eq!(t.to_server(&mut [1, 2, 3]), Err(Untranslatable::Short));
    assert_eq!(
        t.to_server(&mut packet(1, Some(2), None, None, b"")),
        Err(Untranslatable::Short)
    );
}

proptest! {
    /// Whatever the key's changes, a message the client encoded with its challenge decodes
    /// with the server's once translated, whole or in fragments, and the other way round.
    #[test]
    fn xor_messages_decode_under_the_other_challenge(
        client in any::<i32>(),
        server in any::<i32>(),
        salt in any::<u32>(),
        string in proptest::collection::vec(1u8..=255, 1..40),
        msg in proptest::collection::vec(any::<u8>(), 0..3000),
        split in 0usize..3000,
    ) {
        let t = Translation { scheme: Scheme::Xor, client, server };
        for (start, up) in [(CLIENT_ENCODE_START, true), (SERVER_ENCODE_START, false)] {
            let (from, to) = if up { (client, server) } else { (server, client) };
            let mut sent = msg.clone();
            xor_encode(&mut sent, start, from, salt, &string);
            let mut want = msg.clone();
            xor_encode(&mut want, start, to, salt, &string);
            let qport = up.then_some(7);
            // Whole.
            let mut p = packet(9, qport, None, None, &sent);
            if up { t.to_server(&mut p).unwrap() } else { t.to_client(&mut p).unwrap() }
            prop_assert_eq!(&p, &packet(9, qport, None, None, &want));
            // In two fragments, cut anywhere.
            let cut = split.min(sent.len());
            for (at, part, goal) in [(0, &sent[..cut], &want[..cut]), (cut, &sent[cut..], &want[cut..])] {
                let frag = Some((at as u16, part.len() as u16));
                let mut p = packet(9, qport, None, frag, part);
                if up { t.to_server(&mut p).unwrap() } else { t.to_client(&mut p).unwrap() }
                prop_assert_eq!(p, packet(9, qport, None, frag, goal));
            }
        }
    }
}
