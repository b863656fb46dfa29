//! Step 8 of a forward, on the wire: the next hop's client, with bounded retries.
//!
//! Up to [`MAX_ATTEMPTS`] attempts in all, and only after a timeout, a connection error or a
//! request error: an answer from downstream, whatever it says, is definitive and never retried.
//! Before attempt *a* + 1 the forwarder waits [`retry_delay`]`(route, next hop, a)`:
//!
//! `delay = 50 ms + (u16::from_be_bytes(SHA-256("blindrelay/retry/v1" ‖ route_id ‖ next_hop ‖
//! a as u32 BE)[0..2]) mod 100) ms`, so 50–149 ms, spread between routes and next hops but the
//! same for the same retry (no RNG: reproducible, testable).
//!
//! Errors are classified, never printed: reqwest's messages carry the URL, which must not reach
//! a log.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::debug;

use crate::counters::Counters;
use crate::proto::answer::Accepted;
use crate::proto::{NodeId, Prefix, RouteId};

/// Attempts in all, the first included.
pub const MAX_ATTEMPTS: u32 = 3;
/// Connect timeout to a next hop.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Whole-request timeout to a next hop.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from a next hop.
pub const MAX_ANSWER: usize = 16 * 1024;

/// The delay before the attempt after `attempt` (see the module docs).
pub fn retry_delay(route_id: &RouteId, next_hop: &NodeId, attempt: u32) -> Duration {
    let mut h = Sha256::new();
    h.update(b"blindrelay/retry/v1");
    h.update(route_id);
    h.update(next_hop);
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    Duration::from_millis(50 + u64::from(u16::from_be_bytes([d[0], d[1]]) % 100))
}

/// The HTTP client for next hops: no proxy, no redirects, bounded timeouts.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(2)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// What the next hop made of a forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarded {
    /// Accepted (200 and a well-formed answer): the sealed receipt to pass back, opaque here.
    Accepted {
        /// Hex of the sealed receipt.
        receipt: String,
    },
    /// A definitive refusal (any other answer).
    Refused,
    /// No answer after every attempt.
    Exhausted,
}

/// One attempt's failure kind (for logs: never the error text, which holds the URL).
fn kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "request"
    }
}

/// Posts an envelope to `url`, with retries on transport errors only.
pub async fn post(
    http: &reqwest::Client,
    url: &str,
    envelope: &[u8],
    route_id: &RouteId,
    next_hop: &NodeId,
    counters: &Counters,
) -> Forwarded {
    for attempt in 1..=MAX_ATTEMPTS {
        let sent = http
            .post(url)
            .header("content-type", "application/octet-stream")
            .body(envelope.to_vec())
            .send()
            .await;
        match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = read_capped(resp).await;
                if attempt > 1 && status == 200 {
                    counters.retry_succeeded.inc();
                }
                return match (
                    status,
                    body.as_deref().map(serde_json::from_slice::<Accepted>),
                ) {
                    (200, Some(Ok(a))) => Forwarded::Accepted { receipt: a.receipt },
                    _ => {
                        debug!(next = %Prefix(next_hop), status, "next hop refused");
                        Forwarded::Refused
                    }
                };
            }
            Err(e) => {
                debug!(next = %Prefix(next_hop), attempt, kind = kind(&e), "next hop unreachable");
                if attempt < MAX_ATTEMPTS {
                    counters.retry_attempted.inc();
                    tokio::time::sleep(retry_delay(route_id, next_hop, attempt)).await;
                }
            }
        }
    }
    if MAX_ATTEMPTS > 1 {
        counters.retry_exhausted.inc();
    }
    Forwarded::Exhausted
}

async fn read_capped(mut resp: reqwest::Response) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > MAX_ANSWER {
                    return None;
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Some(out),
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_the_formula() {
        let (r, n) = ([0x11u8; 16], [0x22u8; 32]);
        for attempt in 1..=2u32 {
            let mut h = Sha256::new();
            h.update(b"blindrelay/retry/v1");
            h.update(r);
            h.update(n);
            h.update(attempt.to_be_bytes());
            let d = h.finalize();
            let want = 50 + u64::from(u16::from_be_bytes([d[0], d[1]]) % 100);
            assert_eq!(retry_delay(&r, &n, attempt), Duration::from_millis(want));
        }
        // Pinned values, so a change of the formula shows.
        let got: Vec<u128> = (1..=2)
            .map(|a| retry_delay(&r, &n, a).as_millis())
            .collect();
        assert_eq!(got, PINNED.to_vec());
        // Deterministic, in range, and different across routes.
        let mut seen = std::collections::HashSet::new();
        for i in 0..200u8 {
            let d = retry_delay(&[i; 16], &n, 1);
            assert_eq!(d, retry_delay(&[i; 16], &n, 1));
            assert!((50..150).contains(&d.as_millis()));
            seen.insert(d);
        }
        assert!(seen.len() > 50);
    }

    // Computed independently (Python hashlib) for route 16×0x11 and next hop 32×0x22.
    const PINNED: [u128; 2] = [57, 93];
}
