//! Onion layers: what a sender wraps around a payload so that each hop learns only the next hop.
//!
//! A layer for hop *H* whose onion public key is *K*:
//!
//! ```text
//! ephemeral_pub(32) ‖ nonce(24) ‖ XChaCha20-Poly1305(key, nonce, plaintext, aad = H's node id)
//! key = HKDF-SHA256(ikm = X25519(ephemeral_secret, K), salt = "blindrelay/onion/v1",
//!                   info = ephemeral_pub ‖ K), 32 bytes
//! plaintext = 0x01 ‖ next_hop(32) ‖ next_route_id(16) ‖ inner     (forward)
//!           | 0x02 ‖ receipt_key(32) ‖ payload                      (terminal)
//!           | 0x03 ‖ receipt_key(32) ‖ payload                      (terminal, a probe)
//! ```
//!
//! A probe is told apart by its kind byte, inside the authenticated plaintext only the terminal
//! opens: [`build`] always writes `0x02`, whatever the payload, so no message is ever taken for
//! a probe; only [`build_probe`] writes `0x03`. Middle hops cannot tell the two apart (same
//! sizes, both sealed).
//!
//! [`peel`] fails with one opaque [`PeelError`] whatever went wrong, so a prober learns nothing
//! about which check failed. [`build`] wraps a payload for a whole path, with a fresh random
//! route id for every hop and a fresh receipt key.

use std::fmt;

use chacha20poly1305::aead::{Aead, AeadInPlace, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

use super::envelope::MAX_BLOB;
use super::{NodeId, Prefix, RouteId};

const SALT: &[u8] = b"blindrelay/onion/v1";
const EPHEMERAL_LEN: usize = 32;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// What every layer adds around its plaintext: ephemeral key, nonce and tag.
const LAYER_OVERHEAD: usize = EPHEMERAL_LEN + NONCE_LEN + TAG_LEN;
const KIND_FORWARD: u8 = 0x01;
const KIND_TERMINAL: u8 = 0x02;
const KIND_PROBE: u8 = 0x03;
/// Kind ‖ next_hop ‖ next_route_id.
const FORWARD_HEADER: usize = 1 + 32 + 16;
/// Kind ‖ receipt_key.
const TERMINAL_HEADER: usize = 1 + 32;
/// The smallest valid layer: a terminal layer with an empty payload. A forward layer whose
/// inner part is shorter cannot be forwarded usefully and is rejected as malformed.
const MIN_LAYER: usize = LAYER_OVERHEAD + TERMINAL_HEADER;

/// One peeled layer.
#[derive(Clone, PartialEq, Eq)]
pub enum Layer {
    /// Pass `inner` on to `next_hop`, in an envelope carrying `next_route_id`.
    Forward {
        /// The node the next envelope is for.
        next_hop: NodeId,
        /// The route id the sender chose for the next hop.
        next_route_id: RouteId,
        /// The next hop's layer, opaque here.
        inner: Vec<u8>,
    },
    /// This node is the terminal: deliver `payload` and seal the receipt with `receipt_key`.
    Terminal {
        /// The sender's one-route key for sealing the delivery receipt.
        receipt_key: [u8; 32],
        /// The sender's payload, opaque to the protocol.
        payload: Vec<u8>,
    },
    /// This node is the terminal of a synthetic probe: answer it like a delivery, store nothing.
    Probe {
        /// The prober's one-route key for sealing the receipt.
        receipt_key: [u8; 32],
        /// The probe's payload (random bytes, never stored).
        payload: Vec<u8>,
    },
}

/// Prints the next hop's prefix and lengths only: never keys, route ids or payload bytes.
impl fmt::Debug for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layer::Forward {
                next_hop, inner, ..
            } => f
                .debug_struct("Forward")
                .field("next_hop", &Prefix(next_hop))
                .field("inner_len", &inner.len())
                .finish_non_exhaustive(),
            Layer::Terminal { payload, .. } => f
                .debug_struct("Terminal")
                .field("payload_len", &payload.len())
                .finish_non_exhaustive(),
            Layer::Probe { payload, .. } => f
                .debug_struct("Probe")
                .field("payload_len", &payload.len())
                .finish_non_exhaustive(),
        }
    }
}

