//! The netchan model (`netchan`): headers, checksum, fragments and their reassembly as
//! `Netchan_Process` does it, ET's XOR encoding, and two in-memory session ends talking.

use etrelay_testkit::netchan::session::{Counts, Outcome, Role, Session};
use etrelay_testkit::netchan::xor::{
    self, CLIENT_MESSAGE_START, ClientLongs, SERVER_MESSAGE_START, xor_client_message,
    xor_server_message,
};
use etrelay_testkit::netchan::{
    Dialect, Direction, DropReason, FRAGMENT_SIZE, Fragment, Header, Processed, Receiver, Sender,
    checksum,
};

const DIALECTS: [Dialect; 3] = [Dialect::Et, Dialect::Ioq3, Dialect::Ioq3Legacy];
const CHALLENGE: i32 = -1_234_567;

fn message(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 256) as u8).collect()
}

#[test]
fn checksum_is_challenge_xor_sequence_times_challenge() {
    assert_eq!(checksum(0x1234_5678, 5), 0x1234_5678 ^ 0x5B05_B058);
    // Sequence 1 (every channel's first) sums to 0 whatever the challenge: c ^ c.
    assert_eq!(checksum(CHALLENGE, 1), 0);
    let c = CHALLENGE as u32;
    assert_eq!(
        checksum(CHALLENGE, 0x7FFF_FFFF),
        c ^ 0x7FFF_FFFFu32.wrapping_mul(c)
    );
    assert_eq!(checksum(0, 99), 0);
}

#[test]
fn headers_as_the_engines_write_them() {
    // ET, client to server: sequence, qport.
    let mut s = Sender::new(Dialect::Et, Direction::ToServer, 0xBEEF, CHALLENGE);
    let d = s.transmit(b"hi");
    assert_eq!(d, vec![b"\x01\x00\x00\x00\xef\xbehi".to_vec()]);
    // ioquake3 71, server to client: sequence, checksum.
    let mut s = Sender::new(Dialect::Ioq3, Direction::ToServer, 7, 0x0102_0304);
    s.transmit(b"");
    let d = s.transmit(b"x");
    let mut want = vec![2, 0, 0, 0, 7, 0];
    want.extend_from_slice(&checksum(0x0102_0304, 2).to_le_bytes());
    want.push(b'x');
    assert_eq!(d, vec![want]);
    // A fragment: bit 31, then (checksum), start, length.
    let mut s = Sender::new(Dialect::Ioq3, Direction::ToClient, 0, 9);
    let d = s.transmit(&message(FRAGMENT_SIZE + 5));
    assert_eq!(d.len(), 2);
    let h = Header::parse(Dialect::Ioq3, Direction::ToClient, &d[1]).unwrap();
    assert_eq!(
        h,
        Header {
            sequence: 1,
            qport: None,
            checksum: Some(checksum(9, 1)),
            fragment: Some(Fragment {
                start: FRAGMENT_SIZE as u16,
                length: 5
            }),
        }
    );
    assert_eq!(&d[1][..4], &(1u32 | 1 << 31).to_le_bytes());
    assert_eq!(h.wire_len(), 12);
    assert_eq!(d[0].len(), 12 + FRAGMENT_SIZE);
}

#[test]
fn fragment_counts_follow_the_1300_byte_rule() {
    for dialect in DIALECTS {
        for (len, lens) in [
            (FRAGMENT_SIZE - 1, vec![None]),
            (FRAGMENT_SIZE, vec![Some(1300), Some(0)]),
            (2 * FRAGMENT_SIZE, vec![Some(1300), Some(1300), Some(0)]),
            (3000, vec![Some(1300), Some(1300), Some(400)]),
        ] {
            let mut s = Sender::new(dialect, Direction::ToClient, 0, CHALLENGE);
            let got: Vec<Option<u16>> = s
                .transmit(&message(len))
                .iter()
                .map(|d| {
                    let h = Header::parse(dialect, Direction::ToClient, d).unwrap();
                    assert_eq!(h.sequence, 1, "every fragment has the same sequence");
                    h.fragment.map(|f| f.length)
                })
                .collect();
            assert_eq!(got, lens, "{dialect:?} {len}");
            assert_eq!(s.outgoing_sequence(), 2);
        }
    }
}

