//! The discovery messages and their binary form (`POST /v1/discovery`: one message a request,
//! one a reply).
//!
//! Every message is a type byte and its fields, big-endian; lists carry a `u32` count, and a
//! reader refuses a count its input cannot hold. A descriptor takes 146 bytes and its
//! endpoint's: node id, onion key, endpoint (`u8` length), `issued_at`, `expires_at`, protocol,
//! signature. An inventory entry takes 12 bytes. Nothing here checks a signature:
//! [`super::verify`] does, before anything is kept.

use crate::proto::NodeId;
use crate::proto::descriptor::{Descriptor, MAX_ENDPOINT_LEN};

/// Bytes of an identity's short form in an inventory.
pub const SHORT: usize = 8;

/// An identity's first [`SHORT`] bytes.
pub type Short = [u8; SHORT];

/// The short form of `id`.
pub fn short(id: &NodeId) -> Short {
    let mut s = [0; SHORT];
    s.copy_from_slice(&id[..SHORT]);
    s
}

/// A discovery message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A reconciliation round: the initiator's descriptor on the first, then the round's
    /// message (`negentropy`).
    Sync {
        /// The initiator's own descriptor (first round).
        own: Option<Descriptor>,
        /// The round.
        round: Vec<u8>,
    },
    /// The answer to a round: the responder's descriptor on the first, and its round.
    SyncReply {
        /// The responder's own descriptor (first round).
        own: Option<Descriptor>,
        /// The round; empty when the responder will go no further.
        round: Vec<u8>,
    },
    /// Descriptors asked for by node id (what a reconciliation found missing).
    Get(Vec<NodeId>),
    /// Descriptors (an answer to [`Msg::Get`] or [`Msg::Want`]'s follow-up, or a push of what
    /// a reconciliation found the other side lacks).
    Descriptors(Vec<Descriptor>),
    /// Fresh descriptors a node learned: each identity's short form and `issued_at` (4 bytes
    /// on the wire: Unix seconds to 2106).
    Inv(Vec<(Short, u64)>),
    /// The answer to an inventory: the identities wanted (short forms).
    Want(Vec<Short>),
    /// Nothing to say back.
    Ack,
    /// A probe, and its answer: the sender's own descriptor (a probe always carries it; an
    /// answer only when newer than `have`), and the `issued_at` of the receiver's descriptor
    /// the sender holds (0: none).
    Hello {
        /// The sender's descriptor.
        own: Option<Descriptor>,
        /// What the sender holds of the receiver's.
        have: u64,
    },
}

/// Why bytes are not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Cut short, or a count its bytes cannot hold.
    #[error("discovery message truncated")]
    Short,
    /// An unknown type byte.
    #[error("unknown discovery message")]
    Unknown,
    /// Bytes past the end.
    #[error("trailing bytes after a discovery message")]
    Trailing,
    /// A field out of its bounds (an endpoint too long, not UTF-8).
    #[error("discovery message field out of bounds")]
    Field,
}

const SYNC: u8 = 1;
const SYNC_REPLY: u8 = 2;
const GET: u8 = 3;
const DESCRIPTORS: u8 = 4;
const INV: u8 = 5;
const WANT: u8 = 6;
const ACK: u8 = 7;
const HELLO: u8 = 8;

