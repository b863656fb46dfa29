//! Route choice: which peers a send's middle hops are.
//!
//! - **Usable peers only.** A middle is a routable peer (a current v2 descriptor, an allowed
//!   endpoint) that this node's own health says it may use ([`crate::health::Health::usable`]):
//!   reached at least once, not quarantined by this node, and not failing (its last attempt
//!   failed and no probe has shown it back since). Nor is it one the send is avoiding (a hop of
//!   a route of this send that failed).
//! - **Diverse.** No two hops of a route, the terminal included, have endpoints in the same
//!   [`PATH_BLOCKS`] block (/16 IPv4, /32 IPv6), unless the operator turned it off
//!   (`--same-subnet-paths`).
//! - **A block first, then a peer in it.** Each middle is drawn from a block chosen uniformly
//!   among the blocks with a usable candidate, then a candidate uniformly within it: a party
//!   with many identities in one block gets the share of one block, however many it has.
//!
//! The terminal is the one the user named: it is never filtered by health.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};

use super::{Hop, SendError, hop};
pub use crate::peers::Candidate;
use crate::proto::NodeId;
use crate::proto::descriptor::Descriptor;
use crate::sources::{self, Grouping};

/// The blocks no two hops of a route share.
pub const PATH_BLOCKS: Grouping = Grouping {
    v4_prefix: 16,
    v6_prefix: 32,
};

/// How a path is chosen.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// No two hops in one [`PATH_BLOCKS`] block.
    pub distinct_blocks: bool,
}

/// The block a hop counts in: its [`PATH_BLOCKS`] block, or (no address, or diversity off) its
/// own id, so it shares with no one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Block {
    Net(IpAddr),
    Own(NodeId),
}

fn block_of(id: &NodeId, ip: Option<IpAddr>, rules: Rules) -> Block {
    match ip {
        Some(ip) if rules.distinct_blocks => Block::Net(sources::block(ip, PATH_BLOCKS)),
        _ => Block::Own(*id),
    }
}

