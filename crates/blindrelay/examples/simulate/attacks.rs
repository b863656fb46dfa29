//! The simulator's later phases: Sybils over many /16s, an eclipse by a lying bootstrap peer,
//! and sends after 30 % of the nodes died. Route choice is the daemon's function
//! (`blindrelay::send::path::choose`, or `path::Prepared` for many routes of one sender), its candidates the sender's view as the daemon reads it
//! (reached, current, not failing); a route delivers when every hop is up.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use blindrelay::discovery::sim::Net;
use blindrelay::peers::Candidate;
use blindrelay::proto::NodeId;
use blindrelay::send::path::{self, Rules};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

const DAY: u64 = 86_400;
/// Peers in the eclipsed node's seed list (`blindrelay seeds` writes 32 by default).
const SEEDS: usize = 32;

/// The candidates `from` would choose middles among now, but `avoid`; those first kept
/// before `since` as if `older` seconds earlier.
fn candidates_aged(
    net: &Net,
    from: usize,
    avoid: &HashSet<NodeId>,
    since: u64,
    older: u64,
) -> Vec<Candidate> {
    let now = net.now().unix;
    net.nodes[from]
        .disc
        .view()
        .iter()
        .filter(|e| e.healthy() && e.s.d.is_current(now) && !avoid.contains(e.id()))
        .map(|e| Candidate {
            s: Arc::clone(&e.s),
            reached: true,
            first_seen: if e.first_seen() < since {
                e.first_seen().saturating_sub(older)
            } else {
                e.first_seen()
            },
        })
        .collect()
}

/// The candidates `from` would choose middles among now, but `avoid`.
fn candidates(net: &Net, from: usize, avoid: &HashSet<NodeId>) -> Vec<Candidate> {
    candidates_aged(net, from, avoid, 0, 0)
}

/// A send from `from` to `to` over three hops as the daemon makes it: at most
/// `blindrelay::send::MAX_ROUTES` routes, the failed hop and the one before it avoided, the
/// failed hop marked failing in the sender's view. The routes it took, if delivered.
pub(crate) fn send(net: &mut Net, from: usize, to: usize, rng: &mut StdRng) -> Option<usize> {
    let now = net.now().unix;
    let me = net.nodes[from].id();
    let terminal = Arc::clone(&net.nodes[from].disc.view().get(&net.nodes[to].id())?.s);
    let rules = Rules {
        distinct_blocks: true,
    };
    let mut avoid = HashSet::new();
    for route in 1..=blindrelay::send::MAX_ROUTES {
        let cands = candidates(net, from, &avoid);
        let hops = path::choose(&me, &terminal.d, terminal.ip, cands, 3, rules, now, rng).ok()?;
        let dead = hops.iter().position(|h| {
            net.index_of(&h.node_id)
                .is_none_or(|i| !net.nodes[i].up || net.nodes[i].hung)
        });
        let Some(at) = dead else {
            return Some(route);
        };
        if at == hops.len() - 1 {
            return None;
        }
        let failed = hops[at].node_id;
        avoid.insert(failed);
        if at > 0 {
            avoid.insert(hops[at - 1].node_id);
        }
        net.nodes[from].disc.view_mut().failed(&failed);
    }
    None
}

