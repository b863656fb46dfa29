//! Eclipse detection: whether what this node knows came through one source.
//!
//! Every identity remembers its *root*: the /16 (/32) of the first-hand source it came
//! through (the operator's `--peer` or seed, a stranger's own endpoint; an identity a peer
//! brought inherits that peer's root; the peer store keeps roots across restarts, and reads an
//! entry written without one as rooted at its own endpoint). It is *confirmed* once
//! a reconciliation with a peer under another root finds that peer holds it too. So a lying
//! bootstrap peer and the Sybils it hands out share one root, whatever blocks their endpoints
//! are in, and a second, honest source confirms nothing of theirs.
//!
//! - [`EclipseState::OneSource`]: at least [`ONE_SOURCE`] of the identities held are
//!   unconfirmed under one root. True of any node whose only source is one `--peer`, honest or
//!   not: the remedy is the same (more `--peer`s from other operators, or `--seeds`).
//! - [`EclipseState::Unconfirmed`]: after reconciling with at least two roots, most identities
//!   are still confirmed by no second one: the sources disagree about the network.
//!
//! Either is in the status document and logged; the periodic reconciliation then prefers the
//! operator's sources and peers under other roots (`super::sync`). The counts are kept as the
//! view changes, so assessing costs a pass over the roots, not the view.

use super::view::View;

/// Share of identities unconfirmed under one root from which a view is one source's.
pub const ONE_SOURCE: f64 = 0.9;
/// Identities held from which a view can be judged at all.
pub const MIN_HELD: usize = 4;

named_enum! {
    /// What eclipse detection says.
    pub enum EclipseState {
        /// Identities came through several sources that vouch for each other's.
        Ok = "ok",
        /// Nearly everything came through one source.
        OneSource = "one_source",
        /// Several sources, but most identities confirmed by only one of them.
        Unconfirmed = "unconfirmed",
    }
}

/// The assessment and its counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eclipse {
    /// The verdict.
    pub state: EclipseState,
    /// Identities held.
    pub held: usize,
    /// Distinct roots among them.
    pub roots: usize,
    /// Share held confirmed by no second root.
    pub unconfirmed_share: f64,
    /// Share held unconfirmed under the largest root.
    pub top_share: f64,
    /// Roots reconciled with.
    pub roots_synced: usize,
}

/// Assesses `view`, given how many distinct roots this node reconciled with.
pub fn assess(view: &View, roots_synced: usize) -> Eclipse {
    let c = view.roots();
    let share = |n: usize| {
        if c.held == 0 {
            0.0
        } else {
            n as f64 / c.held as f64
        }
    };
    let (unconfirmed_share, top_share) = (share(c.unconfirmed), share(c.top_unconfirmed));
    let state = if c.held < MIN_HELD {
        EclipseState::Ok
    } else if top_share >= ONE_SOURCE {
        EclipseState::OneSource
    } else if roots_synced >= 2 && unconfirmed_share > 0.5 {
        EclipseState::Unconfirmed
    } else {
        EclipseState::Ok
    };
    Eclipse {
        state,
        held: c.held,
        roots: c.roots,
        unconfirmed_share,
        top_share,
        roots_synced,
    }
}
