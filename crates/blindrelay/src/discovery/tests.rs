//! The machine driven by the simulator on small networks: convergence from one bootstrap peer
//! each, a newcomer's sync and push, junk from strangers, splits longer than a descriptor's
//! life, and a lying bootstrap peer.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::sim::{Net, SimConfig};
use super::*;

const T0: u64 = 1_800_000_000;

/// Node `i`'s address: a /16 of its own.
fn ip(i: usize) -> IpAddr {
    IpAddr::from([10, (i % 250) as u8 + 1, (i / 250) as u8, 1])
}

fn sim(interval: u64, lifetime: u64) -> SimConfig {
    SimConfig {
        interval: Duration::from_secs(interval),
        lifetime,
        tick: Duration::from_millis(500),
        ..SimConfig::default()
    }
}

/// `n` nodes, node `i` started with one bootstrap peer among the nodes before it.
fn network(n: usize, cfg: SimConfig) -> Net {
    let mut net = Net::new(cfg, crate::clock::now().into_std(), T0);
    net.grow(n, ip);
    net
}

/// `n` nodes (interval 10 s, descriptors of an hour) once every node holds and reached every
/// other.
fn converged(n: usize) -> Net {
    let mut net = network(n, sim(10, 3600));
    let all: Vec<usize> = (0..n).collect();
    assert!(net.run_until(Duration::from_secs(120), |net| knows_all(net, &all)));
    net
}

/// Every up node among `nodes` holds and reached every other up node of them.
fn knows_all(net: &Net, nodes: &[usize]) -> bool {
    nodes.iter().filter(|i| net.nodes[**i].up).all(|i| {
        let view = net.nodes[*i].disc.view();
        nodes
            .iter()
            .filter(|j| *j != i && net.nodes[**j].up)
            .all(|j| {
                view.get(&net.nodes[*j].id())
                    .is_some_and(|e| e.reached().is_some())
            })
    })
}

