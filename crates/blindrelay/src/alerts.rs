//! Log lines for attacks: what the counters show, said at `warn` where an operator reads it,
//! at most once per [`EVERY`] per kind, with counts since the last line and 8-hex id prefixes
//! only (never an address, a URL or a full id).
//!
//! A watcher reads the counters and the guard's tables every [`TICK`] (nothing is added to
//! the request path) and writes a line of a kind when it moved:
//!
//! | kind | when | says |
//! |---|---|---|
//! | `handshake_flood` | ≥ [`HANDSHAKE_FLOOD`] new connections to the relay listener in a tick | handshakes completed, failed, timed out, refused at the caps |
//! | `strangers_refused` | ≥ [`STRANGERS_REFUSED`] refusals of requests from unknown sources in a tick | how many |
//! | `peer_quarantined` | a peer quarantined since the last tick | its prefix (4 at most, and how many) |
//! | `share_cut` | a peer whose frames keep failing to open, since the last tick | its prefix, as above |
//! | `backpressure` | a `backpressure` refusal | how many, and the source most of it fell on, if one did (`crate::pipeline::pressure`) |
//!
//! A tick that would write a kind's second line within [`EVERY`] adds its counts to the next
//! one (`since_last_line`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use guard::throttle::Throttle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::counters::Snapshot;
use crate::health::Standing;
use crate::proto::{NodeId, Prefix};
use crate::relay::Relay;
use crate::status::{Cause, CauseSource};

/// How often the watcher looks.
pub const TICK: Duration = Duration::from_secs(5);
/// At most one line per kind this often.
pub const EVERY: Duration = Duration::from_secs(60);
/// New connections to the relay listener in one [`TICK`] that make a handshake flood (10 a
/// second: peers keep their links open, so an honest network opens a few a minute).
pub const HANDSHAKE_FLOOD: u64 = 50;
/// Refusals of strangers' requests in one [`TICK`] worth a line.
pub const STRANGERS_REFUSED: u64 = 10;
/// Prefixes named in one line at most.
const NAMED: usize = 4;

/// One kind's throttle and the counts not said yet.
#[derive(Debug)]
struct Kind {
    throttle: Throttle,
    pending: u64,
}

impl Kind {
    fn new() -> Self {
        Kind {
            throttle: Throttle::new(EVERY),
            pending: 0,
        }
    }

    /// The peers in `now_in` that were not in `before`, as events: their prefixes and the count
    /// since the last line, when a line may be written.
    fn newcomers(
        &mut self,
        now_in: &HashSet<NodeId>,
        before: &HashSet<NodeId>,
        now: std::time::Instant,
    ) -> Option<(String, u64)> {
        let new: Vec<&NodeId> = now_in.difference(before).collect();
        if new.is_empty() {
            return None;
        }
        let n = self.event(new.len() as u64, now)?;
        Some((prefixes(new.into_iter()), n))
    }

    /// `n` events now: `Some(all since the last line)` when a line may be written.
    fn event(&mut self, n: u64, now: std::time::Instant) -> Option<u64> {
        self.pending = self.pending.saturating_add(n);
        self.throttle.event(now)?;
        Some(std::mem::take(&mut self.pending))
    }
}

/// What the watcher saw at its last tick.
#[derive(Debug)]
struct Watch {
    last: Snapshot,
    quarantined: HashSet<NodeId>,
    cut: HashSet<NodeId>,
    handshakes: Kind,
    strangers: Kind,
    quarantines: Kind,
    cuts: Kind,
    backpressure: Kind,
}

/// Watches `relay` until `cancel`.
pub async fn run(relay: Arc<Relay>, cancel: CancellationToken) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut w = Watch {
        last: relay.ctx().counters.snapshot(),
        quarantined: HashSet::new(),
        cut: HashSet::new(),
        handshakes: Kind::new(),
        strangers: Kind::new(),
        quarantines: Kind::new(),
        cuts: Kind::new(),
        backpressure: Kind::new(),
    };
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        w.tick(&relay);
    }
}

/// Up to [`NAMED`] prefixes of `ids`, space-separated.
fn prefixes<'a>(ids: impl Iterator<Item = &'a NodeId>) -> String {
    let mut out = String::new();
    for id in ids.take(NAMED) {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{}", Prefix(id));
    }
    out
}

