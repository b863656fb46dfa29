//! The admission pipeline in process, with a hand-driven clock: each step's refusal and its one
//! counter, the order of the steps, the request gate, crypto admission, the previous-hop guard,
//! every replay outcome (also across a restart), retries, and receipts. Nodes listen on fresh
//! 127.x.y.z addresses with ports from the OS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use blindrelay::clock::{Clock, ManualClock};
use blindrelay::context::Context;
use blindrelay::counters::Snapshot;
use blindrelay::daemon::{self, RelayConfig, RunConfig};
use blindrelay::pipeline::{Pipeline, wire};
use blindrelay::proto::frame::Frame;
use blindrelay::proto::sphinx::{self, Delivery, HopSpec, SizeClass};
use blindrelay::proto::{NodeId, RouteId};
use blindrelay::replay::ReplayStore;
use blindrelay::send::v2::expiry;
use ed25519_dalek::SigningKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[path = "common/doc.rs"]
#[allow(dead_code, unreachable_pub)]
mod doc;
use doc::Doc;

const T0: u64 = 1_800_000_000;

fn fresh_ip() -> Ipv4Addr {
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = std::process::id();
    Ipv4Addr::new(
        127,
        200 + (p % 50) as u8,
        (n >> 8) as u8,
        (n & 0xff) as u8 | 1,
    )
}

/// One node running in this process.
struct Node {
    pipeline: Arc<Pipeline>,
    ctx: Arc<Context>,
    addr: SocketAddr,
    operator: SocketAddr,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: CancellationToken,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A client for a node's public (TLS) and operator (plain) listeners.
fn tls_http() -> reqwest::Client {
    blindrelay::links::install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .build()
        .unwrap()
}

/// Serves `app` on `listener` over TLS as the node whose identity is `key` (a fake next hop).
fn serve_tls(listener: TcpListener, app: axum::Router, key: &SigningKey) {
    let tls = tokio_rustls::TlsAcceptor::from(blindrelay::links::server_config(key).unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (tls, app) = (tls.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(stream).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

async fn start_in(
    dir: &Path,
    clock: &Clock,
    tweak: impl FnOnce(&mut RelayConfig),
    init: bool,
) -> (Arc<Pipeline>, SocketAddr, SocketAddr, CancellationToken) {
    let ip = fresh_ip();
    let public = TcpListener::bind((ip, 0)).await.unwrap();
    let operator = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = public.local_addr().unwrap();
    let operator_addr = operator.local_addr().unwrap();
    if init {
        blindrelay::node::init(dir, &format!("https://{addr}"), clock.unix()).unwrap();
    }
    let mut cfg = RelayConfig::new(true);
    // The clock is frozen: a rate would never refill. The gate's own test sets its rate.
    cfg.window_limit = 1_000_000;
    cfg.bind = Some(IpAddr::V4(ip));
    tweak(&mut cfg);
    let built = daemon::build(RunConfig {
        state_dir: dir.to_owned(),
        peers: vec![],
        replay_store: ReplayStore::Sqlite,
        relay: cfg,
        clock: clock.clone(),
        accept_lost_state: false,
    })
    .unwrap();
    let pipeline = Arc::clone(&built.pipeline);
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(daemon::serve(built, public, operator, async move {
        s.cancelled().await
    }));
    (pipeline, addr, operator_addr, stop)
}

async fn node(clock: &Clock, tweak: impl FnOnce(&mut RelayConfig)) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let (pipeline, addr, operator, stop) = start_in(&dir, clock, tweak, true).await;
    Node {
        ctx: Arc::clone(pipeline.ctx()),
        pipeline,
        addr,
        operator,
        dir,
        _tmp: Some(tmp),
        stop,
    }
}

fn manual() -> (Arc<ManualClock>, Clock) {
    let m = ManualClock::new(T0);
    (Arc::clone(&m), Clock::Manual(m))
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&rand::random())
}

fn id(k: &SigningKey) -> NodeId {
    k.verifying_key().to_bytes()
}

/// Makes `b` a known peer of `a`.
fn introduce(a: &Node, b: &Node) {
    let now = a.ctx.clock.unix();
    assert!(a.ctx.peers.insert(b.ctx.node.descriptor(now)));
}

/// A hop of a test route: a node id and its onion key.
#[derive(Clone, Copy)]
struct To {
    id: NodeId,
    onion: [u8; 32],
}

/// `n` as a hop.
fn to(n: &Node) -> To {
    To {
        id: *n.ctx.node.id(),
        onion: n.ctx.node.onion_public(),
    }
}

/// A hop nobody runs (or a key's id as a hop: its layer opens nowhere).
fn nobody(id: NodeId) -> To {
    To {
        id,
        onion: x25519_pub(),
    }
}

/// A v2 frame as a test builds it: the frame (its fields may be tampered with) and the replay
/// tag of its first hop's layer.
#[derive(Clone)]
struct F {
    frame: Frame,
    tag: RouteId,
    /// The node it is signed for.
    to: NodeId,
}

impl F {
    fn encode(&self) -> Vec<u8> {
        self.frame.encode()
    }

    fn request_digest(&self) -> [u8; 32] {
        self.frame.request_digest()
    }

    /// The same packet in a frame signed by `by` for `n`: a layer for another node in a frame
    /// for `n`.
    fn signed_for(&self, by: &SigningKey, n: &Node) -> F {
        F {
            frame: Frame::sign(self.frame.packet.clone(), by, n.ctx.node.id()).unwrap(),
            tag: self.tag,
            to: *n.ctx.node.id(),
        }
    }

    /// The same packet in a fresh frame signed by `by`: a re-wrap.
    fn rewrap(&self, by: &SigningKey) -> F {
        F {
            frame: Frame::sign(self.frame.packet.clone(), by, &self.to).unwrap(),
            tag: self.tag,
            to: self.to,
        }
    }
}

/// A frame signed by `by` for `path` (the last hop is the terminal) carrying `payload` (a probe
/// when `probe`), every layer expiring at `expires`.
fn frame_with(by: &SigningKey, path: &[To], payload: &[u8], probe: bool, expires: u64) -> F {
    let specs: Vec<HopSpec> = path
        .iter()
        .map(|h| HopSpec {
            node_id: h.id,
            onion_key: h.onion,
            expires_at: expires,
        })
        .collect();
    let delivery = Delivery {
        payload,
        probe,
        receipt_key: [7; 32],
    };
    let class = SizeClass::smallest_for(payload.len()).unwrap();
    let built = sphinx::build(&specs, &delivery, class).unwrap();
    F {
        frame: Frame::sign(built.packet, by, &path[0].id).unwrap(),
        tag: built.replay_tags[0],
        to: path[0].id,
    }
}

/// [`frame_with`] of a message.
fn frame(by: &SigningKey, path: &[To], payload: &[u8], expires: u64) -> F {
    frame_with(by, path, payload, false, expires)
}

/// A frame signed by `by` for `n` whose packet is junk after its version and class: framed and
/// signed, refused once its layer does not open (`onion_peel_failed`).
fn junk_frame(by: &SigningKey, n: &Node) -> F {
    let mut packet: Vec<u8> = (0..SizeClass::Small.packet_len())
        .map(|_| rand::random::<u8>())
        .collect();
    packet[..2].copy_from_slice(&[sphinx::VERSION, 0]);
    F {
        frame: Frame::sign(packet, by, n.ctx.node.id()).unwrap(),
        tag: [0; 16],
        to: *n.ctx.node.id(),
    }
}

/// An answer as it goes on the wire.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    status: u16,
    body: Vec<u8>,
}

/// One of 64 unknown sources (each its own /24), in turn, so a test's many requests never
/// exhaust one source's share on the frozen clock.
fn fresh_source(n: &Node) -> blindrelay::sources::Source {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let i = (NEXT.fetch_add(1, Ordering::Relaxed) % 64) as u8;
    n.pipeline.classify(IpAddr::from([10, 77, i, 1]))
}

async fn submit(n: &Node, bytes: Vec<u8>) -> Reply {
    let verdict = match n.pipeline.admit(&fresh_source(n), &bytes) {
        Ok(a) => n.pipeline.process(a).await,
        Err(r) => Err(r),
    };
    let (status, body) = wire(&verdict);
    Reply { status, body }
}

/// A terminal request for `n` carrying `payload`, signed by `by`, sent at `now`.
async fn deliver(n: &Node, by: &SigningKey, now: u64, payload: &[u8]) -> Reply {
    submit(n, frame(by, &[to(n)], payload, expiry(now)).encode()).await
}

/// A request whose layer does not open: refused at the peel, after the guard counted it.
async fn junk(n: &Node, by: &SigningKey) -> Reply {
    submit(n, junk_frame(by, n).encode()).await
}

fn reason(r: &Reply) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["error"]
        .as_str()
        .or(v["outcome"].as_str())
        .unwrap_or("?")
        .to_string()
}

