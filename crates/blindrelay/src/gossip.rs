//! Discovery by gossip of signed descriptors: how a node learns the nodes its `--peer`s know,
//! and how the others learn a newcomer, with no operator restarting anything.
//!
//! Every `--gossip-interval` ([`DEFAULT_INTERVAL`]) a node posts its own signed descriptor to
//! up to [`FANOUT`] routable peers chosen at random (`POST /v1/gossip`, over the link pinned to
//! each peer's id), with its *news*: the identities it learned within the last
//! [`NEWS_ROUNDS`] intervals, newest first, at most [`MAX_NEWS`]. Each answers with up to
//! [`MAX_ANSWER`] descriptors it holds: its own first, then its news, then routable peers at
//! random. Both sides keep what they learn as [`PeerSource::Gossip`]. So a newcomer's
//! descriptor travels both ways at every exchange while it is news, and reaches every node in a
//! few rounds (push and pull, as Lightning's nodes pass on fresh announcements). A descriptor is
//! signed by its owner, so a node can pass on others' descriptors but never forge one; each is
//! verified once, when it is kept. Only peers this node reached at their endpoint are passed on
//! (a descriptor fetched from its URL, a gossip exchange, a probe or a route through it; a
//! newcomer announced to it is probed within a second, `crate::probe`), and none that its own
//! sends avoid (they failed, and no probe has shown them back): identities whose endpoints
//! answer nothing go no further than the node they were announced to.
//!
//! Bounds (Sybils, eclipse):
//! - an answer is read to [`MAX_BODY`] bytes at most, within the fetch timeout, and at most
//!   [`MAX_NEW_PER_ANSWER`] identities new to this node are kept from one answer or
//!   announcement;
//! - at most [`PER_BLOCK`] gossiped identities per address block ([`BLOCKS`]: /24 IPv4, /48
//!   IPv6) are kept, checked before the signature, so 5 000 identities from one /24 cost 5 000
//!   comparisons and leave [`PER_BLOCK`] of them; `--peer` peers are the operator's choice and
//!   not bounded per block;
//! - the peer table is bounded ([`crate::peers::MAX_PEERS`]) and, full, makes room only by
//!   forgetting expired descriptors: long-known peers are never evicted for newcomers;
//! - an announcement costs its source the request gate's cheap budget, like any request, and
//!   each identity new to this node in it (its sender's, or its news) one of the source's
//!   introductions ([`Introductions`]).
//!
//! The bytes of every exchange, both ways and both roles, are counted (`gossip_bytes_sent`,
//! `gossip_bytes_received`).
//!
//! Nothing here logs an id beyond its 8-hex prefix, nor any endpoint or address.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::context::Context;
use crate::peers::{FETCH_TIMEOUT, Refused};
use crate::proto::descriptor::Descriptor;
use crate::sources::{self, Grouping, SourceKey};

/// Time between gossip rounds by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Peers asked per round.
pub const FANOUT: usize = 3;
/// Descriptors in one answer at most.
pub const MAX_ANSWER: usize = 32;
/// Identities new to this node kept from one answer or announcement at most.
pub const MAX_NEW_PER_ANSWER: usize = 8;
/// Gossiped identities kept per address block at most.
pub const PER_BLOCK: usize = 2;
/// The address blocks gossiped identities are counted in.
pub const BLOCKS: Grouping = Grouping {
    v4_prefix: 24,
    v6_prefix: 48,
};
/// New identities one source may announce: a burst of [`MAX_NEW_PER_ANSWER`], then one per
/// this interval.
pub const INTRODUCTION_INTERVAL: Duration = Duration::from_secs(10);
/// Sources whose announcements are remembered at most.
pub const INTRODUCERS: usize = 4096;

/// Largest gossip answer read, and largest announcement body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// Largest announcement body (its sender's descriptor and its news).
pub const MAX_ANNOUNCE: usize = 16 * 1024;
/// News carried by an announcement at most.
pub const MAX_NEWS: usize = 8;
/// An identity is news for this many gossip intervals after this node first kept it.
pub const NEWS_ROUNDS: u32 = 3;

