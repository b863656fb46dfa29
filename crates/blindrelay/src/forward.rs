//! A forward on the wire (the pipeline's delivery, design step 8): the next hop's framed link (`crate::links::framed`; one
//! `POST /v2/relay` per frame to a next hop that speaks only HTTP), with bounded retries.
//!
//! Up to [`MAX_ATTEMPTS`] attempts in all after a timeout, a connection error or a request
//! error. Before attempt *a* + 1 the forwarder waits [`retry_delay`]`(route, next hop, a)`:
//!
//! `delay = 50 ms + (u16::from_be_bytes(SHA-256("blindrelay/retry/v1" ‖ tag ‖ next_hop ‖
//! a as u32 BE)[0..2]) mod 100) ms`, so 50–149 ms, spread between routes and next hops but the
//! same for the same retry (no RNG: reproducible, testable).
//!
//! A busy answer — `503 route_in_flight` (the same request is still being handled there; its
//! answer will be stored and replayed) or a `429` of a moment (`backpressure`,
//! `source_limited`, or naming no reason) — is retried too, at most [`MAX_BUSY_RETRIES`] times,
//! the *n*-th after [`busy_delay`] (the delay × min(n, [`MAX_BUSY_BACKOFF`])); every other
//! answer is definitive. A `backpressure` answer (no crypto slot free at that instant; a slot
//! is held for well under a millisecond of CPU) is retried sooner: the *n*-th after
//! [`backpressure_delay`], the delay ÷ 32 doubled at each retry, never more than
//! [`busy_delay`]. Every attempt waits its turn under the next hop's previous-hop rate
//! ([`crate::outbound`]).
//!
//! **Deadlines**: one fixed budget per hop. A v2 hop does not know how many hops follow it (the
//! frame carries no TTL), so every hop answers within [`HOP_DEADLINE`] (6 s) of a frame's
//! arrival. A forward not over by then is answered `503 route_in_flight` (which the previous hop
//! retries) and goes on to [`LATE_DEADLINE`] (12 s) before its final answer is stored. The sender
//! waits [`SENDER_DEADLINE`] (15 s), longer than the entry hop's late deadline, so it reads the
//! entry hop's stored final answer. On a healthy route every hop answers in milliseconds; behind
//! a hung hop each hop stores `forward_failed` within its own late deadline. A hung next hop
//! costs at most [`PER_NEXT_HOP`] requests in flight (`--per-next-hop`), each for at most the
//! late deadline; more to it are refused at once (`next_hop_busy`).
//!
//! Errors are classified, never printed: reqwest's messages carry the URL, which must not reach
//! a log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{self, Instant};

use sha2::{Digest, Sha256};
use tracing::debug;

use crate::counters::Counters;
use crate::links::{Links, Posted};
use crate::outbound::Turn;
use crate::proto::answer::Accepted;
use crate::proto::link::MAX_ANSWER;
use crate::proto::sphinx::Report;
use crate::proto::{NodeId, Prefix, ReplayTag};
use crate::reason::Reason;

/// Attempts in all, the first included.
pub const MAX_ATTEMPTS: u32 = 3;
/// Retries of a busy answer (`429` of a moment, `503 route_in_flight`) at most.
pub const MAX_BUSY_RETRIES: u32 = 40;
/// A busy retry waits at most this many times the formula's delay.
pub const MAX_BUSY_BACKOFF: u32 = 8;
/// How long a hop may take to answer a frame, whatever its position on the route.
pub const HOP_DEADLINE: Duration = Duration::from_secs(6);
/// How long a hop may go on with a forward after it answered `route_in_flight` at its
/// [`HOP_DEADLINE`]: twice the deadline in all.
pub const LATE_DEADLINE: Duration = Duration::from_secs(12);
/// How long a sender waits for the entry hop: longer than its [`LATE_DEADLINE`], so the entry
/// hop's final answer (stored, replayed to a retry) comes before the sender gives up.
pub const SENDER_DEADLINE: Duration = Duration::from_secs(15);
/// How long a send may take in all, its tries over other routes included (`crate::send`): two
/// routes whose hops hang to their deadlines fit.
pub const SEND_DEADLINE: Duration = Duration::from_secs(30);
/// Requests in flight to one next hop at most, by default.
pub const PER_NEXT_HOP: usize = 8;
/// The `Host` header of every relay request: the same for every next hop, so a request's
/// length on the link does not depend on the next hop's address (the link is pinned to the
/// next hop's key; the server ignores the header).
pub const LINK_HOST: &str = "blindrelay";

