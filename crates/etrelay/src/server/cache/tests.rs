use super::*;

const AGE: Duration = Duration::from_millis(500);

fn addr(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, n], 27000 + u16::from(n)))
}

/// The server's answer to the refresh in `out`, as the fake server writes it.
fn answer_to(refresh: &[u8], q: Query, hostname: &str) -> Vec<u8> {
    let nonce = &refresh[q.request().len()..];
    let mut p = b"\xff\xff\xff\xff".to_vec();
    p.extend_from_slice(q.answer_header());
    p.extend_from_slice(b"\\hostname\\");
    p.extend_from_slice(hostname.as_bytes());
    p.extend_from_slice(b"\\challenge\\");
    p.extend_from_slice(nonce);
    if q == Query::Status {
        p.extend_from_slice(b"\n0 0 \"Bob\"\n");
    }
    p
}

fn challenge_of(packet: &[u8], q: Query) -> Option<Vec<u8>> {
    let info = crate::et::info::info_string(packet, q.answer_header())?;
    crate::et::info::find_key(info, b"challenge").map(|r| info[r].to_vec())
}

/// Answers the refresh in `refresh` and collects what each waiter gets.
fn refreshed(
    cache: &mut QueryCache,
    refresh: &[u8],
    q: Query,
    now: Instant,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut r = cache
        .on_answer(&answer_to(refresh, q, "h"), now)
        .expect("the refresh's answer");
    assert_eq!(r.query(), q);
    let mut out = Vec::new();
    let mut got = Vec::new();
    while let Some(to) = r.next(&mut out) {
        got.push((to, out.clone()));
    }
    got
}

#[test]
fn a_first_query_asks_the_server_and_waits() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    assert_eq!(
        c.query(Query::Info, Some(b"A1"), addr(1), t0, &mut out),
        Outcome::Refresh
    );
    assert!(out.starts_with(b"\xff\xff\xff\xffgetinfo "));
    assert_eq!(out.len(), Query::Info.request().len() + NONCE_LEN);
    let refresh = out.clone();
    // A second asker waits for the same refresh.
    assert_eq!(
        c.query(Query::Info, None, addr(2), t0, &mut out),
        Outcome::Waiting
    );
    let got = refreshed(&mut c, &refresh, Query::Info, t0);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, addr(1));
    assert_eq!(
        challenge_of(&got[0].1, Query::Info).as_deref(),
        Some(&b"A1"[..])
    );
    assert_eq!(got[1].0, addr(2));
    assert_eq!(challenge_of(&got[1].1, Query::Info), None);
    // The refresh is done: its answer is not taken twice.
    assert!(
        c.on_answer(&answer_to(&refresh, Query::Info, "h"), t0)
            .is_none()
    );
}

#[test]
fn a_fresh_answer_is_served_with_each_askers_challenge() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    c.query(Query::Status, Some(b"s0"), addr(1), t0, &mut out);
    let refresh = out.clone();
    refreshed(&mut c, &refresh, Query::Status, t0);
    for (i, ch) in [&b"AAAA"[..], b"ySpAIF`Vrh", b"q%q"]
        .into_iter()
        .enumerate()
    {
        let at = t0 + AGE;
        assert_eq!(
            c.query(Query::Status, Some(ch), addr(2 + i as u8), at, &mut out),
            Outcome::Answer
        );
        let want: Vec<u8> = ch
            .iter()
            .map(|&b| if b == b'%' { b'.' } else { b })
            .collect();
        assert_eq!(challenge_of(&out, Query::Status), Some(want));
        assert!(out.ends_with(b"\n0 0 \"Bob\"\n"), "player lines kept");
    }
    assert_eq!(
        c.query(Query::Status, None, addr(9), t0, &mut out),
        Outcome::Answer
    );
    assert_eq!(challenge_of(&out, Query::Status), None);
    // The other kind has its own answer: none yet.
    assert_eq!(
        c.query(Query::Info, None, addr(9), t0, &mut out),
        Outcome::Refresh
    );
}

#[test]
fn a_stale_answer_is_refreshed() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    c.query(Query::Info, None, addr(1), t0, &mut out);
    let first = out.clone();
    refreshed(&mut c, &first, Query::Info, t0);
    let later = t0 + AGE + Duration::from_millis(1);
    assert_eq!(
        c.query(Query::Info, Some(b"x"), addr(2), later, &mut out),
        Outcome::Refresh
    );
    assert_ne!(out, first, "a new challenge for each refresh");
    // The answer to the former refresh does not count for this one.
    assert!(
        c.on_answer(&answer_to(&first, Query::Info, "old"), later)
            .is_none()
    );
    let second = out.clone();
    let got = refreshed(&mut c, &second, Query::Info, later);
    assert_eq!(got.len(), 1);
    assert_eq!(
        challenge_of(&got[0].1, Query::Info).as_deref(),
        Some(&b"x"[..])
    );
}