/// The counters that moved between two snapshots.
fn moved(before: &Snapshot, after: &Snapshot) -> Vec<(String, u64)> {
    let b = serde_json::to_value(before).unwrap();
    let a = serde_json::to_value(after).unwrap();
    let mut out = Vec::new();
    for (k, v) in a.as_object().unwrap() {
        if k.starts_with("last_") {
            continue;
        }
        let d = v.as_u64().unwrap() - b[k].as_u64().unwrap();
        if d > 0 {
            out.push((k.clone(), d));
        }
    }
    out.sort();
    out
}

fn counted(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<_> = list.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    v.sort();
    v
}

#[tokio::test]
async fn each_step_refuses_with_its_reason_status_and_one_counter() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let strict = node(&clock, |c| c.allow_private_endpoints = false).await;
    let other = node(&clock, |_| {}).await;
    introduce(&strict, &other);
    let dead = node(&clock, |_| {}).await;
    introduce(&n, &dead);
    dead.stop.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let now = clock.unix();
    let p = key();
    let stranger: NodeId = rand::random();

    let fresh = expiry(now);
    let mut bad_sig = frame(&p, &[to(&n)], b"x", fresh);
    bad_sig.frame.signature[0] ^= 1;
    let mut bad_point = frame(&p, &[to(&n)], b"x", fresh);
    bad_point.frame.previous_hop = not_a_point();
    // A v1 node with a current descriptor: known, but not routable (it does not speak v2).
    let old = key();
    let mut v1_peer = blindrelay::proto::Descriptor::sign(
        &old,
        x25519_pub(),
        format!("https://{}", other.addr),
        now,
        3600,
    );
    v1_peer.protocol = 0;
    v1_peer.signature = ed25519_dalek::Signer::sign(&old, &v1_peer.signing_bytes()).to_bytes();
    assert_eq!(v1_peer.verify(now), Ok(()));
    assert!(n.ctx.peers.insert(v1_peer));
    let v1_envelope = {
        let mut b = b"BRE1".to_vec();
        b.extend_from_slice(&[0; 162]);
        b
    };

    type Case<'a> = (&'a str, &'a Node, Vec<u8>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "garbage",
            &n,
            b"not an envelope".to_vec(),
            400,
            "malformed_envelope",
            "envelope_too_large",
        ),
        (
            "v1 envelope",
            &n,
            v1_envelope,
            400,
            "v1_not_accepted",
            "v1_not_accepted",
        ),
        (
            "bad point",
            &n,
            bad_point.encode(),
            400,
            "invalid_previous_hop",
            "invalid_signature",
        ),
        (
            "bad signature",
            &n,
            bad_sig.encode(),
            400,
            "invalid_signature",
            "invalid_signature",
        ),
        (
            "expired",
            &n,
            frame(&p, &[to(&n)], b"x", now - sphinx::EXPIRY_SKEW - 1).encode(),
            400,
            "timestamp_expired",
            "timestamp_rejected",
        ),
        (
            "future",
            &n,
            frame(
                &p,
                &[to(&n)],
                b"x",
                now + sphinx::MAX_LIFETIME + sphinx::EXPIRY_SKEW + 1,
            )
            .encode(),
            400,
            "timestamp_in_future",
            "timestamp_rejected",
        ),
        (
            "self loop",
            &n,
            frame(n.ctx.node.signing_key(), &[to(&n)], b"x", fresh).encode(),
            400,
            "self_loop",
            "loop_detected",
        ),
        (
            // v1's `wrong_hop`: a frame signed for another node.
            "wrong hop",
            &n,
            frame(&p, &[nobody(stranger)], b"x", fresh).encode(),
            400,
            "invalid_signature",
            "invalid_signature",
        ),
        (
            // A layer for another node in a frame for this one: it does not open here.
            "layer for another node",
            &n,
            frame(&p, &[nobody(stranger)], b"x", fresh)
                .signed_for(&p, &n)
                .encode(),
            400,
            "onion_peel_failed",
            "invalid_signature",
        ),
        (
            "peel",
            &n,
            junk_frame(&p, &n).encode(),
            400,
            "onion_peel_failed",
            "invalid_signature",
        ),
        (
            "route loop",
            &n,
            frame(&p, &[to(&n), nobody(id(&p))], b"x", fresh).encode(),
            400,
            "route_loop",
            "loop_detected",
        ),
        (
            "no route",
            &n,
            frame(&p, &[to(&n), nobody(stranger)], b"x", fresh).encode(),
            502,
            "no_route",
            "no_route",
        ),
        (
            "v1 peer",
            &n,
            frame(&p, &[to(&n), nobody(id(&old))], b"x", fresh).encode(),
            502,
            "no_route",
            "no_route",
        ),
        (
            "private endpoint",
            &strict,
            frame(&p, &[to(&strict), to(&other)], b"x", fresh).encode(),
            502,
            "invalid_endpoint",
            "invalid_endpoint",
        ),
    ];
    for (what, target, bytes, status, why, counter) in cases {
        let before = target.ctx.counters.snapshot();
        let r = submit(target, bytes).await;
        assert_eq!((r.status, reason(&r).as_str()), (status, why), "{what}");
        let after = target.ctx.counters.snapshot();
        assert_eq!(
            moved(&before, &after),
            counted(&[("received", 1), ("rejected", 1), (counter, 1)]),
            "{what}"
        );
    }

    // A next hop that does not answer: three attempts, then forward_failed.
    let before = n.ctx.counters.snapshot();
    let r = submit(&n, frame(&p, &[to(&n), to(&dead)], b"y", fresh).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (502, "forward_failed"));
    let after = n.ctx.counters.snapshot();
    assert_eq!(
        moved(&before, &after),
        counted(&[
            ("received", 1),
            ("rejected", 1),
            ("forward_failed", 1),
            ("retry_attempted", 2),
            ("retry_exhausted", 1)
        ])
    );

    // Accepted as the terminal hop.
    let before = n.ctx.counters.snapshot();
    let r = deliver(&n, &p, now, b"fine").await;
    assert_eq!((r.status, reason(&r).as_str()), (200, "delivered"));
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[("received", 1), ("terminal", 1)])
    );

    // Over HTTP, a body over the cap is refused before it is parsed.
    let http = tls_http();
    let big = vec![0u8; blindrelay::proto::frame::MAX_FRAME + 1];
    let r = http
        .post(format!("https://{}/v2/relay", n.addr))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "envelope_too_large"
    );
}

