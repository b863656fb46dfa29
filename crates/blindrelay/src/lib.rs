//! # blindrelay
//!
//! A node that forwards onion-encrypted envelopes for other nodes without ever seeing who talks
//! to whom, behind an abuse guard.
//!
//! # Layout
//! - [`proto`]: the wire formats without I/O: envelopes and their signatures, onion layers,
//!   delivery receipts, descriptors.
//! - [`replay`]: the route replay registry (SQLite or memory) and the terminal's inbox.
//! - [`pipeline`]: the admission pipeline, steps 1–8, and the reasons it refuses.
//! - [`hopguard`]: step 4, the previous-hop rate limit, failure score and quarantine.
//! - [`forward`]: the next hop's client and the retry policy.
//! - [`send`]: the client side: build a route, send, verify the receipt.
//! - [`node`]: identity, onion keys, descriptor; [`peers`]: known peers' descriptors.
//! - [`counters`]: the aggregate counters; [`api`]: the two listeners; [`daemon`]: `run`.
//! - [`clock`]: time, passed in.
//! - [`probe`]: synthetic single-hop and two-hop probes; [`health`]: per-peer health without
//!   who-talks-to-whom; [`status`]: evidence quality, proof scope, the status document and
//!   the Prometheus text.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod api;
pub mod cli;
pub mod clock;
pub mod counters;
pub mod daemon;
pub mod forward;
pub mod health;
pub mod hopguard;
pub mod node;
pub mod peers;
pub mod pipeline;
pub mod probe;
pub mod proto;
pub mod replay;
pub mod send;
pub mod sqlite;
pub mod status;
pub mod terminal;