/// A path of `hops` hops to `terminal` (at `terminal_ip`): `hops − 1` middles among
/// `candidates` (already filtered for health and for what the send avoids; never this node
/// `me` nor the terminal), each from a block of its own chosen uniformly, then the terminal.
///
/// # Errors
/// [`SendError::NotEnoughPeers`] when fewer distinct blocks than middles are left.
pub fn choose(
    me: &NodeId,
    terminal: &Descriptor,
    terminal_ip: Option<IpAddr>,
    candidates: Vec<Candidate>,
    hops: usize,
    rules: Rules,
    rng: &mut impl Rng,
) -> Result<Vec<Hop>, SendError> {
    let middles_needed = hops.saturating_sub(1);
    let terminal_block = block_of(&terminal.node_id, terminal_ip, rules);
    let mut by_block: HashMap<Block, Vec<Descriptor>> = HashMap::new();
    let mut seen = HashSet::new();
    for c in candidates {
        if c.d.node_id == terminal.node_id || c.d.node_id == *me || !seen.insert(c.d.node_id) {
            continue;
        }
        let block = block_of(&c.d.node_id, c.ip, rules);
        if block != terminal_block {
            by_block.entry(block).or_default().push(c.d);
        }
    }
    if by_block.len() < middles_needed {
        return Err(SendError::NotEnoughPeers(hops));
    }
    // A HashMap's order is random per process but not per draw: sort, then shuffle.
    let mut blocks: Vec<(Block, Vec<Descriptor>)> = by_block.into_iter().collect();
    blocks.sort_unstable_by_key(|(b, _)| *b);
    blocks.shuffle(rng);
    let mut path = Vec::with_capacity(hops);
    for (_, peers) in blocks.iter().take(middles_needed) {
        let d = peers.choose(rng).ok_or(SendError::NotEnoughPeers(hops))?;
        path.push(hop(d));
    }
    path.push(hop(terminal));
    Ok(path)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const T0: u64 = 1_800_000_000;
    const DIVERSE: Rules = Rules {
        distinct_blocks: true,
    };

    const ME: NodeId = [0xee; 32];

    /// [`choose`] for this test node to `terminal` among `candidates`.
    fn pick(
        terminal: &Candidate,
        candidates: &[Candidate],
        hops: usize,
        rules: Rules,
        rng: &mut StdRng,
    ) -> Result<Vec<Hop>, SendError> {
        let all = candidates.to_vec();
        choose(&ME, &terminal.d, terminal.ip, all, hops, rules, rng)
    }

    fn at(seed: u8, ip: [u8; 4]) -> Candidate {
        let ip = IpAddr::from(ip);
        Candidate {
            d: crate::proto::descriptor::for_test([seed; 32], format!("https://{ip}:7001"), T0),
            ip: Some(ip),
            reached: true,
        }
    }

    #[test]
    fn a_path_is_middles_from_distinct_blocks_then_the_terminal() {
        let terminal = at(2, [10, 2, 0, 1]);
        let candidates: Vec<_> = (3..=8).map(|i| at(i, [10, i, 0, 1])).collect();
        let mut rng = StdRng::seed_from_u64(7);
        for hops in 1..=7 {
            let path = pick(&terminal, &candidates, hops, DIVERSE, &mut rng).unwrap();
            assert_eq!(path.len(), hops);
            assert_eq!(path.last(), Some(&hop(&terminal.d)));
            let mut ids: Vec<_> = path.iter().map(|h| h.node_id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), hops, "no hop twice");
        }
        assert!(matches!(
            pick(&terminal, &candidates, 8, DIVERSE, &mut rng),
            Err(SendError::NotEnoughPeers(8))
        ));
    }

    #[test]
    fn no_two_hops_in_one_16_unless_turned_off() {
        let terminal = at(1, [10, 1, 0, 1]);
        // Three peers in the terminal's /16, two in another: a 3-hop route has one middle from
        // 10.2/16 and can find no second block.
        let mut candidates = vec![at(2, [10, 1, 0, 2]), at(3, [10, 1, 9, 9])];
        candidates.extend([at(4, [10, 2, 0, 1]), at(5, [10, 2, 200, 1])]);
        let other_block = [candidates[2].d.node_id, candidates[3].d.node_id];
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let path = pick(&terminal, &candidates, 2, DIVERSE, &mut rng).unwrap();
            assert!(other_block.contains(&path[0].node_id));
        }
        assert!(matches!(
            pick(&terminal, &candidates, 3, DIVERSE, &mut rng),
            Err(SendError::NotEnoughPeers(3))
        ));
        let same = Rules {
            distinct_blocks: false,
        };
        assert_eq!(
            pick(&terminal, &candidates, 5, same, &mut rng)
                .unwrap()
                .len(),
            5
        );
    }

    /// Ten identities in one /16 and ten honest peers each in its own: the crowded block is
    /// drawn like any other block, so its identities are on about one route in ten, not half.
    #[test]
    fn many_identities_in_one_block_get_the_share_of_one_block() {
        let terminal = at(1, [10, 1, 0, 1]);
        let mut candidates: Vec<_> = (0..10).map(|i| at(100 + i, [10, 99, i, 1])).collect();
        let crowd: Vec<NodeId> = candidates.iter().map(|c| c.d.node_id).collect();
        candidates.extend((0..10).map(|i| at(2 + i, [10, 2 + i, 0, 1])));
        let mut rng = StdRng::seed_from_u64(3);
        let routes = 2000;
        let through_crowd = (0..routes)
            .filter(|_| {
                let path = pick(&terminal, &candidates, 2, DIVERSE, &mut rng).unwrap();
                crowd.contains(&path[0].node_id)
            })
            .count();
        // 1 block in 11: about 182 of 2 000.
        assert!((120..250).contains(&through_crowd), "{through_crowd}");
    }
}
