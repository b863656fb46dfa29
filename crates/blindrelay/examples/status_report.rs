//! What the status document and its periodic push cost: the document's size, the time to
//! build and serialize it, and one push's round trip to a receiver on loopback, for an idle
//! node and for one whose peer health table is full (4 096 peers, every reason bucket used).
//!
//! Bounded: 200 documents and 200 pushes per case, on 127.0.0.1 only. Run with
//! `scripts/bench-blindrelay-report` (release build), which prints a Markdown table.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blindrelay::clock::Clock;
use blindrelay::daemon::{self, RelayConfig, RunConfig};
use blindrelay::health::MAX_TRACKED;
use blindrelay::reason::Reason;
use blindrelay::relay::Relay;
use blindrelay::replay::ReplayStore;
use blindrelay::status;

const ROUNDS: usize = 200;

/// Builds and serializes the document `ROUNDS` times: its size and the mean time per document.
fn document_cost(relay: &Relay) -> (usize, Duration) {
    let start = Instant::now();
    let mut size = 0;
    for _ in 0..ROUNDS {
        let body = serde_json::to_vec(&status::document(relay)).expect("serializes");
        size = body.len();
    }
    (size, start.elapsed() / ROUNDS as u32)
}

/// Pushes `body` `ROUNDS` times to `url`, one after the other: median and p99 round trip.
async fn push_cost(http: &reqwest::Client, url: &str, body: &[u8]) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let resp = http
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .expect("push");
        assert!(resp.status().is_success());
        took.push(t.elapsed());
    }
    took.sort();
    (took[ROUNDS / 2], took[ROUNDS * 99 / 100])
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let dir = state.path().join("node");
    let now = Clock::System.unix();
    blindrelay::node::init(&dir, "https://127.0.0.1:7001", now)?;
    let built = daemon::build(RunConfig {
        state_dir: dir,
        peers: vec![],
        replay_store: ReplayStore::Sqlite,
        relay: RelayConfig::new(true),
        clock: Clock::System,
        accept_lost_state: false,
    })?;
    let relay = Arc::clone(&built.relay);

    // The receiver: answers every push with 204.
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let url = format!("http://{}/report", listener.local_addr()?);
    let app = axum::Router::new().route(
        "/report",
        axum::routing::post(|_: axum::body::Bytes| async { axum::http::StatusCode::NO_CONTENT }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    blindrelay::links::install_provider();
    let http = reqwest::Client::builder()
        .timeout(blindrelay::report::DEFAULT_TIMEOUT)
        .no_proxy()
        .build()?;

    println!("| node | document | build + serialize | push round trip (median / p99) |");
    println!("|---|---:|---:|---:|");
    for case in ["idle", "peer health table full (4 096 peers)"] {
        if case != "idle" {
            let health = &relay.ctx().health;
            let reasons = [
                Reason::RateLimited,
                Reason::Quarantined,
                Reason::SelfLoop,
                Reason::TimestampExpired,
                Reason::ReplayConflict,
            ];
            for i in 0..MAX_TRACKED as u32 {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.to_be_bytes());
                health.record_refusal(&id, reasons[i as usize % reasons.len()], now);
                health.record_route(&id, i % 3 == 0, now);
            }
        }
        let (size, build) = document_cost(&relay);
        let body = serde_json::to_vec(&status::document(&relay))?;
        let (median, p99) = push_cost(&http, &url, &body).await;
        println!(
            "| {case} | {:.1} KiB | {:.0} µs | {:.0} µs / {:.0} µs |",
            size as f64 / 1024.0,
            build.as_secs_f64() * 1e6,
            median.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
        );
    }
    Ok(())
}
