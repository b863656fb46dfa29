//! Time: one clock, tokio's. Every deadline, window, rate and quarantine reads tokio's monotonic
//! clock ([`Instant`]), so a test pauses it (`#[tokio::test(start_paused = true)]`) and drives
//! it with `tokio::time::advance`. The `guard` crate takes a `std::time::Instant`:
//! [`Clock::instant`] gives one from the same clock.
//!
//! Unix seconds (a layer's expiry, descriptors, the dates of the status document) come from
//! [`Clock::unix`], the one place they are read: the system's wall clock in production
//! ([`Clock::System`]), or in tests a start date that moves with tokio's clock
//! ([`Clock::starting_at`]), so pausing and advancing tokio's clock moves both.
//!
//! This module is the only one that reads the wall clock or tokio's `Instant::now`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use tokio::time::Instant;

/// Where the node reads the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The system's wall clock for dates; tokio's clock for instants.
    System,
    /// Dates that read `unix` seconds at tokio's instant `at` and move with tokio's clock
    /// (tests: paused, it moves only when advanced).
    Since {
        /// Unix seconds at `at`.
        unix: u64,
        /// The tokio instant the clock read `unix` at.
        at: Instant,
    },
}

impl Clock {
    /// A clock whose dates read `unix` seconds now and move with tokio's clock.
    pub fn starting_at(unix: u64) -> Clock {
        Clock::Since {
            unix,
            at: Instant::now(),
        }
    }

    /// Unix seconds now.
    pub fn unix(&self) -> u64 {
        match self {
            Clock::System => wall_unix(),
            Clock::Since { unix, at } => unix + Instant::now().duration_since(*at).as_secs(),
        }
    }

    /// Tokio's clock now: what deadlines and timeouts are set from.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Tokio's clock now, as the `std` instant the `guard` crate's tables take.
    pub fn instant(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

/// Unix seconds of the system's wall clock (0 before the epoch).
pub fn wall_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Tokio's clock now, for code that holds no [`Clock`] (a deadline of the client side).
pub fn now() -> Instant {
    Instant::now()
}

/// The time since `start` on tokio's clock.
pub fn elapsed(start: Instant) -> Duration {
    Instant::now().duration_since(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn dates_and_instants_move_together_on_a_paused_clock() {
        let clock = Clock::starting_at(1_800_000_000);
        let (t0, i0) = (clock.now(), clock.instant());
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(clock.unix(), 1_800_000_002);
        assert_eq!(clock.now() - t0, Duration::from_millis(2_500));
        assert_eq!(clock.instant() - i0, Duration::from_millis(2_500));
        assert!(Clock::System.unix() > 1_700_000_000);
    }
}
