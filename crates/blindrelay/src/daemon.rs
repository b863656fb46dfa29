//! `blindrelay run`: build the node from its state dir, serve its two listeners, and run its
//! background tasks (peer descriptors, probes, onion key rotation and guard upkeep).

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{self, serve};
use crate::clock::Clock;
use crate::context::{self, Context, ContextConfig};
use crate::forward;
use crate::node::Node;
use crate::outbound::{HopRate, QueueLimits};
use crate::peers::Peers;
use crate::pipeline::{Stores, gate};
use crate::probe;
use crate::proto::Prefix;
use crate::relay::Relay;
use crate::replay::{self, ReplayRegistry, ReplayStore};
use crate::report;
use crate::sources::Grouping;
use crate::stores;
use crate::terminal::{self, INBOX_MAX_BYTES, INBOX_MAX_ITEMS, Inbox, InboxError, Terminal};

/// Of the replay registry, what one source may hold by default (percent).
pub const REPLAY_SOURCE_SHARE_PERCENT: u8 = 25;
/// The replay registry's file in the state dir.
pub const REPLAY_DB: &str = "replay.db";
/// The inbox's file in the state dir.
pub const INBOX_DB: &str = "inbox.db";
/// Descriptors kept free for everything but connections (SQLite, peers, the operator).
const SPARE_DESCRIPTORS: u64 = 256;

/// How often onion keys are checked for rotation and the guard is swept.
const UPKEEP: Duration = Duration::from_secs(10);

/// Settings of the relay.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Requests admitted per minute, process-wide.
    pub window_limit: u32,
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// Percent of the admission rate only known sources may use.
    pub known_share_percent: u8,
    /// How sources are grouped.
    pub grouping: Grouping,
    /// The listeners' timeouts and connection caps.
    pub listen: serve::ListenConfig,
    /// Crypto slots in all.
    pub crypto_slots: usize,
    /// How long this node's own send may wait for a crypto slot (relay requests never wait).
    pub crypto_wait: Duration,
    /// Measuring only: the cryptography on the runtime's workers (`--crypto-on-reactor`).
    pub crypto_on_reactor: bool,
    /// Requests in flight per next hop.
    pub per_next_hop: usize,
    /// The previous-hop rate: enforced on previous hops, assumed of next hops.
    pub hop_rate: HopRate,
    /// The outbound queue's bounds.
    pub queue: QueueLimits,
    /// Inbox caps: items, payload bytes.
    pub inbox_max_items: usize,
    /// See `inbox_max_items`.
    pub inbox_max_bytes: u64,
    /// Inbox items are deleted after this long (zero: never).
    pub inbox_retention: Duration,
    /// Percent of the inbox one source may hold.
    pub inbox_share_percent: u8,
    /// Live tags the replay registry holds at most.
    pub replay_capacity: usize,
    /// The request gate's cheap budget per source (requests per second).
    pub cheap_per_second: u32,
    /// Requests one source may have in flight.
    pub in_flight_per_source: usize,
    /// Percent of the replay registry one source may hold.
    pub replay_share_percent: u8,
    /// Outgoing connections are made from this address (the listen address).
    pub bind: Option<IpAddr>,
    /// Next hops may have private endpoints (loopback tests).
    pub allow_private_endpoints: bool,
    /// Two hops of one route may share a /16 (IPv4) or /32 (IPv6): a private network whose
    /// nodes all do.
    pub same_subnet_paths: bool,
    /// Time between two fetches of every `--peer` URL.
    pub peer_refresh: Duration,
    /// Time between probe rounds (zero: no periodic probes).
    pub probe_interval: Duration,
    /// The discovery interval (zero: no discovery beyond the `--peer`s).
    pub gossip_interval: Duration,
    /// How long this node's descriptor is valid (seconds); signed again at half of it.
    pub descriptor_lifetime: u64,
    /// The periodic status report (`None`: off).
    pub report: Option<report::ReportConfig>,
}

