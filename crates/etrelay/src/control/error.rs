//! The control API's errors: each one an HTTP status, a stable code and a message, answered as
//! `{"error": "<code>", "message": "…"}` (`docs/etrelay-api.md` lists them).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::warn;

use super::MAX_BODY;
use super::state_error;
use crate::bans::BanError;
use crate::proof::{MIN_KEY, ProofError};
use crate::registry::RegistryError;

/// Why a request was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No bearer token, or one the relay does not know.
    #[error("missing or unknown bearer token")]
    Unauthorized,
    /// No such route, or no such ban.
    #[error("{0}")]
    NotFound(&'static str),
    /// A route without that method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// A body over [`MAX_BODY`] bytes.
    #[error("the body is over {MAX_BODY} bytes")]
    BodyTooLarge,
    /// A body that could not be read.
    #[error("{0}")]
    BadBody(String),
    /// A body that is not JSON by its Content-Type.
    #[error("the body must be application/json")]
    UnsupportedMediaType,
    /// A body that is not JSON.
    #[error("{0}")]
    BadJson(String),
    /// A JSON body that is not what the route takes.
    #[error("{0}")]
    InvalidBody(String),
    /// A key shorter than [`MIN_KEY`].
    #[error("the key must have at least {MIN_KEY} characters")]
    KeyTooShort,
    /// An upstream that is not a literal `ip:port`, or one the relay refuses (a loop).
    #[error("{0}")]
    BadUpstream(String),
    /// An address in the path that is not an IP address.
    #[error("{0:?} is not an IPv4 or IPv6 address")]
    BadIp(String),
    /// A ban of an address no datagram comes from (unspecified, multicast, broadcast).
    #[error("{0}")]
    NotASource(String),
    /// A ban duration of 0 or over the longest.
    #[error("{0}")]
    BadDuration(String),
    /// The game server did not prove the key.
    #[error("{}", proof_text(.0))]
    ProofFailed(ProofError),
    /// Another server holds the port.
    #[error("{0}")]
    PortTaken(String),
    /// The key owns another server already.
    #[error("{0}")]
    KeyInUse(String),
    /// Not one of `--ports`.
    #[error("{0}")]
    PortNotAllowed(String),
    /// Every port is taken.
    #[error("{0}")]
    NoFreePort(String),
    /// The public port could not be bound.
    #[error("{0}")]
    BindFailed(String),
    /// The server is registered but not relayed.
    #[error("{0}")]
    NotRelaying(String),
    /// Too many bans.
    #[error("{0}")]
    TooManyBans(String),
    /// The relay is stopping.
    #[error("{0}")]
    Stopping(String),
    /// The state disk is full (or over quota).
    #[error("the relay's state disk is full ({0}); nothing changed")]
    StateDiskFull(String),
    /// The state could not be written, for the OS's reason when there is one.
    #[error("the state could not be written{}; nothing changed", because(.0.as_deref()))]
    StateWriteFailed(Option<String>),
}

