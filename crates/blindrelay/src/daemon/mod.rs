//! `blindrelay run`: build the node from its state dir, serve its two listeners, and run its
//! background tasks (peer descriptors, probes, onion key rotation and guard upkeep).
//!
//! By job: [`config`] what the node is set to, [`stores`] its replay registry and inbox opened
//! (and recovered) from the state dir, [`limits`] the descriptor limit fitted to the
//! listeners, [`tasks`] the listeners and background tasks, tracked, and their upkeep. Here:
//! why the node could not start, and the node built from its config.

pub mod config;
pub mod limits;
pub mod stores;
pub mod tasks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

pub use self::config::{
    DiscoveryConfig, REPLAY_SOURCE_SHARE_PERCENT, RelayConfig, RunConfig, StoresConfig,
};
pub use self::stores::{INBOX_DB, REPLAY_DB};
pub use self::tasks::{expire, serve};
use crate::api::{self, serve::ListenConfig};
use crate::context::Context;
use crate::node::Node;
use crate::peers::Peers;
use crate::pipeline::Stores;
use crate::relay::Relay;
use crate::terminal::{InboxError, Terminal};

/// Why the node could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Node files.
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    /// The replay registry.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    /// The inbox.
    #[error(transparent)]
    Inbox(#[from] InboxError),
    /// The operator cookie file.
    #[error("cannot write the operator cookie {}: {kind}", file.display())]
    Cookie {
        /// The cookie file.
        file: PathBuf,
        /// What the file system said.
        kind: std::io::ErrorKind,
    },
    /// The links' TLS identity cannot be made from the node's identity key.
    #[error("{}: cannot make the links' TLS identity from this key: {why}", file.display())]
    Tls {
        /// The identity key's file.
        file: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The status report cannot be pushed.
    #[error(transparent)]
    Report(#[from] crate::report::NoClient),
    /// A listener stopped while the node was serving.
    #[error("the listener of {0} stopped: the node no longer serves")]
    Listener(&'static str),
    /// A store the node opened before is lost, and the operator did not accept it.
    #[error(transparent)]
    LostState(#[from] crate::stores::LostState),
    /// A store's file cannot be used: damaged, truncated, not a database, another store's.
    #[error(
        "{file} cannot be used: {why}. It holds {holds}. Restore it from a backup of this \
         node's state dir, or start with --accept-lost-state to set it aside and start on an \
         empty one ({loss})"
    )]
    Damaged {
        /// The file.
        file: String,
        /// What is wrong with it.
        why: String,
        /// What it holds.
        holds: &'static str,
        /// What starting without it loses.
        loss: &'static str,
    },
    /// The state dir cannot be written (a read-only file system, or no permission).
    #[error(
        "the state dir cannot be written ({0}): a node must record every route in replay.db \
         before it relays it, so it does not start on a read-only state dir"
    )]
    ReadOnly(std::io::Error),
}

/// A built node: its handle and what its listeners and background tasks are set to.
#[derive(Debug, Clone)]
pub struct Built {
    /// The node: context, pipeline, stores, relay connections.
    pub relay: Arc<Relay>,
    /// The public listener's TLS, with the node's identity.
    tls: Arc<rustls::ServerConfig>,
    /// The operator API's cookie, fresh in the state dir.
    cookie: api::cookie::Cookie,
    /// The listeners' limits, fitted to the descriptor limit.
    listen: ListenConfig,
    /// Probes' and discovery's intervals.
    discovery: DiscoveryConfig,
    /// The peer store's file (`peers.json` in the state dir).
    peer_store: PathBuf,
    /// Inbox retention (zero: none).
    inbox_retention: Duration,
    /// The periodic status report and its HTTP client (`None`: off).
    report: Option<(crate::report::ReportConfig, reqwest::Client)>,
}

/// Builds the node from the state dir.
///
/// # Errors
/// [`RunError`].
pub fn build(config: RunConfig) -> Result<Built, RunError> {
    let RunConfig {
        state_dir,
        peers,
        replay_store,
        relay,
        clock,
        accept_lost_state,
    } = config;
    let node =
        Node::load(&state_dir)?.with_descriptor_lifetime(relay.discovery.descriptor_lifetime);
    let node = Arc::new(node);
    stores::check_writable(&state_dir)?;
    let now = clock.unix();
    node.rotate_if_due(now)?;
    let tls = crate::links::node_server_config(node.signing_key()).map_err(|e| RunError::Tls {
        file: state_dir.join(crate::node::IDENTITY_FILE),
        why: e.to_string(),
    })?;
    let report = (relay.report.clone())
        .map(|r| crate::report::http_client(&r).map(|http| (r, http)))
        .transpose()?;
    let opening = stores::Opening {
        state_dir: &state_dir,
        replay_store,
        accept: accept_lost_state,
        bounds: &relay.stores,
    };
    let (registry, inbox) = stores::open(opening, now)?;
    let mut listen = relay.listen;
    limits::fit_descriptors(&mut listen);
    let discovery = relay.discovery;
    let peer_store = crate::peers::cache::path(&state_dir);
    let peers = known_peers(peers, &discovery, clock, &node, &peer_store);
    let ctx = Arc::new(Context::with_config(node, peers, clock, relay.context));
    let stores = Stores {
        replay: Arc::new(registry),
        terminal: Terminal::new(Arc::new(inbox), relay.stores.inbox_share_percent),
    };
    let connections = api::serve::connections(&listen);
    let node = Relay::new(ctx, relay.gate, relay.grouping, stores, connections);
    let cookie = api::cookie::Cookie::create(&state_dir).map_err(|e| RunError::Cookie {
        file: state_dir.join(api::cookie::COOKIE_FILE),
        kind: e.kind(),
    })?;
    Ok(Built {
        relay: Arc::new(node),
        tls,
        cookie,
        listen,
        discovery,
        peer_store,
        inbox_retention: relay.stores.inbox_retention,
        report,
    })
}

/// The peers: the `--peer`s and seeds in `specs`, and those read back from the peer store.
fn known_peers(
    specs: Vec<crate::peers::PeerSpec>,
    discovery: &DiscoveryConfig,
    clock: crate::clock::Clock,
    node: &Node,
    peer_store: &std::path::Path,
) -> Arc<Peers> {
    let interval = discovery.gossip_interval;
    let peers = Peers::new(specs, discovery.allow_private_endpoints, clock, *node.id())
        .with_refresh(discovery.peer_refresh)
        .with_discovery(crate::discovery::Config::for_interval(interval));
    let peers = Arc::new(peers);
    let restored = crate::peers::cache::restore(&peers, peer_store);
    if restored > 0 {
        info!(restored, "peers read back from the peer store");
    }
    peers
}
