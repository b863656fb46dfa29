//! Route choice: which peers a send's middle hops are.
//!
//! - **Usable peers only.** A middle is a routable peer (a current v2 descriptor, an allowed
//!   endpoint) that this node reached and that its own health says it may use
//!   ([`crate::health::Health::usable`]): not quarantined by this node, and not failing. Nor is
//!   it one the send is avoiding (a hop of a route of this send that failed).
//! - **Diverse.** No two hops of a route, the terminal included, have endpoints in the same
//!   [`PATH_BLOCKS`] block (/16 IPv4, /32 IPv6), unless the operator turned it off
//!   (`--same-subnet-paths`); the view holds at most 16 identities per /24 (`crate::discovery`).
//! - **The first hop among long-known peers (guards).** The entry hop is one of this node's
//!   [`GUARDS`] guards: among the candidates known for at least [`GUARD_AGE`] (or, in a network
//!   younger than that, the quarter known longest), one per /16: the /16s ranked first by
//!   `SHA-256(this node's id ‖ the block)`, and in each the candidate ranked first by
//!   `SHA-256(this node's id ‖ its id)`: stable for this node, different from node to node, so
//!   guards are not the same few peers for everyone, and many identities in one block count as
//!   one. Identities an attacker brings today are
//!   never a first hop before they are a week old.
//! - **Weighted by how long they are known.** Every other middle is drawn from a block chosen
//!   with a probability proportional to its weight, then a candidate within it by weight; a
//!   candidate's weight is the share of [`RAMP`] (a week) since this node first kept it, at
//!   least [`NEW_WEIGHT`], and a block's that of its heaviest candidate. So a party with many
//!   identities in one block gets the share of one block, and many new blocks weigh little
//!   for their first week: 500 identities in 250 /16s brought into a network of 10 000 long-
//!   known nodes are every middle of a three-hop route in well under 1 % of routes.
//!
//! The terminal is the one the user named: it is never filtered by health.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use rand::Rng;
use rand::seq::SliceRandom;
use sha2::{Digest, Sha256};

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
/// A candidate weighs its age over this, up to 1.
pub const RAMP: u64 = 7 * 86_400;
/// The least a candidate weighs (one first kept now).
pub const NEW_WEIGHT: f64 = 1.0 / 64.0;
/// Guards a node keeps its first hops among.
pub const GUARDS: usize = 4;
/// A candidate may be a guard once known this long.
pub const GUARD_AGE: u64 = RAMP;

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

/// What a candidate weighs at `now`: see the module docs.
pub fn weight(first_seen: u64, now: u64) -> f64 {
    (now.saturating_sub(first_seen) as f64 / RAMP as f64).clamp(NEW_WEIGHT, 1.0)
}

/// This node's guards among `candidates` at `now` (see the module docs).
pub fn guards(me: &NodeId, candidates: &[Candidate], now: u64) -> Vec<NodeId> {
    let mut eligible: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| now.saturating_sub(c.first_seen) >= GUARD_AGE)
        .collect();
    if eligible.len() < GUARDS {
        let mut by_age: Vec<&Candidate> = candidates.iter().collect();
        by_age.sort_by_key(|c| (c.first_seen, c.d().node_id));
        let quarter = by_age.len().div_ceil(4).max(GUARDS.min(by_age.len()));
        by_age.truncate(quarter);
        eligible = by_age;
    }
    let rank = |bytes: &[u8]| -> [u8; 32] {
        Sha256::new()
            .chain_update(me)
            .chain_update(bytes)
            .finalize()
            .into()
    };
    // One guard per /16 at most: the blocks ranked, then the member ranked first in each.
    let mut best: HashMap<Block, ([u8; 32], NodeId)> = HashMap::new();
    for c in eligible {
        let id = c.d().node_id;
        let block = block_of(
            &id,
            c.ip(),
            Rules {
                distinct_blocks: true,
            },
        );
        let r = rank(&id);
        let slot = best.entry(block).or_insert((r, id));
        if r < slot.0 {
            *slot = (r, id);
        }
    }
    let mut blocks: Vec<([u8; 32], NodeId)> = best
        .into_iter()
        .map(|(b, (_, id))| {
            let key = match b {
                Block::Net(ip) => ip.to_string().into_bytes(),
                Block::Own(own) => own.to_vec(),
            };
            (rank(&key), id)
        })
        .collect();
    blocks.sort_unstable();
    blocks.into_iter().take(GUARDS).map(|(_, id)| id).collect()
}

