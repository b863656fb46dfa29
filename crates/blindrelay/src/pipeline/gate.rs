//! The request gate (design step 1), consulted twice on the way in (`super::ingress`): its cheap
//! budget before the body is read, admission once the body is framed. The design's process-wide totals (`--admission-per-minute`
//! requests per minute, [`MAX_IN_FLIGHT`] in flight) as the ceiling, shared fairly per source
//! (`crate::sources`).
//!
//! - **Cheap budget** ([`RequestGate::cheap`]), before the body is read: every request of a
//!   source, whatever becomes of it, takes a token of its own bucket ([`CHEAP_PER_SECOND`] by
//!   default, `--cheap-per-second`; burst twice that). Requests the cheap checks refuse (size, framing, a slow body) cost
//!   this budget only.
//! - **Admission** ([`RequestGate::admit`]), once the body is read and framed, so the request
//!   can be judged: a slot in flight (at most [`IN_FLIGHT_PER_SOURCE`] per source by default,
//!   `--in-flight-per-source`, and
//!   [`IN_FLIGHT_RESERVED`] of them only for known sources), then a token of the rate. The rate
//!   is two fair pools ([`crate::sources::fair`]): [`KNOWN_SHARE_PERCENT`] of it for known
//!   sources only, the rest for everyone; a known source that used its share of its own pool
//!   may use its share of the other. Tokens refill continuously: recovery follows the load.
//!
//! Refusals: `source_limited` when the source (or the unknown sources together) is over its
//! share, `backpressure` when the node's totals are spent for a known source too, or every
//! in-flight slot it may take is held. Never waits.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use guard::limiter::{KeyedLimiter, Limits, TokenBucket};

use crate::reason::Reason;
use crate::sources::fair::{self, FairPool};
use crate::sources::{CountLimits, CountRefusal, CountTable, Held, SourceKey};

/// Requests in flight at most, by default.
pub const MAX_IN_FLIGHT: usize = 64;
/// Requests admitted per minute, process-wide, by default.
pub const DEFAULT_PER_WINDOW: u32 = 1200;
/// Of the rate, the share only known sources may use, by default (percent).
pub const KNOWN_SHARE_PERCENT: u8 = 50;
/// Requests one source may have in flight.
pub const IN_FLIGHT_PER_SOURCE: usize = 16;
/// In-flight slots only known sources may take.
pub const IN_FLIGHT_RESERVED: usize = 16;
/// The cheap budget: requests per second per source, by default (`--cheap-per-second`), with a
/// burst of twice that.
pub const CHEAP_PER_SECOND: u32 = 200;
/// Sources the cheap budget remembers at most.
pub const CHEAP_SOURCES: usize = 4096;

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateConfig {
    /// Requests admitted per minute, process-wide.
    pub per_minute: u32,
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// Percent of the rate reserved for known sources.
    pub known_share_percent: u8,
    /// The cheap budget per source (requests per second; the burst is twice that).
    pub cheap_per_second: u32,
    /// Requests one source may have in flight.
    pub in_flight_per_source: usize,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            per_minute: DEFAULT_PER_WINDOW,
            max_in_flight: MAX_IN_FLIGHT,
            known_share_percent: KNOWN_SHARE_PERCENT,
            cheap_per_second: CHEAP_PER_SECOND,
            in_flight_per_source: IN_FLIGHT_PER_SOURCE,
        }
    }
}

/// The request gate.
#[derive(Debug)]
pub struct RequestGate {
    cheap: Mutex<KeyedLimiter<SourceKey, TokenBucket>>,
    known: FairPool,
    everyone: FairPool,
    in_flight: CountTable,
}

/// A request admitted by the gate: it holds its in-flight slot until dropped.
#[derive(Debug)]
pub struct Admitted {
    _slot: Held,
}

impl RequestGate {
    /// A gate with `config`, full at `now`.
    pub fn new(config: GateConfig, now: Instant) -> Self {
        let rate = f64::from(config.per_minute) / 60.0;
        let known = rate * f64::from(config.known_share_percent.min(100)) / 100.0;
        let reserved = IN_FLIGHT_RESERVED.min(config.max_in_flight / 2);
        RequestGate {
            cheap: Mutex::new(KeyedLimiter::new(
                TokenBucket::new(
                    config.cheap_per_second.saturating_mul(2).max(1),
                    Duration::from_secs(1) / config.cheap_per_second.max(1),
                ),
                Limits {
                    max_keys: CHEAP_SOURCES,
                    forget: Duration::from_secs(10),
                    sweep_gap: Duration::from_millis(500),
                },
            )),
            known: FairPool::new(known, now),
            everyone: FairPool::new(rate - known, now),
            in_flight: CountTable::new(CountLimits {
                total: config.max_in_flight,
                per_source: config.in_flight_per_source.min(config.max_in_flight),
                reserved,
            }),
        }
    }

