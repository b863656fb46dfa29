//! `--metrics ADDR` in single-server mode: `GET /metrics` over plain HTTP/1.1, the same text the
//! control API serves with several servers.
//!
//! A deliberately small listener: one request per connection, the request head read within
//! [`READ_TIMEOUT`] and at most [`MAX_HEAD`] bytes, the answer written within
//! [`WRITE_TIMEOUT`], at most [`MAX_CONNECTIONS`] connections at once (more are closed at
//! once). Other routes and methods get a JSON error with a 4xx status.

use std::sync::Arc;
use std::time::Duration;

use guard::counters::{Kind, PromText};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, trace, warn};

use crate::server::{Budget, ServerHandle, ServerMetrics};

/// Time to read a request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to write the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
pub const MAX_HEAD: usize = 8192;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` for `server` on `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    server: Arc<ServerHandle>,
    budget: Budget,
    cancel: CancellationToken,
) {
    match listener.local_addr() {
        Ok(a) => info!("metrics on {a}"),
        Err(e) => warn!("metrics: {e}"),
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            () = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    trace!(error = %e, "metrics accept");
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let (server, budget) = (Arc::clone(&server), budget.clone());
        tokio::spawn(async move {
            answer(stream, &server, &budget).await;
            drop(permit);
        });
    }
}

/// Reads one request and answers it; every step bounded in time.
async fn answer(mut stream: TcpStream, server: &ServerHandle, budget: &Budget) {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Some(h)) => h,
        Ok(None) => return,
        Err(_) => {
            trace!("metrics: request head timed out");
            return;
        }
    };
    let (status, kind, body) = route(&head, || render(server, budget));
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        let _ = stream.write_all(text.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The request head (up to the blank line), or what arrived before [`MAX_HEAD`] bytes or the
/// end of the stream; `None` when nothing did.
async fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    (!head.is_empty()).then_some(head)
}

/// Status line, content type and body for a request head.
fn route(head: &[u8], metrics: impl FnOnce() -> String) -> (&'static str, &'static str, String) {
    const JSON: &str = "application/json";
    let error = |status, code: &str, message: &str| {
        (
            status,
            JSON,
            serde_json::json!({"error": code, "message": message}).to_string(),
        )
    };
    if !head.windows(4).any(|w| w == b"\r\n\r\n") {
        return error(
            "431 Request Header Fields Too Large",
            "bad_request",
            "request head too large or incomplete",
        );
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return error("400 Bad Request", "bad_request", "malformed request line");
    };
    if !version.starts_with(b"HTTP/1.") {
        return error("400 Bad Request", "bad_request", "malformed request line");
    }
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    if path != b"/metrics" {
        return error("404 Not Found", "not_found", "no such route");
    }
    if method != b"GET" {
        return error(
            "405 Method Not Allowed",
            "method_not_allowed",
            "method not allowed on this route",
        );
    }
    ("200 OK", "text/plain; version=0.0.4", metrics())
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
    use super::*;

    fn req(head: &str) -> (&'static str, String) {
        let (s, _, b) = route(head.as_bytes(), || "m".to_string());
        (s, b)
    }

    #[test]
    fn routes_and_errors() {
        assert_eq!(req("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").0, "200 OK");
        assert_eq!(req("GET /metrics?x=1 HTTP/1.0\r\n\r\n").1, "m");
        let (s, b) = req("GET /other HTTP/1.1\r\n\r\n");
        assert!(s.starts_with("404") && b.contains("\"not_found\""), "{b}");
        assert!(req("POST /metrics HTTP/1.1\r\n\r\n").0.starts_with("405"));
        assert!(req("garbage\r\n\r\n").0.starts_with("400"));
        assert!(req("GET /metrics SPDY\r\n\r\n").0.starts_with("400"));
        assert!(req("GET /metrics HTTP/1.1\r\n").0.starts_with("431"));
    }
}