/// Requests in flight per next hop: at most `limit` each. Entries exist only while a request
/// is in flight, so the table is bounded by the requests in flight. Nothing is printed.
#[derive(Debug, Clone)]
pub struct NextHopSlots {
    limit: usize,
    map: Arc<Mutex<HashMap<NodeId, usize>>>,
}

/// One request in flight to a next hop, given back on drop.
#[derive(Debug)]
pub struct NextHopSlot {
    map: Arc<Mutex<HashMap<NodeId, usize>>>,
    hop: NodeId,
}

impl NextHopSlots {
    /// At most `limit` requests in flight per next hop.
    pub fn new(limit: usize) -> Self {
        NextHopSlots {
            limit,
            map: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A slot for `hop`, unless it has `limit` requests in flight.
    pub fn acquire(&self, hop: &NodeId) -> Option<NextHopSlot> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(*hop).or_insert(0);
        if *n >= self.limit {
            if *n == 0 {
                m.remove(hop);
            }
            return None;
        }
        *n += 1;
        Some(NextHopSlot {
            map: Arc::clone(&self.map),
            hop: *hop,
        })
    }
}

impl Drop for NextHopSlot {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.hop) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.hop);
            }
        }
    }
}

/// The delay before the attempt after `attempt` (see the module docs).
pub fn retry_delay(tag: &ReplayTag, next_hop: &NodeId, attempt: u32) -> Duration {
    let mut h = Sha256::new();
    h.update(b"blindrelay/retry/v1");
    h.update(tag);
    h.update(next_hop);
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    Duration::from_millis(50 + u64::from(u16::from_be_bytes([d[0], d[1]]) % 100))
}

/// What the next hop made of a forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarded {
    /// Accepted (200 and a well-formed answer): the sealed receipt to pass back, opaque here.
    Accepted {
        /// Hex of the sealed receipt.
        receipt: String,
    },
    /// A definitive refusal (any other answer, or a busy one after its retries): its status
    /// and the reason its body names, if any.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The reason named, if any.
        reason: Option<Reason>,
        /// The failure report the body carries, if any (a hop past the next one failed, or the
        /// next hop could not pass the packet on).
        report: Option<Report>,
    },
    /// No answer after every attempt.
    Exhausted,
}

/// One HTTP request's failure kind, for logs (never the error text, which holds the URL): a
/// forward attempt's here, a status report push's in `crate::report`.
pub(crate) fn kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "request"
    }
}

/// What one attempt got.
enum Attempt {
    /// An answer: status and body (`None` if over [`MAX_ANSWER`] or cut).
    Answer(u16, Option<Vec<u8>>),
    /// No answer: the failure kind.
    Failed(&'static str),
}

/// One attempt to `next_hop` at `url`: over its framed link, or HTTP where it speaks only that.
async fn attempt(
    links: &Links,
    next_hop: &NodeId,
    url: &str,
    frame: &[u8],
    deadline: Instant,
) -> Attempt {
    match links.post_framed(next_hop, url, frame, deadline).await {
        Posted::Answer(status, body) => Attempt::Answer(status, Some(body)),
        Posted::Failed(kind) => Attempt::Failed(kind),
        Posted::UseHttp => {
            let http = links.client(Some(next_hop));
            attempt_http(&http, url, frame, deadline).await
        }
    }
}

/// One attempt over HTTP: `POST url`.
async fn attempt_http(
    http: &reqwest::Client,
    url: &str,
    frame: &[u8],
    deadline: Instant,
) -> Attempt {
    let left = deadline.saturating_duration_since(clock::now());
    let work = async {
        match http
            .post(url)
            .header(reqwest::header::HOST, LINK_HOST)
            .header("content-type", "application/octet-stream")
            .timeout(left)
            .body(frame.to_vec())
            .send()
            .await
        {
            Ok(resp) => {
                let status = resp.status().as_u16();
                Attempt::Answer(status, read_capped(resp).await)
            }
            Err(e) => Attempt::Failed(kind(&e)),
        }
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Attempt::Failed("timeout"))
}

/// The reason of a refusal's body, if it names one.
fn reason_of(body: Option<&[u8]>) -> Option<Reason> {
    error_of(body).and_then(|e| Reason::from_wire(&e.error))
}

fn error_of(body: Option<&[u8]>) -> Option<crate::proto::answer::ErrorBody<'_>> {
    body.and_then(|b| serde_json::from_slice(b).ok())
}

