use ed25519_dalek::SigningKey;
use x25519_dalek::PublicKey;

use super::*;
use crate::proto::sphinx::{Delivery, HopSpec, SizeClass, build};
use crate::replay::{Outcome, ReplayRegistry, WINDOW_SECS};

const NOW: u64 = 1_800_000_000;
const EXPIRES: u64 = NOW + 540;

/// A node: its identity and onion secret.
struct Hop {
    sign: SigningKey,
    onion: StaticSecret,
}

impl Hop {
    fn new(n: u8) -> Hop {
        Hop {
            sign: SigningKey::from_bytes(&[n; 32]),
            onion: StaticSecret::from([n.wrapping_add(100); 32]),
        }
    }

    fn id(&self) -> NodeId {
        self.sign.verifying_key().to_bytes()
    }

    fn check(&self, frame: Frame, now: u64) -> Result<HopChecked, Reason> {
        check_frame(
            &self.id(),
            &[&self.onion],
            frame,
            now,
            &mut None,
            |_| Ok(()),
        )
    }
}

/// A packet for `route`, carrying `payload`.
fn packet(route: &[&Hop], payload: &[u8], probe: bool, expires_at: u64) -> Vec<u8> {
    let specs: Vec<HopSpec> = route
        .iter()
        .map(|h| HopSpec {
            node_id: h.id(),
            onion_key: PublicKey::from(&h.onion).to_bytes(),
            expires_at,
        })
        .collect();
    let delivery = Delivery {
        payload,
        probe,
        receipt_key: [7; 32],
        message_id: [8; 16],
    };
    let class = SizeClass::smallest_for(payload.len()).expect("fits");
    build(&specs, &delivery, class).expect("builds").packet
}

/// `packet` on `by`'s link.
fn frame(packet: Vec<u8>, by: &SigningKey) -> Frame {
    Frame::new(packet, by.verifying_key().to_bytes()).expect("a v2 packet")
}

/// Runs a route hop by hop: every frame each hop received, and the terminal's payload.
fn run(sender: &SigningKey, route: &[&Hop], payload: &[u8]) -> (Vec<Frame>, Vec<u8>) {
    let mut received = vec![frame(packet(route, payload, false, EXPIRES), sender)];
    for (i, hop) in route.iter().enumerate() {
        let got = received.last().expect("one frame per hop").clone();
        match hop.check(got, NOW).expect("accepted").next {
            HopNext::Forward { next_hop, packet } => {
                assert_eq!(next_hop, route[i + 1].id());
                received.push(frame(packet, &hop.sign));
            }
            HopNext::Terminal { payload, probe, .. } => {
                assert!(!probe);
                assert_eq!(i, route.len() - 1);
                return (received, payload);
            }
        }
    }
    panic!("no terminal");
}

#[test]
fn a_route_delivers_and_every_frame_has_one_length() {
    let sender = SigningKey::from_bytes(&[1; 32]);
    let hops: Vec<Hop> = (10..15).map(Hop::new).collect();
    for n in [1, 3, 5] {
        let route: Vec<&Hop> = hops.iter().take(n).collect();
        for len in [0, 100, 2048, 2049, 60_000] {
            let payload = vec![0x5a; len];
            let (frames, got) = run(&sender, &route, &payload);
            assert_eq!(got, payload);
            let lens: Vec<usize> = frames.iter().map(|f| f.encode().len()).collect();
            assert!(
                lens.iter().all(|&l| l == lens[0]),
                "{n} hops, {len} B: {lens:?}"
            );
            assert_nothing_in_clear(&frames, &route);
        }
    }
}

/// No node id but each frame's own previous hop, no replay tag, expiry or hop count appears in
/// any frame's bytes.
fn assert_nothing_in_clear(frames: &[Frame], route: &[&Hop]) {
    let expiry = EXPIRES.to_be_bytes();
    for (i, f) in frames.iter().enumerate() {
        let bytes = f.encode();
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        for hop in route {
            if hop.id() != f.previous_hop {
                assert!(!has(&hop.id()), "frame {i} names a hop");
            }
            // Each hop's tag for this layer, where the layer opens for it.
            let mut p = f.packet.clone();
            if let Ok(peeled) = sphinx::peel_in_place(&[&hop.onion], &mut p) {
                assert!(!has(&peeled.replay_tag), "frame {i} carries its tag");
            }
        }
        assert!(!has(&expiry), "frame {i} carries its expiry");
        // The only bytes in clear at a fixed place are the version and the class.
        assert_eq!(bytes[0], sphinx::VERSION);
    }
}

