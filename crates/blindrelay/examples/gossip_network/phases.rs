//! Phases 1 to 5: convergence, steady state, sends, newcomers, sends after deaths.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blindrelay::clock::{self, Instant};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::Value;

use crate::net::{Net, counter, disc, peers_n};
use crate::{Figures, Flags, Result};

/// Longest wait for the first network to answer and to form.
const FORM: Duration = Duration::from_secs(300);
/// Longest wait for a newcomer to be routable everywhere, and to sync.
const NEWCOMER: Duration = Duration::from_secs(60);
/// The steady state's window.
const STEADY: Duration = Duration::from_secs(60);
/// Newcomers, one after the other.
const NEWCOMERS: usize = 5;

/// Seconds, as a float.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The median of `xs` (0 when empty).
pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// "met" or "NOT met".
pub(crate) fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// The latest of the times every node was seen done, if every node was.
pub(crate) fn latest(seen: &[Option<(Duration, Value)>]) -> Option<Duration> {
    seen.iter()
        .map(|s| s.as_ref().map(|(t, _)| *t))
        .collect::<Option<Vec<_>>>()
        .map(|ts| ts.into_iter().max().unwrap_or_default())
}

/// The nodes of `among` not seen done, with their `routable` and `known` now and the last
/// lines of the first one's log, as an error.
pub(crate) async fn short(
    net: &Net,
    among: &[usize],
    seen: &[Option<(Duration, Value)>],
    what: &str,
) -> crate::Error {
    let left: Vec<usize> = among
        .iter()
        .zip(seen)
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| *i)
        .collect();
    let mut shown = Vec::new();
    for &i in left.iter().take(8) {
        let s = net.status(i).await;
        let at = |name| s.as_ref().map(|s| peers_n(s, name));
        shown.push(format!(
            "node {i} (routable {:?}, known {:?}, waiting {:?})",
            at("routable"),
            at("known"),
            at("waiting")
        ));
    }
    let tail = left
        .first()
        .map(|i| net.log_tail(*i, 20))
        .unwrap_or_default();
    format!(
        "{} of {} nodes not {what} in time: {}\nlog of node {:?}:\n{tail}",
        left.len(),
        among.len(),
        shown.join(", "),
        left.first()
    )
    .into()
}

/// Per-node means of discovery's counters in `statuses`: exchanges, failed, reconciliations,
/// pushes, message bytes sent and received, HTTP body bytes sent and received.
fn means(statuses: &[&Value]) -> [f64; 8] {
    let names = [
        "exchanges",
        "exchanges_failed",
        "syncs",
        "pushes",
        "bytes_sent",
    ];
    let mut out = [0.0; 8];
    for s in statuses {
        for (o, name) in out.iter_mut().zip(names) {
            *o += disc(s, name) as f64;
        }
        out[5] += disc(s, "bytes_received") as f64;
        out[6] += counter(s, "gossip_bytes_sent") as f64;
        out[7] += counter(s, "gossip_bytes_received") as f64;
    }
    out.map(|x| x / statuses.len().max(1) as f64)
}

/// Phase 1: every node made, given one bootstrap peer made before it at random, and started at
/// once: the time until each routes to every other.
pub(crate) async fn converge(net: &mut Net, f: Flags, got: &mut Figures) -> Result<()> {
    let n = f.nodes;
    let made = clock::now();
    let all: Vec<usize> = net.init(n).await?.collect();
    let made = clock::elapsed(made);
    let mut rng = rand::rng();
    for i in 1..n {
        let spec = net.nodes[rng.random_range(0..i)].spec();
        net.nodes[i].args = vec!["--peer".into(), spec];
    }
    let t0 = clock::now();
    for &i in &all {
        net.spawn(i, &[])?;
    }
    let spawned = clock::elapsed(t0);
    let up = net.until(&all, t0, t0 + FORM, |_| true).await;
    let Some(up) = latest(&up) else {
        return Err(short(net, &all, &up, "answering").await);
    };
    let want = (n - 1) as u64;
    let stop = AtomicBool::new(false);
    let (formed, samples) = tokio::join!(
        async {
            let formed = net
                .until(&all, t0, t0 + FORM, |s| peers_n(s, "routable") >= want)
                .await;
            stop.store(true, Ordering::Relaxed);
            formed
        },
        crate::progress::sample(net, &all, t0, want, &stop)
    );
    let Some(took) = latest(&formed) else {
        return Err(short(net, &all, &formed, "routing to every other").await);
    };
    // The nodes' CPU time and their exchanges, both now: per exchange, the work of each.
    let cpu = net.cpu_secs();
    let exchanged = totals(net, &all).await?[0];
    got.converge = Some(secs(took));
    got.converge_median = Some(median(
        formed.iter().flatten().map(|(t, _)| secs(*t)).collect(),
    ));
    let at: Vec<&Value> = formed.iter().flatten().map(|(_, s)| s).collect();
    let exchanges = means(&at)[0];
    got.work = Some((exchanges, cpu * 1e6 / exchanged.max(1.0)));
    got.load = Some(load(&at));
    let start = Start {
        made,
        spawned,
        up,
        took,
        cpu,
    };
    print_convergence(&formed, &start, f);
    if let Some(l) = got.load {
        println!(
            "   until then, a discovery request checked on its crypto slot held it {:.1} ms on \
             average, an exchange took {:.0} ms; per node {:.0} busy answers, {:.0} of them no \
             room to leave",
            l.slot_us / 1000.0,
            l.exchange_ms,
            l.busy,
            l.deferred
        );
    }
    for l in samples {
        println!("{l}");
    }
    Ok(())
}

