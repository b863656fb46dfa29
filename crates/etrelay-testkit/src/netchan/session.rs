//! The fakes' in-game stream: one end of a netchan carrying patterned messages, XOR-encoded
//! with the engines' key schedule where the dialect has it ([`super::xor`]).
//!
//! Messages (the leading longs plain, see [`super::xor`]):
//!
//! * client to server: `serverId`, `messageAcknowledge` (the last server sequence received),
//!   `reliableAcknowledge` (the last server command received), then the body;
//! * server to client: `reliableAcknowledge` (the last client command received), then the body;
//! * body: a counter (`u32`, 1 for the first message of that end), the number of the command
//!   the message carries (`u32`), the command text and a NUL, then a filler whose bytes depend
//!   on the counter and their position, up to a length that also depends on the counter (some
//!   are 1 299 bytes, some exactly 1 300 or 2 600 — a last fragment of 0 bytes — and some
//!   1 300 to 4 299: fragmented).
//!
//! Each message carries a new reliable command of its sender (its text made from its number,
//! with a `%` and sometimes a byte over 127, which the key schedule reads as `.`); a receiver
//! that decodes a message remembers its command. The XOR keys follow the engines: the server
//! encodes with the last client command it received and decodes with its own command the
//! client acknowledges; the client encodes with the server command it acknowledges and decodes
//! with its own command the server acknowledges. The key starts from the challenge, so a
//! message XOR-ed for another challenge decodes to garbage: the filler no longer matches and
//! the message counts as [`Outcome::Garbled`].

use super::xor::{self, ClientLongs};
use super::{Dialect, Direction, DropReason, FRAGMENT_SIZE, Processed, Receiver, Sender};

/// The `serverId` the fake client writes (any value works: the key reads it from the message).
pub const FAKE_SERVER_ID: u32 = 0x0005_EED1;

/// Which end of the netchan a [`Session`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The client (sends with the qport, encodes from offset 12).
    Client,
    /// The server (encodes from offset 4).
    Server,
}

/// What one end counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages sent.
    pub messages_sent: u64,
    /// Datagrams sent (fragments counted one by one).
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Messages the netchan accepted (whole or reassembled).
    pub messages_received: u64,
    /// Accepted messages whose pattern checked out after decoding.
    pub decoded_ok: u64,
    /// Accepted messages that decoded to garbage (wrong key, altered bytes, or not ours).
    pub decoded_bad: u64,
    /// Datagrams dropped for a bad checksum (ioquake3 71).
    pub dropped_checksum: u64,
    /// Datagrams dropped as duplicate or out of order.
    pub dropped_order: u64,
    /// Fragments dropped (gap, illegal length).
    pub dropped_fragment: u64,
    /// Datagrams shorter than their header.
    pub dropped_short: u64,
}

impl Counts {
    /// Adds `other` to these counts (to sum over clients).
    pub fn add(&mut self, other: &Counts) {
        self.messages_sent += other.messages_sent;
        self.datagrams_sent += other.datagrams_sent;
        self.datagrams_received += other.datagrams_received;
        self.messages_received += other.messages_received;
        self.decoded_ok += other.decoded_ok;
        self.decoded_bad += other.decoded_bad;
        self.dropped_checksum += other.dropped_checksum;
        self.dropped_order += other.dropped_order;
        self.dropped_fragment += other.dropped_fragment;
        self.dropped_short += other.dropped_short;
    }

    fn count_drop(&mut self, reason: DropReason) {
        match reason {
            DropReason::Short => self.dropped_short += 1,
            DropReason::BadChecksum => self.dropped_checksum += 1,
            DropReason::OutOfOrder => self.dropped_order += 1,
            DropReason::FragmentGap | DropReason::IllegalFragment => self.dropped_fragment += 1,
        }
    }
}

/// What [`Session::receive`] made of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A whole message that decoded to the pattern; its counter.
    Decoded(u32),
    /// A whole message that decoded to something else.
    Garbled,
    /// A fragment stored, the message not complete yet.
    Fragment,
    /// Dropped by the netchan.
    Dropped(DropReason),
}