/// A layer could not be peeled: too short, wrong key, bad tag, unknown kind or short plaintext.
/// Deliberately one opaque error (`onion_peel_failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("onion_peel_failed")]
pub struct PeelError;

/// Why [`build`] refused a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A route needs at least one hop.
    #[error("empty path")]
    EmptyPath,
    /// More hops than a `u8` ttl can count (256).
    #[error("too many hops")]
    TooManyHops,
    /// The payload does not fit: see [`max_payload`].
    #[error("payload too large for this path")]
    PayloadTooLarge,
    /// A hop's onion key is a small-order X25519 point: anyone could read its layer.
    #[error("unusable onion key")]
    WeakOnionKey,
}

/// One hop of a path, as taken from its verified descriptor.
#[derive(Clone, PartialEq, Eq)]
pub struct Hop {
    /// The hop's node id.
    pub node_id: NodeId,
    /// The hop's current X25519 onion public key.
    pub onion_key: [u8; 32],
}

impl fmt::Debug for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hop")
            .field("node_id", &Prefix(&self.node_id))
            .finish_non_exhaustive()
    }
}

/// A built route: what the sender sends to `path[0]` and what it keeps to check the receipt.
#[derive(Clone, PartialEq, Eq)]
pub struct Route {
    /// The layer for `path[0]`: the blob of the first envelope.
    pub blob: Vec<u8>,
    /// The route id for the first envelope (`path[0]`'s hop).
    pub first_route_id: RouteId,
    /// The last hop's route id: the one its receipt names.
    pub terminal_route_id: RouteId,
    /// The key the terminal seals the receipt with.
    pub receipt_key: [u8; 32],
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("blob_len", &self.blob.len())
            .finish_non_exhaustive()
    }
}

/// Whether `onion_key` can be encrypted to: `false` for the small-order X25519 points, whose
/// shared secret with any key is all zeros.
pub fn onion_key_is_usable(onion_key: &[u8; 32]) -> bool {
    // X25519 clamps every scalar to a multiple of the cofactor 8, so the product is the identity
    // for every small-order point (on the curve or its twist) and for no other point, whatever
    // the (fixed, non-secret) scalar.
    StaticSecret::from([0x5a; 32])
        .diffie_hellman(&PublicKey::from(*onion_key))
        .was_contributory()
}

/// Seals `layer` for the hop `hop_id` whose onion public key is `hop_onion_key`, with a fresh
/// ephemeral key and a random nonce.
///
/// Use only onion keys from verified descriptors ([`super::Descriptor::verify`] rejects the
/// small-order keys for which this encryption would be readable by anyone; [`build`] checks them
/// too).
pub fn seal_layer(hop_id: &NodeId, hop_onion_key: &[u8; 32], layer: &Layer) -> Vec<u8> {
    match layer {
        Layer::Forward {
            next_hop,
            next_route_id,
            inner,
        } => {
            let mut header = [0u8; FORWARD_HEADER];
            header[0] = KIND_FORWARD;
            header[1..33].copy_from_slice(next_hop);
            header[33..49].copy_from_slice(next_route_id);
            seal(hop_id, hop_onion_key, &header, inner)
        }
        Layer::Terminal {
            receipt_key,
            payload,
        }
        | Layer::Probe {
            receipt_key,
            payload,
        } => {
            let mut header = [0u8; TERMINAL_HEADER];
            header[0] = if matches!(layer, Layer::Probe { .. }) {
                KIND_PROBE
            } else {
                KIND_TERMINAL
            };
            header[1..33].copy_from_slice(receipt_key);
            seal(hop_id, hop_onion_key, &header, payload)
        }
    }
}

