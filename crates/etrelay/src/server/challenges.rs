//! The relay's challenges in the relay loop: `getchallenge` answered in the game server's stead,
//! a `connect` checked against the answer, a query's challenge recognised as one the relay gave.
//! No I/O: the relay loop sends what is written here.
//!
//! While the game server's protocol is one the relay translates ([`Dialect`]: ioquake3's 71,
//! ET's 82 to 84; taken from `--game` until the server's own `infoResponse` says), every
//! `getchallenge` gets the relay's challenge ([`super::cookie`]) at once, from the public
//! socket, and nothing goes to the game server: a spoofed flood costs one small answer per
//! packet and no session, no table slot, none of the server's own per-address budget. Only a
//! `connect` holding the relay's challenge for its address (a client that got the answer) goes
//! on, to its session ([`super::handshake`]). The answers are bounded: at most
//! [`PER_ADDRESS_BURST`] at once and one per [`PER_ADDRESS_INTERVAL`] to one address (a spoofer
//! aiming the relay at one victim), and `--challenge-answers` a second in all.
//!
//! A server reporting another protocol gets today's exchange back: `getchallenge` through the
//! fair join gate to the server, its own challenge to the client, nothing translated; the
//! relay says so once in its log.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, Rule, TokenBucket};
use tracing::{info, warn};

use super::cookie::Cookies;
use super::metrics::DropReason;
use super::sweep::SWEEP_PARTS;
use crate::clock::{Instant, StdInstant};
use crate::config::Game;
use crate::et::challenge::{Dialect, Facts, read_ask, write_answer};
use crate::et::connect::{Connect, ConnectError, Reader, atoi};

/// Answers to one address at once…
pub(super) const PER_ADDRESS_BURST: u32 = 32;
/// …then one per this interval (20 a second).
pub(super) const PER_ADDRESS_INTERVAL: Duration = Duration::from_millis(50);
/// Addresses the per-address bound remembers; past it (a flood of spoofed addresses), an
/// address not remembered is answered within the bound in all.
const MAX_ADDRESSES: usize = 65_536;
/// An address at rest this long is forgotten.
const FORGET: Duration = Duration::from_secs(10);
/// Shortest gap between two sweeps forced by a full table.
const SWEEP_GAP: Duration = Duration::from_millis(200);

/// What became of a `connect`.
#[derive(Debug)]
pub(super) enum Checked {
    /// It holds the relay's challenge for its address.
    Ours(Connect),
    /// It holds another challenge: forged, too old, or one the game server gave before the
    /// relay answered in its stead (the client then asks again).
    Other,
}

/// The relay's challenges of one server.
#[derive(Debug)]
pub(super) struct Challenges {
    cookies: Cookies,
    /// The server's protocol as the relay knows it, and what else it said.
    facts: Facts,
    /// `None`: the server gives its own challenges.
    dialect: Option<Dialect>,
    /// `--server-challenges`: never answer in the server's stead.
    off: bool,
    per_address: KeyedLimiter<IpAddr, TokenBucket>,
    all: TokenBucket,
    all_state: StdInstant,
    reader: Reader,
}

impl Challenges {
    /// The challenges of a server of `game` (its protocol assumed until it says), started at
    /// `now`, answering at most `per_second` `getchallenge` a second in all; `off` keeps the
    /// server's own.
    pub(super) fn new(game: Game, per_second: u32, off: bool, now: Instant) -> Self {
        let protocol = match game {
            Game::Q3 => 71,
            Game::Et => 84,
        };
        let facts = Facts {
            protocol: Some(protocol),
            ..Facts::default()
        };
        let per_second = per_second.max(1);
        let all = TokenBucket::new(
            per_second.div_ceil(10).max(1),
            Duration::from_secs(1) / per_second,
        );
        Challenges {
            cookies: Cookies::new(now),
            dialect: (!off).then(|| Dialect::of_protocol(protocol)).flatten(),
            facts,
            off,
            per_address: KeyedLimiter::new(
                TokenBucket::new(PER_ADDRESS_BURST, PER_ADDRESS_INTERVAL),
                Limits {
                    max_keys: MAX_ADDRESSES,
                    forget: FORGET,
                    sweep_gap: SWEEP_GAP,
                },
            ),
            all_state: all.fresh(now.into_std()),
            all,
            reader: Reader::default(),
        }
    }

