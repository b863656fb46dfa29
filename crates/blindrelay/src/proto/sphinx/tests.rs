use proptest::prelude::*;
use x25519_dalek::{PublicKey, StaticSecret};

use super::keys::{HopKeys, STREAM_LEN, xor_stream};
use super::*;

struct Node {
    secret: StaticSecret,
    spec: HopSpec,
}

const EXPIRES: u64 = 1_764_450_600;

fn node_from(seed: u8) -> Node {
    let secret = StaticSecret::from([seed; 32]);
    let spec = HopSpec {
        node_id: [seed ^ 0xa5; 32],
        onion_key: PublicKey::from(&secret).to_bytes(),
        expires_at: EXPIRES + u64::from(seed),
    };
    Node { secret, spec }
}

fn nodes(n: usize) -> Vec<Node> {
    (0..n).map(|i| node_from(i as u8 + 1)).collect()
}

fn specs(nodes: &[Node]) -> Vec<HopSpec> {
    nodes.iter().map(|n| n.spec.clone()).collect()
}

fn delivery(payload: &[u8]) -> Delivery<'_> {
    Delivery {
        payload,
        probe: false,
        receipt_key: [0x55; 32],
        message_id: [0x66; 16],
    }
}

/// Peels `packet` through every node, checking each step; returns the packets each hop received
/// and the final peel.
fn walk(nodes: &[Node], packet: Vec<u8>) -> (Vec<Vec<u8>>, Peeled) {
    let mut seen = vec![packet];
    for (i, node) in nodes.iter().enumerate() {
        let peeled = peel(&[&node.secret], seen.last().expect("one packet")).expect("peels");
        assert_eq!(peeled.expires_at, node.spec.expires_at);
        match peeled.action {
            Action::Forward { next_hop, packet } => {
                assert_eq!(
                    next_hop,
                    nodes[i + 1].spec.node_id,
                    "hop {i} names the next"
                );
                seen.push(packet);
            }
            Action::Deliver { .. } => {
                assert_eq!(i, nodes.len() - 1, "only the last hop delivers");
                return (seen, peeled);
            }
        }
    }
    panic!("no hop delivered");
}

/// What a hop sees of beta once decrypted: its slot, then the rest (what it would shift on).
fn routing_view(secret: &StaticSecret, packet: &[u8]) -> [u8; STREAM_LEN] {
    let alpha: [u8; 32] = packet[ALPHA_AT..BETA_AT].try_into().expect("alpha");
    // The X25519 ladder itself, not the hop's Edwards products: an independent computation.
    let shared = secret.diffie_hellman(&PublicKey::from(alpha));
    assert!(shared.was_contributory());
    let keys = HopKeys::derive(shared.as_bytes(), &alpha);
    let mut routing = [0u8; STREAM_LEN];
    routing[..BETA_LEN].copy_from_slice(&packet[BETA_AT..GAMMA_AT]);
    xor_stream(&keys.rho, &mut routing);
    routing
}

