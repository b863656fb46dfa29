//! The network benchmark (`scripts/bench-network`): `--nodes N` (150) real `blindrelay run`
//! processes (the binary named by `BLINDRELAY_BIN`, default `target/release/blindrelay`) on
//! loopback, node `i` at `127.(100 + i).x.1`, a /16 of its own, each started with one
//! bootstrap `--peer` (a node made before it, chosen at random; all started at once) and
//! `--gossip-interval` `--gossip` (2 s); everything else is the daemon's default. Printed, in
//! order, each wait bounded and polled on the nodes' `GET /v1/status`:
//!
//! 1. convergence: the time from the first start until every node routes to every other
//!    (`runtime.peers.routable`); until then, the nodes' CPU time against the machine's, the
//!    TLS handshakes and refusals at their relay listeners, and per node what discovery did
//!    (exchanges and failed ones, reconciliations, pushes, bytes:
//!    `runtime.peers.discovery.counters`), the nodes with a failed exchange apart; and every
//!    5 s while it forms, a sample (nodes done, identities waiting, failed exchanges, CPU);
//! 2. steady state: discovery bytes per node per second, sent and received, over one minute
//!    (the machine's message bytes, and `gossip_bytes_sent` / `gossip_bytes_received`);
//! 3. 200 sends over 3 hops between random pairs, 8 at a time (`POST /v1/send`): delivered
//!    (target ≥ 99 %), over more than one route, why the others failed, and what the
//!    terminals' inboxes hold (every message read back: none stored twice);
//! 4. 5 newcomers, one after the other, each with one bootstrap peer: the time until every old
//!    node routes to it, in gossip intervals (target: within one), and its sync (the time until
//!    it holds, and routes to, every node; its bytes and exchanges until it holds them);
//! 5. 30 % of the nodes killed at once (`kill -9`), then after `--after` (60 s) 200 sends
//!    between live nodes: delivered (target ≥ 97 %), none stored twice;
//! 6. eclipse: a liar and 4 Sybils that know only it, and a victim whose only `--peer` is the
//!    liar: what its status says (`runtime.peers.discovery.eclipse`: `one_source`); then the
//!    victim started again with a seed list signed by an honest node (`blindrelay seeds`):
//!    the time until it routes to every live honest node, and until it says `ok`; three
//!    trials, each with attackers and a victim of its own (the rescue's median compared).
//!
//! Last, every node stopped, the simulator at the same size (`examples/simulate --nodes N
//! --interval S --after S --cpu-us U --slot-us H`, the binary beside this one or
//! `SIMULATE_BIN`; `--sim 0` skips it): its lines, then its figures beside this run's
//! (convergence and the exchanges until then, a newcomer's sync and bytes, steady bytes, sends
//! after 30 % died, the seed list's rescue) with the margin each is held to, and, held to
//! none, how loaded both machines were (an exchange's mean time, busy answers). `U` and `H`
//! are the two figures the simulator takes from this run, both measured while the network
//! formed: the nodes' CPU time per exchange, and how long a discovery request whose
//! descriptors were checked held its crypto slot; so it runs every node on one machine of this
//! one's cores, as this run does (`discovery::sim::Cpu`).
//!
//! `scripts/bench-network [--nodes N] [--gossip S] [--after S] [--sim 0|1]` (150, 2, 60, 1);
//! `--converge-only 1` stops after phase 1. `BLINDRELAY_BIN=target/debug/blindrelay
//! scripts/bench-network` runs the debug build. Every address is on 127.0.0.0/8; every child is
//! killed when the run ends, pass or fail (SIGINT and SIGTERM included). Each node's log is in
//! the run's temporary directory, removed at the end unless `GOSSIP_NETWORK_KEEP` is set;
//! `GOSSIP_NETWORK_NODE_ARGS` adds arguments to every node's `run` (experiments).

mod eclipse;
mod net;
mod phases;
mod progress;
mod sends;
mod sim;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use net::Net;

/// Any error of the run.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
/// A result of the run.
pub(crate) type Result<T> = std::result::Result<T, Error>;

/// The command line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flags {
    /// Nodes started at first.
    pub(crate) nodes: usize,
    /// The gossip interval.
    pub(crate) gossip: Duration,
    /// Seconds between the kill and the sends of phase 5.
    pub(crate) after: u64,
    /// Run the simulator at the same size afterwards.
    pub(crate) sim: bool,
    /// Stop after phase 1.
    pub(crate) converge_only: bool,
}

