//! The node under attack, on real processes on loopback: honest traffic keeps flowing while a
//! node is flooded, slowed, hung behind or filled (issue 11).
//!
//! Every test starts four nodes (A, B, C, D = 0..3) and sends honest traffic while an attacker
//! (this process, from its own 127.1x.k.1 addresses, one /24 per source) attacks. Every loop is
//! bounded in count and time. Each test prints one `BENCH|` line: honest success during the
//! attack, recovery time, the attacker's answers per second and their p99 latency, and the
//! target's peak RSS (`scripts/bench-blindrelay` runs these in release mode for BENCHMARKS.md).

use crate::common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blindrelay::proto::descriptor::Descriptor;
use blindrelay::proto::receipt;
use blindrelay::proto::sphinx::{self, SizeClass};
use blindrelay::send::wrap::Wrapped;
use common::{Doc, Net, counter, http_from};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long each flood lasts.
const FLOOD: Duration = Duration::from_secs(4);
/// Recovery is measured over this long after an attack.
const AFTER: Duration = Duration::from_secs(5);

/// Source `k` of attacker group `group`: `127.group.k.1`, one /24 each.
fn attacker(group: u8, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, group, k as u8, 1)
}

/// What the attacker saw: answers and their latencies.
#[derive(Debug, Default)]
struct Seen {
    latencies: Vec<Duration>,
    errors: u64,
}

impl Seen {
    fn per_sec(&self, len: Duration) -> f64 {
        self.latencies.len() as f64 / len.as_secs_f64()
    }

    fn p99_ms(&mut self) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_unstable();
        let i = (self.latencies.len() * 99 / 100).min(self.latencies.len() - 1);
        self.latencies[i].as_secs_f64() * 1000.0
    }
}

/// Junk at `target` from `sources` addresses (each a client with an identity of its own),
/// `conns` loops each, until `until`: half of it not an envelope (refused by framing, scored
/// against the link), half a framed packet whose layer does not open (refused at the peel).
/// Bounded by time and by a count per loop.
async fn flood(target: &str, sources: &[Ipv4Addr], conns: usize, until: Instant) -> Seen {
    let url = format!("{target}/v2/relay");
    let mut tasks = Vec::new();
    for ip in sources {
        let client = http_from(*ip);
        for c in 0..conns {
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut framed = vec![7; SizeClass::Small.packet_len()];
                framed[..2].copy_from_slice(&[sphinx::VERSION, 0]);
                for i in 0..200_000u32 {
                    if Instant::now() >= until {
                        break;
                    }
                    let body = if (i + c as u32).is_multiple_of(2) {
                        b"junk junk junk junk".to_vec()
                    } else {
                        framed.clone()
                    };
                    let t = Instant::now();
                    match client.post(&url).body(body).send().await {
                        Ok(r) => {
                            let _ = r.bytes().await;
                            seen.latencies.push(t.elapsed());
                        }
                        Err(_) => seen.errors += 1,
                    }
                }
                seen
            }));
        }
    }
    let mut all = Seen::default();
    for t in tasks {
        let s = t.await.expect("flood task");
        all.latencies.extend(s.latencies);
        all.errors += s.errors;
    }
    all
}

/// Honest sends start this often (4/s: A stays well within its previous-hop rate at B and C,
/// 120 per minute, over a test).
const PACE: Duration = Duration::from_millis(250);

/// Honest 2-hop sends from A to D, one every [`PACE`] (or as soon as the last one ended),
/// until `until` (at most 200): the time each started and whether it was delivered.
async fn honest(net: &Net, until: Instant) -> Vec<(Instant, bool)> {
    let mut out = Vec::new();
    let mut next = Instant::now();
    for i in 0..200 {
        tokio::time::sleep_until(next.into()).await;
        let t = Instant::now();
        if t >= until {
            break;
        }
        next = t + PACE;
        let (ok, _, _) = net.send(0, 3, 2, format!("honest {i}").as_bytes()).await;
        out.push((t, ok));
    }
    out
}

fn share(sends: &[(Instant, bool)]) -> (usize, usize) {
    (sends.iter().filter(|(_, ok)| *ok).count(), sends.len())
}

