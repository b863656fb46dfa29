//! The node's identity, onion keys and descriptor, kept in the state dir.
//!
//! - `identity.key`: the 32-byte Ed25519 seed; the node id is its public key.
//! - `onion-keys.json`: the current X25519 onion key and the previous one (rotated every
//!   [`ONION_ROTATION`], the previous kept [`ONION_GRACE`] after the rotation so routes built
//!   from a descriptor peers still hold keep working). Kept on disk, so a restart changes
//!   neither key.
//! - `node.json`: the public endpoint given at `init`.
//!
//! Secret files are written atomically with mode 0600. No `Debug` here prints a key, the
//! endpoint or the state dir.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use guard::statefile::{self, StateFileError};
use serde::{Deserialize, Serialize};
use x25519_dalek::{PublicKey, StaticSecret};

use crate::proto::descriptor::{DESCRIPTOR_TTL, Descriptor};
use crate::proto::{NodeId, Prefix, from_hex};

/// Age at which the onion key is replaced.
pub const ONION_ROTATION: u64 = 24 * 3600;
/// How long the previous onion key still opens layers after a rotation.
pub const ONION_GRACE: u64 = DESCRIPTOR_TTL + 600;
/// Age at which the descriptor is issued again.
pub const DESCRIPTOR_REISSUE: u64 = DESCRIPTOR_TTL / 2;

/// Why the state dir could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A state file.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The state dir has no identity.
    #[error("{0} holds no node identity: run `blindrelay init` first")]
    NotInitialized(PathBuf),
    /// `init` on a state dir that has one.
    #[error("{0} already holds a node identity")]
    AlreadyInitialized(PathBuf),
    /// A file that is not what the node wrote.
    #[error("{0}: not a valid state file")]
    Corrupt(PathBuf),
    /// The endpoint given to `init`.
    #[error("endpoint {0:?}: {1}")]
    Endpoint(String, String),
    /// The file system.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Holds a secret: no `Debug`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRecord {
    secret: String,
    created_at: u64,
}

/// Holds secrets: no `Debug`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnionKeysFile {
    current: KeyRecord,
    previous: Option<KeyRecord>,
    /// When `previous` stopped being the current key.
    rotated_at: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    endpoint: String,
}

/// The onion keys in memory (secrets: no `Debug`).
#[derive(Clone)]
struct Keyring {
    current: ([u8; 32], u64),
    previous: Option<([u8; 32], u64)>,
    rotated_at: Option<u64>,
}

impl Keyring {
    fn to_file(&self) -> OnionKeysFile {
        let rec = |(k, t): ([u8; 32], u64)| KeyRecord {
            secret: hex::encode(k),
            created_at: t,
        };
        OnionKeysFile {
            current: rec(self.current),
            previous: self.previous.map(rec),
            rotated_at: self.rotated_at,
        }
    }

    fn from_file(f: &OnionKeysFile) -> Option<Keyring> {
        let rec = |r: &KeyRecord| from_hex::<32>(&r.secret).map(|k| (k, r.created_at));
        Some(Keyring {
            current: rec(&f.current)?,
            previous: match &f.previous {
                Some(p) => Some(rec(p)?),
                None => None,
            },
            rotated_at: f.rotated_at,
        })
    }
}

/// A node: identity, endpoint, onion keys, descriptor.
pub struct Node {
    dir: PathBuf,
    signing: SigningKey,
    id: NodeId,
    endpoint: String,
    keyring: Mutex<Keyring>,
    descriptor: Mutex<Option<Descriptor>>,
    /// How long its descriptors are valid (seconds).
    lifetime: u64,
}

/// The id's prefix only: never a key, the endpoint or the state dir.
impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("id", &Prefix(&self.id))
            .finish_non_exhaustive()
    }
}

/// The identity key's file in the state dir (its Ed25519 seed; the links' TLS identity too).
pub const IDENTITY_FILE: &str = "identity.key";

fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join(IDENTITY_FILE),
        dir.join("onion-keys.json"),
        dir.join("node.json"),
    )
}

/// Creates the node's identity and first onion key in `dir`; returns the node id.
///
/// # Errors
/// An identity exists already, the endpoint is not `https://IP:PORT`, or the files cannot be
/// written.
pub fn init(dir: &Path, endpoint: &str, now: u64) -> Result<NodeId, NodeError> {
    crate::proto::descriptor::parse_endpoint(endpoint)
        .map_err(|e| NodeError::Endpoint(endpoint.to_string(), e.to_string()))?;
    std::fs::create_dir_all(dir).map_err(|source| NodeError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let (id_path, onion_path, node_path) = paths(dir);
    if id_path.exists() {
        return Err(NodeError::AlreadyInitialized(dir.to_owned()));
    }
    let seed: [u8; 32] = rand::random();
    statefile::write_atomic_private(&id_path, &seed)?;
    let ring = Keyring {
        current: (rand::random(), now),
        previous: None,
        rotated_at: None,
    };
    let text = serde_json::to_vec_pretty(&ring.to_file())
        .map_err(|_| NodeError::Corrupt(onion_path.clone()))?;
    statefile::write_atomic_private(&onion_path, &text)?;
    statefile::save_json(
        &node_path,
        &NodeFile {
            endpoint: endpoint.to_string(),
        },
    )?;
    crate::stores::init(dir)?;
    Ok(SigningKey::from_bytes(&seed).verifying_key().to_bytes())
}

impl Node {
    /// Loads the node from `dir`.
    ///
    /// # Errors
    /// Missing or broken state files.
    pub fn load(dir: &Path) -> Result<Node, NodeError> {
        let (id_path, onion_path, node_path) = paths(dir);
        let seed = match std::fs::read(&id_path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(NodeError::NotInitialized(dir.to_owned()));
            }
            Err(source) => {
                return Err(NodeError::Io {
                    path: id_path,
                    source,
                });
            }
        };
        let seed: [u8; 32] = seed
            .try_into()
            .map_err(|_| NodeError::Corrupt(id_path.clone()))?;
        let signing = SigningKey::from_bytes(&seed);
        let ring_file: OnionKeysFile = statefile::load_json(&onion_path)?
            .ok_or_else(|| NodeError::Corrupt(onion_path.clone()))?;
        let keyring =
            Keyring::from_file(&ring_file).ok_or_else(|| NodeError::Corrupt(onion_path.clone()))?;
        let node: NodeFile = statefile::load_json(&node_path)?
            .ok_or_else(|| NodeError::Corrupt(node_path.clone()))?;
        Ok(Node {
            dir: dir.to_owned(),
            id: signing.verifying_key().to_bytes(),
            signing,
            endpoint: node.endpoint,
            keyring: Mutex::new(keyring),
            descriptor: Mutex::new(None),
            lifetime: DESCRIPTOR_TTL,
        })
    }

    /// The node id.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// The signing key.
    pub fn signing_key(&self) -> &SigningKey {
        &self.signing
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Keyring> {
        self.keyring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the onion key when it is [`ONION_ROTATION`] old; true when it did.
    ///
    /// # Errors
    /// The new keys could not be saved (nothing changed).
    pub fn rotate_if_due(&self, now: u64) -> Result<bool, NodeError> {
        let mut ring = self.ring();
        if now.saturating_sub(ring.current.1) < ONION_ROTATION {
            return Ok(false);
        }
        let next = Keyring {
            current: (rand::random(), now),
            previous: Some(ring.current),
            rotated_at: Some(now),
        };
        let path = paths(&self.dir).1;
        let text = serde_json::to_vec_pretty(&next.to_file())
            .map_err(|_| NodeError::Corrupt(path.clone()))?;
        statefile::write_atomic_private(&path, &text)?;
        *ring = next;
        drop(ring);
        *self.descriptor.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(true)
    }

    /// The onion secrets that open layers now: the current key, then the previous one while
    /// its grace lasts.
    pub fn onion_secrets(&self, now: u64) -> Vec<StaticSecret> {
        let ring = self.ring();
        let mut out = vec![StaticSecret::from(ring.current.0)];
        if let (Some(prev), Some(at)) = (ring.previous, ring.rotated_at)
            && now < at + ONION_GRACE
        {
            out.push(StaticSecret::from(prev.0));
        }
        out
    }

    /// The current onion public key.
    pub fn onion_public(&self) -> [u8; 32] {
        PublicKey::from(&StaticSecret::from(self.ring().current.0)).to_bytes()
    }

    /// The node with descriptors valid `secs` (at most, and by default, [`DESCRIPTOR_TTL`]: the
    /// previous onion key is kept [`ONION_GRACE`] after a rotation), signed again at half of
    /// it.
    #[must_use]
    pub fn with_descriptor_lifetime(mut self, secs: u64) -> Self {
        self.lifetime = secs.clamp(2, DESCRIPTOR_TTL);
        self
    }

    /// The signed descriptor, issued again when half its life is gone
    /// ([`DESCRIPTOR_REISSUE`] by default).
    pub fn descriptor(&self, now: u64) -> Descriptor {
        let mut slot = self.descriptor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = slot.as_ref()
            && now.saturating_sub(d.issued_at) < self.lifetime / 2
            && now >= d.issued_at
        {
            return d.clone();
        }
        let d = Descriptor::sign(
            &self.signing,
            self.onion_public(),
            &self.endpoint,
            now,
            self.lifetime,
        );
        *slot = Some(d.clone());
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_load_rotate_and_restart_keep_keys() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_764_450_000;
        let id = init(dir.path(), "https://127.0.0.5:7001", t0).unwrap();
        assert!(matches!(
            init(dir.path(), "https://127.0.0.5:7001", t0),
            Err(NodeError::AlreadyInitialized(_))
        ));
        let node = Node::load(dir.path()).unwrap();
        assert_eq!(node.id(), &id);
        let k0 = node.onion_public();
        assert_eq!(node.onion_secrets(t0).len(), 1);
        // A restart keeps the keys.
        assert_eq!(Node::load(dir.path()).unwrap().onion_public(), k0);
        // Rotation after 24 h, previous kept for the grace.
        assert!(!node.rotate_if_due(t0 + ONION_ROTATION - 1).unwrap());
        assert!(node.rotate_if_due(t0 + ONION_ROTATION).unwrap());
        assert_ne!(node.onion_public(), k0);
        let after = t0 + ONION_ROTATION;
        assert_eq!(node.onion_secrets(after + ONION_GRACE - 1).len(), 2);
        assert_eq!(node.onion_secrets(after + ONION_GRACE).len(), 1);
        // And that survives a restart too.
        let again = Node::load(dir.path()).unwrap();
        assert_eq!(again.onion_public(), node.onion_public());
        assert_eq!(again.onion_secrets(after + 1).len(), 2);
        // The descriptor names the current key and verifies.
        let d = node.descriptor(after);
        assert_eq!(d.onion_key, node.onion_public());
        assert!(d.verify(after).is_ok());
        // Debug shows no secret, no endpoint, no full id.
        let text = format!("{node:?}");
        let seed = std::fs::read(dir.path().join("identity.key")).unwrap();
        for secret in node.onion_secrets(after) {
            assert!(!text.contains(&hex::encode(secret.to_bytes())));
        }
        assert!(!text.contains(&hex::encode(&seed)));
        assert!(!text.contains(&hex::encode(id)));
        assert!(!text.contains("127.0.0.5"));
        assert!(text.contains(&Prefix(&id).to_string()));
        use std::os::unix::fs::PermissionsExt;
        for f in ["identity.key", "onion-keys.json"] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(mode, 0o600, "{f}");
        }
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(init(dir.path(), "relay.example:7001", 0).is_err());
        assert!(init(dir.path(), "http://127.0.0.1:1", 0).is_err());
    }
}
