//! Bans: a server's admin bars an IP address from that server, for good or for a while.
//!
//! Everything about them is here: the [`Ban`] and the checks on a new one ([`Ban::new`]), the
//! table the packet path looks up ([`BanTable`], one per relayed server, each ban with its
//! deadline on the monotonic clock), and the per-port store on disk, `bans-<port>.db`
//! ([`store`]; the `bans-<port>.json` of earlier versions, [`load`], is imported once). The
//! control API's routes build bans here; the registry saves them before the server applies
//! them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use guard::statefile::{self, StateFileError};
use serde::{Deserialize, Serialize};

use crate::clock::{self, Instant, from_unix, unix};

/// Most bans one server keeps.
pub const MAX_BANS: usize = 65_536;
/// Longest ban accepted (10 years).
pub const MAX_BAN_SECS: u64 = 10 * 365 * 24 * 3600;
/// Longest reason accepted, in bytes.
pub const MAX_REASON: usize = 1024;

/// A ban of one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    /// The banned address.
    pub ip: IpAddr,
    /// Why, as the admin said.
    pub reason: String,
    /// When it was set.
    pub since: SystemTime,
    /// When it ends; `None`: permanent.
    pub expires: Option<SystemTime>,
}

/// Why a ban was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BanError {
    /// The reason is over [`MAX_REASON`] bytes.
    #[error("reason is over {MAX_REASON} bytes")]
    ReasonTooLong,
    /// A duration of 0.
    #[error("duration_secs must be at least 1")]
    NoDuration,
    /// A duration over [`MAX_BAN_SECS`].
    #[error("duration_secs is over {MAX_BAN_SECS}")]
    TooLong,
    /// An address no datagram comes from ([`crate::net::not_a_source`]).
    #[error("{ip} is {what}: no datagram comes from it, there is nothing to ban")]
    NotASource {
        /// The address, as banned.
        ip: IpAddr,
        /// What it is.
        what: &'static str,
    },
}

impl Ban {
    /// A ban of `ip` set at `now` for `duration_secs` (`None`: for good). An IPv4-mapped IPv6
    /// address is the IPv4 address, as it arrives on the socket.
    ///
    /// # Errors
    /// [`BanError`]: the address is one no datagram comes from, or the reason or the duration
    /// is out of bounds.
    pub fn new(
        ip: IpAddr,
        reason: String,
        duration_secs: Option<u64>,
        now: SystemTime,
    ) -> Result<Ban, BanError> {
        let ip = normalize(ip);
        if let Some(what) = crate::net::not_a_source(ip) {
            return Err(BanError::NotASource { ip, what });
        }
        if reason.len() > MAX_REASON {
            return Err(BanError::ReasonTooLong);
        }
        let expires = match duration_secs {
            None => None,
            Some(0) => return Err(BanError::NoDuration),
            Some(s) if s > MAX_BAN_SECS => return Err(BanError::TooLong),
            Some(s) => Some(now + Duration::from_secs(s)),
        };
        Ok(Ban {
            ip,
            reason,
            since: now,
            expires,
        })
    }

    /// True when the ban no longer applies at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

/// An IPv4-mapped IPv6 address is the IPv4 address (that is how it arrives on the socket).
pub fn normalize(ip: IpAddr) -> IpAddr {
    crate::net::canonical_ip(ip)
}

/// The table holds [`MAX_BANS`] live bans already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

/// The bans of one server in memory, by address. A ban stops matching at its deadline (on the
/// monotonic clock, taken from its end date when it goes in) and is purged on the next change
/// or listing.
#[derive(Debug)]
pub struct BanTable {
    /// Each ban with its deadline; `None`: permanent.
    entries: HashMap<IpAddr, (Ban, Option<Instant>)>,
    max_len: usize,
}

impl Default for BanTable {
    fn default() -> Self {
        BanTable::with_limit(MAX_BANS)
    }
}

impl BanTable {
    fn with_limit(max_len: usize) -> Self {
        BanTable {
            entries: HashMap::new(),
            max_len,
        }
    }