/// Honest sends for [`AFTER`] once the attack ended at `end`: every one must succeed. Returns
/// the time from `end` to the first success.
async fn recovery(net: &Net, end: Instant) -> Duration {
    let after = honest(net, Instant::now() + AFTER).await;
    let (ok, total) = share(&after);
    assert!(total >= 3, "too few sends after the attack: {total}");
    assert_eq!(ok, total, "every send after the attack succeeds: {after:?}");
    after[0].0.saturating_duration_since(end) + Duration::from_millis(1)
}

#[allow(clippy::too_many_arguments)]
fn report(
    name: &str,
    during: (usize, usize),
    recovery: Duration,
    seen: &mut Seen,
    len: Duration,
    rss_kib: u64,
) {
    println!(
        "BENCH| {name} | {:.0} % ({}/{}) | {:.2} s | {:.0} | {:.1} ms | {} MiB |",
        100.0 * during.0 as f64 / during.1.max(1) as f64,
        during.0,
        during.1,
        recovery.as_secs_f64(),
        seen.per_sec(len),
        seen.p99_ms(),
        rss_kib / 1024
    );
}

async fn junk_flood(name: &str, sources: usize, conns: usize) {
    let net = Net::start(4, &["--probe-interval", "0s"]).await;
    let d = net.node(3).endpoint.clone();
    let ips: Vec<_> = (0..sources).map(|k| attacker(10, k)).collect();
    let start = Instant::now();
    let until = start + FLOOD;
    let attack = tokio::spawn(async move { flood(&d, &ips, conns, until).await });
    let during = honest(&net, until).await;
    let mut seen = attack.await.expect("flood");
    let end = Instant::now();
    let (ok, total) = share(&during);
    assert!(total >= 3, "{name}: too few honest sends during the flood");
    assert!(
        ok * 10 >= total * 9,
        "{name}: honest deliveries during the flood {ok}/{total}"
    );
    let rec = recovery(&net, end).await;
    let status = net.status(3).await;
    assert!(
        counter(&status, "envelope_too_large") + counter(&status, "source_limited") > 0,
        "{name}: the junk was refused and counted: {status}"
    );
    assert_ne!(status.quality()["status"], "attention", "{status}");
    report(
        name,
        (ok, total),
        rec,
        &mut seen,
        FLOOD,
        net.peak_rss_kib(3),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_junk_flood_from_one_source() {
    junk_flood("junk flood, 1 source", 1, 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_junk_flood_from_eight_sources() {
    junk_flood("junk flood, 8 sources", 8, 4).await;
}

/// Opens a connection from `from` to `to`; `None` if refused.
async fn connect(from: Ipv4Addr, to: &str) -> Option<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.bind((from, 0).into()).ok()?;
    let addr = to.trim_start_matches("https://").parse().ok()?;
    tokio::time::timeout(Duration::from_secs(5), sock.connect(addr))
        .await
        .ok()?
        .ok()
}

/// Opens a connection from `from` to `to` and completes the TLS handshake (any node's key).
async fn connect_tls(
    from: Ipv4Addr,
    to: &str,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = connect(from, to).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(blindrelay::links::unpinned_config()));
    let name = rustls::pki_types::ServerName::try_from("blindrelay").ok()?;
    tokio::time::timeout(Duration::from_secs(5), tls.connect(name, tcp))
        .await
        .ok()?
        .ok()
}

/// Waits (at most `limit`) until the server closes `s`; how long it took, `None` if it did not.
async fn closed_within(
    mut s: impl tokio::io::AsyncRead + Unpin,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((t + limit).into(), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// Raises this process's descriptor limit (soft up to hard) for the connections below.
fn raise_fd_limit(need: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let l = getrlimit(Resource::Nofile);
    if l.current.is_some_and(|c| c < need) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: l.maximum.map(|m| m.min(need)),
                maximum: l.maximum,
            },
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_and_idle_connections_are_closed_and_honest_traffic_flows() {
    const SLOW: usize = 200;
    const IDLE: usize = 1000;
    const HEADER: Duration = Duration::from_secs(2);
    raise_fd_limit(4096);
    let net = Net::start(4, &["--probe-interval", "0s", "--header-timeout", "2s"]).await;
    let d = net.node(3).endpoint.clone();
    let start = Instant::now();
    // 200 slow bodies from 10 sources (20 each), 1000 idle connections from 40 (25 each).
    let mut slow = Vec::new();
    for i in 0..SLOW {
        if let Some(mut s) = connect_tls(attacker(12, i % 10), &d).await {
            let head =
                "POST /v2/relay HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n\x02\x01";
            if s.write_all(head.as_bytes()).await.is_ok() && s.flush().await.is_ok() {
                slow.push(s);
            }
        }
    }
    let mut idle = Vec::new();
    for i in 0..IDLE {
        if let Some(s) = connect(attacker(11, i % 40), &d).await {
            idle.push(s);
        }
    }
    let opened = Instant::now();
    // The body deadline for 100 000 bytes: 2 s + 100 000 / 64 KiB/s ≈ 3.5 s.
    let body_deadline = blindrelay::pipeline::ingress::body_deadline(100_000);
    let slow_closed = tokio::spawn(async move {
        let mut closed = Vec::new();
        for s in slow {
            closed.push(tokio::spawn(closed_within(
                s,
                body_deadline + Duration::from_secs(3),
            )));
        }
        let mut out = Vec::new();
        for c in closed {
            out.push(c.await.expect("reader"));
        }
        out
    });
    let idle_closed = tokio::spawn(async move {
        let mut closed = Vec::new();
        for s in idle {
            closed.push(tokio::spawn(closed_within(
                s,
                HEADER + Duration::from_secs(3),
            )));
        }
        let mut out = Vec::new();
        for c in closed {
            out.push(c.await.expect("reader"));
        }
        out
    });
    let during = honest(&net, opened + body_deadline).await;
    let slow_closed = slow_closed.await.expect("slow");
    let idle_closed = idle_closed.await.expect("idle");
    let end = Instant::now();
    let (ok, total) = share(&during);
    assert!(total >= 3, "too few honest sends");
    assert!(ok * 10 >= total * 9, "honest deliveries {ok}/{total}");
    assert!(
        slow_closed.iter().all(Option::is_some),
        "every slow body is closed by its deadline"
    );
    assert!(
        idle_closed.iter().all(Option::is_some),
        "every idle connection is closed by the header timeout"
    );
    let rec = recovery(&net, end).await;
    let status = net.status(3).await;
    let timed_out = counter(&status, "request_timeout");
    let refused = counter(&status, "connections_refused");
    let idle_timed_out = counter(&status, "connections_timed_out");
    assert!(timed_out > 0 && idle_timed_out > 0, "{status}");
    assert!(
        timed_out + idle_timed_out + refused >= (SLOW + IDLE) as u64,
        "each slow or idle connection was refused or timed out: {status}"
    );
    let mut seen = Seen {
        latencies: slow_closed
            .into_iter()
            .chain(idle_closed)
            .flatten()
            .collect(),
        errors: 0,
    };
    let len = end.saturating_duration_since(start);
    report(
        "200 slow bodies + 1000 idle connections",
        (ok, total),
        rec,
        &mut seen,
        len,
        net.peak_rss_kib(3),
    );
}

/// The descriptor of node `i`.
async fn descriptor(net: &Net, i: usize) -> Descriptor {
    let url = format!("{}/v1/descriptor", net.node(i).endpoint);
    common::http()
        .get(url)
        .send()
        .await
        .expect("descriptor")
        .json()
        .await
        .expect("descriptor JSON")
}

/// A frame along `path` (this process as the sender), and what the sender keeps to check the
/// receipt.
fn craft(path: &[&Descriptor], payload: &[u8]) -> Wrapped {
    craft_with(false, path, payload)
}

/// [`craft`] of a message or a probe (the probe flag, in the 2 KiB class).
fn craft_with(probe: bool, path: &[&Descriptor], payload: &[u8]) -> Wrapped {
    let expires = blindrelay::send::wrap::expiry(common::unix_now());
    common::craft(path, payload, probe, expires)
}

/// Sends `payload` along `path` and checks the terminal's receipt.
async fn deliver_verified(client: &reqwest::Client, path: &[&Descriptor], payload: &[u8]) -> bool {
    let route = craft(path, payload);
    let mut v = Value::Null;
    // Retried as a sender does on a short `429` (crypto admission refuses at once).
    for _ in 0..200 {
        let Ok(r) = client
            .post(format!("{}/v2/relay", path[0].endpoint))
            .body(route.frame.clone())
            .send()
            .await
        else {
            return false;
        };
        let status = r.status().as_u16();
        let Ok(body) = r.json::<Value>().await else {
            return false;
        };
        v = body;
        let what = v["error"].as_str().unwrap_or_default().to_owned();
        if !common::is_busy(&(status, what)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(sealed) = v["receipt"].as_str().and_then(|h| hex::decode(h).ok()) else {
        return false;
    };
    let Ok(rc) = receipt::open(&sealed, &route.receipt_key) else {
        return false;
    };
    let terminal = path[path.len() - 1].node_id;
    rc.verify(
        &route.message_id,
        &receipt::commitment(payload),
        &terminal,
        rc.delivered_at,
    )
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_next_hop_costs_a_small_bounded_share() {
    // The subject is the hung next hop, not the request rate: 30 requests from strangers at
    // once, each retried while the strangers' crypto share is taken, would spend the unknown
    // sources' admission pool (10/s at the default rate) and end `source_limited`.
    let net = Net::start(
        4,
        &["--probe-interval", "0s", "--admission-per-minute", "60000"],
    )
    .await;
    let (b, c, d) = (
        descriptor(&net, 1).await,
        descriptor(&net, 2).await,
        descriptor(&net, 3).await,
    );
    // C hangs: the kernel still accepts its connections, nobody answers.
    net.signal(2, "STOP");
    let start = Instant::now();
    // 30 requests through B to C at once, from three sources…
    let mut stuck = Vec::new();
    for i in 0..30 {
        let hung = http_from(attacker(13, 2 + i % 3));
        let body = craft(&[&b, &c], format!("to the hung node {i}").as_bytes()).frame;
        let (hung, endpoint) = (hung.clone(), b.endpoint.clone());
        stuck.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = common::post_retrying(&hung, &endpoint, body).await;
            (r, t.elapsed())
        }));
    }
    // …while honest traffic goes through B to D from another.
    let honest_client = http_from(attacker(13, 0));
    let mut during = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        let ok =
            deliver_verified(&honest_client, &[&b, &d], format!("honest {i}").as_bytes()).await;
        during.push((t, ok));
    }
    let mut seen = Seen::default();
    let mut busy = 0;
    for s in stuck {
        let ((status, reason), took) = s.await.expect("hung request");
        // B answers each within its fixed per-hop deadline (6 s).
        assert!(
            took <= blindrelay::forward::HOP_DEADLINE + Duration::from_secs(1),
            "{status} {reason} after {took:?}"
        );
        if reason == "next_hop_busy" {
            busy += 1;
        } else {
            // Answered at B's deadline while its forward goes on (to twice the deadline).
            assert_eq!(reason, "route_in_flight", "{status}");
        }
        seen.latencies.push(took);
    }
    let end = Instant::now();
    assert_eq!(
        busy,
        30 - blindrelay::forward::PER_NEXT_HOP,
        "only 8 wait on C"
    );
    let (ok, total) = share(&during);
    assert_eq!(ok, total, "honest traffic to D is unaffected: {during:?}");
    net.signal(2, "CONT");
    let status = net.status(1).await;
    assert_eq!(counter(&status, "next_hop_busy"), 22, "{status}");
    report(
        "hung next hop (30 requests to it)",
        (ok, total),
        Duration::ZERO,
        &mut seen,
        end.saturating_duration_since(start),
        net.peak_rss_kib(1),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_and_replay_registry_cannot_be_filled_by_one_party_and_drain() {
    let net = Net::start(
        4,
        &[
            "--probe-interval",
            "0s",
            "--inbox-max-items",
            "20",
            "--inbox-share",
            "25",
            "--replay-capacity",
            "40",
            "--replay-share",
            "25",
        ],
    )
    .await;
    let d = descriptor(&net, 3).await;
    let party = |k: usize| http_from(attacker(14, k));
    // One party: five items (25 % of 20), then refused with its own reason.
    let p0 = party(0);
    for i in 0..5 {
        assert!(deliver_verified(&p0, &[&d], format!("p0 {i}").as_bytes()).await);
    }
    let (status, reason) = common::post(&p0, &d.endpoint, craft(&[&d], b"p0 more").frame).await;
    assert_eq!((status, reason.as_str()), (429, "inbox_share_exceeded"));
    assert_eq!(net.status(3).await.runtime()["inbox"]["full"], false);
    // Three more parties fill it; a fifth is refused: the inbox is full, and says so.
    for k in 1..4 {
        let p = party(k);
        for i in 0..5 {
            assert!(deliver_verified(&p, &[&d], format!("p{k} {i}").as_bytes()).await);
        }
    }
    let (status, reason) = common::post(&party(4), &d.endpoint, craft(&[&d], b"p4").frame).await;
    assert_eq!((status, reason.as_str()), (507, "inbox_full"));
    let (ok, _, _) = net.send(0, 3, 2, b"honest while full").await;
    assert!(!ok, "a full inbox refuses honest deliveries too");
    let s = net.status(3).await;
    assert_eq!(s.runtime()["inbox"]["full"], true, "{s}");
    assert_eq!(s.quality()["status"], "attention", "{s}");
    assert!(
        s.quality()["reason"]
            .as_str()
            .unwrap()
            .contains("inbox is full")
    );
    assert!(counter(&s, "inbox_full") >= 2, "{s}");
    // Drain: take the oldest, delete another.
    let op = net.node(3).operator.clone();
    let took = net.cli(&["inbox", "--operator", &op, "--take"]).await;
    assert!(took.ok, "{}", took.stderr);
    assert_eq!(took.stdout, b"p0 0");
    let id = net.inbox_ids(3).await[0].to_string();
    let del = net
        .cli(&["inbox", "--operator", &op, "--delete", &id])
        .await;
    assert!(del.ok, "{}", del.stderr);
    assert_eq!(net.inbox_ids(3).await.len(), 18);
    let s = net.status(3).await;
    assert_eq!(s.runtime()["inbox"]["full"], false, "{s}");
    let (ok, _, err) = net.send(0, 3, 2, b"honest after the drain").await;
    assert!(ok, "{err}");
    assert_ne!(net.status(3).await.quality()["status"], "attention");

    // The replay registry (on C, fresh): 40 live routes, 10 per source. Probe frames (stored
    // nowhere) from one party: 10 reserved, then refused with its own reason.
    let c = descriptor(&net, 2).await;
    let probe = || craft_with(true, &[&c], b"").frame;
    let p5 = party(5);
    let mut reserved = 0;
    for _ in 0..20 {
        let (_, reason) = common::post(&p5, &c.endpoint, probe()).await;
        match reason.as_str() {
            "delivered" => reserved += 1,
            "replay_share_exceeded" => break,
            other => panic!("{other}"),
        }
    }
    assert_eq!(reserved, 10);
    // More parties fill it: refused as `replay_capacity`, and the status says so.
    let mut full = false;
    'fill: for k in 6..12 {
        let p = party(k);
        for _ in 0..11 {
            let (status, reason) = common::post(&p, &c.endpoint, probe()).await;
            if reason == "replay_capacity" {
                assert_eq!(status, 503);
                full = true;
                break 'fill;
            }
        }
    }
    assert!(full, "many parties fill the replay registry");
    let s = net.status(2).await;
    assert_eq!(s.runtime()["replay"]["full"], true, "{s}");
    assert_eq!(s.quality()["status"], "attention", "{s}");
    assert!(counter(&s, "replay_capacity") >= 1, "{s}");
    assert!(counter(&s, "replay_share_exceeded") >= 1, "{s}");
    // (Routes end 600 s after their reservation: the drain is in tests/it/pipeline/replay.rs, on the
    // paused clock.)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_honest_concurrent_senders_lose_nothing() {
    const SENDERS: usize = 12;
    const EACH: usize = 10;
    let net = Arc::new(Net::start(4, &["--probe-interval", "0s"]).await);
    let lost = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let (net, lost) = (Arc::clone(&net), Arc::clone(&lost));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for m in 0..EACH {
                let from = s % 3;
                let t = Instant::now();
                let (ok, _, err) = net.send(from, 3, 2, format!("{s}/{m}").as_bytes()).await;
                latencies.push(t.elapsed());
                if !ok {
                    eprintln!("sender {s} message {m}: {err}");
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies
        }));
    }
    let mut seen = Seen::default();
    for t in tasks {
        seen.latencies.extend(t.await.expect("sender"));
    }
    let len = start.elapsed();
    let lost = lost.load(Ordering::Relaxed);
    assert_eq!(lost, 0, "no honest message is lost");
    assert_eq!(net.inbox_ids(3).await.len(), SENDERS * EACH);
    let delivered = SENDERS * EACH;
    report(
        "12 honest concurrent senders (sends/s, p99 send)",
        (delivered, delivered),
        Duration::ZERO,
        &mut seen,
        len,
        net.peak_rss_kib(3),
    );
}
