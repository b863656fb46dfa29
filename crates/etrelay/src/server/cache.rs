//! The query cache: `getinfo`/`getstatus` answered from the server's last answer.
//!
//! Behind the relay every client reaches the game server from one source IP, and ioquake3 (and
//! ET: Legacy with `sv_protect`) answer one IP about once a second after a burst of 10: without
//! a cache, browsers and masters would starve each other. So the relay asks the server itself,
//! on its own socket, and answers every asker from that answer for `max_age`, writing the
//! asker's own `challenge` into it (or none, when the asker sent none).
//!
//! While a refresh is on its way, askers wait for it (at most [`MAX_WAITERS`] per kind; they
//! are answered as soon as it arrives, or not at all if the server stays silent for
//! [`REFRESH_TIMEOUT`], as the server itself would leave them). Refreshes of both kinds share
//! one budget of [`REFRESH_BURST`] then one per [`REFRESH_INTERVAL`], kept under the servers'
//! own per-IP limit so the relay never trips it; when the budget is spent, the last answer is
//! served even if older than `max_age`.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use guard::limiter::{Rule, TokenBucket};
use rand::Rng;
use tokio::net::UdpSocket;
use tracing::{debug, trace};

use super::metrics::ServerMetrics;
use crate::et::classify::{MAX_CHALLENGE, Query};
use crate::et::info::{INFO_RESPONSE, STATUS_RESPONSE, Template};

/// Askers waiting for one refresh, per kind.
pub const MAX_WAITERS: usize = 256;
/// How long a refresh may take before its askers are given up.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(1);
/// Refreshes the relay may send at once…
pub const REFRESH_BURST: u32 = 5;
/// …then one per this interval (both kinds together).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
const NONCE_LEN: usize = 10;

/// One asker waiting for a refresh.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    to: SocketAddr,
    challenge: [u8; MAX_CHALLENGE],
    /// Length of `challenge`; `None` when the asker sent none.
    len: Option<u8>,
}

#[derive(Debug, Default)]
struct Kind {
    /// The last answer and when it came.
    answer: Option<(Template, Instant)>,
    /// The refresh on its way: its challenge and when it left.
    pending: Option<([u8; NONCE_LEN], Instant)>,
    waiters: Vec<Waiter>,
}

/// What to do with a query.
#[derive(Debug)]
pub enum Outcome {
    /// Send the answer rendered in the scratch buffer now.
    Answer,
    /// The asker waits for the refresh.
    Waiting,
    /// Nothing to answer with and no way to ask: drop.
    Busy,
}

/// The cache of one server, with its own socket connected to the game server.
#[derive(Debug)]
pub struct QueryCache {
    upstream: SocketAddr,
    socket: UdpSocket,
    max_age: Duration,
    kinds: [Kind; 2],
    budget: TokenBucket,
    budget_state: Instant,
    recv_buf: Vec<u8>,
}

fn idx(q: Query) -> usize {
    match q {
        Query::Info => 0,
        Query::Status => 1,
    }
}

impl QueryCache {
    /// A cache asking the game server at `upstream`, serving answers up to `max_age` old.
    ///
    /// # Errors
    /// The socket could not be opened.
    pub fn new(upstream: SocketAddr, max_age: Duration, max_packet: usize) -> io::Result<Self> {
        let now = Instant::now();
        Ok(QueryCache {
            upstream,
            socket: crate::net::upstream_socket(upstream)?,
            max_age,
            kinds: [Kind::default(), Kind::default()].map(|mut k| {
                k.waiters.reserve_exact(MAX_WAITERS);
                k
            }),
            budget: TokenBucket::new(REFRESH_BURST, REFRESH_INTERVAL),
            budget_state: now,
            recv_buf: vec![0; max_packet.max(1)],
        })
    }