/// `POST /v1/gossip`'s body: the caller's own descriptor, and its news.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announce {
    /// The caller's signed descriptor.
    pub descriptor: Descriptor,
    /// Identities the caller learned lately, newest first (at most [`MAX_NEWS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub news: Vec<Descriptor>,
}

/// `POST /v1/gossip`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The answering node's descriptor first, then peers it can route to.
    pub descriptors: Vec<Descriptor>,
}

/// How many identities new to this node each source (address block, or known peer) may
/// announce: a bounded table of token buckets, so that one party cannot feed the table
/// identities whose endpoints it names in many blocks.
#[derive(Debug)]
pub struct Introductions(Mutex<KeyedLimiter<SourceKey, TokenBucket>>);

impl Default for Introductions {
    fn default() -> Self {
        Introductions(Mutex::new(KeyedLimiter::new(
            TokenBucket::new(MAX_NEW_PER_ANSWER as u32, INTRODUCTION_INTERVAL),
            Limits {
                max_keys: INTRODUCERS,
                forget: INTRODUCTION_INTERVAL * MAX_NEW_PER_ANSWER as u32,
                sweep_gap: Duration::from_secs(1),
            },
        )))
    }
}

impl Introductions {
    /// True when `source` may introduce one more identity at `now` (and charges it).
    pub fn allow(&self, source: SourceKey, now: std::time::Instant) -> bool {
        let mut table = self.0.lock().unwrap_or_else(|p| p.into_inner());
        matches!(table.check(&source, now), Ok(true))
    }
}

/// The identities this node learned within [`NEWS_ROUNDS`] × `interval` before `now`, newest
/// first, at most [`MAX_NEWS`]; never a peer its own sends avoid.
pub fn news(ctx: &Context, interval: Duration, now: u64) -> Vec<Descriptor> {
    let since = now.saturating_sub(interval.as_secs().max(1) * u64::from(NEWS_ROUNDS));
    let mut news = ctx.peers.news(now, since, 2 * MAX_NEWS);
    news.retain(|d| ctx.health.usable(&d.node_id, now));
    news.truncate(MAX_NEWS);
    news
}

/// This node's answer at `now`: its own descriptor, its news, then routable peers at random, at
/// most [`MAX_ANSWER`] in all. Only peers this node reached at their endpoint are passed on,
/// and not one its own sends avoid (it failed and no probe has shown it back).
pub fn answer(ctx: &Context, interval: Duration, now: u64) -> Answer {
    let mut descriptors = Vec::with_capacity(MAX_ANSWER);
    descriptors.push(ctx.node.descriptor(now));
    descriptors.extend(news(ctx, interval, now));
    let mut peers: Vec<Descriptor> = ctx
        .peers
        .candidates(now)
        .into_iter()
        .filter(|c| c.reached && ctx.health.usable(&c.d.node_id, now))
        .map(|c| c.d)
        .filter(|d| !descriptors.iter().any(|n| n.node_id == d.node_id))
        .collect();
    peers.shuffle(&mut rand::rng());
    peers.truncate(MAX_ANSWER.saturating_sub(descriptors.len()));
    descriptors.extend(peers);
    Answer { descriptors }
}

/// Keeps what `descriptors` teach this node, within the bounds; how many identities were new.
pub fn learn(ctx: &Context, descriptors: Vec<Descriptor>) -> usize {
    learn_within(ctx, descriptors, || true)
}

/// [`learn`], each identity new to this node first allowed by `introduce` (a source's
/// introductions, charged as it is asked).
pub fn learn_within(
    ctx: &Context,
    descriptors: Vec<Descriptor>,
    mut introduce: impl FnMut() -> bool,
) -> usize {
    let mut new = 0;
    let now = ctx.clock.unix();
    for d in descriptors.into_iter().take(MAX_ANSWER) {
        let id = d.node_id;
        let known = ctx.peers.holds(&id);
        if !known && (new >= MAX_NEW_PER_ANSWER || !introduce()) {
            continue;
        }
        match ctx.peers.insert_gossiped(d, PER_BLOCK, |a, b| {
            sources::block(a, BLOCKS) == sources::block(b, BLOCKS)
        }) {
            Ok(()) => {
                ctx.peers.note_gossip(&id, now);
                if !known {
                    new += 1;
                }
            }
            Err(Refused::Held) => ctx.peers.note_gossip(&id, now),
            Err(why) => debug!(?why, "gossiped descriptor not kept"),
        }
    }
    new
}

