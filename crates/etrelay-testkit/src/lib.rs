//! Test support for `etrelay`, a UDP relay in front of Wolfenstein: Enemy
//! Territory / Quake 3 engine servers.
//!
//! Everything here talks to 127.0.0.0/8 only, but [`lab`], whose addresses exist only inside
//! the network namespaces it makes.
//!
//! * [`q3model`]: a literal model of how the engines read a connectionless
//!   packet (the reference oracle for the relay's classifier);
//! * [`addr`]: fresh loopback addresses per test;
//! * [`udp`]: small UDP helpers (bind, OOB packets, bounded exchanges);
//! * [`info`]: info strings and the replies that carry them;
//! * [`fake_server`]: a scripted ET 2.60b-style game server (`answer`: queries, joins and
//!   in-game packets; `rcon`: its rcon);
//! * [`master`]: scripted master servers (dpmaster-like and etmaster-like; `exchange`: the
//!   registration exchange; `list`: `getservers`);
//! * [`openarena`]: a runner for Debian's real `openarena-server` (ioquake3);
//! * [`qstat`]: a runner for `quakestat`, a real server browser;
//! * [`player`]: a client's connect handshake and in-game packets;
//! * [`flood`]: bounded floods from many source addresses or ports;
//! * [`procstat`]: a process's memory and file descriptors, sampled;
//! * [`netns`], [`lab`]: network namespaces, and the whole deployment built from them (home
//!   server behind a NAT router, WireGuard tunnel, front host, Internet); the one exception to
//!   loopback-only, on addresses that exist only inside the namespaces.

pub mod addr;
pub mod fake_server;
pub mod info;
pub mod master;
pub mod openarena;
pub mod q3model;
pub mod qstat;
pub mod udp;

pub mod flood;
pub mod player;
pub mod procstat;

pub mod lab;
pub mod netns;

pub use addr::{unique_ip, unique_ips};
pub use fake_server::{FakeEtConfig, FakeEtServer, Received};
pub use master::{FakeMaster, MasterStyle};
pub use openarena::OpenArena;
pub use q3model::{Dispatch, ENGINES, Engine};
