//! What `blindrelay run` is set to: a few sub-configs, each passed whole to what it sets (the
//! request gate, the context, the listeners, the stores, discovery, the report).

use std::path::PathBuf;
use std::time::Duration;

use crate::api::serve::ListenConfig;
use crate::clock::Clock;
use crate::context::{self, ContextConfig};
use crate::peers::PeerSpec;
use crate::pipeline::gate::GateConfig;
use crate::replay::{self, ReplayStore};
use crate::report::ReportConfig;
use crate::sources::Grouping;
use crate::terminal;

/// Of the replay registry, what one source may hold by default (percent).
pub const REPLAY_SOURCE_SHARE_PERCENT: u8 = 25;

/// The stores' bounds: the replay registry and the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoresConfig {
    /// Live tags the replay registry holds at most.
    pub replay_capacity: usize,
    /// Percent of the replay registry one source may hold.
    pub replay_share_percent: u8,
    /// Inbox items at most.
    pub inbox_max_items: usize,
    /// Inbox payload bytes at most.
    pub inbox_max_bytes: u64,
    /// Inbox items are deleted after this long (zero: never).
    pub inbox_retention: Duration,
    /// Percent of the inbox one source may hold.
    pub inbox_share_percent: u8,
}

impl Default for StoresConfig {
    fn default() -> Self {
        StoresConfig {
            replay_capacity: replay::CAPACITY,
            replay_share_percent: REPLAY_SOURCE_SHARE_PERCENT,
            inbox_max_items: terminal::INBOX_MAX_ITEMS,
            inbox_max_bytes: terminal::INBOX_MAX_BYTES,
            inbox_retention: terminal::DEFAULT_RETENTION,
            inbox_share_percent: terminal::INBOX_SOURCE_SHARE_PERCENT,
        }
    }
}

/// Peers, probes and discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Next hops may have private endpoints (loopback tests).
    pub allow_private_endpoints: bool,
    /// Time between two fetches of every `--peer` URL.
    pub peer_refresh: Duration,
    /// Time between probe rounds (zero: no periodic probes).
    pub probe_interval: Duration,
    /// The discovery interval (zero: no discovery beyond the `--peer`s).
    pub gossip_interval: Duration,
    /// How long this node's descriptor is valid (seconds); signed again at half of it.
    pub descriptor_lifetime: u64,
}

impl DiscoveryConfig {
    /// The defaults, private endpoints allowed or not.
    pub fn new(allow_private_endpoints: bool) -> Self {
        DiscoveryConfig {
            allow_private_endpoints,
            peer_refresh: crate::peers::ROUND,
            probe_interval: crate::probe::DEFAULT_INTERVAL,
            gossip_interval: crate::gossip::DEFAULT_INTERVAL,
            descriptor_lifetime: crate::proto::descriptor::DESCRIPTOR_TTL,
        }
    }
}

/// Settings of the relay, by what they set.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The request gate (admission).
    pub gate: GateConfig,
    /// How sources are grouped.
    pub grouping: Grouping,
    /// The listeners' timeouts and connection caps.
    pub listen: ListenConfig,
    /// The context: crypto slots, next hops, the outbound queue, the bind address.
    pub context: ContextConfig,
    /// The replay registry's and the inbox's bounds.
    pub stores: StoresConfig,
    /// Peers, probes and discovery.
    pub discovery: DiscoveryConfig,
    /// The periodic status report (`None`: off).
    pub report: Option<ReportConfig>,
}

impl RelayConfig {
    /// The design's defaults.
    pub fn new(allow_private_endpoints: bool) -> Self {
        RelayConfig {
            gate: GateConfig::default(),
            grouping: Grouping::default(),
            listen: ListenConfig::default(),
            context: ContextConfig::new(context::default_crypto_slots()),
            stores: StoresConfig::default(),
            discovery: DiscoveryConfig::new(allow_private_endpoints),
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
    pub peers: Vec<PeerSpec>,
    /// Replay store.
    pub replay_store: ReplayStore,
    /// Relay settings.
    pub relay: RelayConfig,
    /// Time source.
    pub clock: Clock,
    /// Start even when a store the node opened before is missing or empty (`crate::stores`).
    pub accept_lost_state: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_constants() {
        let c = RelayConfig::new(false);
        assert_eq!(c.gate.per_minute, crate::pipeline::gate::DEFAULT_PER_WINDOW);
        assert_eq!(c.context.crypto_wait, context::DEFAULT_CRYPTO_WAIT);
        assert!(c.context.distinct_blocks && !c.context.crypto_on_reactor);
        assert_eq!(c.context.bind, None);
        assert_eq!(c.stores.replay_capacity, replay::CAPACITY);
        assert_eq!(c.stores.replay_share_percent, REPLAY_SOURCE_SHARE_PERCENT);
        assert_eq!(c.stores.inbox_max_items, terminal::INBOX_MAX_ITEMS);
        assert!(!c.discovery.allow_private_endpoints);
        assert!(RelayConfig::new(true).discovery.allow_private_endpoints);
        assert_eq!(c.report, None);
    }
}
