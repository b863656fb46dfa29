//! The descriptor limit fitted to the listeners: raised (soft up to hard) so both can hold
//! their connections; when it cannot be, the connection caps lowered to fit, with a warning.

use tracing::warn;

use crate::api::serve::ListenConfig;

/// Descriptors kept free for everything but connections (SQLite, peers, the operator).
pub const SPARE_DESCRIPTORS: u64 = 256;

/// Descriptors both listeners need at their caps, the spare ones included.
fn need(listen: &ListenConfig) -> u64 {
    2 * listen.connections.total as u64 + SPARE_DESCRIPTORS
}

/// Raises the process's descriptor limit for `listen`, or lowers its caps to the limit.
pub fn fit_descriptors(listen: &mut ListenConfig) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let need = need(listen);
    let lim = getrlimit(Resource::Nofile);
    let soft = lim.current.unwrap_or(u64::MAX);
    if soft >= need {
        return;
    }
    let raised = lim.maximum.unwrap_or(u64::MAX).min(need);
    let to = Rlimit {
        current: Some(raised),
        maximum: lim.maximum,
    };
    let soft = if setrlimit(Resource::Nofile, to).is_ok() {
        raised
    } else {
        soft
    };
    if fit_caps(listen, soft) {
        warn!(
            connections = listen.connections.total,
            "the descriptor limit is low: fewer connections per listener"
        );
    }
}

/// Lowers `listen`'s caps so both listeners fit in `limit` descriptors (at least one
/// connection each); whether it lowered them.
fn fit_caps(listen: &mut ListenConfig, limit: u64) -> bool {
    if limit >= need(listen) {
        return false;
    }
    let total = usize::try_from(limit.saturating_sub(SPARE_DESCRIPTORS) / 2).unwrap_or(0);
    let c = &mut listen.connections;
    c.total = total.max(1);
    c.reserved = c.reserved.min(c.total / 2);
    c.per_source = c.per_source.min(c.total);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_that_holds_both_listeners_changes_nothing() {
        let mut l = ListenConfig::default();
        let before = l;
        let enough = need(&l);
        assert!(!fit_caps(&mut l, enough));
        assert!(!fit_caps(&mut l, u64::MAX));
        assert_eq!(l, before);
    }

    #[test]
    fn a_low_limit_lowers_the_caps_to_fit() {
        let mut l = ListenConfig::default();
        l.connections.total = 1024;
        l.connections.per_source = 32;
        l.connections.reserved = 256;
        assert!(fit_caps(&mut l, SPARE_DESCRIPTORS + 2 * 40));
        let c = l.connections;
        assert_eq!((c.total, c.per_source, c.reserved), (40, 32, 20));
        assert!(need(&l) <= SPARE_DESCRIPTORS + 2 * 40);
    }

    #[test]
    fn a_limit_below_the_spare_descriptors_leaves_one_connection() {
        let mut l = ListenConfig::default();
        assert!(fit_caps(&mut l, 10));
        let c = l.connections;
        assert_eq!((c.total, c.per_source, c.reserved), (1, 1, 0));
    }

    #[test]
    fn the_process_limit_is_fitted_without_lowering_what_fits() {
        let mut l = ListenConfig::default();
        l.connections.total = 4;
        let before = l;
        fit_descriptors(&mut l);
        assert_eq!(l, before, "a few connections always fit");
    }
}
