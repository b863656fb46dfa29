use std::net::Ipv4Addr;

use super::*;

const S: Duration = Duration::from_secs(1);

#[test]
fn the_first_changes_of_a_window_get_a_line_the_rest_a_summary() {
    let t0 = Instant::now();
    let mut w = Window::new(t0);
    for _ in 0..BAN_LINES {
        assert_eq!(w.change(Change::Ban, t0), (None, Verdict::Line));
    }
    let first = w.change(Change::Ban, t0 + S);
    let due = Verdict::Summarize {
        window: t0,
        at: t0 + BAN_LOG_WINDOW,
    };
    assert_eq!(first, (None, due));
    for i in 0..9_998u32 {
        let change = if i < 3 { Change::Unban } else { Change::Ban };
        assert_eq!(w.change(change, t0 + 2 * S), (None, Verdict::Counted));
    }
    let end = t0 + BAN_LOG_WINDOW;
    let s = w.summary(end);
    assert_eq!(
        s,
        Some(Summary {
            bans: 9_996,
            unbans: 3,
            secs: 60
        })
    );
    assert_eq!(w.summary(end), None, "taken once");
    // The next window starts with the next change, one line again.
    assert_eq!(w.change(Change::Unban, end + S), (None, Verdict::Line));
}

#[test]
fn a_summary_not_written_yet_comes_with_the_first_change_of_the_next_window() {
    let t0 = Instant::now();
    let mut w = Window::new(t0);
    for _ in 0..BAN_LINES + 2 {
        w.change(Change::Ban, t0);
    }
    let later = t0 + BAN_LOG_WINDOW + S / 2;
    let (ended, verdict) = w.change(Change::Ban, later);
    assert_eq!(
        ended,
        Some(Summary {
            bans: 2,
            unbans: 0,
            secs: 61
        })
    );
    assert_eq!(verdict, Verdict::Line);
}

/// Log lines written while `f` runs, on this thread's subscriber.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A capture of the log lines written on this thread while the guard lives.
fn captured() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    (capture, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_every_ban_writes_a_handful_of_lines() {
    let (capture, _guard) = captured();
    let log = Arc::new(BanLog::default());
    let ip = |i: u32| IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i));
    // Every ban a server can hold, and 3 unbans, in 30 s; another server bans once.
    let n = crate::bans::MAX_BANS as u32;
    for i in 0..n {
        log.banned(27960, ip(i));
        if i % 2_000 == 0 {
            tokio::time::advance(Duration::from_millis(900)).await;
        }
    }
    for i in 0..3 {
        log.unbanned(27960, ip(i));
    }
    log.banned(27961, ip(0));
    tokio::time::sleep(BAN_LOG_WINDOW).await;
    let lines = capture.lines();
    assert_eq!(lines.len(), BAN_LINES + 2, "{lines:#?}");
    assert!(
        lines[0].ends_with("banned port=27960 ip=10.0.0.0"),
        "{}",
        lines[0]
    );
    let summary = format!(
        "bans and unbans not logged one by one port=27960 bans={} unbans=3 secs=60",
        n as usize - BAN_LINES
    );
    assert!(lines.iter().any(|l| l.ends_with(&summary)), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("banned port=27961 ip=10.0.0.0"))
    );

    // A minute later, an admin's single unban gets its line; nothing is pending at a stop.
    log.unbanned(27960, ip(7));
    log.flush_all();
    let lines = capture.lines();
    assert_eq!(lines.len(), BAN_LINES + 3, "{lines:#?}");
    assert!(lines[BAN_LINES + 2].ends_with("unbanned port=27960 ip=10.0.0.7"));
}

#[tokio::test(start_paused = true)]
async fn summaries_pending_at_a_stop_are_written() {
    let (capture, _guard) = captured();
    let log = Arc::new(BanLog::default());
    for port in [27961, 27960] {
        for i in 0..BAN_LINES as u32 + 4 {
            log.banned(port, IpAddr::from(Ipv4Addr::from(i)));
        }
    }
    tokio::time::advance(Duration::from_millis(2_500)).await;
    log.flush_all();
    let lines = capture.lines();
    assert_eq!(lines.len(), 2 * BAN_LINES + 2, "{lines:#?}");
    assert!(
        lines[2 * BAN_LINES]
            .ends_with("bans and unbans not logged one by one port=27960 bans=4 unbans=0 secs=3"),
        "{lines:#?}"
    );
    // The window's own task finds nothing left to write.
    tokio::time::sleep(BAN_LOG_WINDOW).await;
    assert_eq!(capture.lines().len(), 2 * BAN_LINES + 2);
}
