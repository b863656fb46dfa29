//! The admission pipeline in process, on tokio's paused clock (each test is
//! `#[tokio::test(start_paused = true)]` and moves time with `tokio::time::advance`): nodes built
//! by `daemon::build` and served in this process on fresh 127.x.y.z addresses with ports from the
//! OS, v2 frames built by hand (their fields may be tampered with), and requests submitted
//! straight to the pipeline. The harness of the `pipeline/` test binary, not of `common/mod.rs`
//! (those tests run real processes).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use blindrelay::clock::Clock;
use blindrelay::context::Context;
use blindrelay::counters::Snapshot;
use blindrelay::daemon::{self, RelayConfig, RunConfig};
use blindrelay::pipeline::{Pipeline, wire};
use blindrelay::proto::frame::Frame;
use blindrelay::proto::sphinx::{self, Delivery, HopSpec, SizeClass};
use blindrelay::proto::{NodeId, ReplayTag};
use blindrelay::relay::Relay;
use blindrelay::replay::ReplayStore;
use blindrelay::send::wrap::expiry;
use ed25519_dalek::SigningKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub const T0: u64 = 1_800_000_000;

/// A loopback address in a /16 of its own among this process's last 199 (no two hops of a
/// route may share a /16): `127.(1 + n % 199).(pid % 256).y`. Listeners bind port 0 on it.
pub fn fresh_ip() -> Ipv4Addr {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = std::process::id();
    Ipv4Addr::new(
        127,
        1 + (n % 199) as u8,
        (p % 256) as u8,
        1 + ((n / 199) % 254) as u8,
    )
}

