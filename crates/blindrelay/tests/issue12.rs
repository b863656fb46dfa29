//! The guard blames the right peer and the design's promises hold (issue 12), on real
//! processes on loopback. Every loop is bounded in count and time.

mod common;

use std::time::{Duration, Instant};

use blindrelay::proto::descriptor::Descriptor;
use blindrelay::proto::envelope::Envelope;
use blindrelay::proto::onion::{self, Hop, Route};
use common::{Net, counter, http};
use ed25519_dalek::SigningKey;
use serde_json::Value;

/// The descriptor of node `i`.
async fn descriptor(net: &Net, i: usize) -> Descriptor {
    let url = format!("{}/v1/descriptor", net.node(i).endpoint);
    http()
        .get(url)
        .send()
        .await
        .expect("descriptor")
        .json()
        .await
        .expect("descriptor JSON")
}

fn unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs()
}

/// A frame along `path` (this process as the sender, signed by `key`) with `ttl`, its route.
fn craft(key: &SigningKey, path: &[&Descriptor], ttl: u8, payload: &[u8]) -> (Vec<u8>, Route) {
    let hops: Vec<_> = path
        .iter()
        .map(|d| Hop {
            node_id: d.node_id,
            onion_key: d.onion_key,
        })
        .collect();
    let route = onion::build(&hops, payload).expect("route");
    let env = Envelope::sign(
        route.first_route_id,
        path[0].node_id,
        ttl,
        unix(),
        route.blob.clone(),
        key,
    );
    (env.encode(), route)
}

/// Posts `body` to `endpoint`: the status and the reason or outcome.
async fn post(client: &reqwest::Client, endpoint: &str, body: Vec<u8>) -> (u16, String) {
    match client
        .post(format!("{endpoint}/v1/relay"))
        .body(body)
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            let what = v["error"].as_str().or(v["outcome"].as_str()).unwrap_or("?");
            (status, what.to_string())
        }
        Err(_) => (0, "no answer".into()),
    }
}

/// The row of the peer whose id starts with `prefix` in `status`'s peer health.
fn row<'a>(status: &'a Value, prefix: &str) -> Option<&'a Value> {
    common::peer_rows(status)
        .iter()
        .find(|r| prefix.starts_with(r["node"].as_str().unwrap_or("-")))
}

/// Item 1: frames a stranger seals so that the hop after an honest relay finds a route loop or
/// no TTL left do not get the honest relay quarantined; the stranger gets nothing but refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_loops_and_ttl_cannot_get_an_honest_relay_quarantined() {
    let net = Net::start(4, &["--probe-interval", "0s"]).await;
    let (b, c, d) = (
        descriptor(&net, 1).await,
        descriptor(&net, 2).await,
        descriptor(&net, 3).await,
    );
    let stranger = SigningKey::from_bytes(&rand::random());
    let client = http();
    let mut refused = Vec::new();
    for i in 0..30 {
        // Even: D's layer sends it back to B (route loop at D). Odd: B's frame to D carries
        // ttl 0 while D's layer says forward (ttl exhausted at D).
        let (body, _) = if i % 2 == 0 {
            craft(&stranger, &[&b, &d, &b], 2, format!("loop {i}").as_bytes())
        } else {
            craft(&stranger, &[&b, &d, &c], 1, format!("ttl {i}").as_bytes())
        };
        refused.push(post(&client, &b.endpoint, body).await);
    }
    for (status, reason) in &refused {
        assert!(
            matches!(
                reason.as_str(),
                "route_loop" | "ttl_exhausted" | "forward_failed"
            ),
            "{status} {reason}"
        );
    }
    let status = net.status(3).await;
    assert!(
        counter(&status, "loop_detected") + counter(&status, "ttl_exhausted") > 0,
        "D saw the crafted frames: {status}"
    );
    assert_eq!(counter(&status, "quarantine_started"), 0, "{status}");
    let b_row = row(&status, net.node(1).prefix()).expect("B's row at D");
    assert_eq!(b_row["quarantined"], false, "{b_row}");
    // B's own traffic to D still flows.
    let (ok, _, err) = net.send(1, 3, 1, b"from B after the attack").await;
    assert!(ok, "{err}");
    let (ok, _, err) = net.send(0, 3, 2, b"from A through B or C").await;
    assert!(ok, "{err}");
}
