use super::*;

const MS: Duration = Duration::from_millis(1);

fn limits() -> JoinLimits {
    JoinLimits {
        source_burst: 2,
        source_interval: Duration::from_secs(2),
        // No reserve for proven sources: the tests' own paces are what counts.
        upstream_burst: 1,
        upstream_interval: Duration::from_secs(1),
    }
}

fn src(a: u8, b: u8) -> SocketAddr {
    SocketAddr::from(([10, a, 0, b], 27000))
}

#[test]
fn the_pace_is_a_token_bucket_with_a_reserve() {
    let t0 = Instant::now();
    let mut p = Pace::new(3, Duration::from_secs(1), t0);
    assert_eq!(p.available(t0), 3);
    assert!(p.take(t0, 2));
    assert!(!p.take(t0, 2), "two kept in reserve");
    assert!(p.take(t0, 0));
    assert!(p.take(t0, 0));
    assert!(!p.take(t0, 0));
    assert_eq!(p.next_token(t0), t0 + Duration::from_secs(1));
    assert_eq!(p.available(t0 + 999 * MS), 0);
    assert_eq!(p.available(t0 + Duration::from_secs(1)), 1);
    assert_eq!(p.available(t0 + Duration::from_secs(10)), 3);
}

#[test]
fn a_source_over_its_limit_is_refused_before_anything_else() {
    let t0 = Instant::now();
    let mut pace = Pace::new(100, MS, t0);
    let mut j = Joins::new(&limits());
    assert_eq!(j.offer(src(1, 1), b"g", t0, &mut pace, false), Offer::Pass);
    assert_eq!(j.offer(src(1, 1), b"g", t0, &mut pace, false), Offer::Pass);
    assert_eq!(
        j.offer(src(1, 1), b"g", t0, &mut pace, false),
        Offer::Refused(DropReason::JoinLimit)
    );
    assert_eq!(j.offer(src(1, 2), b"g", t0, &mut pace, false), Offer::Pass);
    assert_eq!(
        j.offer(
            src(1, 1),
            b"g",
            t0 + Duration::from_secs(2),
            &mut pace,
            false
        ),
        Offer::Pass
    );
}

#[test]
fn past_the_pace_joins_wait_their_turn_round_robin_over_prefixes() {
    let t0 = Instant::now();
    let mut pace = Pace::new(2, 500 * MS, t0);
    let mut j = Joins::new(&limits());
    assert_eq!(j.offer(src(1, 1), b"a", t0, &mut pace, false), Offer::Pass);
    assert_eq!(j.offer(src(1, 2), b"b", t0, &mut pace, false), Offer::Pass);
    // The pace is spent: a flood from prefix 1 queues (4 at most), then one honest join.
    for i in 3..10 {
        let o = j.offer(src(1, i), b"f", t0, &mut pace, false);
        assert_eq!(
            o,
            if i < 7 {
                Offer::Queued
            } else {
                Offer::Refused(DropReason::JoinQueue)
            }
        );
    }
    assert_eq!(
        j.offer(src(2, 1), b"honest", t0, &mut pace, false),
        Offer::Queued
    );
    assert_eq!(j.queued(), 5);
    let mut out = Vec::new();
    assert_eq!(j.release(t0, &mut pace, &mut out), None, "no token yet");
    assert_eq!(j.next_due(t0, &pace), Some(t0 + 500 * MS));
    let t1 = t0 + 500 * MS;
    assert_eq!(j.release(t1, &mut pace, &mut out), Some(src(1, 3)));
    assert_eq!(out, b"f");
    let t2 = t0 + 1000 * MS;
    assert_eq!(
        j.release(t2, &mut pace, &mut out),
        Some(src(2, 1)),
        "the other prefix's turn"
    );
    assert_eq!(out, b"honest");
    // Entries that waited too long are dropped.
    assert_eq!(
        j.release(t0 + Duration::from_secs(5), &mut pace, &mut out),
        None
    );
    assert_eq!(j.queued(), 0);
    assert_eq!(j.next_due(t0, &pace), None);
}

#[test]
fn a_full_queue_makes_room_for_a_new_prefix() {
    let t0 = Instant::now();
    let mut pace = Pace::new(1, Duration::from_secs(1), t0);
    let mut j = Joins::new(&JoinLimits {
        source_burst: 100,
        ..limits()
    });
    assert_eq!(j.offer(src(0, 1), b"a", t0, &mut pace, false), Offer::Pass);
    let mut queued = 0;
    for a in 1..=(QUEUE_MAX / QUEUE_PER_PREFIX) as u8 {
        for b in 1..=QUEUE_PER_PREFIX as u8 {
            if j.offer(src(a, b), b"f", t0, &mut pace, false) == Offer::Queued {
                queued += 1;
            }
        }
    }
    assert_eq!(queued, QUEUE_MAX);
    assert_eq!(
        j.offer(src(200, 1), b"honest", t0, &mut pace, false),
        Offer::Queued
    );
    assert_eq!(j.queued(), QUEUE_MAX);
    // One per source address: a retransmit does not queue twice.
    assert_eq!(
        j.offer(src(200, 1), b"honest", t0, &mut pace, false),
        Offer::Refused(DropReason::JoinQueue)
    );
}

