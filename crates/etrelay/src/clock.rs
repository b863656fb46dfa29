//! Time. Every decision reads one monotonic clock, tokio's ([`Instant`]), so tests can pause it
//! and drive time by hand; [`guard`] takes a `std::time::Instant`, which
//! [`Instant::into_std`] gives from the same clock. Wall-clock dates ([`SystemTime`], read by
//! [`wall_now`] and nowhere else) are only kept where a date is shown or stored:
//! registrations, bans, session and probe times, as Unix seconds in the API and the state
//! files.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use tokio::time::Instant;

/// The standard library's form of [`Instant`] (what [`guard`] takes), given by
/// [`Instant::into_std`]; never read on its own.
pub type StdInstant = std::time::Instant;

/// The wall clock's date now: the one place the crate reads it.
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Unix seconds of a date (0 before the epoch).
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The date `s` Unix seconds after the epoch.
pub fn from_unix(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

/// The instant of the monotonic clock at which the wall clock reads `at`, given that it reads
/// `now_sys` at `now` (`now` itself for a date already past).
pub fn deadline(at: SystemTime, now_sys: SystemTime, now: Instant) -> Instant {
    now + at.duration_since(now_sys).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_seconds_and_deadlines() {
        assert_eq!(unix(from_unix(1_700_000_000)), 1_700_000_000);
        assert_eq!(unix(UNIX_EPOCH - Duration::from_secs(1)), 0);
        let (sys, now) = (wall_now(), Instant::now());
        let later = sys + Duration::from_secs(5);
        assert_eq!(deadline(later, sys, now), now + Duration::from_secs(5));
        assert_eq!(deadline(sys - Duration::from_secs(5), sys, now), now);
    }
}
