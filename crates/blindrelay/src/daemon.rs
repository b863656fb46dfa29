//! `blindrelay run`: the node's listeners and background tasks.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::node::Node;
use crate::peers::Peers;
use crate::pipeline::{Relay, RelayConfig};
use crate::proto::Prefix;
use crate::replay::{self, ReplayRegistry, ReplayStore};
use crate::terminal::{Inbox, InboxError};
use crate::{api, forward};

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

/// Builds the relay from the state dir.
///
/// # Errors
/// [`RunError`].
pub fn build(config: RunConfig) -> Result<Arc<Relay>, RunError> {
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
    Ok(Arc::new(Relay::new(
        node,
        peers,
        config.clock,
        config.relay,
        Arc::new(registry),
        Arc::new(inbox),
    )))
}

/// Serves `relay` on the two listeners until `shutdown`.
pub async fn serve(
    relay: Arc<Relay>,
    public: TcpListener,
    operator: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let cancel = CancellationToken::new();
    let probes = tokio::spawn(crate::probe::run(
        Arc::clone(&relay),
        relay.config.probe_interval,
        cancel.clone(),
    ));
    let http = forward::client();
    let peers = tokio::spawn(Arc::clone(&relay.peers).run(http, cancel.clone()));
    let upkeep = tokio::spawn(upkeep(Arc::clone(&relay), cancel.clone()));
    let serve_public = axum::serve(public, api::public(Arc::clone(&relay)))
        .with_graceful_shutdown(cancel.clone().cancelled_owned());
    let serve_operator = axum::serve(operator, api::operator(Arc::clone(&relay)))
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
    info!(node = %Prefix(relay.node.id()), "node ready");
    shutdown.await;
    cancel.cancel();
    for t in [a, b, peers, upkeep, probes] {
        let _ = t.await;
    }
    info!("node stopped");
}

/// Onion key rotation and guard upkeep.
async fn upkeep(relay: Arc<Relay>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        let now = relay.clock.unix();
        match relay.node.rotate_if_due(now) {
            Ok(true) => info!("onion key rotated"),
            Ok(false) => {}
            Err(e) => warn!("onion key rotation failed: {e}"),
        }
        relay.hops().sweep(relay.clock.instant());
    }
}
