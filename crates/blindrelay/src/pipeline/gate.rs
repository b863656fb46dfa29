//! Step 1, the request gate: a process-wide admission window ([`DEFAULT_PER_WINDOW`] requests
//! per fixed [`WINDOW`] by default, `--admission-per-minute`) and at most [`MAX_IN_FLIGHT`]
//! requests in flight (`--max-in-flight`). Checked before the body is read; never waits.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use guard::admission::{Gate, Permit};
use guard::window::FixedWindow;

/// Requests in flight at most, by default.
pub const MAX_IN_FLIGHT: usize = 64;
/// Requests admitted per window, process-wide, by default.
pub const DEFAULT_PER_WINDOW: u32 = 1200;
/// The admission window.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The request gate.
#[derive(Debug)]
pub struct RequestGate {
    /// Requests admitted per [`WINDOW`].
    limit: u32,
    window: Mutex<FixedWindow>,
    in_flight: Gate,
}

/// A request admitted by step 1: it holds its in-flight slot until dropped.
#[derive(Debug)]
pub struct Admitted {
    _slot: Permit,
}

impl RequestGate {
    /// A gate admitting `limit` requests per [`WINDOW`], `max_in_flight` at once; the first
    /// window starts at `now`.
    pub fn new(limit: u32, max_in_flight: usize, now: Instant) -> Self {
        RequestGate {
            limit,
            window: Mutex::new(FixedWindow::new(now)),
            in_flight: Gate::new(max_in_flight),
        }
    }

    /// Step 1 at `now`: `None` when the window is used up or every in-flight slot is taken.
    pub fn admit(&self, now: Instant) -> Option<Admitted> {
        let in_window = self
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_hit(now, WINDOW, self.limit);
        self.in_flight
            .try_acquire()
            .filter(|_| in_window)
            .map(|slot| Admitted { _slot: slot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_and_the_in_flight_limit() {
        let t0 = Instant::now();
        let gate = RequestGate::new(4, 2, t0);
        let a = gate.admit(t0).expect("first");
        let _b = gate.admit(t0).expect("second");
        assert!(gate.admit(t0).is_none(), "two in flight at most");
        drop(a);
        // The refusal above took its place in the window too: this is the fourth and last.
        assert!(gate.admit(t0).is_some(), "the slot is given back on drop");
        assert!(gate.admit(t0).is_none(), "the window is used up");
        assert!(gate.admit(t0 + WINDOW).is_some(), "a new window");
    }
}
