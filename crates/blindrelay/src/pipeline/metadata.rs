//! Step 5, envelope metadata: the signed timestamp at most [`MAX_AGE_SECS`] old and at most
//! [`MAX_SKEW_SECS`] ahead. (The size limit is enforced before: the body is capped at the
//! largest envelope before it is read, and the blob's length field at step 3's decoding.)

use crate::reason::Reason;

/// Oldest envelope timestamp accepted.
pub const MAX_AGE_SECS: u64 = 600;
/// Furthest-future envelope timestamp accepted.
pub const MAX_SKEW_SECS: u64 = 120;

/// Checks an envelope's `timestamp` at `now` (Unix seconds).
///
/// # Errors
/// `timestamp_expired` or `timestamp_in_future`.
pub(super) fn check(timestamp: u64, now: u64) -> Result<(), Reason> {
    if now.saturating_sub(timestamp) > MAX_AGE_SECS {
        return Err(Reason::TimestampExpired);
    }
    if timestamp.saturating_sub(now) > MAX_SKEW_SECS {
        return Err(Reason::TimestampInFuture);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_and_skew_limits_are_inclusive() {
        let now = 1_800_000_000;
        assert_eq!(check(now, now), Ok(()));
        assert_eq!(check(now - MAX_AGE_SECS, now), Ok(()));
        assert_eq!(
            check(now - MAX_AGE_SECS - 1, now),
            Err(Reason::TimestampExpired)
        );
        assert_eq!(check(now + MAX_SKEW_SECS, now), Ok(()));
        assert_eq!(
            check(now + MAX_SKEW_SECS + 1, now),
            Err(Reason::TimestampInFuture)
        );
    }
}
