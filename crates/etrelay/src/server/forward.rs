//! A session's task: the game server's answers → public socket → client, and what the relay
//! loop had to queue (the upstream socket's buffer was full) → game server.
//!
//! [`open`] gives a new session its own upstream socket (an ephemeral port connected to the
//! game server: how the server tells clients apart) and starts its task. The relay loop sends
//! client packets on that socket itself, batched, while it can ([`Session::send_queued`]); the
//! task sends what is left when the socket's buffer was full, trying again after
//! [`FULL_RETRY`], doubling while nothing goes out, and sends the server's answers back
//! **through the public socket** meanwhile, so they come from the public port. The socket is
//! registered for reading only ([`ReadSocket`]): registered for writing too, it would wake the
//! relay after every datagram sent on it. It has no receive buffer of its own: when the
//! upstream socket is readable it reads into the server's one buffer and sends on without
//! waiting (a full socket buffer drops the answer). The first `connectResponse` or in-game packet from the server
//! makes the session established; any other answer marks it answered. It ends after its idle
//! timeout without a packet either way (a deadline on tokio's timer, moved on by every packet;
//! short while half-open), when its server stops, or at once when it is cut (a ban, recycling,
//! a cap at promotion). It then removes itself from the table and gives its slot back.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use guard::admission::Permit;
use tokio::time::Sleep;
use tracing::{Instrument as _, debug, trace, warn};

use super::handshake::Answer;
use super::metrics::DropReason;
use super::session::{Flushed, Phase, Refused, Session};
use super::shared::Shared;
use crate::clock::{Instant, unix, wall_now};
use crate::et;
use crate::net::ring::SendRing;
use crate::net::{ReadSocket, send_batch, session_socket};

/// Datagrams a session task reads from its upstream socket per turn.
const READS_PER_TURN: usize = 32;
/// How soon a session whose upstream socket's buffer was full tries to send again. The socket
/// is not registered for write readiness, which would cost a wake-up after every datagram
/// sent; a full buffer towards the game server is rare (it drains at the link's speed). Each
/// try that sends nothing doubles the wait, up to [`FULL_RETRY_MAX`]: a congested link that
/// keeps many sessions' buffers full costs each of them a few wake-ups a second, not a
/// thousand.
const FULL_RETRY: Duration = Duration::from_millis(1);
/// The longest wait between two tries of a session whose buffer stays full.
const FULL_RETRY_MAX: Duration = Duration::from_millis(64);

/// Opens the upstream socket of a new session for `client`, active at `now_ms`, holding the
/// `permit` of its slot, and starts its task.
///
/// Nothing here waits: a UDP bind and connect return at once, so the relay loop is never held.
///
/// # Errors
/// The socket could not be created, bound or connected.
pub(super) fn open(
    shared: &Arc<Shared>,
    client: SocketAddr,
    now_ms: u64,
    permit: Permit,
) -> io::Result<Arc<Session>> {
    let socket = session_socket(shared.config.upstream)?;
    let session = Arc::new(
        Session::new(
            shared.next_session_id(),
            client,
            socket.get_ref().local_addr()?,
            now_ms,
            shared.config.session.queue,
            shared.budget.clone(),
            shared.cancel.child_token(),
        )
        .with_upstream(socket),
    );
    // A child of the server's span (the relay loop opens sessions within it); disabled, as
    // it is unless the debug level is on, it costs nothing.
    let span = tracing::debug_span!("session", %client);
    let task = run(Arc::clone(shared), Arc::clone(&session), permit).instrument(span);
    shared.tracker.spawn(task);
    Ok(session)
}

