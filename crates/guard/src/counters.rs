//! Atomic counters, counter sets and the Prometheus text exposition format.
//!
//! Counters are plain atomic newtypes ([`Counter`], [`Gauge`], [`Stamp`]) that sit as named
//! fields in each relay's counter struct. [`counter_set!`](crate::counter_set) declares such a
//! struct once: the fields, a plain-value snapshot of it (for JSON and tests), and its
//! Prometheus families, named after the fields with the fields' doc comments as help text.
//! [`PromText`] renders them. Only aggregates are ever rendered: a label value is a fixed word
//! chosen by the code (a reason, a port), never something a peer sent.

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

/// When something last happened, in Unix seconds; it only moves forward.
#[derive(Debug, Default)]
pub struct Stamp(AtomicU64);

impl Stamp {
    /// Records `unix` (seconds), unless a later time is recorded already.
    #[inline]
    pub fn set(&self, unix: u64) {
        self.0.fetch_max(unix, Ordering::Relaxed);
    }

    /// The time, `None` if never.
    #[inline]
    pub fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }
}

/// One field of a counter set: its plain value and how it renders.
pub trait Metric {
    /// The field's value in a snapshot.
    type Value;
    /// Its Prometheus kind.
    const KIND: Kind;
    /// Appended to the field's name to make the family's name.
    const SUFFIX: &'static str;
    /// The value now.
    fn value(&self) -> Self::Value;
    /// The value now as a Prometheus sample.
    fn sample(&self) -> u64;
}

impl Metric for Counter {
    type Value = u64;
    const KIND: Kind = Kind::Counter;
    const SUFFIX: &'static str = "_total";
    fn value(&self) -> u64 {
        self.get()
    }
    fn sample(&self) -> u64 {
        self.get()
    }
}

impl Metric for Gauge {
    type Value = u64;
    const KIND: Kind = Kind::Gauge;
    const SUFFIX: &'static str = "";
    fn value(&self) -> u64 {
        self.get()
    }
    fn sample(&self) -> u64 {
        self.get()
    }
}

impl Metric for Stamp {
    type Value = Option<u64>;
    const KIND: Kind = Kind::Gauge;
    const SUFFIX: &'static str = "_timestamp_seconds";
    fn value(&self) -> Option<u64> {
        self.get()
    }
    /// 0 for never.
    fn sample(&self) -> u64 {
        self.get().unwrap_or(0)
    }
}

/// One Prometheus family of a counter set: one field.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The field's name.
    pub field: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Appended to the prefix and the field to make the family's name.
    pub suffix: &'static str,
    /// The field's doc comment, one line per source line.
    pub doc: &'static str,
}

impl Family {
    /// The family's name: `prefix`, the field, the kind's suffix.
    pub fn name(&self, prefix: &str) -> String {
        format!("{prefix}{}{}", self.field, self.suffix)
    }

    /// The help text: the doc comment's lines joined into one.
    pub fn help(&self) -> String {
        let words: Vec<&str> = self
            .doc
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        words.join(" ")
    }
}

/// A struct of counters declared with [`counter_set!`](crate::counter_set).
pub trait CounterSet {
    /// Put before every field's name (`etrelay_`, `blindrelay_`).
    const PREFIX: &'static str;
    /// One family per field, in declaration order.
    const FAMILIES: &'static [Family];
    /// The samples now, in the order of [`CounterSet::FAMILIES`].
    fn samples(&self) -> Vec<u64>;
}

