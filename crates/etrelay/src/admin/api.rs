//! The answers of the control API this tool shows as tables (docs/etrelay-api.md). Fields it
//! does not show are ignored, so a newer relay's additions do not break it.

use serde::Deserialize;

/// `GET /server`, and the body of `PUT /server`.
#[derive(Debug, Deserialize)]
pub(crate) struct Server {
    pub(crate) port: u16,
    pub(crate) public: Option<String>,
    pub(crate) upstream: String,
    pub(crate) registered_at: i64,
    /// Why it is not relayed, when it is not.
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// The public port's bind state (relays before it: absent).
    #[serde(default)]
    pub(crate) bind: Option<Bind>,
    pub(crate) probe: Probe,
    pub(crate) sessions: u64,
    /// Sources that proved their address (relays before it: absent).
    #[serde(default)]
    pub(crate) proven_sources: Option<u64>,
    /// The floods going on now (relays before it: absent).
    #[serde(default)]
    pub(crate) floods: Option<Vec<Flood>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Flood {
    pub(crate) kind: String,
    pub(crate) since: i64,
    pub(crate) dropped: u64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Bind {
    /// `bound`, `retrying` or `not_bound`.
    pub(crate) state: String,
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
    pub(crate) next_attempt_at: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Probe {
    /// `unknown`, `up` or `down`.
    pub(crate) state: String,
    pub(crate) last_probe_at: Option<i64>,
    pub(crate) last_answer_at: Option<i64>,
}

/// `GET /sessions`.
#[derive(Debug, Deserialize)]
pub(crate) struct Sessions {
    pub(crate) sessions: Vec<Session>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Session {
    pub(crate) client: String,
    /// The port the game server sees this client as.
    pub(crate) upstream_port: u16,
    pub(crate) opened_at: i64,
    pub(crate) last_seen_at: i64,
    pub(crate) packets_up: u64,
    pub(crate) bytes_up: u64,
    pub(crate) packets_down: u64,
    pub(crate) bytes_down: u64,
}

/// `GET /bans`.
#[derive(Debug, Deserialize)]
pub(crate) struct Bans {
    pub(crate) bans: Vec<Ban>,
}

/// One ban, as listed and as `PUT /bans/{ip}` returns it.
#[derive(Debug, Deserialize)]
pub(crate) struct Ban {
    pub(crate) ip: String,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    pub(crate) since: i64,
    /// `None`: permanent.
    #[serde(default)]
    pub(crate) expires_at: Option<i64>,
}