/// Peels the layer addressed to `hop_id`, trying each onion secret in order (current, then
/// previous).
///
/// # Errors
/// [`PeelError`] for any failure; which one is deliberately not said.
pub fn peel(hop_id: &NodeId, secrets: &[&StaticSecret], blob: &[u8]) -> Result<Layer, PeelError> {
    if blob.len() < LAYER_OVERHEAD {
        return Err(PeelError);
    }
    let (ephemeral, rest) = blob.split_at(EPHEMERAL_LEN);
    let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
    let ephemeral: [u8; 32] = ephemeral
        .try_into()
        .expect("invariant: split_at(EPHEMERAL_LEN)");
    let ephemeral_pub = PublicKey::from(ephemeral);
    for secret in secrets {
        let shared = secret.diffie_hellman(&ephemeral_pub);
        if !shared.was_contributory() {
            // A small-order ephemeral gives the same all-zero secret for every key.
            return Err(PeelError);
        }
        let own_pub = PublicKey::from(*secret);
        let cipher = cipher(shared.as_bytes(), &ephemeral, own_pub.as_bytes());
        let opened = cipher.decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: hop_id,
            },
        );
        if let Ok(plaintext) = opened {
            return parse(plaintext);
        }
    }
    Err(PeelError)
}

/// The largest payload [`build`] accepts for a path of `hops` hops: the outer blob then stays
/// within [`MAX_BLOB`]. Each layer adds 72 bytes, plus 49 for a forward header or 33 for the
/// terminal header. `0` for `hops == 0`.
pub fn max_payload(hops: usize) -> usize {
    if hops == 0 {
        return 0;
    }
    let overhead = (hops - 1)
        .saturating_mul(LAYER_OVERHEAD + FORWARD_HEADER)
        .saturating_add(LAYER_OVERHEAD + TERMINAL_HEADER);
    MAX_BLOB.saturating_sub(overhead)
}

/// Wraps `payload` for `path` (first hop first, terminal last): a terminal layer for the last
/// hop, then forward layers outward, each naming the next hop and the next hop's route id. Every
/// hop gets a fresh random route id, and the route a fresh random receipt key.
///
/// # Errors
/// [`BuildError`] for an empty or over-long path, a payload over [`max_payload`], or an
/// unusable onion key.
pub fn build(path: &[Hop], payload: &[u8]) -> Result<Route, BuildError> {
    build_kind(path, payload, KIND_TERMINAL)
}

/// [`build`] for a synthetic probe: the terminal layer says `probe` (kind `0x03`), so the
/// terminal answers without storing. Nothing else differs, middle hops see the same.
///
/// # Errors
/// As [`build`].
pub fn build_probe(path: &[Hop], payload: &[u8]) -> Result<Route, BuildError> {
    build_kind(path, payload, KIND_PROBE)
}

fn build_kind(path: &[Hop], payload: &[u8], terminal_kind: u8) -> Result<Route, BuildError> {
    let Some(last) = path.last() else {
        return Err(BuildError::EmptyPath);
    };
    if path.len() > usize::from(u8::MAX) + 1 {
        return Err(BuildError::TooManyHops);
    }
    if payload.len() > max_payload(path.len()) {
        return Err(BuildError::PayloadTooLarge);
    }
    if !path.iter().all(|hop| onion_key_is_usable(&hop.onion_key)) {
        return Err(BuildError::WeakOnionKey);
    }
    let route_ids: Vec<RouteId> = path.iter().map(|_| rand::random()).collect();
    let receipt_key: [u8; 32] = rand::random();

    let mut header = [0u8; TERMINAL_HEADER];
    header[0] = terminal_kind;
    header[1..].copy_from_slice(&receipt_key);
    let mut blob = seal(&last.node_id, &last.onion_key, &header, payload);

    for i in (0..path.len() - 1).rev() {
        let mut header = [0u8; FORWARD_HEADER];
        header[0] = KIND_FORWARD;
        header[1..33].copy_from_slice(&path[i + 1].node_id);
        header[33..49].copy_from_slice(&route_ids[i + 1]);
        blob = seal(&path[i].node_id, &path[i].onion_key, &header, &blob);
    }
    debug_assert!(blob.len() <= MAX_BLOB);

    Ok(Route {
        blob,
        first_route_id: route_ids[0],
        terminal_route_id: route_ids[path.len() - 1],
        receipt_key,
    })
}

