//! Phase 1's progress, sampled while the network forms: every [`EVERY`], a sweep of every
//! node's status and the nodes' CPU time, one line each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blindrelay::clock::{self, Instant};

use crate::net::{Net, disc, peers_n};
use crate::phases::secs;

/// Time between two samples.
const EVERY: Duration = Duration::from_secs(5);

/// Samples `among` every [`EVERY`] from `t0` until `stop`: how many route to `want` peers, the
/// fewest any routes to, the identities held and not reached yet, the exchanges started and
/// failed so far, and the share of the machine's CPU the nodes used since the last sample.
pub(crate) async fn sample(
    net: &Net,
    among: &[usize],
    t0: Instant,
    want: u64,
    stop: &AtomicBool,
) -> Vec<String> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let mut lines = Vec::new();
    let (mut cpu, mut at) = (net.cpu_secs(), t0);
    let mut next = t0 + EVERY;
    loop {
        while clock::now() < next {
            if stop.load(Ordering::Relaxed) {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        next += EVERY;
        let statuses = net.sweep(among).await;
        let got: Vec<_> = statuses.iter().flatten().collect();
        let sum = |f: &dyn Fn(&serde_json::Value) -> u64| got.iter().map(|s| f(s)).sum::<u64>();
        let done = got
            .iter()
            .filter(|s| peers_n(s, "routable") >= want)
            .count();
        // The node that routes to the fewest, and what its discovery did.
        let fewest = statuses
            .iter()
            .zip(among)
            .filter_map(|(s, i)| Some((peers_n(s.as_ref()?, "routable"), *i, s.as_ref()?)))
            .min_by_key(|(r, i, _)| (*r, *i))
            .map_or("none answered".to_string(), |(r, i, s)| {
                format!(
                    "{r} (node {i}: {} reconciliations, {} exchanges, {} failed)",
                    disc(s, "syncs"),
                    disc(s, "exchanges"),
                    disc(s, "exchanges_failed")
                )
            });
        let (now_cpu, now) = (net.cpu_secs(), clock::now());
        let busy = (now_cpu - cpu) / (secs(now.duration_since(at)) * cores);
        (cpu, at) = (now_cpu, now);
        lines.push(format!(
            "   at {:>5.1} s: {done} of {} nodes route to all, the fewest to {}; {} identities \
             held not reached yet; {} exchanges, {} failed, {} busy; CPU {:.0} %",
            secs(clock::elapsed(t0)),
            among.len(),
            fewest,
            sum(&|s| peers_n(s, "waiting")),
            sum(&|s| disc(s, "exchanges")),
            sum(&|s| disc(s, "exchanges_failed")),
            sum(&|s| disc(s, "exchanges_busy")),
            100.0 * busy
        ));
    }
}
