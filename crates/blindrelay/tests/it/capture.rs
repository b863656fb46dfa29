//! What a link observer sees of a v2 delivery, on real processes behind recording proxies
//! (issue 13, "Tests"): every link message of one delivery has the same length on the wire, for
//! 1-, 3- and 5-hop routes and every size class, and no node id, replay tag, expiry or payload
//! appears in clear. And a layer re-wrapped in a fresh frame is refused at every position, also
//! after every node restarted.
//!
//! This process is the sender: it builds the packet itself (so it knows every layer's replay tag
//! and expiry) and posts it to the entry hop's proxy over a framed link under a key of its own,
//! as a node's sender does; the nodes forward it through the proxies in front of each other.
//! Answers over HTTP (a sender that offers no framed link) have one length of their own.

use crate::common;

use blindrelay::links::{LinkLimits, Links, Posted};
use blindrelay::node::Node as NodeKeys;
use blindrelay::proto::descriptor::Descriptor;
use blindrelay::proto::frame::frame_len;
use blindrelay::proto::receipt;
use blindrelay::proto::sphinx::{self, Action, Delivery, HopSpec, SizeClass};
use blindrelay::send::wrap::expiry;
use common::{Net, Tap, http, tap_mark, unix_now};
use ed25519_dalek::SigningKey;
use serde_json::Value;

/// A packet built by this process, with what it knows of it.
struct Sent {
    frame: Vec<u8>,
    tags: Vec<[u8; 16]>,
    message_id: [u8; 16],
    expires_at: u64,
    receipt_key: [u8; 32],
    packet: Vec<u8>,
}

fn build(path: &[&Descriptor], payload: &[u8], class: SizeClass) -> Sent {
    let expires_at = expiry(unix_now());
    let specs: Vec<HopSpec> = path
        .iter()
        .map(|d| HopSpec {
            node_id: d.node_id,
            onion_key: d.onion_key,
            expires_at,
        })
        .collect();
    let (receipt_key, message_id): ([u8; 32], [u8; 16]) = (rand::random(), rand::random());
    let delivery = Delivery {
        payload,
        probe: false,
        receipt_key,
        message_id,
    };
    let built = sphinx::build(&specs, &delivery, class).expect("builds");
    Sent {
        frame: built.packet.clone(),
        tags: built.replay_tags,
        message_id,
        expires_at,
        receipt_key,
        packet: built.packet,
    }
}

/// Posts `body` to the node of `to` as a node does: over the framed link (`blindrelay/1`), as
/// [`sender`]; the status and the JSON answer.
async fn post(to: &Descriptor, body: Vec<u8>) -> (u16, Value) {
    let url = format!("{}/v2/relay", to.endpoint);
    let deadline = blindrelay::clock::now() + std::time::Duration::from_secs(15);
    match sender()
        .post_framed(&to.node_id, &url, &body, deadline)
        .await
    {
        Posted::Answer(status, body) => {
            (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
        }
        other => panic!("no answer on the framed link: {other:?}"),
    }
}

/// The test's sender: one identity for every frame it posts, so its retry is a retry (its
/// links made anew for each post: each test has its own runtime).
fn sender() -> Links {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    blindrelay::links::install_provider();
    let limits = LinkLimits {
        idle_per_peer: 1,
        clients: 16,
    };
    let key = SigningKey::from_bytes(KEY.get_or_init(rand::random));
    Links::new(None, std::sync::Arc::default(), limits, Some(&key))
}

/// The test's HTTP sender (a node that speaks only HTTP, a tool): one identity throughout.
fn http_sender() -> &'static reqwest::Client {
    static SENDER: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    SENDER.get_or_init(http)
}

/// Posts `body` to `endpoint`'s `path` over HTTP, as [`http_sender`].
async fn post_to(endpoint: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
    post_as(http_sender(), endpoint, path, body).await
}

/// As [`post_to`], from `client`.
async fn post_as(
    client: &reqwest::Client,
    endpoint: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let r = client
        .post(format!("{endpoint}{path}"))
        .header(reqwest::header::HOST, blindrelay::forward::LINK_HOST)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .expect("relay request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn descriptors(net: &Net) -> Vec<Descriptor> {
    let mut out = Vec::new();
    for i in 0..net.len() {
        let d = serde_json::from_value(net.get_json(i, "/v1/descriptor").await).expect("JSON");
        out.push(d);
    }
    out
}

/// Every answer the taps saw after `mark` (see `Tap::answers_since`).
fn link_answers(taps: &[Tap], mark: u32) -> Vec<usize> {
    taps.iter().flat_map(|t| t.answers_since(mark)).collect()
}

/// Every relay request (at least a frame of `class` long) the taps saw after `mark`.
fn link_messages(taps: &[Tap], mark: u32, class: SizeClass) -> Vec<usize> {
    taps.iter()
        .flat_map(|t| t.requests_since(mark))
        .filter(|len| *len >= frame_len(class))
        .collect()
}

fn rand_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|_| rand::random::<u8>()).collect()
}

