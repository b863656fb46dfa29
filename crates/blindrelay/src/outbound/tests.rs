//! The pacing rule on a paused tokio clock.

use super::*;

const HOP: NodeId = [7; 32];
const OTHER: NodeId = [8; 32];

fn pacer(limit: u32, window_secs: u64, limits: QueueLimits) -> Arc<Pacer> {
    Pacer::new(
        HopRate {
            limit,
            window: Duration::from_secs(window_secs),
        },
        limits,
    )
}

fn roomy() -> QueueLimits {
    QueueLimits {
        per_hop_entries: 1000,
        per_hop_bytes: 1 << 30,
        total_entries: 1000,
        total_bytes: 1 << 30,
    }
}

/// Sends `n` requests to `hop` one after the other, each answered at once; returns when each
/// went, relative to the start.
async fn send_all(p: &Arc<Pacer>, hop: &NodeId, n: usize) -> Vec<Duration> {
    let start = Instant::now();
    let mut went = Vec::new();
    for _ in 0..n {
        let mut t = p.join(hop, 100).unwrap();
        assert!(t.go(start + Duration::from_secs(3600)).await);
        went.push(start.elapsed());
        t.answered(true);
    }
    went
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_at_once_then_requests_go_as_earlier_ones_leave_the_window() {
    let p = pacer(5, 60, roomy());
    let went = send_all(&p, &HOP, 12).await;
    assert!(went[..5].iter().all(|d| d.is_zero()), "{went:?}");
    assert!(went[5..10].iter().all(|d| *d == Duration::from_secs(60)));
    assert!(went[10..].iter().all(|d| *d == Duration::from_secs(120)));
    // Another next hop has its own budget.
    assert!(send_all(&p, &OTHER, 5).await.iter().all(|d| d.is_zero()));
}

/// The next hop's guard, replayed: whatever window start it picks, it never counts more than
/// `limit` of the requests in a window, with latencies that vary per request.
#[tokio::test(start_paused = true)]
async fn no_window_of_the_next_hop_ever_holds_more_than_the_limit() {
    let (limit, window) = (10u32, Duration::from_secs(6));
    let p = pacer(limit, window.as_secs(), roomy());
    let start = Instant::now();
    let counted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..60u64 {
        let (p, counted) = (Arc::clone(&p), Arc::clone(&counted));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 97 % 3000)).await;
            let mut t = p.join(&HOP, 10).unwrap();
            assert!(t.go(start + Duration::from_secs(3600)).await);
            // Counted somewhere on the way, answered later.
            let latency = Duration::from_millis(50 + i * 131 % 900);
            tokio::time::sleep(latency * (i % 3) as u32 / 2).await;
            counted.lock().unwrap().push(Instant::now());
            tokio::time::sleep(latency).await;
            t.answered(i % 7 != 0);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut at = counted.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 60);
    for (i, s) in at.iter().enumerate() {
        let inside = at[i..].iter().take_while(|t| **t < *s + window).count();
        assert!(inside <= limit as usize, "{inside} in a window from #{i}");
    }
    // It still went fast: 60 requests at 10 per 6 s take about 30-40 s, not minutes.
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn unanswered_requests_count_a_little_longer() {
    let p = pacer(1, 10, roomy());
    let start = Instant::now();
    let mut t = p.join(&HOP, 1).unwrap();
    assert!(t.go(start).await);
    t.answered(false);
    drop(t);
    let mut t = p.join(&HOP, 1).unwrap();
    assert!(t.go(start + Duration::from_secs(100)).await);
    assert_eq!(start.elapsed(), Duration::from_secs(10) + UNANSWERED_GRACE);
    // Dropped on the wire: unanswered too.
    drop(t);
    let mut t = p.join(&HOP, 1).unwrap();
    let before = Instant::now();
    assert!(t.go(before + Duration::from_secs(100)).await);
    assert_eq!(before.elapsed(), Duration::from_secs(10) + UNANSWERED_GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_at_most_until_its_deadline_and_turns_go_in_order() {
    let p = pacer(1, 60, roomy());
    let start = Instant::now();
    let mut first = p.join(&HOP, 1).unwrap();
    assert!(first.go(start).await);
    let mut second = p.join(&HOP, 1).unwrap();
    assert!(!second.go(start + Duration::from_secs(5)).await);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    // A later place does not overtake an earlier one.
    let mut third = p.join(&HOP, 1).unwrap();
    first.answered(true);
    drop(first);
    assert!(!third.go(Instant::now() + Duration::from_secs(120)).await);
    assert!(second.go(Instant::now() + Duration::from_secs(120)).await);
    // The first was answered at 5 s: its window ended long before.
    assert_eq!(start.elapsed(), Duration::from_secs(5 + 120));
    assert_eq!(p.snapshot().waiting, 1);
    drop(third);
    drop(second);
    assert_eq!(p.snapshot().waiting, 0);
}

/// A request to `hop` on the wire: with a limit of 1, the next ones wait.
fn on_the_wire(p: &Arc<Pacer>, hop: &NodeId) -> Turn {
    let t = p.join(hop, 0).unwrap();
    assert_eq!(t.phase, Phase::OnWire);
    t
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_bounded_in_entries_and_bytes_per_hop_and_in_all() {
    let limits = QueueLimits {
        per_hop_entries: 3,
        per_hop_bytes: 1000,
        total_entries: 5,
        total_bytes: 1500,
    };
    let p = pacer(1, 60, limits);
    let wire: Vec<_> = [HOP, OTHER, [9; 32], [10; 32]]
        .iter()
        .map(|h| on_the_wire(&p, h))
        .collect();
    let a: Vec<_> = (0..3).map(|_| p.join(&HOP, 100).unwrap()).collect();
    assert_eq!(p.join(&HOP, 100).err(), Some(QueueFull), "entries per hop");
    let b = p.join(&OTHER, 900).unwrap();
    assert_eq!(p.join(&OTHER, 101).err(), Some(QueueFull), "bytes per hop");
    let c = p.join(&[9; 32], 200).unwrap();
    assert_eq!(
        p.join(&[10; 32], 1).err(),
        Some(QueueFull),
        "entries in all"
    );
    drop(c);
    assert_eq!(
        p.join(&[10; 32], 400).err(),
        Some(QueueFull),
        "bytes in all"
    );
    let d = p.join(&[10; 32], 100).unwrap();
    assert_eq!(
        p.snapshot(),
        QueueSnapshot {
            waiting: 5,
            waiting_bytes: 1300,
            next_hops: 4
        }
    );
    drop((a, b, d));
    assert_eq!(p.snapshot().waiting, 0);
    assert_eq!(p.snapshot().waiting_bytes, 0);
    drop(wire);
}

#[tokio::test(start_paused = true)]
async fn a_request_on_the_wire_leaves_room_in_the_queue() {
    let limits = QueueLimits {
        per_hop_entries: 1,
        ..roomy()
    };
    let p = pacer(1, 60, limits);
    let mut a = on_the_wire(&p, &HOP);
    let b = p.join(&HOP, 1).unwrap();
    assert_eq!(p.join(&HOP, 1).err(), Some(QueueFull));
    // Between attempts a request holds no place; retrying, it takes its old place back
    // (the oldest), over the bound for a moment, and goes before the later one.
    a.answered(true);
    assert_eq!(p.snapshot().waiting, 1);
    assert!(!a.try_now(), "the rate (1 per 60 s) is spent");
    assert_eq!(p.snapshot().waiting, 2);
    assert_eq!(b.phase, Phase::Waiting);
    let mut b = b;
    let (went_a, went_b) = tokio::join!(
        a.go(Instant::now() + Duration::from_secs(300)),
        b.go(Instant::now() + Duration::from_secs(61))
    );
    assert!(
        went_a && !went_b,
        "the retry went first, the later one waits another window"
    );
    drop((a, b));
    assert_eq!(p.snapshot().waiting, 0);
}
