//! A local demo on loopback that needs nothing installed: three `blindrelay` nodes in this
//! process on 127.21.0.1, 127.22.0.1 and 127.23.0.1 (each in a /16 of its own), each knowing the other two, and one message from node 0 to node 2
//! through node 1 (two hops) with a delivery receipt that only the sender opens and verifies.
//!
//! Run with `cargo run -p blindrelay --example network`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blindrelay::clock::Clock;
use blindrelay::context::Context;
use blindrelay::daemon::{self, Built, RelayConfig, RunConfig};
use blindrelay::proto::Prefix;
use blindrelay::replay::ReplayStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Libraries whose logs could name addresses: kept quiet, as the binary does.
const QUIET: &str =
    "hyper=off,hyper_util=off,reqwest=off,h2=off,axum=off,tower=off,tower_http=off,rusqlite=off";

const NODES: u8 = 3;

/// Binds each node's listeners first, so its endpoint is the address its relay listener really
/// has, then builds the nodes in `state`, each with the others as peers.
async fn build_nodes(
    state: &std::path::Path,
) -> Result<(Vec<Built>, Listeners), Box<dyn std::error::Error>> {
    let mut listeners = Vec::new();
    for n in 0..NODES {
        // Each node in a /16 of its own: no two hops of a route may share one.
        let ip = Ipv4Addr::new(127, 21 + n, 0, 1);
        let public = TcpListener::bind((ip, 0)).await?;
        let operator = TcpListener::bind((ip, 0)).await?;
        listeners.push((public, operator));
    }
    let endpoints: Vec<String> = listeners
        .iter()
        .map(|(p, _)| p.local_addr().map(|a: SocketAddr| format!("https://{a}")))
        .collect::<Result<_, _>>()?;

    println!("\n# three nodes on loopback, each with the other two as peers\n");
    let now = Clock::System.unix();
    let mut nodes: Vec<Built> = Vec::new();
    for (n, endpoint) in endpoints.iter().enumerate() {
        let dir = state.join(format!("node{n}"));
        blindrelay::node::init(&dir, endpoint, now)?;
        let peers = endpoints
            .iter()
            .filter(|e| *e != endpoint)
            .map(|e| blindrelay::peers::PeerSpec::parse(e))
            .collect::<Result<Vec<_>, _>>()?;
        let node = daemon::build(RunConfig {
            state_dir: dir,
            peers,
            replay_store: ReplayStore::Sqlite,
            relay: RelayConfig::new(true),
            clock: Clock::System,
            accept_lost_state: false,
        })?;
        nodes.push(node);
    }
    Ok((nodes, listeners))
}

/// Each node's public and operator listeners.
type Listeners = Vec<(TcpListener, TcpListener)>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(format!("info,{QUIET}"))
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let state = tempfile::tempdir()?;
    let (nodes, listeners) = build_nodes(state.path()).await?;
    let relays: Vec<Arc<Context>> = nodes.iter().map(|n| Arc::clone(n.relay.ctx())).collect();
    let terminal_inbox = Arc::clone(nodes[2].relay.terminal().inbox());

    let stop = CancellationToken::new();
    let mut servers = Vec::new();
    for (node, (public, operator)) in nodes.into_iter().zip(listeners) {
        let shutdown = stop.clone().cancelled_owned();
        servers.push(tokio::spawn(async move {
            if let Err(e) = daemon::serve(node, public, operator, shutdown).await {
                eprintln!("a node stopped serving: {e}");
            }
        }));
    }

    // Ready when every node holds a valid descriptor of both others.
    let deadline = Instant::now() + Duration::from_secs(10);
    for relay in &relays {
        while relay.peers.routable(relay.clock.unix()).len() < usize::from(NODES) - 1 {
            if Instant::now() >= deadline {
                stop.cancel();
                return Err("peers did not become routable within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for (n, relay) in relays.iter().enumerate() {
        println!(
            "node {n}: {}  routable peers: {}",
            Prefix(relay.node.id()),
            relay.peers.routable(relay.clock.unix()).len()
        );
    }

    let payload = b"hello from node 0, through node 1, to node 2".to_vec();
    let (sender, terminal) = (&relays[0], &relays[2]);
    println!(
        "\n# node 0 sends {} bytes to node 2 ({}) over 2 hops\n",
        payload.len(),
        Prefix(terminal.node.id())
    );
    let delivered = blindrelay::send::send(sender, *terminal.node.id(), 2, payload).await;
    match &delivered {
        Ok(d) => println!(
            "delivered to {} over {} hops at {}: node 0 opened and verified the receipt",
            d.terminal, d.hops, d.delivered_at
        ),
        Err(e) => println!("not delivered: {e}"),
    }

    report(&relays, &terminal_inbox)?;

    println!("\n# shutting down\n");
    stop.cancel();
    for s in servers {
        s.await?;
    }
    delivered?;
    Ok(())
}

/// Prints the terminal's inbox and every node's counters.
fn report(
    relays: &[Arc<Context>],
    terminal_inbox: &blindrelay::terminal::Inbox,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n# node 2's inbox\n");
    for item in terminal_inbox.list()? {
        let bytes = terminal_inbox.get(item.id)?.unwrap_or_default();
        println!(
            "#{} received_at {} ({} bytes): {}",
            item.id,
            item.received_at,
            item.size,
            String::from_utf8_lossy(&bytes)
        );
    }

    println!(
        "\n# counters (node 1 only forwarded: the payload and the receipt were sealed from it)\n"
    );
    println!(
        "{:<10} {:>8} {:>9} {:>8} {:>8} {:>9}",
        "node", "received", "forwarded", "terminal", "rejected", "verified"
    );
    for relay in relays {
        let c = relay.counters.snapshot();
        println!(
            "{:<10} {:>8} {:>9} {:>8} {:>8} {:>9}",
            Prefix(relay.node.id()).to_string(),
            c.received,
            c.forwarded,
            c.terminal,
            c.rejected,
            c.verified_client_onion_deliveries
        );
    }
    Ok(())
}
