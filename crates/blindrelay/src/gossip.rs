//! Discovery's driver in the daemon: the I/O around [`crate::discovery`]'s machine.
//!
//! - **Out**: every [`TICK`] (and at once when woken: a newcomer kept, a peer reached), the
//!   machine is polled and each request it returns is posted to `POST /v1/discovery` at the
//!   peer's endpoint, over the link pinned to its id, at most [`MAX_EXCHANGES`] at once (the
//!   machine's own bound, [`crate::discovery::Config::max_exchanges`]; here a backstop). The
//!   answer is read chunk by chunk, dropped past [`MAX_BODY`], all within the machine's
//!   exchange timeout; its descriptors are screened by the machine, checked in batches on a
//!   crypto slot, then handed back with the answer.
//! - **In**: `POST /v1/discovery` (`crate::api`): the request's descriptors are checked the
//!   same way (the crypto slot the listener's admission gave), the caller named by its link's
//!   client certificate (mutual TLS), and the machine's answer returned.
//!
//! An answer `429` (the peer has no crypto slot or budget for it now), and an exchange that
//! finds all [`MAX_EXCHANGES`] slots taken here, go back as [`Failed::Busy`]: asked again
//! soon, nothing counted against the peer. Any other failure is [`Failed::Down`].
//!
//! Message bytes both ways and both roles are counted (`gossip_bytes_sent`,
//! `gossip_bytes_received`). This node's own descriptor is handed to the machine whenever it
//! is reissued. Nothing here logs an id beyond its 8-hex prefix, nor any endpoint or address.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::context::{self, Context};
use crate::discovery::{Failed, Msg, Out, Signed, verify};
use crate::proto::descriptor::Descriptor;

pub use crate::discovery::DEFAULT_INTERVAL;
/// The machine is polled at least this often.
pub const TICK: Duration = Duration::from_millis(250);
/// Largest discovery request or answer body.
pub const MAX_BODY: usize = 1024 * 1024;
/// Exchanges in flight at most.
pub use crate::discovery::MAX_EXCHANGES;

/// The descriptors `msg` carries that the machine wants checked and that verify, checked on a
/// crypto slot (`slot`, or one waited for as a send waits); none when no slot comes. `None`
/// when nothing was worth a check (the slot given back at once).
pub async fn check(
    ctx: &Context,
    msg: &Msg,
    slot: Option<context::CryptoSlot>,
) -> Option<Vec<Arc<Signed>>> {
    let carried = verify::carried(msg);
    if carried.is_empty() {
        return None;
    }
    let now = ctx.peers.now();
    let worth = ctx.peers.lock().screen(carried, now);
    if !worth.iter().any(|w| *w) {
        return None;
    }
    let slot = match slot {
        Some(slot) => slot,
        None => ctx.crypto.slot().await?,
    };
    let ds: Vec<Descriptor> = carried.to_vec();
    let checked = context::on_crypto_slot(slot, move || verify::check(&ds, &worth, now.unix)).await;
    Some(checked.unwrap_or_default())
}

/// Posts `out`'s request and hands its answer (or its failure) back to the machine.
async fn exchange(ctx: Arc<Context>, out: Out, timeout: Duration) {
    let body = out.msg.to_bytes();
    ctx.counters.gossip_bytes_sent.add(body.len() as u64);
    let url = format!("{}/v1/discovery", out.to.d.endpoint.trim_end_matches('/'));
    let http = ctx.outgoing.links.client(Some(&out.to.d.node_id));
    let started = crate::clock::now();
    let answer = tokio::time::timeout(timeout, post(&ctx, &http, &url, body))
        .await
        .unwrap_or(Err(Failed::Down))
        .and_then(|b| Msg::decode(&b).map_err(|_| Failed::Down));
    let took = crate::clock::now().duration_since(started);
    ctx.counters
        .gossip_exchange_micros
        .add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    match answer {
        Ok(msg) => {
            let checked = check(&ctx, &msg, None).await.unwrap_or_default();
            let now = ctx.peers.now();
            ctx.peers.lock().on_reply(out.xid, Ok(&msg), checked, now);
        }
        Err(failed) => {
            let now = ctx.peers.now();
            ctx.peers
                .lock()
                .on_reply(out.xid, Err(failed), Vec::new(), now);
        }
    }
    ctx.peers.changed();
}

