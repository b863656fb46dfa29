//! The simulator at the same size (`examples/simulate`, a process of its own, run once every
//! node is stopped), its lines printed as they are, then its figures beside this run's.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;

use crate::{Figures, Flags, Result};

/// Longest the simulator may take.
const SIM_WAIT: Duration = Duration::from_secs(900);

/// The simulate binary: `SIMULATE_BIN`, or the one beside this example.
fn binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SIMULATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    Ok(me.with_file_name("simulate"))
}

/// The number just before `marker` in the first line that starts with `start` (leading
/// spaces ignored) and holds `marker`, e.g. `6` in "converged after 6 s virtual" for
/// " s virtual".
fn figure(lines: &[String], start: &str, marker: &str) -> Option<f64> {
    let line = lines
        .iter()
        .find(|l| l.trim_start().starts_with(start) && l.contains(marker))?;
    let before = &line[..line.find(marker)?];
    let token = before.split_whitespace().last()?;
    token.trim_start_matches('(').parse().ok()
}

/// One row: a figure of both runs, and whether they agree within `margin` (the larger of an
/// absolute and a relative bound).
struct Row<'a> {
    what: &'a str,
    unit: &'a str,
    sim: Option<f64>,
    real: Option<f64>,
    /// Absolute bound, in the figure's unit.
    abs: f64,
    /// Relative bound, a share of the simulator's figure.
    rel: f64,
    /// Shown for what it tells, held to no margin.
    shown: bool,
}

impl Row<'_> {
    fn print(&self) {
        let show = |x: Option<f64>| {
            x.map_or("?".to_string(), |x| {
                format!("{x:.1} {}", self.unit).trim_end().to_string()
            })
        };
        let (diff, within) = match (self.sim, self.real) {
            (Some(s), Some(r)) if self.shown => (
                format!("{:+.1} {}", r - s, self.unit)
                    .trim_end()
                    .to_string(),
                "—",
            ),
            (Some(s), Some(r)) => {
                let bound = self.abs.max(self.rel * s.abs());
                (
                    format!("{:+.1} {}", r - s, self.unit)
                        .trim_end()
                        .to_string(),
                    if (r - s).abs() <= bound { "yes" } else { "NO" },
                )
            }
            _ => ("?".to_string(), "?"),
        };
        let margin = if self.shown {
            "—".to_string()
        } else {
            format!(
                "±max({}{}, {:.0} %)",
                self.abs,
                if self.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", self.unit)
                },
                self.rel * 100.0
            )
        };
        println!(
            "| {} | {} | {} | {diff} | {margin} | {within} |",
            self.what,
            show(self.sim),
            show(self.real),
        );
    }
}

/// Runs the simulator at `f`'s size and prints its lines, then the figures of both runs.
pub(crate) async fn compare(f: Flags, real: &Figures) -> Result<()> {
    let bin = binary()?;
    let interval = f.gossip.as_secs().max(1).to_string();
    let (nodes, after) = (f.nodes.to_string(), f.after.to_string());
    // The two figures taken from this run, so that the simulator runs every node on one
    // machine like this one: the nodes' CPU time per exchange while the network formed, and
    // how long a request held its crypto slot then.
    let cpu_us = real.work.map_or(0, |w| w.1.round() as u64).to_string();
    let slot_us = real
        .load
        .map_or(0, |l| l.slot_us.round() as u64)
        .to_string();
    let args = [
        "--nodes",
        &nodes,
        "--interval",
        &interval,
        "--after",
        &after,
        "--cpu-us",
        &cpu_us,
        "--slot-us",
        &slot_us,
        // This run has no Sybils: the simulator's 500 would stay in its network.
        "--sybils",
        "0",
    ];
    println!(
        "\n## the simulator at the same size: {} {}\n",
        bin.display(),
        args.join(" ")
    );
    let out = Command::new(&bin).args(args).kill_on_drop(true).output();
    let out = tokio::time::timeout(SIM_WAIT, out)
        .await
        .map_err(|_| format!("no end within {SIM_WAIT:?}"))??;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    for l in &lines {
        println!("    {l}");
    }
    let g = f.gossip.as_secs_f64();
    // Times agree within an interval, and never closer than the simulator's resolution: it
    // checks what it waits for once per virtual second.
    let step = g.max(1.0);
    println!("\n## sim vs real: {} nodes, interval {g} s\n", f.nodes);
    println!("| figure | simulator | real processes | real − sim | margin | within |");
    println!("|---|---|---|---|---|---|");
    let rows = rows(&lines, real, step);
    for r in &rows {
        r.print();
    }
    Ok(())
}

