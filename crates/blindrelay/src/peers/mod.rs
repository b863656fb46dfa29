//! Known peers: the node's view of the network ([`crate::discovery`]'s machine, behind one
//! lock), fed by the operator's `--peer` URLs (fetched, verified, fetched again every
//! `--peer-refresh`), the peer store at start, and discovery.
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
//! routable only while unexpired, once this node reached it, and its endpoint only if it is a
//! public IP (unless `--allow-private-endpoints`). Nothing here is logged beyond 8-hex id
//! prefixes: no URL, no address, and `Debug` prints counts only.

pub mod cache;
pub mod seeds;
mod urls;

pub use urls::{BadPeer, PeerSpec};

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::discovery::{self, Discovery, Now, Signed};
use crate::proto::NodeId;
use crate::proto::descriptor::{self, Descriptor};

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

/// Where a held descriptor came from, as the status document and the peer store name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerSource {
    /// The operator's `--peer` or seed.
    Bootstrap,
    /// Discovery: a peer's answer or push, or a stranger's own.
    Gossip,
    /// The peer store, at start.
    Cache,
}

/// How many descriptors are held from each source, and how many wait to be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BySource {
    /// From `--peer` URLs and seeds.
    pub bootstrap: usize,
    /// From discovery.
    pub gossip: usize,
    /// From the peer store.
    pub cache: usize,
    /// Held, not reached yet.
    pub waiting: usize,
}

/// A peer route choice may pick as a middle (`crate::send::path`).
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its descriptor.
    pub s: Arc<Signed>,
    /// This node reached it at that endpoint.
    pub reached: bool,
    /// When this node first kept it (Unix seconds).
    pub first_seen: u64,
}

impl Candidate {
    /// Its descriptor.
    pub fn d(&self) -> &Descriptor {
        &self.s.d
    }

    /// Its endpoint's address.
    pub fn ip(&self) -> Option<IpAddr> {
        self.s.ip
    }
}

/// What the table knows of one peer ([`Peers::provenance`]).
#[derive(Debug, Clone, Copy)]
pub struct Provenance {
    /// Its descriptor's expiry.
    pub expires_at: u64,
    /// Where the descriptor came from.
    pub source: PeerSource,
    /// When this node last reached it.
    pub last_reached: Option<u64>,
    /// This node reached it at its endpoint.
    pub reached: bool,
}

