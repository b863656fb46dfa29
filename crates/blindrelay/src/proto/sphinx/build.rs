//! Wrapping a payload for a route: the sender's side of v2.
//!
//! The sender draws one ephemeral X25519 secret `x` per packet. Hop *i*'s alpha is
//! `x · b₀ · … · bᵢ₋₁ · G` and its shared secret `x · b₀ · … · bᵢ₋₁ · Kᵢ`, where `bⱼ` is hop *j*'s
//! blinding scalar. The sender multiplies the scalars modulo the group order first, so a route
//! of *n* hops costs *n* fixed-base and *n* variable-base multiplications (see `hop_keys`) and
//! *n* ChaCha20-Poly1305 passes over the payload.
//!
//! Then, innermost first: the terminal's beta is its slot, random padding (so the terminal cannot
//! count the empty slots) and the *filler*, the keystream bytes the hops before it will shift in;
//! each outer beta is the hop's slot (naming the next hop and the next layer's MAC) followed by
//! the inner beta minus its last slot, encrypted with the hop's header stream. Each layer's MAC is
//! the ChaCha20-Poly1305 tag of the payload encrypted under the hop's payload key, with the
//! header as associated data.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use curve25519_dalek::montgomery::MontgomeryPoint;
use curve25519_dalek::scalar::{Scalar, clamp_integer};
use hkdf::Hkdf;
use sha2::Sha256;

use super::keys::{Cleared, HopKeys, SALT, STREAM_LEN, eighth_of_clamped, xor_stream};
use super::slot::Slot;
use super::{
    ALPHA_AT, BETA_AT, BETA_LEN, GAMMA_AT, HEADER_LEN, MAC_LEN, MAX_HOPS, ReplayTag, SLOT_LEN,
    SizeClass, VERSION,
};
use crate::proto::{NodeId, Prefix};

/// One hop of a route, as taken from its verified descriptor.
#[derive(Clone, PartialEq, Eq)]
pub struct HopSpec {
    /// The hop's node id: what the previous hop's slot names.
    pub node_id: NodeId,
    /// The hop's current X25519 onion public key.
    pub onion_key: [u8; 32],
    /// Unix seconds after which the hop refuses its layer (see [`super::expiry_acceptable`]).
    pub expires_at: u64,
}

impl std::fmt::Debug for HopSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HopSpec")
            .field("node_id", &Prefix(&self.node_id))
            .finish_non_exhaustive()
    }
}

/// What the terminal gets.
#[derive(Clone, Copy)]
pub struct Delivery<'a> {
    /// The sender's payload, opaque to the protocol.
    pub payload: &'a [u8],
    /// A synthetic probe: the terminal answers it like a message and stores nothing.
    pub probe: bool,
    /// The key the terminal seals its receipt with.
    pub receipt_key: [u8; 32],
    /// The sender's id of the message (the same on every route it tries).
    pub message_id: crate::proto::MessageId,
}

impl std::fmt::Debug for Delivery<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

/// A built packet and what the sender keeps.
#[derive(Clone, PartialEq, Eq)]
pub struct Built {
    /// The packet for the route's first hop: [`SizeClass::packet_len`] bytes.
    pub packet: Vec<u8>,
    /// The class of the packet.
    pub class: SizeClass,
    /// Each hop's replay tag, first hop first.
    pub replay_tags: Vec<ReplayTag>,
    /// Each hop's failure report key, first hop first ([`super::report::open`]).
    pub report_keys: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("class", &self.class)
            .field("packet_len", &self.packet.len())
            .finish_non_exhaustive()
    }
}

/// Why [`build`] refused a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A route needs at least one hop.
    #[error("empty route")]
    EmptyRoute,
    /// More hops than the header has slots ([`MAX_HOPS`]).
    #[error("too many hops")]
    TooManyHops,
    /// The payload is over the class's capacity.
    #[error("payload too large for the size class")]
    PayloadTooLarge,
    /// A hop's onion key is a small-order X25519 point: anyone could read its layer.
    #[error("unusable onion key")]
    WeakOnionKey,
}

