//! Sources: who a connection or a request comes from, as far as the network says, and the
//! bounded per-source tables the relay listener shares its capacity with.
//!
//! A request's **source** is its peer address, grouped: an IPv4 address by its /24 and an IPv6
//! address by its /56 (`--source-prefix-v4`, `--source-prefix-v6`), so one party with a block of
//! addresses counts once. A **known** source is keyed by its exact address and gets a reserved
//! share unknown sources cannot take: the address of a peer's descriptor endpoint, or an address
//! a request recently came from whose previous hop authenticated as a known peer (a verified
//! previous hop, remembered for [`VERIFIED_TTL`]). A stranger's key, however valid its
//! signatures, never makes its address known.
//!
//! [`SourceKey`] and [`Source`] never print an address: their `Debug` says only the class.
//! Nothing here logs, and the tables only ever expose counts (status, metrics).

pub mod fair;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::peers::Peers;

/// IPv4 sources are grouped by this prefix length unless told otherwise.
pub const DEFAULT_V4_PREFIX: u8 = 24;
/// IPv6 sources are grouped by this prefix length unless told otherwise.
pub const DEFAULT_V6_PREFIX: u8 = 56;
/// An address whose request authenticated and was accepted stays known this long.
pub const VERIFIED_TTL: Duration = Duration::from_secs(600);
/// Verified previous-hop addresses remembered at most.
pub const MAX_VERIFIED: usize = 1024;

/// Whose share a request or a connection draws on. Never printed with its address.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKey {
    /// A known peer's exact address.
    Known(IpAddr),
    /// An unknown source's address block (the prefix, host bits zero).
    Net(IpAddr),
}

impl SourceKey {
    /// True for a known peer.
    pub fn is_known(&self) -> bool {
        matches!(self, SourceKey::Known(_))
    }
}

impl fmt::Debug for SourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_known() {
            "SourceKey(known)"
        } else {
            "SourceKey(unknown)"
        })
    }
}

/// A request's source: its exact address (to remember it as a verified previous hop) and its
/// key. Never printed with its address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Source {
    ip: IpAddr,
    key: SourceKey,
}

impl Source {
    /// The key the request's shares are counted under.
    pub fn key(&self) -> SourceKey {
        self.key
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source").field("key", &self.key).finish()
    }
}

use crate::blocks::canonical;
pub use crate::blocks::{Grouping, block};

impl Default for Grouping {
    fn default() -> Self {
        Grouping {
            v4_prefix: DEFAULT_V4_PREFIX,
            v6_prefix: DEFAULT_V6_PREFIX,
        }
    }
}

/// Tells known sources from unknown ones and groups the unknown.
pub struct Classifier {
    grouping: Grouping,
    peers: Arc<Peers>,
    /// Verified previous hops: address → known until.
    verified: Mutex<HashMap<IpAddr, Instant>>,
}

/// Counts only.
impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("grouping", &self.grouping)
            .field("verified", &lock(&self.verified).len())
            .finish_non_exhaustive()
    }
}