/// The session's task: queue → game server, game server → client, idle deadline.
async fn run(shared: Arc<Shared>, session: Arc<Session>, permit: Permit) {
    let upstream = session
        .upstream()
        .expect("invariant: open() gives every session its socket");
    let idle = tokio::time::sleep(shared.config.caps.half_open_timeout);
    // Made once, not at every turn: a new one registers with the token (or the `Notify`) again.
    let closed = session.closed();
    let queued = session.queued();
    // While the socket's buffer is full: the next try, and the wait after it.
    let retry = tokio::time::sleep(FULL_RETRY);
    let mut full: Option<Duration> = None;
    tokio::pin!(idle, closed, queued, retry);
    loop {
        // A socket that is always ready never makes a task yield by itself: take part in
        // tokio's cooperative budget so one busy session cannot starve the others.
        tokio::task::coop::consume_budget().await;
        tokio::select! {
            biased;
            () = &mut closed => break,
            () = &mut queued => {
                queued.set(session.queued());
                // With the buffer full, the next try is already set.
                if full.is_none() {
                    full = try_flush(&shared, &session, upstream, full, retry.as_mut());
                }
            }
            () = &mut retry, if full.is_some() => {
                full = try_flush(&shared, &session, upstream, full, retry.as_mut());
            }
            // The game server's answers go on while the buffer towards it is full.
            r = upstream.readable() => match r {
                Ok(()) => drain(&shared, &session, upstream),
                Err(e) => trace!(error = %e, "upstream readiness"),
            },
            () = &mut idle => {
                let timeout = if session.phase() == Phase::Established {
                    shared.config.session.timeout
                } else {
                    shared.config.caps.half_open_timeout
                };
                let deadline = shared.instant_of(session.last_active_ms()) + timeout;
                if deadline <= Instant::now() {
                    break;
                }
                idle.as_mut().reset(deadline);
            }
        }
    }
    session.cut();
    let open = shared.remove_session(&session);
    drop(permit);
    debug!(active = open, "session closed");
}

/// One try of [`flush`] after a wait of `wait` (none: the first): the wait before the next
/// try, with `retry` set to its end, while the buffer stays full; `None` once it took all.
fn try_flush(
    shared: &Shared,
    session: &Session,
    upstream: &ReadSocket,
    wait: Option<Duration>,
    retry: Pin<&mut Sleep>,
) -> Option<Duration> {
    let next = next_try(wait, flush(shared, session, upstream));
    if let Some(next) = next {
        retry.reset(Instant::now() + next);
    }
    next
}

/// The wait before the next try after a try that did `done`, the last wait having been `wait`:
/// none once the buffer took everything; [`FULL_RETRY`] after a try that sent something;
/// twice the last (at most [`FULL_RETRY_MAX`]) after one that sent nothing.
fn next_try(wait: Option<Duration>, done: Flushed) -> Option<Duration> {
    done.blocked.then(|| match wait {
        Some(wait) if done.packets == 0 => (wait * 2).min(FULL_RETRY_MAX),
        _ => FULL_RETRY,
    })
}

/// Sends what is queued to the game server, until the queue is empty or the socket's buffer is
/// full (`blocked`: the caller tries again later), and counts it.
pub(super) fn flush(shared: &Shared, session: &Session, upstream: &ReadSocket) -> Flushed {
    let done = session.send_queued(|batch| send_batch(upstream.get_ref(), batch));
    sent(shared, session, done.packets, done.bytes);
    for _ in 0..done.errors {
        shared.metrics.drop(DropReason::Upstream);
    }
    done
}

/// Counts `packets` (`bytes` in all) sent to the game server for `session`.
fn sent(shared: &Shared, session: &Session, packets: u64, bytes: u64) {
    if packets == 0 {
        // A queue the ring had emptied, looked at again for what it left: no counter to touch.
        return;
    }
    let m = &shared.metrics;
    m.upstream_packets.add(packets);
    m.upstream_bytes.add(bytes);
    session.packets_up.add(packets);
    session.bytes_up.add(bytes);
}

