//! The load: concurrent senders through node 0, the crypto-slot overload of one node, and the
//! percentiles of their round trips.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use blindrelay::send::Hop;
use ed25519_dalek::SigningKey;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::nodes::{Node, operator_client};
use crate::{MAX_SENDS, OPERATOR_PORT, RELAY_PORT};

/// Sends with `clients` concurrent loops for `len`, at most `MAX_SENDS`: successes' latencies
/// and the failures.
pub(crate) async fn run_case(
    sender: &Node,
    to: &str,
    hops: usize,
    payload: &[u8],
    clients: usize,
    len: Duration,
) -> (Vec<Duration>, usize, Duration) {
    let http = operator_client(sender);
    let url = format!(
        "http://{}:{OPERATOR_PORT}/v1/send?to={to}&hops={hops}",
        sender.ip
    );
    let started = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let until = t0 + len;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, url, body, started) = (
            http.clone(),
            url.clone(),
            payload.to_vec(),
            Arc::clone(&started),
        );
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (Vec::new(), 0usize);
            while Instant::now() < until && started.fetch_add(1, Ordering::Relaxed) < MAX_SENDS {
                let t = Instant::now();
                match http.post(&url).body(body.clone()).send().await {
                    Ok(r) if r.status().is_success() => ok.push(t.elapsed()),
                    Ok(r) => {
                        if failed == 0 && std::env::var_os("DELIVERY_DEBUG").is_some() {
                            let status = r.status();
                            eprintln!("failed: {status} {}", r.text().await.unwrap_or_default());
                        }
                        failed += 1;
                    }
                    Err(e) => {
                        if failed == 0 && std::env::var_os("DELIVERY_DEBUG").is_some() {
                            eprintln!("failed: {e}");
                        }
                        failed += 1;
                    }
                }
            }
            (ok, failed)
        }));
    }
    let (mut all, mut failed) = (Vec::new(), 0);
    for t in tasks {
        let (ok, f) = t.await.expect("client task");
        all.extend(ok);
        failed += f;
    }
    (all, failed, t0.elapsed())
}

/// The overload's answers as a Markdown table: by source, by the error named, their round trips.
pub(crate) fn print_overload(known: &Overload, strange: &Overload) {
    println!("| from | answer | count | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|---:|");
    for (from, probed) in [("known peer", known), ("stranger", strange)] {
        for (error, v) in &probed.answers {
            println!(
                "| {from} | `{error}` | {} | {:.2} | {:.2} | {:.2} |",
                v.len(),
                percentile(v, 50),
                percentile(v, 99),
                v.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
            );
        }
    }
}

/// The `p`-th percentile of `sorted` in milliseconds ([`nearest_rank`]), NaN when empty.
pub(crate) fn percentile(sorted: &[Duration], p: usize) -> f64 {
    nearest_rank(sorted, p as f64).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// The nearest-rank `p`-th percentile (0 < `p` ≤ 100) of `sorted` (ascending): the smallest
/// value with at least `p` % of the values at or below it; `None` when there is none. (The
/// same definition as etrelay's bench, `crates/etrelay/examples/bench/latency.rs`.)
fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let n = sorted.len();
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    (n > 0).then(|| sorted[rank.clamp(1, n) - 1])
}

/// Answers to requests that overload one node's crypto admission, by the error they got
/// (`backpressure`, `source_limited`, `onion_peel_failed`, …): how fast each came.
#[derive(Default)]
pub(crate) struct Overload {
    pub(crate) answers: std::collections::BTreeMap<String, Vec<Duration>>,
    pub(crate) errors: usize,
}

/// `conns` loops post from `from`, until `until`, a frame to `target` that passes the framing
/// and the signature and fails at the peel (an onion key nobody holds): each costs the node a
/// crypto slot, so together they keep the slots taken. Every answer's round trip is kept, by
/// the error it names.
pub(crate) async fn overload(
    target: &Node,
    from: Ipv4Addr,
    conns: usize,
    until: Instant,
) -> Overload {
    let id: [u8; 32] = hex::decode(&target.id)
        .ok()
        .and_then(|v| v.try_into().ok())
        .expect("a node id");
    let prober = SigningKey::from_bytes(&[201; 32]);
    let bogus = PublicKey::from(&StaticSecret::from([202; 32])).to_bytes();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let path = [Hop {
        node_id: id,
        onion_key: bogus,
    }];
    let frame = blindrelay::send::wrap::wrap(&path, &[0; 1024], false, now)
        .expect("wraps")
        .frame;
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config_as(&prober).expect("tls"))
        .no_proxy()
        .local_address(Some(from.into()))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let url = format!("https://{}:{RELAY_PORT}/v2/relay", target.ip);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (http, url, frame) = (http.clone(), url.clone(), frame.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Overload::default();
            let mut n = 0;
            while Instant::now() < until && n < MAX_SENDS {
                n += 1;
                let t = Instant::now();
                match http.post(&url).body(frame.clone()).send().await {
                    Ok(r) => {
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        let took = t.elapsed();
                        let error = body["error"].as_str().unwrap_or("(no error)").to_owned();
                        out.answers.entry(error).or_default().push(took);
                    }
                    Err(_) => out.errors += 1,
                }
            }
            out
        }));
    }
    let mut all = Overload::default();
    for t in tasks {
        let o = t.await.expect("prober task");
        for (error, took) in o.answers {
            all.answers.entry(error).or_default().extend(took);
        }
        all.errors += o.errors;
    }
    for v in all.answers.values_mut() {
        v.sort_unstable();
    }
    all
}
