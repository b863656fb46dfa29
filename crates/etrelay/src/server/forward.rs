//! A session's task: its queue → upstream socket → game server, and the game server's answers →
//! public socket → client.
//!
//! [`open`] gives a new session its own upstream socket (an ephemeral port connected to the
//! game server: how the server tells clients apart) and starts its task. The task sends the
//! queued packets, sends the server's answers back **through the public socket**, so they come
//! from the public port, and ends after `timeout` without a packet either way (a deadline on
//! tokio's timer, moved on by every packet), when its server stops, or at once when it is cut
//! (a ban). It then removes itself from the table and gives its slot of `MAX_SESSIONS` back.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use guard::admission::Permit;
use tokio::net::UdpSocket;
use tracing::{debug, trace};

use super::metrics::Drop;
use super::session::Session;
use super::shared::Shared;
use crate::clock::Instant;
use crate::et;
use crate::net::upstream_socket;

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
    let socket = upstream_socket(shared.config.upstream)?;
    let session = Arc::new(Session::new(
        shared.next_session_id(),
        client,
        socket.local_addr()?,
        now_ms,
        shared.config.session.queue,
        shared.cancel.child_token(),
    ));
    let task = run(Arc::clone(shared), Arc::clone(&session), socket, permit);
    shared.tracker.spawn(task);
    Ok(session)
}

/// The session's task: queue → game server, game server → client, idle deadline.
async fn run(shared: Arc<Shared>, session: Arc<Session>, upstream: UdpSocket, permit: Permit) {
    let timeout = shared.config.session.timeout;
    let mut buf = vec![0u8; shared.config.session.max_packet.max(1)];
    let idle = tokio::time::sleep(timeout);
    tokio::pin!(idle);
    loop {
        // A socket that is always ready never makes a task yield by itself: take part in
        // tokio's cooperative budget so one busy session cannot starve the others.
        tokio::task::coop::consume_budget().await;
        tokio::select! {
            biased;
            () = session.closed() => break,
            () = session.queued() => flush(&shared, &session, &upstream).await,
            r = upstream.recv(&mut buf) => match r {
                Ok(n) => reply(&shared, &session, &buf[..n]).await,
                // ICMP "port unreachable" from a game server that is down, surfacing on the
                // connected socket: nothing to relay, nothing to stop.
                Err(e) => trace!(error = %e, "upstream receive"),
            },
            () = &mut idle => {
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
    debug!("session - {} ({open} active)", session.client);
}

/// Sends every queued packet to the game server.
async fn flush(shared: &Shared, session: &Session, upstream: &UdpSocket) {
    while let Some(pkt) = session.pop() {
        match upstream.send(&pkt).await {
            Ok(n) => {
                shared.metrics.upstream_packets.inc();
                shared.metrics.upstream_bytes.add(n as u64);
                session.packets_up.inc();
                session.bytes_up.add(n as u64);
            }
            Err(e) => {
                shared.metrics.drop(Drop::Upstream);
                trace!(error = %e, "upstream send");
            }
        }
        session.recycle(pkt);
    }
}

/// Sends one answer of the game server back to the client from the public socket.
async fn reply(shared: &Shared, session: &Session, data: &[u8]) {
    session.touch(shared.now_ms());
    shared.metrics.server_packets.inc();
    shared.metrics.server_bytes.add(data.len() as u64);
    session.packets_down.inc();
    session.bytes_down.add(data.len() as u64);
    if et::is_oob(data) {
        debug!(
            "{} <- ET {} ({} B)",
            session.client,
            et::command_word(data),
            data.len()
        );
    }
    shared.send_to_client(data, session.client).await;
}