/// Pearson's chi-square statistic of the byte histogram against the uniform distribution.
fn chi_square(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let expected = bytes.len() as f64 / 256.0;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// 255 degrees of freedom: mean 255, standard deviation 22.6. 400 is 6.4 standard deviations
/// out: a uniform source fails it about once in 10¹⁰ tries; a biased one (zeros, ASCII,
/// a repeated pattern) fails it at once for the sample sizes used here.
const CHI_SQUARE_MAX: f64 = 400.0;

#[test]
fn every_route_length_delivers_with_constant_size() {
    let all = nodes(MAX_HOPS);
    for n in 1..=MAX_HOPS {
        let route = &all[..n];
        for probe in [false, true] {
            let payload = format!("message over {n} hops").into_bytes();
            let d = Delivery {
                probe,
                ..delivery(&payload)
            };
            let built = build(&specs(route), &d, SizeClass::Small).expect("builds");
            assert_eq!(built.replay_tags.len(), n);
            let (seen, last) = walk(route, built.packet);
            assert!(
                seen.iter()
                    .all(|p| p.len() == SizeClass::Small.packet_len())
            );
            assert_eq!(last.replay_tag, built.replay_tags[n - 1]);
            assert_eq!(
                last.action,
                Action::Deliver {
                    payload: payload.clone(),
                    probe,
                    receipt_key: [0x55; 32],
                    message_id: [0x66; 16],
                }
            );
        }
    }
}

#[test]
fn classes_have_fixed_lengths_and_the_smallest_fits() {
    assert_eq!(HEADER_LEN, 562);
    let lens: Vec<usize> = SizeClass::ALL.iter().map(|c| c.packet_len()).collect();
    assert_eq!(lens, [2_610, 16_946, 66_098, 197_170]);
    assert_eq!(SizeClass::smallest_for(0), Some(SizeClass::Small));
    assert_eq!(SizeClass::smallest_for(2048), Some(SizeClass::Small));
    assert_eq!(SizeClass::smallest_for(2049), Some(SizeClass::Medium));
    assert_eq!(SizeClass::smallest_for(65_537), Some(SizeClass::Huge));
    assert_eq!(SizeClass::smallest_for(196_608), Some(SizeClass::Huge));
    assert_eq!(SizeClass::smallest_for(196_609), None);
    for class in SizeClass::ALL {
        assert_eq!(SizeClass::from_byte(class.to_byte()), Some(class));
    }
    assert_eq!(SizeClass::from_byte(4), None);

    let route = nodes(3);
    for class in SizeClass::ALL {
        let full = vec![0xab; class.capacity()];
        let built = build(&specs(&route), &delivery(&full), class).expect("fits");
        let (seen, last) = walk(&route, built.packet);
        assert!(seen.iter().all(|p| p.len() == class.packet_len()));
        assert!(matches!(last.action, Action::Deliver { payload, .. } if payload == full));
        let over = vec![0; class.capacity() + 1];
        assert_eq!(
            build(&specs(&route), &delivery(&over), class),
            Err(BuildError::PayloadTooLarge)
        );
    }
}

#[test]
fn build_rejects_bad_routes() {
    let d = delivery(b"x");
    assert_eq!(
        build(&[], &d, SizeClass::Small),
        Err(BuildError::EmptyRoute)
    );
    let long: Vec<HopSpec> = (0..=MAX_HOPS).map(|i| node_from(i as u8).spec).collect();
    assert_eq!(
        build(&long, &d, SizeClass::Small),
        Err(BuildError::TooManyHops)
    );
    let mut weak = node_from(1).spec;
    weak.onion_key = [0; 32];
    assert_eq!(
        build(&[node_from(2).spec, weak], &d, SizeClass::Small),
        Err(BuildError::WeakOnionKey)
    );
    // A key of the twist: its node could never read the layer.
    let mut twist = node_from(1).spec;
    twist.onion_key = [0; 32];
    twist.onion_key[0] = 2;
    assert_eq!(
        build(&[node_from(2).spec, twist], &d, SizeClass::Small),
        Err(BuildError::WeakOnionKey)
    );
}

#[test]
fn framing_errors_are_distinct_and_v1_is_named() {
    let built = build(&specs(&nodes(1)), &delivery(b"x"), SizeClass::Small).expect("builds");
    let secret = node_from(1).secret;
    let peel1 = |bytes: &[u8]| peel(&[&secret], bytes).map(|_| ());
    let v1 = hex::decode(crate::proto::frame::V1_ENVELOPE_HEX).expect("hex");
    assert_eq!(
        peel1(&v1),
        Err(PeelError::Framing(FramingError::V1Envelope))
    );
    assert_eq!(peel1(b"BRE1"), Err(FramingError::V1Envelope.into()));
    assert_eq!(peel1(&[]), Err(FramingError::UnknownVersion.into()));
    let mut other = built.packet.clone();
    other[0] = 0x01;
    assert_eq!(peel1(&other), Err(FramingError::UnknownVersion.into()));
    let mut class = built.packet.clone();
    class[1] = 4;
    assert_eq!(peel1(&class), Err(FramingError::UnknownClass.into()));
    class[1] = 1; // a Medium class byte on a Small-length packet
    assert_eq!(peel1(&class), Err(FramingError::BadLength.into()));
    assert_eq!(
        peel1(&built.packet[..1]),
        Err(FramingError::UnknownClass.into())
    );
    let short = &built.packet[..built.packet.len() - 1];
    assert_eq!(peel1(short), Err(FramingError::BadLength.into()));
    let mut long = built.packet.clone();
    long.push(0);
    assert_eq!(peel1(&long), Err(FramingError::BadLength.into()));
    assert_eq!(
        FramingError::V1Envelope.to_string(),
        "v1_not_accepted",
        "the reason a v1 sender is told"
    );
    assert!(peel1(&built.packet).is_ok());
}

#[test]
fn wrong_key_fails_previous_key_works_and_failure_leaves_the_buffer() {
    let route = nodes(2);
    let built = build(&specs(&route), &delivery(b"hi"), SizeClass::Small).expect("builds");
    let other = StaticSecret::from([0x77; 32]);
    let mut buf = built.packet.clone();
    assert_eq!(
        peel_in_place(&[&other], &mut buf),
        Err(PeelError::PeelFailed)
    );
    assert_eq!(buf, built.packet, "a failed MAC changes nothing");
    assert_eq!(peel(&[], &built.packet), Err(PeelError::PeelFailed));
    // The route's key is the previous one after a rotation to `other`.
    let peeled = peel(&[&other, &route[0].secret], &built.packet).expect("previous key");
    assert_eq!(peeled.replay_tag, built.replay_tags[0]);
    // The second hop cannot open the first hop's layer.
    assert_eq!(
        peel(&[&route[1].secret], &built.packet),
        Err(PeelError::PeelFailed)
    );
}

#[test]
fn small_order_and_twist_alphas_fail() {
    let route = nodes(1);
    let built = build(&specs(&route), &delivery(b"hi"), SizeClass::Small).expect("builds");
    let mut packet = built.packet;
    let u = |first: u8| {
        let mut u = [0u8; 32];
        u[0] = first;
        u
    };
    // 0 and 1: small order; 2: a point of the twist.
    for point in [u(0), u(1), u(2)] {
        packet[ALPHA_AT..BETA_AT].copy_from_slice(&point);
        assert_eq!(
            peel(&[&route[0].secret], &packet),
            Err(PeelError::PeelFailed)
        );
    }
}

#[test]
fn every_byte_of_every_hop_is_authenticated() {
    // A 3-hop route: flip one bit in every byte of what each hop receives.
    let route = nodes(3);
    let built = build(&specs(&route), &delivery(b"tamper"), SizeClass::Small).expect("builds");
    let (seen, _) = walk(&route, built.packet);
    for (hop, packet) in seen.iter().enumerate() {
        for index in 2..packet.len() {
            let mut bad = packet.clone();
            bad[index] ^= 0x10;
            assert_eq!(
                peel(&[&route[hop].secret], &bad),
                Err(PeelError::PeelFailed),
                "hop {hop}, byte {index}"
            );
        }
    }
}

#[test]
fn replay_tags_are_per_layer_and_hidden() {
    let route = nodes(3);
    let d = delivery(b"same payload");
    let one = build(&specs(&route), &d, SizeClass::Small).expect("builds");
    let two = build(&specs(&route), &d, SizeClass::Small).expect("builds");
    // The same layer peeled twice has the same tag: a replay is seen whatever carries it.
    let first = peel(&[&route[0].secret], &one.packet).expect("peels");
    let again = peel(&[&route[0].secret], &one.packet.clone()).expect("peels");
    assert_eq!(first.replay_tag, again.replay_tag);
    // Two builds of the same message, and the hops of one route, all have distinct tags.
    let mut tags = one.replay_tags.clone();
    tags.extend(&two.replay_tags);
    let mut unique = tags.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), tags.len());
    // No tag appears in any packet on the wire.
    let (seen, _) = walk(&route, one.packet);
    for packet in &seen {
        for tag in &one.replay_tags {
            assert!(!packet.windows(TAG_LEN).any(|w| w == tag));
        }
    }
}

