//! Retries and the end of a request, on real processes on loopback: a client that disconnects
//! leaves no route in flight, and a busy peer is recorded as busy, not as a transport failure;
//! and in process on tokio's paused clock, the forward's retry policy against a scripted next
//! hop. (Slow next hops within and beyond the deadline: `deadlines.rs`, in process.) Every loop
//! is bounded in count and time.

use crate::common;

use std::time::{Duration, Instant};

use blindrelay::proto::descriptor::Descriptor;
use common::{Doc, Net, counter, http};
use serde_json::Value;

async fn descriptor(net: &Net, i: usize) -> Descriptor {
    http()
        .get(format!("{}/v1/descriptor", net.node(i).endpoint))
        .send()
        .await
        .expect("descriptor")
        .json()
        .await
        .expect("descriptor JSON")
}

/// A frame along `path` (its previous hop: whoever posts it).
fn craft(path: &[&Descriptor], payload: &[u8]) -> Vec<u8> {
    let expires = blindrelay::send::wrap::expiry(common::unix_now());
    common::craft(path, payload, false, expires).frame
}

/// Polls node `i`'s status until `ok` holds (at most `within`); the last status.
async fn wait_status(net: &Net, i: usize, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let s = net.status(i).await;
        if ok(&s) || Instant::now() >= deadline {
            return s;
        }
        tokio::time::sleep(common::POLL).await;
    }
}

/// A client that disconnects while its request is forwarded does not leave the route
/// in flight for the whole window: the request runs to its end, its answer is stored, and the
/// same request sent again gets that answer; the message is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_leaves_no_route_in_flight() {
    let net = Net::start(2, &["--probe-interval", "0s"]).await;
    let (b, c) = (descriptor(&net, 0).await, descriptor(&net, 1).await);
    let body = craft(&[&b, &c], b"the client went away");
    // C hangs, so B's forward stays on the wire while the client goes away.
    net.signal(1, "STOP");
    // One identity for the first request and its retries (a retry is the same previous hop).
    let sender = http();
    let (client, endpoint, first) = (sender.clone(), b.endpoint.clone(), body.clone());
    let gone = tokio::spawn(async move { common::post(&client, &endpoint, first).await });
    let s = wait_status(&net, 0, Duration::from_secs(5), |s| {
        s.runtime()["admission"]["in_flight"].as_u64() == Some(1)
    })
    .await;
    assert_eq!(s.runtime()["admission"]["in_flight"], 1, "{s}");
    gone.abort();
    let _ = gone.await;
    net.signal(1, "CONT");
    // The same request again: answered (the stored answer), never `route_in_flight` for long.
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut answers = Vec::new();
    loop {
        let (status, what) = common::post(&sender, &b.endpoint, body.clone()).await;
        answers.push((status, what.clone()));
        if status != 503 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = answers.last().cloned().unwrap_or_default();
    assert_eq!(last, (200, "forwarded".to_string()), "{answers:?}");
    assert_eq!(net.inbox_ids(1).await.len(), 1, "stored once");
    let s = net.status(0).await;
    assert_eq!(counter(&s, "forwarded"), 1, "run once: {s}");
    assert_eq!(counter(&s, "forward_failed"), 0, "{s}");
}

/// The sender's side: a peer that answers `429`/`503` (here: its one replay slot is
/// taken, so a new route is over the source's share) is recorded in the sender's peer health
/// as busy, not as a transport failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_peer_is_recorded_as_busy_not_as_a_transport_failure() {
    let net = Net::start(2, &["--probe-interval", "0s", "--replay-capacity", "1"]).await;
    let (ok, _, err) = net.send(0, 1, 1, b"fills B's one replay slot").await;
    assert!(ok, "{err}");
    let (ok, _, _) = net.send(0, 1, 1, b"refused: no replay room").await;
    assert!(!ok);
    let b = net.status(1).await;
    assert_eq!(
        counter(&b, "replay_capacity") + counter(&b, "replay_share_exceeded"),
        1,
        "{b}"
    );
    let a = net.status(0).await;
    let row = common::peer_rows(&a)
        .iter()
        .find(|r| {
            net.node(1)
                .id
                .starts_with(r["node"].as_str().unwrap_or("-"))
        })
        .cloned()
        .expect("B's row at A");
    assert_eq!(row["reasons"]["busy"], 1, "{row}");
    assert!(row["reasons"].get("transport").is_none(), "{row}");
    assert_eq!(row["route_failures"], 0, "{row}");
    assert_eq!(row["health"], "healthy", "{row}");
}

