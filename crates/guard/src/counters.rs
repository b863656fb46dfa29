//! Atomic counters and the Prometheus text exposition format.
//!
//! Counters are plain `AtomicU64` newtypes that sit as named fields in each relay's metrics
//! struct; [`PromText`] renders them. Only aggregates are ever rendered: a label value is a
//! fixed word chosen by the code (a reason, a port), never something a peer sent.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (open sessions, state flags).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Kind of a Prometheus metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// Builds a Prometheus text exposition document.
#[derive(Debug, Default)]
pub struct PromText {
    out: String,
}

impl PromText {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a metric family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// One sample of the current family, with `labels` as `(name, value)` pairs.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// The finished document.
    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_counts() {
        let c = Counter::default();
        c.inc();
        c.add(4);
        assert_eq!(c.get(), 5);
    }

    #[test]
    fn renders_families_and_escapes_labels() {
        let mut p = PromText::new();
        p.family("x_total", Kind::Counter, "Things.\nCounted.")
            .sample("x_total", &[("port", "27960"), ("why", "a\"b")], 3)
            .family("y", Kind::Gauge, "Y.")
            .sample("y", &[], 1);
        let text = p.finish();
        assert_eq!(
            text,
            "# HELP x_total Things.\\nCounted.\n# TYPE x_total counter\n\
             x_total{port=\"27960\",why=\"a\\\"b\"} 3\n# HELP y Y.\n# TYPE y gauge\ny 1\n"
        );
    }
}
