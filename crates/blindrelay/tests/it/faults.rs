//! Faults of a next hop (issue 15, item 3), on real processes: node 0 sends to node 2 through
//! node 1, and node 2's address is taken over by a fake that holds node 2's identity key (so the
//! pinned TLS link comes up) and misbehaves at the HTTP level without reading the frame: it
//! never answers, resets the connection, answers garbage over TLS, or answers bytes that are not
//! TLS. Each send ends within its deadline, the fake gets at most the bounded attempts, node 1
//! counts the failed forward and marks node 2 (not node 0) in its peer health, node 0 neither
//! quarantines node 1 (which only passed the failure on) nor notes it as failed (`beyond`, not
//! `refused`), the retry counters say how each forward ended (`retry_exhausted` after retries,
//! `deadline_exhausted` with none), and once node 2 is back the nodes
//! deliver again. The fake serves node 2's real descriptor (fetched before) byte for byte.
//!
//! The figures (`FIGURE next hop …` lines, `--nocapture`) show per fault the time the send
//! took, the attempts, node 1's counters and both nodes' view of the next hop.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Net, RELAY_PORT, counter, hex, http, peer_rows, random_bytes};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// How the fake next hop misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Reads the request and never answers (the connection is held, at most [`HOLD`]).
    Silent,
    /// Resets the TCP connection as soon as it is accepted.
    Reset,
    /// Completes TLS and answers `200` with random bytes as the body.
    Garbage,
    /// Answers random bytes that are not TLS.
    NotTls,
}

/// Longest a silent fake holds a connection.
const HOLD: Duration = Duration::from_secs(30);
/// Attempts a hop makes at most after timeouts and connection or request errors.
const MAX_ATTEMPTS: usize = 3;

/// The fake: connections and relay requests it got, and how it misbehaves now.
struct FakeHop {
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    fault: Arc<std::sync::Mutex<Fault>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeHop {
    /// Misbehaves as `fault` from now on, its counts at zero.
    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
        self.connections.store(0, Ordering::SeqCst);
        self.requests.store(0, Ordering::SeqCst);
    }

    /// Stops listening (the address is free once this returns).
    async fn stop(&mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for FakeHop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeHop {
    /// Listens on `addr` as the node whose identity seed is `seed`, misbehaving as `fault`.
    async fn start(addr: SocketAddr, seed: [u8; 32], descriptor: Vec<u8>) -> Self {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind fake");
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let tls = tokio_rustls::TlsAcceptor::from(
            blindrelay::links::server_config(&key).expect("tls config"),
        );
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let fault = Arc::new(std::sync::Mutex::new(Fault::Silent));
        let (c, r, f) = (
            Arc::clone(&connections),
            Arc::clone(&requests),
            Arc::clone(&fault),
        );
        let descriptor = Arc::new(descriptor);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let fault = *f.lock().unwrap();
                let (tls, r, descriptor) = (tls.clone(), Arc::clone(&r), Arc::clone(&descriptor));
                tokio::spawn(async move {
                    match fault {
                        Fault::Reset => {
                            let _ = conn.set_zero_linger();
                            r.fetch_add(1, Ordering::SeqCst);
                            drop(conn);
                            return;
                        }
                        Fault::NotTls => {
                            let mut conn = conn;
                            r.fetch_add(1, Ordering::SeqCst);
                            let _ = conn.write_all(&random_bytes(512)).await;
                            let _ = conn.shutdown().await;
                            return;
                        }
                        Fault::Silent | Fault::Garbage => {}
                    }
                    let Ok(Ok(mut conn)) =
                        tokio::time::timeout(Duration::from_secs(5), tls.accept(conn)).await
                    else {
                        return;
                    };
                    let head = common::read_request(&mut conn).await;
                    if head.starts_with("GET /v1/descriptor") {
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\nconnection: close\r\n\r\n",
                            descriptor.len()
                        );
                        let _ = conn.write_all(answer.as_bytes()).await;
                        let _ = conn.write_all(&descriptor).await;
                        let _ = conn.shutdown().await;
                        return;
                    }
                    r.fetch_add(1, Ordering::SeqCst);
                    match fault {
                        Fault::Silent => tokio::time::sleep(HOLD).await,
                        _ => {
                            let body = random_bytes(64);
                            let head = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                body.len()
                            );
                            let _ = conn.write_all(head.as_bytes()).await;
                            let _ = conn.write_all(&body).await;
                            let _ = conn.shutdown().await;
                        }
                    }
                });
            }
        });
        FakeHop {
            connections,
            requests,
            fault,
            task,
        }
    }
}

/// The counters of node `i` that a failed forward moves.
async fn counters(net: &Net, i: usize) -> [u64; 5] {
    let s = net.status(i).await;
    [
        counter(&s, "forward_failed"),
        counter(&s, "retry_attempted"),
        counter(&s, "retry_exhausted"),
        counter(&s, "quarantine_started"),
        counter(&s, "deadline_exhausted"),
    ]
}

