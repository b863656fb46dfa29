//! The control API (axum): registration with proof, the server's own view, sessions, bans and
//! metrics. Routes, authentication and error codes: `docs/etrelay-api.md`.
//!
//! Every error is `{"error": "<code>", "message": "…"}` with a 4xx/5xx status, extractor
//! rejections included; a failed request changes nothing (the [`Registry`] writes state files
//! before it changes memory). Ban changes are logged in a bounded way ([`ban_log`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use guard::counters::{Kind, PromText};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

pub mod ban_log;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod listen;
mod server_json;
mod state_error;

use guard::throttle::Throttle;
pub use listen::ListenLimits;

use self::ban_log::BanLog;
pub use self::ban_log::{BAN_LINES, BAN_LOG_WINDOW};

pub use self::error::ControlError;
use crate::bans::{self, Ban, BanRecord};
use crate::clock::{unix, wall_now};
pub use crate::config::BIND_RETRY;
use crate::config::BIND_WARN_PERIOD;
use crate::proof::{self, MIN_KEY};
use crate::registry::{Registered, Registry, RegistryError};
use crate::secret::Secret;
use crate::server::ServerMetrics;
use server_json::{ServerJson, server_json};

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ControlState {
    registry: Registry,
    /// SHA-256 of the relay token: compared in constant time whatever the candidate's length.
    /// Replaced when SIGHUP re-reads the token file ([`ControlState::set_token`]).
    token_hash: Arc<RwLock<Secret<[u8; 32]>>>,
    /// Wait for each proof `getstatus`.
    proof_timeout: Duration,
    /// The ban lines, bounded per server.
    ban_log: Arc<BanLog>,
}

impl ControlState {
    /// State for the API over `registry`, with the relay `token`.
    pub fn new(registry: Registry, token: &str, proof_timeout: Duration) -> Self {
        ControlState {
            registry,
            token_hash: Arc::new(RwLock::new(Secret::new(
                Sha256::digest(token.as_bytes()).into(),
            ))),
            proof_timeout,
            ban_log: Arc::default(),
        }
    }

    /// Takes `token` as the relay token from now on; true when it differs from the old one.
    pub fn set_token(&self, token: &str) -> bool {
        let h: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut held = self.token_hash.write().unwrap_or_else(|p| p.into_inner());
        let changed = !bool::from(h.ct_eq(held.expose()));
        *held = Secret::new(h);
        changed
    }
}

/// A request body of at most [`MAX_BODY`] bytes, read but not yet parsed: handlers check the
/// bearer token first, then [`Body::json`] parses it. Every rejection is an [`ControlError`].
#[derive(Debug)]
struct Body {
    /// `Some(false)` when a Content-Type other than JSON was given.
    is_json: Option<bool>,
    bytes: axum::body::Bytes,
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ControlError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ControlError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/json")
            });
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|r| {
                if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ControlError::BodyTooLarge
                } else {
                    ControlError::BadBody(r.body_text())
                }
            })?;
        Ok(Body { is_json, bytes })
    }
}

