//! `GET /server` (and the body of `PUT /server`): a registered server as the API shows it.

use std::net::SocketAddr;

use serde::Serialize;

use crate::clock::unix;
use crate::registry::Registered;
use crate::server::ProbeState;

#[derive(Debug, Serialize)]
struct ProbeJson {
    state: &'static str,
    last_probe_at: Option<u64>,
    last_answer_at: Option<u64>,
}

/// The public port: bound, tried again, or not tried (the server could not be started before
/// binding: see `error`).
#[derive(Debug, Serialize)]
struct BindJson {
    /// `bound`, `retrying` or `not_bound`.
    state: &'static str,
    /// Failed attempts so far.
    attempts: u32,
    last_error: Option<String>,
    last_attempt_at: Option<u64>,
    next_attempt_at: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(super) struct ServerJson {
    port: u16,
    public: Option<SocketAddr>,
    upstream: SocketAddr,
    registered_at: u64,
    relaying: bool,
    /// Why it is not relayed, when it is not.
    error: Option<String>,
    bind: BindJson,
    probe: ProbeJson,
    sessions: usize,
    /// Sources that proved their address (a join the game server answered), remembered.
    proven_sources: usize,
    /// When the oldest flood going on began (Unix seconds); `None`: no flood.
    under_flood_since: Option<u64>,
    /// The floods going on now, one per defence they meet.
    floods: Vec<FloodJson>,
}

#[derive(Debug, Serialize)]
struct FloodJson {
    /// `reflection`, `limiter`, `joins` or `half_open`.
    kind: &'static str,
    since: u64,
    dropped: u64,
}

pub(super) fn server_json(r: &Registered) -> ServerJson {
    let probe = r.handle.as_ref().map(|h| h.probe());
    let retry = r.bind.as_ref();
    let floods: Vec<FloodJson> = r
        .handle
        .as_ref()
        .map(|h| h.floods())
        .unwrap_or_default()
        .into_iter()
        .map(|f| FloodJson {
            kind: f.kind.name(),
            since: unix(f.since),
            dropped: f.dropped,
        })
        .collect();
    ServerJson {
        port: r.port,
        public: r.handle.as_ref().map(|h| h.public_addr()),
        upstream: r.upstream,
        registered_at: unix(r.registered_at),
        relaying: r.handle.is_some(),
        error: r.error.clone(),
        bind: BindJson {
            state: match (&r.handle, retry) {
                (Some(_), _) => "bound",
                (None, Some(_)) => "retrying",
                (None, None) => "not_bound",
            },
            attempts: retry.map_or(0, |b| b.attempts),
            last_error: retry.map(|b| b.last_error.clone()),
            last_attempt_at: retry.map(|b| unix(b.last_attempt)),
            next_attempt_at: retry.map(|b| unix(b.next_attempt)),
        },
        probe: ProbeJson {
            state: match probe.map(|p| p.state) {
                Some(ProbeState::Up) => "up",
                Some(ProbeState::Down) => "down",
                _ => "unknown",
            },
            last_probe_at: probe.and_then(|p| p.last_probe).map(unix),
            last_answer_at: probe.and_then(|p| p.last_answer).map(unix),
        },
        sessions: r.handle.as_ref().map_or(0, |h| h.session_count()),
        proven_sources: r.handle.as_ref().map_or(0, |h| h.proven_count()),
        under_flood_since: floods.iter().map(|f| f.since).min(),
        floods,
    }
}
