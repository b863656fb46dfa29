//! The admission pipeline in process, on tokio's paused clock (every test is
//! `#[tokio::test(start_paused = true)]`: time moves only when a test advances it or nothing can
//! run, to the next timer): a module per topic, over one harness
//! (`common/inproc.rs`): nodes built by `daemon::build` and served in this process on fresh
//! 127.x.y.z addresses with ports from the OS, v2 frames built by hand.
//!
//! - [`steps`]: each step's refusal, the order of the steps, no retry after a definitive
//!   answer, every error of both listeners as JSON;
//! - [`admission`]: the request gate's shares, crypto admission, the previous-hop guard;
//! - [`replay`]: every replay outcome, a full registry, reservations across a restart;
//! - [`status`]: receipts, probes, status transitions, nothing private in status or metrics;
//! - [`deadlines`]: slow next hops within and beyond the hop's deadline.
//! - [`routes`]: a message sent again over another route, stored once.

mod admission;
mod deadlines;
mod replay;
mod routes;
mod status;
mod steps;
