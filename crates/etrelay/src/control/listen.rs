//! The control API's listener: an accept loop that no client can hold open.
//!
//! - **A connection cap**: at most [`ListenLimits::max_conns`] connections at once, and at most
//!   [`ListenLimits::per_ip`] from one address, so one peer cannot take every slot: a
//!   connection over either cap is accepted and closed at once (accepting it takes it out of
//!   the kernel's queue, where it would delay everyone behind it). The API's descriptors are
//!   thus bounded apart from the sessions' ([`crate::fdbudget`]).
//! - **Timeouts**: the request head must arrive within [`HEADER_TIMEOUT`], the body within
//!   [`BODY_TIMEOUT`], and no connection lives past [`ListenLimits::conn_deadline`] whatever it
//!   does. One request per connection (no keep-alive), so an idle connection is a connection
//!   whose head has not come.
//! - **Bounded shutdown**: when cancelled, the listener closes, requests in flight get
//!   [`SHUTDOWN_GRACE`], then every connection is dropped.
//! - Refused connections and accept errors (a full descriptor table) are logged at most once
//!   per [`WARN_PERIOD`], with the count of those not logged.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use guard::admission::{Gate, Permit};
use guard::throttle::Throttle;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
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

/// Connections open per address; an address leaves the map with its last connection, so the
/// map never holds more than `max_conns` entries.
#[derive(Debug, Default)]
struct PerIp(Mutex<HashMap<IpAddr, usize>>);

/// One admitted connection's slots, given back on drop.
#[derive(Debug)]
struct Slot {
    _permit: Permit,
    per_ip: Arc<PerIp>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.per_ip.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Admits a connection from `ip` when both caps allow it.
fn admit(gate: &Gate, per_ip: &Arc<PerIp>, ip: IpAddr, cap: usize) -> Option<Slot> {
    let mut map = per_ip.0.lock().unwrap_or_else(|p| p.into_inner());
    let n = map.get(&ip).copied().unwrap_or(0);
    if n >= cap {
        return None;
    }
    let permit = gate.try_acquire()?;
    map.insert(ip, n + 1);
    Some(Slot {
        _permit: permit,
        per_ip: Arc::clone(per_ip),
        ip,
    })
}

/// Serves `app` on `listener` within `limits` until `cancel`, then stops within
/// [`SHUTDOWN_GRACE`] (plus the time to drop the connections).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ListenLimits,
    cancel: CancellationToken,
) {
    let gate = Gate::new(limits.max_conns);
    let per_ip = Arc::new(PerIp::default());
    let tracker = TaskTracker::new();
    let drop_all = CancellationToken::new();
    let mut refused = Throttle::new(WARN_PERIOD);
    let mut failed = Throttle::new(WARN_PERIOD);
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                if let Some(n) = failed.event(Instant::now().into_std()) {
                    warn!("control API: cannot accept: {e} ({n} more such errors not logged)");
                }
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let ip = crate::net::canonical_ip(peer.ip());
        let Some(slot) = admit(&gate, &per_ip, ip, limits.per_ip) else {
            drop(stream);
            if let Some(n) = refused.event(Instant::now().into_std()) {
                warn!(
                    "control API: connection from {peer} refused: {} open, at most {} in all and \
                     {} per address ({n} more refused and not logged)",
                    gate.in_use(),
                    limits.max_conns,
                    limits.per_ip
                );
            }
            continue;
        };
        let conn = serve_conn(stream, peer, app.clone(), limits.conn_deadline, slot);
        let stop = drop_all.clone();
        tracker.spawn(async move {
            tokio::select! {
                () = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        debug!("control API: {} connections dropped at stop", tracker.len());
        drop_all.cancel();
        tracker.wait().await;
    }
}

/// One connection: one request, within the timeouts and the deadline.
async fn serve_conn(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    deadline: Duration,
    slot: Slot,
) {
    let _ = stream.set_nodelay(true);
    let service = tower::ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(BODY_TIMEOUT))
        .service(app);
    let service = TowerToHyperService::new(service);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .max_buf_size(MAX_HEAD);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(deadline, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!("control API: {peer}: {e}"),
        Err(_) => debug!("control API: {peer}: closed at its deadline"),
    }
    drop(slot);
}
