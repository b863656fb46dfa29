//! The heartbeat as a state machine without I/O: when to probe the game server, and what the
//! masters get after each probe and when the relay stops.
//!
//! The machine starts Unknown and asks for a probe at once. After each probe
//! ([`Heartbeat::probed`]) it says what the round changed and what goes to the masters; then
//! [`Heartbeat::poll`] says to wait for the next round. Rounds start on a fixed period,
//! `heartbeat_interval` from the start of one round to the start of the next (the ET server's
//! own period): the probe's time (up to 3 × 3 s when the server is down) does not push the
//! next heartbeat later. A round that starts late (the process was stopped, or a round lasted
//! longer than the period) skips the starts it missed instead of running them back to back.
//!
//! - Unknown or Down → Up: heartbeat. Up → Up: heartbeat.
//! - Up → Down: flatline (ET), once for the whole outage: Down → Down sends nothing.
//! - Unknown → Down: nothing (the masters heard nothing from this relay yet).
//! - Stop ([`Heartbeat::stop`]): flatline (ET), whatever the state.
//!
//! The heartbeat task ([`super::heartbeat_task`]) drives it: it owns the probe socket, the
//! masters' name lookups and the sends. States and transitions: `docs/etrelay-heartbeat.md`.

use std::time::{Duration, SystemTime};

use super::metrics::ProbeState;
use crate::clock::Instant;
use crate::config::Game;

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Probe the game server now, then report with [`Heartbeat::probed`].
    Probe,
    /// Nothing until then; poll again at that instant.
    WaitUntil(Instant),
}

/// Which packet goes to the masters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// The game's heartbeat: list this address.
    Heartbeat,
    /// The flatline: this server is gone.
    Flatline,
}

/// A packet for every master, sent from the public socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ToMasters {
    /// Which one.
    pub beat: Beat,
    /// Its bytes, marker included.
    pub packet: &'static [u8],
}

/// What a probe changed, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Unknown or Down → Up.
    Answers,
    /// Up → Down.
    StoppedAnswering,
    /// Unknown → Down.
    DoesNotAnswer,
    /// Same state as before.
    None,
}

/// The outcome of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Round {
    /// The state from now on.
    pub state: ProbeState,
    /// What changed.
    pub change: Change,
    /// What goes to the masters now, if anything.
    pub send: Option<ToMasters>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first round: due at the first poll.
    First,
    /// A round under way, started on the schedule at that instant.
    Probing(Instant),
    /// Waiting for the round scheduled at that instant.
    Wait(Instant),
}

/// The heartbeat of one server.
#[derive(Debug)]
pub(super) struct Heartbeat {
    game: Game,
    interval: Duration,
    state: ProbeState,
    phase: Phase,
}

impl Heartbeat {
    /// A heartbeat for `game`: the first round at once, then one round every `interval`,
    /// start to start.
    pub(super) fn new(game: Game, interval: Duration) -> Self {
        Heartbeat {
            game,
            interval,
            state: ProbeState::Unknown,
            phase: Phase::First,
        }
    }

    /// What to do at `now`.
    pub(super) fn poll(&mut self, now: Instant) -> Next {
        match self.phase {
            Phase::First => {
                self.phase = Phase::Probing(now);
                Next::Probe
            }
            Phase::Probing(_) => Next::Probe,
            Phase::Wait(at) if now < at => Next::WaitUntil(at),
            Phase::Wait(at) => {
                self.phase = Phase::Probing(self.last_start_by(at, now));
                Next::Probe
            }
        }
    }

    /// The latest start of the schedule `at`, `at + interval`, … that is not after `now`.
    fn last_start_by(&self, at: Instant, now: Instant) -> Instant {
        let period = self.interval.as_nanos().max(1);
        let missed = (now - at).as_nanos() / period;
        let skip = u32::try_from(missed).unwrap_or(u32::MAX);
        self.interval
            .checked_mul(skip)
            .and_then(|d| at.checked_add(d))
            .unwrap_or(now)
    }

    /// The probe asked for by [`Heartbeat::poll`] ended: the server `answered` it or not.
    pub(super) fn probed(&mut self, answered: bool) -> Round {
        let next = if answered {
            ProbeState::Up
        } else {
            ProbeState::Down
        };
        let change = match (self.state, next) {
            (ProbeState::Up, ProbeState::Up) | (ProbeState::Down, ProbeState::Down) => Change::None,
            (_, ProbeState::Up) => Change::Answers,
            (ProbeState::Up, _) => Change::StoppedAnswering,
            _ => Change::DoesNotAnswer,
        };
        let send = match (self.state, next) {
            (_, ProbeState::Up) => self.beat(Beat::Heartbeat),
            (ProbeState::Up, _) => self.beat(Beat::Flatline),
            _ => None,
        };
        self.state = next;
        // The next round is due one period after this one's start on the schedule (a result
        // given before any poll leaves the first round due at once).
        self.phase = match self.phase {
            Phase::Probing(at) | Phase::Wait(at) => Phase::Wait(at + self.interval),
            Phase::First => Phase::First,
        };
        Round {
            state: next,
            change,
            send,
        }
    }

    /// The relay stops: the flatline (if the game has one), whatever the state.
    pub(super) fn stop(&mut self) -> Option<ToMasters> {
        self.beat(Beat::Flatline)
    }

    fn beat(&self, beat: Beat) -> Option<ToMasters> {
        let packet = match beat {
            Beat::Heartbeat => Some(self.game.heartbeat()),
            Beat::Flatline => self.game.flatline(),
        }?;
        Some(ToMasters { beat, packet })
    }
}

/// What the last probe found, for the control API.
#[derive(Debug, Clone, Copy)]
pub struct ProbeStatus {
    /// State after the last probe.
    pub state: ProbeState,
    /// When the last probe ended.
    pub last_probe: Option<SystemTime>,
    /// When the server last answered a probe.
    pub last_answer: Option<SystemTime>,
}

impl Default for ProbeStatus {
    fn default() -> Self {
        ProbeStatus {
            state: ProbeState::Unknown,
            last_probe: None,
            last_answer: None,
        }
    }
}

impl ProbeStatus {
    /// Records a probe that ended at the date `at` in `state`.
    pub fn record(&mut self, state: ProbeState, at: SystemTime) {
        self.state = state;
        self.last_probe = Some(at);
        if state == ProbeState::Up {
            self.last_answer = Some(at);
        }
    }
}

#[cfg(test)]
mod tests;