/// One round: this node's descriptor and news posted to up to [`FANOUT`] routable peers at
/// random, what they answer learned. How many identities were new.
pub async fn round(ctx: &Context, interval: Duration) -> usize {
    let now = ctx.clock.unix();
    let mut peers = ctx.peers.routable(now);
    peers.retain(|d| ctx.health.usable(&d.node_id, now));
    peers.shuffle(&mut rand::rng());
    let announce = Announce {
        descriptor: ctx.node.descriptor(now),
        news: news(ctx, interval, now),
    };
    let body = serde_json::to_vec(&announce).unwrap_or_default();
    let mut new = 0;
    for peer in peers.into_iter().take(FANOUT) {
        let http = ctx.http.client(Some(&peer.node_id));
        let url = format!("{}/v1/gossip", peer.endpoint.trim_end_matches('/'));
        ctx.counters.gossip_bytes_sent.add(body.len() as u64);
        match exchange(ctx, &http, &url, body.clone()).await {
            Exchanged::Answer(answer) => {
                let now = ctx.clock.unix();
                ctx.peers.gossiped(now);
                // The link is pinned to its id: it answered at its endpoint.
                ctx.peers.mark_reached(&peer.node_id);
                ctx.peers.note_gossip(&peer.node_id, now);
                new += learn(ctx, answer.descriptors);
            }
            // No connection or no answer in time: what a route through it would meet.
            Exchanged::Unreachable => {
                ctx.health
                    .record_route(&peer.node_id, false, ctx.clock.unix());
            }
            Exchanged::Refused => {}
        }
    }
    new
}

/// What an exchange got.
enum Exchanged {
    /// An answer, read and parsed.
    Answer(Answer),
    /// No connection, or no answer within the fetch timeout.
    Unreachable,
    /// An answer, but a refusal or one this node does not take (too long, not an answer).
    Refused,
}

/// Posts the announcement `body` to `url`; its answer, read chunk by chunk and dropped past
/// [`MAX_BODY`], all within the fetch timeout. The bytes read are counted.
async fn exchange(ctx: &Context, http: &reqwest::Client, url: &str, body: Vec<u8>) -> Exchanged {
    let post = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send();
    let deadline = crate::clock::now() + FETCH_TIMEOUT;
    let resp = match tokio::time::timeout_at(deadline, post).await {
        Ok(Ok(resp)) => resp,
        _ => return Exchanged::Unreachable,
    };
    match tokio::time::timeout_at(deadline, read_answer(ctx, resp)).await {
        Ok(Some(answer)) => Exchanged::Answer(answer),
        _ => Exchanged::Refused,
    }
}

/// The answer of `resp`, read chunk by chunk and dropped past [`MAX_BODY`].
async fn read_answer(ctx: &Context, mut resp: reqwest::Response) -> Option<Answer> {
    if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        ctx.counters.gossip_bytes_received.add(chunk.len() as u64);
        if body.len() + chunk.len() > MAX_BODY {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).ok()
}

/// The shortest time between a news round and the round before it: a quarter of the
/// interval, at least this.
pub const NEWS_GAP: Duration = Duration::from_millis(250);