/// Step 6: 500 Sybil identities in 250 /16s (two per /16) join from random honest nodes and
/// run for two discovery intervals; then honest senders choose three-hop routes to honest
/// terminals at the start of each day of the Sybils' first week. The honest network is taken
/// as known for a week before they came (the simulated network is minutes old: its peers'
/// first-seen dates are set back a week for route choice, nothing else).
pub(crate) fn sybils(net: &mut Net, honest: usize, interval: Duration) {
    let t = net.elapsed();
    let attack = net.now().unix;
    let mut bad = HashSet::new();
    for k in 0..500usize {
        let boot = net.random_below(honest);
        // Two per /16, in 182.0/16 to 182.249/16 (no honest node's first octet).
        let ip = IpAddr::from([182, (k / 2) as u8, 0, (k % 2) as u8 + 1]);
        let i = net.add(ip, &[boot]);
        bad.insert(net.nodes[i].id());
    }
    net.run_until(t + interval * 2, |_| false);
    let mut rng = StdRng::seed_from_u64(6);
    let senders: Vec<usize> = (0..200).map(|_| rng.random_range(0..honest)).collect();
    let known = senders
        .iter()
        .map(|s| {
            net.nodes[*s]
                .disc
                .view()
                .iter()
                .filter(|e| bad.contains(e.id()))
                .count()
        })
        .sum::<usize>()
        / senders.len();
    print!(
        "6. 500 Sybils in 250 /16s, held by an honest node: {known} on average; routes whose every middle is theirs, day 0..7:"
    );
    let rules = Rules {
        distinct_blocks: true,
    };
    for day in 0..=7u64 {
        let now = net.now().unix + day * DAY;
        let (mut all_bad, mut any_bad, mut routes) = (0, 0, 0);
        for &s in &senders {
            let me = net.nodes[s].id();
            let cands = candidates_aged(net, s, &HashSet::new(), attack, 7 * DAY);
            // One sender's candidates ranked once for its 50 routes of the day.
            let routes_of = path::Prepared::new(&me, cands, rules, now);
            let terminals: Vec<&Candidate> = (routes_of.candidates().iter())
                .filter(|c| !bad.contains(&c.d().node_id))
                .collect();
            for _ in 0..50 {
                let Some(t) = terminals.choose(&mut rng) else {
                    break;
                };
                let Ok(hops) = routes_of.route(t.d(), t.ip(), 3, &mut rng) else {
                    continue;
                };
                routes += 1;
                let middles = &hops[..hops.len() - 1];
                let n = middles.iter().filter(|h| bad.contains(&h.node_id)).count();
                all_bad += usize::from(n == middles.len());
                any_bad += usize::from(n > 0);
            }
        }
        print!(
            " {:.2} % ({:.1} % with one)",
            100.0 * all_bad as f64 / routes.max(1) as f64,
            100.0 * any_bad as f64 / routes.max(1) as f64
        );
    }
    println!();
}

/// A liar and its 20 Sybils, who keep only each other, an interval after they started: the
/// liar, and how many they are.
fn liars(net: &mut Net, interval: Duration) -> (usize, usize) {
    let liar = net.add(IpAddr::from([192, 168, 0, 1]), &[]);
    let theirs: Vec<usize> = (0..20)
        .map(|k| net.add(IpAddr::from([100, 64 + k as u8, 0, 1]), &[liar]))
        .collect();
    let mut ids: std::collections::HashSet<NodeId> =
        theirs.iter().map(|i| net.nodes[*i].id()).collect();
    ids.insert(net.nodes[liar].id());
    let ids = Arc::new(ids);
    for i in theirs.iter().chain([&liar]) {
        net.nodes[*i].only = Some(Arc::clone(&ids));
    }
    let t = net.elapsed();
    net.run_until(t + interval, |_| false);
    (liar, ids.len())
}

