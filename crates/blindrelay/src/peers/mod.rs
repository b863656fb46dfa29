//! Known peers: their signed descriptors, fetched from `--peer` URLs, verified, fetched again
//! every `--peer-refresh`.
//!
//! Each `--peer` is one identity at one URL: `ID@URL` pins the node id the URL must answer
//! with; a bare `URL` is trusted on first use (the first verified descriptor's id is pinned
//! for the life of the process). A descriptor naming another id is refused, logged at `warn`
//! (8-hex prefixes only) and counted (`identity_changes` in the status document), so a URL can
//! never hand out identities. The body is read in chunks and dropped at [`MAX_DESCRIPTOR_BODY`]
//! bytes, whatever it declares; the descriptor's lifetime is bounded by
//! [`descriptor::MAX_DESCRIPTOR_LIFETIME`] (checked by `Descriptor::verify`).
//!
//! A descriptor is kept only if it verifies (signature, window, onion key) when it is
//! accepted; lookups then only check its validity window, never the signature again. It is
//! used only while unexpired, and its endpoint only if it is a public IP (unless
//! `--allow-private-endpoints`). The table is bounded ([`MAX_PEERS`]). Nothing here is logged
//! beyond 8-hex id prefixes: no URL, no address, and `Debug` prints counts only.

pub mod cache;
mod urls;

pub use urls::PeerSpec;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::proto::NodeId;
use crate::proto::descriptor::{self, Descriptor};

/// Most peers remembered.
pub const MAX_PEERS: usize = 1024;
/// Wait between fetch rounds while a peer has no valid descriptor.
pub const RETRY: Duration = Duration::from_millis(250);
/// How long a starting node waits for every `--peer`'s descriptor before it says it is ready
/// anyway, and how long a send waits for them.
pub const READY_WAIT: Duration = Duration::from_secs(3);
/// Wait between fetch rounds once every peer has one, by default (`--peer-refresh`): every
/// `--peer` URL is fetched again each round, so an identity swapped behind one is caught
/// within a round (a new TLS handshake with another key, refused).
pub const ROUND: Duration = Duration::from_secs(60);

/// Largest descriptor body read; a longer one is dropped while it is read.
pub const MAX_DESCRIPTOR_BODY: usize = 4096;
/// A descriptor fetch must end within this.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a peer cannot be routed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerError {
    /// No descriptor.
    Unknown,
    /// Its descriptor expired.
    Expired,
    /// Its endpoint is not allowed.
    Endpoint,
    /// Its descriptor does not announce protocol v2 ([`descriptor::PROTOCOL`]): not routable.
    OldProtocol,
}

/// Where a held descriptor came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerSource {
    /// Fetched from a `--peer` URL (or put in by the operator's code): never bounded per
    /// address block.
    Bootstrap,
    /// Learned from another node's gossip ([`crate::gossip`]).
    Gossip,
    /// Read back from the peer store at start ([`cache`]), not yet fetched or gossiped again.
    Cache,
}

/// How many descriptors are held from each source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BySource {
    /// From `--peer` URLs.
    pub bootstrap: usize,
    /// From gossip.
    pub gossip: usize,
    /// From the peer store, not refreshed since the start.
    pub cache: usize,
}

/// A peer route choice may pick as a middle (`crate::send::path`): a routable descriptor and
/// its endpoint's address.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its descriptor.
    pub d: Descriptor,
    /// Its endpoint's address.
    pub ip: Option<IpAddr>,
    /// This node reached it at that endpoint once ([`Peers::mark_reached`]).
    pub reached: bool,
}

/// What the table knows of one peer ([`Peers::provenance`]).
#[derive(Debug, Clone, Copy)]
pub struct Provenance {
    /// Its descriptor's expiry.
    pub expires_at: u64,
    /// Where the descriptor came from.
    pub source: PeerSource,
    /// When this node last gossiped with it or learned its descriptor by gossip.
    pub last_gossip: Option<u64>,
    /// This node reached it at its endpoint once.
    pub reached: bool,
}

/// A held descriptor and where it came from.
#[derive(Debug, Clone)]
struct Held {
    d: Descriptor,
    source: PeerSource,
    /// The endpoint's address, parsed once when kept.
    ip: Option<IpAddr>,
    /// This node reached the peer at its endpoint once: its descriptor fetched from its own
    /// URL, a gossip exchange with it, or a route or probe through it that delivered. Only
    /// such peers are middles of this node's routes: an identity whose endpoint answers
    /// nothing never is.
    reached: bool,
    /// When this node last learned its descriptor by gossip, or exchanged gossip with it.
    last_gossip: Option<u64>,
    /// When this node first kept the identity (this process's time): gossip passes on the
    /// newest as news.
    learned_at: u64,
}