#[test]
fn the_refresh_budget_is_shared_then_stale_answers_are_served() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(Duration::ZERO, t0);
    let mut out = Vec::new();
    // Both kinds draw from one budget of REFRESH_BURST.
    let mut spent = 0;
    let mut t = t0;
    for round in 0..3 {
        for q in [Query::Info, Query::Status] {
            if spent == REFRESH_BURST {
                break;
            }
            assert_eq!(
                c.query(q, None, addr(1), t, &mut out),
                Outcome::Refresh,
                "round {round} {q:?}"
            );
            let refresh = out.clone();
            refreshed(&mut c, &refresh, q, t);
            spent += 1;
        }
        t += Duration::from_millis(1);
    }
    assert_eq!(spent, REFRESH_BURST);
    // Spent: both kinds are answered from their last answer, however old.
    for q in [Query::Info, Query::Status] {
        assert_eq!(
            c.query(q, Some(b"z"), addr(2), t, &mut out),
            Outcome::Answer
        );
        assert_eq!(challenge_of(&out, q).as_deref(), Some(&b"z"[..]));
    }
    // One more refresh per REFRESH_INTERVAL.
    let t = t0 + REFRESH_INTERVAL;
    assert_eq!(
        c.query(Query::Info, None, addr(3), t, &mut out),
        Outcome::Refresh
    );
}

#[test]
fn without_an_answer_or_a_budget_the_query_is_dropped() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    // Spend the budget on refreshes the server never answers.
    for i in 0..REFRESH_BURST {
        assert_eq!(
            c.query(Query::Info, None, addr(1), t0, &mut out),
            Outcome::Refresh,
            "{i}"
        );
        c.unsent(Query::Info);
    }
    assert_eq!(
        c.query(Query::Info, None, addr(1), t0, &mut out),
        Outcome::Busy
    );
}

#[test]
fn waiters_are_bounded() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    assert_eq!(
        c.query(Query::Info, None, addr(0), t0, &mut out),
        Outcome::Refresh
    );
    for _ in 1..MAX_WAITERS {
        assert_eq!(
            c.query(Query::Info, None, addr(1), t0, &mut out),
            Outcome::Waiting
        );
    }
    assert_eq!(
        c.query(Query::Info, None, addr(2), t0, &mut out),
        Outcome::Busy
    );
}

#[test]
fn a_silent_server_leaves_askers_unanswered_then_is_asked_again() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    c.query(Query::Info, None, addr(1), t0, &mut out);
    let lost = out.clone();
    c.query(Query::Info, None, addr(2), t0, &mut out);
    assert_eq!(
        c.expire(t0 + REFRESH_TIMEOUT - Duration::from_millis(1)),
        None
    );
    assert_eq!(c.expire(t0 + REFRESH_TIMEOUT), Some(2));
    assert_eq!(c.expire(t0 + REFRESH_TIMEOUT), None, "given up once");
    // A late answer to the given-up refresh answers nobody.
    assert!(
        c.on_answer(&answer_to(&lost, Query::Info, "h"), t0)
            .is_none()
    );
    // The next query asks again.
    let t = t0 + REFRESH_TIMEOUT;
    assert_eq!(
        c.query(Query::Info, Some(b"y"), addr(3), t, &mut out),
        Outcome::Refresh
    );
    let again = out.clone();
    let got = refreshed(&mut c, &again, Query::Info, t);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, addr(3));
}

#[test]
fn an_unsent_refresh_drops_its_asker() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    c.query(Query::Status, None, addr(1), t0, &mut out);
    let refresh = out.clone();
    c.unsent(Query::Status);
    assert!(
        c.on_answer(&answer_to(&refresh, Query::Status, "h"), t0)
            .is_none()
    );
    assert_eq!(c.expire(t0 + REFRESH_TIMEOUT), None);
}

#[test]
fn other_datagrams_are_ignored() {
    let t0 = Instant::now();
    let mut c = QueryCache::new(AGE, t0);
    let mut out = Vec::new();
    c.query(Query::Info, None, addr(1), t0, &mut out);
    let refresh = out.clone();
    assert!(c.on_answer(b"\xff\xff\xff\xffprint\nhi", t0).is_none());
    // A statusResponse does not answer a getinfo, even with its challenge.
    let mut wrong = answer_to(&refresh, Query::Status, "h");
    assert!(c.on_answer(&wrong, t0).is_none());
    wrong.clear();
    assert!(c.on_answer(&wrong, t0).is_none());
    assert_eq!(refreshed(&mut c, &refresh, Query::Info, t0).len(), 1);
}
