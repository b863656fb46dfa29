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
//!
//! **Bounds.** The store holds what the view holds: at most
//! [`CAPACITY`](crate::discovery::view::CAPACITY) (100 000) peers, whatever a file says (every
//! entry goes through the view's bounds on the way in). On disk, compact JSON: about 530 bytes
//! a peer, 612 at the widest, so a full view takes 51 MiB (58 MiB at the widest) and always
//! fits [`MAX_FILE`] (64 MiB; a larger file is not read). In memory, 100 000 restored peers
//! take 30 MiB: the view's structures 7 MiB, the descriptors 23 MiB (about 240 bytes each).
//! Reading the file back adds to that while it is parsed and checked: a process that restored
//! 100 000 peers holds 66 MiB more than before, 89 MiB at its peak. The signatures are checked
//! on every CPU (the node is starting, nothing waits for one). Measured by
//! `scripts/bench-peer-store` (2 CPUs): 10 000 peers are read back in 0.2–0.3 s, 100 000 in
//! 2.4 s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{PeerSource, Peers};
use crate::discovery::{Kept, Signed, verify};
use crate::proto::descriptor::Descriptor;
use crate::proto::{NodeId, from_hex};

/// The file in the state dir.
pub const FILE: &str = "peers.json";
/// Largest file read at start: a full view (100 000 peers, the view's bound) of compact
/// entries, at most 612 bytes each, fits (`a_full_view_fits_the_file_bound`).
pub const MAX_FILE: u64 = 64 * 1024 * 1024;
/// How often the table is written again when it changed.
pub const SAVE_EVERY: Duration = Duration::from_secs(5);
/// Threads the signatures are checked on at start, at most...
const VERIFY_THREADS: usize = 8;
/// ...each given this many descriptors at least.
const VERIFY_CHUNK: usize = 1024;

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
                %why,
                "the peer store cannot be read; starting from the --peer list"
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
    // The descriptors moved out of the file (not copied), what was kept of each apart.
    let (mut kept, ds): (HashMap<NodeId, Kept>, Vec<Descriptor>) = file
        .peers
        .into_iter()
        .filter(|c| c.reached)
        .map(|c| {
            let first_seen = c.first_seen.unwrap_or(now).min(now);
            let kept = Kept {
                first_seen,
                reached: Some(c.reached_at.unwrap_or(first_seen).min(now)),
                root: c.root.map(|r| (r, c.confirmed)),
            };
            ((c.descriptor.node_id, kept), c.descriptor)
        })
        .unzip();
    let verified = verify_all(&ds, now);
    drop(ds);
    // One entry per identity, as the file names it last.
    peers.restore_all(verified.into_iter().filter_map(|s| {
        let k = kept.remove(&s.d.node_id)?;
        Some((s, k))
    }))
}