/// How the first network started: the time `blindrelay init` took, the time to spawn every
/// process, until every one answered and until the network formed; the nodes' CPU seconds.
#[derive(Debug)]
struct Start {
    made: Duration,
    spawned: Duration,
    up: Duration,
    took: Duration,
    cpu: f64,
}

/// Phase 1's lines, from the status of each node when it first routed to every other.
fn print_convergence(formed: &[Option<(Duration, Value)>], st: &Start, f: Flags) {
    let n = formed.len();
    let times: Vec<f64> = formed.iter().flatten().map(|(t, _)| secs(*t)).collect();
    let mut order: Vec<usize> = (0..times.len()).collect();
    order.sort_by(|a, b| times[*b].total_cmp(&times[*a]));
    let slowest: Vec<String> = order
        .iter()
        .take(3)
        .map(|&i| format!("node {i} {:.1} s", times[i]))
        .collect();
    // Nodes one of whose exchanges failed before they converged, against the others.
    let (failed, clean): (Vec<_>, Vec<_>) = formed
        .iter()
        .flatten()
        .partition(|(_, s)| disc(s, "exchanges_failed") > 0);
    let med = |g: &[&(Duration, Value)]| median(g.iter().map(|(t, _)| secs(*t)).collect());
    let at: Vec<&Value> = formed.iter().flatten().map(|(_, s)| s).collect();
    let m = means(&at);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    println!(
        "1. convergence from one bootstrap peer each: every node routes to the {} others {:.1} s \
         after the first start ({:.1} intervals; median node {:.1} s); the {n} processes \
         ({:.1} s of blindrelay init before) started within {:.2} s and all answered after \
         {:.1} s; slowest: {}",
        n - 1,
        secs(st.took),
        f.intervals(st.took),
        median(times.clone()),
        secs(st.made),
        secs(st.spawned),
        secs(st.up),
        slowest.join(", ")
    );
    println!(
        "   until then, the nodes used {:.0} CPU seconds: {:.0} % of the machine's {cores} \
         cores over that time",
        st.cpu,
        100.0 * st.cpu / (secs(st.took) * cores)
    );
    let sum = |name: &str| at.iter().map(|s| counter(s, name)).sum::<u64>();
    println!(
        "   until then, network-wide: {} TLS handshakes completed at the relay listeners, {} \
         connections timed out (a handshake or an idle connection), {} handshakes failed; \
         refused for capacity: {} backpressure, {} source_limited, {} connections; discovery \
         requests refused: {}",
        sum("tls_handshakes"),
        sum("connections_timed_out"),
        sum("tls_handshake_failed"),
        sum("backpressure_dropped"),
        sum("source_limited"),
        sum("connections_refused"),
        sum("discovery_requests_refused")
    );
    println!(
        "   until then, per node: {:.0} exchanges ({:.0} failed), {:.1} reconciliations, {:.0} \
         pushes, {:.1} KiB sent, {:.1} KiB received (HTTP bodies: {:.1} / {:.1} KiB); {} \
         nodes had an exchange fail (median {:.1} s to converge), {} had none (median {:.1} s)",
        m[0],
        m[1],
        m[2],
        m[3],
        m[4] / 1024.0,
        m[5] / 1024.0,
        m[6] / 1024.0,
        m[7] / 1024.0,
        failed.len(),
        med(&failed),
        clean.len(),
        med(&clean)
    );
}

