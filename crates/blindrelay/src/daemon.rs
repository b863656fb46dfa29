//! `blindrelay run`: build the node from its state dir, serve its two listeners, and run its
//! background tasks (peer descriptors, probes, onion key rotation and guard upkeep).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api;
use crate::clock::Clock;
use crate::context::{self, Context};
use crate::node::Node;
use crate::peers::Peers;
use crate::pipeline::{Pipeline, gate};
use crate::probe;
use crate::proto::Prefix;
use crate::replay::{self, ReplayRegistry, ReplayStore};
use crate::terminal::{Inbox, InboxError, Terminal};

/// How often onion keys are checked for rotation and the guard is swept.
const UPKEEP: Duration = Duration::from_secs(10);

/// Settings of the relay.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Requests admitted per admission window, process-wide.
    pub window_limit: u32,
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// Crypto slots in all.
    pub crypto_slots: usize,
    /// Next hops may have private endpoints (loopback tests).
    pub allow_private_endpoints: bool,
    /// Time between probe rounds (zero: no periodic probes).
    pub probe_interval: Duration,
}

impl RelayConfig {
    /// The design's defaults.
    pub fn new(allow_private_endpoints: bool) -> Self {
        RelayConfig {
            window_limit: gate::DEFAULT_PER_WINDOW,
            max_in_flight: gate::MAX_IN_FLIGHT,
            crypto_slots: context::default_crypto_slots(),
            allow_private_endpoints,
            probe_interval: probe::DEFAULT_INTERVAL,
        }
    }
}

/// What `run` needs.
#[derive(Debug)]
pub struct RunConfig {
    /// The state dir (`blindrelay init`).
    pub state_dir: PathBuf,
    /// Peer URLs to fetch descriptors from.
    pub peers: Vec<String>,
    /// Replay store.
    pub replay_store: ReplayStore,
    /// Relay settings.
    pub relay: RelayConfig,
    /// Time source.
    pub clock: Clock,
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Node files.
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    /// The replay registry.
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
    /// The inbox.
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

/// A built node: its pipeline (whose context the outbound side uses) and how often it probes.
#[derive(Debug, Clone)]
pub struct Built {
    /// The inbound pipeline over the shared context.
    pub pipeline: Arc<Pipeline>,
    /// Time between probe rounds.
    pub probe_interval: Duration,
}

/// Builds the node from the state dir.
///
/// # Errors
/// [`RunError`].
pub fn build(config: RunConfig) -> Result<Built, RunError> {
    let node = Arc::new(Node::load(&config.state_dir)?);
    let now = config.clock.unix();
    node.rotate_if_due(now)?;
    let registry = match config.replay_store {
        ReplayStore::Sqlite => ReplayRegistry::open_sqlite(
            &config.state_dir.join("replay.db"),
            replay::CAPACITY,
            replay::WINDOW_SECS,
            now,
        )?,
        ReplayStore::Memory => ReplayRegistry::memory(replay::CAPACITY, replay::WINDOW_SECS),
    };
    let inbox = Inbox::open(&config.state_dir.join("inbox.db"))?;
    let peers = Arc::new(Peers::new(
        config.peers,
        config.relay.allow_private_endpoints,
        config.clock.clone(),
        *node.id(),
    ));
    let ctx = Arc::new(Context::new(
        node,
        peers,
        config.clock,
        config.relay.crypto_slots,
    ));
    let pipeline = Pipeline::new(
        ctx,
        config.relay.window_limit,
        config.relay.max_in_flight,
        Arc::new(registry),
        Terminal::new(Arc::new(inbox)),
    );
    Ok(Built {
        pipeline: Arc::new(pipeline),
        probe_interval: config.relay.probe_interval,
    })
}

/// Serves `node` on the two listeners until `shutdown`.
pub async fn serve(
    node: Built,
    public: TcpListener,
    operator: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let Built {
        pipeline,
        probe_interval,
    } = node;
    let ctx = Arc::clone(pipeline.ctx());
    let cancel = CancellationToken::new();
    let probes = tokio::spawn(probe::run(Arc::clone(&ctx), probe_interval, cancel.clone()));
    let peers = tokio::spawn(Arc::clone(&ctx.peers).run(ctx.http.clone(), cancel.clone()));
    let upkeep = tokio::spawn(upkeep(Arc::clone(&pipeline), cancel.clone()));
    let serve_public = axum::serve(public, api::public(Arc::clone(&pipeline)))
        .with_graceful_shutdown(cancel.clone().cancelled_owned());
    let serve_operator = axum::serve(operator, api::operator(pipeline))
        .with_graceful_shutdown(cancel.clone().cancelled_owned());
    let a = tokio::spawn(async move {
        if serve_public.await.is_err() {
            warn!("relay listener stopped");
        }
    });
    let b = tokio::spawn(async move {
        if serve_operator.await.is_err() {
            warn!("operator listener stopped");
        }
    });
    info!(node = %Prefix(ctx.node.id()), "node ready");
    shutdown.await;
    cancel.cancel();
    for t in [a, b, peers, upkeep, probes] {
        let _ = t.await;
    }
    info!("node stopped");
}

/// Onion key rotation and guard upkeep.
async fn upkeep(pipeline: Arc<Pipeline>, cancel: CancellationToken) {
    let ctx = Arc::clone(pipeline.ctx());
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(UPKEEP) => {}
        }
        match ctx.node.rotate_if_due(ctx.clock.unix()) {
            Ok(true) => info!("onion key rotated"),
            Ok(false) => {}
            Err(e) => warn!("onion key rotation failed: {e}"),
        }
        pipeline.hops().sweep(ctx.clock.instant());
    }
}
