//! Server keys and the proof of console access.
//!
//! An admin tool registers a server with a key it picked. Before taking the key, the relay
//! checks that the tool runs the game server it registers: the tool makes the server show the
//! key's fingerprint in the serverinfo cvar [`PROOF_CVAR`], and the relay reads it there with
//! `getstatus`. Only whoever holds that server's console can do that; the fingerprint, public
//! for a moment, does not give the key away. The relay keeps only SHA-256(key).

use std::net::SocketAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::debug;

use crate::config::PROBE_ATTEMPTS;
use crate::et::info::{STATUS_RESPONSE, Template, find_key};

/// Shortest key (and relay token) accepted, in characters.
pub const MIN_KEY: usize = 32;
/// Bytes of SHA-256(key) shown as its fingerprint.
pub const PROOF_BYTES: usize = 16;
/// The serverinfo cvar that carries the fingerprint.
pub const PROOF_CVAR: &str = "etrelay_proof";

/// SHA-256 of a key: what the relay stores.
pub type KeyHash = [u8; 32];

/// SHA-256 of `key`.
pub fn key_hash(key: &str) -> KeyHash {
    Sha256::digest(key.as_bytes()).into()
}

/// The fingerprint the game server must show: lowercase hex of the first [`PROOF_BYTES`] bytes
/// of SHA-256(key).
pub fn fingerprint(key: &str) -> String {
    hex(&key_hash(key)[..PROOF_BYTES])
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses lowercase or uppercase hex of exactly 32 bytes.
pub fn parse_key_hash(s: &str) -> Option<KeyHash> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Why the proof failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The game server did not answer `getstatus`.
    #[error("the game server did not answer getstatus")]
    NoAnswer,
    /// It answered, without the cvar.
    #[error("the game server shows no {PROOF_CVAR}")]
    Missing,
    /// It answered with another value.
    #[error("the game server shows another {PROOF_CVAR}")]
    Wrong,
}

/// Asks `upstream` for its serverinfo ([`PROBE_ATTEMPTS`] × `timeout`) and checks it shows the
/// fingerprint of `key`.
///
/// # Errors
/// [`ProofError`] as above.
pub async fn check(upstream: SocketAddr, key: &str, timeout: Duration) -> Result<(), ProofError> {
    let want = fingerprint(key);
    let socket = crate::server::upstream_socket(upstream).map_err(|e| {
        debug!("proof: cannot open a socket: {e}");
        ProofError::NoAnswer
    })?;
    let mut buf = vec![0u8; 64 * 1024];
    for attempt in 1..=PROBE_ATTEMPTS {
        let nonce: u64 = rand::random();
        let challenge = format!("pf{nonce:016x}");
        let mut pkt = b"\xff\xff\xff\xffgetstatus ".to_vec();
        pkt.extend_from_slice(challenge.as_bytes());
        if socket.send(&pkt).await.is_err() {
            continue;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while let Ok(r) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            let Ok(n) = r else { break };
            let Some((_, Some(echoed))) = Template::parse(&buf[..n], STATUS_RESPONSE) else {
                continue;
            };
            if echoed != challenge.as_bytes() {
                continue;
            }
            let info_start = 4 + STATUS_RESPONSE.len();
            let body = &buf[info_start..n];
            let info = &body[..body.iter().position(|&b| b == b'\n').unwrap_or(body.len())];
            return match find_key(info, PROOF_CVAR.as_bytes()) {
                None => Err(ProofError::Missing),
                Some(r) if info[r.clone()].eq_ignore_ascii_case(want.as_bytes()) => Ok(()),
                Some(_) => Err(ProofError::Wrong),
            };
        }
        debug!("proof {attempt}/{PROBE_ATTEMPTS}: no answer from {upstream}");
    }
    Err(ProofError::NoAnswer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_the_first_16_bytes_of_sha256_in_hex() {
        // printf '%s' 'abc' | sha256sum
        assert_eq!(
            hex(&key_hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(fingerprint("abc"), "ba7816bf8f01cfea414140de5dae2223");
        let h = key_hash("some key");
        assert_eq!(parse_key_hash(&hex(&h)), Some(h));
        assert_eq!(parse_key_hash("zz"), None);
        assert_eq!(parse_key_hash(&"g".repeat(64)), None);
    }
}