/// The machine's load over the statuses `at` (each node's when it converged).
fn load(at: &[&Value]) -> crate::Load {
    let sum = |f: &dyn Fn(&Value) -> u64| at.iter().map(|s| f(s)).sum::<u64>() as f64;
    let nodes = at.len().max(1) as f64;
    let posted = sum(&|s| disc(s, "exchanges").saturating_sub(disc(s, "exchanges_deferred")));
    crate::Load {
        slot_us: sum(&|s| counter(s, "discovery_check_micros"))
            / sum(&|s| counter(s, "discovery_requests_checked")).max(1.0),
        exchange_ms: sum(&|s| counter(s, "gossip_exchange_micros")) / 1000.0 / posted.max(1.0),
        busy: sum(&|s| disc(s, "exchanges_busy")) / nodes,
        deferred: sum(&|s| disc(s, "exchanges_deferred")) / nodes,
    }
}

/// The sums over `among` of [`means`]' counters (every node must answer).
async fn totals(net: &Net, among: &[usize]) -> Result<[f64; 8]> {
    let statuses = net.sweep(among).await;
    let got: Vec<&Value> = statuses.iter().flatten().collect();
    if got.len() < among.len() {
        return Err(format!("{} nodes did not answer", among.len() - got.len()).into());
    }
    Ok(means(&got).map(|m| m * among.len() as f64))
}

/// Phase 2: discovery's bytes per node per second over [`STEADY`], nothing joining.
pub(crate) async fn steady(net: &mut Net, _f: Flags, got: &mut Figures) -> Result<()> {
    let all = net.live();
    let before = totals(net, &all).await?;
    let t0 = clock::now();
    tokio::time::sleep(STEADY).await;
    let after = totals(net, &all).await?;
    let window = secs(clock::elapsed(t0));
    let per = |k: usize| (after[k] - before[k]) / all.len() as f64 / window;
    got.steady = Some((per(4), per(5)));
    println!(
        "2. steady state over {window:.0} s: {:.0} B/s sent, {:.0} B/s received per node \
         (discovery messages; HTTP bodies {:.0} / {:.0} B/s); per node per minute: {:.1} \
         exchanges ({:.2} failed), {:.1} reconciliations, {:.1} pushes",
        per(4),
        per(5),
        per(6),
        per(7),
        per(0) * 60.0,
        per(1) * 60.0,
        per(2) * 60.0,
        per(3) * 60.0
    );
    Ok(())
}

/// A newcomer's state when it was first seen done: the time, its discovery bytes received and
/// sent, and its exchanges.
type Snap = (Duration, u64, u64, u64);

fn snap(seen: &[Option<(Duration, Value)>]) -> Option<Snap> {
    seen.first()?.as_ref().map(|(t, s)| {
        let (r, w) = (disc(s, "bytes_received"), disc(s, "bytes_sent"));
        (*t, r, w, disc(s, "exchanges"))
    })
}

/// A [`Snap`] in words.
fn snap_words(c: Option<Snap>) -> String {
    c.map_or(format!("NOT within {NEWCOMER:?}"), |(t, r, w, x)| {
        format!(
            "{:.2} s ({:.1} KiB received, {:.1} KiB sent, {x} exchanges)",
            secs(t),
            r as f64 / 1024.0,
            w as f64 / 1024.0
        )
    })
}

/// One newcomer's figures.
#[derive(Debug)]
struct Newcomer {
    /// When the last old node routed to it, and the median old node.
    known_by: Option<(Duration, Duration)>,
    /// When it held every node.
    holds: Option<Snap>,
    /// When it routed to every node.
    routes: Option<Snap>,
}

/// Starts one newcomer with one bootstrap peer among the live nodes and times it.
async fn newcomer(net: &mut Net) -> Result<(usize, usize, Newcomer)> {
    let old = net.live();
    let j = net.init(1).await?.start;
    let boot = *old.choose(&mut rand::rng()).ok_or("no node")?;
    net.nodes[j].args = vec!["--peer".into(), net.nodes[boot].spec()];
    let want = old.len() as u64;
    let t0 = clock::now();
    net.spawn(j, &[])?;
    let deadline = t0 + NEWCOMER;
    let routable = |s: &Value| peers_n(s, "routable") >= want;
    let me = [j];
    let (by_old, holds, routes) = tokio::join!(
        net.until(&old, t0, deadline, routable),
        net.until(&me, t0, deadline, |s| peers_n(s, "known") >= want),
        net.until(&me, t0, deadline, routable),
    );
    let times: Vec<f64> = by_old.iter().flatten().map(|(t, _)| secs(*t)).collect();
    let known_by = latest(&by_old).map(|t| (t, Duration::from_secs_f64(median(times))));
    if known_by.is_none() {
        let e = short(net, &old, &by_old, "routing to the newcomer").await;
        eprintln!("{e}");
    }
    let c = Newcomer {
        known_by,
        holds: snap(&holds),
        routes: snap(&routes),
    };
    Ok((j, boot, c))
}

