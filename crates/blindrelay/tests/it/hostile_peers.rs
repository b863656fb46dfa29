//! Hostile peers on real processes on loopback: frames a stranger seals into route loops cannot
//! get an honest relay quarantined (the guard blames the right peer), and a lying `--peer` URL
//! cannot hand out identities, memory or an endless descriptor. Every loop is bounded in count
//! and time.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blindrelay::proto::descriptor::Descriptor;
use common::{Doc, Net, counter, http};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// A frame along `path` (this process as the sender).
fn craft(path: &[&Descriptor], payload: &[u8]) -> Vec<u8> {
    let expires = blindrelay::send::wrap::expiry(unix());
    common::craft(path, payload, false, expires).frame
}

/// The row of the peer whose id starts with `prefix` in `status`'s peer health.
fn row<'a>(status: &'a Value, prefix: &str) -> Option<&'a Value> {
    common::peer_rows(status)
        .iter()
        .find(|r| prefix.starts_with(r["node"].as_str().unwrap_or("-")))
}

/// Frames a stranger seals so that the hop after an honest relay finds a route loop (its
/// slot names the previous hop, or itself) do not get the honest relay quarantined; the stranger
/// gets nothing but refusals. (v1's sealed "no TTL left" has no v2 form: the route's length is
/// sealed, no hop reads a TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_loops_cannot_get_an_honest_relay_quarantined() {
    let net = Net::start(4, &["--probe-interval", "0s"]).await;
    let (b, d) = (descriptor(&net, 1).await, descriptor(&net, 3).await);
    // A stranger's client: an identity of its own.
    let client = http();
    let mut refused = Vec::new();
    for i in 0..30 {
        // Even: D's layer sends it back to B. Odd: D's layer sends it to D itself. Both are a
        // route loop at D, sealed where B cannot see it.
        let body = if i % 2 == 0 {
            craft(&[&b, &d, &b], format!("loop {i}").as_bytes())
        } else {
            craft(&[&b, &d, &d], format!("self {i}").as_bytes())
        };
        refused.push(common::post(&client, &b.endpoint, body).await);
    }
    for (status, reason) in &refused {
        assert!(
            matches!(reason.as_str(), "route_loop" | "forward_failed"),
            "{status} {reason}"
        );
    }
    let status = net.status(3).await;
    assert!(
        counter(&status, "route_loop") > 0,
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

/// A `--peer` URL that is not an honest peer (no real peer behaves like this, so the test
/// serves it): `/sybil` answers each fetch with a new identity, `/huge` with an endless body,
/// `/forever` with a descriptor valid until 2⁶³−1.
/// Over TLS as the node whose key is `key`: `/sybil`'s first answer to each source is that
/// identity (trusted on first use), every later one another (refused: it is not the link's key).
#[derive(Debug, Clone)]
struct Liar {
    key: Arc<SigningKey>,
    first: Arc<Mutex<std::collections::HashSet<std::net::IpAddr>>>,
    sybil_fetches: Arc<AtomicU64>,
    /// Bytes written to each `/huge` connection before the reader went away.
    huge: Arc<Mutex<Vec<u64>>>,
}

/// Most bytes `/huge` writes to one connection.
const HUGE: u64 = 256 << 20;

impl Liar {
    async fn start() -> (Liar, SocketAddr) {
        let listener = tokio::net::TcpListener::bind((common::fresh_ip(), 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let key = SigningKey::from_bytes(&rand::random());
        let tls =
            tokio_rustls::TlsAcceptor::from(blindrelay::links::server_config(&key).expect("tls"));
        let liar = Liar {
            key: Arc::new(key),
            first: Arc::default(),
            sybil_fetches: Arc::default(),
            huge: Arc::default(),
        };
        let me = liar.clone();
        tokio::spawn(async move {
            // Bounded: a test's nodes fetch a few times a second.
            for _ in 0..2000 {
                let Ok((conn, from)) = listener.accept().await else {
                    return;
                };
                let (me, tls) = (me.clone(), tls.clone());
                tokio::spawn(async move {
                    if let Ok(Ok(conn)) =
                        tokio::time::timeout(Duration::from_secs(5), tls.accept(conn)).await
                    {
                        me.answer(conn, from.ip()).await;
                    }
                });
            }
        });
        (liar, addr)
    }

    async fn answer(
        self,
        mut conn: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        from: std::net::IpAddr,
    ) {
        let mut head = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let key = SigningKey::from_bytes(&rand::random());
        let onion: [u8; 32] =
            x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<
                [u8; 32],
            >()))
            .to_bytes();
        let now = unix();
        let body = if head.starts_with("GET /sybil/") {
            self.sybil_fetches.fetch_add(1, Ordering::Relaxed);
            let key = if self.first.lock().unwrap().insert(from) {
                (*self.key).clone()
            } else {
                key
            };
            // Short-lived, and fetched again every round anyway.
            Descriptor::sign(&key, onion, "not routable", now, 602)
        } else if head.starts_with("GET /forever/") {
            Descriptor::sign(&key, onion, "not routable either", now, (1 << 63) - 1 - now)
        } else if head.starts_with("GET /huge/") {
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
                .await;
            let chunk = vec![b' '; 64 * 1024];
            let mut written = 0u64;
            while written < HUGE {
                let w = tokio::time::timeout(Duration::from_secs(10), conn.write_all(&chunk)).await;
                if !matches!(w, Ok(Ok(()))) {
                    break;
                }
                written += chunk.len() as u64;
            }
            self.huge.lock().unwrap().push(written);
            return;
        } else {
            return;
        };
        let body = serde_json::to_vec(&body).expect("json");
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(head.as_bytes()).await;
        let _ = conn.write_all(&body).await;
        let _ = conn.flush().await;
        let _ = conn.shutdown().await;
    }
}

/// One `--peer` URL is one identity (trusted on first use here, pinned `ID@URL` for
/// the honest peers), a descriptor body is dropped at 4 096 bytes while it is read, and a
/// descriptor cannot claim to live forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_url_cannot_hand_out_identities_or_memory() {
    let (liar, addr) = Liar::start().await;
    let (sybil, huge, forever) = (
        format!("https://{addr}/sybil"),
        format!("https://{addr}/huge"),
        format!("https://{addr}/forever"),
    );
    let net = Net::start(
        2,
        &[
            "--probe-interval",
            "0s",
            "--peer",
            &sybil,
            "--peer",
            &huge,
            "--peer",
            &forever,
        ],
    )
    .await;
    // Wait (bounded) until the liar has answered several rounds and the huge body was cut.
    let deadline = Instant::now() + Duration::from_secs(15);
    while (liar.sybil_fetches.load(Ordering::Relaxed) < 6 || liar.huge.lock().unwrap().len() < 2)
        && Instant::now() < deadline
    {
        tokio::time::sleep(common::POLL).await;
    }
    assert!(
        liar.sybil_fetches.load(Ordering::Relaxed) >= 6,
        "the nodes kept fetching"
    );
    let status = net.status(0).await;
    // B, and the sybil URL's first identity: nothing else, and nothing from /forever.
    assert_eq!(
        status.runtime()["peers"]["known"],
        2,
        "{}",
        status.runtime()["peers"]
    );
    assert!(
        status.runtime()["peers"]["identity_changes"]
            .as_u64()
            .unwrap_or(0)
            >= 2,
        "{}",
        status.runtime()["peers"]
    );
    let node = net.node(0);
    assert_eq!(node.count("trusted on first use"), 1, "{:?}", node.lines());
    // Every refusal is counted; the warning is written at most once a minute.
    assert_eq!(node.count("another identity"), 1, "{:?}", node.lines());
    let cut = liar.huge.lock().unwrap().clone();
    assert!(cut.len() >= 2);
    for written in cut {
        // What the kernel buffers, not what the node kept.
        assert!(
            written < 16 << 20,
            "the node read {written} bytes of a huge body"
        );
    }
    let rss = net.peak_rss_kib(0);
    assert!(rss < 64 * 1024, "peak RSS {rss} KiB");
    let out = net
        .cli(&["status", "--operator", &net.node(0).operator])
        .await;
    assert!(out.out().contains("another identity"), "{}", out.out());
}