/// The figures compared: the simulator's, found in its `lines`, beside this run's `real`;
/// times are held to `step` seconds.
// structure: table
fn rows<'a>(lines: &[String], real: &Figures, step: f64) -> Vec<Row<'a>> {
    let sync_bytes = |k: usize| {
        real.sync_bytes
            .map(|b| [b.0, b.1, b.2][k] as f64 / if k < 2 { 1024.0 } else { 1.0 })
    };
    vec![
        Row {
            what: "convergence from one bootstrap peer each",
            unit: "s",
            sim: figure(lines, "1.", " s virtual"),
            real: real.converge,
            abs: step,
            rel: 0.5,
            shown: false,
        },
        Row {
            what: "the same, the median node",
            unit: "s",
            sim: figure(lines, "the median node", " s"),
            real: real.converge_median,
            abs: step,
            rel: 0.5,
            shown: false,
        },
        Row {
            what: "until then, exchanges per node",
            unit: "",
            sim: figure(lines, "until then, per node:", " exchanges"),
            real: real.work.map(|w| w.0),
            abs: 10.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "until then, an exchange's mean time",
            unit: "ms",
            sim: figure(lines, "until then, an exchange took", " ms"),
            real: real.load.map(|l| l.exchange_ms),
            abs: 0.0,
            rel: 0.0,
            shown: true,
        },
        Row {
            what: "until then, busy answers per node (no room to leave apart)",
            unit: "",
            sim: figure(lines, "until then, per node:", " busy")
                .zip(figure(lines, "until then, per node:", " of them no room"))
                .map(|(b, d)| b - d),
            real: real.load.map(|l| l.busy - l.deferred),
            abs: 0.0,
            rel: 0.0,
            shown: true,
        },
        Row {
            what: "the same, no room to leave",
            unit: "",
            sim: figure(lines, "until then, per node:", " of them no room"),
            real: real.load.map(|l| l.deferred),
            abs: 0.0,
            rel: 0.0,
            shown: true,
        },
        Row {
            what: "a newcomer holds every node",
            unit: "s",
            sim: figure(lines, "2.", " s ("),
            real: real.sync,
            abs: step,
            rel: 0.5,
            shown: false,
        },
        Row {
            what: "its bytes received until it routes to every node",
            unit: "KiB",
            sim: figure(lines, "routes to every one", " KiB received"),
            real: sync_bytes(0),
            abs: 4.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "its bytes sent until it routes to every node",
            unit: "KiB",
            sim: figure(lines, "routes to every one", " KiB sent"),
            real: sync_bytes(1),
            abs: 4.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "its exchanges until it routes to every node",
            unit: "",
            sim: figure(lines, "routes to every one", " exchanges"),
            real: sync_bytes(2),
            abs: 10.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "steady state, bytes sent per node per second",
            unit: "B/s",
            sim: figure(lines, "4.", " B/s sent"),
            real: real.steady.map(|s| s.0),
            abs: 10.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "steady state, bytes received per node per second",
            unit: "B/s",
            sim: figure(lines, "4.", " B/s received"),
            real: real.steady.map(|s| s.1),
            abs: 10.0,
            rel: 0.25,
            shown: false,
        },
        Row {
            what: "30 % killed, sends delivered after --after",
            unit: "%",
            sim: figure(lines, "7.", " %)"),
            real: real.after_deaths,
            abs: 2.0,
            rel: 0.0,
            shown: false,
        },
        Row {
            what: "eclipse: a seed list, until the victim routes to every live honest node \
                   (real: median of 3 trials)",
            unit: "s",
            sim: figure(lines, "with", " s;"),
            real: real.rescue,
            abs: step,
            rel: 0.5,
            shown: false,
        },
    ]
}