impl Held {
    /// `d` from `source` at `now`, replacing `old` if any: a fetch from its own URL reaches it,
    /// a known peer keeps what it had.
    fn new(d: Descriptor, source: PeerSource, old: Option<&Held>, now: u64) -> Held {
        Held {
            ip: descriptor::parse_endpoint(&d.endpoint).ok().map(|a| a.ip()),
            reached: source == PeerSource::Bootstrap || old.is_some_and(|h| h.reached),
            last_gossip: old.and_then(|h| h.last_gossip),
            learned_at: old.map_or(now, |h| h.learned_at),
            d,
            source,
        }
    }
}

/// Why a gossiped descriptor was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Already held, as new or newer.
    Held,
    /// Its address block already has the most gossiped identities it may have.
    Block,
    /// The table is full of current descriptors.
    Full,
    /// It does not verify, names this node, or has no parsable endpoint.
    Invalid,
}

/// The peer table.
pub struct Peers {
    /// Descriptors that verified when they were accepted.
    map: Mutex<HashMap<NodeId, Held>>,
    /// When a gossip round last got an answer (Unix seconds).
    last_gossip_at: AtomicU64,
    /// Bumped at every change of the table (the peer store is written when it moved).
    generation: AtomicU64,
    /// Set once a fetch round got every `--peer`'s descriptor; waiters woken then.
    fetched: AtomicBool,
    fetched_notify: Notify,
    /// Woken when an identity this node has not reached is kept (the reach probes try it at
    /// once).
    unreached_notify: Notify,
    /// Woken when a peer is reached for the first time (gossip passes it on as news).
    news_notify: Notify,
    /// The addresses of the descriptors' endpoints: known sources (`crate::sources`).
    endpoint_ips: Mutex<HashSet<IpAddr>>,
    /// Each `--peer` and the id it is pinned to (on the command line, or on first use).
    urls: Mutex<Vec<PeerSpec>>,
    /// Descriptors refused because a URL answered with another identity than its pinned one.
    identity_changes: Arc<crate::links::Refusals>,
    allow_private: bool,
    clock: Clock,
    self_id: NodeId,
    /// Every `--peer` URL is fetched again this often ([`ROUND`] unless told otherwise).
    refresh: Duration,
}

