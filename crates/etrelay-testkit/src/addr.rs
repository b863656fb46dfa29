//! Fresh loopback addresses for test peers.
//!
//! All of 127.0.0.0/8 is routed to `lo` on Linux, so every test can bind its
//! own address and keep the usual ports (27960, 27950) without colliding with
//! other tests. Game servers also rate-limit per source IP, so a fresh source
//! address gives a test a fresh bucket.
//!
//! Addresses are never in 127.0.0.0/16 (that range, with 127.0.0.1, is what
//! people and other tools use by hand), and the last octet is never 0 or 255.

use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Second octet: 1..=255 (255 values).
const SECOND: u32 = 255;
/// Third octet: 0..=255.
const THIRD: u32 = 256;
/// Fourth octet: 1..=254.
const FOURTH: u32 = 254;
/// Number of usable addresses.
const SPACE: u32 = SECOND * THIRD * FOURTH;

/// Calls so far in this process.
static COUNTER: AtomicU32 = AtomicU32::new(0);
/// Where this process starts in the address space.
static BASE: OnceLock<u32> = OnceLock::new();

/// A process-specific starting point: the pid and the start time, mixed.
fn base() -> u32 {
    *BASE.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = u64::from(std::process::id()) ^ nanos.rotate_left(29);
        SmallRng::seed_from_u64(seed).random_range(0..SPACE)
    })
}

/// Maps an index in `0..SPACE` to an address.
fn from_index(index: u32) -> Ipv4Addr {
    let fourth = index % FOURTH;
    let rest = index / FOURTH;
    let third = rest % THIRD;
    let second = rest / THIRD;
    Ipv4Addr::new(127, (second + 1) as u8, third as u8, (fourth + 1) as u8)
}

/// A fresh 127.x.y.z address: distinct from every other address returned in
/// this process (for the first ~16.5 million calls), never in 127.0.0.0/16,
/// never ending in .0 or .255.
///
/// The sequence starts at a point derived from the pid and the start time, so
/// two test processes running at the same time are very unlikely to overlap.
pub fn unique_ip() -> Ipv4Addr {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    from_index((base() + n % SPACE) % SPACE)
}

/// `n` fresh addresses, see [`unique_ip`].
pub fn unique_ips(n: usize) -> Vec<Ipv4Addr> {
    (0..n).map(|_| unique_ip()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn distinct_and_in_range() {
        let ips = unique_ips(5000);
        let set: HashSet<_> = ips.iter().collect();
        assert_eq!(set.len(), ips.len());
        for ip in ips {
            let o = ip.octets();
            assert_eq!(o[0], 127);
            assert_ne!(o[1], 0, "{ip}");
            assert!(o[3] != 0 && o[3] != 255, "{ip}");
        }
    }

    #[test]
    fn index_mapping_covers_edges() {
        assert_eq!(from_index(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(from_index(SPACE - 1), Ipv4Addr::new(127, 255, 255, 254));
    }
}