#[test]
fn packets_differ_at_every_hop_and_between_builds() {
    let route = nodes(3);
    let d = delivery(b"same");
    let a = build(&specs(&route), &d, SizeClass::Small).expect("builds");
    let b = build(&specs(&route), &d, SizeClass::Small).expect("builds");
    let (seen, _) = walk(&route, a.packet.clone());
    // No 16-byte window carries over from one hop's packet to the next (nothing to link hops by),
    // nor from one build to another.
    let windows = |p: &[u8]| -> std::collections::HashSet<Vec<u8>> {
        p[2..].windows(16).map(<[u8]>::to_vec).collect()
    };
    for pair in seen.windows(2) {
        let earlier = windows(&pair[0]);
        assert!(pair[1][2..].windows(16).all(|w| !earlier.contains(w)));
    }
    let earlier = windows(&a.packet);
    assert!(b.packet[2..].windows(16).all(|w| !earlier.contains(w)));
}

#[test]
fn the_terminal_cannot_count_the_hops() {
    // What the terminal decrypts after its own slot (random padding, then the filler) is uniform
    // for a 1-hop and a MAX_HOPS route alike.
    let all = nodes(MAX_HOPS);
    for n in [1, 2, MAX_HOPS] {
        let route = &all[..n];
        let mut view = Vec::new();
        for _ in 0..8 {
            let built = build(&specs(route), &delivery(b""), SizeClass::Small).expect("builds");
            let (seen, _) = walk(route, built.packet);
            let routing = routing_view(&route[n - 1].secret, &seen[n - 1]);
            view.extend_from_slice(&routing[SLOT_LEN..BETA_LEN]);
        }
        let chi = chi_square(&view);
        assert!(chi < CHI_SQUARE_MAX, "{n} hops: chi-square {chi}");
    }
}

