//! # etrelay
//!
//! A UDP relay in front of Wolfenstein: Enemy Territory (Quake 3 engine) servers behind NAT.
//!
//! # Layout
//! - [`et`]: the game protocol without I/O: the server-faithful tokenizer, packet
//!   classification (the filter), info strings and the challenge rewrite.
//! - [`config`]: what one relayed server needs to run, with the design's defaults.
//! - [`clock`]: the one monotonic clock decisions read (tokio's), and the one read of the
//!   wall clock ([`clock::wall_now`]) for dates.
//! - [`net`]: batched receive on the public socket; sockets connected to the game server.
//! - [`probe`]: asking the game server with a fresh challenge and waiting for its echo.
//! - [`bans`]: bans: the ban and its checks, the table the packet path looks up, the files.
//! - [`server`]: one relayed server as one unit: public socket, relay loop, sessions, query
//!   limiter and cache, heartbeat, bans in force, counters.
//! - [`proof`]: server keys, their fingerprint, and the proof of console access.
//! - [`registry`]: the registered servers by port, `servers.json`, one writer for changes.
//! - [`control`]: the control API (axum): registration, sessions, bans, metrics; its errors
//!   ([`control::ControlError`]: status, code, message).
//! - [`fdbudget`]: the descriptor limit shared out between sessions, servers and the control
//!   API.
//! - [`metrics_http`]: `--metrics` in single-server mode: `GET /metrics` (axum) on the shared
//!   [`listener`] accept loop, with its caps and timeouts.
//! - [`single`]: the one-server mode: its upstream checked as a registration's, its sockets
//!   bound, shutdown.
//! - [`daemon`]: the several-servers mode: registry, control API, shutdown.
//! - [`secret`]: values whose `Debug` never shows them (tokens, keys, passwords).
//! - [`admin`]: `etrelay admin`, the game server admin's tool (HTTP client and rcon).
//! - [`cli`]: the command line.
//!
//! A packet's path: public socket → [`net`] → [`server`]'s relay loop: size → [`et`] classify
//! (the filter) → [`bans`] check → by kind: query limiter → query cache answer; or
//! `getchallenge` → join gate (per source, pace, fair queue); or in-game → qport check; then
//! session admission (half-open caps) → session queue → upstream socket → game server; its
//! answer → session task (half-open → established) → public socket → client.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
pub mod bans;
pub mod busy_poll;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod daemon;
pub mod et;
pub mod fdbudget;
pub mod metrics_http;
pub mod net;
pub mod probe;
pub mod proof;
pub mod registry;
pub mod secret;
pub mod server;
pub mod single;