#[tokio::test]
async fn every_error_of_both_listeners_is_json() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let cookie = std::fs::read_to_string(n.dir.join("operator.cookie")).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {cookie}").parse().unwrap(),
    );
    blindrelay::links::install_provider();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .default_headers(headers)
        .build()
        .unwrap();
    let stranger = tls_http();
    let (op, public) = (n.operator, n.addr);
    let to = hex::encode([1u8; 32]);
    let big = vec![0u8; blindrelay::proto::frame::MAX_FRAME + 1];
    let cases = [
        (
            "hops not a number",
            http.post(format!("http://{op}/v1/send?to={to}&hops=many")),
            400,
            "bad_query",
        ),
        (
            "no query string",
            http.post(format!("http://{op}/v1/send")),
            400,
            "bad_query",
        ),
        (
            "inbox id not a number",
            http.get(format!("http://{op}/v1/inbox/abc")),
            400,
            "bad_path",
        ),
        (
            "not a node id",
            http.post(format!("http://{op}/v1/send?to=zz&hops=1")),
            400,
            "bad_node_id",
        ),
        (
            "body over the limit",
            http.post(format!("http://{op}/v1/send?to={to}&hops=1"))
                .body(big),
            413,
            "body_too_large",
        ),
        (
            "no such item",
            http.get(format!("http://{op}/v1/inbox/7")),
            404,
            "not_found",
        ),
        (
            "unknown path",
            http.get(format!("http://{op}/v1/nothing")),
            404,
            "not_found",
        ),
        (
            "wrong method",
            http.get(format!("http://{op}/v1/send")),
            405,
            "method_not_allowed",
        ),
        (
            "public unknown path",
            http.get(format!("https://{public}/v1/nothing")),
            404,
            "not_found",
        ),
        (
            "public wrong method",
            http.get(format!("https://{public}/v2/relay")),
            405,
            "method_not_allowed",
        ),
        (
            "operator without the cookie",
            stranger.get(format!("http://{op}/v1/inbox")),
            401,
            "unauthorized",
        ),
        (
            "operator with a wrong cookie",
            stranger
                .get(format!("http://{op}/v1/status"))
                .bearer_auth("ab".repeat(32)),
            401,
            "unauthorized",
        ),
    ];
    for (what, req, status, code) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{what}");
        assert_eq!(r.headers()["content-type"], "application/json", "{what}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], code, "{what}");
        assert!(v["message"].is_string(), "{what}: {v}");
    }
}

#[tokio::test]
async fn the_steps_run_in_the_design_order() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let now = clock.unix();
    let stale = now - 10_000;
    // A quarantined previous hop with a stale layer gets `quarantined` (4 before 5).
    let q = key();
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    let r = submit(&n, frame(&q, &[to(&n)], b"x", stale).encode()).await;
    assert_eq!(reason(&r), "quarantined");
    // A forged frame with a stale layer: authentication first (3 before 5).
    let mut f = frame(&key(), &[to(&n)], b"x", stale);
    f.frame.previous_hop = id(&q);
    assert_eq!(reason(&submit(&n, f.encode()).await), "invalid_signature");
    // A stale self-loop: the loop first (6 before 5: the expiry is sealed in the layer, read
    // only once the layer is peeled; the self-loop needs no cryptography).
    let me = n.ctx.node.signing_key();
    assert_eq!(
        reason(&submit(&n, frame(me, &[to(&n)], b"x", stale).encode()).await),
        "self_loop"
    );
    // A self-loop with a layer for another node: the loop first (6 before 7).
    let other: NodeId = rand::random();
    let f = frame(me, &[nobody(other)], b"x", expiry(now)).signed_for(me, &n);
    assert_eq!(reason(&submit(&n, f.encode()).await), "self_loop");
    // A stale route loop: the layer's expiry first (5 before 7).
    let p = key();
    let f = frame(&p, &[to(&n), nobody(id(&p))], b"x", stale);
    assert_eq!(reason(&submit(&n, f.encode()).await), "timestamp_expired");
    // A route loop to an unknown next hop: the loop first, then the route (7's own order).
    let f = frame(&p, &[to(&n), nobody(id(&p))], b"x", expiry(now));
    assert_eq!(reason(&submit(&n, f.encode()).await), "route_loop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_gate_shares_its_totals_per_source() {
    let (m, clock) = manual();
    let n = node(&clock, |c| c.window_limit = 60_000).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let body = junk_frame(&key(), &n).encode();
    // 64 in flight: at most 16 per source, and the last 16 only for known peers.
    let mut held = Vec::new();
    for i in 0..5u8 {
        let s = n.pipeline.classify(IpAddr::from([10, i, 0, 1]));
        for _ in 0..20 {
            if let Ok(a) = n.pipeline.admit(&s, &body) {
                held.push(a);
            }
        }
    }
    assert_eq!(held.len(), 48);
    let c = n.ctx.counters.snapshot();
    // Sources 0 and 1 over their cap (4 each); then the unknown part is full (4 + 20 + 20).
    assert_eq!((c.source_limited, c.backpressure_dropped), (8, 44));
    // Junk costs the cheap checks only: refused before any slot is taken.
    let s = n.pipeline.classify(IpAddr::from([10, 9, 0, 1]));
    assert_eq!(
        n.pipeline.admit(&s, b"junk").unwrap_err().as_str(),
        "malformed_envelope"
    );
    // A known peer (its descriptor's endpoint) still gets the reserved slots.
    let known = n.pipeline.classify(peer.addr.ip());
    for _ in 0..16 {
        held.push(n.pipeline.admit(&known, &body).expect("a reserved slot"));
    }
    // Over HTTP too: 429 at once.
    let r = tls_http()
        .post(format!("https://{}/v2/relay", n.addr))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    drop(held);

    // The rate: 60 per minute, half of it for known peers. A flooding source gets its share of
    // the other half, a second source too, and the known peer keeps its own.
    let n = node(&clock, |c| c.window_limit = 60).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let flood = n.pipeline.classify(IpAddr::from([10, 1, 0, 1]));
    let got = (0..100)
        .filter(|_| n.pipeline.admit(&flood, &body).is_ok())
        .count();
    assert!((1..=3).contains(&got), "{got}");
    let known = n.pipeline.classify(peer.addr.ip());
    assert!(n.pipeline.admit(&known, &body).is_ok());
    // Recovery follows the load: seconds, not a 60 s window.
    m.advance(Duration::from_secs(4));
    assert!(n.pipeline.admit(&flood, &body).is_ok());
}