/// Draws an index of `weights` with probability proportional to its weight.
fn draw(weights: &[f64], rng: &mut impl Rng) -> Option<usize> {
    let total: f64 = weights.iter().sum();
    if weights.is_empty() || total <= 0.0 {
        return None;
    }
    let mut x = rng.random_range(0.0..total);
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return Some(i);
        }
        x -= w;
    }
    Some(weights.len() - 1)
}

/// A path of `hops` hops to `terminal` (at `terminal_ip`) at `now`: `hops − 1` middles among
/// `candidates` (already filtered for health and for what the send avoids; never this node
/// `me` nor the terminal), the first a guard, each from a block of its own drawn by weight,
/// then the terminal.
///
/// # Errors
/// [`SendError::NotEnoughPeers`] when fewer distinct blocks than middles are left.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    me: &NodeId,
    terminal: &Descriptor,
    terminal_ip: Option<IpAddr>,
    candidates: Vec<Candidate>,
    hops: usize,
    rules: Rules,
    now: u64,
    rng: &mut impl Rng,
) -> Result<Vec<Hop>, SendError> {
    let middles_needed = hops.saturating_sub(1);
    let terminal_block = block_of(&terminal.node_id, terminal_ip, rules);
    let mut seen = HashSet::new();
    let usable: Vec<Candidate> = candidates
        .into_iter()
        .filter(|c| c.d().node_id != terminal.node_id && c.d().node_id != *me)
        .filter(|c| seen.insert(c.d().node_id))
        .filter(|c| block_of(&c.d().node_id, c.ip(), rules) != terminal_block)
        .collect();
    let mut by_block: HashMap<Block, Vec<&Candidate>> = HashMap::new();
    for c in &usable {
        by_block
            .entry(block_of(&c.d().node_id, c.ip(), rules))
            .or_default()
            .push(c);
    }
    if by_block.len() < middles_needed {
        return Err(SendError::NotEnoughPeers(hops));
    }
    let mut path = Vec::with_capacity(hops);
    if middles_needed > 0 {
        let guard_ids = guards(me, &usable, now);
        let mut entries: Vec<&Candidate> = usable
            .iter()
            .filter(|c| guard_ids.contains(&c.d().node_id))
            .collect();
        entries.shuffle(rng);
        // Every guard avoided (they failed for this send): any candidate, by weight.
        let entry = match entries.first() {
            Some(c) => *c,
            None => pick(&by_block, rng, now).ok_or(SendError::NotEnoughPeers(hops))?,
        };
        by_block.remove(&block_of(&entry.d().node_id, entry.ip(), rules));
        path.push(hop(entry.d()));
    }
    for _ in 1..middles_needed {
        let c = pick(&by_block, rng, now).ok_or(SendError::NotEnoughPeers(hops))?;
        by_block.remove(&block_of(&c.d().node_id, c.ip(), rules));
        path.push(hop(c.d()));
    }
    path.push(hop(terminal));
    Ok(path)
}