impl Msg {
    /// The binary form, appended to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Msg::Sync { own, round } | Msg::SyncReply { own, round } => {
                out.push(if matches!(self, Msg::Sync { .. }) {
                    SYNC
                } else {
                    SYNC_REPLY
                });
                out.push(u8::from(own.is_some()));
                if let Some(d) = own {
                    put_descriptor(d, out);
                }
                put_bytes(round, out);
            }
            Msg::Get(digests) => {
                out.push(GET);
                put_count(digests.len(), out);
                digests.iter().for_each(|d| out.extend_from_slice(d));
            }
            Msg::Descriptors(ds) => {
                out.push(DESCRIPTORS);
                put_count(ds.len(), out);
                ds.iter().for_each(|d| put_descriptor(d, out));
            }
            Msg::Inv(items) => {
                out.push(INV);
                put_count(items.len(), out);
                for (s, at) in items {
                    out.extend_from_slice(s);
                    out.extend_from_slice(&u32::try_from(*at).unwrap_or(u32::MAX).to_be_bytes());
                }
            }
            Msg::Want(shorts) => {
                out.push(WANT);
                put_count(shorts.len(), out);
                shorts.iter().for_each(|s| out.extend_from_slice(s));
            }
            Msg::Ack => out.push(ACK),
            Msg::Hello { own, have } => {
                out.push(HELLO);
                out.push(u8::from(own.is_some()));
                if let Some(d) = own {
                    put_descriptor(d, out);
                }
                out.extend_from_slice(&have.to_be_bytes());
            }
        }
    }

    /// The message's name (counters, logs).
    pub fn kind(&self) -> &'static str {
        Msg::KINDS[self.kind_index()]
    }

    /// Its place in [`Msg::KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            Msg::Sync { .. } => 0,
            Msg::SyncReply { .. } => 1,
            Msg::Get(_) => 2,
            Msg::Descriptors(_) => 3,
            Msg::Inv(_) => 4,
            Msg::Want(_) => 5,
            Msg::Ack => 6,
            Msg::Hello { .. } => 7,
        }
    }

    /// The kinds' names, in [`Msg::kind_index`]'s order.
    pub const KINDS: [&'static str; 8] = [
        "sync",
        "sync_reply",
        "get",
        "descriptors",
        "inv",
        "want",
        "ack",
        "hello",
    ];

    /// The bytes of its binary form.
    pub fn encoded_len(&self) -> usize {
        const COUNT: usize = 4;
        1 + match self {
            Msg::Sync { own, round } | Msg::SyncReply { own, round } => {
                1 + own.as_ref().map_or(0, descriptor_len) + COUNT + round.len()
            }
            Msg::Get(ids) => COUNT + 32 * ids.len(),
            Msg::Descriptors(ds) => COUNT + ds.iter().map(descriptor_len).sum::<usize>(),
            Msg::Inv(items) => COUNT + (SHORT + 4) * items.len(),
            Msg::Want(shorts) => COUNT + SHORT * shorts.len(),
            Msg::Ack => 0,
            Msg::Hello { own, .. } => 1 + own.as_ref().map_or(0, descriptor_len) + 8,
        }
    }

    /// The binary form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Reads a message.
    ///
    /// # Errors
    /// [`WireError`].
    pub fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
        let mut r = Reader(bytes);
        let msg = match r.u8()? {
            t @ (SYNC | SYNC_REPLY) => {
                let own = match r.u8()? {
                    0 => None,
                    1 => Some(r.descriptor()?),
                    _ => return Err(WireError::Field),
                };
                let round = r.bytes()?.to_vec();
                if t == SYNC {
                    Msg::Sync { own, round }
                } else {
                    Msg::SyncReply { own, round }
                }
            }
            GET => Msg::Get(r.list(32, |r| r.array())?),
            DESCRIPTORS => Msg::Descriptors(r.list(MIN_DESCRIPTOR, Reader::descriptor)?),
            INV => Msg::Inv(r.list(SHORT + 4, |r| Ok((r.array()?, r.u32()?)))?),
            WANT => Msg::Want(r.list(SHORT, |r| r.array())?),
            ACK => Msg::Ack,
            HELLO => {
                let own = match r.u8()? {
                    0 => None,
                    1 => Some(r.descriptor()?),
                    _ => return Err(WireError::Field),
                };
                Msg::Hello {
                    own,
                    have: r.u64()?,
                }
            }
            _ => return Err(WireError::Unknown),
        };
        if !r.0.is_empty() {
            return Err(WireError::Trailing);
        }
        Ok(msg)
    }
}

/// The fewest bytes a descriptor takes (an empty endpoint).
const MIN_DESCRIPTOR: usize = 32 + 32 + 1 + 8 + 8 + 1 + 64;

/// The bytes of `d` in a message.
pub fn descriptor_len(d: &Descriptor) -> usize {
    MIN_DESCRIPTOR + d.endpoint.len()
}