#[test]
fn a_network_converges_from_one_bootstrap_peer_each() {
    let n = 40;
    let mut net = network(n, sim(10, 3600));
    let all: Vec<usize> = (0..n).collect();
    assert!(
        net.run_until(Duration::from_secs(120), |net| knows_all(net, &all)),
        "converged within 120 s"
    );
    let took = net.elapsed();
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[test]
fn a_newcomer_syncs_in_one_exchange_and_its_descriptor_is_pushed_to_everyone() {
    let n = 40;
    let mut net = converged(n);
    let start = net.elapsed();
    let newcomer = net.add(ip(n), &[3]);
    let id = net.nodes[newcomer].id();
    // The newcomer holds every node after its first reconciliation.
    assert!(net.run_until(start + Duration::from_secs(5), |net| {
        net.nodes[newcomer].disc.view().len() == n
    }));
    assert!(net.nodes[newcomer].disc.stats().syncs >= 1);
    // Every old node holds it and reached it within a few flushes.
    let everyone = net.run_until(start + Duration::from_secs(30), |net| {
        (0..n).all(|i| {
            net.nodes[i]
                .disc
                .view()
                .get(&id)
                .is_some_and(|e| e.reached().is_some())
        })
    });
    assert!(everyone, "pushed to all within 30 s");
}

#[test]
fn strangers_introduce_a_bounded_number_and_junk_that_never_answers_is_forgotten() {
    let mut net = network(3, sim(10, 3600));
    net.run_until(Duration::from_secs(10), |_| false);
    let victim = 0;
    let now = net.now();
    // 130 /24s each announce 20 identities whose endpoints answer nothing (no such node).
    let mut rng = StdRng::seed_from_u64(9);
    for block in 0..130u32 {
        for _ in 0..20 {
            let seed: [u8; 32] = rng.random();
            let d = crate::proto::descriptor::for_test(
                seed,
                format!("https://172.{}.{}.9:7001", 16 + block / 256, block % 256),
                now.unix,
            );
            let caller = Caller {
                id: Some(d.node_id),
                ip: IpAddr::from([172, 16 + (block / 256) as u8, (block % 256) as u8, 9]),
            };
            let msg = Msg::Sync {
                own: Some(d.clone()),
                round: vec![],
            };
            let checked = verify::check(std::slice::from_ref(&d), &[], now.unix);
            net.nodes[victim]
                .disc
                .on_request(caller, &msg, checked, now);
        }
    }
    let waiting = net.nodes[victim].disc.view().waiting();
    assert_eq!(waiting, 130 * STRANGER_BURST as usize, "a burst per /24");
    // A newcomer an honest peer brings is reached within seconds, ahead of the junk.
    let start = net.elapsed();
    let newcomer = net.add(ip(7), &[1]);
    let id = net.nodes[newcomer].id();
    assert!(net.run_until(start + Duration::from_secs(20), |net| {
        net.nodes[victim]
            .disc
            .view()
            .get(&id)
            .is_some_and(|e| e.reached().is_some())
    }));
    // The junk fails its probes and is forgotten within minutes.
    let gone = net.run_until(start + Duration::from_secs(900), |net| {
        net.nodes[victim].disc.view().waiting() == 0
    });
    let d = &net.nodes[victim].disc;
    assert!(gone, "{} waiting, {:?}", d.view().waiting(), d.stats());
    assert!(net.nodes[victim].disc.stats().forgotten >= 1000);
}

#[test]
fn the_halves_of_a_split_longer_than_a_descriptors_life_rejoin() {
    let n = 20;
    // Descriptors live 120 s; the split lasts 400 s.
    let mut net = network(n, sim(10, 120));
    let all: Vec<usize> = (0..n).collect();
    assert!(net.run_until(Duration::from_secs(120), |net| knows_all(net, &all)));
    let half: Vec<usize> = (0..n / 2).collect();
    net.split(&half);
    let t = net.elapsed();
    net.run_until(t + Duration::from_secs(400), |_| false);
    let other = net.nodes[n - 1].id();
    assert!(
        net.nodes[0].disc.view().get(&other).is_none(),
        "expired during the split"
    );
    net.heal();
    let t = net.elapsed();
    let rejoined = net.run_until(t + Duration::from_secs(60), |net| knows_all(net, &all));
    assert!(rejoined, "rejoined within 60 s (6 intervals)");
}

#[test]
fn a_lying_bootstrap_peer_is_reported_and_a_seed_brings_the_honest_network() {
    let honest = 16;
    let mut net = converged(honest);
    // The liar and its 20 Sybils know only each other.
    let liar = net.add(IpAddr::from([192, 168, 0, 1]), &[]);
    let sybils: Vec<usize> = (0..20)
        .map(|k| net.add(IpAddr::from([100, 64 + k as u8, 0, 1]), &[liar]))
        .collect();
    let mut theirs: HashSet<_> = sybils.iter().map(|i| net.nodes[*i].id()).collect();
    theirs.insert(net.nodes[liar].id());
    let theirs = Arc::new(theirs);
    for i in sybils.iter().chain([&liar]) {
        net.nodes[*i].only = Some(Arc::clone(&theirs));
    }
    let t = net.elapsed();
    let victim = net.add(IpAddr::from([10, 251, 0, 1]), &[liar]);
    net.run_until(t + Duration::from_secs(60), |_| false);
    let v = &net.nodes[victim].disc;
    assert_eq!(v.eclipse().state, EclipseState::OneSource);
    let honest_known = (0..honest)
        .filter(|i| v.view().get(&net.nodes[*i].id()).is_some())
        .count();
    assert_eq!(honest_known, 0, "eclipsed");
    // A seed (an honest node) passed by its operator: the honest network, and the report.
    net.fetch(victim, 5);
    let t = net.elapsed();
    let found = net.run_until(t + Duration::from_secs(120), |net| {
        let v = net.nodes[victim].disc.view();
        (0..honest).all(|i| {
            v.get(&net.nodes[i].id())
                .is_some_and(|e| e.reached().is_some())
        })
    });
    assert!(found, "the honest network learned through the seed");
    let e = net.nodes[victim].disc.eclipse();
    assert_ne!(
        e.state,
        EclipseState::Ok,
        "two sources that vouch for nothing of each other: {e:?}"
    );
}

#[test]
fn a_node_whose_only_peer_missed_one_exchange_tries_it_again() {
    let mut net = converged(8);
    // Its only peer (fetched as its `--peer`) hangs through the newcomer's first exchanges,
    // then answers again.
    let newcomer = net.add(ip(50), &[3]);
    net.nodes[3].hung = true;
    let t = net.elapsed();
    let timeout = net.nodes[newcomer].disc.exchange_timeout();
    net.run_until(t + timeout + Duration::from_secs(1), |_| false);
    assert!(
        net.nodes[newcomer].disc.view().len() <= 1,
        "cut off meanwhile"
    );
    net.nodes[3].hung = false;
    let all: Vec<usize> = (0..=newcomer).collect();
    let t = net.elapsed();
    assert!(
        net.run_until(t + Duration::from_secs(30), |net| knows_all(net, &all)),
        "the newcomer tried its peer again within a few intervals: {:?} {:?} {}",
        net.nodes[newcomer].disc.stats(),
        net.nodes[newcomer]
            .disc
            .view()
            .iter()
            .map(|e| (e.reached(), e.failures()))
            .collect::<Vec<_>>(),
        net.nodes[newcomer].probe_state()
    );
}

/// Hellos that fail while a node is forming (here ten of its 30 peers refuse for 3 s, as
/// peers saturated at a network's start do) are tried again within seconds, not after 10 s
/// then 40 s: the newcomer reaches them all within 8 s of its start.
#[test]
fn failed_hellos_are_tried_again_soon_while_a_node_is_forming() {
    let n = 30;
    let mut net = converged(n);
    let start = net.elapsed();
    let newcomer = net.add(ip(n), &[3]);
    for i in 10..20 {
        net.kill(i);
    }
    net.run_until(start + Duration::from_secs(3), |_| false);
    let d = &net.nodes[newcomer].disc;
    assert!(d.stats().exchanges_failed >= 10, "{:?}", d.stats());
    assert!(d.forming());
    for i in 10..20 {
        net.revive(i);
    }
    let all: Vec<usize> = (0..=n).collect();
    let reached = net.run_until(start + Duration::from_secs(8), |net| knows_all(net, &all));
    let d = &net.nodes[newcomer].disc;
    assert!(
        reached,
        "{:?} {}",
        d.stats(),
        net.nodes[newcomer].probe_state()
    );
    assert!(!d.forming());
}

/// A peer that answers busy (`429`) is asked again soon and nothing is counted against it:
/// a newcomer whose only peer is busy for 30 s holds it as healthy throughout, and has the
/// whole network within one interval once it answers.
#[test]
fn a_busy_peer_is_asked_again_soon_and_not_counted_as_failing() {
    let n = 8;
    let mut net = converged(n);
    let newcomer = net.add(ip(50), &[3]);
    net.nodes[3].busy = true;
    let t = net.elapsed();
    net.run_until(t + Duration::from_secs(30), |_| false);
    let id = net.nodes[3].id();
    let d = &net.nodes[newcomer].disc;
    let st = d.stats();
    assert!(st.exchanges_busy >= 3, "{st:?}");
    assert_eq!(st.exchanges_failed, 0, "{st:?}");
    assert!(d.view().get(&id).is_some_and(|e| e.healthy()));
    net.nodes[3].busy = false;
    let all: Vec<usize> = (0..=newcomer).collect();
    let t = net.elapsed();
    assert!(
        net.run_until(t + Duration::from_secs(10), |net| knows_all(net, &all)),
        "{:?}",
        net.nodes[newcomer].disc.stats()
    );
}

#[test]
fn on_one_shared_machine_the_network_forms_no_faster_than_its_cores_do_the_work() {
    let n = 24;
    let all: Vec<usize> = (0..n).collect();
    let formed = |cpu| {
        let mut net = network(
            n,
            SimConfig {
                cpu,
                ..sim(10, 3600)
            },
        );
        assert!(net.run_until(Duration::from_secs(300), |net| knows_all(net, &all)));
        let exchanges: u64 = net.nodes.iter().map(|x| x.disc.stats().exchanges).sum();
        (net.elapsed(), exchanges)
    };
    let (free, _) = formed(None);
    let per_exchange = Duration::from_millis(4);
    let (shared, exchanges) = formed(Some(sim::Cpu {
        cores: 1,
        per_exchange,
        slot_hold: Duration::ZERO,
    }));
    // One core did every exchange's work (but those still queued at the end) by then.
    let work = per_exchange * u32::try_from(exchanges).unwrap_or(u32::MAX);
    assert!(shared > free, "{shared:?} against {free:?}");
    assert!(
        shared.as_secs_f64() >= 0.8 * work.as_secs_f64(),
        "{shared:?} for {work:?} of work"
    );
}

/// Identity `i`'s descriptor, its endpoint in a /16 of its own.
fn signed(i: u8) -> Arc<Signed> {
    let endpoint = format!("https://10.{i}.0.1:7001");
    Arc::new(Signed::trusted(descriptor::for_test([i; 32], endpoint, T0)))
}

#[test]
fn a_failed_hello_is_tried_again_within_seconds_twice_unless_a_stranger_brought_only_itself() {
    let x = signed(200);
    let probe = |d: &mut Discovery, now: Now| {
        d.poll(now)
            .into_iter()
            .find(|o| o.to.d.node_id == x.d.node_id)
    };
    for (stranger, soon) in [(false, true), (true, false)] {
        // A node that formed: 20 peers the operator gave it, all reached.
        let now = Now {
            at: crate::clock::now().into_std(),
            unix: T0,
        };
        let mut d = Discovery::new([0xee; 32], Config::for_interval(Duration::from_secs(60)), 1);
        let peers: Vec<Arc<Signed>> = (1..=20).map(signed).collect();
        for p in &peers {
            d.operator(Arc::clone(p), now);
        }
        let origin = if stranger {
            Source::Stranger(7)
        } else {
            Source::Peer(peers[0].d.node_id)
        };
        assert!(d.learn(Arc::clone(&x), origin, now).is_ok());
        let first = probe(&mut d, now).expect("probed at once");
        d.on_reply(first.xid, Err(Failed::Down), Vec::new(), now);
        let later = Now {
            at: now.at + Duration::from_millis(3_100),
            unix: T0 + 3,
        };
        let second = probe(&mut d, later);
        assert_eq!(second.is_some(), soon, "stranger: {stranger}");
        // Its second retry, for a vouched identity, within seconds too (8 s, with jitter).
        if let Some(second) = second {
            d.on_reply(second.xid, Err(Failed::Down), Vec::new(), later);
            let third = Now {
                at: later.at + Duration::from_millis(12_100),
                unix: T0 + 15,
            };
            assert!(probe(&mut d, third).is_some());
        }
    }
}

#[test]
fn past_its_exchange_slots_a_node_sends_nothing_more_and_asks_again_later() {
    let now = Now {
        at: crate::clock::now().into_std(),
        unix: T0,
    };
    let mut cfg = Config::for_interval(Duration::from_secs(60));
    cfg.max_exchanges = 2;
    let mut d = Discovery::new([0xee; 32], cfg, 1);
    let peers: Vec<Arc<Signed>> = (1..=6).map(signed).collect();
    for p in &peers {
        d.operator(Arc::clone(p), now);
    }
    let outs = d.poll(now);
    assert_eq!(outs.len(), 2);
    assert_eq!(d.in_flight(), 2);
    let st = d.stats();
    assert!(st.exchanges_deferred >= 1, "{st:?}");
    assert_eq!(st.exchanges_busy, st.exchanges_deferred, "{st:?}");
    assert_eq!(st.exchanges_failed, 0, "{st:?}");
    // Nothing counted against a peer, and nothing more while the two are out.
    let healthy = |p: &Arc<Signed>| d.view().get(&p.d.node_id).is_some_and(|e| e.healthy());
    assert!(peers.iter().all(healthy));
    assert!(d.poll(now).is_empty());
    // Answered, the room is back: what was put off is asked again.
    for o in &outs {
        d.on_reply(o.xid, Ok(&Msg::Ack), Vec::new(), now);
    }
    let later = Now {
        at: now.at + Duration::from_secs(3),
        unix: T0 + 3,
    };
    let again = d.poll(later);
    assert!(!again.is_empty() && again.len() <= 2, "{again:?}");
}

#[test]
fn on_one_shared_machine_a_node_out_of_crypto_slots_answers_busy_and_the_network_still_forms() {
    let n = 24;
    let all: Vec<usize> = (0..n).collect();
    let mut net = network(
        n,
        SimConfig {
            // One core (four crypto slots, three for requests, two for strangers): each
            // request's work queued behind the others', its slot held that long again.
            cpu: Some(sim::Cpu {
                cores: 1,
                per_exchange: Duration::from_millis(4),
                slot_hold: Duration::from_millis(200),
            }),
            ..sim(10, 3600)
        },
    );
    assert!(net.run_until(Duration::from_secs(600), |net| knows_all(net, &all)));
    let st = |f: fn(&Stats) -> u64| net.nodes.iter().map(|x| f(&x.disc.stats())).sum::<u64>();
    assert!(st(|s| s.exchanges_busy) > st(|s| s.exchanges_deferred));
    assert_eq!(st(|s| s.exchanges_failed), 0);
    let (timed, mean) = net.exchange_time();
    assert!(timed > 0 && mean > Duration::from_millis(4), "{mean:?}");
}
