//! `POST /v1/discovery` on the public listener ([`crate::gossip`], [`crate::discovery`]): one
//! discovery message in, the machine's answer out. The source pays the request gate's cheap
//! budget, then takes a crypto slot like a relay request (a stranger's within the strangers'
//! share), refused at once when there is none: the descriptors the message carries are
//! checked on it, and a reconciliation round computed. The body is read within its deadline
//! and capped at [`gossip::MAX_BODY`]; bytes that are not a message get a JSON error and change
//! nothing. The caller is named by its link's client certificate (mutual TLS); a caller with
//! none is a stranger, whose pushes are not taken. Not counted as relay traffic; its bytes are
//! counted as gossip's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Extension, Request, State};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::discovery::{Caller, Msg};
use crate::gossip;
use crate::links::LinkPeer;
use crate::pipeline::ingress::body_deadline;
use crate::reason::Reason;
use crate::relay::Relay;

/// The message answered; a refusal counted (`discovery_requests_refused`).
pub(super) async fn exchange(
    State(relay): State<Arc<Relay>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    link: Option<Extension<LinkPeer>>,
    req: Request,
) -> Result<Response, ApiError> {
    let answered = answer(&relay, peer, link, req).await;
    if answered.is_err() {
        relay.ctx().counters.discovery_requests_refused.inc();
    }
    answered
}

async fn answer(
    relay: &Arc<Relay>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    link: Option<Extension<LinkPeer>>,
    req: Request,
) -> Result<Response, ApiError> {
    let pipeline = relay.pipeline();
    let ip = peer.map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(p))| {
        p.ip()
    });
    let caller = Caller {
        id: link.and_then(|Extension(LinkPeer(id))| id),
        ip,
    };
    let source = pipeline.classify(ip);
    let (slot, share) = pipeline.admit_other(&source)?;
    let admitted = crate::clock::now();
    let limit = gossip::MAX_BODY;
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
    let msg = Msg::decode(&body).map_err(|_| ApiError::Refused(Reason::MalformedEnvelope))?;
    let checked = gossip::check(&ctx, &msg, Some(slot)).await;
    drop(share);
    if checked.is_some() {
        let held = crate::clock::now().duration_since(admitted);
        ctx.counters.discovery_requests_checked.inc();
        ctx.counters
            .discovery_check_micros
            .add(u64::try_from(held.as_micros()).unwrap_or(u64::MAX));
    }
    let checked = checked.unwrap_or_default();
    let now = ctx.peers.now();
    let answer = ctx.peers.lock().on_request(caller, &msg, checked, now);
    ctx.peers.changed();
    let body = answer.to_bytes();
    ctx.counters.gossip_bytes_sent.add(body.len() as u64);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        body,
    )
        .into_response())
}
