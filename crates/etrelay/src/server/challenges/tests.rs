use super::*;
use crate::et::huffman::Codec;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn text(p: &[u8]) -> String {
    String::from_utf8_lossy(&p[4..]).into_owned()
}

/// A client's compressed `connect` with `challenge` and `qport`.
fn connect(challenge: i32, qport: u16) -> Vec<u8> {
    let mut p = b"\xff\xff\xff\xffconnect ".to_vec();
    let info = format!("\"\\challenge\\{challenge}\\qport\\{qport}\\protocol\\71\\name\\p\"");
    Codec::default().compress(info.as_bytes(), &mut p);
    p
}

#[tokio::test(start_paused = true)]
async fn the_answer_is_the_challenge_a_connect_must_hold() {
    let mut c = Challenges::new(Game::Q3, 1000, false, Instant::now());
    assert_eq!(c.dialect(), Some(Dialect::Ioq3));
    let (me, other) = (addr("192.0.2.1:27960"), addr("192.0.2.1:27961"));
    let mut out = Vec::new();
    c.answer(
        me,
        b"\xff\xff\xff\xffgetchallenge 4242 Quake3Arena",
        Instant::now(),
        &mut out,
    )
    .unwrap();
    let answer = text(&out);
    let words: Vec<&str> = answer.split(' ').collect();
    assert_eq!(
        (words[0], words[2], words[3]),
        ("challengeResponse", "4242", "71")
    );
    let mine: i32 = words[1].parse().unwrap();
    assert!(
        matches!(c.check(me, &connect(mine, 7), Instant::now()), Ok(Checked::Ours(k)) if k.qport == 7)
    );
    assert!(matches!(
        c.check(other, &connect(mine, 7), Instant::now()),
        Ok(Checked::Other)
    ));
    assert!(matches!(
        c.check(me, &connect(mine + 1, 7), Instant::now()),
        Ok(Checked::Other)
    ));
    assert!(c.is_ours(me, mine.to_string().as_bytes(), Instant::now()));
    assert!(!c.is_ours(other, mine.to_string().as_bytes(), Instant::now()));
    assert!(!c.is_ours(me, format!("{mine}x").as_bytes(), Instant::now()));
}

#[tokio::test(start_paused = true)]
async fn answers_are_bounded_per_address_and_in_all() {
    let mut c = Challenges::new(Game::Et, 1_000_000, false, Instant::now());
    let mut out = Vec::new();
    let victim = addr("192.0.2.9:27960");
    let ask = b"\xff\xff\xff\xffgetchallenge";
    let answered = (0..100)
        .filter(|_| c.answer(victim, ask, Instant::now(), &mut out).is_ok())
        .count();
    assert_eq!(
        answered, PER_ADDRESS_BURST as usize,
        "one address: its burst"
    );
    tokio::time::advance(PER_ADDRESS_INTERVAL).await;
    assert!(
        c.answer(victim, ask, Instant::now(), &mut out).is_ok(),
        "then its rate"
    );
    // Everyone together: the bound in all (100 a second: a burst of 10).
    let mut c = Challenges::new(Game::Et, 100, false, Instant::now());
    let many = (0..50u8)
        .filter(|i| {
            let a = SocketAddr::from(([198, 51, 100, *i], 1));
            c.answer(a, ask, Instant::now(), &mut out).is_ok()
        })
        .count();
    assert_eq!(many, 10);
}

#[tokio::test(start_paused = true)]
async fn an_untranslatable_protocol_gives_the_challenges_back_to_the_server() {
    let mut c = Challenges::new(Game::Et, 1000, false, Instant::now());
    assert_eq!(c.dialect(), Some(Dialect::Et));
    let ettv = Facts {
        protocol: Some(284),
        ..Facts::default()
    };
    c.learn(&ettv, "test");
    assert_eq!(c.dialect(), None);
    let mut out = Vec::new();
    assert!(
        c.answer(
            addr("192.0.2.1:1"),
            b"\xff\xff\xff\xffgetchallenge",
            Instant::now(),
            &mut out
        )
        .is_err()
    );
    c.learn(
        &Facts {
            protocol: Some(84),
            ..Facts::default()
        },
        "test",
    );
    assert_eq!(c.dialect(), Some(Dialect::Et));
    // --server-challenges: never.
    let off = Challenges::new(Game::Q3, 1000, true, Instant::now());
    assert_eq!(off.dialect(), None);
}
