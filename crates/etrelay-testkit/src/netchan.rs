//! The netchan: how the engines frame in-game (sequenced) packets, both directions, both
//! dialects, with fragments; no I/O.
//!
//! Facts from `src/qcommon/net_chan.c` (ET 2.60b and ET: Legacy) and `code/qcommon/net_chan.c`
//! (ioquake3):
//!
//! * header: the sequence, 4 bytes little-endian, bit 31 set on a fragment; client to server
//!   then the 2-byte qport; ioquake3 protocol 71 then a 4-byte checksum
//!   `challenge ^ (sequence * challenge)` (sequence without the fragment bit, 32-bit wrapping
//!   arithmetic) in both directions, absent from ET and from ioquake3's legacy protocol 68; a
//!   fragment then has its 2-byte start and 2-byte length (signed shorts);
//! * `Netchan_Setup`: the outgoing sequence starts at 1, the incoming one at 0;
//! * `Netchan_Transmit`: a message of [`FRAGMENT_SIZE`] (1300 = `MAX_PACKETLEN` 1400 − 100)
//!   bytes or more goes as fragments of 1300 bytes, the last one shorter, possibly empty (a
//!   message of exactly 1300 bytes is a fragment of 1300 then one of 0); every fragment carries
//!   the same sequence, which grows by one after the last;
//! * `Netchan_Process`: the checksum (ioquake3 71) is checked first; a sequence not above the
//!   last one accepted is dropped (duplicates, reordering); a fragment whose sequence differs
//!   from the one being assembled restarts the assembly; a fragment that does not start where
//!   the assembled part ends is dropped (out of order or after a lost one: the engines do not
//!   reorder; the part so far is kept); a negative length, one longer than the datagram or one
//!   that would overflow `MAX_MSGLEN` is dropped; a fragment of exactly 1300 bytes waits for
//!   more; a shorter one completes the message, which is then read from offset 4 (the sequence
//!   stays in front, the qport is gone).
//!
//! [`xor`] is the XOR "encoding" of ET 2.60b, ET: Legacy and ioquake3's protocol 68 on top of
//! the netchan; [`session`] is the fakes' in-game stream (patterned messages both ways) built
//! on both.
//!
//! Simplification: all fragments of a message are returned at once; the engines send one per
//! frame (`Netchan_TransmitNextFragment`) and queue later messages behind them (same bytes,
//! same order).

pub mod session;
pub mod xor;

/// `MAX_PACKETLEN`: the largest datagram the netchan writes.
pub const MAX_PACKETLEN: usize = 1400;
/// `FRAGMENT_SIZE`: messages of this length or more are fragmented.
pub const FRAGMENT_SIZE: usize = MAX_PACKETLEN - 100;
/// Bit 31 of the sequence: this datagram is a fragment.
pub const FRAGMENT_BIT: u32 = 1 << 31;

/// Which engine family's netchan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// ET 2.60b and ET: Legacy, protocol 84: no checksum, XOR-encoded messages.
    Et,
    /// ioquake3, protocol 71 (OpenArena): a checksum in every header, no XOR.
    Ioq3,
    /// ioquake3's legacy ("compat") netchan of the id Quake 3 1.32 protocol 68: no checksum,
    /// XOR-encoded. Debian's OpenArena speaks it under protocol 71 (its wrapper sets
    /// `com_legacyprotocol 71`, so protocol 71 clients are compat clients).
    Ioq3Legacy,
}

impl Dialect {
    /// The `protocol` a stock client of this dialect announces (for [`Dialect::Ioq3Legacy`],
    /// 68; Debian's OpenArena announces 71).
    pub fn protocol(self) -> u32 {
        match self {
            Dialect::Et => 84,
            Dialect::Ioq3 => 71,
            Dialect::Ioq3Legacy => 68,
        }
    }

    /// Whether headers carry the checksum.
    pub fn has_checksum(self) -> bool {
        self == Dialect::Ioq3
    }

    /// Whether messages are XOR-encoded ([`xor`]).
    pub fn xor_encoded(self) -> bool {
        self != Dialect::Ioq3
    }

    /// `MAX_MSGLEN`: the largest message (and fragment buffer).
    pub fn max_msglen(self) -> usize {
        match self {
            Dialect::Et => 32_768,
            Dialect::Ioq3 | Dialect::Ioq3Legacy => 16_384,
        }
    }

    /// `MAX_RELIABLE_COMMANDS`: the size of the command tables the XOR keys index.
    pub fn max_reliable_commands(self) -> usize {
        match self {
            Dialect::Et => 256,
            Dialect::Ioq3 | Dialect::Ioq3Legacy => 64,
        }
    }
}

/// Which way a datagram travels (only client-to-server headers carry the qport).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to server.
    ToServer,
    /// Server to client.
    ToClient,
}

