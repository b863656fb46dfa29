//! `POST /v1/gossip` on the public listener ([`crate::gossip`]): the caller's descriptor in,
//! this node's answer out. The source pays the request gate's cheap budget, then the
//! descriptor's signature check takes a crypto slot like a relay request's (a stranger's within
//! the strangers' share): refused at once when there is none. The body is one descriptor, read
//! within its deadline and capped at [`gossip::MAX_ANNOUNCE`] bytes. A source introduces a
//! bounded number of identities new to this node ([`gossip::Introductions`]); past it, its
//! announcements are answered but not learned. Not counted as relay traffic.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, Extension, Request, State};

use super::{ApiError, body_deadline};
use crate::context;
use crate::gossip::{self, Announce, Answer};
use crate::reason::Reason;
use crate::relay::Relay;

/// The caller's descriptor learned (within the gossip bounds), this node's answer given.
pub(super) async fn exchange(
    State(relay): State<Arc<Relay>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    req: Request,
) -> Result<Json<Answer>, ApiError> {
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
    let announce: Announce =
        serde_json::from_slice(&body).map_err(|_| ApiError::Refused(Reason::MalformedEnvelope))?;
    let ctx = Arc::clone(relay.ctx());
    let new = !ctx.peers.holds(&announce.descriptor.node_id);
    let introduce = !new
        || relay
            .introductions()
            .allow(source.key(), ctx.clock.instant());
    let answer = context::on_crypto_slot(slot, move || {
        if introduce {
            gossip::learn(&ctx, vec![announce.descriptor]);
        }
        drop(share);
        gossip::answer(&ctx, ctx.clock.unix())
    })
    .await
    .ok_or(ApiError::Internal)?;
    Ok(Json(answer))
}
