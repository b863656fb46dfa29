//! The testkit's own tests, in one test binary: the scripted peers and models against the
//! protocol notes, and against Debian's real OpenArena server and client. Tests that need a
//! real peer are `#[ignore]`d with the reason and run by `scripts/test`
//! (`-- --include-ignored`): docs/testing.md.

mod et_netchan;
mod fake_server;
mod huffman;
mod master;
mod netchan;
mod oa_client;
mod openarena;
mod openarena_netchan;
mod player;
