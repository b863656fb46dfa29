//! The node's tasks: its two listeners, its background tasks (probes, peers, discovery, the
//! replay registry's answers, alerts, the report) and their upkeep, all tracked by the
//! context's [`TaskTracker`](tokio_util::task::TaskTracker) under one cancellation token.
//! Shutdown cancels the token and waits for every tracked task, the requests the node runs to
//! their end included.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::config::DiscoveryConfig;
use super::{Built, RunError};
use crate::api::{self, serve};
use crate::context::Context;
use crate::probe;
use crate::proto::Prefix;
use crate::relay::Relay;
use crate::replay;
use crate::report;

/// How often onion keys are checked for rotation and the guard is swept.
pub const UPKEEP: Duration = Duration::from_secs(10);

/// Serves `node` on the two listeners until `shutdown`, then stops every task and waits for
/// them.
///
/// # Errors
/// [`RunError::Listener`]: a listener stopped before `shutdown` (it panicked).
pub async fn serve(
    node: Built,
    public: TcpListener,
    operator: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let Built {
        relay,
        tls,
        cookie,
        listen,
        discovery,
        peer_store,
        inbox_retention,
        report,
    } = node;
    let ctx = Arc::clone(relay.ctx());
    let tasks = ctx.tasks().clone();
    let cancel = CancellationToken::new();
    background(&relay, &cancel, discovery, peer_store);
    tasks.spawn(upkeep(Arc::clone(&relay), inbox_retention, cancel.clone()));
    if let Some((r, http)) = report {
        tasks.spawn(report::run(Arc::clone(&relay), r, http, cancel.clone()));
    }
    let public_served = tasks.spawn(serve::serve(
        public,
        api::public(Arc::clone(&relay)),
        Arc::clone(relay.pipeline()),
        listen,
        relay.connections().clone(),
        Some(tokio_rustls::TlsAcceptor::from(tls)),
        cancel.clone(),
    ));
    let operator_served = tasks.spawn(serve::serve(
        operator,
        api::operator(Arc::clone(&relay), cookie),
        Arc::clone(relay.pipeline()),
        listen,
        serve::connections(&listen),
        None,
        cancel.clone(),
    ));
    let c = cancel.clone();
    tasks.spawn(async move {
        tokio::select! {
            () = c.cancelled() => {}
            () = ready(&ctx) => {}
        }
    });
    let stopped = tokio::select! {
        () = shutdown => Ok(()),
        _ = public_served => Err(RunError::Listener("--listen")),
        _ = operator_served => Err(RunError::Listener("--operator")),
    };
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    info!("node stopped");
    stopped
}

/// The node's background tasks, each until `cancel`: probes and reachability, the peers'
/// fetches and their store, discovery, the replay registry's stored answers, alerts.
fn background(
    relay: &Arc<Relay>,
    cancel: &CancellationToken,
    discovery: DiscoveryConfig,
    peer_store: PathBuf,
) {
    let ctx = relay.ctx();
    let tasks = ctx.tasks();
    let interval = discovery.probe_interval;
    tasks.spawn(probe::run(Arc::clone(ctx), interval, cancel.clone()));
    tasks.spawn(probe::recover(Arc::clone(ctx), cancel.clone()));
    tasks.spawn(Arc::clone(&ctx.peers).run(ctx.outgoing.links.clone(), cancel.clone()));
    let peers = Arc::clone(&ctx.peers);
    tasks.spawn(crate::peers::cache::run(peers, peer_store, cancel.clone()));
    let interval = discovery.gossip_interval;
    tasks.spawn(crate::gossip::run(
        Arc::clone(ctx),
        interval,
        cancel.clone(),
    ));
    let registry = Arc::clone(relay.replay());
    tasks.spawn(replay::write_answers(registry, cancel.clone()));
    tasks.spawn(crate::alerts::run(Arc::clone(relay), cancel.clone()));
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
            Err(e) => warn!(error = %e, "onion key rotation failed"),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::clock::Clock;
    use crate::daemon::{RelayConfig, RunConfig, build};
    use crate::replay::ReplayStore;

    /// A node on a fresh state dir, nothing periodic running.
    fn node(dir: &std::path::Path) -> Built {
        let state = dir.join("node");
        crate::node::init(&state, "https://127.0.0.1:7001", Clock::System.unix()).unwrap();
        let mut relay = RelayConfig::new(true);
        relay.discovery.probe_interval = Duration::ZERO;
        relay.discovery.gossip_interval = Duration::ZERO;
        build(RunConfig {
            state_dir: state,
            peers: Vec::new(),
            replay_store: ReplayStore::Memory,
            relay,
            clock: Clock::System,
            accept_lost_state: false,
        })
        .unwrap()
    }

    #[tokio::test]
    async fn shutdown_waits_for_every_tracked_task() {
        let dir = tempfile::tempdir().unwrap();
        let built = node(dir.path());
        let ctx = Arc::clone(built.relay.ctx());
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        // As a request run to its end is: tracked, ending by its own deadline.
        ctx.tasks().spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            d.store(true, Ordering::SeqCst);
        });
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let operator = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stopped = serve(built, public, operator, async {}).await;
        assert!(stopped.is_ok(), "{stopped:?}");
        assert!(done.load(Ordering::SeqCst), "stopped before the task ended");
        assert!(ctx.tasks().is_closed() && ctx.tasks().is_empty());
    }
}