/// Counts only: no id, no URL.
impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("known", &self.lock().len())
            .field("urls", &self.urls().len())
            .field("allow_private", &self.allow_private)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// A table fed from `urls`.
    pub fn new(urls: Vec<PeerSpec>, allow_private: bool, clock: Clock, self_id: NodeId) -> Self {
        Peers {
            map: Mutex::new(HashMap::new()),
            last_gossip_at: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            fetched: AtomicBool::new(false),
            fetched_notify: Notify::new(),
            unreached_notify: Notify::new(),
            news_notify: Notify::new(),
            endpoint_ips: Mutex::new(HashSet::new()),
            urls: Mutex::new(urls),
            identity_changes: Arc::default(),
            allow_private,
            clock,
            self_id,
            refresh: ROUND,
        }
    }

    /// The table with every `--peer` URL fetched again every `refresh` (`--peer-refresh`):
    /// an identity swapped behind a URL is caught within it.
    #[must_use]
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh.max(RETRY);
        self
    }

    fn urls(&self) -> Vec<PeerSpec> {
        self.urls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Identity refusals (descriptors and TLS handshakes), shared with the links' TLS
    /// verifier.
    pub fn identity_counter(&self) -> Arc<crate::links::Refusals> {
        Arc::clone(&self.identity_changes)
    }

    /// Descriptors and TLS handshakes refused for another identity than the pinned one.
    pub fn identity_changes(&self) -> u64 {
        self.identity_changes.count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Held>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a descriptor from a `--peer` URL if it verifies now (the only signature check it
    /// ever gets) and is newer than the one held. True if kept.
    pub fn insert(&self, d: Descriptor) -> bool {
        self.insert_as(d, PeerSource::Bootstrap, |_| true).is_ok()
    }

    /// Adds a descriptor read back from the peer store if it verifies now, reached before or
    /// not. True if kept.
    pub fn restore(&self, d: Descriptor, reached: bool) -> bool {
        let id = d.node_id;
        let kept = self.insert_as(d, PeerSource::Cache, |_| true).is_ok();
        if kept && reached {
            self.mark_reached(&id);
        }
        kept
    }

    /// Every descriptor held, with its source and whether this node reached it.
    pub fn held(&self) -> Vec<(Descriptor, PeerSource, bool)> {
        self.lock()
            .values()
            .map(|h| (h.d.clone(), h.source, h.reached))
            .collect()
    }

    /// Notes that this node reached `id` at its endpoint (see [`Candidate::reached`]).
    pub fn mark_reached(&self, id: &NodeId) {
        let mut map = self.lock();
        if let Some(h) = map.get_mut(id)
            && !h.reached
        {
            h.reached = true;
            self.generation.fetch_add(1, Ordering::Relaxed);
            drop(map);
            self.news_notify.notify_one();
        }
    }

    /// Waits until a peer is reached for the first time: news gossip passes on (at once if one
    /// was since the last wait).
    pub async fn news_reached(&self) {
        self.news_notify.notified().await;
    }

    /// Notes a gossip exchange with `id`, or its descriptor learned by gossip, at `now`.
    pub fn note_gossip(&self, id: &NodeId, now: u64) {
        if let Some(h) = self.lock().get_mut(id) {
            h.last_gossip = Some(h.last_gossip.map_or(now, |t| t.max(now)));
        }
    }

    /// What the table knows of each peer, for peer health's rows.
    pub fn provenance(&self) -> HashMap<NodeId, Provenance> {
        self.lock()
            .iter()
            .map(|(id, h)| {
                let p = Provenance {
                    expires_at: h.d.expires_at,
                    source: h.source,
                    last_gossip: h.last_gossip,
                    reached: h.reached,
                };
                (*id, p)
            })
            .collect()
    }

    /// Every `--peer` URL with the identity pinned to it, if any yet.
    pub fn pins(&self) -> Vec<(String, NodeId)> {
        self.urls()
            .into_iter()
            .filter_map(|s| s.pinned.map(|id| (s.url, id)))
            .collect()
    }

    /// A number that moves at every change of the table.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Adds a gossiped descriptor, at most `per_block` gossiped identities per address block
    /// (`same_block` tells two endpoint addresses of one block apart), before its signature is
    /// checked: a flood of identities from one block costs a comparison each, not a signature
    /// check. A known peer's newer descriptor keeps its source (a cached one becomes gossiped).
    ///
    /// # Errors
    /// [`Refused`].
    pub fn insert_gossiped(
        &self,
        d: Descriptor,
        per_block: usize,
        same_block: impl Fn(IpAddr, IpAddr) -> bool,
    ) -> Result<(), Refused> {
        let ip = descriptor::parse_endpoint(&d.endpoint)
            .map_err(|_| Refused::Invalid)?
            .ip();
        let id = d.node_id;
        self.insert_as(d, PeerSource::Gossip, |map| {
            let in_block = map
                .iter()
                .filter(|(k, h)| **k != id && h.source == PeerSource::Gossip)
                .filter_map(|(_, h)| h.ip)
                .filter(|a| same_block(*a, ip))
                .count();
            in_block < per_block
        })
    }

    /// Keeps `d` as from `source` if `admit` lets a new identity in (asked under the table's
    /// lock before the signature check, and again when it is kept), it verifies, and it is
    /// newer than the one held.
    fn insert_as(
        &self,
        d: Descriptor,
        source: PeerSource,
        admit: impl Fn(&HashMap<NodeId, Held>) -> bool,
    ) -> Result<(), Refused> {
        let now = self.clock.unix();
        if d.node_id == self.self_id {
            return Err(Refused::Invalid);
        }
        let source = {
            let mut map = self.lock();
            match map.get_mut(&d.node_id) {
                // The same descriptor from the peer's own URL, learned by gossip first: a
                // bootstrap peer, reached, from now on.
                Some(old) if old.d.issued_at >= d.issued_at => {
                    if source == PeerSource::Bootstrap && old.source != PeerSource::Bootstrap {
                        old.source = PeerSource::Bootstrap;
                        old.reached = true;
                        self.generation.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(Refused::Held);
                }
                // A --peer fetch makes a peer a bootstrap one; gossip or the store keep what
                // it was, but a cached descriptor refreshed by gossip is gossip's now.
                Some(old) => match (source, old.source) {
                    (PeerSource::Bootstrap, _) => PeerSource::Bootstrap,
                    (PeerSource::Gossip, PeerSource::Cache) => PeerSource::Gossip,
                    _ => old.source,
                },
                None => {
                    if map.len() >= MAX_PEERS {
                        map.retain(|_, v| v.d.expires_at > now);
                        if map.len() >= MAX_PEERS {
                            return Err(Refused::Full);
                        }
                    }
                    if !admit(&map) {
                        return Err(Refused::Block);
                    }
                    source
                }
            }
        };
        d.verify(now).map_err(|_| Refused::Invalid)?;
        let mut map = self.lock();
        if map
            .get(&d.node_id)
            .is_some_and(|old| old.d.issued_at >= d.issued_at)
        {
            return Err(Refused::Held);
        }
        if !map.contains_key(&d.node_id) {
            if map.len() >= MAX_PEERS {
                return Err(Refused::Full);
            }
            if !admit(&map) {
                return Err(Refused::Block);
            }
        }
        let id = d.node_id;
        let held = Held::new(d, source, map.get(&id), now);
        let new_unreached = !map.contains_key(&id) && !held.reached;
        map.insert(id, held);
        self.generation.fetch_add(1, Ordering::Relaxed);
        let ips = map.values().filter_map(|h| h.ip).collect();
        drop(map);
        *self.endpoint_ips.lock().unwrap_or_else(|p| p.into_inner()) = ips;
        if new_unreached {
            self.unreached_notify.notify_one();
        }
        Ok(())
    }

    /// True when a descriptor of `id` is held, current or not.
    pub fn holds(&self, id: &NodeId) -> bool {
        self.lock().contains_key(id)
    }

    /// True once a fetch round got every `--peer`'s descriptor.
    pub fn is_fetched(&self) -> bool {
        self.fetched.load(Ordering::Acquire)
    }

    /// Waits until a fetch round got every `--peer`'s descriptor, at most `within`; true if it
    /// did.
    pub async fn fetched(&self, within: Duration) -> bool {
        let deadline = crate::clock::now() + within;
        loop {
            let woken = self.fetched_notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.fetched.load(Ordering::Acquire) {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return self.fetched.load(Ordering::Acquire);
            }
        }
    }

    /// Waits until an identity this node has not reached is kept (at once if one was since the
    /// last wait).
    pub async fn unreached_kept(&self) {
        self.unreached_notify.notified().await;
    }

    /// Descriptors held by where they came from.
    pub fn by_source(&self) -> BySource {
        let mut n = BySource::default();
        for h in self.lock().values() {
            match h.source {
                PeerSource::Bootstrap => n.bootstrap += 1,
                PeerSource::Gossip => n.gossip += 1,
                PeerSource::Cache => n.cache += 1,
            }
        }
        n
    }

    /// Notes that a gossip round got an answer at `now`.
    pub fn gossiped(&self, now: u64) {
        self.last_gossip_at.store(now, Ordering::Relaxed);
    }

    /// When a gossip round last got an answer (Unix seconds), if ever.
    pub fn last_gossip_at(&self) -> Option<u64> {
        Some(self.last_gossip_at.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }

    /// True when `ip` is the address of a peer's descriptor endpoint.
    pub fn is_endpoint_ip(&self, ip: &IpAddr) -> bool {
        self.endpoint_ips
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(ip)
    }

    /// The relay URL of `id`, if it can be routed to at `now`.
    ///
    /// # Errors
    /// [`PeerError`].
    pub fn route(&self, id: &NodeId, now: u64) -> Result<String, PeerError> {
        let d = self.descriptor(id, now)?;
        if d.protocol != descriptor::PROTOCOL {
            return Err(PeerError::OldProtocol);
        }
        Ok(format!("{}/v2/relay", d.endpoint.trim_end_matches('/')))
    }

    /// The descriptor of `id`, verified when it was accepted, if still current at `now` and
    /// with an allowed endpoint.
    ///
    /// # Errors
    /// [`PeerError`].
    pub fn descriptor(&self, id: &NodeId, now: u64) -> Result<Descriptor, PeerError> {
        let d = self
            .lock()
            .get(id)
            .map(|h| h.d.clone())
            .ok_or(PeerError::Unknown)?;
        if !d.is_current(now) {
            return Err(PeerError::Expired);
        }
        let addr = descriptor::parse_endpoint(&d.endpoint).map_err(|_| PeerError::Endpoint)?;
        if !self.allow_private && !descriptor::is_public(addr.ip()) {
            return Err(PeerError::Endpoint);
        }
        Ok(d)
    }

    /// Every peer that can be routed to now (a current v2 descriptor, an allowed endpoint).
    pub fn routable(&self, now: u64) -> Vec<Descriptor> {
        let ids: Vec<NodeId> = self.lock().keys().copied().collect();
        ids.iter()
            .filter_map(|id| self.descriptor(id, now).ok())
            .filter(|d| d.protocol == descriptor::PROTOCOL)
            .collect()
    }

    /// Every peer that can be routed to now, with its endpoint's address: route choice's
    /// candidates (`crate::send::path`).
    pub fn candidates(&self, now: u64) -> Vec<Candidate> {
        let held: Vec<(NodeId, Option<IpAddr>, bool)> = self
            .lock()
            .iter()
            .map(|(id, h)| (*id, h.ip, h.reached))
            .collect();
        held.into_iter()
            .filter_map(|(id, ip, reached)| Some((self.descriptor(&id, now).ok()?, ip, reached)))
            .filter(|(d, _, _)| d.protocol == descriptor::PROTOCOL)
            .map(|(d, ip, reached)| Candidate { d, ip, reached })
            .collect()
    }

    /// The identities first kept at `since` or later that this node reached and can route to
    /// now, newest first, at most `max`: what gossip passes on as news.
    pub fn news(&self, now: u64, since: u64, max: usize) -> Vec<Descriptor> {
        let mut fresh: Vec<(u64, NodeId)> = self
            .lock()
            .iter()
            .filter(|(_, h)| h.learned_at >= since && h.reached)
            .map(|(id, h)| (h.learned_at, *id))
            .collect();
        fresh.sort_unstable_by(|a, b| b.cmp(a));
        fresh
            .into_iter()
            .filter_map(|(_, id)| self.descriptor(&id, now).ok())
            .filter(|d| d.protocol == descriptor::PROTOCOL)
            .take(max)
            .collect()
    }

    /// Every descriptor held, valid or not (status).
    pub fn all(&self) -> Vec<Descriptor> {
        self.lock().values().map(|h| h.d.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::links::Links;

    const T0: u64 = 1_800_000_000;

    fn onion_key() -> [u8; 32] {
        x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([5u8; 32])).to_bytes()
    }

    #[test]
    fn a_descriptor_is_verified_once_then_used_while_current() {
        let clock = Clock::starting_at(T0);
        let peers = Peers::new(vec![], true, clock, [0; 32]);
        let key = SigningKey::from_bytes(&[1; 32]);
        let id = key.verifying_key().to_bytes();
        let d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
        let mut forged = d.clone();
        forged.issued_at += 1;
        assert!(
            !peers.insert(forged),
            "a bad signature is refused when accepted"
        );
        assert_eq!(peers.descriptor(&id, T0), Err(PeerError::Unknown));
        assert!(peers.insert(d.clone()));
        assert_eq!(peers.descriptor(&id, T0 + 3599), Ok(d));
        assert_eq!(
            peers.route(&id, T0).as_deref(),
            Ok("https://127.0.0.9:7001/v2/relay")
        );
        assert_eq!(peers.descriptor(&id, T0 + 3600), Err(PeerError::Expired));
        assert!(peers.routable(T0 + 3600).is_empty());
        assert!(!format!("{peers:?}").contains("127.0.0.9"));
    }

    /// A peer that changes its onion key mid-traffic: its newer descriptor replaces the held
    /// one at once, an older one (a replayed fetch) never brings the former key back, and once
    /// the newer one expires the peer is not routable until it is fetched again.
    #[tokio::test(start_paused = true)]
    async fn a_newer_descriptor_with_another_onion_key_replaces_the_held_one() {
        let clock = Clock::starting_at(T0);
        let peers = Peers::new(vec![], true, clock, [0; 32]);
        let key = SigningKey::from_bytes(&[3; 32]);
        let id = key.verifying_key().to_bytes();
        let other_key =
            x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([6u8; 32])).to_bytes();
        let old = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
        assert!(peers.insert(old.clone()));
        tokio::time::advance(std::time::Duration::from_secs(60)).await;
        let new = Descriptor::sign(&key, other_key, "https://127.0.0.9:7001", T0 + 60, 3600);
        assert!(peers.insert(new.clone()));
        assert_eq!(
            peers.descriptor(&id, T0 + 60).map(|d| d.onion_key),
            Ok(other_key)
        );
        assert!(!peers.insert(old), "an older descriptor does not come back");
        assert_eq!(peers.descriptor(&id, T0 + 61), Ok(new));
        assert_eq!(peers.descriptor(&id, T0 + 3660), Err(PeerError::Expired));
        assert!(peers.routable(T0 + 3660).is_empty());
    }

    #[test]
    fn a_peer_without_protocol_2_is_known_but_not_routable() {
        use ed25519_dalek::Signer;
        let clock = Clock::starting_at(T0);
        let peers = Peers::new(vec![], true, clock, [0; 32]);
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
        d.protocol = 0;
        d.signature = key.sign(&d.signing_bytes()).to_bytes();
        assert!(peers.insert(d.clone()), "a v1 descriptor still verifies");
        assert_eq!(peers.descriptor(&d.node_id, T0), Ok(d.clone()));
        assert_eq!(peers.route(&d.node_id, T0), Err(PeerError::OldProtocol));
        assert!(peers.routable(T0).is_empty());
        let v2 = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0 + 1, 3600);
        assert!(peers.insert(v2));
        assert_eq!(peers.routable(T0 + 1).len(), 1);
    }

    #[test]
    fn private_endpoints_only_when_allowed() {
        let clock = Clock::starting_at(T0);
        let strict = Peers::new(vec![], false, clock, [0; 32]);
        let key = SigningKey::from_bytes(&[2; 32]);
        let d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
        assert!(strict.insert(d.clone()));
        assert_eq!(strict.descriptor(&d.node_id, T0), Err(PeerError::Endpoint));
    }

    #[test]
    fn gossiped_identities_are_bounded_per_block_and_checked_before_their_signature() {
        let peers = Peers::new(vec![], true, Clock::starting_at(T0), [0; 32]);
        let same = |a: IpAddr, b: IpAddr| match (a, b) {
            (IpAddr::V4(a), IpAddr::V4(b)) => a.octets()[..3] == b.octets()[..3],
            _ => false,
        };
        let d = |seed: u8, host: u8| {
            Descriptor::sign(
                &SigningKey::from_bytes(&[seed; 32]),
                onion_key(),
                format!("https://127.9.9.{host}:7001"),
                T0,
                3600,
            )
        };
        assert_eq!(peers.insert_gossiped(d(1, 1), 2, same), Ok(()));
        assert_eq!(peers.insert_gossiped(d(2, 2), 2, same), Ok(()));
        assert_eq!(peers.insert_gossiped(d(3, 3), 2, same), Err(Refused::Block));
        let mut forged = d(4, 4);
        forged.issued_at += 1;
        assert_eq!(
            peers.insert_gossiped(forged, 2, same),
            Err(Refused::Block),
            "refused by its block before its signature is checked"
        );
        assert_eq!(peers.insert_gossiped(d(1, 1), 2, same), Err(Refused::Held));
        // The operator's --peer is not bounded per block.
        assert!(peers.insert(d(5, 5)));
        assert_eq!(
            peers.by_source(),
            BySource {
                bootstrap: 1,
                gossip: 2,
                cache: 0
            }
        );
        // Another block is counted apart.
        let other = Descriptor::sign(
            &SigningKey::from_bytes(&[6; 32]),
            onion_key(),
            "https://127.9.10.1:7001",
            T0,
            3600,
        );
        assert_eq!(peers.insert_gossiped(other, 2, same), Ok(()));
        assert!(peers.holds(&SigningKey::from_bytes(&[6; 32]).verifying_key().to_bytes()));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_waits_for_the_first_complete_fetch_round_bounded() {
        let peers = Arc::new(Peers::new(vec![], true, Clock::starting_at(T0), [0; 32]));
        assert!(!peers.fetched(Duration::from_secs(1)).await, "bounded");
        let links = Links::new(
            None,
            Arc::default(),
            crate::links::LinkLimits {
                idle_per_peer: 1,
                clients: 1,
            },
            None,
        );
        let cancel = CancellationToken::new();
        let run = tokio::spawn(Arc::clone(&peers).run(links, cancel.clone()));
        assert!(
            peers.fetched(Duration::from_secs(1)).await,
            "no --peer: ready at once"
        );
        cancel.cancel();
        run.await.unwrap();
    }
}
