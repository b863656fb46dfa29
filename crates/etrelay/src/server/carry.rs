//! Players carried over a restart of the relay: what each translated session needs to go on
//! (its client's address and qport, the two challenges, the scheme), kept in
//! `sessions-<port>.json` in the state directory.
//!
//! A player in game holds the relay's challenge, the game server its own; only the relay knows
//! both. A relay that restarted without them could not translate that player's packets, and the
//! player would hang until its client gives up. So `super::carry_task` writes the translated
//! sessions every [`SAVE_EVERY`] while they changed, and once more when the server stops
//! (atomically, off the reactor); at start the entries younger than [`CARRY_FOR`] are read back.
//! The first in-game packet from such a client (same address, same qport) opens its session
//! with its translation in force, and the game server, seeing the player's qport from a new port
//! of the relay's address, re-points the player there (`SV_PacketEvent`, "fixing up a
//! translated port"): the game goes on. A crash loses the sessions of the last
//! [`SAVE_EVERY`]; a damaged file is logged and ignored. At most [`MAX_CARRIED`] entries.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use guard::statefile::{self, StateFileError};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::session::Phase;
use super::table::Table;
use crate::et::netchan::{Scheme, Translation};

/// How often the sessions are looked at (and written when changed).
pub(super) const SAVE_EVERY: Duration = Duration::from_secs(5);
/// Entries older than this at start are not carried (the engines' clients give up after
/// 200 s without a packet; 2 minutes covers any restart).
pub(super) const CARRY_FOR: Duration = Duration::from_secs(120);
/// Entries read at most.
pub(super) const MAX_CARRIED: usize = 4_096;

/// One carried session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Carried {
    /// The client's address.
    pub(super) client: SocketAddr,
    /// Its qport.
    pub(super) qport: u16,
    /// The challenge the client holds (the relay's).
    pub(super) client_challenge: i32,
    /// The game server's.
    pub(super) server_challenge: i32,
    /// ioquake3's checksum (true) or the XOR scheme.
    pub(super) checksum: bool,
    /// When it was written (Unix seconds).
    pub(super) at: u64,
}

impl Carried {
    /// Its translation.
    pub(super) fn translation(&self) -> Translation {
        Translation {
            scheme: if self.checksum {
                Scheme::Checksum
            } else {
                Scheme::Xor
            },
            client: self.client_challenge,
            server: self.server_challenge,
        }
    }
}

/// The file of `port`'s carried sessions in the state directory `dir`.
pub fn path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("sessions-{port}.json"))
}

/// The entries of `path` younger than [`CARRY_FOR`] at `now` (Unix seconds), by client; none
/// when the file is missing; a damaged file is logged and ignored.
pub(super) fn load(path: &Path, now: u64) -> HashMap<SocketAddr, Carried> {
    let entries: Vec<Carried> = match statefile::load_json(path) {
        Ok(e) => e.unwrap_or_default(),
        Err(e) => {
            warn!(error = %e, "sessions to carry over not read");
            Vec::new()
        }
    };
    let oldest = now.saturating_sub(CARRY_FOR.as_secs());
    entries
        .into_iter()
        .filter(|c| c.at >= oldest)
        .take(MAX_CARRIED)
        .map(|c| (c.client, c))
        .collect()
}

/// The translated, established sessions of `table` as entries stamped `now`, sorted.
pub(super) fn collect(table: &Table, now: u64) -> Vec<Carried> {
    let mut out: Vec<Carried> = table
        .iter()
        .filter(|s| s.phase() == Phase::Established)
        .filter_map(|s| {
            let t = s.translator.get()?;
            Some(Carried {
                client: s.client(),
                qport: s.qport()?,
                client_challenge: t.client,
                server_challenge: t.server,
                checksum: t.scheme == Scheme::Checksum,
                at: now,
            })
        })
        .collect();
    out.sort_unstable_by_key(|c| c.client);
    out
}

/// Writes `entries` to `path` atomically.
pub(super) fn save(path: &Path, entries: &[Carried]) -> Result<(), StateFileError> {
    statefile::save_json(path, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_a_restart_until_they_are_too_old() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), 27960);
        let c = |port: u16, at: u64| Carried {
            client: SocketAddr::from(([192, 0, 2, 1], port)),
            qport: port,
            client_challenge: 5,
            server_challenge: -6,
            checksum: port.is_multiple_of(2),
            at,
        };
        save(
            &p,
            &[c(1000, 10_000), c(1001, 10_000 - CARRY_FOR.as_secs() - 1)],
        )
        .unwrap();
        let back = load(&p, 10_000);
        assert_eq!(back.len(), 1);
        let one = back[&SocketAddr::from(([192, 0, 2, 1], 1000))];
        assert_eq!(one.translation().scheme, Scheme::Checksum);
        assert_eq!(
            (one.translation().client, one.translation().server),
            (5, -6)
        );
        std::fs::write(&p, b"not json").unwrap();
        assert!(load(&p, 0).is_empty());
        assert!(load(&dir.path().join("none.json"), 0).is_empty());
    }
}
