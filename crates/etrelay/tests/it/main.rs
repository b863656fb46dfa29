//! etrelay's integration tests, in one test binary (one link of the crate instead of one per
//! file): a module per topic, sharing the helpers of `common` (the real binary, the daemon, the
//! scripted peers of `etrelay-testkit`). Tests that need root or a real peer (Debian's
//! `openarena-server`, `openarena`, `qstat`, network namespaces, a tmpfs mount) are
//! `#[ignore]`d with the reason and run by `scripts/test` (`-- --include-ignored`):
//! docs/testing.md. One topic: `cargo test -p etrelay --test it -- control::`.

mod common;

mod admin;
mod api_input;
mod attack;
mod ban_burst;
mod binary;
mod challenges;
mod control;
mod crash;
mod deployment;
mod disk;
mod dpmaster;
mod faults;
mod filter;
mod hardening;
mod heartbeat;
mod known_sources;
mod openarena;
mod proxy;
mod queries;
mod real_client;
mod recovery;
mod reflection;