/// `NETCHAN_GENCHECKSUM(challenge, sequence)`: `challenge ^ (sequence * challenge)`, wrapping.
pub fn checksum(challenge: i32, sequence: u32) -> u32 {
    let challenge = challenge as u32;
    challenge ^ sequence.wrapping_mul(challenge)
}

/// Where a fragment goes in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// `fragmentStart`: its offset in the message.
    pub start: u16,
    /// `fragmentLength`: its length; under [`FRAGMENT_SIZE`] on the last one.
    pub length: u16,
}

/// A netchan header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The sequence, without the fragment bit.
    pub sequence: u32,
    /// The qport (client to server only).
    pub qport: Option<u16>,
    /// The checksum (ioquake3 protocol 71 only), as read or to be written.
    pub checksum: Option<u32>,
    /// The fragment fields (fragments only).
    pub fragment: Option<Fragment>,
}

impl Header {
    /// Its length on the wire.
    pub fn wire_len(&self) -> usize {
        4 + self.qport.map_or(0, |_| 2)
            + self.checksum.map_or(0, |_| 4)
            + self.fragment.map_or(0, |_| 4)
    }

    /// Appends it to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        let bit = if self.fragment.is_some() {
            FRAGMENT_BIT
        } else {
            0
        };
        out.extend_from_slice(&(self.sequence | bit).to_le_bytes());
        if let Some(qport) = self.qport {
            out.extend_from_slice(&qport.to_le_bytes());
        }
        if let Some(sum) = self.checksum {
            out.extend_from_slice(&sum.to_le_bytes());
        }
        if let Some(f) = self.fragment {
            out.extend_from_slice(&f.start.to_le_bytes());
            out.extend_from_slice(&f.length.to_le_bytes());
        }
    }

    /// Reads the header of `datagram` as a peer of `dialect` receiving in `direction` does;
    /// `None` when the datagram is shorter than its header.
    pub fn parse(dialect: Dialect, direction: Direction, datagram: &[u8]) -> Option<Header> {
        let mut at = 0;
        let mut take = |n: usize| -> Option<&[u8]> {
            let bytes = datagram.get(at..at + n)?;
            at += n;
            Some(bytes)
        };
        let raw = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let qport = match direction {
            Direction::ToServer => Some(u16::from_le_bytes(take(2)?.try_into().ok()?)),
            Direction::ToClient => None,
        };
        let checksum = match dialect.has_checksum() {
            true => Some(u32::from_le_bytes(take(4)?.try_into().ok()?)),
            false => None,
        };
        let fragment = match raw & FRAGMENT_BIT {
            0 => None,
            _ => Some(Fragment {
                start: u16::from_le_bytes(take(2)?.try_into().ok()?),
                length: u16::from_le_bytes(take(2)?.try_into().ok()?),
            }),
        };
        Some(Header {
            sequence: raw & !FRAGMENT_BIT,
            qport,
            checksum,
            fragment,
        })
    }
}

/// The sending half of a netchan (`netchan_t`'s outgoing side).
#[derive(Debug, Clone)]
pub struct Sender {
    dialect: Dialect,
    direction: Direction,
    qport: u16,
    challenge: i32,
    outgoing_sequence: u32,
}

impl Sender {
    /// A fresh channel (`Netchan_Setup`: the first message gets sequence 1). `qport` is written
    /// only by a client (`direction` [`Direction::ToServer`]); `challenge` feeds the checksum.
    pub fn new(dialect: Dialect, direction: Direction, qport: u16, challenge: i32) -> Sender {
        Sender {
            dialect,
            direction,
            qport,
            challenge,
            outgoing_sequence: 1,
        }
    }

    /// The sequence the next message gets (what ET's server XOR key uses).
    pub fn outgoing_sequence(&self) -> u32 {
        self.outgoing_sequence
    }

    fn header(&self, fragment: Option<Fragment>) -> Header {
        Header {
            sequence: self.outgoing_sequence,
            qport: (self.direction == Direction::ToServer).then_some(self.qport),
            checksum: self
                .dialect
                .has_checksum()
                .then(|| checksum(self.challenge, self.outgoing_sequence)),
            fragment,
        }
    }

