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
            "ce4c97aadcbcced893d12b9ebc4c06c8c910035e70ca6a285fd0b4ed1f9d155b1633aadb43a3eb9990685f38",
            "e4b68c5448129ccd6029b3a71d58bc435f6f437822c20111563e5b73071b9894a866e857095a1630e2ce1857",
            "956524d768aabe52d9d744edc3e23416b8f09ad33d032fe95a36fa9d6c7349c8e4dcdcda4dd2c77d54b5b3e7",
            "f9e39f873d538cb86f8292be7d14194d0688d485836edd3ad4d70e8b8311ba3f3a0f96fc42696a351ef98d0b",
            "3506f7037b72a792529bfed4a6a69ad8b55e9d63e22c93368115a9c2a2930c17999f11c66e775eb3bcb82655",
            "876468c2741dca36e1aa62c94a29dde2aa5d80a5c6b2d4a6bfa7655ea3c411f7ad95b894c4fd374e15199de7",
            "29123f8a46eb3505102a8a1bdc67c8619fec9c0c193cdbcc426d4024207d47fc994ae595bab5e4f79bc57f02",
            "a0287589c65961848a4f21d30a24673bab4ec59ae69e013c042fb42049e5a9ea2df152decd3a0e0a99274632",
            "c1d673959e5a9199da6641e8305e637245cc6ad5da862cbf170e2cb61e416c9f8281601c4db268a85e6eab9b",
            "3771d7c86aefdcd29201927b6903309c458f280db8519b9b16b3e2b466f8f871114800c841e01a468cb67349",
            "9eb265112593423d456dca9e89761605c7b4bfc9834ead431f3fcd8cae2fbcb3dc8b881498e821d406a737cd",
            "873ac8b751ac100fe45969787ca869eac0a4d9c5c6f36918824808e544f4d2a14180",
        ),
    ),
    (
        "frame 0 previous hop",
        "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664",
    ),
    (
        "frame 0 request digest",
        "60510bd145b67ea261936460b18b28a48ef3344948f953332345dfa991025948",
    ),
    (
        "alpha 0",
        "ff2ee45601ec1b67310c7790404585ae697331eee1c1f8cf2419731c1fff3e6b",
    ),
    ("gamma 0", "d9c5c6f36918824808e544f4d2a14180"),
    (
        "packet 0 sha256",
        "05cd762ae4e2aac2c07ad678905bc780e3f8df2c73469e080f0fb699b0909914",
    ),
    ("replay tag 0", "a8ef66854eb6dd200f241901280ad9b2"),
    (
        "report key 0",
        "ba45364a7cd536391ace4fc8cea89acd375ad635c108d11b68da60c5d8c6904f",
    ),
    (
        "alpha 1",
        "425887bc8eb16bdd0ea3c990d59c0d51d817d25d56a24fd08dcf3804310b9b52",
    ),
    ("gamma 1", "073cff5d4e834ef37753c66085d112c6"),
    (
        "packet 1 sha256",
        "f2ddc13348757bf6793eec455fd5429c391f6a7e23fef8f7cae29d63f5e68457",
    ),
    ("replay tag 1", "f0c0908b7f703ed151b2770627a1f105"),
    (
        "report key 1",
        "e3a852113967a72344c07452fff90121ab5834cc4cd7df380f222340b900570f",
    ),
    (
        "alpha 2",
        "3eb1b4a59e555732f82ebb30fda59fdc372ef05867f49ca1e9449c6a829d954d",
    ),
    ("gamma 2", "5f6c3ca67be67a740568ef3523a53da0"),
    (
        "packet 2 sha256",
        "535e445e7676109b5a170a0e4d3885906bfa17fc28af0fca5e6d1a3eceff9c5d",
    ),
    ("replay tag 2", "4a3989c6535899c6389d322faf285cee"),
    (
        "report key 2",
        "246f0f59fb219642d8b45a491ab0362827058c91246fdecd994e3042c56403ce",
    ),
    (
        "report unreachable",
        concat!(
            "148f105c52788a9612f7d235c92c4eed79e3bbc93b5f6aa679a5d85f30ab50bdd80ab6f9e01a8dd4b1945315",
            "aba0132b",
        ),
    ),
    (
        "report refused",
        concat!(
            "178eeb563b16e8f96aa8b440a5404eed79e3bbc93b5f6aa679a5d85f30ab50bdf18b68051cb2920f6753d713",
            "97089065",
        ),
    ),
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
        message_id: [0x66; 16],
    };
    let built = build_with(&specs, &delivery, SizeClass::Small, [0x44; 32]).expect("builds");
    let mut out = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        out.push((format!("onion key {i}"), hex::encode(spec.onion_key)));
    }
    let mut packet = built.packet.clone();
    out.push(("header 0".into(), hex::encode(&packet[..HEADER_LEN])));
    // The first hop's frame, on the link of the key of seed 01 02 … 20.
    let mut seed = [0u8; 32];
    for (b, v) in seed.iter_mut().zip(1u8..) {
        *b = v;
    }
    let sender = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
    let frame = crate::proto::frame::Frame::new(packet.clone(), sender.to_bytes()).expect("frames");
    out.push((
        "frame 0 previous hop".into(),
        hex::encode(frame.previous_hop),
    ));
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
        out.push((format!("report key {i}"), hex::encode(peeled.report_key)));
        assert_eq!(peeled.replay_tag, built.replay_tags[i]);
        assert_eq!(peeled.report_key, built.report_keys[i]);
        match peeled.action {
            Action::Forward { packet: next, .. } => packet = next,
            Action::Deliver { payload, .. } => assert_eq!(payload, PAYLOAD),
        }
    }
    // Hop 1 reports its next hop unreachable; hop 0 masks it on the way back.
    let keys = &built.report_keys;
    let mut unreachable = report::seal(&keys[1], &Failure::Unreachable);
    report::mask(&keys[0], &mut unreachable);
    out.push(("report unreachable".into(), hex::encode(unreachable)));
    // Hop 2 (the terminal) is not a reporter; hop 1 reports it refused `inbox_full` (507).
    let refused = Failure::Refused {
        status: 507,
        reason: Some("inbox_full".into()),
    };
    let mut full = report::seal(&keys[1], &refused);
    report::mask(&keys[0], &mut full);
    out.push(("report refused".into(), hex::encode(full)));
    assert_eq!(
        report::open(keys, &unreachable),
        Some((1, Failure::Unreachable))
    );
    assert_eq!(report::open(keys, &full), Some((1, refused)));
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