/// Phase 4: [`NEWCOMERS`] newcomers, one after the other, each with one bootstrap peer.
pub(crate) async fn newcomers(net: &mut Net, f: Flags, got: &mut Figures) -> Result<()> {
    let mut lines = Vec::new();
    let (mut worst, mut all_known) = (Duration::ZERO, true);
    let (mut holds, mut routes, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..NEWCOMERS {
        let (j, boot, c) = newcomer(net).await?;
        match c.known_by {
            Some((t, _)) => worst = worst.max(t),
            None => all_known = false,
        }
        holds.extend(c.holds.map(|h| secs(h.0)));
        routes.extend(c.routes.map(|h| secs(h.0)));
        bytes.extend(c.routes.map(|(_, r, w, x)| (r, w, x)));
        let by_old = match c.known_by {
            Some((t, m)) => format!(
                "{:.2} s ({:.2} intervals; median old node {:.2} s)",
                secs(t),
                f.intervals(t),
                secs(m)
            ),
            None => format!("NOT within {NEWCOMER:?}"),
        };
        lines.push(format!(
            "   newcomer {} (node {j}, bootstrap peer node {boot}): every old node routes to it \
             after {by_old}; it holds every node after {}, routes to every node after {}",
            k + 1,
            snap_words(c.holds),
            snap_words(c.routes)
        ));
    }
    bytes.sort();
    got.sync = (!holds.is_empty()).then(|| median(holds.clone()));
    got.sync_bytes = bytes.get(bytes.len() / 2).copied();
    let worst = all_known.then_some(worst);
    println!(
        "4. {NEWCOMERS} newcomers, one after the other, each with one bootstrap peer: every old \
         node routed to each within {} (target: within one interval: {}); a newcomer holds \
         every node after {:.2} s, routes to every node after {:.2} s (medians)",
        worst.map_or(format!("NOT {NEWCOMER:?}"), |t| format!(
            "{:.2} s, {:.2} intervals",
            secs(t),
            f.intervals(t)
        )),
        met(worst.is_some_and(|t| f.intervals(t) <= 1.0)),
        median(holds),
        median(routes)
    );
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

/// Phase 5: 30 % of the live nodes killed at once; after `--after` seconds, 200 sends between live
/// nodes.
pub(crate) async fn deaths(net: &mut Net, f: Flags, got: &mut Figures) -> Result<()> {
    let live = net.live();
    let k = (live.len() * 3 + 5) / 10;
    let dead: Vec<usize> = live.choose_multiple(&mut rand::rng(), k).copied().collect();
    net.kill(&dead).await;
    let alive = net.live();
    tokio::time::sleep(Duration::from_secs(f.after)).await;
    let view = net.sweep(&alive).await;
    let avg = |name: &str| {
        let got: Vec<f64> = view
            .iter()
            .flatten()
            .map(|s| peers_n(s, name) as f64)
            .collect();
        got.iter().sum::<f64>() / got.len().max(1) as f64
    };
    let (routable, in_routes) = (avg("routable"), avg("in_routes"));
    let sent = crate::sends::sends(net, &alive, 200, "b").await?;
    got.after_deaths = Some(sent.percent());
    println!(
        "5. {k} of {} nodes killed at once (kill -9); {} s later a live node routes to {routable:.1} \
         peers on average, {in_routes:.1} of them in its routes ({} are alive); 200 sends over 3 \
         hops between live nodes: {}",
        live.len(),
        f.after,
        alive.len() - 1,
        sent.line(97.0)
    );
    Ok(())
}

/// Waits until node `i` answers its status, at most `within`.
pub(crate) async fn answering(net: &Net, i: usize, within: Duration) -> Result<Duration> {
    let t0: Instant = clock::now();
    let seen = net.until(&[i], t0, t0 + within, |_| true).await;
    match latest(&seen) {
        Some(t) => Ok(t),
        None => Err(short(net, &[i], &seen, "answering").await),
    }
}
