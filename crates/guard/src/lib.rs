//! # guard: the abuse-control core shared by `etrelay` and `blindrelay`
//!
//! Only what both relays really share lives here, and none of it does I/O on the network or
//! reads the clock: every decision takes `now` from the caller, so tests drive time by hand.
//!
//! # Layout
//! - [`limiter`]: a keyed store of rate-limit state with a hard key cap, idle eviction and a
//!   stated policy at the cap; [`limiter::TokenBucket`] is one rule for it.
//! - [`window`]: a fixed window counter (events per window of a given length).
//! - [`admission`]: a non-blocking counting gate whose permits release themselves on drop.
//! - [`statefile`]: JSON state files written atomically (temp file, fsync, rename, fsync dir),
//!   and private files created once (keys).
//! - [`sqlite`]: a durable SQLite file (WAL, every commit synced, a busy timeout) as the
//!   relays' stores open it, and its error naming the file.
//! - [`throttle`]: at most one log line per period for a repeated warning, with the count
//!   of those suppressed.
//! - [`counters`]: atomic counters, counter sets declared once with their Prometheus families,
//!   and the Prometheus text format.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admission;
pub mod counters;
mod fixedmap;
pub mod limiter;
pub mod sqlite;
pub mod statefile;
pub mod throttle;
pub mod window;
