//! The peer store kept across restarts: `peers.json` in the state dir, so a restarted network
//! forms again without its bootstrap peers, and a `--peer URL` trusted on first use stays
//! pinned to the identity it answered with.
//!
//! Only peers this node reached are written, with when it first kept each and last reached it
//! (what route choice weighs a peer by): identities that never answered are not, so the
//! store cannot bring back junk. Every [`SAVE_EVERY`] the table is written again if it
//! changed (atomically: `guard::statefile`, a temporary file renamed over the old one), and
//! once more at shutdown; a kill -9 loses at most what was learned since. At start the file is
//! read (at most [`MAX_FILE`] bytes), every descriptor in it verified again (in batches): an
//! expired or forged one is dropped, the others go through the view's bounds like any
//! newcomer (per block, per source) as the store's. A damaged or oversized file is a lost
//! cache, not a lost store: the node says so at `warn`, naming the file, and starts from its
//! `--peer`s. Nothing in the file is secret (descriptors are public); it is written with the
//! state dir's permissions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{PeerSource, Peers};
use crate::proto::descriptor::Descriptor;
use crate::proto::from_hex;

/// The file in the state dir.
pub const FILE: &str = "peers.json";
/// Largest file read at start (100 000 peers, the view's bound, of about 600 bytes each).
pub const MAX_FILE: u64 = 64 * 1024 * 1024;
/// How often the table is written again when it changed.
pub const SAVE_EVERY: Duration = Duration::from_secs(5);

/// What `peers.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerFile {
    /// Every descriptor held, with where it came from.
    pub peers: Vec<Cached>,
    /// Each `--peer` URL and the identity pinned to it (on the command line or on first use).
    pub pins: Vec<PinnedUrl>,
}

/// One held descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cached {
    /// The descriptor, as its owner signed it.
    pub descriptor: Descriptor,
    /// `bootstrap`, `gossip` or `cache`.
    pub source: String,
    /// This node reached it at its endpoint once; absent in files written before, read as
    /// not reached (and not kept).
    #[serde(default)]
    pub reached: bool,
    /// When this node first kept it (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<u64>,
    /// When this node last reached it (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached_at: Option<u64>,
    /// The block key of the first-hand source it came through (its root for eclipse
    /// detection): a restart keeps what came through one source counted as that source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<u32>,
    /// A source under another root held it too.
    #[serde(default)]
    pub confirmed: bool,
}

/// A `--peer` URL and the node id pinned to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedUrl {
    /// The URL.
    pub url: String,
    /// The node id (64 hex).
    pub id: String,
}

/// The file's path in `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads `path` into `peers` (see the module docs); how many descriptors were kept.
pub fn restore(peers: &Peers, path: &Path) -> usize {
    let file = match read(path) {
        Ok(Some(file)) => file,
        Ok(None) => return 0,
        Err(why) => {
            warn!(
                file = %path.display(),
                "the peer store cannot be read ({why}); starting from the --peer list"
            );
            return 0;
        }
    };
    for pin in &file.pins {
        if let Some(id) = from_hex::<32>(&pin.id) {
            peers.restore_pin(&pin.url, id);
        }
    }
    let now = peers.now().unix;
    let reached: Vec<&Cached> = file.peers.iter().filter(|c| c.reached).collect();
    let ds: Vec<Descriptor> = reached.iter().map(|c| c.descriptor.clone()).collect();
    let verified = crate::discovery::verify::check(&ds, &[], now);
    let mut by_id: std::collections::HashMap<_, _> =
        reached.iter().map(|c| (c.descriptor.node_id, *c)).collect();
    verified
        .into_iter()
        .filter(|s| {
            let Some(c) = by_id.remove(&s.d.node_id) else {
                return false;
            };
            let first_seen = c.first_seen.unwrap_or(now).min(now);
            let at = c.reached_at.unwrap_or(first_seen).min(now);
            let kept = crate::discovery::Kept {
                first_seen,
                reached: Some(at),
                root: c.root.map(|r| (r, c.confirmed)),
            };
            peers.restore(std::sync::Arc::clone(s), kept)
        })
        .count()
}

/// The file at `path`, if any.
fn read(path: &Path) -> Result<Option<PeerFile>, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE => return Err(format!("over {MAX_FILE} bytes")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.kind().to_string()),
    }
    guard::statefile::load_json(path).map_err(|e| match e {
        guard::statefile::StateFileError::Parse { .. } => "not a peer store".to_string(),
        guard::statefile::StateFileError::Io { source, .. } => source.kind().to_string(),
    })
}

/// What `peers` holds now, as the file keeps it: the peers this node reached.
pub fn snapshot(peers: &Peers) -> PeerFile {
    let cached = {
        let disc = peers.lock();
        let view = disc.view();
        view.iter()
            .filter_map(|e| {
                let at = e.reached()?;
                Some(Cached {
                    descriptor: e.s.d.clone(),
                    source: super::source_of(view.origin(e)).as_str().to_string(),
                    reached: true,
                    first_seen: Some(e.first_seen()),
                    reached_at: Some(at),
                    root: Some(view.root(e)),
                    confirmed: e.confirmed(),
                })
            })
            .collect()
    };
    PeerFile {
        peers: cached,
        pins: peers
            .pins()
            .into_iter()
            .map(|(url, id)| PinnedUrl {
                url,
                id: hex::encode(id),
            })
            .collect(),
    }
}

