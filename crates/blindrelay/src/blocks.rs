//! Address blocks: an address with its host bits cleared, by prefix length per family. The
//! unit every bound by address counts in (sources, gossiped identities, route diversity). A leaf
//! module: pure functions, no state.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How addresses are grouped into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouping {
    /// IPv4 prefix length (0–32).
    pub v4_prefix: u8,
    /// IPv6 prefix length (0–128).
    pub v6_prefix: u8,
}

/// `ip` with its host bits cleared (IPv4-mapped IPv6 addresses count as IPv4).
pub fn block(ip: IpAddr, g: Grouping) -> IpAddr {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = u32::from(g.v4_prefix.min(32));
            let mask = if keep == 0 {
                0
            } else {
                u32::MAX << (32 - keep)
            };
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = u32::from(g.v6_prefix.min(128));
            let mask = if keep == 0 {
                0
            } else {
                u128::MAX << (128 - keep)
            };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

/// `ip`'s block as a number (a map key of 8 bytes rather than an `IpAddr`'s 17): an IPv4
/// block is its masked address, an IPv6 one its first 64 masked bits with the top bit set
/// (prefixes past 64 bits are counted at 64).
pub fn block_key(ip: IpAddr, g: Grouping) -> u64 {
    match block(ip, g) {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => (1 << 63) | ((u128::from(v6) >> 64) as u64 >> 1),
    }
}

/// A block key in 4 bytes: an IPv4 block's as it is, an IPv6 block's folded (two blocks may
/// then share a key: they are counted together, never apart).
pub fn block_key32(ip: IpAddr, g: Grouping) -> u32 {
    let k = block_key(ip, g);
    (k ^ (k >> 32)) as u32
}

/// The one form of an address: an IPv4-mapped IPv6 address is its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_clear_host_bits_and_map_ipv4() {
        let g = Grouping {
            v4_prefix: 24,
            v6_prefix: 48,
        };
        let a: IpAddr = "192.0.2.77".parse().unwrap();
        assert_eq!(block(a, g), "192.0.2.0".parse::<IpAddr>().unwrap());
        let m: IpAddr = "::ffff:192.0.2.77".parse().unwrap();
        assert_eq!(block(m, g), "192.0.2.0".parse::<IpAddr>().unwrap());
        let v6: IpAddr = "2001:db8:1:2::9".parse().unwrap();
        assert_eq!(block(v6, g), "2001:db8:1::".parse::<IpAddr>().unwrap());
        let all = Grouping {
            v4_prefix: 0,
            v6_prefix: 0,
        };
        assert_eq!(block(a, all), "0.0.0.0".parse::<IpAddr>().unwrap());
    }
}