/// `plaintext = header ‖ body`, sealed with a fresh ephemeral key and nonce.
fn seal(hop_id: &NodeId, onion_key: &[u8; 32], header: &[u8], body: &[u8]) -> Vec<u8> {
    seal_with(
        rand::random(),
        rand::random(),
        hop_id,
        onion_key,
        header,
        body,
    )
}

/// [`seal`] with the ephemeral secret and nonce given (tests pin them).
fn seal_with(
    ephemeral_secret: [u8; 32],
    nonce: [u8; NONCE_LEN],
    hop_id: &NodeId,
    onion_key: &[u8; 32],
    header: &[u8],
    body: &[u8],
) -> Vec<u8> {
    let ephemeral_secret = StaticSecret::from(ephemeral_secret);
    let ephemeral_pub = PublicKey::from(&ephemeral_secret);
    let shared = ephemeral_secret.diffie_hellman(&PublicKey::from(*onion_key));
    let cipher = cipher(shared.as_bytes(), ephemeral_pub.as_bytes(), onion_key);

    let start = EPHEMERAL_LEN + NONCE_LEN;
    let mut out = Vec::with_capacity(LAYER_OVERHEAD + header.len() + body.len());
    out.extend_from_slice(ephemeral_pub.as_bytes());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(header);
    out.extend_from_slice(body);
    let tag = cipher
        .encrypt_in_place_detached(XNonce::from_slice(&nonce), hop_id, &mut out[start..])
        .expect("invariant: XChaCha20-Poly1305 accepts messages far larger than MAX_BLOB");
    out.extend_from_slice(&tag);
    out
}

/// The layer cipher, keyed with HKDF-SHA256(ikm = shared, salt = SALT, info = ephemeral ‖ K).
fn cipher(shared: &[u8; 32], ephemeral_pub: &[u8; 32], onion_key: &[u8; 32]) -> XChaCha20Poly1305 {
    let mut info = [0u8; 64];
    info[..32].copy_from_slice(ephemeral_pub);
    info[32..].copy_from_slice(onion_key);
    let mut key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(SALT), shared)
        .expand(&info, &mut key)
        .expect("invariant: 32 bytes is a valid HKDF-SHA256 output length");
    XChaCha20Poly1305::new(&key.into())
}

