//! The "v2 test vectors" of `docs/blindrelay-protocol.md`: recomputes every value from the code
//! and checks that the document still shows it. `scripts/sphinx-vectors.py` computes the same
//! values with an independent implementation (Python `cryptography`).

use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

use super::*;

const DOC: &str = include_str!("../../../../../docs/blindrelay-protocol.md");

const EXPIRES_AT: u64 = 1_764_450_600;
const PAYLOAD: &[u8] = b"hello";

/// One line per value: (name, hex).
const VECTORS: &[(&str, &str)] = &[
    (
        "onion key 0",
        "04f5f29162c31a8defa18e6e742224ee806fc1718a278be859ba5620402b8f3a",
    ),
    (
        "onion key 1",
        "59d9225473451efffe6b36dbcaefdbf7b1895de62084509a7f5b58bf01d06418",
    ),
    (
        "onion key 2",
        "7b0d47d93427f8311160781c7c733fd89f88970aef490d8aa0ee19a4cb8a1b14",
    ),
    (
        "header 0",
        concat!(
            "0200ff2ee45601ec1b67310c7790404585ae697331eee1c1f8cf2419731c1fff3e6b176f62a7d24814d7c0a6",
            "ce4c97aadcbcced893d12b9ebc4c06c8c910035e70ca6a285fd0b4ed1f9d15089a54d7cc45f5b46bc220a61e",
            "253c5e5448129ccd6029b3a71d58bc435f6f437822c20111563e5b73071b9894a866e857095a1630e2ce1857",
            "956524d768aabec308d6c41b422e5d02f4833997c9d1e2e95a36fa9d6c7349c8e4dcdcda4dd2c77d54b5b3e7",
            "f9e39f873d538cb86f8292be7d14194d0688d485836edd3ad4d70e8b8311ba3f5c69f09a240f0c53789feb6d",
            "536091657b72a792529bfed4a6a69ad8b55e9d63e22c93368115a9c2a2930c17999f11c66e775eb3bcb82655",
            "876468c2741dca36e1aa62c94a29dde2aa5d80a5c6b2d4a6bfa7655ea3c411f7ad95b894c4fd374e15199de7",
            "29123f8a46eb3505102a8a1bdc67c8619fec9c0c193cdbcc426d4024207d47fc994ae595bab5e4f79bc57f02",
            "a0287589c65961848a4f21d30a24673bab4ec59ae69e013c042fb42049e5a9ea2df152decd3a0e0a99274632",
            "c1d673959e5a9199da6641e8305e637245cc6ad5da862cbf170e2cb61e416c9f8281601c4db268a85e6eab9b",
            "3771d7c86aefdcd29201927b6903309c458f280db8519b9b16b3e2b466f8f871114800c841e01a468cb67349",
            "9eb265112593423d456dca9e89761605c7b4bfc9834ead431f3fcd8cae2fbcb3dc8b881498e821d406a737cd",
            "873ac8b751ac100fe45969787ca869eac0a431cd6bc430f8f3c2dfcc2d9d980a4bca",
        ),
    ),
    (
        "frame 0 previous hop",
        "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664",
    ),
    (
        "frame 0 signing bytes",
        concat!(
            "626c696e6472656c61792f6672616d652f76320200ff2ee45601ec1b67310c7790404585ae697331eee1",
            "c1f8cf2419731c1fff3e6b31cd6bc430f8f3c2dfcc2d9d980a4bca79b5562e8fe654f94078b112e8a98b",
            "a7901f853ae695bed7e0e3910bad049664a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1",
            "a1a1a1a1a1a1a1",
        ),
    ),
    (
        "frame 0 signature",
        concat!(
            "329cbfb622cedd9622b144c0c0a4dfe387dcd6de8fd7c6f5fd7f654bc6c2bed9e33141520316ccf81a31",
            "8021a2c5ee3f7efda4b3a636eb32379c6ac5e47d3102",
        ),
    ),
    (
        "frame 0 request digest",
        "e574d3962593e45c3b03b633fd6bd8beceb20dee670c0a8971aed37c096ac79a",
    ),
    (
        "alpha 0",
        "ff2ee45601ec1b67310c7790404585ae697331eee1c1f8cf2419731c1fff3e6b",
    ),
    ("gamma 0", "31cd6bc430f8f3c2dfcc2d9d980a4bca"),
    (
        "packet 0 sha256",
        "8dafbc19d00fa59a34f9934ec3c57edb43587852fa95b5a7425ef9500874c2bc",
    ),
    ("replay tag 0", "a8ef66854eb6dd200f241901280ad9b2"),
    (
        "alpha 1",
        "425887bc8eb16bdd0ea3c990d59c0d51d817d25d56a24fd08dcf3804310b9b52",
    ),
    ("gamma 1", "54b09820598518ac85018e99a3109814"),
    (
        "packet 1 sha256",
        "b9ca585e41e49ee59f9f41f10999580815be4ff0ab4855274a56d8fd6f16fbb5",
    ),
    ("replay tag 1", "f0c0908b7f703ed151b2770627a1f105"),
    (
        "alpha 2",
        "3eb1b4a59e555732f82ebb30fda59fdc372ef05867f49ca1e9449c6a829d954d",
    ),
    ("gamma 2", "cebd3d268d67b61d11249c966751ef6d"),
    (
        "packet 2 sha256",
        "70236be84b14de7cd2420eccb9db04f63f78f4d28c0bd72371bce74a5dfaca47",
    ),
    ("replay tag 2", "4a3989c6535899c6389d322faf285cee"),
];

