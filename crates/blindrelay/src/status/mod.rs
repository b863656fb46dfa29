//! What the operator sees: the status document (`GET /v1/status`, typed, read back by the
//! operator client) and the Prometheus text (`GET /metrics`). Rules: `docs/blindrelay-status.md`.
//!
//! - [`quality`]: the evidence, `status` and `proof_scope` rules over the counters;
//! - [`metrics`]: the Prometheus text;
//! - here: the document, assembled from the counters, the peer health summary, the guard's
//!   quarantines, the replay registry and the inbox. Each is read under its own lock, one at a
//!   time.

pub mod metrics;
pub mod quality;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

pub use self::quality::{
    Cause, CauseReason, CauseSource, Evidence, ProofScope, Quality, Status, Stores,
};
use crate::counters::Snapshot;
use crate::discovery::Stats;
use crate::health::{Standing, Summary};
use crate::pipeline::pressure::Culprit;
use crate::proto::{NodeId, Prefix};
use crate::relay::Relay;
use crate::replay::ReplayStore;

/// The replay registry, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayInfo {
    /// Where reservations are kept.
    pub store: ReplayStore,
    /// Routes reserved now.
    pub live_routes: usize,
    /// Live routes it holds at most.
    pub capacity: usize,
    /// Every slot holds a live route: new routes are refused (`replay_capacity`).
    pub full: bool,
    /// Stored answers in memory, not yet in the file (written with the next reservation, or
    /// within [`crate::replay::ANSWER_FLUSH`]).
    #[serde(default)]
    pub unwritten_answers: usize,
}

/// The request gate and the relay listener, as counts (never an address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionInfo {
    /// Relay requests in flight.
    pub in_flight: usize,
    /// Open connections of the relay listener.
    pub connections: usize,
    /// Sources the request gate's rate pools remember.
    pub sources: usize,
}

/// The peer table, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeersInfo {
    /// Descriptors held, valid or not.
    pub known: usize,
    /// Peers with a current descriptor and an allowed endpoint.
    pub routable: usize,
    /// Of those, the ones this node's own routes may take as middles now: reached once at
    /// their endpoint, not failing, not quarantined (peer health's `in_routes`).
    #[serde(default)]
    pub in_routes: usize,
    /// Descriptors held from `--peer` URLs.
    #[serde(default)]
    pub bootstrap: usize,
    /// Descriptors held from gossip.
    #[serde(default)]
    pub gossip: usize,
    /// Descriptors read back from the peer store at start, not refreshed since.
    #[serde(default)]
    pub cache: usize,
    /// When a reconciliation last completed (Unix seconds), if ever.
    #[serde(default)]
    pub last_gossip_at: Option<u64>,
    /// Held, not reached yet (probed in turn; never routed through nor passed on).
    #[serde(default)]
    pub waiting: usize,
    /// Reached peers whose descriptors lapsed, still greeted now and then.
    #[serde(default)]
    pub lapsed: usize,
    /// What discovery did, and whether this node may be eclipsed.
    #[serde(default)]
    pub discovery: DiscoveryInfo,
    /// Descriptors and TLS handshakes refused because a `--peer` URL or a next hop answered
    /// with another identity than the one pinned to it (on the command line, on first use, or
    /// by the descriptor naming it). Not zero: look at the log.
    pub identity_changes: u64,
}

/// Discovery (`crate::discovery`), as counts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DiscoveryInfo {
    /// Eclipse detection: `ok`, `one_source` (nearly every peer came through one source) or
    /// `unconfirmed` (the sources disagree).
    pub eclipse: String,
    /// Distinct roots (first-hand sources, by /16) of the peers held.
    pub roots: usize,
    /// Percent of peers held unconfirmed under the largest root.
    pub top_root_percent: u32,
    /// Percent of peers held that no second root vouched for.
    pub unconfirmed_percent: u32,
    /// Roots this node reconciled with.
    pub roots_synced: usize,
    /// Discovery's own counters (`crate::discovery::Stats`).
    pub counters: BTreeMap<String, u64>,
}

/// The inbox, as the document shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxInfo {
    /// Items stored.
    pub items: usize,
    /// Payload bytes stored.
    pub bytes: u64,
    /// Items it holds at most.
    pub max_items: usize,
    /// Payload bytes it holds at most.
    pub max_bytes: u64,
    /// Deliveries were refused for lack of room and none was freed since (`inbox_full`).
    pub full: bool,
    /// Sources holding a share of it (a count).
    pub sources: usize,
}

/// The status document, in the design's layout: the counters at
/// `system_stats.discovery_status.peer_store.runtime.blind_relay`, the quality at
/// `….peer_store.blind_relay_quality`, the peer health at `….peer_store.peer_health_summary`.
/// The node's own stores and gate sit next to the counters in `runtime`. The server fills the
/// counters with a [`Snapshot`]; a reader may take them as a map of names to values (the
/// operator client does). The same document is what the periodic report pushes
/// ([`crate::report`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document<C = Snapshot> {
    /// The node's 8-hex prefix.
    pub node: String,
    /// The design's report.
    pub system_stats: SystemStats<C>,
}