/// Sends `messages` through a sender and receiver of `dialect` in `direction`.
fn pair(dialect: Dialect, direction: Direction) -> (Sender, Receiver) {
    (
        Sender::new(dialect, direction, 4242, CHALLENGE),
        Receiver::new(dialect, direction, CHALLENGE),
    )
}

fn deliver(r: &mut Receiver, datagrams: &[Vec<u8>]) -> Vec<Processed> {
    datagrams.iter().map(|d| r.process(d)).collect()
}

#[test]
fn both_directions_both_dialects_reassemble() {
    for dialect in DIALECTS {
        for direction in [Direction::ToServer, Direction::ToClient] {
            let (mut s, mut r) = pair(dialect, direction);
            for len in [
                0,
                10,
                FRAGMENT_SIZE - 1,
                FRAGMENT_SIZE,
                2 * FRAGMENT_SIZE,
                4321,
            ] {
                let m = message(len);
                let out = deliver(&mut r, &s.transmit(&m));
                let (last, rest) = out.split_last().unwrap();
                assert!(rest.iter().all(|p| *p == Processed::Fragment));
                let Processed::Message(d) = last else {
                    panic!("{dialect:?} {direction:?} {len}: {last:?}")
                };
                assert_eq!(d.message, m);
                assert_eq!(d.fragmented, len >= FRAGMENT_SIZE);
                assert_eq!(d.skipped, 0);
            }
        }
    }
}

#[test]
fn out_of_order_and_missing_fragments_are_dropped_as_the_engine_does() {
    let (mut s, mut r) = pair(Dialect::Et, Direction::ToClient);
    // Fragments of message 1 arrive 0, 2, 1: the third is a gap, the second completes
    // nothing (it is not the last), and the third never comes back: message 1 is lost.
    let one = s.transmit(&message(3000));
    assert_eq!(r.process(&one[0]), Processed::Fragment);
    assert_eq!(
        r.process(&one[2]),
        Processed::Dropped(DropReason::FragmentGap)
    );
    assert_eq!(r.process(&one[1]), Processed::Fragment);
    // Message 2 restarts the assembly and arrives whole, one message skipped.
    let two = s.transmit(&message(2000));
    let out = deliver(&mut r, &two);
    let Processed::Message(d) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!((d.sequence, d.skipped, d.message.len()), (2, 1, 2000));
    // A late fragment of message 1, and a duplicate of 2: out of order.
    assert_eq!(
        r.process(&one[2]),
        Processed::Dropped(DropReason::OutOfOrder)
    );
    assert_eq!(
        r.process(&two[1]),
        Processed::Dropped(DropReason::OutOfOrder)
    );
    // A lost middle fragment: the last one is a gap.
    let three = s.transmit(&message(3000));
    assert_eq!(r.process(&three[0]), Processed::Fragment);
    assert_eq!(
        r.process(&three[2]),
        Processed::Dropped(DropReason::FragmentGap)
    );
    // Message 4 plain, after it.
    let four = s.transmit(b"four");
    assert!(matches!(r.process(&four[0]), Processed::Message(d) if d.message == b"four"));
    assert_eq!(r.incoming_sequence(), 4);
}

#[test]
fn illegal_fragments_and_short_datagrams_are_dropped() {
    let mut r = Receiver::new(Dialect::Et, Direction::ToClient, CHALLENGE);
    let fragment = |start: u16, length: u16, body: usize| {
        let mut d = Vec::new();
        Header {
            sequence: 1,
            qport: None,
            checksum: None,
            fragment: Some(Fragment { start, length }),
        }
        .write(&mut d);
        d.extend(std::iter::repeat_n(0u8, body));
        d
    };
    assert_eq!(
        r.process(&fragment(0, 20, 10)),
        Processed::Dropped(DropReason::IllegalFragment)
    );
    assert_eq!(
        r.process(&fragment(0, 0x8000, 10)),
        Processed::Dropped(DropReason::IllegalFragment)
    );
    assert_eq!(
        r.process(&fragment(5, 1, 1)),
        Processed::Dropped(DropReason::FragmentGap)
    );
    assert_eq!(
        r.process(b"\x01\x00"),
        Processed::Dropped(DropReason::Short)
    );
    // A client-to-server header needs its qport.
    let mut r = Receiver::new(Dialect::Et, Direction::ToServer, CHALLENGE);
    assert_eq!(
        r.process(b"\x01\x00\x00\x00\x01"),
        Processed::Dropped(DropReason::Short)
    );
    assert!(
        matches!(r.process(b"\x01\x00\x00\x00\x01\x00"), Processed::Message(d) if d.message.is_empty())
    );
}