/// One node running in this process.
pub struct Node {
    pub relay: Arc<Relay>,
    pub pipeline: Arc<Pipeline>,
    pub ctx: Arc<Context>,
    pub addr: SocketAddr,
    pub operator: SocketAddr,
    pub dir: PathBuf,
    pub _tmp: Option<tempfile::TempDir>,
    pub stop: CancellationToken,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A client for a node's public listener that presents `key`'s identity (the previous hop of
/// the frames it posts).
pub fn tls_http_as(key: &SigningKey) -> reqwest::Client {
    blindrelay::links::install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config_as(key).unwrap())
        .build()
        .unwrap()
}

/// Admits `posted` at `n` from `source`, as its link carries it.
pub fn admit(
    n: &Node,
    source: &blindrelay::sources::Source,
    posted: &Posted,
) -> Result<blindrelay::pipeline::Admitted, blindrelay::reason::Reason> {
    n.pipeline.admit(source, posted.from, &posted.bytes)
}

/// A client for a node's public (TLS) and operator (plain) listeners, presenting no identity.
pub fn tls_http() -> reqwest::Client {
    blindrelay::links::install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(blindrelay::links::unpinned_config())
        .build()
        .unwrap()
}

/// Serves `app` on `listener` over TLS as the node whose identity is `key` (a fake next hop).
pub fn serve_tls(listener: TcpListener, app: axum::Router, key: &SigningKey) {
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

pub async fn start_in(
    dir: &Path,
    clock: &Clock,
    tweak: impl FnOnce(&mut RelayConfig),
    init: bool,
) -> (Arc<Relay>, SocketAddr, SocketAddr, CancellationToken) {
    let ip = fresh_ip();
    let public = TcpListener::bind((ip, 0)).await.unwrap();
    let operator = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = public.local_addr().unwrap();
    let operator_addr = operator.local_addr().unwrap();
    if init {
        blindrelay::node::init(dir, &format!("https://{addr}"), clock.unix()).unwrap();
    }
    let mut cfg = RelayConfig::new(true);
    // The clock is paused: a rate would refill only as a test advances it. The gate's own test
    // sets its rate.
    cfg.gate.per_minute = 1_000_000;
    cfg.context.bind = Some(IpAddr::V4(ip));
    tweak(&mut cfg);
    let built = daemon::build(RunConfig {
        state_dir: dir.to_owned(),
        peers: vec![],
        replay_store: ReplayStore::Sqlite,
        relay: cfg,
        clock: *clock,
        accept_lost_state: false,
    })
    .unwrap();
    let relay = Arc::clone(&built.relay);
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(daemon::serve(built, public, operator, async move {
        s.cancelled().await
    }));
    (relay, addr, operator_addr, stop)
}

pub async fn node(clock: &Clock, tweak: impl FnOnce(&mut RelayConfig)) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    start_node(dir, clock, tweak, true, Some(tmp)).await
}

/// A node served in this process from `dir` (made a node first when `init`; otherwise the
/// state dir of an earlier one), `tmp` the temporary dir that holds it, kept as long as it.
pub async fn start_node(
    dir: PathBuf,
    clock: &Clock,
    tweak: impl FnOnce(&mut RelayConfig),
    init: bool,
    tmp: Option<tempfile::TempDir>,
) -> Node {
    let (relay, addr, operator, stop) = start_in(&dir, clock, tweak, init).await;
    Node {
        ctx: Arc::clone(relay.ctx()),
        pipeline: Arc::clone(relay.pipeline()),
        relay,
        addr,
        operator,
        dir,
        _tmp: tmp,
        stop,
    }
}

/// A clock whose dates start at [`T0`] and move with tokio's (paused) clock.
pub fn clock() -> Clock {
    Clock::starting_at(T0)
}

/// Moves tokio's paused clock, and with it the node's dates, by `d`.
pub async fn advance(d: std::time::Duration) {
    tokio::time::advance(d).await;
}

pub fn key() -> SigningKey {
    SigningKey::from_bytes(&rand::random())
}

pub fn id(k: &SigningKey) -> NodeId {
    k.verifying_key().to_bytes()
}

/// A next hop known to `n` (its descriptor inserted), served in this process over TLS by `app`
/// under a fresh identity: the hop of a route through `n`.
pub async fn fake_next_hop(n: &Node, app: axum::Router) -> To {
    let listener = TcpListener::bind((fresh_ip(), 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let key = SigningKey::from_bytes(&rand::random());
    serve_tls(listener, app, &key);
    let d = blindrelay::proto::descriptor::Descriptor::sign(
        &key,
        x25519_pub(),
        format!("https://{addr}"),
        n.ctx.clock.unix(),
        3600,
    );
    assert!(n.ctx.peers.insert(d));
    nobody(id(&key))
}

/// A key `n` knows as a peer (a success to it noted in its peer health): a previous hop with a
/// row of its own there, where a throwaway key counts among the strangers.
pub fn known_key(n: &Node) -> SigningKey {
    let key = key();
    n.ctx
        .health
        .record_known_contact(&id(&key), n.ctx.clock.unix());
    key
}

/// Makes `b` a known peer of `a`.
pub fn introduce(a: &Node, b: &Node) {
    let now = a.ctx.clock.unix();
    assert!(a.ctx.peers.insert(b.ctx.node.descriptor(now)));
}

/// A hop of a test route: a node id and its onion key.
#[derive(Clone, Copy)]
pub struct To {
    pub id: NodeId,
    pub onion: [u8; 32],
}

/// `n` as a hop.
pub fn to(n: &Node) -> To {
    To {
        id: *n.ctx.node.id(),
        onion: n.ctx.node.onion_public(),
    }
}

/// A hop nobody runs (or a key's id as a hop: its layer opens nowhere).
pub fn nobody(id: NodeId) -> To {
    To {
        id,
        onion: x25519_pub(),
    }
}

/// A v2 frame as a test builds it: the frame (its fields may be tampered with) and the replay
/// tag of its first hop's layer.
#[derive(Clone)]
pub struct F {
    pub frame: Frame,
    pub tag: ReplayTag,
    /// The node it is signed for.
    pub to: NodeId,
}

/// A request as a link carries it: its body, and the node id the link's client authenticated
/// with (none: a client that presented no certificate).
#[derive(Clone)]
pub struct Posted {
    pub from: Option<NodeId>,
    pub bytes: Vec<u8>,
}

impl Posted {
    /// `bytes` on a link of `by`.
    pub fn by(by: &SigningKey, bytes: Vec<u8>) -> Posted {
        Posted {
            from: Some(id(by)),
            bytes,
        }
    }

    /// `bytes` on a link whose client presented no identity.
    pub fn anonymous(bytes: Vec<u8>) -> Posted {
        Posted { from: None, bytes }
    }
}

impl F {
    /// The frame on its previous hop's link.
    pub fn encode(&self) -> Posted {
        Posted {
            from: Some(self.frame.previous_hop),
            bytes: self.frame.encode(),
        }
    }

    pub fn request_digest(&self) -> [u8; 32] {
        self.frame.request_digest()
    }

    /// The same packet sent by `by` to `n`: a layer for another node on a link to `n`.
    pub fn signed_for(&self, by: &SigningKey, n: &Node) -> F {
        F {
            frame: Frame::new(self.frame.packet.clone(), id(by)).unwrap(),
            tag: self.tag,
            to: *n.ctx.node.id(),
        }
    }

    /// The same packet sent again by `by`: a re-wrap.
    pub fn rewrap(&self, by: &SigningKey) -> F {
        F {
            frame: Frame::new(self.frame.packet.clone(), id(by)).unwrap(),
            tag: self.tag,
            to: self.to,
        }
    }
}

/// A frame signed by `by` for `path` (the last hop is the terminal) carrying `payload` (a probe
/// when `probe`), every layer expiring at `expires`.
pub fn frame_with(by: &SigningKey, path: &[To], payload: &[u8], probe: bool, expires: u64) -> F {
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
        message_id: rand::random(),
    };
    let class = SizeClass::smallest_for(payload.len()).unwrap();
    let built = sphinx::build(&specs, &delivery, class).unwrap();
    F {
        frame: Frame::new(built.packet, id(by)).unwrap(),
        tag: built.replay_tags[0],
        to: path[0].id,
    }
}

/// [`frame_with`] of a message.
pub fn frame(by: &SigningKey, path: &[To], payload: &[u8], expires: u64) -> F {
    frame_with(by, path, payload, false, expires)
}

/// A frame signed by `by` for `n` whose packet is junk after its version and class: framed and
/// signed, refused once its layer does not open (`onion_peel_failed`).
pub fn junk_frame(by: &SigningKey, n: &Node) -> F {
    let mut packet: Vec<u8> = (0..SizeClass::Small.packet_len())
        .map(|_| rand::random::<u8>())
        .collect();
    packet[..2].copy_from_slice(&[sphinx::VERSION, 0]);
    F {
        frame: Frame::new(packet, id(by)).unwrap(),
        tag: [0; 16],
        to: *n.ctx.node.id(),
    }
}

/// An answer as it goes on the wire.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// One of 64 unknown sources (each its own /24), in turn, so a test's many requests never
/// exhaust one source's share on the frozen clock.
pub fn fresh_source(n: &Node) -> blindrelay::sources::Source {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let i = (NEXT.fetch_add(1, Ordering::Relaxed) % 64) as u8;
    n.pipeline.classify(IpAddr::from([10, 77, i, 1]))
}

pub async fn submit(n: &Node, posted: Posted) -> Reply {
    let verdict = match n
        .pipeline
        .admit(&fresh_source(n), posted.from, &posted.bytes)
    {
        Ok(a) => n.pipeline.process(a).await,
        Err(r) => Err(r),
    };
    let (status, body) = wire(&verdict);
    Reply { status, body }
}

/// A terminal request for `n` carrying `payload`, signed by `by`, sent at `now`.
pub async fn deliver(n: &Node, by: &SigningKey, now: u64, payload: &[u8]) -> Reply {
    submit(n, frame(by, &[to(n)], payload, expiry(now)).encode()).await
}

/// A request whose layer does not open: refused at the peel, after the guard counted it.
pub async fn junk(n: &Node, by: &SigningKey) -> Reply {
    submit(n, junk_frame(by, n).encode()).await
}

pub fn reason(r: &Reply) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["error"]
        .as_str()
        .or(v["outcome"].as_str())
        .unwrap_or("?")
        .to_string()
}

/// The counters that moved between two snapshots.
pub fn moved(before: &Snapshot, after: &Snapshot) -> Vec<(String, u64)> {
    let b = serde_json::to_value(before).unwrap();
    let a = serde_json::to_value(after).unwrap();
    let mut out = Vec::new();
    for (k, v) in a.as_object().unwrap() {
        // Discovery's exchanges run beside the pipeline, at their own times: not a step's.
        if k.starts_with("last_") || k.starts_with("gossip_") {
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

pub fn counted(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<_> = list.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    v.sort();
    v
}

pub async fn submit_from(n: &Node, source: &blindrelay::sources::Source, posted: Posted) -> Reply {
    let verdict = match n.pipeline.admit(source, posted.from, &posted.bytes) {
        Ok(a) => n.pipeline.process(a).await,
        Err(r) => Err(r),
    };
    let (status, body) = wire(&verdict);
    Reply { status, body }
}

/// 32 bytes that do not decode as an Ed25519 point.
pub fn not_a_point() -> [u8; 32] {
    (2u8..=255)
        .map(|y| {
            let mut b = [0u8; 32];
            b[0] = y;
            b
        })
        .find(|b| ed25519_dalek::VerifyingKey::from_bytes(b).is_err())
        .expect("some small y is not on the curve")
}

pub fn x25519_pub() -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>()))
        .to_bytes()
}

pub fn status_of(n: &Node) -> serde_json::Value {
    serde_json::to_value(blindrelay::status::document(&n.relay)).unwrap()
}

pub async fn three(clock: &Clock) -> (Node, Node, Node) {
    let a = node(clock, |_| {}).await;
    let b = node(clock, |_| {}).await;
    let c = node(clock, |_| {}).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c), (&b, &a), (&c, &a), (&c, &b)] {
        introduce(x, y);
    }
    (a, b, c)
}
