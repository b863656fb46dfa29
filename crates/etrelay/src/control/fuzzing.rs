//! The request bodies of the control API without a listener, for the fuzz targets (`fuzz/`):
//! the code the handlers run, from a body's bytes to the ban or the error answer.

use std::net::SocketAddr;
use std::time::SystemTime;

use super::{Body, ControlError, ban_json, read_put_ban, read_put_server};

/// An error answer as the API writes it.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `{"error": "<code>", "message": "…"}`.
    pub body: serde_json::Value,
}

impl From<ControlError> for Answer {
    fn from(e: ControlError) -> Self {
        Answer {
            status: e.status().as_u16(),
            body: e.body(),
        }
    }
}

fn body(is_json: Option<bool>, bytes: &[u8]) -> Body {
    Body {
        is_json,
        bytes: axum::body::Bytes::copy_from_slice(bytes),
    }
}

/// `PUT /server` up to the proof: the upstream it would prove, or the error answer.
/// `is_json`: the Content-Type said JSON, something else, or nothing.
pub fn put_server(is_json: Option<bool>, bytes: &[u8]) -> Result<SocketAddr, Answer> {
    Ok(read_put_server(&body(is_json, bytes))?.1)
}

/// `PUT /bans/{ip}` at `now`: the ban as the API shows it, or the error answer.
pub fn put_ban(
    ip: &str,
    is_json: Option<bool>,
    bytes: &[u8],
    now: SystemTime,
) -> Result<serde_json::Value, Answer> {
    Ok(ban_json(&read_put_ban(ip, &body(is_json, bytes), now)?))
}