/// `system_stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemStats<C> {
    /// `discovery_status`.
    pub discovery_status: DiscoveryStatus<C>,
}

/// `system_stats.discovery_status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveryStatus<C> {
    /// `peer_store`.
    pub peer_store: PeerStore<C>,
}

/// `system_stats.discovery_status.peer_store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStore<C> {
    /// The counters and the node's stores.
    pub runtime: Runtime<C>,
    /// Evidence, status, proof scope.
    pub blind_relay_quality: Quality,
    /// Per-peer health.
    pub peer_health_summary: Summary,
}

/// `system_stats.discovery_status.peer_store.runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime<C> {
    /// Every counter.
    pub blind_relay: C,
    /// The replay registry.
    pub replay: ReplayInfo,
    /// Known peers.
    pub peers: PeersInfo,
    /// The inbox.
    pub inbox: InboxInfo,
    /// The request gate and the relay listener.
    pub admission: AdmissionInfo,
    /// Requests to next hops waiting for their turn under the previous-hop rate.
    #[serde(default)]
    pub outbound: OutboundInfo,
}

/// The outbound pacer, as counts (never a next hop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OutboundInfo {
    /// The previous-hop limit assumed of next hops (this node's own)…
    pub assumed_limit: u32,
    /// …per window of this many seconds.
    pub window_secs: u64,
    /// Requests waiting for their turn now, and their bytes, and next hops remembered.
    #[serde(flatten)]
    pub queue: crate::outbound::QueueSnapshot,
}

impl<C> Document<C> {
    /// `system_stats.discovery_status.peer_store`.
    pub fn peer_store(&self) -> &PeerStore<C> {
        &self.system_stats.discovery_status.peer_store
    }
}

/// The one source recent backpressure mostly fell on, if any, with what the guard holds
/// against it (`standings`: [`HopGuard::standings`](crate::pipeline::hop_guard::HopGuard)).
pub fn backpressure_cause(
    relay: &Relay,
    standings: &HashMap<NodeId, Standing>,
    now: u64,
) -> Option<Cause> {
    let c = relay.pipeline().pressure().cause(now)?;
    let (source, peer, standing) = match &c.culprit {
        Culprit::Peer(id) => (
            CauseSource::Peer,
            Some(Prefix(id).to_string()),
            standings.get(id).copied().unwrap_or_default(),
        ),
        Culprit::Source(key) if key.is_known() => {
            (CauseSource::KnownAddress, None, Standing::default())
        }
        Culprit::Source(_) => (CauseSource::Strangers, None, Standing::default()),
    };
    let reason = if standing.quarantine_secs > 0 {
        CauseReason::Quarantined
    } else if standing.share_cut {
        CauseReason::PeelFailures
    } else {
        CauseReason::MostRequests
    };
    Some(Cause {
        source,
        peer,
        reason,
        refused: c.refused,
        of: c.of,
    })
}

/// The stores' state now, for `status`.
pub fn stores(relay: &Relay, counters: &Snapshot, now: u64) -> Stores {
    let inbox = relay.terminal().inbox();
    let refused_since_freed = match (counters.last_inbox_full_at, counters.last_inbox_freed_at) {
        (Some(full), Some(freed)) => full > freed,
        (Some(_), None) => true,
        _ => false,
    };
    Stores {
        inbox_full: inbox.len() >= inbox.limits().0 || refused_since_freed,
        replay_full: relay.replay().live(now) >= relay.replay().capacity(),
    }
}

/// What the peer table knows of each peer with a descriptor, for peer health.
fn known_peers(relay: &Relay) -> HashMap<NodeId, crate::health::Known> {
    relay
        .ctx()
        .peers
        .provenance()
        .into_iter()
        .map(|(id, p)| {
            let known = crate::health::Known {
                expires_at: p.expires_at,
                source: p.source.as_str(),
                last_gossip: p.last_reached,
                reached: p.reached,
            };
            (id, known)
        })
        .collect()
}

