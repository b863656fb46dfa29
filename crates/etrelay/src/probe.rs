//! Asking the game server directly: a query with a fresh challenge, and the answer that echoes
//! it.
//!
//! The heartbeat task's probe (`getinfo hb…`, is the server up?) and a registration's proof
//! (`getstatus pf…`, does the server show the key's fingerprint?) both ask this way, from a
//! socket of their own connected to the game server. Answers that do not echo the challenge
//! (late answers to an earlier attempt, anything else) are ignored.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tracing::debug;

use crate::clock::Instant;
use crate::config::PROBE_ATTEMPTS;
use crate::et::classify::Query;
use crate::et::info::{find_key, info_string};
use crate::net::upstream_socket;

/// Bytes of randomness in a challenge (written as twice as many hex digits after the prefix).
const NONCE_BYTES: usize = 8;
/// Room for any answer: a UDP datagram at most.
const MAX_ANSWER: usize = 65_536;
/// Pause after a receive error (an ICMP error from a server that is down), so a stream of them
/// cannot make the wait spin.
const ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Sends `query` to `upstream` with the challenge `<prefix><16 hex digits>`, a new one for each
/// of up to [`PROBE_ATTEMPTS`] attempts, and waits `timeout` after each send for an answer that
/// echoes it. Returns that answer (the whole datagram), or `None` when no attempt got one.
///
/// # Errors
/// The socket could not be opened.
pub async fn ask(
    upstream: SocketAddr,
    query: Query,
    prefix: &str,
    timeout: Duration,
) -> io::Result<Option<Vec<u8>>> {
    let socket = upstream_socket(upstream)?;
    let mut buf = vec![0u8; MAX_ANSWER];
    let mut packet = Vec::with_capacity(query.request().len() + prefix.len() + 2 * NONCE_BYTES);
    for attempt in 1..=PROBE_ATTEMPTS {
        packet.clear();
        packet.extend_from_slice(query.request());
        packet.extend_from_slice(prefix.as_bytes());
        packet.extend_from_slice(hex::encode(rand::random::<[u8; NONCE_BYTES]>()).as_bytes());
        let challenge = &packet[query.request().len()..];
        if let Err(e) = socket.send(&packet).await {
            debug!(%upstream, query = %command(query), error = %e, "probe: send failed");
        }
        let deadline = Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(_)) => tokio::time::sleep(ERROR_PAUSE).await,
                Ok(Ok(n)) if echoes(&buf[..n], query, challenge) => {
                    buf.truncate(n);
                    return Ok(Some(buf));
                }
                Ok(Ok(_)) => {}
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        debug!(
            %upstream,
            query = %command(query),
            attempt,
            of = PROBE_ATTEMPTS,
            "probe: no answer"
        );
    }
    Ok(None)
}

/// True when `packet` is the answer to `query` and carries `challenge`.
fn echoes(packet: &[u8], query: Query, challenge: &[u8]) -> bool {
    info_string(packet, query.answer_header())
        .and_then(|info| find_key(info, b"challenge").map(|r| &info[r]))
        .is_some_and(|echoed| echoed == challenge)
}

/// The query's word, for logs.
fn command(query: Query) -> &'static str {
    match query {
        Query::Info => "getinfo",
        Query::Status => "getstatus",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_echo_of_the_challenge_counts() {
        let info = b"\xff\xff\xff\xffinfoResponse\n\\hostname\\x\\challenge\\hb01";
        assert!(echoes(info, Query::Info, b"hb01"));
        assert!(!echoes(info, Query::Info, b"hb02"));
        assert!(!echoes(info, Query::Status, b"hb01"));
        assert!(!echoes(
            b"\xff\xff\xff\xffinfoResponse\n\\hostname\\x",
            Query::Info,
            b"hb01"
        ));
        let status = b"\xff\xff\xff\xffstatusResponse\n\\challenge\\pf1\\x\\y\n0 0 \"a\"\n";
        assert!(echoes(status, Query::Status, b"pf1"));
    }
}
