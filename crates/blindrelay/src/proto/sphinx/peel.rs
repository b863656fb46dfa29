//! Peeling one layer: the hop's side of v2.
//!
//! The framing (version, class, length) is checked first and refused with a distinct
//! [`FramingError`]; a v1 envelope is named as such. Everything after that fails with one opaque
//! [`PeelError::PeelFailed`]: a wrong key, a small-order alpha, a bad MAC (any byte changed,
//! header or payload) or a malformed slot.
//!
//! Cost per hop: one X25519 for the shared secret (per onion key tried), one HKDF-SHA256
//! extract and four expands, one ChaCha20-Poly1305 check-and-decrypt pass over the payload (per
//! key tried: a packet for the previous onion key pays two), 576 bytes of ChaCha20 for the
//! header and, to forward, one X25519 product to blind alpha.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};
use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

use super::keys::{Cleared, HopKeys, STREAM_LEN, xor_stream};
use super::slot::Slot;
use super::{
    ALPHA_AT, ALPHA_LEN, BETA_AT, BETA_LEN, FramingError, GAMMA_AT, HEADER_LEN, MAC_LEN, ReplayTag,
    SLOT_LEN, SizeClass, classify,
};
use crate::proto::NodeId;

/// Why a packet could not be peeled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeelError {
    /// Not a v2 packet of a known class and length (a v1 envelope is told apart).
    #[error(transparent)]
    Framing(#[from] FramingError),
    /// Any cryptographic or slot failure; which one is deliberately not said.
    #[error("onion_peel_failed")]
    PeelFailed,
}

/// What the hop does with a peeled layer.
#[derive(Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `packet` (same length as the one received) to `next_hop`.
    Forward {
        /// The next hop's node id.
        next_hop: NodeId,
        /// The next hop's packet.
        packet: Vec<u8>,
    },
    /// This hop is the terminal.
    Deliver {
        /// The sender's payload, padding removed.
        payload: Vec<u8>,
        /// A synthetic probe: answer like a message, store nothing.
        probe: bool,
        /// The key to seal the receipt with.
        receipt_key: [u8; 32],
        /// The sender's id of the message.
        message_id: crate::proto::MessageId,
    },
}

/// One peeled layer.
#[derive(Clone, PartialEq, Eq)]
pub struct Peeled {
    /// The layer's replay tag: refuse the layer if the tag was seen before it expired.
    pub replay_tag: ReplayTag,
    /// The layer's failure report key ([`super::report`]).
    pub report_key: [u8; 32],
    /// Unix seconds after which the layer is refused ([`super::expiry_acceptable`]).
    pub expires_at: u64,
    /// The packet's size class.
    pub class: SizeClass,
    /// What to do with it.
    pub action: Action,
}

/// The next hop's prefix, lengths and the probe flag only: never keys or payload bytes.
impl std::fmt::Debug for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Forward { next_hop, packet } => f
                .debug_struct("Forward")
                .field("next_hop", &super::Short(next_hop))
                .field("packet_len", &packet.len())
                .finish_non_exhaustive(),
            Action::Deliver { payload, probe, .. } => f
                .debug_struct("Deliver")
                .field("payload_len", &payload.len())
                .field("probe", probe)
                .finish_non_exhaustive(),
        }
    }
}

/// The class and the action only: never the replay tag.
impl std::fmt::Debug for Peeled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peeled")
            .field("class", &self.class)
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

/// [`peel_in_place`]'s result: the layer's slot and tag; the packet buffer holds the rest.
/// `Debug` prints the slot (log-safe) and the class, never the tag.
#[derive(Clone, PartialEq, Eq)]
pub struct InPlace {
    /// The layer's replay tag.
    pub replay_tag: ReplayTag,
    /// The layer's failure report key ([`super::report`]).
    pub report_key: [u8; 32],
    /// The packet's size class.
    pub class: SizeClass,
    /// The hop's slot. For [`Slot::Forward`] the buffer now holds the next hop's packet; for
    /// [`Slot::Terminal`] its payload starts at [`HEADER_LEN`].
    pub slot: Slot,
}