impl Body {
    /// The body as `T`; `None` for an empty body.
    fn json<T: DeserializeOwned>(&self) -> Result<Option<T>, ControlError> {
        if self.bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if self.is_json == Some(false) {
            return Err(ControlError::UnsupportedMediaType);
        }
        serde_json::from_slice(&self.bytes).map(Some).map_err(|e| {
            if e.is_data() {
                ControlError::InvalidBody(e.to_string())
            } else {
                ControlError::BadJson(e.to_string())
            }
        })
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn require_relay_token(st: &ControlState, headers: &HeaderMap) -> Result<(), ControlError> {
    let given = bearer(headers).ok_or(ControlError::Unauthorized)?;
    let h: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    let held = st.token_hash.read().unwrap_or_else(|p| p.into_inner());
    if bool::from(h.ct_eq(held.expose())) {
        Ok(())
    } else {
        Err(ControlError::Unauthorized)
    }
}

fn require_key(st: &ControlState, headers: &HeaderMap) -> Result<Registered, ControlError> {
    let given = bearer(headers).ok_or(ControlError::Unauthorized)?;
    st.registry.by_key(given).ok_or(ControlError::Unauthorized)
}

/// The router.
pub fn router(state: ControlState) -> Router {
    Router::new()
        .route(
            "/server",
            put(put_server).get(get_server).delete(delete_server),
        )
        .route("/sessions", get(get_sessions))
        .route("/bans", get(get_bans))
        .route("/bans/{ip}", put(put_ban).delete(delete_ban))
        .route("/metrics", get(get_metrics))
        .fallback(|| async { ControlError::NotFound("no such route") })
        .method_not_allowed_fallback(|| async { ControlError::MethodNotAllowed })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(request_span))
        .with_state(state)
}

/// Each request handled within a span naming its method and path, so every line logged on
/// its way (a state write that failed, a registration) says which request it belongs to.
async fn request_span(req: Request, next: axum::middleware::Next) -> Response {
    let span = tracing::info_span!("request", method = %req.method(), path = %req.uri().path());
    next.run(req).instrument(span).await
}

/// Serves the API on `addr` within `limits`, binding again every [`BIND_RETRY`] until it works
/// (the tunnel may come up after the relay), until `cancel`.
pub async fn serve(
    addr: SocketAddr,
    state: ControlState,
    limits: ListenLimits,
    cancel: CancellationToken,
) {
    let mut failed = Throttle::new(BIND_WARN_PERIOD);
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return serve_on(listener, state, limits, cancel).await,
            Err(e) => {
                if let Some(n) = failed.event(crate::clock::Instant::now().into_std()) {
                    warn!(
                        %addr,
                        error = %e,
                        retry_secs = BIND_RETRY.as_secs(),
                        not_logged = n,
                        "control API: cannot bind, trying again"
                    );
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(BIND_RETRY) => {}
        }
    }
}

/// Serves the API on a bound listener within `limits` until `cancel`; returns within
/// [`listen::SHUTDOWN_GRACE`] of it.
pub async fn serve_on(
    listener: TcpListener,
    state: ControlState,
    limits: ListenLimits,
    cancel: CancellationToken,
) {
    match listener.local_addr() {
        Ok(a) => info!(
            addr = %a,
            max_conns = limits.max_conns,
            per_ip = limits.per_ip,
            "control API: listening"
        ),
        Err(e) => warn!(error = %e, "control API: no address"),
    }
    let ban_log = Arc::clone(&state.ban_log);
    listen::serve(listener, router(state), limits, cancel).await;
    ban_log.flush_all();
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutServer {
    key: Secret,
    upstream: String,
    #[serde(default)]
    port: Option<u16>,
}

/// A `PUT /server` body, checked as far as it can be without I/O: the key's length and the
/// upstream address (canonical).
fn read_put_server(body: &Body) -> Result<(PutServer, SocketAddr), ControlError> {
    let body = body
        .json::<PutServer>()?
        .ok_or_else(|| ControlError::InvalidBody("a body is required".into()))?;
    if body.key.expose().chars().count() < MIN_KEY {
        return Err(ControlError::KeyTooShort);
    }
    let upstream: SocketAddr = body
        .upstream
        .parse()
        .ok()
        .map(crate::net::canonical)
        .ok_or_else(|| ControlError::BadUpstream("upstream must be a literal ip:port".into()))?;
    Ok((body, upstream))
}

async fn put_server(
    State(st): State<ControlState>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<ServerJson>), ControlError> {
    require_relay_token(&st, &headers)?;
    let (body, upstream) = read_put_server(&body)?;
    let key = body.key.expose();
    // Before the proof: a loop's proof would be answered by the relay itself.
    st.registry.check_upstream(upstream)?;
    if let Some(p) = body.port
        && !st.registry.ports().contains(&p)
    {
        return Err(RegistryError::PortNotAllowed(p).into());
    }
    proof::check(upstream, key, st.proof_timeout)
        .await
        .map_err(ControlError::ProofFailed)?;
    let (entry, created) = st
        .registry
        .register(proof::key_hash(key), upstream, body.port)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(server_json(&entry))))
}

async fn get_server(
    State(st): State<ControlState>,
    headers: HeaderMap,
) -> Result<Json<ServerJson>, ControlError> {
    let r = require_key(&st, &headers)?;
    Ok(Json(server_json(&r)))
}

