//! Proven sources: the addresses that showed they are real, served first under a flood.
//!
//! A UDP source address can be spoofed; a source that completed a join cannot have been: the
//! game server only sends `connectResponse` (or an in-game packet) to a session after a
//! `connect` that echoed the challenge it sent to that session's client address. The session
//! table calls [`Proven::record`] when it promotes a session (see `forward`), and the relay
//! loop then gives that IP its own lane: its `getchallenge` goes before the fair queue, its
//! queries have their own answer budget (`relay/packet`). A spoofed flood from any number of
//! other addresses cannot take those from it.
//!
//! Bounded: at most [`MAX_PROVEN`] addresses (about 40 bytes each in memory, at most 1.5 MB;
//! under 40 bytes each in the file). At the cap, the eighth seen longest ago is forgotten. An
//! address not seen for [`PROVEN_FOR`] is forgotten at the next [`Proven::prune`]. The set is
//! kept in `proven-<port>.json` in the state directory (written atomically, at most once a
//! minute and when the server stops), so a restart forgets no one. No I/O here but
//! [`Proven::load`] and [`save`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use guard::statefile::{self, StateFileError};
use tracing::warn;

/// Addresses remembered at most.
pub const MAX_PROVEN: usize = 32_768;
/// An address not seen for this long is forgotten: 30 days.
pub const PROVEN_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// A proven address seen again is written again only when its date moved this much.
const RESTAMP: u64 = 3600;

/// The proven addresses of one server and when each was last seen (Unix seconds).
#[derive(Debug, Default)]
pub(super) struct Proven {
    seen: HashMap<IpAddr, u64>,
    /// Changed since the last [`Proven::take_changes`].
    changed: bool,
}

impl Proven {
    /// The set kept in `path`, without the addresses older than [`PROVEN_FOR`] at `now`
    /// (Unix seconds). A missing file is an empty set; a damaged one is logged and ignored (it
    /// is written again at the next save).
    pub(super) fn load(path: &Path, now: u64) -> Self {
        let entries: Vec<(IpAddr, u64)> = match statefile::load_json(path) {
            Ok(e) => e.unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, "proven sources not loaded, starting with none");
                Vec::new()
            }
        };
        let mut p = Proven::default();
        for (ip, at) in entries {
            p.insert(ip.to_canonical(), at);
        }
        p.prune(now);
        p.changed = false;
        p
    }

    /// True when `ip` (canonical form) proved its address.
    pub(super) fn contains(&self, ip: &IpAddr) -> bool {
        self.seen.contains_key(ip)
    }

    /// `ip` completed a join at `now` (Unix seconds).
    pub(super) fn record(&mut self, ip: IpAddr, now: u64) {
        self.insert(ip.to_canonical(), now);
    }

    fn insert(&mut self, ip: IpAddr, at: u64) {
        if let Some(t) = self.seen.get_mut(&ip) {
            if at >= t.saturating_add(RESTAMP) {
                *t = at;
                self.changed = true;
            }
            return;
        }
        if self.seen.len() >= MAX_PROVEN {
            self.forget_oldest(MAX_PROVEN / 8);
        }
        self.seen.insert(ip, at);
        self.changed = true;
    }

    /// Forgets the `n` addresses seen longest ago.
    fn forget_oldest(&mut self, n: usize) {
        let mut dates: Vec<u64> = self.seen.values().copied().collect();
        let n = n.min(dates.len());
        if n == 0 {
            return;
        }
        let (_, cut, _) = dates.select_nth_unstable(n - 1);
        let cut = *cut;
        let mut left = n;
        self.seen.retain(|_, at| {
            if left > 0 && *at <= cut {
                left -= 1;
                false
            } else {
                true
            }
        });
        self.changed = true;
    }

    /// Forgets the addresses not seen for [`PROVEN_FOR`] at `now` (Unix seconds).
    pub(super) fn prune(&mut self, now: u64) {
        let before = self.seen.len();
        let oldest = now.saturating_sub(PROVEN_FOR.as_secs());
        self.seen.retain(|_, at| *at >= oldest);
        if self.seen.len() != before {
            self.changed = true;
        }
    }

    /// Addresses remembered now.
    pub(super) fn len(&self) -> usize {
        self.seen.len()
    }

    /// Asks for the set to be written again (a write failed).
    pub(super) fn mark_changed(&mut self) {
        self.changed = true;
    }

    /// The entries to write when the set changed since the last call.
    pub(super) fn take_changes(&mut self) -> Option<Vec<(IpAddr, u64)>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        Some(self.seen.iter().map(|(ip, at)| (*ip, *at)).collect())
    }
}

/// Writes `entries` to `path` atomically.
///
/// # Errors
/// As [`statefile::save_json`].
pub(super) fn save(path: &Path, entries: &[(IpAddr, u64)]) -> Result<(), StateFileError> {
    statefile::save_json(path, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8) -> IpAddr {
        IpAddr::from([10, 0, a, b])
    }

    #[test]
    fn recorded_addresses_are_kept_until_they_expire() {
        let mut p = Proven::default();
        p.record(ip(0, 1), 1_000);
        p.record("::ffff:10.0.0.2".parse().unwrap(), 1_000);
        assert!(p.contains(&ip(0, 1)));
        assert!(p.contains(&ip(0, 2)), "kept in canonical form");
        assert!(p.take_changes().is_some());
        p.record(ip(0, 1), 1_010);
        assert!(
            p.take_changes().is_none(),
            "seen again soon: nothing to write"
        );
        p.record(ip(0, 1), 1_000 + PROVEN_FOR.as_secs());
        p.prune(1_001 + PROVEN_FOR.as_secs());
        assert!(p.contains(&ip(0, 1)), "seen again later: kept");
        assert!(!p.contains(&ip(0, 2)), "not seen for 30 days: forgotten");
    }

    #[test]
    fn at_the_cap_the_eighth_seen_longest_ago_goes() {
        let mut p = Proven::default();
        for i in 0..MAX_PROVEN {
            p.record(
                IpAddr::from(u32::try_from(i).unwrap().to_be_bytes()),
                i as u64,
            );
        }
        assert_eq!(p.len(), MAX_PROVEN);
        p.record(ip(255, 255), 1 << 40);
        assert_eq!(p.len(), MAX_PROVEN - MAX_PROVEN / 8 + 1);
        assert!(p.contains(&ip(255, 255)));
        assert!(!p.contains(&IpAddr::from([0, 0, 0, 0])), "the oldest went");
        let last = u32::try_from(MAX_PROVEN - 1).unwrap();
        assert!(
            p.contains(&IpAddr::from(last.to_be_bytes())),
            "the newest stayed"
        );
    }

    #[test]
    fn the_file_survives_a_restart_and_damage_loses_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proven-27960.json");
        let d = PROVEN_FOR.as_secs();
        let mut p = Proven::default();
        p.record(ip(0, 1), d);
        p.record("2001:db8::1".parse().unwrap(), 1);
        save(&path, &p.take_changes().unwrap()).unwrap();
        let back = Proven::load(&path, d + 10);
        assert!(back.contains(&ip(0, 1)));
        assert!(
            !back.contains(&"2001:db8::1".parse().unwrap()),
            "expired while stopped"
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(Proven::load(&path, 0).len(), 0);
        assert_eq!(Proven::load(&dir.path().join("none.json"), 0).len(), 0);
    }
}