/// The body of the answer to `body` posted at `url`, read chunk by chunk and dropped past
/// [`MAX_BODY`]; [`Failed::Busy`] for a `429` (the peer is up, with no room now),
/// [`Failed::Down`] on any other failure or refusal.
async fn post(
    ctx: &Context,
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, Failed> {
    let mut resp = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
        .body(body)
        .send()
        .await
        .map_err(|_| Failed::Down)?;
    if resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
        return Err(Failed::Busy);
    }
    if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(Failed::Down);
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|_| Failed::Down)? {
        ctx.counters.gossip_bytes_received.add(chunk.len() as u64);
        if out.len() + chunk.len() > MAX_BODY {
            return Err(Failed::Down);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Drives discovery until `cancel` (nothing when `interval` is zero): waits until every
/// `--peer` and seed was fetched once, answered or failed (at most
/// [`crate::peers::READY_WAIT`]; one that answers later is reconciled with then), then polls
/// the machine every [`TICK`] and whenever woken, and sends what it asks for.
pub async fn run(ctx: Arc<Context>, interval: Duration, cancel: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    tokio::select! {
        () = cancel.cancelled() => return,
        _ = ctx.peers.tried(crate::peers::READY_WAIT) => {}
    }
    let slots = Arc::new(Semaphore::new(MAX_EXCHANGES));
    let timeout = ctx.peers.lock().exchange_timeout();
    let mut reported = None;
    loop {
        let now = ctx.peers.now();
        let own = Arc::new(Signed::trusted(ctx.node.descriptor(now.unix)));
        let outs = {
            let mut disc = ctx.peers.lock();
            disc.set_own(own);
            disc.poll(now)
        };
        for out in outs {
            let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                // No room here (an exchange the machine gave up on still winding down):
                // nothing the peer did.
                ctx.peers
                    .lock()
                    .on_reply(out.xid, Err(Failed::Busy), Vec::new(), now);
                continue;
            };
            let ctx = Arc::clone(&ctx);
            let tasks = ctx.tasks().clone();
            tasks.spawn(async move {
                exchange(ctx, out, timeout).await;
                drop(permit);
            });
        }
        report(&ctx, &mut reported);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
            () = ctx.peers.woken() => {}
        }
    }
}

/// Logs what eclipse detection says when it changes, and at most every ten minutes while it
/// is not content.
fn report(
    ctx: &Context,
    last: &mut Option<(crate::discovery::EclipseState, crate::clock::Instant)>,
) {
    let e = ctx.peers.lock().eclipse();
    let now = crate::clock::now();
    let due = match last {
        Some((state, at)) => {
            *state != e.state
                || (e.state != crate::discovery::EclipseState::Ok
                    && now.duration_since(*at) >= Duration::from_secs(600))
        }
        None => e.state != crate::discovery::EclipseState::Ok,
    };
    if !due {
        return;
    }
    *last = Some((e.state, now));
    let top = format!("{:.0}%", e.top_share * 100.0);
    let unconfirmed = format!("{:.0}%", e.unconfirmed_share * 100.0);
    match e.state {
        crate::discovery::EclipseState::Ok => info!(
            held = e.held,
            roots = e.roots,
            "peers come from several sources that vouch for each other's"
        ),
        crate::discovery::EclipseState::OneSource => warn!(
            held = e.held,
            top,
            "nearly every peer this node knows came through one source (one /16): it may be \
             eclipsed; pass --peer of other operators or --seeds"
        ),
        crate::discovery::EclipseState::Unconfirmed => warn!(
            held = e.held,
            roots = e.roots,
            unconfirmed,
            "this node's sources disagree about the network: most peers are vouched for by one \
             source only; it may be eclipsed"
        ),
    }
}