impl Classifier {
    /// A classifier over the peer table.
    pub fn new(grouping: Grouping, peers: Arc<Peers>) -> Self {
        Classifier {
            grouping,
            peers,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The source of a request or connection from `ip` at `now`.
    pub fn classify(&self, ip: IpAddr, now: Instant) -> Source {
        let ip = canonical(ip);
        let known = self.peers.is_endpoint_ip(&ip)
            || lock(&self.verified)
                .get(&ip)
                .is_some_and(|until| now < *until);
        let key = if known {
            SourceKey::Known(ip)
        } else {
            SourceKey::Net(block(ip, self.grouping))
        };
        Source { ip, key }
    }

    /// Remembers `source` as a verified previous hop until `now + VERIFIED_TTL`. At most
    /// [`MAX_VERIFIED`] addresses: expired ones make room, and when none has expired the new
    /// one is not remembered (it stays unknown, nothing else changes).
    pub fn verified(&self, source: &Source, now: Instant) {
        let mut v = lock(&self.verified);
        if v.len() >= MAX_VERIFIED && !v.contains_key(&source.ip) {
            v.retain(|_, until| now < *until);
            if v.len() >= MAX_VERIFIED {
                return;
            }
        }
        v.insert(source.ip, now + VERIFIED_TTL);
    }

    /// Forgets expired verified addresses.
    pub fn sweep(&self, now: Instant) {
        lock(&self.verified).retain(|_, until| now < *until);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Things held per source at once (open connections, requests in flight): a total, a cap per
/// source, and a share reserved for known sources ([`SourceKey::is_known`]). The one table both
/// relays' listeners count with ([`listener::Table`]), keyed here by source.
pub type CountTable = listener::Table<SourceKey>;
/// One slot of a [`CountTable`], given back on drop.
pub type Held = listener::Slot<SourceKey>;
pub use listener::{Limits as CountLimits, Refusal as CountRefusal};

/// A known source takes the share reserved for known sources.
impl listener::Key for SourceKey {
    fn reserved(&self) -> bool {
        self.is_known()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_of_24_and_56_and_mapped_addresses() {
        let g = Grouping::default();
        assert_eq!(block(ip("192.0.2.77"), g), ip("192.0.2.0"));
        assert_eq!(block(ip("::ffff:192.0.2.77"), g), ip("192.0.2.0"));
        assert_eq!(block(ip("2001:db8:1:2ff:1::9"), g), ip("2001:db8:1:200::"));
        let exact = Grouping {
            v4_prefix: 32,
            v6_prefix: 128,
        };
        assert_eq!(block(ip("192.0.2.77"), exact), ip("192.0.2.77"));
        let all = Grouping {
            v4_prefix: 0,
            v6_prefix: 0,
        };
        assert_eq!(block(ip("192.0.2.77"), all), ip("0.0.0.0"));
    }

    #[test]
    fn verified_hops_are_known_by_exact_address_for_a_while() {
        let clock = Clock::starting_at(1_800_000_000);
        let peers = Arc::new(Peers::new(vec![], true, clock, [0; 32]));
        let c = Classifier::new(Grouping::default(), peers);
        let t0 = clock.instant();
        let s = c.classify(ip("198.51.100.7"), t0);
        assert_eq!(s.key(), SourceKey::Net(ip("198.51.100.0")));
        assert_eq!(format!("{s:?}"), "Source { key: SourceKey(unknown) }");
        c.verified(&s, t0);
        assert_eq!(
            c.classify(ip("198.51.100.7"), t0).key(),
            SourceKey::Known(ip("198.51.100.7"))
        );
        // Its neighbours are not.
        assert!(!c.classify(ip("198.51.100.8"), t0).key().is_known());
        assert!(
            !c.classify(ip("198.51.100.7"), t0 + VERIFIED_TTL)
                .key()
                .is_known()
        );
    }

    #[test]
    fn count_table_caps_per_source_and_reserves_for_known() {
        let t = CountTable::new(CountLimits {
            total: 4,
            per_source: 2,
            reserved: 1,
        });
        let a = SourceKey::Net(ip("10.0.0.0"));
        let b = SourceKey::Net(ip("10.0.1.0"));
        let k = SourceKey::Known(ip("10.0.2.9"));
        let a1 = t.acquire(a).unwrap();
        let _a2 = t.acquire(a).unwrap();
        assert_eq!(t.acquire(a).unwrap_err(), CountRefusal::Source);
        let _b1 = t.acquire(b).unwrap();
        assert_eq!(
            t.acquire(b).unwrap_err(),
            CountRefusal::Total,
            "the last slot is reserved for known sources"
        );
        let _k1 = t.acquire(k).unwrap();
        assert_eq!(t.acquire(k).unwrap_err(), CountRefusal::Total);
        drop(a1);
        assert_eq!((t.held(), t.sources()), (3, 3));
        assert!(t.acquire(k).is_ok());
    }
}
