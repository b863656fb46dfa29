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
//! * [`huffman`]: a literal model of the engines' adaptive Huffman codec (the compressed
//!   `connect`), checked bit for bit against the C code;
//! * [`netchan`]: the netchan framing (sequence, qport, ioquake3's checksum, fragments and
//!   their reassembly), ET's XOR encoding of in-game messages (`xor`), and the fakes' in-game
//!   stream of patterned messages (`session`);
//! * [`fake_server`]: a scripted ET 2.60b-style game server (`answer`: queries, joins and
//!   in-game packets; `engine`: ET 2.60b's connect checks and a netchan per client; `rcon`:
//!   its rcon);
//! * [`master`]: scripted master servers (dpmaster-like and etmaster-like; `exchange`: the
//!   registration exchange; `list`: `getservers`);
//! * [`openarena`]: a runner for Debian's real `openarena-server` (ioquake3);
//! * [`oa_client`]: a runner for Debian's real `openarena` client (ioquake3) under an Xvfb of
//!   its own, and the server console's `status` read back;
//! * [`qstat`]: a runner for `quakestat`, a real server browser;
//! * [`player`]: a client's connect handshake (plaintext or Huffman `connect`) and in-game
//!   packets (raw, or a netchan session with the server);
//! * [`dpmaster`]: a runner for a real dpmaster, given by `ETRELAY_DPMASTER` (not packaged in
//!   Debian: built outside the repository), its output counted per server;
//! * [`flood`]: bounded floods from many source addresses or ports;
//! * [`spoof`]: datagrams with a forged source address and port (a raw socket, root only), and
//!   bounded floods of them;
//! * [`procstat`]: a process's memory and file descriptors, sampled;
//! * [`netns`], [`lab`]: network namespaces, and the whole deployment built from them (home
//!   server behind a NAT router, WireGuard tunnel, front host, Internet); the one exception to
//!   loopback-only, on addresses that exist only inside the namespaces.

pub mod addr;
pub mod dpmaster;
pub mod fake_server;
pub mod huffman;
pub mod info;
pub mod master;
pub mod netchan;
pub mod oa_client;
pub mod openarena;
pub mod q3model;
pub mod qstat;
pub mod udp;

pub mod flood;
pub mod player;
pub mod procstat;
pub mod spoof;

pub mod lab;
pub mod netns;

pub use addr::{unique_ip, unique_ips};
pub use dpmaster::Dpmaster;
pub use fake_server::{FakeEtConfig, FakeEtServer, Handshake, Received};
pub use master::{FakeMaster, MasterStyle};
pub use oa_client::OaClient;
pub use openarena::OpenArena;
pub use q3model::{Dispatch, ENGINES, Engine};
