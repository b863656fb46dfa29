//! Measures outbound pacing (`blindrelay::outbound`), on loopback only, bounded:
//!
//! 1. the pacer's own cost per request (take a place, go, answered, leave), in process, for
//!    1 and 1 000 next hops under the design's rate;
//! 2. honest throughput at the limit: two nodes in this process on 127.0.0.x with a shrunk
//!    previous-hop rate (`limit` per `window`, both nodes alike); node 0 sends `n` one-hop
//!    messages to node 1, 16 at a time, as fast as it may. Printed: how long it took, the
//!    rate, the bound the rule allows, what waited, what was refused, and node 1's quarantines
//!    (must be 0).
//!
//! Run with `scripts/bench-pacing` (release build) or
//! `cargo run --release -p blindrelay --example pacing [LIMIT] [WINDOW_SECS] [N]`.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blindrelay::clock::Clock;
use blindrelay::context::Context;
use blindrelay::daemon::{self, RelayConfig, RunConfig};
use blindrelay::outbound::{HopRate, Pacer, QueueLimits};
use blindrelay::replay::ReplayStore;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let limit: u32 = args.next().map_or(Ok(60), |a| a.parse())?;
    let window: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let n: usize = args.next().map_or(Ok(150), |a| a.parse())?;
    overhead().await;
    throughput(limit, Duration::from_secs(window), n).await
}

/// The pacer's bookkeeping per request, nothing waiting: `hops` next hops, each sent up to the
/// design's limit (120) within its window.
async fn overhead() {
    println!("| next hops | requests | ns per request (join, go, answered, drop) |");
    println!("|---:|---:|---:|");
    for hops in [1usize, 1000] {
        let pacer = Pacer::new(HopRate::default(), QueueLimits::default());
        let ids: Vec<[u8; 32]> = (0..hops)
            .map(|i| {
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&(i as u64).to_be_bytes());
                id
            })
            .collect();
        let per_hop = blindrelay::outbound::RATE_LIMIT as usize;
        let t = Instant::now();
        for _ in 0..per_hop {
            for id in &ids {
                let mut turn = pacer.join(id, 1024).expect("room");
                assert!(turn.try_now(), "under the limit, nothing waits");
                turn.answered(true);
            }
        }
        let total = per_hop * hops;
        let ns = t.elapsed().as_nanos() / total as u128;
        println!("| {hops} | {total} | {ns} |");
    }
}

/// Two nodes in this process (each the other's peer), their previous-hop rule `limit` per
/// `window`, served until `stop`; node 0 ready to route to node 1 (bounded: 10 s).
async fn two_nodes(
    limit: u32,
    window: Duration,
    state: &std::path::Path,
    stop: &CancellationToken,
) -> Result<(Arc<Context>, Arc<Context>, Vec<JoinHandle<()>>), Box<dyn std::error::Error>> {
    let mut listeners = Vec::new();
    for i in 0..2u8 {
        let ip = Ipv4Addr::new(127, 0, 0, 41 + i);
        listeners.push((
            TcpListener::bind((ip, 0)).await?,
            TcpListener::bind((ip, 0)).await?,
        ));
    }
    let endpoints: Vec<String> = listeners
        .iter()
        .map(|(p, _)| p.local_addr().map(|a| format!("https://{a}")))
        .collect::<Result<_, _>>()?;
    let now = Clock::System.unix();
    let mut built = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let dir = state.join(format!("node{i}"));
        blindrelay::node::init(&dir, endpoint, now)?;
        let peers = endpoints
            .iter()
            .filter(|e| *e != endpoint)
            .map(|e| blindrelay::peers::PeerSpec::parse(e))
            .collect::<Result<Vec<_>, _>>()?;
        let mut relay = RelayConfig::new(true);
        relay.context.hop_rate = HopRate { limit, window };
        relay.discovery.probe_interval = Duration::ZERO;
        relay.context.queue.per_hop_entries = 16;
        built.push(daemon::build(RunConfig {
            state_dir: dir,
            peers,
            replay_store: ReplayStore::Sqlite,
            relay,
            clock: Clock::System,
            accept_lost_state: false,
        })?);
    }
    let (a, b) = (
        Arc::clone(built[0].relay.ctx()),
        Arc::clone(built[1].relay.ctx()),
    );
    let mut servers = Vec::new();
    for (node, (public, operator)) in built.into_iter().zip(listeners) {
        let shutdown = stop.clone().cancelled_owned();
        servers.push(tokio::spawn(async move {
            if let Err(e) = daemon::serve(node, public, operator, shutdown).await {
                eprintln!("a node stopped serving: {e}");
            }
        }));
    }
    let ready = Instant::now() + Duration::from_secs(10);
    while a.peers.routable(a.clock.unix()).is_empty() && Instant::now() < ready {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((a, b, servers))
}

/// Two nodes; node 0 sends `n` messages to node 1 over one hop, 16 at a time.
async fn throughput(
    limit: u32,
    window: Duration,
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let stop = CancellationToken::new();
    let (a, b, servers) = two_nodes(limit, window, state.path(), &stop).await?;
    let to = *b.node.id();
    let slots = Arc::new(Semaphore::new(16));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let permit = Arc::clone(&slots).acquire_owned().await?;
        let a = Arc::clone(&a);
        tasks.push(tokio::spawn(async move {
            let r = blindrelay::send::send(&a, to, 1, format!("paced {i}").into_bytes()).await;
            drop(permit);
            r.is_ok()
        }));
    }
    let mut delivered = 0;
    for t in tasks {
        delivered += usize::from(t.await?);
    }
    let took = start.elapsed();
    // The rule lets `limit` go at once, then `limit` per window: the fastest possible.
    let windows = (n.saturating_sub(1) / limit as usize) as u32;
    let bound = window * windows;
    let (sa, sb) = (a.counters.snapshot(), b.counters.snapshot());
    println!();
    println!(
        "| limit / window | messages | delivered | took | messages/s | fastest the rule allows | waited (`paced`) | `next_hop_queue_full` | quarantines at the receiver |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {limit} / {} s | {n} | {delivered} | {:.2} s | {:.1} | {:.2} s | {} | {} | {} |",
        window.as_secs(),
        took.as_secs_f64(),
        delivered as f64 / took.as_secs_f64(),
        bound.as_secs_f64(),
        sa.paced,
        sa.next_hop_queue_full,
        sb.quarantine_started
    );
    stop.cancel();
    for s in servers {
        s.await?;
    }
    if sb.quarantine_started != 0 || delivered != n {
        return Err("an honest sender was quarantined or lost messages".into());
    }
    Ok(())
}