/// Sends what `sessions` queued through `ring`: every session's datagrams with one system
/// call per [`SendRing`]'s worth, in the order queued. A datagram its socket refused as full
/// goes back to its place at the front of its session's queue, and the session, blocked, is
/// left to its task (woken once the batch is out) and to [`flush`]: the ring takes nothing
/// from a blocked session, which would only be refused again. A datagram longer than the
/// ring's slots stays queued for [`flush`]. If the ring fails, what it could not send is
/// counted as dropped, and the caller stops using it ([`SendRing::broken`]).
pub(super) fn flush_through(ring: &mut SendRing, shared: &Shared, sessions: &[Arc<Session>]) {
    let m = &shared.metrics;
    let mut next = 0;
    while next < sessions.len() && !ring.broken() {
        let first = next;
        while next < sessions.len() {
            let s = &sessions[next];
            let Ok(tag) = u32::try_from(next) else {
                return;
            };
            if let Some(upstream) = s.upstream() {
                s.take_queued(|data| ring.stage(upstream.get_ref(), data, tag));
            }
            if ring.is_full() {
                // This session may have more: it is staged again in the next round.
                break;
            }
            next += 1;
        }
        if ring.staged() == 0 {
            return;
        }
        // The session refused last, and how many of its datagrams went back so far: where
        // the next one goes.
        let mut refused = (u32::MAX, 0);
        let mut any_refused = false;
        ring.submit(|tag, data, outcome| {
            let Some(s) = sessions.get(tag as usize) else {
                return;
            };
            match outcome {
                Ok(n) => sent(shared, s, 1, n as u64),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    any_refused = true;
                    if refused.0 != tag {
                        refused = (tag, 0);
                    }
                    match s.requeue(refused.1, data) {
                        Ok(()) => refused.1 += 1,
                        Err(Refused::QueueFull) => m.drop(DropReason::QueueFull),
                        Err(Refused::OverBudget) => m.drop(DropReason::QueuedBytes),
                        Err(Refused::Forged) => m.drop(DropReason::Forged),
                    }
                }
                Err(_) => m.drop(DropReason::Upstream),
            }
        });
        if ring.broken() {
            warn!("io_uring failed: sending one socket at a time from now on");
        }
        // Sessions refused in this round are their tasks' now (looked for only when a socket
        // was full: the common batch takes no lock here).
        if any_refused {
            let end = (next + 1).min(sessions.len());
            for s in sessions[first..end].iter().filter(|s| s.is_blocked()) {
                s.wake();
            }
        }
        if refused.0 as usize == next {
            next += 1;
        }
    }
}

/// Reads what the game server sent (a bounded number per turn, two per system call) and
/// relays it.
fn drain(shared: &Shared, session: &Session, upstream: &ReadSocket) {
    for _ in 0..READS_PER_TURN / 2 {
        let r = shared.with_answers(|rx| {
            rx.try_recv(upstream)?;
            for data in rx.datagrams() {
                if session.is_closed() {
                    break;
                }
                reply(shared, session, data);
            }
            Ok::<bool, io::Error>(rx.drained())
        });
        match r {
            // The queue was empty after what it took: the readiness is cleared.
            Ok(true) => return,
            Ok(false) if session.is_closed() => return,
            Ok(false) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // ICMP "port unreachable" from a game server that is down, surfacing on the
            // connected socket: nothing to relay, nothing to stop.
            Err(e) => trace!(error = %e, "upstream receive"),
        }
    }
}

/// One answer of the game server: the challenge exchange and its translation
/// ([`super::handshake`]), the session's phase, then back to the client from the public socket.
fn reply(shared: &Shared, session: &Session, data: &mut [u8]) {
    session.touch(shared.now_ms());
    shared.heard();
    shared.metrics.server_packets.inc();
    shared.metrics.server_bytes.add(data.len() as u64);
    session.packets_down.inc();
    session.bytes_down.add(data.len() as u64);
    let oob = et::is_oob(data);
    let mut rewritten = [0u8; 64];
    let data: &[u8] = if oob {
        match server_oob(shared, session, data, &mut rewritten) {
            Some(d) => d,
            None => return,
        }
    } else {
        session.translator.to_client(data);
        data
    };
    if session.phase() != Phase::Established && !advance(shared, session, data, oob) {
        return;
    }
    let client = session.client();
    if oob {
        debug!(
            command = %et::command_word(data),
            bytes = data.len(),
            "to client"
        );
    }
    shared.try_send_to_client(data, client);
}