/// Splits an authenticated plaintext into a [`Layer`].
fn parse(mut plaintext: Vec<u8>) -> Result<Layer, PeelError> {
    match plaintext.first() {
        Some(&KIND_FORWARD) if plaintext.len() >= FORWARD_HEADER + MIN_LAYER => {
            let mut next_hop = [0u8; 32];
            next_hop.copy_from_slice(&plaintext[1..33]);
            let mut next_route_id = [0u8; 16];
            next_route_id.copy_from_slice(&plaintext[33..49]);
            plaintext.drain(..FORWARD_HEADER);
            Ok(Layer::Forward {
                next_hop,
                next_route_id,
                inner: plaintext,
            })
        }
        Some(&kind @ (KIND_TERMINAL | KIND_PROBE)) if plaintext.len() >= TERMINAL_HEADER => {
            let mut receipt_key = [0u8; 32];
            receipt_key.copy_from_slice(&plaintext[1..33]);
            plaintext.drain(..TERMINAL_HEADER);
            Ok(if kind == KIND_PROBE {
                Layer::Probe {
                    receipt_key,
                    payload: plaintext,
                }
            } else {
                Layer::Terminal {
                    receipt_key,
                    payload: plaintext,
                }
            })
        }
        _ => Err(PeelError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use proptest::prelude::*;

    struct Node {
        hop: Hop,
        secret: StaticSecret,
    }

    fn node() -> Node {
        let secret = StaticSecret::from(rand::random::<[u8; 32]>());
        let node_id = SigningKey::from_bytes(&rand::random())
            .verifying_key()
            .to_bytes();
        Node {
            hop: Hop {
                node_id,
                onion_key: PublicKey::from(&secret).to_bytes(),
            },
            secret,
        }
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// Builds a route over `n` fresh nodes and peels it hop by hop, checking every layer.
    fn walk(n: usize) {
        let nodes: Vec<Node> = (0..n).map(|_| node()).collect();
        let path: Vec<Hop> = nodes.iter().map(|x| x.hop.clone()).collect();
        let payload: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(7) ^ 0x5c).collect();
        let route = build(&path, &payload).expect("builds");
        assert!(route.blob.len() <= MAX_BLOB);

        // Everything that must never appear in clear in any layer.
        let mut secrets_in_clear: Vec<Vec<u8>> = vec![
            payload[..32].to_vec(),
            route.receipt_key.to_vec(),
            route.first_route_id.to_vec(),
            route.terminal_route_id.to_vec(),
        ];
        for hop in &path {
            secrets_in_clear.push(hop.node_id.to_vec());
        }

        let mut blob = route.blob.clone();
        let mut route_ids = vec![route.first_route_id];
        let mut layers = vec![];
        for (i, node) in nodes.iter().enumerate() {
            layers.push(blob.clone());
            match peel(&node.hop.node_id, &[&node.secret], &blob).expect("peels") {
                Layer::Forward {
                    next_hop,
                    next_route_id,
                    inner,
                } => {
                    assert!(i + 1 < n, "forward layer at the terminal");
                    assert_eq!(next_hop, path[i + 1].node_id);
                    assert!(!route_ids.contains(&next_route_id), "route ids are fresh");
                    route_ids.push(next_route_id);
                    secrets_in_clear.push(next_route_id.to_vec());
                    blob = inner;
                }
                Layer::Terminal {
                    receipt_key,
                    payload: got,
                } => {
                    assert_eq!(i + 1, n, "terminal layer before the last hop");
                    assert_eq!(receipt_key, route.receipt_key);
                    assert_eq!(got, payload);
                    assert_eq!(route_ids.last(), Some(&route.terminal_route_id));
                }
                Layer::Probe { .. } => panic!("build never makes a probe layer"),
            }
        }
        assert_eq!(route_ids.len(), n);
        for layer in &layers {
            for secret in &secrets_in_clear {
                assert!(!contains(layer, secret), "a layer leaks bytes in clear");
            }
        }
    }

    #[test]
    fn routes_of_1_2_3_5_hops_peel_to_the_payload() {
        for n in [1, 2, 3, 5] {
            walk(n);
        }
    }

    #[test]
    fn one_hop_route_ids_agree() {
        let a = node();
        let route = build(std::slice::from_ref(&a.hop), b"x").expect("builds");
        assert_eq!(route.first_route_id, route.terminal_route_id);
    }

    #[test]
    fn seal_and_peel_both_kinds() {
        let a = node();
        for layer in [
            Layer::Terminal {
                receipt_key: [9; 32],
                payload: b"hello".to_vec(),
            },
            Layer::Terminal {
                receipt_key: [9; 32],
                payload: vec![],
            },
            Layer::Forward {
                next_hop: [1; 32],
                next_route_id: [2; 16],
                inner: vec![3; MIN_LAYER],
            },
        ] {
            let blob = seal_layer(&a.hop.node_id, &a.hop.onion_key, &layer);
            assert_eq!(peel(&a.hop.node_id, &[&a.secret], &blob), Ok(layer));
        }
    }

    #[test]
    fn layers_are_randomized() {
        let a = node();
        let layer = Layer::Terminal {
            receipt_key: [9; 32],
            payload: b"hello".to_vec(),
        };
        let one = seal_layer(&a.hop.node_id, &a.hop.onion_key, &layer);
        let two = seal_layer(&a.hop.node_id, &a.hop.onion_key, &layer);
        assert_ne!(one[..32], two[..32], "fresh ephemeral");
        assert_ne!(one[32..56], two[32..56], "fresh nonce");
    }

    #[test]
    fn wrong_key_fails_and_previous_key_is_accepted() {
        let a = node();
        let other = node();
        let route = build(std::slice::from_ref(&a.hop), b"hello").expect("builds");
        let id = &a.hop.node_id;
        assert_eq!(peel(id, &[&other.secret], &route.blob), Err(PeelError));
        assert_eq!(peel(id, &[], &route.blob), Err(PeelError));
        // `a.secret` is the previous key after a rotation to `other.secret`.
        assert!(peel(id, &[&other.secret, &a.secret], &route.blob).is_ok());
        assert!(peel(id, &[&a.secret, &other.secret], &route.blob).is_ok());
    }

    #[test]
    fn tampering_fails() {
        let a = node();
        let route = build(std::slice::from_ref(&a.hop), b"hello").expect("builds");
        let id = &a.hop.node_id;
        let regions = [
            ("ephemeral", 0),
            ("ephemeral", 31),
            ("nonce", 32),
            ("nonce", 55),
            ("ciphertext", 56),
            ("ciphertext", route.blob.len() - 17),
            ("tag", route.blob.len() - 1),
        ];
        for (what, index) in regions {
            let mut blob = route.blob.clone();
            blob[index] ^= 0x01;
            assert_eq!(peel(id, &[&a.secret], &blob), Err(PeelError), "{what}");
        }
        // The hop id is the aad: another node id fails.
        let mut other_id = *id;
        other_id[31] ^= 0x80;
        assert_eq!(peel(&other_id, &[&a.secret], &route.blob), Err(PeelError));
        // Truncated or extended.
        let blob = &route.blob;
        assert_eq!(
            peel(id, &[&a.secret], &blob[..blob.len() - 1]),
            Err(PeelError)
        );
        assert_eq!(
            peel(id, &[&a.secret], &blob[..LAYER_OVERHEAD - 1]),
            Err(PeelError)
        );
        assert_eq!(peel(id, &[&a.secret], &[]), Err(PeelError));
        let mut longer = blob.clone();
        longer.push(0);
        assert_eq!(peel(id, &[&a.secret], &longer), Err(PeelError));
    }

    /// Only [`build_probe`] makes a probe layer; [`build`] never does, whatever the payload
    /// (one starting with the old probe marker included). Same sizes either way.
    #[test]
    fn probes_are_told_apart_by_the_layer_kind_only() {
        let (a, b) = (node(), node());
        let path = [a.hop.clone(), b.hop.clone()];
        let payload = b"blindrelay/probe/v1 looks like a probe";
        let message = build(&path, payload).expect("builds");
        let probe = build_probe(&path, payload).expect("builds");
        assert_eq!(message.blob.len(), probe.blob.len());
        let last = |route: &Route| {
            let Layer::Forward { inner, .. } =
                peel(&a.hop.node_id, &[&a.secret], &route.blob).expect("peels")
            else {
                panic!("forward layer expected");
            };
            peel(&b.hop.node_id, &[&b.secret], &inner).expect("peels")
        };
        assert!(matches!(last(&message), Layer::Terminal { payload: p, .. } if p == payload));
        assert!(matches!(last(&probe), Layer::Probe { payload: p, .. } if p == payload));
    }

    #[test]
    fn malformed_plaintext_fails() {
        let a = node();
        let (id, key) = (&a.hop.node_id, &a.hop.onion_key);
        let cases: [(&str, Vec<u8>); 6] = [
            ("empty", vec![]),
            ("unknown kind", [vec![0x04], vec![0; 64]].concat()),
            ("kind zero", vec![0x00; 200]),
            (
                "short terminal",
                [vec![KIND_TERMINAL], vec![0; 31]].concat(),
            ),
            ("short forward", [vec![KIND_FORWARD], vec![0; 48]].concat()),
            (
                "forward with too short inner",
                [vec![KIND_FORWARD], vec![0; 48 + MIN_LAYER - 1]].concat(),
            ),
        ];
        for (what, plaintext) in cases {
            let blob = seal(id, key, &plaintext, &[]);
            assert_eq!(peel(id, &[&a.secret], &blob), Err(PeelError), "{what}");
        }
    }

    #[test]
    fn small_order_ephemeral_fails() {
        let a = node();
        let route = build(std::slice::from_ref(&a.hop), b"hello").expect("builds");
        let mut blob = route.blob;
        blob[..32].copy_from_slice(&[0; 32]);
        assert_eq!(peel(&a.hop.node_id, &[&a.secret], &blob), Err(PeelError));
    }

    #[test]
    fn layout_matches_spec() {
        // Open a layer by hand, from the spec's definition, to pin the byte layout.
        let a = node();
        let blob = seal_with(
            [0x42; 32],
            [0x24; 24],
            &a.hop.node_id,
            &a.hop.onion_key,
            &[KIND_TERMINAL],
            &[7; 40],
        );
        let ephemeral_pub = PublicKey::from(&StaticSecret::from([0x42; 32]));
        assert_eq!(blob[..32], ephemeral_pub.to_bytes());
        assert_eq!(blob[32..56], [0x24; 24]);
        let shared = a.secret.diffie_hellman(&ephemeral_pub);
        let mut info = ephemeral_pub.to_bytes().to_vec();
        info.extend_from_slice(&a.hop.onion_key);
        let mut key = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"blindrelay/onion/v1"), shared.as_bytes())
            .expand(&info, &mut key)
            .expect("hkdf");
        let plaintext = XChaCha20Poly1305::new(&key.into())
            .decrypt(
                XNonce::from_slice(&[0x24; 24]),
                Payload {
                    msg: &blob[56..],
                    aad: &a.hop.node_id,
                },
            )
            .expect("opens");
        assert_eq!(plaintext, [&[KIND_TERMINAL][..], &[7; 40]].concat());
    }

    #[test]
    fn max_payload_boundary() {
        assert_eq!(max_payload(0), 0);
        assert_eq!(max_payload(1), MAX_BLOB - 105);
        assert_eq!(max_payload(3), MAX_BLOB - 105 - 2 * 121);
        assert_eq!(max_payload(usize::MAX), 0);
        for n in [1, 3] {
            let path: Vec<Hop> = (0..n).map(|_| node().hop).collect();
            let route = build(&path, &vec![0; max_payload(n)]).expect("fits");
            assert_eq!(route.blob.len(), MAX_BLOB);
            assert_eq!(
                build(&path, &vec![0; max_payload(n) + 1]),
                Err(BuildError::PayloadTooLarge)
            );
        }
    }

    #[test]
    fn build_rejects_bad_paths() {
        assert_eq!(build(&[], b"x"), Err(BuildError::EmptyPath));
        let weak = Hop {
            node_id: [1; 32],
            onion_key: [0; 32],
        };
        assert!(!onion_key_is_usable(&weak.onion_key));
        assert!(onion_key_is_usable(&node().hop.onion_key));
        assert_eq!(
            build(&[node().hop, weak], b"x"),
            Err(BuildError::WeakOnionKey)
        );
        let long: Vec<Hop> = (0..257).map(|_| node().hop).collect();
        assert_eq!(build(&long, b"x"), Err(BuildError::TooManyHops));
    }

    #[test]
    fn debug_is_log_safe() {
        let a = node();
        let route = build(std::slice::from_ref(&a.hop), b"secret payload").expect("builds");
        let layer = peel(&a.hop.node_id, &[&a.secret], &route.blob).expect("peels");
        for text in [
            format!("{layer:?}"),
            format!("{route:?}"),
            format!("{:?}", a.hop),
        ] {
            assert!(!text.contains("secret payload"));
            assert!(!text.contains(&hex::encode(a.hop.node_id)));
            assert!(!text.contains(&hex::encode(route.receipt_key)));
        }
    }

    proptest! {
        #[test]
        fn peel_never_panics(blob in proptest::collection::vec(any::<u8>(), 0..300)) {
            let a = StaticSecret::from([7; 32]);
            prop_assert_eq!(peel(&[1; 32], &[&a], &blob), Err(PeelError));
        }
    }
}
