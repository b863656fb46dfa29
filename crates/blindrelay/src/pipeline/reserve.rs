//! The route replay reservation (the end of design step 7), and after the delivery the replay
//! record (the
//! final answer, success or failure, kept for duplicates). The reservation is a SQLite commit
//! (`synchronous=FULL`): it runs on the blocking thread its crypto work ran on, once the slot
//! is given back. The record waits for no commit: it rides with the registry's next one.

use tracing::debug;

use crate::reason::Reason;
use crate::replay::{Digest, Outcome, ReplayRegistry, ReplayTag, StoredResponse};
use crate::sources::SourceKey;

/// A reservation that lets the request go on, or answers it.
#[derive(Debug)]
pub(super) enum Reserved {
    /// Reserved for this request: go on.
    New,
    /// The same request, completed: answer with its stored response.
    Duplicate(StoredResponse),
}

/// Reserves the layer's replay tag `tag` for the request `digest` at `now`, through
/// `keep_through` (the layer's expiry plus the skew: the last second the layer is accepted), so
/// the same layer is refused whatever frame carries it for as long as it could be accepted.
///
/// # Errors
/// The registry's refusal (`route_in_flight`, `replay_conflict`, `replay_response_expired`,
/// `replay_capacity`, `replay_share_exceeded`); `state_write_failed` when the registry cannot
/// be written (a full or read-only disk: nothing was reserved).
///
/// Blocking (a SQLite commit): the pipeline calls it on the blocking thread its crypto work
/// ran on, once the crypto slot is given back.
pub(super) fn reserve(
    replay: &ReplayRegistry,
    tag: ReplayTag,
    digest: Digest,
    now: u64,
    keep_through: u64,
    source: SourceKey,
) -> Result<Reserved, Reason> {
    match replay.reserve_through(tag, digest, now, keep_through, Some(source)) {
        Ok(outcome) => decide(outcome),
        Err(_) => {
            debug!("replay registry cannot be written");
            Err(Reason::StateWriteFailed)
        }
    }
}

/// What a registry outcome means for the request: the one mapping from the registry's table
/// to reasons (whose status and counter are [`Reason`]'s).
fn decide(outcome: Outcome) -> Result<Reserved, Reason> {
    match outcome {
        Outcome::New => Ok(Reserved::New),
        Outcome::Duplicate(stored) => Ok(Reserved::Duplicate(stored)),
        Outcome::InFlight => Err(Reason::RouteInFlight),
        Outcome::Conflict => Err(Reason::ReplayConflict),
        Outcome::Expired => Err(Reason::ReplayResponseExpired),
        Outcome::Capacity => Err(Reason::ReplayCapacity),
        Outcome::ShareExceeded => Err(Reason::ReplayShareExceeded),
    }
}

/// Records the final answer (`status`, `body`) of the route reserved for `digest`, at `now`.
/// Never blocks: the answer is in the registry's memory at once and written with its next
/// batch ([`crate::replay`]), so the reactor calls it and the request is answered without
/// waiting for a write. A failure is only logged: the route then stays in flight until its
/// window ends, and never runs twice.
pub(super) fn complete(
    replay: &ReplayRegistry,
    tag: ReplayTag,
    digest: Digest,
    (status, body): (u16, Vec<u8>),
    now: u64,
) {
    if replay.complete(tag, digest, status, &body, now).is_err() {
        debug!("replay registry: completion not stored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_the_design_statuses() {
        let refused = |o: Outcome| decide(o).err().map(|r| (r.status(), r.as_str()));
        assert_eq!(refused(Outcome::New), None);
        let stored = StoredResponse {
            status: 200,
            body: Vec::new(),
            completed_at: 0,
        };
        assert_eq!(refused(Outcome::Duplicate(stored)), None);
        assert_eq!(refused(Outcome::InFlight), Some((503, "route_in_flight")));
        assert_eq!(refused(Outcome::Conflict), Some((400, "replay_conflict")));
        assert_eq!(
            refused(Outcome::Expired),
            Some((409, "replay_response_expired"))
        );
        assert_eq!(refused(Outcome::Capacity), Some((503, "replay_capacity")));
        assert_eq!(
            refused(Outcome::ShareExceeded),
            Some((429, "replay_share_exceeded"))
        );
    }
}