#[test]
fn padding_and_filler_look_like_data() {
    // All-zero data, a one-byte payload in a big class, and the header's filler: on the wire
    // every region is uniform, at every hop (each region sampled over 16 packets).
    let route = nodes(5);
    for payload in [vec![0u8; 1024], vec![0x41], Vec::new()] {
        let walks: Vec<Vec<Vec<u8>>> = (0..16)
            .map(|_| {
                let built =
                    build(&specs(&route), &delivery(&payload), SizeClass::Medium).expect("builds");
                walk(&route, built.packet).0
            })
            .collect();
        let data_end = HEADER_LEN + 1024;
        for hop in 0..route.len() {
            for (what, range) in [
                ("beta", BETA_AT..GAMMA_AT),
                ("filler slots", GAMMA_AT - 4 * SLOT_LEN..GAMMA_AT),
                ("data region", HEADER_LEN..data_end),
                ("padding region", data_end..SizeClass::Medium.packet_len()),
            ] {
                let sample: Vec<u8> = walks
                    .iter()
                    .flat_map(|seen| seen[hop][range.clone()].iter().copied())
                    .collect();
                let chi = chi_square(&sample);
                assert!(chi < CHI_SQUARE_MAX, "hop {hop}, {what}: chi-square {chi}");
            }
        }
    }
}

#[test]
fn in_place_and_copying_peels_agree() {
    let route = nodes(3);
    let built = build(&specs(&route), &delivery(b"in place"), SizeClass::Small).expect("builds");
    let (seen, _) = walk(&route, built.packet.clone());
    let mut buf = built.packet;
    for (i, node) in route.iter().enumerate() {
        let layer = peel_in_place(&[&node.secret], &mut buf).expect("peels");
        assert_eq!(layer.replay_tag, built.replay_tags[i]);
        assert_eq!(layer.class, SizeClass::Small);
        match layer.slot {
            Slot::Forward { next_hop, .. } => {
                assert_eq!(next_hop, route[i + 1].spec.node_id);
                assert_eq!(buf, seen[i + 1], "the buffer is the next hop's packet");
            }
            Slot::Terminal { payload_len, .. } => {
                assert_eq!(i, 2);
                assert_eq!(
                    &buf[HEADER_LEN..HEADER_LEN + payload_len as usize],
                    b"in place"
                );
            }
        }
    }
}

#[test]
fn probes_and_messages_differ_only_inside_the_terminal_layer() {
    // The same route, payload and ephemeral, probe flag on and off: every hop sees the same
    // length, and the difference is ciphertext and MACs, nothing a hop can read.
    let route = nodes(3);
    let payload = [0x42u8; 35];
    let build_one = |probe| {
        let d = Delivery {
            probe,
            ..delivery(&payload)
        };
        build_with(&specs(&route), &d, SizeClass::Small, [0x44; 32]).expect("builds")
    };
    let (message, probe) = (build_one(false), build_one(true));
    assert_eq!(message.replay_tags, probe.replay_tags);
    let (m_seen, m_last) = walk(&route, message.packet);
    let (p_seen, p_last) = walk(&route, probe.packet);
    for (m, p) in m_seen.iter().zip(&p_seen) {
        assert_eq!(m.len(), p.len());
        assert_eq!(
            m[..BETA_AT],
            p[..BETA_AT],
            "version, class and alpha are the same"
        );
    }
    assert!(matches!(
        m_last.action,
        Action::Deliver { probe: false, .. }
    ));
    assert!(matches!(p_last.action, Action::Deliver { probe: true, .. }));
}

#[test]
fn expiry_window() {
    let now = 1_000_000;
    assert!(expiry_acceptable(now, now));
    assert!(expiry_acceptable(now - EXPIRY_SKEW, now));
    assert!(!expiry_acceptable(now - EXPIRY_SKEW - 1, now));
    assert!(expiry_acceptable(now + MAX_LIFETIME + EXPIRY_SKEW, now));
    assert!(!expiry_acceptable(
        now + MAX_LIFETIME + EXPIRY_SKEW + 1,
        now
    ));
    assert!(!expiry_acceptable(u64::MAX, now));
    assert!(expiry_acceptable(u64::MAX, u64::MAX));
}