impl ControlError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        use ControlError as E;
        match self {
            E::Unauthorized => StatusCode::UNAUTHORIZED,
            E::NotFound(_) => StatusCode::NOT_FOUND,
            E::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            E::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            E::BadBody(_) | E::BadJson(_) | E::BadIp(_) => StatusCode::BAD_REQUEST,
            E::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            E::InvalidBody(_)
            | E::KeyTooShort
            | E::BadUpstream(_)
            | E::BadDuration(_)
            | E::PortNotAllowed(_)
            | E::NotASource(_) => StatusCode::UNPROCESSABLE_ENTITY,
            E::ProofFailed(_) => StatusCode::FORBIDDEN,
            E::PortTaken(_) | E::KeyInUse(_) => StatusCode::CONFLICT,
            E::NoFreePort(_)
            | E::BindFailed(_)
            | E::NotRelaying(_)
            | E::TooManyBans(_)
            | E::Stopping(_) => StatusCode::SERVICE_UNAVAILABLE,
            E::StateDiskFull(_) => StatusCode::INSUFFICIENT_STORAGE,
            E::StateWriteFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable code of the answer (`"error"`).
    pub fn code(&self) -> &'static str {
        use ControlError as E;
        match self {
            E::Unauthorized => "unauthorized",
            E::NotFound(_) => "not_found",
            E::MethodNotAllowed => "method_not_allowed",
            E::BodyTooLarge => "body_too_large",
            E::BadBody(_) => "bad_body",
            E::UnsupportedMediaType => "unsupported_media_type",
            E::BadJson(_) => "bad_json",
            E::InvalidBody(_) => "invalid_body",
            E::KeyTooShort => "key_too_short",
            E::BadUpstream(_) => "bad_upstream",
            E::BadIp(_) => "bad_ip",
            E::NotASource(_) => "not_a_source",
            E::BadDuration(_) => "bad_duration",
            E::ProofFailed(_) => "proof_failed",
            E::PortTaken(_) => "port_taken",
            E::KeyInUse(_) => "key_in_use",
            E::PortNotAllowed(_) => "port_not_allowed",
            E::NoFreePort(_) => "no_free_port",
            E::BindFailed(_) => "bind_failed",
            E::NotRelaying(_) => "not_relaying",
            E::TooManyBans(_) => "too_many_bans",
            E::Stopping(_) => "stopping",
            E::StateDiskFull(_) => "state_disk_full",
            E::StateWriteFailed(_) => "state_write_failed",
        }
    }

    /// The answer's body: `{"error": "<code>", "message": "…"}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": self.code(), "message": self.to_string()})
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.body())).into_response()
    }
}

impl From<RegistryError> for ControlError {
    fn from(e: RegistryError) -> Self {
        use ControlError as E;
        let msg = e.to_string();
        match e {
            RegistryError::PortTaken(_) => E::PortTaken(msg),
            RegistryError::KeyInUse(_) => E::KeyInUse(msg),
            RegistryError::NoFreePort => E::NoFreePort(msg),
            RegistryError::PortNotAllowed(_) => E::PortNotAllowed(msg),
            RegistryError::Bind { .. } => E::BindFailed(msg),
            RegistryError::BadUpstream(_) => E::BadUpstream(msg),
            RegistryError::State(_) | RegistryError::Store(_) => {
                warn!(error = %msg, "control: state not written");
                state_error::control_error(&e)
            }
            RegistryError::NoServer => E::Unauthorized,
            RegistryError::NotRelaying(_) => E::NotRelaying(msg),
            RegistryError::NotBanned => E::NotFound("that address is not banned"),
            RegistryError::BansFull => E::TooManyBans(msg),
            RegistryError::Closed => E::Stopping(msg),
        }
    }
}

impl From<BanError> for ControlError {
    fn from(e: BanError) -> Self {
        match e {
            BanError::ReasonTooLong => ControlError::InvalidBody(e.to_string()),
            BanError::NoDuration | BanError::TooLong => ControlError::BadDuration(e.to_string()),
            BanError::NotASource { .. } => ControlError::NotASource(e.to_string()),
        }
    }
}

/// What a failed proof says.
fn proof_text(e: &ProofError) -> &'static str {
    match e {
        ProofError::NoAnswer => "the game server did not answer getstatus",
        ProofError::Missing => "the game server does not show etrelay_proof",
        ProofError::Wrong => "etrelay_proof on the game server is not this key's fingerprint",
    }
}

/// ` (why)`, or nothing.
fn because(why: Option<&str>) -> String {
    why.map(|w| format!(" ({w})")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_errors_read_as_before() {
        let full = ControlError::StateDiskFull("No space left on device (os error 28)".into());
        assert_eq!(full.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(
            full.to_string(),
            "the relay's state disk is full (No space left on device (os error 28)); nothing \
             changed"
        );
        let failed = ControlError::StateWriteFailed(None);
        assert_eq!(failed.code(), "state_write_failed");
        assert_eq!(
            failed.to_string(),
            "the state could not be written; nothing changed"
        );
        assert_eq!(
            ControlError::StateWriteFailed(Some("Read-only file system".into())).to_string(),
            "the state could not be written (Read-only file system); nothing changed"
        );
        assert_eq!(
            ControlError::ProofFailed(ProofError::Missing).body(),
            json!({
                "error": "proof_failed",
                "message": "the game server does not show etrelay_proof"
            })
        );
    }
}
