//! A routing slot: the 64 bytes of beta a hop reads for itself.
//!
//! ```text
//! forward:  0x01 ‖ expires_at u64 ‖ next_hop(32) ‖ next_mac(16) ‖ 7 zero bytes
//! terminal: 0x02 ‖ expires_at u64 ‖ flags(1) ‖ payload_len u32 ‖ receipt_key(32)
//!           ‖ message_id(16) ‖ 2 zero bytes
//! flags: bit 0 = probe; the other bits zero
//! ```
//!
//! The message id is the sender's: the same for every route it tries for one message, so the
//! terminal stores a message once whichever routes carry it (only the sender and the terminal
//! ever see it).
//!
//! Any other kind, a set reserved bit or a non-zero reserved byte is malformed. Slots are under
//! the layer's MAC, so only the route's sender could have written a malformed one.

use super::{MAC_LEN, SLOT_LEN};
use crate::proto::{MessageId, NodeId};

const KIND_FORWARD: u8 = 0x01;
const KIND_TERMINAL: u8 = 0x02;
const FLAG_PROBE: u8 = 0x01;
/// End of the forward slot's fields.
const FORWARD_END: usize = 1 + 8 + 32 + MAC_LEN;
/// Where the terminal slot's message id starts.
const MESSAGE_ID_AT: usize = 1 + 8 + 1 + 4 + 32;
/// End of the terminal slot's fields.
const TERMINAL_END: usize = MESSAGE_ID_AT + 16;

/// One decoded slot.
#[derive(Clone, PartialEq, Eq)]
pub enum Slot {
    /// Pass the peeled packet on to `next_hop`, whose layer's tag is `next_mac`.
    Forward {
        /// Unix seconds after which the layer is refused.
        expires_at: u64,
        /// The next hop's node id.
        next_hop: NodeId,
        /// The next layer's gamma.
        next_mac: [u8; MAC_LEN],
    },
    /// Deliver the first `payload_len` payload bytes.
    Terminal {
        /// Unix seconds after which the layer is refused.
        expires_at: u64,
        /// A synthetic probe: answer like a delivery, store nothing.
        probe: bool,
        /// How many payload bytes are data (the rest is padding).
        payload_len: u32,
        /// The sender's one-route key for sealing the receipt.
        receipt_key: [u8; 32],
        /// The sender's id of the message: the same on every route it tries.
        message_id: MessageId,
    },
}

/// Never prints keys or ids.
impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Slot::Forward { next_hop, .. } => f
                .debug_struct("Forward")
                .field("next_hop", &super::Short(next_hop))
                .finish_non_exhaustive(),
            Slot::Terminal {
                probe, payload_len, ..
            } => f
                .debug_struct("Terminal")
                .field("probe", probe)
                .field("payload_len", payload_len)
                .finish_non_exhaustive(),
        }
    }
}

impl Slot {
    /// The 64 bytes of the slot.
    pub fn encode(&self) -> [u8; SLOT_LEN] {
        let mut out = [0u8; SLOT_LEN];
        match self {
            Slot::Forward {
                expires_at,
                next_hop,
                next_mac,
            } => {
                out[0] = KIND_FORWARD;
                out[1..9].copy_from_slice(&expires_at.to_be_bytes());
                out[9..41].copy_from_slice(next_hop);
                out[41..FORWARD_END].copy_from_slice(next_mac);
            }
            Slot::Terminal {
                expires_at,
                probe,
                payload_len,
                receipt_key,
                message_id,
            } => {
                out[0] = KIND_TERMINAL;
                out[1..9].copy_from_slice(&expires_at.to_be_bytes());
                out[9] = if *probe { FLAG_PROBE } else { 0 };
                out[10..14].copy_from_slice(&payload_len.to_be_bytes());
                out[14..MESSAGE_ID_AT].copy_from_slice(receipt_key);
                out[MESSAGE_ID_AT..TERMINAL_END].copy_from_slice(message_id);
            }
        }
        out
    }

    /// Parses a slot; `None` when malformed.
    pub fn decode(bytes: &[u8; SLOT_LEN]) -> Option<Slot> {
        let expires_at = u64::from_be_bytes(array(&bytes[1..9]));
        match bytes[0] {
            KIND_FORWARD if zero(&bytes[FORWARD_END..]) => Some(Slot::Forward {
                expires_at,
                next_hop: array(&bytes[9..41]),
                next_mac: array(&bytes[41..FORWARD_END]),
            }),
            KIND_TERMINAL if zero(&bytes[TERMINAL_END..]) && bytes[9] & !FLAG_PROBE == 0 => {
                Some(Slot::Terminal {
                    expires_at,
                    probe: bytes[9] & FLAG_PROBE != 0,
                    payload_len: u32::from_be_bytes(array(&bytes[10..14])),
                    receipt_key: array(&bytes[14..MESSAGE_ID_AT]),
                    message_id: array(&bytes[MESSAGE_ID_AT..TERMINAL_END]),
                })
            }
            _ => None,
        }
    }
}

fn zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    bytes
        .try_into()
        .expect("invariant: slot field ranges have their type's length")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_reject_reserved_bits() {
        let slots = [
            Slot::Forward {
                expires_at: 1_764_450_600,
                next_hop: [7; 32],
                next_mac: [8; MAC_LEN],
            },
            Slot::Terminal {
                expires_at: 5,
                probe: true,
                payload_len: 2048,
                receipt_key: [9; 32],
                message_id: [10; 16],
            },
            Slot::Terminal {
                expires_at: 5,
                probe: false,
                payload_len: 0,
                receipt_key: [9; 32],
                message_id: [0; 16],
            },
        ];
        for slot in slots {
            let bytes = slot.encode();
            assert_eq!(Slot::decode(&bytes), Some(slot.clone()));
            for reserved in [63, if bytes[0] == KIND_FORWARD { 57 } else { 62 }] {
                let mut bad = bytes;
                bad[reserved] = 1;
                assert_eq!(Slot::decode(&bad), None);
            }
        }
        let mut flags = slots_terminal().encode();
        flags[9] = 0x02;
        assert_eq!(Slot::decode(&flags), None);
        for kind in [0x00, 0x03, 0xff] {
            let mut bytes = [0u8; SLOT_LEN];
            bytes[0] = kind;
            assert_eq!(Slot::decode(&bytes), None);
        }
    }

    fn slots_terminal() -> Slot {
        Slot::Terminal {
            expires_at: 1,
            probe: false,
            payload_len: 1,
            receipt_key: [1; 32],
            message_id: [2; 16],
        }
    }
}