    /// The dialect the relay answers in; `None` while the server gives its own challenges.
    pub(super) fn dialect(&self) -> Option<Dialect> {
        self.dialect
    }

    /// What the server says of itself now; logs when the relay starts or stops answering
    /// in its stead, or when a protocol is one it cannot translate.
    pub(super) fn learn(&mut self, facts: &Facts, server: &str) {
        if *facts == self.facts {
            return;
        }
        let before = self.dialect;
        if facts.protocol.is_some() {
            self.facts.protocol = facts.protocol;
        }
        if facts.gamename.is_some() {
            self.facts.gamename.clone_from(&facts.gamename);
        }
        if facts.only_visible.is_some() {
            self.facts.only_visible = facts.only_visible;
        }
        if facts.modern.is_some() {
            self.facts.modern = facts.modern;
        }
        let protocol = self.facts.protocol.unwrap_or(0);
        self.dialect = (!self.off)
            .then(|| Dialect::of_protocol(protocol))
            .flatten();
        match (before, self.dialect) {
            (Some(_), None) if !self.off => warn!(
                public = %server,
                protocol,
                "the game server speaks a protocol whose challenges the relay cannot \
                 translate: getchallenge goes to the game server, as with --server-challenges"
            ),
            (None, Some(_)) => info!(
                public = %server,
                protocol,
                "the game server speaks a protocol the relay translates: it answers \
                 getchallenge itself"
            ),
            _ => {}
        }
    }

    /// The facts the relay holds now.
    pub(super) fn facts(&self) -> &Facts {
        &self.facts
    }

    /// The answer to the `getchallenge` in `packet` from `src` at `now`, written into `out`.
    ///
    /// # Errors
    /// [`DropReason::ChallengeLimit`]: over the answers to `src`'s address or to everyone.
    pub(super) fn answer(
        &mut self,
        src: SocketAddr,
        packet: &[u8],
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Result<(), DropReason> {
        let Some(dialect) = self.dialect else {
            return Err(DropReason::ChallengeLimit);
        };
        let std_now = now.into_std();
        // A table full of spoofed addresses does not refuse an address it does not hold.
        if self.per_address.check(&src.ip(), std_now) == Ok(false) {
            return Err(DropReason::ChallengeLimit);
        }
        if !self.all.check(&mut self.all_state, std_now) {
            return Err(DropReason::ChallengeLimit);
        }
        let ask = read_ask(packet);
        write_answer(
            dialect,
            &self.facts,
            &ask,
            self.cookies.issue(src, now),
            out,
        );
        Ok(())
    }

    /// The `connect` in `packet` from `src` at `now`, read, and whether it holds the relay's
    /// challenge.
    ///
    /// # Errors
    /// [`ConnectError`]: not a readable connect.
    pub(super) fn check(
        &mut self,
        src: SocketAddr,
        packet: &[u8],
        now: Instant,
    ) -> Result<Checked, ConnectError> {
        let c = self.reader.read(packet)?;
        Ok(if self.cookies.check(src, c.challenge, now) {
            Checked::Ours(c)
        } else {
            Checked::Other
        })
    }

    /// Writes into `out` the `connect` last checked, with the server's `challenge`.
    ///
    /// # Errors
    /// [`ConnectError::TooLong`]: the rewritten line would be longer than a server reads.
    pub(super) fn rewrite(
        &mut self,
        connect: &Connect,
        challenge: i32,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnectError> {
        self.reader.rewrite(connect, challenge, out)
    }

    /// Whether a query's `challenge` is the relay's own for `src` at `now`: `src` got the
    /// relay's answer, so it is no spoofed address (an etmaster-style master, or an ET: Legacy
    /// client that asks `getinfo` with its challenge before it connects).
    pub(super) fn is_ours(&self, src: SocketAddr, challenge: &[u8], now: Instant) -> bool {
        self.dialect.is_some()
            && challenge.iter().all(u8::is_ascii_digit)
            && self.cookies.check(src, atoi(challenge) as i32, now)
    }

    /// Forgets addresses at rest, a part per tick.
    pub(super) fn sweep(&mut self, now: Instant) {
        if !self.per_address.is_empty() {
            self.per_address.sweep_part(now.into_std(), SWEEP_PARTS);
        }
    }
}

#[cfg(test)]
mod tests;
