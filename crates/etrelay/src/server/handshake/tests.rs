use super::*;

const C: i32 = 1111;
const S: i32 = 2222;

fn now() -> StdInstant {
    StdInstant::now()
}

#[test]
fn a_connect_waits_for_the_servers_challenge_then_the_client_is_in() {
    let mut h = Handshake::default();
    let t = Translator::default();
    let Next::Ask(number) = h.wait(b"connect-1", C, 71, Dialect::Ioq3, 0) else {
        panic!("the first connect asks");
    };
    assert_eq!(h.kept(), b"connect-1");
    // Retried before the answer: waits, keeps the newest.
    assert_eq!(h.wait(b"connect-2", C, 71, Dialect::Ioq3, 500), Next::Wait);
    assert_eq!(h.kept(), b"connect-2");
    // Another number's answer is not the relay's.
    let stray = format!(
        "\u{0}\u{0}\u{0}\u{0}challengeResponse {S} {} 71",
        number ^ 1
    );
    let mut stray = stray.into_bytes();
    stray[..4].copy_from_slice(&[0xff; 4]);
    assert_eq!(h.on_server(&stray, &t, Some(68)), Answer::Drop);
    let mut offer = format!("....challengeResponse {S} {number} 71").into_bytes();
    offer[..4].copy_from_slice(&[0xff; 4]);
    assert!(
        matches!(h.on_server(&offer, &t, Some(68)), Answer::Connect(o) if o.challenge == S && !o.et)
    );
    // The client retries: the same challenge, no new ask.
    assert_eq!(
        h.wait(b"connect-3", C, 71, Dialect::Ioq3, 800),
        Next::Send(S)
    );
    assert_eq!(t.get(), None);
    let mut ok = format!("....connectResponse {S}").into_bytes();
    ok[..4].copy_from_slice(&[0xff; 4]);
    assert_eq!(h.on_server(&ok, &t, Some(68)), Answer::Connected(Some(C)));
    assert_eq!(
        t.get(),
        Some(Translation {
            scheme: Scheme::Checksum,
            client: C,
            server: S
        })
    );
    // A later connect (a reconnect) asks for a new challenge.
    assert!(matches!(
        h.wait(b"again", C, 71, Dialect::Ioq3, 900),
        Next::Ask(_)
    ));
}

#[test]
fn an_ask_is_made_again_after_a_second_and_relayed_answers_pass() {
    let mut h = Handshake::default();
    let t = Translator::default();
    let mut print = b"....print\nServer is full.\n".to_vec();
    print[..4].copy_from_slice(&[0xff; 4]);
    assert_eq!(h.on_server(&print, &t, Some(84)), Answer::Relay);
    assert!(matches!(h.wait(b"c", C, 84, Dialect::Et, 0), Next::Ask(_)));
    assert_eq!(
        h.wait(b"c", C, 84, Dialect::Et, ASK_AGAIN_MS - 1),
        Next::Wait
    );
    assert!(matches!(
        h.wait(b"c", C, 84, Dialect::Et, ASK_AGAIN_MS),
        Next::Ask(_)
    ));
    let mut offer = b"....challengeResponse 5 1".to_vec();
    offer[..4].copy_from_slice(&[0xff; 4]);
    // ET: no echo to check; the number after it is sv_onlyVisibleClients.
    assert!(
        matches!(h.on_server(&offer, &t, Some(68)), Answer::Connect(o) if o.challenge == 5 && o.second == 1 && o.et)
    );
    let mut ok = b"....connectResponse".to_vec();
    ok[..4].copy_from_slice(&[0xff; 4]);
    assert_eq!(h.on_server(&ok, &t, Some(68)), Answer::Connected(None));
    assert_eq!(t.get().map(|t| t.scheme), Some(Scheme::Xor));
}

#[test]
fn connects_per_session_are_bounded() {
    let mut h = Handshake::default();
    let t0 = now();
    let allowed = (0..20).filter(|_| h.allow(t0)).count();
    assert_eq!(allowed, CONNECT_BURST as usize);
    assert!(h.allow(t0 + CONNECT_INTERVAL));
}

#[test]
fn a_new_port_proves_its_client_by_the_checksum_and_a_later_sequence() {
    use crate::et::netchan::checksum;
    let t = Translator::default();
    t.set(Translation {
        scheme: Scheme::Checksum,
        client: C,
        server: S,
    });
    let packet = |seq: u32, sum: u32| {
        let mut p = seq.to_le_bytes().to_vec();
        p.extend_from_slice(&9u16.to_le_bytes());
        p.extend_from_slice(&sum.to_le_bytes());
        p.extend_from_slice(b"cmd");
        p
    };
    let mut sent = packet(10, checksum(C, 10));
    t.to_server(&mut sent).unwrap();
    assert_eq!(sent, packet(10, checksum(S, 10)));
    assert!(t.proves_client(&packet(11, checksum(C, 11))));
    assert!(
        !t.proves_client(&packet(10, checksum(C, 10))),
        "not past the last"
    );
    assert!(
        !t.proves_client(&packet(12, checksum(S, 12))),
        "the server's: not the client's"
    );
    assert!(!t.proves_client(&packet(12, 0)));
    // The XOR scheme proves nothing.
    t.set(Translation {
        scheme: Scheme::Xor,
        client: C,
        server: S,
    });
    assert!(!t.proves_client(&packet(13, checksum(C, 13))));
}
