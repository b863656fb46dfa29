//! The query cache: `getinfo`/`getstatus` answered from the server's last answer.
//!
//! Behind the relay every client reaches the game server from one source IP, and ioquake3 (and
//! ET: Legacy with `sv_protect`) answer one IP about once a second after a burst of 10: without
//! a cache, browsers and masters would starve each other. So the relay asks the server itself,
//! on a socket of its own, and answers every asker from that answer for `max_age`, writing the
//! asker's own `challenge` into it (or none, when the asker sent none).
//!
//! While a refresh is on its way, askers wait for it (at most [`MAX_WAITERS`] per kind; they
//! are answered as soon as it arrives, or not at all if the server stays silent for
//! [`REFRESH_TIMEOUT`], as the server itself would leave them). Refreshes of both kinds share
//! one budget of [`REFRESH_BURST`] then one per [`REFRESH_INTERVAL`], kept under the servers'
//! own per-IP limit so the relay never trips it; when the budget is spent, the last answer is
//! served even if older than `max_age`.
//!
//! [`QueryCache`] is a state machine without I/O: it takes `now` and says what to send. The
//! relay loop owns the cache's socket: it sends the refreshes [`QueryCache::query`] asks for,
//! hands what arrives to [`QueryCache::on_answer`] and sends the answers it gives back, and
//! calls [`QueryCache::expire`] on its tick.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use guard::limiter::{Rule, TokenBucket};
use rand::Rng;

use crate::clock::{Instant, StdInstant};
use crate::et::classify::{MAX_CHALLENGE, Query};
use crate::et::info::Template;

/// Askers waiting for one refresh, per kind.
pub(super) const MAX_WAITERS: usize = 256;
/// How long a refresh may take before its askers are given up.
pub(super) const REFRESH_TIMEOUT: Duration = Duration::from_secs(1);
/// Refreshes the relay may send at once…
pub(super) const REFRESH_BURST: u32 = 5;
/// …then one per this interval (both kinds together): under ioquake3's limit of one request
/// a second from the relay's address, at least half of it is left to joins.
pub(super) const REFRESH_INTERVAL: Duration = Duration::from_secs(2);
/// Characters of a refresh's challenge.
const NONCE_LEN: usize = 10;

/// One asker waiting for a refresh.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    to: SocketAddr,
    challenge: [u8; MAX_CHALLENGE],
    /// Length of `challenge`; `None` when the asker sent none.
    len: Option<u8>,
}

/// The cache of one kind of query.
#[derive(Debug, Default)]
struct Kind {
    /// The last answer and when it came.
    answer: Option<(Template, Instant)>,
    /// The refresh on its way: its challenge and when it left.
    pending: Option<([u8; NONCE_LEN], Instant)>,
    /// Askers waiting for the refresh on its way (empty when none is).
    waiters: VecDeque<Waiter>,
}

/// What to do with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Send the answer written in `out` to the asker now.
    Answer,
    /// Send the refresh written in `out` to the game server; the asker waits for its answer.
    /// If it cannot be sent, say so with [`QueryCache::unsent`] (the asker is then dropped).
    Refresh,
    /// The asker waits for the refresh already on its way.
    Waiting,
    /// Nothing to answer with and no way to ask: drop.
    Busy,
}

/// The query cache of one server. No I/O: see the module docs.
#[derive(Debug)]
pub(super) struct QueryCache {
    max_age: Duration,
    kinds: [Kind; 2],
    budget: TokenBucket,
    /// The refresh budget's state (on the clock `guard` takes).
    budget_state: StdInstant,
}

fn idx(q: Query) -> usize {
    match q {
        Query::Info => 0,
        Query::Status => 1,
    }
}

impl QueryCache {
    /// A cache serving answers up to `max_age` old, with its full refresh budget at `now`.
    pub(super) fn new(max_age: Duration, now: Instant) -> Self {
        QueryCache {
            max_age,
            kinds: [Kind::default(), Kind::default()].map(|mut k| {
                k.waiters.reserve_exact(MAX_WAITERS);
                k
            }),
            budget: TokenBucket::new(REFRESH_BURST, REFRESH_INTERVAL),
            budget_state: now.into_std(),
        }
    }