/// Who a cause is, in words (prefix only), and for a peer why.
fn who(c: &Cause) -> String {
    match c.source {
        CauseSource::Peer => format!("{} ({})", c.who(), c.reason.as_str()),
        _ => c.who(),
    }
}

impl Watch {
    fn tick(&mut self, relay: &Relay) {
        let ctx = relay.ctx();
        let now = ctx.clock.instant();
        let s = ctx.counters.snapshot();
        let standings = relay.pipeline().hops().standings(now);
        let d = |f: fn(&Snapshot) -> u64| f(&s).saturating_sub(f(&self.last));
        let (done, failed, timed_out, refused) = (
            d(|s| s.tls_handshakes),
            d(|s| s.tls_handshake_failed),
            d(|s| s.connections_timed_out),
            d(|s| s.connections_refused),
        );
        let connections = done + failed + timed_out + refused;
        if connections >= HANDSHAKE_FLOOD
            && let Some(n) = self.handshakes.event(connections, now)
        {
            warn!(
                since_last_line = n,
                completed = done,
                failed,
                timed_out,
                refused,
                "handshake flood: new TLS connections to the relay listener far over what peers open"
            );
        }
        let strangers = d(|s| s.strangers_refused);
        if strangers >= STRANGERS_REFUSED
            && let Some(n) = self.strangers.event(strangers, now)
        {
            warn!(
                since_last_line = n,
                "strangers refused: requests from sources that are not known peers (over their share, no identity, layers that do not open)"
            );
        }
        let pressure = d(|s| s.backpressure_dropped);
        if pressure > 0
            && let Some(n) = self.backpressure.event(pressure, now)
        {
            match crate::status::backpressure_cause(relay, &standings, ctx.clock.unix()) {
                Some(c) => warn!(
                    since_last_line = n,
                    cause = %who(&c),
                    "backpressure: requests refused for lack of crypto slots or request rate, mostly those of one source"
                ),
                None => warn!(
                    since_last_line = n,
                    "backpressure: requests refused for lack of crypto slots or request rate, from many sources: the node is short of capacity"
                ),
            }
        }
        self.guard_lines(&standings, now);
        self.last = s;
    }

    /// Quarantines and share cuts that started since the last tick.
    fn guard_lines(&mut self, standings: &HashMap<NodeId, Standing>, now: std::time::Instant) {
        let quarantined: HashSet<NodeId> = standings
            .iter()
            .filter(|(_, s)| s.quarantine_secs > 0)
            .map(|(id, _)| *id)
            .collect();
        let cut: HashSet<NodeId> = standings
            .iter()
            .filter(|(_, s)| s.share_cut)
            .map(|(id, _)| *id)
            .collect();
        if let Some((peers, n)) = self
            .quarantines
            .newcomers(&quarantined, &self.quarantined, now)
        {
            warn!(
                peers = %peers,
                since_last_line = n,
                "peer quarantined by the previous-hop guard for 300 s (over its rate, or 12 scored failures in 300 s)"
            );
        }
        if let Some((peers, n)) = self.cuts.newcomers(&cut, &self.cut, now) {
            warn!(
                peers = %peers,
                since_last_line = n,
                "a peer's frames keep failing to open (12 in 300 s): its share of crypto slots is cut to a stranger's"
            );
        }
        self.quarantined = quarantined;
        self.cut = cut;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_says_its_counts_once_a_minute() {
        let t0 = crate::clock::Clock::System.instant();
        let mut k = Kind::new();
        assert_eq!(k.event(60, t0), Some(60));
        assert_eq!(k.event(50, t0 + TICK), None);
        assert_eq!(k.event(70, t0 + TICK * 2), None);
        assert_eq!(k.event(1, t0 + EVERY), Some(121));
        assert_eq!(
            prefixes([[0xab; 32], [0xcd; 32]].iter()),
            "abababab cdcdcdcd"
        );
        let many: Vec<NodeId> = (0..9u8).map(|i| [i; 32]).collect();
        assert_eq!(prefixes(many.iter()).split(' ').count(), NAMED);
    }
}