/// A connectionless answer of the server, through the session's challenge exchange: what to
/// send the client (`data` itself, or a rewritten `connectResponse` written into `buf`), or
/// `None` when the answer is the relay's (the server's challenge: the client's `connect` goes
/// to the server now).
fn server_oob<'a>(
    shared: &Shared,
    session: &Session,
    data: &'a [u8],
    buf: &'a mut [u8; 64],
) -> Option<&'a [u8]> {
    let info_protocol = shared.facts().protocol;
    let answer = session
        .handshake()
        .on_server(data, &session.translator, info_protocol);
    match answer {
        Answer::Relay => Some(data),
        Answer::Drop => None,
        Answer::Connect(offer) => {
            if offer.et {
                shared.learn(|f| f.only_visible = Some(offer.second));
            } else if let Some(p) = offer.third.filter(|p| *p > 0) {
                shared.learn(|f| f.modern = Some(p));
            }
            send_connect(shared, session, offer.challenge);
            // The session was answered: it is recycled after those never answered.
            let mut st = shared.lock();
            st.sessions.answered(session);
            None
        }
        Answer::Connected(echo) => {
            shared.metrics.connects_translated.inc();
            if let Some(t) = session.translator.get() {
                debug!(scheme = ?t.scheme, "client in: its packets translated");
            }
            let Some(client) = echo else {
                return Some(data);
            };
            buf[..4].copy_from_slice(&et::OOB);
            let mut out = &mut buf[4..];
            let _ = write!(out, "connectResponse {client}");
            let n = 64 - out.len();
            Some(&buf[..n])
        }
    }
}

/// Sends the client's kept `connect` to the server, rewritten with the server's `challenge`.
fn send_connect(shared: &Shared, session: &Session, challenge: i32) {
    let now_ms = shared.now_ms();
    let pushed = shared.with_connects(|reader, out| {
        let hs = session.handshake();
        let c = reader.read(hs.kept()).ok()?;
        reader.rewrite(&c, challenge, out).ok()?;
        drop(hs);
        Some(session.push(out, now_ms))
    });
    match pushed {
        Some(Ok(())) => {
            debug!("connect sent with the server's challenge");
            if let Some(upstream) = session.upstream()
                && flush(shared, session, upstream).blocked
            {
                session.wake();
            }
        }
        Some(Err(_)) => shared.metrics.drop(DropReason::QueueFull),
        None => shared.metrics.drop(DropReason::Malformed),
    }
}

/// What the game server's answer says of a session not yet established: a `connectResponse` or
/// an in-game packet shows a real client (established), anything else that it was answered.
/// False when a cap refused the promotion: the session is cut and the answer dropped.
fn advance(shared: &Shared, session: &Session, data: &[u8], oob: bool) -> bool {
    let real = !oob || data[4..].starts_with(b"connectResponse");
    let mut st = shared.lock();
    if real {
        if let Err(reason) = st.sessions.promote(session) {
            st.sessions.remove(session);
            shared.gauges(&st.sessions);
            drop(st);
            session.cut();
            shared.refused(reason, session.client());
            return false;
        }
        st.proven.record(session.client().ip(), unix(wall_now()));
        shared.metrics.proven_sources.set(st.proven.len() as u64);
    } else {
        st.sessions.answered(session);
    }
    shared.gauges(&st.sessions);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_is_tried_again_sooner_after_progress_and_later_without() {
        let blocked = |packets| Flushed {
            packets,
            blocked: true,
            ..Flushed::default()
        };
        let ms = Duration::from_millis;
        assert_eq!(next_try(None, blocked(0)), Some(FULL_RETRY));
        let mut wait = Some(FULL_RETRY);
        for expect in [2, 4, 8, 16, 32, 64, 64, 64] {
            wait = next_try(wait, blocked(0));
            assert_eq!(wait, Some(ms(expect)));
        }
        assert_eq!(next_try(wait, blocked(3)), Some(FULL_RETRY));
        assert_eq!(next_try(wait, Flushed::default()), None);
    }
}