/// Wraps `delivery` for `route` (first hop first, terminal last) in a packet of `class`, with a
/// fresh random ephemeral key. Use [`SizeClass::smallest_for`] to pick the class.
///
/// # Errors
/// [`BuildError`] for an empty or over-long route, a payload over the class's capacity, or an
/// unusable onion key.
pub fn build(
    route: &[HopSpec],
    delivery: &Delivery<'_>,
    class: SizeClass,
) -> Result<Built, BuildError> {
    build_with(route, delivery, class, rand::random())
}

/// [`build`] with the ephemeral secret given: everything random in the packet (alpha, and the
/// terminal's slot padding) derives from it, so tests and vectors can pin it. Never reuse one.
///
/// # Errors
/// As [`build`].
pub fn build_with(
    route: &[HopSpec],
    delivery: &Delivery<'_>,
    class: SizeClass,
    ephemeral: [u8; 32],
) -> Result<Built, BuildError> {
    let Some(terminal) = route.last() else {
        return Err(BuildError::EmptyRoute);
    };
    if route.len() > MAX_HOPS {
        return Err(BuildError::TooManyHops);
    }
    let payload_len = u32::try_from(delivery.payload.len())
        .ok()
        .filter(|_| delivery.payload.len() <= class.capacity())
        .ok_or(BuildError::PayloadTooLarge)?;
    let (alphas, keys) = hop_keys(route, &ephemeral)?;

    let terminal_slot = Slot::Terminal {
        expires_at: terminal.expires_at,
        probe: delivery.probe,
        payload_len,
        receipt_key: delivery.receipt_key,
        message_id: delivery.message_id,
    };
    let mut beta = terminal_beta(&keys, &terminal_slot, &ephemeral);

    let mut packet = vec![0u8; class.packet_len()];
    packet[0] = VERSION;
    packet[1] = class.to_byte();
    packet[HEADER_LEN..HEADER_LEN + delivery.payload.len()].copy_from_slice(delivery.payload);
    for i in (0..route.len()).rev() {
        packet[ALPHA_AT..BETA_AT].copy_from_slice(&alphas[i]);
        packet[BETA_AT..GAMMA_AT].copy_from_slice(&beta);
        let (head, rest) = packet.split_at_mut(GAMMA_AT);
        let (gamma, payload) = rest.split_at_mut(MAC_LEN);
        let tag = ChaCha20Poly1305::new(&keys[i].mu.into())
            .encrypt_in_place_detached(&Nonce::default(), head, payload)
            .expect("invariant: a payload of at most 192 KiB is within ChaCha20-Poly1305's limit");
        if i == 0 {
            gamma.copy_from_slice(&tag);
        } else {
            let slot = Slot::Forward {
                expires_at: route[i - 1].expires_at,
                next_hop: route[i].node_id,
                next_mac: tag.into(),
            };
            beta = wrap_beta(&keys[i - 1], &slot, &beta);
        }
    }
    Ok(Built {
        packet,
        class,
        replay_tags: keys.iter().map(|k| k.tag).collect(),
        report_keys: keys.iter().map(|k| k.report).collect(),
    })
}

