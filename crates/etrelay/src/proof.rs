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

use crate::et::classify::Query;
use crate::et::info::{STATUS_RESPONSE, find_key, info_string};
use crate::probe;

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
    hex::encode(&key_hash(key)[..PROOF_BYTES])
}

/// Parses lowercase or uppercase hex of exactly 32 bytes.
pub fn parse_key_hash(s: &str) -> Option<KeyHash> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
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

/// Asks `upstream` for its serverinfo (`getstatus pf…`, [`crate::config::PROBE_ATTEMPTS`] × `timeout`, through
/// [`probe::ask`]) and checks it shows the fingerprint of `key`.
///
/// # Errors
/// [`ProofError`] as above.
pub async fn check(upstream: SocketAddr, key: &str, timeout: Duration) -> Result<(), ProofError> {
    let answer = match probe::ask(upstream, Query::Status, "pf", timeout).await {
        Ok(Some(answer)) => answer,
        Ok(None) => return Err(ProofError::NoAnswer),
        Err(e) => {
            debug!(error = %e, "proof: cannot open a socket");
            return Err(ProofError::NoAnswer);
        }
    };
    let info = info_string(&answer, STATUS_RESPONSE).unwrap_or_default();
    match find_key(info, PROOF_CVAR.as_bytes()) {
        None => Err(ProofError::Missing),
        Some(r) if info[r.clone()].eq_ignore_ascii_case(fingerprint(key).as_bytes()) => Ok(()),
        Some(_) => Err(ProofError::Wrong),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_the_first_16_bytes_of_sha256_in_hex() {
        // printf '%s' 'abc' | sha256sum
        assert_eq!(
            hex::encode(key_hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(fingerprint("abc"), "ba7816bf8f01cfea414140de5dae2223");
        let h = key_hash("some key");
        assert_eq!(parse_key_hash(&hex::encode(h)), Some(h));
        assert_eq!(parse_key_hash("zz"), None);
        assert_eq!(parse_key_hash(&"g".repeat(64)), None);
    }
}