#[test]
fn the_checksum_is_checked_first_in_ioq3_only() {
    for direction in [Direction::ToServer, Direction::ToClient] {
        let mut s = Sender::new(Dialect::Ioq3, direction, 1, CHALLENGE);
        let mut wrong = Receiver::new(Dialect::Ioq3, direction, CHALLENGE ^ 1);
        // (Sequence 1's checksum is 0 for every challenge: start at 2.)
        let first = s.transmit(b"first");
        assert!(matches!(wrong.process(&first[0]), Processed::Message(_)));
        let d = s.transmit(b"abc");
        assert_eq!(
            wrong.process(&d[0]),
            Processed::Dropped(DropReason::BadChecksum)
        );
        let mut right = Receiver::new(Dialect::Ioq3, direction, CHALLENGE);
        assert!(matches!(right.process(&d[0]), Processed::Message(_)));
        // Even a duplicate is a checksum failure first when the checksum is wrong.
        let mut forged = d[0].clone();
        let at = if direction == Direction::ToServer {
            6
        } else {
            4
        };
        forged[at] ^= 1;
        assert_eq!(
            right.process(&forged),
            Processed::Dropped(DropReason::BadChecksum)
        );
    }
    // ET has no checksum: another challenge's datagram passes the netchan.
    let mut s = Sender::new(Dialect::Et, Direction::ToServer, 1, CHALLENGE);
    let mut r = Receiver::new(Dialect::Et, Direction::ToServer, 77);
    assert!(matches!(
        r.process(&s.transmit(b"abc")[0]),
        Processed::Message(_)
    ));
}

/// `CL_Netchan_Decode` / `SV_Netchan_Decode` as the engines run them: on the whole received
/// datagram, from `readcount + start`.
fn engine_decode(datagram: &mut [u8], readcount: usize, start: usize, key: u8, command: &[u8]) {
    let msg = &mut datagram[readcount..];
    // The same walk, but `i` counted in the datagram: shift the message so that indices line
    // up, by decoding a copy padded in front.
    let mut padded = vec![0u8; readcount];
    padded.extend_from_slice(msg);
    xor::xor_from(&mut padded, readcount + start, key, command);
    msg.copy_from_slice(&padded[readcount..]);
}

#[test]
fn xor_round_trips_and_matches_the_engines_datagram_offsets() {
    let command = b"cs 12 \"\\sv%x\"\xe9";
    // Server to client: encode from 4 with challenge ^ sequence.
    let plain = message(3000);
    let mut m = plain.clone();
    xor_server_message(&mut m, CHALLENGE, 7, command);
    assert_eq!(m[..SERVER_MESSAGE_START], plain[..SERVER_MESSAGE_START]);
    assert!(
        m[SERVER_MESSAGE_START..]
            .iter()
            .zip(&plain[4..])
            .any(|(a, b)| a != b)
    );
    let mut back = m.clone();
    xor_server_message(&mut back, CHALLENGE, 7, command);
    assert_eq!(back, plain);
    // The client decodes from readcount + 4 of the datagram: readcount 4 (plain header).
    let mut d = Sender::new(Dialect::Et, Direction::ToClient, 0, CHALLENGE).transmit(&m[..1000]);
    engine_decode(&mut d[0], 4, 4, xor::server_key(CHALLENGE, 1), command);
    let mut want = plain[..1000].to_vec();
    xor_server_message(&mut want, CHALLENGE, 7, command);
    xor_server_message(&mut want, CHALLENGE, 1, command);
    let mut twice = m[..1000].to_vec();
    xor_server_message(&mut twice, CHALLENGE, 1, command);
    assert_eq!(&d[0][4..], &twice[..]);

    // Client to server: the three longs stay, the key reads two of them.
    let mut c = Vec::new();
    ClientLongs {
        server_id: 5,
        message_acknowledge: 9,
        reliable_acknowledge: 3,
    }
    .write(&mut c);
    c.extend_from_slice(&message(500));
    let mut e = c.clone();
    xor_client_message(&mut e, CHALLENGE, command);
    assert_eq!(e[..CLIENT_MESSAGE_START], c[..CLIENT_MESSAGE_START]);
    // The server decodes from readcount + 12, readcount 6 (sequence and qport).
    let mut d = Sender::new(Dialect::Et, Direction::ToServer, 3, CHALLENGE).transmit(&e);
    engine_decode(&mut d[0], 6, 12, xor::client_key(CHALLENGE, 5, 9), command);
    assert_eq!(&d[0][6..], &c[..]);
    // Twelve bytes or less: left alone.
    let mut short = c[..12].to_vec();
    xor_client_message(&mut short, CHALLENGE, command);
    assert_eq!(short, c[..12]);
}