async fn delete_server(
    State(st): State<ControlState>,
    headers: HeaderMap,
) -> Result<StatusCode, ControlError> {
    let r = require_key(&st, &headers)?;
    st.registry.leave(r.port).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn running(r: &Registered) -> Result<&Arc<crate::server::ServerHandle>, ControlError> {
    r.handle.as_ref().ok_or_else(|| {
        RegistryError::NotRelaying(r.error.clone().unwrap_or_else(|| "not started".into())).into()
    })
}

async fn get_sessions(
    State(st): State<ControlState>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ControlError> {
    let r = require_key(&st, &headers)?;
    let mut sessions = running(&r)?.sessions();
    sessions.sort_by_key(|s| s.opened);
    let list: Vec<_> = sessions
        .iter()
        .map(|s| {
            json!({
                "client": s.client.to_string(),
                "upstream_port": s.upstream_local.port(),
                "opened_at": unix(s.opened),
                "last_seen_at": unix(s.last_seen),
                "packets_up": s.packets_up,
                "bytes_up": s.bytes_up,
                "packets_down": s.packets_down,
                "bytes_down": s.bytes_down,
            })
        })
        .collect();
    Ok(Json(json!({ "sessions": list })))
}

fn ban_json(b: &Ban) -> serde_json::Value {
    serde_json::to_value(BanRecord::from(b)).expect("invariant: a ban record always serializes")
}

async fn get_bans(
    State(st): State<ControlState>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ControlError> {
    let r = require_key(&st, &headers)?;
    let bans: Vec<_> = running(&r)?.bans().iter().map(ban_json).collect();
    Ok(Json(json!({ "bans": bans })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBan {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    duration_secs: Option<u64>,
}

fn parse_ip(s: &str) -> Result<IpAddr, ControlError> {
    s.parse().map_err(|_| ControlError::BadIp(s.to_string()))
}

/// A `PUT /bans/{ip}` request as the ban it asks for, at `now`.
fn read_put_ban(ip: &str, body: &Body, now: SystemTime) -> Result<Ban, ControlError> {
    let ip = parse_ip(ip)?;
    let body = body.json::<PutBan>()?.unwrap_or_default();
    Ok(Ban::new(ip, body.reason, body.duration_secs, now)?)
}

async fn put_ban(
    State(st): State<ControlState>,
    headers: HeaderMap,
    Path(ip): Path<String>,
    body: Body,
) -> Result<Json<serde_json::Value>, ControlError> {
    let r = require_key(&st, &headers)?;
    let ban = read_put_ban(&ip, &body, wall_now())?;
    st.registry.ban(r.port, ban.clone()).await?;
    st.ban_log.banned(r.port, ban.ip);
    Ok(Json(ban_json(&ban)))
}

async fn delete_ban(
    State(st): State<ControlState>,
    headers: HeaderMap,
    Path(ip): Path<String>,
) -> Result<StatusCode, ControlError> {
    let r = require_key(&st, &headers)?;
    let ip = bans::normalize(parse_ip(&ip)?);
    st.registry.unban(r.port, ip).await?;
    st.ban_log.unbanned(r.port, ip);
    Ok(StatusCode::NO_CONTENT)
}

async fn get_metrics(
    State(st): State<ControlState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    require_relay_token(&st, &headers)?;
    let servers = st.registry.all();
    let mut out = PromText::new();
    out.family(
        "etrelay_servers_registered",
        Kind::Gauge,
        "Servers registered.",
    )
    .sample("etrelay_servers_registered", &[], servers.len() as u64);
    let open: u64 = servers
        .iter()
        .filter_map(|r| r.handle.as_ref())
        .map(|h| h.metrics().sessions_open.get())
        .sum();
    out.family(
        "etrelay_sessions_open_all",
        Kind::Gauge,
        "Sessions open, all servers together.",
    )
    .sample("etrelay_sessions_open_all", &[], open);
    let running: Vec<(u16, &ServerMetrics)> = servers
        .iter()
        .filter_map(|r| r.handle.as_ref().map(|h| (r.port, h.metrics())))
        .collect();
    ServerMetrics::render_all(&running, &mut out);
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        out.finish(),
    )
        .into_response())
}