fn put_count(n: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(b: &[u8], out: &mut Vec<u8>) {
    put_count(b.len(), out);
    out.extend_from_slice(b);
}

fn put_descriptor(d: &Descriptor, out: &mut Vec<u8>) {
    out.extend_from_slice(&d.node_id);
    out.extend_from_slice(&d.onion_key);
    let endpoint = &d.endpoint.as_bytes()[..d.endpoint.len().min(MAX_ENDPOINT_LEN)];
    out.push(endpoint.len() as u8);
    out.extend_from_slice(endpoint);
    out.extend_from_slice(&d.issued_at.to_be_bytes());
    out.extend_from_slice(&d.expires_at.to_be_bytes());
    out.push(d.protocol);
    out.extend_from_slice(&d.signature);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u64, WireError> {
        Ok(u64::from(u32::from_be_bytes(self.array()?)))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn count(&mut self, each: usize) -> Result<usize, WireError> {
        let n = u32::from_be_bytes(self.array()?) as usize;
        if n.saturating_mul(each.max(1)) > self.0.len() {
            return Err(WireError::Short);
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&[u8], WireError> {
        let n = self.count(1)?;
        self.take(n)
    }

    fn list<T>(
        &mut self,
        each: usize,
        mut one: impl FnMut(&mut Self) -> Result<T, WireError>,
    ) -> Result<Vec<T>, WireError> {
        let n = self.count(each)?;
        (0..n).map(|_| one(self)).collect()
    }

    fn descriptor(&mut self) -> Result<Descriptor, WireError> {
        let node_id = self.array()?;
        let onion_key = self.array()?;
        let len = usize::from(self.u8()?);
        let endpoint = std::str::from_utf8(self.take(len)?)
            .map_err(|_| WireError::Field)?
            .to_owned();
        Ok(Descriptor {
            node_id,
            onion_key,
            endpoint,
            issued_at: self.u64()?,
            expires_at: self.u64()?,
            protocol: self.u8()?,
            signature: self.array()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn d(seed: u8) -> Descriptor {
        crate::proto::descriptor::for_test([seed; 32], "https://192.0.2.1:7001", 1_800_000_000)
    }

    #[test]
    fn every_message_round_trips_and_a_descriptor_is_146_bytes_and_its_endpoint() {
        let msgs = [
            Msg::Sync {
                own: Some(d(1)),
                round: vec![1, 2, 3],
            },
            Msg::SyncReply {
                own: None,
                round: vec![],
            },
            Msg::Get(vec![[7; 32], [8; 32]]),
            Msg::Descriptors(vec![d(2), d(3)]),
            Msg::Inv(vec![([1; SHORT], 5)]),
            Msg::Want(vec![[2; SHORT]]),
            Msg::Ack,
            Msg::Hello {
                own: Some(d(4)),
                have: 7,
            },
            Msg::Hello { own: None, have: 0 },
        ];
        for m in msgs {
            assert_eq!(m.encoded_len(), m.to_bytes().len());
            assert_eq!(Msg::decode(&m.to_bytes()), Ok(m));
        }
        assert_eq!(descriptor_len(&d(1)), 146 + "https://192.0.2.1:7001".len());
        let mut one = Vec::new();
        put_descriptor(&d(1), &mut one);
        assert_eq!(one.len(), descriptor_len(&d(1)));
    }

    #[test]
    fn counts_the_bytes_cannot_hold_are_refused_at_once() {
        // A billion digests announced in 9 bytes.
        let mut b = vec![GET];
        b.extend_from_slice(&1_000_000_000u32.to_be_bytes());
        assert_eq!(Msg::decode(&b), Err(WireError::Short));
        assert_eq!(Msg::decode(&[99]), Err(WireError::Unknown));
        let mut ack = Msg::Ack.to_bytes();
        ack.push(0);
        assert_eq!(Msg::decode(&ack), Err(WireError::Trailing));
    }

    proptest! {
        #[test]
        fn any_bytes_are_a_message_or_an_error(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(m) = Msg::decode(&b) {
                prop_assert_eq!(Msg::decode(&m.to_bytes()), Ok(m));
            }
        }
    }
}