/// Step 8: a liar and its 20 Sybils, who keep only each other; a newcomer whose only
/// bootstrap peer is the liar; then a seed list of honest nodes passed by its operator.
pub(crate) fn eclipse(net: &mut Net, honest: usize, interval: Duration) {
    let (liar, whole) = liars(net, interval);
    let victim = net.add(IpAddr::from([198, 18, 0, 1]), &[liar]);
    let t = net.elapsed();
    // Until it holds the liar's network (as the real-process benchmark waits), at least two
    // intervals.
    net.run_until(t + interval * 2, |_| false);
    net.run_until(t + interval * 30, |net| {
        net.nodes[victim].disc.view().len() >= whole
    });
    // The live honest nodes it holds.
    let honest_known = |net: &Net| {
        let v = net.nodes[victim].disc.view();
        (0..honest)
            .filter(|i| net.nodes[*i].up && v.get(&net.nodes[*i].id()).is_some())
            .count()
    };
    let live = (0..honest).filter(|i| net.nodes[*i].up).count();
    let e = net.nodes[victim].disc.eclipse();
    println!(
        "8. eclipse: after {:.0} s the victim holds {} identities, {} honest; it says \"{}\" ({:.0} % under one root)",
        (net.elapsed() - t).as_secs_f64(),
        net.nodes[victim].disc.view().len(),
        honest_known(net),
        e.state,
        e.top_share * 100.0
    );
    // A seed list (`blindrelay seeds`) names peers in distinct /16s, here chosen at random.
    for _ in 0..SEEDS {
        let seed = net.random_below(honest);
        net.fetch(victim, seed);
    }
    let t = net.elapsed();
    let found = net.run_until(t + Duration::from_secs(900), |net| {
        honest_known(net) * 100 >= live * 99
    });
    let held = net.elapsed() - t;
    // Until it routes to every live honest node (what the real-process benchmark waits for).
    let routes_to_all = |net: &Net| {
        let v = net.nodes[victim].disc.view();
        (0..honest).all(|i| {
            !net.nodes[i].up
                || v.get(&net.nodes[i].id())
                    .is_some_and(blindrelay::discovery::view::Entry::healthy)
        })
    };
    // Asked every tenth of a second: the real-process benchmark's rescue takes less than one.
    let routed = net.run_until_every(
        t + Duration::from_secs(900),
        Duration::from_millis(100),
        routes_to_all,
    );
    let routes = net.elapsed() - t;
    // Its next reconciliations, with peers under other roots, confirm what the seed brought.
    let ok = net.run_until(net.elapsed() + interval * 6, |net| {
        net.nodes[victim].disc.eclipse().state == blindrelay::discovery::EclipseState::Ok
    });
    let e = net.nodes[victim].disc.eclipse();
    println!(
        "   with a seed list of {SEEDS}: 99 % of the live honest network held after {:.0} s{}, routes to every live honest node after {:.1} s{}; it says \"{}\" ({:.0} % unconfirmed) {:.0} s after the seed{}",
        held.as_secs_f64(),
        if found { "" } else { " (NOT reached)" },
        routes.as_secs_f64(),
        if routed { "" } else { " (NOT reached)" },
        e.state,
        e.unconfirmed_share * 100.0,
        (net.elapsed() - t).as_secs_f64(),
        if ok {
            ""
        } else {
            " (not ok within 6 intervals)"
        }
    );
}

/// Step 7: 30 % of the first `honest` nodes killed at once; after `after`, 1 000 three-hop sends
/// between random live nodes.
pub(crate) fn deaths(net: &mut Net, honest: usize, after: Duration) {
    let mut rng = StdRng::seed_from_u64(8);
    let mut all: Vec<usize> = (0..honest).collect();
    all.shuffle(&mut rng);
    let (dead, live) = all.split_at(honest * 3 / 10);
    for &i in dead {
        net.kill(i);
    }
    let t = net.elapsed();
    net.run_until(t + after, |_| false);
    let (mut ok, mut routes) = (0, [0usize; 16]);
    let count = 1000;
    for _ in 0..count {
        let from = *live.choose(&mut rng).unwrap_or(&0);
        let to = loop {
            let to = *live.choose(&mut rng).unwrap_or(&1);
            if to != from || live.len() < 2 {
                break to;
            }
        };
        if let Some(r) = send(net, from, to, &mut rng) {
            ok += 1;
            routes[r.min(15)] += 1;
        }
    }
    let tried: Vec<String> = routes
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{n} on route {r}"))
        .collect();
    println!(
        "7. {} of {honest} nodes killed, sends {:.0} s later: {ok} of {count} delivered ({:.1} %): {}",
        dead.len(),
        after.as_secs_f64(),
        100.0 * ok as f64 / count as f64,
        tried.join(", ")
    );
}