/// A candidate of `by_block` drawn by weight: its block first (a block weighs its heaviest),
/// then within it.
fn pick<'a>(
    by_block: &HashMap<Block, Vec<&'a Candidate>>,
    rng: &mut impl Rng,
    now: u64,
) -> Option<&'a Candidate> {
    // A HashMap's order is random per process but not per draw: sort first.
    let mut blocks: Vec<(&Block, &Vec<&Candidate>)> = by_block.iter().collect();
    blocks.sort_unstable_by_key(|(b, _)| **b);
    let block_weights: Vec<f64> = blocks
        .iter()
        .map(|(_, cs)| {
            cs.iter()
                .map(|c| weight(c.first_seen, now))
                .fold(0.0, f64::max)
        })
        .collect();
    let (_, members) = blocks[draw(&block_weights, rng)?];
    let weights: Vec<f64> = members.iter().map(|c| weight(c.first_seen, now)).collect();
    members.get(draw(&weights, rng)?).copied()
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
        choose(&ME, terminal.d(), terminal.ip(), all, hops, rules, NOW, rng)
    }

    /// When the routes are chosen: a week after the candidates were first kept.
    const NOW: u64 = T0 + RAMP;

    fn at(seed: u8, ip: [u8; 4]) -> Candidate {
        known_since(seed, ip, T0)
    }

    fn known_since(seed: u8, ip: [u8; 4], first_seen: u64) -> Candidate {
        let ip = IpAddr::from(ip);
        let d = crate::proto::descriptor::for_test([seed; 32], format!("https://{ip}:7001"), T0);
        Candidate {
            s: std::sync::Arc::new(crate::discovery::Signed::trusted(d)),
            reached: true,
            first_seen,
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
            assert_eq!(path.last(), Some(&hop(terminal.d())));
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
        let other_block = [candidates[2].d().node_id, candidates[3].d().node_id];
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
    /// drawn like any other block for the second middle, so its identities are on about one
    /// route in ten, not half.
    #[test]
    fn many_identities_in_one_block_get_the_share_of_one_block() {
        let terminal = at(1, [10, 1, 0, 1]);
        let mut candidates: Vec<_> = (0..10).map(|i| at(100 + i, [10, 99, i, 1])).collect();
        let crowd: Vec<NodeId> = candidates.iter().map(|c| c.d().node_id).collect();
        candidates.extend((0..10).map(|i| at(2 + i, [10, 2 + i, 0, 1])));
        let mut rng = StdRng::seed_from_u64(3);
        let (mut routes, mut through_crowd) = (0, 0);
        for _ in 0..4000 {
            let path = pick(&terminal, &candidates, 3, DIVERSE, &mut rng).unwrap();
            if crowd.contains(&path[0].node_id) {
                continue;
            }
            routes += 1;
            through_crowd += usize::from(crowd.contains(&path[1].node_id));
        }
        // The guard's block taken, 1 block in 10 for the second middle.
        let share = through_crowd as f64 / routes as f64;
        assert!((0.06..0.15).contains(&share), "{through_crowd} of {routes}");
    }

    /// The first hop is one of four guards, the same for every route of this node, all among
    /// the peers known longest; 100 identities brought today in 100 /16s are never a first hop
    /// and are the second middle of about 100 / 64 ÷ (40 + 100 / 64) of routes.
    #[test]
    fn first_hops_are_guards_and_new_identities_weigh_little() {
        let terminal = at(1, [10, 1, 0, 1]);
        let mut candidates: Vec<_> = (0..40).map(|i| at(2 + i, [10, 2 + i, 0, 1])).collect();
        let sybils: Vec<Candidate> = (0..100)
            .map(|i| known_since(100 + i, [172, 16 + i, 0, 1], NOW))
            .collect();
        let bad: HashSet<NodeId> = sybils.iter().map(|c| c.d().node_id).collect();
        candidates.extend(sybils);
        let mut rng = StdRng::seed_from_u64(5);
        let (mut entries, mut second_bad) = (HashSet::new(), 0);
        for _ in 0..4000 {
            let path = pick(&terminal, &candidates, 3, DIVERSE, &mut rng).unwrap();
            entries.insert(path[0].node_id);
            second_bad += usize::from(bad.contains(&path[1].node_id));
        }
        assert_eq!(entries.len(), GUARDS, "four guards, always the same");
        assert!(
            entries.iter().all(|e| !bad.contains(e)),
            "never a new identity first"
        );
        // 1.5625 / 41.5625 of 4 000: about 150.
        assert!(second_bad < 300, "{second_bad}");
        // Another node has other guards (a ranking of its own).
        let other = guards(&[0x11; 32], &candidates, NOW);
        assert_ne!(
            other.iter().collect::<HashSet<_>>(),
            entries.iter().collect()
        );
    }
}