/// Declares a struct of counters, its snapshot and its Prometheus families in one place.
///
/// Each field under `counters` is a [`Counter`], [`Gauge`] or [`Stamp`]; its doc comment is its
/// help text. Fields after the `counters` block are plain fields of the struct (each needs
/// `Default` and `Debug`), outside the snapshot and the families: labelled families the owner
/// renders itself, for instance.
///
/// ```
/// guard::counter_set! {
///     /// Counters of one thing.
///     pub struct Things {
///         prefix: "demo_",
///         /// Their values at one moment.
///         snapshot: ThingsSnapshot,
///         counters: {
///             /// Things seen.
///             seen: Counter,
///             /// Things open now.
///             open: Gauge,
///         },
///         /// Things refused, by reason (rendered by hand, with a label).
///         pub refused: [guard::counters::Counter; 3],
///     }
/// }
/// let t = Things::default();
/// t.seen.inc();
/// assert_eq!(t.snapshot().seen, 1);
/// ```
///
/// The caller's crate needs `serde` (the snapshot derives `serde::Serialize`).
#[macro_export]
macro_rules! counter_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            prefix: $prefix:literal,
            $(#[$snap_meta:meta])*
            snapshot: $snap:ident,
            counters: {
                $(
                    $(#[doc = $doc:literal])*
                    $field:ident: $kind:ident,
                )*
            },
            $(
                $(#[$extra_meta:meta])*
                $extra_vis:vis $extra:ident: $extra_ty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[doc = $doc])* pub $field: $crate::counters::$kind, )*
            $( $(#[$extra_meta])* $extra_vis $extra: $extra_ty, )*
        }

        $(#[$snap_meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, ::serde::Serialize)]
        $vis struct $snap {
            $(
                $(#[doc = $doc])*
                pub $field: <$crate::counters::$kind as $crate::counters::Metric>::Value,
            )*
        }

        impl $name {
            /// Every field's value now.
            $vis fn snapshot(&self) -> $snap {
                $snap {
                    $( $field: $crate::counters::Metric::value(&self.$field), )*
                }
            }
        }

        impl $crate::counters::CounterSet for $name {
            const PREFIX: &'static str = $prefix;
            const FAMILIES: &'static [$crate::counters::Family] = &[
                $(
                    $crate::counters::Family {
                        field: stringify!($field),
                        kind: <$crate::counters::$kind as $crate::counters::Metric>::KIND,
                        suffix: <$crate::counters::$kind as $crate::counters::Metric>::SUFFIX,
                        doc: concat!($($doc, "\n",)*),
                    },
                )*
            ];

            fn samples(&self) -> Vec<u64> {
                vec![ $( $crate::counters::Metric::sample(&self.$field), )* ]
            }
        }
    };
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

    /// Every family of counter set `T`, each once, with one sample per set: `(labels, set)`
    /// pairs, e.g. one set per relayed server labelled with its port.
    pub fn counter_sets<T: CounterSet>(&mut self, sets: &[(&[(&str, &str)], &T)]) -> &mut Self {
        let samples: Vec<Vec<u64>> = sets.iter().map(|(_, set)| set.samples()).collect();
        for (i, family) in T::FAMILIES.iter().enumerate() {
            let name = family.name(T::PREFIX);
            self.family(&name, family.kind, &family.help());
            for ((labels, _), values) in sets.iter().zip(&samples) {
                self.sample(&name, labels, values[i]);
            }
        }
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

    crate::counter_set! {
        /// A set for the tests.
        struct Demo {
            prefix: "demo_",
            /// Its snapshot.
            snapshot: DemoSnapshot,
            counters: {
                /// Packets seen,
                /// over two lines.
                packets: Counter,
                /// Open now.
                open: Gauge,
                /// Last seen.
                last_seen: Stamp,
            },
            /// Not a family.
            extra: u8,
        }
    }

    #[test]
    fn a_counter_set_snapshots_and_renders_every_field() {
        let d = Demo::default();
        d.packets.add(2);
        d.open.set(7);
        assert_eq!(d.extra, 0, "plain fields are part of the struct");
        assert_eq!(
            d.snapshot(),
            DemoSnapshot {
                packets: 2,
                open: 7,
                last_seen: None
            }
        );
        d.last_seen.set(1_800_000_000);
        d.last_seen.set(5);
        assert_eq!(
            d.snapshot().last_seen,
            Some(1_800_000_000),
            "a stamp never goes back"
        );
        let other = Demo::default();
        let mut p = PromText::new();
        p.counter_sets(&[(&[("port", "1")], &d), (&[("port", "2")], &other)]);
        assert_eq!(
            p.finish(),
            "# HELP demo_packets_total Packets seen, over two lines.\n\
             # TYPE demo_packets_total counter\n\
             demo_packets_total{port=\"1\"} 2\n\
             demo_packets_total{port=\"2\"} 0\n\
             # HELP demo_open Open now.\n\
             # TYPE demo_open gauge\n\
             demo_open{port=\"1\"} 7\n\
             demo_open{port=\"2\"} 0\n\
             # HELP demo_last_seen_timestamp_seconds Last seen.\n\
             # TYPE demo_last_seen_timestamp_seconds gauge\n\
             demo_last_seen_timestamp_seconds{port=\"1\"} 1800000000\n\
             demo_last_seen_timestamp_seconds{port=\"2\"} 0\n"
        );
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
