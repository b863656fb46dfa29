//! The log lines of ban changes, bounded: an admin's ban or unban gets its own INFO line, a
//! burst gets a summary.
//!
//! Each server's changes are cut into windows of [`BAN_LOG_WINDOW`], a window starting at the
//! first change after the previous one ended. The first [`BAN_LINES`] changes of a window are
//! logged one by one (`port 27960: 203.0.113.66 banned`); the others are counted, and the
//! window's end writes one summary (`port 27960: 12345 bans and 3 unbans not logged one by one
//! in the last 60 s`). A server thus writes at most `BAN_LINES + 1` ban lines per window, so at
//! most twice that in any 60 s, whatever the rate of changes (before: one line per change, 131
//! 000 a minute under a burst).
//!
//! The counting is plain data without a clock ([`Window`]: every call takes `now`, like
//! [`guard::throttle::Throttle`], which writes one line per period and would hide the second of
//! two bans an admin makes within a minute). [`BanLog`] holds one window per server and writes
//! the lines. A window with changes counted gets one task that writes its summary when it ends:
//! one task per window, nothing allocated per change. Summaries pending when the relay stops are
//! written then ([`BanLog::flush_all`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tracing::info;

use crate::clock::Instant;

/// Ban changes of one server logged one by one per window; the rest are counted.
pub const BAN_LINES: usize = 5;
/// The window: at most [`BAN_LINES`] lines and one summary per server in each.
pub const BAN_LOG_WINDOW: Duration = Duration::from_secs(60);

/// A ban change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An address banned.
    Ban,
    /// An address unbanned.
    Unban,
}

/// What to do with one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it on its own line.
    Line,
    /// Counted for the window's summary, which is due at `at` (the first change counted in the
    /// window: schedule it).
    Summarize {
        /// The window's start: it names the window.
        window: Instant,
        /// When the summary is due.
        at: Instant,
    },
    /// Counted; the summary is scheduled already.
    Counted,
}

/// Changes counted in a window and not logged one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Bans counted.
    pub bans: u64,
    /// Unbans counted.
    pub unbans: u64,
    /// Seconds since the window started (rounded up).
    pub secs: u64,
}

/// One server's current window: plain data, every call takes `now`.
#[derive(Debug, Clone)]
pub struct Window {
    /// When it started: at its first change.
    start: Instant,
    /// Changes logged one by one in it.
    lines: usize,
    /// Bans counted in it.
    bans: u64,
    /// Unbans counted in it.
    unbans: u64,
    /// Its summary is scheduled.
    scheduled: bool,
}

impl Window {
    /// A window starting at `now`.
    pub fn new(now: Instant) -> Self {
        Window {
            start: now,
            lines: 0,
            bans: 0,
            unbans: 0,
            scheduled: false,
        }
    }

    /// One change at `now`: what to do with it, and the summary of the window that just ended
    /// when it had one not written yet (write it first).
    pub fn change(&mut self, change: Change, now: Instant) -> (Option<Summary>, Verdict) {
        let mut ended = None;
        if now.saturating_duration_since(self.start) >= BAN_LOG_WINDOW {
            ended = self.summary(now);
            *self = Window::new(now);
        }
        if self.lines < BAN_LINES {
            self.lines += 1;
            return (ended, Verdict::Line);
        }
        match change {
            Change::Ban => self.bans += 1,
            Change::Unban => self.unbans += 1,
        }
        if self.scheduled {
            return (ended, Verdict::Counted);
        }
        self.scheduled = true;
        let at = self.start + BAN_LOG_WINDOW;
        let window = self.start;
        (ended, Verdict::Summarize { window, at })
    }

    /// The changes counted so far, taken (`None`: none).
    pub fn summary(&mut self, now: Instant) -> Option<Summary> {
        self.scheduled = false;
        if self.bans == 0 && self.unbans == 0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.start);
        let secs = elapsed.as_secs() + u64::from(elapsed.subsec_nanos() > 0);
        Some(Summary {
            bans: std::mem::take(&mut self.bans),
            unbans: std::mem::take(&mut self.unbans),
            secs,
        })
    }
}

/// The ban lines of every server: one [`Window`] per port.
#[derive(Debug, Default)]
pub struct BanLog {
    windows: Mutex<HashMap<u16, Window>>,
}

impl BanLog {
    /// Logs (or counts) that `ip` was banned on the server of `port`.
    ///
    /// # Panics
    /// Outside a tokio runtime (a window's summary is written by a task of its own).
    pub fn banned(self: &Arc<Self>, port: u16, ip: IpAddr) {
        if self.note(port, Change::Ban) {
            info!(port, %ip, "banned");
        }
    }

    /// Logs (or counts) that `ip` was unbanned on the server of `port`.
    ///
    /// # Panics
    /// As [`BanLog::banned`].
    pub fn unbanned(self: &Arc<Self>, port: u16, ip: IpAddr) {
        if self.note(port, Change::Unban) {
            info!(port, %ip, "unbanned");
        }
    }

    /// Writes every summary pending (the relay stops).
    pub fn flush_all(&self) {
        let now = Instant::now();
        let mut pending: Vec<(u16, Summary)> = self
            .lock()
            .iter_mut()
            .filter_map(|(port, w)| w.summary(now).map(|s| (*port, s)))
            .collect();
        pending.sort_by_key(|(port, _)| *port);
        for (port, s) in pending {
            log_summary(port, s);
        }
    }

    /// Counts one change; true when it gets its own line. Schedules the window's summary.
    fn note(self: &Arc<Self>, port: u16, change: Change) -> bool {
        let now = Instant::now();
        let (ended, verdict) = self
            .lock()
            .entry(port)
            .or_insert_with(|| Window::new(now))
            .change(change, now);
        if let Some(s) = ended {
            log_summary(port, s);
        }
        match verdict {
            Verdict::Line => true,
            Verdict::Counted => false,
            Verdict::Summarize { window, at } => {
                let log = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    log.flush(port, window);
                });
                false
            }
        }
    }

    /// Writes the summary of the window of `port` that started at `window`, unless a later
    /// change already did.
    fn flush(&self, port: u16, window: Instant) {
        let now = Instant::now();
        let summary = match self.lock().get_mut(&port) {
            Some(w) if w.start == window => w.summary(now),
            _ => None,
        };
        if let Some(s) = summary {
            log_summary(port, s);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u16, Window>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn log_summary(port: u16, s: Summary) {
    info!(
        port,
        bans = s.bans,
        unbans = s.unbans,
        secs = s.secs,
        "bans and unbans not logged one by one"
    );
}

#[cfg(test)]
mod tests;
