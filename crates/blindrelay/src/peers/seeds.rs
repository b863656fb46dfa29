//! Seed lists: peers an operator passes with `--seeds FILE`, signed by whoever published the
//! list, so a node has sources beyond its `--peer`s (a lying bootstrap peer cannot eclipse a
//! node that has a seed it does not control).
//!
//! The file is text: a header line, one pinned peer a line (`ID@URL`, as `--peer` takes it:
//! the link must answer with that id), and a last line `signature SIGNER SIG`: the Ed25519
//! signature by node id `SIGNER` over [`DOMAIN`] and every byte before that line. A list that
//! does not verify is refused at start, naming the file; `--seeds-signer ID` refuses a list
//! signed by any other. `blindrelay seeds` writes one from a node's peer store: the peers it
//! reached, one per /16, known longest first, signed with the node's identity key.

use std::fmt::Write as _;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use super::PeerSpec;
use crate::proto::{NodeId, from_hex};

/// The first line.
pub const HEADER: &str = "blindrelay-seeds 1";
/// What a signature covers first.
pub const DOMAIN: &[u8] = b"blindrelay/seeds/v1\n";
/// Peers a list holds at most.
pub const MAX_SEEDS: usize = 256;
/// Largest file read.
pub const MAX_FILE: u64 = 64 * 1024;

/// Why a seed list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedError {
    /// Not a seed list (no header, a bad line, no signature line).
    #[error("not a seed list: {0}")]
    Malformed(String),
    /// The signature does not verify.
    #[error("the seed list's signature does not verify")]
    BadSignature,
    /// Signed by another key than `--seeds-signer`.
    #[error("the seed list is signed by {got}, not by the --seeds-signer given")]
    OtherSigner {
        /// The signer's 8-hex prefix.
        got: String,
    },
}

/// A verified seed list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeds {
    /// Who signed it.
    pub signer: NodeId,
    /// Its peers, each pinned.
    pub peers: Vec<PeerSpec>,
}

/// Reads and verifies `text`, signed by `signer` when one is required.
///
/// # Errors
/// [`SeedError`].
pub fn parse(text: &str, signer: Option<&NodeId>) -> Result<Seeds, SeedError> {
    let bad = |why: &str| SeedError::Malformed(why.to_string());
    let sig_at = text
        .rfind("\nsignature ")
        .map(|i| i + 1)
        .ok_or_else(|| bad("no signature line"))?;
    let (body, sig_line) = text.split_at(sig_at);
    let mut lines = body.lines();
    if lines.next() != Some(HEADER) {
        return Err(bad("no header line"));
    }
    let mut peers = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let spec = PeerSpec::parse(line.trim()).map_err(|e| bad(&e.to_string()))?;
        if spec.pinned.is_none() {
            return Err(bad("a seed must be ID@URL"));
        }
        peers.push(spec);
    }
    if peers.len() > MAX_SEEDS {
        return Err(bad("too many seeds"));
    }
    let mut words = sig_line.split_whitespace().skip(1);
    let who = words
        .next()
        .and_then(from_hex::<32>)
        .ok_or_else(|| bad("no signer"))?;
    let sig = words
        .next()
        .and_then(from_hex::<64>)
        .ok_or_else(|| bad("no signature"))?;
    let key = VerifyingKey::from_bytes(&who).map_err(|_| SeedError::BadSignature)?;
    let mut signed = DOMAIN.to_vec();
    signed.extend_from_slice(body.as_bytes());
    key.verify(&signed, &Signature::from_bytes(&sig))
        .map_err(|_| SeedError::BadSignature)?;
    if let Some(want) = signer
        && *want != who
    {
        return Err(SeedError::OtherSigner {
            got: crate::proto::Prefix(&who).to_string(),
        });
    }
    Ok(Seeds { signer: who, peers })
}

/// A list of `peers` (`(id, url)`), signed by `key`.
pub fn write(key: &SigningKey, peers: &[(NodeId, String)]) -> String {
    let mut body = format!("{HEADER}\n");
    for (id, url) in peers.iter().take(MAX_SEEDS) {
        let _ = writeln!(body, "{}@{}", hex::encode(id), url.trim_end_matches('/'));
    }
    let mut signed = DOMAIN.to_vec();
    signed.extend_from_slice(body.as_bytes());
    let sig = key.sign(&signed);
    let _ = writeln!(
        body,
        "signature {} {}",
        hex::encode(key.verifying_key().to_bytes()),
        hex::encode(sig.to_bytes())
    );
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> (SigningKey, String) {
        let key = SigningKey::from_bytes(&[3; 32]);
        let peers = vec![
            ([1; 32], "https://192.0.2.1:7001".to_string()),
            ([2; 32], "https://192.0.2.2:7001/".to_string()),
        ];
        let text = write(&key, &peers);
        (key, text)
    }

    #[test]
    fn a_written_list_verifies_and_pins_its_peers() {
        let (key, text) = list();
        let seeds = parse(&text, None).unwrap();
        assert_eq!(seeds.signer, key.verifying_key().to_bytes());
        assert_eq!(seeds.peers.len(), 2);
        assert_eq!(seeds.peers[1].pinned, Some([2; 32]));
        assert_eq!(seeds.peers[1].url, "https://192.0.2.2:7001");
        assert!(parse(&text, Some(&key.verifying_key().to_bytes())).is_ok());
    }

    #[test]
    fn a_changed_list_or_another_signer_is_refused() {
        let (_, text) = list();
        let changed = text.replace("192.0.2.2", "192.0.2.9");
        assert_eq!(parse(&changed, None), Err(SeedError::BadSignature));
        assert!(matches!(
            parse(&text, Some(&[9; 32])),
            Err(SeedError::OtherSigner { .. })
        ));
        assert!(matches!(
            parse("garbage", None),
            Err(SeedError::Malformed(_))
        ));
        let unpinned = text.replace(&format!("{}@", hex::encode([1u8; 32])), "");
        assert!(matches!(
            parse(&unpinned, None),
            Err(SeedError::Malformed(_) | SeedError::BadSignature)
        ));
    }
}