/// A next hop answering from a script, one answer per request (no real node answers
/// `route_in_flight` or `429` on demand): the statuses and bodies it answers with, in order;
/// returns its URL and how many requests it got.
async fn scripted(
    script: Vec<(u16, &'static str)>,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    [u8; 32],
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind((common::fresh_ip(), 0))
        .await
        .expect("bind");
    let url = format!("https://{}/v2/relay", listener.local_addr().expect("addr"));
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random());
    let id = key.verifying_key().to_bytes();
    let tls = tokio_rustls::TlsAcceptor::from(blindrelay::links::server_config(&key).expect("tls"));
    let got = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&got);
    tokio::spawn(async move {
        for (status, body) in script {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let Ok(mut conn) = tls.accept(conn).await else {
                return;
            };
            // Head, then the body it declares; bounded in bytes and time.
            common::read_request(&mut conn).await;
            seen.fetch_add(1, Ordering::SeqCst);
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
    });
    (url, got, id)
}

/// `503 route_in_flight` and a `429` of a moment are retried within the budget and the
/// answer after them is taken; a `429` that lasts minutes (`quarantined`) is final. On tokio's
/// paused clock: the backoffs take no real time.
#[tokio::test(start_paused = true)]
async fn route_in_flight_and_busy_answers_are_retried_then_delivered() {
    use blindrelay::counters::Counters;
    use blindrelay::forward::{self, Forwarded};
    use blindrelay::outbound::{HopRate, Pacer, QueueLimits};
    use std::sync::atomic::Ordering;
    let accepted = r#"{"outcome":"forwarded","receipt":"abcd"}"#;
    let (url, got, hop) = scripted(vec![
        (503, r#"{"error":"route_in_flight"}"#),
        (429, r#"{"error":"backpressure"}"#),
        (503, r#"{"error":"route_in_flight"}"#),
        (200, accepted),
    ])
    .await;
    let pacer = Pacer::new(HopRate::default(), QueueLimits::default());
    let counters = Counters::default();
    let http = blindrelay::links::Links::new(
        None,
        std::sync::Arc::default(),
        blindrelay::links::LinkLimits {
            idle_per_peer: blindrelay::forward::PER_NEXT_HOP,
            clients: 2,
        },
        None,
    );
    let deadline = blindrelay::clock::now() + forward::HOP_DEADLINE;
    let turn = pacer.join(&hop, 10).expect("queue");
    let out = forward::post(&http, &url, b"frame", &[1; 16], &counters, deadline, turn).await;
    assert_eq!(
        out,
        Forwarded::Accepted {
            receipt: "abcd".into()
        }
    );
    assert_eq!(got.load(Ordering::SeqCst), 4);
    assert_eq!(
        (counters.busy_retried.get(), counters.retry_succeeded.get()),
        (3, 1)
    );
    // Final: a quarantine lasts minutes.
    let (url, got, hop) =
        scripted(vec![(429, r#"{"error":"quarantined"}"#), (200, accepted)]).await;
    let turn = pacer.join(&hop, 10).expect("queue");
    let out = forward::post(&http, &url, b"frame", &[2; 16], &counters, deadline, turn).await;
    assert!(
        matches!(out, Forwarded::Refused { status: 429, .. }),
        "{out:?}"
    );
    assert_eq!(got.load(Ordering::SeqCst), 1);
}