/// A seed list (`super::seeds`) of the peers in the store of `state_dir` (reached ones, one per
/// /16, known longest first, at most `max`), signed with the node's identity key.
///
/// # Errors
/// The node's identity cannot be loaded, or its store read.
pub fn seed_list(state_dir: &Path, max: usize) -> Result<String, String> {
    let node = crate::node::Node::load(state_dir).map_err(|e| e.to_string())?;
    let file = read(&path(state_dir))
        .map_err(|why| format!("the peer store cannot be read ({why})"))?
        .unwrap_or(PeerFile {
            peers: Vec::new(),
            pins: Vec::new(),
        });
    let mut reached: Vec<&Cached> = file.peers.iter().filter(|c| c.reached).collect();
    reached.sort_by_key(|c| (c.first_seen.unwrap_or(u64::MAX), c.descriptor.node_id));
    let mut blocks = std::collections::HashSet::new();
    let peers: Vec<_> = reached
        .into_iter()
        .filter(|c| {
            let ip = crate::proto::parse_endpoint(&c.descriptor.endpoint)
                .ok()
                .map(|a| a.ip());
            ip.is_some_and(|ip| {
                blocks.insert(crate::blocks::block(ip, crate::send::path::PATH_BLOCKS))
            })
        })
        .take(max)
        .map(|c| (c.descriptor.node_id, c.descriptor.endpoint.clone()))
        .collect();
    Ok(super::seeds::write(node.signing_key(), &peers))
}

/// Writes the table to `path` every [`SAVE_EVERY`] when it changed, and at `cancel`.
pub async fn run(peers: Arc<Peers>, path: PathBuf, cancel: CancellationToken) {
    let mut saved = None;
    let mut failed_before = false;
    loop {
        let stop = tokio::select! {
            () = cancel.cancelled() => true,
            () = tokio::time::sleep(SAVE_EVERY) => false,
        };
        let now = Some(peers.generation());
        if now != saved {
            let (p, file) = (path.clone(), snapshot(&peers));
            let written =
                tokio::task::spawn_blocking(move || guard::statefile::save_json(&p, &file)).await;
            match written {
                Ok(Ok(())) => {
                    saved = now;
                    failed_before = false;
                }
                _ if failed_before => {}
                _ => {
                    failed_before = true;
                    warn!(
                        file = %path.display(),
                        "the peer store cannot be written; it is kept in memory and tried again"
                    );
                }
            }
        }
        if stop {
            return;
        }
    }
}

impl PeerSource {
    /// The name the status document and the file use.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerSource::Bootstrap => "bootstrap",
            PeerSource::Gossip => "gossip",
            PeerSource::Cache => "cache",
        }
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::clock::Clock;
    use crate::peers::PeerSpec;

    const T0: u64 = 1_800_000_000;

    fn descriptor(seed: u8) -> Descriptor {
        crate::proto::descriptor::for_test([seed; 32], format!("https://127.0.{seed}.1:7001"), T0)
    }

    fn url_spec() -> PeerSpec {
        PeerSpec::parse("https://127.0.1.1:7001").unwrap()
    }

    #[test]
    fn a_restart_reads_back_the_peers_and_the_pins() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        let before = Peers::new(vec![url_spec()], true, Clock::starting_at(T0), [0; 32]);
        assert!(before.insert(descriptor(1)));
        assert!(before.insert(descriptor(2)));
        before.restore_pin("https://127.0.1.1:7001", descriptor(1).node_id);
        guard::statefile::save_json(&file, &snapshot(&before)).unwrap();

        let after = Peers::new(vec![url_spec()], true, Clock::starting_at(T0), [0; 32]);
        assert_eq!(restore(&after, &file), 2);
        assert_eq!(after.by_source().cache, 2);
        assert_eq!(after.routable(T0).len(), 2);
        assert_eq!(
            after.pins(),
            vec![("https://127.0.1.1:7001".to_string(), descriptor(1).node_id)]
        );
        // A fetch from its --peer makes it a bootstrap peer again.
        let mut newer = descriptor(1);
        newer = Descriptor::sign(
            &SigningKey::from_bytes(&[1; 32]),
            newer.onion_key,
            newer.endpoint,
            T0 + 1,
            3600,
        );
        assert!(after.insert(newer));
        assert_eq!(after.by_source().bootstrap, 1);
    }

    #[test]
    fn a_forged_expired_damaged_or_oversized_store_keeps_nothing_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        let peers = Peers::new(vec![], true, Clock::starting_at(T0 + 7200), [0; 32]);
        let mut forged = descriptor(3);
        forged.endpoint = "https://127.0.9.9:7001".into();
        let old = PeerFile {
            peers: vec![
                Cached {
                    descriptor: descriptor(1),
                    source: "gossip".into(),
                    reached: true,
                    first_seen: None,
                    reached_at: None,
                    root: None,
                    confirmed: false,
                },
                Cached {
                    descriptor: forged,
                    source: "gossip".into(),
                    reached: true,
                    first_seen: None,
                    reached_at: None,
                    root: None,
                    confirmed: false,
                },
            ],
            pins: vec![],
        };
        guard::statefile::save_json(&file, &old).unwrap();
        assert_eq!(restore(&peers, &file), 0, "expired and forged");
        std::fs::write(&file, b"{ not json").unwrap();
        assert_eq!(restore(&peers, &file), 0);
        std::fs::write(&file, vec![b' '; MAX_FILE as usize + 1]).unwrap();
        assert_eq!(restore(&peers, &file), 0);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(restore(&peers, &file), 0);
        assert_eq!(peers.by_source(), crate::peers::BySource::default());
    }
}
