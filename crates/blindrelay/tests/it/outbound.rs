//! Outbound traffic to a next hop is paced under the next hop's previous-hop rate and queued in
//! a bounded queue (issue 12, item 2), on real processes on loopback. The rate is shrunk with
//! `--previous-hop-limit`/`--previous-hop-window` (every node runs the same, as the pacer
//! assumes). Every loop is bounded in count and time.

use crate::common;

use std::time::{Duration, Instant};

use common::{Doc, Net, counter};
use serde_json::Value;

/// `POST /v1/send` of `n` messages from node `from` to node `to` over one hop, all at once:
/// each one's status, error code (or "delivered") and when it ended.
async fn send_at_once(net: &Net, from: usize, to: usize, n: usize) -> Vec<(u16, String, Duration)> {
    let http = net.op_http(from);
    let url = format!(
        "{}/v1/send?to={}&hops=1",
        net.node(from).operator,
        net.node(to).id
    );
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                let r = http
                    .post(url)
                    .body(format!("paced {i}"))
                    .send()
                    .await
                    .expect("operator API");
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                let what = if v["delivered"] == true {
                    "delivered".to_string()
                } else {
                    v["error"].as_str().unwrap_or("?").to_string()
                };
                (status, what, start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("send task"));
    }
    out
}

/// An honest node sending more than the limit to one peer in one window is paced, not
/// quarantined, and every message is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_node_over_the_limit_is_paced_not_quarantined() {
    let net = Net::start(
        2,
        &[
            "--probe-interval",
            "0s",
            "--previous-hop-limit",
            "10",
            "--previous-hop-window",
            "2s",
            "--next-hop-queue",
            "16",
            // What this measures is pacing: the sender's 16 wraps at once may wait for a crypto
            // slot on a loaded machine longer than the default 50 ms (a `backpressure` of its
            // own, not the pacer's).
            "--crypto-wait",
            "2s",
        ],
    )
    .await;
    let sent = send_at_once(&net, 0, 1, 16).await;
    let delivered = sent.iter().filter(|(_, w, _)| w == "delivered").count();
    let status = net.status(1).await;
    assert_eq!(
        counter(&status, "quarantine_started"),
        0,
        "{sent:?} {status}"
    );
    assert_eq!(counter(&status, "rate_limited"), 0, "{sent:?}");
    assert_eq!(delivered, 16, "{sent:?}");
    assert_eq!(net.inbox_ids(1).await.len(), 16);
    // Ten went at once; the other six waited for the window to move.
    let late = sent
        .iter()
        .filter(|(_, _, t)| *t >= Duration::from_millis(1900))
        .count();
    assert!(late >= 6, "{sent:?}");
    // A's own traffic to B still flows afterwards.
    let (ok, _, err) = net.send(0, 1, 1, b"after the burst").await;
    assert!(ok, "{err}");
}

/// A full queue gets a clear refusal, counted; what was queued is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_refused_clearly_and_the_queued_are_delivered() {
    let net = Net::start(
        2,
        &[
            "--probe-interval",
            "0s",
            "--previous-hop-limit",
            "2",
            "--previous-hop-window",
            "3s",
            "--next-hop-queue",
            "2",
        ],
    )
    .await;
    let sent = send_at_once(&net, 0, 1, 7).await;
    let count = |w: &str| sent.iter().filter(|(_, x, _)| x == w).count();
    assert_eq!(count("delivered"), 4, "{sent:?}");
    assert_eq!(count("next_hop_queue_full"), 3, "{sent:?}");
    for (status, what, took) in &sent {
        if what == "next_hop_queue_full" {
            assert_eq!(*status, 503);
            assert!(*took < Duration::from_secs(1), "refused at once: {took:?}");
        }
    }
    let a = net.status(0).await;
    assert_eq!(counter(&a, "next_hop_queue_full"), 3, "{a}");
    let b = net.status(1).await;
    assert_eq!(counter(&b, "quarantine_started"), 0, "{b}");
    assert_eq!(net.inbox_ids(1).await.len(), 4);
    // The operator sees the assumption and an empty queue once it drained.
    assert_eq!(a.runtime()["outbound"]["assumed_limit"], 2, "{a}");
    assert_eq!(a.runtime()["outbound"]["window_secs"], 3, "{a}");
    assert_eq!(a.runtime()["outbound"]["waiting"], 0, "{a}");
}