/// Every hop's alpha and keys, first hop first.
///
/// Hop *i*'s alpha is `[x·b₀·…·bᵢ₋₁]G` and its secret `[b₀·…·bᵢ₋₁]·X25519(x, Kᵢ)`, each `b`
/// and `x` clamped as X25519 clamps, the product taken modulo the group order ℓ. The hop computes
/// the same values with one X25519 at a time: for points of the prime-order subgroup (alpha
/// always; `X25519(x, Kᵢ)` too, as the clamped `x` clears any small-order component of `Kᵢ`)
/// multiplying by an integer and by it modulo ℓ agree. So the sender computes the secret as one
/// product, `[x/8 · b₀·…·bᵢ₋₁]·[8]Kᵢ` ([`Cleared::times`]), not an X25519 and then a
/// multiplication by the blinds. Cost: per hop one fixed-base multiplication, `Kᵢ` on the
/// Edwards form and one variable-base multiplication (was: one X25519 and, after the first hop,
/// a second ladder).
///
/// # Errors
/// [`BuildError::WeakOnionKey`] when `X25519(x, Kᵢ)` is all zeros, exactly when `Kᵢ` is a
/// small-order point, whose layer anyone could read, or when `Kᵢ` is no point of the curve
/// (one of the twist), whose node could not read its layer (both refused by
/// [`crate::proto::onion_key_is_usable`]).
fn hop_keys(
    route: &[HopSpec],
    ephemeral: &[u8; 32],
) -> Result<(Vec<[u8; 32]>, Vec<HopKeys>), BuildError> {
    let x_scalar = Scalar::from_bytes_mod_order(clamp_integer(*ephemeral));
    // X25519's scalar divided by the cofactor: `Cleared::times` multiplies it back.
    let x_eighth = eighth_of_clamped(ephemeral);
    let mut blinds = Scalar::ONE;
    let mut alphas = Vec::with_capacity(route.len());
    let mut keys: Vec<HopKeys> = Vec::with_capacity(route.len());
    for hop in route {
        let alpha = MontgomeryPoint::mul_base(&(x_scalar * blinds)).to_bytes();
        let onion_key = Cleared::new(&hop.onion_key)
            .filter(|k| !k.is_small_order())
            .ok_or(BuildError::WeakOnionKey)?;
        let shared = onion_key.times(&(x_eighth * blinds));
        let hop_keys = HopKeys::derive(&shared, &alpha);
        blinds *= Scalar::from_bytes_mod_order(clamp_integer(hop_keys.blind));
        alphas.push(alpha);
        keys.push(hop_keys);
    }
    Ok((alphas, keys))
}

/// The terminal's beta: its slot and random padding, encrypted with its header stream, then the
/// filler the hops before it shift in.
fn terminal_beta(keys: &[HopKeys], slot: &Slot, ephemeral: &[u8; 32]) -> [u8; BETA_LEN] {
    let filler = filler(&keys[..keys.len() - 1]);
    let filler_at = BETA_LEN - (keys.len() - 1) * SLOT_LEN;
    let mut beta = [0u8; BETA_LEN];
    beta[..SLOT_LEN].copy_from_slice(&slot.encode());
    let mut padding_key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(SALT), ephemeral)
        .expand(b"padding", &mut padding_key)
        .expect("invariant: HKDF-SHA256 expands up to 8160 bytes");
    xor_stream(&padding_key, &mut beta[SLOT_LEN..filler_at]);
    let stream = keys[keys.len() - 1].header_stream();
    xor(&mut beta[..filler_at], &stream[..filler_at]);
    beta[filler_at..].copy_from_slice(&filler[filler_at..]);
    beta
}

/// The Sphinx filler for the hops before the terminal, right-aligned in a beta-sized buffer: what
/// the last `hops.len()` slots of the terminal's beta will be after those hops have each shifted
/// in their keystream's last slot.
fn filler(hops: &[HopKeys]) -> [u8; BETA_LEN] {
    let mut filler = [0u8; BETA_LEN];
    for (i, hop) in hops.iter().enumerate() {
        // The filler so far (i slots) moves up one slot, a zero slot comes in, and this hop's
        // stream covers the (i + 1) slots at the end of its (beta ‖ zero slot).
        let len = (i + 1) * SLOT_LEN;
        filler.copy_within(BETA_LEN - i * SLOT_LEN.., BETA_LEN - len);
        filler[BETA_LEN - SLOT_LEN..].fill(0);
        let stream = hop.header_stream();
        xor(&mut filler[BETA_LEN - len..], &stream[STREAM_LEN - len..]);
    }
    filler
}

/// The beta of the hop before: its slot, then `inner` without its last slot, encrypted with the
/// hop's header stream.
fn wrap_beta(hop: &HopKeys, slot: &Slot, inner: &[u8; BETA_LEN]) -> [u8; BETA_LEN] {
    let mut beta = [0u8; BETA_LEN];
    beta[..SLOT_LEN].copy_from_slice(&slot.encode());
    beta[SLOT_LEN..].copy_from_slice(&inner[..BETA_LEN - SLOT_LEN]);
    let stream = hop.header_stream();
    xor(&mut beta, &stream[..BETA_LEN]);
    beta
}

fn xor(out: &mut [u8], with: &[u8]) {
    for (o, w) in out.iter_mut().zip(with) {
        *o ^= w;
    }
}