/// `n` frames of the smallest class whose layer opens nowhere, posted back to back by `client`
/// to `endpoint` over 16 connections (as many as a peer's link keeps): the answers' reasons,
/// counted.
async fn junk_burst(
    client: &reqwest::Client,
    endpoint: &str,
    n: usize,
) -> std::collections::BTreeMap<String, usize> {
    use blindrelay::proto::sphinx::{self, SizeClass};
    const LINKS: usize = 16;
    let tasks: Vec<_> = (0..LINKS.min(n))
        .map(|w| {
            let (client, endpoint) = (client.clone(), endpoint.to_string());
            tokio::spawn(async move {
                let mut reasons = Vec::new();
                for _ in (w..n).step_by(LINKS) {
                    let mut frame = common::random_bytes(SizeClass::Small.packet_len());
                    frame[..2].copy_from_slice(&[sphinx::VERSION, 0]);
                    reasons.push(common::post(&client, &endpoint, frame).await.1);
                }
                reasons
            })
        })
        .collect();
    let mut by = std::collections::BTreeMap::new();
    for t in tasks {
        for reason in t.await.expect("post task") {
            *by.entry(reason).or_default() += 1;
        }
    }
    by
}

/// Waits (bounded) until node `i` logged a line with `needle`; returns that line.
async fn logged(net: &Net, i: usize, needle: &str) -> String {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(l) = net.node(i).lines().into_iter().find(|l| l.contains(needle)) {
            return l;
        }
        assert!(
            Instant::now() < end,
            "node {i} never logged {needle:?}:\n{}",
            net.node(i).lines().join("\n")
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// A known peer (a real node's identity, posting from its address) sends 130 junk frames back
/// to back: the victim's status is `protecting` and names that peer and why, never
/// `attention` / "more CPU"; its health row says its share of crypto slots is cut once its
/// frames keep failing; a second burst then cannot push an honest peer's traffic into
/// backpressure; bodies that are not frames, which only its link could have written, get it
/// quarantined; and the log says each of it once (prefixes only), not once per frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_peer_sending_junk_is_named_as_the_cause_and_cannot_push_honest_traffic_back() {
    // The request gate and the previous-hop rate opened wide: the junk reaches crypto
    // admission, the step under test (the gate's share and the rate are tested on their own),
    // with two inbound slots (one for strangers) and two workers reading requests whatever the
    // machine's cores (one worker of a debug build reads them slower than the slots peel).
    let net = Net::start(
        3,
        &[
            "--probe-interval",
            "0s",
            "--workers",
            "2",
            "--crypto-slots",
            "3",
            "--admission-per-minute",
            "60000",
            "--previous-hop-limit",
            "10000",
        ],
    )
    .await;
    let (victim, bad) = (net.node(0), net.node(1));
    let seed: [u8; 32] = std::fs::read(bad.state_dir.join("identity.key"))
        .expect("the peer's key")
        .try_into()
        .expect("32 bytes");
    let peer = common::http_from_as(bad.ip, &SigningKey::from_bytes(&seed));
    let first = junk_burst(&peer, &victim.endpoint, 130).await;
    let status = net.status(0).await;
    let pushed = counter(&status, "backpressure_dropped");
    assert!(pushed > 0, "the burst met backpressure: {first:?}");
    let q = status.quality();
    assert_eq!(q["status"], "protecting", "{first:?} {q}");
    assert_eq!(q["cause"]["source"], "peer", "{q}");
    assert_eq!(q["cause"]["peer"], bad.prefix(), "{q}");
    let (why, next) = (q["reason"].to_string(), q["next_action"].to_string());
    assert!(why.contains(bad.prefix()), "{why}");
    assert!(
        !why.contains("CPU") && !next.contains("CPU"),
        "{why} / {next}"
    );
    // Its frames keep failing to open: its share is cut (bounded: a few more, one at a time).
    for _ in 0..40 {
        let s = net.status(0).await;
        if row(&s, bad.prefix()).is_some_and(|r| r["share_cut"] == true) {
            break;
        }
        junk_burst(&peer, &victim.endpoint, 1).await;
    }
    let status = net.status(0).await;
    let bad_row = row(&status, bad.prefix()).expect("the peer's row");
    assert_eq!(bad_row["share_cut"], true, "{bad_row}");
    assert!(
        bad_row["reasons"]["layer"].as_u64().unwrap_or(0) >= 12,
        "{bad_row}"
    );
    assert_eq!(
        bad_row["quarantined"], false,
        "never a quarantine for peel failures"
    );
    assert_eq!(status.quality()["cause"]["reason"], "onion_peel_failed");
    // A second burst while the honest peer sends to the victim: the junk gets the share it is
    // cut to, the honest sends all go through, none of them answered busy.
    let busy_before = counter(&net.status(2).await, "busy_retried");
    let (peer2, endpoint) = (peer.clone(), victim.endpoint.clone());
    let burst = tokio::spawn(async move { junk_burst(&peer2, &endpoint, 130).await });
    for i in 0..5 {
        let (ok, _, err) = net.send(2, 0, 1, format!("honest {i}").as_bytes()).await;
        assert!(ok, "honest send {i}: {err}");
    }
    let second = burst.await.expect("burst");
    assert!(
        second.get("source_limited").copied().unwrap_or(0) > 0,
        "{second:?}"
    );
    println!("first burst {first:?}, second burst {second:?}");
    let busy = counter(&net.status(2).await, "busy_retried") - busy_before;
    assert_eq!(busy, 0, "the honest sends met busy answers: {second:?}");
    // The log: one line each, with the peer's prefix and nothing more of it.
    let line = logged(&net, 0, "backpressure: ").await;
    assert!(
        line.contains(bad.prefix()) && !line.contains(&bad.id),
        "{line}"
    );
    let line = logged(&net, 0, "its share of crypto slots is cut").await;
    assert!(
        line.contains(bad.prefix()) && !line.contains(&bad.ip.to_string()),
        "{line}"
    );
    // What only its link could have written (bodies that are not frames) is scored: twelve,
    // and it is quarantined, said once in the log (its prefix only).
    for _ in 0..12 {
        let (_, why) = common::post(&peer, &victim.endpoint, b"not a frame".to_vec()).await;
        assert_eq!(why, "malformed_envelope");
    }
    let next = junk_burst(&peer, &victim.endpoint, 1).await;
    assert_eq!(next.get("quarantined"), Some(&1), "{next:?}");
    let line = logged(&net, 0, "peer quarantined").await;
    assert!(
        line.contains(bad.prefix()) && !line.contains(&bad.id),
        "{line}"
    );
    let status = net.status(0).await;
    let bad_row = row(&status, bad.prefix()).expect("the peer's row");
    assert_eq!(bad_row["quarantined"], true, "{bad_row}");
    tokio::time::sleep(blindrelay::alerts::TICK * 2).await;
    assert_eq!(net.node(0).count("backpressure: "), 1);
    assert_eq!(net.node(0).count("its share of crypto slots is cut"), 1);
    assert_eq!(net.node(0).count("peer quarantined"), 1);
}
