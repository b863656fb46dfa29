//! A session's side of the challenge exchange: the client's `connect` waiting for the game
//! server's own challenge, and the translation of every packet that depends on it afterwards.
//!
//! The relay loop ([`super::relay`]) answers `getchallenge` with the relay's challenge C and
//! checks it in the client's `connect`; it then keeps that `connect` here
//! ([`Handshake::wait`]) and asks the server for a challenge from the session's own socket. The
//! session's task hands every connectionless answer of the server to [`Handshake::on_server`]:
//! - the server's `challengeResponse` with its challenge S: the kept `connect` is rewritten
//!   with S and sent (the client never sees S);
//! - `connectResponse`: the client is in; ioquake3's echo of S becomes C, and from now on
//!   [`Translator`] rewrites what depends on the challenge in each in-game packet, both ways
//!   ([`crate::et::netchan`]);
//! - anything else (a refusal's `print`) goes to the client as it is.
//!
//! A `connect` sent again before the server answered (the client retries every 3 s) replaces
//! the kept one and reuses S when the server gave one, so only the first costs a challenge of
//! the server's. A new handshake on an established session (a client that reconnects) asks
//! for a new S: the server's is spent once it answered `connect`.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use guard::limiter::{Rule, TokenBucket};

use crate::clock::StdInstant;
use crate::et::challenge::{Dialect, read_offer};
use crate::et::netchan::{Scheme, Translation, Untranslatable};

/// `connect`s a session may send at once…
pub(super) const CONNECT_BURST: u32 = 4;
/// …then one per this interval (a real client retries every 3 s).
pub(super) const CONNECT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The server's challenge is asked for again when it has not come after this long (the
/// server's own limit may have dropped the ask).
pub(super) const ASK_AGAIN_MS: u64 = 1_000;
/// Largest `connect` kept (real ones are under 1 400 bytes).
const MAX_CONNECT: usize = 2_048;

/// What a session does with a `connect` the relay checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Ask the server for a challenge (the ask's number is given, ioquake3's echo).
    Ask(i32),
    /// The server's challenge is here: send the rewritten `connect` now.
    Send(i32),
    /// An ask is on its way: wait for it.
    Wait,
}

/// What to do with a connectionless packet of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// Send the kept `connect`, rewritten with the server's challenge, to the server; nothing
    /// to the client.
    Connect(Offered),
    /// The server's `connectResponse`: send the client this rewritten one (`Some`: ioquake3's
    /// echo, the client's challenge to write), the translation now in force.
    Connected(Option<i32>),
    /// Relay it to the client as it is.
    Relay,
    /// Drop it (an answer to an ask the session no longer waits for).
    Drop,
}

/// The server's answer to the relay's ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offered {
    /// The server's challenge.
    pub(super) challenge: i32,
    /// The number after it (ET: Legacy's `sv_onlyVisibleClients` when `et`).
    pub(super) second: i32,
    /// ioquake3's own protocol, after that.
    pub(super) third: Option<i64>,
    /// An ET server's answer.
    pub(super) et: bool,
}

/// The state of one session's exchange; behind the session's lock, touched only by handshakes.
#[derive(Debug, Default)]
pub(super) struct Handshake {
    /// The last checked `connect` of the client, while it waits.
    connect: Vec<u8>,
    waiting: bool,
    /// The relay's challenge the waiting client holds, and the protocol it announced.
    client: i32,
    protocol: i64,
    dialect: Option<Dialect>,
    /// The number of the relay's last ask, and when it went (session milliseconds).
    asked: Option<(i32, u64)>,
    /// The server's challenge for this session, once given.
    server: Option<i32>,
    /// The session's connect bucket (when full again).
    bucket: Option<StdInstant>,
}

impl Handshake {
    /// Charges one `connect` to the session's bucket at `now`; false past it.
    pub(super) fn allow(&mut self, now: StdInstant) -> bool {
        let rule = TokenBucket::new(CONNECT_BURST, CONNECT_INTERVAL);
        let state = self.bucket.get_or_insert_with(|| rule.fresh(now));
        rule.check(state, now)
    }

    /// Keeps `packet`, a `connect` checked to hold the relay's `client` challenge, announcing
    /// `protocol`, to the server of `dialect`, at `now_ms`; says what comes next.
    pub(super) fn wait(
        &mut self,
        packet: &[u8],
        client: i32,
        protocol: i64,
        dialect: Dialect,
        now_ms: u64,
    ) -> Next {
        self.connect.clear();
        self.connect
            .extend_from_slice(&packet[..packet.len().min(MAX_CONNECT)]);
        self.waiting = true;
        self.client = client;
        self.protocol = protocol;
        self.dialect = Some(dialect);
        if let Some(s) = self.server {
            return Next::Send(s);
        }
        match self.asked {
            Some((_, at)) if now_ms.saturating_sub(at) < ASK_AGAIN_MS => Next::Wait,
            _ => {
                let number = rand::random::<i32>() & 0x7fff_ffff;
                self.asked = Some((number, now_ms));
                Next::Ask(number)
            }
        }
    }