/// The failure report of a refusal's body, if it carries one of the right length.
fn report_of(body: Option<&[u8]>) -> Option<Report> {
    error_of(body).and_then(|e| crate::proto::from_hex(e.report.as_deref()?))
}

/// True for an answer the design says to retry: `503 route_in_flight` (the same request is
/// still being handled there: its answer will be stored and replayed) and a `429` of a moment
/// (`backpressure`, `source_limited`, or a `429` naming no reason), and `503
/// state_write_failed` (nothing was reserved there). The other `429`s
/// (`rate_limited`, `quarantined`, `inbox_share_exceeded`, `replay_share_exceeded`) last
/// minutes: a retry within a deadline of seconds cannot succeed, so they are final.
fn busy(status: u16, reason: Option<Reason>) -> bool {
    match (status, reason) {
        (429 | 503, Some(r)) => r.is_retryable(),
        (429, None) => true,
        _ => false,
    }
}

/// The delay before busy retry number `n` (1-based): the formula's delay times `n`, at most
/// [`MAX_BUSY_BACKOFF`] times: a next hop still handling the same request needs longer than
/// a moment of backpressure.
pub fn busy_delay(tag: &ReplayTag, next_hop: &NodeId, attempt: u32, n: u32) -> Duration {
    retry_delay(tag, next_hop, attempt) * n.clamp(1, MAX_BUSY_BACKOFF)
}

/// The delay before busy retry number `n` (1-based) of a `backpressure` answer: the next hop
/// had no crypto slot free at that instant, and its slots are held for well under a
/// millisecond of CPU each, so the first retry comes after the formula's delay ÷ 32 (1.5–4.7
/// ms), doubling at each retry, and never later than [`busy_delay`] would (from the ninth
/// retry on, the same). A next hop that stays overloaded sees the retries thin out as fast.
pub fn backpressure_delay(tag: &ReplayTag, next_hop: &NodeId, attempt: u32, n: u32) -> Duration {
    let doubling =
        retry_delay(tag, next_hop, attempt) * (1 << n.clamp(1, 9).saturating_sub(1)) / 32;
    doubling.min(busy_delay(tag, next_hop, attempt, n))
}

/// Posts a frame to `url` (the next hop of `turn`) until `deadline`, each attempt in its
/// turn (`crate::outbound`), with retries on transport errors and on a busy next hop's
/// retryable `429`.
pub async fn post(
    links: &Links,
    url: &str,
    envelope: &[u8],
    tag: &ReplayTag,
    counters: &Counters,
    deadline: Instant,
    mut turn: Turn,
) -> Forwarded {
    let hop = *turn.hop();
    let next_hop = &hop;
    let (mut failures, mut busy_retries, mut retry) = (0u32, 0u32, 0u32);
    loop {
        if !turn.try_now() {
            counters.paced.inc();
            if !turn.go(deadline).await {
                debug!(next = %Prefix(next_hop), "no turn within the deadline");
                break;
            }
        }
        let got = attempt(links, next_hop, url, envelope, deadline).await;
        turn.answered(matches!(got, Attempt::Answer(..)));
        match got {
            Attempt::Answer(status, body) => {
                let reason = (status != 200)
                    .then(|| reason_of(body.as_deref()))
                    .flatten();
                let delay = if reason == Some(Reason::Backpressure) {
                    backpressure_delay(tag, next_hop, retry + 1, busy_retries + 1)
                } else {
                    busy_delay(tag, next_hop, retry + 1, busy_retries + 1)
                };
                if busy(status, reason)
                    && busy_retries < MAX_BUSY_RETRIES
                    && clock::now() + delay < deadline
                {
                    busy_retries += 1;
                    retry += 1;
                    counters.busy_retried.inc();
                    debug!(next = %Prefix(next_hop), status, "next hop busy, retrying");
                    tokio::time::sleep(delay).await;
                    continue;
                }
                if retry > 0 && status == 200 {
                    counters.retry_succeeded.inc();
                }
                return definitive(next_hop, status, reason, body.as_deref());
            }
            Attempt::Failed(kind) => {
                failures += 1;
                debug!(next = %Prefix(next_hop), attempt = failures, kind, "next hop unreachable");
                let delay = retry_delay(tag, next_hop, retry + 1);
                if failures >= MAX_ATTEMPTS || clock::now() + delay >= deadline {
                    break;
                }
                retry += 1;
                counters.retry_attempted.inc();
                tokio::time::sleep(delay).await;
            }
        }
    }
    // No answer: after retrying (the attempts or the deadline spent), or with no time left for
    // a retry at all (the one attempt, or the wait for its turn, used the whole deadline).
    if retry > 0 {
        counters.retry_exhausted.inc();
    } else {
        counters.deadline_exhausted.inc();
    }
    Forwarded::Exhausted
}