async fn submit_from(n: &Node, source: &blindrelay::sources::Source, bytes: Vec<u8>) -> Reply {
    let verdict = match n.pipeline.admit(source, &bytes) {
        Ok(a) => n.pipeline.process(a).await,
        Err(r) => Err(r),
    };
    let (status, body) = wire(&verdict);
    Reply { status, body }
}

/// Step 2 never waits: with every inbound crypto slot taken a request is refused at once
/// (`backpressure`); a stranger over the strangers' share is refused with `source_limited` (the
/// node is not out of CPU, so not `attention`) while a known peer's request still gets a slot.
#[tokio::test]
async fn crypto_admission_refuses_at_once_and_strangers_cannot_take_the_known_peers_slot() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let peer = node(&clock, |_| {}).await;
    introduce(&n, &peer);
    let p = key();
    let known = n.pipeline.classify(peer.addr.ip());
    assert!(known.key().is_known());
    let stranger = |i: u8| n.pipeline.classify(IpAddr::from([10, 78, i, 1]));
    let strangers = n.pipeline.strangers();
    // Two strangers hold the strangers' share of the 4 slots (2: all inbound slots but one).
    let a = strangers.take(stranger(1).key()).expect("stranger 1");
    let b = strangers.take(stranger(2).key()).expect("stranger 2");
    let req = || frame(&p, &[to(&n)], b"x", expiry(clock.unix())).encode();
    let t = std::time::Instant::now();
    assert_eq!(
        reason(&submit_from(&n, &stranger(3), req()).await),
        "source_limited"
    );
    assert!(t.elapsed() < Duration::from_millis(25), "refused at once");
    assert_eq!(n.ctx.counters.snapshot().source_limited, 1);
    assert_ne!(status_of(&n).quality()["status"], "attention");
    assert_eq!(reason(&submit_from(&n, &known, req()).await), "delivered");
    drop((a, b));
    assert_eq!(
        reason(&submit_from(&n, &stranger(3), req()).await),
        "delivered"
    );
    // Every inbound slot taken: refused at once, not after a wait.
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    let t = std::time::Instant::now();
    assert_eq!(
        reason(&submit_from(&n, &known, req()).await),
        "backpressure"
    );
    assert!(t.elapsed() < Duration::from_millis(25), "refused at once");
    drop(busy);
    assert_eq!(reason(&submit_from(&n, &known, req()).await), "delivered");
}

#[tokio::test]
async fn a_full_replay_registry_says_so_and_drains_as_routes_end() {
    let (m, clock) = manual();
    let n = node(&clock, |c| {
        c.replay_capacity = 8;
        c.replay_share_percent = 25;
    })
    .await;
    let p = key();
    let probe = || frame_with(&p, &[to(&n)], b"", true, expiry(clock.unix())).encode();
    let src = |i: u8| n.pipeline.classify(IpAddr::from([10, 60, i, 1]));
    // One source: two routes (25 % of 8), then its own refusal.
    for _ in 0..2 {
        assert_eq!(
            reason(&submit_from(&n, &src(0), probe()).await),
            "delivered"
        );
    }
    let r = submit_from(&n, &src(0), probe()).await;
    assert_eq!(
        (r.status, reason(&r).as_str()),
        (429, "replay_share_exceeded")
    );
    assert_eq!(status_of(&n).runtime()["replay"]["full"], false);
    // Three more fill it; then everyone is refused as `replay_capacity`, and status says so.
    for i in 1..4 {
        for _ in 0..2 {
            assert_eq!(
                reason(&submit_from(&n, &src(i), probe()).await),
                "delivered"
            );
        }
    }
    let r = submit_from(&n, &src(9), probe()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "replay_capacity"));
    let s = status_of(&n);
    assert_eq!(s.runtime()["replay"]["full"], true);
    assert_eq!(s.quality()["status"], "attention");
    assert_eq!(s.counters()["replay_capacity"], 1);
    assert_eq!(s.counters()["replay_share_exceeded"], 1);
    // Tags end once their layers can no longer be accepted (expiry + 120 s, inclusive): room
    // again, and status no longer full.
    m.advance(Duration::from_secs(
        expiry(T0) + sphinx::EXPIRY_SKEW + 1 - clock.unix(),
    ));
    let r = submit_from(&n, &src(9), probe()).await;
    assert_eq!(reason(&r), "delivered");
    assert_eq!(status_of(&n).runtime()["replay"]["full"], false);
}

