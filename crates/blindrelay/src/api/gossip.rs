//! `POST /v1/gossip` on the public listener ([`crate::gossip`]): the caller's descriptor in,
//! this node's answer out. The source pays the request gate's cheap budget, then the
//! descriptor's signature check takes a crypto slot like a relay request's (a stranger's within
//! the strangers' share): refused at once when there is none. The body is one descriptor, read
//! within its deadline and capped at [`gossip::MAX_ANNOUNCE`] bytes. A source introduces a
//! bounded number of identities new to this node ([`gossip::Introductions`]), its own and its
//! news alike; past it, its announcements are answered but what is new in them is not learned.
//! Not counted as relay traffic; its bytes are counted as gossip's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Extension, Request, State};
use axum::response::{IntoResponse, Response};

use super::{ApiError, body_deadline};
use crate::context;
use crate::gossip::{self, Announce};
use crate::reason::Reason;
use crate::relay::Relay;

/// The caller's descriptor learned (within the gossip bounds), this node's answer given.
pub(super) async fn exchange(
    State(relay): State<Arc<Relay>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    req: Request,
) -> Result<Response, ApiError> {
    let pipeline = relay.pipeline();
    let ip = peer.map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(p))| {
        p.ip()
    });
    let source = pipeline.classify(ip);
    let (slot, share) = pipeline.admit_other(&source)?;
    let limit = gossip::MAX_ANNOUNCE;
    let body = match tokio::time::timeout(
        body_deadline(limit as u64),
        axum::body::to_bytes(req.into_body(), limit),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return Err(ApiError::Refused(Reason::EnvelopeTooLarge)),
        Err(_) => return Err(ApiError::Refused(Reason::RequestTimeout)),
    };
    let ctx = Arc::clone(relay.ctx());
    ctx.counters.gossip_bytes_received.add(body.len() as u64);
    let announce: Announce =
        serde_json::from_slice(&body).map_err(|_| ApiError::Refused(Reason::MalformedEnvelope))?;
    if announce.news.len() > gossip::MAX_NEWS {
        return Err(ApiError::Refused(Reason::MalformedEnvelope));
    }
    let relay = Arc::clone(&relay);
    let answer = context::on_crypto_slot(slot, move || {
        let (at, key) = (ctx.clock.instant(), source.key());
        let announcer = announce.descriptor.node_id;
        let mut learned = vec![announce.descriptor];
        learned.extend(announce.news);
        gossip::learn_within(&ctx, learned, || relay.introductions().allow(key, at));
        ctx.peers.note_gossip(&announcer, ctx.clock.unix());
        drop(share);
        let answer = gossip::answer(&ctx, relay.gossip_interval(), ctx.clock.unix());
        let body = serde_json::to_vec(&answer).unwrap_or_default();
        ctx.counters.gossip_bytes_sent.add(body.len() as u64);
        body
    })
    .await
    .ok_or(ApiError::Internal)?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        answer,
    )
        .into_response())
}