impl RelayConfig {
    /// The design's defaults.
    pub fn new(allow_private_endpoints: bool) -> Self {
        RelayConfig {
            window_limit: gate::DEFAULT_PER_WINDOW,
            max_in_flight: gate::MAX_IN_FLIGHT,
            known_share_percent: gate::KNOWN_SHARE_PERCENT,
            grouping: Grouping::default(),
            listen: serve::ListenConfig::default(),
            crypto_slots: context::default_crypto_slots(),
            crypto_wait: context::DEFAULT_CRYPTO_WAIT,
            crypto_on_reactor: false,
            per_next_hop: forward::PER_NEXT_HOP,
            hop_rate: HopRate::default(),
            queue: QueueLimits::default(),
            inbox_max_items: INBOX_MAX_ITEMS,
            inbox_max_bytes: INBOX_MAX_BYTES,
            inbox_retention: terminal::DEFAULT_RETENTION,
            inbox_share_percent: terminal::INBOX_SOURCE_SHARE_PERCENT,
            replay_capacity: replay::CAPACITY,
            replay_share_percent: REPLAY_SOURCE_SHARE_PERCENT,
            cheap_per_second: gate::CHEAP_PER_SECOND,
            in_flight_per_source: gate::IN_FLIGHT_PER_SOURCE,
            bind: None,
            allow_private_endpoints,
            same_subnet_paths: false,
            peer_refresh: crate::peers::ROUND,
            probe_interval: probe::DEFAULT_INTERVAL,
            gossip_interval: crate::gossip::DEFAULT_INTERVAL,
            descriptor_lifetime: crate::proto::descriptor::DESCRIPTOR_TTL,
            report: None,
        }
    }
}