#[tokio::test]
async fn crypto_admission_refuses_at_once_and_keeps_a_slot_for_outbound() {
    let (_m, clock) = manual();
    let n = node(&clock, |c| c.crypto_slots = 4).await;
    let t = node(&clock, |_| {}).await;
    introduce(&n, &t);
    let now = clock.unix();
    // Three slots busy: inbound work (which gets total − 1 = 3) is refused at once…
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    let before = n.ctx.counters.snapshot();
    let r = submit(&n, frame(&key(), &[to(&n)], b"x", expiry(now)).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (429, "backpressure"));
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[
            ("received", 1),
            ("rejected", 1),
            ("backpressure_dropped", 1)
        ])
    );
    // …while building a route and checking its receipt still proceed on the last slot.
    let sent = blindrelay::send::send(&n.ctx, *t.ctx.node.id(), 1, b"outbound".to_vec()).await;
    assert!(sent.is_ok(), "{sent:?}");
    drop(busy);
    let r = submit(&n, frame(&key(), &[to(&n)], b"x", expiry(now)).encode()).await;
    assert_eq!(r.status, 200);
    assert_eq!(blindrelay::context::crypto_slots(1), 4);
    assert_eq!(blindrelay::context::crypto_slots(2), 4);
    assert_eq!(blindrelay::context::crypto_slots(12), 6);
    assert_eq!(blindrelay::context::crypto_slots(64), 8);
}

#[tokio::test]
async fn forged_frames_cannot_quarantine_an_honest_node() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let now = clock.unix();
    let honest = key();
    let attacker = key();
    for _ in 0..13 {
        let mut f = frame(&attacker, &[to(&n)], b"spam", expiry(now));
        f.frame.previous_hop = id(&honest);
        assert_eq!(reason(&submit(&n, f.encode()).await), "invalid_signature");
    }
    let s = n.ctx.counters.snapshot();
    assert_eq!(
        (s.invalid_signature, s.quarantine_started, s.rejected),
        (13, 0, 13)
    );
    assert!(
        !n.pipeline.hops().remembers(&id(&honest)),
        "nothing charged to the claimed identity"
    );
    let r = deliver(&n, &honest, now, b"real").await;
    assert_eq!(reason(&r), "delivered");
}

#[tokio::test]
async fn rate_limit_quarantine_expiry_and_window_reset() {
    let (m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let cheap = |n: &Node, _: u64| junk_frame(&p, n).encode(); // refused later, at the peel
    for _ in 0..120 {
        assert_eq!(
            reason(&submit(&n, cheap(&n, clock.unix())).await),
            "onion_peel_failed"
        );
    }
    assert_eq!(
        reason(&submit(&n, cheap(&n, clock.unix())).await),
        "rate_limited"
    );
    assert_eq!(n.ctx.counters.snapshot().quarantine_started, 1);
    for step in [1, 100, 198] {
        m.advance(Duration::from_secs(step));
        assert_eq!(
            reason(&submit(&n, cheap(&n, clock.unix())).await),
            "quarantined",
            "+{step}"
        );
    }
    assert_eq!(
        n.ctx.counters.snapshot().quarantine_started,
        1,
        "refusals do not restart it"
    );
    m.advance(Duration::from_secs(1)); // 300 s after it started
    assert_eq!(
        reason(&submit(&n, cheap(&n, clock.unix())).await),
        "onion_peel_failed",
        "re-admitted"
    );

    // The window resets after 60 s.
    let w = key();
    let f = |_: u64| junk_frame(&w, &n).encode();
    for _ in 0..120 {
        submit(&n, f(clock.unix())).await;
    }
    m.advance(Duration::from_secs(60));
    for _ in 0..120 {
        assert_eq!(
            reason(&submit(&n, f(clock.unix())).await),
            "onion_peel_failed"
        );
    }
    assert_eq!(reason(&submit(&n, f(clock.unix())).await), "rate_limited");

    // Route loops are on the design's scored list, but sealed by the sender: they never score
    // against the previous hop (the failure score itself is tested in `hop_guard`).
    let l = key();
    let now = clock.unix();
    for i in 0..12 {
        let f = frame(&l, &[to(&n), nobody(id(&l))], b"x", expiry(now));
        let r = submit(&n, f.encode()).await;
        assert_eq!(reason(&r), "route_loop", "{i}");
    }
    assert_eq!(
        reason(&submit(&n, f(now)).await),
        "quarantined",
        "w is still quarantined"
    );
    // A route loop is sealed by the original sender, which `l` (as a previous hop) cannot
    // read: twelve of them are refused but never charged to `l` (issue 12).
    let r = deliver(&n, &l, now, b"x").await;
    assert_eq!(reason(&r), "delivered");
}

#[tokio::test]
async fn five_thousand_fresh_identities_cannot_flush_an_active_quarantine() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let q = key();
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    let mut refused = 0;
    for _ in 0..5000 {
        let r = submit(&n, junk_frame(&key(), &n).encode()).await;
        if reason(&r) == "rate_limited" {
            refused += 1;
        }
    }
    assert!(n.pipeline.hops().len() <= blindrelay::pipeline::hop_guard::MAX_BUCKETS);
    assert!(
        refused > 5000 - blindrelay::pipeline::hop_guard::MAX_BUCKETS as i32,
        "{refused}"
    );
    assert_eq!(reason(&junk(&n, &q).await), "quarantined");
}

#[tokio::test]
async fn every_replay_outcome() {
    // The registry is filled to its capacity below: a small one keeps the test fast (the default
    // capacity itself is filled in the registry's own test).
    const CAPACITY: usize = 512;
    let (m, clock) = manual();
    let n = node(&clock, |c| c.replay_capacity = CAPACITY).await;
    let p = key();
    let now = clock.unix();
    let first = frame(&p, &[to(&n)], b"once", expiry(now));
    let r1 = submit(&n, first.encode()).await;
    assert_eq!(reason(&r1), "delivered");
    // The same request again: the stored response, receipt and all; nothing delivered twice.
    let before = n.ctx.counters.snapshot();
    let r2 = submit(&n, first.encode()).await;
    assert_eq!(r2, r1);
    assert_eq!(
        moved(&before, &n.ctx.counters.snapshot()),
        counted(&[("received", 1), ("duplicate_route", 1)])
    );
    assert_eq!(n.pipeline.terminal().inbox().len(), 1);
    // The same layer in another frame (a re-wrap by another previous hop): its tag is taken.
    let other = first.rewrap(&key());
    let r = submit(&n, other.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (400, "replay_conflict"));
    // In flight.
    let busy = frame(&p, &[to(&n)], b"busy", expiry(now));
    n.pipeline
        .replay()
        .reserve(busy.tag, busy.request_digest(), now)
        .unwrap();
    let r = submit(&n, busy.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "route_in_flight"));
    // The stored response is too old to replay after 120 s; the route stays reserved.
    m.advance(Duration::from_secs(121));
    let r = submit(&n, first.encode()).await;
    assert_eq!(
        (r.status, reason(&r).as_str()),
        (409, "replay_response_expired")
    );
    assert_eq!(n.pipeline.terminal().inbox().len(), 1);
    // Capacity: every slot live → 503, no live reservation evicted.
    let now = clock.unix();
    let live = n.pipeline.replay().live(now);
    for _ in live..CAPACITY {
        n.pipeline
            .replay()
            .reserve(rand::random(), [0; 32], now)
            .unwrap();
    }
    let r = deliver(&n, &p, now, b"full").await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "replay_capacity"));
    let r = submit(&n, first.encode()).await;
    assert_eq!(
        reason(&r),
        "replay_response_expired",
        "the old route was not evicted"
    );
}