/// What a definitive answer (`status`, `reason`, `body`) of `next_hop` says.
fn definitive(
    next_hop: &NodeId,
    status: u16,
    reason: Option<Reason>,
    body: Option<&[u8]>,
) -> Forwarded {
    match (status, body.map(serde_json::from_slice::<Accepted>)) {
        (200, Some(Ok(a))) => Forwarded::Accepted { receipt: a.receipt },
        _ => {
            debug!(next = %Prefix(next_hop), status, "next hop refused");
            Forwarded::Refused {
                status,
                reason,
                report: report_of(body),
            }
        }
    }
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

    #[test]
    fn deadlines_are_fixed_and_ordered() {
        assert!(HOP_DEADLINE < LATE_DEADLINE);
        assert!(LATE_DEADLINE < SENDER_DEADLINE);
        assert!(SENDER_DEADLINE * 2 <= SEND_DEADLINE);
        assert_eq!(LATE_DEADLINE, HOP_DEADLINE * 2);
    }

    #[test]
    fn next_hop_slots_cap_each_next_hop() {
        let slots = NextHopSlots::new(2);
        let a = slots.acquire(&[1; 32]).unwrap();
        let _b = slots.acquire(&[1; 32]).unwrap();
        assert!(slots.acquire(&[1; 32]).is_none());
        assert!(
            slots.acquire(&[2; 32]).is_some(),
            "another next hop has its own"
        );
        drop(a);
        assert!(slots.acquire(&[1; 32]).is_some());
        assert!(NextHopSlots::new(0).acquire(&[3; 32]).is_none());
    }

    #[test]
    fn what_is_retried() {
        let r = |b: &[u8]| reason_of(Some(b));
        assert!(busy(429, r(br#"{"error":"backpressure"}"#)));
        assert!(busy(429, r(br#"{"error":"source_limited"}"#)));
        assert!(busy(503, r(br#"{"error":"route_in_flight"}"#)));
        assert!(busy(429, None), "a 429 naming no reason");
        assert!(!busy(429, r(br#"{"error":"quarantined"}"#)));
        assert!(!busy(429, r(br#"{"error":"rate_limited"}"#)));
        assert!(!busy(503, r(br#"{"error":"replay_capacity"}"#)));
        assert!(!busy(503, None));
        assert!(!busy(502, r(br#"{"error":"forward_failed"}"#)));
        let (route, hop) = ([1; 16], [2; 32]);
        assert_eq!(
            busy_delay(&route, &hop, 1, 3),
            retry_delay(&route, &hop, 1) * 3
        );
        assert_eq!(
            busy_delay(&route, &hop, 1, 100),
            retry_delay(&route, &hop, 1) * MAX_BUSY_BACKOFF
        );
    }

    #[test]
    fn backpressure_is_retried_sooner_doubling_up_to_the_busy_delay() {
        let (route, hop) = ([0x11; 16], [0x22; 32]);
        // The pinned formula's delay before attempt 2 is 57 ms.
        let ms = |n| backpressure_delay(&route, &hop, 1, n).as_micros();
        assert_eq!(ms(1), 57_000 / 32);
        assert_eq!(ms(2), 57_000 / 16);
        assert_eq!(ms(6), 57_000);
        for n in 1..=MAX_BUSY_RETRIES {
            let (b, busy) = (
                backpressure_delay(&route, &hop, 1, n),
                busy_delay(&route, &hop, 1, n),
            );
            assert!(b <= busy, "retry {n}: never later than a busy retry");
            if n >= 9 {
                assert_eq!(b, busy, "retry {n}: the busy schedule from the ninth on");
            }
        }
        for i in 0..200u8 {
            let first = backpressure_delay(&[i; 16], &hop, 1, 1);
            assert!((1_562..4_657).contains(&first.as_micros()), "{first:?}");
        }
    }

    // Computed independently (Python hashlib) for route 16×0x11 and next hop 32×0x22.
    const PINNED: [u128; 2] = [57, 93];
}
