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
//!   `SHA-256(this node's id ‖ the block's address bytes)`, and in each the candidate ranked
//!   first by `SHA-256(this node's id ‖ its id)`: stable for this node, different from node to
//!   node, so guards are not the same few peers for everyone, and many identities in one block
//!   count as one. Identities an attacker brings today are never a first hop before they are a
//!   week old.
//! - **Weighted by how long they are known.** Every other middle is drawn from a block chosen
//!   with a probability proportional to its weight, then a candidate within it by weight; a
//!   candidate's weight is the share of [`RAMP`] (a week) since this node first kept it, at
//!   least [`NEW_WEIGHT`], and a block's that of its heaviest candidate. So a party with many
//!   identities in one block gets the share of one block, and many new blocks weigh little
//!   for their first week: 500 identities in 250 /16s brought into a network of 10 000 long-
//!   known nodes are every middle of a three-hop route in well under 1 % of routes.
//!
//! The terminal is the one the user named: it is never filtered by health.
//!
//! [`Prepared`] does the grouping, weighing and ranking once for a set of candidates, so that
//! many routes (the simulator's thousands per sender) cost about `log n` each; [`choose`] is
//! one route through it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use rand::Rng;
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

/// `SHA-256(me ‖ bytes)`: how node `me` ranks an id or a block.
fn rank(me: &NodeId, bytes: &[u8]) -> [u8; 32] {
    Sha256::new()
        .chain_update(me)
        .chain_update(bytes)
        .finalize()
        .into()
}

/// How node `me` ranks `block`: by its address bytes (or, a block of one, by the id).
fn block_rank(me: &NodeId, block: &Block) -> [u8; 32] {
    match block {
        Block::Net(IpAddr::V4(a)) => rank(me, &a.octets()),
        Block::Net(IpAddr::V6(a)) => rank(me, &a.octets()),
        Block::Own(id) => rank(me, id),
    }
}

/// This node's guards among `candidates` at `now` (see the module docs). [`Prepared`] gives
/// the same guards without ranking every candidate again for each route.
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
    // One guard per /16 at most: the blocks ranked, then the member ranked first in each.
    let mut best: HashMap<Block, ([u8; 32], NodeId)> = HashMap::new();
    for c in eligible {
        let id = c.d().node_id;
        let block = block_of(&id, c.ip(), GUARD_RULES);
        let r = rank(me, &id);
        let slot = best.entry(block).or_insert((r, id));
        if r < slot.0 {
            *slot = (r, id);
        }
    }
    let mut blocks: Vec<([u8; 32], NodeId)> = best
        .into_iter()
        .map(|(b, (_, id))| (block_rank(me, &b), id))
        .collect();
    blocks.sort_unstable();
    blocks.into_iter().take(GUARDS).map(|(_, id)| id).collect()
}

/// Guards are one per [`PATH_BLOCKS`] block whatever the operator's rules.
const GUARD_RULES: Rules = Rules {
    distinct_blocks: true,
};

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

/// Draws of a block that hit an excluded one before the draw walks the others.
const REDRAWS: usize = 16;

/// The candidates of one block in a [`Prepared`] set.
#[derive(Debug)]
struct Group {
    /// Indices into [`Prepared::cands`], in the order given.
    members: Vec<usize>,
    /// Its heaviest member's weight.
    weight: f64,
    /// Its members known long enough to be guards.
    old: usize,
}

/// A node's candidates made ready for any number of routes at one time: grouped by block,
/// weighed, ranked for guards once. A route is then drawn in about `log n` steps where
/// [`choose`] alone would group, weigh and rank all `n` candidates again; the routes drawn
/// are those [`choose`] draws (the same guards, the same weights).
#[derive(Debug)]
pub struct Prepared {
    me: NodeId,
    rules: Rules,
    now: u64,
    cands: Vec<Candidate>,
    /// Each candidate's group.
    group_of: Vec<usize>,
    /// Ordered by block.
    groups: Vec<Group>,
    index: HashMap<Block, usize>,
    /// The groups' weights summed in order.
    cum: Vec<f64>,
    /// Candidates known long enough to be guards.
    old_total: usize,
    /// The groups with such candidates, ranked, each with its best one: the first
    /// `GUARDS + 1` (a route leaves out one block at most, the terminal's).
    old_ranked: Vec<(usize, usize)>,
    /// Candidates oldest first, for a network younger than [`GUARD_AGE`].
    by_age: Vec<usize>,
}

