//! # blindrelay
//!
//! A node that forwards onion-encrypted envelopes for other nodes without ever seeing who talks
//! to whom, behind an abuse guard.
//!
//! # Layout
//! - [`proto`]: the wire formats without I/O: envelopes and their signatures, onion layers,
//!   delivery receipts, descriptors.
//! - [`replay`]: the route replay registry (SQLite or memory) and the terminal's inbox.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod proto;
pub mod replay;