/// What `run` needs.
#[derive(Debug)]
pub struct RunConfig {
    /// The state dir (`blindrelay init`).
    pub state_dir: PathBuf,
    /// Peer URLs to fetch descriptors from.
    pub peers: Vec<crate::peers::PeerSpec>,
    /// Replay store.
    pub replay_store: ReplayStore,
    /// Relay settings.
    pub relay: RelayConfig,
    /// Time source.
    pub clock: Clock,
    /// Start even when a store the node opened before is missing or empty (`crate::stores`).
    pub accept_lost_state: bool,
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
    /// The operator cookie file.
    #[error("cannot write the operator cookie: {0}")]
    Cookie(std::io::ErrorKind),
    /// A store the node opened before is lost, and the operator did not accept it.
    #[error(transparent)]
    LostState(#[from] stores::LostState),
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

/// Refuses a state dir that cannot be written: the node would fail every request (no route can
/// be reserved) after starting as if well.
fn check_writable(dir: &std::path::Path) -> Result<(), RunError> {
    let probe = dir.join(".write-check");
    std::fs::write(&probe, b"").map_err(RunError::ReadOnly)?;
    std::fs::remove_file(&probe).map_err(RunError::ReadOnly)
}

/// A built node: its handle and what its listeners and background tasks are set to.
#[derive(Debug, Clone)]
pub struct Built {
    /// The node: context, pipeline, stores, relay connections.
    pub relay: Arc<Relay>,
    /// Time between probe rounds.
    pub probe_interval: Duration,
    /// The discovery interval (`--gossip-interval`; zero: no discovery).
    pub gossip_interval: Duration,
    /// The peer store's file (`peers.json` in the state dir).
    pub peer_store: PathBuf,
    /// The listeners' limits.
    pub listen: serve::ListenConfig,
    /// Inbox retention (zero: none).
    pub inbox_retention: Duration,
    /// The operator API's cookie, fresh in the state dir.
    pub cookie: api::cookie::Cookie,
    /// The periodic status report (`None`: off).
    pub report: Option<report::ReportConfig>,
}

/// Builds the node from the state dir.
///
/// # Errors
/// [`RunError`].
pub fn build(config: RunConfig) -> Result<Built, RunError> {
    let node = Arc::new(
        Node::load(&config.state_dir)?.with_descriptor_lifetime(config.relay.descriptor_lifetime),
    );
    check_writable(&config.state_dir)?;
    let now = config.clock.unix();
    node.rotate_if_due(now)?;
    let relay = &config.relay;
    let (registry, inbox) = open_stores(&config, now)?;
    let mut listen = relay.listen;
    fit_descriptors(&mut listen);
    let peers = Arc::new(
        Peers::new(
            config.peers,
            config.relay.allow_private_endpoints,
            config.clock,
            *node.id(),
        )
        .with_refresh(relay.peer_refresh)
        .with_discovery(crate::discovery::Config::for_interval(
            relay.gossip_interval,
        )),
    );
    let peer_store = crate::peers::cache::path(&config.state_dir);
    let restored = crate::peers::cache::restore(&peers, &peer_store);
    if restored > 0 {
        info!(restored, "peers read back from the peer store");
    }
    let ctx = Arc::new(Context::with_config(
        node,
        peers,
        config.clock,
        ContextConfig {
            crypto_slots: relay.crypto_slots,
            crypto_wait: relay.crypto_wait,
            per_next_hop: relay.per_next_hop,
            hop_rate: relay.hop_rate,
            queue: relay.queue,
            bind: relay.bind,
            distinct_blocks: !relay.same_subnet_paths,
            crypto_on_reactor: relay.crypto_on_reactor,
        },
    ));
    let stores = Stores {
        replay: Arc::new(registry),
        terminal: Terminal::new(Arc::new(inbox), relay.inbox_share_percent),
    };
    let node = Relay::new(
        ctx,
        gate::GateConfig {
            per_minute: relay.window_limit,
            max_in_flight: relay.max_in_flight,
            known_share_percent: relay.known_share_percent,
            cheap_per_second: relay.cheap_per_second,
            in_flight_per_source: relay.in_flight_per_source,
        },
        relay.grouping,
        stores,
        serve::connections(&listen),
    );
    let cookie =
        api::cookie::Cookie::create(&config.state_dir).map_err(|e| RunError::Cookie(e.kind()))?;
    Ok(Built {
        cookie,
        relay: Arc::new(node),
        probe_interval: relay.probe_interval,
        gossip_interval: relay.gossip_interval,
        peer_store,
        listen,
        inbox_retention: relay.inbox_retention,
        report: relay.report.clone(),
    })
}

/// The replay registry and the inbox, opened from the state dir; a store opened before and now
/// lost refuses the start unless `--accept-lost-state`.
fn open_stores(config: &RunConfig, now: u64) -> Result<(ReplayRegistry, Inbox), RunError> {
    let relay = &config.relay;
    let opening: &[&str] = match config.replay_store {
        ReplayStore::Sqlite => &[REPLAY_DB, INBOX_DB],
        ReplayStore::Memory => &[INBOX_DB],
    };
    for lost in stores::check(&config.state_dir, opening, config.accept_lost_state)? {
        warn!("{lost}; starting anyway (--accept-lost-state)");
    }
    let accept = config.accept_lost_state;
    let registry = match config.replay_store {
        ReplayStore::Sqlite => open_store(&config.state_dir, &REPLAY, accept, now, |p| {
            ReplayRegistry::open_sqlite(p, relay.replay_capacity, replay::WINDOW_SECS, now)
        })?,
        ReplayStore::Memory => ReplayRegistry::memory(relay.replay_capacity, replay::WINDOW_SECS),
    }
    .with_source_share(relay.replay_share_percent);
    let inbox = open_store(&config.state_dir, &INBOX, accept, now, |p| {
        Inbox::open_with_limits(p, relay.inbox_max_items, relay.inbox_max_bytes)
    })?;
    stores::record(&config.state_dir, opening).map_err(stores::LostState::File)?;
    Ok((registry, inbox))
}

/// What a store's file holds, and what starting without it loses.
struct StoreFile {
    name: &'static str,
    holds: &'static str,
    loss: &'static str,
}

const REPLAY: StoreFile = StoreFile {
    name: REPLAY_DB,
    holds: "the layers this node relayed, so that none runs twice",
    loss: "a layer it relayed before may then be relayed once more",
};

const INBOX: StoreFile = StoreFile {
    name: INBOX_DB,
    holds: "the messages delivered to this node",
    loss: "the messages in it are gone",
};

/// The store `store` of `state_dir`, opened by `open`. A file that cannot be used is refused
/// with its name and the remedy; with `accept` (`--accept-lost-state`) it is set aside as
/// `<name>.damaged-<now>` (its write-ahead log with it) and the store starts empty, said at
/// `warn`.
fn open_store<T, E: std::fmt::Display>(
    state_dir: &std::path::Path,
    store: &StoreFile,
    accept: bool,
    now: u64,
    open: impl Fn(&std::path::Path) -> Result<T, E>,
) -> Result<T, RunError> {
    let path = state_dir.join(store.name);
    let why = match open(&path) {
        Ok(opened) => return Ok(opened),
        Err(e) => e.to_string(),
    };
    let file = path.display().to_string();
    if !accept {
        return Err(RunError::Damaged {
            file,
            why,
            holds: store.holds,
            loss: store.loss,
        });
    }
    let aside = state_dir.join(format!("{}.damaged-{now}", store.name));
    for suffix in ["", "-wal", "-shm"] {
        let from = state_dir.join(format!("{}{suffix}", store.name));
        if from.exists() {
            let to = aside.with_file_name(format!("{}.damaged-{now}{suffix}", store.name));
            std::fs::rename(&from, &to).map_err(|e| RunError::Damaged {
                file: file.clone(),
                why: format!("{why}; and it cannot be set aside: {e}"),
                holds: store.holds,
                loss: store.loss,
            })?;
        }
    }
    warn!(
        "{file} cannot be used ({why}); set aside as {}, starting on an empty one \
         (--accept-lost-state): {}",
        aside.display(),
        store.loss
    );
    open(&path).map_err(|e| RunError::Damaged {
        file,
        why: e.to_string(),
        holds: store.holds,
        loss: store.loss,
    })
}

/// Raises the descriptor limit (soft up to hard) so both listeners can hold their connections;
/// when it cannot, lowers the connection caps to fit, with a warning.
fn fit_descriptors(listen: &mut serve::ListenConfig) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let need = 2 * listen.connections.total as u64 + SPARE_DESCRIPTORS;
    let lim = getrlimit(Resource::Nofile);
    let soft = lim.current.unwrap_or(u64::MAX);
    if soft >= need {
        return;
    }
    let raised = lim.maximum.unwrap_or(u64::MAX).min(need);
    let soft = if setrlimit(
        Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(raised),
            maximum: lim.maximum,
        },
    )
    .is_ok()
    {
        raised
    } else {
        soft
    };
    if soft < need {
        let total = usize::try_from(soft.saturating_sub(SPARE_DESCRIPTORS) / 2).unwrap_or(0);
        let c = &mut listen.connections;
        c.total = total.max(1);
        c.reserved = c.reserved.min(c.total / 2);
        c.per_source = c.per_source.min(c.total);
        warn!(
            connections = c.total,
            "the descriptor limit is low: fewer connections per listener"
        );
    }
}