    /// The cheap budget: one token of `key`'s bucket at `now`, before anything is read.
    ///
    /// # Errors
    /// `source_limited`.
    pub fn cheap(&self, key: SourceKey, now: Instant) -> Result<(), Reason> {
        let mut cheap = self.cheap.lock().unwrap_or_else(|p| p.into_inner());
        match cheap.check(&key, now) {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(Reason::SourceLimited),
        }
    }

    /// Admission at `now` for a request from `key` that can be judged.
    ///
    /// # Errors
    /// `source_limited` or `backpressure`.
    pub fn admit(&self, key: SourceKey, now: Instant) -> Result<Admitted, Reason> {
        let slot = self.in_flight.acquire(key).map_err(|r| match r {
            CountRefusal::Source => Reason::SourceLimited,
            CountRefusal::Total => Reason::Backpressure,
        })?;
        let taken = if key.is_known() {
            self.known
                .take(key, now)
                .or_else(|_| self.everyone.take(key, now))
        } else {
            self.everyone.take(key, now)
        };
        match taken {
            Ok(()) => Ok(Admitted { _slot: slot }),
            Err(fair::Refusal::Share) => Err(Reason::SourceLimited),
            // Unknown sources together spent what is theirs: still a matter of shares.
            Err(fair::Refusal::Pool) if !key.is_known() => Err(Reason::SourceLimited),
            Err(fair::Refusal::Pool) => Err(Reason::Backpressure),
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.held()
    }

    /// Sources the gate's rate pools remember now (a count, for status).
    pub fn sources(&self) -> usize {
        self.known.sources() + self.everyone.sources()
    }

    /// Forgets idle sources of the cheap budget.
    pub fn sweep(&self, now: Instant) {
        self.cheap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sweep(now);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn net(i: u8) -> SourceKey {
        SourceKey::Net(IpAddr::from([10, 0, i, 0]))
    }

    fn known(i: u8) -> SourceKey {
        SourceKey::Known(IpAddr::from([10, 9, 9, i]))
    }

    #[test]
    fn in_flight_per_source_and_reserved_for_known_sources() {
        let t0 = crate::clock::Clock::System.instant();
        let gate = RequestGate::new(
            GateConfig {
                per_minute: 60_000,
                max_in_flight: 64,
                known_share_percent: 50,
                ..GateConfig::default()
            },
            t0,
        );
        let mut held = Vec::new();
        for _ in 0..IN_FLIGHT_PER_SOURCE {
            held.push(gate.admit(net(0), t0).expect("within the source's cap"));
        }
        assert_eq!(gate.admit(net(0), t0).unwrap_err(), Reason::SourceLimited);
        for i in 1..3 {
            for _ in 0..IN_FLIGHT_PER_SOURCE {
                held.push(gate.admit(net(i), t0).expect("within the source's cap"));
            }
        }
        assert_eq!(
            gate.admit(net(9), t0).unwrap_err(),
            Reason::Backpressure,
            "the reserved slots are not for unknown sources"
        );
        for _ in 0..IN_FLIGHT_RESERVED {
            held.push(gate.admit(known(1), t0).expect("a reserved slot"));
        }
        assert_eq!(gate.in_flight(), 64);
        assert_eq!(gate.admit(known(2), t0).unwrap_err(), Reason::Backpressure);
        let k = held.pop();
        drop(k);
    }

    #[test]
    fn known_sources_keep_their_share_under_a_flood() {
        let t0 = crate::clock::Clock::System.instant();
        let gate = RequestGate::new(GateConfig::default(), t0);
        // A flood from eight unknown sources spends the shared pool…
        for i in 0..8 {
            while gate.admit(net(i), t0).is_ok() {}
        }
        assert!(gate.admit(net(50), t0).is_err());
        // …and a known peer still gets its own.
        assert!(gate.admit(known(1), t0).is_ok());
    }

    #[test]
    fn the_cheap_budget_is_per_source() {
        let t0 = crate::clock::Clock::System.instant();
        let gate = RequestGate::new(GateConfig::default(), t0);
        let ok = (0..1000).filter(|_| gate.cheap(net(1), t0).is_ok()).count();
        assert_eq!(ok, 2 * CHEAP_PER_SECOND as usize);
        assert!(gate.cheap(net(2), t0).is_ok());
        assert!(gate.cheap(net(1), t0 + Duration::from_secs(1)).is_ok());
    }
}
