//! The two listeners: the public relay listener (`--listen`: descriptor and relay) and the
//! operator listener (`--operator`, loopback by default: send, inbox, status, metrics, probe).
//! Both take the node's handle, [`Relay`]: its [`crate::pipeline::Pipeline`], stores and [`crate::context::Context`].
//!
//! Handlers turn what the pipeline, the sender and the stores decide into responses; every
//! error goes through [`ApiError`]. SQLite reads and the status document (whose locks may wait
//! for a commit) run on blocking threads. Both listeners run [`serve::serve`] (the shared `listener`
//! accept loop): header and idle timeouts, and capped connections per source.
//!
//! A relay request (`POST /v2/relay`, one v2 frame) has a body deadline: [`BODY_BASE`] plus its
//! length at [`BODY_MIN_RATE`] (a declared `Content-Length` over the largest frame is refused at
//! once with 413). `POST /v1/relay` is mounted only to refuse v1 senders with
//! `400 v1_not_accepted` (counted, never scored), without reading the body. A body
//! that does not arrive in time is refused (`request_timeout`, 408) and its connection closed.
//! The in-flight slot is taken only once the body is read and framed. All of this is the
//! pipeline's way in (`crate::pipeline::ingress`), which a framed link's frames take too.
//! From there the request runs in its own task, holding its slot, to the end of its deadline at
//! most: a client that disconnects does not cancel it, so its route is completed and its
//! answer stored rather than left in flight. A request not over when its previous hop must
//! have the answer is answered `503 route_in_flight` and goes on (`forward::late_deadline`).

pub mod cookie;
mod discovery;
mod error;
mod fixed;
mod link;
pub mod serve;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

pub use self::error::ApiError;
use crate::links::LinkPeer;
use crate::pipeline::ingress::{BodyError, Refused};
use crate::pipeline::{Admitted, Pipeline};
use crate::proto::frame::MAX_FRAME;
use crate::proto::from_hex;
use crate::reason::Reason;
use crate::relay::Relay;
use crate::send::{self, Delivered};
use crate::terminal::InboxItem;
use crate::{probe, status};

/// The public relay listener.
pub fn public(relay: Arc<Relay>) -> Router {
    Router::new()
        .route("/v1/descriptor", get(descriptor))
        .route("/v2/relay", post(relay_request))
        .route("/v1/relay", post(v1_relay))
        .route("/v1/discovery", post(discovery::exchange))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(relay)
}

/// The operator listener: every path needs the operator `cookie` ([`cookie::require`]).
pub fn operator(relay: Arc<Relay>, cookie: cookie::Cookie) -> Router {
    Router::new()
        .route("/v1/send", post(send_message))
        .route("/v1/inbox", get(inbox_list))
        .route("/v1/inbox/{id}", get(inbox_item).delete(inbox_delete))
        .route("/v1/status", get(status_document))
        .route("/metrics", get(metrics))
        .route("/v1/probe", post(probe_now))
        .route("/v1/descriptor", get(descriptor))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_FRAME))
        .layer(axum::middleware::from_fn_with_state(
            cookie,
            cookie::require,
        ))
        .with_state(relay)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such path")
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Runs blocking work (SQLite, locks that may wait for a commit) off the reactor.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ApiError::Internal)
}

async fn descriptor(State(relay): State<Arc<Relay>>) -> Response {
    let ctx = relay.ctx();
    Json(ctx.node.descriptor(ctx.clock.unix())).into_response()
}

/// `POST /v1/relay`: the v1 protocol is not accepted. The source's cheap budget is charged
/// first, so the refusal costs no more than any other cheap one; the body is never read.
async fn v1_relay(
    State(relay): State<Arc<Relay>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
) -> Result<Response, ApiError> {
    let pipeline = relay.pipeline();
    let ip = peer.map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(p))| {
        p.ip()
    });
    let source = pipeline.classify(ip);
    pipeline.cheap(&source)?;
    Err(pipeline.refuse(&source, None, Reason::V1NotAccepted).into())
}

/// `POST /v2/relay`: the pipeline's way in ([`Pipeline::take_in`]: the cheap budget, the
/// declared length, the body within its deadline, framing and admission), then the request in
/// its own task.
async fn relay_request(
    State(relay): State<Arc<Relay>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    link: Option<Extension<LinkPeer>>,
    req: Request,
) -> Result<Response, ApiError> {
    let link = link.and_then(|Extension(LinkPeer(id))| id);
    let pipeline = relay.pipeline();
    let ip = peer.map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(p))| {
        p.ip()
    });
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A body cut short or over the largest frame reads as too large.
    let body = async {
        axum::body::to_bytes(req.into_body(), MAX_FRAME)
            .await
            .map_err(|_| BodyError::TooLarge)
    };
    let admitted = match pipeline.take_in(ip, link, declared, body).await {
        Ok(admitted) => admitted,
        Err(Refused::Unread(r) | Refused::Read(r)) => return Err(r.into()),
        Err(Refused::Broken(_)) => return Err(ApiError::Internal),
    };
    // Refused after admission, the body was read and judged: the connection stays open
    // whatever the reason (a stranger over its crypto share retries on it).
    let (status, body) = process_admitted(pipeline, admitted).await?;
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Ok(fixed::relay_response(status, &body, false))
}

