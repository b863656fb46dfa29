//! What a process costs, read from `/proc`: resident memory and open file descriptors, sampled
//! on a thread while an attack runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Resident memory of `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident memory of `pid` since it started, in KiB (`VmHWM`).
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Open file descriptors of `pid`.
pub fn fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The largest figures seen while sampling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
    /// Samples taken.
    pub samples: usize,
}

/// Samples a process every `every` on a thread until stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Peak>>,
}

impl Sampler {
    /// Starts sampling `pid`.
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut peak = Peak::default();
                // Bounded by the caller's stop; one sample at least.
                loop {
                    if let Some(r) = rss_kib(pid) {
                        peak.rss_kib = peak.rss_kib.max(r);
                    }
                    if let Some(f) = fds(pid) {
                        peak.fds = peak.fds.max(f);
                    }
                    peak.samples += 1;
                    if stop.load(Ordering::Relaxed) {
                        return peak;
                    }
                    std::thread::sleep(every);
                }
            })
        };
        Sampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the peaks seen.
    pub fn stop(mut self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 0);
        assert!(fds(me).unwrap() >= 3);
        let peak = Sampler::start(me, Duration::from_millis(5)).stop();
        assert!(peak.samples >= 1 && peak.rss_kib > 0);
    }
}