    /// The datagrams that carry `message` (`Netchan_Transmit`): one, or fragments when it is
    /// [`FRAGMENT_SIZE`] bytes or more. The sequence then grows by one.
    ///
    /// # Panics
    ///
    /// When `message` is longer than the dialect's `MAX_MSGLEN` (the engines' `Com_Error`).
    pub fn transmit(&mut self, message: &[u8]) -> Vec<Vec<u8>> {
        assert!(
            message.len() <= self.dialect.max_msglen(),
            "Netchan_Transmit: length = {}",
            message.len()
        );
        let mut datagrams = Vec::new();
        if message.len() < FRAGMENT_SIZE {
            let mut d = Vec::with_capacity(14 + message.len());
            self.header(None).write(&mut d);
            d.extend_from_slice(message);
            datagrams.push(d);
        } else {
            let mut start = 0;
            loop {
                let length = FRAGMENT_SIZE.min(message.len() - start);
                let fragment = Fragment {
                    start: start as u16,
                    length: length as u16,
                };
                let mut d = Vec::with_capacity(18 + length);
                self.header(Some(fragment)).write(&mut d);
                d.extend_from_slice(&message[start..start + length]);
                datagrams.push(d);
                start += length;
                // A last fragment of exactly 1300 bytes is followed by an empty one.
                if start == message.len() && length != FRAGMENT_SIZE {
                    break;
                }
            }
        }
        self.outgoing_sequence = self.outgoing_sequence.wrapping_add(1);
        datagrams
    }
}

/// Why [`Receiver::process`] dropped a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Shorter than its header.
    Short,
    /// The checksum does not match (ioquake3 71).
    BadChecksum,
    /// A sequence not above the last accepted one.
    OutOfOrder,
    /// A fragment that does not start where the assembled part ends.
    FragmentGap,
    /// A negative fragment length, one past the datagram's end, or too long a message.
    IllegalFragment,
}

/// A message the netchan accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Its sequence.
    pub sequence: u32,
    /// Whether it came in fragments.
    pub fragmented: bool,
    /// How many sequences were skipped before it (`chan->dropped`).
    pub skipped: u32,
    /// The message: the bytes after the header, or the reassembled fragments.
    pub message: Vec<u8>,
}

/// What [`Receiver::process`] made of a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// A whole message.
    Message(Delivered),
    /// A fragment stored; the message is not complete yet.
    Fragment,
    /// Dropped.
    Dropped(DropReason),
}

/// The receiving half of a netchan (`netchan_t`'s incoming side and fragment buffer).
#[derive(Debug, Clone)]
pub struct Receiver {
    dialect: Dialect,
    direction: Direction,
    challenge: i32,
    /// The last sequence accepted (signed, as the engines compare it).
    incoming_sequence: i32,
    /// The sequence being reassembled.
    fragment_sequence: i32,
    /// The part reassembled so far.
    fragment_buffer: Vec<u8>,
}

impl Receiver {
    /// A fresh channel receiving in `direction` (a server receives [`Direction::ToServer`]).
    pub fn new(dialect: Dialect, direction: Direction, challenge: i32) -> Receiver {
        Receiver {
            dialect,
            direction,
            challenge,
            incoming_sequence: 0,
            fragment_sequence: 0,
            fragment_buffer: Vec::new(),
        }
    }

    /// The last sequence accepted.
    pub fn incoming_sequence(&self) -> u32 {
        self.incoming_sequence as u32
    }

    /// `Netchan_Process` on one datagram.
    pub fn process(&mut self, datagram: &[u8]) -> Processed {
        let Some(header) = Header::parse(self.dialect, self.direction, datagram) else {
            return Processed::Dropped(DropReason::Short);
        };
        if let Some(sum) = header.checksum
            && sum != checksum(self.challenge, header.sequence)
        {
            return Processed::Dropped(DropReason::BadChecksum);
        }
        let sequence = header.sequence as i32;
        if sequence <= self.incoming_sequence {
            return Processed::Dropped(DropReason::OutOfOrder);
        }
        let skipped = (sequence - (self.incoming_sequence + 1)) as u32;
        let body = &datagram[header.wire_len()..];
        let message = match header.fragment {
            None => body.to_vec(),
            Some(fragment) => match self.assemble(sequence, fragment, body) {
                Ok(Some(message)) => message,
                Ok(None) => return Processed::Fragment,
                Err(reason) => return Processed::Dropped(reason),
            },
        };
        self.incoming_sequence = sequence;
        Processed::Message(Delivered {
            sequence: header.sequence,
            fragmented: header.fragment.is_some(),
            skipped,
            message,
        })
    }

    /// Adds a fragment; the whole message once its last fragment is in.
    fn assemble(
        &mut self,
        sequence: i32,
        fragment: Fragment,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, DropReason> {
        if sequence != self.fragment_sequence {
            self.fragment_sequence = sequence;
            self.fragment_buffer.clear();
        }
        // Signed shorts on the wire.
        let (start, length) = (fragment.start as i16, fragment.length as i16);
        if i32::from(start) != self.fragment_buffer.len() as i32 {
            return Err(DropReason::FragmentGap);
        }
        let max = self.dialect.max_msglen();
        if length < 0
            || length as usize > body.len()
            || self.fragment_buffer.len() + length as usize > max
        {
            return Err(DropReason::IllegalFragment);
        }
        self.fragment_buffer
            .extend_from_slice(&body[..length as usize]);
        if length as usize == FRAGMENT_SIZE {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.fragment_buffer)))
    }
}