/// The descriptors among `ds` that verify at `now`, checked in batches on every CPU (at most
/// [`VERIFY_THREADS`]): the node is starting, nothing else waits for one.
fn verify_all(ds: &[Descriptor], now: u64) -> Vec<Arc<Signed>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(VERIFY_THREADS);
    let per = ds.len().div_ceil(threads).max(VERIFY_CHUNK);
    if ds.len() <= per {
        return verify::check(ds, &[], now);
    }
    std::thread::scope(|s| {
        let parts: Vec<_> = ds
            .chunks(per)
            .map(|part| s.spawn(move || verify::check(part, &[], now)))
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// Writes `file` to `path` atomically (`guard::statefile`), as compact JSON: a full view
/// ([`crate::discovery::view::CAPACITY`] peers) stays under [`MAX_FILE`].
///
/// # Errors
/// The file could not be written.
pub fn save(path: &Path, file: &PeerFile) -> Result<(), guard::statefile::StateFileError> {
    let mut bytes =
        serde_json::to_vec(file).map_err(|source| guard::statefile::StateFileError::Parse {
            path: path.to_owned(),
            source,
        })?;
    bytes.push(b'\n');
    guard::statefile::write_atomic(path, &bytes)
}

/// Why the peer store's file cannot be read (said without its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Larger than a peer store may be.
    #[error("over {MAX_FILE} bytes")]
    TooLarge,
    /// The file system refused it.
    #[error("{0}")]
    Io(std::io::ErrorKind),
    /// Something else than a peer store.
    #[error("not a peer store")]
    NotAPeerStore,
}

/// The file at `path`, if any.
fn read(path: &Path) -> Result<Option<PeerFile>, ReadError> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE => return Err(ReadError::TooLarge),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReadError::Io(e.kind())),
    }
    guard::statefile::load_json(path).map_err(|e| match e {
        guard::statefile::StateFileError::Parse { .. } => ReadError::NotAPeerStore,
        guard::statefile::StateFileError::Io { source, .. } => ReadError::Io(source.kind()),
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

/// Why `blindrelay seeds` cannot print a seed list.
#[derive(Debug, thiserror::Error)]
pub enum SeedListError {
    /// The node's identity (the state dir's).
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    /// The peer store cannot be read.
    #[error("the peer store {} cannot be read ({why})", file.display())]
    Store {
        /// The peer store's file.
        file: std::path::PathBuf,
        /// Why.
        why: ReadError,
    },
}

/// A seed list (`super::seeds`) of the peers in the store of `state_dir` (reached ones, one per
/// /16, known longest first, at most `max`), signed with the node's identity key.
///
/// # Errors
/// [`SeedListError`]: the node's identity cannot be loaded, or its store read.
pub fn seed_list(state_dir: &Path, max: usize) -> Result<String, SeedListError> {
    let node = crate::node::Node::load(state_dir)?;
    let store = path(state_dir);
    let file = read(&store)
        .map_err(|why| SeedListError::Store { file: store, why })?
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
            let written = tokio::task::spawn_blocking(move || save(&p, &file)).await;
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
        save(&file, &snapshot(&before)).unwrap();

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

    /// A store of a 10 000-node network, as the node writes it, comes back whole: every
    /// descriptor verified and kept through the view's bounds, routable, rooted as written.
    #[test]
    fn a_store_of_ten_thousand_peers_restores_whole() {
        const N: u32 = 10_000;
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        let onion = descriptor(1).onion_key;
        let peers: Vec<Cached> = (0..N)
            .map(|i| {
                let mut seed = [0x5a; 32];
                seed[..4].copy_from_slice(&i.to_le_bytes());
                let at = format!("https://11.{}.{}.1:7001", i / 256, i % 256);
                let d = Descriptor::sign(&SigningKey::from_bytes(&seed), onion, at, T0, 3600);
                Cached {
                    descriptor: d,
                    source: "gossip".into(),
                    reached: true,
                    first_seen: Some(T0),
                    reached_at: Some(T0),
                    root: Some(i % 64),
                    confirmed: i % 2 == 0,
                }
            })
            .collect();
        save(
            &file,
            &PeerFile {
                peers,
                pins: vec![],
            },
        )
        .unwrap();
        let after = Peers::new(vec![], false, Clock::starting_at(T0 + 60), [0; 32]);
        let started = crate::clock::now();
        assert_eq!(restore(&after, &file), N as usize);
        let took = crate::clock::elapsed(started);
        assert_eq!(after.by_source().cache, N as usize);
        assert_eq!(after.by_source().waiting, 0);
        assert_eq!(after.routable(T0 + 60).len(), N as usize);
        let e = after.lock().eclipse();
        assert_eq!((e.roots, e.unconfirmed_share), (64, 0.5));
        assert_eq!(snapshot(&after).peers.len(), N as usize);
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    }

    /// The file bound holds a full view: [`CAPACITY`](crate::discovery::view::CAPACITY)
    /// entries of the longest kind (the longest endpoint a descriptor may be kept with, every
    /// field at its widest).
    #[test]
    fn a_full_view_fits_the_file_bound() {
        let mut d = descriptor(1);
        d.endpoint = "https://[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535/".into();
        assert!(crate::proto::parse_endpoint(&d.endpoint).is_ok());
        (d.issued_at, d.expires_at) = (u64::MAX, u64::MAX);
        let widest = Cached {
            descriptor: d,
            source: "bootstrap".into(),
            reached: true,
            first_seen: Some(u64::MAX),
            reached_at: Some(u64::MAX),
            root: Some(u32::MAX),
            confirmed: false,
        };
        let entry = serde_json::to_vec(&widest).unwrap().len() as u64 + 1;
        let full = entry * crate::discovery::view::CAPACITY as u64;
        assert!(full + 64 * 1024 <= MAX_FILE, "{entry} bytes an entry");
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
        save(&file, &old).unwrap();
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
