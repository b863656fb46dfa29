//! Time, passed in: the wall clock in production, a hand-driven one in tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the node reads the time.
#[derive(Debug, Clone)]
pub enum Clock {
    /// The system clocks.
    System,
    /// A clock that moves only when told (tests).
    Manual(Arc<ManualClock>),
}

/// A clock for tests: starts at given Unix seconds and moves by [`ManualClock::advance`].
#[derive(Debug)]
pub struct ManualClock {
    base_instant: Instant,
    base_unix: u64,
    offset_ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `unix` seconds now.
    pub fn new(unix: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            base_instant: Instant::now(),
            base_unix: unix,
            offset_ms: AtomicU64::new(0),
        })
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        self.offset_ms
            .fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock {
    /// Unix seconds.
    pub fn unix(&self) -> u64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            Clock::Manual(m) => m.base_unix + m.offset_ms.load(Ordering::SeqCst) / 1000,
        }
    }

    /// A monotonic instant.
    pub fn instant(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(m) => {
                m.base_instant + Duration::from_millis(m.offset_ms.load(Ordering::SeqCst))
            }
        }
    }
}