#[test]
fn another_challenge_differs_by_one_constant_byte() {
    let command = b"userinfo \"\\name\\pl%yer9\"";
    let (c1, c2) = (0x1234_5678, -99);
    let plain = message(800);
    let (mut a, mut b) = (plain.clone(), plain.clone());
    xor_server_message(&mut a, c1, 3, command);
    xor_server_message(&mut b, c2, 3, command);
    let delta = ((c1 ^ c2) & 0xFF) as u8;
    assert!(a.iter().zip(&b).skip(4).all(|(x, y)| x ^ y == delta));
}

/// Runs `n` rounds between a client and a server session: each client message answered.
fn converse(client: &mut Session, server: &mut Session, n: usize) {
    for _ in 0..n {
        let mut answered = false;
        for d in client.next_datagrams() {
            match server.receive(&d) {
                Outcome::Decoded(_) | Outcome::Garbled => answered = true,
                Outcome::Fragment | Outcome::Dropped(_) => {}
            }
        }
        if answered {
            for d in server.next_datagrams() {
                client.receive(&d);
            }
        }
    }
}

#[test]
fn two_session_ends_decode_every_message_both_ways() {
    for dialect in DIALECTS {
        let mut client = Session::new(Role::Client, dialect, 999, CHALLENGE);
        let mut server = Session::new(Role::Server, dialect, 999, CHALLENGE);
        converse(&mut client, &mut server, 100);
        let (c, s) = (client.counts(), server.counts());
        assert_eq!((c.decoded_ok, c.decoded_bad), (100, 0), "{dialect:?} {c:?}");
        assert_eq!((s.decoded_ok, s.decoded_bad), (100, 0), "{dialect:?} {s:?}");
        assert!(
            c.datagrams_received > 100 && s.datagrams_received > 100,
            "fragments"
        );
        assert_eq!(c.messages_sent, 100);
    }
}

#[test]
fn a_wrong_challenge_garbles_et_and_fails_the_ioq3_checksum() {
    let mut client = Session::new(Role::Client, Dialect::Et, 1, CHALLENGE);
    let mut server = Session::new(Role::Server, Dialect::Et, 1, CHALLENGE ^ 0x55);
    converse(&mut client, &mut server, 20);
    let s = server.counts();
    assert_eq!(
        (s.messages_received, s.decoded_ok, s.decoded_bad),
        (20, 0, 20)
    );
    assert_eq!(client.counts().decoded_ok, 0);
    // The challenge's high bytes do not enter ET's one-byte key.
    let mut client = Session::new(Role::Client, Dialect::Et, 1, CHALLENGE);
    let mut server = Session::new(Role::Server, Dialect::Et, 1, CHALLENGE ^ 0x100);
    converse(&mut client, &mut server, 5);
    assert_eq!(server.counts().decoded_ok, 5);

    let mut client = Session::new(Role::Client, Dialect::Ioq3, 1, CHALLENGE);
    let mut server = Session::new(Role::Server, Dialect::Ioq3, 1, CHALLENGE ^ 0x100);
    converse(&mut client, &mut server, 5);
    let s: Counts = server.counts();
    // Only the first message (sequence 1, checksum 0 for any challenge) gets through.
    assert_eq!(s.messages_received, 1);
    assert_eq!(s.dropped_checksum, s.datagrams_received - 1);
    assert!(s.dropped_checksum >= 4);
    assert_eq!(client.counts().messages_received, 1);
}