    /// The socket answers arrive on.
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Handles one query. On [`Outcome::Answer`] the answer is in `out`.
    pub fn query(
        &mut self,
        q: Query,
        challenge: Option<&[u8]>,
        from: SocketAddr,
        now: Instant,
        out: &mut Vec<u8>,
        metrics: &ServerMetrics,
    ) -> Outcome {
        let kind = &mut self.kinds[idx(q)];
        if let Some((t, at)) = &kind.answer
            && now.saturating_duration_since(*at) <= self.max_age
        {
            t.render(challenge, out);
            return Outcome::Answer;
        }
        if kind.pending.is_none() {
            if self.budget.check(&mut self.budget_state, now) {
                let nonce = nonce();
                let mut pkt = [0u8; 4 + 16 + NONCE_LEN];
                let head: &[u8] = match q {
                    Query::Info => b"\xff\xff\xff\xffgetinfo ",
                    Query::Status => b"\xff\xff\xff\xffgetstatus ",
                };
                pkt[..head.len()].copy_from_slice(head);
                pkt[head.len()..head.len() + NONCE_LEN].copy_from_slice(&nonce);
                match self.socket.try_send(&pkt[..head.len() + NONCE_LEN]) {
                    Ok(n) => {
                        metrics.cache_refreshes.inc();
                        metrics.upstream_packets.inc();
                        metrics.upstream_bytes.add(n as u64);
                        kind.pending = Some((nonce, now));
                    }
                    Err(e) => trace!(error = %e, "cache refresh send"),
                }
            } else if let Some((t, _)) = &kind.answer {
                t.render(challenge, out);
                return Outcome::Answer;
            }
        }
        if kind.pending.is_none() || kind.waiters.len() >= MAX_WAITERS {
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
        kind.waiters.push(w);
        Outcome::Waiting
    }

    /// Reads what the game server sent to the cache socket and answers the waiters through
    /// `send` (packet, destination).
    pub fn on_readable(
        &mut self,
        now: Instant,
        out: &mut Vec<u8>,
        metrics: &ServerMetrics,
        mut send: impl FnMut(&[u8], SocketAddr),
    ) {
        let mut read = 0;
        while read < 64 {
            let n = match self.socket.try_recv(&mut self.recv_buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    trace!(error = %e, "cache receive");
                    read += 1;
                    continue;
                }
            };
            read += 1;
            metrics.server_packets.inc();
            metrics.server_bytes.add(n as u64);
            let data = &self.recv_buf[..n];
            let parsed = Template::parse(data, INFO_RESPONSE)
                .map(|t| (Query::Info, t))
                .or_else(|| Template::parse(data, STATUS_RESPONSE).map(|t| (Query::Status, t)));
            let Some((q, (template, echoed))) = parsed else {
                continue;
            };
            let kind = &mut self.kinds[idx(q)];
            let Some((nonce, _)) = kind.pending else {
                continue;
            };
            if echoed.as_deref() != Some(&nonce[..]) {
                continue;
            }
            kind.pending = None;
            metrics.cache_refresh_answers.inc();
            debug!(
                "cache: {} refreshed ({} B)",
                if q == Query::Info {
                    "infoResponse"
                } else {
                    "statusResponse"
                },
                data.len()
            );
            for w in kind.waiters.drain(..) {
                template.render(w.len.map(|l| &w.challenge[..l as usize]), out);
                send(out, w.to);
            }
            kind.answer = Some((template, now));
        }
    }

    /// Gives up refreshes the server did not answer in time. Returns the askers dropped.
    ///
    /// The socket is then opened again: a socket connected before the route to the game server
    /// existed (a tunnel that came up later) keeps a source address the server cannot answer.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        let mut gave_up = false;
        for kind in &mut self.kinds {
            if let Some((_, sent)) = kind.pending
                && now.saturating_duration_since(sent) >= REFRESH_TIMEOUT
            {
                kind.pending = None;
                gave_up = true;
                dropped += kind.waiters.len();
                kind.waiters.clear();
            }
        }
        if gave_up {
            match crate::net::upstream_socket(self.upstream) {
                Ok(s) => self.socket = s,
                Err(e) => debug!("cache: cannot reopen its socket: {e}"),
            }
        }
        dropped
    }
}

fn nonce() -> [u8; NONCE_LEN] {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    std::array::from_fn(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
}