    /// The ask the relay made could not go (the join gate refused it): the next `connect`
    /// asks again.
    pub(super) fn forget_ask(&mut self) {
        self.asked = None;
    }

    /// The kept `connect`.
    pub(super) fn kept(&self) -> &[u8] {
        &self.connect
    }

    /// A connectionless `packet` of the server, whose `infoResponse` says `info_protocol`;
    /// `translator` gets the translation when the client is in (its scheme chosen then, from
    /// what the server said by that time: [`Scheme::for_client`]).
    pub(super) fn on_server(
        &mut self,
        packet: &[u8],
        translator: &Translator,
        info_protocol: Option<i64>,
    ) -> Answer {
        let body = &packet[4..];
        if body.starts_with(b"challengeResponse") {
            let (Some(offer), Some((number, _))) = (read_offer(packet), self.asked) else {
                return Answer::Relay;
            };
            if self.dialect == Some(Dialect::Ioq3) && offer.second != number {
                // Not the answer to the relay's ask.
                return Answer::Drop;
            }
            self.server = Some(offer.challenge);
            return if self.waiting {
                Answer::Connect(Offered {
                    challenge: offer.challenge,
                    second: offer.second,
                    third: offer.third,
                    et: self.dialect == Some(Dialect::Et),
                })
            } else {
                Answer::Drop
            };
        }
        if body.starts_with(b"connectResponse") && self.waiting {
            let Some(server) = self.server else {
                return Answer::Relay;
            };
            let Some(dialect) = self.dialect else {
                return Answer::Relay;
            };
            translator.set(Translation {
                scheme: Scheme::for_client(dialect, info_protocol, self.protocol),
                client: self.client,
                server,
            });
            // Spent: a later handshake asks for a new one.
            self.waiting = false;
            self.server = None;
            self.asked = None;
            let echo = (self.dialect == Some(Dialect::Ioq3)).then_some(self.client);
            return Answer::Connected(echo);
        }
        Answer::Relay
    }
}

/// The translation in force on a session, read by every in-game packet without a lock: the
/// two challenges packed in one word (the client's in the high half) and the scheme (0: none).
#[derive(Debug, Default)]
pub(super) struct Translator {
    challenges: AtomicU64,
    scheme: AtomicU8,
    /// The client's last in-game sequence number (checked packets only).
    last_sequence: AtomicU32,
}

impl Translator {
    /// Puts `t` in force.
    pub(super) fn set(&self, t: Translation) {
        let packed = u64::from(t.client as u32) << 32 | u64::from(t.server as u32);
        self.challenges.store(packed, Ordering::Release);
        let scheme = match t.scheme {
            Scheme::Checksum => 1,
            Scheme::Xor => 2,
        };
        self.scheme.store(scheme, Ordering::Release);
    }

    /// The translation in force, if any.
    pub(super) fn get(&self) -> Option<Translation> {
        let scheme = match self.scheme.load(Ordering::Acquire) {
            1 => Scheme::Checksum,
            2 => Scheme::Xor,
            _ => return None,
        };
        let packed = self.challenges.load(Ordering::Acquire);
        Some(Translation {
            scheme,
            client: (packed >> 32) as u32 as i32,
            server: packed as u32 as i32,
        })
    }

    /// A client's in-game packet, rewritten for the server (nothing to do without a
    /// translation).
    ///
    /// # Errors
    /// [`Untranslatable`]: short, or a checksum of another challenge (not the client's).
    pub(super) fn to_server(&self, packet: &mut [u8]) -> Result<(), Untranslatable> {
        let Some(t) = self.get() else {
            return Ok(());
        };
        t.to_server(packet)?;
        if let Some(seq) = packet.get(..4) {
            let seq = u32::from_le_bytes([seq[0], seq[1], seq[2], seq[3]]) & !(1 << 31);
            self.last_sequence.fetch_max(seq, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A server's in-game packet, rewritten for the client.
    pub(super) fn to_client(&self, packet: &mut [u8]) {
        if let Some(t) = self.get() {
            // A packet too short for a header is relayed as it is: the client drops it.
            let _ = t.to_client(packet);
        }
    }

    /// Whether `packet`, from a new source port, proves it comes from the session's client:
    /// a checksum of the client's challenge and a sequence past the last one seen.
    pub(super) fn proves_client(&self, packet: &[u8]) -> bool {
        self.get()
            .and_then(|t| t.proven_sequence(packet))
            .is_some_and(|seq| seq > self.last_sequence.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests;
