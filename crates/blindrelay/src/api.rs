//! The two listeners: the public relay listener (`--listen`: descriptor and relay) and the
//! operator listener (`--operator`, loopback by default: send, inbox, status). Both share the
//! one process-wide [`Relay`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::pipeline::{Reason, Relay, Reply};
use crate::proto::envelope::MAX_ENVELOPE;
use crate::proto::{NodeId, from_hex};
use crate::send::{self, SendError};

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body,
        )
            .into_response()
    }
}

/// The public relay listener.
pub fn public(relay: Arc<Relay>) -> Router {
    Router::new()
        .route("/v1/descriptor", get(descriptor))
        .route("/v1/relay", post(relay_request))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(json!({"error": "not_found"}))) })
        .with_state(relay)
}

/// The operator listener.
pub fn operator(relay: Arc<Relay>) -> Router {
    Router::new()
        .route("/v1/send", post(send_message))
        .route("/v1/inbox", get(inbox_list))
        .route("/v1/inbox/{id}", get(inbox_item))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/v1/probe", post(probe_now))
        .route("/v1/descriptor", get(descriptor))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(json!({"error": "not_found"}))) })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_ENVELOPE))
        .with_state(relay)
}

async fn descriptor(State(relay): State<Arc<Relay>>) -> Response {
    Json(relay.node.descriptor(relay.clock.unix())).into_response()
}

/// `POST /v1/relay`: step 1 before the body is read, the body capped before it is parsed.
async fn relay_request(State(relay): State<Arc<Relay>>, req: Request) -> Response {
    let admitted = match relay.admit() {
        Ok(a) => a,
        Err(reply) => return reply.into_response(),
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_ENVELOPE).await {
        Ok(b) => b,
        Err(_) => return relay.refuse(Reason::EnvelopeTooLarge).into_response(),
    };
    relay.process(admitted, body.to_vec()).await.into_response()
}

#[derive(Debug, Deserialize)]
struct SendQuery {
    to: String,
    hops: usize,
}

fn op_error(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

async fn send_message(
    State(relay): State<Arc<Relay>>,
    Query(q): Query<SendQuery>,
    body: axum::body::Bytes,
) -> Response {
    let Some(to) = from_hex::<32>(&q.to) else {
        return op_error(
            StatusCode::BAD_REQUEST,
            "bad_node_id",
            "`to` must be a node id (64 hex)".into(),
        );
    };
    let to: NodeId = to;
    match send::send(&relay, to, q.hops, body.to_vec()).await {
        Ok(d) => Json(json!({"delivered": true, "terminal": d.terminal, "hops": d.hops, "delivered_at": d.delivered_at}))
            .into_response(),
        Err(e) => {
            let (status, code) = match &e {
                SendError::UnknownTerminal => (StatusCode::NOT_FOUND, "unknown_terminal"),
                SendError::NotEnoughPeers(_) => (StatusCode::CONFLICT, "not_enough_peers"),
                SendError::NoHops | SendError::TooLarge(_) => (StatusCode::BAD_REQUEST, "bad_request"),
                SendError::Backpressure => (StatusCode::TOO_MANY_REQUESTS, "backpressure"),
                SendError::Refused => (StatusCode::BAD_GATEWAY, "refused"),
                SendError::Unreachable => (StatusCode::BAD_GATEWAY, "unreachable"),
                SendError::Receipt(_) => (StatusCode::BAD_GATEWAY, "receipt_invalid"),
                SendError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            };
            op_error(status, code, e.to_string())
        }
    }
}

async fn inbox_list(State(relay): State<Arc<Relay>>) -> Response {
    match relay.inbox().list() {
        Ok(items) => Json(json!({ "items": items })).into_response(),
        Err(_) => op_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "inbox_unavailable",
            "the inbox cannot be read".into(),
        ),
    }
}

async fn inbox_item(State(relay): State<Arc<Relay>>, Path(id): Path<u64>) -> Response {
    match relay.inbox().get(id) {
        Ok(Some(bytes)) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from(bytes),
        )
            .into_response(),
        Ok(None) => op_error(StatusCode::NOT_FOUND, "not_found", "no such item".into()),
        Err(_) => op_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "inbox_unavailable",
            "the inbox cannot be read".into(),
        ),
    }
}

async fn status(State(relay): State<Arc<Relay>>) -> Response {
    Json(crate::status::document(&relay)).into_response()
}

async fn metrics(State(relay): State<Arc<Relay>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::status::metrics(&relay),
    )
        .into_response()
}

/// Runs a probe round now (the periodic one runs every `--probe-interval`).
async fn probe_now(State(relay): State<Arc<Relay>>) -> Response {
    crate::probe::round(&relay).await;
    let s = relay.counters.snapshot();
    Json(json!({
        "probe_attempted": s.probe_attempted, "probe_succeeded": s.probe_succeeded, "probe_failed": s.probe_failed,
        "two_hop_probe_attempted": s.two_hop_probe_attempted, "two_hop_probe_succeeded": s.two_hop_probe_succeeded,
        "two_hop_probe_failed": s.two_hop_probe_failed,
    }))
    .into_response()
}
