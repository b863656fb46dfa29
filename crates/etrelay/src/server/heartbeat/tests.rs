use super::*;
use crate::clock::wall_now;

const INTERVAL: Duration = Duration::from_secs(300);

fn heartbeat() -> Option<ToMasters> {
    Some(ToMasters {
        beat: Beat::Heartbeat,
        packet: Game::Et.heartbeat(),
    })
}

fn flatline() -> Option<ToMasters> {
    Some(ToMasters {
        beat: Beat::Flatline,
        packet: b"\xff\xff\xff\xffheartbeat ETFlatline-1\n",
    })
}

/// One round at `now`: the machine asks for a probe, gets its result, then says when the next
/// one is due.
fn round(hb: &mut Heartbeat, now: Instant, answered: bool) -> Round {
    assert_eq!(hb.poll(now), Next::Probe);
    let r = hb.probed(answered);
    assert_eq!(hb.poll(now), Next::WaitUntil(now + INTERVAL));
    r
}

#[test]
fn unknown_to_up_heartbeats_and_up_keeps_heartbeating() {
    let t0 = Instant::now();
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    let r = round(&mut hb, t0, true);
    assert_eq!(
        r,
        Round {
            state: ProbeState::Up,
            change: Change::Answers,
            send: heartbeat()
        }
    );
    // Not before the interval has passed since the start of the round.
    let t1 = t0 + INTERVAL;
    assert_eq!(hb.poll(t1 - Duration::from_millis(1)), Next::WaitUntil(t1));
    let r = round(&mut hb, t1, true);
    assert_eq!((r.change, r.send), (Change::None, heartbeat()));
}

#[test]
fn one_flatline_for_the_whole_outage_then_heartbeats_again() {
    let mut t = Instant::now();
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    assert_eq!(round(&mut hb, t, true).send, heartbeat());
    t += INTERVAL;
    let r = round(&mut hb, t, false);
    assert_eq!(
        r,
        Round {
            state: ProbeState::Down,
            change: Change::StoppedAnswering,
            send: flatline()
        }
    );
    // However many rounds the outage lasts: nothing more.
    for _ in 0..5 {
        t += INTERVAL;
        let r = round(&mut hb, t, false);
        assert_eq!(
            (r.state, r.change, r.send),
            (ProbeState::Down, Change::None, None)
        );
    }
    t += INTERVAL;
    let r = round(&mut hb, t, true);
    assert_eq!(
        r,
        Round {
            state: ProbeState::Up,
            change: Change::Answers,
            send: heartbeat()
        }
    );
}

#[test]
fn a_server_never_up_gets_no_flatline() {
    let t0 = Instant::now();
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    let r = round(&mut hb, t0, false);
    assert_eq!(
        r,
        Round {
            state: ProbeState::Down,
            change: Change::DoesNotAnswer,
            send: None
        }
    );
    let r = round(&mut hb, t0 + INTERVAL, false);
    assert_eq!((r.change, r.send), (Change::None, None));
}

#[test]
fn stopping_sends_the_flatline_whatever_the_state() {
    for answers in [None, Some(true), Some(false)] {
        let mut hb = Heartbeat::new(Game::Et, INTERVAL);
        if let Some(a) = answers {
            round(&mut hb, Instant::now(), a);
        }
        assert_eq!(hb.stop(), flatline(), "{answers:?}");
    }
}

#[test]
fn q3_heartbeats_and_never_flatlines() {
    let t0 = Instant::now();
    let mut hb = Heartbeat::new(Game::Q3, INTERVAL);
    let r = round(&mut hb, t0, true);
    assert_eq!(
        r.send,
        Some(ToMasters {
            beat: Beat::Heartbeat,
            packet: b"\xff\xff\xff\xffheartbeat QuakeArena-1\n"
        })
    );
    let r = round(&mut hb, t0 + INTERVAL, false);
    assert_eq!((r.change, r.send), (Change::StoppedAnswering, None));
    assert_eq!(hb.stop(), None);
}

#[test]
fn the_probe_status_keeps_the_last_answer() {
    let mut st = ProbeStatus::default();
    assert_eq!(st.state, ProbeState::Unknown);
    let t1 = wall_now();
    st.record(ProbeState::Up, t1);
    let t2 = t1 + Duration::from_secs(300);
    st.record(ProbeState::Down, t2);
    assert_eq!(st.state, ProbeState::Down);
    assert_eq!((st.last_probe, st.last_answer), (Some(t2), Some(t1)));
}

#[test]
fn rounds_start_on_a_fixed_period_whatever_the_probe_takes() {
    let t0 = Instant::now();
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    // A down round: 3 unanswered probes of 3 s each.
    let probe_time = Duration::from_secs(9);
    for k in 0..5u32 {
        let start = t0 + INTERVAL * k;
        assert_eq!(hb.poll(start), Next::Probe, "round {k}");
        let end = start + probe_time;
        hb.probed(k % 2 == 0);
        // The next round starts one period after this one started, not after it ended.
        assert_eq!(hb.poll(end), Next::WaitUntil(start + INTERVAL), "round {k}");
    }
}

#[test]
fn a_late_round_skips_the_starts_it_missed() {
    let t0 = Instant::now();
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    assert_eq!(round(&mut hb, t0, true).send, heartbeat());
    // Woken 2.5 periods late (a suspended process): one round now, none to catch up.
    let late = t0 + INTERVAL * 3 + INTERVAL / 2;
    assert_eq!(hb.poll(late), Next::Probe);
    hb.probed(true);
    assert_eq!(hb.poll(late), Next::WaitUntil(t0 + INTERVAL * 4));
    // A round that lasts longer than the period: the next one is due at once, then on the
    // schedule again.
    let t4 = t0 + INTERVAL * 4;
    assert_eq!(hb.poll(t4), Next::Probe);
    hb.probed(false);
    let after = t4 + INTERVAL + Duration::from_secs(1);
    assert_eq!(hb.poll(after), Next::Probe);
    hb.probed(false);
    assert_eq!(hb.poll(after), Next::WaitUntil(t4 + INTERVAL * 2));
}

#[tokio::test(start_paused = true)]
async fn on_a_paused_clock_heartbeats_are_one_period_apart() {
    // The task's loop, with the probe's time spent on tokio's (paused) clock.
    let mut hb = Heartbeat::new(Game::Et, INTERVAL);
    let t0 = Instant::now();
    let mut beats = Vec::new();
    while beats.len() < 4 {
        match hb.poll(Instant::now()) {
            Next::WaitUntil(at) => tokio::time::sleep_until(at).await,
            Next::Probe => {
                // Two probes unanswered (3 s each), the third answered.
                tokio::time::sleep(Duration::from_secs(6)).await;
                if hb.probed(true).send.is_some() {
                    beats.push(Instant::now() - t0);
                }
            }
        }
    }
    let secs: Vec<u64> = beats.iter().map(|d| d.as_secs()).collect();
    assert_eq!(secs, vec![6, 306, 606, 906]);
}
