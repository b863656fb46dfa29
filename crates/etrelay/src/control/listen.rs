//! The control API's listener: the shared [`listener`] accept loop, configured so that no
//! client can hold it open.
//!
//! - **A connection cap**: at most [`ListenLimits::max_conns`] connections at once, and at most
//!   [`ListenLimits::per_ip`] from one address, so one peer cannot take every slot: a
//!   connection over either cap is accepted and closed at once. The API's descriptors are
//!   thus bounded apart from the sessions' ([`crate::fdbudget`]).
//! - **Timeouts**: the request head must arrive within [`HEADER_TIMEOUT`], the body within
//!   [`BODY_TIMEOUT`], and no connection lives past [`ListenLimits::conn_deadline`] whatever it
//!   does. One request per connection (no keep-alive), so an idle connection is a connection
//!   whose head has not come.
//! - **Bounded shutdown**: when cancelled, the listener closes, requests in flight get
//!   [`SHUTDOWN_GRACE`], then every connection is dropped.
//! - Refused connections and accept errors (a full descriptor table) are logged at most once
//!   per [`WARN_PERIOD`], with the count of those not logged.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use guard::throttle::Throttle;
use listener::{Closed, Config, Hooks, Limits, Listener, Refused};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tracing::{debug, warn};

use crate::clock::Instant;

/// Connections to the control API at once, by default.
pub const MAX_CONNS: usize = 64;
/// Connections from one address at once, by default.
pub const MAX_CONNS_PER_IP: usize = 8;
/// Time for a request's head (request line and headers) to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a request's body to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Time requests in flight get to finish when the relay stops.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// At most one warning line per this period for refused connections and accept errors.
pub const WARN_PERIOD: Duration = Duration::from_secs(10);
/// Pause after an accept error (a full descriptor table) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Largest request head buffered (hyper's read buffer).
const MAX_HEAD: usize = 16 * 1024;

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Connections at once.
    pub max_conns: usize,
    /// Connections from one address at once.
    pub per_ip: usize,
    /// Longest life of one connection, whatever it does.
    pub conn_deadline: Duration,
}

impl ListenLimits {
    /// The defaults, with a deadline that leaves room for a registration's proof
    /// (`proof_time`: every attempt of the `getstatus` proof together).
    pub fn new(max_conns: usize, per_ip: usize, proof_time: Duration) -> Self {
        ListenLimits {
            max_conns,
            per_ip,
            conn_deadline: HEADER_TIMEOUT + BODY_TIMEOUT + proof_time + Duration::from_secs(5),
        }
    }
}

/// Refusals and accept errors logged at most once per [`WARN_PERIOD`]; connection ends at
/// debug level.
#[derive(Debug)]
struct Log {
    refused: Mutex<Throttle>,
    failed: Mutex<Throttle>,
}

impl Hooks for Log {
    fn refused(&self, r: &Refused) {
        let mut t = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = t.event(Instant::now().into_std()) {
            warn!(
                peer = %r.peer,
                open = r.open,
                max_conns = r.limits.total,
                per_ip = r.limits.per_source,
                not_logged = n,
                "control API: connection refused"
            );
        }
    }

    fn accept_failed(&self, e: &io::Error) {
        let mut t = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = t.event(Instant::now().into_std()) {
            warn!(error = %e, not_logged = n, "control API: cannot accept");
        }
    }

    fn closed(&self, peer: SocketAddr, how: &Closed) {
        match how {
            Closed::Done => {}
            Closed::Stopped => debug!(%peer, "control API: connection dropped at stop"),
            how => debug!(%peer, %how, "control API: connection closed"),
        }
    }
}

/// Serves `app` on `listener` within `limits` until `cancel`, then stops within
/// [`SHUTDOWN_GRACE`] (plus the time to drop the connections).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ListenLimits,
    cancel: CancellationToken,
) {
    let config = Config {
        header_timeout: HEADER_TIMEOUT,
        conn_deadline: Some(limits.conn_deadline),
        keep_alive: false,
        max_head: MAX_HEAD,
        grace: SHUTDOWN_GRACE,
        accept_backoff: ACCEPT_BACKOFF,
    };
    let caps = Limits {
        total: limits.max_conns,
        per_source: limits.per_ip,
        reserved: 0,
    };
    let log = Log {
        refused: Mutex::new(Throttle::new(WARN_PERIOD)),
        failed: Mutex::new(Throttle::new(WARN_PERIOD)),
    };
    let app = app.layer(RequestBodyTimeoutLayer::new(BODY_TIMEOUT));
    Listener::per_ip(config, caps)
        .with_hooks(log)
        .serve(listener, app, cancel)
        .await;
}