#[tokio::test]
async fn a_forwarded_duplicate_is_not_forwarded_twice() {
    let (_m, clock) = manual();
    let a = node(&clock, |_| {}).await;
    let b = node(&clock, |_| {}).await;
    introduce(&a, &b);
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&a), to(&b)], b"relayed", expiry(now));
    let r1 = submit(&a, f.encode()).await;
    assert_eq!(reason(&r1), "forwarded");
    let r2 = submit(&a, f.encode()).await;
    assert_eq!(r2, r1);
    let sb = b.ctx.counters.snapshot();
    assert_eq!((sb.received, sb.terminal), (1, 1));
    assert_eq!(a.ctx.counters.snapshot().forwarded, 1);
}

#[tokio::test]
async fn a_route_accepted_before_a_crash_is_refused_after_the_restart() {
    let (_m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&n)], b"durable", expiry(now));
    let r1 = submit(&n, f.encode()).await;
    assert_eq!(reason(&r1), "delivered");
    // One more reserved but never completed (the process dies while handling it).
    let g = frame(&p, &[to(&n)], b"cut short", expiry(now));
    n.pipeline
        .replay()
        .reserve(g.tag, g.request_digest(), now)
        .unwrap();
    let dir = n.dir.clone();
    let mut n = n;
    n.stop.cancel();
    let tmp = n._tmp.take();
    drop(n);
    // A new process on the same state dir.
    let (pipeline, addr, operator, stop) = start_in(&dir, &clock, |_| {}, false).await;
    let n = Node {
        ctx: Arc::clone(pipeline.ctx()),
        pipeline,
        addr,
        operator,
        dir,
        _tmp: tmp,
        stop,
    };
    assert_eq!(
        submit(&n, f.encode()).await,
        r1,
        "replayed, not delivered again"
    );
    assert_eq!(n.pipeline.terminal().inbox().len(), 1);
    let r = submit(&n, g.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (503, "route_interrupted"));
    assert_eq!(n.pipeline.terminal().inbox().len(), 1);
    // The delivered layer re-wrapped by another previous hop, after the restart: refused by its
    // tag, never delivered again.
    let r = submit(&n, f.rewrap(&key()).encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (400, "replay_conflict"));
    assert_eq!(n.pipeline.terminal().inbox().len(), 1);
}

#[tokio::test]
async fn a_definitive_answer_is_not_retried() {
    use std::sync::atomic::AtomicUsize;
    let (_m, clock) = manual();
    let a = node(&clock, |_| {}).await;
    // A next hop that answers 400 to everything, counting what it gets.
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(move || {
            h.fetch_add(1, Ordering::SeqCst);
            async {
                (
                    axum::http::StatusCode::BAD_REQUEST,
                    "{\"error\":\"invalid_signature\"}",
                )
            }
        }),
    );
    let listener = TcpListener::bind((fresh_ip(), 0)).await.unwrap();
    let fake_addr = listener.local_addr().unwrap();
    let fake = SigningKey::from_bytes(&rand::random());
    serve_tls(listener, app, &fake);
    let d = blindrelay::proto::descriptor::Descriptor::sign(
        &fake,
        x25519_pub(),
        format!("https://{fake_addr}"),
        clock.unix(),
        3600,
    );
    assert!(a.ctx.peers.insert(d));
    let p = key();
    let now = clock.unix();
    let f = frame(&p, &[to(&a), nobody(id(&fake))], b"x", expiry(now));
    let r = submit(&a, f.encode()).await;
    assert_eq!((r.status, reason(&r).as_str()), (502, "forward_failed"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(a.ctx.counters.snapshot().retry_attempted, 0);
}

/// 32 bytes that do not decode as an Ed25519 point.
fn not_a_point() -> [u8; 32] {
    (2u8..=255)
        .map(|y| {
            let mut b = [0u8; 32];
            b[0] = y;
            b
        })
        .find(|b| ed25519_dalek::VerifyingKey::from_bytes(b).is_err())
        .expect("some small y is not on the curve")
}

fn x25519_pub() -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>()))
        .to_bytes()
}

#[tokio::test]
async fn the_sender_verifies_the_terminal_receipt() {
    let (_m, clock) = manual();
    let a = node(&clock, |_| {}).await;
    let b = node(&clock, |_| {}).await;
    let c = node(&clock, |_| {}).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c), (&b, &a), (&c, &a), (&c, &b)] {
        introduce(x, y);
    }
    let d = blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, b"two hops".to_vec())
        .await
        .unwrap();
    assert_eq!(d.hops, 2);
    let s = a.ctx.counters.snapshot();
    assert_eq!(s.verified_client_onion_deliveries, 1);
    assert!(s.last_verified_client_onion_delivery_at.is_some());
    assert_eq!(b.ctx.counters.snapshot().forwarded, 1);
    assert_eq!(
        c.pipeline.terminal().inbox().get(1).unwrap().unwrap(),
        b"two hops"
    );

    // A middle that answers with a made-up receipt is caught by the sender.
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::OK,
                format!(
                    "{{\"outcome\":\"forwarded\",\"receipt\":\"{}\"}}",
                    "ab".repeat(192)
                ),
            )
        }),
    );
    let listener = TcpListener::bind((fresh_ip(), 0)).await.unwrap();
    let fake_addr = listener.local_addr().unwrap();
    let liar = SigningKey::from_bytes(&rand::random());
    serve_tls(listener, app, &liar);
    let desc = blindrelay::proto::descriptor::Descriptor::sign(
        &liar,
        x25519_pub(),
        format!("https://{fake_addr}"),
        clock.unix(),
        3600,
    );
    let (_m2, clock2) = manual();
    let solo = node(&clock2, |_| {}).await;
    assert!(solo.ctx.peers.insert(desc));
    let err = blindrelay::send::send(&solo.ctx, id(&liar), 1, b"x".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(err, blindrelay::send::SendError::Receipt(_)),
        "{err:?}"
    );
    assert_eq!(
        solo.ctx
            .counters
            .snapshot()
            .verified_client_onion_deliveries,
        0
    );
}

fn status_of(n: &Node) -> serde_json::Value {
    serde_json::to_value(blindrelay::status::document(&n.pipeline)).unwrap()
}

async fn three(clock: &Clock) -> (Node, Node, Node) {
    let a = node(clock, |_| {}).await;
    let b = node(clock, |_| {}).await;
    let c = node(clock, |_| {}).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c), (&b, &a), (&c, &a), (&c, &b)] {
        introduce(x, y);
    }
    (a, b, c)
}

