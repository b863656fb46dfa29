//! A fixed window counter: events counted from a start instant until the window's length has
//! passed, then counted afresh.
//!
//! Both relays count events in fixed windows: blindrelay's request gate (requests per window,
//! process-wide) and its previous-hop guard (requests per minute, scored failures per five
//! minutes, per identity). The window is plain data with no clock of its own; every call takes
//! `now`, and the window's length is passed in too, so one rule may keep several windows of
//! different lengths in a few bytes each.

use std::time::{Duration, Instant};

/// Events counted since `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    /// When the current window began.
    start: Instant,
    /// Events counted in it.
    count: u32,
}

impl FixedWindow {
    /// An empty window starting at `now`.
    pub const fn new(now: Instant) -> Self {
        FixedWindow {
            start: now,
            count: 0,
        }
    }

    /// True when a window of length `len` begun at this one's start has ended by `now`.
    pub fn has_ended(&self, now: Instant, len: Duration) -> bool {
        now.saturating_duration_since(self.start) >= len
    }

    /// Starts a new, empty window at `now` if the current one has ended.
    fn roll(&mut self, now: Instant, len: Duration) {
        if self.has_ended(now, len) {
            *self = FixedWindow::new(now);
        }
    }

    /// Counts one event at `now`; returns the events in the current window, this one included.
    pub fn hit(&mut self, now: Instant, len: Duration) -> u32 {
        self.roll(now, len);
        self.count = self.count.saturating_add(1);
        self.count
    }

    /// Counts one event at `now` only while fewer than `limit` were counted in the current
    /// window; true when it was counted.
    pub fn try_hit(&mut self, now: Instant, len: Duration, limit: u32) -> bool {
        self.roll(now, len);
        let admitted = self.count < limit;
        if admitted {
            self.count += 1;
        }
        admitted
    }

    /// Forgets the events counted so far; the window keeps its start.
    pub fn clear(&mut self) {
        self.count = 0;
    }

    /// Events in the window as last counted (a window that has ended still shows its count
    /// until the next event rolls it).
    pub fn count(&self) -> u32 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: Duration = Duration::from_secs(60);

    #[test]
    fn counts_within_the_window_and_afresh_after_it() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(t0);
        assert_eq!(w.hit(t0, LEN), 1);
        assert_eq!(w.hit(t0 + Duration::from_secs(59), LEN), 2);
        assert!(!w.has_ended(t0 + Duration::from_secs(59), LEN));
        assert!(w.has_ended(t0 + LEN, LEN));
        assert_eq!(
            w.hit(t0 + LEN, LEN),
            1,
            "a new window starts at its first event"
        );
        assert!(!w.has_ended(t0 + LEN + Duration::from_secs(59), LEN));
    }

    #[test]
    fn try_hit_admits_up_to_the_limit() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(t0);
        let admitted = (0..5).filter(|_| w.try_hit(t0, LEN, 3)).count();
        assert_eq!(admitted, 3);
        assert_eq!(w.count(), 3, "refusals are not counted");
        assert!(w.try_hit(t0 + LEN, LEN, 3));
    }

    #[test]
    fn clear_keeps_the_start() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(t0);
        w.hit(t0, LEN);
        w.clear();
        assert_eq!(w.count(), 0);
        assert!(w.has_ended(t0 + LEN, LEN));
    }

    #[test]
    fn a_limit_of_zero_admits_nothing() {
        let t0 = Instant::now();
        assert!(!FixedWindow::new(t0).try_hit(t0, LEN, 0));
    }
}