fn assert_absent(wire: &[u8], what: &str, needle: &[u8]) {
    assert!(
        !wire.windows(needle.len()).any(|w| w == needle),
        "{what} in clear on a link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_message_of_a_delivery_has_one_length_and_nothing_is_in_clear() {
    // Gossip off: its exchanges are another protocol on the same links, of other lengths.
    let (net, taps) =
        Net::start_tapped(5, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let ds = descriptors(&net).await;
    let key = SigningKey::from_bytes(&rand::random());
    let mut sent = Vec::new();
    let mut answer_lens = Vec::new();
    for class in SizeClass::ALL {
        let marker = format!("CAPTURE-MARKER-{class:?}-").into_bytes();
        let payload: Vec<u8> = marker
            .iter()
            .copied()
            .cycle()
            .take(class.capacity() - 100)
            .collect();
        let mut lengths = Vec::new();
        for hops in [1, 3, 5] {
            let path: Vec<&Descriptor> = ds[..hops].iter().collect();
            let s = build(&path, &payload, class);
            let mark = tap_mark();
            let (status, answer) = post(&ds[0], s.frame.clone()).await;
            assert_eq!(status, 200, "{class:?} over {hops}: {answer}");
            // The receipt names the message and verifies.
            let sealed = hex::decode(answer["receipt"].as_str().expect("receipt")).expect("hex");
            let r = receipt::open(&sealed, &s.receipt_key).expect("opens");
            let commitment = receipt::commitment(&payload);
            let terminal = path[hops - 1].node_id;
            r.verify(&s.message_id, &commitment, &terminal, unix_now())
                .expect("verifies");
            let messages = link_messages(&taps, mark, class);
            assert_eq!(messages.len(), hops, "{class:?} over {hops}: {messages:?}");
            assert!(
                messages.iter().all(|m| *m == messages[0]),
                "{class:?} over {hops}: {messages:?}"
            );
            lengths.push(messages[0]);
            // Every answer on the way back (the terminal's, then each hop's) has one length.
            let answers = link_answers(&taps, mark);
            assert_eq!(answers.len(), hops, "{class:?} over {hops}: {answers:?}");
            answer_lens.extend(answers);
            sent.push((s, marker.clone()));
        }
        // The same length whatever the route's length: a hop cannot tell its position.
        assert!(
            lengths.iter().all(|l| *l == lengths[0]),
            "{class:?}: {lengths:?}"
        );
        let overhead = lengths[0] - frame_len(class);
        assert!(overhead < 600, "{class:?}: {overhead} bytes of headers");
        println!(
            "{class:?}: every link message {} bytes on the wire ({} B frame)",
            lengths[0],
            frame_len(class)
        );
    }
    // A refusal's answer and a duplicate's have that length too: a frame that is not one
    // (refused after reading it) and a frame already delivered (its stored answer).
    let (duplicate, _) = &sent[0];
    for (body, want) in [
        (rand_bytes(frame_len(SizeClass::Small)), 400),
        (duplicate.frame.clone(), 200),
    ] {
        let mark = tap_mark();
        let (status, answer) = post(&ds[0], body).await;
        assert_eq!(status, want, "{answer}");
        let answers = link_answers(&taps, mark);
        assert_eq!(answers.len(), 1, "{answer}: {answers:?}");
        println!("answer {status} {answer}: {} bytes on the wire", answers[0]);
        answer_lens.extend(answers);
    }
    assert!(
        answer_lens.iter().all(|l| *l == answer_lens[0]),
        "answers of different lengths on the links: {answer_lens:?}"
    );
    println!(
        "every answer on a framed link (accepted, refused, replayed) {} bytes on the wire",
        answer_lens[0]
    );
    // Over HTTP (a sender that offers no framed link) every answer has one length of its own:
    // one decided after reading the body (not a frame), one before (a v1 request, whose
    // connection is then closed), and a layer already delivered, from another previous hop (a
    // re-wrap: `replay_conflict`).
    let mut http_lens = Vec::new();
    for (path, body, want) in [
        ("/v2/relay", rand_bytes(frame_len(SizeClass::Small)), 400),
        ("/v1/relay", rand_bytes(200), 400),
        ("/v2/relay", duplicate.frame.clone(), 400),
    ] {
        let mark = tap_mark();
        let (status, answer) = post_to(&ds[0].endpoint, path, body).await;
        assert_eq!(status, want, "{path}: {answer}");
        let answers = link_answers(&taps, mark);
        assert_eq!(answers.len(), 1, "{path} {answer}: {answers:?}");
        http_lens.extend(answers);
    }
    assert!(
        http_lens.iter().all(|l| *l == http_lens[0]),
        "HTTP answers of different lengths: {http_lens:?}"
    );
    println!(
        "every answer over HTTP (accepted, refused, replayed) {} bytes on the wire",
        http_lens[0]
    );
    // Nothing in clear on any link: no node id (bytes or hex), no tag, no expiry, no payload.
    for (i, tap) in taps.iter().enumerate() {
        let wire = tap.bytes();
        for d in &ds {
            assert_absent(&wire, "a node id", &d.node_id);
            assert_absent(&wire, "a node id in hex", hex::encode(d.node_id).as_bytes());
            assert_absent(
                &wire,
                "a node id prefix",
                hex::encode(&d.node_id[..4]).as_bytes(),
            );
        }
        let sender = key.verifying_key().to_bytes();
        assert_absent(&wire, "the sender's id", &sender);
        for (s, marker) in &sent {
            for tag in &s.tags {
                assert_absent(&wire, "a replay tag", tag);
                assert_absent(&wire, "a replay tag in hex", hex::encode(tag).as_bytes());
            }
            assert_absent(&wire, "the expiry", &s.expires_at.to_be_bytes());
            assert_absent(
                &wire,
                "the expiry in decimal",
                s.expires_at.to_string().as_bytes(),
            );
            assert_absent(&wire, "the payload", marker);
            // The packet's bytes past its version and class (alpha, beta, gamma) are not
            // carried in clear either.
            assert_absent(&wire, "the packet", &s.packet[2..64]);
        }
        assert!(wire.len() > 1000, "tap {i} saw {} bytes", wire.len());
    }
}

/// Each hop's packet of a delivery, as the sender and each hop's keys give it: the packet the
/// hop at each position received.
fn packets_along(net: &Net, path: &[usize], first: Vec<u8>) -> Vec<Vec<u8>> {
    let now = unix_now();
    let mut out = vec![first];
    for &i in &path[..path.len() - 1] {
        let keys = NodeKeys::load(&net.node(i).state_dir).expect("node keys");
        let secrets = keys.onion_secrets(now);
        let refs: Vec<_> = secrets.iter().collect();
        let peeled = sphinx::peel(&refs, out.last().expect("a packet")).expect("peels");
        match peeled.action {
            Action::Forward { packet, .. } => out.push(packet),
            Action::Deliver { .. } => panic!("delivered before the end"),
        }
    }
    out
}

/// The captured layer of every position, re-wrapped in a fresh frame (another previous hop's
/// key, fresh signature) and posted straight to that position's node, is refused as
/// `replay_conflict`: its tag is the layer's, whatever frame carries it. The same after every
/// node restarted (the tags are on disk); the original frame from its own previous hop is a
/// duplicate, answered from the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrapped_layer_is_refused_at_every_position_also_after_a_restart() {
    let (mut net, _taps) =
        Net::start_tapped(3, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let ds = descriptors(&net).await;
    let path = [0, 1, 2];
    let route: Vec<&Descriptor> = path.iter().map(|&i| &ds[i]).collect();
    let s = build(&route, b"once only", SizeClass::Small);
    let (status, answer) = post(&ds[0], s.frame.clone()).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (200, Some("forwarded"))
    );
    let first_receipt = answer["receipt"].clone();
    assert_eq!(net.inbox_ids(2).await.len(), 1);
    let packets = packets_along(&net, &path, s.packet.clone());
    for restarted in [false, true] {
        if restarted {
            // A stored answer is written within 0.1 s of the request (a kill -9 before that
            // loses it: the retry would get `route_interrupted`, still never a second run).
            for i in 0..net.len() {
                net.wait_answers_written(i).await;
            }
            for i in 0..net.len() {
                net.restart(i).await;
            }
            for i in 0..net.len() {
                net.wait_routable(i, net.len() - 1).await;
            }
        }
        for (pos, packet) in packets.iter().enumerate() {
            // The same layer from another previous hop: a re-wrap.
            let other = http();
            let endpoint = &ds[path[pos]].endpoint;
            let (status, answer) = post_as(&other, endpoint, "/v2/relay", packet.clone()).await;
            assert_eq!(
                (status, answer["error"].as_str()),
                (400, Some("replay_conflict")),
                "position {pos}, restarted: {restarted}"
            );
        }
        // The sender retrying its own frame gets the stored answer, not a second delivery.
        let (status, again) = post(&ds[0], s.frame.clone()).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["receipt"], first_receipt, "the stored answer");
        assert_eq!(net.inbox_ids(2).await.len(), 1, "restarted: {restarted}");
    }
}
