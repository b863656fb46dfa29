//! `--metrics ADDR` in single-server mode: `GET /metrics` over plain HTTP/1.1, the same text the
//! control API serves with several servers.
//!
//! An axum [`Router`] on the shared [`listener`] accept loop: one request per connection, the
//! request head read within [`READ_TIMEOUT`] and at most [`MAX_HEAD`] bytes (a longer one is
//! answered 431, a malformed one 400), the whole connection over within [`READ_TIMEOUT`] +
//! [`WRITE_TIMEOUT`], at most [`MAX_CONNECTIONS`] connections at once (more are closed at
//! once). Other routes get a JSON error with 404, other methods on `/metrics` (`HEAD`
//! included) 405.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use guard::counters::{Kind, PromText};
use listener::{Closed, Config, Hooks, Limits, Listener, Refused};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, trace, warn};

use crate::server::{Budget, ServerHandle, ServerMetrics};

/// Time to read a request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to write the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read (hyper's smallest read buffer).
pub const MAX_HEAD: usize = listener::MIN_HEAD;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a scrape in flight gets to finish when the relay stops.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// Pause after an accept error (a full descriptor table) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `GET /metrics` for `server` on `listener` until `cancel`, then stops within
/// [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    server: Arc<ServerHandle>,
    budget: Budget,
    cancel: CancellationToken,
) {
    serve_router(listener, router(move || render(&server, &budget)), cancel).await;
}

/// Serves `app` within this module's bounds.
async fn serve_router(listener: TcpListener, app: Router, cancel: CancellationToken) {
    match listener.local_addr() {
        Ok(a) => info!(addr = %a, "metrics: listening"),
        Err(e) => warn!(error = %e, "metrics: no address"),
    }
    let config = Config {
        header_timeout: READ_TIMEOUT,
        conn_deadline: Some(READ_TIMEOUT + WRITE_TIMEOUT),
        keep_alive: false,
        max_head: MAX_HEAD,
        grace: SHUTDOWN_GRACE,
        accept_backoff: ACCEPT_BACKOFF,
    };
    // One cap: a scraper is one address, and the listener's address is the operator's choice.
    let caps = Limits {
        total: MAX_CONNECTIONS,
        per_source: MAX_CONNECTIONS,
        reserved: 0,
    };
    Listener::per_ip(config, caps)
        .with_hooks(Trace)
        .serve(listener, app, cancel)
        .await;
}

/// Everything at trace level: the metrics port says nothing unasked.
#[derive(Debug)]
struct Trace;

impl Hooks for Trace {
    fn refused(&self, r: &Refused) {
        trace!(open = r.open, "metrics: connection refused");
    }
    fn accept_failed(&self, e: &io::Error) {
        trace!(error = %e, "metrics accept");
    }
    fn closed(&self, _peer: SocketAddr, how: &Closed) {
        if !matches!(how, Closed::Done) {
            trace!(how = %how, "metrics: connection closed");
        }
    }
}

/// `GET /metrics` answered with `metrics()`; JSON errors elsewhere.
fn router(metrics: impl Fn() -> String + Clone + Send + Sync + 'static) -> Router {
    let scrape = move || {
        let metrics = metrics.clone();
        async move {
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                metrics(),
            )
        }
    };
    Router::new()
        .route("/metrics", get(scrape).head(method_not_allowed))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(method_not_allowed)
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// `{"error": code, "message": message}` with `status`.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": code, "message": message})),
    )
        .into_response()
}

/// The counters of the one server, as the control API renders them.
fn render(server: &ServerHandle, budget: &Budget) -> String {
    let mut out = PromText::new();
    out.family(
        "etrelay_sessions_open_all",
        Kind::Gauge,
        "Sessions open, all servers together.",
    )
    .sample(
        "etrelay_sessions_open_all",
        &[],
        server.metrics().sessions_open.get(),
    );
    out.family(
        "etrelay_queued_bytes",
        Kind::Gauge,
        "Bytes queued towards the game servers, all servers together.",
    )
    .sample("etrelay_queued_bytes", &[], budget.queued_bytes() as u64);
    ServerMetrics::render_all(&[(server.public_addr().port(), server.metrics())], &mut out);
    out.finish()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// The listener with metrics "m" on 127.0.0.1, and what each of `requests` gets back (the
    /// connection read to its end).
    async fn ask(requests: &[&[u8]]) -> Vec<String> {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let served = tokio::spawn(serve_router(
            tcp,
            router(|| "m".to_string()),
            cancel.clone(),
        ));
        let mut answers = vec![];
        for request in requests {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(request).await.unwrap();
            s.shutdown().await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            answers.push(out);
        }
        cancel.cancel();
        served.await.unwrap();
        answers
    }

    #[tokio::test]
    async fn routes_and_errors() {
        let long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        let got = ask(&[
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /metrics?x=1 HTTP/1.0\r\n\r\n",
            b"GET /other HTTP/1.1\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"HEAD /metrics HTTP/1.1\r\n\r\n",
            b"garbage\r\n\r\n",
            b"GET /metrics SPDY\r\n\r\n",
            long.as_bytes(),
        ])
        .await;
        let ok = &got[0];
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        let lower = ok.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: text/plain; version=0.0.4\r\n"),
            "{ok}"
        );
        assert!(lower.contains("content-length: 1\r\n"), "{ok}");
        assert!(lower.contains("connection: close\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nm"), "{ok}");
        assert!(got[1].starts_with("HTTP/1.0 200") && got[1].ends_with("\r\n\r\nm"));
        let nf = &got[2];
        assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
        assert!(
            nf.to_ascii_lowercase()
                .contains("content-type: application/json")
        );
        assert!(
            nf.ends_with(r#"{"error":"not_found","message":"no such route"}"#),
            "{nf}"
        );
        assert!(got[3].starts_with("HTTP/1.1 405"), "{}", got[3]);
        assert!(
            got[3].contains(r#""error":"method_not_allowed""#),
            "{}",
            got[3]
        );
        // An answer to HEAD has no body.
        assert!(got[4].starts_with("HTTP/1.1 405"), "{}", got[4]);
        assert!(got[5].starts_with("HTTP/1.1 400"), "{}", got[5]);
        assert!(got[6].starts_with("HTTP/1.1 400"), "{}", got[6]);
        assert!(got[7].starts_with("HTTP/1.1 431"), "{}", got[7]);
    }
}