#[tokio::test]
async fn probes_are_kept_apart_from_user_traffic() {
    let (_m, clock) = manual();
    let (a, b, c) = three(&clock).await;
    blindrelay::probe::round(&a.ctx).await;
    let s = a.ctx.counters.snapshot();
    assert_eq!(
        (s.probe_attempted, s.probe_succeeded, s.probe_failed),
        (2, 2, 0)
    );
    assert_eq!(
        (
            s.two_hop_probe_attempted,
            s.two_hop_probe_succeeded,
            s.two_hop_probe_failed
        ),
        (1, 1, 0)
    );
    assert_eq!(
        (
            s.received,
            s.terminal,
            s.forwarded,
            s.verified_client_onion_deliveries
        ),
        (0, 0, 0, 0)
    );
    // The probed nodes answered as terminals without counting or storing user traffic.
    let (sb, sc) = (b.ctx.counters.snapshot(), c.ctx.counters.snapshot());
    assert_eq!(sb.probes_answered + sc.probes_answered, 3);
    assert_eq!(sb.terminal + sc.terminal, 0);
    assert!(b.pipeline.terminal().inbox().is_empty() && c.pipeline.terminal().inbox().is_empty());
    // The middle of the two-hop probe cannot tell it from a message: one forward, as designed.
    assert_eq!(sb.forwarded + sc.forwarded, 1);
    let q = status_of(&a).quality().clone();
    assert_eq!(q["status"], "ready");
    assert_eq!(q["proof_scope"], "message_delivery");
    assert_eq!(q["real_relay_ready"], false);
    assert_eq!(q["relay_acceptance"]["total"], 0);
    assert_eq!(q["synthetic_probes"]["total"], 2);
    // A verified client delivery makes the node really ready.
    blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, b"real".to_vec())
        .await
        .unwrap();
    let q = status_of(&a).quality().clone();
    assert_eq!(
        (q["proof_scope"].as_str(), q["real_relay_ready"].as_bool()),
        (Some("client_message_delivery"), Some(true))
    );
}

#[tokio::test]
async fn status_moves_with_recent_events_and_recovers() {
    let (m, clock) = manual();
    let n = node(&clock, |c| c.crypto_slots = 4).await;
    let st = |n: &Node| {
        status_of(n).quality()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(st(&n), "idle");
    let p = key();
    let stranger: NodeId = rand::random();
    let now = clock.unix();
    let f = frame(&p, &[to(&n), nobody(stranger)], b"x", expiry(now));
    submit(&n, f.encode()).await;
    assert_eq!(st(&n), "observing");
    deliver(&n, &p, now, b"a").await;
    assert_eq!(st(&n), "ready");
    m.advance(Duration::from_secs(1800));
    assert_eq!(st(&n), "stale");
    // A rate limit: protecting, while the relay keeps working.
    let q = key();
    for _ in 0..=120 {
        junk(&n, &q).await;
    }
    deliver(&n, &p, clock.unix(), b"b").await;
    assert_eq!(st(&n), "protecting");
    let health = status_of(&n).health().clone();
    let row = health["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["health"] == "quarantined")
        .unwrap()
        .clone();
    assert_eq!(row["node"], blindrelay::proto::Prefix(&id(&q)).to_string());
    assert_eq!(row["quarantine_remaining_secs"], 300);
    assert!(row["reasons"]["rate_limit"].as_u64().unwrap() >= 1);
    // The window passes; with fresh work the node is ready again by itself.
    m.advance(Duration::from_secs(1800));
    deliver(&n, &p, clock.unix(), b"c").await;
    assert_eq!(st(&n), "ready");
    // Backpressure: attention, with what to do.
    let busy: Vec<_> = (0..3)
        .map(|_| n.ctx.crypto.try_acquire().unwrap())
        .collect();
    deliver(&n, &p, clock.unix(), b"d").await;
    drop(busy);
    let q = status_of(&n).quality().clone();
    assert_eq!(q["status"], "attention");
    assert!(q["next_action"].as_str().unwrap().contains("CPU"));
    m.advance(Duration::from_secs(1800));
    // Forward failures: degraded, and the next hop shows as failing after three.
    let dead = node(&clock, |_| {}).await;
    introduce(&n, &dead);
    dead.stop.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let f = frame(&p, &[to(&n), to(&dead)], b"x", expiry(clock.unix()));
        submit(&n, f.encode()).await;
    }
    let doc = status_of(&n);
    assert_eq!(
        doc.quality()["status"],
        "attention",
        "exhausted retries call for attention"
    );
    let failing = doc.health()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["health"] == "failing")
        .cloned();
    assert_eq!(
        failing.unwrap()["node"],
        blindrelay::proto::Prefix(dead.ctx.node.id()).to_string()
    );
}

#[tokio::test]
async fn status_and_metrics_name_no_peer_route_endpoint_or_payload() {
    let (_m, clock) = manual();
    let (a, b, c) = three(&clock).await;
    let payload = b"PRIVATE-PAYLOAD-3f9a".to_vec();
    blindrelay::send::send(&a.ctx, *c.ctx.node.id(), 2, payload.clone())
        .await
        .unwrap();
    blindrelay::probe::round(&a.ctx).await;
    let p = key();
    let f = frame(&p, &[to(&b), to(&c)], b"x", expiry(clock.unix()));
    let route = f.tag;
    submit(&b, f.encode()).await;
    let mut forbidden: Vec<String> = vec![String::from_utf8(payload.clone()).unwrap()];
    use sha2::Digest;
    forbidden.push(hex::encode(sha2::Sha256::digest(&payload)));
    forbidden.push(hex::encode(blindrelay::proto::receipt::commitment(
        &payload,
    )));
    forbidden.push(hex::encode(route));
    for n in [&a, &b, &c] {
        forbidden.push(hex::encode(n.ctx.node.id()));
        forbidden.push(n.addr.to_string());
        forbidden.push(n.addr.ip().to_string());
    }
    forbidden.push(hex::encode(id(&p)));
    for n in [&a, &b, &c] {
        let text = status_of(n).to_string() + &blindrelay::status::metrics::render(&n.pipeline);
        for f in &forbidden {
            assert!(
                !text.contains(f.as_str()),
                "{f} in the status of {}",
                blindrelay::proto::Prefix(n.ctx.node.id())
            );
        }
        assert!(
            status_of(n).health()["rows"].as_array().unwrap().len() <= blindrelay::health::MAX_ROWS
        );
    }
    // The metrics are labelled by status only.
    let metrics = blindrelay::status::metrics::render(&a.pipeline);
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains('{') || line.starts_with("blindrelay_status{status="),
            "{line}"
        );
    }
    assert!(metrics.contains("blindrelay_verified_client_onion_deliveries_total 1"));
}