/// The peer table.
pub struct Peers {
    disc: Mutex<Discovery>,
    /// Bumped at every change the peer store cares for.
    generation: AtomicU64,
    /// Set once a fetch round got every `--peer`'s descriptor; waiters woken then.
    fetched: AtomicBool,
    /// Set once the first fetch round is over (each `--peer` answered or failed).
    tried: AtomicBool,
    fetched_notify: Notify,
    /// Wakes discovery's driver (something to send).
    wake: Notify,
    /// The addresses of the descriptors' endpoints (known sources, `crate::sources`), built
    /// again at most once a second when the view moved.
    endpoint_ips: Mutex<(u64, Option<crate::clock::Instant>, Arc<HashSet<IpAddr>>)>,
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
            .field("known", &self.lock().view().len())
            .field("urls", &self.urls().len())
            .field("allow_private", &self.allow_private)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// A table fed from `urls`, discovery paced for the default interval.
    pub fn new(urls: Vec<PeerSpec>, allow_private: bool, clock: Clock, self_id: NodeId) -> Self {
        let cfg = discovery::Config::for_interval(discovery::DEFAULT_INTERVAL);
        Peers {
            disc: Mutex::new(Discovery::new(self_id, cfg, rand::random())),
            generation: AtomicU64::new(0),
            fetched: AtomicBool::new(false),
            tried: AtomicBool::new(false),
            fetched_notify: Notify::new(),
            wake: Notify::new(),
            endpoint_ips: Mutex::new((u64::MAX, None, Arc::default())),
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

    /// The table with discovery paced by `cfg` (set before anything is held).
    #[must_use]
    pub fn with_discovery(self, cfg: discovery::Config) -> Self {
        *self.lock() = Discovery::new(self.self_id, cfg, rand::random());
        self
    }

    fn urls(&self) -> Vec<PeerSpec> {
        self.urls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The discovery machine, locked.
    pub fn lock(&self) -> MutexGuard<'_, Discovery> {
        self.disc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The time as discovery takes it.
    pub fn now(&self) -> Now {
        Now {
            at: self.clock.instant(),
            unix: self.clock.unix(),
        }
    }

    /// Notes a change the peer store should write, and wakes discovery's driver.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Waits until there may be something for discovery to send.
    pub async fn woken(&self) {
        self.wake.notified().await;
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

    /// Adds a descriptor the operator's `--peer` (or seed) served from its own URL if it
    /// verifies now (the only signature check it ever gets); reached, so routable. True if
    /// it was new (a newer descriptor, or a new identity) and is held now.
    pub fn insert(&self, d: Descriptor) -> bool {
        let now = self.now();
        if d.node_id == self.self_id || d.verify(now.unix).is_err() {
            return false;
        }
        let (id, at) = (d.node_id, d.issued_at);
        let s = Arc::new(Signed::trusted(d));
        let kept = {
            let mut disc = self.lock();
            let before = disc.view().get(&id).map(|e| e.s.d.issued_at);
            disc.operator(s, now);
            before.is_none_or(|b| b < at)
                && disc.view().get(&id).is_some_and(|e| e.s.d.issued_at == at)
        };
        self.changed();
        kept
    }

    /// Adds the entries read back from the peer store (verified by the caller), each through
    /// the view's bounds, under one lock and with one notification; how many were kept.
    pub fn restore_all(
        &self,
        entries: impl IntoIterator<Item = (Arc<Signed>, crate::discovery::Kept)>,
    ) -> usize {
        let now = self.now();
        let kept = {
            let mut disc = self.lock();
            entries
                .into_iter()
                .filter(|(s, kept)| disc.restore(Arc::clone(s), *kept, now))
                .count()
        };
        if kept > 0 {
            self.changed();
        }
        kept
    }

    /// Notes that this node reached `id` at its endpoint (a route or probe through it
    /// delivered).
    pub fn mark_reached(&self, id: &NodeId) {
        let now = self.now();
        let first = {
            let mut disc = self.lock();
            let before = disc.view().get(id).and_then(|e| e.reached());
            disc.reached(id, now);
            before.is_none()
        };
        if first {
            self.changed();
        }
    }

    /// Notes that a contact with `id` failed.
    pub fn mark_failed(&self, id: &NodeId) {
        self.lock().view_mut().failed(id);
    }

    /// What the table knows of each peer, for peer health's rows.
    pub fn provenance(&self) -> HashMap<NodeId, Provenance> {
        let disc = self.lock();
        let view = disc.view();
        view.iter()
            .map(|e| {
                let p = Provenance {
                    expires_at: e.s.d.expires_at,
                    source: source_of(view.origin(e)),
                    last_reached: e.reached(),
                    reached: e.reached().is_some(),
                };
                (*e.id(), p)
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

    /// True when a descriptor of `id` is held, current or not.
    pub fn holds(&self, id: &NodeId) -> bool {
        self.lock().view().get(id).is_some()
    }

    /// True once a fetch round got every `--peer`'s descriptor.
    pub fn is_fetched(&self) -> bool {
        self.fetched.load(Ordering::Acquire)
    }

    /// Waits until a fetch round got every `--peer`'s descriptor, at most `within`; true if it
    /// did.
    pub async fn fetched(&self, within: Duration) -> bool {
        self.wait_for(&self.fetched, within).await
    }

    /// Waits until the first fetch round is over, each `--peer` answered or failed (a dead
    /// seed does not hold discovery back), at most `within`; true if it is.
    pub async fn tried(&self, within: Duration) -> bool {
        self.wait_for(&self.tried, within).await
    }

    async fn wait_for(&self, flag: &AtomicBool, within: Duration) -> bool {
        let deadline = crate::clock::now() + within;
        loop {
            let woken = self.fetched_notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if flag.load(Ordering::Acquire) {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return flag.load(Ordering::Acquire);
            }
        }
    }

    /// Descriptors held by where they came from.
    pub fn by_source(&self) -> BySource {
        let disc = self.lock();
        let view = disc.view();
        let mut n = BySource {
            waiting: view.waiting(),
            ..BySource::default()
        };
        for e in view.iter() {
            match source_of(view.origin(e)) {
                PeerSource::Bootstrap => n.bootstrap += 1,
                PeerSource::Gossip => n.gossip += 1,
                PeerSource::Cache => n.cache += 1,
            }
        }
        n
    }

    /// When a reconciliation last completed (Unix seconds), if ever.
    pub fn last_gossip_at(&self) -> Option<u64> {
        self.lock().last_sync()
    }

    /// True when `ip` is the address of a peer's descriptor endpoint.
    pub fn is_endpoint_ip(&self, ip: &IpAddr) -> bool {
        let generation = self.generation();
        let now = crate::clock::now();
        let mut cached = self.endpoint_ips.lock().unwrap_or_else(|p| p.into_inner());
        // Built again when the view moved: at once while it is small, at most once a second
        // when it is large (each build is a pass over it).
        let large = cached.2.len() > 4096;
        let fresh = cached.0 == generation
            || (large
                && cached
                    .1
                    .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)));
        if !fresh {
            let ips: HashSet<IpAddr> = self.lock().view().iter().filter_map(|e| e.s.ip).collect();
            *cached = (generation, Some(now), Arc::new(ips));
        }
        cached.2.contains(ip)
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
        let s = self
            .lock()
            .view()
            .get(id)
            .map(|e| Arc::clone(&e.s))
            .ok_or(PeerError::Unknown)?;
        self.usable(&s, now)?;
        Ok(s.d.clone())
    }

    fn usable(&self, s: &Signed, now: u64) -> Result<(), PeerError> {
        if !s.d.is_current(now) {
            return Err(PeerError::Expired);
        }
        let ip = s.ip.ok_or(PeerError::Endpoint)?;
        if !self.allow_private && !descriptor::is_public(ip) {
            return Err(PeerError::Endpoint);
        }
        Ok(())
    }

    /// How many peers can be routed to now: reached, a current v2 descriptor, an allowed
    /// endpoint.
    pub fn routable_count(&self, now: u64) -> usize {
        self.candidates(now).len()
    }

    /// Every peer that can be routed to now (see [`Peers::routable_count`]).
    pub fn routable(&self, now: u64) -> Vec<Descriptor> {
        self.candidates(now)
            .into_iter()
            .map(|c| c.s.d.clone())
            .collect()
    }

    /// Every peer route choice may take now: reached, a current v2 descriptor, an allowed
    /// endpoint; with when this node first kept it.
    pub fn candidates(&self, now: u64) -> Vec<Candidate> {
        let held: Vec<Candidate> = self
            .lock()
            .view()
            .iter()
            .filter(|e| e.reached().is_some() && e.s.d.protocol == descriptor::PROTOCOL)
            .map(|e| Candidate {
                s: Arc::clone(&e.s),
                reached: true,
                first_seen: e.first_seen(),
            })
            .collect();
        held.into_iter()
            .filter(|c| self.usable(&c.s, now).is_ok())
            .collect()
    }
}

/// The status document's and the store's name for an origin.
fn source_of(o: discovery::view::Origin) -> PeerSource {
    if o.is_operator() {
        PeerSource::Bootstrap
    } else if o == discovery::view::Origin::STORE {
        PeerSource::Cache
    } else {
        PeerSource::Gossip
    }
}

#[cfg(test)]
mod tests;