/// Node `i`'s peer health row for node `j`.
async fn row(net: &Net, i: usize, j: usize) -> Value {
    let s = net.status(i).await;
    let prefix = net.node(j).prefix().to_string();
    peer_rows(&s)
        .iter()
        .find(|r| r["node"].as_str() == Some(prefix.as_str()))
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_hop_that_times_out_resets_or_answers_garbage() {
    let mut net = Net::start(3, &[]).await;
    let first = format!("before {}", hex(&random_bytes(8))).into_bytes();
    let (ok, out, err) = net.send(0, 2, 2, &first).await;
    assert!(ok, "{out} {err}");
    let descriptor = http()
        .get(format!("{}/v1/descriptor", net.node(2).endpoint))
        .send()
        .await
        .expect("descriptor")
        .bytes()
        .await
        .expect("descriptor body")
        .to_vec();
    let seed: [u8; 32] = std::fs::read(net.node(2).state_dir.join("identity.key"))
        .expect("identity key")
        .try_into()
        .expect("32-byte seed");
    let addr = SocketAddr::from((net.node(2).ip, RELAY_PORT));
    net.kill9(2).await;

    let mut fake = FakeHop::start(addr, seed, descriptor).await;
    for fault in [Fault::Reset, Fault::NotTls, Fault::Garbage, Fault::Silent] {
        fake.set(fault);
        let (before1, before0) = (counters(&net, 1).await, counters(&net, 0).await);
        let t = Instant::now();
        let p = format!("{fault:?} {}", hex(&random_bytes(8))).into_bytes();
        let (ok, out, err) = net.send(0, 2, 2, &p).await;
        let took = t.elapsed();
        let (after1, after0) = (counters(&net, 1).await, counters(&net, 0).await);
        let requests = fake.requests.load(Ordering::SeqCst);
        let connections = fake.connections.load(Ordering::SeqCst);
        let (to2, to1) = (row(&net, 1, 2).await, row(&net, 0, 1).await);
        println!(
            "FIGURE next hop {fault:?}: send failed in {:.2} s ({}), the fake got {requests} \
             request(s) on {connections} connection(s); node 1 forward_failed +{}, \
             retry_attempted +{}, retry_exhausted +{}, deadline_exhausted +{}; node 1 sees node \
             2 as {} ({}); node 0 sees node 1 as {} ({})",
            took.as_secs_f64(),
            err.trim(),
            after1[0] - before1[0],
            after1[1] - before1[1],
            after1[2] - before1[2],
            after1[4] - before1[4],
            to2["health"],
            to2["reasons"],
            to1["health"],
            to1["reasons"],
        );
        assert!(!ok, "{fault:?}: delivered? {out}");
        assert!(
            (1..=MAX_ATTEMPTS).contains(&requests),
            "{fault:?}: {requests} attempts"
        );
        assert!(took < Duration::from_secs(25), "{fault:?}: {took:?}");
        assert_eq!(after1[0] - before1[0], 1, "{fault:?}: one failed forward");
        assert!(after1[1] - before1[1] < MAX_ATTEMPTS as u64, "{fault:?}");
        // Node 1 passed on a failure that is not its own: node 0 does not quarantine it (its
        // peer health does note node 1's refusals: see the crate docs).
        assert_eq!(
            after0[3], before0[3],
            "{fault:?}: node 0 quarantined someone"
        );
        assert_eq!(to1["quarantined"], false, "{fault:?}: {to1}");
        // Nor does it note them as node 1's failures: node 1 answered, and said a hop past it
        // failed (`beyond`).
        assert!(
            !matches!(to1["health"].as_str(), Some("degraded" | "failing")),
            "{fault:?}: node 0 blames node 1: {to1}"
        );
        assert!(to1["reasons"].get("refused").is_none(), "{fault:?}: {to1}");
        assert!(
            to1["reasons"]["beyond"].as_u64() >= Some(1),
            "{fault:?}: {to1}"
        );
        // The retry counters say what happened: the attempts made, and how the forward ended.
        let (retries, exhausted, timed_out) = (
            after1[1] - before1[1],
            after1[2] - before1[2],
            after1[4] - before1[4],
        );
        assert!(
            retries < requests as u64,
            "{fault:?}: {retries} retries for {requests} attempts"
        );
        match fault {
            Fault::Garbage => assert_eq!((exhausted, timed_out), (0, 0), "{fault:?}: an answer"),
            _ if retries > 0 => assert_eq!((exhausted, timed_out), (1, 0), "{fault:?}"),
            _ => assert_eq!(
                (exhausted, timed_out),
                (0, 1),
                "{fault:?}: no time for a retry"
            ),
        }
        assert_ne!(
            to2["health"], "healthy",
            "{fault:?}: node 1 still trusts node 2: {to2}"
        );
    }

    fake.stop().await;

    // Node 2 back: the nodes deliver again.
    net.restart(2).await;
    let last = format!("after {}", hex(&random_bytes(8))).into_bytes();
    let mut delivered = false;
    for _ in 0..3 {
        if net.send(0, 2, 2, &last).await.0 {
            delivered = true;
            break;
        }
    }
    assert!(delivered, "no delivery once node 2 is back");
    net.stop_all().await;
}
