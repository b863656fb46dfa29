//! The HTTP edge's one error type. Every error of both listeners is JSON: a relay refusal is
//! `{"error": "<reason>"}` with the reason's status (the protocol's shape, also what the replay
//! registry keeps); every other error is `{"error": "<code>", "message": "<words>"}`, including
//! axum's own extractor rejections (query string, path parameter, JSON body, body limit), an
//! unknown path and a wrong method. Messages are fixed words: they never echo what the client
//! sent.

use std::borrow::Cow;

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::proto::answer::ErrorBody;
use crate::reason::Reason;
use crate::send::{Cause, SendError};

/// Why a request to either listener failed.
#[derive(Debug)]
pub enum ApiError {
    /// A relay request refused by the pipeline.
    Refused(Reason),
    /// An operator send that did not end in a verified delivery.
    Send(SendError),
    /// `to` is not a node id.
    BadNodeId,
    /// No such path, or no such inbox item.
    NotFound(&'static str),
    /// The path exists, the method does not.
    MethodNotAllowed,
    /// The inbox cannot be read.
    InboxUnavailable,
    /// A blocking task of the handler died.
    Internal,
    /// An operator request without the operator cookie.
    Unauthorized,
    /// The query string does not deserialize.
    Query(QueryRejection),
    /// A path parameter does not deserialize.
    Path(PathRejection),
    /// A JSON body does not deserialize.
    Json(JsonRejection),
    /// The body cannot be read, or is over the limit.
    Body(BytesRejection),
}

impl ApiError {
    /// The status, the code, and the message (none for relay refusals).
    fn parts(&self) -> (StatusCode, &'static str, Option<Cow<'static, str>>) {
        let words = |s: &'static str| Some(Cow::Borrowed(s));
        match self {
            ApiError::Refused(r) => (status(r.status()), r.as_str(), None),
            ApiError::Send(e) => {
                let (st, code) = match e {
                    SendError::UnknownTerminal => (StatusCode::NOT_FOUND, "unknown_terminal"),
                    SendError::NotEnoughPeers(_) => (StatusCode::CONFLICT, "not_enough_peers"),
                    SendError::NoHops | SendError::TooLarge(_) | SendError::TooManyHops(_) => {
                        (StatusCode::BAD_REQUEST, "bad_request")
                    }
                    SendError::Backpressure => (StatusCode::TOO_MANY_REQUESTS, "backpressure"),
                    SendError::QueueFull => {
                        (StatusCode::SERVICE_UNAVAILABLE, "next_hop_queue_full")
                    }
                    SendError::Route { failure, .. } => match failure.cause {
                        Cause::Unreachable => (StatusCode::BAD_GATEWAY, "unreachable"),
                        Cause::Refused { .. } | Cause::Garbled => {
                            (StatusCode::BAD_GATEWAY, "refused")
                        }
                        Cause::Receipt(_) => (StatusCode::BAD_GATEWAY, "receipt_invalid"),
                    },
                    SendError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
                };
                (st, code, Some(Cow::Owned(e.to_string())))
            }
            ApiError::BadNodeId => (
                StatusCode::BAD_REQUEST,
                "bad_node_id",
                words("`to` must be a node id (64 hex)"),
            ),
            ApiError::NotFound(what) => (StatusCode::NOT_FOUND, "not_found", words(what)),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                words("this path does not take this method"),
            ),
            ApiError::InboxUnavailable => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "inbox_unavailable",
                words("the inbox cannot be read"),
            ),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                words("the operator API needs the cookie from the node's state dir"),
            ),
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                words("internal error"),
            ),
            ApiError::Query(r) => (
                r.status(),
                "bad_query",
                words("the query string does not fit this endpoint"),
            ),
            ApiError::Path(r) => (
                r.status(),
                "bad_path",
                words("a path parameter does not fit this endpoint"),
            ),
            ApiError::Json(r) => (
                r.status(),
                "bad_json",
                words("the body is not the JSON this endpoint takes"),
            ),
            ApiError::Body(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => (
                r.status(),
                "body_too_large",
                words("the body is over this endpoint's limit"),
            ),
            ApiError::Body(r) => (r.status(), "bad_body", words("the body cannot be read")),
        }
    }
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error, message) = self.parts();
        if let ApiError::Refused(r) = self {
            // A relay refusal: at the one length of every relay answer on the link.
            return super::fixed::relay_response(
                status,
                &ErrorBody::code(error).to_json(),
                closes(r),
            );
        }
        let body = ErrorBody {
            error: Cow::Borrowed(error),
            message,
            report: None,
        };
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_json(),
        )
            .into_response()
    }
}

impl ApiError {
    /// The answer as a framed link carries it (`crate::proto::link`): its status and its body
    /// at the one length of every relay answer.
    pub(super) fn on_link(&self) -> (u16, Vec<u8>) {
        let (status, error, _) = self.parts();
        (
            status.as_u16(),
            crate::proto::answer::pad(&ErrorBody::code(error).to_json()),
        )
    }
}

/// Refusals after which the connection is closed: its body was not read (too large, too slow,
/// a v1 request), or its source is over its share.
fn closes(r: Reason) -> bool {
    matches!(
        r,
        Reason::EnvelopeTooLarge
            | Reason::RequestTimeout
            | Reason::SourceLimited
            | Reason::V1NotAccepted
    )
}

impl From<Reason> for ApiError {
    fn from(r: Reason) -> Self {
        ApiError::Refused(r)
    }
}

impl From<SendError> for ApiError {
    fn from(e: SendError) -> Self {
        ApiError::Send(e)
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::Query(r)
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::Path(r)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        ApiError::Json(r)
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        ApiError::Body(r)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::{FromRequest, Query};
    use axum::http::{Request, Uri};

    use super::*;
    use crate::pipeline::wire;

    async fn parts(e: ApiError) -> (u16, serde_json::Value) {
        let resp = e.into_response();
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/json",
            "always JSON"
        );
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_refusal_is_answered_exactly_as_the_replay_registry_keeps_it() {
        for r in Reason::ALL {
            let resp = ApiError::Refused(r).into_response();
            let status = resp.status().as_u16();
            let body = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
            let (wire_status, wire_body) = wire(&Err(r));
            let padded = crate::proto::answer::pad(&wire_body);
            assert_eq!(
                (status, body.to_vec()),
                (wire_status, padded),
                "{}",
                r.as_str()
            );
        }
    }

    #[tokio::test]
    async fn extractor_rejections_are_json_with_their_status() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Q {
            hops: usize,
        }
        let uri: Uri = "/v1/send?hops=many".parse().unwrap();
        let rejection = Query::<Q>::try_from_uri(&uri).unwrap_err();
        let (status, v) = parts(rejection.into()).await;
        assert_eq!((status, v["error"].as_str()), (400, Some("bad_query")));
        assert!(v["message"].is_string());

        let req = Request::builder().body(Body::from("{}")).unwrap();
        let rejection = axum::Json::<serde_json::Value>::from_request(req, &())
            .await
            .unwrap_err();
        let (status, v) = parts(rejection.into()).await;
        assert_eq!((status, v["error"].as_str()), (415, Some("bad_json")));

        let (status, v) = parts(ApiError::NotFound("no such item")).await;
        assert_eq!(
            (status, v["error"].as_str(), v["message"].as_str()),
            (404, Some("not_found"), Some("no such item"))
        );
    }
}
