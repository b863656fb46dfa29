//! The CPU cost of the v2 onion format (`proto::sphinx`): building
//! a packet for 1, 3 and 5 hops, peeling one layer, and a v2 hop's whole CPU work on a frame
//! (signature check, peel in place, expiry and slot, the next frame signed), for a 1 KiB and a
//! 64 KiB payload. One thread, no I/O. Each case runs a fixed number of rounds, and stops early after 2 s.
//!
//! Run with `cargo run --release -p blindrelay --example sphinx` (or `scripts/bench-blindrelay
//! sphinx`). Prints a Markdown table: minimum, median and p90 microseconds per operation (the
//! minimum is the figure least disturbed by other load on the machine).

use std::hint::black_box;
use std::time::{Duration, Instant};

use blindrelay::pipeline::{self, HopNext};
use blindrelay::proto::frame::Frame;
use blindrelay::proto::sphinx::{self, Action, Delivery, HopSpec, SizeClass};
use ed25519_dalek::SigningKey;
use x25519_dalek::{PublicKey, StaticSecret};

const ROUNDS: usize = 500;
const CASE_BUDGET: Duration = Duration::from_secs(2);

struct Node {
    secret: StaticSecret,
    spec: HopSpec,
}

fn nodes(n: usize) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let secret = StaticSecret::from(rand::random::<[u8; 32]>());
            let spec = HopSpec {
                node_id: [i as u8 + 1; 32],
                onion_key: PublicKey::from(&secret).to_bytes(),
                expires_at: 1_764_450_600,
            };
            Node { secret, spec }
        })
        .collect()
}

/// Minimum, median and p90 of `rounds` timings of `f`, in microseconds, and the rounds run.
fn measure(mut f: impl FnMut() -> Duration) -> (f64, f64, f64, usize) {
    let start = Instant::now();
    let mut samples = Vec::with_capacity(ROUNDS);
    while samples.len() < ROUNDS && start.elapsed() < CASE_BUDGET {
        samples.push(f().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.0), at(0.5), at(0.9), samples.len())
}

fn row(what: &str, hops: usize, payload: usize, len: usize, timing: (f64, f64, f64, usize)) {
    let (min, p50, p90, n) = timing;
    println!("| {what} | {hops} | {payload} | {len} | {min:.1} | {p50:.1} | {p90:.1} | {n} |");
}

/// What a v2 hop does per frame over `route`, per hop: the layer peeled in place, its expiry
/// and slot (`pipeline::check_frame`; the previous hop is the link's, checked once per link).
fn hop_per_frame(route: &[Node], packet: impl Fn() -> Vec<u8>) -> (f64, f64, f64, usize) {
    let hops = route.len();
    let keys: Vec<[u8; 32]> = (0..=hops)
        .map(|i| {
            SigningKey::from_bytes(&[i as u8 + 50; 32])
                .verifying_key()
                .to_bytes()
        })
        .collect();
    let now = route[0].spec.expires_at - 300;
    measure(|| {
        let mut frame = Frame::new(packet(), keys[0]).expect("frames");
        let mut total = Duration::ZERO;
        for (i, node) in route.iter().enumerate() {
            let received = frame.clone();
            let t = Instant::now();
            let checked = pipeline::check_frame(
                &node.spec.node_id,
                &[&node.secret],
                received,
                now,
                &mut None,
                |_| Ok(()),
            )
            .expect("accepted");
            match checked.next {
                HopNext::Forward { packet, .. } => {
                    frame = Frame::new(packet, keys[i + 1]).expect("frames");
                    total += t.elapsed();
                }
                HopNext::Terminal { payload, .. } => {
                    total += t.elapsed();
                    black_box(payload);
                }
            }
        }
        total / hops as u32
    })
}

/// What each hop paid per frame while frames carried their previous hop's signature (the
/// link's mutual TLS took its place): a signature made for the next hop, one checked.
fn signature_row() {
    let (key, bytes) = (SigningKey::from_bytes(&[4; 32]), [0x11u8; 133]);
    let verifying = key.verifying_key();
    let timing = measure(|| {
        let t = Instant::now();
        let sig = ed25519_dalek::Signer::sign(&key, black_box(&bytes));
        black_box(verifying.verify_strict(black_box(&bytes), &sig)).ok();
        t.elapsed()
    });
    row(
        "the per-frame signature frames no longer carry: one Ed25519 sign + one verify_strict",
        0,
        0,
        96,
        timing,
    );
}

fn main() {
    println!(
        "| operation | hops | payload (B) | bytes on the wire per hop | min µs | median µs | p90 µs | rounds |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let (secret, point) = (StaticSecret::from([3; 32]), PublicKey::from([9; 32]));
    let timing = measure(|| {
        let t = Instant::now();
        black_box(secret.diffie_hellman(black_box(&point)));
        t.elapsed()
    });
    row("one X25519 (reference)", 0, 0, 0, timing);
    signature_row();
    for payload_len in [1024, 64 * 1024] {
        let payload = vec![0x5au8; payload_len];
        let class = SizeClass::smallest_for(payload_len).expect("fits a class");
        for hops in [1, 3, 5] {
            let route = nodes(hops);
            let specs: Vec<HopSpec> = route.iter().map(|n| n.spec.clone()).collect();
            let delivery = Delivery {
                payload: &payload,
                probe: false,
                receipt_key: [7; 32],
                message_id: [8; 16],
            };
            let built = || sphinx::build(&specs, &delivery, class).expect("builds");
            let timing = measure(|| {
                let t = Instant::now();
                black_box(built());
                t.elapsed()
            });
            row("v2 build", hops, payload_len, class.packet_len(), timing);

            // Peel every hop of fresh packets; time each hop's peel.
            let timing = measure(|| {
                let mut packet = built().packet;
                let mut total = Duration::ZERO;
                for node in &route {
                    let t = Instant::now();
                    let peeled = sphinx::peel(&[&node.secret], &packet).expect("peels");
                    total += t.elapsed();
                    match peeled.action {
                        Action::Forward { packet: next, .. } => packet = next,
                        Action::Deliver { payload, .. } => {
                            black_box(payload);
                        }
                    }
                }
                total / hops as u32
            });
            row(
                "v2 peel, per hop",
                hops,
                payload_len,
                class.packet_len(),
                timing,
            );

            let timing = hop_per_frame(&route, || built().packet);
            row(
                "v2 hop: peel in place (the previous hop is the link's), per hop",
                hops,
                payload_len,
                class.packet_len(),
                timing,
            );
        }
    }
}