impl Prepared {
    /// `candidates` (as for [`choose`]; this node among them is left out) made ready for
    /// routes at `now`.
    pub fn new(me: &NodeId, candidates: Vec<Candidate>, rules: Rules, now: u64) -> Self {
        let mut seen = HashSet::new();
        let cands: Vec<Candidate> = candidates
            .into_iter()
            .filter(|c| c.d().node_id != *me && seen.insert(c.d().node_id))
            .collect();
        let blocks: Vec<Block> = cands
            .iter()
            .map(|c| block_of(&c.d().node_id, c.ip(), rules))
            .collect();
        let mut order: Vec<Block> = blocks.clone();
        order.sort_unstable();
        order.dedup();
        let index: HashMap<Block, usize> = order.iter().enumerate().map(|(i, b)| (*b, i)).collect();
        let mut groups: Vec<Group> = order
            .into_iter()
            .map(|_| Group {
                members: Vec::new(),
                weight: 0.0,
                old: 0,
            })
            .collect();
        let mut group_of = Vec::with_capacity(cands.len());
        for (i, (c, b)) in cands.iter().zip(&blocks).enumerate() {
            let g = index.get(b).copied().unwrap_or_default();
            group_of.push(g);
            let group = &mut groups[g];
            group.members.push(i);
            group.weight = group.weight.max(weight(c.first_seen, now));
            group.old += usize::from(now.saturating_sub(c.first_seen) >= GUARD_AGE);
        }
        let cum = groups
            .iter()
            .scan(0.0, |sum, g| {
                *sum += g.weight;
                Some(*sum)
            })
            .collect();
        let mut by_age: Vec<usize> = (0..cands.len()).collect();
        by_age.sort_unstable_by_key(|i| (cands[*i].first_seen, cands[*i].d().node_id));
        let mut p = Self {
            me: *me,
            rules,
            now,
            old_total: groups.iter().map(|g| g.old).sum(),
            cands,
            group_of,
            groups,
            index,
            cum,
            old_ranked: Vec::new(),
            by_age,
        };
        let old = (0..p.cands.len()).filter(|i| p.is_old(*i));
        p.old_ranked = p.ranked(old, GUARDS + 1);
        p
    }

    /// The candidates, as given but this node and any repeated.
    pub fn candidates(&self) -> &[Candidate] {
        &self.cands
    }

    fn is_old(&self, i: usize) -> bool {
        self.now.saturating_sub(self.cands[i].first_seen) >= GUARD_AGE
    }

    /// Of `members`, the best of each [`PATH_BLOCKS`] block, the blocks ranked: the first
    /// `take` as `(group, member)`.
    fn ranked(&self, members: impl Iterator<Item = usize>, take: usize) -> Vec<(usize, usize)> {
        let mut best: HashMap<Block, ([u8; 32], usize)> = HashMap::new();
        for i in members {
            let id = self.cands[i].d().node_id;
            let r = rank(&self.me, &id);
            let slot = best
                .entry(block_of(&id, self.cands[i].ip(), GUARD_RULES))
                .or_insert((r, i));
            if r < slot.0 {
                *slot = (r, i);
            }
        }
        let mut blocks: Vec<([u8; 32], NodeId, usize)> = best
            .into_iter()
            .map(|(b, (_, i))| (block_rank(&self.me, &b), self.cands[i].d().node_id, i))
            .collect();
        blocks.sort_unstable();
        blocks
            .into_iter()
            .take(take)
            .map(|(_, _, i)| (self.group_of[i], i))
            .collect()
    }