impl Flags {
    /// `d` in gossip intervals.
    pub(crate) fn intervals(&self, d: Duration) -> f64 {
        d.as_secs_f64() / self.gossip.as_secs_f64()
    }
}

/// This run's figures that the simulator also gives (`None`: not measured).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Figures {
    /// Convergence from the first start, seconds: the last node, and the median node.
    pub(crate) converge: Option<f64>,
    pub(crate) converge_median: Option<f64>,
    /// Until then: exchanges per node (mean), and the nodes' CPU time per exchange, µs.
    pub(crate) work: Option<(f64, f64)>,
    /// Until then, how loaded the machine was ([`Load`]).
    pub(crate) load: Option<Load>,
    /// A newcomer's time until it holds every node (median of the newcomers), seconds.
    pub(crate) sync: Option<f64>,
    /// Its bytes received and sent until then, and its exchanges (medians).
    pub(crate) sync_bytes: Option<(u64, u64, u64)>,
    /// Steady discovery bytes per node per second, sent and received.
    pub(crate) steady: Option<(f64, f64)>,
    /// Share of sends delivered after 30 % died, percent.
    pub(crate) after_deaths: Option<f64>,
    /// The seed list's rescue: seconds until the victim routes to the honest network.
    pub(crate) rescue: Option<f64>,
}

/// How loaded the machine was while the network formed, from the nodes' counters.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    /// Mean time a discovery request whose descriptors were checked held its crypto slot, µs
    /// (`discovery_check_micros`).
    pub(crate) slot_us: f64,
    /// Mean time an exchange took, ms (`gossip_exchange_micros`).
    pub(crate) exchange_ms: f64,
    /// Busy answers per node (mean), and of them those with no room to leave.
    pub(crate) busy: f64,
    pub(crate) deferred: f64,
}

fn flags() -> Result<Flags> {
    let mut f = Flags {
        nodes: 150,
        gossip: Duration::from_secs(2),
        after: 60,
        sim: true,
        converge_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--nodes" => f.nodes = v.parse()?,
            "--gossip" => f.gossip = Duration::from_secs_f64(v.parse()?),
            "--after" => f.after = v.parse()?,
            "--sim" => f.sim = v != "0",
            "--converge-only" => f.converge_only = v != "0",
            _ => return Err(format!("unknown flag {a}").into()),
        }
    }
    if !(10..=150).contains(&f.nodes) {
        return Err("--nodes: 10 to 150".into());
    }
    if f.gossip < Duration::from_millis(100) {
        return Err("--gossip: at least 0.1 s".into());
    }
    Ok(f)
}

/// Raises this process's descriptor limit (soft up to hard): its children inherit it.
fn raise_nofile() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

/// Resolves at SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Phases 1 to 6 on `net`; their figures.
async fn run(net: &mut Net, f: Flags, got: &mut Figures) -> Result<()> {
    phases::converge(net, f, got).await?;
    if f.converge_only {
        return Ok(());
    }
    phases::steady(net, f, got).await?;
    let all = net.live();
    let sent = sends::sends(net, &all, 200, "a").await?;
    println!(
        "3. 200 sends over 3 hops between random pairs, 8 at a time: {}",
        sent.line(99.0)
    );
    phases::newcomers(net, f, got).await?;
    phases::deaths(net, f, got).await?;
    eclipse::run(net, f, got).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let f = match flags() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gossip_network: {e}");
            return ExitCode::from(2);
        }
    };
    raise_nofile();
    blindrelay::links::install_provider();
    let bin = PathBuf::from(
        std::env::var("BLINDRELAY_BIN").unwrap_or_else(|_| "target/release/blindrelay".into()),
    );
    let mut net = match Net::new(bin, f.gossip) {
        Ok(net) => net,
        Err(e) => {
            eprintln!("gossip_network: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "# blindrelay network: {} node processes, each in a /16 of its own with one bootstrap \
         peer, gossip every {:?}\n",
        f.nodes, f.gossip
    );
    let mut got = Figures::default();
    let outcome = tokio::select! {
        r = run(&mut net, f, &mut got) => r,
        () = stop_signal() => Err("interrupted".into()),
    };
    let live = net.live();
    net.kill(&live).await;
    drop(net);
    if let Err(e) = outcome {
        eprintln!("gossip_network: {e}");
        return ExitCode::FAILURE;
    }
    if f.sim {
        let compared = tokio::select! {
            r = sim::compare(f, &got) => r,
            () = stop_signal() => Err("interrupted".into()),
        };
        if let Err(e) = compared {
            eprintln!("gossip_network: the simulator: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