/// Serves `node` on the two listeners until `shutdown`.
pub async fn serve(
    node: Built,
    public: TcpListener,
    operator: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let Built {
        relay,
        probe_interval,
        gossip_interval,
        peer_store,
        listen,
        inbox_retention,
        cookie,
        report,
    } = node;
    let ctx = Arc::clone(relay.ctx());
    let tls = match crate::links::node_server_config(ctx.node.signing_key()) {
        Ok(c) => tokio_rustls::TlsAcceptor::from(c),
        Err(e) => {
            tracing::error!(%e, "cannot make the links' TLS identity; not serving");
            return;
        }
    };
    let cancel = CancellationToken::new();
    let mut tasks = background(&relay, &cancel, probe_interval, gossip_interval, peer_store);
    let upkeep = upkeep(Arc::clone(&relay), inbox_retention, cancel.clone());
    tasks.push(tokio::spawn(upkeep));
    if let Some(r) = report {
        tasks.push(tokio::spawn(report::run(
            Arc::clone(&relay),
            r,
            cancel.clone(),
        )));
    }
    let a = tokio::spawn(serve::serve(
        public,
        api::public(Arc::clone(&relay)),
        Arc::clone(relay.pipeline()),
        listen,
        relay.connections().clone(),
        Some(tls),
        cancel.clone(),
    ));
    let b = tokio::spawn(serve::serve(
        operator,
        api::operator(Arc::clone(&relay), cookie),
        Arc::clone(relay.pipeline()),
        listen,
        serve::connections(&listen),
        None,
        cancel.clone(),
    ));
    tokio::pin!(shutdown);
    let stopped = tokio::select! {
        () = ready(&ctx) => false,
        () = &mut shutdown => true,
    };
    if !stopped {
        shutdown.await;
    }
    cancel.cancel();
    for t in [a, b].into_iter().chain(tasks) {
        let _ = t.await;
    }
    info!("node stopped");
}

