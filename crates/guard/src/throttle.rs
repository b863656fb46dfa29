//! A log-line throttle: a repeated warning is written at most once per period, with the count
//! of those suppressed since the last one written.
//!
//! A condition that fires per packet or per connection (no socket left for a session, a
//! refused connection) would otherwise write one line per event: 100 000 lines in two seconds
//! under a flood. The throttle is plain data with no clock of its own; every call takes `now`.

use std::time::{Duration, Instant};

/// At most one line per `period`; the rest counted.
#[derive(Debug, Clone)]
pub struct Throttle {
    period: Duration,
    /// When the last line was written; `None` before the first.
    last: Option<Instant>,
    /// Events since that line that were not written.
    suppressed: u64,
}

impl Throttle {
    /// A throttle writing at most one line per `period`.
    pub const fn new(period: Duration) -> Self {
        Throttle {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// One event at `now`: `Some(n)` when a line may be written now, `n` being the events
    /// suppressed since the last line written; `None` when this one is suppressed (and counted).
    pub fn event(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.period => {
                self.suppressed = self.suppressed.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }

    /// Events suppressed since the last line written.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_suppressed() {
        let t0 = Instant::now();
        let p = Duration::from_secs(10);
        let mut t = Throttle::new(p);
        assert_eq!(t.event(t0), Some(0));
        for i in 1..=99_999 {
            assert_eq!(t.event(t0 + Duration::from_micros(i)), None);
        }
        assert_eq!(t.suppressed(), 99_999);
        assert_eq!(t.event(t0 + p - Duration::from_millis(1)), None);
        assert_eq!(t.event(t0 + p), Some(100_000));
        assert_eq!(t.suppressed(), 0);
        assert_eq!(t.event(t0 + p * 3), Some(0));
    }
}