#[test]
fn a_proven_source_goes_first_under_any_flood() {
    let t0 = Instant::now();
    let lim = JoinLimits {
        source_burst: 100,
        upstream_burst: 8,
        ..limits()
    };
    let mut pace = Pace::new(8, Duration::from_secs(1), t0);
    let mut j = Joins::new(&lim);
    // A flood of strangers takes all but the reserves (the relay's own, the proven sources'),
    // then queues.
    let mut passed = 0;
    for a in 1..=50u8 {
        if j.offer(src(a, 1), b"f", t0, &mut pace, false) == Offer::Pass {
            passed += 1;
        }
    }
    assert_eq!(passed, 8 - (OWN_RESERVE + PROVEN_RESERVE) as usize);
    assert_eq!(j.queued(), QUEUE_MAX.min(50 - passed));
    // A returning player passes at once, on the reserve.
    assert_eq!(
        j.offer(src(200, 1), b"p1", t0, &mut pace, true),
        Offer::Pass
    );
    assert_eq!(
        j.offer(src(200, 2), b"p2", t0, &mut pace, true),
        Offer::Pass
    );
    // The reserve spent: the next one waits in front of the fair queue.
    assert_eq!(
        j.offer(src(200, 3), b"p3", t0, &mut pace, true),
        Offer::Queued
    );
    assert_eq!(
        j.offer(src(200, 3), b"p3", t0, &mut pace, true),
        Offer::Refused(DropReason::JoinQueue),
        "a retransmit does not queue twice"
    );
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(j.next_due(t0, &pace), Some(t1));
    let mut out = Vec::new();
    assert_eq!(j.release(t1, &mut pace, &mut out), Some(src(200, 3)));
    assert_eq!(out, b"p3");
    // The strangers' queue waits until more than the reserves are back.
    assert_eq!(j.release(t1, &mut pace, &mut out), None);
    assert_eq!(
        j.next_due(t1, &pace),
        Some(t1 + Duration::from_secs(u64::from(OWN_RESERVE + PROVEN_RESERVE)))
    );
}

#[test]
fn new_players_get_every_other_join_while_proven_sources_wait_too() {
    let t0 = Instant::now();
    let lim = JoinLimits {
        source_burst: 100,
        upstream_burst: 2,
        ..limits()
    };
    let mut pace = Pace::new(2, Duration::from_millis(100), t0);
    let mut j = Joins::new(&lim);
    // The relay's own token kept; one join passes.
    assert_eq!(j.offer(src(1, 1), b"n", t0, &mut pace, false), Offer::Pass);
    for b in 2..=5u8 {
        assert_eq!(
            j.offer(src(1, b), b"n", t0, &mut pace, false),
            Offer::Queued
        );
        assert_eq!(
            j.offer(src(200, b), b"p", t0, &mut pace, true),
            Offer::Queued
        );
    }
    let mut out = Vec::new();
    let mut order = Vec::new();
    let mut t = t0;
    while j.queued() > 0 {
        t = j.next_due(t, &pace).unwrap();
        if let Some(who) = j.release(t, &mut pace, &mut out) {
            order.push(matches!(who.ip(), std::net::IpAddr::V4(a) if a.octets()[1] == 200));
        }
    }
    // Proven first, then turn and turn about.
    assert_eq!(order, [true, false, true, false, true, false, true, false]);
}

#[test]
fn a_full_source_table_does_not_refuse_a_proven_source() {
    let t0 = Instant::now();
    let mut pace = Pace::new(1000, MS, t0);
    let mut j = Joins::new(&limits());
    for i in 0..MAX_JOIN_SOURCES as u32 {
        let s = SocketAddr::from((std::net::Ipv4Addr::from(0x0b00_0000 + i), 1));
        let _ = j.offer(s, b"f", t0 + MS * (i / 1000), &mut pace, false);
    }
    let t = t0 + Duration::from_millis(100);
    assert_eq!(
        j.offer(src(9, 9), b"g", t, &mut pace, false),
        Offer::Refused(DropReason::JoinLimit)
    );
    assert_ne!(
        j.offer(src(9, 8), b"g", t, &mut pace, true),
        Offer::Refused(DropReason::JoinLimit)
    );
}