    /// Handles one query of `from` (its challenge, if it sent one) at `now`. On
    /// [`Outcome::Answer`] and [`Outcome::Refresh`] the packet to send is in `out`.
    #[cfg(test)]
    pub(super) fn query(
        &mut self,
        q: Query,
        challenge: Option<&[u8]>,
        from: SocketAddr,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Outcome {
        self.query_paced(q, challenge, from, now, out, true)
    }

    /// [`QueryCache::query`], with the relay's pace towards the game server: a refresh is only
    /// asked for when `may_refresh` (the caller then takes the pace's token) and the cache's
    /// own budget allows it.
    pub(super) fn query_paced(
        &mut self,
        q: Query,
        challenge: Option<&[u8]>,
        from: SocketAddr,
        now: Instant,
        out: &mut Vec<u8>,
        may_refresh: bool,
    ) -> Outcome {
        let kind = &mut self.kinds[idx(q)];
        if let Some((t, at)) = &kind.answer
            && now.saturating_duration_since(*at) <= self.max_age
        {
            t.render(challenge, out);
            return Outcome::Answer;
        }
        let mut outcome = Outcome::Waiting;
        if kind.pending.is_none() {
            if may_refresh && self.budget.check(&mut self.budget_state, now.into_std()) {
                let nonce = nonce();
                out.clear();
                out.extend_from_slice(q.request());
                out.extend_from_slice(&nonce);
                kind.pending = Some((nonce, now));
                outcome = Outcome::Refresh;
            } else if let Some((t, _)) = &kind.answer {
                t.render(challenge, out);
                return Outcome::Answer;
            } else {
                return Outcome::Busy;
            }
        }
        if kind.waiters.len() >= MAX_WAITERS {
            return Outcome::Busy;
        }
        let mut w = Waiter {
            to: from,
            challenge: [0; MAX_CHALLENGE],
            len: None,
        };
        if let Some(c) = challenge {
            // The classifier caps challenges at MAX_CHALLENGE bytes.
            let n = c.len().min(MAX_CHALLENGE);
            w.challenge[..n].copy_from_slice(&c[..n]);
            w.len = Some(n as u8);
        }
        kind.waiters.push_back(w);
        outcome
    }

    /// The refresh of `q` that [`QueryCache::query`] asked for could not be sent: it is
    /// forgotten with its asker, and the next query may ask again.
    pub(super) fn unsent(&mut self, q: Query) {
        let kind = &mut self.kinds[idx(q)];
        kind.pending = None;
        kind.waiters.clear();
    }

    /// Takes a datagram the game server sent to the cache's socket at `now`. When it is the
    /// answer a refresh waits for, it becomes the cached answer and its waiters are to be
    /// answered: [`Refreshed::next`] gives each one's packet. Anything else is ignored.
    pub(super) fn on_answer(&mut self, packet: &[u8], now: Instant) -> Option<Refreshed<'_>> {
        let (query, (template, echoed)) = [Query::Info, Query::Status]
            .into_iter()
            .find_map(|q| Template::parse(packet, q.answer_header()).map(|t| (q, t)))?;
        let kind = &mut self.kinds[idx(query)];
        let (nonce, _) = kind.pending?;
        if echoed.as_deref() != Some(&nonce[..]) {
            return None;
        }
        kind.pending = None;
        kind.answer = Some((template, now));
        Some(Refreshed { kind, query })
    }

    /// Gives up the refreshes the server did not answer within [`REFRESH_TIMEOUT`] of `now`,
    /// with their askers. Returns `None` when none was given up, else the askers dropped: the
    /// cache's socket should then be opened again (one connected before the route to the game
    /// server existed, a tunnel that came up later, keeps a source address the server cannot
    /// answer).
    pub(super) fn expire(&mut self, now: Instant) -> Option<usize> {
        let mut dropped = None;
        for kind in &mut self.kinds {
            if let Some((_, sent)) = kind.pending
                && now.saturating_duration_since(sent) >= REFRESH_TIMEOUT
            {
                kind.pending = None;
                *dropped.get_or_insert(0) += kind.waiters.len();
                kind.waiters.clear();
            }
        }
        dropped
    }
}

/// The waiters of a refresh that was just answered, to be answered in turn.
#[derive(Debug)]
pub(super) struct Refreshed<'a> {
    kind: &'a mut Kind,
    query: Query,
}

impl Refreshed<'_> {
    /// Which query was refreshed.
    pub(super) fn query(&self) -> Query {
        self.query
    }

    /// Writes the next waiter's answer (with its own challenge) into `out` and returns where to
    /// send it; `None` once every waiter is answered.
    pub(super) fn next(&mut self, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let (template, _) = self.kind.answer.as_ref()?;
        let w = self.kind.waiters.pop_front()?;
        template.render(w.len.map(|l| &w.challenge[..usize::from(l)]), out);
        Some(w.to)
    }
}

impl Drop for Refreshed<'_> {
    /// Waiters left unanswered are dropped with the refresh they waited for.
    fn drop(&mut self) {
        self.kind.waiters.clear();
    }
}

fn nonce() -> [u8; NONCE_LEN] {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    std::array::from_fn(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
}

#[cfg(test)]
mod tests;