impl std::fmt::Debug for InPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPlace")
            .field("class", &self.class)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// Peels the layer of `packet` for this hop, trying each onion secret in order (current, then
/// previous), into a new buffer.
///
/// # Errors
/// [`PeelError::Framing`] for a packet that is not v2 framing, else [`PeelError::PeelFailed`].
pub fn peel(secrets: &[&StaticSecret], packet: &[u8]) -> Result<Peeled, PeelError> {
    classify(packet)?;
    let mut buf = packet.to_vec();
    let layer = peel_in_place(secrets, &mut buf)?;
    let (expires_at, action) = match layer.slot {
        Slot::Forward {
            expires_at,
            next_hop,
            ..
        } => (
            expires_at,
            Action::Forward {
                next_hop,
                packet: buf,
            },
        ),
        Slot::Terminal {
            expires_at,
            probe,
            payload_len,
            receipt_key,
            message_id,
        } => {
            // `peel_in_place` checked the length against the class.
            buf.truncate(HEADER_LEN + payload_len as usize);
            buf.drain(..HEADER_LEN);
            (
                expires_at,
                Action::Deliver {
                    payload: buf,
                    probe,
                    receipt_key,
                    message_id,
                },
            )
        }
    };
    Ok(Peeled {
        replay_tag: layer.replay_tag,
        report_key: layer.report_key,
        expires_at,
        class: layer.class,
        action,
    })
}

/// Peels the layer in place, without allocating: on success `packet` holds the next hop's packet
/// (forward) or the decrypted payload after [`HEADER_LEN`] (terminal). On a framing error or a
/// failed MAC `packet` is unchanged; on a malformed slot (only its sender can write one, as it
/// is under the MAC) its contents are unspecified.
///
/// # Errors
/// As [`peel`].
pub fn peel_in_place(secrets: &[&StaticSecret], packet: &mut [u8]) -> Result<InPlace, PeelError> {
    let class = classify(packet)?;
    let alpha: [u8; ALPHA_LEN] = packet[ALPHA_AT..BETA_AT]
        .try_into()
        .expect("invariant: classify checked the length");
    let (head, rest) = packet.split_at_mut(GAMMA_AT);
    let (gamma, payload) = rest.split_at_mut(MAC_LEN);
    // A small-order alpha gives the same all-zero secret for every key; an alpha off the curve
    // is none an honest sender makes (`Cleared`).
    let point = Cleared::new(&alpha)
        .filter(|p| !p.is_small_order())
        .ok_or(PeelError::PeelFailed)?;
    let mut opened = None;
    for secret in secrets {
        let shared = Zeroizing::new(point.x25519(&Zeroizing::new(secret.to_bytes())));
        let keys = HopKeys::derive(&shared, &alpha);
        let checked = ChaCha20Poly1305::new(&keys.mu.into()).decrypt_in_place_detached(
            &Nonce::default(),
            head,
            payload,
            Tag::from_slice(gamma),
        );
        if checked.is_ok() {
            opened = Some(keys);
            break;
        }
    }
    let keys = opened.ok_or(PeelError::PeelFailed)?;

    let mut routing = [0u8; STREAM_LEN];
    routing[..BETA_LEN].copy_from_slice(&head[BETA_AT..]);
    xor_stream(&keys.rho, &mut routing);
    let slot_bytes: &[u8; SLOT_LEN] = routing[..SLOT_LEN]
        .try_into()
        .expect("invariant: STREAM_LEN > SLOT_LEN");
    let slot = Slot::decode(slot_bytes).ok_or(PeelError::PeelFailed)?;
    match &slot {
        Slot::Forward { next_mac, .. } => {
            head[ALPHA_AT..BETA_AT].copy_from_slice(&keys.blind_alpha(&point));
            head[BETA_AT..].copy_from_slice(&routing[SLOT_LEN..]);
            gamma.copy_from_slice(next_mac);
        }
        Slot::Terminal { payload_len, .. } => {
            if *payload_len as usize > class.capacity() {
                return Err(PeelError::PeelFailed);
            }
        }
    }
    Ok(InPlace {
        replay_tag: keys.tag,
        report_key: keys.report,
        class,
        slot,
    })
}