/// Discovery's own counters (`crate::discovery::Stats`) as the document
/// (`peers.discovery.counters`) and the metrics (`blindrelay_discovery_<name>_total`) name
/// them: name, help, value. Counts only.
// structure: table
pub fn discovery_counters(st: &Stats) -> [(&'static str, &'static str, u64); 14] {
    [
        (
            "bytes_sent",
            "Discovery message bytes sent (requests and answers).",
            st.bytes_sent,
        ),
        (
            "bytes_received",
            "Discovery message bytes received (requests and answers).",
            st.bytes_received,
        ),
        (
            "exchanges",
            "Discovery exchanges this node started.",
            st.exchanges,
        ),
        (
            "exchanges_failed",
            "Discovery exchanges this node started that got no usable answer.",
            st.exchanges_failed,
        ),
        (
            "exchanges_busy",
            "Discovery exchanges this node started that the peer answered busy (429), or that \
             found no room to leave: tried again soon, not counted against the peer.",
            st.exchanges_busy,
        ),
        (
            "exchanges_deferred",
            "Of the busy ones, those that found this node's own exchange slots all taken.",
            st.exchanges_deferred,
        ),
        ("syncs", "Reconciliations completed.", st.syncs),
        (
            "learned",
            "Descriptors kept (new identities and newer descriptors).",
            st.learned,
        ),
        (
            "refused",
            "Descriptors not kept because a bound of the view refused them.",
            st.refused,
        ),
        (
            "reached",
            "Identities reached for the first time.",
            st.reached,
        ),
        (
            "forgotten",
            "Identities forgotten after every probe failed.",
            st.forgotten,
        ),
        ("revived", "Lapsed peers that answered again.", st.revived),
        ("pushes", "Pushes (inventories) sent.", st.pushes),
        (
            "turned_away",
            "Discovery requests from strangers or over a budget, answered with nothing.",
            st.turned_away,
        ),
    ]
}

/// A share (0 to 1) as a whole percent.
pub fn percent(share: f64) -> u32 {
    (share * 100.0).round() as u32
}

/// Discovery's counters and eclipse assessment.
fn discovery_info(ctx: &crate::context::Context) -> DiscoveryInfo {
    let disc = ctx.peers.lock();
    let (e, st) = (disc.eclipse(), disc.stats());
    DiscoveryInfo {
        eclipse: e.state.as_str().to_string(),
        roots: e.roots,
        top_root_percent: percent(e.top_share),
        unconfirmed_percent: percent(e.unconfirmed_share),
        roots_synced: e.roots_synced,
        counters: discovery_counters(&st)
            .into_iter()
            .map(|(k, _, v)| (k.to_string(), v))
            .collect(),
    }
}

/// The whole status document now. Reads the replay registry's and the inbox's in-memory state
/// (no disk read), but their locks may wait for a commit: call it off the async reactor.
pub fn document(relay: &Relay) -> Document {
    let ctx = relay.ctx();
    let now = ctx.clock.unix();
    let counters = ctx.counters.snapshot();
    let descriptors = known_peers(relay);
    let standings = relay.pipeline().hops().standings(ctx.clock.instant());
    let peer_health = ctx.health.summary(now, &descriptors, |id| {
        standings.get(id).copied().unwrap_or_default()
    });
    let cause = backpressure_cause(relay, &standings, now);
    let stores = stores(relay, &counters, now);
    let inbox = relay.terminal().inbox();
    let (max_items, max_bytes) = inbox.limits();
    let by_source = ctx.peers.by_source();
    // Taken alone: a lock guard in the literal below would live to its end.
    let lapsed = ctx.peers.lock().lapsed();
    let runtime = Runtime {
        blind_relay: counters,
        replay: ReplayInfo {
            store: relay.replay().kind(),
            live_routes: relay.replay().live(now),
            unwritten_answers: relay.replay().unwritten(),
            capacity: relay.replay().capacity(),
            full: stores.replay_full,
        },
        peers: PeersInfo {
            known: descriptors.len(),
            routable: ctx.peers.routable(now).len(),
            in_routes: peer_health.in_routes,
            bootstrap: by_source.bootstrap,
            gossip: by_source.gossip,
            cache: by_source.cache,
            last_gossip_at: ctx.peers.last_gossip_at(),
            waiting: by_source.waiting,
            lapsed,
            discovery: discovery_info(ctx),
            identity_changes: ctx.peers.identity_changes(),
        },
        inbox: InboxInfo {
            items: inbox.len(),
            bytes: inbox.bytes(),
            max_items,
            max_bytes,
            full: stores.inbox_full,
            sources: relay.terminal().sources(),
        },
        admission: AdmissionInfo {
            in_flight: relay.pipeline().gate().in_flight(),
            connections: relay.connections().held(),
            sources: relay.pipeline().gate().sources(),
        },
        outbound: OutboundInfo {
            assumed_limit: ctx.outgoing.pacer.rate().limit,
            window_secs: ctx.outgoing.pacer.rate().window.as_secs(),
            queue: ctx.outgoing.pacer.snapshot(),
        },
    };
    Document {
        node: Prefix(ctx.node.id()).to_string(),
        system_stats: SystemStats {
            discovery_status: DiscoveryStatus {
                peer_store: PeerStore {
                    blind_relay_quality: quality::quality(&runtime.blind_relay, now, stores, cause),
                    runtime,
                    peer_health_summary: peer_health,
                },
            },
        },
    }
}
