//! # etrelay
//!
//! A UDP relay in front of Wolfenstein: Enemy Territory (Quake 3 engine) servers behind NAT.
//!
//! # Layout
//! - [`et`]: the game protocol without I/O: the server-faithful tokenizer, packet
//!   classification (the filter), info strings and the challenge rewrite.
//! - [`config`]: what one relayed server needs to run, with the design's defaults.
//! - [`server`]: one relayed server as one unit: public socket, relay loop, sessions, query
//!   limiter and cache, heartbeat task, metrics.
//! - [`cli`]: the command line.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
pub mod bans;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod daemon;
pub mod et;
pub mod net;
pub mod probe;
pub mod proof;
pub mod registry;
pub mod secret;
pub mod server;