/// The length of message number `counter` (header longs included).
pub fn message_len(counter: u32) -> usize {
    let c = counter as usize;
    match counter % 10 {
        3 if counter % 20 == 13 => 2 * FRAGMENT_SIZE,
        3 => FRAGMENT_SIZE,
        5 => FRAGMENT_SIZE - 1,
        7 => FRAGMENT_SIZE + (c * 397) % 3000,
        _ => 100 + (c * 53) % 400,
    }
}

/// Filler byte `j` of message `counter`.
fn filler(counter: u32, j: usize) -> u8 {
    (counter as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ ((j >> 8) as u8) ^ 0x5A
}

/// The text of reliable command `number` sent by `role`.
pub fn command_text(role: Role, number: u32) -> Vec<u8> {
    let mut text = match role {
        Role::Server => format!("cs {} \"\\sv_fake\\{}%\"", number % 1024, number).into_bytes(),
        Role::Client => format!("userinfo \"\\name\\pl%yer{number}\"").into_bytes(),
    };
    if number.is_multiple_of(3) {
        text.push(0xE9);
    }
    text
}

/// One end of a netchan with its command tables and counts; no I/O.
#[derive(Debug, Clone)]
pub struct Session {
    role: Role,
    dialect: Dialect,
    challenge: i32,
    sender: Sender,
    receiver: Receiver,
    /// This end's reliable commands, by number modulo the table size.
    own_commands: Vec<Vec<u8>>,
    own_command_seq: u32,
    /// The peer's reliable commands received, by number modulo the table size.
    peer_commands: Vec<Vec<u8>>,
    peer_command_seq: u32,
    counts: Counts,
}

impl Session {
    /// One end of a fresh netchan: `qport` is what the client writes; `challenge` is the one of
    /// the handshake (checksum and XOR keys).
    pub fn new(role: Role, dialect: Dialect, qport: u16, challenge: i32) -> Session {
        let (out, inc) = match role {
            Role::Client => (Direction::ToServer, Direction::ToClient),
            Role::Server => (Direction::ToClient, Direction::ToServer),
        };
        let table = dialect.max_reliable_commands();
        Session {
            role,
            dialect,
            challenge,
            sender: Sender::new(dialect, out, qport, challenge),
            receiver: Receiver::new(dialect, inc, challenge),
            own_commands: vec![Vec::new(); table],
            own_command_seq: 0,
            peer_commands: vec![Vec::new(); table],
            peer_command_seq: 0,
            counts: Counts::default(),
        }
    }

    /// The challenge this end uses.
    pub fn challenge(&self) -> i32 {
        self.challenge
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// What this end counted so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    fn slot(&self, number: u32) -> usize {
        number as usize & (self.own_commands.len() - 1)
    }

    /// Builds, encodes and frames the next message: the datagrams to send.
    pub fn next_datagrams(&mut self) -> Vec<Vec<u8>> {
        let counter = (self.counts.messages_sent + 1) as u32;
        self.own_command_seq += 1;
        let number = self.own_command_seq;
        let command = command_text(self.role, number);
        let slot = self.slot(number);
        self.own_commands[slot] = command.clone();
        let acked = self.peer_commands[self.slot(self.peer_command_seq)].clone();
        let mut message = Vec::with_capacity(message_len(counter));
        match self.role {
            Role::Client => ClientLongs {
                server_id: FAKE_SERVER_ID,
                message_acknowledge: self.receiver.incoming_sequence(),
                reliable_acknowledge: self.peer_command_seq,
            }
            .write(&mut message),
            Role::Server => message.extend_from_slice(&self.peer_command_seq.to_le_bytes()),
        }
        write_body(&mut message, counter, number, &command);
        if self.dialect.xor_encoded() {
            match self.role {
                Role::Client => xor::xor_client_message(&mut message, self.challenge, &acked),
                Role::Server => {
                    let sequence = self.sender.outgoing_sequence();
                    xor::xor_server_message(&mut message, self.challenge, sequence, &acked);
                }
            }
        }
        let datagrams = self.sender.transmit(&message);
        self.counts.messages_sent += 1;
        self.counts.datagrams_sent += datagrams.len() as u64;
        datagrams
    }

    /// Processes one received datagram: netchan, then decoding and the pattern check.
    pub fn receive(&mut self, datagram: &[u8]) -> Outcome {
        self.counts.datagrams_received += 1;
        let delivered = match self.receiver.process(datagram) {
            Processed::Message(d) => d,
            Processed::Fragment => return Outcome::Fragment,
            Processed::Dropped(reason) => {
                self.counts.count_drop(reason);
                return Outcome::Dropped(reason);
            }
        };
        self.counts.messages_received += 1;
        let mut message = delivered.message;
        let start = match self.role {
            Role::Client => xor::SERVER_MESSAGE_START,
            Role::Server => xor::CLIENT_MESSAGE_START,
        };
        if self.dialect.xor_encoded() {
            self.decode(&mut message, delivered.sequence);
        }
        match check_body(
            message.get(start..).unwrap_or(&[]),
            message.len(),
            self.peer(),
        ) {
            Some((counter, number, command)) => {
                if number > self.peer_command_seq {
                    self.peer_command_seq = number;
                    let slot = self.slot(number);
                    self.peer_commands[slot] = command;
                }
                self.counts.decoded_ok += 1;
                Outcome::Decoded(counter)
            }
            None => {
                self.counts.decoded_bad += 1;
                Outcome::Garbled
            }
        }
    }

    /// The peer's role.
    fn peer(&self) -> Role {
        match self.role {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        }
    }

    /// Undoes the peer's XOR with this end's own command the message acknowledges.
    fn decode(&self, message: &mut [u8], sequence: u32) {
        match self.role {
            Role::Client => {
                let ack = xor::server_message_ack(message).unwrap_or(0);
                let command = &self.own_commands[self.slot(ack)];
                xor::xor_server_message(message, self.challenge, sequence, command);
            }
            Role::Server => {
                let ack = ClientLongs::read(message).map_or(0, |l| l.reliable_acknowledge);
                let command = &self.own_commands[self.slot(ack)];
                xor::xor_client_message(message, self.challenge, command);
            }
        }
    }
}

/// Appends the body of message `counter` carrying command `number`, filling up to
/// [`message_len`].
fn write_body(message: &mut Vec<u8>, counter: u32, number: u32, command: &[u8]) {
    message.extend_from_slice(&counter.to_le_bytes());
    message.extend_from_slice(&number.to_le_bytes());
    message.extend_from_slice(command);
    message.push(0);
    let end = message_len(counter).max(message.len());
    let start = message.len();
    message.extend((start..end).map(|j| filler(counter, j)));
}

/// Checks a decoded body (the message minus its leading longs; `total` is the whole message's
/// length) sent by `sender`: its counter, command number and command text when it matches.
fn check_body(body: &[u8], total: usize, sender: Role) -> Option<(u32, u32, Vec<u8>)> {
    let long = |i: usize| Some(u32::from_le_bytes(body.get(i..i + 4)?.try_into().ok()?));
    let (counter, number) = (long(0)?, long(4)?);
    let command = command_text(sender, number);
    let after = 8 + command.len();
    if counter == 0
        || total != message_len(counter)
        || body.get(8..after)? != command.as_slice()
        || body.get(after) != Some(&0)
    {
        return None;
    }
    let offset = total - body.len();
    let filler_ok = body[after + 1..]
        .iter()
        .enumerate()
        .all(|(k, &b)| b == filler(counter, offset + after + 1 + k));
    filler_ok.then_some((counter, number, command))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_cover_the_fragment_edges() {
        let lens: Vec<usize> = (1..=40).map(message_len).collect();
        assert!(lens.contains(&FRAGMENT_SIZE));
        assert!(lens.contains(&(2 * FRAGMENT_SIZE)));
        assert!(lens.contains(&(FRAGMENT_SIZE - 1)));
        assert!(lens.iter().any(|&l| l > 2 * FRAGMENT_SIZE));
        assert!(lens.iter().all(|&l| l >= 100));
    }
}