    /// The guards of a route that leaves out group `skip` (the terminal's block): those of
    /// [`guards`] over the candidates outside it.
    fn guards_without(&self, skip: Option<usize>) -> Vec<usize> {
        let left = |g: usize| Some(g) != skip;
        let skipped = skip.map_or((0, 0), |g| {
            (self.groups[g].old, self.groups[g].members.len())
        });
        if self.old_total - skipped.0 >= GUARDS {
            if self.rules.distinct_blocks || skip.is_none() {
                return (self.old_ranked.iter())
                    .filter(|(g, _)| left(*g))
                    .take(GUARDS)
                    .map(|(_, i)| *i)
                    .collect();
            }
            let old = (0..self.cands.len()).filter(|i| self.is_old(*i) && left(self.group_of[*i]));
            return self
                .ranked(old, GUARDS)
                .into_iter()
                .map(|(_, i)| i)
                .collect();
        }
        let n = self.cands.len() - skipped.1;
        let quarter = n.div_ceil(4).max(GUARDS.min(n));
        let firsts = (self.by_age.iter().copied())
            .filter(|i| left(self.group_of[*i]))
            .take(quarter);
        self.ranked(firsts, GUARDS)
            .into_iter()
            .map(|(_, i)| i)
            .collect()
    }

    /// A group drawn by weight, none of `excluded`.
    fn draw_group(&self, excluded: &[usize], rng: &mut impl Rng) -> Option<usize> {
        let total = *self.cum.last()?;
        if total <= 0.0 {
            return None;
        }
        for _ in 0..REDRAWS {
            let x = rng.random_range(0.0..total);
            let g = self
                .cum
                .partition_point(|c| *c <= x)
                .min(self.groups.len() - 1);
            if !excluded.contains(&g) {
                return Some(g);
            }
        }
        let rest: Vec<usize> = (0..self.groups.len())
            .filter(|g| !excluded.contains(g))
            .collect();
        let weights: Vec<f64> = rest.iter().map(|g| self.groups[*g].weight).collect();
        draw(&weights, rng).map(|k| rest[k])
    }

    /// A member of group `g` drawn by weight.
    fn draw_member(&self, g: usize, rng: &mut impl Rng) -> Option<usize> {
        let members = &self.groups[g].members;
        let weights: Vec<f64> = (members.iter())
            .map(|i| weight(self.cands[*i].first_seen, self.now))
            .collect();
        draw(&weights, rng).map(|k| members[k])
    }

    /// A path of `hops` hops to `terminal` (at `terminal_ip`), as [`choose`] draws it.
    ///
    /// # Errors
    /// [`SendError::NotEnoughPeers`] when fewer distinct blocks than middles are left.
    pub fn route(
        &self,
        terminal: &Descriptor,
        terminal_ip: Option<IpAddr>,
        hops: usize,
        rng: &mut impl Rng,
    ) -> Result<Vec<Hop>, SendError> {
        let terminal_block = block_of(&terminal.node_id, terminal_ip, self.rules);
        let skip = self.index.get(&terminal_block).copied();
        let is_terminal = |i: &usize| self.cands[*i].d().node_id == terminal.node_id;
        // Usually the terminal is in its own block, or not a candidate (`choose`): the search
        // of every candidate only for the latter.
        let in_block = skip.is_some_and(|g| self.groups[g].members.iter().any(is_terminal));
        let stray = (!in_block)
            .then(|| (0..self.cands.len()).find(|i| is_terminal(i)))
            .flatten()
            .filter(|i| Some(self.group_of[*i]) != skip);
        if let Some(t) = stray {
            // The terminal among the candidates outside its own block (its endpoint read
            // otherwise): left out as choose leaves it out.
            let mut rest = self.cands.clone();
            rest.remove(t);
            return Self::new(&self.me, rest, self.rules, self.now).route(
                terminal,
                terminal_ip,
                hops,
                rng,
            );
        }
        let middles_needed = hops.saturating_sub(1);
        let not_enough = || SendError::NotEnoughPeers(hops);
        if self.groups.len() - usize::from(skip.is_some()) < middles_needed {
            return Err(not_enough());
        }
        let mut excluded: Vec<usize> = skip.into_iter().collect();
        let mut path = Vec::with_capacity(hops);
        if middles_needed > 0 {
            let guards = self.guards_without(skip);
            let entry = match guards.len() {
                0 => {
                    let g = self.draw_group(&excluded, rng).ok_or_else(not_enough)?;
                    self.draw_member(g, rng).ok_or_else(not_enough)?
                }
                n => guards[rng.random_range(0..n)],
            };
            excluded.push(self.group_of[entry]);
            path.push(hop(self.cands[entry].d()));
        }
        for _ in 1..middles_needed {
            let g = self.draw_group(&excluded, rng).ok_or_else(not_enough)?;
            let c = self.draw_member(g, rng).ok_or_else(not_enough)?;
            excluded.push(g);
            path.push(hop(self.cands[c].d()));
        }
        path.push(hop(terminal));
        Ok(path)
    }
}