fn route() -> (Vec<StaticSecret>, Vec<HopSpec>) {
    let secrets: Vec<StaticSecret> = [0x31, 0x32, 0x33]
        .into_iter()
        .map(|b| StaticSecret::from([b; 32]))
        .collect();
    let specs = secrets
        .iter()
        .zip([0xa1u8, 0xa2, 0xa3])
        .map(|(secret, id)| HopSpec {
            node_id: [id; 32],
            onion_key: PublicKey::from(secret).to_bytes(),
            expires_at: EXPIRES_AT,
        })
        .collect();
    (secrets, specs)
}

/// Every value of the vectors, in the order the document lists them.
fn compute() -> Vec<(String, String)> {
    let (secrets, specs) = route();
    let delivery = Delivery {
        payload: PAYLOAD,
        probe: false,
        receipt_key: [0x55; 32],
    };
    let built = build_with(&specs, &delivery, SizeClass::Small, [0x44; 32]).expect("builds");
    let mut out = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        out.push((format!("onion key {i}"), hex::encode(spec.onion_key)));
    }
    let mut packet = built.packet.clone();
    out.push(("header 0".into(), hex::encode(&packet[..HEADER_LEN])));
    // The first hop's frame: signed by the key of seed 01 02 … 20, for hop 0.
    let mut seed = [0u8; 32];
    for (b, v) in seed.iter_mut().zip(1u8..) {
        *b = v;
    }
    let signer = ed25519_dalek::SigningKey::from_bytes(&seed);
    let frame = crate::proto::frame::Frame::sign(packet.clone(), &signer, &specs[0].node_id)
        .expect("frames");
    assert_eq!(frame.verify(&specs[0].node_id), Ok(()));
    out.push((
        "frame 0 previous hop".into(),
        hex::encode(frame.previous_hop),
    ));
    let signing = frame.signing_bytes(&specs[0].node_id);
    assert_eq!(signing.len(), 133);
    out.push(("frame 0 signing bytes".into(), hex::encode(signing)));
    out.push(("frame 0 signature".into(), hex::encode(frame.signature)));
    out.push((
        "frame 0 request digest".into(),
        hex::encode(frame.request_digest()),
    ));
    for (i, secret) in secrets.iter().enumerate() {
        out.push((
            format!("alpha {i}"),
            hex::encode(&packet[ALPHA_AT..BETA_AT]),
        ));
        out.push((
            format!("gamma {i}"),
            hex::encode(&packet[GAMMA_AT..HEADER_LEN]),
        ));
        out.push((
            format!("packet {i} sha256"),
            hex::encode(Sha256::digest(&packet)),
        ));
        let peeled = peel(&[secret], &packet).expect("vector peels");
        out.push((format!("replay tag {i}"), hex::encode(peeled.replay_tag)));
        assert_eq!(peeled.replay_tag, built.replay_tags[i]);
        match peeled.action {
            Action::Forward { packet: next, .. } => packet = next,
            Action::Deliver { payload, .. } => assert_eq!(payload, PAYLOAD),
        }
    }
    out
}

#[test]
fn v2_vectors_match_code_and_doc() {
    let computed = compute();
    let matches = computed.len() == VECTORS.len()
        && computed
            .iter()
            .zip(VECTORS)
            .all(|((n, v), (wn, wv))| n == wn && v == wv);
    if !matches {
        // What to paste, after checking it with scripts/sphinx-vectors.py.
        for (name, value) in &computed {
            println!("{name}: {value}");
        }
    }
    assert_eq!(computed.len(), VECTORS.len(), "one constant per value");
    let section = DOC
        .split_once("### v2 test vectors")
        .map(|(_, section)| section)
        .expect("docs/blindrelay-protocol.md has a \"v2 test vectors\" section");
    for ((name, value), (want_name, want)) in computed.iter().zip(VECTORS) {
        assert_eq!(name, want_name);
        assert_eq!(value, want, "{name}");
        assert!(
            section.contains(value.as_str()),
            "the doc's v2 vectors do not show {name}: {value}"
        );
    }
    assert_eq!(SizeClass::Small.packet_len(), 2_610);
}