/// The node's background tasks, each until `cancel`: probes and reachability, the peers'
/// fetches and their store, gossip, the replay registry's stored answers, alerts.
fn background(
    relay: &Arc<Relay>,
    cancel: &CancellationToken,
    probe_interval: Duration,
    gossip_interval: Duration,
    peer_store: PathBuf,
) -> Vec<tokio::task::JoinHandle<()>> {
    let ctx = relay.ctx();
    vec![
        tokio::spawn(probe::run(Arc::clone(ctx), probe_interval, cancel.clone())),
        tokio::spawn(probe::recover(Arc::clone(ctx), cancel.clone())),
        tokio::spawn(Arc::clone(&ctx.peers).run(ctx.outgoing.links.clone(), cancel.clone())),
        tokio::spawn(crate::peers::cache::run(
            Arc::clone(&ctx.peers),
            peer_store,
            cancel.clone(),
        )),
        tokio::spawn(crate::gossip::run(
            Arc::clone(ctx),
            gossip_interval,
            cancel.clone(),
        )),
        tokio::spawn(replay::write_answers(
            Arc::clone(relay.replay()),
            cancel.clone(),
        )),
        tokio::spawn(crate::alerts::run(Arc::clone(relay), cancel.clone())),
    ]
}

/// Ready means ready: says `node ready` once every `--peer`'s descriptor is held, so a send can
/// route (at most [`crate::peers::READY_WAIT`]: then it says what is missing and goes on).
async fn ready(ctx: &Context) {
    if !ctx.peers.fetched(crate::peers::READY_WAIT).await {
        warn!("not every --peer's descriptor could be fetched yet; fetching on");
    }
    let routable = ctx.peers.routable(ctx.clock.unix()).len();
    info!(node = %Prefix(ctx.node.id()), routable, "node ready");
}

/// Onion key rotation, guard upkeep, and the inbox's retention.
async fn upkeep(relay: Arc<Relay>, retention: Duration, cancel: CancellationToken) {
    let ctx = Arc::clone(relay.ctx());
    let pipeline = relay.pipeline();
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
        let instant = ctx.clock.instant();
        pipeline.hops().sweep(instant);
        pipeline.gate().sweep(instant);
        pipeline.sources().sweep(instant);
        if !retention.is_zero() {
            expire(&relay, retention).await;
        }
    }
}

/// Deletes the inbox items older than `retention`.
pub async fn expire(relay: &Relay, retention: Duration) {
    let ctx = relay.ctx();
    let now = ctx.clock.unix();
    let cutoff = now.saturating_sub(retention.as_secs());
    let terminal = relay.terminal().clone();
    match tokio::task::spawn_blocking(move || terminal.expire(cutoff)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => {
            ctx.counters.inbox_expired.add(n as u64);
            ctx.counters.last_inbox_freed_at.set(now);
            info!(items = n, "inbox items past their retention deleted");
        }
        _ => warn!("inbox retention failed"),
    }
}