/// Gossip rounds until `cancel` (none when `interval` is zero): the first as soon as every
/// `--peer`'s descriptor is held (a newcomer announces itself at once), then every `interval`,
/// and a *news round* as soon as a peer is reached for the first time (a newcomer passed on at
/// once rather than at the next round), at most one per quarter interval.
pub async fn run(ctx: Arc<Context>, interval: Duration, cancel: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    let gap = (interval / 4).max(NEWS_GAP);
    tokio::select! {
        () = cancel.cancelled() => return,
        _ = ctx.peers.fetched(crate::peers::READY_WAIT) => {}
    }
    let mut next = crate::clock::now();
    loop {
        let last = crate::clock::now();
        if last >= next {
            next = last + interval;
        }
        let new = round(&ctx, interval).await;
        if new > 0 {
            let n = ctx.peers.by_source();
            info!(
                new,
                bootstrap = n.bootstrap,
                gossip = n.gossip,
                cache = n.cache,
                "peers learned by gossip"
            );
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            () = async {
                ctx.peers.news_reached().await;
                tokio::time::sleep_until((last + gap).max(crate::clock::now())).await;
            } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::node::{self, Node};
    use crate::peers::Peers;

    const T0: u64 = 1_800_000_000;

    fn context(dir: &tempfile::TempDir) -> Context {
        let clock = Clock::starting_at(T0);
        node::init(dir.path(), "https://127.0.0.1:7001", T0).unwrap();
        let node = Arc::new(Node::load(dir.path()).unwrap());
        let peers = Arc::new(Peers::new(vec![], true, clock, *node.id()));
        Context::new(node, peers, clock, 4)
    }

    fn descriptor(i: u16) -> Descriptor {
        let mut seed = [7u8; 32];
        seed[..2].copy_from_slice(&i.to_be_bytes());
        crate::proto::descriptor::for_test(
            seed,
            format!("https://127.{}.{}.1:7001", i / 256, i % 256),
            T0,
        )
    }

    #[test]
    fn one_answer_teaches_a_bounded_number_of_new_identities() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(&dir);
        let many: Vec<_> = (1..=40).map(descriptor).collect();
        assert_eq!(learn(&ctx, many.clone()), MAX_NEW_PER_ANSWER);
        assert_eq!(ctx.peers.by_source().gossip, MAX_NEW_PER_ANSWER);
        // What is already held is refreshed, not counted; the next new ones come in turn.
        assert_eq!(learn(&ctx, many.clone()), MAX_NEW_PER_ANSWER);
        // Passed on once reached (the reach probes' work).
        for d in &many {
            ctx.peers.mark_reached(&d.node_id);
        }
        let answer = answer(&ctx, DEFAULT_INTERVAL, T0);
        assert_eq!(
            answer.descriptors[0].node_id,
            *ctx.node.id(),
            "its own first"
        );
        assert_eq!(answer.descriptors.len(), 1 + 2 * MAX_NEW_PER_ANSWER);
        let all: Vec<_> = (1..=200).map(descriptor).collect();
        for chunk in all.chunks(MAX_ANSWER) {
            learn(&ctx, chunk.to_vec());
        }
        for d in &all {
            ctx.peers.mark_reached(&d.node_id);
        }
        assert_eq!(answer_len(&ctx), MAX_ANSWER, "an answer is bounded");
    }

    #[test]
    fn news_is_what_this_node_reached_lately_and_leads_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(&dir);
        let all: Vec<_> = (1..=8).map(descriptor).collect();
        assert_eq!(learn(&ctx, all.clone()), 8);
        assert!(
            news(&ctx, DEFAULT_INTERVAL, T0).is_empty(),
            "nothing reached: no news, and nothing passed on"
        );
        assert_eq!(answer_len(&ctx), 1);
        for d in &all[..3] {
            ctx.peers.mark_reached(&d.node_id);
        }
        let mut fresh: Vec<_> = news(&ctx, DEFAULT_INTERVAL, T0)
            .into_iter()
            .map(|d| d.node_id)
            .collect();
        fresh.sort_unstable();
        let mut want: Vec<_> = all[..3].iter().map(|d| d.node_id).collect();
        want.sort_unstable();
        assert_eq!(fresh, want);
        let a = answer(&ctx, DEFAULT_INTERVAL, T0);
        assert_eq!(a.descriptors.len(), 4, "its own, then the three it reached");
        // A failed peer is not passed on; news grows old after NEWS_ROUNDS intervals.
        ctx.health.record_route(&all[0].node_id, false, T0);
        assert_eq!(answer_len(&ctx), 3);
        let later = T0 + DEFAULT_INTERVAL.as_secs() * u64::from(NEWS_ROUNDS) + 1;
        assert!(news(&ctx, DEFAULT_INTERVAL, later).is_empty());
    }

    fn answer_len(ctx: &Context) -> usize {
        answer(ctx, DEFAULT_INTERVAL, T0).descriptors.len()
    }
}