/// A path of `hops` hops to `terminal` (at `terminal_ip`) at `now`: `hops − 1` middles among
/// `candidates` (already filtered for health and for what the send avoids; never this node
/// `me` nor the terminal), the first a guard, each from a block of its own drawn by weight,
/// then the terminal. Many routes from one set of candidates: [`Prepared`].
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
    let candidates = (candidates.into_iter())
        .filter(|c| c.d().node_id != terminal.node_id)
        .collect();
    Prepared::new(me, candidates, rules, now).route(terminal, terminal_ip, hops, rng)
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

    /// A prepared set gives each route the guards [`guards`] ranks afresh over what that route
    /// may use (the terminal and its block left out): in an old network, a young one, one with
    /// five old candidates of which two share a block, and with diversity off.
    #[test]
    fn prepared_guards_are_those_ranked_afresh() {
        let same = Rules {
            distinct_blocks: false,
        };
        type Ages = fn(usize) -> u64;
        let cases: [(Ages, Rules); 4] = [
            (|k| T0 - k as u64, DIVERSE),
            (|k| NOW - 3600 + k as u64, DIVERSE),
            (
                |k| if k < 5 { T0 - k as u64 } else { NOW - k as u64 },
                DIVERSE,
            ),
            (|k| T0 - k as u64, same),
        ];
        for (first_seen, rules) in cases {
            // 60 candidates, 3 to a /16 (the old ones of the third case in 10.0/16 and 10.1/16).
            let all: Vec<Candidate> = (0..60)
                .map(|k| known_since(k as u8 + 1, [10, (k / 3) as u8, k as u8, 1], first_seen(k)))
                .collect();
            let prepared = Prepared::new(&ME, all.clone(), rules, NOW);
            let mut rng = StdRng::seed_from_u64(9);
            for t in &all {
                let t_block = block_of(&t.d().node_id, t.ip(), rules);
                let usable: Vec<Candidate> = (all.iter())
                    .filter(|c| c.d().node_id != t.d().node_id)
                    .filter(|c| block_of(&c.d().node_id, c.ip(), rules) != t_block)
                    .cloned()
                    .collect();
                let want = guards(&ME, &usable, NOW);
                let skip = prepared.index.get(&t_block).copied();
                let got: Vec<NodeId> = (prepared.guards_without(skip).iter())
                    .map(|i| prepared.cands[*i].d().node_id)
                    .collect();
                assert_eq!(got, want);
                let path = prepared.route(t.d(), t.ip(), 3, &mut rng).unwrap();
                assert!(want.contains(&path[0].node_id));
                let cached = choose(&ME, t.d(), t.ip(), all.clone(), 3, rules, NOW, &mut rng);
                assert!(want.contains(&cached.unwrap()[0].node_id));
                // The terminal's endpoint unread: it is left out of the middles all the same.
                let blind = prepared.route(t.d(), None, 3, &mut rng).unwrap();
                assert!(blind[..2].iter().all(|h| h.node_id != t.d().node_id));
            }
        }
    }
}