#[test]
fn a_probe_is_flagged_only_at_the_terminal() {
    let sender = SigningKey::from_bytes(&[1; 32]);
    let (a, b) = (Hop::new(10), Hop::new(11));
    let first = frame(packet(&[&a, &b], b"probe", true, EXPIRES), &sender);
    let HopNext::Forward { packet, .. } = a.check(first, NOW).expect("forwarded").next else {
        panic!("a forwards");
    };
    assert_eq!(packet.len(), SizeClass::Small.packet_len());
    let HopNext::Terminal { probe, .. } = b.check(frame(packet, &a.sign), NOW).expect("ok").next
    else {
        panic!("b delivers");
    };
    assert!(probe);
}

#[test]
fn refusals() {
    let sender = SigningKey::from_bytes(&[1; 32]);
    let (a, b) = (Hop::new(10), Hop::new(11));
    let p = packet(&[&a, &b], b"x", false, EXPIRES);
    let reason = |r: Result<HopChecked, Reason>| r.map(|_| ()).unwrap_err();
    // Signed by this node itself.
    assert_eq!(
        reason(a.check(frame(p.clone(), &a.sign), NOW)),
        Reason::SelfLoop
    );
    // For another node.
    assert_eq!(
        reason(b.check(frame(p.clone(), &sender), NOW)),
        Reason::OnionPeelFailed
    );
    // Expired, and too far ahead.
    assert_eq!(
        reason(a.check(frame(p, &sender), EXPIRES + sphinx::EXPIRY_SKEW + 1)),
        Reason::TimestampExpired
    );
    let ahead = packet(&[&a, &b], b"x", false, NOW + 2000);
    assert_eq!(
        reason(a.check(frame(ahead, &sender), NOW)),
        Reason::TimestampInFuture
    );
    // The previous hop named as next hop: a → b → a refused at b.
    let looped = packet(&[&a, &b, &a], b"x", false, EXPIRES);
    let HopNext::Forward { packet, .. } = a.check(frame(looped, &sender), NOW).unwrap().next else {
        panic!("a forwards");
    };
    assert_eq!(
        reason(b.check(frame(packet, &a.sign), NOW)),
        Reason::RouteLoop
    );
}

/// A layer captured at any position and re-wrapped in a fresh frame (another previous hop, its
/// own signature) has the same tag and another digest: the registry refuses it as a conflict,
/// also once reopened from disk, for as long as the layer is acceptable.
#[test]
fn a_rewrapped_layer_is_refused_at_every_position_also_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sender = SigningKey::from_bytes(&[1; 32]);
    let attacker = SigningKey::from_bytes(&[66; 32]);
    let hops: Vec<Hop> = (10..15).map(Hop::new).collect();
    let route: Vec<&Hop> = hops.iter().collect();
    let (frames, _) = run(&sender, &route, b"once");
    for (i, hop) in route.iter().enumerate() {
        let path = dir.path().join(format!("replay-{i}.sqlite"));
        let reserve = |reg: &ReplayRegistry, c: &HopChecked, now| {
            reg.reserve_through(c.tag, c.digest, now, c.keep_through, None)
                .expect("reserve")
        };
        let first = hop.check(frames[i].clone(), NOW).expect("accepted");
        {
            let reg = ReplayRegistry::open_sqlite(&path, 64, WINDOW_SECS, NOW).expect("open");
            assert_eq!(reserve(&reg, &first, NOW), Outcome::New, "hop {i}");
            let rewrapped = frame(frames[i].packet.clone(), &attacker);
            let again = hop
                .check(rewrapped, NOW + 1)
                .expect("the layer still opens");
            assert_eq!(again.tag, first.tag, "hop {i}");
            assert_ne!(again.digest, first.digest, "hop {i}");
            assert_eq!(reserve(&reg, &again, NOW + 1), Outcome::Conflict, "hop {i}");
        }
        // After a restart, and until the layer itself is refused.
        let last = EXPIRES + sphinx::EXPIRY_SKEW;
        for now in [NOW + 2, NOW + WINDOW_SECS + 1, last] {
            let reg = ReplayRegistry::open_sqlite(&path, 64, WINDOW_SECS, now).expect("reopen");
            let rewrapped = frame(frames[i].packet.clone(), &attacker);
            let again = hop.check(rewrapped, now).expect("still acceptable");
            assert_eq!(
                reserve(&reg, &again, now),
                Outcome::Conflict,
                "hop {i} at {now}"
            );
        }
        let late = frame(frames[i].packet.clone(), &attacker);
        assert_eq!(
            hop.check(late, last + 1).map(|_| ()).unwrap_err(),
            Reason::TimestampExpired,
            "hop {i}"
        );
    }
}

#[test]
fn the_tag_is_kept_through_expiry_plus_skew() {
    let sender = SigningKey::from_bytes(&[1; 32]);
    let a = Hop::new(10);
    let c = a
        .check(frame(packet(&[&a], b"x", false, EXPIRES), &sender), NOW)
        .expect("ok");
    assert_eq!(c.expires_at, EXPIRES);
    assert_eq!(c.keep_through, EXPIRES + sphinx::EXPIRY_SKEW);
}