/// The stages of an admitted relay request (over HTTP or a framed link): the answer or the
/// refusal after admission as the protocol has it (a replayed one exactly as first sent), its
/// status and unpadded body.
///
/// The request runs to its end in its own task, within its deadline, even if the client goes
/// away: a reserved route is always completed (its answer stored for duplicates), never left in
/// flight to the end of its window, and never run twice. Not over when the previous hop must
/// have its answer: `route_in_flight`, which it may retry; the request goes on and its final
/// answer is stored for that retry.
async fn process_admitted(
    pipeline: &Arc<Pipeline>,
    admitted: Admitted,
) -> Result<(u16, Vec<u8>), ApiError> {
    let answer_by = admitted.answer_by();
    let p = Arc::clone(pipeline);
    let tasks = pipeline.ctx().tasks();
    let mut task = tasks.spawn(async move { p.process(admitted).await });
    match tokio::time::timeout_at(answer_by, &mut task).await {
        Ok(joined) => Ok(crate::pipeline::wire(
            &joined.map_err(|_| ApiError::Internal)?,
        )),
        Err(_) => {
            pipeline.ctx().counters.answered_in_flight.inc();
            Err(ApiError::Refused(Reason::RouteInFlight))
        }
    }
}

/// `POST /v1/send`'s query string.
#[derive(Debug, Deserialize)]
struct SendQuery {
    to: String,
    hops: usize,
}

/// `POST /v1/send`'s answer: a verified delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    /// Always true: anything else is an error.
    pub delivered: bool,
    /// What was delivered where.
    #[serde(flatten)]
    pub delivery: Delivered,
}

async fn send_message(
    State(relay): State<Arc<Relay>>,
    query: Result<Query<SendQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Sent>, ApiError> {
    let Query(q) = query?;
    let body = body?;
    let to = from_hex::<32>(&q.to).ok_or(ApiError::BadNodeId)?;
    let delivery = send::send(relay.ctx(), to, q.hops, body.to_vec()).await?;
    Ok(Json(Sent {
        delivered: true,
        delivery,
    }))
}

/// `GET /v1/inbox`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxList {
    /// Every item, oldest first.
    pub items: Vec<InboxItem>,
}

async fn inbox_list(State(relay): State<Arc<Relay>>) -> Result<Json<InboxList>, ApiError> {
    let inbox = Arc::clone(relay.terminal().inbox());
    let items = blocking(move || inbox.list())
        .await?
        .map_err(|_| ApiError::InboxUnavailable)?;
    Ok(Json(InboxList { items }))
}

async fn inbox_item(
    State(relay): State<Arc<Relay>>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    let inbox = Arc::clone(relay.terminal().inbox());
    match blocking(move || inbox.get(id)).await? {
        Ok(Some(bytes)) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from(bytes),
        )
            .into_response()),
        Ok(None) => Err(ApiError::NotFound("no such item")),
        Err(_) => Err(ApiError::InboxUnavailable),
    }
}

/// `DELETE /v1/inbox/{id}`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// The item deleted.
    pub deleted: u64,
    /// Its size in bytes.
    pub size: u64,
}

async fn inbox_delete(
    State(relay): State<Arc<Relay>>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Deleted>, ApiError> {
    let Path(id) = id?;
    let terminal = relay.terminal().clone();
    match blocking(move || terminal.remove(id)).await? {
        Ok(Some(size)) => {
            let c = &relay.ctx().counters;
            c.inbox_removed.inc();
            c.last_inbox_freed_at.set(relay.ctx().clock.unix());
            Ok(Json(Deleted { deleted: id, size }))
        }
        Ok(None) => Err(ApiError::NotFound("no such item")),
        Err(_) => Err(ApiError::InboxUnavailable),
    }
}

async fn status_document(
    State(relay): State<Arc<Relay>>,
) -> Result<Json<status::Document>, ApiError> {
    Ok(Json(blocking(move || status::document(&relay)).await?))
}

async fn metrics(State(relay): State<Arc<Relay>>) -> Result<Response, ApiError> {
    let text = blocking(move || status::metrics::render(&relay)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// `POST /v1/probe`'s answer: the probe counters after the round.
#[derive(Debug, Serialize)]
struct ProbeCounts {
    probe_attempted: u64,
    probe_succeeded: u64,
    probe_failed: u64,
    two_hop_probe_attempted: u64,
    two_hop_probe_succeeded: u64,
    two_hop_probe_failed: u64,
}

/// Runs a probe round now (the periodic one runs every `--probe-interval`).
async fn probe_now(State(relay): State<Arc<Relay>>) -> Json<ProbeCounts> {
    let ctx = relay.ctx();
    probe::round(ctx).await;
    let s = ctx.counters.snapshot();
    Json(ProbeCounts {
        probe_attempted: s.probe_attempted,
        probe_succeeded: s.probe_succeeded,
        probe_failed: s.probe_failed,
        two_hop_probe_attempted: s.two_hop_probe_attempted,
        two_hop_probe_succeeded: s.two_hop_probe_succeeded,
        two_hop_probe_failed: s.two_hop_probe_failed,
    })
}
