//! Routes that avoid failing peers, on real processes, each node in a /16 of its own: with two
//! middles of eight nodes dead, every three-hop send is delivered (a route through a dead hop
//! is tried again over another, the message stored once), the dead are avoided after their
//! first failure and taken back once they answer a recovery probe, and a send that cannot be
//! delivered names the hop that failed. Every wait is bounded.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Net, counter, peer_rows};
use serde_json::Value;

/// Node `of`'s peer health row of node `who`, if shown.
fn row<'a>(net: &Net, status: &'a Value, who: usize) -> Option<&'a Value> {
    let prefix = net.node(who).prefix().to_string();
    peer_rows(status).iter().find(|r| r["node"] == prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_go_around_dead_middles_and_take_them_back_once_they_answer() {
    let mut net = Net::start(8, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let dead = [3, 5];
    for &i in &dead {
        net.kill9(i).await;
    }
    let live: Vec<usize> = (1..8).filter(|i| !dead.contains(i)).collect();
    let mut sent: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
    let mut rerouted_sends = 0;
    for k in 0..20 {
        let to = live[k % live.len()];
        let payload = format!("around the dead {k}").into_bytes();
        let (ok, out, err) = net.send(0, to, 3, &payload).await;
        assert!(ok, "send {k} to node {to}: {out} {err}");
        // "(route N: the ones before it failed; stored once)"
        if let Some(n) = out
            .split("(route ")
            .nth(1)
            .and_then(|r| r.split(':').next())
        {
            rerouted_sends += n.parse::<u64>().expect("a route number") - 1;
        }
        sent.entry(to).or_default().push(payload);
    }
    let s = net.status(0).await;
    assert_eq!(counter(&s, "verified_client_onion_deliveries"), 20, "{s}");
    // Each dead middle costs at most one failed route: it is avoided from its first failure.
    let rerouted = counter(&s, "send_rerouted");
    assert_eq!(rerouted, rerouted_sends, "{s}");
    assert!(
        rerouted <= dead.len() as u64,
        "{rerouted} routes through the dead: {s}"
    );
    for &i in &dead {
        if let Some(r) = row(&net, &s, i) {
            assert_eq!(r["in_routes"], false, "a dead node in routes: {r}");
        }
    }
    // Nothing delivered twice: each terminal holds exactly what was sent to it.
    for (&to, payloads) in &sent {
        let ids = net.inbox_ids(to).await;
        assert_eq!(ids.len(), payloads.len(), "node {to}'s inbox");
        let s = net.status(to).await;
        assert_eq!(counter(&s, "duplicate_message"), 0, "{s}");
    }
    // A dead node restarted is taken back: a first hop that failed once it answers a recovery
    // probe (5 s after its failure, at most 10 s after its second); a later hop, whose failure
    // this node only heard of in the route's report, once the same wait is over, with no probe
    // (it could have been a send's terminal: nothing this node does next goes to it).
    if rerouted > 0 {
        let failed: Vec<usize> = dead
            .iter()
            .copied()
            .filter(|&i| row(&net, &s, i).is_some_and(|r| r["route_failures"].as_u64() > Some(0)))
            .collect();
        for &i in &dead {
            net.revive(i).await;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for &i in &failed {
            loop {
                let s = net.status(0).await;
                if row(&net, &s, i).is_some_and(|r| r["in_routes"] == true) {
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} never taken back: {s}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_cannot_be_delivered_names_the_failed_hop() {
    let mut net = Net::start(5, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    net.kill9(4).await;
    // The terminal is dead: every route fails at its last hop, and the message says so.
    let (ok, out, err) = net.send(0, 4, 2, b"to the dead").await;
    assert!(!ok, "{out}");
    let prefix = net.node(4).prefix().to_string();
    assert!(
        err.contains(&format!(
            "hop 2 of 2 ({prefix}), the terminal, did not answer"
        )) && err.contains("3 routes tried"),
        "unclear message: {err:?}"
    );
    let s = net.status(0).await;
    assert_eq!(counter(&s, "send_rerouted"), 2, "{s}");
    // Its previous hops each saw it fail; none of them is blamed by the sender.
    for i in 1..4 {
        let r = row(&net, &s, i).expect("a middle's row");
        assert_eq!(r["route_failures"], 0, "middle {i}: {r}");
    }
    assert_eq!(
        row(&net, &s, 4).expect("the terminal's row")["in_routes"],
        false
    );
    // The entry hop dead: hop 1 named, at once.
    let (ok, _, err) = net.send(1, 4, 1, b"to the dead, direct").await;
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "hop 1 of 1 ({prefix}) did not answer (1 route tried)"
        )),
        "unclear message: {err:?}"
    );
}