    /// Puts `ban` in, replacing an earlier ban of the same address; `now_sys` and `now` are
    /// the same moment on both clocks. A new address is refused when the table is full of live
    /// bans (expired ones are purged first); replacing never fails.
    ///
    /// # Errors
    /// [`TableFull`] as above.
    pub fn insert(&mut self, ban: Ban, now_sys: SystemTime, now: Instant) -> Result<(), TableFull> {
        if !self.entries.contains_key(&ban.ip) && self.entries.len() >= self.max_len {
            self.purge(now);
            if self.entries.len() >= self.max_len {
                return Err(TableFull);
            }
        }
        let deadline = ban.expires.map(|at| clock::deadline(at, now_sys, now));
        self.entries.insert(ban.ip, (ban, deadline));
        Ok(())
    }

    /// Lifts the ban of `ip`; false when it was not banned (or its ban had expired).
    pub fn remove(&mut self, ip: IpAddr, now: Instant) -> bool {
        self.entries
            .remove(&ip)
            .is_some_and(|(_, deadline)| live(deadline, now))
    }

    /// True when `ip` is banned at `now`: the packet path's check.
    #[inline]
    pub fn is_banned(&self, ip: IpAddr, now: Instant) -> bool {
        !self.entries.is_empty()
            && self
                .entries
                .get(&ip)
                .is_some_and(|(_, deadline)| live(*deadline, now))
    }

    /// The bans in force, oldest first (expired ones are purged).
    pub fn list(&mut self, now: Instant) -> Vec<Ban> {
        self.purge(now);
        let mut v: Vec<Ban> = self.entries.values().map(|(b, _)| b.clone()).collect();
        v.sort_by(|a, b| a.since.cmp(&b.since).then(a.ip.cmp(&b.ip)));
        v
    }

    /// Removes the expired bans; returns how many.
    fn purge(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, (_, deadline)| live(*deadline, now));
        before - self.entries.len()
    }
}

fn live(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_none_or(|d| now < d)
}

/// A ban as the state file and the control API show it: dates as Unix seconds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BanRecord {
    ip: IpAddr,
    reason: String,
    since: u64,
    expires_at: Option<u64>,
}

impl From<&Ban> for BanRecord {
    fn from(b: &Ban) -> Self {
        BanRecord {
            ip: b.ip,
            reason: b.reason.clone(),
            since: unix(b.since),
            expires_at: b.expires.map(unix),
        }
    }
}

impl From<BanRecord> for Ban {
    fn from(r: BanRecord) -> Self {
        Ban {
            ip: r.ip,
            reason: r.reason,
            since: from_unix(r.since),
            expires: r.expires_at.map(from_unix),
        }
    }
}

/// `bans-<port>.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BansFile {
    bans: Vec<BanRecord>,
}

/// The JSON ban file of an earlier version for the server on `port`, in `dir` (imported into
/// the [`store`] once).
pub fn path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("bans-{port}.json"))
}

/// The bans saved in `path`; none when the file does not exist.
///
/// # Errors
/// The file cannot be read or parsed.
pub fn load(path: &Path) -> Result<Vec<Ban>, StateFileError> {
    let file: BansFile = statefile::load_json(path)?.unwrap_or_default();
    Ok(file.bans.into_iter().map(Ban::from).collect())
}

/// Writes `bans` to `path` atomically (temp file, fsync, rename, fsync dir). Blocking: run it
/// off the reactor.
///
/// # Errors
/// The file cannot be written.
pub fn save(path: &Path, bans: &[Ban]) -> Result<(), StateFileError> {
    let file = BansFile {
        bans: bans.iter().map(BanRecord::from).collect(),
    };
    statefile::save_json(path, &file)
}

pub mod store;

#[cfg(test)]
mod tests;
