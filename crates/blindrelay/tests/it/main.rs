//! blindrelay's integration tests, in one test binary (one link of the crate instead of one per
//! file): a module per topic, sharing the helpers of `common` (networks of real `blindrelay`
//! processes on loopback; `common/inproc.rs`, nodes in this process for `pipeline`). The disk
//! test needs root (it mounts a tmpfs) and is `#[ignore]`d with the reason; `scripts/test` runs
//! it (`-- --include-ignored`): docs/testing.md. One topic:
//! `cargo test -p blindrelay --test it -- attack::`.

mod common;

mod accounting;
mod attack;
mod capture;
mod crash;
mod discovery;
mod discovery_attacks;
mod discovery_split;
mod disk;
mod faults;
mod framed;
mod hostile_peers;
mod links;
mod network;
mod operator;
mod outbound;
mod pipeline;
mod privacy;
mod retry;
mod routes;