/// Issue 12, item 4, in v2: a layer's tag stays reserved as long as the layer can be accepted
/// (through its expiry plus the skew, inclusive), also past the registry's 600 s window from the
/// reservation; one second later the layer itself is refused (hand-driven clock).
#[tokio::test]
async fn a_reservation_outlives_its_layer() {
    use blindrelay::proto::sphinx::{EXPIRY_SKEW, MAX_LIFETIME};
    let (m, clock) = manual();
    let n = node(&clock, |_| {}).await;
    let p = key();
    let t0 = clock.unix();
    // Expiring as far ahead as a hop accepts, and as a sender's own layer does.
    let ahead = frame(&p, &[to(&n)], b"ahead", t0 + MAX_LIFETIME + EXPIRY_SKEW);
    let today = frame(&p, &[to(&n)], b"today", t0 + MAX_LIFETIME);
    assert_eq!(reason(&submit(&n, ahead.encode()).await), "delivered");
    assert_eq!(reason(&submit(&n, today.encode()).await), "delivered");
    // The last second `today` is accepted: still reserved.
    m.advance(Duration::from_secs(MAX_LIFETIME + EXPIRY_SKEW));
    assert_eq!(
        reason(&submit(&n, today.encode()).await),
        "replay_response_expired"
    );
    m.advance(Duration::from_secs(1));
    assert_eq!(
        reason(&submit(&n, today.encode()).await),
        "timestamp_expired"
    );
    // Past the registry's window from `ahead`'s reservation, its layer is still acceptable.
    m.advance(Duration::from_secs(EXPIRY_SKEW - 1));
    assert_eq!(clock.unix(), t0 + MAX_LIFETIME + 2 * EXPIRY_SKEW);
    assert_eq!(
        reason(&submit(&n, ahead.encode()).await),
        "replay_response_expired"
    );
    // One second later it is not: refused by its expiry, never delivered again.
    m.advance(Duration::from_secs(1));
    assert_eq!(
        reason(&submit(&n, ahead.encode()).await),
        "timestamp_expired"
    );
    assert_eq!(n.pipeline.terminal().inbox().len(), 2);
}

/// Issue 12, item 6: what the previous hop could not have prevented leaves its health alone.
/// Replays in flight and expired responses have no effect on it at all; this node's own
/// refusals (no route, a disallowed endpoint, a frame for another node, a full replay registry)
/// note the contact only, never `degraded`, never a score. A replay conflict (its own reuse of
/// a route id) does mark it, to show the rows tell the difference.
#[tokio::test]
async fn refusals_the_previous_hop_could_not_prevent_leave_its_health_alone() {
    let (m, clock) = manual();
    let n = node(&clock, |c| c.replay_capacity = 64).await;
    let strict = node(&clock, |c| c.allow_private_endpoints = false).await;
    let other = node(&clock, |_| {}).await;
    introduce(&strict, &other);
    let row = |at: &Node, k: &SigningKey| {
        let prefix = hex::encode(&id(k)[..4]);
        let s = status_of(at);
        s.health()["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == prefix.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no row for {prefix}: {s}"))
    };
    let untouched = |r: &serde_json::Value, what: &str| {
        assert_eq!(r["health"], "healthy", "{what}: {r}");
        assert_eq!(r["reasons"], serde_json::json!({}), "{what}: {r}");
    };
    let now = clock.unix();
    let stranger: NodeId = rand::random();

    // Replays in flight and expired: no effect (only the first delivery's contact).
    let (in_flight, expired) = (key(), key());
    let busy = frame(&in_flight, &[to(&n)], b"b", expiry(now));
    deliver(&n, &in_flight, now, b"contact").await;
    n.pipeline
        .replay()
        .reserve(busy.tag, busy.request_digest(), now)
        .unwrap();
    let first = frame(&expired, &[to(&n)], b"e", expiry(now));
    assert_eq!(reason(&submit(&n, first.encode()).await), "delivered");
    for _ in 0..13 {
        assert_eq!(reason(&submit(&n, busy.encode()).await), "route_in_flight");
    }
    m.advance(Duration::from_secs(121));
    let now = clock.unix();
    for _ in 0..13 {
        assert_eq!(
            reason(&submit(&n, first.encode()).await),
            "replay_response_expired"
        );
    }
    untouched(&row(&n, &in_flight), "route_in_flight");
    untouched(&row(&n, &expired), "replay_response_expired");

    // This node's own refusals: thirteen each, no score, no mark.
    let (no_route, wrong_hop, endpoint, full) = (key(), key(), key(), key());
    for _ in 0..13 {
        let f = frame(&no_route, &[to(&n), nobody(stranger)], b"x", expiry(now));
        assert_eq!(reason(&submit(&n, f.encode()).await), "no_route");
        // v1's `wrong_hop`: a layer for another node (in a frame for this one).
        let f =
            frame(&wrong_hop, &[nobody(stranger)], b"x", expiry(now)).signed_for(&wrong_hop, &n);
        assert_eq!(reason(&submit(&n, f.encode()).await), "onion_peel_failed");
        let f = frame(&endpoint, &[to(&strict), to(&other)], b"x", expiry(now));
        assert_eq!(
            reason(&submit(&strict, f.encode()).await),
            "invalid_endpoint"
        );
    }
    untouched(&row(&n, &no_route), "no_route");
    untouched(&row(&n, &wrong_hop), "wrong_hop");
    untouched(&row(&strict, &endpoint), "invalid_endpoint");
    let live = n.pipeline.replay().live(now);
    for _ in live..64 {
        n.pipeline
            .replay()
            .reserve(rand::random(), [0; 32], now)
            .unwrap();
    }
    for _ in 0..13 {
        assert_eq!(
            reason(&deliver(&n, &full, now, b"full").await),
            "replay_capacity"
        );
    }
    untouched(&row(&n, &full), "replay_capacity");
    for (at, k) in [
        (&n, &no_route),
        (&n, &wrong_hop),
        (&strict, &endpoint),
        (&n, &full),
    ] {
        assert_eq!(row(at, k)["quarantined"], false);
    }
    assert_eq!(n.ctx.counters.quarantine_started.get(), 0);
    assert_eq!(strict.ctx.counters.quarantine_started.get(), 0);

    // A re-wrap of a layer another previous hop already carried is the re-wrapper's fault:
    // marked (health only).
    let rewrapper = key();
    let conflict = first.rewrap(&rewrapper);
    assert_eq!(
        reason(&submit(&n, conflict.encode()).await),
        "replay_conflict"
    );
    let r = row(&n, &rewrapper);
    assert_eq!(r["health"], "degraded", "{r}");
    assert_eq!(r["reasons"]["replay"], 1, "{r}");
}