#[test]
fn debug_is_log_safe() {
    let route = nodes(2);
    let payload = b"secret payload";
    let built = build(&specs(&route), &delivery(payload), SizeClass::Small).expect("builds");
    let first = peel(&[&route[0].secret], &built.packet).expect("peels");
    let Action::Forward { packet, .. } = &first.action else {
        panic!("forward");
    };
    let last = peel(&[&route[1].secret], packet).expect("peels");
    let mut inplace = built.packet.clone();
    let layer = peel_in_place(&[&route[0].secret], &mut inplace).expect("peels");
    for text in [
        format!("{first:?}"),
        format!("{last:?}"),
        format!("{layer:?}"),
        format!("{built:?}"),
        format!("{:?}", route[0].spec),
        format!("{:?}", delivery(payload)),
    ] {
        assert!(!text.contains("secret payload"), "{text}");
        assert!(
            !text.contains(&hex::encode(route[1].spec.node_id)),
            "{text}"
        );
        assert!(!text.contains(&hex::encode([0x55; 32])), "{text}");
        for tag in &built.replay_tags {
            assert!(!text.contains(&hex::encode(tag)), "{text}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_position_sees_the_class_length(
        hops in 1..=MAX_HOPS,
        payload in proptest::collection::vec(any::<u8>(), 0..=2048),
        medium in any::<bool>(),
        ephemeral in any::<[u8; 32]>(),
    ) {
        let route = nodes(hops);
        let class = if medium { SizeClass::Medium } else { SizeClass::Small };
        let built = build_with(&specs(&route), &delivery(&payload), class, ephemeral)
            .expect("builds");
        let (seen, last) = walk(&route, built.packet);
        prop_assert_eq!(seen.len(), hops);
        for packet in &seen {
            prop_assert_eq!(packet.len(), class.packet_len());
            prop_assert_eq!(classify(packet), Ok(class));
        }
        let delivered = matches!(last.action, Action::Deliver { payload: ref p, .. } if *p == payload);
        prop_assert!(delivered);
    }

    #[test]
    fn tampering_anywhere_at_any_hop_is_refused(
        hops in 1..=5usize,
        at in any::<prop::sample::Index>(),
        index in 2..SizeClass::Small.packet_len(),
        bit in 0..8u8,
    ) {
        let route = nodes(hops);
        let built = build(&specs(&route), &delivery(b"payload"), SizeClass::Small)
            .expect("builds");
        let (seen, _) = walk(&route, built.packet);
        let hop = at.index(hops);
        let mut bad = seen[hop].clone();
        bad[index] ^= 1 << bit;
        prop_assert_eq!(peel(&[&route[hop].secret], &bad), Err(PeelError::PeelFailed));
    }

    #[test]
    fn wire_bytes_are_uniform_whatever_the_payload(
        hops in 1..=MAX_HOPS,
        at in any::<prop::sample::Index>(),
        len in 0..=2048usize,
        fill in any::<u8>(),
    ) {
        // The most biased data there is (one repeated byte, any length, so any share of the
        // payload area is padding): every hop's packet, header and payload, filler and padding
        // included, passes the uniformity check as a whole. Only the version and class bytes
        // are fixed.
        let route = nodes(hops);
        let payload = vec![fill; len];
        let built = build(&specs(&route), &delivery(&payload), SizeClass::Small)
            .expect("builds");
        let (seen, _) = walk(&route, built.packet);
        let chi = chi_square(&seen[at.index(hops)][2..]);
        prop_assert!(chi < CHI_SQUARE_MAX, "chi-square {}", chi);
    }

    #[test]
    fn random_v2_framed_bytes_never_peel(
        body in proptest::collection::vec(any::<u8>(), SizeClass::Small.packet_len() - 2),
    ) {
        let mut packet = vec![VERSION, SizeClass::Small.to_byte()];
        packet.extend_from_slice(&body);
        let secret = StaticSecret::from([9; 32]);
        prop_assert_eq!(peel(&[&secret], &packet), Err(PeelError::PeelFailed));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let secret = StaticSecret::from([9; 32]);
        prop_assert!(peel(&[&secret], &bytes).is_err());
    }
}

#[test]
fn the_uniformity_check_catches_bias() {
    // The check above is not vacuous: zeros, text, a short repeated pattern and a slightly biased
    // source of the same sample size all fail it.
    let text: Vec<u8> = b"message over five hops "
        .iter()
        .copied()
        .cycle()
        .take(4096)
        .collect();
    let pattern: Vec<u8> = (0..4096).map(|i| (i % 200) as u8).collect();
    let biased: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 & 0xfe)
        .collect();
    for sample in [vec![0u8; 4096], text, pattern, biased] {
        assert!(chi_square(&sample) > CHI_SQUARE_MAX);
    }
    let uniform: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    assert!(chi_square(&uniform) < CHI_SQUARE_MAX);
}
